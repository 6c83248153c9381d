"""Fast evaluation engine: greedy answers and option-ID logits for many prompt variants of one question.

The format-bias grid asks each question in 48 formats x O circular shifts; Promptception asks it under
61 instructions. All variants of a question share a token prefix (system prompt, image tokens, question);
only the tail differs. :class:`PrefixSharingEngine`

1. renders every variant with the model's own chat template; the processor - image resizing, normalising,
   patching - runs **once**, on the first variant; every variant's text is tokenised alone and joined to that
   encode's ids (checked against full renders on a sample of groups: :meth:`PrefixSharingEngine.group_rows`),
2. finds their longest common token prefix and runs it - vision encoder included - **once**, with the prefix's
   own processor outputs (pixel values, grids, token types: whatever the family's forward takes),
3. shares that KV cache with a batch of variants (expanded views where the cache class only ever concatenates;
   a copy otherwise), the batch sized from free memory, and runs only the differing tails, left-padded between
   prefix and tail, each token at the position ``generate`` would give it (1-D, or Qwen's 3-D M-RoPE positions
   computed by the model's own ``get_rope_index`` over the full rows),
4. decodes greedily from there for each variant's ``max_new_tokens`` steps (1 step when all option IDs are one
   token: then the answer *is* the argmax of the next-token logits and the option-ID logits come from the same
   pass); variants whose option IDs differ in length share one prefix and stop at their own limits. With
   ``seeds`` it samples instead, each variant from its own seeded stream through the logits processor
   :meth:`HFModel.generate_sampled` uses (:class:`~mmfragile.models.hf.SeededGumbelSampler`: a row's text depends on
   its seed alone), so the judge's repeated runs share their prefix too.

The result equals :meth:`HFModel.generate` (sampled: :meth:`HFModel.generate_sampled`) token for token on every
family the adapters know (tested per architecture in ``tests/test_architectures.py``). Family differences come from
:mod:`mmfragile.models.adapters`. Where sharing cannot be exact the engine refuses with the reason
(:class:`EngineInexact`): PaliGemma (bidirectional attention over the whole prompt), checkpoints without a
verified adapter, variants whose images fall in the differing tail, rows longer than a sliding window.
"""
from __future__ import annotations

import copy
import inspect
import warnings
from dataclasses import dataclass
from typing import Sequence, cast

import numpy as np
import torch
import torch.nn.functional as F

from mmfragile.models.adapters import EngineInexact
from mmfragile.models.base import Prompt
from mmfragile.models.hf import HFModel, SeededGumbelSampler, extend_per_token, left_pad

__all__ = ["PrefixSharingEngine", "EngineOutput", "EngineInexact", "engine_supported", "engine_refusal"]


@dataclass
class EngineOutput:
    text: str                  # greedy continuation, special tokens stripped (as HFModel.generate)
    option_logits: np.ndarray  # first-step logits of each candidate's first token
    argmax_token: int          # the first generated token (the argmax over the vocabulary; sampled: the draw)


def engine_refusal(model) -> str | None:
    """Why the engine cannot run ``model`` exactly, or None if it can."""
    if not model.prefix_engine:
        return f"{type(model).__name__} is not a transformers model (the engine drives HFModel checkpoints)"
    return model.adapter.engine_refusal


def engine_supported(model) -> bool:
    return engine_refusal(model) is None


class PrefixSharingEngine:
    """``batch_size``: at most that many tails per forward (None: as many as fit in the memory budget, up to
    ``max_batch``); the memory estimate lowers an explicit value too. The budget: ``memory_budget`` bytes if given,
    else ``memory_fraction`` of the free memory at the time - on the GPU all of it, on the host at most
    :data:`HOST_TAIL_BUDGET` (on CPU a larger batch is no faster, and a group should cost about the memory of one
    encode whatever its number of variants).
    ``verify_every``: every k-th group (and the first) checks its spliced token ids against full renders of two of
    its variants (see :meth:`group_rows`). ``share_cache=False`` gives every tail batch its own copy of the prefix's
    cache even where views would do (the reference the views are tested against)."""

    def __init__(self, model: HFModel, batch_size: int | None = None, memory_fraction: float = 0.4,
                 memory_budget: int | None = None, max_batch: int = 256, verify_every: int = 16,
                 share_cache: bool = True):
        reason = engine_refusal(model)
        if reason is not None:
            raise EngineInexact(f"{getattr(model, 'name', model)}: {reason}")
        self.m = model
        self.batch_size = batch_size
        self.memory_fraction = float(memory_fraction)
        self.memory_budget = memory_budget
        self.max_batch = int(max_batch)
        self.verify_every = max(1, int(verify_every))
        self.share_cache = bool(share_cache)
        self._first_ids: dict[str, int] = {}
        eos = model.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None
                           else [model.tokenizer.eos_token_id])
        self.media_token_ids = media_token_ids(model.model.config)
        self._media = torch.tensor(sorted(self.media_token_ids), dtype=torch.long)
        # transformers renamed forward()'s past_key_values to cache (5.2x); drive whichever this version takes
        params = inspect.signature(model.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.stats = {"prefix_tokens": 0, "tail_tokens": 0, "groups": 0, "spliced_groups": 0, "verified_groups": 0,
                      "full_render_groups": 0, "tail_batches": 0, "max_tail_batch": 0, "shared_cache_views": 0,
                      "cache_copies": 0, "joint_batches": 0}

    # ------------------------------------------------------------------ token rows of a group
    def group_rows(self, prompts: Sequence[Prompt]) -> tuple[list[torch.Tensor], dict, dict[str, list[torch.Tensor]]]:
        """Token rows of every variant, the prefix encode (the ONE processor call with images: pixel values, grids,
        token types of variant 0) and the per-token tensors of every row.

        The image work runs once: variant 0 goes through the processor; every variant's rendered text is tokenised
        alone (image placeholders unexpanded) and its part after the variants' common token prefix is joined to
        variant 0's expanded ids. The splice must reproduce variant 0's own ids, and on the first and every
        ``verify_every``-th group two more variants are rendered in full (one at a time) and compared; on any
        mismatch the group warns with the reason and renders every variant in full (:data:`FULL_RENDER_CHUNK` at a
        time, keeping only the token tensors: memory stays that of a few encodes)."""
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
            warnings.warn(f"{m.name}: prefix-sharing engine cannot splice the token ids of the group of "
                          f"{prompts[0].text[:60]!r} ({e}); its {len(prompts)} variants are rendered in full, "
                          f"{FULL_RENDER_CHUNK} per processor call", stacklevel=3)
        self.stats["full_render_groups"] += 1
        rows, extra = [], {}
        for s in range(0, len(prompts), FULL_RENDER_CHUNK):
            enc = m.encode(prompts[s:s + FULL_RENDER_CHUNK])
            rows += _unpad(enc)
            for k in _per_token_keys(enc, ad):
                extra.setdefault(k, []).extend(_unpad_key(enc, k))
            del enc
        return rows, enc0, extra

    def tokenize(self, texts: list[str]) -> list[torch.Tensor]:
        """Token ids of rendered texts with their image placeholders unexpanded (no special tokens added: whatever
        the processor adds lies in its expansion of the prefix)."""
        return [torch.tensor(r, dtype=torch.long) for r in self.m.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def _splice(self, enc0: dict, texts: list[str]):
        """Variant 0's processed ids up to the variants' common text prefix, then each variant's own text tokens.
        Exact when the processor only expands what comes before that point (image placeholders, BOS) and
        tokenises the rest as the tokenizer does - checked on variant 0 here, on sampled variants by
        :meth:`_check_against_full`."""
        ad = self.m.adapter
        raw = self.tokenize(texts)
        full0 = _unpad(enc0)[0]
        k = min(_common_prefix_len(raw), min(len(r) for r in raw) - 1) if len(raw) > 1 else len(raw[0]) - 1
        if k < 0:
            raise _SpliceMismatch("a variant renders to no tokens")
        big_k = k + len(full0) - len(raw[0])  # the processor's expansion (image tokens, BOS) all lies before k
        if big_k < 0 or not torch.equal(full0[big_k:], raw[0][k:]):
            raise _SpliceMismatch("the processor changes the text after the variants' common prefix (variant 0's "
                                  "processed ids do not end with its tokenised text)")
        media = torch.isin(full0, self._media).nonzero()
        if len(media) and int(media[-1]) >= big_k:
            raise _SpliceMismatch("image tokens lie after the variants' common prefix")
        head = full0[:big_k]
        rows = [torch.cat([head, r[k:]]) for r in raw]
        extra = {}
        for key in _per_token_keys(enc0, ad):
            old = _unpad_key(enc0, key)[0][:big_k]
            extra[key] = [extend_per_token(old, len(r) - k, ad.per_token[key]) for r in raw]
        return rows, extra  # rows[0] == full0: head + raw[0][k:] with full0[big_k:] == raw[0][k:] checked above

    def _check_against_full(self, i: int, prompt: Prompt, row: torch.Tensor, extra: dict) -> None:
        enc = self.m.encode([prompt])
        if not torch.equal(_unpad(enc)[0], row):
            raise _SpliceMismatch(f"variant {i}'s spliced token ids differ from its full render")
        for k, v in extra.items():
            if k in enc and not torch.equal(_unpad_key(enc, k)[0], v):
                raise _SpliceMismatch(f"variant {i}'s spliced {k} differ from its full render")

    # ------------------------------------------------------------------
    def run_group(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]] | None,
                  max_new_tokens: int | Sequence[int], seeds: Sequence[int] | None = None, temperature: float = 1.0,
                  top_p: float = 1.0) -> list[EngineOutput]:
        """Variants of ONE question (same images); ``max_new_tokens`` for all or one per variant (each stops where
        ``generate`` with its own limit would); ``candidates``: each variant's option IDs (None: none scored).
        ``seeds`` (one per variant): seeded sampling at ``temperature`` / ``top_p`` as
        :meth:`HFModel.generate_sampled`, instead of greedy decoding. Returns one output per prompt, in order;
        raises :class:`EngineInexact` (before any model call) if sharing the prefix would not be exact."""
        return self.run_groups([(prompts, candidates, max_new_tokens, seeds)], temperature, top_p)[0]

    def run_groups(self, groups: Sequence[tuple[Sequence[Prompt], Sequence[Sequence[str]] | None,
                                                int | Sequence[int], Sequence[int] | None]],
                   temperature: float = 1.0, top_p: float = 1.0) -> list[list[EngineOutput]]:
        """Several groups, each ``(prompts, candidates, max_new_tokens, seeds)`` as :meth:`run_group` takes them,
        one output list per group. Each group's prefix runs once; where the cache holds every token (no sliding
        window, no cross-attention inputs per step) the tails of all groups then run and decode **together**, each
        group's prefix cache left-padded to the batch's longest (masked, as batched ``generate`` pads): a
        multi-token answer costs as many decode steps as one batch, not one per group (the judge's sampled
        judgments: a few variants per picture). Every group is checked before any output is computed."""
        plans = [self._plan(*g) for g in groups]
        if len({plan.seeds is None for plan in plans}) > 1:
            raise ValueError("run_groups: either every group is sampled (seeds) or none is")
        if len(plans) == 1:
            return [self._run_plan(plans[0], temperature, top_p)]
        for plan in plans:
            self._run_prefix(plan)
        if self.m.adapter.tail_keys() or not all(_every_token_kept(plan.cache) for plan in plans):
            return [self._run_plan(plan, temperature, top_p) for plan in plans]
        return self._run_joint(plans, temperature, top_p)

    def _plan(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]] | None,
              max_new_tokens: int | Sequence[int], seeds: Sequence[int] | None) -> "_Plan":
        """A group's token rows, shared prefix length, tail positions and the prefix's processor outputs; raises
        where sharing would not be exact."""
        m, ad = self.m, self.m.adapter
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError("run_group: one seed per prompt")
        limits = [int(max_new_tokens)] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len({p.media_key for p in prompts}) > 1:
            raise ValueError("run_group takes variants that share their images")
        rows, prefix, per_row = self.group_rows(prompts)
        plen = min(_common_prefix_len(rows), min(len(r) for r in rows) - 1)  # every tail needs >= 1 token
        if self.media_token_ids and any(bool(torch.isin(r[plen:], self._media).any()) for r in rows):
            raise EngineInexact("image tokens fall in the part where the variants differ: nothing to share")
        # positions as generate gives them: the model's own for variant 0 (whose processor outputs the prefix
        # encode holds), then each tail from variant 0's first tail position on, one per token - the tails are
        # text, and text tokens advance every position component by one (1-D RoPE and M-RoPE alike)
        start = ad.position_ids(m.model, prefix)[..., 0, plen]  # scalar, or [3] for M-RoPE
        row_pos = [start[..., None] + torch.arange(len(r) - plen) for r in rows]
        per_token = {k: v for k, v in per_row.items() if k in ad.tail_keys()}
        prefix = dict(prefix)
        for k, v in list(prefix.items()):
            if k in ("input_ids", "attention_mask") or k in ad.per_token or k in ad.tail_keys():
                prefix[k] = v[:, :plen]
        return _Plan(rows, plen, row_pos, per_token, prefix,
                     [[]] * len(prompts) if candidates is None else list(candidates), limits,
                     None if seeds is None else [int(x) for x in seeds])

    def _run_prefix(self, plan: "_Plan") -> None:
        self.stats["groups"] += 1
        self.stats["prefix_tokens"] += plan.plen
        with torch.inference_mode():
            out = self.m.model(**self.m.to_device(plan.prefix), use_cache=True, logits_to_keep=1)
        plan.cache = _cache_of(out)
        plan.prefix = {}   # pixel values and the prefix's logits: only its KV cache is needed from here on

    def _batches(self, lengths: list[int], row_len: int, tail_len: int, copies: int | None = None) -> list[list[int]]:
        """Indices in tail batches: similar lengths together (less padding), equal sizes (as few forwards, less
        padding in the last)."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        bsz = self.tail_batch_size(len(order), row_len, tail_len, copies)
        n_batches = -(-len(order) // bsz)
        bsz = -(-len(order) // n_batches)
        return [order[s:s + bsz] for s in range(0, len(order), bsz)]

    def _run_plan(self, plan: "_Plan", temperature: float, top_p: float) -> list[EngineOutput]:
        """One group: its prefix cache shared (views where allowed) by batches of its tails."""
        rows, plen, steps = plan.rows, plan.plen, max(plan.limits)
        batches = self._batches([len(r) for r in rows], max(len(r) for r in rows) + steps,
                                max(len(r) for r in rows) - plen)
        pads = {i: max(len(rows[j]) for j in b) - len(rows[i]) for b in batches for i in b}
        self.m.adapter.check_exact(self.m.model, [len(r) for r in rows], [pads[i] for i in range(len(rows))], steps)
        if plan.cache is None:
            self._run_prefix(plan)
        results: list[EngineOutput | None] = [None] * len(rows)
        for idx in batches:
            tails = self._decode_tails(
                [rows[i][plen:] for i in idx], torch.ones((len(idx), plen), dtype=torch.long),
                [plan.row_pos[i] for i in idx], {k: [v[i][plen:] for i in idx] for k, v in plan.per_token.items()},
                self._share(plan.cache, len(idx)), [plan.candidates[i] for i in idx], [plan.limits[i] for i in idx],
                _sampler(None if plan.seeds is None else [plan.seeds[i] for i in idx], temperature, top_p))
            for i, o in zip(idx, tails):
                results[i] = o
        return results  # type: ignore[return-value]

    def _run_joint(self, plans: list["_Plan"], temperature: float, top_p: float) -> list[list[EngineOutput]]:
        """The tails of several groups in common batches: each row after its own group's prefix cache, left-padded
        to the batch's longest prefix (the pads masked out)."""
        entries = [(g, i) for g, plan in enumerate(plans) for i in range(len(plan.rows))]
        tail = [len(plans[g].rows[i]) - plans[g].plen for g, i in entries]
        longest_prefix, steps = max(p.plen for p in plans), max(max(p.limits) for p in plans)
        batches = self._batches(tail, longest_prefix + max(tail) + steps, max(tail), copies=2)
        sampled = plans[0].seeds is not None
        results: list[list[EngineOutput | None]] = [[None] * len(p.rows) for p in plans]
        for idx in batches:
            self.stats["joint_batches"] += 1
            rows = [entries[k] for k in idx]
            width = max(plans[g].plen for g, _ in rows)
            tail_width = max(tail[k] for k in idx)
            self.m.adapter.check_exact(self.m.model, [width + tail_width] * len(rows),
                                       [width - plans[g].plen + tail_width - tail[k] for (g, _), k in zip(rows, idx)],
                                       steps)
            prefix_mask = torch.stack([torch.cat([torch.zeros(width - plans[g].plen, dtype=torch.long),
                                                  torch.ones(plans[g].plen, dtype=torch.long)]) for g, _ in rows])
            seeds = [cast(list, plans[g].seeds)[i] for g, i in rows] if sampled else None
            outs = self._decode_tails(
                [plans[g].rows[i][plans[g].plen:] for g, i in rows], prefix_mask,
                [plans[g].row_pos[i] for g, i in rows],
                {}, self._padded_cache([plans[g] for g, _ in rows], width), [plans[g].candidates[i] for g, i in rows],
                [plans[g].limits[i] for g, i in rows], _sampler(seeds, temperature, top_p))
            for (g, i), o in zip(rows, outs):
                results[g][i] = o
        return results  # type: ignore[return-value]

    def _padded_cache(self, row_plans: list["_Plan"], width: int):
        """One cache for a batch of rows from several groups: row r holds its group's prefix keys and values,
        left-padded with zeros to ``width`` positions (masked by the caller)."""
        padded: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for plan in row_plans:
            if id(plan) not in padded:
                pad = (0, 0, width - plan.plen, 0)
                padded[id(plan)] = [(F.pad(layer.keys, pad), F.pad(layer.values, pad)) for layer in plan.cache.layers]
        first = row_plans[0].cache
        merged = copy.copy(first)
        merged.layers = []
        for n, layer in enumerate(first.layers):
            new = copy.copy(layer)
            new.keys = torch.cat([padded[id(p)][n][0] for p in row_plans])
            new.values = torch.cat([padded[id(p)][n][1] for p in row_plans])
            merged.layers.append(new)
        self.stats["cache_copies"] += 1
        return merged

    def _first_token_id(self, text: str) -> int:
        """:meth:`HFModel.first_token_id`, remembered: a group asks for the same few option IDs hundreds of times."""
        if text not in self._first_ids:
            self._first_ids[text] = self.m.first_token_id(text)
        return self._first_ids[text]

    # ------------------------------------------------------------------ memory
    def tail_batch_size(self, n_rows: int, row_len: int, tail_len: int, copies: int | None = None) -> int:
        """Tails per forward: ``batch_size`` (or ``max_batch``), lowered to what fits in the memory budget (see the
        class) by an estimate of one row's cost (:func:`_row_bytes`; ``copies``: of the prefix per row, 1 for
        views - the default where the engine shares them - 2 for a copy)."""
        cap = min(self.batch_size or self.max_batch, n_rows)
        copies = copies if copies is not None else 1 if self.share_cache else 2
        per_row = _row_bytes(self.m.model, row_len, tail_len, copies=copies)
        return max(1, min(cap, int(self.tail_budget() // max(per_row, 1))))

    def tail_budget(self) -> int:
        """Bytes a tail batch may take (see the class)."""
        if self.memory_budget is not None:
            return int(self.memory_budget)
        budget = int(self.memory_fraction * free_memory(self.m.device))
        return budget if torch.device(self.m.device).type == "cuda" else min(budget, HOST_TAIL_BUDGET)

    def _share(self, prefix_cache, b: int):
        """The prefix's cache for a batch of ``b`` tails: views expanded along the batch axis where every layer
        only ever replaces its tensors by concatenation (DynamicLayer, DynamicSlidingWindowLayer: the tails'
        keys are torch.cat-ed onto a new tensor, the prefix's stay untouched); a deep copy repeated ``b`` times
        for any other cache class."""
        if self.share_cache and _views_allowed(prefix_cache):
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
    def _decode_tails(self, tails, prefix_mask, tail_pos, tail_extra, cache, candidates, limits,
                      sampler: SeededGumbelSampler | None = None) -> list[EngineOutput]:
        """One batch of tails after their prefix ``cache`` (one row per tail; ``prefix_mask`` [b, width]: its real
        positions), decoded to each row's limit: greedy, or through ``sampler`` (each row's own seeded stream, one
        draw per step as in ``generate``)."""
        m, ad, dev = self.m, self.m.adapter, self.m.device

        def pick(scores: torch.Tensor) -> torch.Tensor:
            return (scores if sampler is None else sampler(None, scores)).argmax(-1).cpu()

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
        mask = torch.cat([prefix_mask, tmask], 1)
        out = m.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                      use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}, **m.to_device(extra))
        del cache
        logits = out.logits[:, -1, :].float()
        first = pick(logits)
        # every row's option-ID logits in one gather (one device-to-host copy, not one per row)
        cols = [[self._first_token_id(c) for c in cands] for cands in candidates]
        rows_idx = torch.tensor([i for i, c in enumerate(cols) for _ in c], dtype=torch.long, device=logits.device)
        col_idx = torch.tensor([t for c in cols for t in c], dtype=torch.long, device=logits.device)
        picked = logits[rows_idx, col_idx].cpu().numpy()
        opt_logits = np.split(picked, np.cumsum([len(c) for c in cols])[:-1])
        del logits
        generated = [[int(t)] for t in first]
        done = torch.tensor([int(t) in self.eos_ids or lim <= 1 for t, lim in zip(first, limits)])
        next_tok, next_pos = first, pos[..., -1] + 1  # text continues one position after the row's last token
        step_extra = extra
        for _ in range(max(limits) - 1):
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], 1)
            step_extra = ad.decode_kwargs(step_extra)
            out = m.model(input_ids=next_tok[:, None].to(dev), attention_mask=mask.to(dev),
                          position_ids=next_pos[..., None].to(dev), use_cache=True,
                          **{self._cache_kw: _cache_of(out)}, **m.to_device(step_extra))
            next_tok = pick(out.logits[:, -1, :].float())
            next_pos = next_pos + 1
            for i in range(b):
                if not done[i]:
                    generated[i].append(int(next_tok[i]))
                    done[i] = int(next_tok[i]) in self.eos_ids or len(generated[i]) >= limits[i]
        del out
        texts = m.tokenizer.batch_decode(generated, skip_special_tokens=True)
        return [EngineOutput(texts[i], opt_logits[i], int(first[i])) for i in range(b)]


#: most bytes a tail batch takes on the host: measured on the 1280 x 720 Qwen2.5-VL group (196 tails), batches of
#: 8-64 rows ran as fast as one of 196 or faster, while the peak grew with the batch (``scripts/benchmark_engine.py``)
HOST_TAIL_BUDGET = 512 * 2**20

#: variants per processor call when a group is rendered in full (splice mismatch): bounds memory to a few encodes
FULL_RENDER_CHUNK = 8


@dataclass
class _Plan:
    """A group ready to run: token rows, shared prefix length, tail positions (and per-token inputs), the prefix's
    processor outputs - then, once run, its KV cache - and each row's option IDs, limit and seed."""

    rows: list[torch.Tensor]
    plen: int
    row_pos: list[torch.Tensor]
    per_token: dict[str, list[torch.Tensor]]
    prefix: dict
    candidates: list
    limits: list[int]
    seeds: list[int] | None
    cache: object = None


def _sampler(seeds: list[int] | None, temperature: float, top_p: float) -> SeededGumbelSampler | None:
    """A tail batch's sampler (one seeded stream per row), None for greedy decoding."""
    return None if seeds is None else SeededGumbelSampler(seeds, temperature, top_p)


def _every_token_kept(cache) -> bool:
    """Whether every layer of ``cache`` keeps every token's keys and values in plain tensors (DynamicLayer): then
    caches of different groups can be left-padded into one batch."""
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        return False
    layers = getattr(cache, "layers", None)
    return (isinstance(cache, DynamicCache) and bool(layers) and not getattr(cache, "offloading", False)
            and all(type(layer) is DynamicLayer for layer in layers))


class _SpliceMismatch(Exception):
    """The spliced token ids of a group would not equal a full render; the message says where they differ."""


def media_token_ids(config) -> set[int]:
    """The ids of a checkpoint's image, video and audio placeholder tokens (configs name them ``*_token_id`` or
    ``*_token_index``, Gemma-3 both; Phi-4-multimodal in its vision and audio sub-configs)."""
    configs = [config, *(getattr(config, sub, None) for sub in ("vision_config", "audio_config"))]
    keys = ("image_token_id", "image_token_index", "video_token_id", "video_token_index", "audio_token_id")
    return {int(t) for c in configs if c is not None for t in (getattr(c, k, None) for k in keys) if t is not None}


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


def _row_bytes(model, row_len: int, tail_len: int, copies: int = 1) -> int:
    """Estimated peak bytes one tail row adds to a batch: its KV cache over the whole row (the concatenation
    that appends the tail materialises the shared prefix once per row; ``copies=2`` when the prefix was also
    copied per row first), one more layer's worth while a concatenation holds old and new, the tail's
    activations (residual, attention projections, MLP) and attention scores (float32, as eager attention
    keeps them), and the last position's logits."""
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
    kv_layer = 2 * kv_heads * head_dim * el * row_len
    act = tail_len * (8 * hidden + 3 * inter) * el + 2 * tail_len * heads * row_len * 4
    return int((copies * layers + 1) * kv_layer + act + 3 * vocab * 4)


def _common_prefix_len(rows: Sequence[torch.Tensor]) -> int:
    n = min(len(r) for r in rows)
    stack = torch.stack([r[:n] for r in rows])
    same = (stack == stack[0]).all(0)
    diff = (~same).nonzero()
    return int(diff[0]) if len(diff) else n
