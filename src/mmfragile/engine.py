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
import inspect
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .models.adapters import EngineInexact
from .models.base import Prompt
from .models.hf import HFModel, left_pad

__all__ = ["PrefixSharingEngine", "EngineOutput", "EngineInexact", "engine_supported", "engine_refusal"]


@dataclass
class EngineOutput:
    text: str                  # greedy continuation, special tokens stripped (as HFModel.generate)
    option_logits: np.ndarray  # first-step logits of each candidate's first token
    argmax_token: int          # first-step argmax over the whole vocabulary


def engine_refusal(model) -> str | None:
    """Why the engine cannot run ``model`` exactly, or None if it can."""
    if not isinstance(model, HFModel):
        return f"{type(model).__name__} is not a transformers model (the engine drives HFModel checkpoints)"
    return model.adapter.engine_refusal


def engine_supported(model) -> bool:
    return engine_refusal(model) is None


class PrefixSharingEngine:
    """``batch_size``: at most that many tails per forward (None: as many as fit in ``memory_fraction`` of the free
    memory - GPU or host - at the time, up to ``max_batch``); the memory estimate lowers an explicit value too.
    ``verify_every``: every k-th group (and the first) checks its spliced token ids against full renders of two of
    its variants (see :meth:`group_rows`)."""

    def __init__(self, model: HFModel, batch_size: int | None = None, memory_fraction: float = 0.4,
                 max_batch: int = 256, verify_every: int = 16):
        reason = engine_refusal(model)
        if reason is not None:
            raise EngineInexact(f"{getattr(model, 'name', model)}: {reason}")
        self.m = model
        self.batch_size = batch_size
        self.memory_fraction = float(memory_fraction)
        self.max_batch = int(max_batch)
        self.verify_every = max(1, int(verify_every))
        eos = model.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None
                           else [model.tokenizer.eos_token_id])
        cfg = model.model.config
        self.media_token_ids = {int(t) for t in (getattr(cfg, k, None) for k in
                                                 ("image_token_id", "image_token_index", "video_token_id",
                                                  "video_token_index")) if t is not None}
        # transformers renamed forward()'s past_key_values to cache (5.2x); drive whichever this version takes
        params = inspect.signature(model.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.stats = {"prefix_tokens": 0, "tail_tokens": 0, "groups": 0, "spliced_groups": 0, "verified_groups": 0,
                      "full_render_groups": 0, "tail_batches": 0, "max_tail_batch": 0, "shared_cache_views": 0,
                      "cache_copies": 0}

    # ------------------------------------------------------------------ token rows of a group
    def group_rows(self, prompts: Sequence[Prompt]) -> tuple[list[torch.Tensor], dict, dict[str, list[torch.Tensor]]]:
        """Token rows of every variant, the prefix encode (the ONE processor call with images: pixel values, grids,
        token types of variant 0) and the per-token tensors of every row.

        The image work runs once: variant 0 goes through the processor; every variant's rendered text is tokenised
        alone (image placeholders unexpanded) and its part after the variants' common token prefix is joined to
        variant 0's expanded ids. The splice must reproduce variant 0's own ids, and on the first and every
        ``verify_every``-th group two more variants are rendered in full (one at a time) and compared; on any
        mismatch the group warns with the reason and renders every variant in full (in small chunks, keeping only
        the token tensors)."""
        m, ad = self.m, self.m.adapter
        media = m.supports_images and any(p.images for p in prompts)
        if not media:  # text alone: the tokenizer (or the processor's text path) is all there is to run
            enc = m.encode(prompts)
            return _unpad(enc), m.encode(prompts[:1]), {k: _unpad_key(enc, k) for k in _per_token_keys(enc, ad)}
        enc0 = m.encode(prompts[:1])
        texts = [m.render(p) for p in prompts]
        try:
            rows, extra = self._splice(enc0, texts)
            verify = self.stats["groups"] % self.verify_every == 0 and len(prompts) > 1
            if verify:
                sample = sorted({len(prompts) // 2, len(prompts) - 1} - {0})
                for i in sample:
                    self._check_against_full(i, prompts[i], rows[i], {k: v[i] for k, v in extra.items()})
                self.stats["verified_groups"] += 1
            self.stats["spliced_groups"] += 1
            return rows, enc0, extra
        except _SpliceMismatch as e:
            warnings.warn(f"{m.name}: prefix-sharing engine cannot splice this group's token ids ({e}); its "
                          f"{len(prompts)} variants are rendered in full, one processor call per chunk", stacklevel=3)
        self.stats["full_render_groups"] += 1
        rows, extra = [], {}
        for s in range(0, len(prompts), 8):
            enc = m.encode(prompts[s:s + 8])
            rows += _unpad(enc)
            for k in _per_token_keys(enc, ad):
                extra.setdefault(k, []).extend(_unpad_key(enc, k))
            del enc
        return rows, enc0, extra

    def _splice(self, enc0: dict, texts: list[str]):
        m, ad = self.m, self.m.adapter
        raw = [torch.tensor(r, dtype=torch.long) for r in
               m.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        full0 = enc0["input_ids"][0][enc0["attention_mask"][0].bool()]
        k = min(_common_prefix_len(raw), min(len(r) for r in raw) - 1) if len(raw) > 1 else len(raw[0]) - 1
        if k < 0:
            raise _SpliceMismatch("a variant renders to no tokens")
        big_k = k + len(full0) - len(raw[0])  # the processor's expansion (image tokens, BOS) all lies before k
        if big_k < 0 or not torch.equal(full0[big_k:], raw[0][k:]):
            raise _SpliceMismatch("the processor changes the text after the variants' common prefix (variant 0's "
                                  "processed ids do not end with its tokenised text)")
        media = [j for j, t in enumerate(full0.tolist()) if t in self.media_token_ids]
        if media and media[-1] >= big_k:
            raise _SpliceMismatch("image tokens lie after the variants' common prefix")
        head = full0[:big_k]
        rows = [torch.cat([head, r[k:]]) for r in raw]
        extra = {}
        for key in _per_token_keys(enc0, ad):
            old = enc0[key][0][enc0["attention_mask"][0].bool()][:big_k]
            fill = ad.per_token.get(key, 0)
            out = []
            for r in raw:
                n = len(r) - k
                add = old[-1:].expand(n, *old.shape[1:]) if fill == -1 else \
                    torch.full((n, *old.shape[1:]), fill, dtype=old.dtype)
                out.append(torch.cat([old, add]))
            extra[key] = out
        if not torch.equal(rows[0], full0):
            raise _SpliceMismatch("the spliced ids of variant 0 differ from its processed ids")
        return rows, extra

    def _check_against_full(self, i: int, prompt: Prompt, row: torch.Tensor, extra: dict) -> None:
        enc = self.m.encode([prompt])
        mask = enc["attention_mask"][0].bool()
        if not torch.equal(enc["input_ids"][0][mask], row):
            raise _SpliceMismatch(f"variant {i}'s spliced token ids differ from its full render")
        for k, v in extra.items():
            if k in enc and not torch.equal(enc[k][0][mask], v):
                raise _SpliceMismatch(f"variant {i}'s spliced {k} differ from its full render")

    # ------------------------------------------------------------------
    def run_group(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]], max_new_tokens: int) -> list[EngineOutput]:
        """Variants of ONE question (same images). Returns one output per prompt, in order; raises
        :class:`EngineInexact` (before any model call) if sharing the prefix would not be exact."""
        m, ad = self.m, self.m.adapter
        if len({(tuple(map(str, p.images)), p.video) for p in prompts}) > 1:
            raise ValueError("run_group takes variants that share their images")
        rows, prefix, per_row = self.group_rows(prompts)
        plen = min(_common_prefix_len(rows), min(len(r) for r in rows) - 1)  # every tail needs >= 1 token
        for r in rows:
            if any(int(t) in self.media_token_ids for t in r[plen:]):
                raise EngineInexact("image tokens fall in the part where the variants differ: nothing to share")
        batch = {"input_ids": left_pad(rows, m.tokenizer.pad_token_id),
                 "attention_mask": left_pad([torch.ones(len(r), dtype=torch.long) for r in rows], 0),
                 **{k: left_pad(v, 0) for k, v in per_row.items()}, **ad.group_media_meta(prefix, len(rows))}
        positions = ad.position_ids(m.model, batch)  # [B, L] or [3, B, L], as generate would use them
        mask = batch["attention_mask"].bool()
        row_pos = [positions[..., i, :][..., mask[i]] for i in range(len(rows))]
        del batch, positions
        per_token = {k: v for k, v in per_row.items() if k in ad.tail_keys()}
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))  # similar lengths together: less padding
        bsz = self.tail_batch_size(len(rows), max(len(r) for r in rows) + max_new_tokens,
                                   max(len(r) for r in rows) - plen)
        n_batches = -(-len(order) // bsz)
        bsz = -(-len(order) // n_batches)  # equal batches: as few forwards, less padding in the last
        batches = [order[s:s + bsz] for s in range(0, len(order), bsz)]
        pads = {i: max(len(rows[j]) for j in b) - len(rows[i]) for b in batches for i in b}
        ad.check_exact(m.model, [len(r) for r in rows], [pads[i] for i in range(len(rows))], max_new_tokens)
        self.stats["groups"] += 1
        self.stats["prefix_tokens"] += plen

        prefix = dict(prefix)
        for k, v in list(prefix.items()):
            if k in ("input_ids", "attention_mask") or k in ad.per_token or k in ad.tail_keys():
                prefix[k] = v[:, :plen]
        with torch.inference_mode():
            out = m.model(**m._to_device(prefix), use_cache=True, logits_to_keep=1)
        prefix_cache = _cache_of(out)
        del prefix, out  # pixel values and the prefix's logits: only its KV cache is needed from here on
        results: list[EngineOutput | None] = [None] * len(rows)
        for idx in batches:
            tails = self._decode_tails([rows[i][plen:] for i in idx], plen, [row_pos[i][..., plen:] for i in idx],
                                       {k: [v[i][plen:] for i in idx] for k, v in per_token.items()}, prefix_cache,
                                       [candidates[i] for i in idx], max_new_tokens)
            for i, o in zip(idx, tails):
                results[i] = o
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ memory
    def tail_batch_size(self, n_rows: int, row_len: int, tail_len: int) -> int:
        """Tails per forward: ``batch_size`` (or ``max_batch``), lowered to what fits in ``memory_fraction`` of the
        free memory by an estimate of one row's cost (its KV cache, held twice while a step concatenates, the
        tail's activations and attention scores, the last position's logits)."""
        cap = min(self.batch_size or self.max_batch, n_rows)
        per_row = _row_bytes(self.m.model, row_len, tail_len)
        fits = int(self.memory_fraction * free_memory(self.m.device) // max(per_row, 1))
        return max(1, min(cap, fits))

    def _share(self, prefix_cache, b: int):
        """The prefix's cache for a batch of ``b`` tails: views expanded along the batch axis where every layer
        only ever replaces its tensors by concatenation (DynamicLayer, DynamicSlidingWindowLayer: the tails'
        keys are torch.cat-ed onto a new tensor, the prefix's stay untouched); a deep copy repeated ``b`` times
        for any other cache class."""
        if _views_allowed(prefix_cache):
            shared = copy.copy(prefix_cache)
            shared.layers = []
            for layer in prefix_cache.layers:
                new = copy.copy(layer)
                for name in ("keys", "values"):
                    t = getattr(layer, name, None)
                    if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[0] == 1:
                        setattr(new, name, t.expand(b, *t.shape[1:]))
                shared.layers.append(new)
            self.stats["shared_cache_views"] += 1
            return shared
        cache = copy.deepcopy(prefix_cache)
        cache.batch_repeat_interleave(b)
        self.stats["cache_copies"] += 1
        return cache

    @torch.inference_mode()
    def _decode_tails(self, tails, plen, tail_pos, tail_extra, prefix_cache, candidates, max_new_tokens) -> list[EngineOutput]:
        m, ad, dev = self.m, self.m.adapter, self.m.device
        b = len(tails)
        self.stats["tail_tokens"] += sum(len(t) for t in tails)
        self.stats["tail_batches"] += 1
        self.stats["max_tail_batch"] = max(self.stats["max_tail_batch"], b)
        ids = left_pad(tails, m.tokenizer.pad_token_id)  # pads sit between prefix and tail, masked out
        tmask = left_pad([torch.ones(len(t), dtype=torch.long) for t in tails], 0)
        # positions: [..., t] per row -> put the position axis first so left_pad pads it, then restore the layout
        pos = left_pad([p.movedim(-1, 0) for p in tail_pos], 0).movedim(1, -1)  # [b, (3,) w] -> ... -> [(3,) b, w]
        if pos.dim() == 3:
            pos = pos.movedim(1, 0)
        extra = {k: left_pad(v, 0) for k, v in tail_extra.items()}
        mask = torch.cat([torch.ones((b, plen), dtype=torch.long), tmask], 1)
        cache = self._share(prefix_cache, b)
        out = m.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                      use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}, **m._to_device(extra))
        del cache
        logits = out.logits[:, -1, :].float()
        first = logits.argmax(-1).cpu()
        opt_logits = [logits[i, [m.first_token_id(c) for c in candidates[i]]].cpu().numpy() for i in range(b)]
        del logits
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
                          position_ids=next_pos[..., None].to(dev), use_cache=True,
                          **{self._cache_kw: _cache_of(out)}, **m._to_device(step_extra))
            next_tok = out.logits[:, -1, :].float().argmax(-1).cpu()
            next_pos = next_pos + 1
            for i in range(b):
                if not done[i]:
                    generated[i].append(int(next_tok[i]))
                    done[i] = int(next_tok[i]) in self.eos_ids
        del out
        texts = m.tokenizer.batch_decode(generated, skip_special_tokens=True)
        return [EngineOutput(texts[i], opt_logits[i], int(first[i])) for i in range(b)]


class _SpliceMismatch(Exception):
    pass


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _views_allowed(cache) -> bool:
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer
    except ImportError:
        return False
    layers = getattr(cache, "layers", None)
    return (isinstance(cache, DynamicCache) and bool(layers) and not getattr(cache, "offloading", False)
            and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers))


def _per_token_keys(enc: dict, ad) -> list[str]:
    return [k for k in ad.per_token if k in enc]


def _unpad(enc: dict) -> list[torch.Tensor]:
    return _unpad_key(enc, "input_ids")


def _unpad_key(enc: dict, key: str) -> list[torch.Tensor]:
    mask = enc["attention_mask"].bool()
    return [enc[key][i][mask[i]] for i in range(len(mask))]


def free_memory(device) -> int:
    """Bytes free for new tensors: on CUDA the driver's free memory plus what torch's allocator holds unused, on
    the host /proc/meminfo's MemAvailable."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def _row_bytes(model, row_len: int, tail_len: int) -> int:
    """Estimated peak bytes one tail row adds to a batch (see :meth:`PrefixSharingEngine.tail_batch_size`)."""
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    layers = int(getattr(text, "num_hidden_layers", 32) or 32)
    heads = int(getattr(text, "num_attention_heads", 32) or 32)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    hidden = int(getattr(text, "hidden_size", 4096) or 4096)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    inter = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    vocab = int(getattr(text, "vocab_size", 32000) or 32000)
    el = next(model.parameters()).element_size()
    kv = layers * 2 * kv_heads * head_dim * el * row_len
    act = tail_len * (8 * hidden + 3 * inter) * el + 2 * tail_len * heads * row_len * 4
    return int(3 * kv + act + 3 * vocab * 4)


def _common_prefix_len(rows: Sequence[torch.Tensor]) -> int:
    n = min(len(r) for r in rows)
    stack = torch.stack([r[:n] for r in rows])
    same = (stack == stack[0]).all(0)
    diff = (~same).nonzero()
    return int(diff[0]) if len(diff) else n
