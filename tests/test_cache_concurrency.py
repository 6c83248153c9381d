"""Concurrent first use of the cache (:func:`mmfragile.paths.build_once`): processes that need the same cached
model at once - a SLURM array's shards starting on one node, Ray workers, notebooks - on an empty
``MMFRAGILE_CACHE``: one builds, the others wait and use what it built; a failed or killed build leaves no
half-made entry and blocks no later one. Interleavings are forced with marker files and the waiter's own
"waiting" line, never with timing."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mmfragile import faults
from mmfragile.paths import build_once

WAITING = "mmfragile: waiting for another process building"

#: builds the tiny LLaVA checkpoint into $MMFRAGILE_CACHE/tiny and loads it; its build pauses where the test says
WORKER = r'''
import sys, time
from pathlib import Path

from mmfragile.models import tiny

role, sync = sys.argv[1], Path(sys.argv[2])
real = tiny.FAMILIES["llava"].build


def wait_for(name):
    deadline = time.monotonic() + 300  # a safety net against a hung test, not a synchronisation
    while not (sync / name).exists():
        if time.monotonic() > deadline:
            sys.exit(f"{role}: {name} never came")
        time.sleep(0.02)


def build(out):
    (sync / f"{role}.building").touch()
    if role == "A":  # A: the whole checkpoint in its temporary folder, then hold until the test lets it rename
        real(out)
        (sync / "A.built").touch()
        wait_for("A.go")
    else:
        wait_for("B.go")
        real(out)


tiny.FAMILIES["llava"].build = build
path = tiny.build_tiny("llava")
from transformers import AutoProcessor, LlavaForConditionalGeneration

LlavaForConditionalGeneration.from_pretrained(path)
AutoProcessor.from_pretrained(path)
print("loaded", path)
'''


def _env(cache: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMFRAGILE_")}
    return {**env, "MMFRAGILE_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def _until(cond, procs, what: str, limit: float = 300) -> None:
    """Wait for ``cond()``; fail at once, with their output, if one of ``procs`` has ended first."""
    deadline = time.monotonic() + limit  # a safety net against a hung test, not a synchronisation
    while not cond():
        for p, log in procs:
            if p.poll() is not None:
                pytest.fail(f"{what}: a worker ended first (rc {p.returncode}):\n{log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"{what}: never happened"
        time.sleep(0.02)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.building*"))


def test_two_processes_building_the_same_model_on_an_empty_cache(tmp_path):
    """A has built the tiny checkpoint into its temporary folder when B asks for it: B must wait rather than
    build over A's folder (today's main: B deletes it, A then renames B's empty folder and cannot load it)."""
    cache, sync = tmp_path / "cache", tmp_path / "sync"
    sync.mkdir()
    (tmp_path / "worker.py").write_text(WORKER)

    def start(role):
        log = tmp_path / f"{role}.log"
        p = subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), role, str(sync)], env=_env(cache),
                             stdout=log.open("w"), stderr=subprocess.STDOUT)
        return p, log

    a = start("A")
    _until(lambda: (sync / "A.built").exists(), [a], "A built")
    b = start("B")
    # B is either blocked on A's lock (it says so) or - the bug - inside a build of its own
    _until(lambda: WAITING in b[1].read_text() or (sync / "B.building").exists(), [a, b], "B waiting")
    (sync / "A.go").touch()
    assert a[0].wait(300) == 0, a[1].read_text()[-3000:]
    (sync / "B.go").touch()
    assert b[0].wait(300) == 0, b[1].read_text()[-3000:]

    target = cache / "tiny" / "llava"
    assert "loaded" in a[1].read_text() and "loaded" in b[1].read_text()
    assert WAITING in b[1].read_text()
    assert not (sync / "B.building").exists(), "B built a second copy instead of using A's"
    assert {"config.json", "model.safetensors", "processor_config.json"} <= {f.name for f in target.iterdir()}
    assert _leftovers(target.parent) == []


def test_a_killed_build_leaves_no_target_and_blocks_no_later_build(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    code = "from mmfragile.models.tiny import build_tiny; build_tiny('llava')"
    r = subprocess.run([sys.executable, "-c", code], env=_env(cache, MMFRAGILE_KILL_AT="cache.built:1"),
                       capture_output=True, text=True)
    assert r.returncode == faults.KILL_EXIT_CODE, r.stderr[-3000:]
    folder = cache / "tiny"
    assert not (folder / "llava").exists()
    [stale] = _leftovers(folder)  # the killed process's complete-but-unrenamed folder
    assert (folder / stale / "config.json").is_file()

    from mmfragile.models.tiny import build_tiny

    monkeypatch.setenv("MMFRAGILE_CACHE", str(cache))
    assert build_tiny("llava") == folder / "llava"
    assert WAITING not in capsys.readouterr().err  # the dead process's lock died with it
    assert (folder / "llava" / "config.json").is_file()
    assert _leftovers(folder) == []  # the stale temporary folder was removed


def _lock_is_free(target: Path) -> bool:
    with open(target.with_name(target.name + ".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def test_a_failed_build_leaves_nothing_and_releases_the_lock(tmp_path):
    target = tmp_path / "model"

    def broken(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        build_once(target, broken)
    assert not target.exists() and _leftovers(tmp_path) == []
    assert _lock_is_free(target)
    assert build_once(target, lambda out: (out / "config.json").write_text("{}")) == target
    assert (target / "config.json").read_text() == "{}"


class _Runner(threading.Thread):
    """A thread keeping what its call returned or raised (so a failing builder fails the test at once)."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call, self.result, self.error = call, None, None

    def run(self):
        try:
            self.result = self.call()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def test_builders_in_two_threads_one_builds_the_other_waits_and_reuses(tmp_path, capsys):
    """flock holds between threads too (each opens the lock file): the second asker waits, then finds the
    target, and its own build never runs."""
    target, built, ran, said = tmp_path / "model", threading.Event(), [], []
    threads = []

    def first(out: Path) -> None:
        ran.append("first")
        (out / "weights").write_text("first")
        built.set()
        _until(lambda: said.append(capsys.readouterr().err) or WAITING in "".join(said) or not threads[-1].is_alive(),
               [], "second waits")

    threads.append(_Runner(lambda: build_once(target, first)))
    threads[0].start()  # started once listed: the builder looks at threads[-1]
    _until(lambda: built.is_set() or not threads[0].is_alive(), [], "first builds")
    second = _Runner(lambda: build_once(target, lambda out: ran.append("second")))
    second.start()  # listed once alive: until then the builder's threads[-1] is itself and it keeps waiting
    threads.append(second)
    for t in threads:
        t.join(60)
    assert [(t.result, t.error) for t in threads] == [(target, None)] * 2 and ran == ["first"]
    assert WAITING in "".join(said)
    assert (target / "weights").read_text() == "first" and _leftovers(tmp_path) == []


def test_a_cached_file_written_by_two_builders_at_once(tmp_path):
    """File entries (images, frames, hashes) take no lock: both writers use their own temporary file and the
    rename is atomic - the slower one replaces the entry with the same bytes, and neither fails."""
    target, b_done = tmp_path / "img.png", threading.Event()

    def slow(tmp: Path) -> None:
        tmp.write_bytes(b"same")
        assert b_done.wait(60)  # B writes and renames its own copy before A renames

    a = _Runner(lambda: build_once(target, slow, file=True))
    a.start()
    _until(lambda: any(tmp_path.glob("img.png.building*")) or not a.is_alive(), [], "A wrote")
    assert build_once(target, lambda tmp: tmp.write_bytes(b"same"), file=True) == target
    b_done.set()
    a.join(60)
    assert (a.result, a.error) == (target, None)
    assert target.read_bytes() == b"same" and _leftovers(tmp_path) == []


@pytest.mark.slow
def test_prepare_twice_at_once_on_an_empty_cache(tmp_path):
    """``python -m mmfragile prepare`` started twice at once (several minutes on 2 cores: every embedded and zoo
    model is built, once)."""
    env = _env(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-m", "mmfragile", "prepare"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n----\n".join(o[-3000:] for o in outs)
    models = tmp_path / "cache" / "models"
    assert _leftovers(models) == []
    for d in models.iterdir():
        if d.is_dir():
            assert (d / "config.json").is_file(), d
