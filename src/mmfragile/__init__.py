"""mmfragile: measure how fragile multimodal-model evaluations are.

Reproduces three studies: prompt-format bias in multiple-choice VQA (48 formats, circular evaluation),
Promptception prompt sensitivity (61 instructions), and MM-JudgeBias (MLLM-as-a-judge perturbations).

    >>> import mmfragile as mf
    >>> model = mf.load_model("smollm2-vlm")            # embedded default, offline
    >>> qs = mf.load_dataset("synthetic-image", n=4)     # Pillow-generated MC-VQA
    >>> items = mf.format_bias_items(model, qs)          # 48 formats + standard x circular shifts
    >>> df = mf.run_items(model, items, mf.ResultStore("runs/demo"))   # resumable, per question
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "load_model": "mmfragile.api",
    "load_dataset": "mmfragile.api",
    "figure_note": "mmfragile.api",
    "ResultStore": "mmfragile.store",
    "merge_stores": "mmfragile.store",
    "Shard": "mmfragile.shards",
    "run_on_ray": "mmfragile.distributed",
    "run_items": "mmfragile.runner",
    "format_bias_items": "mmfragile.runner",
    "EvalItem": "mmfragile.runner",
    "Prompt": "mmfragile.models.base",
    "MLLM": "mmfragile.models.base",
    "HFModel": "mmfragile.models.hf",
    "MCQuestion": "mmfragile.schema",
    "DataError": "mmfragile.schema",
    "run_grid": "mmfragile.grid",
    "run_pipeline": "mmfragile.grid",
    "build_report": "mmfragile.report",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):  # lazy: `import mmfragile` stays cheap (no torch import)
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mmfragile' has no attribute {name!r}")
