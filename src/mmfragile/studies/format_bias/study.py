"""Study 1 as a :class:`~mmfragile.study.Study`: the format grid (48 formats + the standard one, every circular
shift) and CP-LN's cloze log-likelihoods, each a stage of :func:`mmfragile.study.run_study`.

``mmfragile run format-bias --model M --dataset D --out DIR [--cp-ln]`` (alias ``mmfragile formats``) and
notebook ``30_format_bias_run`` run it; :mod:`mmfragile.studies.format_bias.analysis` reads the stores back.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from mmfragile.data.video import question_media
from mmfragile.errors import UsageError
from mmfragile.models.base import MLLM
from mmfragile.runner import EvalItem
from mmfragile.errors import DataError
from mmfragile.schema import MCQuestion, skip_or_raise
from mmfragile.study import MODE, Param, RunContext, Stage, Study, csv_list, question_records, register
from mmfragile.studies.format_bias import budget, report
from mmfragile.studies.format_bias.items import (STANDARD_FORMAT_COLUMN, STUDY_NAME, format_bias_items, run_config,
                                                 run_info, standard_formats_for, video_settings)
from mmfragile.studies.format_bias.prompts import (NoStandardFormat, PromptFormat, build_cloze_prompt,
                                                   exact_match_score)

__all__ = ["STUDY", "cloze_items", "cp_ln_score", "no_standard_message"]

PARAMS = (
    Param(name="formats", default=None, help="format names (default: all 48 of Table 1)", type=csv_list),
    Param(name="standard_format", default=None,
          help="format of the 'standard' variant where Table 5 has none (e.g. uppercase-dot-line_break), 'none' to "
               "leave that variant out (default: the dataset's Table 5 format)", type=str),
    MODE,
    Param(name="batch_size", default=32, help="prompts per batch (the engine sizes its own tail batches)", type=int),
    Param(name="flush_every", default=256, help="rows per Parquet part (smaller: less lost on a kill)", type=int),
    Param(name="n_frames", default=None, help="frames per video question (video datasets)", type=int),
    Param(name="fps", default=None, help="sample video frames at this rate (capped by n_frames)", type=float),
    Param(name="video_bounds", default=True, help="sample inside the benchmark's start/end window (MVBench)",
          type=bool),
    Param(name="skip_bad_rows", default=False,
          help="leave bad input rows out (listed in the store's config.json) instead of stopping", type=bool),
    Param(name="cp_ln", default=False,
          help="also CP-LN: the log-likelihood of every option text after the cloze prompt", type=bool),
)


# ============================================================================================== data
def _standard(params: dict) -> tuple[bool, str | None]:
    """``standard_format``: (include the standard variant, the format name to use or None for Table 5)."""
    value = (params.get("standard_format") or "").strip()
    if value.lower() == "none":
        return False, None
    try:
        return True, (PromptFormat.from_name(value).name if value else None)
    except ValueError as e:
        raise ValueError(f"standard_format (--standard-format): {e}") from None


def load(ctx: RunContext) -> pd.DataFrame:
    """The question table; a format name that is none of Table 1's and a dataset without a standard format stop
    here, before any model loads."""
    for name in ctx.params["formats"] or []:
        try:
            PromptFormat.from_name(name)
        except ValueError as e:
            raise UsageError(f"--formats (formats=): {e}") from None
    qs = ctx.questions(ctx.n, ctx.params["skip_bad_rows"])
    include, name = _standard(ctx.params)
    if name:
        attrs = dict(qs.attrs)
        qs = qs.assign(**{STANDARD_FORMAT_COLUMN: name})
        qs.attrs = attrs
    elif include and ctx.budget is None:  # a budgeted run has no standard variant
        standard_formats_for(qs)  # NoStandardFormat names what to pass
    ctx.run_info = run_info(qs, [])
    return qs


def _config(ctx: RunContext, stage: str = "grid") -> dict[str, Any]:
    p = ctx.params
    video = video_settings(ctx.data, p["n_frames"], p["fps"], p["video_bounds"])
    cfg = run_config(ctx.model_name, ctx.dataset, ctx.n, p["formats"], stage=stage, video=video)
    if stage == "grid" and p["standard_format"]:
        cfg["standard_format"] = _standard(p)[1] or "none"
    return cfg


# ============================================================================================== the grid
def grid_items(model: MLLM, units: list, params: dict, skipped: list | None) -> list[EvalItem]:
    fmts = [PromptFormat.from_name(f) for f in params["formats"]] if params["formats"] else None
    include = _standard(params)[0] and not params["budgeted"]
    return format_bias_items(model, pd.DataFrame(units), formats=fmts, include_standard=include,
                             n_frames=params["n_frames"], fps=params["fps"], video_bounds=params["video_bounds"],
                             skipped=skipped)


# ============================================================================================== CP-LN
def cloze_items(model: MLLM, units: list, params: dict, skipped: list | None) -> list[EvalItem]:
    """CP-LN (Sec. 4.3, B.3 Eq. 9-10): per question and option, the option text as the continuation of the cloze
    prompt (:func:`build_cloze_prompt`: the question and its images, no options, IDs or instruction); key
    ``variant`` = the option index in canonical order. Video questions are shown as the frames the grid shows."""
    items = []
    for rec in units:
        q = MCQuestion.from_row(rec)
        try:
            cz = build_cloze_prompt(q)
            cz.images = question_media(rec, None, n_frames=params["n_frames"], fps=params["fps"],
                                       use_bounds=params["video_bounds"], require_budget=True)
        except DataError as e:
            skip_or_raise(rec, e, skipped)
            continue
        prompt = cz.to_prompt()
        for k, text in enumerate(cz.continuations):
            items.append(EvalItem(
                key={"dataset": q.dataset, "question_id": q.question_id, "variant": str(k), "option": k,
                     "option_text": text, "answer": int(q.answer), "n_options": len(q.options),
                     "category": q.category, "modality": q.modality},
                prompt=prompt, request="loglikelihood", continuation=text))
    return items


def cp_ln_score(ll, item: EvalItem) -> dict[str, Any]:
    """Eq. 10's length normalisation: the option's mean log-probability per token."""
    return {"mean_logprob": float(ll.logprob) / max(int(ll.n_tokens), 1)}


def no_standard_message(e: NoStandardFormat) -> str:
    """The CLI's line for a dataset without a Table 5 format: the option to pass."""
    names = ", ".join(repr(d) for d in e.datasets)
    return (f"no standard prompt format for dataset {names} (known: {', '.join(e.known)}); pass "
            "--standard-format NAME (e.g. --standard-format uppercase-dot-line_break) to give the format of the "
            "'standard' variant, or --standard-format none to leave that variant out")


STUDY = register(Study(
    name=STUDY_NAME,
    title="Prompt-format bias in multiple-choice VQA (48 formats x circular evaluation)",
    paper="format-bias-mcvqa",
    params=PARAMS,
    load=load,
    stages=(
        Stage(name="grid", units=question_records, items=grid_items,
              score=exact_match_score, config=_config, budget=budget.GRID,
              run_params=("mode", "batch_size", "flush_every")),
        Stage(name="cp_ln", subfolder="cp_ln", units=question_records, items=cloze_items,
              score=cp_ln_score, config=lambda ctx: _config(ctx, "cp_ln"),
              when=lambda p: p["cp_ln"], run_params=("batch_size",), unit="option"),
    ),
    summarize=lambda stores: {"per_format": _per_format(stores["grid"].read())} if "grid" in stores else {},
    default_dataset="easy-vqa",
    report=report.report,
    report_stages=("grid",),
    errors={NoStandardFormat: no_standard_message},
))


def _per_format(rows: pd.DataFrame) -> pd.DataFrame:
    """Exact-match accuracy and coverage (%) per format, best first (what ``mmfragile formats`` prints)."""
    if rows.empty:
        return rows
    acc = rows.groupby("format")[["correct", "covered"]].mean().mul(100).round(1)
    return acc.sort_values("correct", ascending=False)
