"""Figures of the budgeted estimates (:mod:`mmfragile.budget.estimator`, :mod:`mmfragile.budget.validation`):
error vs budget, per-quantile error, model calls saved, and one model's per-variant estimates with intervals."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mmfragile.budget.estimator import QUANTILES  # noqa: E402
from mmfragile.figures import save_figure, stamp_note  # noqa: E402,F401  (save_figure re-exported)

METHOD_STYLE = {"irt": dict(color="#C44E52", marker="o", label="IRT estimate (this toolkit)"),
                "avg": dict(color="#4C72B0", marker="s", ls="--", label="per-variant average (PromptEval's 'avg')")}


def _pct(b) -> float:
    return 100 * float(b)


def plot_error_curves(summary: pd.DataFrame, title: str = "", note: str | None = None,
                      targets: dict[str, float] | None = None):
    """2 x 2 panels over the budget (% of the grid): mean absolute error of the mean, of the quantiles (dashed:
    their worst case), Kendall tau of the model ranking per variant, and interval coverage. ``summary`` is
    :func:`~mmfragile.budget.validation.summarize_curves` by budget; ``targets`` draws horizontal lines
    (e.g. ``{"mean": 1, "quantile": 2}`` pp)."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [("mean_abs_err", "mean: |error| [pp]", "mean"), ("quantile_abs_err", "quantiles 5-95 %: |error| [pp]", "quantile"),
              ("kendall_tau", "model ranking per variant: Kendall tau", None), ("coverage", "interval coverage (irt)", None)]
    for ax, (col, label, tkey) in zip(axes.ravel(), panels):
        if col not in summary.columns or summary[col].isna().all():
            ax.text(0.5, 0.5, "not available\n(one model per dataset)" if col == "kendall_tau" else "n/a",
                    ha="center", va="center", transform=ax.transAxes, color="#888888")
            ax.set_title(label, fontsize=10)
            continue
        for method, g in summary.groupby("method"):
            if g[col].isna().all():
                continue
            g = g.sort_values("budget")
            st = METHOD_STYLE.get(method, {})
            ax.plot([_pct(b) for b in g["budget"]], g[col], **st)
            if col == "quantile_abs_err" and "quantile_abs_err_max" in g:
                ax.plot([_pct(b) for b in g["budget"]], g["quantile_abs_err_max"], color=st.get("color"), lw=0.8,
                        ls=":", alpha=0.8)
        if tkey and targets and tkey in targets:
            ax.axhline(targets[tkey], color="#555555", lw=0.8, ls="-.")
            ax.text(ax.get_xlim()[1], targets[tkey], f" target {targets[tkey]:g} pp", va="bottom", ha="right",
                    fontsize=7, color="#555555")
        if col == "coverage":
            lv = summary.attrs.get("level", 0.9)
            ax.axhline(lv, color="#555555", lw=0.8, ls="-.")
            ax.set_ylim(0, 1.02)
        ax.set_xscale("log")
        ax.set_xlabel("budget [% of the grid's cells]")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return stamp_note(fig, note)


def plot_quantile_errors(stats: pd.DataFrame, title: str = "", note: str | None = None):
    """PromptEval's Fig. 3 layout: one panel per quantile, mean absolute error vs budget per method."""
    qs = [f"q{q:02d}" for q in QUANTILES]
    fig, axes = plt.subplots(1, len(qs), figsize=(3 * len(qs), 3), sharey=True)
    agg = stats[stats["statistic"].isin(qs)].groupby(["statistic", "method", "budget"])["abs_error"].mean().reset_index()
    for ax, q in zip(axes, qs):
        for method, g in agg[agg["statistic"] == q].groupby("method"):
            ax.plot([_pct(b) for b in g["budget"]], g["abs_error"], **METHOD_STYLE.get(method, {}))
        ax.set_title(f"{int(q[1:])} % quantile", fontsize=10)
        ax.set_xscale("log")
        ax.set_xlabel("budget [%]")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("|error| [pp]")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return stamp_note(fig, note)


def plot_calls_saved(summary: pd.DataFrame, n_cells: float, title: str = "", note: str | None = None):
    """Model calls per group (dataset x model) at each budget against the full grid, annotated with the
    quantile error reached (irt)."""
    irt = summary[summary["method"] == "irt"].sort_values("budget")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = np.arange(len(irt))
    ax.bar(x, irt["n_observed"], color="#C44E52", label="model calls (budgeted run)")
    ax.axhline(n_cells, color="#333333", ls="--", lw=1, label=f"full grid: {n_cells:,.0f} calls")
    for xi, (_, r) in zip(x, irt.iterrows()):
        ax.text(xi, r["n_observed"], f"{100 * (1 - r['n_observed'] / n_cells):.0f} % saved\n"
                f"|q err| {r['quantile_abs_err']:.1f} pp", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{_pct(b):g} %" for b in irt["budget"]])
    ax.set_xlabel("budget")
    ax.set_ylabel("model calls per model x dataset")
    ax.set_yscale("log")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return stamp_note(fig, note)


def plot_unit_estimates(units: pd.DataFrame, truth: pd.DataFrame | None, unit: str, title: str = "",
                        note: str | None = None):
    """One group's per-variant estimates (dots, with intervals) sorted by estimate, the observed means
    (PromptEval's 'avg', squares) and, if given, the full grid's accuracies (crosses)."""
    u = units.sort_values("estimate").reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(6, 0.2 * len(u)), 3.8))
    x = np.arange(len(u))
    ax.errorbar(x, u["estimate"], yerr=[u["estimate"] - u["lo"], u["hi"] - u["estimate"]], fmt="o", ms=3,
                color="#C44E52", elinewidth=0.8, label="estimate (interval)")
    ax.scatter(x, u["observed"], marker="s", s=10, color="#4C72B0", label="observed cells' mean")
    if truth is not None:
        t = u.merge(truth, on=unit, how="left")
        ax.scatter(x, t["accuracy"], marker="x", s=18, color="black", label="full grid")
    ax.set_xticks(x, u[unit], rotation=90, fontsize=6)
    ax.set_ylabel("accuracy [%]")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return stamp_note(fig, note)


def save_report_figures(report, unit: str, out, title: str, note: str | None = None,
                        targets: dict[str, float] | None = None, dpi: int = 130) -> list:
    """The figures of a :class:`~mmfragile.budget.validation.ValidationReport` under ``out``: error vs
    budget, per-quantile errors, model calls saved, and the first grid's per-variant estimates."""
    from pathlib import Path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    design = report.curves["stats"]["design"].iloc[0]
    figs = {f"error_vs_budget_{design}.png": plot_error_curves(report.summary, title, note, targets),
            f"quantile_errors_{design}.png": plot_quantile_errors(report.curves["stats"], title, note),
            f"calls_saved_{design}.png": plot_calls_saved(report.summary, float(report.summary["n_cells"].mean()),
                                                          "model calls saved per model x dataset", note)}
    u = report.detail.units
    keys = [c for c in ("dataset", "model") if c in u.columns]
    first = u.groupby(keys, sort=True).ngroup() == 0
    g0 = u[first]
    t0 = report.truth_units.merge(g0[keys].drop_duplicates(), on=keys)[[unit, "accuracy"]]
    label = " on ".join(str(g0[k].iloc[0]) for k in reversed(keys))
    figs[f"unit_estimates_{design}.png"] = plot_unit_estimates(
        g0, t0, unit, title=f"{label}: per-variant accuracy from {100 * report.detail.budget['fraction'].mean():.0f} % "
                            f"of the cells ({design})", note=note)
    paths = []
    for name, fig in figs.items():
        save_figure(fig, out / name, dpi=dpi)
        paths.append(out / name)
    return paths
