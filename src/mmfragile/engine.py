"""Fast evaluation engine: greedy answers and option-ID logits for many prompt variants of one question.

The format-bias grid asks each question in 48 formats x O circular shifts; Promptception asks it under
61 instructions. All variants of a question share a token prefix (system prompt, image tokens, question);
only the tail differs. :class:`PrefixSharingEngine`

1. renders every variant of a question with the model's own chat template and processor,
2. finds their longest common token prefix and runs it - vision encoder included - **once**,
3. copies that KV cache across a batch of variants and runs only the differing tails, left-padded between
   prefix and tail with explicit position ids, so every row sees exactly the positions it would alone,
4. decodes greedily from there for ``max_new_tokens`` steps (1 step when all option IDs are one token:
   then the answer *is* the argmax of the next-token logits and the option-ID logits come from the same pass).

The result equals :meth:`HFModel.generate` token for token (tested), at a fraction of the cost
(``scripts/benchmark_engine.py``). Models with non-1-D position ids (Qwen2-VL's M-RoPE) are not
supported by the prefix cache and fall back to the naive path.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .models.base import Prompt
from .models.hf import HFModel

#: model types whose forward takes plain 1-D position ids (RoPE / learned), so the prefix trick is exact
SUPPORTED_MODEL_TYPES = {"llava", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "phi", "gpt2",
                         "smollm3", "olmo", "granite"}


@dataclass
class EngineOutput:
    text: str                  # greedy continuation, special tokens stripped (as HFModel.generate)
    option_logits: np.ndarray  # first-step logits of each candidate's first token
    argmax_token: int          # first-step argmax over the whole vocabulary


def engine_supported(model) -> bool:
    return isinstance(model, HFModel) and getattr(model.model.config, "model_type", "") in SUPPORTED_MODEL_TYPES


class PrefixSharingEngine:
    def __init__(self, model: HFModel, batch_size: int = 32):
        if not engine_supported(model):
            raise ValueError(f"{getattr(model, 'name', model)}: prefix-sharing engine supports HF models of types "
                             f"{sorted(SUPPORTED_MODEL_TYPES)}")
        self.m = model
        self.batch_size = batch_size
        tok = model.tokenizer
        eos = model.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [tok.eos_token_id])
        self.image_token_id = getattr(model.model.config, "image_token_index", getattr(model.model.config, "image_token_id", None))
        self.stats = {"prefix_tokens": 0, "tail_tokens": 0, "groups": 0}

    # ------------------------------------------------------------------
    def run_group(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]], max_new_tokens: int) -> list[EngineOutput]:
        """Variants of ONE question (same images). Returns one output per prompt, in order."""
        m = self.m
        if len({tuple(map(str, p.images)) for p in prompts}) > 1:
            raise ValueError("run_group takes variants that share their images")
        enc = m.encode(prompts)
        rows = [enc["input_ids"][i][enc["attention_mask"][i].bool()] for i in range(len(prompts))]
        plen = _common_prefix_len(rows)
        plen = min(plen, min(len(r) for r in rows) - 1)  # every tail needs >= 1 token
        if self.image_token_id is not None:
            img_pos = (rows[0] == self.image_token_id).nonzero()
            if len(img_pos) and int(img_pos.max()) >= plen:  # image tokens must sit inside the shared prefix
                raise ValueError("image tokens are not inside the common prefix")
        self.stats["groups"] += 1
        self.stats["prefix_tokens"] += plen
        prefix_inputs = {k: v[:1] if k != "pixel_values" else v for k, v in enc.items() if k not in ("input_ids", "attention_mask")}
        if "pixel_values" in enc and prompts[0].images:
            n_img = len(prompts[0].images)
            prefix_inputs["pixel_values"] = enc["pixel_values"][:n_img]
        prefix_inputs["input_ids"] = rows[0][:plen][None]
        prefix_inputs["attention_mask"] = torch.ones_like(prefix_inputs["input_ids"])
        with torch.inference_mode():
            out = m.model(**m._to_device(prefix_inputs), use_cache=True, logits_to_keep=1)
        prefix_cache = out.cache
        # batch tails of similar length together (less padding), then restore the caller's order
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        results: list[EngineOutput | None] = [None] * len(rows)
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            outs = self._decode_tails([rows[i][plen:] for i in idx], plen, prefix_cache, [candidates[i] for i in idx],
                                      max_new_tokens)
            for i, o in zip(idx, outs):
                results[i] = o
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _decode_tails(self, tails, plen, prefix_cache, candidates, max_new_tokens) -> list[EngineOutput]:
        m, dev = self.m, self.m.device
        b = len(tails)
        width = max(len(t) for t in tails)
        self.stats["tail_tokens"] += sum(len(t) for t in tails)
        pad = m.tokenizer.pad_token_id
        ids = torch.full((b, width), pad, dtype=torch.long)
        tmask = torch.zeros((b, width), dtype=torch.long)
        for i, t in enumerate(tails):  # left-pad the tails: pads sit between prefix and tail, masked out
            ids[i, width - len(t):] = t
            tmask[i, width - len(t):] = 1
        pos = plen + (tmask.cumsum(1) - 1).clamp(min=0)
        mask = torch.cat([torch.ones((b, plen), dtype=torch.long), tmask], 1)
        cache = copy.deepcopy(prefix_cache)
        cache.batch_repeat_interleave(b)
        out = m.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                      cache=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :].float()
        first = logits.argmax(-1)
        opt_logits = [logits[i, [m.first_token_id(c) for c in candidates[i]]].cpu().numpy() for i in range(b)]
        generated = [[int(t)] for t in first]
        done = torch.tensor([int(t) in self.eos_ids for t in first])
        next_tok, next_pos = first, pos[:, -1] + 1
        for _ in range(max_new_tokens - 1):
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], 1)
            out = m.model(input_ids=next_tok[:, None].to(dev), attention_mask=mask.to(dev),
                          position_ids=next_pos[:, None].to(dev), cache=out.cache, use_cache=True)
            next_tok = out.logits[:, -1, :].float().argmax(-1).cpu()
            next_pos = next_pos + 1
            for i in range(b):
                if not done[i]:
                    generated[i].append(int(next_tok[i]))
                    done[i] = int(next_tok[i]) in self.eos_ids
        texts = m.tokenizer.batch_decode(generated, skip_special_tokens=True)
        return [EngineOutput(texts[i], opt_logits[i], int(first[i])) for i in range(b)]


def _common_prefix_len(rows: Sequence[torch.Tensor]) -> int:
    n = min(len(r) for r in rows)
    stack = torch.stack([r[:n] for r in rows])
    same = (stack == stack[0]).all(0)
    diff = (~same).nonzero()
    return int(diff[0]) if len(diff) else n
