"""Deterministic kill points and injected I/O errors for crash and fault tests (no timing involved).

``MMFRAGILE_KILL_AT="<point>:<n>[,<point>:<n> ...]"`` makes a process ``os._exit(KILL_EXIT_CODE)`` the n-th time
it reaches ``<point>`` (counted per process). With ``MMFRAGILE_KILL_ONCE=<file>`` only the first process that gets
there dies - it creates the file first - so a restarted worker or a rerun carries on. The points:

* ``store.append`` - a :meth:`~mmfragile.store.ResultStore.append` call begins (nothing of it written yet);
* ``store.write`` - half of a part's bytes are in its temporary file (a truncated file is left behind);
* ``store.renamed`` - the part is on disk under its final name, the writer has not yet recorded it;
* ``store.compact`` - a compacted part is on disk, the parts it replaces are not yet deleted;
* ``worker.task`` - a distributed worker has evaluated a task and not yet returned its rows;
* ``cache.built`` - :func:`mmfragile.paths.build_once` has built a cache entry into its temporary sibling and not
  yet renamed it (a stale temporary folder and, for a folder, a lock its death releases are left behind).

``MMFRAGILE_PAUSE_AT="<point>:<n>"`` with ``MMFRAGILE_PAUSE_FILE=<file>`` instead makes the n-th arrival at a kill
point create ``<file>`` and wait for a signal (the interrupt tests: send SIGINT / SIGTERM once the file exists).

``MMFRAGILE_FAIL_AT="<point>:<n>[:<ERRNO>][,...]"`` instead makes the n-th arrival at a :func:`fail_point`
(counted per process while the variable is set, apart from the kills) raise ``OSError(errno.<ERRNO>)`` - ``EIO``
if no errno is named, e.g. ``store.write:2:ENOSPC`` (a full disk half-way through the second durable write of the
process - parts, manifests and compacted parts all count) or ``store.read:1:EIO``. ``<n>+`` fails that arrival and
every later one (a disk that stays full). The fail points:

* ``store.write`` - as the kill point above: half of a file's bytes are in its temporary file;
* ``store.read`` - before each read of a result part's bytes from disk.

:func:`reset` forgets the counts (in-process tests). Unset (the normal case) every point is a dictionary lookup.
"""
from __future__ import annotations

import errno
import os
import time
from collections import Counter

KILL_EXIT_CODE = 86
_counts: Counter = Counter()
_fail_counts: Counter = Counter()
_pause_counts: Counter = Counter()
PAUSE_MAX_S = 600.0


def _plan(variable: str = "MMFRAGILE_KILL_AT") -> dict[str, int]:
    spec = os.environ.get(variable, "")
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        point, _, n = part.rpartition(":")
        out[point] = int(n)
    return out


def kill_point(point: str) -> None:
    """Exit at once (no cleanup, no flush) if ``MMFRAGILE_KILL_AT`` asks for it here (or wait for a signal, if
    ``MMFRAGILE_PAUSE_AT`` does)."""
    if "MMFRAGILE_PAUSE_AT" in os.environ:
        _pause(point)
    if "MMFRAGILE_KILL_AT" not in os.environ:
        return
    want = _plan().get(point)
    if want is None:
        return
    _counts[point] += 1
    if _counts[point] != want:
        return
    once = os.environ.get("MMFRAGILE_KILL_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
    os._exit(KILL_EXIT_CODE)


def _pause(point: str) -> None:
    """At the n-th arrival that ``MMFRAGILE_PAUSE_AT`` names: create ``MMFRAGILE_PAUSE_FILE`` and wait (at most
    ``PAUSE_MAX_S``) for a signal whose handler raises - a test interrupts the process at a known point."""
    if _plan("MMFRAGILE_PAUSE_AT").get(point) is None:
        return
    _pause_counts[point] += 1
    if _pause_counts[point] != _plan("MMFRAGILE_PAUSE_AT")[point]:
        return
    with open(os.environ["MMFRAGILE_PAUSE_FILE"], "w"):
        pass
    deadline = time.monotonic() + PAUSE_MAX_S
    while time.monotonic() < deadline:
        time.sleep(0.05)


def reset() -> None:
    """Forget how often each point was reached (kill, pause and fail points), as in a fresh process."""
    _counts.clear()
    _pause_counts.clear()
    _fail_counts.clear()


def _fail_plan() -> dict[str, tuple[int, bool, int]]:
    """``{point: (n, from_n_on, errno)}`` from ``MMFRAGILE_FAIL_AT``."""
    out = {}
    for part in filter(None, (p.strip() for p in os.environ.get("MMFRAGILE_FAIL_AT", "").split(","))):
        fields = part.split(":")
        code = errno.EIO
        if len(fields) == 3:
            name = fields.pop()
            code = getattr(errno, name, None) if not name.isdigit() else int(name)
            if not isinstance(code, int):
                raise ValueError(f"MMFRAGILE_FAIL_AT: {part!r}: {name!r} is no errno name (e.g. ENOSPC, EIO)")
        if len(fields) != 2 or not fields[1].rstrip("+").isdigit():
            raise ValueError(f"MMFRAGILE_FAIL_AT: {part!r} is not <point>:<n>[+][:<ERRNO>]")
        out[fields[0]] = (int(fields[1].rstrip("+")), fields[1].endswith("+"), code)
    return out


def fail_point(point: str) -> None:
    """Raise the ``OSError`` that ``MMFRAGILE_FAIL_AT`` asks for here, if it does."""
    if "MMFRAGILE_FAIL_AT" not in os.environ:
        return
    want = _fail_plan().get(point)
    if want is None:
        return
    n, onwards, code = want
    _fail_counts[point] += 1
    if _fail_counts[point] == n or (onwards and _fail_counts[point] > n):
        raise OSError(code, f"{os.strerror(code)} (injected by MMFRAGILE_FAIL_AT at {point}, "
                            f"arrival {_fail_counts[point]})")
