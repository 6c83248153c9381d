"""`transformers` backend: any local causal LM or image-text-to-text checkpoint behind :class:`MLLM`.

The same class drives the embedded default models (:mod:`mmfragile.models.embedded`) and real
checkpoints from a local path or the HF cache (LLaVA, Qwen2-VL, Phi, Gemma-3, ...): the prompt is
rendered with the checkpoint's own chat template, images go through its own processor.

All three calls are deterministic (greedy, no sampling) and batched with left padding, so the
last position of every row is the next-token position.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..schema import DataError
from .base import LogLik, MLLM, Prompt


def load_image(img: Any, where: str = "prompt"):
    """PIL image in RGB from a PIL image or a path; DataError naming the file if missing/corrupt."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(img, Image.Image):
        return img.convert("RGB")
    p = Path(img)
    if not p.is_file():
        raise DataError(f"{where}: image file not found: {p}")
    try:
        with Image.open(p) as im:
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise DataError(f"{where}: corrupt or unreadable image {p}: {e}") from e


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class SeededGumbelSampler:
    """Logits processor that turns greedy decoding into sampling from ``softmax(logits / T)`` restricted
    to the top-``p`` nucleus, with one independent random stream per batch row (Gumbel-max trick:
    ``argmax(l_i + G_i)`` with ``G_i ~ Gumbel(0, 1)`` is a sample from ``softmax(l)``)."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.t = float(temperature)
        self.top_p = float(top_p)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        s = scores.float() / self.t
        if self.top_p < 1.0:
            srt, idx = torch.sort(s, dim=-1, descending=True)
            p = torch.softmax(srt, dim=-1)
            drop_sorted = (torch.cumsum(p, dim=-1) - p) > self.top_p  # keep the smallest set with mass >= top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
            s = s.masked_fill(drop, float("-inf"))
        v = s.shape[-1]
        u = torch.stack([torch.rand(v, generator=g) for g in self.gens]).to(s.device)
        gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
        return s + gumbel


class HFModel(MLLM):
    """A `transformers` model + its processor (or tokenizer, for text-only LMs)."""

    def __init__(self, model, processor, name: str | None = None, batch_size: int = 8):
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.supports_images = hasattr(processor, "image_processor")
        self.name = name or Path(str(getattr(model.config, "_name_or_path", "model"))).name or "model"
        self.batch_size = batch_size
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = next(model.parameters()).device

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, name: str | None = None, device: str | None = None,
                        dtype: torch.dtype | str | None = None, batch_size: int = 8, **kwargs) -> "HFModel":
        """Load a local checkpoint folder (or a model id already in the HF cache; no download is attempted
        when ``HF_HUB_OFFLINE=1``). Vision checkpoints (a ``vision_config`` in config.json) load with
        ``AutoModelForImageTextToText`` + ``AutoProcessor``, others with ``AutoModelForCausalLM`` + tokenizer."""
        from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor,
                                  AutoTokenizer)

        device = device or default_device()
        if dtype is None:
            dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        config = AutoConfig.from_pretrained(path, **kwargs)
        if getattr(config, "vision_config", None) is not None:
            model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, **kwargs)
            processor = AutoProcessor.from_pretrained(path, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kwargs)
            processor = AutoTokenizer.from_pretrained(path, **kwargs)
        return cls(model.to(device), processor, name=name or Path(str(path)).name, batch_size=batch_size)

    # ------------------------------------------------------------------ prompts
    def render(self, prompt: Prompt) -> str:
        """The exact text fed to the tokenizer: chat template + generation prompt + assistant prefix."""
        messages: list[dict] = []
        if prompt.system:
            messages.append({"role": "system", "content": prompt.system if not self.supports_images
                             else [{"type": "text", "text": prompt.system}]})
        if self.supports_images:
            content = [{"type": "image"} for _ in prompt.images] + [{"type": "text", "text": prompt.text}]
        else:
            if prompt.images:
                raise DataError(f"{self.name} is a text-only model but the prompt has {len(prompt.images)} image(s)")
            content = prompt.text
        messages.append({"role": "user", "content": content})
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text + prompt.assistant_prefix

    def encode(self, prompts: Sequence[Prompt], continuations: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """Left-padded model inputs; with ``continuations`` their tokens are appended to each prompt and
        ``cont_lengths`` gives how many trailing tokens of each row are the continuation."""
        texts = [self.render(p) for p in prompts]
        if self.supports_images:
            images = [load_image(im, f"prompt {i}") for i, p in enumerate(prompts) for im in p.images]
            enc = self.processor(text=texts, images=images or None, return_tensors="pt", padding=True)
        else:
            enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = dict(enc)
        if continuations is not None:
            rows, cont_lens = [], []
            for i, cont in enumerate(continuations):
                ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
                cids = self.tokenizer(cont, add_special_tokens=False)["input_ids"]
                if not cids:
                    raise ValueError(f"continuation {i} is empty after tokenization: {cont!r}")
                rows.append(ids + cids)
                cont_lens.append(len(cids))
            enc["input_ids"], enc["attention_mask"] = self._left_pad(rows)
            enc["cont_lengths"] = torch.tensor(cont_lens)
        return enc

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        return ids, mask

    def _to_device(self, enc: dict) -> dict:
        out = {}
        for k, v in enc.items():
            if isinstance(v, torch.Tensor):
                v = v.to(self.device)
                if v.is_floating_point():
                    v = v.to(self.model.dtype)
            out[k] = v
        return out

    def _batches(self, n: int):
        for s in range(0, n, self.batch_size):
            yield slice(s, min(s + self.batch_size, n))

    # ------------------------------------------------------------------ the interface
    @torch.inference_mode()
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 16) -> list[str]:
        out: list[str] = []
        for sl in self._batches(len(prompts)):
            enc = self._to_device(self.encode(prompts[sl]))
            gen = self.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                      pad_token_id=self.tokenizer.pad_token_id, temperature=None, top_p=None, top_k=None)
            new = gen[:, enc["input_ids"].shape[1]:]
            out += self.tokenizer.batch_decode(new, skip_special_tokens=True)
        return out

    @torch.inference_mode()
    def generate_sampled(self, prompts: Sequence[Prompt], max_new_tokens: int, seeds: Sequence[int],
                         temperature: float = 0.7, top_p: float = 0.9) -> list[str]:
        """Seeded sampling (for repeated judge runs): prompt i samples with its own stream ``seeds[i]`` through a
        Gumbel-max logits processor on the greedy path, so its text depends on its seed, not on its batch."""
        from transformers import LogitsProcessorList

        if len(seeds) != len(prompts):
            raise ValueError("generate_sampled: one seed per prompt")
        out: list[str] = []
        for sl in self._batches(len(prompts)):
            enc = self._to_device(self.encode(prompts[sl]))
            proc = LogitsProcessorList([SeededGumbelSampler(seeds[sl], temperature, top_p)])
            gen = self.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                      logits_processor=proc, pad_token_id=self.tokenizer.pad_token_id,
                                      temperature=None, top_p=None, top_k=None)
            out += self.tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return out

    @torch.inference_mode()
    def next_token_logits(self, prompts: Sequence[Prompt]) -> torch.Tensor:
        """[len(prompts), vocab] logits of the next token, float32 on CPU (one forward pass per batch)."""
        chunks = []
        for sl in self._batches(len(prompts)):
            enc = self._to_device(self.encode(prompts[sl]))
            logits = self.model(**enc, logits_to_keep=1).logits[:, -1, :]
            chunks.append(logits.float().cpu())
        return torch.cat(chunks)

    def first_token_id(self, text: str) -> int:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"candidate {text!r} tokenizes to nothing")
        return ids[0]

    def option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        logits = self.next_token_logits(prompts)
        return [logits[i, [self.first_token_id(c) for c in cands]].numpy() for i, cands in enumerate(candidates)]

    @torch.inference_mode()
    def loglikelihood(self, prompts: Sequence[Prompt], continuations: Sequence[str]) -> list[LogLik]:
        out: list[LogLik] = []
        for sl in self._batches(len(prompts)):
            enc = self.encode(prompts[sl], continuations[sl])
            cont_lens = enc.pop("cont_lengths")
            enc = self._to_device(enc)
            logp = torch.log_softmax(self.model(**enc).logits.float(), dim=-1)
            ids = enc["input_ids"]
            for i, n in enumerate(cont_lens.tolist()):
                target = ids[i, -n:]
                pred = logp[i, -n - 1:-1, :]  # position t predicts token t+1
                out.append(LogLik(float(pred.gather(1, target[:, None]).sum()), n))
        return out

    def max_id_tokens(self, ids: Sequence[str]) -> int:
        return max(len(self.tokenizer(i, add_special_tokens=False)["input_ids"]) for i in ids)
