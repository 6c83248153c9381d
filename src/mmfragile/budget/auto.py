"""A budgeted run that stops when it knows enough: ``--budget auto --target T``.

The cells run in seeded rounds along the stratified sequence (:func:`~mmfragile.budget.estimator.stratified_order`:
round k is its first k x ``round_share`` of the grid, at least one cell per unit a round, so rounds nest). After
each round the grid is estimated from the cells of the rounds so far - only those, whatever else a store holds -
and the run stops at the first round where the widest interval of the asked statistics (default: the mean and
the 5-95 % spread, over every group) is at most ``target`` percentage points - never while a group's observed
cells all agree (every answer right, or every one wrong: its intervals then come from the prior alone). Every
choice is a function of the seed and of the outcomes of the cells already chosen, so a killed run, rerun, runs the
same cells and stops at the same round. :func:`auto_stop` is the rule on any source of outcomes: a model run
(:func:`mmfragile.budget.run_auto`, what ``run_study(budget="auto")`` calls) or a complete grid with the rest
hidden (:func:`mmfragile.budget.validation.auto_stop_curves`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from mmfragile.budget.estimator import STATISTICS, BudgetEstimate, GridSpec, estimate, stratified_order

__all__ = ["AUTO", "AUTO_STATISTICS", "AutoStop", "round_sizes", "widest_intervals", "auto_stop"]

#: the ``budget`` value that asks for a run that stops by itself
AUTO = "auto"
#: the statistics whose intervals a run stops on by default
AUTO_STATISTICS: tuple[str, ...] = ("mean", "spread")


@dataclass
class AutoStop:
    """What an auto-stopped run did: ``rounds`` (one row per round: ``round``, ``cells``, ``share`` of the grid,
    the widest interval in pp of each statistic and ``widest`` of them all), the ``target`` (pp), whether it was
    ``reached`` (else the grid ran out first), and the last round's ``estimate``."""

    rounds: pd.DataFrame
    target: float
    statistics: tuple[str, ...]
    reached: bool
    estimate: BudgetEstimate
    n_cells: int

    @property
    def share(self) -> float:
        """The share of the grid it ran."""
        return float(self.rounds["share"].iloc[-1])

    def __str__(self) -> str:
        last = self.rounds.iloc[-1]
        what = ", ".join(self.statistics)
        how = (f"widest {self.estimate.level:.0%} interval of {what}: {last['widest']:.2f} pp <= target "
               f"{self.target:g} pp" if self.reached else
               f"the grid ran out before the target: widest interval of {what} {last['widest']:.2f} pp > "
               f"{self.target:g} pp")
        return (f"auto budget: stopped after round {int(last['round'])} with {int(last['cells'])} of {self.n_cells} "
                f"cells ({100 * self.share:.1f} % of the grid); {how}")

    def record(self) -> dict[str, object]:
        """The run_info entry a store keeps of it (JSON)."""
        last = self.rounds.iloc[-1]
        return {"target": self.target, "statistics": list(self.statistics), "reached": self.reached,
                "rounds": int(last["round"]), "cells": int(last["cells"]), "n_cells": self.n_cells,
                "share": self.share, "widest": float(last["widest"])}


def round_sizes(n_cells: int, n_units: int, round_share: float) -> list[int]:
    """The cumulative cell counts of the rounds: steps of ``round_share`` of the grid (at least one cell per unit),
    the last one the whole grid."""
    if not 0 < round_share <= 1:
        raise ValueError(f"round share must be in (0, 1], got {round_share}")
    step = max(int(n_units), math.ceil(round_share * n_cells), 1)
    return list(range(step, n_cells, step)) + [n_cells]


def _check_statistics(statistics: Sequence[str]) -> tuple[str, ...]:
    bad = [s for s in statistics if s not in STATISTICS]
    if bad or not statistics:
        raise ValueError(f"--stop-on: unknown statistic(s) {bad or list(statistics)}; choose from {list(STATISTICS)}")
    return tuple(statistics)


def widest_intervals(est: BudgetEstimate, statistics: Sequence[str]) -> dict[str, float]:
    """Per statistic, the widest interval (``hi - lo``, pp) over the estimate's groups."""
    _check_statistics(statistics)
    rows = est.summary[est.summary["statistic"].isin(list(statistics))]
    width = (rows["hi"] - rows["lo"]).groupby(rows["statistic"]).max()
    return {s: float(width.get(s, np.nan)) for s in statistics}


def auto_stop(cells: pd.DataFrame, spec: GridSpec, target: float, observe: Callable[[np.ndarray], pd.DataFrame], *,
              statistics: Sequence[str] = AUTO_STATISTICS, seed: int = 0, round_share: float = 0.01,
              level: float = 0.9, n_draws: int = 200,
              on_round: Callable[[dict[str, float]], None] | None = None) -> AutoStop:
    """Run the rounds (see the module docstring) until the target holds. ``cells``: the grid's cell frame (outcomes
    not needed); ``observe(idx)``: the cell frame with the outcomes of exactly the cells ``idx`` (positions in
    ``cells``; the rest NaN) - it runs or reads them. ``on_round``: called with each round's row (progress)."""
    if not target > 0:
        raise ValueError(f"--target must be > 0 pp, got {target}")
    statistics = _check_statistics(statistics)
    order = stratified_order(cells, spec, len(cells), seed)
    rows: list[dict[str, float]] = []
    est, reached = None, False
    for k, n in enumerate(round_sizes(len(cells), cells[spec.unit].nunique(), round_share), start=1):
        est = estimate(observe(order[:n]), spec, level=level, n_draws=n_draws, seed=seed)
        widths = widest_intervals(est, statistics)
        # a group whose observed cells all agree has intervals from the prior alone: no evidence to stop on
        flat = bool((est.budget["note"].astype(str) != "").any())
        row = {"round": k, "cells": n, "share": n / len(cells), **{f"{s}_width": w for s, w in widths.items()},
               "widest": max(widths.values()), "all_agree": flat}
        rows.append(row)
        if on_round is not None:
            on_round(row)
        reached = row["widest"] <= target and not flat
        if reached:
            break
    assert est is not None   # a grid has at least one round
    return AutoStop(pd.DataFrame(rows), float(target), statistics, bool(reached), est, len(cells))
