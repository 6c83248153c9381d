"""VLMEvalKit bridge (mmfragile.harness.vlmevalkit): export a study's grid as VLMEvalKit custom VQA datasets (TSV),
import VLMEvalKit's prediction files back into a result store.

The fast tests write prediction files the way VLMEvalKit's ``infer_data_job`` does - the dataset's table as
``vlmeval.smp.load`` reads the TSV (``pandas.read_csv(sep='\\t')``), less ``image``, plus ``prediction`` - dumped as
``vlmeval.smp.dump`` dumps ``.xlsx`` (pandas + xlsxwriter, ``strings_to_formulas`` off), ``.tsv``/``.csv``
(``QUOTE_ALL``) and ``.json`` (records), with planted predictions whose scores are worked out by hand. The slow
test runs VLMEvalKit itself (skips when scripts/install_vlmevalkit.sh has not run)."""
from __future__ import annotations

import base64
import csv
import io
import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from mmfragile.cli import main
from mmfragile.harness.common import MANIFEST, HarnessError
from mmfragile.harness.vlmevalkit import TSV_HEAD, import_vlmevalkit
from mmfragile.store import ResultStore

NAME = "mmfragile_format_bias_easy_vqa_openended"
FORMATS = "uppercase-dot-line_break,numbers-colon-comma"
KEYS = ["dataset", "question_id", "variant", "format", "option_id_set", "delimiter", "separator", "shift",
        "n_options", "category", "modality"]


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vlmevalkit") / "export"
    assert main(["export", "vlmevalkit", "--model", "zoo-gemma3-good", "--dataset", "easy-vqa", "--n", "2",
                 "--formats", FORMATS, "--out", str(out)]) == 0
    return out


def _load_tsv(path: Path) -> pd.DataFrame:
    """What vlmeval.smp.load does with a .tsv."""
    return pd.read_csv(path, sep="\t")


def _rows(export: Path) -> list[dict]:
    return [json.loads(x) for x in (export / "data" / f"{NAME}.jsonl").read_text().splitlines()]


# ============================================================================================== export
def test_export_writes_one_custom_vqa_tsv(export):
    man = json.loads((export / MANIFEST).read_text())
    assert man["harness"] == "VLMEvalKit" and man["model"] == "zoo-gemma3-good"
    assert list(man["datasets"]) == [NAME]  # every ID of these formats is one token: one budget, one dataset
    tsv = _load_tsv(export / f"{NAME}.tsv")
    assert list(tsv.columns) == [*TSV_HEAD, *KEYS, "option_ids", "max_new_tokens"]
    assert not {"A", "B"} & set(tsv.columns)  # no option columns: VLMEvalKit builds a CustomVQADataset
    assert tsv["index"].tolist() == list(range(len(tsv))) and tsv["index"].dtype.kind == "i"
    # every circular shift of every variant (2 formats + the standard one) is a row
    n_opts = tsv.groupby("question_id")["n_options"].first()
    assert len(tsv) == 3 * n_opts.sum() == man["datasets"][NAME]["rows"]
    assert set(tsv["variant"].str.split("|").str[0]) == {"numbers-colon-comma", "uppercase-dot-line_break",
                                                         "standard"}
    per = tsv.groupby(["question_id", tsv["variant"].str.split("|").str[0]])["shift"].apply(sorted)
    assert all(s == list(range(n_opts[q])) for (q, _), s in per.items())
    # test-6161 "Is a yellow shape present?" options [no, yes], answer no: shift 1 puts yes first, no is 2
    row = tsv[(tsv["question_id"] == "test-6161") & (tsv["variant"] == "numbers-colon-comma|s1")].iloc[0]
    assert row["question"] == ("Is a yellow shape present?\n1: yes, 2: no\nSelect the best answer to the above "
                               "multiple-choice question based on the image. Respond with only the number (e.g., 1, "
                               "or 2) of the correct option and no bracket, colon, or dot.")
    assert str(row["answer"]) == "2" and json.loads(row["option_ids"]) == ["1", "2"]
    assert (row["delimiter"], row["separator"], row["option_id_set"]) == ("colon", "comma", "numbers")


def test_export_question_is_the_rendered_prompt_and_rows_match_the_data_file(export):
    tsv = _load_tsv(export / f"{NAME}.tsv")
    rows = _rows(export)
    assert [r["index"] for r in rows] == tsv["index"].tolist()
    assert tsv["question"].tolist() == [r["prompt"] for r in rows]
    assert [str(a) for a in tsv["answer"]] == [r["answer_id"] for r in rows]
    for k in KEYS:
        assert tsv[k].tolist() == [r[k] for r in rows], k


def test_export_images_are_base64_or_the_index_of_the_first_row_with_them(export):
    """VLMEvalKit's ImageBaseDataset: an image cell of at most 64 characters is the index of the row whose cell
    holds the image's base64 (how MMBench shares one image between rows)."""
    tsv = _load_tsv(export / f"{NAME}.tsv")
    rows = _rows(export)
    first: dict[str, int] = {}
    for cell, row in zip(tsv["image"].astype(str), rows):
        (path,) = row["images"]
        if path not in first:
            first[path] = row["index"]
            assert len(cell) > 64 and base64.b64decode(cell) == Path(path).read_bytes()
            decoded = Image.open(io.BytesIO(base64.b64decode(cell)))
            with Image.open(path) as im:
                assert decoded.size == im.size and decoded.convert("RGB").tobytes() == im.convert("RGB").tobytes()
        else:
            assert cell == str(first[path])
    assert len(first) == 2  # two questions, one image each, sent in every variant


def test_export_refuses_a_question_without_image(tmp_path, monkeypatch):
    from mmfragile.harness import vlmevalkit

    real = vlmevalkit.item_row
    monkeypatch.setattr(vlmevalkit, "item_row", lambda it: {**real(it), "images": []})
    with pytest.raises(ValueError, match="has no image; VLMEvalKit's custom VQA dataset drops rows without one"):
        vlmevalkit.export_vlmevalkit("format-bias", "zoo-gemma3-good", "easy-vqa", tmp_path, n=1,
                                     formats=["uppercase-dot-comma"], standard_format="none")


def test_export_bad_format_is_one_line(tmp_path, capsys):
    rc = main(["export", "vlmevalkit", "--model", "zoo-gemma3-good", "--formats", "uppercase-paren-comma",
               "--out", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "paren" in err and err.count("\n") == 1


def test_a_study_the_bridge_cannot_run_is_refused_before_any_model(tmp_path):
    """VLMEvalKit's rows for study 2 are not written (docs/harnesses.md, Not done yet): the export says so and which
    study it runs; the CLI offers only that study."""
    from mmfragile.harness.vlmevalkit import export_vlmevalkit

    with pytest.raises(ValueError, match=r"export vlmevalkit: study 'promptception' is not supported "
                                         r"\(supported: format-bias\)"):
        export_vlmevalkit("promptception", "no-such-model", "easy-vqa", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_longer_answer_budget_gets_its_own_dataset(tmp_path, monkeypatch):
    """VLMEvalKit's max_new_tokens is the model's setting: a variant whose IDs take 2 tokens (counted here as
    characters: roman "II" is 2) is a dataset of its own, to run with a model generating 2 tokens."""
    from mmfragile.harness import common
    from mmfragile.harness.vlmevalkit import export_vlmevalkit

    monkeypatch.setattr(common.TokenBudget, "max_id_tokens", lambda self, ids: max(len(i) for i in ids))
    man = export_vlmevalkit("format-bias", "zoo-gemma3-good", "easy-vqa", tmp_path, n=2,
                            formats=["uppercase-dot-comma", "roman-dot-comma"], standard_format="none")
    assert {k: v["max_new_tokens"] for k, v in man["datasets"].items()} == {NAME: 1, f"{NAME}_t2": 2}
    t2 = _load_tsv(tmp_path / f"{NAME}_t2.tsv")
    assert set(t2["format"]) == {"roman-dot-comma"} and set(t2["max_new_tokens"]) == {2}
    assert t2["index"].tolist() == list(range(len(t2)))


# ============================================================================================== import
def _planted(row: dict) -> str:
    """A prediction per exported row, by index: right, wrong, no ID ('A.'), empty (NaN in VLMEvalKit's table)."""
    ids, ans = row["option_ids"], row["answer_id"]
    return [ans, next(i for i in ids if i != ans), f"{ans}.", ""][row["index"] % 4]


def _expected(row: dict) -> dict:
    pred = _planted(row)
    kind = row["index"] % 4
    return {"raw_output": pred, "covered": kind in (0, 1), "correct": kind == 0,
            "selected_position": row["option_ids"].index(pred) if kind in (0, 1) else -1}


def _prediction_table(export: Path) -> pd.DataFrame:
    """VLMEvalKit's infer_data_job: the dataset's table less `image`, plus `prediction` (str of each answer)."""
    data = _load_tsv(export / f"{NAME}.tsv")
    rows = {r["index"]: r for r in _rows(export)}
    data["prediction"] = [str(_planted(rows[i])) for i in data["index"]]
    return data.drop(columns=["image"])


def _dump(data: pd.DataFrame, path: Path) -> Path:
    """vlmeval.smp.dump, by suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".xlsx":
        with pd.ExcelWriter(path, engine="xlsxwriter",
                            engine_kwargs={"options": {"strings_to_formulas": False}}) as writer:
            data.to_excel(writer, index=False)
    elif path.suffix in (".tsv", ".csv"):
        data.to_csv(path, sep="\t" if path.suffix == ".tsv" else ",", index=False, encoding="utf-8",
                    quoting=csv.QUOTE_ALL)
    else:
        json.dump(data.to_dict("records"), open(path, "w"), indent=4, ensure_ascii=False)
    return path


@pytest.mark.parametrize("suffix", [".xlsx", ".tsv", ".csv", ".json"])
def test_import_scores_every_prediction(export, tmp_path, suffix):
    pred = _dump(_prediction_table(export), tmp_path / "run" / f"GemmaCPU_{NAME}{suffix}")
    store = import_vlmevalkit([pred], tmp_path / "store", export=export)
    got = store.read().sort_values("variant", kind="stable")
    got = {(r["question_id"], r["variant"]): r for r in got.to_dict("records")}
    rows = _rows(export)
    assert len(got) == len(rows) and store.check().complete
    for row in rows:
        g = got[(row["question_id"], row["variant"])]
        want = {"model": "zoo-gemma3-good", **{k: row[k] for k in KEYS}, "option_ids": row["option_ids"],
                "answer_id": row["answer_id"], **_expected(row)}
        assert {k: list(v) if k == "option_ids" else v for k, v in g.items()} == want, row["index"]
    # the planted kinds all occur; the empty prediction is kept, out of coverage
    assert sum(1 for r in rows if r["index"] % 4 == 3) == sum(1 for g in got.values() if g["raw_output"] == "") > 0


def test_imported_config_is_the_native_one_with_provenance(export, tmp_path):
    pred = _dump(_prediction_table(export), tmp_path / "GemmaCPU" / "T20261205" / f"GemmaCPU_{NAME}.xlsx")
    (pred.parent / "status.json").write_text(json.dumps({"commit": "e8e78f05", "argv": ["run.py", "--data", NAME],
                                                         "model_name": "GemmaCPU"}))
    store = import_vlmevalkit([pred], tmp_path / "store", export=export)
    man = json.loads((export / MANIFEST).read_text())
    cfg = store.config
    # the config run_study writes for the same study, model, dataset, n and formats (its keys: a native store's,
    # as recorded in tests/data/lmms_eval_run/native_config.json)
    assert {k: v for k, v in cfg.items() if k != "run_info"} == {
        "study": "format-bias", "stage": "grid", "model": "zoo-gemma3-good", "dataset": "easy-vqa", "n": 2,
        "formats": FORMATS, "key_columns": ["model", "dataset", "question_id", "variant"]}
    native = Path(__file__).parent / "data" / "lmms_eval_run" / "native_config.json"
    assert set(cfg) == set(json.loads(native.read_text())) and man["config"]["formats"] == FORMATS
    prov = cfg["run_info"]["provenance"]["zoo-gemma3-good"]
    assert prov["harness"] == "VLMEvalKit" and prov["harness_model"] == "GemmaCPU"
    assert prov["harness_version"] == "e8e78f05" and prov["run_argv"] == f"run.py --data {NAME}"
    assert prov["prediction_files"] == [str(pred)]


def test_a_row_the_run_left_out_is_missing_in_the_manifest(export, tmp_path):
    table = _prediction_table(export)
    pred = _dump(table[table["index"] != 5], tmp_path / f"M_{NAME}.tsv")
    store = import_vlmevalkit([pred], tmp_path / "store", export=export, model="renamed")
    check = store.check()
    row = _rows(export)[5]
    assert len(store) == len(table) - 1 and not check.complete
    assert check.missing.astype(str).values.tolist() == [["renamed", "easy-vqa", row["question_id"], row["variant"]]]


def _edited(export: Path, tmp_path: Path, edit, suffix=".xlsx") -> Path:
    return _dump(edit(_prediction_table(export)), tmp_path / f"M_{NAME}{suffix}")


def _set(table: pd.DataFrame, i: int, col: str, value) -> pd.DataFrame:
    table = table.copy()
    table[col] = table[col].astype(object)
    table.loc[i, col] = value
    return table


@pytest.mark.parametrize("suffix", [".xlsx", ".tsv"])
@pytest.mark.parametrize("edit, message", [
    (lambda t: _set(t, 2, "index", 999), r"row 4: index '999' is not a row of the exported dataset"),
    (lambda t: _set(t, 2, "index", 0), r"row 4: index 0 already on row 2"),
    (lambda t: _set(t, 2, "question", "Is it red?"), r"row 4: the question of index 2 is not the exported prompt"),
    (lambda t: t.drop(columns=["prediction"]), r": no `prediction` column \(columns: index, question"),
])
def test_unmatched_row_is_an_error_naming_file_and_row(export, tmp_path, edit, message, suffix):
    pred = _edited(export, tmp_path, edit, suffix)
    with pytest.raises(HarnessError, match=message) as e:
        import_vlmevalkit([pred], tmp_path / "store", export=export)
    assert str(e.value).startswith(str(pred)) and "\n" not in str(e.value)
    assert not (tmp_path / "store").exists() or len(ResultStore(tmp_path / "store")) == 0


def test_xlsx_without_openpyxl_is_one_line(export, tmp_path, monkeypatch):
    import builtins

    pred = _dump(_prediction_table(export), tmp_path / f"M_{NAME}.xlsx")
    real = builtins.__import__

    def no_openpyxl(name, *a, **k):
        if name == "openpyxl":
            raise ImportError("No module named 'openpyxl'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_openpyxl)
    with pytest.raises(HarnessError, match=r"reading \.xlsx needs openpyxl \(pip install openpyxl\), or rerun "
                                           r"VLMEvalKit with PRED_FORMAT=tsv"):
        import_vlmevalkit([pred], tmp_path / "store", export=export)


def test_prediction_text_is_kept_as_text(export, tmp_path):
    """pandas would read a prediction '1' as the number 1 (1.0 beside an empty cell) and 'None' as NaN: the import
    reads every cell as text, so the raw output is what the model wrote."""
    rows = _rows(export)
    i = next(r["index"] for r in rows if r["option_id_set"] == "numbers")
    table = _set(_set(_prediction_table(export), i, "prediction", "1"), 0, "prediction", "None")
    store = import_vlmevalkit([_dump(table, tmp_path / f"M_{NAME}.tsv")], tmp_path / "store", export=export)
    by_q = {(r["question_id"], r["variant"]): r for r in store.read().to_dict("records")}
    assert len(by_q) == len(rows)
    one, none = by_q[(rows[i]["question_id"], rows[i]["variant"])], by_q[(rows[0]["question_id"], rows[0]["variant"])]
    assert (one["raw_output"], one["covered"], one["selected_position"]) == ("1", True, 0)
    assert (none["raw_output"], none["covered"], none["selected_position"]) == ("None", False, -1)


def test_cli_import_finds_run_files_under_the_work_dir_and_the_export_in_lmudata(export, tmp_path, capsys,
                                                                                  monkeypatch):
    """run.py writes <work-dir>/<model>/<eval_id>/<model>_<NAME>.xlsx and links it into <work-dir>/<model>/: the
    import reads it once; without --export it finds the export where VLMEvalKit read the TSV ($LMUData)."""
    pred = _dump(_prediction_table(export), tmp_path / "work" / "GemmaCPU" / "T1" / f"GemmaCPU_{NAME}.xlsx")
    (tmp_path / "work" / "GemmaCPU" / pred.name).symlink_to(pred)
    monkeypatch.setenv("LMUData", str(export))
    assert main(["import", "vlmevalkit", str(tmp_path / "work"), "--out", str(tmp_path / "store")]) == 0
    n = len(_rows(export))
    assert f"{n} rows stored, {n} expected by the manifests - COMPLETE" in capsys.readouterr().out


def test_cli_import_errors_are_one_line(export, tmp_path, capsys, monkeypatch):
    pred = _dump(_prediction_table(export), tmp_path / f"M_{NAME}.csv")
    monkeypatch.delenv("LMUData", raising=False)
    assert main(["import", "vlmevalkit", str(pred), "--out", str(tmp_path / "s1")]) == 2
    err = capsys.readouterr().err
    assert "pass --export DIR" in err and err.count("\n") == 1
    other = _dump(_prediction_table(export), tmp_path / "M_SomeOtherBench.csv")
    assert main(["import", "vlmevalkit", str(other), "--export", str(export), "--out", str(tmp_path / "s2")]) == 2
    err = capsys.readouterr().err
    assert f"not a prediction file of this export (<model>_<dataset>.xlsx, dataset one of {NAME})" in err
    assert err.count("\n") == 1
    assert main(["import", "vlmevalkit", str(pred), str(pred.with_name(f"N_{NAME}.csv")), "--export", str(export),
                 "--out", str(tmp_path / "s3")]) == 2
    assert "no such VLMEvalKit prediction file" in capsys.readouterr().err
    copy = _dump(_prediction_table(export), tmp_path / "again" / f"M_{NAME}.csv")
    assert main(["import", "vlmevalkit", str(pred), str(copy), "--export", str(export),
                 "--out", str(tmp_path / "s4")]) == 2
    assert f"predictions of {NAME} were already read from {pred}" in capsys.readouterr().err


def test_report_reads_the_imported_store(export, tmp_path):
    from mmfragile.report import build_report

    import_vlmevalkit([_dump(_prediction_table(export), tmp_path / f"M_{NAME}.tsv")], tmp_path / "store",
                      export=export)
    rep = build_report([tmp_path / "store"], tmp_path / "report", n_boot=20)
    assert Path(rep.html).is_file() and "zoo-gemma3-good" in Path(rep.markdown).read_text()


# ============================================================================================== a real run
RUN = Path(__file__).parent / "data" / "vlmevalkit_run"
STORE_KEY = ["model", "dataset", "question_id", "variant"]


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(STORE_KEY).reset_index(drop=True)


def _cells(col: pd.Series) -> list:
    return [list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in col.tolist()]


def test_real_run_imports_equal_to_mmfragiles_own_run(tmp_path):
    """VLMEvalKit's run.py on the zoo model (tests/data/vlmevalkit_run/README.md): every column of the imported
    store equals mmfragile's own run of the same 20 requests, raw outputs included."""
    store = import_vlmevalkit([RUN / "run"], tmp_path / "store", export=RUN / "export")
    got, want = _sorted(store.read()), _sorted(pd.DataFrame(json.loads((RUN / "native_rows.json").read_text())))
    assert len(got) == len(want) == 20 and sorted(got.columns) == sorted(want.columns)
    for col in want.columns:
        assert _cells(got[col]) == _cells(want[col]), col
    native = json.loads((RUN / "native_config.json").read_text())
    assert {k: v for k, v in store.config.items() if k != "run_info"} == \
        {k: v for k, v in native.items() if k != "run_info"}
    prov = store.config["run_info"]["provenance"]["zoo-gemma3-good"]
    assert prov["harness_model"] == "ZooGemma3CPU" and "--mode infer" in prov["run_argv"]
    assert prov["harness_version"].startswith("not recorded")  # ms-vlmeval's status.json: "commit": ""


VLM_VENV = Path(os.environ.get("MMFRAGILE_VLMEVALKIT_VENV",
                               Path(os.environ.get("MMFRAGILE_CACHE", Path.home() / ".cache" / "mmfragile"))
                               / "vlmevalkit-venv"))


@pytest.mark.slow
@pytest.mark.skipif(not (VLM_VENV / ".mmfragile-vlmevalkit").exists(),
                    reason=f"no VLMEvalKit venv at {VLM_VENV}: run scripts/install_vlmevalkit.sh")
def test_round_trip_with_real_vlmevalkit(tmp_path):
    """export -> VLMEvalKit's run.py (scripts/vlmevalkit_cpu_run.py, CPU) -> import equals run_study."""
    from mmfragile.models.zoo import zoo_model_path
    from mmfragile.study import run_study

    formats = ["uppercase-dot-line_break"]
    export, work = tmp_path / "export", tmp_path / "work"
    assert main(["export", "vlmevalkit", "--model", "zoo-gemma3-good", "--dataset", "easy-vqa", "--n", "3",
                 "--formats", ",".join(formats), "--standard-format", "none", "--out", str(export)]) == 0
    env = {**os.environ, "LMUData": str(export), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    subprocess.run([str(VLM_VENV / "bin" / "python"), str(Path(__file__).parents[1] / "scripts" /
                    "vlmevalkit_cpu_run.py"), "--model-path", str(zoo_model_path("zoo-gemma3-good")),
                    "--name", "ZooGemma3CPU", "--max-new-tokens", "1", "--", "--data", NAME, "--mode", "infer",
                    "--work-dir", str(work)], check=True, env=env, cwd=tmp_path, timeout=3000)
    assert main(["import", "vlmevalkit", str(work), "--export", str(export), "--out", str(tmp_path / "store")]) == 0
    got = _sorted(ResultStore(tmp_path / "store").read())
    native = run_study("format-bias", "zoo-gemma3-good", "easy-vqa", n=3, formats=formats, standard_format="none",
                       out=tmp_path / "native", progress=False).stores["grid"].read()
    want = _sorted(native.drop(columns=["option_logits"]))
    assert len(got) == len(want) > 0
    assert got["raw_output"].tolist() == want["raw_output"].tolist()
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)
