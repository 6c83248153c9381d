"""Study 1's grid as :mod:`mmfragile.budget` samples and estimates it: the estimator's covariates
(:data:`FORMAT_BIAS`), the complete grid rebuilt from store rows (:func:`cells`) and complete grids simulated to
match the published per-format tables (:func:`simulate_published`; see :mod:`mmfragile.budget.validation`)."""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from mmfragile.budget import first_rows, merge_outcomes, rows_with_position
from mmfragile.budget.estimator import GridSpec, Term
from mmfragile.budget.validation import simulate_grid
from mmfragile.study import BudgetGrid, CommittedGrid
from mmfragile.studies.format_bias import metrics as fb
from mmfragile.studies.format_bias.prompts import PromptFormat, all_formats

__all__ = ["FORMAT_BIAS", "FORMAT_ITEMS", "GRID", "COMMITTED", "cells", "simulate_published"]

#: Study 1: 48 formats x circular shifts. The format covariates of Tab. 1, the shift, the shown position of the
#: correct answer (position bias differs between formats, Sec. 5.1 / C.2, hence the interactions), a free
#: effect per format and per format x answer position, and question effects (overall and per answer position:
#: under circular evaluation a question is asked once per position). Prior scales were set on the embedded
#: easy-VQA grid and the simulations of ``budget_validation`` (see the notebook 35), not tuned per grid.
FORMAT_BIAS = GridSpec("format-bias", unit="format", terms=(
    Term(("option_id_set",), 1.5), Term(("delimiter",), 1.5), Term(("separator",), 1.5),
    Term(("shift",), 0.5), Term(("answer_position",), 1.5),
    Term(("option_id_set", "delimiter"), 1.0), Term(("option_id_set", "separator"), 1.0),
    Term(("delimiter", "separator"), 1.0), Term(("format",), 1.0),
    Term(("option_id_set", "answer_position"), 1.0), Term(("delimiter", "answer_position"), 1.0),
    Term(("separator", "answer_position"), 1.0), Term(("format", "answer_position"), 0.75),
    Term(("question",), 2.0), Term(("question", "answer_position"), 1.0),
), balance=("shift",))   # a question's cells spread over its circular shifts

#: Circular-evaluation items per dataset (Tab. 5 "Circ. eval.").
FORMAT_ITEMS: dict[str, int] = {"A-OKVQA": 4580, "HRBench-4K": 800, "MMBench": 4876, "MME-RealWorld-Lite": 9595,
                                "V*Bench": 596}


def cells(rows: pd.DataFrame, formats: Sequence[str] | None = None) -> pd.DataFrame:
    """The complete 48-format x circular-shift grid of every (model, question) in format-bias store rows (the
    ``standard`` variant left out), with ``correct`` where the store has the cell. A question's grid is rebuilt
    from any one of its rows (option count, shift and shown answer position give the canonical answer)."""
    r = rows[rows["format"].astype(str) != "standard"] if "format" in rows.columns else rows
    r = rows_with_position(r, "format-bias cells")
    fmts = [PromptFormat.from_name(f) for f in formats] if formats else all_formats()
    first = first_rows(r)
    parts = []
    for rec in first.to_dict("records"):
        n = len(list(rec["option_ids"]))
        a0 = (int(rec["answer_position"]) + int(rec["shift"])) % n       # shown position = (answer - shift) % n
        for f in fmts:
            for s in range(n):
                parts.append({"model": rec["model"], "dataset": rec["dataset"], "question_id": rec["question_id"],
                              "variant": f"{f.name}|s{s}", "format": f.name, "option_id_set": f.option_ids,
                              "delimiter": f.delimiter, "separator": f.separator, "shift": s, "n_options": n,
                              "answer_position": (a0 - s) % n, "question": rec["question"]})
    grid = pd.DataFrame(parts).astype({"model": str, "dataset": str, "question_id": str, "variant": str})
    return merge_outcomes(grid, r)


def simulate_published(published: pd.DataFrame | None = None, datasets: Sequence[str] | None = None,
                         models: Sequence[str] | None = None, tau: float = 2.0, rho: float = 0.8, seed: int = 0,
                         max_items: int | None = None, n_items: dict[str, int] | None = None) -> pd.DataFrame:
    """Complete simulated grids for Tabs. 8-12 (see the module docstring for exactly what is simulated):
    a cell frame ``dataset, model, question, format, option_id_set, delimiter, separator, correct`` (the column
    names of the runs), one row per item x format x model."""
    pub = fb.load_published_results() if published is None else published
    if datasets is not None:
        pub = pub[pub["dataset"].isin(datasets)]
    if models is not None:
        pub = pub[pub["model"].isin(models)]
    pub = pub.rename(columns={"option_ids": "option_id_set"}).copy()
    pub["format"] = pub["option_id_set"] + "-" + pub["delimiter"] + "-" + pub["separator"]
    return simulate_grid(pub, "dataset", ["format", "option_id_set", "delimiter", "separator"],
                     {**FORMAT_ITEMS, **(n_items or {})}, tau, rho, seed, max_items)


def _expand_committed(df: pd.DataFrame) -> pd.DataFrame:
    """The committed grid's compact columns -> the cell frame (the format name carries its three covariates)."""
    df = df.astype({"format": str})
    parts = df["format"].str.split("-", expand=True)
    return df.assign(option_id_set=parts[0], delimiter=parts[1], separator=parts[2],
                     variant=df["format"] + "|s" + df["shift"].astype(str))


#: The committed complete grid (resources/budget/README.md): SmolLM2-135M + a random vision tower on easy-VQA,
#: every format x circular shift, through the engine.
COMMITTED = CommittedGrid(
    file="format_bias_smollm2-vlm_easy-vqa.parquet",
    columns=("model", "dataset", "question_id", "format", "shift", "n_options", "answer_position", "correct",
             "covered"),
    expand=_expand_committed, note="embedded smollm2-vlm (random vision tower) on easy-VQA")

GRID = BudgetGrid(spec=FORMAT_BIAS, cells=cells, simulate=simulate_published, embedded=COMMITTED)
