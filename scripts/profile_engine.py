"""Where a run's time goes: one format grid through :func:`mmfragile.runner.run_items` under torch's profiler,
split into the processor (chat template, tokenizer, image processor), the vision tower, the language model's GEMMs
and attention, its other tensor ops, and what is left - Python and per-step overhead (the wall time no tensor op
or processor call accounts for).

    python scripts/profile_engine.py --model smollm2 --dataset synthetic-text --questions 1        # text grid
    python scripts/profile_engine.py --model smollm2 --dataset synthetic-text --dtype bfloat16
    python scripts/profile_engine.py --model zoo-gemma3-good --dataset easy-vqa --mode generate
    python scripts/profile_engine.py --model ~/.cache/mmfragile/tiny/qwen2_5_vl-real --image-size 1280x720

The profiler adds a few microseconds per op, so "other ops" and "overhead" are upper bounds; the shares are what
to read. Each op is counted once, by its own (self) time, under the innermost of the processor / vision-tower
ranges it ran in.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict

#: the parts of the table, in order
PARTS = ("processor", "vision tower", "GEMM", "attention", "other tensor ops", "Python / per-step overhead")
VISION_MODULES = ("vision_tower", "visual", "vision_model", "vision_encoder", "image_encoder")


def op_part(name: str) -> str:
    """The part of the table a tensor op's own time belongs to (outside the processor and vision ranges)."""
    n = name.lower()
    if "scaled_dot_product" in n or "attention" in n:
        return "attention"
    if any(k in n for k in ("::mm", "addmm", "bmm", "matmul", "linear", "mkldnn", "onednn", "gemm")):
        return "GEMM"
    return "other tensor ops"


class _Ranged:
    """``obj`` whose calls run inside a profiler range ``name`` (the processor)."""

    def __init__(self, obj, name: str):
        self._obj, self._name = obj, name

    def __call__(self, *args, **kwargs):
        import torch

        with torch.profiler.record_function(self._name):
            return self._obj(*args, **kwargs)

    def __getattr__(self, key):
        return getattr(self._obj, key)


def _range_vision(model) -> None:
    """Every call of the vision tower inside a profiler range "vision tower" (forward hooks)."""
    import torch

    for name, module in model.model.named_modules():
        if name.split(".")[-1] in VISION_MODULES:
            open_ranges = []

            def pre(mod, args, _open=open_ranges):
                r = torch.profiler.record_function("vision tower")
                r.__enter__()
                _open.append(r)

            def post(mod, args, out, _open=open_ranges):
                _open.pop().__exit__(None, None, None)

            module.register_forward_pre_hook(pre)
            module.register_forward_hook(post)
            return


def split(events, wall_us: float) -> dict[str, float]:
    """Seconds per part from the profiler's events (each op by its self time, under its innermost named range)."""
    out: dict[str, float] = defaultdict(float)
    for ev in events:
        if ev.name in ("processor", "vision tower"):
            continue
        parent, where = ev.cpu_parent, None
        while parent is not None and where is None:
            where = parent.name if parent.name in ("processor", "vision tower") else None
            parent = parent.cpu_parent
        out[where or op_part(ev.name)] += ev.self_cpu_time_total
    for ev in events:   # the ranges' own Python time (tokenizer, image processing) belongs to them
        if ev.name in ("processor", "vision tower"):
            out[ev.name] += ev.self_cpu_time_total
    out["Python / per-step overhead"] = max(0.0, wall_us - sum(out.values()))
    return {k: out.get(k, 0.0) / 1e6 for k in PARTS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dataset", default="synthetic-text")
    ap.add_argument("--questions", type=int, default=1)
    ap.add_argument("--formats", type=int, default=48)
    ap.add_argument("--image-size", default=None, metavar="WxH", help="4-option questions on WxH images")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--mode", default="engine", choices=["engine", "generate"])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--top", type=int, default=8, help="list the ops with the most own time")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from mmfragile.api import load_dataset, load_model
    from mmfragile.data.synthetic import benchmark_questions
    from mmfragile.models.base import Prompt
    from mmfragile.runner import run_items
    from mmfragile.studies.format_bias.prompts import exact_match_score
    from mmfragile.store import ResultStore
    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.studies.format_bias.prompts import all_formats

    model = load_model(a.model, dtype=a.dtype)
    if getattr(model, "processor", None) is not None:
        model.processor = _Ranged(model.processor, "processor")
    if getattr(model, "tokenizer", None) is not None and model.tokenizer is not getattr(model.processor, "_obj", None):
        model.tokenizer = _Ranged(model.tokenizer, "processor")
    _range_vision(model)
    with tempfile.TemporaryDirectory() as tmp:
        qs = (benchmark_questions(tmp, tuple(map(int, a.image_size.split("x"))), a.questions) if a.image_size else
              load_dataset(a.dataset).head(a.questions))
        items = format_bias_items(model, qs, formats=all_formats()[:a.formats])
        model.generate([Prompt("Warm-up: say one word.")], 2)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            run_items(model, items, ResultStore(f"{tmp}/store"), exact_match_score, mode=a.mode,
                      batch_size=a.batch_size,
                      progress=False)
            wall = time.perf_counter() - t
    parts = split(prof.events(), wall * 1e6)
    print(f"model={a.model} dtype={a.dtype} mode={a.mode} prompts={len(items)} wall {wall:.1f} s "
          f"({len(items) / wall:.2f} prompts/s, under the profiler); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs, {a.threads} threads")
    print("| part | seconds | share |\n|---|---|---|")
    for k in PARTS:
        print(f"| {k} | {parts[k]:.3f} | {100 * parts[k] / wall:.0f} % |")
    if a.top:
        print(f"\nthe {a.top} ops with the most own time:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.top, max_name_column_width=48))


if __name__ == "__main__":
    main()
