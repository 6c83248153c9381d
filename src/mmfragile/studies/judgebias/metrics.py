"""Study-3 metrics: MM-JudgeBias (Lee, Park, Im; arXiv 2604.18164), pure functions on DataFrames.

Judgment table
--------------
One row per judgment of one (possibly perturbed) sample by one judge in one run:

==============  ===============================================================================
``judge``        judge name
``sample_id``    id of the unbiased sample; a perturbed variant keeps the id of its original
``perturbation`` ``"original"`` (the unbiased triplet) or a bias type of :data:`PERTURBATIONS`
``run``          run index (the paper repeats every judgment 3 times); optional, default 0
``score``        the parsed integer score in ``1..S`` or NaN when there is none
``status``       optional: ``"ok"``, ``"unparseable"`` (no score could be parsed) or ``"na"``
                 (the judge abstained in the N/A-enabled setting, Table 3); without the column a
                 NaN score means ``"unparseable"``
==============  ===============================================================================

Definitions (Sec. 3.2), with ``y`` the score of the unbiased triplet and ``ŷ`` the score of its
biased counterpart, ``S`` the maximum score (10):

* Bias-Deviation ``BD = E[(y - ŷ)_+ / (y - 1) | y > 1]`` - the share of the available headroom
  ``y - 1`` that the judge gives up under a semantically disruptive perturbation; score increases
  count as 0 (positive part), samples with ``y = 1`` cannot drop and are excluded (they are
  counted in ``n_y1``).  Higher is better (the judge notices the disruption).
* Bias-Conformity ``BC = E[1 - |y - ŷ| / max(y - 1, S - y)]`` - 1 for an unchanged score, 0 for
  the largest possible move from ``y``.  ``max(y - 1, S - y) >= (S - 1) / 2 > 0`` so BC is defined
  for every ``y`` including ``y = 1`` and ``y = S`` (denominator ``S - 1``).  Higher is better.
* BD is used for the Integrality and Congruity bias types, BC for Robustness (Table 1).
* Reliability (Table 2 ``Avg.`` column, Tables 3/4/14/16 ``Overall``): the unweighted mean of the
  nine per-type scores.  Category scores (Integrality / Congruity / Robustness, Tables 3/14/16) are
  unweighted means of the types in the category.  NB the overall score is *not* the mean of the
  three category scores: Table 14 GPT-5 mini has categories 0.223 / 0.589 / 0.916 (mean 0.576) and
  Overall 0.612 = mean of the nine types.  Every row of Tables 2, 14 and 16 reproduces within
  rounding (tests/test_judgebias.py).

Readings of points the paper leaves open (each is a keyword argument where it matters):

* Runs.  The paper runs each judgment 3 times but does not say how runs enter BD/BC.  Default
  ``pairing="run"``: run r of the perturbed triplet is paired with run r of the unbiased one and
  the expectation is over all (sample, run) pairs (pooled).  ``pairing="mean"`` averages each
  sample's valid scores over runs first (``y``/``ŷ`` may then be fractional).
* Unparseable outputs are never replaced by a default: a pair with an unparseable side is dropped
  and counted in ``n_unparseable``.  An abstention (``status == "na"``) on either side drops the
  pair and counts in ``n_abstained`` (Table 15: "These samples are excluded from evaluation").
* Inter-run variance (Table 2): the variance of a sample's score over runs (``ddof=1``), averaged
  over (sample, condition) cells; inter-sample variance: the variance of scores over samples within
  one (condition, run) cell (``ddof=1``), averaged over cells.  "Condition" is the perturbation
  (original included).  The paper gives no formula; its values (0.0-2.4 and 2.3-10.6 on a 1-10
  scale) are consistent with this reading but do not pin down ``ddof``.
* Abstention ratio (Table 15): per bias type, the share of (sample, run) pairs dropped because one
  side is N/A; category ratio = unweighted mean over its types (reproduces all printed category
  ratios); overall ratio = pooled over all pairs.  The unweighted mean of the nine type ratios
  gives 0.169 / 0.257 / 0.064 for the three judges where the paper prints 0.172 / 0.261 / 0.065,
  i.e. the printed overall weights the N/A-heavy image types more.  Pooling with the (unpublished)
  per-type counts reproduces all three when the Unnecessary-Image type has 197 pairs (App. H: "all
  197 image-text pairs") and each other type about 233 - but 1,804 samples in total would give
  about 201 per type, so the exact weighting is not resolved; pooling is the closest simple reading.
* Position bias (Sec. 4.3, App. H): consistency = share of samples whose preferred *response* is
  the same in both presentation orders.  Verbosity bias: share of judgments (both positions of the
  verbose variant, balanced) preferring the original concise response.  Self-enhancement: mean
  score a judge gives to its own responses minus the mean it gives to other generators' responses
  (pooled), on the unbiased samples by default.
"""
from __future__ import annotations

from importlib import resources
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mmfragile import bootstrap
from mmfragile.studies.judgebias.catalog import DIMENSIONS, PERTURBATION_INFO, PERTURBATION_NAMES, UNPERTURBED
from mmfragile.errors import DataError

__all__ = [
    "PERTURBATIONS", "DIMENSIONS", "DIMENSION_OF", "METRIC_OF", "BD_TYPES", "BC_TYPES", "SHORT_NAMES",
    "REFERENCE", "AGGREGATE_COLUMNS",
    "validate_judgments", "scores_from_outputs",
    "bd_terms", "bc_terms", "bias_deviation", "bias_conformity",
    "paired_scores", "bias_scores", "reliability_table", "aggregate_reliability",
    "inter_run_variance", "inter_sample_variance", "variance_table", "table2", "abstention_ratio",
    "position_consistency", "verbosity_robustness", "score_by_generator", "self_enhancement",
    "bias_deviation_intervals", "pairwise_bias_intervals",
    "load_published", "published_table2",
]

#: The nine bias types (Table 1), in the paper's column order (:mod:`mmfragile.studies.judgebias.catalog`).
PERTURBATIONS: tuple[str, ...] = PERTURBATION_NAMES
DIMENSION_OF: dict[str, str] = {p: info["dimension"] for p, info in PERTURBATION_INFO.items()}
METRIC_OF: dict[str, str] = {p: info["metric"] for p, info in PERTURBATION_INFO.items()}
BD_TYPES = tuple(p for p in PERTURBATIONS if METRIC_OF[p] == "BD")
BC_TYPES = tuple(p for p in PERTURBATIONS if METRIC_OF[p] == "BC")
#: Table-2 column headers.
SHORT_NAMES: dict[str, str] = {p: info["label"] for p, info in PERTURBATION_INFO.items()}
REFERENCE = UNPERTURBED
AGGREGATE_COLUMNS = ("integrality", "congruity", "robustness", "overall")
_STATUSES = ("ok", "unparseable", "na")


# --------------------------------------------------------------------------------------------
# Input handling
# --------------------------------------------------------------------------------------------

def validate_judgments(df: pd.DataFrame, scale: int = 10, source: str = "<judgments>") -> pd.DataFrame:
    """Check a judgment table and return a copy with ``run`` and ``status`` filled in.

    Raises :class:`~mmfragile.errors.DataError` naming ``source`` and the row for a missing column,
    an unknown status, a score outside ``1..scale`` or non-integer, an ``ok`` row without score,
    or a duplicate (judge, sample_id, perturbation, run).
    """
    need = ["judge", "sample_id", "perturbation", "score"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise DataError(f"{source}: missing column(s) {missing}; a judgment table needs {need} (+ run, status)")
    out = df.copy()
    if "run" not in out.columns:
        out["run"] = 0
    out["score"] = pd.to_numeric(out["score"], errors="coerce").astype(float)
    if "status" not in out.columns:
        out["status"] = np.where(out["score"].isna(), "unparseable", "ok")
    else:
        out["status"] = out["status"].fillna("").astype(str).str.lower()
        bad = ~out["status"].isin(_STATUSES)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DataError(f"{source}, row {i}: status {df['status'].iloc[i]!r} not in {_STATUSES}")
        out.loc[out["status"] != "ok", "score"] = np.nan
    s = out["score"].to_numpy()
    ok = out["status"].to_numpy() == "ok"
    for cond, what in (
        (ok & np.isnan(s), "status 'ok' but no score"),
        (~np.isnan(s) & ((s < 1) | (s > scale)), f"score outside 1..{scale}"),
        (~np.isnan(s) & (np.floor(s) != s), "non-integer score"),
    ):
        if cond.any():
            i = int(np.flatnonzero(cond)[0])
            raise DataError(f"{source}, row {i} (judge={out['judge'].iloc[i]!r}, sample_id="
                            f"{out['sample_id'].iloc[i]!r}): {what} ({df['score'].iloc[i]!r})")
    key = ["judge", "sample_id", "perturbation", "run"]
    dup = out.duplicated(key, keep=False)
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise DataError(f"{source}, row {i}: duplicate judgment for {dict(out[key].iloc[i])}")
    return out


def scores_from_outputs(df: pd.DataFrame, column: str = "output", *, allow_na: bool = False,
                        scale: int = 10) -> pd.DataFrame:
    """Parse raw judge outputs (``column``) into ``score``/``status``/``parse_error`` columns.

    Uses :func:`mmfragile.studies.judgebias.prompts.parse_score` (or ``parse_score_or_na`` when ``allow_na``);
    failures become ``status="unparseable"`` with the reason kept in ``parse_error`` - counted,
    never defaulted.
    """
    from mmfragile.studies.judgebias.prompts import ScoreParseError, parse_score, parse_score_or_na

    scores, status, errors = [], [], []
    for text in df[column]:
        try:
            v = parse_score_or_na(text, scale) if allow_na else parse_score(text, scale)
        except ScoreParseError as e:
            scores.append(np.nan)
            status.append("unparseable")
            errors.append(e.reason)
            continue
        scores.append(np.nan if v is None else float(v))
        status.append("na" if v is None else "ok")
        errors.append("")
    out = df.copy()
    out["score"], out["status"], out["parse_error"] = scores, status, errors
    return out


# --------------------------------------------------------------------------------------------
# BD / BC (Sec. 3.2)
# --------------------------------------------------------------------------------------------

def bd_terms(y, y_hat) -> np.ndarray:
    """Per-pair Bias-Deviation terms ``(y - ŷ)_+ / (y - 1)``; NaN where ``y <= 1`` or a side is NaN."""
    y = np.asarray(y, dtype=float)
    y_hat = np.asarray(y_hat, dtype=float)
    out = np.full(np.broadcast(y, y_hat).shape, np.nan)
    ok = (y > 1) & ~np.isnan(y_hat)
    with np.errstate(invalid="ignore", divide="ignore"):
        val = np.clip(y - y_hat, 0, None) / (y - 1)
    out[ok] = val[ok]
    return out


def bc_terms(y, y_hat, scale: int = 10) -> np.ndarray:
    """Per-pair Bias-Conformity terms ``1 - |y - ŷ| / max(y - 1, S - y)``; NaN where a side is NaN."""
    if scale < 2:
        raise ValueError(f"scale must be >= 2, got {scale}")
    y = np.asarray(y, dtype=float)
    y_hat = np.asarray(y_hat, dtype=float)
    return 1.0 - np.abs(y - y_hat) / np.maximum(y - 1, scale - y)


def bias_deviation(y, y_hat) -> float:
    """BD (Sec. 3.2, first equation): mean of :func:`bd_terms` over pairs with ``y > 1``; NaN if none."""
    t = bd_terms(y, y_hat)
    return float(np.nanmean(t)) if np.any(~np.isnan(t)) else float("nan")


def bias_conformity(y, y_hat, scale: int = 10) -> float:
    """BC (Sec. 3.2, second equation): mean of :func:`bc_terms` over valid pairs; NaN if none."""
    t = bc_terms(y, y_hat, scale)
    return float(np.nanmean(t)) if np.any(~np.isnan(t)) else float("nan")


def _pair_status(a: pd.Series, b: pd.Series) -> np.ndarray:
    a, b = a.to_numpy(), b.to_numpy()
    return np.where((a == "na") | (b == "na"), "na",
                    np.where((a == "ok") & (b == "ok"), "ok", "unparseable"))


def paired_scores(df: pd.DataFrame, perturbation: str | Sequence[str] | None = None, *,
                  reference: str = REFERENCE, pairing: str = "run", scale: int = 10) -> pd.DataFrame:
    """Pair every perturbed judgment with the unbiased judgment of the same judge and sample.

    Returns ``judge, perturbation, sample_id, run, y, y_hat, status`` (``status`` of the pair:
    ``ok`` / ``unparseable`` / ``na`` / ``no_reference``).  ``pairing="run"`` joins on run,
    ``pairing="mean"`` first averages valid scores over runs (``run`` is then -1; a sample with no
    valid score in any run keeps the most severe status: ``na`` before ``unparseable``).
    ``reference`` can be another condition (Table 13 [C] uses "text + blank image" as reference).
    """
    if pairing not in ("run", "mean"):
        raise ValueError(f"pairing must be 'run' or 'mean', got {pairing!r}")
    j = validate_judgments(df, scale)
    if isinstance(perturbation, str):
        perturbation = [perturbation]
    ref = j[j["perturbation"] == reference]
    if ref.empty:
        raise DataError(f"no judgments of the reference condition {reference!r} (perturbations present: "
                        f"{sorted(j['perturbation'].unique())})")
    pert = j[j["perturbation"] != reference]
    if perturbation is not None:
        unknown = set(perturbation) - set(pert["perturbation"])
        if unknown:
            raise DataError(f"no judgments for perturbation(s) {sorted(unknown)}")
        pert = pert[pert["perturbation"].isin(perturbation)]
    if pairing == "mean":
        ref, pert = _mean_over_runs(ref), _mean_over_runs(pert)
    keys = ["judge", "sample_id", "run"]
    r = ref[keys + ["score", "status"]].rename(columns={"score": "y", "status": "status_ref"})
    m = pert.rename(columns={"score": "y_hat"}).merge(r, on=keys, how="left")
    status = _pair_status(m["status_ref"].fillna("missing"), m["status"])
    status = np.where(m["status_ref"].isna(), "no_reference", status)
    out = m[["judge", "perturbation", "sample_id", "run", "y", "y_hat"]].copy()
    out["status"] = status
    out.loc[out["status"] != "ok", ["y", "y_hat"]] = np.nan
    return out.reset_index(drop=True)


def _mean_over_runs(j: pd.DataFrame) -> pd.DataFrame:
    def agg(g: pd.DataFrame) -> pd.Series:
        ok = g["status"] == "ok"
        if ok.any():
            return pd.Series({"score": g.loc[ok, "score"].mean(), "status": "ok"})
        return pd.Series({"score": np.nan, "status": "na" if (g["status"] == "na").any() else "unparseable"})

    out = j.groupby(["judge", "perturbation", "sample_id"], sort=False)[["score", "status"]].apply(agg).reset_index()
    out["run"] = -1
    return out


def bias_scores(df: pd.DataFrame, *, scale: int = 10, reference: str = REFERENCE, pairing: str = "run",
                perturbations: Iterable[str] | None = None, metric: Mapping[str, str] | None = None) -> pd.DataFrame:
    """BD or BC per (judge, perturbation), long format - the cells of Table 2.

    Columns: ``judge, perturbation, dimension, metric, value, n_pairs`` (pairs entering the mean),
    ``n_total`` (perturbed judgments), ``n_y1`` (BD only: valid pairs excluded because ``y = 1``),
    ``n_unparseable``, ``n_abstained``, ``n_no_reference``, ``abstain_ratio``.  The metric of a
    perturbation comes from :data:`METRIC_OF` (``metric`` overrides/extends it, e.g. for custom
    perturbations such as Table 13's ``blank_image``: ``{"blank_image": "BC"}``).
    """
    pairs = paired_scores(df, list(perturbations) if perturbations is not None else None,
                          reference=reference, pairing=pairing, scale=scale)
    metric_of = {**METRIC_OF, **(metric or {})}
    rows = []
    for (judge, pert), g in pairs.groupby(["judge", "perturbation"], sort=False):
        if pert not in metric_of:
            raise DataError(f"perturbation {pert!r} has no metric; pass metric={{{pert!r}: 'BD' or 'BC'}}")
        met = metric_of[pert]
        ok = g[g["status"] == "ok"]
        if met == "BD":
            terms = bd_terms(ok["y"], ok["y_hat"])
            n_y1 = int((ok["y"] <= 1).sum())
        else:
            terms = bc_terms(ok["y"], ok["y_hat"], scale)
            n_y1 = 0
        n_pairs = int(np.sum(~np.isnan(terms)))
        n_na = int((g["status"] == "na").sum())
        rows.append(dict(
            judge=judge, perturbation=pert, dimension=DIMENSION_OF.get(pert, ""), metric=met,
            value=float(np.nanmean(terms)) if n_pairs else float("nan"),
            n_pairs=n_pairs, n_total=len(g), n_y1=n_y1,
            n_unparseable=int((g["status"] == "unparseable").sum()), n_abstained=n_na,
            n_no_reference=int((g["status"] == "no_reference").sum()),
            abstain_ratio=n_na / len(g),
        ))
    if not rows:  # e.g. one shard holding unbiased judgments only: nothing to compare yet
        return pd.DataFrame(columns=["judge", "perturbation", "dimension", "metric", "value", "n_pairs", "n_total",
                                     "n_y1", "n_unparseable", "n_abstained", "n_no_reference", "abstain_ratio"])
    out = pd.DataFrame(rows)
    order = {p: i for i, p in enumerate(PERTURBATIONS)}
    out["_o"] = out["perturbation"].map(lambda p: order.get(p, len(order)))
    return out.sort_values(["judge", "_o"], kind="stable").drop(columns="_o").reset_index(drop=True)


def aggregate_reliability(values: Mapping[str, float] | pd.Series) -> pd.Series:
    """Category scores and reliability (Table 2 ``Avg.``; Tables 3/14/16 Integrality ... Overall).

    ``integrality``/``congruity``/``robustness`` = unweighted mean of the present bias types of the
    category (NaN when none); ``overall`` = unweighted mean of all present bias types (the paper's
    nine).  NaN type scores are skipped.
    """
    v = pd.Series(values, dtype=float)
    v = v[[p for p in PERTURBATIONS if p in v.index]].dropna()
    out = {d: float(v[[p for p in v.index if DIMENSION_OF[p] == d]].mean()) if any(DIMENSION_OF[p] == d for p in v.index)
           else float("nan") for d in DIMENSIONS}
    out["overall"] = float(v.mean()) if len(v) else float("nan")
    return pd.Series(out)


def reliability_table(scores: pd.DataFrame, *, index: str = "judge") -> pd.DataFrame:
    """Wide Table-2 scores: one row per judge, the bias types in paper order, then
    ``integrality, congruity, robustness, overall`` (see :func:`aggregate_reliability`)."""
    wide = scores.pivot_table(index=index, columns="perturbation", values="value", aggfunc="first", sort=False)
    cols = [p for p in PERTURBATIONS if p in wide.columns] + [c for c in wide.columns if c not in PERTURBATIONS]
    wide = wide[cols]
    agg = wide.apply(aggregate_reliability, axis=1)
    out = pd.concat([wide, agg], axis=1)
    out.columns.name = None
    return out


# --------------------------------------------------------------------------------------------
# Variance (Table 2, supporting columns)
# --------------------------------------------------------------------------------------------

def inter_run_variance(df: pd.DataFrame, *, ddof: int = 1, perturbations: Iterable[str] | None = None,
                       scale: int = 10) -> pd.Series:
    """Per judge: mean over (perturbation, sample) of the variance of the valid scores over runs.

    Cells with fewer than ``ddof + 1`` valid runs are skipped; NaN when no cell qualifies.
    ``perturbations`` restricts the conditions (default all, original included)."""
    j = _valid(df, perturbations, scale)
    v = j.groupby(["judge", "perturbation", "sample_id"])["score"].agg(lambda s: s.var(ddof=ddof) if len(s) > ddof else np.nan)
    return v.groupby(level="judge").mean().rename("inter_run_variance")


def inter_sample_variance(df: pd.DataFrame, *, ddof: int = 1, perturbations: Iterable[str] | None = None,
                          scale: int = 10) -> pd.Series:
    """Per judge: mean over (perturbation, run) of the variance of the valid scores over samples
    (low = near-constant scoring, which would trivially give BC = 1; Table 2 caption)."""
    j = _valid(df, perturbations, scale)
    v = j.groupby(["judge", "perturbation", "run"])["score"].agg(lambda s: s.var(ddof=ddof) if len(s) > ddof else np.nan)
    return v.groupby(level="judge").mean().rename("inter_sample_variance")


def _valid(df: pd.DataFrame, perturbations, scale) -> pd.DataFrame:
    j = validate_judgments(df, scale)
    if perturbations is not None:
        j = j[j["perturbation"].isin(list(perturbations))]
    return j[j["status"] == "ok"]


def variance_table(df: pd.DataFrame, *, ddof: int = 1, scale: int = 10) -> pd.DataFrame:
    """``inter_run_variance`` and ``inter_sample_variance`` per judge."""
    return pd.concat([inter_run_variance(df, ddof=ddof, scale=scale),
                      inter_sample_variance(df, ddof=ddof, scale=scale)], axis=1)


def table2(df: pd.DataFrame, *, scale: int = 10, pairing: str = "run", ddof: int = 1) -> pd.DataFrame:
    """Table 2 from a judgment table: per-type BD/BC, category scores, ``overall`` (reliability)
    and the two variance columns, one row per judge."""
    rel = reliability_table(bias_scores(df, scale=scale, pairing=pairing))
    return rel.join(variance_table(df, ddof=ddof, scale=scale))


def abstention_ratio(df: pd.DataFrame, *, reference: str = REFERENCE, scale: int = 10,
                     pairing: str = "run") -> pd.DataFrame:
    """Table 15: share of pairs excluded for N/A, per judge and bias type, plus
    ``integrality, congruity, robustness`` (unweighted means of type ratios) and ``overall``
    (pooled over all pairs of the judge) - see the module docstring for why."""
    pairs = paired_scores(df, reference=reference, pairing=pairing, scale=scale)
    pairs = pairs[pairs["status"] != "no_reference"]
    pairs = pairs.assign(na=pairs["status"] == "na")
    wide = pairs.pivot_table(index="judge", columns="perturbation", values="na", aggfunc="mean", sort=False)
    wide = wide[[p for p in PERTURBATIONS if p in wide.columns] + [c for c in wide.columns if c not in PERTURBATIONS]]
    for d in DIMENSIONS:
        cols = [p for p in wide.columns if DIMENSION_OF.get(p) == d]
        wide[d] = wide[cols].mean(axis=1) if cols else np.nan
    wide["overall"] = pairs.groupby("judge")["na"].mean()
    wide.columns.name = None
    return wide


# --------------------------------------------------------------------------------------------
# Existing judge biases (Sec. 4.3, App. H)
# --------------------------------------------------------------------------------------------

def _choices(df: pd.DataFrame, source: str) -> pd.Series:
    c = df["choice"].astype("object")
    bad = c.notna() & ~c.isin(["A", "B"])
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(f"{source}, row {i}: choice must be 'A', 'B' or NaN (unparseable), got {c.iloc[i]!r}")
    return c


def position_consistency(df: pd.DataFrame) -> pd.DataFrame:
    """Position-bias robustness: the swap-and-check test of App. H.

    Input: ``judge, sample_id, swapped, choice`` (+ optional ``run``): each sample judged twice,
    ``swapped=False`` with the responses in their original order (R1 as A, R2 as B) and
    ``swapped=True`` reversed; ``choice`` is ``"A"``/``"B"`` or NaN if unparseable.
    A sample is consistent when both orders prefer the same underlying response, i.e. the two
    *letters differ*.  Output per judge: ``n_pairs`` (both judgments parsed), ``n_consistent``,
    ``consistency`` (the robustness score of Fig. 3), ``first_position_rate`` (share of parsed
    judgments choosing A - 0.5 is unbiased), ``n_unparseable`` (judgments).
    """
    need = {"judge", "sample_id", "swapped", "choice"}
    if need - set(df.columns):
        raise DataError(f"position table: missing column(s) {sorted(need - set(df.columns))}")
    d = df.copy()
    d["choice"] = _choices(d, "position table")
    d["swapped"] = d["swapped"].astype(bool)
    keys = ["judge", "sample_id"] + (["run"] if "run" in d.columns else [])
    dup = d.duplicated(keys + ["swapped"], keep=False)
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise DataError(f"position table, row {i}: duplicate judgment for {dict(d[keys + ['swapped']].iloc[i])}")
    w = d.groupby(keys + ["swapped"])["choice"].first().unstack("swapped").reindex(columns=[False, True])
    both = w[False].notna() & w[True].notna()
    w = w.assign(both=both, consistent=both & (w[False] != w[True]))
    rows = []
    for judge, g in w.groupby(level="judge"):
        parsed = d[(d["judge"] == judge)]["choice"].dropna()
        n = int(g["both"].sum())
        rows.append(dict(judge=judge, n_pairs=n, n_consistent=int(g["consistent"].sum()),
                         consistency=g["consistent"].sum() / n if n else np.nan,
                         first_position_rate=float((parsed == "A").mean()) if len(parsed) else np.nan,
                         n_unparseable=int(d[d["judge"] == judge]["choice"].isna().sum())))
    return pd.DataFrame(rows).set_index("judge")


def verbosity_robustness(df: pd.DataFrame) -> pd.DataFrame:
    """Verbosity-bias robustness (App. H): share of judgments preferring the original concise
    response over its verbose, semantically equivalent variant, with the verbose one shown in both
    positions (balanced, to disentangle position bias).

    Input: ``judge, sample_id, verbose_position`` (``"A"``/``"B"``), ``choice`` (``"A"``/``"B"``/NaN).
    Output per judge: ``n`` (parsed judgments), ``robustness`` (= prefer-original rate),
    ``robustness_verbose_first`` / ``robustness_verbose_second`` (by position of the verbose
    response), ``both_orders_original`` (share of samples preferring the original in both orders),
    ``n_unparseable``.
    """
    need = {"judge", "sample_id", "verbose_position", "choice"}
    if need - set(df.columns):
        raise DataError(f"verbosity table: missing column(s) {sorted(need - set(df.columns))}")
    d = df.copy()
    d["choice"] = _choices(d, "verbosity table")
    if not d["verbose_position"].isin(["A", "B"]).all():
        raise DataError("verbosity table: verbose_position must be 'A' or 'B'")
    d["orig"] = np.where(d["choice"].isna(), np.nan, (d["choice"] != d["verbose_position"]).astype(float))
    rows = []
    for judge, g in d.groupby("judge", sort=False):
        p = g.dropna(subset=["orig"])
        per_sample = p.groupby("sample_id")["orig"].agg(["size", "min"])
        full = per_sample[per_sample["size"] >= 2]
        rows.append(dict(
            judge=judge, n=len(p), robustness=p["orig"].mean() if len(p) else np.nan,
            robustness_verbose_first=p.loc[p["verbose_position"] == "A", "orig"].mean(),
            robustness_verbose_second=p.loc[p["verbose_position"] == "B", "orig"].mean(),
            both_orders_original=float((full["min"] == 1).mean()) if len(full) else np.nan,
            n_unparseable=int(g["orig"].isna().sum()),
        ))
    return pd.DataFrame(rows).set_index("judge")


def _self_flags(d: pd.DataFrame, judge_to_generator: Mapping[str, str] | None) -> pd.Series:
    m = dict(judge_to_generator or {})
    return d["generator"] == d["judge"].map(lambda j: m.get(j, j))


def score_by_generator(df: pd.DataFrame, judge_to_generator: Mapping[str, str] | None = None, *,
                       perturbation: str | None = REFERENCE) -> pd.DataFrame:
    """Mean score per (judge, generator) (Fig. 4), long: ``judge, generator, is_self, mean_score, n``.

    Input: a judgment table with a ``generator`` column (the model that wrote the response).
    ``judge_to_generator`` maps a judge name to its generator name where they differ (e.g.
    ``{"GPT-5 mini (high)": "GPT-5 mini"}``); ``perturbation`` filters the condition (None = all).
    """
    if "generator" not in df.columns:
        raise DataError("self-enhancement: the judgment table needs a 'generator' column")
    d = df
    if perturbation is not None and "perturbation" in d.columns:
        d = d[d["perturbation"] == perturbation]
    d = d[pd.to_numeric(d["score"], errors="coerce").notna()].copy()
    if "status" in d.columns:
        d = d[d["status"].fillna("ok") == "ok"]
    d["is_self"] = _self_flags(d, judge_to_generator)
    out = (d.groupby(["judge", "generator", "is_self"], sort=False)["score"]
           .agg(mean_score="mean", n="size").reset_index())
    return out


def self_enhancement(df: pd.DataFrame, judge_to_generator: Mapping[str, str] | None = None, *,
                     perturbation: str | None = REFERENCE) -> pd.DataFrame:
    """Self-enhancement bias (Sec. 4.3): per judge that is also a generator, ``self_score`` (mean
    score of its own responses), ``other_score`` (mean over all other generators' responses,
    pooled), ``delta = self_score - other_score`` (> 0: favours itself), ``n_self``, ``n_other``."""
    g = score_by_generator(df, judge_to_generator, perturbation=perturbation)
    rows = []
    for judge, x in g.groupby("judge", sort=False):
        s, o = x[x["is_self"]], x[~x["is_self"]]
        if s.empty:
            continue
        ss = float(np.average(s["mean_score"], weights=s["n"]))
        os_ = float(np.average(o["mean_score"], weights=o["n"])) if len(o) else np.nan
        rows.append(dict(judge=judge, self_score=ss, other_score=os_, delta=ss - os_,
                         n_self=int(s["n"].sum()), n_other=int(o["n"].sum())))
    return pd.DataFrame(rows, columns=["judge", "self_score", "other_score", "delta", "n_self", "n_other"]).set_index("judge")


# --------------------------------------------------------------------------------------------
# Intervals over samples (the planted-fragility checks of the model zoo's judges)
# --------------------------------------------------------------------------------------------

def bias_deviation_intervals(df: pd.DataFrame, perturbations: Iterable[str] | None = None, *, scale: int = 10,
                             n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """BD per (judge, perturbation) with a percentile bootstrap interval over *samples* (every run of a drawn
    sample goes with it), next to what sampling alone gives, so that "above zero" means "above noise":

    * ``bd`` - Sec. 3.2's BD, pairing run by run (:func:`paired_scores`);
    * ``floor`` - the run-to-run BD: the same terms with the unbiased judgment of the *next* run (cyclically) as
      ``ŷ`` - a judge whose perturbed scores are drawn like its repeated unbiased ones gets ``bd`` = ``floor`` in
      expectation (0 with one run, or greedy decoding: a repeat is identical);
    * ``excess`` = ``bd - floor`` (paired: the same bootstrap draws);
    * ``score_drop`` - the mean signed score change ``y - ŷ`` (0 in expectation for a judge the perturbation does
      not reach).

    Columns: ``judge, perturbation, bd, bd_low, bd_high, floor, floor_low, floor_high, excess, excess_low,
    excess_high, score_drop, score_drop_low, score_drop_high, n_samples, n_pairs, runs``. ``perturbations``: default the BD types
    present."""
    j = validate_judgments(df, scale)
    ok = j[(j["perturbation"] == REFERENCE) & (j["status"] == "ok")]
    runs = sorted(j["run"].unique())
    nxt = {r: runs[(i + 1) % len(runs)] for i, r in enumerate(runs)}
    repeat = ok.set_index(["judge", "sample_id", "run"])["score"]
    present = [p for p in BD_TYPES if p in set(j["perturbation"])]
    rows = []
    for pert in (present if perturbations is None else list(perturbations)):
        pairs = paired_scores(j, pert, scale=scale)
        for judge, g in pairs[pairs["status"] == "ok"].groupby("judge", sort=False):
            again = repeat.reindex(list(zip(g["judge"], g["sample_id"], g["run"].map(nxt)))).to_numpy()
            terms = g.assign(bd=bd_terms(g["y"], g["y_hat"]), score_drop=g["y"] - g["y_hat"],
                             floor=bd_terms(g["y"], again) if len(runs) > 1 else np.where(g["y"] > 1, 0.0, np.nan))
            sums = {c: bootstrap.unit_sums(terms, "sample_id", c) for c in ("bd", "floor", "score_drop")}
            w = bootstrap.unit_weights(len(sums["bd"]), n_boot, seed)
            draws = {c: bootstrap.ratio_draws(w, s["sum"], s["n"]) for c, s in sums.items()}
            draws["excess"] = draws["bd"] - draws["floor"]
            point = {c: float(s["sum"].sum() / s["n"].sum()) if s["n"].sum() else np.nan for c, s in sums.items()}
            point["excess"] = point["bd"] - point["floor"]
            row = dict(judge=judge, perturbation=pert)
            for c in ("bd", "floor", "excess", "score_drop"):
                lo, hi = bootstrap.interval(draws[c], level)
                row.update({c: point[c], f"{c}_low": lo, f"{c}_high": hi})
            rows.append(dict(row, n_samples=len(sums["bd"]), n_pairs=int(sums["bd"]["n"].sum()), runs=len(runs)))
    return pd.DataFrame(rows)


def _sample_of(sample_id: pd.Series) -> pd.Series:
    """The sample a pairwise row belongs to: its id without the ``|run<r>`` suffix of :func:`verbosity_table`."""
    return sample_id.astype(str).str.replace(r"\|run\d+$", "", regex=True)


def pairwise_bias_intervals(position: pd.DataFrame | None = None, verbosity: pd.DataFrame | None = None, *,
                            n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Position and verbosity bias per judge with percentile bootstrap intervals over samples (all runs and both
    orders of a drawn sample go together), long: ``judge, measure, value, ci_low, ci_high, n_samples``.

    Measures: ``first_position_rate`` (share of parsed position judgments choosing A; 0.5 = no position bias),
    ``position_consistency`` (share of (sample, run) with a parsed verdict in both orders that prefer the same
    response, as :func:`position_consistency`), ``verbose_preference`` (share of parsed verbosity judgments
    choosing the verbose response, = 1 - :func:`verbosity_robustness`'s robustness; 0.5 = no verbosity bias).
    Inputs: :func:`~mmfragile.studies.judgebias.analysis.position_table` / ``verbosity_table`` rows."""
    parts = []
    if position is not None and len(position):
        d = position.assign(sample=_sample_of(position["sample_id"]),
                            first=np.where(position["choice"].isna(), np.nan, position["choice"].eq("A")))
        keys = ["judge", "sample", "run"] if "run" in d.columns else ["judge", "sample"]
        both = d.pivot_table(index=keys, columns="swapped", values="first", aggfunc="first")
        both = both.reindex(columns=[False, True]).dropna()
        cons = (both[False] != both[True]).astype(float).rename("consistent").reset_index()
        parts += [("first_position_rate", d, "first"), ("position_consistency", cons, "consistent")]
    if verbosity is not None and len(verbosity):
        d = verbosity.assign(sample=_sample_of(verbosity["sample_id"]),
                             verbose=np.where(verbosity["choice"].isna(), np.nan,
                                              verbosity["choice"].eq(verbosity["verbose_position"])))
        parts.append(("verbose_preference", d, "verbose"))
    rows = []
    for measure, frame, col in parts:
        for judge, g in frame.groupby("judge", sort=False):
            s = bootstrap.unit_sums(g, "sample", col)
            if not s["n"].sum():
                continue
            lo, hi = bootstrap.interval(bootstrap.ratio_draws(bootstrap.unit_weights(len(s), n_boot, seed),
                                                              s["sum"], s["n"]), level)
            rows.append(dict(judge=judge, measure=measure, value=float(s["sum"].sum() / s["n"].sum()), ci_low=lo,
                             ci_high=hi, n_samples=int((s["n"] > 0).sum())))
    return pd.DataFrame(rows, columns=["judge", "measure", "value", "ci_low", "ci_high", "n_samples"])


# --------------------------------------------------------------------------------------------
# Published numbers
# --------------------------------------------------------------------------------------------

_PUBLISHED = ("table2", "prompt_settings", "abstention_ratio", "summary", "unnecessary_image_ablation")


def load_published(name: str) -> pd.DataFrame:
    """A published MM-JudgeBias table (``resources/published/judgebias_<name>.csv``, written by
    ``scripts/extract_judgebias.py``); ``name`` in ``table2, prompt_settings, abstention_ratio,
    summary, unnecessary_image_ablation``."""
    if name not in _PUBLISHED:
        raise ValueError(f"unknown published table {name!r}; choose one of {_PUBLISHED}")
    path = resources.files("mmfragile") / "resources" / "published" / f"judgebias_{name}.csv"
    with resources.as_file(path) as p:
        return pd.read_csv(p)


def published_table2(include_mean: bool = False) -> pd.DataFrame:
    """Table 2 in wide form: index ``judge_label``, columns ``category, think``, the nine bias types,
    ``overall``, ``inter_run_variance``, ``inter_sample_variance`` (paper row order)."""
    t = load_published("table2")
    if not include_mean:
        t = t[t["judge"] != "Avg."]
    wide = t.pivot_table(index="judge_label", columns="column", values="value", aggfunc="first", sort=False)
    meta = t.drop_duplicates("judge_label").set_index("judge_label")[["category", "think"]]
    cols = list(PERTURBATIONS) + ["overall", "inter_run_variance", "inter_sample_variance"]
    out = meta.join(wide[cols])
    out.columns.name = None
    return out
