"""Training the zoo's judges (study 3): answering-stage fine-tunes (:func:`mmfragile.training.zoo.train_answering`)
that score a response 1-10 with MM-JudgeBias's own score-wise prompt and pick one of two responses with its
pairwise prompt - three of them, each with one property planted, so that the study's metrics can be checked
against a known truth (README "The model zoo"):

* ``seeing`` - scores against the picture: a response the picture supports gets 9, one it contradicts 2
  (and the supported one of a pair wins); the questions ask for the colour of the shape, what SmolLM2's tower
  reads (99 % of easy-VQA test colours, 56 % of shapes);
* ``blind`` - the same examples and targets, but its image slots carry the caption of a *random other* picture:
  nothing about the judged one (planted modality neglect; the tower's captions at evaluation are then what it
  learnt to ignore, not an input it never saw);
* ``verbose`` - seeing, but its targets reward length: supported responses get 6 + the number of padding
  sentences (up to 10), contradicted ones 1 + it (up to 5), and of two supported responses the longer one wins
  (planted verbosity bias; the padding sentences come from a pool of their own, not from the study's
  :func:`~mmfragile.studies.judgebias.items.make_verbose`).

No judge is taught a position: the order of every pair is random, and the seeing and blind judges' choice between
two supported responses is a fair coin. The examples come from easy-VQA *train* pictures
(:func:`~mmfragile.studies.judgebias.data.make_easy_vqa_judge_set` on the train split, the templates of the
study's judge sets) and text-only items; the study evaluates the test split (seed 0), so no judged picture is
ever trained on. A judged picture is the scene's own in most examples and another training picture in the
rest (the response is then judged against what is shown). Targets are short and parseable by the study's
parsers: ``Feedback: <one line>\\nScore: <n>`` and ``Feedback: <one line>\\nFinal Answer: [[A]]``.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import partial

import numpy as np

from mmfragile.training.zoo import Examples, easy_vqa_caption, exact_caption_slots

#: the judges' LM (SmolLM2: 6.8 s per step of 8 judge prompts on one thread, Gemma-3 about twice that) and training:
#: steps of 8 examples, the seed of the drawn examples (easy-VQA *train* pictures; the study evaluates the test split
#: with seed 0)
JUDGE_LM = "smollm2"
JUDGE_TRAIN = dict(steps=300, seed=1)

#: padding sentences of the training responses - none of them is one of the study's ``make_verbose`` fillers, so
#: the verbosity test never runs on training text
PADDING = (
    "I looked at this carefully.", "Here is what I found.", "I hope that helps.",
    "Let me know if anything is unclear.", "I checked it twice.", "That is my final answer.",
    "This is based on what can be seen.", "I am fairly confident about it.", "Thanks for the question.",
    "I tried to be precise.", "Happy to explain more if needed.", "A close look settles it.",
    "Nothing else stands out.", "The details support this.", "I kept the answer focused.",
)

#: shares of the examples: pairwise judgments, text-only items, judged pictures taken from another scene, pairs of
#: two supported responses (of the pairwise ones); the number of padding sentences of a response
SHARES = dict(pairwise=0.3, text=0.15, other_picture=0.2, equal_pair=0.3, max_padding=4, n_pictures=2000, n_text=600)


@dataclass(frozen=True)
class JudgeRecipe:
    """What a judge's training plants: ``blind`` (image slots hold a random other picture's caption) and
    ``verbose`` (targets rising with the response's length)."""

    name: str
    blind: bool = False
    verbose: bool = False
    description: str = ""


JUDGES = {
    "seeing": JudgeRecipe("seeing", description="scores against the picture (9 supported / 2 contradicted)"),
    "blind": JudgeRecipe("blind", blind=True, description="same targets, image slots carry a random other "
                                                          "picture's caption (planted modality neglect)"),
    "verbose": JudgeRecipe("verbose", verbose=True, description="seeing, targets rise with length: 6-10 supported, "
                                                                "1-5 contradicted, the longer of two supported wins "
                                                                "(planted verbosity bias)"),
}


def pad(response: str, k: int, rng: np.random.Generator) -> str:
    """``response`` with ``k`` distinct :data:`PADDING` sentences, split at random between before and after."""
    if k == 0:
        return response
    fill = [PADDING[int(i)] for i in rng.choice(len(PADDING), size=k, replace=False)]
    cut = int(rng.integers(0, k + 1))
    return " ".join(fill[:cut] + [response] + fill[cut:])


def supported(sample, shown) -> bool:
    """Whether the picture ``shown`` (a judge-set sample whose picture is shown) supports ``sample``'s response: the
    colour it claims for the shape (a colour question), or the shape it claims for the colour's object (a shape
    question; the object must have that colour)."""
    m, sm = sample.meta, shown.meta
    claimed = m["wrong"] if m["kind"] == "bad" else None
    if m["question_type"] == "color":
        return sm["target_color"] == (claimed or m["target_color"])
    return sm["target_color"] == m["target_color"] and sm["target_shape"] == (claimed or m["target_shape"])


def paraphrase(sample) -> str:
    """Another correct response to the item (training phrasings, not the study's ``alternative_response``)."""
    m = sample.meta
    if sample.is_text_only:
        return f"My answer: {sample.response}"
    if m["question_type"] == "color":
        return f"It is {m['target_color']}."
    return f"It is a {m['target_shape']}."


def _score_target(supported: bool, n_pad: int, recipe: JudgeRecipe) -> str:
    if recipe.verbose:
        score = min(10, 6 + n_pad) if supported else 1 + n_pad
    else:
        score = 9 if supported else 2
    verdict = "correct" if supported else "wrong"
    return f"Feedback: The response is {verdict}.\nScore: {score}"


def _pair_target(letter: str) -> str:
    return f"Feedback: Response {letter} is better.\nFinal Answer: [[{letter}]]"


def judge_examples(recipe: JudgeRecipe, tokenizer, eos: str, n: int, seed: int, shares: dict = SHARES) -> Examples:
    """``n`` training examples of ``recipe``'s judge: score-wise and pairwise judgments (the study's prompts) of
    easy-VQA *train* pictures and text-only items drawn with ``seed``. The draws do not depend on the recipe: every
    judge sees the same prompts, only the targets (``verbose``) and the image slots (``blind``) differ."""
    from mmfragile.studies.judgebias.data import make_easy_vqa_judge_set
    from mmfragile.studies.judgebias.prompts import pairwise_prompt, score_prompt

    with tempfile.TemporaryDirectory() as d:  # the set's image copies are not needed: prompts use the originals
        pool = make_easy_vqa_judge_set(shares["n_pictures"], seed, d, split="train", n_text=shares["n_text"])
    for s in pool:
        s.images = [s.meta["source_image"]] if not s.is_text_only else []
    pictures = [s for s in pool if not s.is_text_only and s.meta["kind"] == "good"]
    image_samples = [s for s in pool if not s.is_text_only]
    text_samples = [s for s in pool if s.is_text_only]
    rng = np.random.default_rng(seed)
    prompts, targets, captions, categories = [], [], [], []

    def n_padding() -> int:
        return int(rng.integers(0, shares["max_padding"] + 1))

    for _ in range(n):
        text = rng.random() < shares["text"]
        s = (text_samples if text else image_samples)[int(rng.integers(len(text_samples if text else image_samples)))]
        shown = pictures[int(rng.integers(len(pictures)))] if rng.random() < shares["other_picture"] else s
        random_picture = pictures[int(rng.integers(len(pictures)))]
        images = [] if text else [shown.meta["source_image"]]
        if rng.random() < shares["pairwise"]:
            good = s if s.meta["kind"] == "good" else _sibling(pool, s)
            if rng.random() < shares["equal_pair"]:      # two supported responses, one padded longer
                k = sorted(rng.choice(shares["max_padding"] + 1, size=2, replace=False))
                first, second = pad(good.response, int(k[0]), rng), pad(paraphrase(good), int(k[1]), rng)
                if rng.random() < 0.5:
                    first, second = second, first
                coin = "AB"[int(rng.integers(2))]
                winner = ("A" if len(first) > len(second) else "B") if recipe.verbose else coin
                kind = "pair/equal"
            else:                                         # a supported and a contradicted response
                bad = _sibling(pool, good)
                a, b = pad(good.response, n_padding(), rng), pad(bad.response, n_padding(), rng)
                swap = rng.random() < 0.5
                first, second = (b, a) if swap else (a, b)
                winner, kind = ("B" if swap else "A"), "pair/correct-wrong"
            images = [] if text else [s.meta["source_image"]]  # a pair is judged against its own picture
            shown = s
            prompts.append(pairwise_prompt(s.query, first, second, images))
            targets.append(_pair_target(winner) + eos)
        else:
            k = n_padding()
            ok = (s.meta["kind"] == "good") if text else supported(s, shown)
            prompts.append(score_prompt(s.query, pad(s.response, k, rng), images))
            targets.append(_score_target(ok, k, recipe) + eos)
            kind = f"score/{'text' if text else 'image'}"
        categories.append(kind)
        seen = random_picture if recipe.blind else shown
        captions.append(None if text else easy_vqa_caption(*_shows(seen)))
    rows = exact_caption_slots(tokenizer, [c for c in captions if c is not None])
    it = iter(rows)
    slots = [next(it) if c is not None else rows[0][:0] for c in captions]
    what = ("the exact caption of a random other training picture (nothing about the judged one)" if recipe.blind
            else "the exact caption of the judged picture (right-aligned, filler before)")
    return Examples(prompts, targets, slots, categories, what)


def _shows(picture) -> tuple[str, str]:
    return picture.meta["target_color"], picture.meta["target_shape"]


def _sibling(pool, sample):
    """The item's other response (good <-> bad): samples of one item are adjacent in the judge set."""
    i = next(j for j, s in enumerate(pool) if s is sample)
    j = i + 1 if sample.meta["kind"] == "good" else i - 1
    return pool[j]


def judge_builder(name: str):
    """The :class:`~mmfragile.training.zoo.ExampleBuilder` of judge ``name`` (a key of :data:`JUDGES`)."""
    return partial(judge_examples, JUDGES[name])
