"""Running Study 2 (Promptception): items, two-stage scoring, video frame sampling, stores -> accuracy."""
from __future__ import annotations

import re
import sys
from functools import partial

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from mmfragile.runner import run_items
from mmfragile.models.base import MLLM, Prompt
from mmfragile.errors import DataError
from mmfragile.store import ResultStore
from mmfragile.study import answerable, tag
from mmfragile.studies.promptception.study import STUDY
from mmfragile.studies.promptception.extraction import PENDING, extraction_item, score_extraction
from mmfragile.studies.promptception import (PromptceptionItem, accuracy_frame, figure_note_for, frame_indices,
                                             load_results, score_answer, promptception_items, run_config,
                                             sample_frames, select_questions, split_zero_baselines,
                                             summarize_run)


class FakeMLLM(MLLM):
    """Test double. As an extractor it answers the stage-2 prompt by option-text matching (letter of the
    first listed option whose text occurs in the answer, else the no-match code) and records the prompts;
    ``supports_images`` is configurable so it can also stand in for a text-only model."""

    name = "fake"

    def __init__(self, supports_images: bool = False, fixed: str | None = None):
        self.supports_images = supports_images
        self.fixed = fixed
        self.prompts: list[Prompt] = []

    def generate(self, prompts, max_new_tokens=16):
        outs = []
        for p in prompts:
            self.prompts.append(p)
            if self.fixed is not None:
                outs.append(self.fixed)
                continue
            tail = p.text.rsplit("Now it is your turn:", 1)[1]
            opts = re.findall(r"^([A-Z])\. (.+)$", tail.split("\nAnswer:")[0], flags=re.M)
            answer = re.search(r"^Answer: (.*)$", tail, flags=re.M).group(1).lower()
            no_match = re.search(r"matches none of the options, output (\w+)\.", p.text).group(1)
            outs.append(next((L for L, t in opts if t.lower() in answer), no_match))
        return outs

    def option_logits(self, prompts, candidates):
        raise NotImplementedError

    def loglikelihood(self, prompts, continuations):
        raise NotImplementedError


def one_per_modality(synthetic: pd.DataFrame) -> pd.DataFrame:
    return synthetic.groupby("modality", sort=False).head(1).reset_index(drop=True)


# ---------------------------------------------------------------------------------------------- items
def test_items_count_and_keys(synthetic):
    qs = one_per_modality(synthetic)
    assert sorted(qs.modality) == ["image", "multi-image", "text", "video"]
    items = promptception_items(FakeMLLM(supports_images=True), qs, n_frames=4)
    per_q = pd.Series([it.key["question_id"] for it in items]).value_counts()
    vid = qs[qs.modality == "video"].question_id.iloc[0]
    # 61 prompt types on video questions, 59 elsewhere (11.4 / 11.5 are video-only); no separate baseline
    assert per_q[vid] == 61 and (per_q.drop(vid) == 59).all() and len(items) == 61 + 3 * 59
    assert all(isinstance(it, PromptceptionItem) for it in items)
    for it in items:
        k = it.key
        assert set(k) == {"dataset", "question_id", "variant", "prompt_id", "category", "supercategory", "intent",
                          "modality", "n_options", "question_category"}
        assert k["variant"] == k["prompt_id"] and k["category"] == int(k["prompt_id"].split(".")[0])
        assert k["intent"] in ("positive", "neutral", "negative")
        if k["prompt_id"] in ("11.4", "11.5"):
            assert k["modality"] == "video"
        assert it.max_new_tokens == 48 and it.group == f"synthetic-vqa/{k['question_id']}"
    # items of a question are contiguous and in paper order
    assert [it.key["prompt_id"] for it in items[:3]] == ["1.1", "1.2", "1.3"]
    by_id = {(it.key["question_id"], it.key["prompt_id"]): it for it in items}
    row = qs.iloc[0]
    it = by_id[(row.question_id, "1.1")]
    assert it.answer_id == "ABCDE"[row.answer] and it.option_ids == list("ABCDE"[:len(row.options)])
    assert it.key["n_options"] == len(row.options) and it.key["category"] == 1 and it.key["supercategory"] == 1
    assert it.question == row.question and it.options == list(row.options)
    assert it.prompt.text.endswith("Answer with the option letter from the given choices directly.")
    # 7.6 adds three options: valid letters, never the answer
    it76 = by_id[(row.question_id, "7.6")]
    n = len(row.options)
    assert it76.option_ids == list("ABCDEFGH"[: n + 3]) and it76.options[n:][0].startswith("Not sure")
    # video: 6 frames sampled to 4 (indices 0, 1, 3, 5), same frames for every prompt; text: no images
    vrow = qs[qs.modality == "video"].iloc[0]
    assert len(vrow.images) == 6
    v = by_id[(vid, "11.4")]
    assert v.prompt.images == [vrow.images[i] for i in (0, 1, 3, 5)]
    assert by_id[(vid, "1.1")].prompt.images == v.prompt.images
    trow = qs[qs.modality == "text"].iloc[0]
    assert by_id[(trow.question_id, "1.1")].prompt.images == []


def test_items_subset_options_and_text_only_model(synthetic):
    qs = one_per_modality(synthetic)
    items = promptception_items(FakeMLLM(supports_images=True), qs, prompt_ids=["baseline", "11.4", "12.1"],
                                model_kind="proprietary", max_new_tokens=12)
    assert len(items) == 4 * 2 + 1 and {it.max_new_tokens for it in items} == {12}
    base = [it for it in items if it.key["prompt_id"] == "baseline"][0]
    assert base.key["category"] == 0 and base.key["intent"] == "neutral"
    # proprietary variant (Appendix A): 12.1 with "$LETTER"; omit_dollar drops the $ (Appendix J)
    p121 = [it for it in items if it.key["prompt_id"] == "12.1"][0].prompt.text
    no_dollar = promptception_items(FakeMLLM(True), qs.iloc[:1], prompt_ids=["12.1"], omit_dollar=True)[0].prompt.text
    assert "$LETTER" in p121 and "$LETTER" not in no_dollar and "LETTER" in no_dollar
    with pytest.raises(KeyError):
        promptception_items(FakeMLLM(True), qs, prompt_ids=["16.1"])
    # a text-only model gets the items of every question; mmfragile.study.answerable leaves out the image ones
    text_only = FakeMLLM(supports_images=False)
    with pytest.warns(UserWarning, match="fake takes no images: 3 of 4 questions"):
        text_items = answerable(text_only, promptception_items(text_only, qs, prompt_ids=["1.1"]))
    assert [it.key["modality"] for it in text_items] == ["text"]


def test_select_questions_spreads_and_is_prefix_stable(synthetic):
    sel = select_questions(synthetic, 12)
    assert sel.modality.value_counts().to_dict() == {"image": 3, "video": 3, "multi-image": 3, "text": 3}
    assert list(sel.modality[:4]) == ["image", "video", "multi-image", "text"]
    assert list(sel[sel.modality == "image"].category) == ["count", "colour", "shape"]
    assert list(select_questions(synthetic, 5).question_id) == list(sel.question_id[:5])
    assert len(select_questions(synthetic, None)) == len(synthetic)


# ---------------------------------------------------------------------------------------------- frames
def test_frame_indices_hand_computed():
    # uniform rule floor(linspace(0, N-1, n)) (LLaVA-OneVision loader, Appendix F)
    assert frame_indices(10, 4) == [0, 3, 6, 9]
    assert frame_indices(6, 4) == [0, 1, 3, 5]
    assert frame_indices(100, 3) == [0, 49, 99]
    assert frame_indices(3, 8) == [0, 1, 2]              # never repeats frames
    assert frame_indices(10, fps=1, source_fps=2) == [0, 2, 4, 6, 8]
    assert frame_indices(90, 16, fps=1, source_fps=30) == [0, 30, 60]  # 1 fps gives 3 <= 16 frames
    assert frame_indices(10, 3, fps=1, source_fps=2) == [0, 4, 9]      # 5 > 3: uniform over the whole video
    assert frame_indices(7) == list(range(7))
    with pytest.raises(ValueError, match="source_fps"):
        frame_indices(10, fps=1)
    with pytest.raises(ValueError):
        frame_indices(0, 4)
    with pytest.raises(ValueError):
        frame_indices(10, 0)


def test_sample_frames_list_and_folder(tmp_path):
    frames = [f"/x/f{i}.png" for i in range(10)]
    assert sample_frames(frames, 4) == ["/x/f0.png", "/x/f3.png", "/x/f6.png", "/x/f9.png"]
    assert sample_frames(frames) == frames
    d = tmp_path / "frames"
    d.mkdir()
    for i in range(1, 11):  # natural order: frame_2 before frame_10
        Image.new("RGB", (4, 4), (i, 0, 0)).save(d / f"frame_{i}.png")
    (d / "notes.txt").write_text("not a frame")
    got = sample_frames(d, 4)
    assert [p.rsplit("/", 1)[1] for p in got] == ["frame_1.png", "frame_4.png", "frame_7.png", "frame_10.png"]
    assert sample_frames([str(d)], 4) == got  # one-element list holding a folder
    with pytest.raises(DataError, match="not found"):
        sample_frames(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no frame images"):
        sample_frames(tmp_path / "empty")


def test_sample_frames_gif(tmp_path):
    colours = [(25 * i, 255 - 25 * i, 0) for i in range(10)]
    imgs = [Image.new("RGB", (8, 8), c) for c in colours]
    gif = tmp_path / "clip.gif"
    imgs[0].save(gif, save_all=True, append_images=imgs[1:], duration=500, loop=0)  # 2 fps
    out = tmp_path / "out"
    got = sample_frames(gif, 4, out_dir=out)
    assert len(got) == 4
    for path, i in zip(got, [0, 3, 6, 9]):
        px = np.asarray(Image.open(path).convert("RGB"))[0, 0]
        assert np.abs(px.astype(int) - np.array(colours[i])).max() <= 8, (i, px)
    # 1 fps from a 2 fps GIF (frame rate read from the GIF's frame durations): every second frame
    got_fps = sample_frames(gif, fps=1, out_dir=out)
    assert [p.rsplit("_", 1)[1] for p in got_fps] == [f"{i:06d}.png" for i in (0, 2, 4, 6, 8)]


def test_sample_frames_video_needs_pyav(tmp_path, monkeypatch):
    vid = tmp_path / "clip.mp4"
    vid.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    monkeypatch.setitem(sys.modules, "av", None)  # as if PyAV were not installed
    with pytest.raises(ImportError, match="PyAV"):
        sample_frames(vid, 4)
    with pytest.raises(DataError):
        sample_frames(tmp_path / "notes.xyz")


# ---------------------------------------------------------------------------------------------- scoring
def _item(question_id="q1", prompt_id="7.6", answer="B"):
    return PromptceptionItem(
        key={"dataset": "d", "question_id": question_id, "variant": prompt_id, "prompt_id": prompt_id},
        prompt=Prompt(text="..."), option_ids=list("ABCDEFG"), answer_id=answer, max_new_tokens=8,
        question="What colour is the square?",
        options=["red", "blue", "green", "yellow", "Not sure (if you genuinely do not know the answer).",
                 "Evidence not sufficient to answer", "I'll answer later"])


def two_stage(extractor: MLLM | None = None, exclude_refusals: bool = False):
    """The answers' score, then for a pending answer the extraction stage's request and score (one by one here;
    tests/test_promptception_extraction.py runs them batched)."""

    def score(raw: str, item: PromptceptionItem) -> dict:
        r = score_answer(raw, item, exclude_refusals=exclude_refusals, extractor="x" if extractor is not None else None)
        if r["extraction_stage"] != PENDING:
            return r
        ex = extraction_item(item.key, item.question, item.options, item.option_ids, raw, item.answer_id,
                             exclude_refusals)
        return score_extraction(extractor.generate([ex.prompt], ex.max_new_tokens)[0], ex, exclude_refusals)

    return score


def test_score_fn_two_stages():
    ex = FakeMLLM()
    score = two_stage(ex)
    r = score("B", _item())
    assert r == {"letter": "B", "extraction_stage": "regex", "refusal": False, "correct": True, "covered": True,
                 "extractor_output": None}
    assert ex.prompts == []  # stage 1 resolved it: no model call
    r = score("The square is blue.", _item())
    assert (r["letter"], r["extraction_stage"], r["correct"], r["covered"]) == ("B", "model", True, True)
    assert r["extractor_output"] == "B"
    # the matcher sees the question and the rendered options, including the added ones (7.6)
    assert "What colour is the square?" in ex.prompts[-1].text and "E. Not sure" in ex.prompts[-1].text
    r = score("The square is green.", _item())
    assert (r["letter"], r["extraction_stage"], r["correct"]) == ("C", "model", False)
    r = score("F", _item())  # an added option: a valid answer, never correct
    assert (r["letter"], r["covered"], r["correct"]) == ("F", True, False)
    # unresolved by both stages: kept, incorrect
    r = score("It is a shape with four sides.", _item())
    assert (r["letter"], r["extraction_stage"], r["correct"], r["covered"]) == (None, "failed", False, False)
    assert r["extractor_output"] == "Y"
    # no extractor: stage 2 skipped
    r = two_stage(None)("The square is blue.", _item())
    assert (r["letter"], r["extraction_stage"], r["correct"]) == (None, "failed", False)
    r = two_stage(ex)("", _item())
    assert (r["extraction_stage"], r["correct"]) == ("failed", False)


def test_score_fn_refusals():
    refusal = "I'm sorry, but I cannot see the image clearly."
    # Fig. 7 policy (open-source models): failed and incorrect, flagged as a refusal for reporting
    r = two_stage(FakeMLLM(fixed="Y"))(refusal, _item())
    assert (r["extraction_stage"], r["refusal"], r["correct"]) == ("failed", True, False)
    # GPT-4o policy: stage "refusal" (dropped later by the accuracy, not here)
    ex = FakeMLLM(fixed="A")
    r = two_stage(ex, exclude_refusals=True)(refusal, _item())
    assert (r["letter"], r["extraction_stage"], r["refusal"], r["correct"]) == (None, "refusal", True, False)
    # refusal-aware stage 2 uses the Fig. 8 prompt, whose refusal code X is honoured
    r = two_stage(FakeMLLM(fixed="X"), exclude_refusals=True)("hmm, the colours are odd", _item())
    assert (r["extraction_stage"], r["refusal"]) == ("refusal", True)
    r = two_stage(FakeMLLM(fixed="A"))("hmm, the colours are odd", _item())
    assert (r["letter"], r["refusal"], r["correct"]) == ("A", False, False)


# ---------------------------------------------------------------------------------------------- end to end
def test_run_items_end_to_end_and_resume(tiny_vlm, synthetic, tmp_path):
    qs = synthetic[synthetic.modality.isin(["image", "video"])].groupby("modality").head(1)
    items = promptception_items(tiny_vlm, qs, prompt_ids=["1.1", "7.6", "12.1"], max_new_tokens=6, n_frames=3)
    assert len(items) == 6
    root = tmp_path / "runs" / "tiny-vlm" / "synthetic-vqa"
    cfg = {**run_config("tiny-vlm", "synthetic-vqa", max_new_tokens=6, extractor="fake", n_frames=3),
           **tag(STUDY, STUDY.stage("prompts"))}
    score = partial(score_answer, extractor="x")
    part = run_items(tiny_vlm, items, ResultStore(root, cfg), score, progress=False, stop_after=2, flush_every=1)
    assert 2 <= len(part) < 6  # a killed run keeps what it flushed (the engine runs a question's group at once)
    res = run_items(tiny_vlm, items, ResultStore(root, cfg), score, progress=False)
    assert len(res) == 6 and not res.duplicated(["question_id", "variant"]).any()
    n_parts = len(list((root / "parts").glob("*.parquet")))
    again = run_items(tiny_vlm, items, ResultStore(root, cfg), score, progress=False)
    assert len(again) == 6 and len(list((root / "parts").glob("*.parquet"))) == n_parts  # resuming adds nothing
    assert set(res.extraction_stage) <= {"regex", PENDING, "failed"}
    assert (res.correct == (res.letter == res.answer_id)).all()
    assert {"prompt_id", "category", "supercategory", "intent", "modality", "raw_output"} <= set(res.columns)
    # store -> accuracy frame: one benchmark per modality, 1.1 is the baseline
    rows = load_results(tmp_path / "runs")
    assert len(rows) == 6 and not rows.exclude_refusals.any()
    acc = accuracy_frame(rows)
    assert sorted(acc.benchmark.unique()) == ["synthetic-vqa[image]", "synthetic-vqa[video]"]
    assert set(acc.accuracy.unique()) <= {0.0, 100.0} and (acc.n == 1).all()
    summ = summarize_run(res)
    assert list(summ["per_prompt"].prompt_id) == ["1.1", "7.6", "12.1"] and summ["per_prompt"].n.sum() == 6


def test_accuracy_frame_exclusion_and_zero_baselines():
    rows = pd.DataFrame({
        "model": ["m"] * 4 + ["g"] * 4, "dataset": ["d"] * 8, "modality": ["image"] * 8,
        "question_id": ["q1", "q2"] * 4, "prompt_id": ["1.1", "1.1", "2.1", "2.1"] * 2,
        "correct": [True, False, False, False, False, False, True, False],
        "refusal": [False, False, False, True, False, True, False, True],
        "exclude_refusals": [False] * 4 + [True] * 4})
    acc = accuracy_frame(rows).set_index(["model", "prompt_id"])
    assert acc.loc[("m", "1.1"), "accuracy"] == 50.0 and acc.loc[("m", "2.1"), "accuracy"] == 0.0  # refusal kept
    assert acc.loc[("g", "1.1"), "accuracy"] == 0.0 and acc.loc[("g", "2.1"), "accuracy"] == 100.0  # refusal dropped
    assert set(acc.benchmark) == {"d"}
    ok, bad = split_zero_baselines(acc.reset_index())
    assert list(bad.model) == ["g"] and set(ok.model) == {"m"}


def test_figure_note_for():
    assert "RANDOM" in figure_note_for(["smollm2-vlm", "x"])
    assert figure_note_for(["/models/llava"]) is None


class FakeAPI(FakeMLLM):
    """A model built by hand that declares itself a remote chat API (no ``spec``)."""

    name = "fake-api"
    api = True
    exact_option_logits = False


def test_a_loaded_api_model_runs_and_records_the_proprietary_formats(synthetic, tmp_path):
    """Appendix A: an API model gets the proprietary answer formats - and the store's config says what was sent."""
    from mmfragile.study import run_study

    model = FakeAPI(supports_images=True, fixed="Answer: A")
    run = run_study("promptception", model, "synthetic-vqa", n=2, out=tmp_path / "run", prompt_ids=["1.1", "2.6"],
                    n_frames=2, max_new_tokens=4, progress=False)
    cfg = run.stores["prompts"].config
    assert cfg["model_kind"] == "proprietary" and cfg["model"] == "fake-api"
    assert cfg["run_info"]["model_identity"]["fake-api"]["backend"] == "openai"
    sent = [p.text for p in model.prompts if "Here is the question" in p.text]        # the prompts of type 2.6
    assert len(sent) == 2
    assert all("Respond in the following format: ’Answer: " in t and "Respond only with" not in t for t in sent)
