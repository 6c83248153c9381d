"""Write a compact complete format-bias grid (the budget estimator's fixture) from a result store.

    python -m mmfragile formats --model smollm2-vlm --dataset easy-vqa --n 40 --out runs/budget_grid/smollm2-vlm/easy-vqa
    python scripts/make_budget_grid.py runs/budget_grid/smollm2-vlm/easy-vqa \\
        src/mmfragile/resources/budget/format_bias_smollm2-vlm_easy-vqa.parquet

Keeps the questions whose 48-format x circular-shift grid is complete in the store (the engine runs a question's
items together, so a run stopped early leaves whole questions plus at most one partial one) and only the columns
:func:`mmfragile.budget.validation.load_embedded_grid` needs: model, dataset, question_id, format, shift,
n_options, answer_position, correct, covered.
"""
from __future__ import annotations

import argparse
from pathlib import Path


from mmfragile.studies.format_bias.budget import cells as format_bias_cells
from mmfragile.store import ResultStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store")
    ap.add_argument("out")
    ap.add_argument("--max-questions", type=int, default=None, help="keep the first k complete questions")
    a = ap.parse_args()
    rows = ResultStore(a.store).read()
    cells = format_bias_cells(rows)
    cov = rows[rows["format"] != "standard"].assign(covered=lambda d: d["covered"].astype(bool))
    cells = cells.merge(cov[["model", "dataset", "question_id", "variant", "covered"]].astype(
        {"question_id": str, "variant": str}), on=["model", "dataset", "question_id", "variant"], how="left")
    complete = cells.groupby(["model", "question_id"])["correct"].transform(lambda c: c.notna().all())
    keep = cells[complete]
    order = list(dict.fromkeys(rows["question_id"].astype(str)))          # the order the run evaluated them
    qs = [q for q in order if q in set(keep["question_id"])][: a.max_questions]
    keep = keep[keep["question_id"].isin(qs)]
    out = keep[["model", "dataset", "question_id", "format", "shift", "n_options", "answer_position"]].copy()
    out["correct"] = keep["correct"].astype(bool)
    out["covered"] = keep["covered"].astype(bool)
    out = out.sort_values(["question_id", "format", "shift"]).reset_index(drop=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    out.astype({"model": "category", "dataset": "category", "format": "category", "shift": "int8",
                "n_options": "int8", "answer_position": "int8"}).to_parquet(a.out, index=False, compression="zstd")
    print(f"{a.out}: {len(out)} cells, {out['question_id'].nunique()} complete questions "
          f"(of {rows['question_id'].nunique()} in the store), accuracy {100 * out['correct'].mean():.1f} %, "
          f"{Path(a.out).stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
