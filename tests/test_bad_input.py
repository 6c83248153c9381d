"""Bad input found with published-layout copies of the benchmarks (mmfragile.data.fixtures): rows that used to
vanish or load unchecked, and datasets without a standard prompt format."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from mmfragile.data import fixtures as fx
from mmfragile.data import loaders
from mmfragile.data.loaders import load_dataset, load_hrbench, load_mmbench, skipped_rows
from mmfragile.studies.format_bias.items import format_bias_items
from mmfragile.studies.format_bias.prompts import NoStandardFormat, PromptFormat
from mmfragile.errors import DataError

ONE_FORMAT = [PromptFormat("lowercase", "bracket", "comma")]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_CACHE", str(tmp_path / "cache"))


def _tsv(spec: str) -> Path:
    return Path(spec.split(":", 1)[1])


def _rows(df) -> list[int]:
    return [r["row"] for r in skipped_rows(df)]


# ---------------------------------------------------------------------------------------------- MMBench circular copies
def test_mmbench_drops_only_true_circular_copies(tmp_path):
    f = _tsv(fx.write_mmbench(tmp_path, bad_copies=True))
    # row 5 (index 1000001) is a real question, not a copy of index 1: it no longer vanishes without a word
    with pytest.raises(DataError, match=re.escape(f"{f}, row 5 (index=1000001)") + r".*question 'How many squares"):
        load_mmbench(f)
    df = load_mmbench(f, skip_bad_rows=True)
    assert df.question_id.tolist() == ["0", "1", "2"]  # the true copies (rows 3, 4) are dropped silently
    bad = skipped_rows(df)
    assert [(b["file"], b["row"]) for b in bad] == [(str(f), 5), (str(f), 6), (str(f), 7), (str(f), 8)]
    assert "a different question, not a copy" in bad[0]["reason"]
    assert "are not a rotation of that row's ['red', 'green', 'blue', 'yellow']" in bad[1]["reason"]
    assert "answer 'B' does not follow the rotation of the options (expected A: 'green')" in bad[2]["reason"]
    assert "copy of index 7, but the file has no row with index 7" in bad[3]["reason"]
    # kept as questions, every row loads (and each true copy still has its answer text)
    both = load_mmbench(f, circular_copies=True)
    assert len(both) == 9 and skipped_rows(both) == []
    by_id = both.set_index("question_id")
    assert by_id.loc["2000000"].options[by_id.loc["2000000"].answer] == "red"
    # the clean fixture: no skipped rows, the copy dropped as before
    clean = load_dataset(fx.write_mmbench(tmp_path / "clean"), skip_bad_rows=True)
    assert clean.question_id.tolist() == ["0", "1", "2"] and skipped_rows(clean) == []


def test_mmbench_copy_rows_get_the_row_checks(tmp_path):
    f = _tsv(fx.write_mmbench(tmp_path))
    rows = pd.read_csv(f, sep="\t", dtype=str, keep_default_na=False)
    good = rows.loc[0, "image"]
    copy = rows.iloc[3].to_dict()
    extra = pd.DataFrame([
        {**copy, "index": "2000000", "image": good[:100] + "*!" + good[102:]},  # its own image, not base64
        {**copy, "index": "3000000", "image": "42"},                          # names no row with an image
        {**copy, "index": "1000000"},                                         # a second 1000000
        {**copy, "index": "1000001", "answer": "E"},                          # answer not an option
    ])
    pd.concat([rows, extra]).to_csv(f, sep="\t", index=False)
    df = load_mmbench(f, skip_bad_rows=True)
    assert df.question_id.tolist() == ["0", "1", "2"]
    reasons = {b["row"]: b["reason"] for b in skipped_rows(df)}
    assert sorted(reasons) == [4, 5, 6, 7]
    assert "not valid base64" in reasons[4] and "image field '42' names no row" in reasons[5]
    assert "duplicate index '1000000'" in reasons[6] and "answer 'E' is not among" in reasons[7]
    # n stops reading: rows after the n-th question are not read, so not checked
    assert load_mmbench(f, n=2).question_id.tolist() == ["0", "1"]


# ---------------------------------------------------------------------------------------------- HR-Bench cycles 2-4
@pytest.mark.parametrize("fmt", ["tsv", "parquet"])
def test_hrbench_checks_the_rows_of_every_cycle(tmp_path, fmt):
    spec = fx.write_hrbench(tmp_path, "4k", fmt=fmt, bad_later_cycles=True)
    f = _tsv(spec)
    with pytest.raises(DataError, match=re.escape(f"{f}, row 3 (index=3)") + r": answer 'E' is not among"):
        load_dataset(spec)  # cycles="first": row 3 is cycle 2, not returned, but read and checked
    df = load_dataset(spec, skip_bad_rows=True)
    assert df.question_id.tolist() == ["0", "1"] and df.cycle_category.unique().tolist() == ["cycle1"]
    bad = skipped_rows(df)
    assert [(b["file"], b["row"]) for b in bad] == [(str(f), 3), (str(f), 4), (str(f), 7)]
    assert "truncated" in bad[1]["reason"] and "not valid base64" in bad[2]["reason"]
    every = load_hrbench(f, cycles="all", skip_bad_rows=True)
    assert len(every) == 5 and _rows(every) == [3, 4, 7]
    assert load_dataset(spec, n=2).question_id.tolist() == ["0", "1"]  # n stops before the bad rows
    assert _rows(load_dataset(fx.write_hrbench(tmp_path / "clean", "4k", fmt=fmt), skip_bad_rows=True)) == []


def test_hrbench_unused_images_are_checked_then_discarded(tmp_path, monkeypatch):
    spec = fx.write_hrbench(tmp_path, "4k")
    f = _tsv(spec)
    calls: list[str] = []
    real = loaders.check_image_bytes
    monkeypatch.setattr(loaders, "check_image_bytes", lambda data, where: calls.append(where) or real(data, where))
    cache = tmp_path / "cache" / "images" / "hrbench-4k"
    assert len(load_dataset(spec)) == 2
    assert calls == []  # cycles 2-4 share the images of cycle 1, already checked: not decoded again
    assert len(list(cache.iterdir())) == 2
    rows = pd.read_csv(f, sep="\t", dtype=str, keep_default_na=False)
    rows.loc[5, "image"] = fx.b64(fx.jpeg_bytes(7, (80, 60)))  # cycle 3: an image of its own
    rows.to_csv(f, sep="\t", index=False)
    assert len(load_dataset(spec)) == 2
    assert calls == [f"{f}, row 5 (index=5)"]  # decode-checked ...
    assert len(list(cache.iterdir())) == 2     # ... and not written anywhere


# ---------------------------------------------------------------------------------------------- standard format
def _generic(tmp_path: Path) -> str:
    fx.noise_image(0).save(tmp_path / "q0.jpg")
    fx.noise_image(1).save(tmp_path / "q1.jpg")
    recs = [{"question_id": f"g{i}", "question": "What colour is the square?", "options": fx.NAMES, "answer": i,
             "image": f"q{i}.jpg"} for i in range(2)]
    f = tmp_path / "mine.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in recs))
    return f"generic:{f}"


def test_format_bias_items_without_a_standard_format_names_what_to_pass(tmp_path, tiny_vlm):
    qs = load_dataset(_generic(tmp_path))
    assert qs.dataset.unique().tolist() == ["mine"]
    for kw in ({}, {"skipped": []}):  # not a bad row: never swallowed into `skipped`
        with pytest.raises(NoStandardFormat) as e:
            format_bias_items(tiny_vlm, qs, formats=ONE_FORMAT, **kw)
    msg = str(e.value)
    assert isinstance(e.value, ValueError) and e.value.datasets == ["mine"]
    assert msg.startswith("no standard prompt format for dataset 'mine'; known: ['A-OKVQA'")
    for needed in ("standard='uppercase-dot-line_break'", "include_standard=False", "run_study",
                   "--standard-format", "'standard_format' column"):
        assert needed in msg
    # a DataFrame with its own dataset name, next to a known one: only the unknown one is named
    mixed = pd.concat([qs.assign(dataset="my-bench"), qs.assign(dataset="mmbench")])
    with pytest.raises(NoStandardFormat, match=r"dataset 'my-bench'; known"):
        format_bias_items(tiny_vlm, mixed, formats=ONE_FORMAT)

    def std(items):
        return {(it.key["dataset"], it.key["option_id_set"], it.key["delimiter"], it.key["separator"])
                for it in items if it.key["format"] == "standard"}

    items = format_bias_items(tiny_vlm, qs, formats=ONE_FORMAT, standard="uppercase-dot-line_break")
    assert std(items) == {("mine", "uppercase", "dot", "line_break")} and len(items) == 2 * 2 * 4
    assert std(format_bias_items(tiny_vlm, mixed, formats=ONE_FORMAT, standard={"my-bench": PromptFormat(
        "numbers", "colon", "comma")})) == {("my-bench", "numbers", "colon", "comma"),
                                            ("mmbench", "uppercase", "dot", "semicolon")}  # Table 5 for MMBench
    col = qs.assign(standard_format="roman-bracket-semicolon")
    assert std(format_bias_items(tiny_vlm, col, formats=ONE_FORMAT)) == {("mine", "roman", "bracket", "semicolon")}
    assert std(format_bias_items(tiny_vlm, qs, formats=ONE_FORMAT, include_standard=False)) == set()
    with pytest.raises(ValueError, match="standard: bad prompt format name 'upper'"):
        format_bias_items(tiny_vlm, qs, formats=ONE_FORMAT, standard="upper")


def test_run_study_and_cli_without_a_standard_format(tmp_path, tiny_vlm, monkeypatch, capsys):
    from mmfragile import cli
    from mmfragile.models.spec import ModelSpec
    from mmfragile.store import ResultStore
    from mmfragile.study import run_study

    spec = _generic(tmp_path)
    qs = load_dataset(spec)
    with pytest.raises(NoStandardFormat, match="--standard-format"):
        run_study("format-bias", tiny_vlm, qs, out=tmp_path / "api", formats=[f.name for f in ONE_FORMAT],
                  progress=False)
    assert not (tmp_path / "api" / "parts").exists()   # refused before any row ran
    monkeypatch.setattr(ModelSpec, "load", lambda spec: pytest.fail("no model is loaded for a doomed run"))
    args = ["formats", "--model", "tiny-vlm", "--dataset", spec, "--formats", ONE_FORMAT[0].name, "--quiet"]
    assert cli.main(args + ["--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "no standard prompt format for dataset 'mine'" in err and "MMBench" in err
    assert "--standard-format NAME" in err and "--standard-format none" in err
    assert cli.main(args + ["--out", str(tmp_path / "run"), "--standard-format", "upper"]) == 2
    assert "(--standard-format): bad prompt format name" in capsys.readouterr().err
    monkeypatch.setattr(ModelSpec, "load", lambda spec: tiny_vlm)
    assert cli.main(args + ["--out", str(tmp_path / "run"), "--standard-format", "numbers-dot-comma"]) == 0
    res = ResultStore(tmp_path / "run").read()
    std = res[res["format"] == "standard"]
    assert len(std) == 2 * 4 and set(std.option_id_set) == {"numbers"} and set(std.separator) == {"comma"}
    assert json.loads((tmp_path / "run" / "config.json").read_text())["standard_format"] == "numbers-dot-comma"
    assert cli.main(args + ["--out", str(tmp_path / "none"), "--standard-format", "none"]) == 0
    assert set(ResultStore(tmp_path / "none").read()["format"]) == {ONE_FORMAT[0].name}
