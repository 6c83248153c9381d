"""Write a study's committed complete grid (the budget estimator's fixture, ``resources/budget/``) from a store.

    python -m mmfragile formats --model smollm2-vlm --dataset easy-vqa --n 40 --out runs/budget_grid/smollm2-vlm/easy-vqa
    python scripts/make_budget_grid.py runs/budget_grid/smollm2-vlm/easy-vqa \\
        src/mmfragile/resources/budget/format_bias_smollm2-vlm_easy-vqa.parquet
    python scripts/make_budget_grid.py --study promptception runs/budget_grid/zoo-follower/easy-vqa \\
        src/mmfragile/resources/budget/promptception_zoo-follower_easy-vqa.parquet

Keeps the questions whose grid is complete in the store (the engine runs a question's items together, so a run
stopped early leaves whole questions plus at most one partial one), in the order the run evaluated them, and only
the columns of the study's :class:`~mmfragile.study.CommittedGrid` (from which
:func:`mmfragile.budget.validation.load_embedded_grid` rebuilds the cell frame); ``covered`` is the store's.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mmfragile.store import find_stores
from mmfragile.study import budget_stage


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store", help="the run's results folder")
    ap.add_argument("out")
    ap.add_argument("--study", default="format-bias")
    ap.add_argument("--max-questions", type=int, default=None, help="keep the first k complete questions")
    a = ap.parse_args(argv)
    stage = budget_stage(a.study)
    grid, committed = stage.budget, stage.budget.embedded
    if committed is None:
        raise SystemExit(f"error: study {a.study!r} has no committed grid (study's BudgetGrid.embedded)")
    stores = find_stores(a.store, a.study, stage.tag)
    if len(stores) != 1:
        raise SystemExit(f"error: {a.store}: {len(stores)} {a.study} stores under this folder, need one")
    rows = grid.read(stores[0])
    key = ["model", "dataset", "question_id", "variant"]
    rows = rows.astype({c: str for c in key})
    cells = grid.cells(rows).merge(rows[[*key, "covered"]].assign(covered=rows["covered"].astype(bool)),
                                   on=key, how="left")
    complete = cells.groupby(["model", "question_id"])["correct"].transform(lambda c: c.notna().all())
    keep = cells[complete]
    order = list(dict.fromkeys(rows["question_id"]))          # the order the run evaluated them
    qs = [q for q in order if q in set(keep["question_id"])][: a.max_questions]
    out = keep[keep["question_id"].isin(qs)][list(committed.columns)].copy()
    out["correct"] = out["correct"].astype(bool)
    out["covered"] = out["covered"].astype(bool)
    out = out.sort_values([c for c in ("question_id", "format", "shift", "prompt_id") if c in out.columns])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    small = {c: "category" for c in out.columns if pd.api.types.is_string_dtype(out[c]) and c != "question_id"}
    small.update({c: "int8" for c in ("shift", "n_options", "answer_position") if c in out.columns})
    out.reset_index(drop=True).astype(small).to_parquet(a.out, index=False, compression="zstd")
    print(f"{a.out}: {len(out)} cells, {out['question_id'].nunique()} complete questions "
          f"(of {rows['question_id'].nunique()} in the store), accuracy {100 * out['correct'].mean():.1f} %, "
          f"{Path(a.out).stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
