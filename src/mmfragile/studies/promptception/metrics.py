"""Promptception metrics (Ismithdeen et al., "Promptception: How Sensitive Are Large Multimodal Models
to Prompts?"): trimmed mean (Eq. 1), PRA (Eq. 2), PRAD (Eq. 3), within-category standard deviations and
the sensitivity rule of Sec. 4.2.1, average PRA per prompt type (Sec. 4.2.2, Figs. 5/6), best/worst prompt
per category (Figs. 9/10), model sensitivity (Fig. 12), and accuracy per prompt from per-question results.

All functions are pure and work on "accuracy frames": long DataFrames with columns
``benchmark, model, prompt_id, accuracy`` (accuracy in percent, ``prompt_id`` a string such as ``"7.6"``).
The published Appendix-B tables in this shape are loaded by :func:`load_published_accuracy`.

Baseline.  The baseline prompt of Fig. 3 is identical to prompt Type 1.1 ("Answer with the option letter
from the given choices directly.", options as "A. ..."), and the "Base" column of Table 2 equals the 1.1
row of Tables 6-8 for every model and benchmark.  The published accuracy frame therefore has no separate
baseline row.  Frames coming from new runs may carry an explicit ``prompt_id == "baseline"`` row: it is
then used as the baseline (:func:`baseline_accuracy`) but left out of every aggregate over prompt types
(trimmed mean, category std, averages), so that the baseline is never counted twice.
"""
from __future__ import annotations

from importlib import resources
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mmfragile.errors import DataError

# --------------------------------------------------------------------------------------------------
# Models, benchmarks, taxonomy
# --------------------------------------------------------------------------------------------------

#: Sec. 2.2: 8 open-source models (HF Transformers) and 2 proprietary API models. Names as in Table 2.
OPEN_SOURCE_MODELS: list[str] = [
    "LLaVA-OV-7B",
    "Qwen2-VL-7B",
    "MiniCPM-V 2.6",
    "Llama-3.2-11B-Vision",
    "Molmo-7B-D-0924",
    "InternVL2.5-1B",
    "InternVL2.5-8B",
    "InternVL2.5-38B",
]
PROPRIETARY_MODELS: list[str] = ["GPT-4o", "Gemini 1.5 Pro"]
MODELS: list[str] = OPEN_SOURCE_MODELS + PROPRIETARY_MODELS
BENCHMARKS: list[str] = ["MMStar", "MMMU-Pro", "MVBench"]

#: The baseline prompt (Fig. 3) is prompt Type 1.1.
BASELINE_PROMPT = "1.1"
BASELINE_LABEL = "baseline"

#: Sec. 4.2.1: for GPT-4o and Gemini 1.5 Pro only a 100-video subset of MVBench was evaluated, so their
#: MVBench results are left out of the category standard deviations (Fig. 4).
PROPRIETARY_EXCLUDED_BENCHMARKS: tuple[str, ...] = ("MVBench",)

#: The 15 categories (Table 1 / Fig. 1 / Table 5).
CATEGORY_NAMES: dict[int, str] = {
    1: "Formatting Variations in Choice Presentation",
    2: "Structured Formatting",
    3: "Prompt Position Changes",
    4: "Poor Linguistic Formatting",
    5: "Effect of Prompt Length",
    6: "Chain of Thought (CoT) Prompt",
    7: "Ambiguity and Probabilistic Prompts",
    8: "Target Audience Prompts",
    9: "Roleplay Scenarios",
    10: "Testing Bias and Stereotypes",
    11: "Focus-Driven Prompts",
    12: "Answer Handling",
    13: "Penalty-Based Prompts",
    14: "Incentive-Based Prompts",
    15: "Competitive Framing Prompts",
}
#: The 6 supercategories (Table 1 / Fig. 1).
SUPERCATEGORY_NAMES: dict[int, str] = {
    1: "Choice Formatting and Presentation",
    2: "Linguistic and Stylistic Challenges",
    3: "Thought Process and Reasoning",
    4: "Context-Aware and Ethical Guidance",
    5: "Task-Specific Instructions",
    6: "Performance, Feedback, and Penalty",
}
#: category -> supercategory number (Table 1 / Table 5).
SUPERCATEGORY_OF_CATEGORY: dict[int, int] = {
    1: 1, 2: 1, 3: 1,
    4: 2, 5: 2,
    6: 3, 7: 3,
    8: 4, 9: 4, 10: 4,
    11: 5, 12: 5,
    13: 6, 14: 6, 15: 6,
}
#: Number of prompt types per category (Appendix A, Table 5); 61 in total.
TYPES_PER_CATEGORY: dict[int, int] = {1: 3, 2: 9, 3: 2, 4: 5, 5: 3, 6: 4, 7: 6, 8: 4, 9: 3, 10: 2,
                                      11: 5, 12: 5, 13: 4, 14: 3, 15: 3}
#: All 61 prompt ids in paper order.
PROMPT_IDS: list[str] = [f"{c}.{i}" for c, n in TYPES_PER_CATEGORY.items() for i in range(1, n + 1)]
#: 11.4 and 11.5 are video-specific (Sec. 4.2.2) and only used on MVBench (59 prompts on image benchmarks).
VIDEO_ONLY_PROMPTS: tuple[str, ...] = ("11.4", "11.5")


def _expand(spec: str) -> list[str]:
    out: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-")
            c = a.split(".")[0]
            out += [f"{c}.{i}" for i in range(int(a.split(".")[1]), int(b.split(".")[1]) + 1)]
        else:
            out.append(part)
    return out


#: Prompt intent (Sec. 4.2.1 / Table 3): positive, neutral, negative framing. Covers all 61 prompts.
PROMPT_INTENT: dict[str, str] = {
    **{p: "positive" for p in _expand("2.3-2.9, 6.1-6.4, 9.1, 10.1, 10.2, 11.4, 11.5, 13.1-13.4, 14.1-14.3, 15.1-15.3")},
    **{p: "neutral" for p in _expand("1.1-1.3, 2.1, 2.2, 3.1, 3.2, 5.1, 8.1-8.4, 12.1-12.5")},
    **{p: "negative" for p in _expand("4.1-4.5, 5.2, 5.3, 7.1-7.6, 9.2, 9.3, 11.1-11.3")},
}


def prompt_category(prompt_id: str) -> int:
    """Category number of a prompt id: the integer before the dot (``"7.6" -> 7``).

    ``"baseline"`` maps to category 1 because the baseline prompt is Type 1.1.
    """
    pid = str(prompt_id).strip()
    if pid == BASELINE_LABEL:
        return 1
    head, sep, tail = pid.partition(".")
    if not sep or not head.isdigit() or not tail.isdigit():
        raise ValueError(f"not a Promptception prompt id: {prompt_id!r} (expected '<category>.<type>')")
    cat = int(head)
    if cat not in CATEGORY_NAMES:
        raise ValueError(f"prompt id {prompt_id!r}: category {cat} outside 1..15")
    return cat


def prompt_supercategory(prompt_id: str) -> int:
    """Supercategory number (1..6) of a prompt id."""
    return SUPERCATEGORY_OF_CATEGORY[prompt_category(prompt_id)]


def prompt_sort_key(prompt_id: str) -> tuple[int, int]:
    """Numeric sort key (``"2.10"`` after ``"2.9"``; ``"baseline"`` first)."""
    pid = str(prompt_id)
    if pid == BASELINE_LABEL:
        return (0, 0)
    a, _, b = pid.partition(".")
    return (int(a), int(b))


def _order_by_prompt(df: pd.DataFrame) -> pd.DataFrame:
    pids = [str(p) for p in df["prompt_id"]]
    idx = sorted(range(len(pids)), key=lambda i: prompt_sort_key(pids[i]))
    return df.iloc[idx]


def model_group(model: str) -> str:
    """``"open-source"`` or ``"proprietary"`` (Sec. 2.2); unknown models count as open-source."""
    return "proprietary" if model in PROPRIETARY_MODELS else "open-source"


# --------------------------------------------------------------------------------------------------
# Published data
# --------------------------------------------------------------------------------------------------

def _read_published(name: str) -> pd.DataFrame:
    path = resources.files("mmfragile") / "resources" / "published" / name
    with resources.as_file(path) as p:
        return pd.read_csv(p, dtype={"prompt_id": str, "model": str, "benchmark": str})


def load_published_accuracy() -> pd.DataFrame:
    """Appendix B Tables 6-8 (MMMU-Pro = s4): ``benchmark, model, prompt_id, accuracy`` (1550 rows)."""
    return _read_published("promptception_accuracy.csv")


def load_published_table2() -> pd.DataFrame:
    """Table 2: ``benchmark, model, trimmed_mean, baseline`` (26 rows)."""
    return _read_published("promptception_table2.csv")


# --------------------------------------------------------------------------------------------------
# Eq. 1-3
# --------------------------------------------------------------------------------------------------

def _trim_count(n: int, proportion: float, rounding: str) -> int:
    x = proportion * n
    if rounding == "floor":
        return int(np.floor(x + 1e-9))
    if rounding == "round":  # Python's round(): half to even ("banker's")
        return int(round(x))
    if rounding == "half_up":
        return int(np.floor(x + 0.5 + 1e-9))
    raise ValueError(f"rounding must be 'floor', 'round' or 'half_up', not {rounding!r}")


def trimmed_mean(values: Sequence[float] | np.ndarray, proportion: float = 0.1, rounding: str = "floor") -> float:
    """Trimmed mean, Eq. 1 (Sec. 2.5.1): sort the N values, drop k from *each* end, average the rest.

    ``rounding`` decides k:

    * ``"floor"`` (default): k = floor(proportion * N), i.e. ``scipy.stats.trim_mean``.  **This is the
      reading that reproduces Table 2**: applied to the accuracies of the prompt types in Tables 6-8
      (N = 61 on MVBench, 59 on MMStar/MMMU-Pro, the baseline counted once as Type 1.1) it gives all 26
      published trimmed means exactly after rounding to one decimal.
    * ``"round"``: k = round(proportion * N) with Python's half-to-even rounding, the literal text of
      Eq. 1 ("rounded to the nearest integer"); for N = 59 this drops 6 instead of 5 values per end and
      misses 3 of 26 published values at one decimal (max |diff| 0.074).
    * ``"half_up"``: k = round-half-up(proportion * N).  Differs from ``"round"`` only when
      proportion * N ends in .5 (e.g. N = 45, 65), which never happens in the paper's tables, so the
      published numbers cannot tell these two apart.

    NaNs are ignored. Raises ``ValueError`` on an empty input or when 2k >= N.
    """
    x = np.asarray(values, dtype=float).ravel()
    x = np.sort(x[~np.isnan(x)])
    n = len(x)
    if n == 0:
        raise ValueError("trimmed_mean of no values")
    k = _trim_count(n, proportion, rounding)
    if 2 * k >= n:
        raise ValueError(f"trimming {k} values from each end of {n} leaves nothing")
    return float(x[k : n - k].mean())


def _num(x):
    return np.asarray(x, dtype=float) if isinstance(x, (list, tuple)) else x


def pra(acc, baseline):
    """Percentage Relative Accuracy, Eq. 2: ``acc / baseline * 100``.

    Works on scalars, numpy arrays, lists and pandas Series (broadcasting as usual).
    """
    return _num(acc) / _num(baseline) * 100.0


def prad(acc, baseline):
    """Percentage Relative Accuracy Difference, Eq. 3: ``(acc - baseline) / baseline * 100`` (= PRA - 100)."""
    acc, baseline = _num(acc), _num(baseline)
    return (acc - baseline) / baseline * 100.0


# --------------------------------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------------------------------

ACC_COLUMNS = ["benchmark", "model", "prompt_id", "accuracy"]


def _check_columns(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise DataError(f"{what}: missing column(s) {missing}; have {list(df.columns)}")


def prompts_only(acc_df: pd.DataFrame) -> pd.DataFrame:
    """The accuracy frame without explicit 'baseline' rows, prompt_id as str, with a category column."""
    _check_columns(acc_df, ACC_COLUMNS, "accuracy frame")
    df = acc_df.copy()
    df["prompt_id"] = df["prompt_id"].astype(str)
    df = df[df.prompt_id != BASELINE_LABEL]
    df["category"] = df.prompt_id.map(prompt_category)
    return df


def baseline_accuracy(acc_df: pd.DataFrame) -> pd.DataFrame:
    """Baseline accuracy per (benchmark, model): the ``"baseline"`` row if present, else prompt 1.1.

    Returns ``benchmark, model, baseline``.  Raises :class:`DataError` if a (benchmark, model) has neither.
    """
    _check_columns(acc_df, ACC_COLUMNS, "accuracy frame")
    df = acc_df.assign(prompt_id=acc_df.prompt_id.astype(str))
    out = []
    for (b, m), g in df.groupby(["benchmark", "model"], sort=False):
        sel = g[g.prompt_id == BASELINE_LABEL]
        if sel.empty:
            sel = g[g.prompt_id == BASELINE_PROMPT]
        if len(sel) != 1:
            raise DataError(f"accuracy frame: benchmark={b!r} model={m!r} has {len(sel)} baseline rows "
                            f"(need exactly one 'baseline' or '{BASELINE_PROMPT}' row)")
        out.append((b, m, float(sel.accuracy.iloc[0])))
    return pd.DataFrame(out, columns=["benchmark", "model", "baseline"])


def add_relative_accuracy(acc_df: pd.DataFrame) -> pd.DataFrame:
    """Prompt rows (no 'baseline' rows) with ``category, baseline, pra, prad`` columns added (Eqs. 2, 3)."""
    base = baseline_accuracy(acc_df)
    df = prompts_only(acc_df).merge(base, on=["benchmark", "model"], how="left")
    df["pra"] = pra(df.accuracy.to_numpy(), df.baseline.to_numpy())
    df["prad"] = prad(df.accuracy.to_numpy(), df.baseline.to_numpy())
    return df


def trimmed_means(acc_df: pd.DataFrame, proportion: float = 0.1, rounding: str = "floor") -> pd.DataFrame:
    """Table 2: trimmed mean (Eq. 1) of the prompt-type accuracies and the baseline per (benchmark, model).

    The N values are the accuracies of all prompt types run on that benchmark (61 on MVBench, 59 on the
    image benchmarks); the baseline enters once, as Type 1.1 (an explicit 'baseline' row is not added a
    second time).  See :func:`trimmed_mean` for ``rounding``.  Returns
    ``benchmark, model, trimmed_mean, baseline, n_prompts``.
    """
    df = prompts_only(acc_df)
    base = baseline_accuracy(acc_df)
    rows = [(b, m, trimmed_mean(g.accuracy.to_numpy(), proportion, rounding), len(g))
            for (b, m), g in df.groupby(["benchmark", "model"], sort=False)]
    out = pd.DataFrame(rows, columns=["benchmark", "model", "trimmed_mean", "n_prompts"])
    out = out.merge(base, on=["benchmark", "model"], how="left")
    return out[["benchmark", "model", "trimmed_mean", "baseline", "n_prompts"]]


def prompt_accuracy(per_question: pd.DataFrame, exclude_refusals: bool = False) -> pd.DataFrame:
    """Accuracy (%) per (model, benchmark, prompt_id) from per-question results.

    ``per_question`` has columns ``model, benchmark, prompt_id, question_id, correct (bool)`` and, when
    ``exclude_refusals`` is set, ``refusal (bool)``.  Invalid (unparseable) answers count as incorrect
    (App. E).  With ``exclude_refusals=True`` questions the model refused to answer for safety reasons are
    dropped from the denominator, as the paper does for GPT-4o (App. E, "Handling Invalid Responses").
    Returns ``benchmark, model, prompt_id, accuracy, n, n_correct, n_refusals`` (an accuracy frame).
    """
    need = ["model", "benchmark", "prompt_id", "question_id", "correct"] + (["refusal"] if exclude_refusals else [])
    _check_columns(per_question, need, "per-question results")
    df = per_question.copy()
    df["prompt_id"] = df.prompt_id.astype(str)
    if df.duplicated(["model", "benchmark", "prompt_id", "question_id"]).any():
        i = int(np.flatnonzero(df.duplicated(["model", "benchmark", "prompt_id", "question_id"]).to_numpy())[0])
        raise DataError(f"per-question results: row {i} duplicates (model, benchmark, prompt_id, question_id)")
    for col in ("correct", "refusal"):
        if col in df.columns:
            if df[col].isna().any():
                i = int(np.flatnonzero(df[col].isna().to_numpy())[0])
                raise DataError(f"per-question results: row {i} has a missing {col!r}")
            df[col] = df[col].astype(bool)
    if "refusal" not in df.columns:
        df["refusal"] = False
    keys = ["benchmark", "model", "prompt_id"]
    n_ref = df.groupby(keys, sort=False).refusal.sum().rename("n_refusals")
    if exclude_refusals:
        df = df[~df.refusal]
    g = df.groupby(keys, sort=False).correct
    out = pd.concat([g.size().rename("n"), g.sum().rename("n_correct")], axis=1)
    out = out.join(n_ref, how="right").fillna({"n": 0, "n_correct": 0}).reset_index()
    out["n"] = out.n.astype(int)
    out["n_correct"] = out.n_correct.astype(int)
    out["n_refusals"] = out.n_refusals.astype(int)
    with np.errstate(invalid="ignore", divide="ignore"):
        out["accuracy"] = np.where(out.n > 0, 100.0 * out.n_correct / out.n.where(out.n > 0, 1), np.nan)
    return out[["benchmark", "model", "prompt_id", "accuracy", "n", "n_correct", "n_refusals"]]


def group_intervals(per_question: pd.DataFrame, groups: Mapping[str, Iterable[int]], proportion: float = 0.1,
                    n_boot: int = 2000, seed: int = 0, level: float = 0.95,
                    contrasts: Sequence[tuple[str, str]] = ()) -> pd.DataFrame:
    """Where a model's prompt sensitivity lies, with percentile bootstrap intervals over *questions* (every prompt of
    a drawn question goes with it; the draws are shared by all statistics of a (benchmark, model), so their
    differences are paired). Per (benchmark, model) and statistic: its accuracy (%), its PRAD against the baseline
    prompt 1.1 (Eq. 3) and the difference in points, each with an interval.

    Statistics: ``baseline`` (prompt 1.1), ``trimmed_mean`` (Eq. 1 over all prompts run, as Table 2) and, for
    every ``groups`` entry ``name -> prompt categories``, ``name``: the mean accuracy of its prompts (unweighted over
    prompts, as the paper averages per prompt type; 1.1 itself left out). ``per_question``: ``benchmark, model,
    prompt_id, question_id, correct``. Columns: ``benchmark, model, statistic, n_prompts, n_questions, accuracy,
    accuracy_low, accuracy_high, prad, prad_low, prad_high, diff, diff_low, diff_high``.

    ``contrasts``: pairs ``(a, b)`` of statistics compared with each other on the same draws - a row ``"a - b"``
    whose ``diff`` is a's accuracy minus b's (points) and ``prad`` a's PRAD with b as the reference (``accuracy``
    empty). A paired contrast of two prompt groups does not carry the sampling noise of the one baseline prompt
    that every PRAD against 1.1 shares."""
    from mmfragile import bootstrap

    _check_columns(per_question, ["benchmark", "model", "prompt_id", "question_id", "correct"], "per-question results")
    rows = []
    for (bench, model), g in per_question.groupby(["benchmark", "model"], sort=False):
        hits = g.pivot_table(index="prompt_id", columns="question_id", values="correct", aggfunc="sum", fill_value=0)
        n = g.pivot_table(index="prompt_id", columns="question_id", values="correct", aggfunc="size", fill_value=0)
        prompts = [str(p) for p in hits.index]
        if BASELINE_PROMPT not in prompts:
            raise DataError(f"group_intervals: {bench}/{model} has no baseline prompt {BASELINE_PROMPT}")
        w = bootstrap.unit_weights(hits.shape[1], n_boot, seed)
        draws = 100 * bootstrap.ratio_draws(w, hits.to_numpy(float), n.to_numpy(float))       # draws x prompts
        point = 100 * hits.sum(axis=1).to_numpy(float) / n.sum(axis=1).to_numpy(float)
        base_i = prompts.index(BASELINE_PROMPT)
        k = _trim_count(len(prompts), proportion, "floor")
        stats = {"baseline": (lambda a: a[..., base_i], 1),
                 "trimmed_mean": (lambda a: np.sort(a, axis=-1)[..., k:len(prompts) - k].mean(axis=-1), len(prompts))}
        for name, cats in groups.items():
            idx = [i for i, p in enumerate(prompts) if prompt_category(p) in set(cats) and p != BASELINE_PROMPT]
            if idx:
                stats[name] = (lambda a, idx=idx: a[..., idx].mean(axis=-1), len(idx))
        def row(name: str, n_prompts: int, stat, ref, accuracy: bool = True) -> dict:
            """``stat``'s accuracy (if ``accuracy``), PRAD and difference against ``ref``, each with its interval."""
            d, v, rd, rv = stat(draws), float(stat(point)), ref(draws), float(ref(point))
            out = {"benchmark": bench, "model": model, "statistic": name, "n_prompts": n_prompts,
                   "n_questions": hits.shape[1]}
            cols = [("accuracy", d, v)] if accuracy else []
            for col, dv, pv in cols + [("prad", prad(d, rd), float(prad(v, rv))), ("diff", d - rd, v - rv)]:
                lo, hi = bootstrap.interval(dv, level)
                out.update({col: pv, f"{col}_low": lo, f"{col}_high": hi})
            return out

        base = stats["baseline"][0]
        rows += [row(name, n_prompts, stat, base) for name, (stat, n_prompts) in stats.items()]
        for a, b in contrasts:
            if a not in stats or b not in stats:
                raise KeyError(f"group_intervals: contrast ({a!r}, {b!r}) names a statistic not computed; "
                               f"known: {sorted(stats)}")
            rows.append(row(f"{a} - {b}", stats[a][1] + stats[b][1], stats[a][0], stats[b][0], accuracy=False))
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------------
# Sec. 4.2.1: category standard deviations and the sensitivity rule
# --------------------------------------------------------------------------------------------------

def category_std(acc_df: pd.DataFrame, catalog_map: Mapping[str, int] | None = None, ddof: int = 0) -> pd.DataFrame:
    """Standard deviation of the prompt accuracies within each category, per (benchmark, model).

    Sec. 4.2.1 computes "the standard deviation within each category for each model".  ``ddof=0``
    (population std, ``numpy.std``) is the reading that reproduces the paper's threshold: the median of
    all these values on the published Tables 6-8 is 0.775 (the paper: 0.78), while the sample std
    (``ddof=1``) gives 0.90.  ``catalog_map`` maps prompt_id -> category (default: the integer before the
    dot).  Returns ``benchmark, model, category, std, n_prompts``.
    """
    df = prompts_only(acc_df)
    if catalog_map is not None:
        cmap = {str(k): int(v) for k, v in catalog_map.items()}
        unknown = sorted(set(df.prompt_id) - set(cmap), key=prompt_sort_key)
        if unknown:
            raise DataError(f"category_std: prompt id(s) {unknown} missing from catalog_map")
        df["category"] = df.prompt_id.map(cmap)
    g = df.groupby(["benchmark", "model", "category"], sort=False).accuracy
    out = pd.concat([g.std(ddof=ddof).rename("std"), g.size().rename("n_prompts")], axis=1).reset_index()
    return out.sort_values(["benchmark", "model", "category"], kind="stable").reset_index(drop=True)


def average_category_std(
    std_df: pd.DataFrame,
    exclude: Mapping[str, Iterable[str]] | None = None,
) -> pd.DataFrame:
    """Fig. 4: category std averaged over the benchmarks, per (model, category).

    ``exclude`` maps model -> benchmarks left out of its average; by default MVBench for the proprietary
    models (Sec. 4.2.1: only a 100-video subset was used for them).  Pass ``{}`` to keep everything.
    Returns ``model, category, std, n_benchmarks``.
    """
    _check_columns(std_df, ["benchmark", "model", "category", "std"], "category-std frame")
    if exclude is None:
        exclude = {m: PROPRIETARY_EXCLUDED_BENCHMARKS for m in PROPRIETARY_MODELS}
    excluded = {(m, b) for m, bs in exclude.items() for b in bs}
    drop = [(m, b) in excluded for m, b in zip(std_df["model"], std_df["benchmark"])]
    df = std_df[~np.asarray(drop, dtype=bool)]
    g = df.groupby(["model", "category"], sort=False)["std"]
    out = pd.concat([g.mean().rename("std"), g.size().rename("n_benchmarks")], axis=1).reset_index()
    return out


def sensitivity_threshold(std_df: pd.DataFrame) -> float:
    """Sec. 4.2.1 / App. K: the threshold is the median of all std values in ``std_df``.

    The paper "aggregated all standard deviation values across models and categories and set the threshold
    at the median (0.78)".  On the published tables, the median over all per-(benchmark, model, category)
    values of :func:`category_std` (390 values, proprietary MVBench included) is 0.775, which reproduces
    0.78; the median of the Fig. 4 averages (150 values) would be 0.83-0.87, and excluding the
    proprietary MVBench values gives 0.72.  Pass the per-benchmark frame to reproduce the paper.
    """
    _check_columns(std_df, ["std"], "std frame")
    vals = std_df["std"].to_numpy(dtype=float)
    vals = vals[~np.isnan(vals)]
    if len(vals) == 0:
        raise ValueError("sensitivity_threshold of no std values")
    return float(np.median(vals))


def sensitive_categories(
    std_df: pd.DataFrame,
    threshold: float,
    min_models: int = 5,
    models: Iterable[str] | None = None,
) -> list[int]:
    """Sec. 4.2.1 rule: a category is highly sensitive if at least ``min_models`` models have a std
    strictly greater than ``threshold`` (the paper: 5 of the 8 open-source models, threshold 0.78).

    ``std_df`` is per (model, category) (Fig. 4 values, :func:`average_category_std`); a frame that still
    has a ``benchmark`` column is first averaged with :func:`average_category_std` (default exclusions).
    ``models`` restricts the models considered (e.g. :data:`OPEN_SOURCE_MODELS`).
    Returns the sorted category numbers.

    On the published tables this gives categories 2, 6, 7, 9, 12; the paper also lists 8, which only 4 of
    the 8 open-source models exceed (MiniCPM, Llama, Molmo, InternVL2.5-1B) under any std reading tried.
    """
    _check_columns(std_df, ["model", "category", "std"], "std frame")
    df = average_category_std(std_df) if "benchmark" in std_df.columns else std_df
    if models is not None:
        df = df[df.model.isin(list(models))]
    counts = (df["std"] > threshold).groupby(df["category"]).sum()
    return sorted(int(c) for c, n in counts.items() if n >= min_models)


# --------------------------------------------------------------------------------------------------
# Sec. 4.2.2: average PRA per prompt type, best / worst prompt per category
# --------------------------------------------------------------------------------------------------

def average_pra(
    acc_df: pd.DataFrame,
    models: Iterable[str] | None = None,
    exclude_below: float | None = 80.0,
    benchmarks: Iterable[str] | None = None,
) -> pd.DataFrame:
    """Figs. 5/6: PRA (Eq. 2, w.r.t. the model's baseline on that benchmark) averaged per prompt type
    over the given models and all benchmarks (all (model, benchmark) pairs pooled).

    Sec. 4.2.2: "for open-source models, percentage relative accuracies below 80% were excluded from the
    averaging" - use ``exclude_below=80`` for open-source models and ``None`` for proprietary ones (the
    paper keeps e.g. the -50% of prompt 9.2).  Returns ``prompt_id, category, pra, prad, n, n_excluded``
    in prompt order, where ``prad`` = mean PRAD (Eq. 3) = ``pra - 100`` over the same values (Figs. 9/10).
    """
    df = add_relative_accuracy(acc_df)
    if models is not None:
        df = df[df.model.isin(list(models))]
    if benchmarks is not None:
        df = df[df.benchmark.isin(list(benchmarks))]
    keep = np.ones(len(df), dtype=bool) if exclude_below is None else (df.pra >= exclude_below).to_numpy()
    excl = (~pd.Series(keep, index=df.index)).groupby(df.prompt_id).sum().rename("n_excluded")
    kept = df[keep]
    g = kept.groupby("prompt_id")
    out = pd.concat([g.pra.mean().rename("pra"), g.prad.mean().rename("prad"), g.size().rename("n")], axis=1)
    out = out.join(excl, how="outer").reset_index()
    out["n"] = out.n.fillna(0).astype(int)
    out["n_excluded"] = out.n_excluded.fillna(0).astype(int)
    out["category"] = out.prompt_id.map(prompt_category)
    out = _order_by_prompt(out).reset_index(drop=True)
    return out[["prompt_id", "category", "pra", "prad", "n", "n_excluded"]]


def best_worst_per_category(avg_df: pd.DataFrame, value: str = "prad") -> pd.DataFrame:
    """Figs. 9/10: the best and worst prompt type of each category by mean PRAD (Eq. 3).

    ``avg_df`` is the output of :func:`average_pra`.  Ties are broken by prompt order.  Returns
    ``category, category_name, best_prompt, best_prad, worst_prompt, worst_prad, n_prompts``
    (for a one-prompt category best and worst are the same prompt).
    """
    _check_columns(avg_df, ["prompt_id", value], "average-PRA frame")
    df = avg_df.dropna(subset=[value]).copy()
    if "category" not in df.columns:
        df["category"] = df.prompt_id.map(prompt_category)
    df = _order_by_prompt(df)
    rows = []
    for c, g in df.groupby("category", sort=True):
        b = g.loc[g[value].idxmax()]
        w = g.loc[g[value].idxmin()]
        rows.append((int(c), CATEGORY_NAMES.get(int(c), str(c)), b.prompt_id, float(b[value]),
                     w.prompt_id, float(w[value]), len(g)))
    return pd.DataFrame(rows, columns=["category", "category_name", "best_prompt", f"best_{value}",
                                       "worst_prompt", f"worst_{value}", "n_prompts"])


# --------------------------------------------------------------------------------------------------
# App. H: model sensitivity
# --------------------------------------------------------------------------------------------------

def model_sensitivity(acc_df: pd.DataFrame, prompts: Iterable[str] | None = None, ddof: int = 0) -> pd.DataFrame:
    """Figs. 12-15: mean accuracy and std over prompts per (benchmark, model), averaged over benchmarks.

    ``prompts`` restricts to a subset (e.g. the positive prompts of :data:`PROMPT_INTENT` for Fig. 13).
    Returns ``model, group, mean_accuracy, std, n_benchmarks`` (``group`` open-source / proprietary),
    in :data:`MODELS` order for known models.
    """
    df = prompts_only(acc_df)
    if prompts is not None:
        df = df[df.prompt_id.isin([str(p) for p in prompts])]
    per = df.groupby(["benchmark", "model"], sort=False).accuracy.agg(
        mean_accuracy="mean", std=lambda s: float(np.std(s.to_numpy(), ddof=ddof))).reset_index()
    out = per.groupby("model", sort=False).agg(mean_accuracy=("mean_accuracy", "mean"), std=("std", "mean"),
                                               n_benchmarks=("benchmark", "size")).reset_index()
    out["group"] = out.model.map(model_group)
    order = {m: i for i, m in enumerate(MODELS)}
    out = out.iloc[np.argsort([order.get(m, len(order)) for m in out.model], kind="stable")].reset_index(drop=True)
    return out[["model", "group", "mean_accuracy", "std", "n_benchmarks"]]
