"""What every sample-log bridge's import must do, checked on each harness's committed real run (``harness_runs``):
the imported store equals the native one column by column, a request the run left out is missing (never filled in),
a log line that matches no exported row is an error naming file and line (never dropped), the export is found from the
run's ``results.json``, and the report reads the store. What only one harness logs is tested in its own file."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from harness_runs import by_key, cells, harnesses, native_rows

from mmfragile.cli import main
from mmfragile.harness.common import MANIFEST, HarnessError


@harnesses
def test_import_equals_mmfragiles_own_run(rec, tmp_path):
    got, want = by_key(rec.import_(rec.root / "run", tmp_path).read()), by_key(native_rows(rec))
    assert len(got) == len(want) == rec.rows
    assert sorted(got.columns) == sorted(want.columns)  # every native column but option_logits
    for col in want.columns:
        assert cells(got[col]) == cells(want[col]), col


@harnesses
def test_imported_config_is_the_native_one(rec, tmp_path):
    store = rec.import_(rec.root / "run", tmp_path)
    native = json.loads((rec.root / "native_config.json").read_text())
    assert {k: v for k, v in store.config.items() if k != "run_info"} == \
        {k: v for k, v in native.items() if k != "run_info"}
    assert store.config["run_info"]["provenance"][rec.model]["harness"] == rec.harness
    assert store.check().complete and len(store) == rec.rows


@harnesses
def test_a_request_the_run_left_out_is_missing_in_the_manifest(rec, tmp_path):
    run = rec.copy_run(tmp_path)
    log = rec.one_log(run)
    lines = log.read_text().splitlines(True)
    log.write_text("".join(lines[:3] + lines[4:]))  # doc_id 3 of this task not run (e.g. --limit)
    store = rec.import_(run, tmp_path)
    check = store.check()
    assert len(store) == rec.rows - 1 and not check.complete
    row = json.loads((rec.root / "export" / "data" / rec.data_file).read_text().splitlines()[3])
    assert check.missing.astype(str).values.tolist() == [[rec.model, row["dataset"], row["question_id"],
                                                          row["variant"]]]


@harnesses
def test_report_reads_the_imported_store(rec, tmp_path):
    from mmfragile.report import build_report

    rec.import_(rec.root / "run", tmp_path)
    rep = build_report([tmp_path / "store"], tmp_path / "report", n_boot=50)
    assert Path(rep.html).is_file() and rec.model in Path(rep.markdown).read_text()


@harnesses
@pytest.mark.parametrize("edit, message", [
    (lambda s: {**s, "doc_id": 999}, "doc_id 999 is not a row"),
    (lambda s: {**s, "filtered_resps": [["A", "B"]]}, "is not one generated text"),
])
def test_unmatched_sample_is_an_error_naming_file_and_line(rec, tmp_path, edit, message):
    run, log = rec.edit_third_line(tmp_path, edit)
    with pytest.raises(HarnessError, match=message) as e:
        rec.import_(run, tmp_path)
    assert f"{log}:3:" in str(e.value) and "\n" not in str(e.value)


@harnesses
def test_duplicate_doc_id_is_an_error(rec, tmp_path):
    run = rec.copy_run(tmp_path)
    log = rec.one_log(run)
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines + [lines[0]]) + "\n")
    with pytest.raises(HarnessError, match=f"{len(lines) + 1}: doc_id 0 already logged on line 1"):
        rec.import_(run, tmp_path)


@harnesses
def test_import_finds_the_export_from_results_json(rec, tmp_path, capsys):
    run, export = rec.copy_run(tmp_path), tmp_path / "export"
    shutil.copytree(rec.root / "export", export)
    rec.point_results_at(run, export)
    assert main(["import", rec.harness, str(run), "--out", str(tmp_path / "store")]) == 0
    assert f"{rec.rows} rows stored, {rec.rows} expected by the manifests - COMPLETE" in capsys.readouterr().out


@harnesses
def test_import_without_export_folder_names_what_to_pass(rec, tmp_path, capsys):
    run = rec.copy_run(tmp_path)
    rec.point_results_at(run, tmp_path / "moved")
    assert main(["import", rec.harness, str(run), "--out", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "--export DIR" in err and "samples_mmfragile_" in err and err.count("\n") == 1


@harnesses
def test_the_harness_own_score_of_each_sample_is_mmfragiles(rec):
    """The exported process_results scores as the study does: the exact_match the harness logged for each sample
    is the native row's (first-stage, for study 2) ``correct``."""
    man = json.loads((rec.root / "export" / MANIFEST).read_text())
    logged = {}
    for log in (rec.root / "run").rglob("*samples_*.jsonl"):
        rows = [json.loads(x) for x in (rec.root / "export" / man["tasks"][rec.task_of(log)]["data"]).read_text()
                .splitlines()]
        for line in log.read_text().splitlines():
            s = json.loads(line)
            logged[rows[s["doc_id"]]["question_id"], rows[s["doc_id"]]["variant"]] = s["exact_match"]
    assert logged == {(r["question_id"], r["variant"]): float(r["correct"]) for r in native_rows(rec).to_dict("records")}
