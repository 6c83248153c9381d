"""The Python API: run_study takes the question table mf.load_dataset returned (used as given, n respected, stored
under a stable name); dir(mmfragile) lists the public API for completion."""
from __future__ import annotations

import pytest

import mmfragile as mf

FORMAT = ["uppercase-dot-line_break"]


def _questions(run) -> list[str]:
    return sorted(run.table()["question_id"].unique())


def test_run_study_takes_a_question_table_as_given(tmp_path, tiny_vlm):
    table = mf.load_dataset("synthetic-vqa", n=6)
    picked = table.iloc[[1, 4]]                          # not the spec's first rows: the table is what runs
    run = mf.run_study("format-bias", tiny_vlm, picked, out=tmp_path / "picked", formats=FORMAT,
                       standard_format="none", progress=False)
    assert _questions(run) == ["count-0001", "count-0004"]
    assert table.attrs["spec"] == run.stores["grid"].config["dataset"] == "synthetic-vqa"
    first = mf.run_study("format-bias", tiny_vlm, table, n=1, out=tmp_path / "n1", formats=FORMAT,
                         standard_format="none", progress=False)
    assert _questions(first) == ["count-0000"]
    # the same run from the spec string writes the same rows under the same configuration
    spec = mf.run_study("format-bias", tiny_vlm, "synthetic-vqa", n=1, out=tmp_path / "spec", formats=FORMAT,
                        standard_format="none", progress=False)
    def configuration(store):   # the measured rate (rows per second of this run) is a measurement, not config
        cfg = dict(store.config)
        cfg["run_info"] = {k: v for k, v in cfg["run_info"].items() if k != "rate"}
        return cfg

    assert configuration(spec.stores["grid"]) == configuration(first.stores["grid"])
    assert spec.table()["raw_output"].tolist() == first.table()["raw_output"].tolist()


def test_table_name_without_attrs_is_its_dataset_column():
    from mmfragile.study import table_name

    table = mf.load_dataset("synthetic-vqa", n=2)
    table.attrs = {}
    assert table_name(table) == "synthetic-vqa"
    mixed = table.assign(dataset=["b-set", "a-set"])
    assert table_name(mixed) == "a-set+b-set"
    with pytest.raises(ValueError, match=r"needs rows and the columns .*; this one lacks \['options'\]"):
        mf.run_study("format-bias", "tiny-vlm", table.drop(columns="options"), out="unused")


def test_promptception_takes_a_question_table(tmp_path, tiny_vlm):
    table = mf.load_dataset("synthetic-vqa", n=6).iloc[[2, 5]]
    run = mf.run_study("promptception", tiny_vlm, table, out=tmp_path, prompt_ids=["1.1"], progress=False)
    assert _questions(run) == ["count-0002", "count-0005"]


def test_dir_lists_the_public_api():
    names = dir(mf)
    assert {"run_study", "load_dataset", "load_judge_dataset", "load_model", "ResultStore"} <= set(names)
    assert set(mf.__all__) <= set(names) and "__version__" in names
