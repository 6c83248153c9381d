"""Every ``scripts/benchmark_*.py`` (and the profile and architecture-table scripts the docs give) runs, on a tiny
grid, so that a refactor cannot break one silently.

The numbers they print are not checked (speed is measured by running them, never in a test); what is checked is
that each runs to the end and that its correctness column holds: every path gives the same answers.
``benchmark_gpu.py`` has its own tests (tests/test_benchmark_gpu.py, ``--tiny --device cpu``).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def script(name: str, *args: str, timeout: int = 900) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
    p = subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stdout


def test_every_benchmark_script_has_a_test_here_or_its_own():
    here = Path(__file__).read_text().split('"""', 2)[2]  # this file's tests, not its docstring
    tested = set(re.findall(r"(?:benchmark|profile|architecture)_\w+\.py", here)) | set(
        re.findall(r"benchmark_\w+\.py", (REPO / "tests" / "test_benchmark_gpu.py").read_text()))
    patterns = ("benchmark_*.py", "profile_*.py", "architecture_*.py")
    assert {p.name for pattern in patterns for p in (REPO / "scripts").glob(pattern)} <= tested


def test_profile_engine_splits_the_whole_run_into_its_parts():
    """On an image grid: the processor and the vision tower get their time, the parts add up to the wall time."""
    out = script("profile_engine.py", "--model", "tiny-vlm", "--dataset", "easy-vqa", "--formats", "2", "--top", "0")
    wall = float(re.search(r"wall ([\d.]+) s", out)[1])
    parts = {ln.split("|")[1].strip(): float(ln.split("|")[2]) for ln in out.splitlines()
             if ln.startswith("| ") and not ln.startswith("| part")}
    assert list(parts) == ["processor", "vision tower", "GEMM", "attention", "other tensor ops",
                           "Python / per-step overhead"]
    assert parts["processor"] > 0 and parts["vision tower"] > 0 and parts["GEMM"] > 0
    assert abs(sum(parts.values()) - wall) <= 0.02 * wall + 0.05, out   # every part counted once


def test_architecture_table_row_of_one_family():
    """docs/architectures.md's table command on one family: every check of the conformance suite passes on the
    tiny LLaVA, video is "-" with its reason (the family takes frames as images), and the bfloat16 column is a
    count of the 30 prompts and a logit difference (measured, machine-dependent: not asserted)."""
    out = script("architecture_table.py", "--family", "llava")
    header = next(ln for ln in out.splitlines() if ln.startswith("| architecture"))
    row = next(ln for ln in out.splitlines() if ln.startswith("| llava"))
    cells = dict(zip([c.strip() for c in header.split("|")[2:-1]], [c.strip() for c in row.split("|")[2:-1]]))
    assert {k: v for k, v in cells.items() if k != "engine bf16 vs generate"} == {
        "load": "✓", "generate": "✓", "option logits": "✓", "loglikelihood": "✓", "multi-image": "✓", "video": "–",
        "engine exact": "✓"}, out
    assert re.fullmatch(r"\d+/30, [\d.e+-]+", cells["engine bf16 vs generate"]), out
    assert "llava (LLaVA-1.5-7B) / video: the family takes no video input" in out


def test_benchmark_engine_on_a_tiny_grid():
    out = script("benchmark_engine.py", "--model", "tiny-vlm", "--formats", "2", "--batch-sizes", "4", "--no-naive")
    assert "15 prompts; identical predictions across paths: True" in out  # 1 question x (2 formats + standard) x 5
    assert re.search(r"engine:\s+[\d.]+ prompts/s", out)


def test_benchmark_engine_high_resolution_mode():
    out = script("benchmark_engine.py", "--real-processor", "--arch", "qwen2_5_vl", "--image-size", "64x48",
                 "--generate-prompts", "4")
    row = json.loads(out.strip().splitlines()[-1])
    assert (row["arch"], row["size"], row["identical"], row["gen_prompts"]) == ("qwen2_5_vl", "64x48", "4/4", 4)


def test_benchmark_store_on_a_small_store():
    out = script("benchmark_store.py", "--questions", "8", "--flush", "200")
    assert "1,960 rows in parts of 245" in out  # 8 questions x 245 rows, flushed as the CLI does
    assert re.search(r"check\(\) against the manifest .*\| complete", out)


@pytest.mark.vllm
def test_benchmark_vllm_on_a_tiny_grid():
    from mmfragile.paths import vllm_venv

    if not (vllm_venv() / "bin" / "python").exists():
        pytest.skip(f"no vLLM environment at {vllm_venv()}: create it with scripts/install_vllm.sh (.ci/run does)")
    from mmfragile.models.hf import cpu_has_bf16_matmul

    args = ("--questions", "1", "--formats", "2", "--backends", "hf-engine,vllm-cache", "--enforce-eager")
    dtypes = ("float32", "bfloat16")
    if not cpu_has_bf16_matmul():   # bfloat16 is emulated here: the script refuses to time it, in one line
        p = subprocess.run([sys.executable, str(REPO / "scripts" / "benchmark_vllm.py"), *args, "--dtypes",
                            ",".join(dtypes)], capture_output=True, text=True, timeout=300)
        assert p.returncode != 0 and "no bfloat16 matrix instructions" in p.stderr and "running" not in p.stdout
        dtypes = ("float32",)
    out = script("benchmark_vllm.py", *args, "--dtypes", ",".join(dtypes))
    rows = {(ln[:28].strip(), ln[28:].split()[0]): ln[28:].split() for ln in out.splitlines()
            if ln.startswith(("HF ", "vLLM"))}
    assert set(rows) == {(b, d) for b in ("HF prefix-sharing engine", "vLLM, prefix caching on") for d in dtypes}
    # 1 text question x (2 formats + standard) x its circular shifts, every float32 answer the engine's
    prompts = int(re.search(r"prompts=(\d+)", out)[1])
    assert all(r[-1] == f"{prompts}/{prompts}" for (_, d), r in rows.items() if d == "float32"), out
    # the GEMM peak is measured per dtype in the run, and MFU is a share of it for the engine and for vLLM (its
    # prefix-cache counters give the tokens it computed)
    assert re.search(r"GEMM peak \(GFLOP/s, \d+ threads\): " + ", ".join(rf"{d} \d+" for d in dtypes), out), out
    assert all(0 < float(r[-2]) < 100 for r in rows.values()), out


def test_benchmark_judge_on_a_tiny_grid():
    """Study 3 through the engine and through batched generate_sampled: the same stored judgments."""
    out = script("benchmark_judge.py", "--model", "tiny-vlm", "--n-samples", "1", "--max-new-tokens", "6",
                 "--perturbations", "text_dominance,response_dominance,image_misalignment")
    assert "every stored output equal: True" in out, out
    assert re.search(r"\| scores \| \d+ \|", out) and re.search(r"\| pairwise \| \d+ \|", out), out
