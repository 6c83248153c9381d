"""Ray: a 2-worker run of the format grid equals the single-process run, with a worker killed mid-run (Ray
restarts it and retries its task) and with the driver killed (the rerun finishes the store). Kills happen at
deterministic points (mmfragile.faults), not on a timer."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

ray = pytest.importorskip("ray")

from mmfragile.api import load_dataset  # noqa: E402
from mmfragile.distributed import init_ray, run_on_ray  # noqa: E402
from mmfragile.study import StageTask  # noqa: E402
from mmfragile.runner import run_items
from mmfragile.studies.format_bias.prompts import exact_match_score
from mmfragile.studies.format_bias.items import format_bias_items  # noqa: E402
from mmfragile.faults import KILL_EXIT_CODE  # noqa: E402
from mmfragile.studies.format_bias.prompts import PromptFormat  # noqa: E402
from mmfragile.store import ResultStore, merge_stores  # noqa: E402
from mmfragile.studies import format_bias as fbs  # noqa: E402

KEY = ["model", "dataset", "question_id", "variant"]
FORMATS = ("uppercase-dot-line_break", "numbers-bracket-semicolon")
N = 4          # questions: split by group into 4 tasks, 3 of them non-empty


@pytest.fixture(scope="module")
def cluster():
    init_ray(num_cpus=2)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_vlm):
    import tempfile

    qs = load_dataset("synthetic-image", n=N)
    items = format_bias_items(tiny_vlm, qs, formats=[PromptFormat.from_name(f) for f in FORMATS])
    with tempfile.TemporaryDirectory() as d:
        return run_items(tiny_vlm, items, ResultStore(d), exact_match_score, batch_size=8, progress=False)


def _same_table(a: pd.DataFrame, b: pd.DataFrame) -> None:
    cols = KEY + ["raw_output", "correct", "covered", "selected_position", "answer_id"]
    assert not b.duplicated(KEY).any()
    a, b = (x.sort_values(KEY).reset_index(drop=True) for x in (a, b))
    pd.testing.assert_frame_equal(a[cols], b[cols])
    np.testing.assert_allclose(np.concatenate(a.option_logits.tolist()), np.concatenate(b.option_logits.tolist()),
                               rtol=1e-4, atol=1e-4)  # one torch thread per worker: summation order may differ


def _store(root):
    return fbs.STUDY.stage_store(root, "grid", fbs.run_config("tiny-vlm", "synthetic-image", N, FORMATS))


def _task():
    return StageTask("format-bias", "grid", (("batch_size", 8), ("formats", list(FORMATS))))


def test_two_workers_with_a_killed_worker_equal_the_single_process_run(cluster, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_KILL_AT", "worker.task:1")     # the first worker to finish a task dies ...
    monkeypatch.setenv("MMFRAGILE_KILL_ONCE", str(tmp_path / "killed-once"))  # ... once
    qs = load_dataset("synthetic-image", n=N)
    rep = run_on_ray(_task(), qs.to_dict("records"), _store(tmp_path / "s"),
                     "tiny-vlm", workers=2, n_tasks=4, progress=False)
    assert (tmp_path / "killed-once").exists()                   # the kill happened
    assert rep.n_tasks == 4 and rep.n_dispatched == 3 and rep.n_rows == len(reference)
    assert len(rep.rows_by_worker) >= 2                          # both replicas (and the restarted one) worked
    _same_table(reference, ResultStore(tmp_path / "s").read())
    check = merge_stores(tmp_path / "s")
    assert check.complete and check.duplicates.empty and check.n_stored == len(reference)


def test_killed_driver_rerun_equals_the_single_process_run(cluster, reference, tmp_path):
    out = tmp_path / "s"
    cmd = [sys.executable, "-m", "mmfragile", "formats", "--model", "tiny-vlm", "--dataset", "synthetic-image",
           "--n", str(N), "--formats", ",".join(FORMATS), "--batch-size", "8", "--out", str(out), "--quiet",
           "--workers", "2", "--tasks", "4", "--ray-address", cluster]
    # the driver dies as it writes the second task's rows (the first task's rows are stored)
    env = {**os.environ, "MMFRAGILE_KILL_AT": "store.append:2", "PYTHONPATH": os.pathsep.join(sys.path)}
    first = subprocess.run(cmd, env=env, capture_output=True, timeout=600)
    assert first.returncode == KILL_EXIT_CODE, first.stderr.decode()[-3000:]
    partial = ResultStore(out).read()
    assert 0 < len(partial) < len(reference)
    assert not merge_stores(out, compact=False).complete
    qs = load_dataset("synthetic-image", n=N)
    rep = run_on_ray(_task(), qs.to_dict("records"), _store(out),
                     "tiny-vlm", workers=2, n_tasks=4, progress=False)  # the rerun (as the CLI would do it)
    assert rep.n_dispatched == 2                     # only the two unfinished tasks go out again
    _same_table(reference, ResultStore(out).read())
    assert merge_stores(out).complete
