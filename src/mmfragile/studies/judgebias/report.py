"""Study 3's section of the fragility report (:func:`mmfragile.report.build_report`): BD / BC per judge and
perturbation with bootstrap intervals over samples, parse failures, and the pairwise judgments' parse
failures. Numbers come from :mod:`mmfragile.studies.judgebias.metrics`.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from mmfragile.report.build import (Cell, Doc, Paragraph, ReportOptions, Section, Table, add_figure, boot_weights,
                                    finite, how_value, interval, metric_key, read_stores, txt)
from mmfragile.store import ResultStore


def judge_section(doc: Doc, score_stores: list[ResultStore], pair_stores: list[ResultStore], n_boot: int, seed: int,
                  level: float) -> tuple[Section | None, list[dict]]:
    from mmfragile.studies.judgebias import metrics as jm
    from mmfragile.studies.judgebias import analysis as jb

    rows = read_stores(score_stores)
    if rows.empty:
        return None, []
    jt = jb.judgment_table(rows)
    if jt.empty:
        return None, []
    sec = Section("judgebias", "Study 3 - MM-JudgeBias: judge perturbations")
    bs = jm.bias_scores(jt)
    pairs = jm.paired_scores(jt)
    pf = jb.parse_failure_table(jb.main_rows(rows[rows["prompt_variant"] == "original"])
                                if "prompt_variant" in rows else jb.main_rows(rows), by=("judge", "perturbation"))
    pf_idx = pf.set_index(["judge", "perturbation"]) if len(pf) else None
    how: list[dict] = []
    unparsed: list[str] = []       # judges without one BD / BC value: no judgment pair parsed
    for judge, g in bs.groupby("judge", sort=False):
        trows, vals = [], {}
        for t in g.itertuples():
            p = pairs[(pairs["judge"] == judge) & (pairs["perturbation"] == t.perturbation) & (pairs["status"] == "ok")]
            terms = (jm.bd_terms(p["y"], p["y_hat"]) if t.metric == "BD" else jm.bc_terms(p["y"], p["y_hat"]))
            d = pd.DataFrame({"s": p["sample_id"].astype(str).to_numpy(), "t": np.nan_to_num(terms),
                              "n": (~np.isnan(terms)).astype(float)}).groupby("s")[["t", "n"]].sum()
            if len(d) and d["n"].sum() > 0:
                W = boot_weights(len(d), n_boot, seed)
                with np.errstate(invalid="ignore", divide="ignore"):
                    boot = (W @ d["t"].to_numpy()) / (W @ d["n"].to_numpy())
                lo, hi = interval(boot, level)
            else:
                lo = hi = float("nan")
            base = metric_key("judge", judge, t.perturbation)
            vals[t.perturbation] = t.value
            pr = pf_idx.loc[(judge, t.perturbation)] if pf_idx is not None and (judge, t.perturbation) in pf_idx.index else None
            trows.append([txt(t.perturbation), txt(t.dimension), txt(t.metric),
                          doc.ci(f"{base}/value", t.value, lo, hi, 3), doc.count(f"{base}/n_pairs", t.n_pairs),
                          doc.count(f"{base}/n_unparseable", t.n_unparseable), doc.count(f"{base}/n_abstained", t.n_abstained),
                          doc.num(f"{base}/parse_failure_pct", None if pr is None else 100 * pr["parse_failure_rate"], 1)])
        if pf_idx is not None and (judge, "original") in pf_idx.index:
            pr = pf_idx.loc[(judge, "original")]
            trows.append([txt("original (unbiased)"), txt(""), txt(""), txt(""),
                          doc.count(metric_key("judge", judge, "original", "n"), pr["n"]),
                          doc.count(metric_key("judge", judge, "original", "n_unparseable"), pr["n_unparseable"]),
                          doc.count(metric_key("judge", judge, "original", "n_abstained"), pr["n_abstained"]),
                          doc.num(metric_key("judge", judge, "original", "parse_failure_pct"), 100 * pr["parse_failure_rate"], 1)])
        agg = jm.aggregate_reliability(pd.Series(vals))
        if all(finite(v) is None for v in vals.values()):
            unparsed.append(str(judge))
        sec.blocks.append(Table(doc.uid(f"judge-{judge}"), f"Judge {judge}: BD / BC per perturbation",
                                ["perturbation", "dimension", "metric", f"value [{int(level * 100)} % CI]", "pairs",
                                 "unparseable", "abstained", "parse failures (%)"], trows,
                                note=f"BD (Integrality, Congruity; higher = notices the disruption) and BC (Robustness; "
                                     f"higher = stable). Interval: bootstrap over samples ({n_boot} draws, seed {seed}). "
                                     "Unparseable outputs are never defaulted: their pairs are dropped and counted."))
        sec.blocks.append(Paragraph([Cell([("Reliability (unweighted means of the types): ", None, None)] + [
            p for k, c in enumerate(jm.AGGREGATE_COLUMNS) for p in
            ([("; ", None, None)] if k else []) + [(f"{c} ", None, None),
                                                   doc.span(metric_key("judge", judge, "aggregate", c), agg.get(c), 3)]])]))
        how.append({"kind": "judge", "judge": judge, "n_pert": len(g), "agg": agg, "paragraph": how_paragraph})
    if unparsed:  # an empty chart would look like a judge that scored 0
        sec.blocks.append(Paragraph([txt(f"No judgment parsed for {', '.join(unparsed)}: no BD / BC to plot "
                                          "(every pair has an unparseable score - see the parse failures above).")]))
    drawn = bs[~bs["judge"].astype(str).isin(unparsed)]
    if len(drawn):
        add_figure(doc, sec, "judge-bias", "BD / BC per perturbation", lambda: _judge_figure(drawn, pairs, doc.metrics))
    if pair_stores:
        prs = read_stores(pair_stores)
        if len(prs) and "experiment" in prs.columns:
            pft = jb.parse_failure_table(prs, by=("judge", "experiment"))
            r2 = [[txt(t.judge), txt(t.experiment), doc.count(metric_key("judge", t.judge, t.experiment, "n"), t.n),
                   doc.count(metric_key("judge", t.judge, t.experiment, "n_unparseable"), t.n_unparseable),
                   doc.num(metric_key("judge", t.judge, t.experiment, "parse_failure_pct"), 100 * t.parse_failure_rate, 1)]
                  for t in pft.itertuples()]
            sec.blocks.append(Table(doc.uid("judge-pairwise"), "Pairwise judgments (position / verbosity): parse failures",
                                    ["judge", "experiment", "judgments", "unparseable", "parse failures (%)"], r2))
    return sec, how


def _judge_figure(bs: pd.DataFrame, pairs: pd.DataFrame, metrics: Mapping[str, float | None]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    judges = list(dict.fromkeys(bs["judge"]))
    perts = list(dict.fromkeys(bs["perturbation"]))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(perts) + 2), 3.8))
    off = np.linspace(-0.2, 0.2, len(judges)) if len(judges) > 1 else [0.0]
    for o, j in zip(off, judges):
        x, y, lo, hi = [], [], [], []
        for i, p in enumerate(perts):
            k = metric_key("judge", j, p, "value")
            v = metrics.get(k)
            if v is None:
                continue
            x.append(i + o)
            y.append(v)
            lo.append(v - (metrics.get(k + "/ci_low") if metrics.get(k + "/ci_low") is not None else v))
            hi.append((metrics.get(k + "/ci_high") if metrics.get(k + "/ci_high") is not None else v) - v)
        ax.errorbar(x, y, yerr=[lo, hi], fmt="o", capsize=3, label=j)
    metric_of = dict(zip(bs["perturbation"], bs["metric"]))
    ax.set_xticks(range(len(perts)), [f"{p}\n({metric_of[p]})" for p in perts], rotation=30, ha="right", fontsize=7)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("BD / BC (higher = better)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    ax.set_title("Bias-Deviation / Bias-Conformity per perturbation (bootstrap interval over samples)", fontsize=9)
    fig.tight_layout()
    return fig




def report(doc: Doc, stores: Mapping[str, list[ResultStore]], opts: ReportOptions) -> tuple[Section | None, list[dict]]:
    """Study 3's report section, from its score-wise and pairwise stores."""
    return judge_section(doc, stores.get("scores", []), stores.get("pairwise", []), opts.n_boot, opts.seed, opts.level)


def how_paragraph(doc: Doc, h: dict, level: float) -> Paragraph:
    """The judge's entry in "How to report this"."""
    j = h["judge"]
    parts = [(f"Judge {j}: report BD (Integrality, Congruity) and BC (Robustness) per perturbation with their "
              "intervals and the parse failures, not only the overall reliability (", None, None),
             how_value(doc, metric_key("judge", j, "aggregate", "overall"), 3),
             ("); a BC near 1 can come from a judge that gives every sample the same score, so give the "
              "inter-sample variance beside it (MM-JudgeBias, Table 2).", None, None)]
    return Paragraph([Cell(parts)], "how")
