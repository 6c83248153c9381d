"""Benchmark: study 3's judgments through the prefix-sharing engine against batched ``generate_sampled``.

Runs the judge study (``run_study("judge", ...)``: score-wise judgments under the perturbations, and the pairwise
position / verbosity pairs with ``--pairwise``) twice in one process on the same judge set - ``mode="generate"``
(batched ``generate`` / ``generate_sampled``: the path before the engine took free-text requests) and
``mode="auto"`` (the engine: a picture's conditions and runs share its prefix, groups decode together) - into
fresh stores, prints each stage's seconds, the ratios and the load average, and counts the stored outputs that are
equal (they must all be, in float32).

    python scripts/benchmark_judge.py                                          # smollm2-vlm, 2 scenes, pairwise
    python scripts/benchmark_judge.py --model zoo-judge-seeing --model-args dtype=float32 \\
        --dataset easy-vqa-judge --n-samples 4                                 # a zoo judge, 50_judgebias_run's data
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

import pandas as pd

from mmfragile.store import ResultStore
from mmfragile.study import run_study

MODES = ("generate", "auto")
KEY = ["model", "dataset", "question_id", "variant"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-vlm")
    ap.add_argument("--model-args", default=None, help="k=v,... (e.g. dtype=float32 for a zoo judge)")
    ap.add_argument("--dataset", default="synthetic")
    ap.add_argument("--n-samples", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--decoding", default="sample", choices=("sample", "greedy"))
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--perturbations", default=None, help="comma-separated (default: all nine)")
    ap.add_argument("--no-pairwise", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the notebooks' setting)")
    ap.add_argument("--out", default=None, help="keep the stores here (default: a temporary folder)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")   # the runs' warnings are the study's own tests' business
    root = Path(args.out or tempfile.mkdtemp(prefix="benchmark_judge_"))
    params = {"n_samples": args.n_samples, "runs": args.runs, "decoding": args.decoding,
              "max_new_tokens": args.max_new_tokens, "pairwise": not args.no_pairwise}
    if args.perturbations:
        params["perturbations"] = args.perturbations.split(",")
    print(f"{args.model} ({args.model_args or 'its own dtype'}) on {args.dataset}: {args.n_samples} samples, "
          f"{args.runs} runs, {args.decoding}, {args.threads} thread(s); load average at start "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    seconds: dict[str, dict[str, float]] = {}
    for mode in MODES:
        run = run_study("judge", args.model, args.dataset, results_dir=root / mode, model_args=args.model_args,
                        threads=args.threads, mode=mode, progress=False, **params)
        seconds[mode] = dict(run.seconds)
        print(f"  mode={mode}: " + ", ".join(f"{k} {v:.1f} s" for k, v in run.seconds.items())
              + f" (load average {os.getloadavg()[0]:.2f})", flush=True)
    print("| stage | judgments | batched generate, s | engine, s | engine / batched | stored outputs equal |")
    print("|---|---|---|---|---|---|")
    all_equal = True
    for stage in seconds["auto"]:
        a, b = (ResultStore(root / mode / stage).read().sort_values(KEY).reset_index(drop=True) for mode in MODES)
        equal = int((a["raw_output"].values == b["raw_output"].values).sum()) if len(a) == len(b) else 0
        all_equal &= equal == len(a) == len(b)
        print(f"| {stage} | {len(a)} | {seconds['generate'][stage]:.1f} | {seconds['auto'][stage]:.1f} | "
              f"**{seconds['generate'][stage] / max(seconds['auto'][stage], 1e-9):.2f}x** | {equal}/{len(a)} |")
    total = {mode: sum(s.values()) for mode, s in seconds.items()}
    print(f"total: batched generate {total['generate']:.1f} s, engine {total['auto']:.1f} s "
          f"({total['generate'] / max(total['auto'], 1e-9):.2f}x); every stored output equal: {all_equal}; "
          f"load average at end {os.getloadavg()[0]:.2f}")
    pd.DataFrame(seconds).to_csv(root / "seconds.csv")
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
