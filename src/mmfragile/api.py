"""Top-level conveniences: load a model or a dataset from one string, as the notebooks and the CLI do.

Model specs: see :mod:`mmfragile.models.spec` (embedded and zoo names, checkpoint folders, cached model ids,
``vllm:...``, ``openai:<base_url>::<model>``). Dataset specs: see :func:`mmfragile.data.loaders.load_dataset`
and the benchmark registry :mod:`mmfragile.data.benchmarks`.
"""
from __future__ import annotations

from typing import Any

from mmfragile.data.loaders import load_dataset  # noqa: F401  (re-exported)
from mmfragile.models.base import MLLM
from mmfragile.models.spec import ModelSpec, as_spec


def load_model(spec: "str | ModelSpec", backend: str | None = None, **kwargs: Any) -> MLLM:
    """The model of ``spec`` (:class:`~mmfragile.models.spec.ModelSpec` or its string), keyword arguments to the
    backend's constructor (``max_pixels``, ``trust_remote_code``, ``tensor_parallel_size`` ...)."""
    return as_spec(spec, backend, **kwargs).load()


def figure_note(model_spec: "str | ModelSpec") -> str | None:
    """The footer every figure made with a model that does not really see carries (random vision tower etc.)."""
    return ModelSpec.parse(model_spec).figure_note()
