"""Study 3 (MM-JudgeBias) - the run side: conditions, pairs, self-generated responses, how an output is
scored into a row and the store config; :mod:`mmfragile.studies.judgebias.analysis` reads the stores back.

MM-JudgeBias, Lee, Park, Im; arXiv 2604.18164) end to end on any judge.

Pipeline (Sec. 3-4 of the seed):

1. :func:`build_judge_conditions` - every unbiased sample plus its biased counterparts under the nine
   perturbations of Table 1 (:mod:`mmfragile.studies.judgebias.perturbations`), with an audit copy of every judged
   input (PNG + JSON sidecar) and a manifest.
2. the ``scores`` stage (:func:`mmfragile.study.run_study`) - the score-wise judgment (App. E, Fig. 11 prompt,
   :func:`~mmfragile.studies.judgebias.prompts.score_prompt`) of every condition, ``runs`` times, into a resumable
   :class:`~mmfragile.store.ResultStore`; raw output,
   parsed score and - for an unparseable output - ``score = NaN``, ``status = "unparseable"`` and the
   parser's reason in ``parse_error`` (counted, never defaulted: :func:`parse_failure_table`).
3. the ``pairwise`` stage - the pairwise judgment (Fig. 12 prompt) for position bias (:func:`position_pairs`,
   swap-and-check) and verbosity bias (:func:`verbosity_pairs`, balanced positions), App. H.
4. Self-enhancement (Sec. 4.3, App. H: "auditing the logs from our main experiments" - i.e. *pointwise*
   scores grouped by the model that wrote the response): the ``responses`` stage has each generator
   (the judge itself and other models) answer the unbiased queries, the ``selfgen`` stage scores them; the
   ``generator`` column feeds :func:`mmfragile.studies.judgebias.metrics.self_enhancement`.
5. :func:`judgment_table`, :func:`position_table`, :func:`verbosity_table`, :func:`selfgen_table` turn the
   stored rows into the tables of :mod:`mmfragile.studies.judgebias.metrics`.

What a *run* is
---------------
The paper performs "three experimental runs ... given the intrinsic consistency issue of MLLMs" (Table 2
caption) with each model's default ``temperature``/``top_p`` (Sec. 4.1): a run re-executes the *same*
judgment on the *same* (fixed) biased and unbiased triplets, and the inter-run variance measures
execution-level stochasticity ("execution-level stochasticity and sample-level differentiation are
distinct phenomena", Sec. 4.2). Greedy decoding would make all runs identical (inter-run variance 0 - as
the paper reports for LLaVA-Critic, whose default decoding is greedy). So here run ``r`` is **seeded
sampled decoding** (``decoding="sample"``, default ``temperature=0.7, top_p=0.9``: SmolLM2's GGUF ships no
sampling defaults, so we use common open-model chat defaults). The sample of each judgment is drawn with a
per-judgment random stream seeded by ``(seed, judge, sample_id, condition, prompt variant, run)``
(:func:`judgment_seed`) via the Gumbel-max trick, so a judgment's text does not depend on the batch it
ran in or on the order of a resumed run: rerunning reproduces it exactly. The perturbed inputs are built
once (one perturbation ``seed``) and shared by all runs, as the benchmark's triplets are. ``decoding=
"greedy"`` is available for deterministic judges (every run then repeats run 0).

Which conditions a sample takes
-------------------------------
As in the benchmark, image samples take the eight image perturbations and text-only samples only
Unnecessary-Image (App. C.4: the text-only subset exists for that bias type). A text-only judge (e.g.
``smollm2``) cannot read an image: conditions with images are skipped for it (counted in the report,
not stored), so it judges only the unbiased text-only items.

Stand-ins for the paper's model-dependent steps (all recorded in the audit sidecars): Detail-Description
captions come from the synthetic scene's ground-truth facts (:func:`scene_captioner`) unless a
``captioner`` is given - an accurate, aligned description as the paper intends (GPT-5.1 captions);
captioning with the embedded VLM would describe noise, its vision tower being random. Texture-Insertion
keywords use :func:`~mmfragile.studies.judgebias.perturbations.heuristic_keyword`; Unnecessary-Image uses no relevance
filter (the synthetic arithmetic/word items and shape scenes are unrelated by construction).
"""
from __future__ import annotations

import json
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from mmfragile.studies.judgebias.metrics import PERTURBATIONS
from mmfragile.studies.judgebias.perturbations import (UNPERTURBED, JudgeSample, PerturbationError, apply_perturbation,
                             save_perturbed)
from mmfragile.studies.judgebias.prompts import (SCORE_VARIANTS, ScoreParseError, parse_pairwise, parse_score,
                                                 parse_score_or_na)
from mmfragile.shards import question_group
from mmfragile.paths import safe_name

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "DEFAULT_TEMPERATURE", "DEFAULT_TOP_P", "DATASET", "SELFGEN_DATASET",
    "EXPERIMENTS", "applicable", "unavailable", "scene_description", "scene_captioner", "build_judge_conditions",
    "release_conditions", "judgment_seed", "parse_prompt_variant", "sample_group", "PairItem",
    "position_pairs", "verbosity_pairs", "make_verbose", "alternative_response", "reference_responses",
    "selfgen_samples", "selfgen_sample", "selfgen_group",
    "check_decoding", "choice_row", "sample_dataset", "score_row"]

#: Judge output budget. The paper allows 16384 tokens (Sec. 4.1); on CPU we cap it. SmolLM2 usually writes
#: its "Score: N" within ~60 tokens when it writes one at all; a truncated output without a score is
#: recorded as unparseable.
DEFAULT_MAX_NEW_TOKENS = 80
DEFAULT_TEMPERATURE = 0.7
DEFAULT_TOP_P = 0.9
#: ``dataset`` key of the main judgments (the synthetic set's samples carry it in ``meta["dataset"]``).
DATASET = "synthetic-judge"
#: ``dataset`` key of the self-enhancement judgments (responses written by generator models).
SELFGEN_DATASET_SUFFIX = "-selfgen"
SELFGEN_DATASET = DATASET + SELFGEN_DATASET_SUFFIX
EXPERIMENTS = ("position", "verbosity")
_IMAGE_FREE_PERTURBATIONS = ("unnecessary_image",)


# ---------------------------------------------------------------------------------------------- conditions
def applicable(perturbation: str, sample: JudgeSample) -> bool:
    """Whether the benchmark pairs ``sample`` with ``perturbation``: Unnecessary-Image for text-only
    samples, the other eight for samples with an image; ``"original"`` for every sample."""
    if perturbation == UNPERTURBED:
        return True
    if perturbation in _IMAGE_FREE_PERTURBATIONS:
        return sample.is_text_only
    return not sample.is_text_only


def unavailable(perturbations: Iterable[str], samples: Sequence[JudgeSample]) -> dict[str, str]:
    """The ``perturbations`` no sample of ``samples`` can take, each with the reason (what the records lack):
    the image ones need an image, Unnecessary-Image a text-only record and an image to add, the misalignments
    a second record to take the query / image from, Detail-Description a description of the image (a record's
    ``caption`` or the synthetic scene's facts)."""
    with_image = [s for s in samples if not s.is_text_only]
    items = {str(s.meta.get("item_id", s.sample_id)) for s in samples}
    image_items = {str(s.meta.get("item_id", s.sample_id)) for s in with_image}
    out = {}
    for p in dict.fromkeys(str(p) for p in perturbations):
        if p == UNPERTURBED:
            continue
        if p in _IMAGE_FREE_PERTURBATIONS:
            why = ("it adds an unrelated image to a text-only record, and every record has an image"
                   if len(with_image) == len(samples) else "no record has an image to add" if not with_image else "")
        elif not with_image:
            why = "it changes the image, and no record has one"
        elif p == "instruction_misalignment" and len(items) < 2:
            why = "it takes the query of another record, and there is only one"
        elif p == "image_misalignment" and len(image_items) < 2:
            why = "it takes the image of another record, and only one has an image"
        elif p == "detail_description" and not any(_describable(s) for s in with_image):
            why = "it appends a description of the image to the query: give the records a 'caption'"
        else:
            why = ""
        if why:
            out[p] = why
    return out


def _describable(sample: JudgeSample) -> bool:
    return bool(sample.meta.get("caption") or sample.meta.get("objects"))


_ROWS = ("top", "middle", "bottom")
_COLS = ("left", "centre", "right")


def scene_description(meta: Mapping[str, Any], size: tuple[int, int]) -> str:
    """A detailed, accurate description of a synthetic scene from its ground-truth facts
    (:func:`mmfragile.studies.judgebias.data.make_judge_set` metadata): background and every shape with
    colour and position (3x3 grid), in drawing order."""
    objs = list(meta.get("objects") or [])
    if not objs:
        raise PerturbationError("scene_description: the sample has no scene facts (meta['objects'])")
    w, h = size
    parts = []
    for o in objs:
        cx, cy = o["center"]
        r = _ROWS[min(2, max(0, int(cy / (h / 3))))]
        c = _COLS[min(2, max(0, int(cx / (w / 3))))]
        where = "the centre" if (r, c) == ("middle", "centre") else f"the {r} {c}"
        parts.append(f"a {o['color']} {o['shape']} in {where}")
    listing = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    n = len(objs)
    return (f"The image shows {n} coloured shape{'s' if n != 1 else ''} on a plain {meta.get('background', 'plain')} "
            f"background: {listing}. There is no text in the image.")


def scene_captioner(sample: JudgeSample) -> Callable:
    """``captioner(image) -> str`` for :func:`~mmfragile.studies.judgebias.perturbations.detail_description`: the
    record's own ``caption`` (``meta["caption"]``, flat judge data) if it has one, else a description of ``sample``'s
    synthetic scene from its facts (the image only supplies the size)."""
    given = sample.meta.get("caption")

    def caption(img) -> str:
        return str(given) if given else scene_description(sample.meta, img.size)

    caption.__name__ = "record_caption" if given else "scene_facts_captioner"
    return caption


def sample_dataset(sample: JudgeSample) -> str:
    return str(sample.meta.get("dataset") or DATASET)


def build_judge_conditions(samples: Sequence[JudgeSample], perturbations: Iterable[str] = PERTURBATIONS,
                           seed: int = 0, out_dir: str | Path | None = None, captioner: Callable | None = None, *,
                           keyword_extractor: Callable | None = None, relevance_checker: Callable | None = None,
                           pool: Sequence[JudgeSample] | None = None) -> list[tuple[str, JudgeSample]]:
    """``[(condition, sample), ...]``: ``("original", s)`` for every sample, then every applicable
    perturbation (:func:`applicable`) of every sample, in the order of ``perturbations``.

    ``seed`` fixes every random draw (donors, visual operations, text source), ``pool`` (default
    ``samples``) supplies the misalignment / unnecessary-image donors. ``captioner(image) -> str`` is used
    for Detail-Description; without one, :func:`scene_captioner` describes synthetic scenes from their facts
    (a sample without facts then raises). A :class:`~mmfragile.studies.judgebias.perturbations.PerturbationError` on an
    applicable pair (e.g. no donor) skips that pair with a warning and a ``status: "error"`` manifest line.

    With ``out_dir`` every judged input is written for audit by
    :func:`~mmfragile.studies.judgebias.perturbations.save_perturbed` to ``out_dir/<condition>/<sample_id>__<condition>.{png,json}``
    and listed in ``out_dir/manifest.jsonl`` (condition, sample_id, json path, status, reason).
    """
    perts = [p for p in dict.fromkeys(str(p) for p in perturbations) if p != UNPERTURBED]
    unknown = [p for p in perts if p not in PERTURBATIONS]
    if unknown:
        raise KeyError(f"unknown perturbation(s) {unknown}; known: {list(PERTURBATIONS)}")
    ids = [s.sample_id for s in samples]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"build_judge_conditions: duplicate sample_id(s) {dup[:5]}")
    pool = list(samples if pool is None else pool)
    out: list[tuple[str, JudgeSample]] = []
    manifest: list[dict] = []
    root = Path(out_dir) if out_dir is not None else None

    def record(cond: str, s: JudgeSample, status: str = "ok", reason: str = "") -> None:
        entry = {"condition": cond, "sample_id": s.sample_id, "status": status, "reason": reason}
        if root is not None and status == "ok":
            path = save_perturbed(s, root / cond)
            entry["file"] = str(path.relative_to(root))
        manifest.append(entry)

    for s in samples:
        o = apply_perturbation(UNPERTURBED, s)
        out.append((UNPERTURBED, o))
        record(UNPERTURBED, o)
    for p in perts:
        for s in samples:
            if not applicable(p, s):
                continue
            opts: dict[str, Any] = {}
            if p == "detail_description":
                opts["captioner"] = captioner if captioner is not None else scene_captioner(s)
            elif p == "texture_insertion" and keyword_extractor is not None:
                opts["keyword_extractor"] = keyword_extractor
            elif p == "unnecessary_image" and relevance_checker is not None:
                opts["relevance_checker"] = relevance_checker
            try:
                b = apply_perturbation(p, s, pool, seed, **opts)
            except PerturbationError as e:
                warnings.warn(f"build_judge_conditions: {p} skipped for {s.sample_id!r}: {e}")
                record(p, s, "error", str(e))
                continue
            out.append((p, b))
            record(p, b)
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / "manifest.jsonl", "w", encoding="utf-8") as f:
            for m in manifest:
                f.write(json.dumps({"seed": int(seed), **m}, ensure_ascii=False) + "\n")
    return out


# ---------------------------------------------------------------------------------------------- decoding
def release_conditions(samples: Sequence[JudgeSample],
                       perturbations: Iterable[str] = PERTURBATIONS) -> list[tuple[str, JudgeSample]]:
    """The MM-JudgeBias release's own triplets as ``[(condition, sample), ...]``: for every released record
    (:func:`mmfragile.studies.judgebias.data.load_judge_dir`, paired shape) ``("original", unbiased)`` and
    ``(bias_type, biased)`` - the benchmark's fixed pairs (Sec. 3.4), no perturbation is regenerated.
    Records whose bias type is not in ``perturbations`` are left out; an unknown bias type is a
    :class:`~mmfragile.errors.DataError` naming the record's file and row."""
    from mmfragile.errors import DataError

    wanted = [p for p in dict.fromkeys(str(p) for p in perturbations) if p != UNPERTURBED]
    unknown = [p for p in wanted if p not in PERTURBATIONS]
    if unknown:
        raise KeyError(f"unknown perturbation(s) {unknown}; known: {list(PERTURBATIONS)}")
    by_id: dict[str, dict[str, JudgeSample]] = {}
    for s in samples:
        role = s.meta.get("role")
        if role not in ("unbiased", "biased"):
            raise DataError(f"{s.meta.get('source_file')}, row {s.meta.get('source_row')}: sample {s.sample_id!r} is "
                            "not from a released (paired) record; use build_judge_conditions for flat samples")
        by_id.setdefault(s.sample_id, {})[role] = s
    out: list[tuple[str, JudgeSample]] = []
    for sid, pair in by_id.items():
        b = pair.get("biased")
        bias = b.perturbation if b is not None else None
        if bias not in PERTURBATIONS:
            src = (b or pair["unbiased"]).meta
            raise DataError(f"{src.get('source_file')}, row {src.get('source_row')}: bias_type {bias!r} is not one "
                            f"of the nine types {list(PERTURBATIONS)}")
        if bias in wanted and "unbiased" in pair:
            out += [(UNPERTURBED, pair["unbiased"]), (bias, b)]
    return out


def judgment_seed(seed: int, *parts: Any) -> int:
    """A 63-bit seed for one judgment from the run seed and its identifying parts (judge, sample id,
    condition, prompt variant, run ...): independent of batching and processing order."""
    words = [int(seed)] + [zlib.crc32(str(p).encode("utf-8")) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0]) & ((1 << 63) - 1)


def check_decoding(decoding: str, runs: int) -> None:
    if decoding not in ("greedy", "sample"):
        raise ValueError(f"decoding must be 'greedy' or 'sample', got {decoding!r}")
    if int(runs) < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    if decoding == "greedy" and runs > 1:
        warnings.warn("greedy decoding is deterministic: every run repeats run 0 (inter-run variance 0); "
                      "use decoding='sample' for runs in the paper's sense")


# ---------------------------------------------------------------------------------------------- scoring
def parse_prompt_variant(variant: str) -> tuple[str, bool]:
    """``"original"``, ``"score_guide"``, ``"constraints"``, ``"reasoning"`` (Tables 4/16), ``"na"``
    (= original with the N/A option, Table 3) or ``"<variant>+na"`` -> (score-prompt variant, allow_na)."""
    v = str(variant)
    if v == "na":
        return "original", True
    base, plus, tail = v.partition("+")
    if plus and tail != "na":
        raise ValueError(f"prompt variant {variant!r}: only '+na' may be appended")
    if base not in SCORE_VARIANTS:
        raise ValueError(f"unknown prompt variant {variant!r}; choose from {SCORE_VARIANTS}, 'na' or '<v>+na'")
    return base, bool(plus)




def sample_group(sample: JudgeSample) -> str:
    """The question group of every judgment of ``sample`` (all conditions and runs stay together)."""
    return question_group(sample_dataset(sample), sample.sample_id)


def score_row(raw: str, allow_na: bool) -> dict[str, Any]:
    try:
        v = parse_score_or_na(raw) if allow_na else parse_score(raw)
    except ScoreParseError as e:
        return {"score": float("nan"), "status": "unparseable", "parse_error": e.reason}
    if v is None:
        return {"score": float("nan"), "status": "na", "parse_error": ""}
    return {"score": float(v), "status": "ok", "parse_error": ""}


# ---------------------------------------------------------------------------------------------- pairwise
@dataclass
class PairItem:
    """One pairwise judgment (Fig. 12 prompt): ``query`` + ``images`` and two candidates shown as A and B.

    ``experiment``: ``"position"`` (``info["swapped"]``: False = (R1, R2), True = (R2, R1)) or
    ``"verbosity"`` (``info["verbose_position"]``: ``"A"``/``"B"``). ``order`` names the presentation
    (``"AB"``/``"BA"``) and is part of the store key."""

    experiment: str
    sample_id: str
    order: str
    query: str
    images: list
    response_a: str
    response_b: str
    dataset: str = DATASET
    info: dict = field(default_factory=dict)


def alternative_response(sample: JudgeSample) -> str:
    """A second high-quality response with the same content as a correct synthetic response (position
    bias needs "two high-quality responses", App. H): the record's ``reference`` answer if it has one, else the
    answer restated from the scene facts."""
    m = sample.meta
    if m.get("reference"):
        return str(m["reference"])
    qt = m.get("question_type")
    if qt == "count":
        k = int(m["count"])
        return f"I count {k} {m['target_color']} {m['target_shape']}{'s' if k != 1 else ''}. So the answer is {k}."
    if qt == "color":
        return f"The colour of the {m['target_shape']} is {m['target_color']}."
    if qt == "shape":
        return f"It is a {m['target_shape']}: the {m['target_color']} object has the shape of a {m['target_shape']}."
    return f"Answer: {sample.response}"


def position_pairs(samples: Sequence[JudgeSample], second: Callable[[JudgeSample], str] = alternative_response,
                   kinds: Sequence[str] | None = ("good",)) -> list[PairItem]:
    """Swap-and-check pairs (App. H, position bias): for every sample (of ``kinds`` in ``meta["kind"]``;
    None = all) its response R1 and ``second(sample)`` R2, once as (A=R1, B=R2), once as (A=R2, B=R1)."""
    out = []
    for s in samples:
        if kinds is not None and s.meta.get("kind") not in kinds:
            continue
        r1, r2 = s.response, second(s)
        for swapped in (False, True):
            a, b = (r2, r1) if swapped else (r1, r2)
            out.append(PairItem("position", s.sample_id, "BA" if swapped else "AB", s.query, list(s.images), a, b,
                                sample_dataset(s), {"swapped": swapped}))
    return out


_VERBOSE_PREFIX = (
    "Thank you for the question.",
    "Let me look at this carefully before answering.",
    "I have examined the provided input closely to make sure my answer is accurate.",
    "This is a good question, and it can be answered directly.",
)
_VERBOSE_SUFFIX = (
    "I hope this answer is helpful.",
    "To restate the answer clearly: {response}",
    "This conclusion follows directly from the information provided.",
    "Please let me know if you need any further clarification.",
    "In summary, the answer above addresses the question as asked.",
)


def make_verbose(response: str, seed: int = 0, key: str = "") -> str:
    """A semantically equivalent but longer response (App. H: "redundant or filler sentences that preserve
    the original semantic content"; the paper writes them by hand): two filler sentences before and two
    after ``response`` (one may restate it), drawn with ``seed`` and ``key``."""
    rng = np.random.default_rng(judgment_seed(seed, "verbose", key))
    pre = [_VERBOSE_PREFIX[i] for i in sorted(rng.choice(len(_VERBOSE_PREFIX), 2, replace=False))]
    post = [_VERBOSE_SUFFIX[i].format(response=response.strip()) for i in
            sorted(rng.choice(len(_VERBOSE_SUFFIX), 2, replace=False))]
    return " ".join(pre + [response.strip()] + post)


def verbosity_pairs(samples: Sequence[JudgeSample], seed: int = 0, kinds: Sequence[str] | None = ("good",),
                    verbose: Callable[[str, int, str], str] = make_verbose) -> list[PairItem]:
    """Balanced verbosity pairs (App. H): original vs ``verbose(response, seed, sample_id)``, with the
    verbose response once in position B (order ``"AB"``: original first) and once in position A."""
    out = []
    for s in samples:
        if kinds is not None and s.meta.get("kind") not in kinds:
            continue
        v = verbose(s.response, seed, s.sample_id)
        out.append(PairItem("verbosity", s.sample_id, "AB", s.query, list(s.images), s.response, v, sample_dataset(s),
                            {"verbose_position": "B", "verbose_response": v}))
        out.append(PairItem("verbosity", s.sample_id, "BA", s.query, list(s.images), v, s.response, sample_dataset(s),
                            {"verbose_position": "A", "verbose_response": v}))
    return out


def choice_row(raw: str) -> dict[str, Any]:
    try:
        return {"choice": parse_pairwise(raw), "status": "ok", "parse_error": ""}
    except ScoreParseError as e:
        return {"choice": None, "status": "unparseable", "parse_error": e.reason}


# ---------------------------------------------------------------------------------------------- self-enhancement
def selfgen_samples(samples: Sequence[JudgeSample]) -> list[JudgeSample]:
    """One unbiased sample per source item (``meta["item_id"]``; the first one seen), the queries every
    generator answers for the self-enhancement analysis."""
    seen, out = set(), []
    for s in samples:
        item = str(s.meta.get("item_id", s.sample_id))
        if item not in seen:
            seen.add(item)
            out.append(s)
    return out


def selfgen_sample(source: JudgeSample, response: str, generator: str) -> JudgeSample:
    """``source``'s query and image with ``generator``'s ``response``, as an unbiased sample
    ``<item_id>@<generator>`` of dataset ``<dataset>-selfgen`` (``gold_score`` None, ``meta["generator"]``)."""
    item = str(source.meta.get("item_id", source.sample_id))
    g = source.copy()
    g.sample_id = f"{item}@{safe_name(generator)}"
    g.response = response
    g.gold_score = None
    g.meta.update(generator=generator, dataset=sample_dataset(source) + SELFGEN_DATASET_SUFFIX, kind="generated",
                  perturbation=UNPERTURBED, source_sample=source.sample_id)
    return g


def selfgen_group(sample: JudgeSample) -> str:
    """The question group of a self-generated sample: its source sample's, so that the generators' responses and
    the judge's scores of them fall in the same shard."""
    source = str(sample.meta.get("dataset", DATASET)).removesuffix(SELFGEN_DATASET_SUFFIX)
    return question_group(source, sample.meta.get("source_sample", sample.sample_id))


def reference_responses(samples: Sequence[JudgeSample], kind: str = "good", name: str = "reference") -> list[JudgeSample]:
    """The dataset's own responses of ``meta["kind"] == kind`` (the correct ones by default) - or, for flat judge
    data, each item's ``reference`` answer (``meta["reference"]``) - as a further "generator" ``name`` for the
    self-enhancement comparison - a quality anchor next to the models' responses (same ids and dataset scheme as
    the generators' responses, :func:`selfgen_sample`)."""
    kept = [selfgen_sample(s, s.response, name) for s in samples if s.meta.get("kind") == kind]
    return kept + [selfgen_sample(s, str(s.meta["reference"]), name) for s in selfgen_samples(samples)
                   if s.meta.get("reference") and "kind" not in s.meta]


# ---------------------------------------------------------------------------------------------- stores, tables
