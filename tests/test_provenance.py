"""A run records what it ran on - the checkpoint's and the dataset's SHA-256 - and the report shows it."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from mmfragile.data import fixtures as fx
from mmfragile.models.spec import ModelSpec
from mmfragile.provenance import MAX_HASHED_BYTES, tree_sha256
from mmfragile.study import run_study


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _folder_sha(root: Path) -> str:
    """The documented rule, written out independently: relative path and content hash of every file, sorted."""
    lines = [f"{f.relative_to(root).as_posix()}\0{_sha(f.read_bytes())}\n".encode()
             for f in sorted(p for p in root.rglob("*") if p.is_file())]
    return _sha(b"".join(lines))


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFRAGILE_CACHE", str(tmp_path / "cache"))


def test_tree_hash_is_the_documented_rule(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.json").write_text('{"x": 1}')
    (tmp_path / "d" / "sub" / "w.bin").write_bytes(b"\x00\x01" * 1000)
    assert tree_sha256(tmp_path / "d") == _folder_sha(tmp_path / "d")
    assert tree_sha256(tmp_path / "d" / "a.json") == _sha(b'{"x": 1}')
    before = tree_sha256(tmp_path / "d")
    (tmp_path / "d" / "a.json").write_text('{"x": 2}')                    # a changed file changes the hash
    assert tree_sha256(tmp_path / "d") != before
    assert MAX_HASHED_BYTES >= 2**20


def test_run_records_checkpoint_and_dataset_hashes_and_the_report_shows_them(tmp_path, tiny_vlm):
    from mmfragile.report import build_report

    spec = fx.write_hrbench(tmp_path / "data", "4k")
    run = run_study("format-bias", tiny_vlm, spec, n=1, out=tmp_path / "run", formats=["uppercase-dot-line_break"],
                    standard_format="none", progress=False)
    prov = run.stores["grid"].config["run_info"]["provenance"][tiny_vlm.name]
    assert prov["checkpoint_sha256"] == _folder_sha(tiny_vlm.checkpoint)
    tsv = Path(spec.partition(":")[2])
    assert prov["dataset_sha256"] == _sha(tsv.read_bytes()) and prov["dataset"] == spec
    assert prov["mmfragile_version"] and prov["torch_version"]
    rep = build_report([tmp_path / "run"], tmp_path / "report", n_boot=20)
    (p,) = rep.provenance
    assert prov["checkpoint_sha256"][:40] in p["checkpoint hash"] and prov["dataset_sha256"][:40] in p["dataset / file hash"]
    assert "mmfragile 0.1.0" in p["version"]


def test_an_api_model_has_no_checkpoint_to_hash():
    assert ModelSpec.parse("openai:http://127.0.0.1:1/v1::m").checkpoint_dir() is None
