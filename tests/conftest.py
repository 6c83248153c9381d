"""Shared fixtures. Models and data live in a session cache folder so the (one-off) SmolLM2 conversion
is paid once per machine: ``MMFRAGILE_CACHE`` if set, else ``~/.cache/mmfragile``."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def load_script():
    """``load_script("name")``: ``scripts/name.py`` imported as a module (its ``main`` / functions called in-process)."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


@pytest.fixture(scope="session")
def tiny_vlm():
    from mmfragile.models.embedded import load_embedded

    return load_embedded("tiny-vlm")


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory):
    from mmfragile.data.synthetic import make_synthetic_vqa

    return make_synthetic_vqa(0, tmp_path_factory.mktemp("synthetic"))
