"""pytest, run many times over a copy of the repository, each run with some of its files rewritten: one process
imports the heavy libraries once (torch, pandas, scipy, ...) and forks a child per run, which imports the copy's
own ``mmfragile`` and runs pytest there (a run then costs its tests, not ~8 s of imports). Used by
``tests/test_contributing.py``; nothing here imports ``mmfragile``, so every child imports the copy's.

    python tests/forked_runs.py plan.json

``plan.json``: ``{"copy": <the copy's root>, "args": [pytest's arguments], "preload": [module names],
"runs": [{"writes": {<path>: <text, or null to delete the file>}, "out": <file for the run's output>}, ...]}``.
Before each run its ``writes`` are made; each run prints one JSON line, ``{"rc": <pytest's exit code>,
"mmfragile": <the file its mmfragile was imported from>}``.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))


def run(copy: str, args: list[str], out: str) -> dict:
    """pytest ``args`` in a forked child, in ``copy``, its output in ``out``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        result: dict = {"rc": None, "mmfragile": None}
        try:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(copy)
            sys.path.insert(0, os.path.join(copy, "src"))
            import pytest

            result["rc"] = int(pytest.main(args))
            result["mmfragile"] = getattr(sys.modules.get("mmfragile"), "__file__", None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.write(write, json.dumps(result).encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reply = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(reply) if reply else {"rc": None, "mmfragile": None}


def main(plan_file: str) -> int:
    with open(plan_file) as f:
        plan = json.load(f)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]   # the copy's tests, not these
    for name in plan.get("preload", []):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    assert "mmfragile" not in sys.modules, "a preloaded module imported mmfragile: the runs would share it"
    for step in plan["runs"]:
        for path, text in step["writes"].items():
            if text is None:
                if os.path.exists(path):
                    os.unlink(path)
            else:
                with open(path, "w") as f:
                    f.write(text)
        print(json.dumps(run(plan["copy"], plan["args"], step["out"])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
