"""Top-level conveniences: load a model or a dataset from one string, as the notebooks and the CLI do.

Model specs:

* ``smollm2`` | ``gemma3`` | ``smollm2-vlm`` | ``tiny-vlm`` (optionally ``@seed``, e.g. ``smollm2-vlm@1``) - embedded
  defaults (the ``-vlm`` ones have RANDOM vision towers: for tests);
* ``zoo-smollm2-good`` | ``zoo-smollm2-weak`` | ``zoo-gemma3-good`` | ``zoo-gemma3-weak`` - the model zoo: real
  LMs with trained vision towers (:mod:`mmfragile.models.zoo`);
* a local folder with a ``transformers`` checkpoint (``/models/llava-1.5-7b-hf``) or a model id already in
  the HF cache (set ``HF_HUB_OFFLINE=1`` so nothing is downloaded);
* ``openai:<base_url>::<model>`` - an OpenAI-compatible server (vLLM, llama.cpp, an API);
* ``vllm:<any of the above local specs>`` (or ``backend="vllm"``) - the same checkpoint in an offline vLLM
  engine (:class:`mmfragile.models.vllm_backend.VLLMModel`; run from the environment
  ``scripts/install_vllm.sh`` creates). Keyword arguments go to the engine (``tensor_parallel_size``, ...).

Dataset specs: see :func:`mmfragile.data.loaders.load_dataset`.
"""
from __future__ import annotations

import os
from pathlib import Path

from mmfragile.data.loaders import load_dataset  # noqa: F401  (re-exported)
from mmfragile.models.base import MLLM
from mmfragile.models.embedded import EMBEDDED_MODELS, EMBEDDED_NOTE, load_embedded
from mmfragile.models.zoo import ZOO_MODELS, load_zoo, zoo_model_path


def load_model(spec: str, backend: str = "hf", **kwargs) -> MLLM:
    if spec.startswith("vllm:"):
        spec, backend = spec[len("vllm:"):], "vllm"
    if backend == "vllm":
        return _load_vllm(spec, **kwargs)
    if backend != "hf":
        raise ValueError(f"backend must be 'hf' or 'vllm', not {backend!r}")
    name, _, seed = spec.partition("@")
    if spec in ZOO_MODELS:
        return load_zoo(spec, **kwargs)
    if name in EMBEDDED_MODELS:
        m = load_embedded(name, seed=int(seed or 0), **kwargs)
        if seed:
            m.name = spec
        return m
    if spec.startswith("openai:"):
        from mmfragile.models.openai_api import OpenAIChatModel

        url, _, model = spec[len("openai:"):].partition("::")
        if not model:
            raise ValueError(f"openai model spec needs '::<model>': {spec!r}")
        return OpenAIChatModel(url, model, **kwargs)
    from mmfragile.models.hf import HFModel

    if not Path(spec).exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # only the local HF cache, never the network
    return HFModel.from_pretrained(spec, **kwargs)


def _load_vllm(spec: str, **kwargs) -> MLLM:
    from mmfragile.models.embedded import embedded_model_path
    from mmfragile.models.vllm_backend import VLLMModel

    name, _, seed = spec.partition("@")
    if name in EMBEDDED_MODELS:
        return VLLMModel(embedded_model_path(name, int(seed or 0)), name=spec, **kwargs)
    if spec in ZOO_MODELS:
        return VLLMModel(zoo_model_path(spec), name=spec, **kwargs)
    if Path(spec).exists():
        return VLLMModel(spec, **kwargs)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:  # a model id already in the HF cache, as for the HF backend; never a download
        path = snapshot_download(spec, local_files_only=True)
    except (LocalEntryNotFoundError, ValueError) as e:
        raise FileNotFoundError(f"vllm:{spec}: neither an embedded model, a local folder nor a model id in the "
                                f"local HF cache ({e})") from e
    return VLLMModel(path, name=spec.rsplit("/", 1)[-1], **kwargs)


def figure_note(model_spec: str) -> str | None:
    """The footer every figure made with a random-weight embedded model carries."""
    name = model_spec.partition("@")[0]
    if name == "tiny-vlm":
        return "embedded tiny-vlm: RANDOM weights throughout (a test model, not a real VLM)"
    if name in ("smollm2-vlm", "smollm2-vlm-hd"):
        return EMBEDDED_NOTE
    if name == "smollm2":
        return "embedded default: SmolLM2-135M-Instruct (text only)"
    if name == "gemma3":
        return "embedded: Gemma-3-270M base (text only)"
    return None
