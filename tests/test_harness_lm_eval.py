"""lm-evaluation-harness bridge (mmfragile.harness.lm_eval): export a study's grid of text-only questions as an lm-eval
task group, import lm-eval's sample logs back into a result store that equals mmfragile's own run.

The fast tests import sample logs written by a real lm-eval 0.4.13 run (tests/data/lm_eval_run/README.md says how they
were made and cut; test_harness_imports.py compares every column with mmfragile's own run, native_rows.json); the slow
test does the whole round trip with the real tool (skips when scripts/install_lm_eval.sh has not run)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from harness_runs import LM_EVAL_GROUP, RUNS, by_key

from mmfragile.cli import main
from mmfragile.harness.common import MANIFEST, HarnessError
from mmfragile.harness.lm_eval import task_of
from mmfragile.paths import lm_eval_venv
from mmfragile.store import ResultStore

RUN = Path(__file__).parent / "data" / "lm_eval_run"
GROUP = LM_EVAL_GROUP
MODEL = "zoo-smollm2-good"
LM = next(r for r in RUNS if r.harness == "lm-eval")


def _import(run: Path, tmp_path: Path) -> ResultStore:
    return LM.import_(run, tmp_path)


def test_imported_rows_hold_both_tasks_the_run_asked(tmp_path):
    # planted truths of the log itself (hand-read from the sample lines): the two exported formats' tasks
    got = _import(RUN / "run", tmp_path).read()
    assert set(got["format"]) == {"uppercase-dot-line_break", "roman-bracket-comma"}
    assert got.groupby("format").size().tolist() == [8, 8]


def test_provenance_names_lm_evals_model_class_device_and_versions(tmp_path):
    prov = _import(RUN / "run", tmp_path).config["run_info"]["provenance"][MODEL]
    assert prov["harness_version"] == "0.4.13" and prov["harness_model"] == "hf-multimodal"
    assert prov["device"] == "cpu" and prov["transformers_version"] == "5.24.0"
    assert "zoo-smollm2-caption-smollm2-answer" in prov["model_args"]
    # lm-eval stops at the end of turn itself (generation_config eos, special tokens not decoded): nothing to cut
    assert prov["cut_at_end_of_turn"]["responses"] == 0


@pytest.mark.parametrize("edit, message", [
    (lambda s: {**s, "doc_id": "2"}, "doc_id '2' is not a row"),
    (lambda s: {**s, "doc": {**s["doc"], "prompt": s["doc"]["prompt"] + " "}}, "logged doc's prompt is not"),
    (lambda s: {**s, "doc": {**s["doc"], "variant": "numbers-dot-comma|s0"}}, "logged doc's variant is not"),
    (lambda s: {k: v for k, v in s.items() if k != "doc"}, "no logged doc"),
])
def test_a_logged_doc_other_than_the_exported_row_is_an_error(tmp_path, edit, message):
    run, log = LM.edit_third_line(tmp_path, edit)
    with pytest.raises(HarnessError, match=message) as e:
        _import(run, tmp_path)
    assert f"{log}:3:" in str(e.value) and "\n" not in str(e.value)


def test_a_line_that_is_no_json_is_an_error(tmp_path):
    run = LM.copy_run(tmp_path)
    log = LM.one_log(run)
    log.write_text(log.read_text() + "{not json\n")
    with pytest.raises(HarnessError, match=f"{log}:9: not a JSON line"):
        _import(run, tmp_path)


def test_wrong_input_is_one_line(tmp_path, capsys):
    """What a user can pass by mistake: a folder without lm-eval logs, an lmms-eval log, a task of another export."""
    (tmp_path / "empty").mkdir()
    assert main(["import", "lm-eval", str(tmp_path / "empty"), "--out", str(tmp_path / "s1")]) == 2
    err = capsys.readouterr().err
    assert "no samples_*.jsonl under" in err and "--log_samples" in err and err.count("\n") == 1
    lmms_log = next((Path(__file__).parent / "data" / "lmms_eval_run" / "run").rglob("*_samples_*standard.jsonl"))
    with pytest.raises(HarnessError, match="not an lm-eval sample log"):
        task_of(lmms_log)
    assert main(["import", "lm-eval", str(lmms_log), "--out", str(tmp_path / "s2")]) == 2
    assert "not an lm-eval sample log (samples_<task>_<date>.jsonl)" in capsys.readouterr().err
    run = LM.copy_run(tmp_path)
    log = LM.one_log(run)
    log.rename(log.with_name(log.name.replace("uppercase_dot_line_break", "numbers_colon_comma")))
    assert main(["import", "lm-eval", str(run), "--export", str(RUN / "export"), "--out", str(tmp_path / "s3")]) == 2
    err = capsys.readouterr().err
    assert f"task '{GROUP}_numbers_colon_comma' is not in" in err and err.count("\n") == 1


def test_task_of_reads_lm_evals_file_names():
    # evaluation_tracker.py: f"samples_{task_name}_{date_id}.jsonl", date_id = isoformat() with ":" -> "-"
    assert task_of(Path(f"samples_{GROUP}_standard_2026-12-05T08-51-13.123456.jsonl")) == f"{GROUP}_standard"
    assert task_of(Path("samples_a_b_c_2026-01-02T03-04-05.jsonl")) == "a_b_c"


def test_export_writes_the_task_group(tmp_path):
    out = tmp_path / "export"
    assert main(["export", "lm-eval", "--model", MODEL, "--dataset", "synthetic-text",
                 "--formats", "uppercase-dot-line_break,numbers-colon-comma", "--out", str(out)]) == 0
    man = json.loads((out / MANIFEST).read_text())
    assert man["group"] == GROUP and man["model"] == MODEL and man["harness"] == "lm-eval"
    assert man["stop_strings"] == ["<|im_end|>"]  # SmolLM2's end of turn, cut at on import
    assert (out / f"{GROUP}.yaml").read_text().splitlines()[2:] == [f"- {t}" for t in sorted(man["tasks"])]
    assert sorted(man["tasks"]) == [f"{GROUP}_numbers_colon_comma", f"{GROUP}_standard",
                                    f"{GROUP}_uppercase_dot_line_break"]
    data = out / man["tasks"][f"{GROUP}_numbers_colon_comma"]["data"]
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    n_opts = {r["question_id"]: r["n_options"] for r in rows}
    assert len(n_opts) == 10 and len(rows) == sum(n_opts.values())  # every circular shift is a row
    # text-0000 "What is 4 plus 8?" options [14, 4, 12], answer 12: shift 1 rotates them to [4, 12, 14]
    row = next(r for r in rows if r["question_id"] == "text-0000" and r["shift"] == 1)
    assert row["variant"] == "numbers-colon-comma|s1" and row["option_ids"] == ["1", "2", "3"]
    assert row["answer_id"] == "2" and row["images"] == [] and row["modality"] == "text"
    assert row["prompt"].startswith("What is 4 plus 8?\n1: 4, 2: 12, 3: 14\n")
    task_yaml = (out / f"{GROUP}_numbers_colon_comma.yaml").read_text()
    for line in ("output_type: generate_until", "  until: []", "  max_gen_toks: 1", "  do_sample: false",
                 "process_results: !function utils.process_results", f'    test: "{out / "data"}/'):
        assert line in task_yaml, line
    assert "doc_to_visual" not in task_yaml and "PIL" not in (out / "utils.py").read_text()


def test_export_refuses_questions_with_images(tmp_path, capsys):
    rc = main(["export", "lm-eval", "--model", MODEL, "--dataset", "easy-vqa", "--n", "2", "--formats",
               "uppercase-dot-comma", "--out", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "easy-vqa has questions with images (8 of 8 requests" in err and "synthetic-text" in err
    assert err.count("\n") == 1 and not (tmp_path / "x").exists()


@pytest.mark.slow
@pytest.mark.skipif(not (lm_eval_venv() / "bin" / "lm_eval").exists(),
                    reason=f"no lm-eval venv at {lm_eval_venv()}: run scripts/install_lm_eval.sh")
@pytest.mark.parametrize("study, group, params, rows", [
    ("format-bias", GROUP, dict(formats=["roman-bracket-comma"], standard_format="none"), 34),
    ("promptception", "mmfragile_promptception_synthetic_text",
     dict(n=4, prompt_ids=["1.1", "6.1", "12.1"], max_new_tokens=24), 12),
])
def test_round_trip_with_real_lm_eval(tmp_path, study, group, params, rows):
    """export -> lm_eval (hf, CPU, chat template) -> import equals run_study on the same questions and variants; the
    model is the embedded text LM ``smollm2`` (SmolLM2-135M-Instruct), which lm-eval's ``hf`` class loads."""
    from mmfragile.models.embedded import embedded_model_path
    from mmfragile.study import get_study, run_study

    export, runs = tmp_path / "export", tmp_path / "runs"
    options = [f"--{k.replace('_', '-')}={','.join(v) if isinstance(v, list) else v}" for k, v in params.items()]
    assert main(["export", "lm-eval", "--study", study, "--model", "smollm2", "--dataset", "synthetic-text",
                 *options, "--out", str(export)]) == 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    subprocess.run([str(lm_eval_venv() / "bin" / "lm_eval"), "--model", "hf", "--model_args",
                    f"pretrained={embedded_model_path('smollm2')}", "--device", "cpu", "--apply_chat_template",
                    "--include_path", str(export), "--tasks", group, "--batch_size", "1",
                    "--log_samples", "--output_path", str(runs)], check=True, env=env, cwd=tmp_path, timeout=3000)
    assert main(["import", "lm-eval", str(runs), "--out", str(tmp_path / "store")]) == 0
    got = by_key(ResultStore(tmp_path / "store").read())
    native = run_study(study, "smollm2", "synthetic-text", out=tmp_path / "native", progress=False, **params)
    grid_store = native.stores[get_study(study).stages[0].name]
    want = by_key(grid_store.read().drop(columns=["option_logits"], errors="ignore"))
    assert len(got) == len(want) == rows
    assert got["raw_output"].tolist() == want["raw_output"].tolist()
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)
    assert ResultStore(tmp_path / "store").config == {**grid_store.config,
                                                      "run_info": ResultStore(tmp_path / "store").config["run_info"]}
