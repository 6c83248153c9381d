"""Validation of the budgeted estimates (:mod:`mmfragile.budget.estimator`) against ground truth.

* :func:`error_curves` - on a *complete* per-question grid (every cell observed): hide all but a budget of
  cells (stratified or adaptive design, several seeds), estimate, and compare with the full grid: absolute
  error of the mean and of every quantile, interval coverage, best / worst variant (hit and regret) and the
  model ranking per variant (Kendall tau, scipy), for the model-based estimate and PromptEval's "avg" baseline
  (per-variant mean of the observed cells).
* :func:`simulate_grid` (each study's grid ``simulate``: ``simulate_published`` of its ``budget`` module) -
  complete grids for the published
  per-variant tables, which publish no per-question outcomes. **What is simulated:** the per-question outcomes.
  A logistic latent-threshold IRT model: item ``i`` of model ``m`` has ability-adjusted difficulty
  ``b_mi = tau * (rho * z_i + sqrt(1 - rho^2) * e_mi)`` (``z``, ``e`` standard normal: items are harder or
  easier for every model alike, with correlation ``rho^2`` between models), and cell (item, variant) is correct
  iff ``b_mi + eps > c_mv`` with ``eps`` standard logistic; the threshold ``c_mv`` is set so that *exactly*
  ``round(accuracy x n_items)`` cells of the variant are correct, i.e. every simulated per-variant accuracy
  equals the published one (to 1/n_items). Not simulated: coverage, option-position effects, circular shifts
  (each of the ``N x O`` circular items of a format-bias dataset is one exchangeable item) and any
  item x variant interaction beyond the logistic noise. ``n_items`` defaults to the paper's item count
  (Tab. 5 circular QA pairs; Promptception Sec. 2.3) and can be lowered for speed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy import stats as sps

from mmfragile.errors import DataError

from mmfragile.budget.auto import AUTO_STATISTICS, auto_stop
from mmfragile.budget.estimator import (STATISTICS, GridSpec, adaptive_batch, budget_size, estimate,
                     stratified_order, summarize_units, unit_accuracy)

if TYPE_CHECKING:   # the studies' budget modules import this one and study; imported where used (load_embedded_grid)
    from mmfragile.study import CommittedGrid

__all__ = ["ValidationReport", "validation_report", "load_embedded_grid", "committed_cells", "complete_grid", "truth",
           "hide", "observed_only", "design_mask", "error_curves", "summarize_curves", "auto_stop_curves",
           "simulate_grid", "simulation_spec", "PROMPTEVAL_METHODS", "prompteval_estimate", "distribution_errors",
           "PROMPTEVAL_REPORTED"]

#: What PromptEval (Maia Polo et al. 2024) reports, for the side-by-side in notebook 35 / 42. Only statements
#: and set-ups are recorded here; their per-budget errors are published as figures (Figs. 1, 3), not tables.
PROMPTEVAL_REPORTED = pd.DataFrame([
    {"benchmark": "MMLU", "templates": 100, "llms": 15, "budget": "x1-x4 one-template evaluations (1-4 % of the grid)",
     "statement": "accurately estimates performance quantiles across 100 prompt templates with a budget "
                  "equivalent to two single-prompt evaluations (abstract; Fig. 1)"},
    {"benchmark": "BBH / LMentry", "templates": None, "llms": None, "budget": "200, 400, 800, 1600 cells per task x LLM",
     "statement": "quantile (5/25/50/75/95 %) absolute error and Wasserstein-1 distance fall with the budget; "
                  "PromptEval variants beat the per-template average ('avg') at every budget (Fig. 3; "
                  "code: prompteval/dist_evaluation.py, rounds_eval = [200, 400, 800, 1600])"},
])


def load_embedded_grid(study: str) -> pd.DataFrame:
    """The committed complete grid of ``study`` (its budget stage's :class:`~mmfragile.study.CommittedGrid`) as a
    cell frame: study 1's is SmolLM2-135M + a random vision tower (``smollm2-vlm``) on easy-VQA, every one of the
    48 formats x every circular shift; study 2's the zoo's prompt follower on easy-VQA, every prompt (see
    ``resources/budget/README.md``, which says how each was made)."""
    from importlib import resources

    from mmfragile.study import budget_stage

    committed = budget_stage(study).budget.embedded
    if committed is None:
        raise DataError(f"no committed {study} grid: pass 'published' or a results folder")
    with resources.as_file(resources.files("mmfragile") / "resources" / "budget" / committed.file) as p:
        return committed_cells(committed, pd.read_parquet(p))


def committed_cells(committed: CommittedGrid, df: pd.DataFrame) -> pd.DataFrame:
    """A committed grid file's frame ``df`` (``committed.columns``) -> the stage's cell frame: the question key and
    a float ``correct`` as every stage has them, then the study's own derived columns (``committed.expand``)."""
    df = df.astype({c: str for c in ("model", "dataset", "question_id")})
    return committed.expand(df.assign(question=df["dataset"] + "/" + df["question_id"],
                                      correct=df["correct"].astype(float)))


def complete_grid(source: str, study: str, datasets: Sequence[str] | None = None,
                  max_items: int | None = None, seed: int = 0, **sim_kw) -> tuple[pd.DataFrame, GridSpec, str]:
    """A complete grid of ``study`` (its :class:`~mmfragile.study.BudgetGrid`) to validate on, its spec and a
    note on what it is:

    * ``"embedded"`` - :func:`load_embedded_grid` of the grid's committed file (``BudgetGrid.embedded``);
    * ``"published"`` - the grid's ``simulate`` (complete grids matching the seed paper's per-variant tables; see
      the module docstring for what is simulated), with :func:`simulation_spec`;
    * a results folder - every store of the study under it (the grid's ``cells``), keeping the (model,
      question) grids that are complete."""
    from mmfragile.study import budget_stage

    stage = budget_stage(study)
    grid = stage.budget
    if source == "embedded":
        cells = load_embedded_grid(study)
        return cells, grid.spec, grid.embedded.note
    if source == "published":
        if grid.simulate is None:
            raise DataError(f"study {study!r} has no published grid to simulate: pass a results folder")
        sim = grid.simulate(datasets=datasets, max_items=max_items, seed=seed, **sim_kw)
        return sim, simulation_spec(grid.spec), "simulated per-question outcomes matching the published per-variant accuracies"
    from mmfragile.store import find_stores

    stores = find_stores(source, study, stage.tag)
    if not stores:
        raise DataError(f"{source}: no {study!r} result stores under this folder")
    rows = pd.concat([grid.read(st) for st in stores], ignore_index=True)   # e.g. stage-2 extractions joined in
    cells = grid.cells(rows)
    full = cells.groupby(["model", "question"])["correct"].transform(lambda c: c.notna().all())
    if not full.any():
        raise DataError(f"{source}: no (model, question) has its complete grid; run the full grid first")
    return cells[full].reset_index(drop=True), grid.spec, f"complete grids in {source}"


def simulation_spec(spec: GridSpec) -> GridSpec:
    """``spec`` without the cell-level terms the simulations do not generate (shift, answer position)."""
    drop = {"shift", "answer_position"}
    return replace(spec, name=spec.name + "-sim", terms=tuple(t for t in spec.terms if not set(t.columns) & drop))


# ================================================================================================ truth
def _group_cols(cells: pd.DataFrame) -> list[str]:
    return [c for c in ("dataset", "model") if c in cells.columns]


def truth(cells: pd.DataFrame, spec: GridSpec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(units, summary)`` of a complete grid: per group x unit ``accuracy`` (%), and per group x statistic
    ``truth`` (with the ``unit`` of best / worst). Raises DataError if a cell is unobserved."""
    if cells["correct"].isna().any():
        raise DataError(f"truth: the grid is not complete ({int(cells['correct'].isna().sum())} cells missing)")
    gcols = _group_cols(cells)
    urows, srows = [], []
    for key, g in (cells.groupby(gcols, sort=True) if gcols else [((), cells)]):
        key = key if isinstance(key, tuple) else (key,)
        gd = dict(zip(gcols, key))
        units, acc = unit_accuracy(g, spec, g["correct"].astype(float).to_numpy())
        urows += [{**gd, spec.unit: u, "accuracy": a} for u, a in zip(units, acc)]
        for st, v in zip(STATISTICS, summarize_units(acc)):
            unit = units[int(np.argmax(acc))] if st == "best" else units[int(np.argmin(acc))] if st == "worst" else None
            srows.append({**gd, "statistic": st, "truth": v, "unit": unit})
    return pd.DataFrame(urows), pd.DataFrame(srows)


# ================================================================================================ designs
def design_mask(g: pd.DataFrame, spec: GridSpec, budget: float | int, seed: int, design: str = "stratified",
                initial: float = 0.5, batch: int | None = None) -> np.ndarray:
    """Boolean mask of the cells a budgeted run of one group observes: ``"stratified"`` - the stratified prefix;
    ``"adaptive"`` - the stratified prefix for ``initial`` of the budget, then :func:`adaptive_batch` batches of
    ``batch`` cells (default: a tenth of the rest) on the outcomes of the complete grid ``g``."""
    n = budget_size(len(g), budget)
    if design == "stratified":
        mask = np.zeros(len(g), bool)
        mask[stratified_order(g, spec, n, seed)] = True
        return mask
    if design != "adaptive":
        raise ValueError(f"design must be 'stratified' or 'adaptive', not {design!r}")
    n0 = max(min(n, g[spec.unit].nunique()), int(round(initial * n)))
    mask = np.zeros(len(g), bool)
    mask[stratified_order(g, spec, n0, seed)] = True
    step = batch or max(1, (n - n0 + 9) // 10)
    y = g["correct"].to_numpy()
    while mask.sum() < n:
        cur = g.assign(correct=np.where(mask, y, np.nan))
        nxt = adaptive_batch(cur, spec, min(step, n - int(mask.sum())), seed)
        if not len(nxt):
            break
        mask[nxt] = True
    return mask


def hide(g: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    """``g`` with ``correct`` set to NaN outside ``mask``."""
    return g.assign(correct=np.where(mask, g["correct"].astype(float).to_numpy(), np.nan))


def observed_only(g: pd.DataFrame, idx: np.ndarray) -> pd.DataFrame:
    """``g`` with the outcomes of the cells at positions ``idx`` only (:func:`hide` the rest): a complete grid as
    the ``observe`` of :func:`mmfragile.budget.auto.auto_stop`."""
    mask = np.zeros(len(g), bool)
    mask[idx] = True
    return hide(g, mask)


# ================================================================================================ auto stop
def auto_stop_curves(cells: pd.DataFrame, spec: GridSpec, target: float, seeds: Iterable[int] = (0,),
                     statistics: Sequence[str] = AUTO_STATISTICS, round_share: float = 0.01, level: float = 0.9,
                     n_draws: int = 200) -> pd.DataFrame:
    """``--budget auto --target`` on a complete grid, every group (dataset x model) on its own, the outcomes
    outside each round hidden (:func:`hide`): one row per group x seed x statistic - ``share`` of the grid used,
    ``rounds``, ``reached``, ``estimate``, ``truth``, ``error`` (pp) and ``within`` (|error| <= target): how often
    the stopped estimate is as close to the truth as the target says."""
    gcols = _group_cols(cells)
    rows = []
    for key, g in (cells.groupby(gcols, sort=True) if gcols else [((), cells)]):
        key = key if isinstance(key, tuple) else (key,)
        g = g.reset_index(drop=True)
        true = truth(g, spec)[1].set_index("statistic")["truth"]
        for seed in seeds:
            res = auto_stop(g, spec, target, partial(observed_only, g), statistics=statistics, seed=seed,
                            round_share=round_share, level=level, n_draws=n_draws)
            got = res.estimate.summary.set_index("statistic")["estimate"]
            for st in res.statistics:
                err = float(got[st] - true[st])
                rows.append({**dict(zip(gcols, key)), "seed": seed, "statistic": st, "share": res.share,
                             "rounds": len(res.rounds), "reached": res.reached, "estimate": float(got[st]),
                             "truth": float(true[st]), "error": err, "within": abs(err) <= target})
    return pd.DataFrame(rows)


# ================================================================================================ curves
def error_curves(cells: pd.DataFrame, spec: GridSpec, budgets: Sequence[float | int], seeds: Iterable[int] = (0,),
                 design: str = "stratified", level: float = 0.9, n_draws: int = 200, progress: bool = False,
                 scale_draws: int = 8, **design_kw) -> dict[str, pd.DataFrame]:
    """Error vs budget on a complete grid (every group = dataset x model estimated separately, rankings across
    the models of a dataset). Returns frames:

    * ``stats``: group, budget, seed, statistic, ``method`` (``irt`` / ``avg``), estimate, truth, ``error``
      (estimate - truth, pp), ``abs_error``, lo, hi, ``covered`` (truth inside [lo, hi]; irt only);
    * ``units``: per group x budget x seed: mean absolute per-unit error (pp) and interval coverage;
    * ``extremes``: best / worst unit: ``hit`` (estimated unit is the true one) and ``regret`` (pp of true
      accuracy lost by taking the estimated best / worst);
    * ``ranking``: per dataset x budget x seed x method: Kendall tau between estimated and true model ranking,
      averaged over units (only with >= 2 models per dataset);
    * ``rank_coverage``: per group x unit x budget x seed (only with >= 2 models per dataset): ``covered``, whether
      the model's rank interval holds its rank on the full grid;
    * ``cells``: per group x budget x seed: cells observed and fraction.

    ``scale_draws``: :func:`~mmfragile.budget.estimator.estimate`'s (0 = intervals at the learnt prior scales).
    """
    from tqdm.auto import tqdm

    tu, ts = truth(cells, spec)
    gcols = _group_cols(cells)
    groups = list(cells.groupby(gcols, sort=True)) if gcols else [((), cells)]
    out = {k: [] for k in ("stats", "units", "extremes", "ranking", "rank_coverage", "cells")}
    todo = [(b, s) for b in budgets for s in seeds]
    for b, s in tqdm(todo, disable=not progress, desc=f"{spec.name} error curves"):
        parts = []
        for key, g in groups:
            g = g.reset_index(drop=True)
            parts.append(hide(g, design_mask(g, spec, b, s, design, **design_kw)))
        est = estimate(pd.concat(parts, ignore_index=True), spec, level=level, n_draws=n_draws, seed=s,
                       scale_draws=scale_draws)
        tag = {"budget": b, "seed": s, "design": design, "scale_draws": scale_draws}
        _collect(est, tu, ts, gcols, spec, tag, out)
    return {k: pd.concat(v, ignore_index=True) if v else pd.DataFrame() for k, v in out.items()}


def _collect(est, tu, ts, gcols, spec, tag, out) -> None:
    sm = est.summary.merge(ts.drop(columns="unit"), on=[*gcols, "statistic"])
    irt = sm.assign(method="irt", **tag)
    avg = sm.assign(method="avg", estimate=sm["naive"], lo=np.nan, hi=np.nan, **tag)
    st = pd.concat([irt, avg], ignore_index=True)
    st["error"] = st["estimate"] - st["truth"]
    st["abs_error"] = st["error"].abs()
    inside = (st["lo"] <= st["truth"]) & (st["truth"] <= st["hi"])
    st["covered"] = np.where((st["method"] == "irt") & st["lo"].notna(), inside, np.nan)
    out["stats"].append(st[[*gcols, "budget", "seed", "design", "statistic", "method", "estimate", "truth", "error",
                            "abs_error", "lo", "hi", "covered"]])
    u = est.units.merge(tu, on=[*gcols, spec.unit])
    u["err_irt"] = (u["estimate"] - u["accuracy"]).abs()
    u["err_avg"] = (u["observed"] - u["accuracy"]).abs()
    u["cov"] = np.where(u["lo"].notna(), (u["lo"] <= u["accuracy"]) & (u["accuracy"] <= u["hi"]), np.nan)
    out["units"].append(u.groupby(gcols).agg(mae_irt=("err_irt", "mean"), mae_avg=("err_avg", "mean"),
                                             coverage=("cov", "mean")).reset_index().assign(**tag))
    ext = []
    for key, g in u.groupby(gcols, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        acc = g.set_index(spec.unit)["accuracy"]
        for method, col in (("irt", "estimate"), ("avg", "observed")):
            e = g.set_index(spec.unit)[col]
            if e.isna().all():
                continue
            for which, pick in (("best", e.idxmax()), ("worst", e.idxmin())):
                true_u = acc.idxmax() if which == "best" else acc.idxmin()
                regret = (acc.max() - acc[pick]) if which == "best" else (acc[pick] - acc.min())
                ext.append({**dict(zip(gcols, key)), "method": method, "which": which, "unit": pick,
                            "true_unit": true_u, "hit": pick == true_u, "regret": regret, **tag})
    out["extremes"].append(pd.DataFrame(ext))
    if "model" in gcols:
        dcols = [c for c in gcols if c != "model"]
        rk = []
        for dkey, g in (u.groupby(dcols, sort=True) if dcols else [((), u)]):
            if g["model"].nunique() < 2:
                continue
            dkey = dkey if isinstance(dkey, tuple) else (dkey,)
            for method, col in (("irt", "estimate"), ("avg", "observed")):
                tau, n_units = _mean_kendall_tau(g, spec.unit, col)
                rk.append({**dict(zip(dcols, dkey)), "method": method, "kendall_tau": tau, "n_units": n_units, **tag})
        out["ranking"].append(pd.DataFrame(rk))
        if len(est.ranks):   # the rank intervals: does [rank_lo, rank_hi] hold the full grid's rank?
            tr = u.assign(true_rank=u.groupby([*dcols, spec.unit])["accuracy"].rank(method="min", ascending=False))
            rr = est.ranks.merge(tr[[*gcols, spec.unit, "true_rank"]], on=[*gcols, spec.unit])
            held = (rr["rank_lo"] <= rr["true_rank"]) & (rr["true_rank"] <= rr["rank_hi"])
            out["rank_coverage"].append(rr[[*gcols, spec.unit]].assign(covered=held.to_numpy(), **tag))
    out["cells"].append(est.budget.assign(**tag))


def _mean_kendall_tau(u: pd.DataFrame, unit: str, col: str) -> tuple[float, int]:
    """Kendall tau between ``col`` and the true ``accuracy`` of the models of one dataset, averaged over the
    units where both are defined (every model estimated, neither constant), and that number of units."""
    taus = [sps.kendalltau(gu[col], gu["accuracy"]).statistic for _, gu in u.groupby(unit)
            if gu[col].notna().all() and gu["accuracy"].nunique() > 1 and gu[col].nunique() > 1]
    return (float(np.nanmean(taus)) if taus else np.nan), len(taus)


def summarize_curves(curves: dict[str, pd.DataFrame], by: Sequence[str] = ("budget",)) -> pd.DataFrame:
    """One row per ``by`` x method: mean absolute error of the mean and of the quantiles (pp, averaged over
    groups and seeds), worst absolute quantile error, interval coverage (irt), best-unit hit rate and regret,
    Kendall tau (where rankings exist) and mean cells observed."""
    by = list(by)
    st = curves["stats"]
    q = st[st["statistic"].str.match(r"q\d\d")]
    m = st[st["statistic"] == "mean"]
    res = (m.groupby([*by, "method"])["abs_error"].mean().rename("mean_abs_err").to_frame()
           .join(q.groupby([*by, "method"])["abs_error"].mean().rename("quantile_abs_err"))
           .join(q.groupby([*by, "method"])["abs_error"].max().rename("quantile_abs_err_max"))
           .join(st[st["method"] == "irt"].groupby([*by, "method"])["covered"].mean().rename("coverage")))
    ex = curves["extremes"]
    if len(ex):
        b = ex[ex["which"] == "best"].groupby([*by, "method"]).agg(best_hit=("hit", "mean"), best_regret=("regret", "mean"))
        res = res.join(b)
    if len(curves.get("ranking", [])):
        res = res.join(curves["ranking"].groupby([*by, "method"])["kendall_tau"].mean())
    cells = curves["cells"].groupby(by).agg(n_observed=("n_observed", "mean"), n_cells=("n_cells", "mean"),
                                            fraction=("fraction", "mean"))
    return res.reset_index().merge(cells.reset_index(), on=by)


# ================================================================================================ PromptEval
#: PromptEval's estimators (Maia Polo et al. 2024, Sec. 3; their ``prompteval/methods.py``), implemented here:
#: "PE-Rasch" - a one-hot per variant and per question; "PE-discrete" - the variant's discrete covariates (the
#: spec's one-column variant terms) instead of its one-hot. PE-EmbPT / PE-EmbFT need a prompt encoder (BERT,
#: fine-tuned on the grid) - not implemented: no encoder ships offline and a format's covariates name it fully.
PROMPTEVAL_METHODS: tuple[str, ...] = ("pe-rasch", "pe-discrete")


def prompteval_estimate(cells: pd.DataFrame, spec: GridSpec, method: str = "pe-rasch") -> pd.DataFrame:
    """PromptEval's plug-in estimate of one group's per-unit accuracies (%): columns ``spec.unit``,
    ``estimate``. The fit is theirs - scikit-learn's ``LogisticRegression(C=100, solver="liblinear",
    fit_intercept=False)`` on the observed cells' features, with an explicit intercept column where covariates
    replace a one-hot (their ``ExtendedRaschModel``) and, where every observed outcome agrees, one flipped at
    a seeded random position (their trick to make liblinear run); observed cells keep their outcome, the others
    get the fitted probability."""
    from sklearn.linear_model import LogisticRegression

    if method not in PROMPTEVAL_METHODS:
        raise ValueError(f"method must be one of {PROMPTEVAL_METHODS}, not {method!r}")
    cells = cells.reset_index(drop=True)
    if method == "pe-rasch":
        unit_cols = [spec.unit]
    else:
        unit_cols = [t.columns[0] for t in spec.terms if len(t.columns) == 1
                     and t.columns[0] not in (spec.question, spec.unit)]
    codes = [pd.factorize(cells[c].astype(str), sort=True)[0] for c in [*unit_cols, spec.question]]
    offsets = np.cumsum([0, *(int(c.max()) + 1 for c in codes)])
    n = len(cells)
    X = sp.csr_matrix((np.ones(n * len(codes)), np.stack([c + o for c, o in zip(codes, offsets)], axis=1).ravel(),
                       np.arange(0, n * len(codes) + 1, len(codes))), shape=(n, int(offsets[-1])))
    if method == "pe-discrete":
        X = sp.hstack([X, np.ones((n, 1))], format="csr")
    obs = cells["correct"].notna().to_numpy()
    y = cells["correct"].to_numpy(float)
    yo = y[obs].copy()
    if np.var(yo) == 0:
        yo[np.random.RandomState(0).choice(len(yo))] = 1 - np.median(yo)
    lr = LogisticRegression(C=100.0, solver="liblinear", fit_intercept=False, random_state=0).fit(X[obs], yo)
    p = lr.predict_proba(X)[:, 1]
    units, acc = unit_accuracy(cells, spec, np.where(obs, y, p))
    return pd.DataFrame({spec.unit: units, "estimate": acc})


def distribution_errors(cells: pd.DataFrame, spec: GridSpec, budgets: Sequence[float], seeds: Iterable[int],
                        methods: Sequence[str] = ("irt", *PROMPTEVAL_METHODS, "avg"),
                        progress: bool = False) -> pd.DataFrame:
    """How well each method recovers every group's per-variant accuracy distribution from the same stratified
    cells (PromptEval's Fig. 3 measures): per group x budget x seed x method ``w1`` (Wasserstein-1 distance
    between the estimated and the true per-variant accuracies, as fractions: PromptEval's scale), ``q05_err`` /
    ``q95_err`` (absolute 5 / 95 % quantile error, pp), ``mean_err`` (pp) and, per dataset with >= 2 models,
    ``kendall_tau`` (of the model ranking per variant, averaged over variants). ``irt`` is
    :func:`~mmfragile.budget.estimator.estimate`'s plug-in, ``avg`` the per-variant mean of the observed cells."""
    from tqdm.auto import tqdm

    tu, _ = truth(cells, spec)
    gcols = _group_cols(cells)
    dcols = [c for c in gcols if c != "model"]
    rows, tau_rows = [], []
    for b, s in tqdm([(b, s) for b in budgets for s in seeds], disable=not progress, desc="distribution errors"):
        ests = []
        for key, g in (cells.groupby(gcols, sort=True) if gcols else [((), cells)]):
            g = g.reset_index(drop=True)
            key = key if isinstance(key, tuple) else (key,)
            h = hide(g, design_mask(g, spec, b, s))
            point = estimate(h, spec, n_draws=0).units if {"irt", "avg"} & set(methods) else None
            for method in methods:
                if method == "irt":
                    e = point[[spec.unit, "estimate"]]
                elif method == "avg":
                    e = point[[spec.unit, "observed"]].rename(columns={"observed": "estimate"})
                else:
                    e = prompteval_estimate(h, spec, method)
                ests.append(e.assign(**dict(zip(gcols, key)), method=method))
        u = pd.concat(ests, ignore_index=True).merge(tu, on=[*gcols, spec.unit])
        for key, gu in u.groupby([*gcols, "method"], sort=True):
            est, acc = gu["estimate"].dropna().to_numpy(), gu["accuracy"].to_numpy()
            qe = np.abs(np.percentile(est, [5, 95]) - np.percentile(acc, [5, 95]))
            rows.append({**dict(zip([*gcols, "method"], key)), "budget": b, "seed": s,
                         "w1": sps.wasserstein_distance(est / 100, acc / 100), "q05_err": qe[0], "q95_err": qe[1],
                         "mean_err": abs(est.mean() - acc.mean())})
        if "model" in gcols and u["model"].nunique() > 1:
            for key, gd in u.groupby([*dcols, "method"], sort=True):
                key = key if isinstance(key, tuple) else (key,)
                tau_rows.append({**dict(zip([*dcols, "method"], key)), "budget": b, "seed": s,
                                 "kendall_tau": _mean_kendall_tau(gd, spec.unit, "estimate")[0]})
    out = pd.DataFrame(rows)
    if not tau_rows:
        return out.assign(kendall_tau=np.nan)
    return out.merge(pd.DataFrame(tau_rows), on=[*dcols, "method", "budget", "seed"], how="left")


# ================================================================================================ simulation
def _latent_threshold(acc: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """items x variants 0/1 with exactly round(acc_v * n) ones in column v: correct iff b_i + eps > c_v."""
    n = len(b)
    lat = b[:, None] + rng.logistic(size=(n, len(acc)))
    k = np.rint(np.clip(acc, 0, 1) * n).astype(int)
    order = np.argsort(-lat, axis=0, kind="stable")
    y = np.zeros_like(lat, dtype=np.int8)
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(n)[:, None].repeat(len(acc), axis=1), axis=0)
    y[ranks < k[None, :]] = 1
    return y


def simulate_grid(table: pd.DataFrame, group: str, unit_cols: list[str], n_items: dict[str, int], tau: float,
              rho: float, seed: int, max_items: int | None) -> pd.DataFrame:
    frames = []
    for ds, gd in table.groupby(group, sort=True):
        n = int(n_items[ds]) if ds in n_items else None
        if n is None:
            raise DataError(f"simulate: no item count for {group} {ds!r}; pass n_items")
        if max_items:
            n = min(n, int(max_items))
        rng = np.random.default_rng([seed, sum(map(ord, str(ds)))])
        z = rng.standard_normal(n)
        for model, gm in gd.groupby("model", sort=True):
            gm = gm.sort_values(unit_cols)
            b = tau * (rho * z + np.sqrt(1 - rho ** 2) * rng.standard_normal(n))
            y = _latent_threshold(gm["accuracy"].to_numpy(float) / 100, b, rng)
            rep = gm[unit_cols].loc[gm.index.repeat(n)].reset_index(drop=True)
            frames.append(rep.assign(dataset=ds, model=model,
                                     question=np.tile([f"i{i:05d}" for i in range(n)], len(gm)),
                                     correct=y.T.ravel().astype(float)))
    return pd.concat(frames, ignore_index=True)


# ================================================================================================ report
@dataclass
class ValidationReport:
    """What notebooks 35 / 42 show: ``detail`` (one budgeted :class:`~mmfragile.budget.estimator.BudgetEstimate`),
    ``detail_table`` (its statistics next to the full grid's), ``truth_units``, ``curves`` (:func:`error_curves`),
    ``summary`` (:func:`summarize_curves` by budget), ``at_detail`` (the errors at the detail budget: mean and max
    absolute error per statistic over grids and seeds), ``seconds`` (estimate of the detail design, and the curves)."""

    detail: object
    detail_table: pd.DataFrame
    truth_units: pd.DataFrame
    curves: dict
    summary: pd.DataFrame
    at_detail: pd.DataFrame
    seconds: dict


def validation_report(cells: pd.DataFrame, spec: GridSpec, budgets: Sequence[float], n_seeds: int = 3,
                      design: str = "stratified", n_draws: int = 200, detail_budget: float = 0.05,
                      level: float = 0.9) -> ValidationReport:
    """Estimate one ``detail_budget`` design (seed 0) and the error curves over ``budgets`` x ``n_seeds``."""
    import time

    tu, ts = truth(cells, spec)
    parts = []
    for _, g in cells.groupby(_group_cols(cells), sort=True):
        g = g.reset_index(drop=True)
        parts.append(hide(g, design_mask(g, spec, detail_budget, 0, design)))
    t0 = time.perf_counter()
    est = estimate(pd.concat(parts, ignore_index=True), spec, level=level, n_draws=n_draws, seed=0)
    t_est = time.perf_counter() - t0
    gcols = _group_cols(cells)
    table = est.summary.merge(ts.rename(columns={"unit": "true_unit"}), on=[*gcols, "statistic"])
    table["error"] = table["estimate"] - table["truth"]
    t0 = time.perf_counter()
    curves = error_curves(cells, spec, budgets, seeds=range(n_seeds), design=design, level=level, n_draws=n_draws)
    t_cur = time.perf_counter() - t0
    summary = summarize_curves(curves)
    summary.attrs["level"] = level
    st = curves["stats"]
    at = st[np.isclose(st["budget"].astype(float), detail_budget)]
    at_detail = at.groupby(["method", "statistic"])["abs_error"].agg(["mean", "max"]).reset_index()
    return ValidationReport(est, table, tu, curves, summary, at_detail,
                            {"detail_estimate": t_est, "curves": t_cur})
