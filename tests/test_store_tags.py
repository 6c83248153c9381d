"""One name per study and stage in every store's config ({"study", "stage"}, written by run_study); stores
written under the old tags are read - and resumed - through the one legacy table (store.LEGACY_TAGS); a store
that names no study is an error naming it, never read as some study."""
from __future__ import annotations

import pytest

from mmfragile.store import ConfigMismatch, ResultStore, UntaggedStore, find_stores, store_tag


@pytest.mark.parametrize("config, tag", [
    ({"study": "judge", "stage": "pairwise"}, ("judge", "pairwise")),
    ({"study": "judgebias", "kind": "pairwise"}, ("judge", "pairwise")),
    ({"study": "judgebias"}, ("judge", "scores")),
    ({"study": "format-bias-cp-ln"}, ("format-bias", "cp_ln")),
    ({"study": "format-bias"}, ("format-bias", "grid")),
    ({"study": "promptception"}, ("promptception", "prompts")),
])
def test_tags_old_and_new(config, tag):
    assert store_tag(config) == tag


def test_a_store_without_a_tag_is_an_error_naming_it(tmp_path):
    from mmfragile.report import build_report

    ResultStore(tmp_path / "runs" / "m" / "d", config={"model": "m", "n": 2})
    with pytest.raises(UntaggedStore, match=r"runs/m/d/config.json: its config.json names no study"):
        build_report([tmp_path / "runs"], tmp_path / "rep", n_boot=10)
    with pytest.raises(UntaggedStore, match="names no study"):
        find_stores(tmp_path / "runs", "format-bias")


def test_an_old_judge_store_resumes_under_the_new_tag(tmp_path):
    from mmfragile.study import get_study

    judge = get_study("judge")
    old = {"study": "judgebias", "seed": 0, "n_samples": 3}
    ResultStore(tmp_path / "scores", {**old, "kind": "scores"})
    scores = judge.stage_store(tmp_path, "scores", {"seed": 0, "n_samples": 3})   # today's: study judge, stage scores
    assert store_tag(scores.config) == ("judge", "scores")
    with pytest.raises(ConfigMismatch, match="seed"):
        judge.stage_store(tmp_path, "scores", {"seed": 1, "n_samples": 3})
    with pytest.raises(ConfigMismatch, match="stage"):                       # a pairwise config is another store
        ResultStore(tmp_path / "scores", {**judge.stage_store(tmp_path, "scores").config, "stage": "pairwise"})


def test_format_bias_reads_old_and_new_grid_stores_and_not_cp_ln(tmp_path):
    from mmfragile.studies.format_bias import STUDY, load_cp_ln, load_runs, run_config

    row = dict(model="m", dataset="d", question_id="q0", variant="a|s0", correct=True)
    ResultStore(tmp_path / "old", {"study": "format-bias", "model": "m"}).append([row])
    STUDY.stage_store(tmp_path / "new", "grid", run_config("m2", "d", 1)).append([{**row, "model": "m2"}])
    ResultStore(tmp_path / "cp", {"study": "format-bias-cp-ln"}).append([{**row, "model": "m3", "variant": "0"}])
    assert sorted(load_runs(tmp_path)["model"]) == ["m", "m2"]
    assert list(load_cp_ln(tmp_path)["model"]) == ["m3"]
