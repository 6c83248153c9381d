"""Stage 2 of Appendix E's answer extraction as its own stage of the Promptception study.

The ``prompts`` stage scores every answer with what needs no model (regex, refusal heuristic, option-text
match); an answer only the extractor model can resolve is stored as ``extraction_stage == "pending"``. The
``extraction`` stage (run when the study's ``extractor`` parameter names a model) turns each pending answer into one
request - the Fig. 7 / Fig. 8 prompt of :func:`mmfragile.studies.promptception.answers.build_extraction_prompt` - sent
to the
extractor through :func:`mmfragile.runner.run_items`: batched, resumable, with progress, stored in
``<folder>/extraction`` beside the answers (key ``model`` = the extractor, ``answer_model`` = who answered).

:func:`with_extraction` joins the two: a pending answer takes its extraction's ``letter, extraction_stage, refusal,
correct, covered, extractor_output``; one whose extraction is missing stays ``"pending"``, out of coverage and
incorrect - never dropped. :func:`read_answers` reads a store folder that way (what the analysis reads).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from mmfragile.studies.promptception.answers import (ExtractionResult, build_extraction_prompt, is_refusal,
                                                    read_extractor_output)
from mmfragile.models.base import Prompt
from mmfragile.runner import EvalItem
from mmfragile.schema import MCQuestion
from mmfragile.store import ResultStore
from mmfragile.studies.promptception.prompts import get_prompt_type

__all__ = ["PENDING", "EXTRACTION_STORE", "EXTRACTION_MAX_NEW_TOKENS", "ExtractionItem",
           "pending_answers", "extraction_items", "extraction_item", "score_extraction", "answer_columns",
           "with_extraction", "read_answers"]

#: ``extraction_stage`` of an answer waiting for the extractor
PENDING = "pending"
#: the extraction store's subfolder of the answers' store, and its config's ``study``
EXTRACTION_STORE = "extraction"
#: the extractor's generation limit (one letter or code)
EXTRACTION_MAX_NEW_TOKENS = 8
#: the columns an extraction sets on its answer
RESULT_COLUMNS = ("letter", "extraction_stage", "refusal", "correct", "covered", "extractor_output")
_JOIN = ["dataset", "question_id", "variant"]


@dataclass
class ExtractionItem(EvalItem):
    """One extraction request: ``letters`` are the answer's valid letters, ``response`` the answer itself."""

    letters: list[str] = field(default_factory=list)
    response: str = ""


def pending_answers(answers: pd.DataFrame, questions: pd.DataFrame, answer_model: str,
                    model_kind: str) -> list[dict[str, Any]]:
    """The units of the extraction stage: ``answer_model``'s pending answers to the questions of ``questions``, each
    with its question record and the prompt variant it answered (``model_kind``): the extraction prompt shows the
    question and the options as the answer saw them."""
    if answers.empty or "extraction_stage" not in answers.columns:
        return []
    rows = answers[(answers.extraction_stage == PENDING) & (answers.model == answer_model)]
    records = {(str(r["dataset"]), str(r["question_id"])): r for r in questions.to_dict("records")}
    return [{"dataset": a.dataset, "question_id": a.question_id, "variant": a.variant, "prompt_id": a.prompt_id,
             "answer_model": answer_model, "response": a.raw_output, "answer_id": a.answer_id,
             "model_kind": model_kind, "question": records[(str(a.dataset), str(a.question_id))]}
            for a in rows.itertuples(index=False) if (str(a.dataset), str(a.question_id)) in records]


def extraction_items(units: list[dict[str, Any]], refusals: bool,
                     max_new_tokens: int = EXTRACTION_MAX_NEW_TOKENS) -> list[ExtractionItem]:
    """One matching prompt per pending answer (Fig. 8 with ``refusals``, else Fig. 7), listing the options the
    answer's prompt rendered (7.6's added ones included)."""
    items = []
    for u in units:
        q = MCQuestion.from_row(u["question"])
        shown = get_prompt_type(u["prompt_id"]).render(q, model_kind=u["model_kind"])
        key = {"dataset": u["dataset"], "question_id": u["question_id"], "variant": u["variant"],
               "prompt_id": u["prompt_id"], "answer_model": u["answer_model"]}
        items.append(extraction_item(key, q.question, shown.options, shown.valid_letters, str(u["response"]),
                                     u["answer_id"], refusals, max_new_tokens))
    return items


def extraction_item(key: dict[str, Any], question: str, options: Sequence[str], letters: Sequence[str], response: str,
                    answer_id: str, refusals: bool, max_new_tokens: int = EXTRACTION_MAX_NEW_TOKENS) -> ExtractionItem:
    """The matching request of one answer ``response`` to ``question`` with ``options`` labelled ``letters``."""
    return ExtractionItem(key=key, prompt=Prompt(text=build_extraction_prompt(question, options, response, letters,
                                                                              refusals)),
                          answer_id=answer_id, max_new_tokens=max_new_tokens, letters=list(letters), response=response)


def score_extraction(out: str, item: ExtractionItem, exclude_refusals: bool = False) -> dict[str, Any]:
    """Score the extractor's output into the answer's columns (the ``refusal`` policy of
    :func:`mmfragile.studies.promptception.items.score_answer`)."""
    return answer_columns(read_extractor_output(out, item.letters, exclude_refusals), item.response,
                          item.answer_id, exclude_refusals)


def answer_columns(res: ExtractionResult, response: str | None, answer_id: str,
                   exclude_refusals: bool) -> dict[str, Any]:
    """An answer's :data:`RESULT_COLUMNS` from its extraction ``res`` (either stage). ``refusal``: with
    ``exclude_refusals`` the extraction's verdict, else whether an unresolved ``response`` reads as a refusal
    (reported; it stays incorrect)."""
    refusal = res.refusal if exclude_refusals else (res.letter is None and is_refusal(response))
    return {"letter": res.letter, "extraction_stage": res.stage, "refusal": bool(refusal),
            "correct": bool(res.is_correct(answer_id)), "covered": res.letter is not None,
            "extractor_output": res.model_output}


def with_extraction(answers: pd.DataFrame, extractions: pd.DataFrame | None) -> pd.DataFrame:
    """``answers`` with each pending answer's extraction filled in (same rows, same columns, same order)."""
    if extractions is None or extractions.empty or answers.empty or "extraction_stage" not in answers.columns:
        return answers
    ex = extractions.rename(columns={"model": "extractor", "answer_model": "model"})
    ex = ex[["model", *_JOIN, *RESULT_COLUMNS]].drop_duplicates(["model", *_JOIN])
    pending = (answers.extraction_stage == PENDING).to_numpy()
    got = answers.loc[pending, ["model", *_JOIN]].merge(ex, how="left", on=["model", *_JOIN])
    found = got.extraction_stage.notna().to_numpy()
    out = answers.copy()
    idx = out.index[pending][found]
    for c in RESULT_COLUMNS:
        out.loc[idx, c] = got.loc[found, c].to_numpy()
    return out.astype({c: bool for c in ("refusal", "correct", "covered")})


def read_answers(store: ResultStore | str | Path) -> pd.DataFrame:
    """The rows of a Promptception answers store joined with the extraction store beside it (if any)."""
    store = store if isinstance(store, ResultStore) else ResultStore(store)
    ex_root = store.root / EXTRACTION_STORE
    extractions = ResultStore(ex_root).read() if (ex_root / "parts").is_dir() else None
    return with_extraction(store.read(), extractions)
