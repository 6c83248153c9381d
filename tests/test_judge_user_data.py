"""Study 3 on a user's own judge data (docs/judge-data.md): one flat JSONL of image path, query, response and an
optional reference / score is perturbed with the study's catalogue and judged end to end; perturbations the
records cannot take are left out with a note."""
from __future__ import annotations

import json
import warnings

import pytest
from PIL import Image

import mmfragile as mf
from mmfragile.cli import main
from mmfragile.models.base import MLLM
from mmfragile.store import ResultStore
from mmfragile.studies.judgebias import reference_responses
from mmfragile.studies.judgebias.data import load_judge_dataset
from mmfragile.studies.judgebias.metrics import PERTURBATIONS

#: the perturbations a file of image records without captions takes (no text-only record: no Unnecessary-Image;
#: no caption: no Detail-Description)
IMAGE_ONLY = ["text_dominance", "image_dominance", "response_dominance", "instruction_misalignment",
              "image_misalignment", "visual_transformation", "texture_insertion"]
COLOURS = {"cat": (200, 120, 40), "sky": (80, 140, 230), "leaf": (40, 160, 60)}


def _user_file(root, caption: bool = False, text_only: bool = False):
    """A user's layout: pics/<name>.png and judge.jsonl with image paths relative to the file."""
    (root / "pics").mkdir(parents=True)
    recs = []
    for name, colour in COLOURS.items():
        Image.new("RGB", (24, 24), colour).save(root / "pics" / f"{name}.png")
        rec = {"image": f"pics/{name}.png", "query": f"What is shown in the {name} picture?",
               "response": f"A {name}.", "score": 9, "reference": f"It shows a {name}."}
        if caption:
            rec["caption"] = f"A plain square of {name} colour."
        recs.append(rec)
    if text_only:
        recs.append({"query": "What is 2 + 2?", "response": "4.", "reference": "2 + 2 = 4."})
    (root / "judge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return root / "judge.jsonl"


def test_run_judge_on_a_flat_jsonl_end_to_end(tmp_path, capsys):
    data = _user_file(tmp_path / "data")
    rc = main(["run", "judge", "--model", "tiny-vlm", "--dataset", f"judge-dir:{data}", "--out",
               str(tmp_path / "out"), "--runs", "2", "--max-new-tokens", "4", "--quiet"])
    assert rc == 0
    printed = capsys.readouterr()
    notes = printed.err.splitlines()  # the CLI prints each warning as one line
    left = sorted(n.split(" left out")[0].split()[-1] for n in notes if " left out: " in n)
    assert left == ["detail_description", "unnecessary_image"]
    store = ResultStore(tmp_path / "out" / "scores")
    rows = store.read()
    # 3 records x (original + 7 perturbations) x 2 runs
    assert len(rows) == 3 * (1 + len(IMAGE_ONLY)) * 2 == 48
    assert set(rows["dataset"]) == {"judge"} and set(rows["sample_id"]) == {"judge-0", "judge-1", "judge-2"}
    assert sorted(store.config["run_info"]["left_out"]) == ["detail_description", "unnecessary_image"]
    bias = mf.get_study("judge").summarize({"scores": store})["bias"]
    assert list(bias["perturbation"]) == IMAGE_ONLY                       # one row each, in the paper's order
    assert list(bias["metric"]) == ["BD"] * 5 + ["BC"] * 2
    assert (bias["n_total"] == 3 * 2).all()                               # every record's perturbed runs
    out = printed.out
    assert "# bias" in out and all(p in out for p in IMAGE_ONLY) and "unnecessary_image" not in out


class BlackImageJudge(MLLM):
    """Scores 2 when the image is all black (Text- / Response-Dominance), else 8 - a planted truth."""

    name = "black-image-judge"
    supports_images = True

    def generate(self, prompts, max_new_tokens=16):
        return [f"Score: {2 if p.images and p.images[0].convert('L').getextrema() == (0, 0) else 8}" for p in prompts]

    def option_logits(self, prompts, candidates):  # pragma: no cover - not used
        raise NotImplementedError

    def loglikelihood(self, prompts, continuations):  # pragma: no cover - not used
        raise NotImplementedError


def test_flat_data_bd_bc_of_a_planted_judge(tmp_path):
    data = _user_file(tmp_path / "data", caption=True, text_only=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = mf.run_study("judge", BlackImageJudge(), f"judge-dir:{data}", out=tmp_path / "out", runs=1,
                           decoding="greedy", progress=False)
    assert not [w for w in seen if " left out: " in str(w.message)]
    bias = run.summary()["bias"].set_index("perturbation")
    # all nine apply: captions for Detail-Description, a text-only record for Unnecessary-Image
    assert list(bias.index) == list(PERTURBATIONS)
    # y = 8 everywhere; a black image gives 2: BD = (8 - 2) / (8 - 1); every other judgment stays 8 (BD 0, BC 1)
    assert bias.loc["text_dominance", "value"] == bias.loc["response_dominance", "value"] == pytest.approx(6 / 7)
    assert (bias.drop(index=["text_dominance", "response_dominance"])
            .query("metric == 'BD'")["value"] == 0).all()
    assert (bias.query("metric == 'BC'")["value"] == 1).all()
    assert bias.loc["unnecessary_image", "n_total"] == 1 and bias.loc["text_dominance", "n_total"] == 3
    assert len(run.table()) == 4 + 3 * 8 + 1                              # originals, 8 image perturbations x 3, 1
    captioned = run.table().query("perturbation == 'detail_description'")["query"]
    assert captioned.str.endswith("Detailed description of the image: A plain square of cat colour.").sum() == 1


def test_reference_key_is_kept_and_scored_as_the_reference_generator(tmp_path):
    data = _user_file(tmp_path / "data", text_only=True)
    samples = mf.load_judge_dataset(f"judge-dir:{data}")
    assert mf.load_judge_dataset is load_judge_dataset
    assert [s.meta["reference"] for s in samples] == ["It shows a cat.", "It shows a sky.", "It shows a leaf.",
                                                      "2 + 2 = 4."]
    assert "score" not in samples[0].meta and samples[0].gold_score == 9 and samples[3].gold_score is None
    refs = reference_responses(samples)
    assert [(r.sample_id, r.response, r.meta["generator"]) for r in refs] == [
        (f"judge-{i}@reference", s.meta["reference"], "reference") for i, s in enumerate(samples)]


def test_unavailable_names_what_the_records_lack(tmp_path):
    from mmfragile.studies.judgebias import unavailable

    image_only = load_judge_dataset(f"judge-dir:{_user_file(tmp_path / 'a')}")
    assert unavailable(PERTURBATIONS, image_only) == {
        "detail_description": "it appends a description of the image to the query: give the records a 'caption'",
        "unnecessary_image": "it adds an unrelated image to a text-only record, and every record has an image"}
    one = image_only[:1]
    assert sorted(unavailable(["instruction_misalignment", "image_misalignment", "text_dominance"], one)) == [
        "image_misalignment", "instruction_misalignment"]
    text = [s for s in load_judge_dataset(f"judge-dir:{_user_file(tmp_path / 'b', text_only=True)}")
            if s.is_text_only]
    assert unavailable(["unnecessary_image", "texture_insertion"], text) == {
        "unnecessary_image": "no record has an image to add",
        "texture_insertion": "it changes the image, and no record has one"}


def test_the_judge_study_refuses_a_question_table(tmp_path):
    table = mf.load_dataset("synthetic-vqa", n=2)
    with pytest.raises(ValueError, match=r"judge-dir:<file> - docs/judge-data.md - .*list of JudgeSample .*not a "
                                         "DataFrame"):
        mf.run_study("judge", "tiny-vlm", table, out=tmp_path)


def test_pairwise_on_flat_data_pairs_every_response_with_its_reference(tmp_path):
    data = _user_file(tmp_path / "data")
    run = mf.run_study("judge", BlackImageJudge(), f"judge-dir:{data}", out=tmp_path / "out", runs=1,
                       decoding="greedy", progress=False, pairwise=True, perturbations=["text_dominance"])
    pairs = run.table("pairwise")
    assert len(pairs) == 3 * (2 + 2)                 # 3 records x (position AB, BA + verbosity AB, BA) x 1 run
    ab = pairs.query("experiment == 'position' and order == 'AB'").set_index("sample_id")
    assert ab.loc["judge-1", ["response_a", "response_b"]].tolist() == ["A sky.", "It shows a sky."]
    verbose = pairs.query("experiment == 'verbosity' and order == 'AB'").set_index("sample_id")
    assert verbose.loc["judge-2", "response_a"] == "A leaf." and "A leaf." in verbose.loc["judge-2", "response_b"]
