"""Benchmark: naive per-item generate() vs the prefix-sharing engine on the 48-format x circular grid.

Runs both paths in one process on the embedded model and a fixed slice of the synthetic set, checks that
they give identical predictions, and prints questions/second for each, their ratio, and peak memory.

    python scripts/benchmark_engine.py                      # smollm2-vlm, 3 image questions, 48 formats
    python scripts/benchmark_engine.py --model tiny-vlm --questions 4
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-vlm")
    ap.add_argument("--questions", type=int, default=3, help="image questions of the synthetic set (seed 0)")
    ap.add_argument("--batch-size", type=int, default=48)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from mmfragile.api import load_dataset, load_model
    from mmfragile.evaluate import format_bias_items, run_items
    from mmfragile.store import ResultStore

    model = load_model(a.model)
    qs = load_dataset("synthetic-image").head(a.questions)
    items = format_bias_items(model, qs)  # 48 formats + standard, every circular shift
    print(f"model={model.name} device={model.device} threads={a.threads} questions={len(qs)} "
          f"prompts={len(items)} (48 formats + standard x circular shifts)")
    model.generate([items[0].prompt], 1)  # warm-up (allocations, lazy init) outside both timings

    results, times, mem = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        # naive: one generate() call per prompt, as a straightforward evaluation loop does
        model.batch_size = 1
        with PeakRSS() as m:
            t = time.perf_counter()
            results["naive"] = run_items(model, items, ResultStore(f"{tmp}/naive"), mode="generate", batch_size=1,
                                         progress=False)
            times["naive"] = time.perf_counter() - t
        mem["naive"] = m.mib
        model.batch_size = a.batch_size
        with PeakRSS() as m:
            t = time.perf_counter()
            results["engine"] = run_items(model, items, ResultStore(f"{tmp}/engine"), mode="engine",
                                          batch_size=a.batch_size, progress=False)
            times["engine"] = time.perf_counter() - t
        mem["engine"] = m.mib

    key = ["question_id", "variant"]
    a_, b_ = (results[k].sort_values(key).reset_index(drop=True) for k in ("naive", "engine"))
    same = bool((a_.raw_output == b_.raw_output).all())
    print(f"identical predictions: {same} ({int((a_.raw_output == b_.raw_output).sum())}/{len(a_)}); "
          f"accuracy {100 * a_.correct.mean():.1f}% / coverage {100 * a_.covered.mean():.1f}%")
    for k in ("naive", "engine"):
        print(f"{k:>7}: {len(items) / times[k]:8.2f} prompts/s  {len(qs) / times[k]:7.3f} questions/s  "
              f"{times[k]:7.1f} s  peak memory +{mem[k]:.0f} MiB")
    print(f"speed-up (engine / naive): {times['naive'] / times['engine']:.1f}x")


if __name__ == "__main__":
    main()
