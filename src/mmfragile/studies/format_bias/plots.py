"""Figures for Study 1 (prompt-format bias in multiple-choice VQA), after Figs. 3-8 and 10-15 of the paper.

Every function takes a tidy DataFrame produced by :mod:`mmfragile.studies.format_bias.metrics`, returns a
matplotlib :class:`~matplotlib.figure.Figure` (Agg backend, nothing is shown) and accepts ``note``, a
small footer stamped on the figure (e.g. "random-weight embedded model - not a real result").
"""
from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from mmfragile.studies.format_bias.metrics import (  # noqa: E402

    CONFIDENCE_BINS, DATASETS, FACTOR_LABELS, FACTORS, LEVEL_LABELS, LEVELS, METHOD_LABELS, MODELS,
)
from mmfragile.figures import save_figure, seeded_numpy, stamp_note  # noqa: E402,F401  (save_figure re-exported)

__all__ = [
    "plot_rank_distribution", "plot_format_accuracy_ci", "plot_deviation_heatmap", "plot_coverage_heatmap", "plot_lmm_coefficients",
    "plot_confidence_bins", "plot_mitigation", "plot_selection_pattern", "save_figure",
]

GREY = "#d9d9d9"
POS_COLOR = "#2b8cbe"
NEG_COLOR = "#d7301f"
NS_COLOR = "#9e9e9e"


# ----------------------------------------------------------------------------------------- helpers



def _ordered(values: Sequence[str], preferred: Sequence[str]) -> list[str]:
    vals = list(dict.fromkeys(values))
    return [v for v in preferred if v in vals] + sorted(v for v in vals if v not in preferred)


def _level_columns(df: pd.DataFrame) -> list[tuple[str, str]]:
    present = set(zip(df["factor"], df["level"]))
    cols = [(f, l) for f in FACTORS for l in LEVELS[f] if (f, l) in present]
    cols += sorted(p for p in present if p not in cols)
    return cols


def _grid(n: int, max_cols: int) -> tuple[int, int]:
    ncols = min(n, max_cols)
    return int(np.ceil(n / ncols)), ncols




def _factor_heatmaps(df: pd.DataFrame, value: str, panel_col: str, row_col: str, *, cmap, norm=None,
                     vmin=None, vmax=None, fmt: str = ".0f", grey_zero: bool = False, title: str = "",
                     cbar_label: str = "", max_cols: int = 3, row_order: Sequence[str] | None = None,
                     panel_order: Sequence[str] | None = None, note: str | None = None) -> Figure:
    """One heatmap per ``panel_col`` value: rows ``row_col``, columns the 11 factor levels."""
    cols = _level_columns(df)
    panels = _ordered(df[panel_col], panel_order or [])
    rows = _ordered(df[row_col], row_order or [])
    nr, nc = _grid(len(panels), max_cols)
    cell_w, cell_h = 0.62, 0.42
    fig_w = nc * (len(cols) * cell_w + 1.9) + 0.8
    fig_h = nr * (len(rows) * cell_h + 1.9) + 0.6
    fig, axes = plt.subplots(nr, nc, figsize=(fig_w, fig_h), squeeze=False, layout="constrained")
    cm = (plt.get_cmap(cmap) if isinstance(cmap, str) else cmap).with_extremes(bad=GREY)
    mappable = None
    for ax, p in zip(axes.flat, panels):
        sub = df[df[panel_col] == p]
        mat = np.full((len(rows), len(cols)), np.nan)
        idx = {r: i for i, r in enumerate(rows)}
        cidx = {c: j for j, c in enumerate(cols)}
        for r, f, l, v in zip(sub[row_col], sub["factor"], sub["level"], sub[value]):
            mat[idx[r], cidx[(f, l)]] = v
        shown = np.where(np.isclose(mat, 0.0) & grey_zero, np.nan, mat)
        mappable = ax.imshow(np.ma.masked_invalid(shown), cmap=cm, norm=norm,
                             vmin=None if norm else vmin, vmax=None if norm else vmax, aspect="auto")
        for i in range(len(rows)):
            for j in range(len(cols)):
                v = mat[i, j]
                if np.isnan(v):
                    continue
                rgba = cm(mappable.norm(v)) if not (grey_zero and np.isclose(v, 0)) else (0.85, 0.85, 0.85, 1)
                lum = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2]
                txt = format(v, fmt)
                if txt in ("-0", "-0.0"):
                    txt = txt[1:]
                ax.text(j, i, txt, ha="center", va="center", fontsize=7.5,
                        color="white" if lum < 0.45 else "black")
        ax.set_xticks(range(len(cols)))
        ax.set_xticklabels([LEVEL_LABELS.get(l, l) for _, l in cols], rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(rows, fontsize=8.5)
        ax.set_title(str(p), fontsize=10, fontweight="bold")
        # factor separators; the factor labels as a top axis, so the layout puts the panel title above them
        j, centres, names = 0, [], []
        for f in FACTORS:
            k = sum(1 for c in cols if c[0] == f)
            if k == 0:
                continue
            if j > 0:
                ax.axvline(j - 0.5, color="white", lw=3)
            centres.append(j + (k - 1) / 2)
            names.append(FACTOR_LABELS[f])
            j += k
        top = ax.secondary_xaxis("top")
        top.set_xticks(centres, names, fontsize=7.5, color="#444444")
        top.tick_params(length=0)
        top.spines["top"].set_visible(False)
        ax.tick_params(length=0)
        for s in ax.spines.values():
            s.set_visible(False)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if mappable is not None:
        cb = fig.colorbar(mappable, ax=axes.ravel().tolist(), shrink=0.6, pad=0.01, aspect=30)
        cb.set_label(cbar_label, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=12)
    return stamp_note(fig, note)


# ----------------------------------------------------------------------------------------- Fig. 3

def plot_rank_distribution(ranks: pd.DataFrame, note: str | None = None, include_ideal: bool = True,
                           datasets: Sequence[str] | None = None, max_cols: int = 3) -> Figure:
    """Fig. 3: distribution of each model's rank over the prompt formats, one panel per dataset.

    Boxen plot of the ranks with the individual formats as jittered points on top; rank 1 at the top.
    ``include_ideal`` adds the paper's "ideal evaluation" panel in which every model keeps one rank.

    Args:
        ranks: output of :func:`mmfragile.studies.format_bias.metrics.format_ranks` (``dataset, model, rank``).
    """
    r = ranks.dropna(subset=["rank"]).copy()
    r["rank"] = r["rank"].astype(float)
    ds_list = _ordered(r["dataset"], DATASETS) if datasets is None else list(datasets)
    models = _ordered(r["model"], MODELS)
    n_models = len(models)
    palette = dict(zip(models, sns.color_palette("tab10", n_models)))
    panels = (["Ideal evaluation"] if include_ideal else []) + ds_list
    nr, nc = _grid(len(panels), max_cols)
    fig, axes = plt.subplots(nr, nc, figsize=(nc * 4.3, nr * 3.6), squeeze=False, sharey=True)
    for ax, p in zip(axes.flat, panels):
        if p == "Ideal evaluation":
            n_fmt = 48
            sub = pd.DataFrame({"model": np.repeat(models, n_fmt),
                                "rank": np.repeat(np.arange(1, n_models + 1, dtype=float), n_fmt)})
        else:
            sub = r[r["dataset"] == p]
        sns.boxenplot(data=sub, x="model", y="rank", hue="model", order=models, hue_order=models,
                      palette=palette, ax=ax, legend=False, width=0.6, linewidth=0.6, showfliers=False)
        with seeded_numpy(0):   # seaborn jitters with numpy's global generator: the same figure every run
            sns.stripplot(data=sub, x="model", y="rank", order=models, color="black", size=2.2, alpha=0.35,
                          jitter=0.22, ax=ax)
        ax.set_ylim(n_models + 0.6, 0.4)
        ax.set_yticks(range(1, n_models + 1))
        ax.set_title(p, fontsize=10, fontweight="bold", style="italic" if p == "Ideal evaluation" else "normal")
        ax.set_xlabel("")
        ax.set_ylabel("Rank (1 = best)")
        ax.tick_params(axis="x", rotation=45, labelsize=8)
        for lab in ax.get_xticklabels():
            lab.set_ha("right")
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("Model ranks across prompt formats", fontsize=12)
    fig.tight_layout()
    return stamp_note(fig, note)


# ----------------------------------------------------------------------------------------- per-format accuracy

def plot_format_accuracy_ci(ci: pd.DataFrame, note: str | None = None, title: str | None = None) -> Figure:
    """Accuracy of every prompt format with its bootstrap interval, one panel per dataset, one colour per model;
    formats on the x axis in the paper's order (ID set, then delimiter, then separator), the ID sets shaded, so
    overlapping intervals show where two formats (or two models) cannot be told apart.

    Args:
        ci: output of :func:`mmfragile.studies.format_bias.metrics.format_accuracy_ci`.
    """
    ds_list = _ordered(ci["dataset"], DATASETS)
    models = _ordered(ci["model"], MODELS)
    palette = dict(zip(models, sns.color_palette("tab10", len(models))))
    fmt_keys = list(dict.fromkeys(zip(*(ci[f] for f in FACTORS))))
    x_of = {k: i for i, k in enumerate(fmt_keys)}
    fig, axes = plt.subplots(len(ds_list), 1, figsize=(max(8.0, 0.22 * len(fmt_keys) + 2), 3.4 * len(ds_list)),
                             squeeze=False)
    offsets = np.linspace(-0.25, 0.25, len(models)) if len(models) > 1 else [0.0]
    for ax, ds in zip(axes[:, 0], ds_list):
        sub = ci[ci["dataset"] == ds]
        for off, m in zip(offsets, models):
            r = sub[sub["model"] == m]
            x = np.array([x_of[k] for k in zip(*(r[f] for f in FACTORS))]) + off
            ax.errorbar(x, r["accuracy"], yerr=[r["accuracy"] - r["ci_low"], r["ci_high"] - r["accuracy"]],
                        fmt="o", ms=3, lw=0.8, capsize=0, color=palette[m],
                        label=f"{m} (n={int(r['n_questions'].max())} questions)")
        ids = [k[0] for k in fmt_keys]
        for j, level in enumerate(dict.fromkeys(ids)):
            span = [i for i, v in enumerate(ids) if v == level]
            if j % 2 == 0:
                ax.axvspan(span[0] - 0.5, span[-1] + 0.5, color=GREY, alpha=0.35, lw=0)
            ax.text((span[0] + span[-1]) / 2, 1.0, LEVEL_LABELS.get(level, level), transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(fmt_keys)))
        ax.set_xticklabels([f"{LEVEL_LABELS.get(d, d)} / {LEVEL_LABELS.get(s, s)}" for _, d, s in fmt_keys],
                           rotation=90, fontsize=6)
        ax.set_xlim(-0.7, len(fmt_keys) - 0.3)
        ax.set_ylabel(f"{ds}\naccuracy (%)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)  # beside, not on, the data
    fig.suptitle(title or "Accuracy per prompt format (95 % bootstrap interval over questions)", fontsize=11)
    fig.tight_layout()
    return stamp_note(fig, note)


# ----------------------------------------------------------------------------------------- Fig. 4 / 15

def plot_deviation_heatmap(deviations: pd.DataFrame, note: str | None = None, title: str | None = None,
                           max_cols: int = 3, limit: float | None = None) -> Figure:
    """Fig. 4 (and Fig. 15): accuracy deviation from the model-dataset mean per factor level.

    One heatmap per dataset, models as rows, the 11 factor levels as columns; diverging colour map centred
    at 0 pp (symmetric limits, ``limit`` or the largest |deviation|). NaN cells (levels filtered out in the
    coverage-neutral analysis) are grey.

    Args:
        deviations: output of ``deviation_from_mean`` or ``coverage_neutral``.
    """
    v = deviations["deviation"].abs().max()
    lim = float(limit if limit is not None else (v if np.isfinite(v) and v > 0 else 1.0))
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)
    return _factor_heatmaps(deviations, "deviation", "dataset", "model", cmap="RdBu", norm=norm, fmt=".0f",
                            title=title or "Accuracy deviation from the model-dataset mean [pp]",
                            cbar_label="Deviation [pp]", max_cols=max_cols, row_order=MODELS,
                            panel_order=DATASETS, note=note)


# ----------------------------------------------------------------------------------------- Fig. 5 / 9

def plot_coverage_heatmap(coverage: pd.DataFrame, note: str | None = None, title: str | None = None,
                          max_cols: int = 3) -> Figure:
    """Fig. 5 / Fig. 9: mean coverage (%) per factor level; 0 % cells are grey (no valid answer at all).

    Args:
        coverage: output of ``coverage_by_factor``.
    """
    return _factor_heatmaps(coverage, "coverage", "dataset", "model", cmap="viridis", vmin=0, vmax=100,
                            fmt=".0f", grey_zero=True, title=title or "Coverage [%] per prompt-format factor",
                            cbar_label="Coverage [%]", max_cols=max_cols, row_order=MODELS,
                            panel_order=DATASETS, note=note)


# ----------------------------------------------------------------------------------------- Fig. 6

def plot_lmm_coefficients(lmm: pd.DataFrame, note: str | None = None, title: str | None = None) -> Figure:
    """Fig. 6: fixed-effect estimates of the LMM with 95 % CIs; significant effects coloured by sign.

    Args:
        lmm: output of ``fit_lmm`` (intercept is left out; base levels are named in the axis label).
    """
    t = lmm[lmm["factor"] != "intercept"].copy()
    t["label"] = [f"{FACTOR_LABELS.get(f, f)}: {LEVEL_LABELS.get(l, l)}" for f, l in zip(t.factor, t.level)]
    colors = [NS_COLOR if not s else (POS_COLOR if c > 0 else NEG_COLOR) for s, c in zip(t.significant, t.coef)]
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(t) + 1.6))
    y = np.arange(len(t))
    ax.barh(y, t["coef"], color=colors, height=0.65, edgecolor="none")
    ax.errorbar(t["coef"], y, xerr=[t["coef"] - t["ci_low"], t["ci_high"] - t["coef"]], fmt="none",
                ecolor="#333333", capsize=3, lw=1)
    for yi, (c, hi, lo) in enumerate(zip(t["coef"], t["ci_high"], t["ci_low"])):
        x = hi if c >= 0 else lo
        ax.text(x + (0.3 if c >= 0 else -0.3), yi, f"{c:+.1f}", va="center", ha="left" if c >= 0 else "right",
                fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels(t["label"], fontsize=9)
    ax.invert_yaxis()
    base = lmm.attrs.get("base_levels", {})
    base_txt = ", ".join(LEVEL_LABELS.get(base[f], base[f]) for f in FACTORS if f in base)
    ax.set_xlabel(f"Effect on accuracy [pp] vs. base ({base_txt})" if base_txt else "Effect on accuracy [pp]")
    lo, hi = float(t["ci_low"].min()), float(t["ci_high"].max())
    pad = 0.15 * max(hi - lo, 1.0)
    ax.set_xlim(min(lo, 0) - pad, max(hi, 0) + pad)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=POS_COLOR, label="significant +"), Patch(color=NEG_COLOR, label="significant -"),
                       Patch(color=NS_COLOR, label="not significant")], fontsize=8, loc="lower right", frameon=False)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or "Effect of prompt-format factors (linear mixed model, 95 % CI)", fontsize=11)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    fig.tight_layout()
    return stamp_note(fig, note)


# ----------------------------------------------------------------------------------------- Fig. 7

def plot_confidence_bins(bin_scores: pd.DataFrame, note: str | None = None, title: str | None = None) -> Figure:
    """Fig. 7: accuracy per confidence bin (top 20 / middle 60 / bottom 20 %) across factor levels.

    One row of panels per model x dataset, one panel per factor; each line is a confidence bin, points are
    the mean accuracy over the formats with that level and the band spans min-max over those formats.

    Args:
        bin_scores: output of ``confidence_bins``.
    """
    groups = list(dict.fromkeys(zip(bin_scores["model"], bin_scores["dataset"])))
    colors = dict(zip(CONFIDENCE_BINS, ["#1b9e77", "#7570b3", "#d95f02"]))
    fig, axes = plt.subplots(len(groups), len(FACTORS), figsize=(11.5, 3.2 * len(groups)), squeeze=False,
                             sharey="row", gridspec_kw={"width_ratios": [len(LEVELS[f]) for f in FACTORS]})
    for gi, (model, ds) in enumerate(groups):
        sub = bin_scores[(bin_scores["model"] == model) & (bin_scores["dataset"] == ds)]
        for fi, f in enumerate(FACTORS):
            ax = axes[gi, fi]
            levels = [l for l in LEVELS[f] if l in set(sub[f])]
            x = np.arange(len(levels))
            for b in CONFIDENCE_BINS:
                s = sub[sub["confidence_bin"].astype(str) == b].groupby(f, observed=True)["accuracy"]
                stats = s.agg(["mean", "min", "max"]).reindex(levels)
                ax.plot(x, stats["mean"], marker="o", color=colors[b], label=b, lw=1.8)
                ax.fill_between(x, stats["min"], stats["max"], color=colors[b], alpha=0.15, lw=0)
            ax.set_xticks(x)
            ax.set_xticklabels([LEVEL_LABELS.get(l, l) for l in levels], rotation=30, ha="right", fontsize=8)
            ax.set_ylim(-3, 103)
            ax.grid(alpha=0.3)
            ax.set_title(f"{model} on {ds}: {FACTOR_LABELS[f]}" if fi == 0 else FACTOR_LABELS[f], fontsize=9)
            if fi == 0:
                ax.set_ylabel("Accuracy [%]")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.suptitle(title or "Accuracy by confidence bin across prompt formats", fontsize=12)
    # leave a fixed 0.5 inch band on top for the title, whatever the number of rows
    fig.tight_layout(rect=(0, 0, 0.86, 1 - 0.5 / fig.get_figheight()))
    fig.legend(handles, labels, title="Confidence under\nthe reference format", fontsize=8, title_fontsize=8,
               loc="center right", frameon=False)
    return stamp_note(fig, note)


# ----------------------------------------------------------------------------------------- Fig. 8

def plot_mitigation(agreement: pd.DataFrame, note: str | None = None, title: str | None = None,
                    methods: Sequence[str] = ("vanilla", "pia", "pride", "cp_ln")) -> Figure:
    """Fig. 8: number of models each method ranks like the pseudo GT, per dataset.

    Grouped bars (x = dataset, colour = method); methods not applicable to a dataset are marked "NA";
    the dashed line marks half of the models.

    Args:
        agreement: output of ``ranking_agreement`` with a ``method`` column (``dataset, method,
            correctly_ranked, n_models``, optionally ``spearman``).
    """
    a = agreement.copy()
    ds_list = _ordered(a["dataset"], DATASETS)
    methods = [m for m in methods if m in set(a["method"])] + sorted(set(a["method"]) - set(methods))
    n_models = int(pd.to_numeric(a["n_models"], errors="coerce").max() or 7)
    palette = dict(zip(methods, sns.color_palette("Set2", len(methods))))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.9 * len(ds_list) + 2.5), 4.2), layout="constrained")
    w = 0.8 / len(methods)
    for i, m in enumerate(methods):
        for j, ds in enumerate(ds_list):
            row = a[(a["dataset"] == ds) & (a["method"] == m)]
            x = j - 0.4 + w * (i + 0.5)
            val = row["correctly_ranked"].iloc[0] if len(row) else pd.NA
            if pd.isna(val):
                ax.text(x, 0.15, "NA", ha="center", va="bottom", fontsize=8, color="#777777", rotation=90)
                continue
            ax.bar(x, float(val), width=w * 0.92, color=palette[m], label=METHOD_LABELS.get(m, m) if j == 0 else None,
                   edgecolor="white")
            inside = float(val) >= 0.7
            ax.text(x, float(val) - 0.08 if inside else float(val) + 0.05, f"{int(val)}", ha="center",
                    va="top" if inside else "bottom", fontsize=9, fontweight="bold", zorder=5)
            if "spearman" in row and pd.notna(row["spearman"].iloc[0]):
                ax.text(x, float(val) + (0.05 if inside else 0.4), f"\u03c1={row['spearman'].iloc[0]:.2f}",
                        ha="center", va="bottom", fontsize=7, color="#333333", zorder=5)
    ax.axhline(n_models / 2, color="#555555", ls="--", lw=1)
    ax.text(len(ds_list) - 0.5, n_models / 2 + 0.05, "half of the models", fontsize=7.5, color="#555555",
            ha="right", va="bottom")
    ax.set_xlim(-0.5, len(ds_list) - 0.5)
    ax.set_xticks(range(len(ds_list)))
    ax.set_xticklabels(ds_list)
    ax.set_ylim(0, n_models + 0.3)
    ax.set_ylabel(f"Correctly ranked models (of {n_models})")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    ax.legend(seen.values(), seen.keys(), fontsize=8, frameon=False, loc="upper left", ncols=len(seen))
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    ax.set_title(title or "Ranking agreement with the 48-format pseudo GT", fontsize=11)
    return stamp_note(fig, note)


# ----------------------------------------------------------------------------------------- Figs. 10-14

def plot_selection_pattern(pattern: pd.DataFrame, note: str | None = None, title: str | None = None,
                           max_cols: int = 4) -> Figure:
    """Figs. 10-14: normalised answering frequency per option position, per factor level, one panel per model.

    Rows are the 11 factor levels, columns the option positions (A/1/I = position 1); a uniform model has
    1/o everywhere. Cells with 0 frequency (position never chosen) are grey. The colour map is centred at
    the uniform frequency 1/o.

    Args:
        pattern: ``selection_pattern(..., by_factor=True)`` for one dataset (if several datasets are
            present, panels are model x dataset).
    """
    p = pattern.copy()
    multi_ds = p["dataset"].nunique() > 1
    p["panel"] = p["model"] + (" / " + p["dataset"] if multi_ds else "")
    panels = list(dict.fromkeys(p.sort_values("model", key=lambda s: s.map(
        {m: i for i, m in enumerate(MODELS)}).fillna(99), kind="stable")["panel"]))
    rows = [(f, l) for f in FACTORS for l in LEVELS[f] if ((p["factor"] == f) & (p["level"] == l)).any()]
    n_pos = int(p["position"].max()) + 1
    uniform = 1.0 / n_pos
    vmax = max(float(p["frequency"].max(skipna=True) or 0), 2 * uniform)
    norm = TwoSlopeNorm(vcenter=uniform, vmin=0.0, vmax=vmax)
    cm = plt.get_cmap("PuOr_r").with_extremes(bad=GREY)
    nr, nc = _grid(len(panels), max_cols)
    fig, axes = plt.subplots(nr, nc, figsize=(nc * (0.45 * n_pos + 0.6) + 2.2, nr * (0.3 * len(rows) + 1.2)),
                             squeeze=False, layout="constrained")
    im = None
    for ax, pan in zip(axes.flat, panels):
        sub = p[p["panel"] == pan]
        mat = np.full((len(rows), n_pos), np.nan)
        ridx = {r: i for i, r in enumerate(rows)}
        for f, l, pos, v in zip(sub["factor"], sub["level"], sub["position"], sub["frequency"]):
            mat[ridx[(f, l)], int(pos)] = v
        shown = np.where(np.isclose(mat, 0.0), np.nan, mat)
        im = ax.imshow(np.ma.masked_invalid(shown), cmap=cm, norm=norm, aspect="auto")
        for i in range(len(rows)):
            for j in range(n_pos):
                if np.isfinite(mat[i, j]):
                    ax.text(j, i, f"{100 * mat[i, j]:.0f}", ha="center", va="center", fontsize=6.5)
        ax.set_xticks(range(n_pos))
        ax.set_xticklabels([str(k + 1) for k in range(n_pos)], fontsize=8)
        ax.set_xlabel("Option position", fontsize=8)
        ax.set_yticks(range(len(rows)))
        first_col = list(axes.flat).index(ax) % nc == 0
        ax.set_yticklabels([LEVEL_LABELS.get(l, l) for _, l in rows] if first_col else [], fontsize=7.5)
        for k in (4, 8):
            if k < len(rows):
                ax.axhline(k - 0.5, color="white", lw=2.5)
        ax.set_title(pan, fontsize=9, fontweight="bold")
        ax.tick_params(length=0)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if im is not None:
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, pad=0.01, aspect=30)
        cb.set_label("Normalised answer frequency (cells in %)", fontsize=8)
    fig.suptitle(title or "Answer frequency per option position", fontsize=11)
    return stamp_note(fig, note)
