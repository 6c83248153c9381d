"""Injected faults (deterministic, no timing): the MMFRAGILE_KILL_AT / MMFRAGILE_FAIL_AT points themselves, and a
full disk while the result store writes - the store stays readable with no half part, the error names the store
and says the disk is full, and the rerun stores every row exactly once (store API and ``run_items``)."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

from mmfragile import faults
from mmfragile.models.base import MLLM, Prompt
from mmfragile.store import ResultStore, StoreDiskFull

KEY = ["model", "dataset", "question_id", "variant"]


@pytest.fixture(autouse=True)
def _fresh_counts(monkeypatch):
    monkeypatch.delenv("MMFRAGILE_FAIL_AT", raising=False)
    monkeypatch.delenv("MMFRAGILE_KILL_AT", raising=False)
    faults.reset()
    yield
    faults.reset()


def _rows(ids):
    return [{"model": "m", "dataset": "d", "question_id": str(i), "variant": "v", "x": float(i)} for i in ids]


def _keys(ids) -> pd.DataFrame:
    return pd.DataFrame(_rows(ids))[KEY]


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------------------- the points
def test_fail_point_raises_at_the_nth_arrival_only(monkeypatch):
    monkeypatch.setenv("MMFRAGILE_FAIL_AT", "a:2:ENOSPC, b:1, c:2+:28")
    faults.fail_point("a")                              # arrival 1: nothing
    with pytest.raises(OSError, match="No space left.*MMFRAGILE_FAIL_AT at a") as ei:
        faults.fail_point("a")
    assert ei.value.errno == errno.ENOSPC
    faults.fail_point("a")                              # only the 2nd arrival fails
    with pytest.raises(OSError) as ei:
        faults.fail_point("b")
    assert ei.value.errno == errno.EIO                  # the default errno
    faults.fail_point("c")
    for _ in range(3):                                  # "2+": the 2nd and every later arrival
        with pytest.raises(OSError) as ei:
            faults.fail_point("c")
        assert ei.value.errno == errno.ENOSPC
    faults.fail_point("elsewhere")
    faults.reset()
    faults.fail_point("a")                              # counts start again
    with pytest.raises(OSError):
        faults.fail_point("a")


@pytest.mark.parametrize("spec", ["a", "a:x", "a:1:ENOTANERRNO", "a:1:ENOSPC:9"])
def test_bad_fail_spec_is_an_error(monkeypatch, spec):
    monkeypatch.setenv("MMFRAGILE_FAIL_AT", spec)
    with pytest.raises(ValueError, match="MMFRAGILE_FAIL_AT"):
        faults.fail_point("a")


def test_unset_points_do_nothing():
    for _ in range(3):
        faults.fail_point("store.write")
        faults.kill_point("store.write")
    assert not faults._counts and not faults._fail_counts


def test_kill_point_exits_at_the_nth_arrival_and_once_per_marker(tmp_path):
    code = ("from mmfragile.faults import kill_point\n"
            "for i in range(1, 4):\n"
            "    print(i, flush=True)\n"
            "    kill_point('p')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MMFRAGILE_KILL_AT": "p:2",
           "MMFRAGILE_KILL_ONCE": str(tmp_path / "once")}
    env.pop("MMFRAGILE_FAIL_AT", None)
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == faults.KILL_EXIT_CODE and first.stdout.split() == ["1", "2"]
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout.split() == ["1", "2", "3"]  # the marker exists: carry on


# ------------------------------------------------------------------------------------------- a full disk
def test_full_disk_while_a_part_is_written_leaves_a_readable_resumable_store(tmp_path, monkeypatch):
    root = tmp_path / "store"
    monkeypatch.setenv("MMFRAGILE_FAIL_AT", "store.write:2+:ENOSPC")  # the disk fills up half-way through write 2
    st = ResultStore(root, config={"study": "t"}, compact_fanout=0)
    st.append(_rows(range(10)))                         # write 1
    with pytest.raises(StoreDiskFull) as ei:
        st.append(_rows(range(5, 20)))
    err = ei.value
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC and err.filename == str(root)
    assert str(root) in str(err) and "disk full" in str(err) and "rerun" in str(err)
    assert _leftovers(root) == []                       # the half-written temporary file is gone
    with pytest.raises(StoreDiskFull):                  # still full: a second try fails the same, cleanly
        ResultStore(root).append(_rows(range(10, 20)))
    assert _leftovers(root) == []
    # readable, holding exactly what was written before the disk filled up; the lost batch counts as not done
    fresh = ResultStore(root)
    assert sorted(fresh.read().question_id.astype(int)) == list(range(10))
    assert fresh.pending(_keys(range(20))).tolist() == [False] * 10 + [True] * 10
    assert st.pending(_keys(range(20))).tolist() == [False] * 10 + [True] * 10  # the failed handle agrees
    monkeypatch.delenv("MMFRAGILE_FAIL_AT")             # space freed: rerun the same appends
    assert st.append(_rows(range(5, 20))) == 10
    assert st.append(_rows(range(20))) == 0
    df = ResultStore(root).read()
    assert sorted(df.question_id.astype(int)) == list(range(20)) and not df.duplicated(KEY).any()


def test_full_disk_in_a_manifest_or_config_write_is_clean(tmp_path, monkeypatch):
    root = tmp_path / "store"
    st = ResultStore(root, config={"study": "t"})
    monkeypatch.setenv("MMFRAGILE_FAIL_AT", "store.write:1:ENOSPC")
    with pytest.raises(StoreDiskFull, match=f"{root}.*disk full.*manifest"):
        st.declare(_keys(range(3)))
    assert _leftovers(root) == [] and not list((root / "manifest").glob("*.parquet"))
    st.declare(_keys(range(3)))                         # the next try (space back) works
    assert len(st.expected_keys()) == 3

    import mmfragile.store as store_mod

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod.Path, "write_text", full)
    with pytest.raises(StoreDiskFull, match=f"{root}.*disk full.*config.json"):
        st.set_run_info({"note": 1})
    with pytest.raises(StoreDiskFull, match="config.json"):
        ResultStore(tmp_path / "new", config={"study": "t"})
    monkeypatch.undo()
    assert _leftovers(tmp_path) == [] and st.config == {"study": "t", "key_columns": KEY}
    assert not (tmp_path / "new" / "config.json").exists()


def test_full_disk_during_the_compaction_of_an_append_only_warns(tmp_path, monkeypatch):
    """The append's own part is durable before it compacts; a compaction that finds the disk full warns and
    leaves the parts as they are (reads are unaffected)."""
    root = tmp_path / "store"
    monkeypatch.setenv("MMFRAGILE_FAIL_AT", "store.write:3:ENOSPC")  # 2 = the second part, 3 = merging the two
    st = ResultStore(root, compact_fanout=2)
    st.append(_rows(range(10)))                         # write 1
    with pytest.warns(RuntimeWarning, match=f"{root}.*disk full.*10 row\\(s\\) of this append are stored"):
        assert st.append(_rows(range(10, 20))) == 10
    assert len(list((root / "parts").glob("part-*.parquet"))) == 2 and _leftovers(root) == []
    assert sorted(ResultStore(root).read().question_id.astype(int)) == list(range(20))
    monkeypatch.delenv("MMFRAGILE_FAIL_AT")
    assert ResultStore(root).compact() == 1
    assert sorted(ResultStore(root).read().question_id.astype(int)) == list(range(20))


class _CountingModel(MLLM):
    """Answers "A" to everything and counts the prompts it was asked."""

    name = "fake"

    def __init__(self):
        self.seen: list[str] = []

    def generate(self, prompts, max_new_tokens=16):
        self.seen += [p.text for p in prompts]
        return ["A" for _ in prompts]

    def option_logits(self, prompts, candidates):
        raise NotImplementedError

    def loglikelihood(self, prompts, continuations):
        raise NotImplementedError


def test_run_items_resumes_after_a_full_disk_with_every_row_once(tmp_path, monkeypatch):
    from mmfragile.runner import EvalItem, run_items
    from mmfragile.studies.format_bias.prompts import exact_match_score

    items = [EvalItem(key={"dataset": "d", "question_id": str(i), "variant": "v"}, prompt=Prompt(text=f"q{i}"),
                      option_ids=["A", "B"], answer_id="A" if i % 2 else "B") for i in range(12)]
    root = tmp_path / "run"
    model = _CountingModel()
    # write 1 = the manifest, 2 = the first flush (4 rows), 3 = the second flush: the disk is full from there on
    monkeypatch.setenv("MMFRAGILE_FAIL_AT", "store.write:3+:ENOSPC")
    with pytest.raises(StoreDiskFull, match=f"{root}.*disk full"):
        run_items(model, items, ResultStore(root, config={"study": "t"}, compact_fanout=0), exact_match_score,
                  mode="generate",
                  batch_size=4, flush_every=4, progress=False)
    assert _leftovers(root) == []
    partial = ResultStore(root).read()
    assert sorted(partial.question_id.astype(int)) == [0, 1, 2, 3]
    monkeypatch.delenv("MMFRAGILE_FAIL_AT")
    model.seen.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = run_items(model, items, ResultStore(root, config={"study": "t"}, compact_fanout=0), exact_match_score,
                       mode="generate",
                       batch_size=4, flush_every=4, progress=False)
    assert sorted(model.seen) == sorted(f"q{i}" for i in range(4, 12))   # only what was not stored
    assert sorted(df.question_id.astype(int)) == list(range(12)) and not df.duplicated(KEY).any()
    assert df.set_index("question_id").loc["1", "correct"] and not df.set_index("question_id").loc["2", "correct"]
    assert ResultStore(root).check().complete
