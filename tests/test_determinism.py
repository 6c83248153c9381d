"""The deterministic mode (mmfragile.determinism, ``--deterministic`` / ``MMFRAGILE_DETERMINISTIC=1``): settings
that give different numbers today - the thread count, the CPU kernels' instruction set - give bit-equal stores.

The zoo's study-2 grid (its answers) and study-1 grid (its option logits, which show any rounding) on a few
questions, each run in a fresh process under 1 and 2 threads and under the AVX-512 and AVX2 kernels."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from mmfragile.store import ResultStore

SETTINGS = {"one thread": {"OMP_NUM_THREADS": "1"},
            "two threads": {"OMP_NUM_THREADS": "2"},
            "two threads, AVX2 kernels": {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2"}}
GRIDS = {"promptception": (["--prompt-ids", "1.1,2.1,3.1,4.1"], ["raw_output"]),
         "format-bias": (["--formats", "uppercase-dot-line_break,roman-colon-comma"], ["raw_output", "option_logits"])}


def _run(study: str, env: dict, out, deterministic: bool) -> list:
    args, cols = GRIDS[study]
    base = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA",
                                                             "MMFRAGILE_DETERMINISTIC")}
    cmd = [sys.executable, "-m", "mmfragile", "run", study, "--model", "zoo-smollm2-good", "--dataset", "easy-vqa",
           "--n", "2", *args, "--quiet", "--out", str(out)] + (["--deterministic"] if deterministic else [])
    p = subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = ResultStore(out).read().sort_values(["question_id", "variant"])
    return [[str(list(v)) if col == "option_logits" else v for v in rows[col]] for col in cols]


@pytest.mark.parametrize("study", list(GRIDS))
def test_settings_that_differ_today_give_bit_equal_stores_in_the_deterministic_mode(study, tmp_path):
    got = {name: _run(study, env, tmp_path / name.replace(" ", "_").replace(",", ""), True)
           for name, env in SETTINGS.items()}
    first = next(iter(got.values()))
    assert all(v == first for v in got.values()), {k: [len(c) for c in v] for k, v in got.items()}


def test_the_mode_refuses_where_torch_already_runs_other_kernels(monkeypatch):
    from mmfragile import determinism

    for key in (determinism.ENV, *determinism.PINNED_X86):   # set here, so that the test's end restores them
        monkeypatch.setenv(key, os.environ.get(key, ""))
    if torch.backends.cpu.get_cpu_capability().lower() == determinism.pinned().get("ATEN_CPU_CAPABILITY", "?"):
        pytest.skip("this machine's torch already runs the pinned kernels")
    with pytest.raises(RuntimeError, match="torch was imported before mmfragile"):
        determinism.enable()


def test_the_mode_is_off_after_the_test_that_turned_it_on():
    from mmfragile import determinism

    assert not determinism.enabled()
