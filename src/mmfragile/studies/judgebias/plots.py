"""Figures and table helpers for Study 3 (MM-JudgeBias, arXiv 2604.18164).

* :func:`table2_frame` / :func:`save_table2_csv` - the Table-2 layout (judges x bias types grouped
  by Integrality / Congruity / Robustness, ``Avg.`` reliability, inter-run / inter-sample variance);
* :func:`plot_table2_heatmap` - Table 2 as an annotated heatmap; :func:`plot_bias_heatmap` the
  same without the variance panel;
* :func:`plot_bias_bars` - grouped BD / BC bars per bias type and judge;
* :func:`plot_category_scores` - Integrality / Congruity / Robustness / Overall per judge;
* :func:`plot_setting_comparison` - prompt settings of Tables 3/4/14/16 side by side;
* :func:`plot_variance` - inter-run vs inter-sample variance;
* :func:`plot_position_verbosity` - Fig. 3 (position and verbosity robustness);
* :func:`plot_self_enhancement` - Fig. 4 (mean score per response generator, self highlighted);
* :func:`plot_planted_findings` - what the metrics find in judges with a planted bias, with intervals.

Every plot takes a DataFrame from :mod:`mmfragile.studies.judgebias.metrics` (or a published table),
returns a matplotlib :class:`~matplotlib.figure.Figure` (Agg backend, nothing shown) and accepts
``note``, a small footer stamped on the figure.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.transforms import offset_copy  # noqa: E402

from mmfragile.studies.judgebias.metrics import (  # noqa: E402

    AGGREGATE_COLUMNS, DIMENSION_OF, DIMENSIONS, METRIC_OF, PERTURBATIONS, SHORT_NAMES,
)
from mmfragile.figures import save_figure, stamp_note  # noqa: E402,F401  (save_figure re-exported)

__all__ = [
    "table2_frame", "save_table2_csv", "plot_table2_heatmap", "plot_bias_heatmap", "plot_bias_bars",
    "plot_category_scores", "plot_setting_comparison", "plot_variance", "plot_position_verbosity",
    "plot_self_enhancement", "plot_planted_findings", "plot_abstention_ratio", "plot_perturbed_inputs", "save_figure",
]

DIM_LABEL = {"integrality": "Integrality (BD↑)", "congruity": "Congruity (BD↑)", "robustness": "Robustness (BC↑)"}
DIM_COLOR = {"integrality": "#c0504d", "congruity": "#e29a2d", "robustness": "#2f7ebc"}
AGG_LABEL = {"integrality": "Integrality", "congruity": "Congruity", "robustness": "Robustness", "overall": "Overall"}
VAR_LABEL = {"inter_run_variance": "Inter-run", "inter_sample_variance": "Inter-sample"}
SETTING_LABEL = {"original": "Orig.", "na": "N/A", "score_guide": "+Guide", "constraints": "+Const.",
                 "reasoning": "+Reason."}
SCORE_CMAP = "RdYlGn"


# ----------------------------------------------------------------------------------------- helpers





def _wide(df: pd.DataFrame) -> pd.DataFrame:
    """Accept a wide table (judges x perturbations, e.g. :func:`reliability_table`,
    :func:`published_table2`) or the long :func:`bias_scores` output."""
    if {"judge", "perturbation", "value"} <= set(df.columns):
        from mmfragile.studies.judgebias.metrics import reliability_table

        return reliability_table(df)
    return df


def _types(df: pd.DataFrame) -> list[str]:
    return [p for p in PERTURBATIONS if p in df.columns]


# ------------------------------------------------------------------------------------------ Table 2

def table2_frame(table: pd.DataFrame, *, add_mean: bool = True, decimals: int = 3, flat: bool = False) -> pd.DataFrame:
    """Table 2 layout: rows judges (+ an ``Avg.`` row, the mean over judges, when ``add_mean``),
    columns grouped ``(Integrality (BD↑), TextDom.)`` ... ``(Robustness (BC↑), TextInsert.)``,
    ``("", "Avg.")`` (reliability) and ``("Variance", "Inter-run"/"Inter-sample")`` where present.
    ``flat=True`` joins the two header levels (``"Integrality (BD↑) | TextDom."``) for CSV."""
    t = _wide(table)
    types = _types(t)
    cols, names = [], []
    for p in types:
        cols.append(p)
        names.append((DIM_LABEL[DIMENSION_OF[p]], SHORT_NAMES[p]))
    if "overall" in t.columns:
        cols.append("overall")
        names.append(("", "Avg."))
    for v in VAR_LABEL:
        if v in t.columns:
            cols.append(v)
            names.append(("Variance", VAR_LABEL[v]))
    out = t[cols].astype(float).copy()
    if add_mean:
        out.loc["Avg."] = out.mean(axis=0)
    dec = {c: (1 if c in VAR_LABEL else decimals) for c in cols}
    out = out.round(dec)
    out.columns = pd.MultiIndex.from_tuples(names)
    out.index.name = "Judge"
    if flat:
        out.columns = [f"{a} | {b}" if a else b for a, b in out.columns]
    return out


def save_table2_csv(table: pd.DataFrame, path, **kw) -> Path:
    """Write :func:`table2_frame` (flat header) to ``path`` and return it."""
    path = Path(path)
    table2_frame(table, flat=True, **kw).to_csv(path)
    return path


def plot_table2_heatmap(table: pd.DataFrame, *, note: str | None = None, title: str | None = None,
                        add_mean: bool = True, variance: bool = True, show_aggregates: bool = False,
                        vmin: float = 0.0, vmax: float = 1.0) -> Figure:
    """Table 2 as a heatmap: one row per judge, BD columns (Integrality, Congruity), BC columns
    (Robustness), the ``Avg.`` reliability column (bold), and, if present and ``variance``, a
    separate panel with inter-run / inter-sample variance on its own scale.  Rows are grouped by
    ``category`` when the table has that column (e.g. :func:`published_table2`).
    ``show_aggregates`` adds the three category-score columns before ``Avg.``."""
    t = _wide(table)
    types = _types(t)
    if not types:
        raise ValueError("plot_table2_heatmap: the table has none of the nine bias-type columns")
    if show_aggregates and not set(AGGREGATE_COLUMNS) <= set(t.columns):
        from mmfragile.studies.judgebias.metrics import aggregate_reliability

        t = pd.concat([t.drop(columns=[c for c in AGGREGATE_COLUMNS if c in t.columns]),
                       t[types].apply(aggregate_reliability, axis=1)], axis=1)
    score_cols = types + ([c for c in DIMENSIONS if c in t.columns] if show_aggregates else [])
    score_cols += ["overall"] if "overall" in t.columns else []
    var_cols = [v for v in VAR_LABEL if v in t.columns] if variance else []
    vals = t[score_cols + var_cols].astype(float)
    cats = t["category"] if "category" in t.columns else None
    if add_mean:
        vals.loc["Avg."] = vals.mean(axis=0)
        if cats is not None:
            cats = pd.concat([cats, pd.Series({"Avg.": "Avg."})])
    n_rows = len(vals)
    label_w = max(len(str(i)) for i in vals.index) * 0.075 + 0.6
    w_scores = 0.78 * len(score_cols)
    w_var = 0.95 * len(var_cols)
    fig_w = label_w + w_scores + w_var + 1.6
    fig_h = 0.34 * n_rows + 2.0
    ratios = [w_scores] + ([w_var] if var_cols else []) + [0.22]
    fig, axes = plt.subplots(1, len(ratios), figsize=(fig_w, fig_h), squeeze=False,
                             gridspec_kw=dict(width_ratios=ratios, wspace=0.04), layout="constrained")
    ax, cax = axes[0, 0], axes[0, -1]
    xlabels = [SHORT_NAMES.get(c, AGG_LABEL.get(c, c)) for c in score_cols]
    xlabels = ["Avg." if c == "overall" else x for c, x in zip(score_cols, xlabels)]
    sns.heatmap(vals[score_cols], ax=ax, cmap=SCORE_CMAP, vmin=vmin, vmax=vmax, annot=True, fmt=".3f",
                annot_kws=dict(fontsize=7.5), linewidths=0.4, linecolor="white",
                cbar_ax=cax, cbar_kws=dict(label="score (higher = more reliable)"),
                xticklabels=xlabels, yticklabels=list(vals.index))
    ax.set_xlabel("")
    ax.set_ylabel("")
    ax.xaxis.tick_top()
    ax.tick_params(axis="x", rotation=40, labelsize=8.5, length=0)
    plt.setp(ax.get_xticklabels(), ha="left")
    ax.tick_params(axis="y", labelsize=8.5, length=0)
    # bold reliability column, separators between dimensions
    if "overall" in score_cols:
        j = score_cols.index("overall")
        for txt in ax.texts:
            x, _ = txt.get_position()
            if int(x) == j:
                txt.set_fontweight("bold")
    if len(score_cols) > len(types):
        ax.axvline(len(types), color="black", lw=1.4)
    prev = None
    for k, c in enumerate(types):
        d = DIMENSION_OF[c]
        if prev is not None and d != prev:
            ax.axvline(k, color="white", lw=3.0)
        prev = d
    for d in DIMENSIONS:
        ks = [k for k, c in enumerate(types) if DIMENSION_OF[c] == d]
        if ks:
            ax.annotate(DIM_LABEL[d], xy=((ks[0] + ks[-1] + 1) / 2, 0), xycoords=("data", "axes fraction"),
                        xytext=(0, -7), textcoords="offset points",
                        ha="center", va="top", fontsize=9, fontweight="bold", color=DIM_COLOR[d],
                        annotation_clip=False)
            ax.plot([ks[0] + 0.08, ks[-1] + 0.92], [0, 0],
                    transform=offset_copy(ax.get_xaxis_transform(), fig=fig, y=-3.5, units="points"),
                    color=DIM_COLOR[d], lw=2.5, clip_on=False, solid_capstyle="butt")
    # row groups
    if cats is not None:
        cats = cats.reindex(vals.index)
        for k in range(1, n_rows):
            if cats.iloc[k] != cats.iloc[k - 1]:
                ax.axhline(k, color="black", lw=1.2)
                if var_cols:
                    axes[0, 1].axhline(k, color="black", lw=1.2)
        for c in pd.unique(cats):
            if c == "Avg.":
                continue
            ks = np.flatnonzero((cats == c).to_numpy())
            ax.annotate(str(c), xy=(-0.005, 1 - (ks[0] + ks[-1] + 1) / 2 / n_rows), xycoords="axes fraction",
                        xytext=(-max(len(str(i)) for i in vals.index) * 5.0 - 14, 0), textcoords="offset points", rotation=90,
                        ha="center", va="center", fontsize=8.5, color="#444444", annotation_clip=False)
    elif add_mean:
        ax.axhline(n_rows - 1, color="black", lw=1.2)
    if var_cols:
        axv = axes[0, 1]
        v = vals[var_cols]
        sns.heatmap(v / v.max(axis=0).replace(0, 1), ax=axv, cmap="Blues", vmin=0, vmax=1.25, annot=v, fmt=".1f",
                    annot_kws=dict(fontsize=7.5), linewidths=0.4, linecolor="white", cbar=False,
                    xticklabels=[VAR_LABEL[c] for c in var_cols], yticklabels=False)
        axv.set_ylabel("")
        axv.set_xlabel("")
        axv.xaxis.tick_top()
        axv.tick_params(axis="x", rotation=40, labelsize=8.5, length=0)
        plt.setp(axv.get_xticklabels(), ha="left")
        axv.annotate("Variance", xy=(0.5, 0), xycoords="axes fraction", xytext=(0, -7),
                     textcoords="offset points", ha="center", va="top",
                     fontsize=9, fontweight="bold", color="#555555", annotation_clip=False)
        if cats is None and add_mean:
            axv.axhline(n_rows - 1, color="black", lw=1.2)
    fig.suptitle(title or "MM-JudgeBias: reliability of MLLM judges (Table 2 layout)", fontsize=11.5, fontweight="bold")
    return stamp_note(fig, note)


def plot_bias_heatmap(scores: pd.DataFrame, *, note: str | None = None, title: str | None = None,
                      add_mean: bool = False) -> Figure:
    """BD / BC per judge (rows) and bias type (columns) with category scores and reliability."""
    return plot_table2_heatmap(scores, note=note, title=title or "Bias-Deviation / Bias-Conformity per judge",
                               add_mean=add_mean, variance=False, show_aggregates=True)


# ------------------------------------------------------------------------------------------- bars

def plot_bias_bars(scores: pd.DataFrame, *, note: str | None = None, title: str | None = None,
                   judges: Sequence[str] | None = None, palette: str = "tab10") -> Figure:
    """Grouped bars: one group per bias type (BD panel for Integrality + Congruity, BC panel for
    Robustness), one bar per judge. ``scores``: long :func:`bias_scores` output or a wide table."""
    t = _wide(scores)
    types = _types(t)
    if judges is not None:
        t = t.loc[list(judges)]
    long = (t[types].rename_axis("judge").reset_index()
            .melt(id_vars="judge", var_name="perturbation", value_name="value"))
    long["metric"] = long["perturbation"].map(METRIC_OF)
    long["type"] = long["perturbation"].map(SHORT_NAMES)
    order = list(t.index)
    colors = dict(zip(order, sns.color_palette(palette, n_colors=max(len(order), 1))))
    panels = [m for m in ("BD", "BC") if (long["metric"] == m).any()]
    n_types = {m: long.loc[long["metric"] == m, "type"].nunique() for m in panels}
    fig_w = max(6.0, 0.42 * len(order) * sum(n_types.values()) * 0.55 + 3)
    fig, axes = plt.subplots(1, len(panels), figsize=(min(fig_w, 20), 4.6), squeeze=False, layout="constrained",
                             gridspec_kw=dict(width_ratios=[n_types[m] for m in panels]))
    for ax, m in zip(axes[0], panels):
        d = long[long["metric"] == m]
        sns.barplot(data=d, x="type", y="value", hue="judge", hue_order=order, palette=colors, ax=ax,
                    edgecolor="white", linewidth=0.5, legend=(m == panels[-1]))
        types_here = list(dict.fromkeys(d["type"]))
        for k, ty in enumerate(types_here):
            p = next(p for p in types if SHORT_NAMES[p] == ty)
            ax.axvspan(k - 0.5, k + 0.5, color=DIM_COLOR[DIMENSION_OF[p]], alpha=0.07, lw=0)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("")
        ax.set_ylabel("Bias-Deviation (BD↑)" if m == "BD" else "Bias-Conformity (BC↑)")
        ax.grid(axis="y", color="#e5e5e5", lw=0.8)
        ax.set_axisbelow(True)
        sns.despine(ax=ax)
        ax.tick_params(axis="x", rotation=20)
    leg = axes[0, -1].get_legend()
    if leg is not None:
        handles = leg.legend_handles
        labels = [t_.get_text() for t_ in leg.get_texts()]
        leg.remove()
        dims = [Patch(color=DIM_COLOR[d], alpha=0.3, label=DIM_LABEL[d]) for d in DIMENSIONS]
        fig.legend(handles + dims, labels + [p.get_label() for p in dims], loc="outside right upper",
                   fontsize=8, frameon=False, title="Judge", title_fontsize=9)
    fig.suptitle(title or "Compositional bias per bias type", fontsize=11.5, fontweight="bold")
    return stamp_note(fig, note)


def plot_category_scores(table: pd.DataFrame, *, note: str | None = None, title: str | None = None,
                         palette: str = "tab10") -> Figure:
    """Integrality / Congruity / Robustness / Overall per judge (Table 3 columns). ``table``: wide
    (e.g. :func:`reliability_table`) or long :func:`bias_scores`; aggregates are computed if absent."""
    t = _wide(table)
    if not set(AGGREGATE_COLUMNS) <= set(t.columns):
        from mmfragile.studies.judgebias.metrics import aggregate_reliability

        t = pd.concat([t, t.apply(aggregate_reliability, axis=1)], axis=1)
    long = (t[list(AGGREGATE_COLUMNS)].rename_axis("judge").reset_index()
            .melt(id_vars="judge", var_name="category", value_name="value"))
    long["category"] = long["category"].map(AGG_LABEL)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(t) + 3.5), 4.2), layout="constrained")
    sns.barplot(data=long, x="judge", y="value", hue="category", ax=ax,
                palette=[DIM_COLOR["integrality"], DIM_COLOR["congruity"], DIM_COLOR["robustness"], "#555555"],
                edgecolor="white", linewidth=0.5)
    for c in ax.containers:
        ax.bar_label(c, fmt="%.2f", fontsize=7, padding=1.5)
    ax.set_ylim(0, 1.08)
    ax.set_xlabel("")
    ax.set_ylabel("score (higher = more reliable)")
    ax.grid(axis="y", color="#e5e5e5", lw=0.8)
    ax.set_axisbelow(True)
    ax.legend(frameon=False, fontsize=8, ncols=4, loc="upper left", bbox_to_anchor=(0, 1.12))
    ax.tick_params(axis="x", rotation=20 if len(t) > 4 else 0)
    sns.despine(ax=ax)
    fig.suptitle(title or "Category scores and overall reliability", fontsize=11.5, fontweight="bold", y=1.06)
    return stamp_note(fig, note)


def plot_setting_comparison(settings: pd.DataFrame, *, note: str | None = None, title: str | None = None,
                            columns: Sequence[str] = AGGREGATE_COLUMNS) -> Figure:
    """Prompt settings side by side (Tables 3/4/14/16): one panel per ``columns`` entry, x the
    settings, one line per judge.  ``settings``: long ``judge, setting, column, value`` (e.g.
    ``load_published("prompt_settings")``; duplicated rows of the same cell are averaged)."""
    d = settings[settings["column"].isin(columns)]
    d = d.groupby(["judge", "setting", "column"], sort=False, as_index=False)["value"].mean()
    order = [s for s in SETTING_LABEL if s in set(d["setting"])] + sorted(set(d["setting"]) - set(SETTING_LABEL))
    cols = [c for c in columns if c in set(d["column"])]
    fig, axes = plt.subplots(1, len(cols), figsize=(3.1 * len(cols) + 1.5, 3.6), squeeze=False,
                             layout="constrained", sharey=False)
    judges = list(dict.fromkeys(d["judge"]))
    colors = dict(zip(judges, sns.color_palette("Set2", len(judges))))
    for ax, c in zip(axes[0], cols):
        x = d[d["column"] == c]
        for j in judges:
            y = x[x["judge"] == j].set_index("setting")["value"].reindex(order)
            ax.plot(range(len(order)), y.to_numpy(), marker="o", color=colors[j], lw=1.0, alpha=0.9, ms=6,
                    ls=":", label=j)
        ax.set_xticks(range(len(order)), [SETTING_LABEL.get(s, s) for s in order], fontsize=8.5)
        ax.set_title(AGG_LABEL.get(c, SHORT_NAMES.get(c, c)), fontsize=10,
                     color=DIM_COLOR.get(c, "#222222"), fontweight="bold")
        ax.grid(color="#ececec", lw=0.8)
        ax.margins(x=0.12, y=0.15)
        sns.despine(ax=ax)
    axes[0, 0].set_ylabel("score")
    axes[0, -1].legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title or "Prompt settings: category scores and overall reliability", fontsize=11.5,
                 fontweight="bold")
    return stamp_note(fig, note)


def plot_variance(variances: pd.DataFrame, *, note: str | None = None, title: str | None = None) -> Figure:
    """Inter-run vs inter-sample variance per judge: paired horizontal bars (left) and a scatter with
    Pearson r (right; the paper notes the two are only weakly correlated).  ``variances``: index
    judge, columns ``inter_run_variance, inter_sample_variance`` (:func:`variance_table`, Table 2)."""
    v = variances[["inter_run_variance", "inter_sample_variance"]].astype(float).dropna(how="all")
    v = v.sort_values("inter_sample_variance")
    n = len(v)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, max(3.2, 0.28 * n + 1.6)), layout="constrained",
                                 gridspec_kw=dict(width_ratios=[1.3, 1]))
    y = np.arange(n)
    h = 0.38
    a1.barh(y + h / 2, v["inter_sample_variance"], height=h, color="#2f7ebc", label="Inter-sample")
    a1.barh(y - h / 2, v["inter_run_variance"], height=h, color="#e29a2d", label="Inter-run")
    a1.set_yticks(y, v.index, fontsize=8)
    a1.set_xlabel("score variance (1-10 scale)")
    a1.legend(frameon=False, fontsize=8, loc="lower right")
    a1.grid(axis="x", color="#ececec")
    a1.set_axisbelow(True)
    sns.despine(ax=a1)
    a2.scatter(v["inter_run_variance"], v["inter_sample_variance"], s=36, color="#5b5b9f", alpha=0.85,
               edgecolor="white", lw=0.6, zorder=3)
    if n <= 40:
        for name, r in v.iterrows():
            a2.annotate(str(name), (r["inter_run_variance"], r["inter_sample_variance"]), fontsize=6.5,
                        xytext=(3, 2), textcoords="offset points", color="#444444")
    ok = v.dropna()
    if len(ok) >= 3 and ok.std().min() > 0:
        r = np.corrcoef(ok["inter_run_variance"], ok["inter_sample_variance"])[0, 1]
        a2.text(0.98, 0.03, f"Pearson r = {r:.2f} (n = {len(ok)})", transform=a2.transAxes, ha="right",
                fontsize=8.5, color="#333333")
    a2.set_xlabel("inter-run variance")
    a2.set_ylabel("inter-sample variance")
    a2.grid(color="#ececec")
    sns.despine(ax=a2)
    fig.suptitle(title or "Judgment variance across runs and across samples", fontsize=11.5, fontweight="bold")
    return stamp_note(fig, note)


def plot_position_verbosity(position: pd.DataFrame | None = None, verbosity: pd.DataFrame | None = None, *,
                            note: str | None = None, title: str | None = None) -> Figure:
    """Fig. 3: robustness to position bias (swap consistency, :func:`position_consistency`) and to
    verbosity bias (prefer-original rate, :func:`verbosity_robustness`) per judge, horizontal bars
    sorted by value; dashed line = 0.5 (verbosity: indifferent between concise and verbose)."""
    panels = []
    if position is not None:
        panels.append(("Position bias", position["consistency"], "swap consistency (robustness ↑)", None, "#2f7ebc"))
    if verbosity is not None:
        panels.append(("Verbosity bias", verbosity["robustness"], "prefers original concise response (robustness ↑)",
                       0.5, "#c0504d"))
    if not panels:
        raise ValueError("plot_position_verbosity: give position and/or verbosity results")
    n = max(len(p[1]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 1, max(2.8, 0.36 * n + 1.5)),
                             squeeze=False, layout="constrained")
    for ax, (name, s, xlabel, ref, color) in zip(axes[0], panels):
        s = s.astype(float).sort_values()
        y = np.arange(len(s))
        ax.barh(y, s.to_numpy(), color=color, alpha=0.85, height=0.65)
        for k, val in enumerate(s.to_numpy()):
            if np.isfinite(val):
                ax.text(val + 0.01, k, f"{val:.2f}", va="center", fontsize=7.5, color="#333333")
        ax.set_yticks(y, s.index, fontsize=8.5)
        ax.set_xlim(0, 1.1)
        if ref is not None:
            ax.axvline(ref, color="#555555", ls="--", lw=1)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_title(name, fontsize=10.5, fontweight="bold")
        ax.grid(axis="x", color="#ececec")
        ax.set_axisbelow(True)
        sns.despine(ax=ax)
    if title:
        fig.suptitle(title, fontsize=11.5, fontweight="bold")
    return stamp_note(fig, note)


def plot_self_enhancement(by_generator: pd.DataFrame, *, note: str | None = None, title: str | None = None) -> Figure:
    """Fig. 4: mean score each judge gives to each generator's responses; the judge's own responses
    are outlined and hatched.  ``by_generator``: :func:`score_by_generator` output."""
    d = by_generator.copy()
    judges = list(dict.fromkeys(d["judge"]))
    gens = list(dict.fromkeys(d["generator"]))
    colors = dict(zip(gens, sns.color_palette("Set2", len(gens))))
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(judges) + 2.5), 4.0), layout="constrained")
    w = 0.8 / max(len(gens), 1)
    for gi, g in enumerate(gens):
        for ji, j in enumerate(judges):
            row = d[(d["judge"] == j) & (d["generator"] == g)]
            if row.empty:
                continue
            val = float(row["mean_score"].iloc[0])
            is_self = bool(row["is_self"].iloc[0])
            x = ji - 0.4 + w * (gi + 0.5)
            ax.bar(x, val, width=w * 0.92, color=colors[g], edgecolor="black" if is_self else "white",
                   lw=1.6 if is_self else 0.5, hatch="//" if is_self else None)
            ax.text(x, val + 0.08, f"{val:.2f}", ha="center", fontsize=7, color="#333333")
    ax.set_xticks(range(len(judges)), judges, fontsize=9)
    ax.set_xlabel("judge")
    ax.set_ylabel("mean judge score")
    top = float(d["mean_score"].max()) if len(d) else 10
    ax.set_ylim(0, top * 1.15 + 0.1)
    handles = [Patch(color=colors[g], label=g) for g in gens]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="own responses"))
    ax.legend(handles=handles, title="response generator", frameon=False, fontsize=8, title_fontsize=8.5,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", color="#ececec")
    ax.set_axisbelow(True)
    sns.despine(ax=ax)
    fig.suptitle(title or "Self-enhancement: scores by response generator", fontsize=11.5, fontweight="bold")
    return stamp_note(fig, note)


def plot_planted_findings(bd: pd.DataFrame, pairwise: pd.DataFrame, planted: dict[str, str] | None = None, *,
                          perturbations: Sequence[str] = ("text_dominance", "image_misalignment"),
                          note: str | None = None, title: str | None = None) -> Figure:
    """Judges with planted biases next to what the metrics find, 95 % intervals over samples. Left: excess BD (BD
    above the run-to-run floor, :func:`~mmfragile.studies.judgebias.metrics.bias_deviation_intervals`) of the
    image-side ``perturbations``; right: verbose preference and first-position rate
    (:func:`~mmfragile.studies.judgebias.metrics.pairwise_bias_intervals`; 0.5 = no bias). ``planted``: judge ->
    what its training planted, shown with its name."""
    planted = planted or {}
    judges = list(dict.fromkeys([*bd["judge"], *(pairwise["judge"] if len(pairwise) else [])]))
    labels = [f"{j}\n(planted: {planted.get(j) or 'none'})" for j in judges]
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 0.75 * len(judges) + 2.2), layout="constrained")
    panels = ((axes[0], bd, "perturbation", list(perturbations), "excess", 0.0,
               "BD above its run-to-run floor (image-side perturbations)"),
              (axes[1], pairwise, "measure", ["verbose_preference", "first_position_rate"], "value", 0.5,
               "share of pairwise verdicts (0.5 = no bias)"))
    colors = ["#c0504d", "#2f7ebc", "#e29a2d", "#6a9a3a"]
    for ax, frame, key, keys, col, ref, xlabel in panels:
        low, high = (f"{col}_low", f"{col}_high") if col == "excess" else ("ci_low", "ci_high")
        for k, (name, color) in enumerate(zip(keys, colors)):
            sub = frame[frame[key] == name].set_index("judge") if len(frame) else frame
            for i, j in enumerate(judges):
                if j not in sub.index:
                    continue
                r = sub.loc[j]
                y = i + (k - (len(keys) - 1) / 2) * 0.22
                ax.errorbar(r[col], y, xerr=[[r[col] - r[low]], [r[high] - r[col]]], fmt="o", color=color, capsize=3,
                            label=SHORT_NAMES.get(name, name.replace("_", " ")) if i == 0 else None)
        ax.axvline(ref, color="#555555", ls="--", lw=1)
        ax.set_yticks(range(len(judges)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel, fontsize=9)
        ax.grid(axis="x", color="#ececec")
        ax.legend(fontsize=7.5, loc="best", frameon=False)
        sns.despine(ax=ax)
    axes[1].set_xlim(-0.02, 1.02)
    fig.suptitle(title or "Planted biases and what the metrics find (95 % bootstrap intervals over samples)",
                 fontsize=11, fontweight="bold")
    return stamp_note(fig, note)


# ------------------------------------------------------------------------------------------- abstention / inputs
def plot_abstention_ratio(ratios: pd.DataFrame, *, note: str | None = None, title: str | None = None) -> Figure:
    """Table 15: the N/A ratio per judge (rows) and bias type / aggregate (columns), 0-1."""
    values = ratios.to_numpy(float)
    fig, ax = plt.subplots(figsize=(10, max(2.6, 1 + 0.3 * len(ratios))), layout="constrained")
    im = ax.imshow(values, cmap="Purples", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(ratios.shape[1]), [SHORT_NAMES.get(c, c.capitalize()) for c in ratios.columns], rotation=30,
                  ha="right", fontsize=8)
    ax.set_yticks(range(len(ratios)), ratios.index, fontsize=8.5)
    for (i, k), val in np.ndenumerate(values):
        ax.text(k, i, f"{val:.2f}", ha="center", va="center", fontsize=7, color="white" if val > 0.5 else "black")
    fig.colorbar(im, ax=ax, shrink=0.8, label="N/A ratio")
    ax.set_title(title or "Table 15 - abstention ratio per bias type (N/A-enabled setting)", fontsize=10.5)
    return stamp_note(fig, note)


def plot_perturbed_inputs(conditions: Sequence[tuple[str, object]], *, note: str | None = None,
                          title: str | None = None) -> Figure:
    """One sample under each condition as the judge receives it: ``conditions`` is ``(perturbation, sample)``
    pairs (:class:`~mmfragile.studies.judgebias.data.JudgeSample`); its picture, the perturbation and the query."""
    cols = (len(conditions) + 1) // 2
    fig, axes = plt.subplots(2, cols, figsize=(2.6 * cols, 6.4), layout="constrained", squeeze=False)
    for ax, (condition, sample) in zip(axes.flat, conditions):
        if sample.images:
            ax.imshow(sample.images[0])
        ax.set_title(condition.replace("_", " "), fontsize=8.5)
        query = sample.query if len(sample.query) < 70 else sample.query[:67] + "..."
        ax.set_xlabel(query or "(empty query)", fontsize=6.5, wrap=True)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in list(axes.flat)[len(conditions):]:
        ax.axis("off")
    first = conditions[0][1] if conditions else None
    fig.suptitle(title or (f"Perturbed inputs of {first.sample_id} (response: {first.response!r})" if first else ""),
                 fontsize=10)
    return stamp_note(fig, note)
