"""Study 2's grid as :mod:`mmfragile.budget` samples and estimates it: the estimator's covariates
(:data:`PROMPTCEPTION`), the complete grid rebuilt from store rows (:func:`cells`) and complete grids simulated to
match the published per-prompt tables (:func:`simulate_published`; see :mod:`mmfragile.budget.validation`)."""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from mmfragile.budget import first_rows, merge_outcomes, rows_with_position
from mmfragile.budget.estimator import GridSpec, Term
from mmfragile.budget.validation import simulate_grid
from mmfragile.study import BudgetGrid, CommittedGrid
from mmfragile.studies.promptception import metrics as pc
from mmfragile.studies.promptception.extraction import read_answers
from mmfragile.studies.promptception.prompts import get_prompt_type, prompt_ids as catalog_ids

__all__ = ["PROMPTCEPTION", "PROMPTCEPTION_ITEMS", "GRID", "COMMITTED", "cells", "simulate_published"]

#: Promptception: 61 prompt types. Category / supercategory / intent of Tab. 1 / Tab. 3, a free effect per
#: prompt, the correct answer's letter position (a prompt can move a model's letter bias) and question effects.
PROMPTCEPTION = GridSpec("promptception", unit="prompt_id", terms=(
    Term(("supercategory",), 1.0), Term(("category",), 1.0), Term(("intent",), 1.0),
    Term(("prompt_id",), 1.0), Term(("answer_position",), 1.0),
    Term(("category", "answer_position"), 0.75), Term(("prompt_id", "answer_position"), 0.5),
    Term(("question",), 2.0),
))

#: Questions per benchmark (Promptception Sec. 2.3: MMStar 1,500; MVBench 4,000 - 100 videos for GPT-4o and
#: Gemini 1.5 Pro; MMMU-Pro's count is not restated in the seed: 1,730 is MMMU-Pro's standard (4/10-option) set).
PROMPTCEPTION_ITEMS: dict[str, int] = {"MMStar": 1500, "MMMU-Pro": 1730, "MVBench": 4000}


def _prompt_columns(prompt_id: str) -> dict[str, str]:
    """A prompt's cell columns: the unit and its catalog covariates."""
    t = get_prompt_type(prompt_id)
    return {"variant": t.prompt_id, "prompt_id": t.prompt_id, "category": str(int(t.category)),
            "supercategory": str(int(t.supercategory)), "intent": t.intent or "neutral"}


def cells(rows: pd.DataFrame, prompt_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """The complete question x prompt grid of every (model, question) in Promptception store rows - the
    catalog's prompts that support the question's modality (59 / 61), or ``prompt_ids`` - with ``correct`` where
    the store has the cell. ``answer_position`` is the correct letter's index."""
    r = rows_with_position(rows, "promptception cells")
    pids = [str(p) for p in (prompt_ids or catalog_ids(include_baseline=False))]
    types = [get_prompt_type(p) for p in pids]
    first = first_rows(r)
    parts = []
    for rec in first.to_dict("records"):
        for t in types:
            if not t.supports(rec["modality"]):
                continue
            parts.append({"model": rec["model"], "dataset": rec["dataset"], "question_id": rec["question_id"],
                          **_prompt_columns(t.prompt_id), "modality": rec["modality"],
                          "answer_position": int(rec["answer_position"]), "question": rec["question"]})
    grid = pd.DataFrame(parts).astype({"model": str, "dataset": str, "question_id": str, "variant": str})
    return merge_outcomes(grid, r)


def simulate_published(published: pd.DataFrame | None = None, datasets: Sequence[str] | None = None,
                       models: Sequence[str] | None = None, tau: float = 2.0, rho: float = 0.8, seed: int = 0,
                       max_items: int | None = None, n_items: dict[str, int] | None = None) -> pd.DataFrame:
    """Complete simulated grids for Promptception's Tables 6-8 (59 / 61 prompts x 10 models x 3 benchmarks):
    ``dataset`` (= benchmark), ``model, question, prompt_id, category, supercategory, intent, correct``.
    MVBench's GPT-4o / Gemini 1.5 Pro rows were measured on 100 videos: they get 100 items."""
    pub = pc.load_published_accuracy() if published is None else published
    if datasets is not None:  # the published tables call them benchmarks
        pub = pub[pub["benchmark"].isin(datasets)]
    if models is not None:
        pub = pub[pub["model"].isin(models)]
    pub = pub.rename(columns={"benchmark": "dataset"}).copy()
    pub["prompt_id"] = pub["prompt_id"].astype(str)
    pub["category"] = pub["prompt_id"].map(pc.prompt_category).astype(str)
    pub["supercategory"] = pub["prompt_id"].map(pc.prompt_supercategory).astype(str)
    pub["intent"] = pub["prompt_id"].map(pc.PROMPT_INTENT)
    items = {**PROMPTCEPTION_ITEMS, **(n_items or {})}
    parts = []
    for (ds, subset), g in pub.groupby(["dataset", pub["model"].isin(pc.PROPRIETARY_MODELS) & pub["dataset"].isin(
            pc.PROPRIETARY_EXCLUDED_BENCHMARKS)], sort=True):
        n = {ds: 100 if subset else items[ds]}
        sim = simulate_grid(g, "dataset", ["prompt_id", "category", "supercategory", "intent"], n, tau, rho,
                        seed + (7 if subset else 0), max_items)
        if subset:
            sim["dataset"] = sim["dataset"] + " (100-video subset)"
        parts.append(sim)
    return pd.concat(parts, ignore_index=True)


def _expand_committed(df: pd.DataFrame) -> pd.DataFrame:
    """The committed grid's columns -> the cell frame (a prompt ID names its covariates)."""
    ids = df["prompt_id"].astype(str)
    cov = pd.DataFrame([_prompt_columns(p) for p in ids.unique()]).set_index("prompt_id")
    return df.assign(prompt_id=ids, **{c: ids.map(cov[c]) for c in cov.columns})


#: The committed complete grid (resources/budget/README.md): the zoo's prompt follower (planted: the 7 held-out
#: categories) on easy-VQA, every prompt of the catalog, float32.
COMMITTED = CommittedGrid(
    file="promptception_zoo-follower_easy-vqa.parquet",
    columns=("model", "dataset", "question_id", "prompt_id", "modality", "answer_position", "correct", "covered"),
    expand=_expand_committed, note="zoo-follower (planted: prompt sensitivity in 7 held-out categories) on easy-VQA")

GRID = BudgetGrid(spec=PROMPTCEPTION, cells=cells, simulate=simulate_published, read=read_answers,
                  embedded=COMMITTED)
