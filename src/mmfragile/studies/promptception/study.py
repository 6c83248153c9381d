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
from mmfragile.runner import EvalItem
from mmfragile.store import ResultStore
from mmfragile.study import Param, RunContext, Stage, Study, csv_list, question_records, register
from mmfragile.studies.promptception import budget, report
from mmfragile.studies.promptception.analysis import summarize_run
from mmfragile.studies.promptception.items import (DEFAULT_MAX_NEW_TOKENS, score_answer, promptception_items,
                                                   resolve_model_kind, run_config, select_questions)
from mmfragile.studies.promptception.extraction import (EXTRACTION_MAX_NEW_TOKENS, EXTRACTION_STORE,
                                                        extraction_items, score_extraction, pending_answers,
                                                        read_answers)

__all__ = ["STUDY"]

PARAMS = (
    Param(name="prompt_ids", default=None,
          help="prompt types (default: all 61); keep 1.1, the baseline, in any subset", type=csv_list),
    Param(name="model_kind", default="auto",
          help="open or proprietary answer formats (Appendix A); auto: proprietary for API models",
          type=str, choices=("auto", "open", "proprietary")),
    Param(name="max_new_tokens", default=DEFAULT_MAX_NEW_TOKENS, help="one generation limit for every prompt",
          type=int),
    Param(name="n_frames", default=16, help="frames per video question (Appendix F uses 16-64)", type=int),
    Param(name="fps", default=None, help="sample video frames at this rate (capped by n_frames)", type=float),
    Param(name="video_bounds", default=False,
          help="MVBench start/end windows (the authors' release samples whole clips)", type=bool),
    Param(name="extractor", default=None, help="stage-2 answer matcher (Appendix E), a model spec such as smollm2",
          type=str),
    Param(name="match_text", default=False,
          help="before stage 2: a response naming exactly one option's text is that option", type=bool),
    Param(name="exclude_refusals", default=False,
          help="the paper's GPT-4o policy: refusal-aware matcher, refusals left out", type=bool),
    Param(name="batch_size", default=16, help="prompts per batch", type=int),
    Param(name="flush_every", default=256, help="rows per Parquet part", type=int),
    Param(name="skip_bad_rows", default=False, help="leave bad input rows out (listed in the store's config.json)",
          type=bool),
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
    stages=(Stage(name="prompts", units=question_records, items=items, score=score_answer,
                  score_params=("exclude_refusals", "match_text", "extractor"),
                  config=_config, budget=budget.GRID,
                  run_params=("batch_size", "flush_every")),
            # stage 2 of Appendix E: the pending answers through the extractor, batched, into <folder>/extraction
            Stage(name=EXTRACTION_STORE, units=extraction_units, subfolder=EXTRACTION_STORE, config=_extraction_config,
                  items=lambda model, units, p, skipped: extraction_items(units, p["exclude_refusals"]),
                  score=score_extraction, score_params=("exclude_refusals",), models=extractor_spec,
                  when=lambda p: bool(p["extractor"]), unit="answer",
                  run_params=("batch_size", "flush_every"))),
    summarize=lambda stores: summarize_run(read_answers(stores["prompts"])) if "prompts" in stores else {},
    default_dataset="synthetic-vqa",
    report=report.report,
    report_stages=("prompts",),
))
