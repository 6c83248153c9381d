"""Study 3 as a :class:`~mmfragile.study.Study`: an MLLM judge under the nine perturbations of Table 1.

Stages (each into a store under the results folder, shared by every judge - the judge is the store's ``model``):

* ``scores`` (``scores/``): every condition x prompt variant x run, score-wise (Fig. 11 prompt), seeded sampled
  decoding (or greedy);
* ``pairwise`` (``pairwise/``, with ``pairwise``): position and verbosity pairs (App. H, Fig. 12 prompt);
* ``responses`` (``responses/``, with ``self_generators``): each generator - the judge itself and the
  ``self_generators`` - answers one query per item, greedily;
* ``selfgen`` (``scores/``, with ``self_generators``): the judge scores those responses (and, with
  ``self_reference``, the dataset's correct ones) - self-enhancement, App. H.

``mmfragile run judge --model JUDGE --out DIR`` (alias ``mmfragile judge``) and notebook ``50_judgebias_run``
run it; :mod:`mmfragile.studies.judgebias.analysis` turns the stores into the tables of the metrics module.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from mmfragile.errors import UsageError
from mmfragile.models.base import MLLM, Prompt
from mmfragile.models.spec import ModelSpec
from mmfragile.runner import EvalItem
from mmfragile.shards import question_group
from mmfragile.store import ResultStore
from mmfragile.study import MODE, Param, RunContext, Stage, Study, csv_list, register
from mmfragile.studies.judgebias.analysis import bias_table, parse_failure_table
from mmfragile.studies.judgebias.items import (DATASET, DEFAULT_MAX_NEW_TOKENS, DEFAULT_TEMPERATURE, DEFAULT_TOP_P,
                                               EXPERIMENTS, PairItem, build_judge_conditions,
                                               check_decoding, choice_row, judgment_seed, parse_prompt_variant,
                                               position_pairs, reference_responses, release_conditions, sample_dataset,
                                               sample_group, score_row, selfgen_group, selfgen_sample, selfgen_samples,
                                               unavailable, verbosity_pairs)
from mmfragile.studies.judgebias.data import (EASY_VQA_JUDGE_DATASET, JudgeSample, load_judge_dataset,
                                               make_easy_vqa_judge_set, make_judge_set)
from mmfragile.studies.judgebias.metrics import PERTURBATIONS
from mmfragile.studies.judgebias.prompts import pairwise_prompt, score_prompt
from mmfragile.studies.judgebias.report import report as judge_report

__all__ = ["STUDY", "JudgeData", "score_items", "pair_items", "judge_samples_name"]

PARAMS = (
    Param(name="n_samples", default=8, help="image scenes of the synthetic judge set (release: samples read)",
          type=int),
    Param(name="seed", default=0, help="seed of the judge set, the perturbations and the sampled runs", type=int),
    Param(name="perturbations", default=list(PERTURBATIONS), help="perturbations of Table 1 (default: all nine)",
          type=csv_list),
    Param(name="prompt_variants", default=["original"],
          help="score-prompt variants: original, na, score_guide, constraints, reasoning, <v>+na", type=csv_list),
    Param(name="runs", default=2, help="sampled runs per judgment (the paper's repeated judgments)", type=int),
    Param(name="decoding", default="sample",
          help="sample: seeded runs; greedy: deterministic (every run repeats run 0)", type=str,
          choices=("sample", "greedy")),
    Param(name="temperature", default=DEFAULT_TEMPERATURE, help="sampling temperature", type=float),
    Param(name="top_p", default=DEFAULT_TOP_P, help="nucleus sampling", type=float),
    Param(name="max_new_tokens", default=DEFAULT_MAX_NEW_TOKENS,
          help="score-wise judgment budget (the paper allows 16384)", type=int),
    Param(name="pairwise", default=False, help="also the position and verbosity pairs (Sec. 4.3)", type=bool),
    Param(name="pairwise_max_new_tokens", default=64, help="pairwise judgment budget", type=int),
    Param(name="self_generators", default=None,
          help="other response generators for self-enhancement (the judge is always one); unset: no "
               "self-enhancement", type=csv_list),
    Param(name="self_reference", default=True,
          help="with self-enhancement: also score the dataset's correct responses", type=bool),
    Param(name="generator_max_new_tokens", default=48, help="budget of the generators' responses", type=int),
    MODE,
    Param(name="batch_size", default=16, help="prompts per batch (the engine sizes its own tail batches)", type=int),
    Param(name="flush_every", default=32, help="rows per Parquet part", type=int),
    Param(name="skip_bad_rows", default=False,
          help="release data: leave bad records out (listed in the stores' config.json)", type=bool),
)


@dataclass
class JudgeData:
    """The driver's data: the unbiased samples and every (condition, sample) to judge."""

    samples: list[JudgeSample]
    conditions: list[tuple[str, JudgeSample]]


def _builtin_set(dataset: str | None):
    """The builder of a generated judge set: the synthetic scenes (``synthetic``, the default) or easy-VQA test
    pictures (``easy-vqa-judge``, what the zoo's towers read); None for a release spec."""
    if dataset in (None, "synthetic", DATASET):
        return make_judge_set
    return make_easy_vqa_judge_set if dataset == EASY_VQA_JUDGE_DATASET else None


def judge_samples_name(samples: Any) -> str:
    """The dataset name judge samples given to ``run_study`` are stored under: their datasets'; anything but a
    non-empty list of :class:`JudgeSample` raises, naming what to pass."""
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence) or not samples \
            or not all(isinstance(s, JudgeSample) for s in samples):
        raise ValueError("dataset: the judge study reads a dataset spec (synthetic, easy-vqa-judge, "
                         "judge-dir:<file> - docs/judge-data.md - or mm-judgebias:<data>) or a non-empty list of "
                         f"JudgeSample (make_judge_set), not a {type(samples).__name__}")
    return "+".join(sorted({sample_dataset(s) for s in samples}))


def load(ctx: RunContext) -> JudgeData:
    """Judge samples given in memory (a list of :class:`JudgeSample`), a generated judge set (``dataset``
    "synthetic" or "easy-vqa-judge", written under ``<folder>/data``), a user's flat records
    (``judge-dir:<file or folder>``, docs/judge-data.md) - these three perturbed here, the judged inputs saved
    for audit under ``<folder>/audit`` - or the released benchmark's own pairs (``mm-judgebias:<data>[::<images>]``).
    A perturbation no record can take is left out with a warning and listed in ``run_info["left_out"]``."""
    p = ctx.params
    check_decoding(p["decoding"], p["runs"])
    if p["decoding"] == "sample" and not ctx.model.can("can_sample"):   # before any model loads or any row runs
        raise UsageError(f"{ctx.model_name} ({ctx.model.backend} backend) cannot sample with a seed, which "
                         "--decoding sample (the default: seeded runs) needs: pass --decoding greedy")
    if ctx.n is not None:  # accepted by every study's command line, but a judge set is counted in samples
        raise UsageError(f"the judge study takes --n-samples N (n_samples=; default {p['n_samples']}), not --n")
    bad: list[dict] = []
    if ctx.table is not None:   # samples given in memory (judge_samples_name checked them)
        samples = list(ctx.table)
    elif _builtin_set(ctx.dataset):
        samples = _builtin_set(ctx.dataset)(p["n_samples"], p["seed"], ctx.folder / "data")
    else:
        samples = load_judge_dataset(ctx.dataset, n=p["n_samples"], skipped=bad if p["skip_bad_rows"] else None)
    if any(s.meta.get("role") in ("unbiased", "biased") for s in samples):  # the release: its fixed pairs
        conditions, left_out = release_conditions(samples, p["perturbations"]), {}
    else:
        left_out = unavailable(p["perturbations"], samples)
        for name, why in left_out.items():
            warnings.warn(f"{name} left out: {why}")
        conditions = build_judge_conditions(samples, [x for x in p["perturbations"] if x not in left_out], p["seed"],
                                            ctx.folder / "audit")
    ctx.run_info = {"n_samples": len(samples), "skipped_rows": bad, "left_out": left_out}
    return JudgeData(samples, conditions)


def _config(ctx: RunContext) -> dict[str, Any]:
    """Every judge stage's store config: what changes its rows (the tag is added by the runner)."""
    p = ctx.params
    extra = {} if ctx.dataset in (None, "synthetic", DATASET) else {"dataset": ctx.dataset}
    keys = ("seed", "n_samples", "max_new_tokens", "decoding", "temperature", "top_p", "pairwise_max_new_tokens",
            "generator_max_new_tokens")
    return {**{k: p[k] for k in keys}, **extra}


def _decoding(params: dict, seed: int) -> dict[str, Any]:
    """An item's request and the decoding columns it stores."""
    sample = params["decoding"] == "sample"
    item = {"request": "sample", "seed": seed, "temperature": params["temperature"], "top_p": params["top_p"]} \
        if sample else {"request": "generate"}
    columns = {"decoding": params["decoding"], "temperature": float(params["temperature"]) if sample else float("nan"),
               "top_p": float(params["top_p"]) if sample else float("nan"), "sample_seed": str(seed) if sample else ""}
    return {"item": item, "columns": columns}


# ============================================================================================== score-wise
def score_items(judge: MLLM, units: Sequence[tuple[str, JudgeSample]], params: dict,
                skipped: list | None = None, group_of=None) -> list[EvalItem]:
    """Every ``(condition, sample)`` x prompt variant x run as a score-wise judgment. Key: ``model`` (the judge),
    ``dataset``, ``question_id`` = sample id, ``variant = f"{condition}|run{r}|{prompt_variant}"``; the other
    columns name the judgment (``judge, sample_id, perturbation, run, prompt_variant, allow_na, generator, kind,
    modality, gold_score, n_images, query, response``) and its decoding."""
    group_of = group_of or (lambda unit: sample_group(unit[1]))
    items = []
    for variant in params["prompt_variants"]:
        base, allow_na = parse_prompt_variant(variant)
        for cond, s in units:
            prompt = score_prompt(s.query, s.response, s.images, variant=base, allow_na=allow_na)
            for r in range(int(params["runs"])):
                dec = _decoding(params, judgment_seed(params["seed"], judge.name, s.sample_id, cond, variant, r))
                key = {"dataset": sample_dataset(s), "question_id": s.sample_id, "variant": f"{cond}|run{r}|{variant}",
                       "judge": judge.name, "sample_id": s.sample_id, "perturbation": cond, "run": r,
                       "prompt_variant": variant, "allow_na": allow_na,
                       "generator": str(s.meta.get("generator", "reference")), "kind": str(s.meta.get("kind", "")),
                       "modality": "text" if s.is_text_only else "image",
                       "gold_score": float("nan") if s.gold_score is None else float(s.gold_score),
                       "n_images": len(s.images), "query": s.query, "response": s.response, **dec["columns"],
                       "max_new_tokens": int(params["max_new_tokens"])}
                items.append(EvalItem(key, prompt, max_new_tokens=int(params["max_new_tokens"]),
                                      group=group_of((cond, s)),
                                      **dec["item"]))
    return engine_order(items, lambda it: len(it.key["query"]) + len(it.key["response"]))


def engine_order(items: list[EvalItem], length: Callable[[EvalItem], int]) -> list[EvalItem]:
    """The judgments of one sample and one picture next to each other - one prefix-sharing engine group (its
    image and query computed once for every condition and run) - similar lengths together within it (less
    padding where they run batched; sampled outputs do not depend on the batching)."""
    pictures: dict[tuple[tuple[str, ...], bool], int] = {}

    def picture(it: EvalItem) -> int:   # numbered as first met: a deterministic order
        return pictures.setdefault(it.prompt.media_key, len(pictures))

    return sorted(items, key=lambda it: (it.group, picture(it), length(it)))


def score_judgment(raw: str, item: EvalItem) -> dict[str, Any]:
    """A score-wise judgment's columns (its item's ``allow_na``: whether N/A is a valid verdict)."""
    return score_row(raw, item.key["allow_na"])


def score_pair(raw: str, item: EvalItem) -> dict[str, Any]:
    """A pairwise judgment's columns (its choice)."""
    return choice_row(raw)


# ============================================================================================== pairwise
def pair_items(judge: MLLM, units: Sequence[PairItem], params: dict, skipped: list | None = None) -> list[EvalItem]:
    """Every pair x run. Key: ``variant = f"{experiment}|{order}|run{r}"``; columns ``judge, sample_id,
    experiment, order, run, swapped, verbose_position, n_images, response_a, response_b`` and the decoding."""
    items = []
    for it in units:
        if it.experiment not in EXPERIMENTS:
            raise ValueError(f"unknown pairwise experiment {it.experiment!r}; choose from {EXPERIMENTS}")
        prompt = pairwise_prompt(it.query, it.response_a, it.response_b, it.images)
        for r in range(int(params["runs"])):
            dec = _decoding(params, judgment_seed(params["seed"], judge.name, it.sample_id, it.experiment, it.order, r))
            key = {"dataset": it.dataset, "question_id": it.sample_id, "variant": f"{it.experiment}|{it.order}|run{r}",
                   "judge": judge.name, "sample_id": it.sample_id, "experiment": it.experiment, "order": it.order,
                   "run": r, "swapped": bool(it.info.get("swapped", False)),
                   "verbose_position": it.info.get("verbose_position"), "n_images": len(it.images),
                   "response_a": it.response_a, "response_b": it.response_b, **dec["columns"],
                   "max_new_tokens": int(params["pairwise_max_new_tokens"])}
            items.append(EvalItem(key, prompt, max_new_tokens=int(params["pairwise_max_new_tokens"]), **dec["item"]))
    return engine_order(items, lambda it: len(it.key["response_a"]) + len(it.key["response_b"]))


def pair_units(ctx: RunContext) -> list[PairItem]:
    """Position and verbosity pairs of the correct responses (``meta["kind"] == "good"``) of a generated set; of a
    user's records (no ``kind``: docs/judge-data.md) every response, position-paired with its ``reference``."""
    samples = ctx.data.samples
    kinds = None if not any("kind" in s.meta or s.meta.get("role") for s in samples) else ("good",)
    return (position_pairs(samples, kinds=kinds)
            + verbosity_pairs(samples, seed=ctx.params["seed"], kinds=kinds))


def pair_group(unit: PairItem) -> str:
    return question_group(unit.dataset, unit.sample_id)


# ============================================================================================== self-enhancement
def response_items(generator: MLLM, units: Sequence[JudgeSample], params: dict,
                   skipped: list | None = None) -> list[EvalItem]:
    """One greedy answer per item (the query as the whole user turn, images attached); a text-only generator
    answers the text-only items only (:func:`mmfragile.study.answerable`). Key: ``model`` = the generator,
    ``question_id`` = the item id."""
    return [EvalItem({"dataset": sample_dataset(s), "question_id": str(s.meta.get("item_id", s.sample_id)),
                      "variant": "response", "source_sample": s.sample_id},
                     Prompt(text=s.query, images=list(s.images)),
                     max_new_tokens=int(params["generator_max_new_tokens"]), group=sample_group(s))
            for s in units]


def score_response(raw: str, item: EvalItem) -> dict[str, Any]:
    return {"response": str(raw).strip()}


def _generators(ctx: RunContext) -> list[ModelSpec]:
    others = [ModelSpec.parse(g) for g in ctx.params["self_generators"] or []]
    return [ctx.model, *[g for g in others if g.name != ctx.model_name]]


def selfgen_units(ctx: RunContext) -> list[tuple[str, JudgeSample]]:
    """The generators' stored responses (and the reference responses) as ``("original", sample)`` units."""
    rows = ResultStore(ctx.folder / "responses").read()
    got = {} if rows.empty else {(str(m), str(q)): r for m, q, r in zip(rows["model"], rows["question_id"],
                                                                      rows["response"])}
    sources = selfgen_samples(ctx.data.samples)
    out = []
    for g in _generators(ctx):
        for s in sources:
            item = str(s.meta.get("item_id", s.sample_id))
            if (g.name, item) in got:
                out.append(("original", selfgen_sample(s, got[(g.name, item)], g.name)))
    if ctx.params["self_reference"]:
        out += [("original", s) for s in reference_responses(ctx.data.samples)]
    return out


def _selfgen_items(judge: MLLM, units, params: dict, skipped: list | None = None) -> list[EvalItem]:
    return score_items(judge, units, {**params, "prompt_variants": ["original"]}, skipped,
                       group_of=lambda unit: selfgen_group(unit[1]))


#: the parameters every stage's run loop takes
_BATCH = ("mode", "batch_size", "flush_every")


def _summarize(stores: dict[str, ResultStore]) -> dict:
    out = {}
    if "scores" in stores:
        rows = stores["scores"].read()   # read once for both tables
        out["bias"] = bias_table(rows)
        out["parse_failures"] = parse_failure_table(rows, by=("judge", "perturbation"))
    if "pairwise" in stores:
        out["pairwise_parse_failures"] = parse_failure_table(stores["pairwise"].read(), by=("judge", "experiment"))
    return out


STUDY = register(Study(
    name="judge",
    title="MM-JudgeBias: an MLLM judge under nine perturbations of query, image and response",
    paper="mm-judgebias",
    params=PARAMS,
    load=load,
    stages=(
        Stage(name="scores", subfolder="scores", units=lambda ctx: ctx.data.conditions, items=score_items,
              score=score_judgment, config=_config, group_of=lambda unit: sample_group(unit[1]), run_params=_BATCH,
              unit="judgment"),
        Stage(name="pairwise", subfolder="pairwise", units=pair_units,
              items=pair_items, score=score_pair,
              config=_config, group_of=pair_group, when=lambda p: p["pairwise"], run_params=_BATCH,
              unit="judgment"),
        Stage(name="responses", subfolder="responses", units=lambda ctx: selfgen_samples(ctx.data.samples),
              items=response_items, score=score_response, config=_config,
              group_of=sample_group, when=lambda p: p["self_generators"] is not None, models=_generators,
              run_params=_BATCH, unit="response"),
        Stage(name="selfgen", subfolder="scores", units=selfgen_units, items=_selfgen_items, score=score_judgment,
              config=_config, group_of=lambda unit: selfgen_group(unit[1]),
              when=lambda p: p["self_generators"] is not None, run_params=_BATCH, unit="judgment"),
    ),
    summarize=_summarize,
    folder=lambda results_dir, model, dataset: Path(results_dir),
    default_model="smollm2-vlm",
    default_dataset="synthetic",
    needs_dataset=False,
    data_name=judge_samples_name,
    report=judge_report,
    report_stages=("scores", "pairwise"),
))
