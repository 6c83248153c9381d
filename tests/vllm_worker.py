"""Runs in the vLLM environment for tests/test_vllm_backend.py (and nothing else): loads ONE model through
``load_model("vllm:<spec>")`` - one engine start - makes the calls a job pickle lists and pickles the results.

    <vllm-venv>/bin/python tests/vllm_worker.py job.pkl results.pkl

A job is ``{"spec": str, "kwargs": dict, "calls": [(key, method, args), ...]}``. ``method`` is a model
method, or ``run_items`` (args: items, store folder) for the evaluation path, ``prompt_token_ids`` (args:
prompts) for the ids vLLM fed the model after expanding image placeholders, or ``stats``.
"""
from __future__ import annotations

import pickle
import sys
import time


def main(job_path: str, out_path: str) -> None:
    from mmfragile.api import load_model

    with open(job_path, "rb") as f:
        job = pickle.load(f)
    t = time.perf_counter()
    model = load_model("vllm:" + job["spec"], **job.get("kwargs", {}))
    print(f"engine start {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    results = {}
    for key, method, args in job["calls"]:
        t = time.perf_counter()
        if method == "run_items":
            from mmfragile.runner import run_items
            from mmfragile.studies.format_bias.prompts import exact_match_score
            from mmfragile.store import ResultStore

            items, folder = args
            results[key] = run_items(model, items, ResultStore(folder), exact_match_score, progress=False)
        elif method == "prompt_token_ids":
            outs = model.llm.generate(model._inputs(args[0]), model._params(1), use_tqdm=False)
            results[key] = [list(o.prompt_token_ids) for o in outs]
        elif method == "stats":
            results[key] = dict(model.stats)
        else:
            results[key] = getattr(model, method)(*args)
        print(f"{key}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
