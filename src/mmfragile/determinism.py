"""A deterministic mode: the same commit gives the same numbers on any machine of the same architecture.

What decides a CPU run's arithmetic besides the code: the instruction set PyTorch's kernels dispatch to
(``ATEN_CPU_CAPABILITY``: AVX-512 here, AVX2 elsewhere), MKL's code path (its Conditional Numerical
Reproducibility, ``MKL_CBWR``), oneDNN's ISA (``ONEDNN_MAX_CPU_ISA``), the kernels and threads of the OpenBLAS that
numpy, scipy and statsmodels compute the analyses with (``OPENBLAS_CORETYPE``, ``OPENBLAS_NUM_THREADS``: the mixed
model's coefficients moved in their 13th digit between machines), the thread count (how reductions split) and
non-deterministic algorithms. With ``MMFRAGILE_DETERMINISTIC=1`` (``mmfragile --deterministic ...`` sets it) the
ISA is pinned to AVX2 - the level every x86-64 machine of the last decade has - MKL to its strict AVX2 path and
oneDNN to AVX2 and OpenBLAS to its Haswell (AVX2) kernels on one thread, before torch and numpy are imported,
for this process and every process it starts (papermill kernels, Ray workers, shards), and torch uses
deterministic algorithms. Under MKL's strict reproducibility torch's thread count no longer changes a bit
(measured: 1 and 2 threads give bit-equal stores), so it is left as it is. Measured cost and what it fixes:
docs/numerics.md.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

#: the switch (any value but "" / "0")
ENV = "MMFRAGILE_DETERMINISTIC"
#: what the mode pins on x86-64 (read by torch, MKL, oneDNN and numpy's / scipy's OpenBLAS when they load)
PINNED_X86 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2",
              "OPENBLAS_CORETYPE": "Haswell"}
#: what it pins everywhere: OpenBLAS splits a dot product's sum over its threads (MKL's strict mode does not)
PINNED = {"OPENBLAS_NUM_THREADS": "1"}


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def pinned() -> dict[str, str]:
    """The environment the mode sets on this machine's architecture."""
    import platform  # here, not at import: every `import mmfragile` runs apply()

    return {**PINNED, **(PINNED_X86 if platform.machine().lower() in ("x86_64", "amd64") else {})}


def enable() -> None:
    """Turn the mode on for this process and its children: before torch is imported, or it refuses (one line)."""
    os.environ[ENV] = "1"
    apply()


def apply() -> None:
    """Pin the environment (where the mode is on) and, once torch is imported, its deterministic algorithms. Torch
    reads its ISA once, on import: if it was imported with another one, refuse, naming what to do."""
    if not enabled():
        return
    os.environ.update(pinned())
    if "torch" in sys.modules:   # else on the next call: ModelSpec.load calls this before a model loads
        import torch

        want = pinned().get("ATEN_CPU_CAPABILITY")
        have = torch.backends.cpu.get_cpu_capability().lower()
        if want and have != want:
            raise RuntimeError(f"{ENV}=1 but torch was imported before mmfragile with the {have} kernels: set {ENV}=1 "
                               "in the environment before starting Python (or import mmfragile first)")
        torch.use_deterministic_algorithms(True)
    if "numpy" in sys.modules and "OPENBLAS_CORETYPE" in pinned():   # OpenBLAS, too, picks its kernels on load
        from threadpoolctl import threadpool_info

        loaded = {i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"}
        if loaded - {pinned()["OPENBLAS_CORETYPE"]}:
            raise RuntimeError(f"{ENV}=1 but numpy was imported before mmfragile with OpenBLAS's "
                               f"{', '.join(sorted(map(str, loaded)))} kernels: import mmfragile before torch and "
                               "numpy (or run `python -m mmfragile --deterministic ...`)")


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch CPU threads (None: as set), then restore (``run_study(threads=)``; the numerics
    study's thread-count alternative: the thread count is part of the arithmetic)."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)
