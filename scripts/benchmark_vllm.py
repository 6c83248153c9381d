"""Benchmark: vLLM (prefix caching on / off) beside the HF prefix-sharing engine and batched HF generate.

Every backend evaluates the same format-bias items (48 formats + standard x circular shifts) through
:func:`mmfragile.runner.run_items`, each in its own process (HF here, vLLM in the environment of
``scripts/install_vllm.sh``), after its model is loaded and warmed up on an unrelated prompt. Prints
prompts/second, the ratios, start-up time, and whether every backend's answers equal the HF engine's.

    python scripts/benchmark_vllm.py                                  # smollm2, 3 text questions (539 prompts)
    python scripts/benchmark_vllm.py --model smollm2-vlm --dataset synthetic-image --questions 3
    python scripts/benchmark_vllm.py --backends vllm-cache,hf-engine   # a subset
    python scripts/benchmark_vllm.py --dtypes float32,bfloat16          # each backend in each precision
    python scripts/benchmark_vllm.py --model zoo-smollm2-good --dataset easy-vqa --questions 2
    # high resolution: a tiny checkpoint with the real image processor, 4-option questions on 1280 x 720 images
    python scripts/benchmark_vllm.py --model ~/.cache/mmfragile/tiny/qwen2_5_vl-real --image-size 1280x720

vLLM runs with automatic prefix caching (on / off) and its multimodal processor cache on (4 GiB, the default).
With ``--dtypes`` every backend runs in each precision; answers are compared with the float32 engine's (the
reference), and the machine's own GEMM peak is measured in the same run for each precision (a 2048 x 2048 x 2048
matmul on the same threads), so that MFU = 2 x parameters x tokens computed / seconds / that peak: for the HF paths
the tokens they computed (the engine's shared prefixes once, its tails; generate every prompt token), for vLLM the
prompt tokens it was served less its prefix-cache hits (its own counters).
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
    # vLLM keeps its stats (the prefix-cache counters MFU needs) only with disable_log_stats=False
    "vllm-cache": ("vLLM, prefix caching on", "vllm", "auto",
                   {"enable_prefix_caching": True, "disable_log_stats": False}),
    "vllm-nocache": ("vLLM, prefix caching off", "vllm", "auto",
                     {"enable_prefix_caching": False, "disable_log_stats": False}),
}


def worker(a) -> None:
    """One backend in this process: load, warm up, time run_items over the items, write a JSON result."""
    import torch

    torch.set_num_threads(a.threads)
    from mmfragile.api import load_dataset, load_model
    from mmfragile.data.synthetic import benchmark_questions
    from mmfragile.runner import run_items
    from mmfragile.studies.format_bias.prompts import exact_match_score
    from mmfragile.models.base import Prompt
    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.studies.format_bias.prompts import all_formats
    from mmfragile.store import ResultStore

    _, backend, mode, kwargs = BACKENDS[a.worker]
    if backend == "vllm" and a.enforce_eager:
        kwargs = {**kwargs, "enforce_eager": True}
    kwargs = {**kwargs, "dtype": a.dtype}
    t = time.perf_counter()
    model = load_model(a.model, backend=backend, **kwargs)
    start = time.perf_counter() - t
    with tempfile.TemporaryDirectory() as tmp:
        qs = (benchmark_questions(tmp, tuple(map(int, a.image_size.split("x"))), a.questions) if a.image_size else
              load_dataset(a.dataset).head(a.questions))
        items = format_bias_items(model, qs, formats=all_formats()[:a.formats])
        model.generate([Prompt("Warm-up: say one word.")], 2)  # lazy init outside the timing, no shared prefix
        engines = _record_engines()
        before = _cache_counters(model)
        t = time.perf_counter()
        res = run_items(model, items, ResultStore(f"{tmp}/store"), exact_match_score, mode=mode,
                        batch_size=a.batch_size, progress=False)
        seconds = time.perf_counter() - t
        computed = _computed_tokens(model, mode, items, engines, before)
    res = res.sort_values(["question_id", "variant"])
    Path(a.out).write_text(json.dumps({"prompts": len(items), "questions": a.questions, "seconds": seconds,
                                       "start_s": start, "raw": res.raw_output.tolist(),
                                       "computed_tokens": computed, "params": _parameters(a.model)}))


def _record_engines() -> list:
    """The prefix-sharing engines run_items makes from here on (their stats count the tokens they computed)."""
    import mmfragile.runner as runner

    made: list = []

    class Recorded(runner.PrefixSharingEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    runner.PrefixSharingEngine = Recorded
    return made


def _cache_counters(model) -> tuple[int, int] | None:
    """vLLM's prefix-cache (queries, hits) in tokens, from its metrics; None elsewhere."""
    llm = getattr(model, "llm", None)
    if llm is None or not hasattr(llm, "get_metrics"):
        return None
    got = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    return int(got.get("vllm:prefix_cache_queries", 0) or 0), int(got.get("vllm:prefix_cache_hits", 0) or 0)


def _computed_tokens(model, mode: str, items, engines: list, before) -> int | None:
    """The prompt tokens the run computed a forward pass for: the engine's prefixes once and its tails (its
    stats), batched generate's every prompt token, vLLM's prompt tokens less its prefix-cache hits (None without
    its counters)."""
    if engines:
        return int(sum(e.stats["prefix_tokens"] + e.stats["tail_tokens"] for e in engines))
    if mode == "generate":
        return int(sum(model.encode([it.prompt])["input_ids"].shape[-1] for it in items))
    after = _cache_counters(model)
    if before is None or after is None or after[0] == before[0]:
        return None
    return int((after[0] - before[0]) - (after[1] - before[1]))


def _parameters(spec: str) -> int:
    """The language model's parameters without the embedding table (what each token's forward multiplies by)."""
    from transformers import AutoConfig

    from mmfragile.models.spec import ModelSpec

    cfg = AutoConfig.from_pretrained(ModelSpec.parse(spec).checkpoint_dir())
    cfg = getattr(cfg, "text_config", None) or cfg
    h, n, inter = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or h // heads
    per_layer = h * head_dim * (heads + 2 * kv) + heads * head_dim * h + 3 * h * inter
    return int(n * per_layer)


def gemm_peak(dtype: str, threads: int, n: int = 2048, repeats: int = 5) -> float:
    """This machine's measured GEMM rate in GFLOP/s: the best of ``repeats`` n x n x n matmuls in ``dtype``."""
    import torch

    torch.set_num_threads(threads)
    dt = getattr(torch, dtype)
    x, y = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
    x @ y
    best = min(_timed(lambda: x @ y) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


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
    ap.add_argument("--dtypes", default="float32", help="precisions, comma-separated (float32, bfloat16)")
    ap.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=list(BACKENDS), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)

    from mmfragile.paths import vllm_venv

    names, dtypes = a.backends.split(","), a.dtypes.split(",")
    if "bfloat16" in dtypes:
        from mmfragile.models.hf import cpu_has_bf16_matmul

        if not cpu_has_bf16_matmul():
            sys.exit("--dtypes bfloat16: this CPU has no bfloat16 matrix instructions (no AMX or AVX512-BF16), so "
                     "torch emulates them and the run would time the emulation (docs/speed.md, 'The CPU fast "
                     "path'); run --dtypes float32 here, bfloat16 on a CPU that has them")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in dtypes:
            for name in names:
                py = str(vllm_venv() / "bin" / "python") if BACKENDS[name][1] == "vllm" else sys.executable
                if not Path(py).exists():
                    sys.exit(f"{name}: no vLLM environment at {vllm_venv()}; run scripts/install_vllm.sh")
                res = f"{tmp}/{name}-{dtype}.json"
                cmd = [py, __file__, "--worker", name, "--out", res, "--model", a.model, "--dtype", dtype,
                       "--dataset", a.dataset, "--questions", str(a.questions), "--formats", str(a.formats),
                       "--batch-size", str(a.batch_size),
                       "--threads", str(a.threads)] + (["--enforce-eager"] if a.enforce_eager else []) + \
                    (["--image-size", a.image_size] if a.image_size else [])
                print(f"running {name} in {dtype} ...", flush=True)
                p = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"{name} ({dtype}) failed:\n{p.stderr[-4000:]}")
                out[name, dtype] = json.loads(Path(res).read_text())
    peaks = {dtype: gemm_peak(dtype, a.threads) for dtype in dtypes}
    ref = out.get(("hf-engine", "float32")) or out[names[0], dtypes[0]]
    print(f"\nmodel={a.model} dataset={a.image_size or a.dataset} questions={a.questions} prompts={ref['prompts']} "
          f"({a.formats} formats + standard x circular shifts); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs; GEMM peak (GFLOP/s, {a.threads} threads): "
          + ", ".join(f"{d} {v:.0f}" for d, v in peaks.items()))
    print(f"{'backend':<28}{'dtype':>9}{'prompts/s':>10}{'seconds':>9}{'start s':>9}{'vs generate':>13}"
          f"{'vs engine':>11}{'MFU %':>8}{'same answers':>15}")
    for dtype in dtypes:
        base, eng = out.get(("hf-generate", dtype)), out.get(("hf-engine", dtype))
        for name in names:
            r = out[name, dtype]
            rate = r["prompts"] / r["seconds"]
            vs_gen = f"{base['seconds'] / r['seconds']:.2f}x" if base else "-"
            vs_eng = f"{eng['seconds'] / r['seconds']:.2f}x" if eng else "-"
            mfu = (f"{100 * 2 * r['params'] * r['computed_tokens'] / r['seconds'] / (peaks[dtype] * 1e9):.1f}"
                   if r.get("computed_tokens") else "n/a")
            same = f"{sum(x == y for x, y in zip(r['raw'], ref['raw']))}/{len(ref['raw'])}"
            print(f"{BACKENDS[name][0]:<28}{dtype:>9}{rate:>10.2f}{r['seconds']:>9.1f}{r['start_s']:>9.1f}"
                  f"{vs_gen:>13}{vs_eng:>11}{mfu:>8}{same:>15}")


if __name__ == "__main__":
    main()
