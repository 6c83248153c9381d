"""Run a model over evaluation items into a resumable per-question result store.

An :class:`EvalItem` is one model call: a prompt, the valid option IDs and the correct one, plus the key
columns that identify it (dataset, question_id, variant, and descriptive columns such as the format
factors, the shift or the prompt id). :func:`run_items` skips items already in the store, evaluates the
rest in batches - through the prefix-sharing engine when the backend allows it, else the backend's
``generate`` - scores each raw output with ``score_fn`` and appends rows as it goes, so a killed run
resumes where it stopped without losing or duplicating a row.

Study 1 (format bias) items come from :func:`format_bias_items`.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any, Callable, Iterable, Sequence

import pandas as pd
from tqdm.auto import tqdm

from .engine import PrefixSharingEngine, engine_supported
from .models.base import MLLM, Prompt
from .prompts.formats import (PromptFormat, all_formats, build_mc_prompt, circular_shifts, score_exact_match,
                              standard_format)
from .schema import MCQuestion
from .store import ResultStore


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
            self.group = f"{self.key['dataset']}/{self.key['question_id']}"


ScoreFn = Callable[[str, EvalItem], dict[str, Any]]


def exact_match_score(raw: str, item: EvalItem) -> dict[str, Any]:
    """Format-bias scoring (Sec. A.3): exact match of the raw output, no answer extraction."""
    covered, correct, selected = score_exact_match(raw, item.option_ids, item.answer_id)
    return {"covered": covered, "correct": correct, "selected_position": selected}


def run_items(model: MLLM, items: Sequence[EvalItem], store: ResultStore, score_fn: ScoreFn = exact_match_score,
              mode: str = "auto", batch_size: int = 16, flush_every: int = 256, progress: bool = True,
              desc: str | None = None, stop_after: int | None = None) -> pd.DataFrame:
    """Evaluate the items not yet in ``store`` and return the store's full table.

    ``mode``: ``"engine"`` (prefix-sharing engine; HF models only), ``"generate"`` (one ``generate`` per
    batch - the naive path), or ``"auto"`` (engine where supported; else a backend's own
    ``generate_with_option_logits`` - vLLM: answers and option-ID log-probabilities in one request, at least
    ``model.batch_size`` prompts per call - else ``generate``). ``stop_after`` ends the run after that
    many new rows (used to simulate a killed run in tests)."""
    if mode not in ("auto", "engine", "generate"):
        raise ValueError(f"mode must be auto, engine or generate, not {mode!r}")
    use_engine = mode == "engine" or (mode == "auto" and engine_supported(model))
    engine = PrefixSharingEngine(model, batch_size=batch_size) if use_engine else None
    scored = mode == "auto" and not use_engine and hasattr(model, "generate_with_option_logits")
    if scored:
        batch_size = max(batch_size, getattr(model, "batch_size", batch_size))
    todo = [it for it in items if not store.is_done({"model": model.name, **it.key})]
    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=desc or model.name, disable=not progress,
               unit="q", smoothing=0.05)
    buffer: list[dict] = []
    written = 0

    def flush():
        nonlocal written
        written += store.append(buffer)
        buffer.clear()

    for chunk in _chunks(todo, engine is not None, batch_size):
        if engine is not None:
            outs = engine.run_group([it.prompt for it in chunk], [it.option_ids for it in chunk],
                                    max(it.max_new_tokens for it in chunk))
            raws = [o.text for o in outs]
            logits = [o.option_logits for o in outs]
        elif scored:
            raws, logits = model.generate_with_option_logits([it.prompt for it in chunk], [it.option_ids for it in chunk],
                                                             max(it.max_new_tokens for it in chunk))
        else:
            raws = model.generate([it.prompt for it in chunk], max_new_tokens=max(it.max_new_tokens for it in chunk))
            logits = [None] * len(chunk)
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


# ---------------------------------------------------------------------------------------------- study 1
def format_bias_items(model: MLLM, questions: pd.DataFrame, formats: Sequence[PromptFormat] | None = None,
                      circular: bool = True, instruction: str | None = "paper", include_standard: bool = True,
                      system: str | None = None) -> list[EvalItem]:
    """Items of the format-bias grid: every question x format x circular shift (Sec. 4.1).

    ``formats`` defaults to the 48 of Table 1; ``include_standard`` adds the dataset's standard format
    (Table 5) as variant ``standard`` (the reference prompt of the confidence analysis, Sec. 5.3).
    ``max_new_tokens`` is the longest tokenized option ID of the format (Sec. A.4)."""
    formats = list(formats) if formats is not None else all_formats()
    items: list[EvalItem] = []
    id_len_cache: dict[tuple, int] = {}
    for rec in questions.to_dict("records"):
        q = MCQuestion.from_row(rec)
        fmts = [(f, f.name) for f in formats]
        if include_standard:
            fmts.append((standard_format(q.dataset), "standard"))
        for fmt, fname in fmts:
            for shift in (circular_shifts(len(q.options)) if circular else [0]):
                fp = build_mc_prompt(q, fmt, shift=shift, instruction=instruction)
                ids = tuple(fp.option_ids)
                if ids not in id_len_cache:
                    id_len_cache[ids] = model.max_id_tokens(ids)
                items.append(EvalItem(
                    key={"dataset": q.dataset, "question_id": q.question_id, "variant": f"{fname}|s{shift}",
                         "format": fname, "option_id_set": fmt.option_ids, "delimiter": fmt.delimiter,
                         "separator": fmt.separator, "shift": shift, "n_options": len(q.options),
                         "category": q.category, "modality": q.modality},
                    prompt=fp.to_prompt(system=system), option_ids=list(fp.option_ids), answer_id=fp.answer_id,
                    max_new_tokens=id_len_cache[ids]))
    # keep one group's items together and sorted by generation length so the engine sees whole groups
    items.sort(key=lambda it: (it.group, it.max_new_tokens))
    return items
