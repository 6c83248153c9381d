"""The budgeted estimator against the full grid and against PromptEval's estimators (docs/budget.md's tables).

    python scripts/budget_comparison.py errors published format-bias --budgets 0.02 --seeds 10
    python scripts/budget_comparison.py coverage published promptception --max-items 600 --budgets 0.02,0.05 --seeds 3

``errors``: per group x budget x seed x method (ours, PE-Rasch, PE-discrete, the per-variant average) the W1
distance of the per-variant accuracy distribution, the 5 / 95 % quantile errors and the Kendall tau of the model
ranking per variant (``mmfragile.budget.validation.distribution_errors``). ``coverage``: how often the nominal
90 % intervals hold the full grid's value, per statistic, with the prior scales integrated over (the default) and
at the learnt scales alone (``error_curves(scale_draws=...)``). ``auto``: ``--budget auto --target T`` on the
complete grid (``auto_stop_curves``): the share of the grid it used and how often the stopped estimate is within
the target of the full grid's value. Each writes a CSV and prints a summary.

    python scripts/budget_comparison.py auto embedded promptception --target 1.0 --stop-on mean --seeds 3
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from mmfragile.budget import validation as bv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["errors", "coverage", "auto"])
    ap.add_argument("source", help="embedded | published | a results folder")
    ap.add_argument("study", help="format-bias | promptception")
    ap.add_argument("--datasets", default=None, help="comma-separated (published grids; default all)")
    ap.add_argument("--max-items", type=int, default=None,
                    help="items per dataset (published grids; default the paper's)")
    ap.add_argument("--budgets", default="0.01,0.02,0.05,0.1")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--target", type=float, default=1.0, help="auto: the target interval width, pp")
    ap.add_argument("--stop-on", default="mean,spread", help="auto: the statistics to stop on")
    ap.add_argument("--out", default="figures/budget/comparison")
    a = ap.parse_args(argv)
    cells, spec, note = bv.complete_grid(a.source, a.study, datasets=a.datasets and a.datasets.split(","),
                                         max_items=a.max_items)
    budgets = [float(b) for b in a.budgets.split(",")]
    t0 = time.perf_counter()
    if a.what == "errors":
        table = bv.distribution_errors(cells, spec, budgets, range(a.seeds), progress=True)
        summary = (table.groupby(["budget", "method"])[["w1", "q05_err", "q95_err", "mean_err", "kendall_tau"]]
                   .mean().round(3))
    elif a.what == "auto":
        table = bv.auto_stop_curves(cells, spec, a.target, seeds=range(a.seeds), statistics=a.stop_on.split(","))
        summary = (table.groupby("statistic")[["share", "rounds", "reached", "within"]].mean()
                   .join(table.groupby("statistic")["error"].agg(lambda e: e.abs().max()).rename("max_abs_error"))
                   .round(3))
    else:
        parts = []
        for draws in (8, 0):
            cur = bv.error_curves(cells, spec, budgets, seeds=range(a.seeds), scale_draws=draws, progress=True)
            st = cur["stats"][cur["stats"]["method"] == "irt"]
            cov = st.groupby(["budget", "statistic"])["covered"].mean().unstack()
            cov["variant"] = cur["units"].groupby("budget")["coverage"].mean()
            if len(cur["rank_coverage"]):
                cov["rank"] = cur["rank_coverage"].groupby("budget")["covered"].mean()
            parts.append(cov.reset_index().assign(scale_draws=draws))
        table = summary = pd.concat(parts, ignore_index=True).round(3)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{a.what}_{a.study}_{a.source if a.source in ('embedded', 'published') else 'runs'}"
    name += f"_{a.max_items}items" if a.max_items else ""
    name += f"_target{a.target:g}_{a.stop_on.replace(',', '+')}" if a.what == "auto" else ""
    table.to_csv(out / f"{name}.csv", index=False)
    print(f"{note}; {a.seeds} seeds, {time.perf_counter() - t0:.0f} s -> {out / name}.csv")
    print(summary.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
