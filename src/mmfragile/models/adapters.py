"""Per-family knowledge of `transformers` vision-language models, in one place.

:class:`~mmfragile.models.hf.HFModel` and the prefix-sharing engine (:mod:`mmfragile.engine`) are written once for
every architecture; everything that differs between families lives in a :class:`FamilyAdapter`:

* how a :class:`Prompt` becomes chat messages (images interleaved where the text names them, or first; a video as a
  video or as frames) and which chat template renders them (the checkpoint's own, else a documented fallback);
* how images and videos are handed to the processor (one list per prompt, so batches with mixed image counts work);
* which processor outputs run along the tokens (``token_type_ids``, ``mm_token_type_ids``, ``cross_attention_mask``)
  and must be cut, extended or padded with them, and which outputs never reach ``forward`` (``labels``);
* for the engine: the position ids of a row (1-D, or Qwen's 3-D M-RoPE), what a tail forward needs besides its
  tokens, and when sharing a prefix's KV cache cannot be exact (then the engine refuses, with the reason).

A new family is one adapter (usually a few class attributes) registered in :data:`ADAPTERS`, plus one tiny
checkpoint builder in :mod:`mmfragile.models.tiny` for the conformance suite.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from mmfragile.errors import DataError
from mmfragile.models.base import IMAGE_MARKER, Prompt, split_interleaved, unnamed_images


class EngineInexact(ValueError):
    """The prefix-sharing engine cannot reproduce ``generate`` exactly for these inputs; the message says why."""


class FamilyAdapter:
    #: ``config.model_type`` values this adapter serves
    model_types: tuple[str, ...] = ()
    #: transformers Auto class of the checkpoint's model
    auto_class: str = "AutoModelForImageTextToText"
    #: the chat template places each image where the content list puts it (else all images come first)
    interleave: bool = True
    #: the processor takes videos (else a video's frames are passed as images)
    video: bool = False
    #: processor outputs aligned with input_ids, and the value a continuation token gets in each
    per_token: dict[str, int] = {"token_type_ids": 0, "mm_token_type_ids": 0}
    #: processor outputs that never reach forward()
    drop_keys: tuple[str, ...] = ("labels",)
    #: the engine's prefix sharing is exact for this family (None), or the reason it is not
    engine_refusal: str | None = None

    # ------------------------------------------------------------------ prompts
    def content(self, prompt: Prompt) -> list[dict]:
        """The user turn's content parts. A video prompt is one video part (families without video take its frames
        as images). Where the family interleaves, ``<image k>`` markers are replaced by image k (its first mention;
        a later mention stays text) and images the text never names come first; otherwise the markers stay in the
        text and all images come first, in order (as VLMEvalKit does for models without interleaved input)."""
        return self._layout(prompt)[0]

    def image_order(self, prompt: Prompt) -> list[int]:
        """Indices of ``prompt.images`` in the order their image parts appear in :meth:`content`."""
        return self._layout(prompt)[1]

    def _layout(self, prompt: Prompt) -> tuple[list[dict], list[int]]:
        text, n = prompt.text, len(prompt.images)
        if prompt.video and prompt.images and self.video:
            return [{"type": "video"}, {"type": "text", "text": text}], []
        if not (self.interleave and IMAGE_MARKER.search(text)):
            return [{"type": "image"}] * n + [{"type": "text", "text": text}], list(range(n))
        try:
            pieces = split_interleaved(text, n)
        except ValueError as e:
            raise DataError(f"{e}: {text[:120]!r}") from e
        order = unnamed_images(text, n)
        parts: list[dict] = [{"type": "image"}] * len(order)
        for piece in pieces:
            if isinstance(piece, int) and piece not in order:
                parts.append({"type": "image"})
                order.append(piece)
            else:
                parts.append({"type": "text", "text": piece if isinstance(piece, str) else f"<image {piece + 1}>"})
        return _merge_text(parts), order

    def messages(self, prompt: Prompt) -> list[dict]:
        msgs: list[dict] = []
        if prompt.system:
            msgs.append({"role": "system", "content": [{"type": "text", "text": prompt.system}]})
        msgs.append({"role": "user", "content": self.content(prompt)})
        return msgs

    def render(self, processor, prompt: Prompt) -> str:
        """The exact text given to the processor: chat template + generation prompt + assistant prefix."""
        msgs = self.messages(prompt)
        if getattr(processor, "chat_template", None):
            text = processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        else:
            text = self.render_without_template(processor, msgs)
        return text + prompt.assistant_prefix

    def render_without_template(self, processor, msgs: list[dict]) -> str:
        """Checkpoints whose processor has no chat template: the tokenizer's template with each image as the
        processor's image token (Phi-4's processor loses its template on load while the tokenizer keeps it)."""
        tok = getattr(processor, "tokenizer", processor)
        if not getattr(tok, "chat_template", None):
            raise ValueError(f"{type(processor).__name__} has no chat template and neither has its tokenizer: pass "
                             "a chat_template when loading, or use a family adapter with a documented fallback")
        image_token = getattr(processor, "image_token", None) or ""
        flat = [{"role": m["role"], "content": "".join(
            image_token if p["type"] in ("image", "video") else p["text"] for p in m["content"])} for m in msgs]
        return tok.apply_chat_template(flat, tokenize=False, add_generation_prompt=True)

    # ------------------------------------------------------------------ processor inputs
    def media(self, prompts: Sequence[Prompt], load_image) -> dict[str, Any]:
        """images (one list per prompt, in content order) and videos (one frame list per video prompt)."""
        images, videos = [], []
        for i, p in enumerate(prompts):
            loaded = [load_image(im, f"prompt {i}") for im in p.images]
            if p.video and loaded and self.video:
                images.append([])
                videos.append(loaded)
            else:
                images.append([loaded[k] for k in self.image_order(p)])
        out: dict[str, Any] = {}
        if any(images):
            out["images"] = images
        if videos:
            out["videos"] = videos
        return out

    def batch_key(self, prompt: Prompt) -> Any:
        """Prompts with different keys never share a processor call (default: any prompts may)."""
        return None

    # ------------------------------------------------------------------ engine hooks
    def position_ids(self, model, enc: dict) -> torch.Tensor:
        """Position ids of every token of a left-padded batch, as ``generate`` would use them: [B, L] (or [3, B, L]
        for M-RoPE). Padding positions hold 0."""
        mask = enc["attention_mask"]
        return ((mask.cumsum(1) - 1) * mask).long()

    def expand_positions(self, pos: torch.Tensor) -> torch.Tensor:
        """Decode-step positions [b, t] in the layout forward() takes (identity for 1-D RoPE)."""
        return pos

    def tail_keys(self) -> tuple[str, ...]:
        """Per-token processor outputs that a forward over tail tokens needs (sliced along with the tokens)."""
        return ()

    def decode_kwargs(self, tail_kwargs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Extra inputs of a one-token decode step, from those of the previous step."""
        return {}

    def check_exact(self, model, total_lengths: Sequence[int], pad_widths: Sequence[int], max_new_tokens: int) -> None:
        """Raise :class:`EngineInexact` if sharing a prefix cache with padded tails would change the result."""
        window = _sliding_window(model.config)
        if window is not None:
            longest = max(n + p for n, p in zip(total_lengths, pad_widths)) + max_new_tokens
            if longest > window:
                raise EngineInexact(f"a row reaches {longest} cache slots but the sliding-window layers attend to "
                                    f"{window}: the padding between prefix and tail would shift the window")


def _merge_text(parts: list[dict]) -> list[dict]:
    out: list[dict] = []
    for p in parts:
        if p["type"] == "text" and out and out[-1]["type"] == "text":
            out[-1] = {"type": "text", "text": out[-1]["text"] + p["text"]}
        else:
            out.append(p)
    return out


def _sliding_window(config) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    if getattr(text, "use_sliding_window", True) is False:
        return None
    return int(window)


# ---------------------------------------------------------------------------------------------- families
class LlavaAdapter(FamilyAdapter):
    model_types = ("llava", "llava_next")
    interleave = False  # the published templates render every image first ("<image>\n" ... then the text)


class LlavaOnevisionAdapter(LlavaAdapter):
    model_types = ("llava_onevision",)
    video = True


class QwenVLAdapter(FamilyAdapter):
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL (and MoE variant): interleaved images, videos, 3-D M-RoPE positions."""
    model_types = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
    video = True

    def position_ids(self, model, enc: dict) -> torch.Tensor:
        if enc.get("image_grid_thw") is None and enc.get("video_grid_thw") is None:
            return super().position_ids(model, enc)[None].expand(3, -1, -1)
        pos, _ = model.model.get_rope_index(enc["input_ids"], mm_token_type_ids=enc["mm_token_type_ids"],
                                            image_grid_thw=enc.get("image_grid_thw"),
                                            video_grid_thw=enc.get("video_grid_thw"),
                                            attention_mask=enc["attention_mask"])
        return pos * enc["attention_mask"][None]

    def expand_positions(self, pos: torch.Tensor) -> torch.Tensor:
        return pos[None].expand(3, -1, -1) if pos.dim() == 2 else pos


class Gemma3Adapter(FamilyAdapter):
    """Gemma-3: image tokens attend bidirectionally within their image (token_type_ids); the prefix forward gets
    them, the tails hold no image tokens, so causal tails are exact. Sliding-window layers bound the engine."""
    model_types = ("gemma3",)


class PaliGemmaAdapter(FamilyAdapter):
    model_types = ("paligemma",)
    interleave = False
    per_token = {"token_type_ids": 1}  # continuation tokens are the "suffix": causal, as generated tokens are
    engine_refusal = ("PaliGemma attends bidirectionally over the whole prompt (image + text prefix), so a shared "
                      "prefix's KV cache depends on each variant's tail: prefix sharing cannot be exact")

    def render(self, processor, prompt: Prompt) -> str:
        """PaliGemma publishes no chat template: the prompt is its image tokens then the plain text (the system
        text, if any, on the line before); the processor puts <bos> after the images and the newline that starts
        generation after the text."""
        if getattr(processor, "chat_template", None):
            return super().render(processor, prompt)
        if not prompt.images:
            raise DataError("PaliGemma needs at least one image in every prompt (its processor refuses text alone)")
        if prompt.assistant_prefix:
            raise ValueError("PaliGemma's prompt format has no assistant turn to prefix (its processor appends the "
                             "newline that starts generation): use assistant_prefix='' for this family")
        text = prompt.text if not prompt.system else f"{prompt.system}\n{prompt.text}"
        return processor.image_token * len(prompt.images) + text


class InternVLAdapter(FamilyAdapter):
    model_types = ("internvl",)
    video = True


class Idefics3Adapter(FamilyAdapter):
    model_types = ("idefics3",)


class SmolVLMAdapter(FamilyAdapter):
    model_types = ("smolvlm",)
    video = True

    def batch_key(self, prompt: Prompt) -> Any:
        return bool(prompt.video and prompt.images)  # images and video frames both arrive as pixel_values


class Phi4MultimodalAdapter(FamilyAdapter):
    model_types = ("phi4_multimodal",)
    auto_class = "AutoModelForCausalLM"  # registered there, though its config carries a vision_config


class MllamaAdapter(FamilyAdapter):
    """Llama-3.2-Vision: images enter through cross-attention layers; every text token carries a
    cross_attention_mask row saying which image tiles it may attend to."""
    model_types = ("mllama",)
    interleave = False  # the template emits one <|image|> before the text
    per_token = {"cross_attention_mask": -1}  # -1: repeat the last row (what generate does for new tokens)

    def batch_key(self, prompt: Prompt) -> Any:
        # the processor pads every row to the batch's image count, and a padded row does not give the result it
        # gives alone: a row without images gets a zero image whose cross-attention output is not masked out
        # (alone it skips those layers), a 1-image row next to a 2-image row moves by ~1e-4 in its logits
        return len(prompt.images)

    def tail_keys(self):
        return ("cross_attention_mask",)

    def decode_kwargs(self, tail_kwargs):
        return {k: v[:, -1:] for k, v in tail_kwargs.items() if k == "cross_attention_mask"}


class TextAdapter(FamilyAdapter):
    """Text-only causal LMs (the embedded SmolLM2 / Gemma-3 text models): prompts are plain chat turns."""
    auto_class = "AutoModelForCausalLM"
    model_types = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "phi", "gpt2",
                   "smollm3", "olmo", "granite")

    def messages(self, prompt: Prompt) -> list[dict]:
        if prompt.images:
            raise DataError(f"a text-only model got a prompt with {len(prompt.images)} image(s)")
        msgs = [{"role": "system", "content": prompt.system}] if prompt.system else []
        return msgs + [{"role": "user", "content": prompt.text}]


class GenericAdapter(FamilyAdapter):
    """Any other image-text-to-text checkpoint: generate / option_logits / loglikelihood through its own processor
    and template; the engine refuses (no verified adapter for its attention and position ids)."""

    def __init__(self, model_type: str, remote_code: bool = False):
        self.model_types = (model_type,)
        why = "runs the checkpoint's own remote code" if remote_code else "has no verified family adapter"
        self.engine_refusal = (f"model type {model_type!r} {why}: the engine is exact only on families whose "
                               "attention and position ids are known (see mmfragile.models.adapters.ADAPTERS)")


ADAPTERS: dict[str, FamilyAdapter] = {}
for _cls in (LlavaAdapter, LlavaOnevisionAdapter, QwenVLAdapter, Gemma3Adapter, PaliGemmaAdapter, InternVLAdapter,
             Idefics3Adapter, SmolVLMAdapter, Phi4MultimodalAdapter, MllamaAdapter, TextAdapter):
    for _t in _cls.model_types:
        ADAPTERS[_t] = _cls()


def adapter_for(config) -> FamilyAdapter:
    """The adapter of a checkpoint's config: its family's, else a generic one (remote code or unknown type)."""
    model_type = getattr(config, "model_type", "")
    remote = bool(getattr(config, "auto_map", None))
    if model_type in ADAPTERS and not remote:
        return ADAPTERS[model_type]
    if getattr(config, "vision_config", None) is None and not remote:
        text = TextAdapter()
        text.engine_refusal = None if model_type in TextAdapter.model_types else GenericAdapter(model_type).engine_refusal
        return text
    return GenericAdapter(model_type, remote_code=remote)
