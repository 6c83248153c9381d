"""Architecture conformance checks: does a checkpoint run every call of the toolkit, exactly?

Each check takes a loaded :class:`~mmfragile.models.hf.HFModel` and returns a :class:`Check` (passed or not, with
what was compared). ``tests/test_architectures.py`` asserts them on the tiny checkpoint of every family
(:mod:`mmfragile.models.tiny`); ``scripts/architecture_table.py`` runs the same checks and prints the README's
architecture table. Run them on a real checkpoint too: ``python scripts/architecture_table.py --path /models/x``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mmfragile.models.base import Prompt

SAMPLE_T = 0.1  # the engine's sampled check: temperature (see check_engine)
ATOL = 1e-4  # float32 tolerance on logits and log-likelihoods between batched / single / engine runs


@dataclass
class Check:
    ok: bool | None   # None: not applicable to this family (with the reason in detail)
    detail: str

    @property
    def mark(self) -> str:
        return {True: "✓", False: "✗", None: "–"}[self.ok]


def sample_images(n: int = 3, seed: int = 0):
    """Deterministic RGB images of different sizes and aspect ratios (anyres / tiling paths get exercised)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(40, 60), (64, 32), (50, 50), (36, 80)]
    return [Image.fromarray(rng.integers(0, 255, (*sizes[i % 4], 3), dtype=np.uint8)) for i in range(n)]


def mixed_prompts(model) -> list[Prompt]:
    """One image, two images named in the text, and no image (PaliGemma, which needs one, gets one)."""
    imgs = sample_images()
    text_only = [] if model.adapter.__class__.__name__ != "PaliGemmaAdapter" else [imgs[2]]
    return [Prompt("What is shown? Answer A or B.", images=[imgs[0]]),
            Prompt("Compare <image 1> with <image 2>. Which is brighter, A or B?", images=[imgs[1], imgs[2]]),
            Prompt("Which letter comes first, A or B?", images=text_only)]


def _single(model, fn, prompts, *args):
    return [fn([p], *[[a[i]] for a in args])[0] for i, p in enumerate(prompts)]


def check_generate(model) -> Check:
    ps = mixed_prompts(model)
    batched, single = model.generate(ps, max_new_tokens=4), _single(model, lambda p: model.generate(p, 4), ps)
    return Check(batched == single, f"batched {batched!r} vs one at a time {single!r}")


def check_option_logits(model) -> Check:
    ps, cands = mixed_prompts(model), [["A", "B"]] * 3
    batched, single = model.option_logits(ps, cands), _single(model, model.option_logits, ps, cands)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(batched, single))
    return Check(diff < ATOL, f"max |batched - single| = {diff:.1e}")


def check_loglikelihood(model) -> Check:
    ps, conts = mixed_prompts(model), ["A cat.", "B", "A, then B"]
    batched, single = model.loglikelihood(ps, conts), _single(model, model.loglikelihood, ps, conts)
    diff = max(abs(a.logprob - b.logprob) for a, b in zip(batched, single))
    same_n = all(a.n_tokens == b.n_tokens for a, b in zip(batched, single))
    finite = all(np.isfinite(a.logprob) and a.logprob < 0 for a in batched)
    return Check(diff < ATOL and same_n and finite, f"max |batched - single| = {diff:.1e}, n_tokens equal: {same_n}")


def check_multi_image(model) -> Check:
    """Both images reach the model (their features differ from one image twice) and, where the template
    interleaves, each image sits where the text names it."""
    imgs = sample_images()
    p = Prompt("Compare <image 1> with <image 2>. A or B?", images=[imgs[0], imgs[1]])
    swapped = Prompt("Compare <image 1> with <image 2>. A or B?", images=[imgs[0], imgs[0]])
    la, lb = model.option_logits([p, swapped], [["A", "B"]] * 2)
    text = model.render(p)
    if model.adapter.interleave:
        placed = text.find("Compare") < _first_image_marker(model, text) < text.find("with")
        where = "image 1 between 'Compare' and 'with'"
    else:
        placed = _first_image_marker(model, text) < text.find("Compare")
        where = "images before the text (the family's template puts them first)"
    sees_both = float(np.abs(la - lb).max()) > 1e-6
    return Check(placed and sees_both, f"{where}: {placed}; second image changes the logits: {sees_both}")


def _first_image_marker(model, text: str) -> int:
    proc = model.processor
    marks = [m for m in (getattr(proc, "image_token", None), getattr(proc, "boi_token", None),
                         getattr(getattr(proc, "tokenizer", None), "boi_token", None), "<|vision_start|>") if m]
    found = [text.find(m) for m in marks if m in text]
    return min(found) if found else -1


def check_video(model) -> Check:
    if not model.adapter.video:
        return Check(None, "the family takes no video input: a video's frames go in as images")
    frames = sample_images(4)
    frames = [f.resize((48, 48)) for f in frames]
    video = Prompt("What happens in the video? A or B?", images=frames, video=True)
    enc = model.encode([video])
    video_keys = sorted(k for k in enc if "video" in k or k == "pixel_values")
    batched = model.generate([video, mixed_prompts(model)[0]], max_new_tokens=3)
    single = [model.generate([video], 3)[0], model.generate([mixed_prompts(model)[0]], 3)[0]]
    return Check(bool(video_keys) and batched == single, f"video inputs {video_keys}; batched == single: "
                                                           f"{batched == single}")


def engine_variants(images: list) -> list[Prompt]:
    """Prompt variants of one question, as a study builds them: a shared prefix, different short tails."""
    q = "Look at <image 1>. How many shapes are there? Options: A. one B. two" if len(images) == 1 else \
        "Compare <image 1> with <image 2>. Which has more shapes? Options: A. first B. second"
    tails = ["\nAnswer with the option's letter.", "\nAnswer:", "\nReply with A or B only, nothing else.",
             "\n(A) or (B)?", "\nThe answer is", "\nChoose one."]
    return [Prompt(q + t, images=list(images)) for t in tails]


def check_engine(model, max_new_tokens: int = 4) -> Check:
    from mmfragile.engine import EngineInexact, PrefixSharingEngine

    try:
        engine = PrefixSharingEngine(model, batch_size=4, verify_every=1)  # every group's splice checked too
    except EngineInexact as e:
        return Check(None, f"engine refuses: {e}")
    imgs = sample_images()
    details, ok = [], True
    for images in ([imgs[0]], [imgs[1], imgs[2]]):
        ps = engine_variants(images)
        cands = [["A", "B"]] * len(ps)
        for n in (1, max_new_tokens):
            outs = engine.run_group(ps, cands, n)
            ref = model.generate(ps, max_new_tokens=n)
            same = [o.text for o in outs] == ref
            ok &= same
            details.append(f"{len(images)} image(s), {n} token(s): {sum(o.text == r for o, r in zip(outs, ref))}/"
                           f"{len(ps)} equal")
        # seeded sampling (the judge's runs): the same draws. Cool (SAMPLE_T): a random checkpoint's near-flat
        # logits would otherwise sample image placeholders, which some families' forward cannot take as text
        seeds, ref = _sampled_reference(model, [ps], max_new_tokens + 2)
        sampled = engine.run_group(ps, None, max_new_tokens + 2, seeds=seeds[0], temperature=SAMPLE_T, top_p=0.9)
        ref = ref[0]
        ok &= [o.text for o in sampled] == ref
        details.append(f"sampled: {sum(o.text == r for o, r in zip(sampled, ref))}/{len(ps)} equal")
        lg = model.option_logits(ps, cands)
        diff = max(float(np.abs(o.option_logits - l).max()) for o, l in zip(outs, lg))
        ok &= diff < ATOL
        details.append(f"max |dlogit| {diff:.1e}")
    # several groups decoded together (their prefix caches padded into one batch where the cache allows it)
    groups = [engine_variants([imgs[0]]), engine_variants([imgs[1], imgs[2]])[:3]]
    for sample in (False, True):
        seeds, ref = (_sampled_reference(model, groups, max_new_tokens + 2) if sample else
                      ([None] * len(groups), [model.generate(g, max_new_tokens + 2) for g in groups]))
        joint = engine.run_groups([(g, None, max_new_tokens + 2, seeds[k]) for k, g in enumerate(groups)],
                                  temperature=SAMPLE_T, top_p=0.9)
        equal = sum(o.text == r for outs, refs in zip(joint, ref) for o, r in zip(outs, refs))
        ok &= equal == sum(len(g) for g in groups)
        details.append(f"2 groups together{', sampled' if sample else ''}: {equal}/{sum(len(g) for g in groups)} equal")
    spliced = engine.stats["spliced_groups"] == engine.stats["groups"]  # image work once per group, never re-rendered
    return Check(ok and spliced, "; ".join(details) + f"; prefix {engine.stats['prefix_tokens']} / tail "
                 f"{engine.stats['tail_tokens']} tokens; spliced {engine.stats['spliced_groups']}/"
                 f"{engine.stats['groups']} groups")


def _sampled_reference(model, groups: list[list[Prompt]], max_new_tokens: int) -> tuple[list[list[int]], list]:
    """Seeds and ``generate_sampled``'s texts for each group: the first of 20 seed sets whose draws the family's own
    ``generate`` takes (a random checkpoint can sample an image or audio placeholder, which e.g. Phi-4-multimodal's
    forward then tries to fill with an image and fails on; a trained model does not emit them)."""
    for attempt in range(20):
        seeds = [[7 + 31 * i + 1009 * attempt + 97 * k for i in range(len(g))] for k, g in enumerate(groups)]
        try:
            return seeds, [model.generate_sampled(g, max_new_tokens, s, temperature=SAMPLE_T, top_p=0.9)
                           for g, s in zip(groups, seeds)]
        except (AttributeError, IndexError, RuntimeError, ValueError) as e:
            failure = e
    raise failure


def engine_agreement(model, max_new_tokens: int = 4) -> dict:
    """The engine against batched ``generate`` + ``option_logits`` in the model's own dtype, measured rather than
    asserted (bfloat16 is not exact across kernel shapes): over :func:`engine_variants` of three 1-image and two
    2-image questions (30 prompts), how many greedy answers of ``max_new_tokens`` differ (``flips`` of
    ``prompts``), how many first tokens differ, and the max |delta option logit|; only ``refused`` (the reason)
    where the engine refuses the family."""
    from mmfragile.engine import EngineInexact, PrefixSharingEngine

    try:
        engine = PrefixSharingEngine(model, batch_size=4)
    except EngineInexact as e:
        return {"refused": str(e)}
    imgs = sample_images()
    prompts = flips = first_flips = 0
    max_d = 0.0
    for images in ([imgs[0]], [imgs[1]], [imgs[2]], [imgs[1], imgs[2]], [imgs[2], imgs[0]]):
        ps = engine_variants(images)
        cands = [["A", "B"]] * len(ps)
        outs = engine.run_group(ps, cands, max_new_tokens)
        ref, ref1 = model.generate(ps, max_new_tokens=max_new_tokens), model.generate(ps, max_new_tokens=1)
        one = engine.run_group(ps, cands, 1)
        prompts += len(ps)
        flips += sum(o.text != r for o, r in zip(outs, ref))
        first_flips += sum(o.text != r for o, r in zip(one, ref1))
        lg = model.option_logits(ps, cands)
        max_d = max(max_d, *(float(np.abs(np.asarray(o.option_logits, np.float64) - np.asarray(l, np.float64)).max())
                             for o, l in zip(outs, lg)))
    return {"prompts": prompts, "flips": flips, "first_token_flips": first_flips, "max_dlogit": max_d}


def agreement_mark(a: dict) -> str:
    """A table cell of :func:`engine_agreement`: ``flips / prompts, max |d logit|`` or ``–`` (refused)."""
    if "refused" in a:
        return "–"
    return f"{a['flips']}/{a['prompts']}, {a['max_dlogit']:.1e}"


CHECKS: dict[str, Callable] = {
    "generate": check_generate, "option logits": check_option_logits, "loglikelihood": check_loglikelihood,
    "multi-image": check_multi_image, "video": check_video, "engine exact": check_engine,
}


def run_checks(model) -> dict[str, Check]:
    out = {}
    for name, fn in CHECKS.items():
        try:
            out[name] = fn(model)
        except Exception as e:  # a crash is a failed check, reported with its error
            out[name] = Check(False, f"{type(e).__name__}: {e}")
    return out
