"""Fast evaluation engine: greedy answers and option-ID logits for many prompt variants of one question.

The format-bias grid asks each question in 48 formats x O circular shifts; Promptception asks it under
61 instructions. All variants of a question share a token prefix (system prompt, image tokens, question);
only the tail differs. :class:`PrefixSharingEngine`

1. renders every variant with the model's own chat template and processor,
2. finds their longest common token prefix and runs it - vision encoder included - **once**, with the prefix's
   own processor outputs (pixel values, grids, token types: whatever the family's forward takes),
3. copies that KV cache across a batch of variants and runs only the differing tails, left-padded between
   prefix and tail, each token at the position ``generate`` would give it (1-D, or Qwen's 3-D M-RoPE positions
   computed by the model's own ``get_rope_index`` over the full rows),
4. decodes greedily from there for ``max_new_tokens`` steps (1 step when all option IDs are one token:
   then the answer *is* the argmax of the next-token logits and the option-ID logits come from the same pass).

The result equals :meth:`HFModel.generate` token for token on every family the adapters know (tested per
architecture in ``tests/test_architectures.py``). Family differences come from
:mod:`mmfragile.models.adapters`. Where sharing cannot be exact the engine refuses with the reason
(:class:`EngineInexact`): PaliGemma (bidirectional attention over the whole prompt), checkpoints without a
verified adapter, variants whose images fall in the differing tail, rows longer than a sliding window.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from mmfragile.models.adapters import EngineInexact
from mmfragile.models.base import Prompt
from mmfragile.models.hf import HFModel, left_pad

__all__ = ["PrefixSharingEngine", "EngineOutput", "EngineInexact", "engine_supported", "engine_refusal"]


@dataclass
class EngineOutput:
    text: str                  # greedy continuation, special tokens stripped (as HFModel.generate)
    option_logits: np.ndarray  # first-step logits of each candidate's first token
    argmax_token: int          # first-step argmax over the whole vocabulary


def engine_refusal(model) -> str | None:
    """Why the engine cannot run ``model`` exactly, or None if it can."""
    if not model.prefix_engine:
        return f"{type(model).__name__} is not a transformers model (the engine drives HFModel checkpoints)"
    return model.adapter.engine_refusal


def engine_supported(model) -> bool:
    return engine_refusal(model) is None


class PrefixSharingEngine:
    def __init__(self, model: HFModel, batch_size: int = 32):
        reason = engine_refusal(model)
        if reason is not None:
            raise EngineInexact(f"{getattr(model, 'name', model)}: {reason}")
        self.m = model
        self.batch_size = batch_size
        eos = model.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None
                           else [model.tokenizer.eos_token_id])
        cfg = model.model.config
        self.media_token_ids = {int(t) for t in (getattr(cfg, k, None) for k in
                                                 ("image_token_id", "image_token_index", "video_token_id",
                                                  "video_token_index")) if t is not None}
        self.stats = {"prefix_tokens": 0, "tail_tokens": 0, "groups": 0}

    # ------------------------------------------------------------------
    def run_group(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]], max_new_tokens: int) -> list[EngineOutput]:
        """Variants of ONE question (same images). Returns one output per prompt, in order; raises
        :class:`EngineInexact` (before any model call) if sharing the prefix would not be exact."""
        m, ad = self.m, self.m.adapter
        if len({(tuple(map(str, p.images)), p.video) for p in prompts}) > 1:
            raise ValueError("run_group takes variants that share their images")
        enc = m.encode(prompts)
        mask = enc["attention_mask"].bool()
        rows = [enc["input_ids"][i][mask[i]] for i in range(len(prompts))]
        plen = min(_common_prefix_len(rows), min(len(r) for r in rows) - 1)  # every tail needs >= 1 token
        for r in rows:
            if any(int(t) in self.media_token_ids for t in r[plen:]):
                raise EngineInexact("image tokens fall in the part where the variants differ: nothing to share")
        positions = ad.position_ids(m.model, enc)  # [B, L] or [3, B, L], as generate would use them
        row_pos = [positions[..., i, :][..., mask[i]] for i in range(len(rows))]
        per_token = {k: [enc[k][i][mask[i]] for i in range(len(rows))] for k in ad.tail_keys() if k in enc}
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # similar lengths together: less padding
        batches = [order[s:s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        pads = {i: max(len(rows[j]) for j in b) - len(rows[i]) for b in batches for i in b}
        ad.check_exact(m.model, [len(r) for r in rows], [pads[i] for i in range(len(rows))], max_new_tokens)
        self.stats["groups"] += 1
        self.stats["prefix_tokens"] += plen

        prefix = m.encode(prompts[:1])  # the prefix's own pixel values / grids / token types, in its layout
        for k, v in list(prefix.items()):
            if k in ("input_ids", "attention_mask") or k in ad.per_token or k in ad.tail_keys():
                prefix[k] = v[:, :plen]
        with torch.inference_mode():
            out = m.model(**m._to_device(prefix), use_cache=True, logits_to_keep=1)
        results: list[EngineOutput | None] = [None] * len(rows)
        for idx in batches:
            tails = self._decode_tails([rows[i][plen:] for i in idx], plen, [row_pos[i][..., plen:] for i in idx],
                                       {k: [v[i][plen:] for i in idx] for k, v in per_token.items()}, out.cache,
                                       [candidates[i] for i in idx], max_new_tokens)
            for i, o in zip(idx, tails):
                results[i] = o
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _decode_tails(self, tails, plen, tail_pos, tail_extra, prefix_cache, candidates, max_new_tokens) -> list[EngineOutput]:
        m, ad, dev = self.m, self.m.adapter, self.m.device
        b = len(tails)
        self.stats["tail_tokens"] += sum(len(t) for t in tails)
        ids = left_pad(tails, m.tokenizer.pad_token_id)  # pads sit between prefix and tail, masked out
        tmask = left_pad([torch.ones(len(t), dtype=torch.long) for t in tails], 0)
        # positions: [..., t] per row -> put the position axis first so left_pad pads it, then restore the layout
        pos = left_pad([p.movedim(-1, 0) for p in tail_pos], 0).movedim(1, -1)  # [b, (3,) w] -> ... -> [(3,) b, w]
        if pos.dim() == 3:
            pos = pos.movedim(1, 0)
        extra = {k: left_pad(v, 0) for k, v in tail_extra.items()}
        mask = torch.cat([torch.ones((b, plen), dtype=torch.long), tmask], 1)
        cache = copy.deepcopy(prefix_cache)
        cache.batch_repeat_interleave(b)
        out = m.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), cache=cache,
                      use_cache=True, logits_to_keep=1, **m._to_device(extra))
        logits = out.logits[:, -1, :].float()
        first = logits.argmax(-1)
        opt_logits = [logits[i, [m.first_token_id(c) for c in candidates[i]]].cpu().numpy() for i in range(b)]
        generated = [[int(t)] for t in first]
        done = torch.tensor([int(t) in self.eos_ids for t in first])
        next_tok, next_pos = first, pos[..., -1] + 1  # text continues one position after the row's last token
        step_extra = extra
        for _ in range(max_new_tokens - 1):
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], 1)
            step_extra = ad.decode_kwargs(step_extra)
            out = m.model(input_ids=next_tok[:, None].to(dev), attention_mask=mask.to(dev),
                          position_ids=next_pos[..., None].to(dev), cache=out.cache, use_cache=True,
                          **m._to_device(step_extra))
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
