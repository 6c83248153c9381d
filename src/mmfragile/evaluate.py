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

import warnings
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd
from tqdm.auto import tqdm

from .data.video import question_frames
from .engine import EngineInexact, PrefixSharingEngine, engine_refusal
from .models.base import MLLM, Prompt
from .prompts.formats import (STANDARD_FORMATS, NoStandardFormat, PromptFormat, all_formats, build_mc_prompt,
                              circular_shifts, score_exact_match)
from .schema import DataError, MCQuestion, bad_row, options_in_image, row_where
from .shards import Shard, question_group
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
    with a warning naming the reason). ``auto`` never switches backends: which of the engine and vLLM is faster
    depends on the workload (README, "Speed" and "vLLM backend"); load the model with ``vllm:`` to choose vLLM.
    ``batch_size``: prompts per batched ``generate`` call (the engine sizes its tail batches from free memory).
    ``shard`` (``"i/n"`` or a :class:`~mmfragile.shards.Shard`): evaluate only
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
    # the engine sizes its tail batches from free memory; batch_size is batched generate's
    engine = PrefixSharingEngine(model) if mode != "generate" and refusal is None and not scored else None
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

    def naive(chunk, with_logits):
        """Batched generate (+ option logits), each item to its own max_new_tokens."""
        raws: list = [None] * len(chunk)
        logits: list = [None] * len(chunk)
        by_length: dict[int, list[int]] = {}
        for i, it in enumerate(chunk):
            by_length.setdefault(it.max_new_tokens, []).append(i)
        for new_tokens, idx in by_length.items():
            ps = [chunk[i].prompt for i in idx]
            outs = model.generate(ps, max_new_tokens=new_tokens)
            lgs = model.option_logits(ps, [chunk[i].option_ids for i in idx]) if with_logits else [None] * len(ps)
            for i, raw, lg in zip(idx, outs, lgs):
                raws[i], logits[i] = raw, lg
        return raws, logits

    for chunk in _chunks(todo, engine is not None, batch_size):
        prompts, option_ids = [it.prompt for it in chunk], [it.option_ids for it in chunk]
        if scored:
            raws, logits = model.generate_with_option_logits(prompts, option_ids, chunk[0].max_new_tokens)
        elif engine is None:
            raws, logits = naive(chunk, stand_in_logits)
        else:
            try:
                outs = engine.run_group(prompts, option_ids, [it.max_new_tokens for it in chunk])
                raws, logits = [o.text for o in outs], [o.option_logits for o in outs]
            except EngineInexact as e:
                if mode == "engine":
                    raise
                warnings.warn(f"{model.name}, {chunk[0].group}: {e}; this group runs through batched generate",
                              stacklevel=2)
                raws, logits = naive(chunk, True)
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
    """Engine: all items of a group together - one shared prefix, each item decoded to its own max_new_tokens (the
    engine batches internally); naive: plain batches, with equal max_new_tokens inside a batch so the generation
    length matches the item's protocol."""
    if by_group:
        for _, grp in groupby(items, key=lambda it: it.group):
            yield list(grp)
        return
    for _, grp in groupby(items, key=lambda it: it.max_new_tokens):
        grp = list(grp)
        for s in range(0, len(grp), batch_size):
            yield grp[s:s + batch_size]


# ---------------------------------------------------------------------------------------------- study 1
#: Question-table column naming a question's standard format (a format name; what ``--standard-format`` sets).
STANDARD_FORMAT_COLUMN = "standard_format"

StandardArg = PromptFormat | str | Mapping[str, PromptFormat | str] | None


def _no_standard_hint() -> str:
    example = PromptFormat().name
    return (f"pass one: format_bias_items(..., standard={example!r}) (a format name or PromptFormat for all "
            f"questions, or a {{dataset: format}} dict), or a {STANDARD_FORMAT_COLUMN!r} column of format names in "
            "the question table (run_format_bias reads it too), or include_standard=False (format_bias_items, "
            f"run_format_bias) to leave the standard variant out; command line: python -m mmfragile formats "
            f"--standard-format {example} (or --standard-format none)")


def _as_format(value: Any, what: str) -> PromptFormat:
    if isinstance(value, PromptFormat):
        return value
    try:
        return PromptFormat.from_name(str(value).strip())
    except (ValueError, TypeError) as e:
        raise ValueError(f"{what}: {e}") from None


def standard_formats_for(questions: pd.DataFrame, standard: StandardArg = None) -> list[PromptFormat | None]:
    """The format of each question's ``standard`` variant: ``standard`` if given (one format - a
    :class:`~mmfragile.prompts.formats.PromptFormat` or its name - for every question, or a mapping dataset ->
    format, the datasets it does not name falling back to the rest of this list), else the question's
    ``standard_format`` column (a format name) where it has one, else the dataset's Table 5 format
    (:data:`~mmfragile.prompts.formats.STANDARD_FORMATS`). None for a question whose options are in the image
    (refused later as a bad row). A dataset with none of these raises
    :class:`~mmfragile.prompts.formats.NoStandardFormat` (a ``ValueError``) listing the known datasets and
    naming what to pass - before any question is turned into items."""
    fixed = per = None
    if isinstance(standard, Mapping):
        per = {str(k): _as_format(v, f"standard[{k!r}]") for k, v in standard.items()}
    elif standard is not None:
        fixed = _as_format(standard, "standard")
    out: list[PromptFormat | None] = []
    missing: list[str] = []
    table5: dict[str, PromptFormat | None] = {}
    for rec in questions.to_dict("records"):
        ds = str(rec.get("dataset"))
        cell = rec.get(STANDARD_FORMAT_COLUMN)
        if options_in_image(rec):
            out.append(None)
        elif fixed is not None:
            out.append(fixed)
        elif per is not None and ds in per:
            out.append(per[ds])
        elif isinstance(cell, (str, PromptFormat)) and str(cell).strip():
            out.append(_as_format(cell, f"{row_where(rec)}: column {STANDARD_FORMAT_COLUMN!r}"))
        else:
            if ds not in table5:
                try:
                    table5[ds] = STANDARD_FORMATS[ds]
                except KeyError:
                    table5[ds] = None
                    missing.append(ds)
            out.append(table5[ds])
    if missing:
        raise NoStandardFormat(missing, _no_standard_hint())
    return out


def format_bias_items(model: MLLM, questions: pd.DataFrame, formats: Sequence[PromptFormat] | None = None,
                      circular: bool = True, instruction: str | None = "paper", include_standard: bool = True,
                      system: str | None = None, n_frames: int | None = None, fps: float | None = None,
                      video_bounds: bool = True, skipped: list[dict] | None = None,
                      standard: StandardArg = None) -> list[EvalItem]:
    """Items of the format-bias grid: every question x format x circular shift (Sec. 4.1).

    ``formats`` defaults to the 48 of Table 1; ``include_standard`` adds the dataset's standard format
    (Table 5) as variant ``standard`` (the reference prompt of the confidence analysis, Sec. 5.3).
    ``max_new_tokens`` is the longest tokenized option ID of the format (Sec. A.4).

    ``standard``: the standard format where Table 5 has none (a ``generic:`` file, a table with its own
    dataset name) or another one - a format name / :class:`PromptFormat` for every question or a mapping
    dataset -> format; a ``standard_format`` column of format names does the same per question
    (:func:`standard_formats_for`). With ``include_standard`` and a dataset that has no standard format,
    :class:`~mmfragile.prompts.formats.NoStandardFormat` (a ``ValueError``, not a skippable bad row) names
    the datasets, the known ones and what to pass.

    Video questions (the paper has none): a question whose ``images`` is one video file / frame folder
    is shown as ``n_frames`` frames (or frames at ``fps``) from :func:`mmfragile.data.video.question_frames`,
    inside the benchmark's own time window when ``video_bounds`` (MVBench's start/end); one of the two
    must be given for such questions. A question whose options are in the image (MMMU-Pro vision) cannot
    be put in a text prompt format and is refused.

    A question that cannot be turned into items (more options than an ID set has, an unreadable video,
    options in the image) raises :class:`~mmfragile.schema.DataError` naming its file and row - or, with a
    ``skipped`` list, is appended to it as ``{"file", "row", "reason"}`` and left out."""
    formats = list(formats) if formats is not None else all_formats()
    standards = standard_formats_for(questions, standard) if include_standard else [None] * len(questions)
    items: list[EvalItem] = []
    id_len_cache: dict[tuple, int] = {}
    for rec, std in zip(questions.to_dict("records"), standards):
        q = MCQuestion.from_row(rec)
        try:
            new = _question_format_items(model, q, rec, formats, circular, instruction, std, system,
                                         n_frames, fps, video_bounds, id_len_cache)
        except DataError as e:
            if skipped is None:
                raise
            skipped.append(bad_row(rec, e))
            continue
        items += new
    # keep one group's items together and sorted by generation length so the engine sees whole groups
    items.sort(key=lambda it: (it.group, it.max_new_tokens))
    return items


def _question_format_items(model, q, rec, formats, circular, instruction, standard, system, n_frames, fps,
                           video_bounds, id_len_cache) -> list[EvalItem]:
    where = row_where(rec)
    if options_in_image(rec):
        raise DataError(f"{where}: the options are in the image (MMMU-Pro vision setting); a prompt format "
                        "cannot be applied to them")
    images = list(q.images)
    if q.modality == "video" and images:
        images = question_frames(rec, n_frames=n_frames, fps=fps, use_bounds=video_bounds, require_budget=True)
    out: list[EvalItem] = []
    fmts = [(f, f.name) for f in formats]
    if standard is not None:
        fmts.append((standard, "standard"))
    for fmt, fname in fmts:
        for shift in (circular_shifts(len(q.options)) if circular else [0]):
            try:
                fp = build_mc_prompt(q, fmt, shift=shift, instruction=instruction)
            except DataError as e:
                raise DataError(f"{where}: {e}") from e
            ids = tuple(fp.option_ids)
            if ids not in id_len_cache:
                id_len_cache[ids] = model.max_id_tokens(ids)
            prompt = fp.to_prompt(system=system)
            prompt.images = list(images)
            out.append(EvalItem(
                key={"dataset": q.dataset, "question_id": q.question_id, "variant": f"{fname}|s{shift}",
                     "format": fname, "option_id_set": fmt.option_ids, "delimiter": fmt.delimiter,
                     "separator": fmt.separator, "shift": shift, "n_options": len(q.options),
                     "category": q.category, "modality": q.modality},
                prompt=prompt, option_ids=list(fp.option_ids), answer_id=fp.answer_id,
                max_new_tokens=id_len_cache[ids]))
    return out
