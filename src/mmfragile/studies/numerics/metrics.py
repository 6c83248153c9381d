"""The noise floor as pure functions on a numerics store's rows (one row per cell and run).

A numerics store holds the reference run - the model under its name, the run's own default settings - and one run
per alternative under ``<model>~<alternative>`` (:data:`SEPARATOR`). :func:`floor_table` pairs each alternative's
cells with the reference's and reports, per alternative: the answer flip rate (Wilson interval), the paired
accuracy change (bootstrap over questions, McNemar's exact test), the median and max |delta option logit|, the
share of cells whose top-2 option-logit margin is below that max, and how many format / prompt ranks change.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

#: between a model's name and an alternative's in a numerics store (``zoo-gemma3-good~bfloat16``)
SEPARATOR = "~"
CELL = ["dataset", "question_id", "variant"]
COLUMNS = ["alternative", "cells", "flips", "flip_rate", "flip_lo", "flip_hi", "delta_acc", "delta_lo", "delta_hi",
           "mcnemar_p", "median_dlogit", "max_dlogit", "share_margin_below", "rank_changes", "effects"]


def split_model(name: str) -> tuple[str, str | None]:
    """``"m~bfloat16"`` -> ``("m", "bfloat16")``; a reference run's name -> ``(name, None)``."""
    base, sep, alt = str(name).partition(SEPARATOR)
    return base, (alt if sep else None)


def answer_key(rows: pd.DataFrame) -> pd.Series:
    """What one cell answered, comparable across runs: the option it chose where its output was one
    (``letter`` - Promptception's extraction - or ``selected_position``), else its raw output (an uncovered
    answer that changes its text is a changed answer, never dropped)."""
    raw = "raw:" + rows["raw_output"].astype(str) if "raw_output" in rows else pd.Series("", index=rows.index)
    col = next((c for c in ("letter", "selected_position") if c in rows), None)
    if col is None:
        return raw

    def option(v) -> str:  # 1, 1.0 and "1" are one position; a letter stays itself
        return f"opt:{int(v)}" if isinstance(v, (int, float, np.integer, np.floating)) else f"opt:{v}"

    chosen = rows[col]
    return pd.Series([option(v) if pd.notna(v) else r for v, r in zip(chosen, raw)], index=rows.index)


def wilson(count: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (statsmodels), in [0, 1]; (nan, nan) without cells."""
    if n == 0:
        return math.nan, math.nan
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(count, n, alpha=1 - level, method="wilson")
    return float(lo), float(hi)


def mcnemar_p(ref_correct: np.ndarray, alt_correct: np.ndarray) -> float:
    """McNemar's exact test of paired correctness (1.0 where no cell changed correctness)."""
    b = int(np.sum(ref_correct & ~alt_correct))
    c = int(np.sum(~ref_correct & alt_correct))
    if b + c == 0:
        return 1.0
    from statsmodels.stats.contingency_tables import mcnemar

    return float(mcnemar([[0, b], [c, 0]], exact=True).pvalue)


def bootstrap_delta(questions: np.ndarray, delta: np.ndarray, n_boot: int = 1000, level: float = 0.95,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the mean paired change (pp), resampling whole questions (their cells move together:
    :mod:`mmfragile.bootstrap`); (nan, nan) with fewer than two questions."""
    from mmfragile import bootstrap

    per_question = bootstrap.unit_sums(pd.DataFrame({"q": questions, "d": delta}), "q", "d")
    if len(per_question) < 2:
        return math.nan, math.nan
    weights = bootstrap.unit_weights(len(per_question), n_boot, seed)
    return bootstrap.interval(bootstrap.ratio_draws(weights, per_question["sum"], per_question["n"]), level)


def _logit_array(value) -> np.ndarray | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    arr = np.asarray(list(value), dtype=np.float64)
    return arr if arr.size else None


def logit_deltas(ref: pd.Series, alt: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Per paired cell with option logits on both sides: max |alt - ref| over the options, and the reference's
    top-2 margin."""
    deltas, margins = [], []
    for a, b in zip(ref, alt):
        x, y = _logit_array(a), _logit_array(b)
        if x is None or y is None or x.shape != y.shape:
            continue
        deltas.append(float(np.max(np.abs(y - x))))
        top = np.sort(x)[::-1]
        margins.append(float(top[0] - top[1]) if len(top) > 1 else math.inf)
    return np.asarray(deltas), np.asarray(margins)


def effect_of(variant: pd.Series) -> pd.Series:
    """The effect a cell belongs to: its format (``uppercase-dot-comma|s2`` -> ``uppercase-dot-comma``) or its
    prompt (Promptception's variant is the prompt id)."""
    return variant.astype(str).str.partition("|")[0]


def rank_changes(ref: pd.DataFrame, alt: pd.DataFrame) -> tuple[int, int]:
    """How many effects (formats, prompts) change rank by accuracy between the two runs of the same cells, of how
    many (ties share their best rank)."""
    def ranks(rows):
        acc = rows.assign(effect=effect_of(rows["variant"]), c=rows["correct"].astype(float)).groupby("effect")["c"]
        return acc.mean().rank(ascending=False, method="min")

    a, b = ranks(ref), ranks(alt)
    common = a.index.intersection(b.index)
    return int((a[common] != b[common]).sum()), int(len(common))


def paired(rows: pd.DataFrame, reference: str, alternative: str) -> pd.DataFrame:
    """The cells both runs hold, side by side (``_ref`` / ``_alt`` suffixes)."""
    ref = rows[rows["model"] == reference]
    alt = rows[rows["model"] == alternative]
    return ref.merge(alt, on=CELL, suffixes=("_ref", "_alt"))


def alternative_row(rows: pd.DataFrame, reference: str, alternative: str, level: float = 0.95,
                    n_boot: int = 1000, seed: int = 0) -> dict:
    """One alternative's line of :func:`floor_table`."""
    p = paired(rows, reference, alternative)
    n = len(p)
    ref_ans, alt_ans = (answer_key(p[[c for c in p if c.endswith(side)]].rename(columns=lambda c: c[:-4]))
                        for side in ("_ref", "_alt"))
    flips = int((ref_ans != alt_ans).sum())
    lo, hi = wilson(flips, n, level)
    rc = p["correct_ref"].astype(bool).to_numpy() if n else np.array([], bool)
    ac = p["correct_alt"].astype(bool).to_numpy() if n else np.array([], bool)
    delta = 100.0 * (ac.astype(float) - rc.astype(float))
    dlo, dhi = bootstrap_delta((p["dataset"] + "/" + p["question_id"].astype(str)).to_numpy(), delta, n_boot,
                               level, seed) if n else (math.nan, math.nan)
    d, margin = (logit_deltas(p["option_logits_ref"], p["option_logits_alt"]) if "option_logits_ref" in p
                 else (np.array([]), np.array([])))
    max_d = float(d.max()) if d.size else math.nan
    changed, effects = rank_changes(p[CELL].assign(correct=p["correct_ref"]), p[CELL].assign(correct=p["correct_alt"]))\
        if n else (0, 0)
    return {"alternative": split_model(alternative)[1], "cells": n, "flips": flips,
            "flip_rate": 100.0 * flips / n if n else math.nan, "flip_lo": 100 * lo, "flip_hi": 100 * hi,
            "delta_acc": float(delta.mean()) if n else math.nan, "delta_lo": dlo, "delta_hi": dhi,
            "mcnemar_p": mcnemar_p(rc, ac), "median_dlogit": float(np.median(d)) if d.size else math.nan,
            "max_dlogit": max_d, "share_margin_below": 100.0 * float(np.mean(margin < max_d)) if d.size else math.nan,
            "rank_changes": changed, "effects": effects}


def floor_table(rows: pd.DataFrame, level: float = 0.95, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per (model, alternative) of a numerics store: see the module docstring. Rates and changes in %/pp."""
    out = []
    names = sorted(map(str, rows["model"].unique())) if len(rows) else []
    for name in names:
        base, alt = split_model(name)
        if alt is None or base not in names:
            continue
        out.append({"model": base, **alternative_row(rows, base, name, level, n_boot, seed)})
    return pd.DataFrame(out, columns=["model", *COLUMNS])


def floor_pp(table: pd.DataFrame) -> pd.Series:
    """A model's numerical floor in pp: the widest paired accuracy change any alternative could make - the upper
    end of the largest interval of |delta accuracy| - per model."""
    if table.empty:
        return pd.Series(dtype=float)
    width = np.maximum(table["delta_hi"].abs().fillna(0), table["delta_lo"].abs().fillna(0))
    width = np.maximum(width, table["delta_acc"].abs().fillna(0))
    return pd.Series(width.to_numpy(), index=table["model"]).groupby(level=0).max()
