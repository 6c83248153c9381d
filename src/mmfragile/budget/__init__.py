"""Budgeted runs: evaluate a seeded subset of a study's (question, variant) grid into the study's own resumable
store, and estimate the whole grid's accuracy distribution from it (:mod:`mmfragile.budget.estimator`).

* :func:`item_cells` - the cell frame of a list of :class:`~mmfragile.runner.EvalItem` (one row per item,
  outcome missing), :func:`attach_outcomes` - the outcomes a store already holds.
* :func:`run_budgeted` - the stratified design - the first ``budget`` share of a seeded sequence balanced over
  the grid's variants, questions and covariates (:func:`~mmfragile.budget.estimator.stratified_order`; budgets
  nest, so ``--budget 0.02`` then ``--budget 0.05`` only runs the difference) - through
  :func:`~mmfragile.runner.run_items` into the same store a full run uses (the budget is not part of the store config:
  a later full run completes the same store). With
  ``adaptive=True`` it runs the stratified design for ``initial`` of the budget, then batches chosen by
  :func:`~mmfragile.budget.estimator.adaptive_batch` from what the store holds - a deterministic function of the
  stored outcomes and the seed, so a killed run resumes with the same choices for the same store contents.
* :func:`estimate_store` - the estimate from a study's store rows alone: its stage declares its grid
  (:class:`mmfragile.study.BudgetGrid`: the estimator's :class:`GridSpec` and the function that rebuilds the
  complete cell frame from store rows, outcomes attached where observed; :func:`mmfragile.study.budget_grid`
  finds it by study name) - this package imports no study and no registry.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mmfragile.runner import EvalItem, ScoreFn, run_items
from mmfragile.budget.auto import AUTO_STATISTICS, AutoStop, auto_stop
from mmfragile.budget.estimator import GridSpec, adaptive_batch, budget_size, estimate, stratified_order
from mmfragile.models.base import MLLM
from mmfragile.errors import DataError
from mmfragile.store import RUN_INFO, ResultStore

__all__ = ["KEY", "item_cells", "attach_outcomes", "run_budgeted", "run_auto", "record_grid_units", "grid_units",
           "rows_with_position", "first_rows", "merge_outcomes", "estimate_store", "estimate_tables", "STORE_LEVEL",
           "STORE_DRAWS", "STORE_SEED"]

#: Columns that identify a cell in a store (with the model).
KEY = ["dataset", "question_id", "variant"]


def _answer_position(option_ids: Sequence[str], answer_id: str, where: str) -> int:
    ids = [str(x) for x in option_ids]
    if str(answer_id) not in ids:
        raise DataError(f"{where}: answer_id {answer_id!r} is not among the option IDs {ids}")
    return ids.index(str(answer_id))


def item_cells(items: Sequence[EvalItem], spec: GridSpec) -> pd.DataFrame:
    """One row per item: its key columns, ``question`` (``dataset/question_id``), ``answer_position`` (shown
    position of the correct option) and ``correct`` = NaN. Row i is ``items[i]``."""
    rows = []
    for i, it in enumerate(items):
        rows.append({**it.key, "question": f"{it.key['dataset']}/{it.key['question_id']}",
                     "answer_position": _answer_position(it.option_ids, it.answer_id, f"item {i} ({it.key})"),
                     "correct": np.nan})
    cells = pd.DataFrame(rows)
    missing = [c for c in [spec.unit, *spec.columns] if c not in cells.columns]
    if missing:
        raise DataError(f"item_cells: the items lack column(s) {missing} that the {spec.name} estimator needs")
    if cells.duplicated(KEY).any():
        i = int(np.flatnonzero(cells.duplicated(KEY).to_numpy())[0])
        raise DataError(f"item_cells: item {i} repeats the key {items[i].key}")
    return cells


def attach_outcomes(cells: pd.DataFrame, store: ResultStore, model_name: str,
                    columns: Sequence[str] = ("correct",)) -> pd.DataFrame:
    """``cells`` with ``model`` and the outcome ``columns`` (0/1; ``covered`` too for the coverage hurdle, where the
    store has it) filled in from ``store`` where that cell is stored."""
    table = store.read()
    out = cells.assign(model=model_name)
    if table.empty:
        return out
    t = table[table["model"].astype(str) == str(model_name)]
    t = t.assign(**{c: t[c].astype(str) for c in KEY}).set_index(KEY)
    idx = pd.MultiIndex.from_frame(cells[KEY].astype(str))
    for col in (c for c in columns if c in t.columns):
        vals = t[col].reindex(idx).to_numpy(dtype=object)
        out[col] = pd.array([np.nan if v is None or (isinstance(v, float) and np.isnan(v)) else float(bool(v))
                             for v in vals], dtype="float64")
    return out


def _as_engine_order(items: Sequence[EvalItem], idx: np.ndarray) -> list[EvalItem]:
    """The chosen items in the order the engine wants them (whole groups, by generation length)."""
    return sorted((items[int(i)] for i in idx), key=lambda it: (it.group, it.max_new_tokens))


def run_budgeted(model: MLLM, items: Sequence[EvalItem], store: ResultStore, spec: GridSpec, budget: float | int,
                 seed: int = 0, adaptive: bool = False, initial: float = 0.5, batch: int | None = None, *,
                 score_fn: ScoreFn, progress: bool = True, **run_kw: Any) -> pd.DataFrame:
    """Evaluate a budgeted subset of ``items`` into ``store`` (resumable), each output scored by the stage's
    ``score_fn``, and return the store's table.

    Stratified (default): the first ``budget`` of the stratified sequence. Adaptive: the stratified
    prefix for ``initial`` x budget (at least one cell per variant), then batches of ``batch`` cells (default:
    a tenth of the remaining budget) picked by :func:`~mmfragile.budget.estimator.adaptive_batch` on the outcomes
    in the store, until the store holds ``budget`` cells of this grid. ``run_kw`` go to :func:`run_items`."""
    cells = item_cells(items, spec)
    n = budget_size(len(cells), budget)
    record_grid_units(store, model.name, cells[spec.unit])
    if not adaptive:
        chosen = _as_engine_order(items, stratified_order(cells, spec, n, seed))
        return run_items(model, chosen, store, score_fn=score_fn, progress=progress,
                         desc=f"{model.name} budget {n}/{len(cells)}", **run_kw)
    if not 0 < initial <= 1:
        raise ValueError(f"initial must be in (0, 1], got {initial}")
    n0 = min(n, max(cells[spec.unit].nunique(), int(round(initial * n))))
    run_items(model, _as_engine_order(items, stratified_order(cells, spec, n0, seed)), store, score_fn=score_fn,
              progress=progress, desc=f"{model.name} budget {n0}/{len(cells)} (stratified start)", **run_kw)
    step = batch or max(1, (n - n0 + 9) // 10)
    while True:
        cur = attach_outcomes(cells, store, model.name)
        have = int(cur["correct"].notna().sum())
        if have >= n:
            break
        nxt = adaptive_batch(cur, spec, min(step, n - have), seed)
        if not len(nxt):
            break
        run_items(model, _as_engine_order(items, nxt), store, score_fn=score_fn, progress=progress,
                  desc=f"{model.name} adaptive {have + len(nxt)}/{n}", **run_kw)
    return store.read()


def run_auto(model: MLLM, items: Sequence[EvalItem], store: ResultStore, spec: GridSpec, target: float, *,
             score_fn: ScoreFn, seed: int = 0, statistics: Sequence[str] = AUTO_STATISTICS,
             round_share: float = 0.01, progress: bool = True, **run_kw: Any) -> AutoStop:
    """``--budget auto --target T`` (:mod:`mmfragile.budget.auto`): the stratified sequence in rounds into ``store``
    until the widest interval of ``statistics`` is at most ``target`` pp; its rounds are recorded in the store's
    ``run_info["budget_auto"]`` (per model) and it says where it stopped."""
    cells = item_cells(items, spec)
    record_grid_units(store, model.name, cells[spec.unit])
    keep = ("correct", "covered")

    def observe(idx: np.ndarray) -> pd.DataFrame:
        run_items(model, _as_engine_order(items, idx), store, score_fn=score_fn, progress=progress,
                  desc=f"{model.name} auto budget {len(idx)}/{len(cells)}", **run_kw)
        got = attach_outcomes(cells, store, model.name, keep)
        mask = np.zeros(len(cells), bool)
        mask[idx] = True   # only this round's prefix counts, whatever else the store holds
        return got.assign(**{c: got[c].where(mask) for c in keep if c in got.columns})

    def say(row: dict[str, float]) -> None:
        if progress:
            agree = "; every observed cell of a group agrees: no evidence yet" if row["all_agree"] else ""
            print(f"auto budget round {int(row['round'])}: {int(row['cells'])} cells ({100 * row['share']:.1f} %), "
                  f"widest interval {row['widest']:.2f} pp (target {target:g}){agree}", flush=True)

    result = auto_stop(cells, spec, target, observe, statistics=statistics, seed=seed, round_share=round_share,
                       on_round=say)
    store.merge_run_info("budget_auto", {model.name: result.record()})
    if progress:
        print(result, flush=True)
    return result


# ---------------------------------------------------------------------------------------------- from stores
def rows_with_position(rows: pd.DataFrame, what: str) -> pd.DataFrame:
    need = ["model", "dataset", "question_id", "variant", "option_ids", "answer_id", "correct"]
    missing = [c for c in need if c not in rows.columns]
    if missing:
        raise DataError(f"{what}: store rows lack column(s) {missing}")
    pos = [_answer_position(list(o), a, f"{what}: row {i}") for i, (o, a) in
           enumerate(zip(rows["option_ids"], rows["answer_id"]))]
    return rows.assign(answer_position=pos, question=rows["dataset"].astype(str) + "/" + rows["question_id"].astype(str))


def first_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, dataset, question), sorted: the grid's cell order, whatever the store's row order."""
    key = ["model", "dataset", "question_id"]
    first = rows.drop_duplicates(key)
    return first.iloc[np.lexsort([first[c].astype(str).to_numpy() for c in reversed(key)])]


def merge_outcomes(grid: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    obs = rows[["model", *KEY, "correct"]].assign(correct=rows["correct"].astype(bool).astype(float))
    key = ["model", *KEY]
    out = grid.merge(obs.astype({c: str for c in key}), on=key, how="left")
    return out


#: ``run_info`` key of the units (prompts, formats ...) each model's budgeted runs sampled from.
GRID_UNITS = "budget_units"


def record_grid_units(store: ResultStore, model: str, units: Iterable[Any]) -> None:
    """Add ``units`` to the grid ``model``'s budgeted runs of ``store`` sampled from (a later budget over more
    prompts or formats widens it): the estimate is over that grid, not over the study's whole catalogue."""
    old = ((store.config.get(RUN_INFO) or {}).get(GRID_UNITS) or {}).get(model, [])
    store.merge_run_info(GRID_UNITS, {model: sorted({*map(str, old), *map(str, units)})})


def grid_units(configs: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """model -> the units its budgeted runs sampled from, over stores' configs (:func:`record_grid_units`)."""
    out: dict[str, set[str]] = {}
    for cfg in configs:
        for model, units in ((cfg.get(RUN_INFO) or {}).get(GRID_UNITS) or {}).items():
            out.setdefault(model, set()).update(units)
    return {m: sorted(u) for m, u in out.items()}


#: The settings of every store estimate (``mmfragile run --budget`` and ``mmfragile report`` print the same numbers).
STORE_LEVEL, STORE_DRAWS, STORE_SEED = 0.9, 400, 0


def estimate_store(rows: pd.DataFrame, grid: Any, level: float = STORE_LEVEL, n_draws: int = STORE_DRAWS,
                   seed: int = STORE_SEED, units: Mapping[str, Sequence[str]] | None = None, **kw: Any):
    """:func:`~mmfragile.budget.estimator.estimate` on the complete grid rebuilt from a study's store rows (``grid``:
    the stage's :class:`~mmfragile.study.BudgetGrid`, :func:`mmfragile.study.budget_grid`; in any row order: the grid is built in sorted question order, so the posterior draws do not depend on it). ``units``
    (:func:`grid_units` of the stores' configs): per model, the units its budgeted runs sampled from - a run over
    ``--prompt-ids`` / ``--formats`` is estimated over that subset; a model without an entry over the whole grid."""
    cells = grid.cells(rows)
    if units:
        keep = [m not in units or u in units[m] for m, u in zip(cells["model"].astype(str), cells[grid.spec.unit].astype(str))]
        cells = cells[keep].reset_index(drop=True)
    return estimate(cells, grid.spec, level=level, n_draws=n_draws, seed=seed, **kw)


def estimate_tables(est) -> dict[str, pd.DataFrame]:
    """The console's tables of a :class:`~mmfragile.budget.estimator.BudgetEstimate`, at the report's display
    precision (accuracies 1 decimal, shares 2): ``budget`` (cells run per group, and why an estimate is the
    observed value) and ``estimate`` (the summary statistics with their intervals)."""
    budget = est.budget.round({"fraction": 3})
    if "note" in budget and not budget["note"].astype(bool).any():
        budget = budget.drop(columns="note")
    summary = est.summary.drop(columns=["dataset"], errors="ignore")
    return {"budget": budget, "estimate": summary.round({"estimate": 1, "lo": 1, "hi": 1, "naive": 1, "p_unit": 2})}
