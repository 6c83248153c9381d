"""Loaders for the real benchmarks of the three studies, from local copies only (no hub access).

Every loader returns a validated question table (:mod:`mmfragile.schema`). Images embedded in
the source (base64 in MMBench TSVs, bytes in MMStar parquet) are written once to a cache folder
so that every row refers to an image file. Bad input raises :class:`~mmfragile.schema.DataError`
naming the file and row.

Layouts read (as published by the benchmarks' authors):

* **A-OKVQA** - ``aokvqa_v1p0_{split}.json`` (list of records with ``question_id``, ``question``,
  ``choices``, ``correct_choice_idx``, ``image_id``) and COCO images ``{coco_dir}/{image_id:012d}.jpg``
  (``{split}2017`` folder by default).
* **MMBench** - the TSV (``index, question, hint, A, B, C, D[, E, F], answer, image(base64), category``).
* **MMStar** - parquet with ``index, question, image (bytes or {"bytes": ...}), answer, category, l2_category``;
  the options are inline in the question text ("Options: A: ..., B: ...").
* **V*Bench** - a folder of sub-task folders (``direct_attributes``, ``relative_position``) each holding
  ``<name>.jpg`` + ``<name>.json`` with ``question`` and ``options``; the correct option is listed first.
* **Generic** - parquet / JSONL / JSON with ``question, options, answer`` (index or option text) and
  ``image`` / ``images`` (path, relative to the file, or bytes).
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import string
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ..paths import cache_dir
from ..schema import DataError, MCQuestion, answer_index, questions_frame, validate_questions

LETTERS = string.ascii_uppercase


def _store_image_bytes(data: bytes, where: str, dataset: str) -> str:
    """Write image bytes once (content-addressed) and return the path; DataError if undecodable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.verify()
            fmt = (im.format or "png").lower()
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise DataError(f"{where}: corrupt or unreadable embedded image: {e}") from e
    digest = hashlib.sha256(data).hexdigest()[:24]
    path = cache_dir("images", dataset) / f"{digest}.{fmt}"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return str(path)


def _image_field(value: Any, base: Path, where: str, dataset: str) -> list[str]:
    """Accept a path, a list of paths, raw bytes, a {"bytes": ..., "path": ...} dict or base64 text."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return []
    if isinstance(value, (list, tuple)) or (hasattr(value, "tolist") and not isinstance(value, (bytes, str, dict))):
        out: list[str] = []
        for v in list(value):
            out += _image_field(v, base, where, dataset)
        return out
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return [_store_image_bytes(value["bytes"], where, dataset)]
        return _image_field(value.get("path"), base, where, dataset)
    if isinstance(value, (bytes, bytearray)):
        return [_store_image_bytes(bytes(value), where, dataset)]
    text = str(value)
    p = Path(text)
    if not p.is_absolute():
        p = base / p
    if p.suffix.lower() in {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"} or p.exists():
        return [str(p)]
    try:  # long base64 strings (MMBench)
        data = base64.b64decode(text, validate=True)
    except (ValueError, base64.binascii.Error):
        raise DataError(f"{where}: image field is neither an existing file nor base64 data: {text[:60]!r}") from None
    return [_store_image_bytes(data, where, dataset)]


def load_aokvqa(annotation_file: str | Path, coco_dir: str | Path, n: int | None = None) -> pd.DataFrame:
    f = Path(annotation_file)
    if not f.is_file():
        raise DataError(f"A-OKVQA annotation file not found: {f}")
    records = json.loads(f.read_text())
    qs = []
    for i, r in enumerate(records[:n] if n else records):
        where = f"{f}, row {i}"
        try:
            choices, idx = list(r["choices"]), r.get("correct_choice_idx")
        except KeyError as e:
            raise DataError(f"{where}: missing field {e}") from e
        if idx is None:
            raise DataError(f"{where}: no correct_choice_idx (test split has no answers)")
        if not 0 <= int(idx) < len(choices):
            raise DataError(f"{where}: correct_choice_idx {idx} is not among the {len(choices)} choices")
        img = Path(coco_dir) / f"{int(r['image_id']):012d}.jpg"
        qs.append(MCQuestion("a-okvqa", str(r["question_id"]), r["question"], choices, int(idx), [str(img)], "", "image"))
    return validate_questions(questions_frame(qs), source=f)


def _letter_columns(df: pd.DataFrame) -> list[str]:
    cols = []
    for letter in LETTERS:
        if letter in df.columns:
            cols.append(letter)
        else:
            break
    return cols


def load_mmbench(tsv_file: str | Path, n: int | None = None, use_hint: bool = True) -> pd.DataFrame:
    f = Path(tsv_file)
    if not f.is_file():
        raise DataError(f"MMBench TSV not found: {f}")
    df = pd.read_csv(f, sep="\t", dtype=str, keep_default_na=False)
    letters = _letter_columns(df)
    if len(letters) < 2:
        raise DataError(f"{f}: expected option columns A, B, ... in the header, got {list(df.columns)}")
    qs = []
    for i, r in enumerate(df.head(n).itertuples(index=False) if n else df.itertuples(index=False)):
        r = r._asdict()
        where = f"{f}, row {i} (index={r.get('index')})"
        opts = [r[c] for c in letters if str(r[c]).strip() not in ("", "nan")]
        ans = str(r.get("answer", "")).strip()
        if ans not in LETTERS[: len(opts)]:
            raise DataError(f"{where}: answer {ans!r} is not among the option letters {list(LETTERS[:len(opts)])}")
        q = r["question"]
        if use_hint and str(r.get("hint", "")).strip() not in ("", "nan"):
            q = f"{r['hint']}\n{q}"
        imgs = _image_field(r.get("image"), f.parent, where, "mmbench")
        qs.append(MCQuestion("mmbench", str(r.get("index", i)), q, opts, LETTERS.index(ans), imgs, str(r.get("category", "")), "image"))
    return validate_questions(questions_frame(qs), source=f)


_MMSTAR_OPTS = re.compile(r"\n?Options?:\s*(.*)$", re.S)
_MMSTAR_SPLIT = re.compile(r"(?:^|,\s*|\n)([A-Z])\s*[:.]\s*")


def parse_inline_options(text: str, where: str) -> tuple[str, list[str]]:
    """Split "Question?\\nOptions: A: x, B: y" into ("Question?", ["x", "y"])."""
    m = _MMSTAR_OPTS.search(text)
    if not m:
        raise DataError(f"{where}: no 'Options:' block in the question text {text[:80]!r}")
    body = m.group(1)
    parts = _MMSTAR_SPLIT.split(body)
    # parts = [before, 'A', optA, 'B', optB, ...]
    letters, opts = parts[1::2], [p.strip().rstrip(",").strip() for p in parts[2::2]]
    if letters != list(LETTERS[: len(letters)]) or len(opts) < 2:
        raise DataError(f"{where}: cannot parse the options block {body[:80]!r}")
    return text[: m.start()].strip(), opts


def load_mmstar(parquet_file: str | Path, n: int | None = None) -> pd.DataFrame:
    f = Path(parquet_file)
    if not f.is_file():
        raise DataError(f"MMStar parquet not found: {f}")
    df = pd.read_parquet(f)
    qs = []
    for i, r in enumerate((df.head(n) if n else df).to_dict("records")):
        where = f"{f}, row {i} (index={r.get('index')})"
        q, opts = parse_inline_options(str(r["question"]), where)
        ans = str(r.get("answer", "")).strip()
        if ans not in LETTERS[: len(opts)]:
            raise DataError(f"{where}: answer {ans!r} is not among the option letters {list(LETTERS[:len(opts)])}")
        imgs = _image_field(r.get("image"), f.parent, where, "mmstar")
        qs.append(MCQuestion("mmstar", str(r.get("index", i)), q, opts, LETTERS.index(ans), imgs, str(r.get("category", "")), "image"))
    return validate_questions(questions_frame(qs), source=f)


def load_vstar(folder: str | Path, n: int | None = None) -> pd.DataFrame:
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"V*Bench folder not found: {root}")
    qs = []
    for jf in sorted(root.glob("*/*.json")):
        where = str(jf)
        try:
            r = json.loads(jf.read_text())
            opts, question = list(r["options"]), r["question"]
        except (json.JSONDecodeError, KeyError) as e:
            raise DataError(f"{where}: unreadable V*Bench record: {e}") from e
        img_name = r.get("image", jf.with_suffix(".jpg").name)
        img = jf.parent / img_name
        # V*Bench lists the correct option first
        qs.append(MCQuestion("vstar", f"{jf.parent.name}/{jf.stem}", question, opts, 0, [str(img)], jf.parent.name, "image"))
        if n and len(qs) >= n:
            break
    if not qs:
        raise DataError(f"{root}: no <task>/<name>.json records found")
    return validate_questions(questions_frame(qs), source=root)


def load_generic(path: str | Path, dataset: str | None = None, n: int | None = None) -> pd.DataFrame:
    """Parquet (also a HF ``datasets`` on-disk folder of parquet shards), JSONL or JSON records."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.rglob("*.parquet"))
        if not files:
            raise DataError(f"{p}: no parquet files in folder")
        df = pd.concat([pd.read_parquet(x) for x in files], ignore_index=True)
    elif p.suffix == ".parquet":
        df = pd.read_parquet(p)
    elif p.suffix == ".jsonl":
        df = pd.read_json(p, lines=True)
    elif p.suffix == ".json":
        df = pd.DataFrame(json.loads(p.read_text()))
    elif not p.exists():
        raise DataError(f"dataset file not found: {p}")
    else:
        raise DataError(f"{p}: unsupported dataset file type {p.suffix!r} (parquet, jsonl, json)")
    name = dataset or p.stem
    base = p if p.is_dir() else p.parent
    qs = []
    for i, r in enumerate((df.head(n) if n else df).to_dict("records")):
        where = f"{p}, row {i}"
        for col in ("question", "options", "answer"):
            if col not in r:
                raise DataError(f"{where}: missing field {col!r}")
        opts = [str(o) for o in list(r["options"])]
        a = r["answer"]
        if isinstance(a, str) and not a.isdigit():
            ans = LETTERS.index(a) if (len(a) == 1 and a in LETTERS[: len(opts)]) else answer_index(opts, a, where)
        else:
            ans = int(a)
            if not 0 <= ans < len(opts):
                raise DataError(f"{where}: answer index {ans} is not among the {len(opts)} options {opts}")
        imgs = _image_field(r.get("images", r.get("image")), base, where, name)
        modality = r.get("modality") or ("text" if not imgs else "image" if len(imgs) == 1 else "multi-image")
        qs.append(MCQuestion(name, str(r.get("question_id", r.get("id", i))), str(r["question"]), opts, ans, imgs,
                             str(r.get("category", "") or ""), modality))
    return validate_questions(questions_frame(qs), source=p)


def load_dataset(spec: str, n: int | None = None, seed: int = 0) -> pd.DataFrame:
    """One entry point, by name: ``synthetic-vqa``, ``synthetic-text`` (its text-only subset), ``easy-vqa``,
    or ``<kind>:<path>`` with kind in aokvqa (``aokvqa:<json>::<coco_dir>``), mmbench, mmstar, vstar, generic."""
    from .easyvqa import load_easy_vqa
    from .synthetic import make_synthetic_vqa

    if spec in ("synthetic-vqa", "synthetic"):
        df = make_synthetic_vqa(seed)
    elif spec == "synthetic-image":
        # the first n of the four image kinds in turn (count, colour, shape, position, count, ...)
        per_kind = max(10, -(-(n or 0) // 4))
        df = make_synthetic_vqa(seed, n_per_kind=per_kind).query("modality == 'image'")
        df = df.assign(_i=df.groupby("category").cumcount()).sort_values("_i", kind="stable")
        df = df.drop(columns="_i").reset_index(drop=True)
    elif spec == "synthetic-text":
        df = make_synthetic_vqa(seed).query("modality == 'text'").reset_index(drop=True)
    elif spec == "easy-vqa":
        return load_easy_vqa(n=n or 200, seed=seed)
    elif ":" in spec:
        kind, path = spec.split(":", 1)
        loaders: dict[str, Callable[..., pd.DataFrame]] = {
            "mmbench": load_mmbench, "mmstar": load_mmstar, "vstar": load_vstar, "generic": load_generic}
        if kind == "aokvqa":
            ann, _, coco = path.partition("::")
            return load_aokvqa(ann, coco or Path(ann).parent, n=n)
        if kind not in loaders:
            raise DataError(f"unknown dataset kind {kind!r}; use one of aokvqa, {', '.join(loaders)}")
        return loaders[kind](path, n=n)
    else:
        raise DataError(f"unknown dataset {spec!r}: use synthetic-vqa, synthetic-text, easy-vqa or <kind>:<path>")
    return df.head(n).reset_index(drop=True) if n else df
