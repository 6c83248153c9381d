"""Study 1's section of the fragility report (:func:`mmfragile.report.build_report`): accuracy over the 48
formats beside the standard format, coverage by factor level, model ranking, the mixed model of the format factors
and budgeted grids. Numbers come from :mod:`mmfragile.studies.format_bias.metrics`.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import pandas as pd

from mmfragile.report.build import (Cell, Doc, Paragraph, ReportOptions, Section, Table, add_figure, boot_ratio,
                                    boot_weights, budget_block, distribution_figure, finite, floor_block, interval,
                                    metric_key,
                                    of_group, of_groups, outcome_matrix, ranking_tables, read_stores, stats_row, txt,
                                    variant_statistics)
from mmfragile.store import ResultStore


def grid_section(doc: Doc, stores: list[ResultStore], n_boot: int, seed: int, level: float,
                 budget_draws: int | None) -> tuple[Section | None, list[dict]]:
    """Study 1's section: the complete grids' scores, coverage, ranking and mixed model, then the budgeted grids."""
    from mmfragile.studies.format_bias import analysis as fbs
    from mmfragile.studies.format_bias import metrics as fb

    raw = read_stores(stores)
    if raw.empty:
        return None, []
    sec = Section("format-bias", "Study 1 - prompt-format bias in MC-VQA")
    pq = fbs.results_to_metrics_frame(raw, include_standard=True)
    grid = fbs.grid_rows(pq)
    complete, budgeted = _complete_and_budgeted(grid, pq)
    how: list[dict] = []
    if complete:
        scores = fb.format_scores(of_groups(grid, set(complete)))
        how = _scores_block(doc, sec, grid, pq, scores, complete, n_boot, seed, level)
        _coverage_block(doc, sec, scores, complete, how)
        _ranking_block(doc, sec, grid, scores, complete, how, n_boot, seed, level)
        _lmm_block(doc, sec, scores, level, how)
    if budgeted:
        budget_block(doc, sec, of_groups(raw, set(budgeted)), "format-bias", "formats", "format", budget_draws, how)
    return sec, how


def _format_names(df: pd.DataFrame) -> pd.Series:
    """Each row's format as ``<option IDs>-<delimiter>-<separator>``."""
    return df["option_ids"].astype(str) + "-" + df["delimiter"].astype(str) + "-" + df["separator"].astype(str)


def _complete_and_budgeted(grid: pd.DataFrame, pq: pd.DataFrame) -> tuple[list, list]:
    """The (model, dataset) groups whose every question has every format x shift, and the others (budgeted)."""
    complete, budgeted = [], []
    for m, ds in dict.fromkeys(zip(pq["model"].astype(str), pq["dataset"].astype(str))):
        g = of_group(grid, m, ds)
        n_fmt = g["format"].nunique()
        per_q = g.groupby("question_id")["n_options"].agg(["size", "first"])
        (budgeted if (per_q["size"] < n_fmt * per_q["first"]).any() else complete).append((m, ds))
    return complete, budgeted


def _scores_block(doc: Doc, sec: Section, grid: pd.DataFrame, pq: pd.DataFrame, scores: pd.DataFrame,
                  complete: list, n_boot: int, seed: int, level: float) -> list[dict]:
    """The accuracy table (standard format beside the distribution over formats) and its two figures; returns
    the how-to-report entry of each group."""
    from mmfragile.studies.format_bias import metrics as fb
    from mmfragile.studies.format_bias import plots as fbp

    rows, dist_groups, how = [], [], []
    for m, ds in complete:
        row, dist, h = _scores_row(doc, m, ds, of_group(grid, m, ds), of_group(scores, m, ds),
                                   of_groups(pq, {(m, ds)}), n_boot, seed, level)
        rows.append(row)
        dist_groups.append(dist)
        how.append(h)
    sec.blocks.append(Table(doc.uid("formats-scores"), "Accuracy (%): standard format beside the distribution over formats",
                            ["model", "dataset", "questions", "formats", "standard format", "mean", "median", "IQR",
                             "worst 5 %", "spread (max-min)", "best format", "worst format",
                             "standard - mean (pp)"], rows,
                            note=f"[{int(level * 100)} % bootstrap interval over questions, {n_boot} draws, seed "
                                 f"{seed}; all circular shifts of a question drawn together.] Standard format: the "
                                 "'standard' variant where it was run, else the dataset's standard format in the "
                                 "grid (Tab. 5). Accuracy per format = circular evaluation (each shift counts)."))
    for (m, ds), h in zip(complete, how):
        group = of_group(scores, m, ds)
        floor_block(doc, sec, "formats", m, ds, "format", _format_names(group).tolist(), group["accuracy"], h)
    add_figure(doc, sec, "formats-distribution", "Accuracy over prompt formats",
               lambda: distribution_figure(dist_groups, "accuracy (%)", "Accuracy over the prompt formats "
                                           "(one dot per format)", "standard format"),
               "Quote the distribution (mean, IQR, worst 5 %), not the best format.")
    add_figure(doc, sec, "formats-ci", "Accuracy per format with bootstrap intervals",
               lambda: fbp.plot_format_accuracy_ci(fb.format_accuracy_ci(of_groups(grid, set(complete)), level=level,
                                                                         n_boot=n_boot, seed=seed)))
    return how


def _scores_row(doc: Doc, m: str, ds: str, g: pd.DataFrame, s: pd.DataFrame, pq_group: pd.DataFrame,
                n_boot: int, seed: int, level: float) -> tuple[list, dict, dict]:
    """One group's row of the accuracy table, its distribution for the figure and its how-to-report entry."""
    from mmfragile.studies.format_bias import analysis as fbs

    st = fbs.standard_rows(pq_group)
    fmt_names = _format_names(s).tolist()
    g = g.assign(_fmt=_format_names(g))
    questions = sorted(g["question_id"].astype(str).unique())
    hits, n = outcome_matrix(g, "_fmt", questions, fmt_names)
    W = boot_weights(len(questions), n_boot, seed)
    B = boot_ratio(W, hits, n)                                        # boot x formats
    point = variant_statistics(s["accuracy"].to_numpy())
    boot = variant_statistics(B, axis=1)
    prefix = metric_key("formats", m, ds)
    std_acc = float(st["correct"].mean() * 100) if len(st) else float("nan")
    if len(st):
        sh, sn = outcome_matrix(st.assign(_v="standard"), "_v", questions, ["standard"])
        std_boot = boot_ratio(W, sh, sn)[:, 0]
    else:
        std_boot = np.full(n_boot, np.nan)
    ibest, iworst = int(np.argmax(s["accuracy"].to_numpy())), int(np.argmin(s["accuracy"].to_numpy()))
    lo, hi = interval(std_boot, level)
    gap_lo, gap_hi = interval(std_boot - boot["mean"], level)
    row = [txt(m), txt(ds), doc.count(f"{prefix}/n_questions", len(questions)),
           doc.count(f"{prefix}/n_formats", len(fmt_names)), doc.ci(f"{prefix}/standard", std_acc, lo, hi, cls="std")]
    row += stats_row(doc, prefix, point, boot, level)
    row += [Cell([doc.span(f"{prefix}/max", point["max"]), (f" ({fmt_names[ibest]})", None, None)]),
            Cell([doc.span(f"{prefix}/min", point["min"]), (f" ({fmt_names[iworst]})", None, None)]),
            doc.ci(f"{prefix}/standard_minus_mean", std_acc - point["mean"], gap_lo, gap_hi)]
    for k in ("q25", "q75"):
        doc.put(f"{prefix}/{k}", point[k])
    dist = {"label": f"{m}\n{ds}", "values": s["accuracy"].to_numpy(),
            "standard": None if math.isnan(std_acc) else std_acc}
    how = {"kind": "formats", "grid": True, "unit": "format", "standard_label": "standard format",
           "standard_key": f"{prefix}/standard", "standard_gap": True,
           "model": m, "dataset": ds, "prefix": prefix, "n_variants": len(fmt_names),
           "best_name": fmt_names[ibest], "standard_is_variant": bool(st["is_standard"].any()) if len(st) else False}
    return row, dist, how


def _coverage_block(doc: Doc, sec: Section, scores: pd.DataFrame, complete: list, how: list[dict]) -> None:
    """Coverage by factor level (red below the collapse threshold), the collapses named, and its heatmap."""
    from mmfragile.studies.format_bias import metrics as fb
    from mmfragile.studies.format_bias import plots as fbp

    cov = fb.coverage_by_factor(scores)
    levels = [(f, l) for f in fb.FACTORS for l in fb.LEVELS[f] if ((cov["factor"] == f) & (cov["level"] == l)).any()]
    crow, collapses = [], []
    for m, ds in complete:
        c = of_group(cov, m, ds).set_index(["factor", "level"])
        r = [txt(m), txt(ds)]
        for f, l in levels:
            v = c["coverage"].get((f, l), np.nan)
            low = finite(v) is not None and v < fb.COVERAGE_THRESHOLD
            r.append(doc.num(metric_key("coverage", m, ds, f, l), v, 0, cls="collapse" if low else ""))
            if low:
                collapses.append(f"{m} / {ds}: {fb.FACTOR_LABELS[f]} = {fb.LEVEL_LABELS.get(l, l)} ({v:.0f} %)")
        crow.append(r)
    sec.blocks.append(Table(doc.uid("formats-coverage"), "Coverage (%) by factor level: where answers stop being option IDs",
                            ["model", "dataset"] + [f"{fb.FACTOR_LABELS[f].replace('Option ', '')}: "
                                                    f"{fb.LEVEL_LABELS.get(l, l)}" for f, l in levels], crow,
                            note=f"Mean coverage over the formats with that level (coverage_by_factor). Red: below "
                                 f"{fb.COVERAGE_THRESHOLD:.0f} % (a collapse: accuracy there measures instruction "
                                 "following, not the task)."))
    sec.blocks.append(Paragraph([txt("Coverage collapses: " + ("; ".join(collapses) if collapses else
                                                                f"none (every factor level >= {fb.COVERAGE_THRESHOLD:.0f} %)."))]))
    for h in how:
        h["collapses"] = [c for c in collapses if c.startswith(f"{h['model']} / {h['dataset']}:")]
    add_figure(doc, sec, "formats-coverage", "Coverage per factor level", lambda: fbp.plot_coverage_heatmap(cov))


def _ranking_block(doc: Doc, sec: Section, grid: pd.DataFrame, scores: pd.DataFrame, complete: list,
                   how: list[dict], n_boot: int, seed: int, level: float) -> None:
    """Per dataset with two or more models: the ranking tables over formats, then the rank figure."""
    from mmfragile.studies.format_bias import metrics as fb
    from mmfragile.studies.format_bias import plots as fbp

    ranks = fb.format_ranks(scores)
    rd = fb.rank_distribution(ranks)
    pg = fb.pseudo_gt(scores)
    for ds in dict.fromkeys(d for _, d in complete):
        ms = [m for m, d in complete if d == ds]
        if len(ms) < 2:
            continue
        r_ds = ranks[ranks["dataset"].astype(str) == ds]
        unit_rank = pd.DataFrame({"unit": _format_names(r_ds), "model": r_ds["model"].astype(str), "rank": r_ds["rank"]})
        per_model = {}
        for m in ms:
            g = of_group(grid, m, ds)
            per_model[m] = {"frame": g.assign(_fmt=_format_names(g)), "variant": "_fmt"}
        pg_ds = pg[pg["dataset"].astype(str) == ds]
        res = ranking_tables(doc, sec, "formats", ds, per_model, "format", n_boot, seed, level, unit_rank,
                             dict(zip(pg_ds["model"].astype(str), pg_ds["rank"].astype(int))),
                             rd[rd["dataset"].astype(str) == ds])
        for h in how:
            if h["dataset"] == ds and h["model"] in res:
                h["ranking"] = res
    if any(len([m for m, d in complete if d == ds]) > 1 for ds in {d for _, d in complete}):
        add_figure(doc, sec, "formats-ranks", "Model ranks across formats",
                   lambda: fbp.plot_rank_distribution(ranks, include_ideal=False))


def _lmm_block(doc: Doc, sec: Section, scores: pd.DataFrame, level: float, how: list[dict]) -> None:
    """The mixed model of the format factors: its coefficients, the significant ones named, and their figure."""
    from mmfragile.studies.format_bias import analysis as fbs
    from mmfragile.studies.format_bias import metrics as fb
    from mmfragile.studies.format_bias import plots as fbp

    try:
        lmm = fbs.fit_lmm_with_fallback(scores, alpha=1 - level)
    except (ValueError, KeyError) as e:
        sec.blocks.append(Paragraph([txt(f"Mixed model not fitted: {e}")]))
        return
    lrow, sig = [], []
    for t in lmm.itertuples():
        base = metric_key("lmm", t.factor, t.level or "intercept")
        name = "intercept" if t.factor == "intercept" else f"{fb.FACTOR_LABELS.get(t.factor, t.factor)}: {fb.LEVEL_LABELS.get(t.level, t.level)}"
        lrow.append([txt(name), doc.ci(f"{base}/coef", t.coef, t.ci_low, t.ci_high, 2),
                     doc.num(f"{base}/p_value", t.p_value, 4), txt("yes" if t.significant else "no")])
        if t.significant and t.factor != "intercept":
            sig.append((name, base, t.coef))
    fb_reason = lmm.attrs.get("fallback")
    sec.blocks.append(Table(doc.uid("formats-lmm"), "Mixed model: accuracy ~ option IDs + delimiter + separator + (1 | model:dataset)",
                            ["term (vs lowercase / bracket / comma)", f"coefficient, pp [{int(level * 100)} % CI]",
                             "p", f"significant (p < {1 - level:.2f})"], lrow,
                            note=f"{lmm.attrs.get('method', '')}; {lmm.attrs.get('n_groups')} model x dataset group(s), "
                                 f"{lmm.attrs.get('n_obs')} format scores"
                                 + (f"; fallback to pooled OLS: {fb_reason}" if fb_reason else "")))
    sec.blocks.append(Paragraph([Cell([("Significant factors: ", None, None)] + (
        [p for k, (name, base, coef) in enumerate(sig) for p in
         ([(", ", None, None)] if k else []) + [(f"{name} (", None, None), doc.span(f"{base}/coef", coef, 2),
                                                 (" pp)", None, None)]]
        if sig else [("none at this sample size.", None, None)]))]))
    for h in how:
        h["lmm_sig"] = sig
    add_figure(doc, sec, "formats-lmm", "Mixed-model coefficients", lambda: fbp.plot_lmm_coefficients(lmm))




def report(doc: Doc, stores: Mapping[str, list[ResultStore]], opts: ReportOptions) -> tuple[Section | None, list[dict]]:
    """Study 1's report section, from its grid stores (CP-LN stores are listed under provenance)."""
    return grid_section(doc, stores.get("grid", []), opts.n_boot, opts.seed, opts.level, opts.budget_draws)
