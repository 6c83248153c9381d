"""The numerics study's report section: the floor per alternative, and the other studies' effects held against it.

The section comes after study 1's and study 2's (the report's study order), so their effects are already among the
report's numbers: each model's summary effects (the spread over formats / prompts, the best variant over the
mean, the standard format or baseline prompt against the mean) are listed beside the model's floor - the largest
paired accuracy change (its interval's far end) any alternative made - and labelled inside or above it.
"""
from __future__ import annotations

from typing import Mapping

from mmfragile.report.build import Cell, Doc, Paragraph, ReportOptions, Section, Table, metric_key, read_stores, txt
from mmfragile.store import ResultStore
from mmfragile.studies.numerics.metrics import floor_pp, floor_table

NAME = "numerics"
#: the other studies' effects (metric-key prefix, statistic or (minuend, subtrahend), label)
EFFECTS = (("formats", "spread", "spread over the formats (max - min)"),
           ("formats", ("max", "mean"), "best format over the mean"),
           ("formats", "standard_minus_mean", "standard format - mean"),
           ("prompts", "spread", "spread over the prompts (max - min)"),
           ("prompts", ("max", "mean"), "best prompt over the mean"),
           ("prompts", "standard_minus_mean", "baseline prompt - mean"))
COMMAND = "python -m mmfragile run numerics --model M --dataset D --n 8 --out runs/numerics"
#: the studies whose effects the floor is held against
HELD_AGAINST = ("format-bias", "promptception")


def absent(studies) -> list[str]:
    """The report's note where it has study-1 / study-2 stores but no numerics store."""
    if not set(studies) & set(HELD_AGAINST):
        return []
    return [f"no numerical floor was measured: a format or prompt effect of 1-2 pp can be arithmetic noise "
            f"(precision, batch, path). Measure it with `{COMMAND}` and give that store to the report too "
            "(docs/numerics.md)"]


def _table(stores: Mapping[str, list[ResultStore]], opts: ReportOptions):
    rows = read_stores(stores.get("cells", []))
    return None if rows.empty else floor_table(rows, level=opts.level, n_boot=opts.n_boot, seed=opts.seed)


def floors(stores: Mapping[str, list[ResultStore]], opts: ReportOptions) -> dict[str, float]:
    """Each model's floor in pp (:func:`floor_pp`): what study 1's and study 2's sections hold their effects
    against."""
    table = _table(stores, opts)
    return {} if table is None else {str(m): float(v) for m, v in floor_pp(table).items()}


def section(doc: Doc, stores: Mapping[str, list[ResultStore]], opts: ReportOptions):
    table = _table(stores, opts)
    if table is None:
        return None, []
    sec = Section(NAME, "Numerics: the noise floor")
    L = f"{int(opts.level * 100)} %"
    trows = []
    for r in table.itertuples(index=False):
        k = metric_key(NAME, r.model, r.alternative)
        trows.append([txt(r.model), txt(r.alternative), doc.count(f"{k}/cells", r.cells),
                      doc.count(f"{k}/flips", r.flips), doc.ci(f"{k}/flip_rate", r.flip_rate, r.flip_lo, r.flip_hi),
                      doc.ci(f"{k}/delta_acc", r.delta_acc, r.delta_lo, r.delta_hi),
                      doc.num(f"{k}/mcnemar_p", r.mcnemar_p, 3), doc.num(f"{k}/median_dlogit", r.median_dlogit, 5),
                      doc.num(f"{k}/max_dlogit", r.max_dlogit, 5), doc.num(f"{k}/share_margin_below",
                                                                          r.share_margin_below, 1),
                      Cell([doc.span(f"{k}/rank_changes", r.rank_changes, 0), (f" of {r.effects}", None, None)])])
    sec.blocks.append(Table(doc.uid("numerics-floor"), "Answers under arithmetic-only changes, against the reference "
                            "run (the run's own default settings)",
                            ["model", "alternative", "cells", "flips", "flip rate %", "accuracy change (pp)",
                             "McNemar p", "median |d logit|", "max |d logit|", "% cells with margin < max",
                             "rank changes"], trows,
                            note=f"[{L} intervals: Wilson for the flip rate, bootstrap over questions for the paired "
                                 "accuracy change; McNemar's exact test.] A flip: the cell's chosen option (or, "
                                 "uncovered, its raw output) differs. Margin: the reference's top-2 option-logit gap."))
    effects, how = [], []
    for model, floor in floor_pp(table).items():
        doc.put(metric_key(NAME, model, "floor_pp"), floor)
        for ds, value, label in _effects(doc, model):
            inside = abs(value) <= floor
            effects.append([txt(model), txt(ds), txt(label), txt(f"{value:.1f}"),
                            txt(f"{floor:.1f}"), txt("inside the floor" if inside else "above the floor")])
        how.append({"paragraph": _how, "model": model, "floor": floor,
                    "inside": [e[2].text for e in effects if e[0].text == model and e[5].text.startswith("inside")]})
    if effects:
        sec.blocks.append(Table(doc.uid("numerics-effects"), "The other studies' effects beside the numerical floor",
                                ["model", "dataset", "effect", "pp", "floor (pp)", "verdict"], effects,
                                note="Floor: the largest |paired accuracy change| of any alternative, to the far end "
                                     "of its interval. An effect inside it cannot be told from arithmetic noise."))
    else:
        sec.blocks.append(Paragraph([txt("No study-1 or study-2 store of these models is in this report: give them "
                                         "with the numerics store to see each effect beside the floor.")]))
    return sec, how


def _effects(doc: Doc, model: str):
    """``(dataset, value in pp, label)`` of every summary effect of ``model`` the report computed."""
    for kind, stat, label in EFFECTS:
        datasets = sorted({k.split("/")[2] for k in doc.metrics if k.startswith(f"{kind}/{model}/")})
        for ds in datasets:
            parts = [doc.metrics.get(metric_key(kind, model, ds, s)) for s in ((stat,) if isinstance(stat, str)
                                                                              else stat)]
            if all(v is not None for v in parts):
                yield ds, parts[0] - (parts[1] if len(parts) > 1 else 0.0), label


def _how(doc: Doc, h: dict, level: float) -> Paragraph:
    inside = f" Inside it here: {', '.join(h['inside'])} - report these as not distinguishable from numerical " \
             "noise." if h["inside"] else ""
    return Paragraph([Cell([(f"{h['model']}: its numerical floor is ", None, None),
                            (f"{h['floor']:.1f}", metric_key(NAME, h["model"], "floor_pp"), h["floor"]),
                            (" pp - the largest accuracy change an arithmetic-only change made (precision, batch, "
                             "path, threads). Quote every format or prompt effect beside it; an effect within it "
                             f"is inside the floor.{inside}", None, None)])], "how")
