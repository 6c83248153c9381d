"""Resumable Parquet result store: dedup, concurrent writers, kills at every write stage (deterministic kill
points, no timing), corrupt parts, compaction, manifests; and a killed-and-resumed format-bias CLI run."""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pandas as pd
import pytest

from mmfragile.faults import KILL_EXIT_CODE
from mmfragile.store import ConfigMismatch, CorruptPartWarning, PartReadError, ResultStore, merge_stores

KEY = ["model", "dataset", "question_id", "variant"]


def _rows(ids, variant="v", **extra):
    return [{"model": "m", "dataset": "d", "question_id": str(i), "variant": variant, "correct": i % 2 == 0,
             "logits": [float(i), -1.0], **extra} for i in ids]


def _parts(root: Path) -> list[Path]:
    return sorted((root / "parts").glob("part-*.parquet"))


def test_append_skips_done_and_duplicate_rows(tmp_path):
    st = ResultStore(tmp_path, config={"a": 1})
    assert st.append(_rows(range(5))) == 5
    assert st.append(_rows(range(3, 8))) == 3          # 3, 4 already stored
    assert st.append(_rows([9, 9])) == 1               # duplicate inside one batch
    df = ResultStore(tmp_path).read()                  # a fresh handle sees the same table
    assert sorted(df.question_id.astype(int)) == [0, 1, 2, 3, 4, 5, 6, 7, 9]
    assert len(_parts(tmp_path)) == 3
    assert st.is_done({"model": "m", "dataset": "d", "question_id": "4", "variant": "v"})
    assert not st.is_done({"model": "m", "dataset": "d", "question_id": "4", "variant": "w"})
    assert len(st) == len(ResultStore(tmp_path)) == 9


def test_pending_matches_is_done_and_compares_keys_as_text(tmp_path):
    st = ResultStore(tmp_path)
    st.append(_rows([1, 2]))
    ResultStore(tmp_path).append(_rows([3]))           # another writer: seen after refresh
    q = pd.DataFrame({"model": "m", "dataset": "d", "question_id": [1, 2, 3, 4], "variant": "v"})  # ints
    assert st.pending(q).tolist() == [False, False, True, True]
    st.refresh()
    assert st.pending(q).tolist() == [False, False, False, True]
    assert [st.is_done(r) for r in q.to_dict("records")] == [True, True, True, False]
    assert st.pending(q.iloc[:0]).tolist() == []


def test_read_deduplicates_parts_written_twice(tmp_path):
    st = ResultStore(tmp_path)
    st.append(_rows([1, 2]))
    part = _parts(tmp_path)[0]
    (tmp_path / "parts" / "part-999999-copy.parquet").write_bytes(part.read_bytes())
    assert len(ResultStore(tmp_path).read()) == 2


def test_two_writers_of_one_key_keep_the_first_part(tmp_path):
    a, b = ResultStore(tmp_path), ResultStore(tmp_path)
    assert len(b) == 0                                 # b looked before a wrote
    a.append(_rows([1], raw="first"))
    b.append(_rows([1, 2], raw="second"))              # b never looked: it writes key 1 again
    df = ResultStore(tmp_path).read().set_index("question_id")
    assert df.loc["1", "raw"] == "first" and df.loc["2", "raw"] == "second" and len(df) == 2
    ResultStore(tmp_path).compact()
    df = ResultStore(tmp_path).read().set_index("question_id")
    assert len(_parts(tmp_path)) == 1 and df.loc["1", "raw"] == "first" and len(df) == 2


def test_config_mismatch_is_refused(tmp_path):
    ResultStore(tmp_path, config={"model": "a", "n": 3})
    ResultStore(tmp_path, config={"model": "a", "n": 3})  # same config resumes
    with pytest.raises(ConfigMismatch, match="n.*3.*4"):
        ResultStore(tmp_path, config={"model": "a", "n": 4})


def test_missing_key_column_is_an_error(tmp_path):
    with pytest.raises(KeyError, match="variant"):
        ResultStore(tmp_path).append([{"model": "m", "dataset": "d", "question_id": "1"}])


def test_reading_a_column_some_parts_lack_keeps_every_part(tmp_path):
    """A column added by a later run (e.g. ``covered`` after an upgrade) is read as missing from older parts -
    on main such a read quarantined the good older part and its rows were evaluated again."""
    st = ResultStore(tmp_path)
    st.append(_rows(range(3)))
    st.append(_rows(range(3, 5), covered=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptPartWarning)
        df = ResultStore(tmp_path).read(columns=["covered"])
    assert not (tmp_path / "quarantine").exists() and len(_parts(tmp_path)) == 2
    assert sorted(df.question_id.astype(int)) == [0, 1, 2, 3, 4]
    got = df.set_index(df.question_id.astype(int))["covered"]
    assert got[[0, 1, 2]].isna().all() and got[[3, 4]].tolist() == [True, True]
    assert len(ResultStore(tmp_path).read()) == 5


def test_corrupt_truncated_and_foreign_parts_are_quarantined(tmp_path):
    st = ResultStore(tmp_path)
    for lo in (0, 10, 20, 30):
        st.append([{**r, "raw": hashlib.sha1(r["question_id"].encode()).hexdigest()} for r in _rows(range(lo, lo + 10))])
    flipped, truncated, good, _ = _parts(tmp_path)
    data = bytearray(flipped.read_bytes())
    at = data.find(hashlib.sha1(b"5").hexdigest().encode())  # row 5's value: inside a data page, not a min/max
    assert at > 0                                            # statistic (those carry no checksum)
    data[at + 5] ^= 0x01                                     # one bit error: the page checksum fails
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:200])
    foreign = tmp_path / "parts" / "part-99999999999999999999-abc-n1.parquet"
    foreign.write_text("not parquet")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = ResultStore(tmp_path).read()              # never raises
    msgs = [str(w.message) for w in caught if w.category is CorruptPartWarning]
    assert len(msgs) == 3
    for p in (flipped, truncated, foreign):
        assert any(str(p) in m for m in msgs)
        assert not p.exists() and (tmp_path / "quarantine" / p.name).exists()
        assert (tmp_path / "quarantine" / f"{p.name}.reason.txt").read_text().strip()
    assert sorted(df.question_id.astype(int)) == list(range(20, 40))   # the two good parts
    fresh = ResultStore(tmp_path)                      # the lost rows count as not done: a rerun redoes them
    assert fresh.pending(pd.DataFrame(_rows(range(40)))[KEY]).sum() == 20
    assert fresh.append(_rows(range(40))) == 20
    assert len(ResultStore(tmp_path).read()) == 40


def test_tiered_and_full_compaction_keep_the_table(tmp_path):
    st = ResultStore(tmp_path, compact_fanout=4)
    for i in range(40):                                # 1-row parts: merged 4 at a time, then 4 merged parts ...
        st.append(_rows([i], score=float(i)) if i % 3 else _rows([i], score=None))
    n_parts = len(_parts(tmp_path))
    assert n_parts < 12
    expected = pd.DataFrame(_rows(range(40))).assign(score=[None if i % 3 == 0 else float(i) for i in range(40)])
    got = ResultStore(tmp_path).read().sort_values("question_id", key=lambda s: s.astype(int)).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[expected.columns], expected, check_dtype=False)
    assert ResultStore(tmp_path).compact(full=True) == n_parts - 1
    assert len(_parts(tmp_path)) == 1
    again = ResultStore(tmp_path).read().sort_values("question_id", key=lambda s: s.astype(int)).reset_index(drop=True)
    pd.testing.assert_frame_equal(again, got)


def test_manifest_check_reports_missing_unexpected_duplicates_and_shards(tmp_path):
    st, racer = ResultStore(tmp_path), ResultStore(tmp_path)
    assert len(racer) == 0                             # the racer looked before st wrote
    st.declare(pd.DataFrame(_rows(range(4)))[KEY], "shard-0-of-3")
    st.declare(pd.DataFrame(_rows(range(4, 6)))[KEY], "shard-2-of-3")
    st.append(_rows([0, 1, 2, 4, 99]))
    racer.append(_rows([1]))                           # so it writes key 1 a second time
    rep = ResultStore(tmp_path).check()
    assert not rep.complete
    assert rep.n_expected == 6 and rep.n_stored == 5
    assert rep.missing.question_id.tolist() == ["3", "5"]
    assert rep.unexpected.question_id.tolist() == ["99"]
    assert rep.duplicates.question_id.tolist() == ["1"] and rep.duplicates.copies.tolist() == [2]
    assert rep.missing_shards == ["1/3"]
    text = str(rep)
    assert "INCOMPLETE" in text and "1/3" in text and "2 missing" in text
    st.declare(pd.DataFrame(columns=KEY), "shard-1-of-3")  # an empty shard is complete as it is
    st.append(_rows([3, 5]))
    rep = merge_stores(tmp_path)
    assert rep.complete and rep.duplicates.question_id.tolist() == ["1"]  # found, then compacted away
    assert ResultStore(tmp_path).check().duplicates.empty and len(_parts(tmp_path)) == 1


def test_merge_brings_in_shard_stores(tmp_path):
    cfg = {"study": "x"}
    a, b = ResultStore(tmp_path / "a", cfg), ResultStore(tmp_path / "b", cfg)
    a.declare(pd.DataFrame(_rows([0, 1]))[KEY], "shard-0-of-2")
    a.append(_rows([0, 1]))
    b.declare(pd.DataFrame(_rows([2]))[KEY], "shard-1-of-2")
    b.append(_rows([2]))
    rep = merge_stores(tmp_path / "all", [tmp_path / "a", tmp_path / "b"])
    assert rep.complete and rep.n_stored == 3
    assert ResultStore(tmp_path / "all").config == a.config
    with pytest.raises(ConfigMismatch):
        merge_stores(tmp_path / "all", [ResultStore(tmp_path / "c", {"study": "y"}).root])


WRITER = textwrap.dedent("""
    import sys
    from mmfragile.store import ResultStore
    root, lo, hi, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    st = ResultStore(root, config={"study": "t"}, compact_fanout=3)
    ids = list(range(lo, hi))
    st.declare([{"model": "m", "dataset": "d", "question_id": str(i), "variant": "v"} for i in ids],
               f"shard-{lo // 100}-of-4")
    for s in range(0, len(ids), batch):
        st.append([{"model": "m", "dataset": "d", "question_id": str(i), "variant": "v", "w": sys.argv[5]}
                   for i in ids[s:s + batch] if st.is_done({"model": "m", "dataset": "d",
                                                            "question_id": str(i), "variant": "v"}) is False])
""")


def _writer(tmp_path, root, lo, hi, batch, tag, kill=None):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("MMFRAGILE_KILL_AT", None)
    if kill:
        env["MMFRAGILE_KILL_AT"] = kill
    return subprocess.Popen([sys.executable, str(script), str(root), str(lo), str(hi), str(batch), tag], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_concurrent_writers_killed_anywhere_lose_and_duplicate_nothing(tmp_path):
    """Four processes append their key ranges in batches of 4 (compacting as they go, fan-out 3) while a fifth
    races the fourth on the same keys; three are killed at deterministic points of the write path - before a
    write, half-way through a part's bytes, after the rename. Reruns of the killed three complete the store:
    every key exactly once, nothing lost."""
    root = tmp_path / "store"
    ranges = [(0, 25), (100, 125), (200, 225), (300, 325)]
    kills = ["store.append:3", "store.write:3", "store.renamed:3", None]
    procs = [_writer(tmp_path, root, lo, hi, 4, f"w{k}", kill=kills[k]) for k, (lo, hi) in enumerate(ranges)]
    procs.append(_writer(tmp_path, root, 300, 325, 5, "racer"))
    codes = [p.wait(timeout=120) for p in procs]
    errs = [p.stderr.read().decode()[-2000:] for p in procs]
    assert codes == [KILL_EXIT_CODE] * 3 + [0, 0], errs  # each kill landed where asked, whatever the timing
    partial = ResultStore(root).read()
    assert not partial.duplicated(KEY).any() and len(partial) < 100
    assert len(list((root / "parts").glob(".*.tmp"))) == 1    # the half-written part, never read
    reruns = [_writer(tmp_path, root, lo, hi, 4, "rerun") for lo, hi in ranges[:3]]
    assert [p.wait(timeout=120) for p in reruns] == [0, 0, 0]
    want = sorted(str(i) for lo, hi in ranges for i in range(lo, hi))
    assert sorted(ResultStore(root).read().question_id) == want  # nothing lost, nothing twice
    rep = merge_stores(root)
    assert rep.complete and rep.n_stored == 100 and rep.missing.empty and rep.unexpected.empty
    assert len(_parts(root)) == 1
    assert sorted(ResultStore(root).read().question_id) == want
    leftovers = list((root / "parts").glob(".*.tmp"))
    assert ResultStore(root).clean_temporary(min_age_s=0) == leftovers and leftovers


def test_compaction_killed_between_write_and_delete(tmp_path):
    st = ResultStore(tmp_path, config={"study": "t"}, compact_fanout=0)
    for i in range(0, 12, 3):
        st.append(_rows(range(i, i + 3)))
    code = f"from mmfragile.store import ResultStore; ResultStore({str(tmp_path)!r}).compact()"
    env = {**os.environ, "MMFRAGILE_KILL_AT": "store.compact:1", "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == KILL_EXIT_CODE
    assert len(_parts(tmp_path)) == 5                  # the merged part and the four it replaces
    df = ResultStore(tmp_path).read()
    assert sorted(df.question_id.astype(int)) == list(range(12))
    assert ResultStore(tmp_path).check().duplicates.copies.tolist() == [2] * 12
    ResultStore(tmp_path).compact()
    assert len(_parts(tmp_path)) == 1 and ResultStore(tmp_path).check().duplicates.empty


# ------------------------------------------------------------------------------------------- CLI kill + resume
def _cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mmfragile", "formats", "--model", "tiny-vlm", "--dataset", "synthetic-image",
            "--n", "2", "--out", str(out), "--flush-every", "6", "--batch-size", "8", "--quiet",
            "--formats", "uppercase-dot-line_break,numbers-bracket-semicolon", *extra]


def test_killed_cli_run_resumes_to_the_uninterrupted_table(tmp_path, tiny_vlm):
    """The CLI dies at its second flush (a deterministic kill point, not a timer); the rerun completes the
    store, which then equals an uninterrupted in-process run of the same grid."""
    from mmfragile.api import load_dataset
    from mmfragile.cli import main
    from mmfragile.runner import run_items
    from mmfragile.studies.format_bias.prompts import exact_match_score
    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.studies.format_bias.prompts import PromptFormat

    names = ["uppercase-dot-line_break", "numbers-bracket-semicolon"]
    items = format_bias_items(tiny_vlm, load_dataset("synthetic-image", n=2),
                              formats=[PromptFormat.from_name(n) for n in names])
    expected = run_items(tiny_vlm, items, ResultStore(tmp_path / "full"), exact_match_score, batch_size=8,
                         progress=False)

    killed = tmp_path / "killed"
    env = {**os.environ, "MMFRAGILE_KILL_AT": "store.append:2"}
    first = subprocess.run(_cli(killed), env=env, capture_output=True, timeout=600)
    assert first.returncode == KILL_EXIT_CODE, first.stderr.decode()[-2000:]
    n_partial = len(ResultStore(killed).read())
    assert 0 < n_partial < len(expected)
    assert main(_cli(killed)[3:]) == 0                 # the same command again, in this process
    resumed = ResultStore(killed).read()
    cols = KEY + ["raw_output", "correct", "covered", "selected_position", "answer_id"]
    a = expected[cols].sort_values(KEY).reset_index(drop=True)
    b = resumed[cols].sort_values(KEY).reset_index(drop=True)
    assert not b.duplicated(KEY).any()
    pd.testing.assert_frame_equal(a, b)
    assert merge_stores(killed).complete


def test_parts_of_older_stores_are_read_and_compacted(tmp_path):
    """Parts named before names carried the row count (``part-000000-<hex>.parquet``) are counted from the
    Parquet footer and compacted with the rest."""
    (tmp_path / "parts").mkdir()
    for i in range(3):
        pd.DataFrame(_rows([i])).to_parquet(tmp_path / "parts" / f"part-{i:06d}-abcd123{i}.parquet")
    st = ResultStore(tmp_path)
    st.append(_rows([2, 3]))
    assert st.compact() == 3 and len(_parts(tmp_path)) == 1
    assert sorted(ResultStore(tmp_path).read().question_id.astype(int)) == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------- read errors
class _FlakyFile:
    """A part's file whose first ``fail`` reads raise ``OSError(code)`` (EIO, EAGAIN ...): a disk that fails to
    deliver bytes, not a corrupt part."""

    def __init__(self, f, fail: int, code: int):
        self.f, self.fail, self.code = f, fail, code

    def read(self, n=-1):
        if self.fail > 0:
            self.fail -= 1
            raise OSError(self.code, os.strerror(self.code))
        return self.f.read(n)

    def __getattr__(self, name):
        return getattr(self.f, name)


def _flaky_open(monkeypatch, target: Path, failures: list):
    """Replace the store's OS-level open: for ``target``, each open pops its fault from ``failures`` - an int n
    (the first n reads fail with EIO) or an exception (the open itself raises it); other parts open normally."""
    import mmfragile.store as store_mod

    real = store_mod._open_part
    opened = []

    def fake(path):
        f = real(path)
        if Path(path).name != target.name:
            return f
        opened.append(path)
        if not failures:
            return f
        fault = failures.pop(0)
        if isinstance(fault, BaseException):
            f.close()
            raise fault
        return _FlakyFile(f, fault, errno.EIO)

    monkeypatch.setattr(store_mod, "_open_part", fake)
    return opened


def test_transient_read_errors_are_retried_and_never_quarantine_a_good_part(tmp_path, monkeypatch):
    """A read that fails with an OSError (EIO, EAGAIN) says nothing about the part: it is retried and the part
    is neither quarantined nor lost; a part that does not parse (truncated) still is quarantined."""
    import mmfragile.store as store_mod

    delays = []
    monkeypatch.setattr(store_mod, "_sleep", delays.append)        # backoff without waiting
    st = ResultStore(tmp_path, compact_fanout=0)
    for lo in (0, 10, 20):
        st.append(_rows(range(lo, lo + 10)))
    good, flaky, truncated = _parts(tmp_path)
    truncated.write_bytes(truncated.read_bytes()[:200])
    # the flaky part: the first open fails with EAGAIN, the next two reads fail with EIO on their first read
    opened = _flaky_open(monkeypatch, flaky, [OSError(errno.EAGAIN, "Resource temporarily unavailable"), 1, 1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = ResultStore(tmp_path).read()
    assert len(opened) == 4 and len(delays) == 3                   # three failed attempts, the fourth read it
    msgs = [str(w.message) for w in caught if w.category is CorruptPartWarning]
    assert len(msgs) == 1 and str(truncated) in msgs[0]           # only the truncated part
    assert flaky.exists() and good.exists() and not (tmp_path / "quarantine" / flaky.name).exists()
    assert not truncated.exists() and (tmp_path / "quarantine" / truncated.name).exists()
    assert sorted(df.question_id.astype(int)) == list(range(20))  # nothing of the flaky part lost
    # the same through pending (a resuming run): the flaky part's rows count as done, not as to redo
    _flaky_open(monkeypatch, flaky, [1])
    assert ResultStore(tmp_path).pending(pd.DataFrame(_rows(range(30)))[KEY]).tolist() == [False] * 20 + [True] * 10


def test_a_part_that_stays_unreadable_raises_naming_it_and_stays(tmp_path, monkeypatch):
    import mmfragile.store as store_mod

    delays = []
    monkeypatch.setattr(store_mod, "_sleep", delays.append)
    st = ResultStore(tmp_path, compact_fanout=0)
    st.append(_rows(range(5)))
    st.append(_rows(range(5, 10)))
    part = _parts(tmp_path)[1]
    attempts = len(store_mod.READ_RETRY_DELAYS) + 1
    _flaky_open(monkeypatch, part, [10] * attempts)               # every attempt fails (a dying disk)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptPartWarning)        # never quarantined
        with pytest.raises(PartReadError, match=f"{part}.*cannot read.*Errno {errno.EIO}.*{attempts} attempt") as ei:
            ResultStore(tmp_path).read()
    assert isinstance(ei.value, OSError) and ei.value.errno == errno.EIO and ei.value.filename == str(part)
    assert delays == list(store_mod.READ_RETRY_DELAYS)
    assert part.exists() and not (tmp_path / "quarantine").exists()
    assert len(ResultStore(tmp_path).read()) == 10                # the disk recovered: every row is there


def test_read_error_fault_point_is_retried(tmp_path, monkeypatch):
    """The same through the deterministic fault point (``MMFRAGILE_FAIL_AT=store.read:1:EIO``)."""
    import mmfragile.store as store_mod
    from mmfragile import faults

    monkeypatch.setattr(store_mod, "_sleep", lambda s: None)
    ResultStore(tmp_path).append(_rows(range(4)))
    monkeypatch.setenv("MMFRAGILE_FAIL_AT", "store.read:1:EIO")
    faults.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptPartWarning)
        assert len(ResultStore(tmp_path).read()) == 4
    assert faults._fail_counts["store.read"] >= 2 and len(_parts(tmp_path)) == 1
    faults.reset()
