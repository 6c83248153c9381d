"""Run a model over evaluation items into a resumable per-question result store.

An :class:`EvalItem` is one model call: a prompt, the valid option IDs and the correct one, plus the key
columns that identify it (dataset, question_id, variant, and descriptive columns such as the format
factors, the shift or the prompt id). :func:`run_items` skips items already in the store, evaluates the
rest in batches - through the prefix-sharing engine when the backend allows it, else the backend's
``generate`` - scores each raw output with ``score_fn`` and appends rows as it goes, so a killed run
resumes where it stopped without losing or duplicating a row.

Study 1 (format bias) items come from :func:`mmfragile.studies.format_bias.items.format_bias_items`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Callable, Iterable, Sequence

import pandas as pd
from tqdm.auto import tqdm

from mmfragile.engine import EngineInexact, PrefixSharingEngine, engine_refusal
from mmfragile.models.base import MLLM, Prompt
from mmfragile.shards import Shard, question_group
from mmfragile.store import ResultStore
from mmfragile.studies.format_bias.prompts import score_exact_match


@dataclass
class EvalItem:
    key: dict[str, Any]            # must hold dataset, question_id, variant; any extra columns are stored too
    prompt: Prompt
    option_ids: list[str]
    answer_id: str
    max_new_tokens: int = 1
    group: str = ""                # items of one group share images and (most of) their prompt prefix

    def __post_init__(self):
        if not self.group:
            self.group = question_group(self.key["dataset"], self.key["question_id"])


ScoreFn = Callable[[str, EvalItem], dict[str, Any]]


def exact_match_score(raw: str, item: EvalItem) -> dict[str, Any]:
    """Format-bias scoring (Sec. A.3): exact match of the raw output, no answer extraction."""
    covered, correct, selected = score_exact_match(raw, item.option_ids, item.answer_id)
    return {"covered": covered, "correct": correct, "selected_position": selected}


def run_items(model: MLLM, items: Sequence[EvalItem], store: ResultStore, score_fn: ScoreFn = exact_match_score,
              mode: str = "auto", batch_size: int = 16, flush_every: int = 256, progress: bool = True,
              desc: str | None = None, stop_after: int | None = None,
              shard: Shard | str | None = None) -> pd.DataFrame:
    """Evaluate the items not yet in ``store`` and return the store's full table.

    ``mode``: ``"engine"`` (prefix-sharing engine; refuses with the reason where it cannot be exact),
    ``"generate"`` (one batched ``generate`` per batch - the naive path), or ``"auto"`` (the engine where it is
    exact; a backend with its own ``generate_with_option_logits`` - vLLM: answers and option-ID log-probabilities
    in one request, at least ``model.batch_size`` prompts per call - uses that; elsewhere - a family the engine
    refuses, or a question group whose variants it cannot share - batched ``generate`` plus ``option_logits``,
    with a warning naming the reason). ``shard`` (``"i/n"`` or a :class:`~mmfragile.shards.Shard`): evaluate only
    the items of that shard's question groups. The item keys are declared in the store's manifest under the
    shard's label first, so ``mmfragile merge`` can check the run for completeness. ``stop_after`` ends the run
    after that many new rows (used to simulate a killed run in tests)."""
    if mode not in ("auto", "engine", "generate"):
        raise ValueError(f"mode must be auto, engine or generate, not {mode!r}")
    shard = Shard.parse(shard)
    if shard.count > 1:
        items = [it for it in items if shard.owns(it.group)]
    scored = mode == "auto" and hasattr(model, "generate_with_option_logits")
    if scored:
        batch_size = max(batch_size, getattr(model, "batch_size", batch_size))
    refusal = engine_refusal(model) if mode != "generate" and not scored else None
    if refusal is not None and mode == "engine":
        raise EngineInexact(f"{model.name}: {refusal}")
    # where the engine is refused in auto mode, a transformers model still stores option logits as the engine does
    stand_in_logits = mode == "auto" and hasattr(model, "adapter")
    if refusal is not None and stand_in_logits:  # say so, once
        warnings.warn(f"{model.name}: prefix-sharing engine not used ({refusal}); running batched generate",
                      stacklevel=2)
    engine = (PrefixSharingEngine(model, batch_size=batch_size)
              if mode != "generate" and refusal is None and not scored else None)
    keys = pd.DataFrame([{"model": model.name, **it.key} for it in items], columns=store.key_columns)
    if items:
        store.declare(keys, shard.label)
        if getattr(model, "image_policy", None) is not None and any(it.prompt.images for it in items):
            store.pin_run_info("image_policy", model.image_policy)
    todo = [it for it, p in zip(items, store.pending(keys)) if p]
    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=desc or model.name, disable=not progress,
               unit="q", smoothing=0.05)
    buffer: list[dict] = []
    written = 0

    def flush():
        nonlocal written
        written += store.append(buffer)
        buffer.clear()

    def naive(prompts, option_ids, new_tokens, with_logits):
        raws = model.generate(prompts, max_new_tokens=new_tokens)
        return raws, (model.option_logits(prompts, option_ids) if with_logits else [None] * len(prompts))

    for chunk in _chunks(todo, engine is not None, batch_size):
        prompts, option_ids = [it.prompt for it in chunk], [it.option_ids for it in chunk]
        new_tokens = max(it.max_new_tokens for it in chunk)
        if scored:
            raws, logits = model.generate_with_option_logits(prompts, option_ids, new_tokens)
        elif engine is None:
            raws, logits = naive(prompts, option_ids, new_tokens, stand_in_logits)
        else:
            try:
                outs = engine.run_group(prompts, option_ids, new_tokens)
                raws, logits = [o.text for o in outs], [o.option_logits for o in outs]
            except EngineInexact as e:
                if mode == "engine":
                    raise
                warnings.warn(f"{model.name}, {chunk[0].group}: {e}; this group runs through batched generate",
                              stacklevel=2)
                raws, logits = naive(prompts, option_ids, new_tokens, True)
        for it, raw, lg in zip(chunk, raws, logits):
            row = {"model": model.name, **it.key, "raw_output": raw, "option_ids": list(it.option_ids),
                   "answer_id": it.answer_id, **score_fn(raw, it)}
            row["option_logits"] = None if lg is None else [float(x) for x in lg]
            buffer.append(row)
        bar.update(len(chunk))
        if len(buffer) >= flush_every:
            flush()
        if stop_after is not None and written + len(buffer) >= stop_after:
            break
    flush()
    bar.close()
    return store.read()


def _chunks(items: Sequence[EvalItem], by_group: bool, batch_size: int) -> Iterable[list[EvalItem]]:
    """Engine: all items of a group together (the engine batches internally); naive: plain batches,
    with equal max_new_tokens inside a batch so the generation length matches the item's protocol."""
    if by_group:
        for _, grp in groupby(items, key=lambda it: (it.group, it.max_new_tokens)):
            yield list(grp)
        return
    for _, grp in groupby(items, key=lambda it: it.max_new_tokens):
        grp = list(grp)
        for s in range(0, len(grp), batch_size):
            yield grp[s:s + batch_size]
