"""Compact run records of the zoo's planted fragility, for the fast tests (tests/test_planted_fragility.py).

    python scripts/record_planted_runs.py                                  # the default profile's stores
    python scripts/record_planted_runs.py --judges runs/judgebias --prompts runs/promptception

Reads the stores a `reproduce` (default profile: notebooks 40 and 50) wrote - the judge study of the zoo's three
judges on the easy-VQA judge set and the Promptception run of the zoo's prompt follower - and writes one row per
judgment / pairwise verdict / (question, prompt) of the zoo's fine-tunes to src/mmfragile/resources/zoo/runs/:
judge_scores.parquet, judge_pairs.parquet, follower_prompts.parquet (a few hundred kB in all), with the run
configuration in runs.json. Nothing is recomputed: the rows are the stores' own.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmfragile.models.zoo import ZOO_SPECS, weights_dir
from mmfragile.store import ResultStore
from mmfragile.studies import judgebias as jb
from mmfragile.studies import promptception as pc

SCORE_COLUMNS = ["judge", "sample_id", "perturbation", "run", "score", "status", "kind", "modality"]
PAIR_COLUMNS = ["judge", "sample_id", "experiment", "order", "run", "swapped", "verbose_position", "choice", "status"]
PROMPT_COLUMNS = ["model", "dataset", "modality", "question_id", "prompt_id", "category", "n_options", "correct",
                  "covered"]


def records_dir() -> Path:
    return weights_dir() / "runs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judges", default="runs/judgebias", help="results folder of the judge study")
    ap.add_argument("--prompts", default="runs/promptception", help="results folder of the Promptception runs")
    a = ap.parse_args()
    out = records_dir()
    out.mkdir(parents=True, exist_ok=True)
    judges = [s.name for s in ZOO_SPECS if s.role == "judge"]
    followers = [s.name for s in ZOO_SPECS if s.role == "follower"]
    scores = ResultStore(Path(a.judges) / "scores")
    table = jb.judgment_table(scores)
    table = table[table["judge"].isin(judges)][SCORE_COLUMNS]
    pairs = ResultStore(Path(a.judges) / "pairwise").read()
    pairs = pairs[pairs["judge"].isin(judges)][PAIR_COLUMNS]
    prompts = pc.load_results(a.prompts)
    prompts = prompts[prompts["model"].isin(followers)][PROMPT_COLUMNS]
    for name, frame in (("judge_scores", table), ("judge_pairs", pairs), ("follower_prompts", prompts)):
        frame.reset_index(drop=True).to_parquet(out / f"{name}.parquet", index=False)
        print(f"{name}: {len(frame)} rows")
    config = {"judges": {k: scores.config.get(k) for k in ("dataset", "n_samples", "seed", "decoding", "temperature",
                                                            "top_p", "max_new_tokens", "pairwise_max_new_tokens")},
              "judge_models": sorted(set(table["judge"])), "follower_models": sorted(set(prompts["model"])),
              "follower_questions": int(prompts["question_id"].nunique()),
              "follower_datasets": sorted(set(prompts["dataset"]))}
    (out / "runs.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
