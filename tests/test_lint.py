"""Lint and types, in the default set (so CI runs them): ruff's pyflakes rules over the package, the tests and the
scripts (pyproject.toml ``[tool.ruff]``), and ``mypy --strict`` over the modules of the study contract - the run
loop, the store, the model interface and its specs (issue 36: typed and checked)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the modules held to ``mypy --strict`` (0 errors); widen as more modules are typed
STRICT = ("src/mmfragile/study.py", "src/mmfragile/runner.py", "src/mmfragile/store.py",
          "src/mmfragile/models/base.py", "src/mmfragile/models/spec.py")


def _tool(name: str) -> list[str]:
    if shutil.which(name) is None and subprocess.run([sys.executable, "-m", name, "--version"],
                                                     capture_output=True).returncode:
        pytest.fail(f"{name} is not installed: bash scripts/install.sh installs it (requirements.txt)")
    return [sys.executable, "-m", name]


def test_ruff_finds_nothing():
    out = subprocess.run([*_tool("ruff"), "check", "--no-cache", "src", "tests", "scripts"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_contract_modules_pass_mypy_strict(tmp_path):
    out = subprocess.run([*_tool("mypy"), "--strict", "--cache-dir", str(tmp_path), *STRICT], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
