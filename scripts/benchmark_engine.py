"""Benchmark: the prefix-sharing engine against batched generate (the strongest HF baseline) and per-prompt generate.

Runs every path in one process on the same format-bias items (48 formats + standard x circular shifts), checks
that they give identical predictions, and prints prompts/second, the ratios, peak memory, and the tokens each path
computes against the minimum: the unique tokens of a trie of all variants of a question (what a radix tree of KV
caches, SGLang-style, would compute).

    python scripts/benchmark_engine.py                              # smollm2-vlm, 1 image question
    python scripts/benchmark_engine.py --model smollm2 --text       # text-only format grid on SmolLM2-135M
    python scripts/benchmark_engine.py --arch qwen2_vl              # a tiny random checkpoint of a family
    python scripts/benchmark_engine.py --arch all --markdown        # every family, one README table row each
    python scripts/benchmark_engine.py --model /models/llava-1.5-7b-hf --questions 20 --batch-sizes 16,48
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from itertools import groupby

import torch


class PeakRSS:
    """Peak resident memory (MiB) above the level at start, sampled every 5 ms (CPU); CUDA peak on GPU."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()

    @staticmethod
    def rss() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) * 1024
        return 0

    def __enter__(self):
        self.base = self.rss()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss() - self.base)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        if torch.cuda.is_available():
            self.peak = torch.cuda.max_memory_allocated()

    @property
    def mib(self) -> float:
        return self.peak / 2**20


def token_accounting(model, items) -> dict[str, int]:
    """Tokens per path over all question groups: every row in full (generate), the engine's shared prefix once
    plus every tail, and the trie minimum (each distinct token-sequence prefix computed once)."""
    from mmfragile.engine import _common_prefix_len

    full = engine = trie = 0
    for _, grp in groupby(items, key=lambda it: it.group):
        enc = model.encode([it.prompt for it in grp])
        mask = enc["attention_mask"].bool()
        rows = [enc["input_ids"][i][mask[i]].tolist() for i in range(len(mask))]
        plen = min(_common_prefix_len([torch.tensor(r) for r in rows]), min(map(len, rows)) - 1)
        full += sum(map(len, rows))
        engine += plen + sum(len(r) - plen for r in rows)
        trie += len({tuple(r[:k]) for r in rows for k in range(1, len(r) + 1)})
    return {"generate": full, "engine": engine, "trie": trie}


def run(model, items, batch_sizes, engine_batch, naive: bool) -> dict:
    from mmfragile.runner import run_items
    from mmfragile.store import ResultStore

    model.generate([items[0].prompt], 1)  # warm-up (allocations, lazy init) outside every timing
    paths = ([("per-prompt generate", "generate", 1)] if naive else []) + \
        [(f"batched generate ({b})", "generate", b) for b in batch_sizes] + [("engine", "engine", engine_batch)]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, mode, bs in paths:
            model.batch_size = bs
            with PeakRSS() as mem:
                t = time.perf_counter()
                res = run_items(model, items, ResultStore(f"{tmp}/{len(out)}"), mode=mode, batch_size=bs,
                                progress=False)
                dt = time.perf_counter() - t
            out[label] = {"seconds": dt, "prompts_per_s": len(items) / dt, "mib": mem.mib,
                          "raw": res.sort_values(["question_id", "variant"]).raw_output.tolist()}
    return out


def report(name, items, n_questions, res, tokens, markdown: bool) -> None:
    ref = res["engine"]["raw"]
    best_batched = max((k for k in res if k.startswith("batched")), key=lambda k: res[k]["prompts_per_s"])
    identical = all(r["raw"] == ref for r in res.values())
    vs_batched = res["engine"]["prompts_per_s"] / res[best_batched]["prompts_per_s"]
    if markdown:
        naive = res.get("per-prompt generate")
        vs_naive = "" if naive is None else f"{res['engine']['prompts_per_s'] / naive['prompts_per_s']:.1f}x"
        batch = best_batched.split("(")[1][:-1]
        print(f"| {name} | {len(items)} | {res[best_batched]['prompts_per_s']:.1f} ({batch}) | "
              f"{res['engine']['prompts_per_s']:.1f} | **{vs_batched:.1f}x** | {vs_naive} | "
              f"{tokens['engine'] / tokens['trie']:.2f} | {'yes' if identical else 'NO'} |")
        return
    print(f"{name}: {n_questions} question(s), {len(items)} prompts; identical predictions across paths: {identical}")
    for k, r in res.items():
        print(f"  {k:>24}: {r['prompts_per_s']:8.2f} prompts/s  {r['seconds']:7.1f} s  peak memory +{r['mib']:.0f} MiB")
    print(f"  engine vs best batched generate: {vs_batched:.2f}x; vs per-prompt: "
          f"{res['engine']['prompts_per_s'] / res['per-prompt generate']['prompts_per_s']:.1f}x"
          if "per-prompt generate" in res else f"  engine vs best batched generate: {vs_batched:.2f}x")
    print(f"  tokens computed: generate {tokens['generate']}, engine {tokens['engine']}, trie minimum {tokens['trie']} "
          f"-> a radix tree could save at most {1 - tokens['trie'] / tokens['engine']:.0%} of the engine's tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-vlm", help="embedded name, checkpoint folder or HF-cache id")
    ap.add_argument("--arch", default=None, help="a tiny random checkpoint family (mmfragile.models.tiny), or 'all'")
    ap.add_argument("--questions", type=int, default=1, help="questions of the synthetic set (seed 0)")
    ap.add_argument("--text", action="store_true", help="text-only questions (for text LMs)")
    ap.add_argument("--formats", type=int, default=48, help="first N of the 48 formats (fewer: faster runs)")
    ap.add_argument("--batch-sizes", default="16,48", help="batched-generate batch sizes (lmms-eval runs 16-48)")
    ap.add_argument("--engine-batch", type=int, default=48)
    ap.add_argument("--no-naive", action="store_true", help="skip the per-prompt generate path (slow)")
    ap.add_argument("--markdown", action="store_true", help="one README table row per model")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from mmfragile.api import load_dataset, load_model
    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.models.tiny import FAMILIES, build_tiny
    from mmfragile.studies.format_bias.prompts import all_formats

    targets = ([(f, str(build_tiny(f))) for f in sorted(FAMILIES)] if a.arch == "all" else
               [(a.arch, str(build_tiny(a.arch)))] if a.arch else [(a.model, a.model)])
    qs = load_dataset("synthetic-vqa")
    qs = qs[qs.modality == ("text" if a.text else "image")].head(a.questions)
    if a.markdown:
        print("| model | prompts | batched generate, prompts/s (batch) | engine, prompts/s | engine / batched | "
              "engine / per-prompt | engine tokens / trie minimum | identical |\n|---|---|---|---|---|---|---|---|")
    from mmfragile.engine import engine_refusal

    for name, spec in targets:
        model = load_model(spec)
        if engine_refusal(model):
            print(f"| {name} | engine refused: {engine_refusal(model)} |" if a.markdown else
                  f"{name}: engine refused: {engine_refusal(model)}")
            continue
        items = format_bias_items(model, qs, formats=all_formats()[:a.formats])
        if not a.markdown:
            print(f"model={name} device={model.device} threads={a.threads}")
        res = run(model, items, [int(b) for b in a.batch_sizes.split(",")], a.engine_batch, not a.no_naive)
        report(name, items, len(qs), res, token_accounting(model, items), a.markdown)


if __name__ == "__main__":
    main()
