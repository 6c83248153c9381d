"""Study 2's section of the fragility report (:func:`mmfragile.report.build_report`): accuracy over the prompts
beside the base prompt and the trimmed mean, answer extraction by category, model ranking and budgeted grids.
Numbers come from :mod:`mmfragile.studies.promptception.metrics`.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from mmfragile.report.build import (Cell, Doc, Paragraph, ReportOptions, Section, Table, add_figure, boot_ratio,
                                    boot_weights, budget_block, distribution_figure, finite, floor_block, interval,
                                    metric_key, model_labels, of_group, of_groups, outcome_matrix, ranking_tables,
                                    stats_row, store_rows, txt, variant_statistics)
from mmfragile.store import ResultStore
from mmfragile.studies.promptception.extraction import read_answers


def prompt_section(doc: Doc, stores: list[ResultStore], n_boot: int, seed: int, level: float,
                   budget_draws: int | None) -> tuple[Section | None, list[dict]]:
    """Study 2's section: the complete grids' scores, extraction by category and ranking, then the budgeted
    grids."""
    from mmfragile.studies.promptception import analysis as pcs

    raw = _answers(stores)
    if raw is None:
        return None, []
    sec = Section("promptception", "Study 2 - Promptception: prompt sensitivity")
    how: list[dict] = []
    complete, budgeted = _complete_and_budgeted(raw)
    if complete:
        rc = of_groups(raw, set(complete))
        acc = pcs.accuracy_frame(rc.drop(columns=["_store"]), benchmark_by="dataset")
        how = _scores_block(doc, sec, rc, acc, complete, n_boot, seed, level)
        _coverage_block(doc, sec, rc, complete, how)
        _ranking_block(doc, sec, rc, acc, complete, how, n_boot, seed, level)
        sec.blocks.append(Paragraph([txt("The mixed model of the format factors applies to study 1; for prompts the "
                                          "category-level spread is in the coverage and distribution tables above.")]))
    if budgeted:
        budget_block(doc, sec, of_groups(raw, set(budgeted)), "promptception", "prompts", "prompt", budget_draws, how)
    return sec, how


def _answers(stores: list[ResultStore]) -> pd.DataFrame | None:
    """Every store's answers with their stage-2 extraction (pending ones too), the store's refusal policy and
    root beside them; None without any."""
    frames = []
    labels = model_labels(stores)[0]
    for st in stores:
        df = store_rows(st, labels, read=read_answers)  # pending answers with their stage-2 extraction
        if len(df):
            frames.append(df.assign(exclude_refusals=bool(st.config.get("exclude_refusals", False)), _store=str(st.root)))
    if not frames:
        return None
    raw = pd.concat(frames, ignore_index=True)
    raw["prompt_id"] = raw["prompt_id"].astype(str)
    return raw


def _complete_and_budgeted(raw: pd.DataFrame) -> tuple[list, list]:
    """The (model, dataset) groups whose every question has every prompt its modality supports, and the others
    (budgeted)."""
    from mmfragile.studies.promptception import metrics as pm
    from mmfragile.studies.promptception.prompts import get_prompt_type

    complete, budgeted = [], []
    for m, ds in dict.fromkeys(zip(raw["model"].astype(str), raw["dataset"].astype(str))):
        g = of_group(raw, m, ds)
        pids = sorted(set(g["prompt_id"]) - {pm.BASELINE_LABEL})
        missing = False
        for q, gq in g.groupby("question_id"):
            mod = str(gq["modality"].iloc[0]) if "modality" in gq else "image"
            expected = {p for p in pids if _supports(get_prompt_type, p, mod)}
            if not expected <= set(gq["prompt_id"]):
                missing = True
                break
        (budgeted if missing else complete).append((m, ds))
    return complete, budgeted


def _hits(g: pd.DataFrame) -> pd.DataFrame:
    """``g`` with ``_h`` (a correct answer) and ``_n`` (it counts): refusals count only for stores that keep
    them."""
    excl = g["exclude_refusals"].astype(bool) & g.get("refusal", pd.Series(False, index=g.index)).astype(bool)
    return g.assign(_h=(g["correct"].astype(bool) & ~excl).astype(float), _n=(~excl).astype(float))


def _scores_block(doc: Doc, sec: Section, rc: pd.DataFrame, acc: pd.DataFrame, complete: list, n_boot: int,
                  seed: int, level: float) -> list[dict]:
    """The accuracy table (base prompt and trimmed mean beside the distribution over prompts) and its figure;
    returns the how-to-report entry of each group."""
    from mmfragile.studies.promptception import metrics as pm

    base, tm = pm.baseline_accuracy(acc), pm.trimmed_means(acc)
    rows, dist_groups, how, floors = [], [], [], []
    for m, ds in complete:
        b_val = float(of_group(base, m, ds, "benchmark")["baseline"].iloc[0])
        t_val = float(of_group(tm, m, ds, "benchmark")["trimmed_mean"].iloc[0])
        row, values, h = _scores_row(doc, m, ds, of_group(acc, m, ds, "benchmark"), _hits(of_group(rc, m, ds)),
                                     b_val, t_val, n_boot, seed, level)
        rows.append(row)
        dist_groups.append({"label": f"{m}\n{ds}", "values": values, "standard": b_val})
        how.append(h)
        floors.append((m, ds, values, h))
    sec.blocks.append(Table(doc.uid("prompts-scores"), "Accuracy (%): base prompt beside the distribution over prompts",
                            ["model", "benchmark", "questions", "prompts", "base prompt (1.1)", "trimmed mean (10 %)",
                             "mean", "median", "IQR", "worst 5 %", "spread (max-min)", "best prompt", "worst prompt"],
                            rows, note=f"[{int(level * 100)} % bootstrap interval over questions, {n_boot} draws, seed "
                                       f"{seed}.] Unresolved answers count as wrong (App. E); refusals are left out "
                                       "only for stores run with exclude_refusals."))
    for m, ds, values, h in floors:
        floor_block(doc, sec, "prompts", m, ds, "prompt", h["prompt_ids"], values, h)
    add_figure(doc, sec, "prompts-distribution", "Accuracy over prompts",
               lambda: distribution_figure(dist_groups, "accuracy (%)", "Accuracy over the prompt types (one dot per "
                                           "prompt)", "base prompt 1.1"))
    return how


def _scores_row(doc: Doc, m: str, ds: str, a: pd.DataFrame, g: pd.DataFrame, b_val: float, t_val: float,
                n_boot: int, seed: int, level: float) -> tuple[list, np.ndarray, dict]:
    """One group's row of the accuracy table, its prompts' accuracies (the figure's dots) and its how-to-report
    entry."""
    from mmfragile.studies.promptception import metrics as pm

    a = pm.prompts_only(a)
    a = a[a["n"] > 0]
    questions = sorted(g["question_id"].astype(str).unique())
    pids = list(a["prompt_id"])
    hits, n = outcome_matrix(g, "prompt_id", questions, pids, "_h", "_n")
    W = boot_weights(len(questions), n_boot, seed)
    B = boot_ratio(W, hits, n)
    point = variant_statistics(a["accuracy"].to_numpy())
    boot = variant_statistics(B, axis=1)
    prefix = metric_key("prompts", m, ds)
    b_id = pm.BASELINE_LABEL if (g["prompt_id"] == pm.BASELINE_LABEL).any() else pm.BASELINE_PROMPT
    bh, bn = outcome_matrix(g, "prompt_id", questions, [b_id], "_h", "_n")
    b_boot = boot_ratio(W, bh, bn)[:, 0]
    t_boot = np.array([pm.trimmed_mean(r[~np.isnan(r)]) if (~np.isnan(r)).any() else np.nan for r in B])
    lo, hi = interval(b_boot, level)
    tlo, thi = interval(t_boot, level)
    ibest, iworst = int(np.argmax(a["accuracy"].to_numpy())), int(np.argmin(a["accuracy"].to_numpy()))
    row = [txt(m), txt(ds), doc.count(f"{prefix}/n_questions", len(questions)),
           doc.count(f"{prefix}/n_prompts", len(pids)), doc.ci(f"{prefix}/baseline", b_val, lo, hi, cls="std"),
           doc.ci(f"{prefix}/trimmed_mean", t_val, tlo, thi)]
    row += stats_row(doc, prefix, point, boot, level)
    row += [Cell([doc.span(f"{prefix}/max", point["max"]), (f" ({pids[ibest]})", None, None)]),
            Cell([doc.span(f"{prefix}/min", point["min"]), (f" ({pids[iworst]})", None, None)])]
    for k in ("q25", "q75"):
        doc.put(f"{prefix}/{k}", point[k])
    how = {"kind": "prompts", "grid": True, "unit": "prompt", "standard_label": "base prompt (1.1)",
           "standard_key": f"{prefix}/baseline", "trimmed_mean": True,
           "model": m, "dataset": ds, "prefix": prefix, "n_variants": len(pids), "best_name": pids[ibest],
           "prompt_ids": pids}
    return row, a["accuracy"].to_numpy(), how


def _coverage_block(doc: Doc, sec: Section, rc: pd.DataFrame, complete: list, how: list[dict]) -> None:
    """Answer extracted (%) by prompt category (red below 75 %) and the collapses named."""
    from mmfragile.studies.promptception import metrics as pm

    crow, collapses = [], []
    cats = sorted({pm.prompt_category(p) for p in rc["prompt_id"] if p != pm.BASELINE_LABEL})
    for m, ds in complete:
        g = of_group(rc, m, ds)
        g = g[g["prompt_id"] != pm.BASELINE_LABEL]
        cov = (g.assign(_c=g["prompt_id"].map(pm.prompt_category))
               .groupby("_c")["covered"].apply(lambda s: 100 * s.astype(bool).mean()))
        r = [txt(m), txt(ds)]
        for c in cats:
            v = cov.get(c, np.nan)
            low = finite(v) is not None and v < 75
            r.append(doc.num(metric_key("coverage", m, ds, "category", c), v, 0, cls="collapse" if low else ""))
            if low:
                collapses.append(f"{m} / {ds}: category {_category(c)} ({v:.0f} %)")
        crow.append(r)
    sec.blocks.append(Table(doc.uid("prompts-coverage"), "Answer extracted (%) by prompt category",
                            ["model", "benchmark"] + [_category(c) for c in cats], crow,
                            note="Share of responses from which a letter was extracted (stage 1 regex / option-text "
                                 "match, or stage 2). Red: below 75 %."))
    sec.blocks.append(Paragraph([txt("Coverage collapses: " + ("; ".join(collapses) if collapses else "none."))]))
    for h in how:
        h["collapses"] = [c for c in collapses if c.startswith(f"{h['model']} / {h['dataset']}:")]


def _ranking_block(doc: Doc, sec: Section, rc: pd.DataFrame, acc: pd.DataFrame, complete: list, how: list[dict],
                   n_boot: int, seed: int, level: float) -> None:
    """Per dataset with two or more models: the ranking tables over prompts."""
    from mmfragile.studies.promptception import metrics as pm

    for ds in dict.fromkeys(d for _, d in complete):
        ms = [m for m, d in complete if d == ds]
        if len(ms) < 2:
            continue
        a_ds = pm.prompts_only(acc[acc["benchmark"].astype(str) == ds])
        a_ds = a_ds.assign(rank=a_ds.groupby("prompt_id")["accuracy"].rank(method="min", ascending=False))
        mean_rank = a_ds.groupby("model")["accuracy"].mean().rank(method="min", ascending=False).astype(int)
        rd = []
        for mm, gg in a_ds.groupby("model"):
            counts = gg["rank"].astype(int).value_counts()
            rd.append(dict(model=mm, rank=1, share=counts.get(1, 0) / len(gg), median_rank=gg["rank"].median(),
                           min_rank=int(gg["rank"].min()), max_rank=int(gg["rank"].max())))
        per_model = {}
        for m in ms:
            g = of_group(rc, m, ds)
            per_model[m] = {"frame": _hits(g[g["prompt_id"] != pm.BASELINE_LABEL]), "variant": "prompt_id",
                            "hit": "_h", "n": "_n"}
        res = ranking_tables(doc, sec, "prompts", ds, per_model, "prompt", n_boot, seed, level,
                             a_ds.rename(columns={"prompt_id": "unit"})[["unit", "model", "rank"]].astype({"model": str}),
                             {str(k): int(v) for k, v in mean_rank.items()}, pd.DataFrame(rd).astype({"model": str}))
        for h in how:
            if h["dataset"] == ds and h["model"] in res:
                h["ranking"] = res


def _category(c: int) -> str:
    """A Promptception category as '<number> <name>' (Table 1)."""
    from mmfragile.studies.promptception.metrics import CATEGORY_NAMES

    return f"{c} {CATEGORY_NAMES[int(c)]}"


def _supports(get_prompt_type, pid: str, modality: str) -> bool:
    try:
        return bool(get_prompt_type(pid).supports(modality))
    except Exception:  # noqa: BLE001 - an unknown prompt id: expected everywhere
        return True




def report(doc: Doc, stores: Mapping[str, list[ResultStore]], opts: ReportOptions) -> tuple[Section | None, list[dict]]:
    """Study 2's report section, from its prompt-grid stores."""
    return prompt_section(doc, stores.get("prompts", []), opts.n_boot, opts.seed, opts.level, opts.budget_draws)
