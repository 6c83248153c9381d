"""Promptception's stage-2 answer extraction runs as the study's own ``extraction`` stage: the extractor gets the
answers stage 1 left unresolved as batched requests of the run loop (resumable, stored beside the answers), and the
joined rows carry the same letters as extracting each answer on its own
(:func:`mmfragile.studies.promptception.answers.extract_answer`).
"""
from __future__ import annotations

import json
import math
import zlib

import pandas as pd
import pytest

from mmfragile.errors import UsageError
from mmfragile.studies.promptception.answers import extract_answer
from mmfragile.models.base import MLLM
from mmfragile.models.spec import spec_of
from mmfragile.schema import MCQuestion
from mmfragile.study import RunContext, StageTask, get_study, run_study
from mmfragile.studies.promptception.extraction import PENDING, read_answers, with_extraction
from mmfragile.studies.promptception.prompts import get_prompt_type

MATCHER_MARK = "Now it is your turn:"   # in every stage-2 prompt (Fig. 7 / 8)
ANSWERS = ("B", "Answer: A", "it looks like a shape to me", "", "I'm sorry, I cannot see it",
           "hmm, hard to say", "The colour is clearly something")
MATCHES = ("A", "C", "Y", "X", "B")
RUN = dict(n=3, prompt_ids=["1.1", "2.1", "7.6", "12.1"], max_new_tokens=6, n_frames=2, progress=False)


def _pick(options, text: str) -> str:
    return options[zlib.crc32(text.encode()) % len(options)]


class Scripted(MLLM):
    """Answers a question prompt with one of :data:`ANSWERS` and a matching prompt with one of :data:`MATCHES`
    (both chosen by the prompt's text, so deterministic); records every ``generate`` call's prompts."""

    exact_option_logits = False

    def __init__(self, name: str):
        self.name = name
        self.calls: list[list[str]] = []

    def generate(self, prompts, max_new_tokens=16):
        self.calls.append([p.text for p in prompts])
        return [_pick(MATCHES if MATCHER_MARK in p.text else ANSWERS, p.text) for p in prompts]

    def matcher_calls(self) -> list[int]:
        """The sizes of the calls that carried matching prompts."""
        return [len(c) for c in self.calls if any(MATCHER_MARK in t for t in c)]

    def option_logits(self, prompts, candidates):
        raise NotImplementedError

    def loglikelihood(self, prompts, continuations):
        raise NotImplementedError


def _one_by_one(rows: pd.DataFrame, questions: pd.DataFrame, extractor: MLLM, **kw) -> pd.DataFrame:
    """Each answer through :func:`extract_answer` on its own (the per-item path), as the reference."""
    recs = {r["question_id"]: MCQuestion.from_row(r) for r in questions.to_dict("records")}
    out = []
    for r in rows.itertuples(index=False):
        q = recs[r.question_id]
        shown = get_prompt_type(r.prompt_id).render(q, model_kind="open")
        res = extract_answer(r.raw_output, q, list(r.option_ids), extractor, options=shown.options, **kw)
        out.append((res.letter, res.stage, res.is_correct(r.answer_id), res.letter is not None))
    return pd.DataFrame(out, columns=["letter", "extraction_stage", "correct", "covered"], index=rows.index)


def _same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    for c in want.columns:
        assert got[c].fillna("-").tolist() == want[c].fillna("-").tolist(), c


def test_extraction_is_batched_and_gives_the_per_item_letters(tmp_path):
    model = Scripted("scripted")   # answers and (extractor = its own name) matches, as a study run allows
    run = run_study("promptception", model, "synthetic-vqa", out=tmp_path, extractor="scripted", batch_size=4, **RUN)
    answers = run.stores["prompts"].read()
    pending = answers[answers.extraction_stage == PENDING]
    n = len(pending)
    assert n > 4 and n < len(answers)   # the script leaves several answers to stage 2, resolves others
    assert model.matcher_calls() == [4] * (n // 4) + ([n % 4] if n % 4 else [])   # ceil(n/4) calls, not n
    assert len(model.matcher_calls()) == math.ceil(n / 4)
    ex = run.stores["extraction"]
    assert ex.root == tmp_path / "extraction" and len(ex) == n and set(ex.read().model) == {"scripted"}
    joined = read_answers(run.stores["prompts"])
    assert len(joined) == len(answers) and not (joined.extraction_stage == PENDING).any()
    assert set(joined.extraction_stage) >= {"regex", "model", "failed"}
    _same(joined, _one_by_one(joined, run.data, Scripted("reference"), refusals=False))
    assert run.summary()["per_prompt"].stage2.sum() == (joined.extraction_stage == "model").sum()
    # the report reads the joined answers: its trimmed mean is the one of the extracted letters, not of "pending"
    from mmfragile.report import build_report
    from mmfragile.studies.promptception import analysis as pcs
    from mmfragile.studies.promptception import metrics as pm

    rep = build_report([run.stores["prompts"].root], tmp_path / "report", n_boot=20)
    got = json.loads(rep.json.read_text())["metrics"][f"prompts/scripted/{answers.dataset.iloc[0]}/trimmed_mean"]
    want = pm.trimmed_means(pcs.accuracy_frame(joined.assign(exclude_refusals=False), benchmark_by="dataset"))
    assert got == pytest.approx(float(want["trimmed_mean"].iloc[0]), abs=1e-6)


def test_killed_extraction_resumes_and_a_missing_one_is_out_of_coverage(tmp_path):
    answerer, extractor = Scripted("answerer"), Scripted("smollm2")   # the extractor stands in for smollm2
    loader = {"answerer": answerer, "smollm2": extractor}
    kw = dict(RUN, n=4, extractor="smollm2", batch_size=3, exclude_refusals=True)
    run = run_study("promptception", answerer, "synthetic-vqa", out=tmp_path, stages=["prompts"],
                    models=lambda spec: loader[spec.name], **kw)
    n = int((run.table().extraction_stage == PENDING).sum())
    assert n > 6 and answerer.matcher_calls() == []
    # the extraction stage killed after its second batch
    study = get_study("promptception")
    stage = study.stage("extraction")
    params = study.resolve({k: v for k, v in kw.items() if k not in ("n", "progress")})
    ctx = RunContext(study, spec_of(answerer), "answerer", "synthetic-vqa", kw["n"], tmp_path, params, data=run.data)
    store = study.stage_store(tmp_path, "extraction", stage.config(ctx))
    StageTask("promptception", "extraction", tuple(sorted(params.items())), stop_after=4)(
        extractor, stage.units(ctx), store)
    assert extractor.matcher_calls() == [3, 3] and len(store) == 6
    part = read_answers(tmp_path)
    assert len(part) == len(run.table())   # nothing dropped: the answers without extraction are still there
    missing = part[part.extraction_stage == PENDING]
    assert len(missing) == n - 6 and not missing.covered.any() and not missing.correct.any()
    # the rerun extracts only the rest, through the run's model loader
    extractor.calls.clear()
    again = run_study("promptception", answerer, "synthetic-vqa", out=tmp_path,
                      models=lambda spec: loader[spec.name], **kw)
    assert again.new_rows == {"prompts": 0, "extraction": n - 6}
    assert sum(extractor.matcher_calls()) == n - 6 and len(extractor.matcher_calls()) == math.ceil((n - 6) / 3)
    ex = again.stores["extraction"].read()
    assert len(ex) == n and not ex.duplicated(["dataset", "question_id", "variant"]).any()
    joined = read_answers(tmp_path)
    _same(joined, _one_by_one(joined, run.data, Scripted("reference"), refusals=True))
    assert (joined.refusal == (joined.extraction_stage == "refusal")).all()


def test_an_unknown_extractor_fails_before_any_model_runs(tmp_path):
    model = Scripted("scripted")
    with pytest.raises(UsageError, match="no-such-matcher"):
        run_study("promptception", model, "synthetic-vqa", out=tmp_path, extractor="no-such-matcher", **RUN)
    assert model.calls == [] and not (tmp_path / "parts").exists()


def test_with_extraction_joins_by_answer_model_and_key():
    answers = pd.DataFrame({
        "model": ["m", "m", "m", "g"], "dataset": "d", "question_id": ["q1", "q2", "q3", "q1"], "variant": "1.1",
        "letter": ["A", None, None, None], "extraction_stage": ["regex", PENDING, PENDING, PENDING],
        "refusal": False, "correct": [True, False, False, False], "covered": [True, False, False, False],
        "extractor_output": None})
    ex = pd.DataFrame({
        "model": "x", "answer_model": ["m", "g", "m"], "dataset": "d", "question_id": ["q2", "q2", "q1"],
        "variant": "1.1", "letter": ["B", "C", "D"], "extraction_stage": "model", "refusal": False,
        "correct": [True, True, True], "covered": True, "extractor_output": ["B", "C", "D"]})
    got = with_extraction(answers, ex)
    # q1 of m was resolved by stage 1 (its stray extraction is ignored); g's q2 extraction does not touch m's rows
    assert got.letter.fillna("-").tolist() == ["A", "B", "-", "-"]
    assert got.extraction_stage.tolist() == ["regex", "model", PENDING, PENDING]
    assert got.correct.tolist() == [True, True, False, False] and got.covered.tolist() == [True, True, False, False]
    assert got.extractor_output.fillna("-").tolist() == ["-", "B", "-", "-"] and list(got.columns) == list(answers.columns)
    pd.testing.assert_frame_equal(with_extraction(answers, None), answers)
