"""Study 2 as a :class:`~mmfragile.study.Study`: every question x prompt type of the Promptception catalog, with the
two-stage answer extraction of Appendix E: stage ``prompts`` (a grid a budget can sample) scores the answers with
what needs no model, stage ``extraction`` (with an ``extractor``) sends the answers it left pending to the extractor
model as batched requests of their own (:mod:`mmfragile.studies.promptception.extraction`).

``mmfragile run promptception --model M --dataset D --out DIR`` (alias ``mmfragile promptception``) and notebook
``40_promptception_run`` run it; :mod:`mmfragile.studies.promptception.analysis` reads the stores back.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from mmfragile.data.loaders import run_info
from mmfragile.models.base import MLLM
from mmfragile.models.spec import ModelSpec, as_spec
from mmfragile.runner import EvalItem, ScoreFn
from mmfragile.store import ResultStore
from mmfragile.study import Param, RunContext, Stage, Study, csv_list, register
from mmfragile.studies.promptception import budget, report
from mmfragile.studies.promptception.analysis import summarize_run
from mmfragile.studies.promptception.items import (DEFAULT_MAX_NEW_TOKENS, make_score_fn, promptception_items,
                                                   resolve_model_kind, run_config, select_questions)
from mmfragile.studies.promptception.extraction import (EXTRACTION_MAX_NEW_TOKENS, EXTRACTION_STORE,
                                                        extraction_items, extraction_score, pending_answers,
                                                        read_answers)

__all__ = ["STUDY"]

PARAMS = (
    Param("prompt_ids", None, "prompt types (default: all 61); keep 1.1, the baseline, in any subset", csv_list),
    Param("model_kind", "auto", "open or proprietary answer formats (Appendix A); auto: proprietary for API models",
          str, ("auto", "open", "proprietary")),
    Param("max_new_tokens", DEFAULT_MAX_NEW_TOKENS, "one generation limit for every prompt", int),
    Param("n_frames", 16, "frames per video question (Appendix F uses 16-64)", int),
    Param("fps", None, "sample video frames at this rate (capped by n_frames)", float),
    Param("video_bounds", False, "MVBench start/end windows (the authors' release samples whole clips)", bool),
    Param("extractor", None, "stage-2 answer matcher (Appendix E), a model spec such as smollm2", str),
    Param("match_text", False, "before stage 2: a response naming exactly one option's text is that option", bool),
    Param("exclude_refusals", False, "the paper's GPT-4o policy: refusal-aware matcher, refusals left out", bool),
    Param("batch_size", 16, "prompts per batch", int),
    Param("flush_every", 256, "rows per Parquet part", int),
    Param("skip_bad_rows", False, "leave bad input rows out (listed in the store's config.json)", bool),
)


def load(ctx: RunContext) -> pd.DataFrame:
    """The question table, ``n`` questions spread over modalities and categories (:func:`select_questions`).
    An ``extractor`` that names no model fails here, in one line, before any model loads."""
    if ctx.params["extractor"] not in (None, "", ctx.model_name):  # the evaluated model itself is checked already
        extractor_spec(ctx)[0].check()
    loaded = ctx.questions(skip_bad_rows=ctx.params["skip_bad_rows"])
    ctx.run_info = run_info(loaded, [])
    return select_questions(loaded, ctx.n)


def _config(ctx: RunContext) -> dict[str, Any]:
    p = ctx.params
    return run_config(ctx.model_name, ctx.dataset, resolve_model_kind(ctx.model, p["model_kind"]), p["max_new_tokens"],
                      p["extractor"], p["exclude_refusals"], p["n_frames"], p["fps"], match_text=p["match_text"],
                      video_bounds=p["video_bounds"])


def items(model: MLLM, units: list, params: dict, skipped: list | None) -> list[EvalItem]:
    return promptception_items(model, pd.DataFrame(units), params["prompt_ids"],
                               model_kind=resolve_model_kind(model, params["model_kind"]),
                               max_new_tokens=params["max_new_tokens"], n_frames=params["n_frames"],
                               fps=params["fps"], video_bounds=params["video_bounds"], skipped=skipped)


def score(model: MLLM, params: dict) -> ScoreFn:
    return make_score_fn(exclude_refusals=params["exclude_refusals"], match_text=params["match_text"],
                         stage2=bool(params["extractor"]))


def extractor_spec(ctx: RunContext) -> list[ModelSpec]:
    """The extraction stage's model: the ``extractor`` spec (the evaluated model's own spec if it names it)."""
    return [ctx.model if ctx.params["extractor"] == ctx.model_name else as_spec(ctx.params["extractor"])]


def extraction_units(ctx: RunContext) -> list[dict]:
    """This run's answers left pending by the prompts stage (read from its store, complete by now)."""
    answers = ResultStore(ctx.folder).read() if (ctx.folder / "parts").is_dir() else pd.DataFrame()
    return pending_answers(answers, ctx.data, ctx.model_name,
                           resolve_model_kind(ctx.model, ctx.params["model_kind"]))


def _extraction_config(ctx: RunContext) -> dict[str, Any]:
    return {**_config(ctx), "extraction_max_new_tokens": EXTRACTION_MAX_NEW_TOKENS}


STUDY = register(Study(
    name="promptception",
    title="Promptception: 61 instruction prompts in 15 categories",
    paper="promptception",
    params=PARAMS,
    load=load,
    stages=(Stage("prompts", units=lambda ctx: ctx.data.to_dict("records"), items=items, score=score,
                  config=_config, budget=budget.GRID,
                  run_kw=lambda p: {"batch_size": p["batch_size"], "flush_every": p["flush_every"]}),
            # stage 2 of Appendix E: the pending answers through the extractor, batched, into <folder>/extraction
            Stage(EXTRACTION_STORE, units=extraction_units, subfolder=EXTRACTION_STORE, config=_extraction_config,
                  items=lambda model, units, p, skipped: extraction_items(units, p["exclude_refusals"]),
                  score=lambda model, p: extraction_score(p["exclude_refusals"]), models=extractor_spec,
                  when=lambda p: bool(p["extractor"]), unit="answer",
                  run_kw=lambda p: {"batch_size": p["batch_size"], "flush_every": p["flush_every"]})),
    summarize=lambda stores: summarize_run(read_answers(stores["prompts"])) if "prompts" in stores else {},
    default_dataset="synthetic-vqa",
    report=report.report,
    report_stages=("prompts",),
))
