"""mmfragile: measure how fragile multimodal-model evaluations are.

Reproduces three studies: prompt-format bias in multiple-choice VQA (48 formats, circular evaluation),
Promptception prompt sensitivity (61 instructions), and MM-JudgeBias (MLLM-as-a-judge perturbations); a fourth,
numerics, measures the noise floor they are held against.

    >>> import mmfragile as mf
    >>> run = mf.run_study("format-bias", "zoo-gemma3-good", "easy-vqa", n=4, out="runs/demo")  # resumable
    >>> run.table().groupby("format")[["correct", "covered"]].mean()   # per question -> per format
"""
from __future__ import annotations

__version__ = "0.1.0"

from mmfragile.determinism import apply as _pin_arithmetic

_pin_arithmetic()  # MMFRAGILE_DETERMINISTIC=1: before anything imports torch (a no-op otherwise)

_LAZY = {
    "load_model": "mmfragile.api",
    "load_dataset": "mmfragile.api",
    "figure_note": "mmfragile.api",
    "ResultStore": "mmfragile.store",
    "merge_stores": "mmfragile.store",
    "Shard": "mmfragile.shards",
    "run_on_ray": "mmfragile.distributed",
    "run_items": "mmfragile.runner",
    "EvalItem": "mmfragile.runner",
    "run_study": "mmfragile.study",
    "get_study": "mmfragile.study",
    "ModelSpec": "mmfragile.models.spec",
    "format_bias_items": "mmfragile.studies.format_bias.items",
    "Prompt": "mmfragile.models.base",
    "MLLM": "mmfragile.models.base",
    "HFModel": "mmfragile.models.hf",
    "MCQuestion": "mmfragile.schema",
    "DataError": "mmfragile.schema",
    "run_grid": "mmfragile.grid",
    "run_pipeline": "mmfragile.grid",
    "build_report": "mmfragile.report",
    "load_judge_dataset": "mmfragile.studies.judgebias.data",
}

__all__ = sorted(_LAZY)


def __dir__() -> list[str]:  # notebook completion: the lazy exports are no module globals until first use
    return sorted(set(globals()) | set(_LAZY))


def __getattr__(name: str):  # lazy: `import mmfragile` stays cheap (no torch import)
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mmfragile' has no attribute {name!r}")
