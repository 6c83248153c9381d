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
                                                             "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS",
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

    for key in (determinism.ENV, *determinism.pinned()):   # recorded here, so that the test's end restores them
        absent = key not in os.environ
        monkeypatch.setenv(key, os.environ.get(key, ""))
        if absent:   # and absent again until enable() sets it (an empty ATEN_CPU_CAPABILITY makes torch warn)
            monkeypatch.delenv(key)
    if torch.backends.cpu.get_cpu_capability().lower() == determinism.pinned().get("ATEN_CPU_CAPABILITY", "?"):
        pytest.skip("this machine's torch already runs the pinned kernels")
    with pytest.raises(RuntimeError, match="torch was imported before mmfragile"):
        determinism.enable()


def test_the_mode_is_off_after_the_test_that_turned_it_on():
    from mmfragile import determinism

    assert not determinism.enabled()


@pytest.mark.parametrize("flags, expected", [([], (None, None)), (["--deterministic"], ("1", "avx2"))])
def test_reproduce_pins_the_notebook_kernels_with_deterministic(flags, expected, tmp_path):
    """`mmfragile --deterministic reproduce` pins the arithmetic for every notebook kernel it starts (they inherit
    the environment); plain `reproduce` runs the machine's own kernels (the mode costs 8-15x on bfloat16 models:
    docs/numerics.md)."""
    from mmfragile import determinism

    if not determinism.pinned().get("ATEN_CPU_CAPABILITY"):
        pytest.skip("the mode pins no ISA on this architecture")
    base = {k: v for k, v in os.environ.items() if k not in (determinism.ENV, *determinism.pinned())}
    code = ("import os, sys; from mmfragile.cli import main; "
            f"rc = main([*{flags!r}, 'reproduce', '--only', 'no-such-notebook', '--out', {str(tmp_path)!r}]); "
            "print(rc, os.environ.get('MMFRAGILE_DETERMINISTIC'), os.environ.get('ATEN_CPU_CAPABILITY'))")
    p = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[-3:] == ["0", str(expected[0]), str(expected[1])]


def _published_lmm(env: dict) -> str:
    """The published-table mixed model's coefficients (statsmodels on numpy's OpenBLAS), to every digit."""
    code = ("import mmfragile\nfrom mmfragile.studies.format_bias import metrics as fb\n"
            "from mmfragile.studies import format_bias as fbs\n"
            "lmm = fb.fit_lmm(fbs.load_study('published', None).scores)\n"
            "print(lmm[['coef', 'std_err', 'p_value']].to_csv())")
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_") and k != "MMFRAGILE_DETERMINISTIC"}
    p = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def test_the_analyses_numpy_computes_are_pinned_too():
    """The mixed model of study 1 moved in its 13th digit between OpenBLAS's AVX-512 and AVX2 kernels (one of the
    committed CSVs that differed between machines); in the mode both give the same digits."""
    from threadpoolctl import threadpool_info

    if not any(i.get("architecture") == "SkylakeX" for i in threadpool_info()):
        pytest.skip("this machine's OpenBLAS does not run its AVX-512 kernels")
    avx512, avx2 = ({"OPENBLAS_CORETYPE": c} for c in ("SkylakeX", "Haswell"))
    assert _published_lmm(avx512) != _published_lmm(avx2)                # differs today
    mode = {"MMFRAGILE_DETERMINISTIC": "1"}
    assert _published_lmm({**mode, **avx512, "OPENBLAS_NUM_THREADS": "2"}) == _published_lmm({**mode, **avx2})
