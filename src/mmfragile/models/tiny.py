"""Tiny random-weight checkpoints of the real VLM architectures, built offline.

Each builder makes a checkpoint folder exactly as a downloaded one looks: the family's model class with a tiny
config (random weights), its real processor / image processor / video processor classes, a tokenizer of the
family's tokenizer class carrying the family's special tokens, and the family's published chat template
(``resources/chat_templates/<family>.jinja``; sources in that folder's README). Saved with ``save_pretrained`` and
loaded through :func:`mmfragile.load_model` by path, they prove that every architecture runs through the same code
as a real checkpoint would (the conformance suite in ``tests/test_architectures.py``) and give the engine benchmark
one model per family (``scripts/benchmark_engine.py --arch``).

The vocabularies are tiny (one token per byte or character, plus the family's special tokens) so a checkpoint is
well under a megabyte; the tokenizer *classes* and their pre-tokenizers are the families' own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import torch

from mmfragile.paths import build_once, cache_dir

#: hidden sizes of every tiny language / vision model (small, but with >1 head and >1 layer)
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=4096)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)

#: the language model of a real-processor checkpoint (``build_tiny(family, real_processor=True)``): a
#: high-resolution image is thousands of tokens (position limit as the real models'), and heads 32 wide, the
#: narrowest vLLM's CPU attention has a kernel for (so the same checkpoint runs on every backend)
REAL_TEXT = dict(max_position_embeddings=32768, num_attention_heads=2, num_key_value_heads=1)


def chat_template(family: str) -> str | None:
    f = resources.files("mmfragile.resources") / "chat_templates" / f"{family}.jinja"
    return f.read_text() if f.is_file() else None


# ---------------------------------------------------------------------------------------------- tokenizers
def _byte_vocab() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {ch: i for i, ch in enumerate(sorted(bytes_to_unicode().values()))}


PRINTABLE = [chr(c) for c in range(33, 127)]


def _char_vocab(specials: list[str]) -> dict[str, int]:
    """SentencePiece-style vocabulary: specials, byte-fallback tokens <0xNN>, '▁', printable ASCII and '▁' + each
    printable character (so " A" / a leading "A" is one token, as in the real Llama / Gemma vocabularies)."""
    toks = list(dict.fromkeys(specials)) + [f"<0x{i:02X}>" for i in range(256)] + ["▁"] + PRINTABLE
    toks += ["▁" + c for c in PRINTABLE]
    return {t: i for i, t in enumerate(dict.fromkeys(toks))}


def _trained_bpe(texts: Sequence[str], vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level BPE vocabulary and merges learnt from ``texts``: words it has seen become one token or a few, as
    in a real tokenizer's vocabulary (one token per byte would count English text about four times over)."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(bpe.to_str())["model"]
    return model["vocab"], [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def make_tokenizer(kind: str, specials: dict[str, str], extra: list[str] = (), named: dict[str, str] | None = None,
                   train_on: Sequence[str] | None = None, vocab_size: int = 4096, **kwargs):
    """A tokenizer of class ``kind`` with a tiny vocabulary.

    ``specials``: bos/eos/pad/unk tokens; ``extra``: other special tokens of the family (turn markers, image
    placeholders); ``named``: model-specific special tokens exposed as attributes (``tokenizer.image_token``).
    ``train_on`` (byte-level kinds): BPE merges learnt from these texts (up to ``vocab_size`` tokens), so prompts
    are about as many tokens as with a real vocabulary (the GPU benchmark's cost model); else one token per byte."""
    import transformers

    named = dict(named or {})
    specials = {k: v for k, v in specials.items() if v is not None}
    all_special = list(dict.fromkeys([*specials.values(), *extra, *named.values()]))
    cls = getattr(transformers, kind)
    if kind in ("GemmaTokenizer", "LlamaTokenizer"):
        tok = cls(vocab=_char_vocab(all_special), merges=[("▁", c) for c in PRINTABLE], **specials, **kwargs)
    else:
        vocab, merges = _trained_bpe(train_on, vocab_size) if train_on else (_byte_vocab(), [])
        tok = cls(vocab=vocab, merges=merges, **specials, **kwargs)
    tok.add_special_tokens({"additional_special_tokens": [t for t in all_special if t not in tok.get_vocab()]},
                           replace_extra_special_tokens=False)
    # model-specific named tokens (tokenizer.image_token, tokenizer.image_token_id) as the hub tokenizers carry them
    if named:
        tok._set_model_specific_special_tokens(special_tokens=named)
    return tok


# ---------------------------------------------------------------------------------------------- the families
@dataclass
class TinySpec:
    family: str                      # key (also the chat-template file name)
    build: Callable[[Path], None]    # writes model + processor into the folder
    video: bool = False              # the family's processor takes videos
    interleave: bool = True          # its chat template places images where the content list puts them
    remote_code: bool = False
    real_processor: bool = False     # build(out, real=True) gives the published image-processor settings
    notes: str = ""
    seeds_models: list[str] = field(default_factory=list)


def _save(model, processor, out: Path, generation_eos: list[int] | int | None = None) -> None:
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    if generation_eos is not None:
        model.generation_config.eos_token_id = generation_eos
    model.save_pretrained(out)
    processor.save_pretrained(out)


def _ids(tok, *tokens: str) -> list[int]:
    return [tok.convert_tokens_to_ids(t) for t in tokens]


def _text_config(cls_name: str, tok, real: bool = False, **kw):
    import transformers

    cfg = dict(TEXT, vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    if real:
        cfg.update(REAL_TEXT)
    cfg.update(kw)
    return getattr(transformers, cls_name)(**cfg)


def _model(cls_name: str, config, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():  # zero-initialised projections / gates (Gemma-3, Llama-3.2-Vision) would hide the images
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, 0.2)
    return model


CHATML = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None}


def build_llava(out: Path) -> None:
    from transformers import CLIPImageProcessor, CLIPVisionConfig, LlavaConfig, LlavaProcessor

    tok = make_tokenizer("LlamaTokenizer", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                            "pad_token": "<pad>"}, named={"image_token": "<image>"})
    vision = CLIPVisionConfig(**VISION, image_size=28, patch_size=14, projection_dim=32)
    cfg = LlavaConfig(vision_config=vision, text_config=_text_config("LlamaConfig", tok),
                      image_token_index=tok.image_token_id, image_seq_length=4)
    ip = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    proc = LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, chat_template=chat_template("llava"))
    _save(_model("LlavaForConditionalGeneration", cfg), proc, out)


def build_llava_next(out: Path) -> None:
    from transformers import CLIPVisionConfig, LlavaNextConfig, LlavaNextImageProcessor, LlavaNextProcessor

    tok = make_tokenizer("LlamaTokenizer", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                            "pad_token": "<pad>"}, named={"image_token": "<image>"})
    pinpoints = [[28, 56], [56, 28], [56, 56]]
    vision = CLIPVisionConfig(**VISION, image_size=28, patch_size=14, projection_dim=32)
    cfg = LlavaNextConfig(vision_config=vision, text_config=_text_config("MistralConfig", tok),
                          image_token_index=tok.image_token_id, image_grid_pinpoints=pinpoints)
    ip = LlavaNextImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28},
                                 image_grid_pinpoints=pinpoints)
    proc = LlavaNextProcessor(image_processor=ip, tokenizer=tok, patch_size=14, vision_feature_select_strategy="default",
                              num_additional_image_tokens=1, chat_template=chat_template("llava_next"))
    _save(_model("LlavaNextForConditionalGeneration", cfg), proc, out)


def build_llava_onevision(out: Path, real: bool = False) -> None:
    from transformers import (LlavaOnevisionConfig, LlavaOnevisionImageProcessor, LlavaOnevisionProcessor,
                              LlavaOnevisionVideoProcessor, SiglipVisionConfig)

    tok = make_tokenizer("Qwen2Tokenizer", CHATML, extra=["<|im_start|>"],
                         named={"image_token": "<image>", "video_token": "<video>"})
    # real: llava-hf/llava-onevision-qwen2-7b-ov-hf (and -72b-ov-hf) preprocessor_config.json - 384 px SigLIP tiles
    # (27 x 27 = 729 tokens each), anyres grid pinpoints every multiple of 384 up to 2304 x 2304; processor
    # num_image_tokens 729, vision_aspect_ratio anyres_max_9
    tile = 384 if real else 28
    pinpoints = ([[h, w] for h in range(384, 2305, 384) for w in range(384, 2305, 384)] if real else
                 [[28, 28], [28, 56], [56, 28], [56, 56]])
    vision = SiglipVisionConfig(**VISION, image_size=tile, patch_size=14)
    cfg = LlavaOnevisionConfig(vision_config=vision, text_config=_text_config("Qwen2Config", tok, real),
                               image_token_index=tok.image_token_id, video_token_index=tok.video_token_id,
                               image_grid_pinpoints=pinpoints, vision_feature_select_strategy="full",
                               vision_feature_layer=-1)
    ip = LlavaOnevisionImageProcessor(size={"height": tile, "width": tile}, image_grid_pinpoints=pinpoints)
    vp = LlavaOnevisionVideoProcessor(size={"height": tile, "width": tile})
    proc = LlavaOnevisionProcessor(image_processor=ip, video_processor=vp, tokenizer=tok,
                                   num_image_tokens=(tile // 14) ** 2,
                                   vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9",
                                   chat_template=chat_template("llava_onevision"))
    _save(_model("LlavaOnevisionForConditionalGeneration", cfg), proc, out)


QWEN_VL_TOKENS = ["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def _qwen_tok():
    return make_tokenizer("Qwen2Tokenizer", CHATML, extra=QWEN_VL_TOKENS,
                          named={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                 "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"})


def _build_qwen(out: Path, version: str, real: bool = False) -> None:
    import transformers
    from transformers import Qwen2VLImageProcessor

    tok = _qwen_tok()
    patch = 16 if version == "3" else 14
    # 56 x 56 px -> 4 x 4 patches -> 2 x 2 merged tokens; bounds keep realistic aspect handling at tiny cost.
    # real: Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json (as Qwen2-VL's) - min_pixels 3136,
    # max_pixels 12845056 (a 3840 x 2160 image keeps its size: ~10,500 image tokens)
    size = ({"shortest_edge": 3136, "longest_edge": 12845056} if real else
            {"shortest_edge": (2 * patch) ** 2, "longest_edge": (4 * patch) ** 2 * 4})
    ip = Qwen2VLImageProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2, size=size)
    # M-RoPE sections split half a head's width: 8 for the 16-wide heads, 16 for the real-processor LM's 32
    rope = {"rope_type": "default", "mrope_section": [4, 6, 6] if real else [2, 3, 3], "rope_theta": 10000.0}
    ids = dict(image_token_id=tok.image_token_id, video_token_id=tok.video_token_id,
               vision_start_token_id=tok.vision_start_token_id, vision_end_token_id=tok.vision_end_token_id)
    vis = dict(depth=2, hidden_size=32, num_heads=2, patch_size=patch, spatial_merge_size=2, temporal_patch_size=2)
    if version == "2":
        vision = transformers.Qwen2VLVisionConfig(**vis, embed_dim=32, mlp_ratio=2, in_channels=3)
        vision.hidden_size = 64  # the merger projects into the LM width
        text = _text_config("Qwen2VLTextConfig", tok, real, rope_parameters=rope)
        cfg, model_cls, proc_cls, vp_cls = (transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **ids),
                                            "Qwen2VLForConditionalGeneration", transformers.Qwen2VLProcessor,
                                            transformers.Qwen2VLVideoProcessor)
        template = "qwen2_vl"
    elif version == "2.5":
        vision = transformers.Qwen2_5_VLVisionConfig(**vis, intermediate_size=64, out_hidden_size=64, window_size=56,
                                                      fullatt_block_indexes=[1])
        text = _text_config("Qwen2_5_VLTextConfig", tok, real, rope_parameters=rope)
        cfg, model_cls, proc_cls, vp_cls = (transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids),
                                            "Qwen2_5_VLForConditionalGeneration", transformers.Qwen2_5_VLProcessor,
                                            transformers.Qwen2VLVideoProcessor)
        template = "qwen2_vl"
    else:
        vision = transformers.Qwen3VLVisionConfig(**vis, intermediate_size=64, out_hidden_size=64,
                                                   num_position_embeddings=64, deepstack_visual_indexes=[0])
        text = _text_config("Qwen3VLTextConfig", tok, real, head_dim=32 if real else 16,
                            rope_parameters={**rope, "mrope_interleaved": True})
        cfg, model_cls, proc_cls, vp_cls = (transformers.Qwen3VLConfig(text_config=text, vision_config=vision, **ids),
                                            "Qwen3VLForConditionalGeneration", transformers.Qwen3VLProcessor,
                                            transformers.Qwen3VLVideoProcessor)
        template = "qwen3_vl"
    vp = vp_cls(patch_size=patch, merge_size=2, temporal_patch_size=2,
                size={"shortest_edge": (2 * patch) ** 2 * 2, "longest_edge": (4 * patch) ** 2 * 8})
    proc = proc_cls(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=chat_template(template))
    _save(_model(model_cls, cfg), proc, out, generation_eos=_ids(tok, "<|im_end|>", "<|endoftext|>"))


def build_gemma3(out: Path, real: bool = False) -> None:
    from transformers import Gemma3Config, Gemma3ImageProcessor, Gemma3Processor, SiglipVisionConfig

    tok = make_tokenizer("GemmaTokenizer", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                                            "unk_token": "<unk>"}, extra=["<start_of_turn>", "<end_of_turn>"],
                         named={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                "image_token": "<image_soft_token>"})
    # real: google/gemma-3-4b-it preprocessor_config.json - 896 x 896 (64 x 64 SigLIP patches pooled to 256
    # tokens), do_pan_and_scan null (off); processor image_seq_length 256; its config's sliding window 1024
    px, tokens, window = (896, 256, 1024) if real else (28, 4, 512)
    vision = SiglipVisionConfig(**VISION, image_size=px, patch_size=14, vision_use_head=False)
    text = _text_config("Gemma3TextConfig", tok, real, head_dim=32 if real else 16, sliding_window=window,
                        query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"])
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=tokens,
                       boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id,
                       image_token_index=tok.image_token_id)
    ip = Gemma3ImageProcessor(size={"height": px, "width": px})  # pan-and-scan off: its default, as shipped
    proc = Gemma3Processor(image_processor=ip, tokenizer=tok, image_seq_length=tokens,
                           chat_template=chat_template("gemma3"))
    _save(_model("Gemma3ForConditionalGeneration", cfg), proc, out,
          generation_eos=_ids(tok, "<eos>", "<end_of_turn>"))


def build_internvl(out: Path, real: bool = False) -> None:
    from transformers import (GotOcr2ImageProcessor, InternVLConfig, InternVLProcessor, InternVLVideoProcessor,
                              InternVLVisionConfig)

    tok = make_tokenizer("Qwen2Tokenizer", CHATML, extra=["<|im_start|>"],
                         named={"start_image_token": "<img>", "end_image_token": "</img>",
                                "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})
    # real: OpenGVLab/InternVL3_5-8B-HF processor_config.json - GotOcr2ImageProcessor 448 x 448 tiles, min_patches 1,
    # max_patches 12 (+ a thumbnail), image_seq_length 256 (32 x 32 patches, pixel-shuffled by 0.5); the
    # processor crops to patches by default (InternVLProcessor images_kwargs crop_to_patches=True)
    px, tiles = (448, 12) if real else (28, 4)
    tokens = (px // 28) ** 2  # 14 px patches, downsample_ratio 0.5
    vision = InternVLVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=[px, px], patch_size=[14, 14])
    cfg = InternVLConfig(vision_config=vision, text_config=_text_config("Qwen2Config", tok, real),
                         image_token_id=tok.context_image_token_id, image_seq_length=tokens, downsample_ratio=0.5)
    ip = GotOcr2ImageProcessor(size={"height": px, "width": px}, crop_to_patches=True, min_patches=1,
                               max_patches=tiles)
    vp = InternVLVideoProcessor(size={"height": px, "width": px})
    proc = InternVLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, image_seq_length=tokens,
                             chat_template=chat_template("internvl"))
    _save(_model("InternVLForConditionalGeneration", cfg), proc, out, generation_eos=_ids(tok, "<|im_end|>"))


def _idefics_tokens() -> list[str]:
    return (["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]
            + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])


def build_idefics3(out: Path, real: bool = False) -> None:
    from transformers import Idefics3Config, Idefics3ImageProcessor, Idefics3Processor, Idefics3VisionConfig

    tok = make_tokenizer("PreTrainedTokenizerFast", {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                                                     "pad_token": "<|reserved_special_token_0|>"},
                         extra=_idefics_tokens())
    # real: HuggingFaceM4/Idefics3-8B-Llama3 preprocessor_config.json - do_image_splitting, size longest_edge 1456,
    # max_image_size 364 (tiles of 26 x 26 patches, pixel-shuffled by 2: image_seq_len 169)
    tile = 364 if real else 28
    vision = Idefics3VisionConfig(**VISION, image_size=tile, patch_size=14)
    cfg = Idefics3Config(vision_config=vision, text_config=_text_config("LlamaConfig", tok, real), scale_factor=2,
                         image_token_id=tok.convert_tokens_to_ids("<image>"))
    ip = Idefics3ImageProcessor(size={"longest_edge": 4 * tile if real else 56}, max_image_size={"longest_edge": tile},
                                do_image_splitting=True)
    proc = Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=(tile // 28) ** 2,
                             chat_template=chat_template("idefics3"))
    _save(_model("Idefics3ForConditionalGeneration", cfg), proc, out,
          generation_eos=_ids(tok, "<end_of_utterance>", "<|end_of_text|>"))


def build_smolvlm(out: Path, real: bool = False) -> None:
    from transformers import (SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor,
                              SmolVLMVisionConfig)

    tok = make_tokenizer("GPT2Tokenizer", {"bos_token": "<|im_start|>", "eos_token": "<end_of_utterance>",
                                           "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>"},
                         extra=_idefics_tokens() + ["<|im_start|>"],
                         named={"fake_image_token": "<fake_token_around_image>", "image_token": "<image>",
                                "end_of_utterance_token": "<end_of_utterance>", "global_image_token": "<global-img>"})
    # real: HuggingFaceTB/SmolVLM2-256M-Video-Instruct preprocessor_config.json - do_image_splitting, size longest_edge
    # 2048, max_image_size 512 (tiles of 32 x 32 patches of 16 px, pixel-shuffled by 4: image_seq_len 64)
    tile, patch, scale = (512, 16, 4) if real else (28, 14, 2)
    vision = SmolVLMVisionConfig(**VISION, image_size=tile, patch_size=patch)
    cfg = SmolVLMConfig(vision_config=vision, text_config=_text_config("LlamaConfig", tok, real), scale_factor=scale,
                        image_token_id=tok.image_token_id)
    ip = SmolVLMImageProcessor(size={"longest_edge": 4 * tile if real else 56}, max_image_size={"longest_edge": tile},
                               do_image_splitting=True)
    vp = SmolVLMVideoProcessor(size={"longest_edge": tile}, max_image_size={"longest_edge": tile})
    proc = SmolVLMProcessor(image_processor=ip, tokenizer=tok, video_processor=vp,
                            image_seq_len=(tile // patch // scale) ** 2,
                            chat_template=chat_template("smolvlm"))
    _save(_model("SmolVLMForConditionalGeneration", cfg), proc, out, generation_eos=_ids(tok, "<end_of_utterance>"))


def build_paligemma(out: Path) -> None:
    from transformers import GemmaConfig, PaliGemmaConfig, PaliGemmaProcessor, SiglipImageProcessor, SiglipVisionConfig

    tok = make_tokenizer("GemmaTokenizer", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                                            "unk_token": "<unk>"}, extra=["<image>"])
    vision = SiglipVisionConfig(**VISION, image_size=28, patch_size=14, projection_dim=64)
    text = GemmaConfig(**dict(TEXT, vocab_size=len(tok) + 1100, head_dim=16, bos_token_id=tok.bos_token_id,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    cfg = PaliGemmaConfig(vision_config=vision, text_config=text, image_token_index=tok.convert_tokens_to_ids("<image>"),
                          projection_dim=64, hidden_size=64)
    ip = SiglipImageProcessor(size={"height": 28, "width": 28})
    ip.image_seq_length = 4
    proc = PaliGemmaProcessor(image_processor=ip, tokenizer=tok)  # PaliGemma publishes no chat template
    model = _model("PaliGemmaForConditionalGeneration", cfg)
    model.resize_token_embeddings(len(proc.tokenizer))  # the processor adds <loc>/<seg> tokens
    _save(model, proc, out)


def build_phi4_multimodal(out: Path) -> None:
    from transformers import (Phi4MultimodalAudioConfig, Phi4MultimodalConfig, Phi4MultimodalFeatureExtractor,
                              Phi4MultimodalImageProcessor, Phi4MultimodalProcessor, Phi4MultimodalVisionConfig)

    tok = make_tokenizer("GPT2Tokenizer", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                                           "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"},
                         extra=["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>"],
                         named={"image_token": "<|image|>", "audio_token": "<|audio|>"},
                         chat_template=chat_template("phi4_multimodal_tokenizer"))
    # the image processor hard-codes 448 px crops of 14 px patches (256 + 16 tokens per crop): keep them
    vision = Phi4MultimodalVisionConfig(**VISION, image_size=448, patch_size=14, crop_size=448,
                                        image_token_id=tok.image_token_id)
    audio = Phi4MultimodalAudioConfig(hidden_size=32, intermediate_size=64, num_blocks=1, num_attention_heads=2,
                                      audio_token_id=tok.audio_token_id, nemo_conv_channels=32, nemo_final_size=10)
    cfg = Phi4MultimodalConfig(**dict(TEXT, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                      tie_word_embeddings=False),
                               vision_config=vision, audio_config=audio)
    ip = Phi4MultimodalImageProcessor(size={"height": 448, "width": 448}, patch_size=14, dynamic_hd=2)
    fe = Phi4MultimodalFeatureExtractor()
    proc = Phi4MultimodalProcessor(image_processor=ip, audio_processor=fe, tokenizer=tok,
                                   chat_template=chat_template("phi4_multimodal"))
    _save(_model("Phi4MultimodalForCausalLM", cfg), proc, out, generation_eos=_ids(tok, "<|end|>", "<|endoftext|>"))


def build_mllama(out: Path) -> None:
    from transformers import MllamaConfig, MllamaImageProcessor, MllamaProcessor, MllamaTextConfig, MllamaVisionConfig

    tok = make_tokenizer("PreTrainedTokenizerFast", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                                                     "pad_token": "<|finetune_right_pad_id|>"},
                         extra=["<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>", "<|end_of_text|>"],
                         named={"image_token": "<|image|>"})
    vision = MllamaVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1,
                                attention_heads=2, image_size=28, patch_size=14, max_num_tiles=2, vision_output_dim=64,
                                intermediate_layers_indices=[0], supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]])
    text = MllamaTextConfig(**dict(TEXT, num_hidden_layers=3), vocab_size=len(tok), cross_attention_layers=[1],
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    cfg = MllamaConfig(vision_config=vision, text_config=text, image_token_index=tok.image_token_id)
    ip = MllamaImageProcessor(size={"height": 28, "width": 28}, max_image_tiles=2)
    proc = MllamaProcessor(image_processor=ip, tokenizer=tok, chat_template=chat_template("mllama"))
    _save(_model("MllamaForConditionalGeneration", cfg), proc, out, generation_eos=_ids(tok, "<|eot_id|>", "<|end_of_text|>"))


FAMILIES: dict[str, TinySpec] = {s.family: s for s in [
    TinySpec("llava", build_llava, interleave=False, seeds_models=["LLaVA-1.5-7B"]),
    TinySpec("llava_next", build_llava_next, interleave=False, seeds_models=["LLaVA-NeXT"]),
    TinySpec("llava_onevision", build_llava_onevision, video=True, interleave=False, real_processor=True,
             seeds_models=["LLaVA-OneVision-7B", "LLaVA-Critic-7B/72B"]),
    TinySpec("qwen2_vl", lambda out: _build_qwen(out, "2"), video=True, seeds_models=["Qwen2-VL-7B-Instruct"]),
    TinySpec("qwen2_5_vl", lambda out, real=False: _build_qwen(out, "2.5", real), video=True, real_processor=True,
             seeds_models=["Qwen2.5-VL-7B/72B-Instruct"]),
    TinySpec("qwen3_vl", lambda out: _build_qwen(out, "3"), video=True, seeds_models=["Qwen3-VL-8B-Instruct/Thinking"]),
    TinySpec("gemma3", build_gemma3, real_processor=True, seeds_models=["Gemma-3-4B-it"]),
    TinySpec("internvl", build_internvl, video=True, real_processor=True, seeds_models=["InternVL2.5-1B/8B/38B", "InternVL3.5-8B/14B"]),
    TinySpec("idefics3", build_idefics3, real_processor=True, seeds_models=["Idefics3-8B"]),
    TinySpec("smolvlm", build_smolvlm, video=True, real_processor=True, seeds_models=["SmolVLM"]),
    TinySpec("paligemma", build_paligemma, interleave=False, seeds_models=["PaliGemma"]),
    TinySpec("phi4_multimodal", build_phi4_multimodal, seeds_models=["Phi-4-multimodal-instruct"]),
    TinySpec("mllama", build_mllama, interleave=False, seeds_models=["Llama-3.2-11B-Vision"]),
]}


def build_tiny(family: str, root: str | Path | None = None, force: bool = False, real_processor: bool = False) -> Path:
    """Folder of the tiny ``family`` checkpoint (built once into ``root`` or the cache, then reused).

    ``real_processor``: the family's image processor as its published checkpoint ships it (high-resolution images
    become thousands of tokens: Qwen's pixel bounds, LLaVA-OneVision's anyres grid, InternVL's tiles,
    Idefics3 / SmolVLM image splitting, Gemma-3's 896 px), with the vision tower's tile size and tokens per tile
    to match; the towers and the language model stay tiny (folder ``<family>-real``). Families:
    :data:`REAL_PROCESSOR_FAMILIES`."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {sorted(FAMILIES)}")
    spec = FAMILIES[family]
    if real_processor and not spec.real_processor:
        raise ValueError(f"{family}: no real-processor build; choose from {REAL_PROCESSOR_FAMILIES}")
    name = f"{family}-real" if real_processor else family
    target = Path(root) / name if root is not None else cache_dir("tiny") / name
    if force and target.exists():
        import shutil

        shutil.rmtree(target)
    return build_once(target, (lambda out: spec.build(out, real=True)) if real_processor else spec.build)


#: families whose tiny checkpoint can be built with the published image-processor settings
REAL_PROCESSOR_FAMILIES = tuple(sorted(f for f, spec in FAMILIES.items() if spec.real_processor))
