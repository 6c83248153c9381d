"""Metrics for Study 1: prompt-format bias in multiple-choice VQA.

Paper: "Unexplored Flaws in Multiple-Choice VQA Evaluations" (seed ``format-bias-mcvqa.txt``).
48 prompt formats = 4 option-ID sets x 4 option delimiters x 3 option separators (Tab. 1); every format
is evaluated with circular evaluation (Sec. 4.2, B.3).

All functions are pure functions on pandas DataFrames. The level names are shared with
:mod:`mmfragile.studies.format_bias.prompts`:

* ``option_ids``: ``uppercase`` (A/B/C/D), ``lowercase`` (a/b/c/d), ``numbers`` (1/2/3/4), ``roman`` (I/II/III/IV)
* ``delimiter``:  ``dot`` ("A."), ``colon`` ("A:"), ``bracket`` ("A)"), ``double_brackets`` ("(A)")
* ``separator``:  ``line_break``, ``comma``, ``semicolon``

Per-question results (the input of :func:`format_scores` and friends) have one row per
model x dataset x question x circular shift x format, with at least the columns
``model, dataset, question_id, shift, option_ids, delimiter, separator, correct, covered,
selected_position`` (``selected_position``: 0-based position of the chosen option in the displayed
(shifted) order, ``-1`` when the output is not a valid option ID).

Format-level scores (the output of :func:`format_scores`, and the published Tables 8-12 from
:func:`load_published_results`) have the columns
``model, dataset, option_ids, delimiter, separator, accuracy, coverage`` in percent.
"""
from __future__ import annotations

import math
import re
import warnings
from importlib import resources
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mmfragile.data import benchmarks
from mmfragile.errors import DataError

# --------------------------------------------------------------------------------------------------
# constants
# --------------------------------------------------------------------------------------------------

FACTORS: tuple[str, str, str] = ("option_ids", "delimiter", "separator")
FORMAT_COLS: list[str] = list(FACTORS)
#: Levels of each prompt-format factor (Tab. 1), in the paper's display order.
LEVELS: dict[str, list[str]] = {
    "option_ids": ["uppercase", "lowercase", "numbers", "roman"],
    "delimiter": ["dot", "colon", "bracket", "double_brackets"],
    "separator": ["line_break", "comma", "semicolon"],
}
#: Human-readable level labels for figures.
LEVEL_LABELS: dict[str, str] = {
    "uppercase": "Uppercase", "lowercase": "Lowercase", "numbers": "Numbers", "roman": "Roman",
    "dot": "Dot", "colon": "Colon", "bracket": "Bracket", "double_brackets": "Double brackets",
    "line_break": "Line break", "comma": "Comma", "semicolon": "Semicolon",
}
FACTOR_LABELS: dict[str, str] = {"option_ids": "Option IDs", "delimiter": "Option delimiter",
                                 "separator": "Option separator"}
#: Base configuration of the LMM (Sec. 5.2 / A.2).
BASE_LEVELS: dict[str, str] = {"option_ids": "lowercase", "delimiter": "bracket", "separator": "comma"}
#: Models and datasets of the paper, in its order.
MODELS: list[str] = ["Gemma-3", "LLaVA-1.5", "LLaVA-OV", "Phi-3.5", "Phi-4", "Qwen-2-VL", "Qwen-2.5-VL"]
DATASETS: list[str] = ["A-OKVQA", "HRBench-4K", "MMBench", "MME-RealWorld-Lite", "V*Bench"]
#: Each dataset's standard ("vanilla"/reference) prompt format, Tab. 5: (option_ids, delimiter, separator), from
#: the benchmark registry (:mod:`mmfragile.data.benchmarks`).
STANDARD_FORMATS: dict[str, tuple[str, str, str]] = {
    d: tuple(benchmarks.benchmark(d).standard_format.split("-")) for d in DATASETS}
#: Coverage threshold of the coverage-neutral analysis (Sec. 5.1, C.3), percent.
COVERAGE_THRESHOLD: float = 75.0
CONFIDENCE_BINS: tuple[str, str, str] = ("top 20%", "middle 60%", "bottom 20%")
METHOD_LABELS: dict[str, str] = {"pseudo_gt": "Pseudo GT", "vanilla": "Vanilla", "pia": "PIA",
                                 "pride": "PriDe", "cp_ln": "CP-LN"}

PER_QUESTION_COLS = ["model", "dataset", "question_id", "shift", "option_ids", "delimiter", "separator",
                     "correct", "covered", "selected_position"]
SCORE_COLS = ["model", "dataset", "option_ids", "delimiter", "separator", "accuracy", "coverage"]


def canonical_dataset(name: str) -> str:
    """Map a dataset spelling (``"a-okvqa"``, ``"HR-Bench-4K"``, ``"vstar"`` ...) to the paper's name (the
    benchmark registry's). Unknown names are returned unchanged.
    """
    try:
        return benchmarks.benchmark(name).name
    except KeyError:
        return str(name)


def standard_format(dataset: str) -> tuple[str, str, str]:
    """The dataset's standard prompt format (Tab. 5) as ``(option_ids, delimiter, separator)``."""
    ds = canonical_dataset(dataset)
    if ds not in STANDARD_FORMATS:
        raise KeyError(f"no standard prompt format known for dataset {dataset!r}; pass `reference=` explicitly")
    return STANDARD_FORMATS[ds]


def require_columns(df: pd.DataFrame, cols: Iterable[str], what: str) -> None:
    """Refuse, naming ``what`` and the missing columns, a frame that lacks any of ``cols``."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise DataError(f"{what}: missing column(s) {missing}; have {list(df.columns)}")


# --------------------------------------------------------------------------------------------------
# published data
# --------------------------------------------------------------------------------------------------

def _read_published(name: str) -> pd.DataFrame:
    path = resources.files("mmfragile").joinpath("resources").joinpath("published").joinpath(name)
    with path.open("r", encoding="utf-8") as fh:
        return pd.read_csv(fh)


def load_published_results() -> pd.DataFrame:
    """Tables 8-12: accuracy and coverage (%) of 7 MLLMs x 5 datasets x 48 formats (1680 rows).

    Columns ``dataset, model, option_ids, delimiter, separator, accuracy, coverage``.
    Extracted from the seed by ``scripts/extract_format_bias.py``.
    """
    df = _read_published("format_bias_results.csv")
    for c in ("dataset", "model", "option_ids", "delimiter", "separator"):
        df[c] = df[c].astype(str)
    return df


def load_published_mitigation() -> pd.DataFrame:
    """Table 7: accuracy (%) and rank per dataset x model x method.

    Columns ``dataset, model, method, accuracy, rank``; ``method`` in
    ``pseudo_gt, vanilla, pia, pride, cp_ln``; PIA and PriDe on V*Bench are NA (not applicable).
    Note two printed pseudo-GT errata (see the README): A-OKVQA/Phi-3.5 (59.27, Tables 8 give
    59.37) and HRBench-4K/LLaVA-1.5 (22.05, Table 9 gives 21.65).
    """
    df = _read_published("format_bias_mitigation.csv")
    df["rank"] = df["rank"].astype("Int64")
    return df


def load_published_mitigation_summary() -> pd.DataFrame:
    """Table 7 footer: ``dataset, method, complexity, ranking_correlation, correctly_ranked, n_models``."""
    df = _read_published("format_bias_mitigation_summary.csv")
    for c in ("complexity", "correctly_ranked", "n_models"):
        df[c] = df[c].astype("Int64")
    return df


# --------------------------------------------------------------------------------------------------
# question level -> format level
# --------------------------------------------------------------------------------------------------

def format_scores(per_question: pd.DataFrame) -> pd.DataFrame:
    """Accuracy and coverage (%) per model x dataset x prompt format (Sec. 4.1, A.3).

    Circular evaluation: every circularly shifted copy of a question counts as one question, i.e.
    a dataset of N questions with O options contributes N x O evaluations per format, and accuracy is
    ``#correct / (N x O)``. This is the reading that reproduces the published tables: Tab. 5 lists
    "QA pairs, Circ. eval." (A-OKVQA 4,580 = 1,145 x 4; MMBench 4,876; V*Bench 596), Tab. 6 counts
    the same numbers "per prompt format variant", and every accuracy in Tabs. 8-12 is an integer count
    over exactly that many questions (checked in ``scripts/extract_format_bias.py``). It is *not*
    MMBench's strict CircularEval (a question right only if all shifts are right).

    Coverage (Eq. 6) = share of outputs that are a valid option ID of the question.

    Args:
        per_question: one row per model x dataset x question_id x shift x format, with columns
            ``model, dataset, option_ids, delimiter, separator, correct, covered`` (bool).

    Returns:
        ``model, dataset, option_ids, delimiter, separator, accuracy, coverage, n_questions``.
    """
    require_columns(per_question, ["model", "dataset", *FORMAT_COLS, "correct", "covered"], "format_scores")
    pq = per_question
    correct = pq["correct"].astype(bool)
    covered = pq["covered"].astype(bool)
    if (correct & ~covered).any():
        i = int(np.flatnonzero((correct & ~covered).to_numpy())[0])
        raise DataError(f"format_scores: row {i} is correct but not covered (a correct answer is a valid option ID)")
    keys = ["model", "dataset", *FORMAT_COLS]
    g = (pd.DataFrame({**{k: pq[k] for k in keys}, "correct": correct, "covered": covered})
         .groupby(keys, sort=False, observed=True))
    out = pd.DataFrame({"accuracy": g["correct"].mean() * 100.0, "coverage": g["covered"].mean() * 100.0,
                        "n_questions": g.size()}).reset_index()
    return _sort_formats(out)


def format_accuracy_ci(per_question: pd.DataFrame, level: float = 0.95, n_boot: int = 2000,
                       seed: int = 0) -> pd.DataFrame:
    """Per-format accuracy (%) with a percentile bootstrap interval, resampling *questions* (all circular shifts of
    a drawn question go together, since they share the picture and the options; a question drawn twice counts
    twice). Same grouping and accuracy as :func:`format_scores`; the question draws are shared across the formats
    of a model x dataset, so intervals of formats compare like for like.

    Returns ``model, dataset, option_ids, delimiter, separator, accuracy, ci_low, ci_high, n_questions``
    (``n_questions`` = distinct questions)."""
    require_columns(per_question, ["model", "dataset", "question_id", *FORMAT_COLS, "correct"], "format_accuracy_ci")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    keys = ["model", "dataset", *FORMAT_COLS]
    pq = per_question.assign(correct=per_question["correct"].astype(bool))
    rng = np.random.default_rng(seed)
    lo_q, hi_q = 100 * (1 - level) / 2, 100 * (1 + level) / 2
    out = []
    for (model, dataset), g in pq.groupby(["model", "dataset"], sort=False, observed=True):
        cells = g.groupby([*FORMAT_COLS, "question_id"], sort=False, observed=True)["correct"].agg(["sum", "size"])
        hits = cells["sum"].unstack("question_id", fill_value=0)        # formats x questions
        n = cells["size"].unstack("question_id", fill_value=0)
        weights = rng.multinomial(n.shape[1], np.full(n.shape[1], 1 / n.shape[1]), size=n_boot)  # boot x questions
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = 100 * (weights @ hits.to_numpy().T) / (weights @ n.to_numpy().T)   # boot x formats
        acc = 100 * hits.sum(axis=1) / n.sum(axis=1)
        fmt = hits.index.to_frame(index=False)
        out.append(fmt.assign(model=model, dataset=dataset, accuracy=acc.to_numpy(),
                              ci_low=np.nanpercentile(boot, lo_q, axis=0), ci_high=np.nanpercentile(boot, hi_q, axis=0),
                              n_questions=(n > 0).sum(axis=1).to_numpy()))
    cols = [*keys, "accuracy", "ci_low", "ci_high", "n_questions"]
    return _sort_formats(pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols))


def _sort_formats(df: pd.DataFrame) -> pd.DataFrame:
    """Sort rows by dataset, model, then the paper's level order (unknown levels last)."""
    order = {c: {v: i for i, v in enumerate(LEVELS[c])} for c in FACTORS}
    key_cols = [c for c in ("dataset", "model", *FACTORS) if c in df.columns]

    def key(s: pd.Series) -> pd.Series:
        if s.name in order:
            return s.map(order[s.name]).fillna(len(order[s.name]))
        return s
    return df.sort_values(key_cols, key=key, kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# rankings (Fig. 3) and pseudo ground truth (Sec. 4.2, Tab. 7)
# --------------------------------------------------------------------------------------------------

def _competition_rank(values: pd.Series) -> pd.Series:
    """Rank 1 = highest value; ties share the smallest rank ("1224"), NaN stays NaN."""
    return values.rank(method="min", ascending=False).astype("Int64")


def format_ranks(scores: pd.DataFrame, metric: str = "accuracy", decimals: int | None = None) -> pd.DataFrame:
    """Rank the models within each dataset x prompt format (Fig. 3, Sec. 5.1 "Benchmark Ranking").

    Rank 1 = best ``metric``. Ties get the same, smallest rank and the next rank is skipped
    (competition ranking, pandas ``method="min"``), as in Tab. 7 where LLaVA-OV and Phi-4 both score
    65.00 on HRBench-4K (vanilla) and are both ranked 1, followed by rank 3.

    Args:
        scores: format-level scores (``model, dataset, option_ids, delimiter, separator, <metric>``).
        decimals: round ``metric`` before ranking (e.g. 3 to rank at the published precision).

    Returns:
        ``scores`` with an added ``rank`` column (nullable int).
    """
    require_columns(scores, ["model", "dataset", *FORMAT_COLS, metric], "format_ranks")
    out = scores.copy()
    vals = out[metric].round(decimals) if decimals is not None else out[metric]
    out["rank"] = (vals.groupby([out["dataset"], *(out[c] for c in FORMAT_COLS)], sort=False, observed=True)
                   .rank(method="min", ascending=False).astype("Int64"))
    return out


def rank_distribution(ranks: pd.DataFrame) -> pd.DataFrame:
    """Distribution of each model's rank over the prompt formats, per dataset (Fig. 3).

    Args:
        ranks: output of :func:`format_ranks` (or format-level scores; ranks are then computed on accuracy).

    Returns:
        long table ``dataset, model, rank, n_formats, share`` (share of the dataset's formats at which the
        model had that rank; ranks never reached are included with 0) and, per dataset x model, the
        summary columns ``median_rank, min_rank, max_rank`` repeated on each row.
    """
    if "rank" not in ranks.columns:
        ranks = format_ranks(ranks)
    r = ranks.dropna(subset=["rank"])
    n_models = r.groupby("dataset")["model"].nunique()
    rows = []
    for (ds, model), g in r.groupby(["dataset", "model"], sort=False):
        counts = g["rank"].astype(int).value_counts()
        for k in range(1, int(n_models[ds]) + 1):
            rows.append(dict(dataset=ds, model=model, rank=k, n_formats=int(counts.get(k, 0)),
                             share=float(counts.get(k, 0)) / len(g),
                             median_rank=float(g["rank"].astype(float).median()),
                             min_rank=int(g["rank"].min()), max_rank=int(g["rank"].max())))
    return pd.DataFrame(rows)


def pseudo_gt(scores: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Pseudo ground truth: mean ``metric`` over all prompt formats per model x dataset (Sec. 4.2, Tab. 7).

    The paper averages over all 48 formats ("gold standard" reference); ``n_formats`` reports how many
    formats went into each mean. ``rank`` is the competition rank within the dataset (1 = best).

    Returns:
        ``dataset, model, accuracy, rank, n_formats`` (the value column keeps the name ``metric``).
    """
    require_columns(scores, ["model", "dataset", metric], "pseudo_gt")
    g = scores.groupby(["dataset", "model"], sort=False, observed=True)[metric]
    out = pd.DataFrame({metric: g.mean(), "n_formats": g.count()}).reset_index()
    out["rank"] = out.groupby("dataset", sort=False)[metric].rank(method="min", ascending=False).astype("Int64")
    return out[["dataset", "model", metric, "rank", "n_formats"]]


def ranking_agreement(method_scores: pd.DataFrame, pseudo_gt: pd.DataFrame,
                      metric: str = "accuracy", count_ties: bool = False) -> pd.DataFrame:
    """Agreement of a (mitigation) method's model ranking with the pseudo-GT ranking (Tab. 7, Fig. 8).

    Both sides are ranked per dataset from ``metric`` with competition ranks (1 = best, ties share the
    smallest rank; this reproduces every rank printed in Tab. 7). Then, per dataset (x method):

    * ``spearman``: the Pearson correlation of the two rank vectors (Spearman's rho on competition
      ranks). This reading reproduces the printed "Ranking correlation" where ties occur
      (HRBench-4K vanilla 0.63 and PriDe 0.88; scipy's average-rank Spearman gives 0.67 and 0.90).
      V*Bench/CP-LN is printed as 0.93 but its printed ranks give 0.82 under every definition.
    * ``kendall``: Kendall's tau-b on the same ranks.
    * ``correctly_ranked``: number of models whose rank equals their pseudo-GT rank. With
      ``count_ties=False`` (default) a model that shares its rank with another model (on either side)
      does not count: its position is ambiguous. This reproduces all printed "Correctly ranked" values
      of Tab. 7, including HRBench-4K/PriDe (2/7: Qwen-2-VL ties with LLaVA-OV at rank 2).
      ``count_ties=True`` counts plain rank equality and gives 3 there, which is what the text of
      Sec. 5.4 says ("PriDe and CP-LN rank 3 models correctly"); the table and the text disagree.

    Models with a missing score on either side are dropped; a method with no scores on a dataset gets
    NaN/NA (e.g. PIA and PriDe on V*Bench).

    Args:
        method_scores: ``dataset, model, <metric>`` and optionally ``method``.
        pseudo_gt: ``dataset, model, <metric>`` (output of :func:`pseudo_gt`).

    Returns:
        ``dataset, [method,] spearman, kendall, correctly_ranked, n_models``.
    """
    from scipy import stats

    require_columns(method_scores, ["dataset", "model", metric], "ranking_agreement(method_scores)")
    require_columns(pseudo_gt, ["dataset", "model", metric], "ranking_agreement(pseudo_gt)")
    has_method = "method" in method_scores.columns
    ms = method_scores if has_method else method_scores.assign(method="_")
    gt = pseudo_gt[["dataset", "model", metric]].rename(columns={metric: "_gt"})
    rows = []
    for (ds, meth), g in ms.groupby(["dataset", "method"], sort=False):
        m = g[["dataset", "model", metric]].merge(gt, on=["dataset", "model"], how="inner")
        m = m.dropna(subset=[metric, "_gt"])
        row = dict(dataset=ds, method=meth, spearman=np.nan, kendall=np.nan, correctly_ranked=pd.NA,
                   n_models=len(m))
        if len(m) >= 2:
            r_m = _competition_rank(m[metric]).astype(float).to_numpy()
            r_g = _competition_rank(m["_gt"]).astype(float).to_numpy()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # constant input -> nan, fine
                row["spearman"] = float(np.corrcoef(r_m, r_g)[0, 1]) if r_m.std() > 0 and r_g.std() > 0 else np.nan
                row["kendall"] = float(stats.kendalltau(r_m, r_g).statistic)
            hit = r_m == r_g
            if not count_ties:
                tied = pd.Series(r_m).duplicated(keep=False).to_numpy() | pd.Series(r_g).duplicated(keep=False).to_numpy()
                hit &= ~tied
            row["correctly_ranked"] = int(hit.sum())
        elif len(m) == 1:
            row["correctly_ranked"] = 1
        rows.append(row)
    out = pd.DataFrame(rows)
    out["correctly_ranked"] = out["correctly_ranked"].astype("Int64")
    if not has_method:
        out = out.drop(columns="method")
    return out


# --------------------------------------------------------------------------------------------------
# factor-level aggregates (Fig. 4, 5, 9, 15)
# --------------------------------------------------------------------------------------------------

def _per_factor(df: pd.DataFrame, value: str, out_name: str) -> pd.DataFrame:
    parts = []
    for f in FACTORS:
        g = (df.groupby(["dataset", "model", f], sort=False, observed=True)[value]
             .agg(["mean", "count"]).reset_index()
             .rename(columns={f: "level", "mean": out_name, "count": "n_formats"}))
        g.insert(2, "factor", f)
        parts.append(g)
    out = pd.concat(parts, ignore_index=True)
    out["level_order"] = [LEVELS[f].index(l) if l in LEVELS[f] else 99 for f, l in zip(out.factor, out.level)]
    out["factor_order"] = out["factor"].map({f: i for i, f in enumerate(FACTORS)})
    return (out.sort_values(["dataset", "model", "factor_order", "level_order"], kind="stable")
            .drop(columns=["level_order", "factor_order"]).reset_index(drop=True))


def deviation_from_mean(scores: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Accuracy deviation from the model-dataset mean, averaged per factor level (Fig. 4, Sec. 5.1).

    For each model x dataset: ``dev(format) = metric(format) - mean over all formats of that
    model x dataset``; then the deviations are averaged over the formats sharing a factor level
    (with all 48 formats: 12 evaluations per option-ID / delimiter level, 16 per separator level).

    Returns:
        long table ``dataset, model, factor, level, deviation, n_formats`` (pp).
    """
    require_columns(scores, ["model", "dataset", *FORMAT_COLS, metric], "deviation_from_mean")
    df = scores.copy()
    df["_dev"] = df[metric] - df.groupby(["dataset", "model"], observed=True)[metric].transform("mean")
    return _per_factor(df, "_dev", "deviation")


def coverage_by_factor(scores: pd.DataFrame) -> pd.DataFrame:
    """Mean coverage (%) per model x dataset x factor level (Fig. 5 and Fig. 9, Sec. 5.1 / C.1).

    Averages over 12 formats per option-ID / delimiter level and 16 per separator level.

    Returns:
        long table ``dataset, model, factor, level, coverage, n_formats``.
    """
    require_columns(scores, ["model", "dataset", *FORMAT_COLS, "coverage"], "coverage_by_factor")
    return _per_factor(scores, "coverage", "coverage")


def coverage_neutral(scores: pd.DataFrame, threshold: float = COVERAGE_THRESHOLD,
                     metric: str = "accuracy") -> pd.DataFrame:
    """Coverage-neutral deviations (Fig. 15, Sec. 5.1 / C.3).

    Formats with ``coverage < threshold`` (75 %) are dropped first; the model-dataset mean is then
    recomputed over the *remaining* formats and deviations are averaged per factor level as in
    :func:`deviation_from_mean`. Recomputing the mean is the reading that reproduces the text
    ("LLaVA-OV exhibits the largest deviations ... (-21 to +8 pp)"; keeping the unfiltered mean would
    give -18 to +11 pp and make LLaVA-1.5 / Phi-3.5 deviations all positive). Factor levels whose
    formats were all filtered out are kept with ``deviation = NaN`` and ``n_formats = 0`` (the grey
    cells of Fig. 15).

    Returns:
        long table ``dataset, model, factor, level, deviation, n_formats``.
    """
    require_columns(scores, ["model", "dataset", *FORMAT_COLS, metric, "coverage"], "coverage_neutral")
    full = deviation_from_mean(scores, metric)[["dataset", "model", "factor", "level"]]
    kept = scores[scores["coverage"] >= threshold]
    dev = deviation_from_mean(kept, metric) if len(kept) else pd.DataFrame(
        columns=["dataset", "model", "factor", "level", "deviation", "n_formats"])
    out = full.merge(dev, on=["dataset", "model", "factor", "level"], how="left")
    out["n_formats"] = out["n_formats"].fillna(0).astype(int)
    out["deviation"] = out["deviation"].astype(float)
    return out


# --------------------------------------------------------------------------------------------------
# option selection patterns (Fig. 10-14, Sec. C.2)
# --------------------------------------------------------------------------------------------------

def selection_pattern(per_question: pd.DataFrame, by_factor: bool = False) -> pd.DataFrame:
    """Normalised answering frequency per option position (Eq. 11-12, Sec. C.2; Figs. 10-14).

    Per model x dataset x format: ``s_i`` = number of times displayed position ``i`` was selected,
    ``n_i`` = number of evaluated questions that have a position ``i`` (questions with fewer options
    do not count), ``f_i = s_i / n_i`` (Eq. 11) and ``frequency = f_i / sum_j f_j`` (Eq. 12) over the
    dataset's ``o`` = maximal number of options. Invalid outputs (``selected_position == -1``) are not
    selections but their questions still count in ``n_i``. If a format never yields a valid answer all
    frequencies are NaN.

    The number of options of a question is taken from an ``n_options`` column if present, otherwise it
    is inferred as the number of distinct ``shift`` values of that (dataset, question_id), which equals
    the number of options under circular evaluation.

    Args:
        per_question: per-question results (see module doc).
        by_factor: if True, average the normalised frequencies over the formats sharing a factor level
            (12 evaluations per option-ID / delimiter level, 16 per separator level), as in Figs. 10-14.

    Returns:
        per format: ``model, dataset, option_ids, delimiter, separator, position, n_selected, n_appeared,
        f, frequency``; with ``by_factor``: ``model, dataset, factor, level, position, frequency, n_formats``.
        Positions are 0-based.
    """
    require_columns(per_question, ["model", "dataset", "question_id", *FORMAT_COLS, "selected_position"],
             "selection_pattern")
    pq = per_question.copy()
    if "n_options" not in pq.columns:
        require_columns(pq, ["shift"], "selection_pattern (no n_options column)")
        pq["n_options"] = pq.groupby(["dataset", "question_id"], observed=True)["shift"].transform("nunique")
    pq["n_options"] = pq["n_options"].astype(int)
    pq["selected_position"] = pq["selected_position"].fillna(-1).astype(int)
    bad = (pq["selected_position"] >= pq["n_options"])
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(f"selection_pattern: row {i} selects position {pq['selected_position'].iloc[i]} "
                        f"but has only {pq['n_options'].iloc[i]} options")
    keys = ["model", "dataset", *FORMAT_COLS]
    o_max = pq.groupby("dataset", observed=True)["n_options"].max()
    rows = []
    for key, g in pq.groupby(keys, sort=False, observed=True):
        o = int(o_max[key[1]])
        pos = np.arange(o)
        appeared = (g["n_options"].to_numpy()[:, None] > pos[None, :]).sum(axis=0)
        sel = g["selected_position"].to_numpy()
        selected = np.bincount(sel[sel >= 0], minlength=o)[:o]
        with np.errstate(invalid="ignore", divide="ignore"):
            f = np.where(appeared > 0, selected / np.maximum(appeared, 1), np.nan)
        total = np.nansum(f)
        freq = f / total if total > 0 else np.full(o, np.nan)
        for i in range(o):
            rows.append((*key, i, int(selected[i]), int(appeared[i]), f[i], freq[i]))
    out = pd.DataFrame(rows, columns=[*keys, "position", "n_selected", "n_appeared", "f", "frequency"])
    if not by_factor:
        return out
    parts = []
    for fac in FACTORS:
        g = (out.groupby(["model", "dataset", fac, "position"], sort=False, observed=True)["frequency"]
             .agg(["mean", "count"]).reset_index()
             .rename(columns={fac: "level", "mean": "frequency", "count": "n_formats"}))
        g.insert(2, "factor", fac)
        parts.append(g)
    return pd.concat(parts, ignore_index=True)


# --------------------------------------------------------------------------------------------------
# confidence bins (Sec. 5.3, Fig. 7)
# --------------------------------------------------------------------------------------------------

def _bin_sizes(n: int, shares: Sequence[float]) -> list[int]:
    top = int(math.floor(shares[0] * n + 0.5))
    bottom = int(math.floor(shares[-1] * n + 0.5))
    return [top, n - top - bottom, bottom]


def assign_confidence_bins(per_question: pd.DataFrame, confidence_col: str,
                           reference: tuple[str, str, str] | Mapping[str, tuple[str, str, str]] | None = None,
                           shares: Sequence[float] = (0.2, 0.6, 0.2), unit: str = "item") -> pd.DataFrame:
    """Confidence bin of every question, decided under the reference prompt format (Sec. 5.3).

    Per model x dataset, the questions are ranked by ``confidence_col`` (the model's logit of the correct
    option ID) measured under the reference format, highest first, and split into
    ``top 20%`` / ``middle 60%`` / ``bottom 20%`` (bin sizes ``round(0.2 n)``, rest, ``round(0.2 n)``;
    ties broken by question_id, shift for determinism).

    ``unit="item"`` (default) bins each circularly shifted copy (question_id, shift) separately, matching
    the N x O question count of :func:`format_scores`; ``unit="question"`` bins question_ids by their
    confidence averaged over shifts. Items without a confidence under the reference format get no bin.

    Args:
        reference: ``(option_ids, delimiter, separator)``, a dict dataset -> that tuple, or None for each
            dataset's standard format (Tab. 5, see :data:`STANDARD_FORMATS`).

    Returns:
        ``model, dataset, question_id, [shift,] confidence, confidence_bin``.
    """
    require_columns(per_question, ["model", "dataset", "question_id", *FORMAT_COLS, confidence_col],
             "assign_confidence_bins")
    if unit not in ("item", "question"):
        raise ValueError("unit must be 'item' or 'question'")
    if unit == "item":
        require_columns(per_question, ["shift"], "assign_confidence_bins(unit='item')")
    item_keys = ["question_id", "shift"] if unit == "item" else ["question_id"]
    parts = []
    for (model, ds), g in per_question.groupby(["model", "dataset"], sort=False, observed=True):
        if reference is None:
            ref = standard_format(ds)
        elif isinstance(reference, Mapping):
            ref = reference[ds] if ds in reference else reference[canonical_dataset(ds)]
        else:
            ref = tuple(reference)
        mask = np.ones(len(g), dtype=bool)
        for c, v in zip(FORMAT_COLS, ref):
            mask &= (g[c] == v).to_numpy()
        r = g.loc[mask, [*item_keys, confidence_col]].dropna(subset=[confidence_col])
        if r.empty:
            raise DataError(f"assign_confidence_bins: model {model!r} on {ds!r} has no rows with a "
                            f"{confidence_col!r} under the reference format {ref}")
        conf = r.groupby(item_keys, sort=True)[confidence_col].mean().rename("confidence").reset_index()
        conf = conf.sort_values(["confidence", *item_keys], ascending=[False] + [True] * len(item_keys),
                                kind="stable").reset_index(drop=True)
        sizes = _bin_sizes(len(conf), shares)
        conf["confidence_bin"] = np.repeat(CONFIDENCE_BINS, sizes)
        conf.insert(0, "dataset", ds)
        conf.insert(0, "model", model)
        parts.append(conf)
    out = pd.concat(parts, ignore_index=True)
    out["confidence_bin"] = pd.Categorical(out["confidence_bin"], categories=list(CONFIDENCE_BINS), ordered=True)
    return out


def confidence_bins(per_question: pd.DataFrame, confidence_col: str,
                    reference: tuple[str, str, str] | Mapping[str, tuple[str, str, str]] | None = None,
                    shares: Sequence[float] = (0.2, 0.6, 0.2), unit: str = "item") -> pd.DataFrame:
    """Accuracy (%) per confidence bin per prompt format (Sec. 5.3, Fig. 7).

    Questions are binned once, by confidence under the reference format (see
    :func:`assign_confidence_bins`); the bins are then held fixed and accuracy is computed within each
    bin under every format.

    Returns:
        ``model, dataset, option_ids, delimiter, separator, confidence_bin, accuracy, n_questions``.
    """
    require_columns(per_question, ["correct"], "confidence_bins")
    bins = assign_confidence_bins(per_question, confidence_col, reference, shares, unit)
    item_keys = ["question_id", "shift"] if unit == "item" else ["question_id"]
    m = per_question.merge(bins[["model", "dataset", *item_keys, "confidence_bin"]],
                           on=["model", "dataset", *item_keys], how="inner")
    m["_c"] = m["correct"].astype(bool)
    g = m.groupby(["model", "dataset", *FORMAT_COLS, "confidence_bin"], sort=True, observed=True)["_c"]
    out = pd.DataFrame({"accuracy": g.mean() * 100.0, "n_questions": g.size()}).reset_index()
    return _sort_formats(out)  # stable: bins stay top, middle, bottom within a format


# --------------------------------------------------------------------------------------------------
# linear mixed model (Sec. 5.2, A.2, Fig. 6)
# --------------------------------------------------------------------------------------------------

def fit_lmm(scores: pd.DataFrame, metric: str = "accuracy", base_levels: Mapping[str, str] | None = None,
            alpha: float = 0.05, reml: bool = True, return_result: bool = False):
    """Linear mixed model of accuracy on the prompt-format factors (Eq. 4-5, Sec. A.2; Fig. 6).

    ``Accuracy ~ Option_IDs + Options_delimiter + Options_separator + (1 | Model:Dataset)``, fitted with
    statsmodels ``MixedLM`` (REML by default) with treatment coding against the base configuration
    lowercase / bracket / comma. Coefficients are percentage points relative to that base.
    On the published Tables 8-12 this gives numbers -9.8, uppercase +6.0, double brackets -5.9 pp
    (text of Sec. 5.2: -10, +6, -5 pp), the only effects with p < 0.05.

    With a single model-dataset group a random intercept is not identifiable; the same fixed effects are
    then fitted by OLS (``attrs["method"] == "OLS"``).

    Args:
        scores: format-level scores with ``model, dataset, option_ids, delimiter, separator, <metric>``.
        base_levels: override of :data:`BASE_LEVELS`.
        alpha: significance level for ``significant`` and the ``1 - alpha`` confidence interval.
        return_result: also return the statsmodels results object.

    Returns:
        DataFrame ``term, factor, level, coef, std_err, ci_low, ci_high, p_value, significant, direction``
        (first row the intercept; ``direction`` is ``positive``/``negative`` for significant effects and
        ``n.s.`` otherwise). ``attrs`` hold ``method``, ``converged``, ``group_var``, ``scale``, ``n_groups``,
        ``n_obs``, ``base_levels``. With ``return_result`` a tuple ``(table, result)``.
    """
    import statsmodels.formula.api as smf

    require_columns(scores, ["model", "dataset", *FORMAT_COLS, metric], "fit_lmm")
    base = dict(BASE_LEVELS if base_levels is None else base_levels)
    df = scores[["model", "dataset", *FORMAT_COLS, metric]].dropna().copy()
    df = df.rename(columns={metric: "y"})
    for c in FORMAT_COLS:
        df[c] = df[c].astype(str)
        if base[c] not in set(df[c]):
            raise ValueError(f"fit_lmm: base level {base[c]!r} of {c} not in the data (have {sorted(set(df[c]))})")
    df["group"] = df["model"].astype(str) + ":" + df["dataset"].astype(str)
    terms = [f'C({c}, Treatment("{base[c]}"))' for c in FORMAT_COLS if df[c].nunique() > 1]
    formula = "y ~ " + (" + ".join(terms) if terms else "1")
    n_groups = df["group"].nunique()
    attrs: dict = {"base_levels": base, "n_groups": int(n_groups), "n_obs": int(len(df)), "formula": formula}
    if n_groups >= 2:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = smf.mixedlm(formula, df, groups=df["group"]).fit(reml=reml)
        params, bse, pvals = res.fe_params, res.bse[res.fe_params.index], res.pvalues[res.fe_params.index]
        ci = res.conf_int(alpha=alpha).loc[res.fe_params.index]
        attrs.update(method="MixedLM (REML)" if reml else "MixedLM (ML)", converged=bool(res.converged),
                     group_var=float(res.cov_re.iloc[0, 0]), scale=float(res.scale))
    else:
        res = smf.ols(formula, df).fit()
        params, bse, pvals, ci = res.params, res.bse, res.pvalues, res.conf_int(alpha=alpha)
        attrs.update(method="OLS", converged=True, group_var=float("nan"), scale=float(res.scale))
    rows = []
    for term in params.index:
        m = re.match(r'C\((\w+), Treatment\("[^"]*"\)\)\[T\.(.+)\]', term)
        factor, level = (m.group(1), m.group(2)) if m else ("intercept", "")
        p = float(pvals[term])
        sig = bool(p < alpha)
        coef = float(params[term])
        rows.append(dict(term=term, factor=factor, level=level, coef=coef, std_err=float(bse[term]),
                         ci_low=float(ci.loc[term].iloc[0]), ci_high=float(ci.loc[term].iloc[1]),
                         p_value=p, significant=sig,
                         direction=("positive" if coef > 0 else "negative") if sig else "n.s."))
    table = pd.DataFrame(rows)
    order = {("intercept", ""): -1}
    order.update({(f, l): 10 * i + LEVELS[f].index(l) for i, f in enumerate(FACTORS) for l in LEVELS[f]})
    table = table.sort_values("term", key=lambda s: [order.get((f, l), 999) for f, l in zip(table.factor, table.level)],
                              kind="stable").reset_index(drop=True)
    table.attrs.update(attrs)
    return (table, res) if return_result else table
