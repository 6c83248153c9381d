"""Deterministic kill points for crash tests (no timing involved).

``MMFRAGILE_KILL_AT="<point>:<n>[,<point>:<n> ...]"`` makes a process ``os._exit(KILL_EXIT_CODE)`` the n-th time
it reaches ``<point>`` (counted per process). With ``MMFRAGILE_KILL_ONCE=<file>`` only the first process that gets
there dies - it creates the file first - so a restarted worker or a rerun carries on. The points:

* ``store.append`` - a :meth:`~mmfragile.store.ResultStore.append` call begins (nothing of it written yet);
* ``store.write`` - half of a part's bytes are in its temporary file (a truncated file is left behind);
* ``store.renamed`` - the part is on disk under its final name, the writer has not yet recorded it;
* ``store.compact`` - a compacted part is on disk, the parts it replaces are not yet deleted;
* ``worker.task`` - a distributed worker has evaluated a task and not yet returned its rows.

Unset (the normal case) every point is a dictionary lookup.
"""
from __future__ import annotations

import os
from collections import Counter

KILL_EXIT_CODE = 86
_counts: Counter = Counter()


def _plan() -> dict[str, int]:
    spec = os.environ.get("MMFRAGILE_KILL_AT", "")
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        point, _, n = part.rpartition(":")
        out[point] = int(n)
    return out


def kill_point(point: str) -> None:
    """Exit at once (no cleanup, no flush) if ``MMFRAGILE_KILL_AT`` asks for it here."""
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
