"""A run says what it did: where its rows went (new / already there / skipped, coverage), what to run next, and -
when interrupted by Ctrl-C or SIGTERM - how many rows are safe and that the same command resumes (exit 130 / 143,
no traceback). Progress bars name what they count; ``--n`` above the dataset's size is a warning."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmfragile import cli
from mmfragile.store import ResultStore

RUN = ["run", "format-bias", "--model", "tiny-vlm", "--dataset", "easy-vqa", "--formats", "uppercase-dot-line_break"]
SRC = Path(__file__).resolve().parents[1] / "src"


def test_a_run_says_where_its_rows_went_and_what_comes_next(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(RUN + ["--n", "2", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    rows = ResultStore(out).read()
    n = len(rows)  # 2 questions x (1 format + standard) x their circular shifts
    assert n >= 8 and rows["question_id"].nunique() == 2
    coverage = rows["covered"].astype(float).mean() * 100
    assert (f"stored: {out} (format-bias/grid): {n} rows - {n} new, 0 already there, 0 bad input rows skipped; "
            f"coverage {coverage:.1f} %") in err
    assert err[-1] == f"next: python -m mmfragile report {out} --out {out / 'report'}"
    # the same command again: nothing new, all resumed
    assert cli.main(RUN + ["--n", "2", "--out", str(out), "--quiet"]) == 0
    assert f"stored: {out} (format-bias/grid): {n} rows - 0 new, {n} already there" in capsys.readouterr().err


def test_run_study_counts_the_questions_that_got_new_rows(tmp_path):
    """``StudyRun.new_questions`` counts (dataset, question) groups: on main it counted (model, dataset) pairs."""
    import mmfragile as mf

    run = mf.run_study("format-bias", "tiny-vlm", "easy-vqa", n=3, out=tmp_path / "run", progress=False,
                       formats=["uppercase-dot-line_break"])
    assert run.new_questions["grid"] == 3 and run.new_rows["grid"] == len(run.table())
    assert "(3 questions)" in str(run)


def test_every_store_of_a_run_is_listed_coverage_where_the_stage_has_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(RUN + ["--n", "1", "--cp-ln", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    n_options, n_grid = len(ResultStore(out / "cp_ln").read()), len(ResultStore(out).read())
    assert re.search(rf"stored: {re.escape(str(out))} \(format-bias/grid\): {n_grid} rows - {n_grid} new, .*; "
                     r"coverage [\d.]+ %", err)
    assert f"stored: {out / 'cp_ln'} (format-bias/cp_ln): {n_options} rows - {n_options} new, 0 already there, " \
           "0 bad input rows skipped\n" in err  # CP-LN has no `covered` column


def test_skipped_rows_are_counted(tmp_path, capsys):
    from mmfragile.data.benchmarks import benchmark

    spec = benchmark("mmbench").write_fixture(tmp_path / "data", bad_rows=True)
    out = tmp_path / "run"
    assert cli.main(["run", "format-bias", "--model", "tiny-vlm", "--dataset", spec, "--skip-bad-rows",
                     "--formats", "uppercase-dot-line_break", "--out", str(out), "--quiet"]) == 0
    n_bad = len(ResultStore(out).config["run_info"]["skipped_rows"])
    assert n_bad >= 1 and f"{n_bad} bad input rows skipped" in capsys.readouterr().err


def test_n_above_the_dataset_size_is_a_warning(tmp_path, capsys):
    from mmfragile.data.benchmarks import benchmark

    spec = benchmark("mmbench").write_fixture(tmp_path / "data")  # 3 questions
    assert cli.main(["run", "format-bias", "--model", "tiny-vlm", "--dataset", spec, "--n", "500", "--formats",
                     "uppercase-dot-line_break", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "warning: --n 500 but the dataset has 3 questions: running 3" in err


def test_the_progress_bar_counts_prompts(tmp_path, capsys):
    from mmfragile.study import Stage, get_study

    assert cli.main(RUN + ["--n", "1", "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"(\d+)/\1 ", err) and re.search(r"prompt/s|s/prompt", err) and "q/s" not in err
    assert Stage.__dataclass_fields__["unit"].default == "prompt"
    assert get_study("promptception").stage("prompts").unit == "prompt"


def test_an_interrupt_stores_the_finished_rows_first(tmp_path, tiny_vlm):
    from mmfragile.runner import EvalItem, run_items
    from mmfragile.models.base import Prompt

    items = [EvalItem({"dataset": "d", "question_id": str(i), "variant": "v"}, Prompt(text=f"question {i}"),
                      max_new_tokens=1) for i in range(5)]
    seen = []

    def score(raw, item):
        seen.append(item)
        if len(seen) == 4:
            raise KeyboardInterrupt
        return {"raw": raw}

    store = ResultStore(tmp_path / "s")
    with pytest.raises(KeyboardInterrupt):
        run_items(tiny_vlm, items, store, score, mode="generate", batch_size=1, flush_every=100, progress=False)
    assert sorted(ResultStore(tmp_path / "s").read()["question_id"]) == ["0", "1", "2"]


def _interrupt(tmp_path: Path, sig: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The CLI in a subprocess, paused at its second store append (the first question's rows stored, the second's
    finished) by
    ``MMFRAGILE_PAUSE_AT``; ``sig`` is sent once the pause file exists."""
    out, paused = tmp_path / "run", tmp_path / "paused"
    argv = [sys.executable, "-m", "mmfragile", *RUN, "--n", "3", "--flush-every", "1", "--out", str(out), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1", "MMFRAGILE_PAUSE_AT": "store.append:2",
           "MMFRAGILE_PAUSE_FILE": str(paused)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while not paused.exists():  # deterministic: the process waits there for the signal
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr), argv


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_run_says_how_many_rows_are_saved_and_resumes(tmp_path, capsys, sig, code):
    done, argv = _interrupt(tmp_path, sig)
    out = tmp_path / "run"
    rows = ResultStore(out).read()
    stored = len(rows)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == \
        f"interrupted: {stored} rows saved in {out} ({stored} new); rerun the same command to resume"
    # the first append's question + the one finished when the signal came (flushed on the way out); 3 in all
    assert rows["question_id"].nunique() == 2
    if sig == signal.SIGINT:
        return  # resuming is the same after either signal
    assert cli.main(argv[3:]) == 0  # the same command, in this process
    total = len(ResultStore(out).read())
    assert f"stored: {out} (format-bias/grid): {total} rows - {total - stored} new, {stored} already there" \
        in capsys.readouterr().err
    assert ResultStore(out).read()["question_id"].nunique() == 3
