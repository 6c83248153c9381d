"""Benchmark: the prefix-sharing engine against batched generate (the strongest HF baseline) and per-prompt generate.

Runs every path in one process on the same format-bias items (48 formats + standard x circular shifts), checks
that they give identical predictions, and prints prompts/second, the ratios, peak memory, and the tokens each path
computes against the minimum: the unique tokens of a trie of all variants of a question (what a radix tree of KV
caches, SGLang-style, would compute).

    python scripts/benchmark_engine.py                              # smollm2-vlm, 1 image question
    python scripts/benchmark_engine.py --model smollm2 --text       # text-only format grid on SmolLM2-135M
    python scripts/benchmark_engine.py --arch qwen2_vl              # a tiny random checkpoint of a family
    python scripts/benchmark_engine.py --arch all --markdown        # every family, one docs/speed.md table row each
    python scripts/benchmark_engine.py --model /models/llava-1.5-7b-hf --questions 20 --batch-sizes 16,48

High-resolution mode: each family's tiny checkpoint with its image processor as the real model ships it
(``build_tiny(family, real_processor=True)``), one question with 4 options (196 prompts) on one image of each size
(``mmfragile.data.synthetic.benchmark_questions``).
Memory is the peak RSS of fresh processes: one that loads the model and encodes the question once, one that loads it
and runs the engine on the group (run_items, mode="engine") then batched generate (batch 16) - the speed ratio comes
from that one process:

    python scripts/benchmark_engine.py --real-processor --arch qwen2_5_vl --image-size 1280x720
    python scripts/benchmark_engine.py --real-processor --arch all --image-size 1280x720,1920x1080 --markdown
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from itertools import groupby

import torch

from mmfragile.studies.format_bias.prompts import exact_match_score


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


def run(model, items, batch_sizes, naive: bool) -> dict:
    from mmfragile.runner import run_items
    from mmfragile.store import ResultStore

    model.generate([items[0].prompt], 1)  # warm-up (allocations, lazy init) outside every timing
    paths = ([("per-prompt generate", "generate", 1)] if naive else []) + \
        [(f"batched generate ({b})", "generate", b) for b in batch_sizes] + [("engine", "engine", 1)]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, mode, bs in paths:
            model.batch_size = bs  # batched generate's; the engine sizes its tail batches from free memory
            with PeakRSS() as mem:
                t = time.perf_counter()
                res = run_items(model, items, ResultStore(f"{tmp}/{len(out)}"), exact_match_score, mode=mode,
                                batch_size=bs,
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


# ---------------------------------------------------------------------------------------------- high resolution
def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def high_res_worker(a) -> dict:
    """One measurement in this (fresh) process: ``encode`` (model + one encode of the question) or ``paths``
    (model + the engine on the group, then batched generate on the first ``--generate-prompts`` prompts)."""
    from mmfragile.api import load_model
    from mmfragile.data.synthetic import benchmark_questions
    from mmfragile.engine import media_token_ids
    from mmfragile.runner import run_items
    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.models.base import Prompt
    from mmfragile.models.tiny import build_tiny
    from mmfragile.store import ResultStore

    w, h = map(int, a.image_size.split("x"))
    model = load_model(str(build_tiny(a.arch, real_processor=True)))
    with tempfile.TemporaryDirectory() as tmp:
        items = format_bias_items(model, benchmark_questions(a.image_dir, (w, h)))  # the parent made the image
        # lazy initialisation on a small image, so the peak below is the measured path's
        small = Prompt("Warm-up.", images=benchmark_questions(a.image_dir, (64, 48)).images[0])
        model.generate([small], 1)
        out = {"arch": a.arch, "size": a.image_size, "prompts": len(items), "after_load_mib": peak_rss_mib()}
        if a.worker == "encode":
            t = time.perf_counter()
            enc = model.encode([items[0].prompt])
            out.update(seconds=time.perf_counter() - t, peak_mib=peak_rss_mib(), tokens=int(enc["input_ids"].shape[1]),
                       image_tokens=int(sum(int((enc["input_ids"] == t).sum()) for t in media_token_ids(model.model.config))))
            return out
        res = {}
        for mode, subset in (("engine", items), ("generate", items[:a.generate_prompts or len(items)])):
            t = time.perf_counter()
            df = run_items(model, subset, ResultStore(f"{tmp}/{mode}"), exact_match_score, mode=mode, batch_size=16,
                           progress=False)
            res[mode] = {"seconds": time.perf_counter() - t, "prompts": len(subset), "peak_mib": peak_rss_mib(),
                         "raw": dict(zip(df.variant, df.raw_output))}
        same = [res["engine"]["raw"][v] == r for v, r in res["generate"]["raw"].items()]
        out.update({m: {k: v for k, v in r.items() if k != "raw"} for m, r in res.items()},
                   identical=f"{sum(same)}/{len(same)}")
        return out


def high_res(a) -> None:
    """Run the workers of every (family, size), each in its own process, and print the table."""
    from mmfragile.models.tiny import REAL_PROCESSOR_FAMILIES

    archs = REAL_PROCESSOR_FAMILIES if a.arch in (None, "all") else a.arch.split(",")
    if a.markdown:
        print("| family (real processor) | image | image tokens | prompt tokens | model + one encode, peak RSS | "
              "engine group, peak RSS | engine / one encode | batched generate, peak RSS | engine, prompts/s | "
              "batched generate, prompts/s (prompts) | engine / generate | identical |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|")
    from mmfragile.data.synthetic import benchmark_questions

    images = tempfile.TemporaryDirectory()
    for size in a.image_size.split(",") + ["64x48"]:  # made here: a 4K image's synthesis would set a worker's peak
        benchmark_questions(images.name, tuple(map(int, size.split("x"))))
    for arch in archs:
        for size in a.image_size.split(","):
            r = {}
            for worker in ("encode", "paths"):
                cmd = [sys.executable, __file__, "--real-processor", "--worker", worker, "--arch", arch, "--image-size",
                       size, "--threads", str(a.threads), "--generate-prompts", str(a.generate_prompts or 0),
                       "--image-dir", images.name]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    r["error"] = f"{worker} failed: {p.stderr.strip().splitlines()[-1]}"
                    break
                r[worker] = json.loads(p.stdout.strip().splitlines()[-1])
            if "error" in r:
                print(f"| {arch} | {size} | {r['error']} |" if a.markdown else json.dumps(r), flush=True)
                continue
            enc, paths = r["encode"], r["paths"]
            eng, gen = paths["engine"], paths["generate"]
            e_rate, g_rate = eng["prompts"] / eng["seconds"], gen["prompts"] / gen["seconds"]
            row = dict(arch=arch, size=size, image_tokens=enc["image_tokens"], tokens=enc["tokens"],
                       encode_mib=enc["peak_mib"], engine_mib=eng["peak_mib"], ratio=eng["peak_mib"] / enc["peak_mib"],
                       engine_rate=e_rate, gen_rate=g_rate, gen_prompts=gen["prompts"], speedup=e_rate / g_rate,
                       identical=paths["identical"], generate_mib=gen["peak_mib"])
            if a.markdown:
                print(f"| {arch} | {size} | {row['image_tokens']:,} | {row['tokens']:,} | {row['encode_mib'] / 1024:.2f} GB | "
                      f"{row['engine_mib'] / 1024:.2f} GB | **{row['ratio']:.2f}x** | {row['generate_mib'] / 1024:.2f} GB | "
                      f"{e_rate:.1f} | {g_rate:.2f} "
                      f"({gen['prompts']}) | **{row['speedup']:.1f}x** | {row['identical']} |", flush=True)
            else:
                print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-vlm", help="embedded name, checkpoint folder or HF-cache id")
    ap.add_argument("--arch", default=None, help="a tiny random checkpoint family (mmfragile.models.tiny), or 'all'")
    ap.add_argument("--questions", type=int, default=1, help="questions of the synthetic set (seed 0)")
    ap.add_argument("--text", action="store_true", help="text-only questions (for text LMs)")
    ap.add_argument("--formats", type=int, default=48, help="first N of the 48 formats (fewer: faster runs)")
    ap.add_argument("--batch-sizes", default="16,48", help="batched-generate batch sizes (lmms-eval runs 16-48)")
    ap.add_argument("--no-naive", action="store_true", help="skip the per-prompt generate path (slow)")
    ap.add_argument("--markdown", action="store_true", help="one docs/speed.md table row per model")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--real-processor", action="store_true",
                    help="high-resolution mode: --arch families with their real image processors (see above)")
    ap.add_argument("--image-size", default="1280x720", help="high-resolution mode: WxH[,WxH...]")
    ap.add_argument("--generate-prompts", type=int, default=0,
                    help="high-resolution mode: batched generate on the first N prompts only (0: all)")
    ap.add_argument("--worker", choices=["encode", "paths"], help=argparse.SUPPRESS)
    ap.add_argument("--image-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.worker:
        print(json.dumps(high_res_worker(a)))
        return
    if a.real_processor:
        return high_res(a)

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
        res = run(model, items, [int(b) for b in a.batch_sizes.split(",")], not a.no_naive)
        report(name, items, len(qs), res, token_accounting(model, items), a.markdown)


if __name__ == "__main__":
    main()
