"""lmms-eval bridge (mmfragile.harness.lmms_eval): export a study's grid as an lmms-eval task group, import lmms-eval's
sample logs back into a result store that equals mmfragile's own run.

The fast tests import sample logs written by a real lmms-eval 0.7.3 run (tests/data/lmms_eval_run/README.md says how
they were made and cut; test_harness_imports.py compares every column with mmfragile's own run, native_rows.json);
the slow test does the whole round trip with the real tool (skips when scripts/install_lmms_eval.sh has not run)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from harness_runs import RUNS, by_key, cells, native_rows

from mmfragile.cli import main
from mmfragile.harness.common import MANIFEST, HarnessError
from mmfragile.harness.lmms_eval import import_lmms_eval
from mmfragile.store import ResultStore

RUN = Path(__file__).parent / "data" / "lmms_eval_run"
LMMS = next(r for r in RUNS if r.harness == "lmms-eval")


def test_imported_uncovered_answers_are_kept_and_scored_wrong(tmp_path):
    # planted truths of the log itself: the roman format's answers out of coverage stay, wrong, with no position
    got = LMMS.import_(RUN / "run", tmp_path).read()
    assert (~got["covered"]).sum() == (~native_rows(LMMS)["covered"]).sum() > 0
    assert set(got.loc[~got["covered"], "selected_position"]) == {-1}
    assert not got.loc[~got["covered"], "correct"].any()


def test_provenance_names_lmms_evals_model_class_and_args(tmp_path):
    prov = LMMS.import_(RUN / "run", tmp_path).config["run_info"]["provenance"]["zoo-gemma3-good"]
    assert prov["harness_model"] == "llava_hf" and "device_map=cpu" in prov["model_args"]


def test_a_logged_input_other_than_the_exported_prompt_is_an_error(tmp_path):
    run, log = LMMS.edit_third_line(tmp_path, lambda s: {**s, "input": s["input"] + " "})
    with pytest.raises(HarnessError, match=f"{log}:3: the logged input is not the exported prompt"):
        import_lmms_eval([run], tmp_path / "store", export=RUN / "export")


def test_export_writes_the_task_group(tmp_path):
    out = tmp_path / "export"
    assert main(["export", "lmms-eval", "--model", "zoo-gemma3-good", "--dataset", "easy-vqa", "--n", "2",
                 "--formats", "uppercase-dot-line_break,numbers-colon-comma", "--out", str(out)]) == 0
    man = json.loads((out / MANIFEST).read_text())
    group = "mmfragile_format_bias_easy_vqa"
    assert man["group"] == group and man["model"] == "zoo-gemma3-good"
    assert (out / f"{group}.yaml").read_text().splitlines()[2:] == [f"- {t}" for t in sorted(man["tasks"])]
    assert sorted(man["tasks"]) == [f"{group}_numbers_colon_comma", f"{group}_standard",
                                    f"{group}_uppercase_dot_line_break"]
    rows = [json.loads(x) for x in (out / man["tasks"][f"{group}_numbers_colon_comma"]["data"]).read_text().splitlines()]
    n_opts = {r["question_id"]: r["n_options"] for r in rows}
    assert len(rows) == sum(n_opts.values())  # every circular shift is a row
    # test-6161 "Is a yellow shape present?" options [no, yes], answer no: shift 1 puts yes first, no is 2
    row = next(r for r in rows if r["question_id"] == "test-6161" and r["shift"] == 1)
    assert row["variant"] == "numbers-colon-comma|s1" and row["option_ids"] == ["1", "2"] and row["answer_id"] == "2"
    assert row["prompt"] == ("Is a yellow shape present?\n1: yes, 2: no\nSelect the best answer to the above "
                             "multiple-choice question based on the image. Respond with only the number (e.g., 1, or "
                             "2) of the correct option and no bracket, colon, or dot.")
    assert (row["delimiter"], row["separator"], row["option_id_set"]) == ("colon", "comma", "numbers")
    assert row["images"] == [str(Path(row["images"][0]).resolve())] and row["images"][0].endswith(".png")
    task_yaml = (out / f"{group}_numbers_colon_comma.yaml").read_text()
    assert "max_new_tokens: 1\n" in task_yaml and "process_results: !function utils.process_results" in task_yaml
    assert str(out / "data") in task_yaml  # an absolute data file path: runs from any working directory


def test_a_longer_answer_budget_gets_its_own_task(tmp_path, monkeypatch):
    """lmms-eval's generation settings are per task: a variant whose IDs take 2 tokens (here: counted as characters,
    so roman "II" is 2 and "A" is 1) is a task of its own with max_new_tokens 2 (the eos trap, docs/harnesses.md)."""
    from mmfragile.harness import common
    from mmfragile.harness.lmms_eval import export_lmms_eval

    monkeypatch.setattr(common.TokenBudget, "max_id_tokens", lambda self, ids: max(len(i) for i in ids))
    man = export_lmms_eval("format-bias", "zoo-gemma3-good", "easy-vqa", tmp_path, n=2,
                           formats=["uppercase-dot-comma", "roman-dot-comma"], standard_format="none")
    group = "mmfragile_format_bias_easy_vqa"
    assert {t: v["max_new_tokens"] for t, v in man["tasks"].items()} == {
        f"{group}_uppercase_dot_comma": 1, f"{group}_roman_dot_comma_t2": 2}
    assert "  max_new_tokens: 2\n" in (tmp_path / f"{group}_roman_dot_comma_t2.yaml").read_text()


def test_export_bad_format_is_one_line_before_any_model(tmp_path, capsys):
    rc = main(["export", "lmms-eval", "--model", "zoo-gemma3-good", "--formats", "uppercase-paren-comma",
               "--out", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "paren" in err and err.count("\n") == 1


LMMS_VENV = Path(os.environ.get("MMFRAGILE_LMMS_EVAL_VENV",
                                Path(os.environ.get("MMFRAGILE_CACHE", Path.home() / ".cache" / "mmfragile"))
                                / "lmms-eval-venv"))


@pytest.mark.slow
@pytest.mark.skipif(not (LMMS_VENV / "bin" / "lmms-eval").exists(),
                    reason=f"no lmms-eval venv at {LMMS_VENV}: run scripts/install_lmms_eval.sh")
def test_round_trip_with_real_lmms_eval(tmp_path):
    """export -> lmms-eval (llava_hf, CPU) -> import equals run_study on the same questions and formats."""
    from mmfragile.models.zoo import zoo_model_path
    from mmfragile.study import run_study

    formats = ["uppercase-dot-line_break"]
    export, runs = tmp_path / "export", tmp_path / "runs"
    assert main(["export", "lmms-eval", "--model", "zoo-gemma3-good", "--dataset", "easy-vqa", "--n", "3",
                 "--formats", ",".join(formats), "--standard-format", "none", "--out", str(export)]) == 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    subprocess.run([str(LMMS_VENV / "bin" / "lmms-eval"), "--model", "llava_hf", "--model_args",
                    f"pretrained={zoo_model_path('zoo-gemma3-good')},device_map=cpu", "--device", "cpu",
                    "--include_path", str(export), "--tasks", "mmfragile_format_bias_easy_vqa", "--batch_size", "1",
                    "--log_samples", "--output_path", str(runs)], check=True, env=env, cwd=tmp_path, timeout=3000)
    assert main(["import", "lmms-eval", str(runs), "--out", str(tmp_path / "store")]) == 0
    got = by_key(ResultStore(tmp_path / "store").read())
    native = run_study("format-bias", "zoo-gemma3-good", "easy-vqa", n=3, formats=formats, standard_format="none",
                       out=tmp_path / "native", progress=False).stores["grid"].read()
    want = by_key(native.drop(columns=["option_logits"]))
    assert len(got) == len(want) > 0
    assert got["raw_output"].tolist() == want["raw_output"].tolist()
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)
    assert ResultStore(tmp_path / "store").config == {**ResultStore(tmp_path / "native").config,
                                                      "run_info": ResultStore(tmp_path / "store").config["run_info"]}
    assert main(["report", str(tmp_path / "store"), "--out", str(tmp_path / "report"), "--n-boot", "20"]) == 0


# ============================================================================================== promptception
PC = dict(n=3, prompt_ids=["1.1", "6.1", "12.1"], max_new_tokens=6, extractor="tiny-vlm")


def _as_lmms_eval_logs(export: Path, native: pd.DataFrame, run: Path, suffix: str = "") -> None:
    """Sample logs in lmms-eval's layout (``<date>_samples_<task>.jsonl``: doc_id, input, filtered_resps) whose
    responses are ``native``'s raw outputs plus ``suffix`` (what llava_hf appends past the end of the turn)."""
    man = json.loads((export / MANIFEST).read_text())
    raw = {(r["question_id"], r["variant"]): r["raw_output"] for r in native.to_dict("records")}
    run.mkdir(parents=True)
    for task, t in man["tasks"].items():
        rows = [json.loads(x) for x in (export / t["data"]).read_text().splitlines()]
        (run / f"20261205_000000_samples_{task}.jsonl").write_text("".join(
            json.dumps({"doc_id": i, "input": r["prompt"], "target": r["answer_id"],
                        "filtered_resps": [raw[r["question_id"], r["variant"]] + suffix]}) + "\n"
            for i, r in enumerate(rows)))


def test_promptception_round_trip_equals_the_native_run_and_its_extraction_stage_runs_on_it(tmp_path, tiny_vlm):
    """Export promptception (with an extractor), lmms-eval-layout logs of the native run's responses with
    '<|im_end|>' and junk after them (llava_hf runs past the end of the turn), import: the store equals the native
    prompts store column for column (first-stage scoring, pending answers kept pending); then the extraction stage
    runs on the imported store and gives the native extraction rows."""
    from mmfragile.harness.lmms_eval import export_lmms_eval
    from mmfragile.study import run_study

    native = run_study("promptception", tiny_vlm, "synthetic-vqa", out=tmp_path / "native", progress=False, **PC)
    rows = native.stores["prompts"].read()
    man = export_lmms_eval("promptception", "tiny-vlm", "synthetic-vqa", tmp_path / "export", **PC)
    assert man["stop_strings"] == ["<|im_end|>"] and len(man["tasks"]) == 3
    _as_lmms_eval_logs(tmp_path / "export", rows, tmp_path / "run", suffix="<|im_end|>assistant B")
    store = import_lmms_eval([tmp_path / "run"], tmp_path / "imported", export=tmp_path / "export")
    got, want = by_key(store.read()), by_key(rows.drop(columns=["option_logits"], errors="ignore"))
    assert len(got) == len(want) == 9 and sorted(got.columns) == sorted(want.columns)
    for col in want.columns:
        assert cells(got[col]) == cells(want[col]), col
    assert store.config["run_info"]["provenance"]["tiny-vlm"]["cut_at_end_of_turn"]["responses"] == 9
    assert {k: v for k, v in store.config.items() if k != "run_info"} == \
        {k: v for k, v in native.stores["prompts"].config.items() if k != "run_info"}
    pending = int((got["extraction_stage"] == "pending").sum())
    again = run_study("promptception", tiny_vlm, "synthetic-vqa", out=tmp_path / "imported", progress=False, **PC)
    assert len(again.stores["prompts"]) == 9                  # nothing re-asked: the imported answers stand
    ext, native_ext = (by_key(r.stores["extraction"].read()) for r in (again, native))
    assert len(ext) == len(native_ext) == pending > 0
    assert ext["raw_output"].tolist() == native_ext["raw_output"].tolist()


def test_free_text_answers_get_a_checkpoint_that_stops_at_the_end_of_the_turn(tmp_path):
    """Gemma-3 ends its turn with <end_of_turn> (generation_config), its tokenizer's eos is <eos>: for study 2's
    free-text answers the export writes a checkpoint view whose tokenizer eos is <end_of_turn> (all else linked),
    names it in the manifest, and lists both stop strings as `until`; study 1 with one-token answers needs none."""
    from transformers import AutoTokenizer

    from mmfragile.harness.lmms_eval import export_lmms_eval
    from mmfragile.models.zoo import zoo_model_path

    ckpt = Path(zoo_model_path("zoo-gemma3-good"))
    man = export_lmms_eval("promptception", "zoo-gemma3-good", "easy-vqa", tmp_path / "pc", n=1, prompt_ids=["1.1"],
                           max_new_tokens=8)
    view = tmp_path / "pc" / "checkpoint"
    assert man["checkpoint"] == str(view) and man["stop_strings"] == ["<end_of_turn>", "<eos>"]
    tok, orig = AutoTokenizer.from_pretrained(str(view)), AutoTokenizer.from_pretrained(str(ckpt))
    assert (tok.eos_token, tok.eos_token_id) == ("<end_of_turn>", 106) and orig.eos_token == "<eos>"
    assert tok("A red circle?")["input_ids"] == orig("A red circle?")["input_ids"]
    assert sorted(p.name for p in view.iterdir()) == sorted(p.name for p in ckpt.iterdir())
    assert (view / "model.safetensors").resolve() == (ckpt / "model.safetensors").resolve()
    task_yaml = next((tmp_path / "pc").glob("*_1_1_t8.yaml")).read_text()
    assert '  until: ["<end_of_turn>", "<eos>"]\n' in task_yaml
    fb = export_lmms_eval("format-bias", "zoo-gemma3-good", "easy-vqa", tmp_path / "fb", n=1,
                          formats=["uppercase-dot-comma"], standard_format="none")
    assert fb["checkpoint"] == str(ckpt) and not (tmp_path / "fb" / "checkpoint").exists()
