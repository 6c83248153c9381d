"""The vLLM backend's parts that need no vLLM: the export of transformers-5 LLaVA checkpoints into the layout
vLLM's CLIP module loads, and the `vllm:` model specs."""
from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from mmfragile.models.vllm_backend import needs_vllm_export, vllm_checkpoint


def test_vision_tower_gets_the_vision_model_level_and_nothing_else_changes(tiny_vlm, tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "ckpt"
    tiny_vlm.model.save_pretrained(src)
    tiny_vlm.processor.save_pretrained(src)
    assert needs_vllm_export(src)
    out = vllm_checkpoint(src)
    assert out != src and not needs_vllm_export(out) and vllm_checkpoint(src) == out  # built once
    a, b = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    assert len(a) == len(b)
    for k, v in a.items():
        nk = "vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k
        assert torch.equal(b[nk], v)
    assert "vision_tower.vision_model.encoder.layers.1.self_attn.q_proj.weight" in b
    assert "language_model.model.layers.0.self_attn.q_proj.weight" in b  # the language model is untouched
    for f in ("config.json", "processor_config.json", "tokenizer.json", "chat_template.jinja"):
        assert (out / f).read_bytes() == (src / f).read_bytes()


def test_sharded_checkpoint_index_is_renamed_and_text_models_are_not_exported(tiny_vlm, tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "sharded"
    tiny_vlm.model.save_pretrained(src, max_shard_size="5MB")
    tiny_vlm.processor.save_pretrained(src)
    assert len(list(src.glob("*.safetensors"))) > 1
    out = vllm_checkpoint(src)
    idx = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert all(not k.startswith("vision_tower.") or k.startswith("vision_tower.vision_model.") for k in idx)
    for k, shard in idx.items():
        assert k in load_file(out / shard)
    text = tmp_path / "text"
    text.mkdir()
    (text / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not needs_vllm_export(text) and vllm_checkpoint(text) == text.resolve()


def test_vllm_specs_without_vllm_say_how_to_get_it():
    """In the project's own environment (no vLLM) a vllm: spec names the install script; bad backends refuse."""
    import importlib.util

    import pytest

    from mmfragile.api import load_model

    with pytest.raises(ValueError, match="backend must be one of hf, vllm, openai"):
        load_model("smollm2", backend="tgi")
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment")
    from mmfragile.errors import UsageError

    with pytest.raises(UsageError, match="install_vllm.sh"):  # before anything loads (ModelSpec.check)
        load_model("vllm:smollm2")
    with pytest.raises(UsageError, match="install_vllm.sh"):
        load_model("smollm2", backend="vllm")
