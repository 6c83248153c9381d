"""A small grid of every study, run through :func:`mmfragile.study.run_study` into result stores - the regression
reference of the study runner. ``tests/data/regression/*.parquet`` were written by this module with the code
before the runner was unified (issue 19), through the studies' own wrappers; since those went (issue 36) the grid
runs through ``run_study``, and every row it stores equals them (float columns to 1e-7: the same data, batched
alike). ``tests/test_regression.py`` runs it again and compares every stored row.

    python tests/regression_grid.py tests/data/regression     # rewrite the reference (only on purpose!)

Model: ``tiny-vlm`` (random weights, fast and deterministic); every study's paths are covered: the format grid
through the engine plus CP-LN log-likelihoods, Promptception's generation + two-stage scoring, the judge's seeded
sampled scores, pairwise position / verbosity judgments and judge self-generation.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

KEY = ["model", "dataset", "question_id", "variant"]
FORMATS = ("uppercase-dot-line_break", "numbers-bracket-semicolon", "roman-colon-comma")
PROMPT_IDS = ("1.1", "2.1", "7.6", "12.1")
PERTURBATIONS = ("text_dominance", "image_dominance", "image_misalignment", "unnecessary_image")
#: the reference tables, one per store
TABLES = ("formats", "cp_ln", "promptception", "judge_scores", "judge_pairwise", "judge_selfgen")


def build(out: str | Path, model=None) -> dict[str, pd.DataFrame]:
    """Run the grid into stores under ``out/stores`` through :func:`mmfragile.study.run_study` - the one run path
    the CLI and the notebooks take - and return one table per entry of :data:`TABLES`."""
    from mmfragile.api import load_dataset, load_model
    from mmfragile.studies.judgebias.data import make_judge_set
    from mmfragile.studies.judgebias.items import SELFGEN_DATASET
    from mmfragile.study import run_study

    out = Path(out)
    model = model or load_model("tiny-vlm")
    qs = load_dataset("synthetic-vqa", n=None)
    fb_q = pd.concat([qs[qs.modality == m].head(1) for m in ("image", "multi-image", "video", "text")])
    fb = run_study("format-bias", model, fb_q, out=out / "stores" / "formats", formats=list(FORMATS), n_frames=3,
                   cp_ln=True, progress=False)
    pc = run_study("promptception", model, "synthetic-vqa", n=4, out=out / "stores" / "promptception",
                   prompt_ids=list(PROMPT_IDS), max_new_tokens=6, n_frames=3, match_text=True, batch_size=8,
                   progress=False)
    samples = make_judge_set(2, 0, out / "judge" / "data", n_text=1)
    jb = run_study("judge", model, samples, out=out / "stores" / "judge", perturbations=list(PERTURBATIONS),
                   runs=2, max_new_tokens=6, batch_size=8, pairwise=True, pairwise_max_new_tokens=6,
                   self_generators=[], generator_max_new_tokens=6, progress=False)
    scores = jb.table("scores")   # the judge's scores of the self-generated responses share the score store
    selfgen = scores["dataset"] == SELFGEN_DATASET
    tables = {"formats": fb.table("grid"), "cp_ln": fb.table("cp_ln"), "promptception": pc.table(),
              "judge_scores": scores[~selfgen], "judge_pairwise": jb.table("pairwise"),
              "judge_selfgen": scores[selfgen]}
    return {k: v.sort_values(KEY).reset_index(drop=True) for k, v in tables.items()}


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    """The columns that must not change, list/array cells as tuples, absolute paths dropped (they name the run's
    folder)."""
    drop = [c for c in df.columns if c in ("image_paths",)]
    out = df.drop(columns=drop).sort_values(KEY).reset_index(drop=True)
    for c in out.columns:
        if out[c].map(lambda v: hasattr(v, "__len__") and not isinstance(v, (str, bytes))).any():
            out[c] = out[c].map(lambda v: None if v is None else tuple(v))
    return out


if __name__ == "__main__":
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "data" / "regression")
    import tempfile

    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, table in build(tmp).items():
            table.to_parquet(dest / f"{name}.parquet", index=False)
            print(name, len(table), "rows", list(table.columns))
