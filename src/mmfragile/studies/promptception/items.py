"""Study 2 (Promptception) - the run side: items, the answer scoring of stage 1, the question selection and the
store config; :mod:`mmfragile.studies.promptception.analysis` reads the stores back.

Study 2 (Promptception) on any model: evaluation items, two-stage scoring, video frame sampling, and
reading the result stores back into the accuracy frames of :mod:`mmfragile.studies.promptception.metrics`.

Protocol (seed ``promptception``):

* Sec. 2.1 / 3: every question is asked once per prompt type, zero-shot; the prompt of
  :func:`mmfragile.studies.promptception.prompts.render` is the whole user turn, the images (or video frames)
  come before it. The 61 prompt types are run by default - 59 on image / multi-image / text questions,
  61 on video questions (11.4 and 11.5 are video-only, Sec. 4.2.2). The catalog's ``"baseline"`` prompt
  (Fig. 3) is the same text as Type 1.1, so it is not run twice: the metrics take 1.1 as the baseline
  (:func:`mmfragile.studies.promptception.metrics.baseline_accuracy`); pass ``prompt_ids=[..., "baseline"]`` to
  run it explicitly anyway.
* Generation is greedy with one ``max_new_tokens`` for every prompt (default 48: enough for the answer
  formats and a short rationale of the CoT / "explain" prompts, cheap enough for CPU runs; the paper does
  not state its limit). A truncated rationale that never names a letter goes to stage 2 like any other.
* App. E: answers are extracted in two stages: the regex by :func:`score_answer`, then a text model - GPT-4o mini
  in the paper, SmolLM2 in the notebooks - as the study's own ``extraction`` stage, batched
  (:mod:`mmfragile.studies.promptception.extraction`). Unresolved answers are **incorrect and kept**.
  ``exclude_refusals=True`` is the paper's GPT-4o policy: refusal-aware matching prompt (Fig. 8) and the
  ``refusal`` flag, so that :func:`accuracy_frame` drops refusals from that model's denominator.
* App. F: video inputs are frames sampled by :func:`sample_frames` (1 fps capped at N frames in the
  paper, N = 16-64 depending on the model; here ``n_frames`` / ``fps`` per run).

Results go through :func:`mmfragile.runner.run_items` into a resumable
:class:`~mmfragile.store.ResultStore` at ``<results_dir>/<model>/<dataset>`` (the study's ``folder``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd

from mmfragile.runner import EvalItem
from mmfragile.studies.promptception.answers import ExtractionResult, resolve_without_model
from mmfragile.models.base import MLLM
from mmfragile.data.video import frame_indices, question_media, sample_frames  # noqa: F401  (re-exported)
from mmfragile.studies.promptception.prompts import BASELINE_ID, get_prompt_type, prompt_ids as catalog_prompt_ids
from mmfragile.errors import DataError
from mmfragile.schema import MCQuestion, row_where, skip_or_raise
from mmfragile.models.spec import ModelSpec, spec_of
from mmfragile.studies.promptception.extraction import PENDING, answer_columns

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "MODALITY_ORDER", "PromptceptionItem", "promptception_items",
           "resolve_model_kind", "score_answer", "frame_indices", "sample_frames", "select_questions", "run_config"]

#: Generation limit of every prompt (see the module docstring).
DEFAULT_MAX_NEW_TOKENS = 48
#: Order in which :func:`select_questions` spreads a small sample over modalities.
MODALITY_ORDER = ("image", "video", "multi-image", "text")


# ---------------------------------------------------------------------------------------------- items
@dataclass
class PromptceptionItem(EvalItem):
    """An :class:`EvalItem` that also carries the question text and the options as rendered (including
    options a prompt adds, 7.6), which the stage-2 extraction prompt shows to the matcher model."""

    question: str = ""
    options: list[str] = field(default_factory=list)


def resolve_model_kind(model: "MLLM | ModelSpec | str", model_kind: str = "auto") -> str:
    """The prompt variant of Appendix A: ``model_kind`` "open" / "proprietary" as given; "auto" gives
    "proprietary" for API models (a spec of an ``api`` backend such as ``openai:``, the one a loaded model carries
    or declares: ``spec_of``) and "open" for everything else."""
    if model_kind == "auto":  # API models get the proprietary variant (Appendix A), local ones the open one
        api = (ModelSpec.parse(model) if isinstance(model, (str, ModelSpec)) else spec_of(model)).origin == "api"
        return "proprietary" if api else "open"
    return model_kind


def promptception_items(model: MLLM, questions: pd.DataFrame, prompt_ids: Sequence[str] | None = None,
                        model_kind: str = "open", max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                        n_frames: int | None = None, fps: float | None = None, source_fps: float | None = None,
                        omit_dollar: bool = False, system: str | None = None, video_bounds: bool = False,
                        skipped: list[dict] | None = None) -> list[PromptceptionItem]:
    """One item per question x prompt type (Sec. 3), grouped by question for the prefix-sharing engine.

    ``prompt_ids`` (a list, or one comma-separated string) defaults to the 61 prompt types (no separate
    baseline, see the module docstring);
    prompts a question's modality does not support (11.4 / 11.5 on non-video questions) are skipped.
    ``model_kind`` is "open", "proprietary" (Appendix A's two answer-format variants) or "auto"
    (proprietary for OpenAI-compatible API models). ``omit_dollar`` drops the ``$`` of ``$LETTER``
    (Appendix J, GPT-4o). Video questions get their frames through
    :func:`mmfragile.data.video.question_frames` with ``n_frames`` / ``fps`` / ``source_fps`` (a question
    whose ``images`` is one video file, GIF or frame folder is decoded there). ``video_bounds=False``
    (default) samples the whole clip even where MVBench gives a start/end window: the Promptception
    authors' released ``Datasets/MVBench/mvbench.json`` carries no start/end and their loaders sample the
    whole video; ``True`` follows MVBench's own protocol. Questions with images are skipped, with a warning,
    for a text-only model. A question the study cannot show - options in the image (MMMU-Pro vision: the
    authors ran it with a separate prompt file, ``Prompts_MMMU-Pro-Vision.yaml``, not in the catalog), a
    video that does not decode, more options than letters - raises :class:`DataError` naming its file and
    row, or with a ``skipped`` list is appended there (``{"file", "row", "reason"}``) and left out.

    Key columns: ``dataset, question_id, variant (= prompt_id), prompt_id, category`` (prompt category
    1-15), ``supercategory`` (1-6), ``intent, modality, n_options`` (the question's own options) and
    ``question_category``. ``answer_id`` is the correct letter, ``option_ids`` every letter shown.
    """
    kind = resolve_model_kind(model, model_kind)
    if isinstance(prompt_ids, str):  # "1.1,6.1" from a command line / papermill -p
        prompt_ids = [p.strip() for p in prompt_ids.split(",") if p.strip()]
    pids = [str(p) for p in (prompt_ids if prompt_ids is not None else catalog_prompt_ids(include_baseline=False))]
    types = [get_prompt_type(p) for p in pids]  # KeyError for an unknown id, before any work
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    items: list[PromptceptionItem] = []
    for rec in questions.to_dict("records"):
        q = MCQuestion.from_row(rec)
        try:
            new = _question_items(q, rec, types, kind, max_new_tokens, n_frames, fps, source_fps, omit_dollar,
                                  system, video_bounds)
        except DataError as e:
            skip_or_raise(rec, e, skipped)
            continue
        items += new
    items.sort(key=lambda it: (it.group, it.max_new_tokens))  # stable: prompt order kept within a question
    return items


def _question_items(q: MCQuestion, rec: dict, types, kind: str, max_new_tokens: int, n_frames, fps, source_fps,
                    omit_dollar: bool, system: str | None, video_bounds: bool) -> list[PromptceptionItem]:
    where = row_where(rec)
    images = question_media(rec, "its prompts (the authors' Prompts_MMMU-Pro-Vision.yaml) are not in the "
                            "Promptception catalog", n_frames=n_frames, fps=fps, use_bounds=video_bounds,
                            source_fps=source_fps)
    items = []
    for pt in types:
        if not pt.supports(q.modality):
            continue
        try:
            r = pt.render(q, model_kind=kind, omit_dollar=omit_dollar)
        except DataError as e:
            raise DataError(f"{where}: {e}") from e
        items.append(PromptceptionItem(
                key={"dataset": q.dataset, "question_id": q.question_id, "variant": pt.prompt_id,
                     "prompt_id": pt.prompt_id, "category": int(pt.category), "supercategory": int(pt.supercategory),
                     "intent": pt.intent if pt.intent is not None else ("neutral" if pt.prompt_id == BASELINE_ID else ""),
                     "modality": q.modality, "n_options": len(q.options), "question_category": q.category},
                prompt=r.to_prompt(images=images, system=system), option_ids=list(r.valid_letters),
                answer_id=r.answer_letter, max_new_tokens=int(max_new_tokens),
                question=q.question, options=list(r.options)))
    return items


# ---------------------------------------------------------------------------------------------- scoring
def score_answer(raw: str, item: EvalItem, exclude_refusals: bool = False, match_text: bool = False,
                 extractor: str | None = None) -> dict[str, Any]:
    """Score one answer with what needs no model of the two-stage extraction of Appendix E (the ``prompts``
    stage's score; ``exclude_refusals``, ``match_text`` and ``extractor`` are the study's parameters).

    Stage 1 is the regex of :func:`mmfragile.studies.promptception.answers.extract_letter_regex`. ``match_text`` adds
    :func:`mmfragile.studies.promptception.answers.match_option_text` after it (a response that names exactly one
    option's text; stage
    "text"), a free stand-in for a weak or absent stage-2 model. An answer neither resolves is "failed", or with
    an ``extractor`` (the stage-2 model's spec) "pending": the study's ``extraction`` stage sends it to the extractor
    model as its own batched request (:mod:`mmfragile.studies.promptception.extraction`), with the Fig. 7 prompt, or
    the refusal-aware Fig. 8 prompt when ``exclude_refusals`` is set (the paper's GPT-4o policy).

    Returns ``letter`` (None if unresolved), ``extraction_stage`` ("regex", "text", "pending", "failed", "refusal";
    "model" after the extraction), ``refusal``, ``correct`` (False whenever no letter - never dropped here),
    ``covered`` (a valid letter was extracted; a prompt's added options such as 7.6's "Not sure" count as covered,
    never correct) and ``extractor_output`` (the raw stage-2 output; None here).

    ``refusal``: with ``exclude_refusals`` it is the extraction's refusal verdict (stage "refusal", which
    :func:`accuracy_frame` then leaves out of the denominator); without it the Fig. 7 pipeline runs and an
    unresolved response is "failed", but ``refusal`` still flags responses that read as refusals
    (:func:`mmfragile.studies.promptception.answers.is_refusal`) for reporting - they stay incorrect.
    """
    question = getattr(item, "question", "") or item.prompt.text
    options = list(getattr(item, "options", None) or [])
    res = resolve_without_model(raw, question, item.option_ids, options=options, refusals=exclude_refusals,
                                match_text=match_text)
    if res is None:
        res = ExtractionResult(None, PENDING if extractor else "failed")
    return answer_columns(res, raw, item.answer_id, exclude_refusals)


# ---------------------------------------------------------------------------------------------- runs
def select_questions(questions: pd.DataFrame, n: int | None = None) -> pd.DataFrame:
    """``n`` questions spread evenly over modalities (order :data:`MODALITY_ORDER`, then others) and,
    within a modality, over question categories - round robin, deterministic, in table order otherwise.
    The first ``n`` of a larger selection are the selection of ``n``, so growing ``n`` resumes a run."""
    if n is None or n >= len(questions):
        n = len(questions)
    df = questions.reset_index(drop=True)
    mods = [m for m in MODALITY_ORDER if m in set(df.modality)] + \
           [m for m in dict.fromkeys(df.modality) if m not in MODALITY_ORDER]

    def round_robin(lists: list[list[int]]) -> list[int]:
        out: list[int] = []
        for k in range(max((len(l) for l in lists), default=0)):
            out += [l[k] for l in lists if k < len(l)]
        return out

    per_mod = []
    for m in mods:
        sub = df[df.modality == m]
        per_mod.append(round_robin([list(g.index) for _, g in sub.groupby("category", sort=False)]))
    order = round_robin(per_mod)[:n]
    return df.loc[order].reset_index(drop=True)


def run_config(model: str, dataset: str, model_kind: str = "open", max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
               extractor: str | None = None, exclude_refusals: bool = False, n_frames: int | None = None,
               fps: float | None = None, omit_dollar: bool = False, match_text: bool = False,
               video_bounds: bool = False) -> dict[str, Any]:
    """The store configuration: everything that changes a row's value (not which rows are run - questions
    and prompts can be added to a store later). ``video_bounds`` is written only when True, so stores made
    before the option existed (whole clips) resume unchanged."""
    cfg = {"model": model, "dataset": dataset, "model_kind": model_kind,
           "max_new_tokens": int(max_new_tokens), "extractor": extractor, "exclude_refusals": bool(exclude_refusals),
           "n_frames": n_frames, "fps": fps, "omit_dollar": bool(omit_dollar), "match_text": bool(match_text)}
    if video_bounds:
        cfg["video_bounds"] = True
    return cfg


