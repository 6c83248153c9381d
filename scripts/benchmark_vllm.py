"""Benchmark: vLLM (prefix caching on / off) beside the HF prefix-sharing engine and batched HF generate.

Every backend evaluates the same format-bias items (48 formats + standard x circular shifts) through
:func:`mmfragile.runner.run_items`, each in its own process (HF here, vLLM in the environment of
``scripts/install_vllm.sh``), after its model is loaded and warmed up on an unrelated prompt. Prints
prompts/second, the ratios, start-up time, and whether every backend's answers equal the HF engine's.

    python scripts/benchmark_vllm.py                                  # smollm2, 3 text questions (539 prompts)
    python scripts/benchmark_vllm.py --model smollm2-vlm --dataset synthetic-image --questions 3
    python scripts/benchmark_vllm.py --backends vllm-cache,hf-engine   # a subset
    python scripts/benchmark_vllm.py --model zoo-smollm2-good --dataset easy-vqa --questions 2
    # high resolution: a tiny checkpoint with the real image processor, 4-option questions on 1280 x 720 images
    python scripts/benchmark_vllm.py --model ~/.cache/mmfragile/tiny/qwen2_5_vl-real --image-size 1280x720

vLLM runs with automatic prefix caching (on / off) and its multimodal processor cache on (4 GiB, the default).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BACKENDS = {  # name: (description, load_model backend, run_items mode, extra load kwargs)
    "hf-generate": ("HF batched generate", "hf", "generate", {}),
    "hf-engine": ("HF prefix-sharing engine", "hf", "engine", {}),
    "vllm-cache": ("vLLM, prefix caching on", "vllm", "auto", {"enable_prefix_caching": True}),
    "vllm-nocache": ("vLLM, prefix caching off", "vllm", "auto", {"enable_prefix_caching": False}),
}


def worker(a) -> None:
    """One backend in this process: load, warm up, time run_items over the items, write a JSON result."""
    import torch

    torch.set_num_threads(a.threads)
    from mmfragile.api import load_dataset, load_model
    from mmfragile.data.synthetic import benchmark_questions
    from mmfragile.runner import run_items
    from mmfragile.models.base import Prompt
    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.studies.format_bias.prompts import all_formats
    from mmfragile.store import ResultStore

    _, backend, mode, kwargs = BACKENDS[a.worker]
    if backend == "vllm" and a.enforce_eager:
        kwargs = {**kwargs, "enforce_eager": True}
    t = time.perf_counter()
    model = load_model(a.model, backend=backend, **kwargs)
    start = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        qs = (benchmark_questions(tmp, tuple(map(int, a.image_size.split("x"))), a.questions) if a.image_size else
              load_dataset(a.dataset).head(a.questions))
        items = format_bias_items(model, qs, formats=all_formats()[:a.formats])
        model.generate([Prompt("Warm-up: say one word.")], 2)  # lazy init outside the timing, no shared prefix
        t = time.perf_counter()
        res = run_items(model, items, ResultStore(f"{tmp}/store"), mode=mode, batch_size=a.batch_size, progress=False)
        seconds = time.perf_counter() - t
    res = res.sort_values(["question_id", "variant"])
    Path(a.out).write_text(json.dumps({"prompts": len(items), "questions": a.questions, "seconds": seconds,
                                       "start_s": start, "raw": res.raw_output.tolist()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dataset", default="synthetic-text")
    ap.add_argument("--questions", type=int, default=3, help="first N questions of the dataset")
    ap.add_argument("--formats", type=int, default=48, help="first N of the 48 formats (fewer: a quicker grid)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--image-size", default=None, metavar="WxH",
                    help="4-option questions on WxH images (mmfragile.data.synthetic.benchmark_questions) instead "
                         "of --dataset")
    ap.add_argument("--batch-size", type=int, default=16,
                    help="HF batched-generate batch (the engine sizes its tail batches from memory)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="torch threads (HF)")
    ap.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile (faster start)")
    ap.add_argument("--worker", choices=list(BACKENDS), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)

    from mmfragile.paths import vllm_venv

    names = a.backends.split(",")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            py = str(vllm_venv() / "bin" / "python") if BACKENDS[name][1] == "vllm" else sys.executable
            if not Path(py).exists():
                sys.exit(f"{name}: no vLLM environment at {vllm_venv()}; run scripts/install_vllm.sh")
            cmd = [py, __file__, "--worker", name, "--out", f"{tmp}/{name}.json", "--model", a.model,
                   "--dataset", a.dataset, "--questions", str(a.questions), "--formats", str(a.formats),
                   "--batch-size", str(a.batch_size),
                   "--threads", str(a.threads)] + (["--enforce-eager"] if a.enforce_eager else []) + \
                (["--image-size", a.image_size] if a.image_size else [])
            print(f"running {name} ...", flush=True)
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{name} failed:\n{p.stderr[-4000:]}")
            out[name] = json.loads(Path(f"{tmp}/{name}.json").read_text())
    ref = out.get("hf-engine") or out[names[0]]
    base = out.get("hf-generate")
    print(f"\nmodel={a.model} dataset={a.image_size or a.dataset} questions={a.questions} prompts={ref['prompts']} "
          f"({a.formats} formats + standard x circular shifts); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"{'backend':<28}{'prompts/s':>10}{'seconds':>9}{'start s':>9}{'vs generate':>13}{'vs engine':>11}"
          f"{'same answers':>15}")
    for name in names:
        r = out[name]
        rate = r["prompts"] / r["seconds"]
        vs_gen = f"{base['seconds'] / r['seconds']:.2f}x" if base else "-"
        vs_eng = f"{out['hf-engine']['seconds'] / r['seconds']:.2f}x" if "hf-engine" in out else "-"
        same = f"{sum(x == y for x, y in zip(r['raw'], ref['raw']))}/{len(ref['raw'])}"
        print(f"{BACKENDS[name][0]:<28}{rate:>10.2f}{r['seconds']:>9.1f}{r['start_s']:>9.1f}{vs_gen:>13}{vs_eng:>11}"
              f"{same:>15}")


if __name__ == "__main__":
    main()
