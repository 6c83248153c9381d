"""Every mmfragile command runs in the vLLM environment (scripts/install_vllm.sh), as docs/vllm.md says.

The vLLM backend's own tests run a worker that never imports a study, so the documented command could break (the
study packages import the budget - scipy - when they load) with every test green. Here docs/vllm.md's command block
is run as written, in that environment, then ``report`` on its store; then ``run`` of each study (``--budget``
included), ``merge``, ``export`` and ``report`` on tiny grids. A module missing from an environment is one line
naming the script that builds it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mmfragile.paths import vllm_venv

REPO = Path(__file__).resolve().parents[1]
DOC_PYTHON = "~/.cache/mmfragile/vllm-venv/bin/python"  # how docs/vllm.md writes the environment's Python
#: runtime dependencies the vLLM environment leaves out: the notebook runners (`reproduce`, `grid`: main env)
NOTEBOOK_ONLY = {"papermill", "nbformat", "ipykernel"}


def venv_python() -> Path:
    py = vllm_venv() / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no vLLM environment at {vllm_venv()}: create it with scripts/install_vllm.sh (.ci/run does)")
    return py


def mmfragile(py: Path, cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "1",
           "MPLBACKEND": "Agg"}
    p = subprocess.run([str(py), "-m", "mmfragile", *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"mmfragile {' '.join(args)} (rc {p.returncode}):\n{p.stderr[-4000:]}"
    return p


def documented_commands() -> list[list[str]]:
    """The mmfragile lines of docs/vllm.md's first bash block, as argument lists after ``-m mmfragile``."""
    block = (REPO / "docs" / "vllm.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    lines = [ln.strip() for ln in block.strip().splitlines()]
    assert lines[0] == "bash scripts/install_vllm.sh", lines
    prefix = f"{DOC_PYTHON} -m mmfragile "
    assert all(ln.startswith(prefix) for ln in lines[1:]) and len(lines) == 3, lines
    return [ln.removeprefix(prefix).split() for ln in lines[1:]]


@pytest.mark.vllm
def test_the_documented_vllm_command_runs_and_report_reads_its_store(tmp_path):
    py = venv_python()
    from mmfragile.models.embedded import embedded_model_path

    embedded_model_path("smollm2")  # built once per machine (the environments share the cache)
    (run, report) = documented_commands()
    assert run[:4] == ["run", "format-bias", "--model", "vllm:smollm2"] and report[0] == "report"
    mmfragile(py, tmp_path, *run)
    out = Path(run[run.index("--out") + 1])
    cfg = json.loads((tmp_path / out / "config.json").read_text())
    assert cfg["run_info"]["model_identity"]["smollm2"]["backend"] == "vllm"
    mmfragile(py, tmp_path, *report)
    page = (tmp_path / report[report.index("--out") + 1] / "report.md").read_text()
    # 1 question x (uppercase-dot-line_break + standard) x its circular shifts, all through vLLM
    assert "vllm:smollm2" in page and "uppercase-dot-line_break" in page


@pytest.mark.vllm
def test_every_command_runs_in_the_vllm_environment(tmp_path):
    py = venv_python()
    fb = ["--dataset", "synthetic-text", "--formats", "uppercase-dot-line_break,lowercase-colon-comma"]
    mmfragile(py, tmp_path, "run", "format-bias", "--model", "smollm2", *fb, "--n", "2", "--budget", "0.5",
              "--out", "fb")
    mmfragile(py, tmp_path, "run", "format-bias", "--model", "smollm2", *fb, "--n", "1", "--shard", "0/2",
              "--out", "sharded")
    mmfragile(py, tmp_path, "run", "promptception", "--model", "smollm2", "--dataset", "synthetic-text", "--n", "1",
              "--prompt-ids", "1.1,2.1", "--out", "pc")
    mmfragile(py, tmp_path, "run", "judge", "--model", "tiny-vlm", "--n-samples", "1", "--perturbations",
              "text_dominance", "--runs", "1", "--max-new-tokens", "4", "--out", "jb")
    merged = mmfragile(py, tmp_path, "merge", "merged", "fb")
    assert merged.stdout.rstrip().endswith("COMPLETE"), merged.stdout
    mmfragile(py, tmp_path, "export", "lm-eval", "--model", "smollm2", "--dataset", "synthetic-text", "--n", "1",
              "--formats", "uppercase-dot-line_break", "--out", "export")
    mmfragile(py, tmp_path, "report", "fb", "pc", "jb", "--out", "report")
    page = (tmp_path / "report" / "report.md").read_text()
    for section in ("format-bias", "promptception", "judge"):
        assert section in page.lower()
    assert "grid estimate" in page.lower() or "budget" in page.lower()


@pytest.mark.vllm
def test_the_vllm_environment_has_every_runtime_dependency():
    py = venv_python()
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = sorted({re.split(r"[<>=!~ \[]", d, maxsplit=1)[0] for d in deps} - NOTEBOOK_ONLY)
    probe = ("import importlib.metadata as m, json, sys\n"
             "def has(n):\n    try:\n        m.version(n); return True\n    except m.PackageNotFoundError:\n"
             "        return False\n"
             "print(json.dumps([n for n in sys.argv[1:] if not has(n)]))")
    p = subprocess.run([str(py), "-c", probe, *names], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout) == [], p.stdout + p.stderr


def test_a_missing_module_is_one_line_naming_the_install_script(tmp_path):
    # scipy made unimportable, as in an environment without it: the study packages import the budget when they load
    code = ("import sys; sys.modules['scipy'] = None\n"
            "from mmfragile.cli import main\n"
            "sys.exit(main(['run', 'format-bias', '--model', 'smollm2', '--dataset', 'synthetic-text', '--n', '1',"
            " '--out', 'x']))")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("error: this environment (") and "has no module 'scipy'" in p.stderr
    assert "bash scripts/install" in p.stderr and "Traceback" not in p.stderr
