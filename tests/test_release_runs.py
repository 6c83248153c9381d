"""The three studies on the benchmark releases (tiny fixtures): items, bad rows recorded in config.json, the CLI."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from mmfragile.data import fixtures as fx
from mmfragile.studies.judgebias.data import RELEASE_DATASET, load_judge_dataset
from mmfragile.data.loaders import load_dataset
from mmfragile.studies.format_bias.items import format_bias_items
from mmfragile.models.base import split_interleaved
from mmfragile.studies.format_bias.prompts import PromptFormat
from mmfragile.errors import DataError
from mmfragile.store import ConfigMismatch, ResultStore
from mmfragile.studies import judgebias as jb
from mmfragile.studies.promptception import promptception_items

ONE_FORMAT = [PromptFormat("uppercase", "dot", "line_break")]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_CACHE", str(tmp_path / "cache"))


def test_cli_formats_runs_a_release_and_records_skipped_rows(tmp_path, tiny_vlm, monkeypatch, capsys):
    from mmfragile import cli
    from mmfragile.models.spec import ModelSpec

    monkeypatch.setattr(ModelSpec, "load", lambda spec: tiny_vlm)
    spec = fx.write_hrbench(tmp_path / "data", "4k", bad_rows=True)
    args = ["formats", "--model", "tiny-vlm", "--dataset", spec, "--n", "3", "--formats", "uppercase-dot-line_break",
            "--out", str(tmp_path / "run"), "--quiet"]
    assert cli.main(args) == 2  # a bad row stops the run, naming file and row
    assert re.search(r"error: .*hr_bench_4k.tsv, row 2 \(index=100\): corrupt.*\n\(--skip-bad-rows",
                     capsys.readouterr().err)
    assert cli.main(args + ["--skip-bad-rows"]) == 0
    out = capsys.readouterr()
    assert re.search(r"standard\s+[\d.]+\s+[\d.]+", out.out) and "uppercase-dot-line_break" in out.out
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    tsv = str(tmp_path / "data" / "hr_bench_4k.tsv")
    assert [(r["file"], r["row"]) for r in cfg["run_info"]["skipped_rows"]] == [(tsv, 2), (tsv, 3)]
    assert "skipped 2 bad row(s)" in out.err
    rows = ResultStore(tmp_path / "run").read()
    assert len(rows) == 2 * 2 * 4  # 2 questions x (format + standard) x 4 circular shifts
    assert cli.main(args + ["--skip-bad-rows"]) == 0  # resumes: run_info is not part of the resume check
    assert len(ResultStore(tmp_path / "run").read()) == 16


def test_store_run_info_is_rewritten_not_checked(tmp_path):
    st = ResultStore(tmp_path, {"study": "x", "n": 1}, run_info={"skipped_rows": [{"file": "a", "row": 1}]})
    assert st.config["run_info"]["skipped_rows"] == [{"file": "a", "row": 1}]
    st2 = ResultStore(tmp_path, {"study": "x", "n": 1}, run_info={"skipped_rows": []})
    assert st2.config["run_info"] == {"skipped_rows": []}
    assert ResultStore(tmp_path, {"study": "x", "n": 1}).config["run_info"] == {"skipped_rows": []}  # kept
    with pytest.raises(ConfigMismatch):
        ResultStore(tmp_path, {"study": "x", "n": 2})


def test_format_bias_items_on_video_and_bad_questions(tmp_path, tiny_vlm):
    qs = load_dataset(fx.write_mvbench(tmp_path, bad_rows=True), skip_bad_rows=True)
    seq = qs[qs.category.isin(["action_sequence", "unexpected_action"])]
    with pytest.raises(DataError, match=r"action_sequence.json, row 0 .*needs n_frames or fps"):
        format_bias_items(tiny_vlm, seq, formats=ONE_FORMAT)
    skipped: list[dict] = []
    items = format_bias_items(tiny_vlm, seq, formats=ONE_FORMAT, n_frames=2, skipped=skipped)
    assert {it.key["question_id"] for it in items} == {"action_sequence/0", "unexpected_action/0"}
    assert all(len(it.prompt.images) == 2 and it.prompt.images[0].endswith(".png") for it in items)
    assert [(Path(r["file"]).name, r["row"]) for r in skipped] == [("unexpected_action.json", 1)]
    assert "broken.mp4: unreadable video" in skipped[0]["reason"]
    # more options than an ID set has: the question's file and row, or a skipped entry
    big = seq.iloc[[0]].assign(options=[[f"o{i}" for i in range(27)]], answer=0, modality="text",
                               images=[[]])
    with pytest.raises(DataError, match=r"action_sequence.json, row 0 .*27 options but the 'uppercase' option ID set"):
        format_bias_items(tiny_vlm, big, formats=ONE_FORMAT)
    vis = load_dataset(fx.write_mmmu_pro(tmp_path / "mp").replace("-s4:", "-vision:"))
    with pytest.raises(DataError, match=r"row 0 \(question_id='test_Art_1'\): the options are in the image"):
        format_bias_items(tiny_vlm, vis, formats=ONE_FORMAT)


def test_promptception_items_keep_interleaved_markers(tmp_path, tiny_vlm):
    spec = fx.write_mmmu_pro(tmp_path)
    s4 = load_dataset(spec)
    items = promptception_items(tiny_vlm, s4, ["1.1"])
    two = next(it for it in items if it.key["question_id"] == "test_Design_2")
    assert two.prompt.text.startswith("Compare <image 1> and <image 2>: which one shows the colour of <image 2>?")
    assert two.prompt.images == s4.images[1]
    parts = split_interleaved(two.prompt.text, len(two.prompt.images))
    assert parts[:4] == ["Compare ", 0, " and ", 1] and parts.count(0) == 2 and parts.count(1) == 3
    vis = load_dataset(spec.replace("-s4:", "-vision:"))
    skipped: list[dict] = []
    assert promptception_items(tiny_vlm, vis, ["1.1"], skipped=skipped) == []
    assert len(skipped) == 3 and "Prompts_MMMU-Pro-Vision.yaml" in skipped[0]["reason"]
    mv = load_dataset(fx.write_mvbench(tmp_path / "mv"), n=1)  # action_sequence: 16 frames, window 1-3 s
    whole = promptception_items(tiny_vlm, mv, ["1.1"], n_frames=3)[0]
    window = promptception_items(tiny_vlm, mv, ["1.1"], n_frames=3, video_bounds=True)[0]
    assert [p.rsplit("_", 1)[1] for p in whole.prompt.images] == ["000000.png", "000007.png", "000015.png"]
    assert [p.rsplit("_", 1)[1] for p in window.prompt.images] == ["000004.png", "000008.png", "000012.png"]


def test_mm_judgebias_release(tmp_path):
    spec = fx.write_mm_judgebias(tmp_path)
    samples = load_judge_dataset(spec)
    assert len(samples) == 8 and {s.meta["dataset"] for s in samples} == {RELEASE_DATASET}
    by = {(s.sample_id, s.meta["role"]): s for s in samples}
    assert by[("2", "biased")].query == "" and by[("2", "biased")].perturbation == "image_dominance"
    assert by[("4", "unbiased")].is_text_only and not by[("4", "biased")].is_text_only
    assert by[("3", "unbiased")].images[0].size == (64, 48)  # restricted source: from images/0003_unbiased.jpg
    conds = jb.release_conditions(samples)
    assert [(c, s.sample_id) for c, s in conds][:2] == [("original", "1"), ("text_dominance", "1")]
    assert len(conds) == 8 and len(jb.release_conditions(samples, ["unnecessary_image"])) == 2
    lazy = load_judge_dataset(spec, load_images=False)
    assert all(not s.images for s in lazy) and Path(lazy[0].meta["image_paths"][0]).is_file()
    bad = fx.write_mm_judgebias(tmp_path / "bad", bad_rows=True)
    shard = tmp_path / "bad" / "data" / "test-00000-of-00001.parquet"
    with pytest.raises(DataError, match=rf"{re.escape(str(shard))}, row 4, field 'biased_image': undecodable"):
        load_judge_dataset(bad)
    skipped: list[dict] = []
    assert len(load_judge_dataset(bad, skipped=skipped)) == 8
    assert [(r["file"], r["row"]) for r in skipped] == [(str(shard), 4), (str(shard), 5)]
    rows = pd.DataFrame({"dataset": [RELEASE_DATASET, RELEASE_DATASET + "-selfgen"], "x": [1, 2]})
    assert jb.main_rows(rows)["x"].tolist() == [1]
