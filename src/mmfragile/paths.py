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


def seed_path(name: str) -> Path:
    """A seed paper text (``format-bias-mcvqa.txt``, ``promptception.txt``, ``mm-judgebias.txt``):
    ``$MMFRAGILE_SEEDS/<name>``, else ``<repo>/../shared/seeds/<name>`` (the checkout's sibling folder)."""
    env = os.environ.get("MMFRAGILE_SEEDS")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[3] / "shared" / "seeds")
    candidates.append(Path.cwd().parent / "shared" / "seeds")
    for c in candidates:
        if (c / name).is_file():
            return c / name
    return candidates[0] / name


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


def check_writable_folder(path: str | Path, what: str = "--out") -> None:
    """A folder that is there or can be made, and written in - checked without leaving anything behind:
    :class:`~mmfragile.errors.UsageError` naming ``what`` and the file in the way or the folder that refuses."""
    import tempfile

    from mmfragile.errors import UsageError

    folder = Path(path).expanduser()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f"{what} {path}: {existing} is a file, not a folder")
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot write in {existing} ({e.strerror or e})") from None
