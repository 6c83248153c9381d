"""A fourth study, defined in the test tree (tests/option_order_study.py: format-bias's items in one prompt format,
every circular shift) and registered at import, gets with no edit of a core file: the CLI command with its own
options, --shard and merge, --budget with the estimate, resume, its store tag, and its section in the report."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

import mmfragile
import option_order_study as oo
from mmfragile.cli import main
from mmfragile.store import ResultStore

N = 3
ARGS = ["run", oo.NAME, "--model", "tiny-vlm", "--dataset", "easy-vqa", "--n", str(N), "--quiet",
        "--batch-size", "16"]
KEY = ["question_id", "variant"]
FORMAT_2 = "numbers-bracket-semicolon"


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """One whole run through the CLI, and the number of cells it should hold (every option count's shifts)."""
    from mmfragile.data.loaders import load_dataset

    out = tmp_path_factory.mktemp("oo") / "one"
    assert main([*ARGS, "--out", str(out)]) == 0
    n_cells = sum(len(list(o)) for o in load_dataset("easy-vqa", n=N)["options"])
    return out, n_cells


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(KEY).reset_index(drop=True)[[*KEY, "shift", "correct", "selected_position"]]


def test_the_cli_runs_every_shift_in_one_format_into_a_tagged_store(full):
    out, n_cells = full
    rows = ResultStore(out).read()
    assert len(rows) == n_cells and set(rows["format"]) == {oo.FORMAT}
    for _, g in rows.groupby("question_id"):                        # every circular shift, once
        assert sorted(g["shift"]) == list(range(len(list(g["option_ids"].iloc[0]))))
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["study"], cfg["stage"], cfg["format"]) == (oo.NAME, "shifts", oo.FORMAT)


def test_a_second_run_resumes_with_nothing_new(full):
    from mmfragile.study import run_study

    out, n_cells = full
    run = run_study(oo.NAME, "tiny-vlm", "easy-vqa", n=N, out=out, progress=False)
    assert run.new_rows == {"shifts": 0} and len(run.table()) == n_cells


def test_shards_then_merge_give_the_whole_run(full, tmp_path):
    out, n_cells = full
    for i in range(2):
        assert main([*ARGS, "--out", str(tmp_path / "sharded"), "--shard", f"{i}/2"]) == 0
    assert main(["merge", str(tmp_path / "sharded")]) == 0
    pd.testing.assert_frame_equal(_sorted(ResultStore(tmp_path / "sharded").read()), _sorted(ResultStore(out).read()))


def test_a_process_that_never_imported_the_study_runs_its_task_from_the_task_alone(tmp_path):
    """What a Ray worker does: unpickle a StageTask in a fresh process (without this test tree on its path) and
    find the study from the module and file recorded at register()."""
    import pickle
    import subprocess
    import sys

    from mmfragile.study import StageTask

    task = StageTask(oo.NAME, "shifts", (("format", FORMAT_2),))
    assert task.origin == ("option_order_study", oo.__file__)
    code = ("import pickle, sys; t = pickle.loads(sys.stdin.buffer.read()); "
            "print(t._stage().name, t.resolved()['format'], sys.modules['option_order_study'].NAME)")
    src = str(Path(mmfragile.__file__).parents[1])
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(task), capture_output=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": src}, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["shifts", FORMAT_2, oo.NAME]


def test_two_ray_workers_fill_the_store_of_the_one_process_run(full, tmp_path):
    """The workers know the study only from the task: they import its module (this test tree's), as the driver did."""
    pytest.importorskip("ray")
    out, _ = full
    assert main([*ARGS, "--out", str(tmp_path / "ray"), "--workers", "2", "--tasks", "2"]) == 0
    one, two = (ResultStore(p).read().sort_values(KEY).reset_index(drop=True) for p in (out, tmp_path / "ray"))
    cols = [*KEY, "shift", "format", "raw_output", "correct", "selected_position", "answer_id"]
    pd.testing.assert_frame_equal(two[cols], one[cols])
    assert len(two) == len(one) and not two.duplicated(KEY).any()


def test_a_budget_runs_a_share_of_the_declared_grid_and_prints_its_estimate(full, tmp_path, capsys):
    _, n_cells = full
    capsys.readouterr()
    assert main([*ARGS, "--out", str(tmp_path / "b"), "--budget", "0.5"]) == 0
    assert "n_observed" in capsys.readouterr().out                  # the estimate of the whole grid
    rows = ResultStore(tmp_path / "b").read()
    assert len(rows) == round(0.5 * n_cells)
    cells = oo.cells(rows)                                           # the declared grid, rebuilt from the rows
    assert len(cells) == n_cells and int(cells["correct"].notna().sum()) == len(rows)


def test_its_section_in_the_report_holds_its_numbers(full, tmp_path):
    from mmfragile.report import build_report

    out, _ = full
    rows = ResultStore(out).read()
    rep = build_report([out], tmp_path / "rep", n_boot=20)
    assert 'id="option-order"' in rep.html.read_text() or "Option order only" in rep.html.read_text()
    for s, g in rows.groupby("shift"):                               # hand-computed: mean of correct per shift
        key = f"{oo.NAME}/tiny-vlm/easy-vqa/{s}/accuracy"
        assert rep.metrics[key] == pytest.approx(100 * g["correct"].astype(float).mean())
    assert not any("not summarised" in n for n in rep.notes)


def test_its_own_error_is_one_line_from_the_cli_before_the_model_loads(tmp_path, capsys):
    """The study declares NoSuchFormat -> its message; the CLI imports no study to print it."""
    assert main([*ARGS, "--out", str(tmp_path / "e"), "--format", "nonsense"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"error: --format nonsense: not one of the 48 formats (e.g. {oo.FORMAT})"
    assert not (tmp_path / "e" / "parts").exists()
