"""Where mmfragile keeps generated data, converted models and caches (never inside site-packages)."""
from __future__ import annotations

import contextlib
import glob
import os
import re
import secrets
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterator

from mmfragile.faults import kill_point


def cache_dir(*parts: str) -> Path:
    """``$MMFRAGILE_CACHE`` (default ``~/.cache/mmfragile``) joined with ``parts``; created on demand."""
    root = Path(os.environ.get("MMFRAGILE_CACHE", Path.home() / ".cache" / "mmfragile"))
    p = root.joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


def build_once(target: Path, build: Callable[[Path], None], *, file: bool = False) -> Path:
    """``target`` - a cached folder, or with ``file`` a cached file - made by ``build(tmp)`` the first time it is
    asked for; safe when any number of processes (or threads) of one machine ask for it at once.

    ``build`` fills a temporary sibling of its own (a new empty folder, or with ``file`` a path to write), renamed to
    ``target`` when it returns: a target on disk is always complete, and a build that raises leaves nothing. A
    folder is built holding an exclusive ``flock`` on ``<target>.lock``: one process builds, the others wait (saying
    so on stderr), look again and use what it built. The lock dies with its process, and the next builder removes
    the temporary folders a killed build left (``<target>.building*``). A file takes no lock: its builders write the
    same bytes and the rename is atomic (a lock file per cached image would double the cache's files). ``flock``
    holds between processes of one machine; a cache on NFS shared by several machines is not covered."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if file:
        return _build_into(target, build, target.parent / f"{target.name}.building-{_token()}")
    with _exclusive(target):
        if target.exists():  # built while we waited
            return target
        for stale in target.parent.glob(glob.escape(target.name) + ".building*"):
            _remove(stale)  # we hold the lock, so no live build owns it: a killed one left it
        tmp = target.parent / f"{target.name}.building-{_token()}"
        tmp.mkdir()
        return _build_into(target, build, tmp)


def _token() -> str:
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _build_into(target: Path, build: Callable[[Path], None], tmp: Path) -> Path:
    try:
        build(tmp)
        kill_point("cache.built")
        os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise
    return target


@contextlib.contextmanager
def _exclusive(target: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<target>.lock`` (the file stays: removing it would let a late
    waiter lock a different file than the next newcomer)."""
    import fcntl

    with open(target.with_name(target.name + ".lock"), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"mmfragile: waiting for another process building {target}", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def seed_path(name: str) -> Path | None:
    """A seed paper text (``format-bias-mcvqa.txt``, ``promptception.txt``, ``mm-judgebias.txt``) at
    ``$MMFRAGILE_SEEDS/<name>``; None when the variable is unset or the file is not there. The texts ship with no
    checkout: only the extraction scripts and their tests read them (the extracted tables are committed)."""
    env = os.environ.get("MMFRAGILE_SEEDS")
    path = Path(env) / name if env else None
    return path if path is not None and path.is_file() else None


def seed_missing(name: str) -> str:
    """Why ``seed_path(name)`` is None, in one line: the reason a test skips and a script stops with."""
    env = os.environ.get("MMFRAGILE_SEEDS")
    if not env:
        return f"seed text {name} not available: set MMFRAGILE_SEEDS to the folder holding it"
    return f"seed text {name} not found in MMFRAGILE_SEEDS={env}"


def _venv(env: str, name: str) -> Path:
    path = os.environ.get(env)
    if path:
        return Path(path)
    return Path(os.environ.get("MMFRAGILE_CACHE", Path.home() / ".cache" / "mmfragile")) / name


def vllm_venv() -> Path:
    """The vLLM environment ``scripts/install_vllm.sh`` creates (vLLM pins its own transformers / numpy):
    ``$MMFRAGILE_VLLM_VENV``, else ``vllm-venv`` in the cache folder. Not created here."""
    return _venv("MMFRAGILE_VLLM_VENV", "vllm-venv")


def lmms_eval_venv() -> Path:
    """The lmms-eval environment ``scripts/install_lmms_eval.sh`` creates: ``$MMFRAGILE_LMMS_EVAL_VENV``, else
    ``lmms-eval-venv`` in the cache folder. Not created here."""
    return _venv("MMFRAGILE_LMMS_EVAL_VENV", "lmms-eval-venv")


def lm_eval_venv() -> Path:
    """The lm-evaluation-harness environment ``scripts/install_lm_eval.sh`` creates: ``$MMFRAGILE_LM_EVAL_VENV``,
    else ``lm-eval-venv`` in the cache folder. Not created here."""
    return _venv("MMFRAGILE_LM_EVAL_VENV", "lm-eval-venv")


def safe_name(name: str) -> str:
    """``name`` usable as one path component and in keys (model / dataset names in store and figure paths,
    self-generated sample ids)."""
    return re.sub(r"[^A-Za-z0-9@._=+-]+", "_", str(name)).strip("_") or "_"


def check_writable_folder(path: str | Path, what: str = "--out") -> None:
    """A folder that is there or can be made, and written in - checked without leaving anything behind:
    :class:`~mmfragile.errors.UsageError` naming ``what`` and the file in the way or the folder that refuses."""
    import tempfile

    from mmfragile.errors import UsageError

    folder = Path(path).expanduser()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"{what} {path}: {existing} is a file, not a folder")
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot write in {existing} ({e.strerror or e})") from None
