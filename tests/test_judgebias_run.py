"""Study 3 end to end (mmfragile.studies.judgebias): conditions, scoring runs into the store, resume,
parse failures, BD/BC from stored rows vs hand-computed values, pairwise and self-enhancement runs, and
one tiny real-model run."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from mmfragile.studies.judgebias.data import make_judge_set
from mmfragile.studies.judgebias import metrics as jm
from mmfragile.models.base import MLLM
from mmfragile.studies.judgebias.perturbations import image_sha256
from mmfragile.studies.judgebias.prompts import pairwise_prompt, parse_score, score_prompt
from mmfragile.store import ResultStore
from mmfragile.studies import judgebias as jb
from mmfragile.study import run_study


def judge_run(judge, samples, out, **params):
    """The judge study on samples in memory, through the one run path (what the CLI and notebooks run)."""
    return run_study("judge", judge, samples, out=out, progress=False, **params)


def counts(rows):
    return {k: int((rows["status"] == k).sum()) for k in ("ok", "unparseable", "na")}


def _key(prompt):
    return prompt.text, tuple(image_sha256(im) for im in prompt.images)


class FakeJudge(MLLM):
    """Returns canned outputs: ``respond(prompt) -> str``; counts calls; optional seeded sampling; with
    ``interrupt_after`` a Ctrl-C arrives in the call that would pass that many prompts (a killed run)."""

    def __init__(self, respond, name="fake-judge", supports_images=True, sampled=None, interrupt_after=None):
        self.respond = respond
        self.name = name
        self.supports_images = supports_images
        self.calls = 0
        self.sampled = sampled
        self.can_sample = sampled is not None
        self.interrupt_after = interrupt_after

    def generate(self, prompts, max_new_tokens=16):
        if self.interrupt_after is not None and self.calls + len(prompts) > self.interrupt_after:
            raise KeyboardInterrupt
        self.calls += len(prompts)
        return [self.respond(p) for p in prompts]

    def option_logits(self, prompts, candidates):  # pragma: no cover - not used
        raise NotImplementedError

    def loglikelihood(self, prompts, continuations):  # pragma: no cover - not used
        raise NotImplementedError

    def generate_sampled(self, prompts, max_new_tokens, seeds, temperature=0.7, top_p=0.9):
        if self.sampled is None:
            return super().generate_sampled(prompts, max_new_tokens, seeds, temperature, top_p)
        return self.sampled(prompts, max_new_tokens, seeds, temperature, top_p)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """3 samples: two image items (different scenes) and one text-only item, all correct responses."""
    s = make_judge_set(2, 0, tmp_path_factory.mktemp("jset"), n_text=1)
    by = {x.sample_id: x for x in s}
    return [by["img000-good"], by["img001-good"], by["txt000-good"]]


# canned scores: original, then one per perturbation for (img000, img001); None = unparseable output
ORIG = {"img000-good": 8, "img001-good": 6, "txt000-good": 9}
PERT = {
    "text_dominance": (5, 6), "image_dominance": (8, 2), "response_dominance": (1, 9),
    "instruction_misalignment": (4, None), "image_misalignment": (10, 3),
    "detail_description": (8, 8), "visual_transformation": (6, 6), "texture_insertion": (9, 1),
}
UNNEC = 7  # txt000 + unnecessary image
FORMATS = ["Feedback: fine.\nScore: {}", "The answer is right. [[{}]]", "Feedback: ok\n\nI would rate it a {}",
           "Rating: {}/10"]
HAND = {  # BD / BC by hand from the canned scores above (Sec. 3.2, S = 10)
    "text_dominance": ((8 - 5) / 7 + 0 / 5) / 2,
    "image_dominance": (0 + (6 - 2) / 5) / 2,
    "response_dominance": (7 / 7 + 0) / 2,
    "instruction_misalignment": (8 - 4) / 7,          # the img001 pair is unparseable -> dropped
    "image_misalignment": (0 + (6 - 3) / 5) / 2,
    "detail_description": (1 + (1 - 2 / 5)) / 2,      # y=6: max(y-1, S-y) = 5
    "visual_transformation": ((1 - 2 / 7) + 1) / 2,   # y=8: max(7, 2) = 7
    "texture_insertion": ((1 - 1 / 7) + (1 - 5 / 5)) / 2,
    "unnecessary_image": 1 - 2 / 8,                   # y=9: max(8, 1) = 8
}


def _canned(conditions):
    table, k = {}, 0
    for cond, s in conditions:
        if cond == "original":
            v = ORIG[s.sample_id]
        elif cond == "unnecessary_image":
            v = UNNEC
        else:
            v = PERT[cond][0 if s.sample_id == "img000-good" else 1]
        out = "The response seems plausible, but I cannot decide." if v is None else FORMATS[k % 4].format(v)
        k += 1
        table[_key(score_prompt(s.query, s.response, s.images))] = out
    return table


def test_applicable_and_scene_description(three):
    img, _, txt = three
    assert jb.applicable("original", img) and jb.applicable("original", txt)
    assert jb.applicable("unnecessary_image", txt) and not jb.applicable("unnecessary_image", img)
    assert jb.applicable("text_dominance", img) and not jb.applicable("text_dominance", txt)
    desc = jb.scene_description(img.meta, img.image.size)
    assert desc.split(". There is no text")[0].count(" in the ") == len(img.meta["objects"])
    if img.meta["objects"][0]["center"] == [52.7, 45.3]:  # (x, y) on a 256-px image: left third, top third
        assert "a green triangle in the top left" in desc
    for o in img.meta["objects"]:
        assert f"a {o['color']} {o['shape']}" in desc
    assert img.meta["background"] in desc
    assert jb.parse_prompt_variant("na") == ("original", True)
    assert jb.parse_prompt_variant("reasoning+na") == ("reasoning", True)
    assert jb.parse_prompt_variant("score_guide") == ("score_guide", False)
    with pytest.raises(ValueError):
        jb.parse_prompt_variant("bogus")


def test_build_conditions_counts_and_audit(three, tmp_path):
    conds = jb.build_judge_conditions(three, seed=0, out_dir=tmp_path)
    names = [c for c, _ in conds]
    # 3 originals + 8 image perturbations x 2 image samples + unnecessary image x 1 text sample
    assert len(conds) == 3 + 8 * 2 + 1 == 20
    assert names.count("original") == 3 and names.count("unnecessary_image") == 1
    assert all(names.count(p) == 2 for p in jm.PERTURBATIONS if p != "unnecessary_image")
    for cond, s in conds:
        assert s.perturbation == cond
        side = tmp_path / cond / f"{s.sample_id}__{cond}.json"
        assert side.is_file()
        rec = json.loads(side.read_text())
        assert rec["query"] == s.query and len(rec["images"]) == len(s.images)
        for name in rec["images"]:
            assert (side.parent / name).is_file()
    manifest = [json.loads(x) for x in (tmp_path / "manifest.jsonl").read_text().splitlines()]
    assert len(manifest) == 20 and all(m["status"] == "ok" for m in manifest)
    # detail description: the scene's facts appended to the query; unnecessary image: the text item got one
    dd = [s for c, s in conds if c == "detail_description"][0]
    assert dd.query.startswith(three[0].query) and "coloured shape" in dd.query
    un = [s for c, s in conds if c == "unnecessary_image"][0]
    assert len(un.images) == 1 and un.sample_id == "txt000-good"
    # same seed -> same conditions (pixels and text)
    again = jb.build_judge_conditions(three, seed=0, out_dir=None)
    assert [(c, s.query, [image_sha256(i) for i in s.images]) for c, s in again] == \
        [(c, s.query, [image_sha256(i) for i in s.images]) for c, s in conds]


def test_judge_run_store_parse_failures_bd_bc_and_resume(three, tmp_path):
    conds = jb.build_judge_conditions(three, seed=0, out_dir=None)   # what the study builds of the samples
    table = _canned(conds)
    judge = FakeJudge(lambda p: table[_key(p)])
    run = judge_run(judge, three, tmp_path, runs=1, decoding="greedy", batch_size=4, flush_every=6)
    store = run.stores["scores"]
    rows = store.read()
    assert run.new_rows["scores"] == len(rows) == 20 and judge.calls == 20
    assert counts(rows) == {"ok": 19, "unparseable": 1, "na": 0}
    assert set(rows["variant"]) >= {"original|run0|original", "text_dominance|run0|original"}
    bad = rows[rows["status"] == "unparseable"]
    assert len(bad) == 1 and bad["perturbation"].item() == "instruction_misalignment"
    assert math.isnan(bad["score"].item()) and bad["parse_error"].item() == "no score found"
    assert "cannot decide" in bad["raw_output"].item()
    # every parsed row holds the parser's score of its stored raw output
    ok = rows[rows["status"] == "ok"]
    assert all(parse_score(r) == s for r, s in zip(ok["raw_output"], ok["score"]))
    # the judged inputs are saved for audit beside the stores
    assert len((tmp_path / "audit" / "manifest.jsonl").read_text().splitlines()) == 20

    j = jb.judgment_table(store)
    scores = jm.bias_scores(j).set_index("perturbation")
    for p, v in HAND.items():
        assert scores.loc[p, "value"] == pytest.approx(v), p
        assert scores.loc[p, "metric"] == jm.METRIC_OF[p]
    assert scores.loc["instruction_misalignment", "n_unparseable"] == 1
    assert scores.loc["instruction_misalignment", "n_pairs"] == 1
    t2 = jm.table2(j)
    assert t2.loc["fake-judge", "overall"] == pytest.approx(np.mean(list(HAND.values())))

    fails = jb.parse_failure_table(store)
    assert fails["n_unparseable"].sum() == 1
    assert fails.set_index("perturbation").loc["instruction_misalignment", "parse_failure_rate"] == 0.5

    # resume: nothing new is generated or written
    again = judge_run(judge, three, tmp_path, runs=1, decoding="greedy")
    assert again.new_rows["scores"] == 0 and judge.calls == 20 and len(store.read()) == 20


def test_interrupted_run_resumes_without_duplicates(three, tmp_path):
    table = _canned(jb.build_judge_conditions(three, seed=0, out_dir=None))
    killed = FakeJudge(lambda p: table[_key(p)], interrupt_after=8)
    with pytest.raises(KeyboardInterrupt):
        judge_run(killed, three, tmp_path, runs=1, decoding="greedy", batch_size=4, flush_every=100)
    assert len(ResultStore(tmp_path / "scores")) == 8   # the finished batches were kept
    judge = FakeJudge(lambda p: table[_key(p)])
    run = judge_run(judge, three, tmp_path, runs=1, decoding="greedy", batch_size=4)
    rows = run.table("scores")
    assert run.new_rows["scores"] == 12 == judge.calls and len(rows) == 20
    assert not rows.duplicated(["question_id", "variant"]).any()


def test_text_only_judge_skips_image_inputs(three, tmp_path):
    judge = FakeJudge(lambda p: "Score: 7", name="text-judge", supports_images=False)
    with pytest.warns(UserWarning, match="text-judge takes no images: 3 of 3 questions"):
        run = judge_run(judge, three, tmp_path, runs=1, decoding="greedy")
    assert judge.calls == 1
    assert run.table("scores")["question_id"].tolist() == ["txt000-good"]


def test_sampled_runs_are_seeded_per_judgment(three, tmp_path):
    seen = []

    def sampled(prompts, max_new_tokens, seeds, temperature, top_p):
        seen.extend(seeds)
        return [f"Score: {s % 10 + 1}" for s in seeds]

    judge = FakeJudge(lambda p: "unused", sampled=sampled)
    rows = judge_run(judge, three, tmp_path, perturbations=["text_dominance"], runs=2).table("scores")
    assert len(rows) == 2 * 5 and judge.calls == 0
    assert sorted(rows["run"].unique()) == [0, 1]
    assert len(set(seen)) == 10  # every (sample, condition, run) has its own stream
    r = rows.set_index("variant")
    assert r.loc["original|run0|original"].shape[0] == 3
    assert all(int(sd) % 10 + 1 == sc for sd, sc in zip(rows["sample_seed"], rows["score"]))
    s0 = jb.judgment_seed(0, "fake-judge", "img000-good", "original", "original", 0)
    assert s0 == jb.judgment_seed(0, "fake-judge", "img000-good", "original", "original", 0)
    assert s0 != jb.judgment_seed(0, "fake-judge", "img000-good", "original", "original", 1)
    assert str(s0) in set(rows["sample_seed"])
    var = jm.variance_table(jb.judgment_table(rows))
    assert var.loc["fake-judge", "inter_run_variance"] >= 0


def test_pairwise_position_and_verbosity(three, tmp_path):
    img = three[:2]
    pos = jb.position_pairs(img)
    verb = jb.verbosity_pairs(img, seed=0)
    assert len(pos) == 4 and len(verb) == 4
    p0, p1 = pos[0], pos[1]
    assert (p0.response_a, p0.response_b) == (p1.response_b, p1.response_a) and p1.info["swapped"]
    v = [x for x in verb if x.info["verbose_position"] == "B"][0]
    assert v.response_a in v.response_b and len(v.response_b) > 2 * len(v.response_a)
    assert jb.make_verbose("X is 3.", 0, "k") == jb.make_verbose("X is 3.", 0, "k")

    # each pair's canned verdict by its prompt (the run orders the judgments by picture, not by experiment)
    verdicts = ["Feedback: both fine.\nFinal Answer: [[A]]", "[[A]]", "I prefer B.", "no idea"] * 2
    answers = {_key(pairwise_prompt(u.query, u.response_a, u.response_b, u.images)): v
               for u, v in zip(pos + verb, verdicts)}
    judge = FakeJudge(lambda p: answers[_key(p)], name="pj")
    run = judge_run(judge, img, tmp_path, pairwise=True, stages=["pairwise"], runs=1, decoding="greedy",
                    batch_size=3)
    store = run.stores["pairwise"]
    assert judge.calls == 8 and counts(store.read())["unparseable"] == 2
    rows = store.read()
    assert set(rows["variant"]) == {"position|AB|run0", "position|BA|run0", "verbosity|AB|run0", "verbosity|BA|run0"}
    assert rows.loc[rows.status == "unparseable", "choice"].isna().all()
    # position: img000 A/A -> inconsistent; img001 B/unparseable -> not a full pair
    pc = jm.position_consistency(jb.position_table(store)).loc["pj"]
    assert (pc["n_pairs"], pc["n_consistent"], pc["n_unparseable"]) == (1, 0, 1)
    # verbosity: img000 verbose at B -> A (original), verbose at A -> A (verbose); img001 verbose at B -> B
    # (verbose), verbose at A -> unparseable: 1 of 3 parsed judgments prefers the original
    vr = jm.verbosity_robustness(jb.verbosity_table(store)).loc["pj"]
    assert vr["n"] == 3 and vr["robustness"] == pytest.approx(1 / 3) and vr["n_unparseable"] == 1
    assert vr["robustness_verbose_second"] == pytest.approx(1 / 2) and vr["robustness_verbose_first"] == 0
    assert judge_run(judge, img, tmp_path, pairwise=True, stages=["pairwise"], runs=1,
                     decoding="greedy").new_rows["pairwise"] == 0


def test_self_enhancement_pipeline(three, tmp_path):
    """The responses stage (every generator answers once; a text-only one the text items only) and the selfgen
    stage (the judge scores them and the references): a run with two generators, the judge one of them."""
    queries = {s.query for s in three}

    def judge_a(p):   # answers a bare query as a generator, scores a response as the judge
        if p.text in queries:
            return "mine"
        return "Score: 9" if "mine" in p.text else "Score: 4" if "theirs" in p.text else "Score: 6"

    judge = FakeJudge(judge_a, name="judge-a")
    other = FakeJudge(lambda p: "theirs", name="model-b", supports_images=False)
    run = judge_run(judge, three, tmp_path, self_generators=["model-b"], stages=["responses", "selfgen"],
                    runs=1, decoding="greedy", models=lambda spec: {"judge-a": judge, "model-b": other}[spec.name])
    responses = run.table("responses").sort_values(["model", "question_id"])
    assert list(zip(responses["model"], responses["question_id"], responses["response"])) == [
        ("judge-a", "img000", "mine"), ("judge-a", "img001", "mine"), ("judge-a", "txt000", "mine"),
        ("model-b", "txt000", "theirs")]   # a text-only generator: text items only
    store = run.stores["selfgen"]
    rows = store.read()
    assert set(rows["dataset"]) == {jb.SELFGEN_DATASET}
    assert sorted(rows["question_id"]) == ["img000@judge-a", "img000@reference", "img001@judge-a",
                                           "img001@reference", "txt000@judge-a", "txt000@model-b",
                                           "txt000@reference"]
    ref = jb.reference_responses(three)
    assert ref[0].response == three[0].response and ref[0].meta["generator"] == "reference"
    se = jm.self_enhancement(jb.selfgen_table(store)).loc["judge-a"]
    # self 9 (x3) vs others: model-b 4 (x1) and reference 6 (x3), pooled: (4 + 18) / 4 = 5.5
    assert (se["self_score"], se["other_score"], se["delta"], se["n_self"], se["n_other"]) == (9, 5.5, 3.5, 3, 4)
    assert jb.judgment_table(store).empty  # self-generated rows are not main-study judgments
    # stored responses are resumed, not asked again (another answer now would show)
    again = judge_run(FakeJudge(lambda p: "other", name="judge-a"), three, tmp_path, self_generators=["model-b"],
                      stages=["responses"], runs=1, decoding="greedy", models=lambda spec: other)
    assert again.new_rows["responses"] == 0


def test_tiny_vlm_real_run(tiny_vlm, tmp_path):
    s = make_judge_set(2, 1, tmp_path / "set", n_text=1)
    by = {x.sample_id: x for x in s}
    samples = [by["img000-good"], by["img001-bad"], by["txt000-good"]]
    run = judge_run(tiny_vlm, samples, tmp_path / "a", perturbations=["text_dominance"], runs=1, max_new_tokens=6)
    rows = run.table("scores")
    assert len(rows) == 2 * 2 + 1  # 2 image samples x (original, text_dominance) + the text-only original
    assert set(rows["status"]) <= {"ok", "unparseable"}
    un = rows[rows["status"] == "unparseable"]
    assert un["score"].isna().all() and (un["parse_error"].str.len() > 0).all()
    ok = rows[rows["status"] == "ok"]
    assert all(parse_score(r) == v for r, v in zip(ok["raw_output"], ok["score"]))
    # the stored sample reproduces: rerunning the same judgments in other batches gives byte-identical outputs
    again = judge_run(tiny_vlm, samples, tmp_path / "b", perturbations=["text_dominance"], runs=1, max_new_tokens=6,
                      batch_size=2).table("scores")
    a = rows.set_index(["question_id", "variant"])["raw_output"].sort_index()
    b = again.set_index(["question_id", "variant"])["raw_output"].sort_index()
    pd.testing.assert_series_equal(a, b)


def test_judgments_through_the_engine_equal_batched_generate(tiny_vlm, tmp_path, monkeypatch):
    """Issue 37 item 3: the judge's sampled judgments run through the prefix-sharing engine - the conditions and
    runs of one picture share its prefix, the groups decode together - and store the texts batched
    ``generate_sampled`` stores (float32), score-wise and pairwise; greedy verdicts too."""
    from mmfragile.engine import PrefixSharingEngine

    calls = []
    run_groups = PrefixSharingEngine.run_groups

    def counted(self, groups, *args, **kwargs):
        out = run_groups(self, groups, *args, **kwargs)
        calls.append((len(groups), sum(len(g[0]) for g in groups), self.stats["joint_batches"]))
        return out

    monkeypatch.setattr(PrefixSharingEngine, "run_groups", counted)
    s = make_judge_set(2, 1, tmp_path / "set", n_text=1)
    params = dict(perturbations=["text_dominance", "response_dominance", "image_misalignment"], runs=2,
                  max_new_tokens=8, pairwise=True, pairwise_max_new_tokens=6)
    for decoding in ("sample", "greedy"):
        engine = judge_run(tiny_vlm, s, tmp_path / f"engine-{decoding}", decoding=decoding, **params)
        assert calls and max(c[0] for c in calls) > 1 and calls[-1][2] > 0   # several groups, decoded together
        n_calls = len(calls)
        batched = judge_run(tiny_vlm, s, tmp_path / f"generate-{decoding}", decoding=decoding, mode="generate",
                            **params)
        assert len(calls) == n_calls   # mode="generate": no engine
        for stage in ("scores", "pairwise"):
            a = engine.table(stage).set_index(["question_id", "variant"])["raw_output"].sort_index()
            b = batched.table(stage).set_index(["question_id", "variant"])["raw_output"].sort_index()
            assert len(a) > 10
            pd.testing.assert_series_equal(a, b)
