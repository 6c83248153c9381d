"""Resumable Parquet result store, and a real kill-and-resume of the format-bias CLI."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from mmfragile.store import ConfigMismatch, ResultStore


def _rows(ids, variant="v"):
    return [{"model": "m", "dataset": "d", "question_id": str(i), "variant": variant, "correct": i % 2 == 0} for i in ids]


def test_append_skips_done_and_duplicate_rows(tmp_path):
    st = ResultStore(tmp_path, config={"a": 1})
    assert st.append(_rows(range(5))) == 5
    assert st.append(_rows(range(3, 8))) == 3          # 3, 4 already stored
    assert st.append(_rows([9, 9])) == 1               # duplicate inside one batch
    df = ResultStore(tmp_path).read()                  # a fresh handle sees the same table
    assert sorted(df.question_id.astype(int)) == [0, 1, 2, 3, 4, 5, 6, 7, 9]
    assert len(list((tmp_path / "parts").glob("*.parquet"))) == 3
    assert st.is_done({"model": "m", "dataset": "d", "question_id": "4", "variant": "v"})
    assert not st.is_done({"model": "m", "dataset": "d", "question_id": "4", "variant": "w"})


def test_read_deduplicates_parts_written_twice(tmp_path):
    st = ResultStore(tmp_path)
    st.append(_rows([1, 2]))
    part = next((tmp_path / "parts").glob("*.parquet"))
    (tmp_path / "parts" / "part-999999-copy.parquet").write_bytes(part.read_bytes())
    assert len(ResultStore(tmp_path).read()) == 2


def test_config_mismatch_is_refused(tmp_path):
    ResultStore(tmp_path, config={"model": "a", "n": 3})
    ResultStore(tmp_path, config={"model": "a", "n": 3})  # same config resumes
    with pytest.raises(ConfigMismatch, match="n.*3.*4"):
        ResultStore(tmp_path, config={"model": "a", "n": 4})


def test_missing_key_column_is_an_error(tmp_path):
    with pytest.raises(KeyError, match="variant"):
        ResultStore(tmp_path).append([{"model": "m", "dataset": "d", "question_id": "1"}])


def _cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mmfragile", "formats", "--model", "tiny-vlm", "--dataset", "synthetic-image",
            "--n", "4", "--out", str(out), "--flush-every", "24", "--batch-size", "8", "--quiet",
            "--formats", "uppercase-dot-line_break,lowercase-colon-comma,numbers-bracket-semicolon,roman-double_brackets-line_break",
            *extra]


def test_killed_run_resumes_to_the_uninterrupted_table(tmp_path):
    """SIGKILL the CLI once some parts are on disk, run it again, compare with one uninterrupted run."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    full = tmp_path / "full"
    subprocess.run(_cli(full), check=True, env=env, capture_output=True, timeout=600)
    expected = ResultStore(full).read()

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cli(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and len(list((killed / "parts").glob("part-*.parquet"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_partial = len(ResultStore(killed).read())
    assert 0 < n_partial < len(expected), "the kill should land half-way"

    subprocess.run(_cli(killed), check=True, env=env, capture_output=True, timeout=600)
    resumed = ResultStore(killed).read()
    key = ["model", "dataset", "question_id", "variant"]
    cols = key + ["raw_output", "correct", "covered", "selected_position", "answer_id"]
    a = expected[cols].sort_values(key).reset_index(drop=True)
    b = resumed[cols].sort_values(key).reset_index(drop=True)
    assert not b.duplicated(key).any()
    pd.testing.assert_frame_equal(a, b)
