"""Figures of the Promptception study (Figs. 4, 5/6, 9/10, 11, 12, 23 of the paper).

Every function takes the DataFrame produced by the matching function of
:mod:`mmfragile.studies.promptception.metrics` and returns a matplotlib Figure (Agg backend, nothing shown).
``note`` is stamped as a small grey footer (used to mark figures made with the random-weight model).
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from mmfragile.studies.promptception.metrics import (  # noqa: E402

    CATEGORY_NAMES,
    MODELS,
    PROPRIETARY_MODELS,
    SUPERCATEGORY_OF_CATEGORY,
    prompt_category,
    prompt_sort_key,
)
from mmfragile.figures import save_figure, stamp_note  # noqa: E402,F401  (save_figure re-exported)


def _category_colors() -> dict[int, tuple]:
    """One colour per category: a hue family per supercategory, shades within it."""
    families = {1: "Blues", 2: "Oranges", 3: "Greens", 4: "Purples", 5: "Reds", 6: "YlOrBr"}
    out: dict[int, tuple] = {}
    for sc, fam in families.items():
        cats = [c for c, s in SUPERCATEGORY_OF_CATEGORY.items() if s == sc]
        shades = sns.color_palette(fam, len(cats) + 1)[1:]
        for c, col in zip(cats, shades):
            out[c] = col
    return out


#: One colour per category (1..15), shared by all figures; categories of a supercategory share a hue.
CATEGORY_COLORS: dict[int, tuple] = _category_colors()
GROUP_COLORS = {"open-source": "#4C72B0", "proprietary": "#DD8452"}




def _short(cat: int, width: int = 22) -> str:
    name = CATEGORY_NAMES.get(int(cat), str(cat))
    name = name.replace(" Prompts", "").replace(" (CoT) Prompt", " (CoT)").replace("Formatting Variations in Choice Presentation", "Choice Formatting")
    return f"{cat}. {name}" if len(name) <= width else f"{cat}. {name[: width - 1]}…"


def _model_order(models) -> list[str]:
    known = [m for m in MODELS if m in set(models)]
    return known + sorted(set(models) - set(known))


def _category_legend(ax, cats, loc="upper left", ncol=3, **kw):
    handles = [Patch(color=CATEGORY_COLORS[c], label=_short(c, 30)) for c in sorted(cats)]
    return ax.legend(handles=handles, loc=loc, ncol=ncol, fontsize=7, frameon=True, title="Category",
                     title_fontsize=8, **kw)


# --------------------------------------------------------------------------------------------------

def plot_category_std_heatmap(
    fig4_df: pd.DataFrame,
    threshold: float | None = None,
    title: str = "Std of prompt accuracies within each category (averaged over benchmarks)",
    vmax: float | None = None,
    note: str | None = None,
) -> plt.Figure:
    """Fig. 4: heatmap model x category of :func:`average_category_std`.

    Cells are annotated with their value; the colour scale is capped at ``vmax`` (default: the 95th
    percentile) so that extreme cells (Gemini on 9.x) do not wash out the rest. Cells above ``threshold``
    are printed in bold. A line separates open-source from proprietary models.
    """
    w = fig4_df.pivot_table(index="model", columns="category", values="std", aggfunc="mean")
    w = w.loc[_model_order(w.index)]
    w = w[sorted(w.columns)]
    if vmax is None:
        vals = w.to_numpy()[~np.isnan(w.to_numpy())]
        vmax = float(np.percentile(vals, 95)) if len(vals) else 1.0
    fig, ax = plt.subplots(figsize=(1.0 + 0.62 * w.shape[1], 1.4 + 0.45 * w.shape[0]))
    sns.heatmap(w, ax=ax, cmap="YlOrRd", vmin=0, vmax=vmax, annot=False, linewidths=0.5, linecolor="white",
                cbar_kws={"label": "std of accuracy (pp)", "extend": "max", "shrink": 0.8})
    for i, m in enumerate(w.index):
        for j, c in enumerate(w.columns):
            v = w.iat[i, j]
            if np.isnan(v):
                continue
            bold = threshold is not None and v > threshold
            ax.text(j + 0.5, i + 0.5, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    fontweight="bold" if bold else "normal", color="white" if v > 0.6 * vmax else "0.1")
    n_open = sum(m not in PROPRIETARY_MODELS for m in w.index)
    if 0 < n_open < len(w.index):
        ax.axhline(n_open, color="0.2", lw=1.5)
    ax.set_xticks(np.arange(w.shape[1]) + 0.5)
    ax.set_xticklabels([_short(c, 30) for c in w.columns], rotation=40, ha="right", fontsize=8)
    ax.set_xlabel("Prompt category")
    ax.set_ylabel("")
    ax.tick_params(axis="y", labelsize=8)
    sub = f"  (bold: > threshold {threshold:.2f})" if threshold is not None else ""
    ax.set_title(title + sub, fontsize=10)
    fig.tight_layout()
    return stamp_note(fig, note)


def plot_average_pra(
    avg_df: pd.DataFrame,
    title: str = "Average PRA per prompt type",
    clip_low: float | None = None,
    note: str | None = None,
) -> plt.Figure:
    """Figs. 5/6: average PRA (Eq. 2) per prompt type from :func:`average_pra`, bars drawn from the
    baseline (100 %) and coloured by category. Bars below ``clip_low`` are cut there and labelled with
    their real value (the paper caps 9.2 for proprietary models the same way)."""
    df = avg_df.dropna(subset=["pra"]).copy()
    df = df.iloc[sorted(range(len(df)), key=lambda i: prompt_sort_key(str(df.prompt_id.iat[i])))]
    cats = df.prompt_id.map(prompt_category)
    x = np.arange(len(df))
    shown = df.pra.to_numpy(dtype=float)
    if clip_low is not None:
        shown = np.maximum(shown, clip_low)
    fig, ax = plt.subplots(figsize=(max(8, 0.22 * len(df) + 2), 4.6))
    bars = ax.bar(x, shown - 100, bottom=100, color=[CATEGORY_COLORS[c] for c in cats], edgecolor="0.3",
                  linewidth=0.3)
    if clip_low is not None:
        for b, real in zip(bars, df.pra):
            if real < clip_low:
                b.set_hatch("///")
    ax.axhline(100, color="0.15", lw=1)
    for xi, real, s in zip(x, df.pra, shown):
        if clip_low is not None and real < clip_low:
            ax.text(xi, s - 0.3, f"{real:.0f}", ha="center", va="top", fontsize=7, color="firebrick",
                    rotation=90)
    ax.set_xticks(x)
    ax.set_xticklabels(df.prompt_id, rotation=90, fontsize=7)
    ax.set_xlim(-0.7, len(df) - 0.3)
    lo, hi = float(np.min(shown)), float(np.max(shown))
    pad = 0.08 * max(hi - lo, 1)
    ax.set_ylim(min(lo, 100) - pad - (1.5 if clip_low is not None and (df.pra < clip_low).any() else 0),
                max(hi, 100) + pad)
    ax.set_ylabel("PRA w.r.t. baseline (%)")
    ax.set_xlabel("Prompt type")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    # separators between categories
    bounds = np.flatnonzero(np.diff(cats.to_numpy())) + 0.5
    for b in bounds:
        ax.axvline(b, color="0.85", lw=0.6, zorder=0)
    _category_legend(ax, set(cats), loc="upper left", ncol=5, bbox_to_anchor=(0, -0.2))
    fig.tight_layout()
    return stamp_note(fig, note)


def plot_best_worst(
    bw_df: pd.DataFrame,
    title: str = "Best and worst prompt per category (mean PRAD)",
    clip_low: float | None = None,
    note: str | None = None,
) -> plt.Figure:
    """Figs. 9/10: best and worst prompt of each category by mean PRAD (Eq. 3), from
    :func:`best_worst_per_category`. Horizontal bars, labelled with the prompt id (and the real value when
    cut at ``clip_low``)."""
    df = bw_df.sort_values("category")
    y = np.arange(len(df))
    h = 0.38
    best = df.best_prad.to_numpy(float)
    worst = df.worst_prad.to_numpy(float)
    wshown = np.maximum(worst, clip_low) if clip_low is not None else worst
    fig, ax = plt.subplots(figsize=(8.5, 0.42 * len(df) + 1.6))
    ax.barh(y - h / 2, best, height=h, color="#55A868", label="best prompt")
    ax.barh(y + h / 2, wshown, height=h, color="#C44E52", label="worst prompt")
    span = max(np.nanmax(np.abs(np.r_[best, wshown])), 0.5)
    off = 0.02 * span
    for yi, b, pb, w, ws, pw in zip(y, best, df.best_prompt, worst, wshown, df.worst_prompt):
        ax.text(b + (off if b >= 0 else -off), yi - h / 2, pb, va="center", ha="left" if b >= 0 else "right", fontsize=7)
        if w == ws:
            ax.text(ws + (off if ws >= 0 else -off), yi + h / 2, pw, va="center",
                    ha="left" if ws >= 0 else "right", fontsize=7)
        else:  # bar cut at clip_low: label inside the bar with the real value
            ax.text(ws + off, yi + h / 2, f"{pw} (real {w:.1f}, cut)", va="center", ha="left", fontsize=7,
                    color="white", fontweight="bold")
    ax.axvline(0, color="0.15", lw=1)
    ax.set_yticks(y)
    ax.set_yticklabels([_short(c, 34) for c in df.category], fontsize=8)
    ax.invert_yaxis()
    lo = min(0, np.nanmin(np.r_[best, wshown]))
    hi = max(0, np.nanmax(np.r_[best, wshown]))
    ax.set_xlim(lo - 0.18 * span, hi + 0.18 * span)
    ax.set_xlabel("Mean PRAD w.r.t. baseline (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return stamp_note(fig, note)


def plot_accuracy_across_prompts(
    acc_df: pd.DataFrame,
    benchmark: str = "MMStar",
    title: str | None = None,
    note: str | None = None,
) -> plt.Figure:
    """Fig. 11: accuracy of every model across the prompt types on one benchmark (lines + markers),
    categories shaded alternately, the baseline (1.1) marked."""
    df = acc_df[(acc_df.benchmark == benchmark) & (acc_df.prompt_id.astype(str) != "baseline")].copy()
    df["prompt_id"] = df.prompt_id.astype(str)
    prompts = sorted(df.prompt_id.unique(), key=prompt_sort_key)
    pos = {p: i for i, p in enumerate(prompts)}
    models = _model_order(df.model.unique())
    palette = dict(zip(models, sns.color_palette("tab10", len(models))))
    fig, ax = plt.subplots(figsize=(max(9, 0.2 * len(prompts) + 3), 5))
    cats = [prompt_category(p) for p in prompts]
    start = 0
    for i in range(1, len(prompts) + 1):
        if i == len(prompts) or cats[i] != cats[start]:
            if cats[start] % 2 == 0:
                ax.axvspan(start - 0.5, i - 0.5, color="0.94", zorder=0)
            ax.text((start + i - 1) / 2, 1.005, str(cats[start]), transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7, color="0.35")
            start = i
    for m in models:
        g = df[df.model == m].sort_values("prompt_id", key=lambda s: s.map(pos))
        ls = "--" if m in PROPRIETARY_MODELS else "-"
        ax.plot(g.prompt_id.map(pos), g.accuracy, ls, marker="o", ms=2.5, lw=1.1, color=palette[m], label=m)
    if "1.1" in pos:
        ax.axvline(pos["1.1"], color="0.3", lw=0.8, ls=":")
    ax.set_xticks(range(len(prompts)))
    ax.set_xticklabels(prompts, rotation=90, fontsize=6.5)
    ax.set_xlim(-0.7, len(prompts) - 0.3)
    ax.set_ylabel("Accuracy (%)")
    ax.set_xlabel("Prompt type (category number on top; dashed = proprietary)")
    ax.set_title(title or f"Accuracy across prompt types on {benchmark}", fontsize=10, pad=14)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8, frameon=False)
    fig.tight_layout()
    return stamp_note(fig, note)


def plot_model_sensitivity(
    sens_df: pd.DataFrame,
    title: str = "Model sensitivity across prompts (averaged over benchmarks)",
    note: str | None = None,
) -> plt.Figure:
    """Fig. 12: per model, mean accuracy over prompts (bars, with ±std whiskers) and the std itself
    (right panel), from :func:`model_sensitivity`; coloured open-source / proprietary."""
    df = sens_df.copy()
    df = df.set_index("model").loc[_model_order(df.model)].reset_index()
    colors = [GROUP_COLORS.get(g, "0.5") for g in df.group]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 0.42 * len(df) + 1.8), sharey=True,
                                 gridspec_kw={"width_ratios": [1.6, 1]})
    y = np.arange(len(df))
    a1.barh(y, df.mean_accuracy, xerr=df["std"], color=colors, edgecolor="0.3", lw=0.4,
            error_kw={"elinewidth": 1, "capsize": 3, "ecolor": "0.2"})
    for yi, v in zip(y, df.mean_accuracy):
        a1.text(1, yi, f"{v:.1f}", va="center", ha="left", fontsize=7, color="white", fontweight="bold")
    a1.set_yticks(y)
    labels = list(df.model)
    if "n_benchmarks" in df.columns:
        nmax = int(df.n_benchmarks.max())
        labels = [m if n == nmax else f"{m}\n({n} benchmark{'s' if n > 1 else ''})"
                  for m, n in zip(df.model, df.n_benchmarks)]
    a1.set_yticklabels(labels, fontsize=8)
    a1.invert_yaxis()
    a1.set_xlabel("Mean accuracy over prompts (%) ± std")
    a2.barh(y, df["std"], color=colors, edgecolor="0.3", lw=0.4)
    for yi, v in zip(y, df["std"]):
        a2.text(v + 0.05, yi, f"{v:.2f}", va="center", fontsize=7)
    a2.set_xlabel("Std of accuracy over prompts (pp)")
    a2.set_xlim(0, float(df["std"].max()) * 1.2 + 0.1)
    for a in (a1, a2):
        a.grid(axis="x", alpha=0.3)
        a.set_axisbelow(True)
    handles = [Patch(color=c, label=g) for g, c in GROUP_COLORS.items() if g in set(df.group)]
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.01))
    return stamp_note(fig, note)


def plot_std_distribution(
    std_df: pd.DataFrame,
    threshold: float | None = None,
    xmax: float | None = None,
    title: str = "Distribution of within-category std values",
    note: str | None = None,
) -> plt.Figure:
    """Fig. 23 (App. K): histogram of the category std values (:func:`category_std`), stacked by model
    group, with the median (the sensitivity threshold) marked. Values above ``xmax`` (default: the
    97th percentile, at least 3x the median) are collected in the last bin and counted in the legend."""
    df = std_df.dropna(subset=["std"]).copy()
    df["group"] = np.where(df.model.isin(PROPRIETARY_MODELS), "proprietary", "open-source")
    med = float(np.median(df["std"])) if threshold is None else float(threshold)
    if xmax is None:
        xmax = max(float(np.percentile(df["std"], 97)), 3 * med, 0.5)
    n_over = int((df["std"] > xmax).sum())
    df["shown"] = df["std"].clip(upper=xmax)
    bins = np.linspace(0, xmax * 1.0001, 31)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    sns.histplot(df, x="shown", hue="group", bins=bins, multiple="stack", palette=GROUP_COLORS, ax=ax,
                 edgecolor="white", linewidth=0.4, hue_order=[g for g in GROUP_COLORS if g in set(df.group)])
    ax.axvline(med, color="firebrick", lw=1.6, ls="--")
    ax.text(med, ax.get_ylim()[1] * 0.97, f" median = {med:.3f}", color="firebrick", va="top", ha="left", fontsize=9)
    if n_over:
        ax.text(xmax, ax.get_ylim()[1] * 0.85, f"{n_over} values > {xmax:.1f}\n(in last bin)  ", ha="right",
                va="top", fontsize=8, color="0.3")
    ax.set_xlabel("Std of prompt accuracies within a category (pp)")
    ax.set_ylabel("Count (model × category × benchmark)")
    ax.set_title(title + f"  (n = {len(df)})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    fig.tight_layout()
    return stamp_note(fig, note)


def plot_planted_sensitivity(category_prad: pd.DataFrame, groups: pd.DataFrame, categories: dict[str, tuple],
                             note: str | None = None, title: str | None = None) -> plt.Figure:
    """A model with planted prompt sensitivity next to what the metrics find. Left: mean PRAD (Eq. 3) of each
    category's prompts (``category_prad``: ``category, prad``), coloured by the group ``categories`` puts it in
    (e.g. trained / held out); right: each group's accuracy minus the baseline prompt's, and the trimmed mean's,
    with 95 % bootstrap intervals over questions (``groups``:
    :func:`~mmfragile.studies.promptception.metrics.group_intervals`)."""
    palette = dict(zip(categories, ["#2f7ebc", "#c0504d", "#6a9a3a", "#e29a2d"]))
    group_of = {c: g for g, cats in categories.items() for c in cats}
    cp = category_prad.sort_values("category")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained", width_ratios=[1.6, 1])
    ax.bar(range(len(cp)), cp["prad"], color=[palette.get(group_of.get(int(c)), "#999999") for c in cp["category"]])
    ax.set_xticks(range(len(cp)), [str(int(c)) for c in cp["category"]])
    ax.axhline(0, color="#555555", lw=1)
    ax.set_xlabel("prompt category")
    ax.set_ylabel("mean PRAD vs baseline prompt (%)")
    ax.legend(handles=[Patch(color=col, label=g.replace("_", " ")) for g, col in palette.items()], frameon=False,
              fontsize=8)
    rows = groups[groups["statistic"] != "baseline"].reset_index(drop=True)
    for i, r in rows.iterrows():
        ax_color = palette.get(r["statistic"], "#444444")
        bx.errorbar(r["diff"], i, xerr=[[r["diff"] - r["diff_low"]], [r["diff_high"] - r["diff"]]], fmt="o",
                    color=ax_color, capsize=3)
    bx.set_yticks(range(len(rows)), [f"{s.replace('_', ' ')} ({n} prompts)" for s, n in
                                     zip(rows["statistic"], rows["n_prompts"])], fontsize=8.5)
    bx.invert_yaxis()
    bx.axvline(0, color="#555555", ls="--", lw=1)
    bx.set_xlabel("accuracy minus baseline prompt (points)")
    for a in (ax, bx):
        a.grid(axis="y" if a is ax else "x", color="#ececec")
        sns.despine(ax=a)
    fig.suptitle(title or "Planted prompt sensitivity and what PRAD / the trimmed mean find (95 % intervals over "
                 "questions)", fontsize=11, fontweight="bold")
    return stamp_note(fig, note)
