"""Percentile bootstrap over units (questions, judged samples): the intervals of the planted-fragility checks.

A statistic that is a ratio of per-unit sums (an accuracy: hits / items; a mean BD: terms / pairs) is resampled
by drawing units with replacement - every row of a drawn unit goes with it, so repeated runs, prompts or circular
shifts of one question are never treated as independent - as multiplicities ``W`` (draws x units), so the draws of
every statistic of one table share the same resampled units and differences between them are paired.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

LEVEL = 0.95


def unit_weights(n_units: int, n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """Bootstrap draws of ``n_units`` units as multiplicities (``n_boot x n_units``), seeded."""
    if n_units < 1:
        raise ValueError("a bootstrap needs at least one unit")
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=n_boot).astype(float)


def ratio_draws(weights: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Resampled ``sum / count`` for every draw: ``weights`` (draws x units) with ``sums`` / ``counts`` per unit
    (units, or statistics x units) -> draws (or draws x statistics)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (weights @ np.asarray(sums, float).T) / (weights @ np.asarray(counts, float).T)


def interval(draws: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of bootstrap draws (NaN draws - a resample without any count - ignored)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    a = 100 * (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = np.nanpercentile(np.asarray(draws, float), [a, 100 - a])
    return float(lo), float(hi)


def unit_sums(frame: pd.DataFrame, unit: str, value: str) -> pd.DataFrame:
    """Per unit: the sum and the count of the non-missing ``value`` (columns ``sum``, ``n``), sorted by unit."""
    v = pd.to_numeric(frame[value], errors="coerce")
    return (pd.DataFrame({"u": frame[unit].astype(str).to_numpy(), "sum": v.fillna(0.0).to_numpy(),
                          "n": v.notna().astype(float).to_numpy()})
            .groupby("u", sort=True)[["sum", "n"]].sum())
