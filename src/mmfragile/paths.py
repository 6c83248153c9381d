"""Where mmfragile keeps generated data, converted models and caches (never inside site-packages)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$MMFRAGILE_CACHE`` (default ``~/.cache/mmfragile``) joined with ``parts``; created on demand."""
    root = Path(os.environ.get("MMFRAGILE_CACHE", Path.home() / ".cache" / "mmfragile"))
    p = root.joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p
