"""Execute parameterised notebooks with papermill over parameter grids.

``run_grid("notebooks/30_format_bias_run.ipynb", {"model": ["smollm2-vlm", "tiny-vlm"], "dataset": ["synthetic-vqa"]})``
runs the cartesian product, one executed notebook per combination under
``papermill_runs/<notebook stem>/<k1=v1,k2=v2>.ipynb``, with a progress bar. A pipeline file
(``notebooks/pipeline.yaml``) lists the notebooks and grids that regenerate every figure.
"""
from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml
from tqdm.auto import tqdm

REPO_ROOT = Path(__file__).resolve().parents[2]


def expand_grid(grid: Mapping[str, Any]) -> list[dict[str, Any]]:
    keys = list(grid)
    values = [v if isinstance(v, (list, tuple)) else [v] for v in grid.values()]
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def slug(params: Mapping[str, Any]) -> str:
    text = ",".join(f"{k}={v}" for k, v in params.items()) or "default"
    return re.sub(r"[^A-Za-z0-9=,._@-]+", "_", text)[:180]


def run_grid(notebook: str | Path, grid: Mapping[str, Any] | None = None, fixed: Mapping[str, Any] | None = None,
             out_dir: str | Path = "papermill_runs", kernel: str | None = None, progress: bool = True,
             cwd: str | Path | None = None, log_output: bool = False) -> list[Path]:
    """Execute ``notebook`` once per grid point (``fixed`` parameters are passed to every run, not in the name)."""
    import papermill as pm

    notebook = Path(notebook)
    runs = expand_grid(grid or {})
    out = Path(out_dir) / notebook.stem
    out.mkdir(parents=True, exist_ok=True)
    written = []
    bar = tqdm(runs, desc=notebook.stem, disable=not progress, unit="nb")
    for params in bar:
        bar.set_postfix_str(slug(params)[:60])
        target = out / f"{slug(params)}.ipynb"
        t = time.time()
        pm.execute_notebook(str(notebook), str(target), parameters={**(fixed or {}), **params},
                            kernel_name=kernel, progress_bar=False, cwd=str(cwd or REPO_ROOT), log_output=log_output)
        relative_notebook_paths(target, REPO_ROOT)
        written.append(target)
        bar.write(f"  {target}  ({time.time() - t:.0f} s)")
    return written


def relative_notebook_paths(path: str | Path, root: str | Path = REPO_ROOT) -> None:
    """Rewrite the paths papermill records in an executed notebook (``input_path``, ``output_path``, ``cwd``)
    relative to ``root``: committed runs must not name the folder of the machine that ran them."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    pm = nb.metadata.get("papermill", {})
    for key in ("input_path", "output_path", "cwd"):
        value = pm.get(key)
        if isinstance(value, str) and Path(value).is_absolute():
            try:
                pm[key] = Path(os.path.relpath(Path(value).resolve(), Path(root).resolve())).as_posix()
            except ValueError:  # another drive (Windows): keep the name only
                pm[key] = Path(value).name
    nbformat.write(nb, str(path))


def load_pipeline(path: str | Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load(Path(path).read_text())
    steps = spec.get("steps", spec) if isinstance(spec, dict) else spec
    for i, s in enumerate(steps):
        if "notebook" not in s:
            raise ValueError(f"{path}: step {i} has no 'notebook'")
    return steps


def for_profile(value: Any, profile: str) -> Any:
    """``{default: X, quick: Y}`` -> the profile's entry (falling back to default); anything else as is."""
    if isinstance(value, dict) and ("default" in value or profile in value) and \
            all(k in ("default", "quick", "full") for k in value):
        return value.get(profile, value.get("default"))
    return value


def run_pipeline(path: str | Path = REPO_ROOT / "notebooks" / "pipeline.yaml", profile: str = "default",
                 only: Sequence[str] | None = None, out_dir: str | Path = REPO_ROOT / "papermill_runs",
                 progress: bool = True, cwd: str | Path | None = None) -> list[Path]:
    """Run every step of the pipeline file (its relative paths - results and figure folders - under ``cwd``,
    default the repository). A step has a ``notebook`` and either a ``grid`` (cartesian product)
    or ``runs`` (an explicit list of parameter sets), plus ``fixed`` parameters for every run; each of these
    may be split by profile (``{default: ..., quick: ...}``)."""
    written: list[Path] = []
    path = Path(path)
    for step in load_pipeline(path):
        nb = (path.parent / step["notebook"]).resolve()
        if only and not any(o in nb.stem for o in only):
            continue
        fixed = for_profile(step.get("fixed", {}), profile) or {}
        runs = for_profile(step.get("runs"), profile)
        if runs:
            for params in runs:
                written += run_grid(nb, {k: [v] for k, v in params.items()}, fixed, out_dir=out_dir, progress=progress,
                                    cwd=cwd)
        else:
            written += run_grid(nb, for_profile(step.get("grid", {}), profile) or {}, fixed, out_dir=out_dir,
                                progress=progress, cwd=cwd)
    return written
