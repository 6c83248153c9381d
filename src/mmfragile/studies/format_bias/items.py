"""Study 1's run side: the evaluation items - every question x prompt format x circular shift (Sec. 4.1), plus the
dataset's standard format (Table 5) as variant ``standard`` - and where and under which config their rows are
stored (:func:`run_config`, :func:`video_settings`); :mod:`~mmfragile.studies.format_bias.analysis`
reads the stores back."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from mmfragile.data.loaders import run_info
from mmfragile.data.video import question_media
from mmfragile.runner import EvalItem
from mmfragile.models.base import MLLM
from mmfragile.errors import DataError
from mmfragile.schema import MCQuestion, options_in_image, row_where, skip_or_raise
from mmfragile.studies.format_bias.prompts import (STANDARD_FORMATS, NoStandardFormat, PromptFormat, all_formats,
                                                   build_mc_prompt, circular_shifts)

__all__ = ["STUDY_NAME", "STANDARD_FORMAT_COLUMN", "standard_formats_for", "format_bias_items", "run_config",
           "video_settings", "run_info"]

#: The study's registry name (:data:`mmfragile.studies.format_bias.study.STUDY`; the analyses find its stores by it).
STUDY_NAME = "format-bias"
#: Question-table column naming a question's standard format (a format name; what ``--standard-format`` sets).
STANDARD_FORMAT_COLUMN = "standard_format"

StandardArg = PromptFormat | str | Mapping[str, PromptFormat | str] | None


def _no_standard_hint() -> str:
    example = PromptFormat().name
    return (f"pass one: format_bias_items(..., standard={example!r}) (a format name or PromptFormat for all "
            f"questions, or a {{dataset: format}} dict), or a {STANDARD_FORMAT_COLUMN!r} column of format names in "
            "the question table (run_study reads it too), or include_standard=False (format_bias_items; run_study: "
            f"standard_format='none') to leave the standard variant out; command line: python -m mmfragile formats "
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
    :class:`~mmfragile.studies.format_bias.prompts.PromptFormat` or its name - for every question, or a mapping dataset ->
    format, the datasets it does not name falling back to the rest of this list), else the question's
    ``standard_format`` column (a format name) where it has one, else the dataset's Table 5 format
    (:data:`~mmfragile.studies.format_bias.prompts.STANDARD_FORMATS`). None for a question whose options are in the image
    (refused later as a bad row). A dataset with none of these raises
    :class:`~mmfragile.studies.format_bias.prompts.NoStandardFormat` (a ``ValueError``) listing the known datasets and
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
    :class:`~mmfragile.studies.format_bias.prompts.NoStandardFormat` (a ``ValueError``, not a skippable bad row) names
    the datasets, the known ones and what to pass.

    Video questions (the paper has none): a question whose ``images`` is one video file / frame folder
    is shown as ``n_frames`` frames (or frames at ``fps``) from :func:`mmfragile.data.video.question_frames`,
    inside the benchmark's own time window when ``video_bounds`` (MVBench's start/end); one of the two
    must be given for such questions. A question whose options are in the image (MMMU-Pro vision) cannot
    be put in a text prompt format and is refused.

    A question that cannot be turned into items (more options than an ID set has, an unreadable video,
    options in the image) raises :class:`~mmfragile.errors.DataError` naming its file and row - or, with a
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
            skip_or_raise(rec, e, skipped)
            continue
        items += new
    # keep one group's items together and sorted by generation length so the engine sees whole groups
    items.sort(key=lambda it: (it.group, it.max_new_tokens))
    return items


def _question_format_items(model, q, rec, formats, circular, instruction, standard, system, n_frames, fps,
                           video_bounds, id_len_cache) -> list[EvalItem]:
    where = row_where(rec)
    images = question_media(rec, "a prompt format cannot be applied to them", n_frames=n_frames, fps=fps,
                            use_bounds=video_bounds, require_budget=True)
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


# ================================================================================================ stores
def run_config(model: str, dataset: str, n: int | None, formats: Sequence[str] | None = None,
               stage: str = "grid", video: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A stage's store config (what changes its rows; the study's tag is added where the store is opened,
    :meth:`mmfragile.study.Study.stage_store`). ``video`` (``n_frames``, ``fps``, ``video_bounds``) is added only for
    datasets with video questions, so
    image-only stores keep their config."""
    cfg: dict[str, Any] = {"model": model, "dataset": dataset, "n": n}
    if stage == "grid":
        cfg["formats"] = None if formats is None else ",".join(formats)
    if video:
        cfg["video"] = dict(video)
    return cfg


def video_settings(questions: pd.DataFrame, n_frames: int | None = None, fps: float | None = None,
                   video_bounds: bool = True) -> dict[str, Any] | None:
    """The frame sampling of a run (for :func:`run_config`), or None when ``questions`` has no video."""
    if "modality" not in questions or not (questions["modality"] == "video").any():
        return None
    return {"n_frames": n_frames, "fps": fps, "video_bounds": bool(video_bounds)}
