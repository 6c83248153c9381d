"""What a run ran on, recorded in each store's config.json (``run_info.provenance``) and shown by the report:
the model spec and the SHA-256 of its checkpoint, the dataset spec and the SHA-256 of its files, the versions.

A store is one model per model name: :func:`model_identity` (backend, source, the arguments that change outputs,
checkpoint hash) is pinned in ``run_info.model_identity`` on the first run and a resume with another model under
that name is refused (:meth:`mmfragile.store.ResultStore.pin_model`; docs/stores.md).

Hashes are of file contents (SHA-256 over every file of a checkpoint folder, in sorted order, with its relative
path), cached per file by (path, size, modification time) under ``$MMFRAGILE_CACHE/hashes``, so a 15 GB 7B
checkpoint is read once per machine. A dataset's *media* folders are not read (COCO, MVBench videos: many GB): the
spec's annotation file (or every file of its annotation folder up to :data:`MAX_HASHED_BYTES`) is hashed, larger
files by their size alone - the method is recorded beside the hash (``dataset_hash_method``).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from mmfragile.paths import build_once, cache_dir
from mmfragile.redaction import redact, without_credentials

#: files above this size in a *dataset* folder enter its hash by name and size only (media, not annotations)
MAX_HASHED_BYTES = 64 * 2**20


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's contents, cached by (path, size, mtime)."""
    p = Path(path).resolve()
    st = p.stat()
    key = hashlib.sha256(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    cached = build_once(cache_dir("hashes") / key, lambda tmp: tmp.write_text(_read_sha256(p)), file=True)
    return cached.read_text().strip()


def _read_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def tree_sha256(root: str | Path, max_bytes: int | None = None) -> str:
    """SHA-256 over a file or a folder: every file's relative path and content hash in sorted order (files larger
    than ``max_bytes``, if given, by their size only)."""
    root = Path(root)
    if root.is_file():
        return file_sha256(root)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        size = f.stat().st_size
        digest = f"size:{size}" if max_bytes is not None and size > max_bytes else file_sha256(f)
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest()


_SHA256 = re.compile(r"[0-9a-f]{64}")


def model_identity(spec, checkpoint_sha256: str) -> dict[str, Any]:
    """What makes rows one model's: the spec's backend, source and output-changing arguments
    (:attr:`~mmfragile.models.spec.ModelSpec.output_options`: not its name, batch size, memory ...) and the
    checkpoint's SHA-256 (as :func:`model_provenance` records it). Secrets are not part of it (a key change is not
    a model change): the source's URL credentials are left out and secret arguments are not output options."""
    return json.loads(json.dumps({"backend": spec.backend, "source": without_credentials(spec.source),
                                  "args": spec.output_options,
                                  "checkpoint_sha256": checkpoint_sha256}, default=str))


def same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two identities are one model: the same backend and arguments, and the same checkpoint bytes - where both
    checkpoints are hashed the path may differ (a copied or moved checkpoint); otherwise the same source."""
    hashed = all(_SHA256.fullmatch(str(x.get("checkpoint_sha256"))) for x in (a, b))
    keys = ("backend", "args", "checkpoint_sha256") + (() if hashed else ("source",))
    # a store pinned before secrets were masked may hold a source with credentials in it
    return all(without_credentials(a.get(k)) == without_credentials(b.get(k)) if k == "source" else a.get(k) == b.get(k)
               for k in keys)


def describe_identity(ident: dict[str, Any]) -> str:
    """An identity in one short phrase: ``hf:/ckpt dtype=bfloat16 (checkpoint sha256 0123456789ab)``."""
    args = "".join(f" {k}={v}" for k, v in sorted((ident.get("args") or {}).items()))
    sha = str(ident.get("checkpoint_sha256"))
    sha = sha[:12] if _SHA256.fullmatch(sha) else sha
    return f"{ident.get('backend')}:{ident.get('source')}{args} (checkpoint sha256 {sha})"


def identity_clash(where: Path | str, name: str, held: dict[str, Any], new: dict[str, Any],
                   one_model: bool = False) -> str:
    """The one-line refusal of a model that is not the one a store holds under ``name`` (``one_model``: a store
    whose configuration names its one model, so that only a new folder takes another)."""
    way = ("Use a new --out (and --model-args name=NEW to tell the two apart in a report)" if one_model else
           "Use a new --out, or give this model another name with --model-args name=NEW")
    return (f"{where}: the model named {name!r} here is {describe_identity(held)}, not {describe_identity(new)} "
            f"(stored vs requested); their rows would mix. {way}.")


def model_provenance(spec: str, folder: Path | None) -> dict[str, Any]:
    """The model spec and the SHA-256 of its checkpoint folder (an API model has none)."""
    out: dict[str, Any] = {"model_spec": redact(spec)}
    if folder is None:
        out["checkpoint_sha256"] = "none: no local checkpoint (an API model)"
    else:
        out["checkpoint_sha256"] = tree_sha256(folder)
        out["checkpoint"] = Path(folder).name
    return out


def dataset_provenance(dataset: str | None) -> dict[str, Any]:
    """The dataset spec and the SHA-256 of its files (built-in sets: how they are made)."""
    from mmfragile.data.benchmarks import benchmark, by_prefix

    if not dataset:
        return {}
    prefix, sep, path = str(dataset).partition(":")
    record = by_prefix(prefix) if sep else None
    if record is None or record.builtin:
        try:
            source = benchmark(dataset).source
        except KeyError:
            source = "generated by the study"
        return {"dataset": dataset, "dataset_sha256": "none: a built-in set", "dataset_source": source}
    first = Path(path.partition("::")[0])
    if not first.exists():
        return {"dataset": dataset, "dataset_sha256": f"none: {first} not found"}
    return {"dataset": dataset, "dataset_sha256": tree_sha256(first, MAX_HASHED_BYTES),
            "dataset_hash_method": f"contents of {first.name}" + (f"; files over {MAX_HASHED_BYTES >> 20} MiB by size"
                                                                 if first.is_dir() else "")}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("mmfragile", "torch", "transformers", "vllm"):
        try:
            out[f"{pkg}_version"] = version(pkg)
        except PackageNotFoundError:
            continue
    return out


def run_provenance(spec: str, folder: Path | None, dataset: str | None) -> dict[str, Any]:
    """Everything above for one run of one model (its spec and checkpoint folder)."""
    return json.loads(json.dumps({**model_provenance(spec, folder), **dataset_provenance(dataset), **versions()}))
