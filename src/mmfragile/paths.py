"""Where mmfragile keeps generated data, converted models and caches (never inside site-packages)."""
from __future__ import annotations

import os
import re
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$MMFRAGILE_CACHE`` (default ``~/.cache/mmfragile``) joined with ``parts``; created on demand."""
    root = Path(os.environ.get("MMFRAGILE_CACHE", Path.home() / ".cache" / "mmfragile"))
    p = root.joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


def seed_path(name: str) -> Path | None:
    """A seed paper text (``format-bias-mcvqa.txt``, ``promptception.txt``, ``mm-judgebias.txt``) at
    ``$MMFRAGILE_SEEDS/<name>``; None when the variable is unset or the file is not there. The texts ship with no
    checkout: only the extraction scripts and their tests read them (the extracted tables are committed)."""
    env = os.environ.get("MMFRAGILE_SEEDS")
    path = Path(env) / name if env else None
    return path if path is not None and path.is_file() else None


def seed_missing(name: str) -> str:
    """Why ``seed_path(name)`` is None, in one line: the reason a test skips and a script stops with."""
    env = os.environ.get("MMFRAGILE_SEEDS")
    if not env:
        return f"seed text {name} not available: set MMFRAGILE_SEEDS to the folder holding it"
    return f"seed text {name} not found in MMFRAGILE_SEEDS={env}"


def vllm_venv() -> Path:
    """The vLLM environment ``scripts/install_vllm.sh`` creates (vLLM pins its own transformers / numpy):
    ``$MMFRAGILE_VLLM_VENV``, else ``vllm-venv`` in the cache folder. Not created here."""
    env = os.environ.get("MMFRAGILE_VLLM_VENV")
    if env:
        return Path(env)
    return Path(os.environ.get("MMFRAGILE_CACHE", Path.home() / ".cache" / "mmfragile")) / "vllm-venv"


def safe_name(name: str) -> str:
    """``name`` usable as one path component and in keys (model / dataset names in store and figure paths,
    self-generated sample ids)."""
    return re.sub(r"[^A-Za-z0-9@._=+-]+", "_", str(name)).strip("_") or "_"
