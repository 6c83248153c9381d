"""A fourth study defined outside ``src/`` (tests/test_fourth_study.py): *option order only* - format-bias's items
in one prompt format, every circular shift of the options. It declares what the shared layers need - its stage's
budget grid, its report section, a CLI error line - and touches no core file; importing this module registers it."""
from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from mmfragile.budget import first_rows, merge_outcomes, rows_with_position
from mmfragile.budget.estimator import GridSpec, Term
from mmfragile.report.build import Doc, ReportOptions, Section, Table, metric_key, read_stores, txt
from mmfragile.studies.format_bias.prompts import exact_match_score
from mmfragile.store import ResultStore
from mmfragile.study import BudgetGrid, Param, RunContext, Stage, Study, register
from mmfragile.studies.format_bias.items import format_bias_items
from mmfragile.studies.format_bias.prompts import PromptFormat

NAME = "option-order"
FORMAT = "uppercase-dot-line_break"


class NoSuchFormat(ValueError):
    """A --format the 48 do not have (the study's own error, given its own CLI line)."""


def _format(params: Mapping[str, Any]) -> PromptFormat:
    try:
        return PromptFormat.from_name(params["format"])
    except ValueError as e:
        raise NoSuchFormat(params["format"]) from e


def load(ctx: RunContext) -> pd.DataFrame:
    _format(ctx.params)  # before any model loads
    return ctx.questions(ctx.n)


def items(model, units: list, params: dict, skipped: list | None):
    return format_bias_items(model, pd.DataFrame(units), formats=[_format(params)], include_standard=False,
                             skipped=skipped)


def cells(rows: pd.DataFrame) -> pd.DataFrame:
    """Every shift of every (model, question) in the store rows, ``correct`` where stored."""
    r = rows_with_position(rows, "option-order cells")
    parts = []
    for rec in first_rows(r).to_dict("records"):
        n = len(list(rec["option_ids"]))
        a0 = (int(rec["answer_position"]) + int(rec["shift"])) % n       # shown position = (answer - shift) % n
        parts += [{"model": rec["model"], "dataset": rec["dataset"], "question_id": rec["question_id"],
                   "variant": f"{rec['format']}|s{s}", "shift": s, "answer_position": (a0 - s) % n,
                   "question": rec["question"]} for s in range(n)]
    grid = pd.DataFrame(parts).astype({"model": str, "dataset": str, "question_id": str, "variant": str})
    return merge_outcomes(grid, r)


SPEC = GridSpec(NAME, unit="shift", terms=(Term(("shift",), 0.5), Term(("answer_position",), 1.0),
                                           Term(("question",), 2.0)))


def report(doc: Doc, stores: Mapping[str, list[ResultStore]], opts: ReportOptions):
    """Accuracy (%) per shift, per model and dataset."""
    rows = read_stores(stores.get("shifts", []))
    if rows.empty:
        return None, []
    sec = Section(NAME, "Option order only: accuracy per circular shift")
    acc = rows.assign(correct=rows["correct"].astype(float)).groupby(["model", "dataset", "shift"])["correct"].mean()
    trows = [[txt(m), txt(ds), txt(str(s)), doc.num(metric_key(NAME, m, ds, s, "accuracy"), 100 * v, 1)]
             for (m, ds, s), v in acc.items()]
    sec.blocks.append(Table(doc.uid(NAME), "Accuracy (%) per shift", ["model", "dataset", "shift", "accuracy"], trows))
    return sec, []


STUDY = register(Study(
    name=NAME,
    title="Option order only: one prompt format, every circular shift",
    paper="format-bias-mcvqa",
    params=(Param(name="format", default=FORMAT, help="the one prompt format (Table 1 name)", type=str),
            Param(name="batch_size", default=8, help="prompts per batch", type=int)),
    load=load,
    stages=(Stage(name="shifts", units=lambda ctx: ctx.data.to_dict("records"), items=items,
                  score=exact_match_score,
                  config=lambda ctx: {"model": ctx.model_name, "dataset": ctx.dataset, "n": ctx.n,
                                      "format": ctx.params["format"]},
                  budget=BudgetGrid(spec=SPEC, cells=cells), run_kw=lambda p: {"batch_size": p["batch_size"]}),),
    report=report,
    report_stages=("shifts",),
    errors={NoSuchFormat: lambda e: f"--format {e}: not one of the 48 formats (e.g. {FORMAT})"},
    default_model="tiny-vlm",
    default_dataset="easy-vqa",
))
