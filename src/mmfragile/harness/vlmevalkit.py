"""VLMEvalKit bridge: a study's grid as VLMEvalKit custom datasets (TSV), and VLMEvalKit's prediction files back as a
result store.

Export (:func:`export_vlmevalkit`) writes one folder, run with ``LMUData=DIR python run.py --data NAME ... --mode
infer`` (VLMEvalKit reads an unregistered dataset ``NAME`` from ``$LMUData/NAME.tsv``):

* ``NAME.tsv`` - one custom dataset per answer budget (``NAME`` = ``mmfragile_<study>_<dataset>_openended``, plus
  ``_t<budget>`` for variants whose longest option ID takes more than one token), one row per request (every
  circular shift of every prompt variant is a row) in VLMEvalKit's published layout: ``index``, ``image`` (the image
  file's bytes as base64; a later row of the same image holds the index of its first row, VLMEvalKit's own way of
  sharing an image; several images are a list of base64 strings), ``question`` = the whole user text as mmfragile
  renders it for the variant, ``answer`` = the answer ID, then mmfragile's keys (dataset, question_id, variant,
  format factors, shift ...) and ``option_ids`` (JSON) as extra columns;
* ``data/NAME.jsonl`` - the exported rows as mmfragile reads them back (``index`` + :func:`common.item_row`);
* ``mmfragile_export.json`` - the study, model, dataset, parameters, the native store's config, name -> files.

Why this layout keeps the prompt: a TSV with ``A`` and ``B`` columns is a ``CustomMCQDataset``, whose
``build_prompt`` rewraps every row as ``Hint/Question: ...\\nOptions:\\nA. ...\\nPlease select the correct answer
from the options above.`` - the format under test would be gone. A TSV without option columns is a
``CustomVQADataset``, whose ``build_prompt`` (``ImageBaseDataset``'s) sends the images and ``question`` verbatim.
The model class may still rewrite the prompt: ``inference.infer_data`` calls the model's own ``build_prompt`` where
``model.use_custom_prompt(NAME)`` is true, which most classes answer from ``DATASET_TYPE(NAME)`` - ``'MCQ'`` for an
unregistered name unless it contains ``openended`` (then ``'VQA'``). Hence ``_openended`` in every name.

VLMEvalKit's prediction file (``<model>_<NAME>.xlsx`` by default, ``.tsv`` / ``.json`` with ``PRED_FORMAT``; a
``.csv`` is read too) is the dataset's table less ``image`` plus ``prediction``. Import
(:func:`import_vlmevalkit`) joins each row to the exported row on ``index``, checks that ``question`` is the
exported prompt, and scores ``prediction`` with the study's score function into a store with the native config. A
row that does not match (unknown or repeated index, another question, no ``prediction`` column) is a
:class:`HarnessError` naming the file and row, never dropped; an empty prediction (NaN) is the empty string,
scored as out of coverage.
"""
from __future__ import annotations

import base64
import csv
import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

import pandas as pd

from mmfragile.harness.common import (MANIFEST, HarnessError, exported_rows, group_name, item_row, read_jsonl,
                                      read_manifest, study_grid, write_jsonl, write_store)
from mmfragile.store import ResultStore

HARNESS = "VLMEvalKit"
#: Studies whose grid VLMEvalKit can run: their score function is a pure function of the raw output.
STUDIES = ("format-bias",)
#: The prediction file formats VLMEvalKit writes (PRED_FORMAT xlsx - the default -, tsv, json) and csv.
PRED_SUFFIXES = (".xlsx", ".tsv", ".csv", ".json")
#: Columns of the TSV before mmfragile's keys: VLMEvalKit's own.
TSV_HEAD = ("index", "image", "question", "answer")


def dataset_name(study: str, dataset: str, max_new_tokens: int) -> str:
    """VLMEvalKit's ``--data`` name of the requests with this answer budget (``openended``: see module docstring)."""
    name = f"{group_name(study, dataset)}_openended"
    return name if max_new_tokens == 1 else f"{name}_t{max_new_tokens}"


# ============================================================================================== export
def _image_cells(rows: Sequence[dict], where: str) -> list[str]:
    """The ``image`` column: base64 of the image file, or the ``index`` of the first row with the same image."""
    first: dict[str, int] = {}
    cells = []
    for row in rows:
        if not row["images"]:
            raise ValueError(f"export vlmevalkit: {where} question {row['question_id']} ({row['variant']}) has no "
                             "image; VLMEvalKit's custom VQA dataset drops rows without one (skip_noimg): export "
                             "image questions only")
        key = json.dumps(row["images"])
        if key in first:
            cells.append(str(first[key]))
            continue
        first[key] = row["index"]
        b64 = [base64.b64encode(Path(p).read_bytes()).decode("ascii") for p in row["images"]]
        cells.append(b64[0] if len(b64) == 1 else json.dumps(b64))
    return cells


def tsv_frame(rows: Sequence[dict], where: str = "") -> pd.DataFrame:
    """VLMEvalKit's table of the exported rows (module docstring)."""
    extra = [k for k in rows[0] if k not in ("index", "prompt", "images", "option_ids", "answer_id",
                                             "max_new_tokens")]
    frame = pd.DataFrame({"index": [r["index"] for r in rows], "image": _image_cells(rows, where),
                          "question": [r["prompt"] for r in rows], "answer": [r["answer_id"] for r in rows]})
    for k in extra:
        frame[k] = [r[k] for r in rows]
    frame["option_ids"] = [json.dumps(r["option_ids"]) for r in rows]
    frame["max_new_tokens"] = [r["max_new_tokens"] for r in rows]
    return frame


def export_vlmevalkit(study: str, model: str, dataset: str, out: str | Path, n: int | None = None,
                      **params: Any) -> dict[str, Any]:
    """Write ``study``'s grid as VLMEvalKit custom datasets (module docstring); returns the manifest written.
    ``model`` is the checkpoint whose tokenizer sizes each variant's answer budget and that names the imported
    store (what ``run_study``'s ``model`` is); ``params``: the study's parameters (``formats`` ...)."""
    grid = study_grid(study, model, dataset, n, params, "vlmevalkit", STUDIES)
    out = Path(out).resolve()
    (out / "data").mkdir(parents=True, exist_ok=True)
    by_name: dict[str, list[dict]] = defaultdict(list)
    for it in grid.items:  # one dataset per answer budget: VLMEvalKit's max_new_tokens is the model's setting
        rows = by_name[dataset_name(study, dataset, it.max_new_tokens)]
        rows.append({"index": len(rows), **item_row(it)})
    datasets = {}
    for name, rows in sorted(by_name.items()):
        write_jsonl(out / "data" / f"{name}.jsonl", rows)
        # as vlmeval.smp.dump writes a .tsv (read back by vlmeval.smp.load: pandas.read_csv(sep='\t'))
        tsv_frame(rows, name).to_csv(out / f"{name}.tsv", sep="\t", index=False, encoding="utf-8",
                                     quoting=csv.QUOTE_ALL)
        datasets[name] = {"tsv": f"{name}.tsv", "data": f"data/{name}.jsonl", "rows": len(rows),
                          "max_new_tokens": rows[0]["max_new_tokens"]}
    manifest = grid.manifest(HARNESS, dataset, n, datasets=datasets)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def run_hint(manifest: dict[str, Any], out: str | Path) -> str:
    """What the export holds and the VLMEvalKit command per dataset (a model generating at most its budget)."""
    sets = manifest["datasets"]
    lines = [f"{out}: {len(sets)} VLMEvalKit datasets, {sum(d['rows'] for d in sets.values())} requests"]
    for name, d in sets.items():
        lines.append(f"run: LMUData={out} python -m vlmeval.run --data {name} --model MODEL --mode infer "
                     "--work-dir RUN_DIR"
                     f"  (MODEL generating at most {d['max_new_tokens']} new token"
                     f"{'s' if d['max_new_tokens'] > 1 else ''})")
    return "\n".join(lines)


# ============================================================================================== import
def _export_folder(export: str | Path | None) -> Path:
    if export is not None:
        return Path(export)
    lmu = os.environ.get("LMUData")
    if lmu and (Path(lmu) / MANIFEST).is_file():
        return Path(lmu)
    raise HarnessError("cannot find the export of these predictions ($LMUData has no mmfragile_export.json); "
                       "pass --export DIR, the folder `mmfragile export vlmevalkit` wrote")


def _name_of(path: Path, names: Iterable[str]) -> str | None:
    """The exported dataset a prediction file ``<model>_<NAME>.<ext>`` is of (the longest name that fits)."""
    fits = [n for n in names if path.stem.endswith(f"_{n}")]
    return max(fits, key=len) if fits else None


def prediction_files(paths: Sequence[str | Path], names: Sequence[str]) -> list[Path]:
    """The prediction files given, or found under the folders given (``*_<NAME>.<xlsx|tsv|csv|json>``), each file
    once (a link to a file counts as the file)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files += sorted(f for f in p.rglob("*_*") if f.suffix.lower() in PRED_SUFFIXES and f.is_file()
                            and _name_of(f, names))
        else:
            raise HarnessError(f"{p}: no such VLMEvalKit prediction file or output folder")
    # run.py links each file of its run folder (<work-dir>/<model>/<eval_id>/) into <work-dir>/<model>/: once
    unique: dict[Path, Path] = {}
    for f in files:
        unique.setdefault(f.resolve(), f)
    files = list(unique.values())
    if not files:
        raise HarnessError(f"no prediction file (<model>_<dataset>.xlsx/.tsv/.csv/.json of the export's datasets "
                           f"{', '.join(names)}) under {', '.join(map(str, paths))}: run VLMEvalKit's run.py with "
                           "--data NAME first")
    return files


def read_predictions(path: Path) -> pd.DataFrame:
    """A prediction file as VLMEvalKit writes it (``vlmeval.smp.dump``), every cell as text: a prediction ``"1"`` or
    ``"None"`` stays that text (pandas' own guessing would make them 1.0 and NaN); an empty cell is ``""``."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".xlsx":
            try:
                import openpyxl  # noqa: F401  (pandas' xlsx reader)
            except ImportError:
                raise HarnessError(f"{path}: reading .xlsx needs openpyxl (pip install openpyxl), or rerun "
                                   "VLMEvalKit with PRED_FORMAT=tsv") from None
            return pd.read_excel(path, dtype=str, keep_default_na=False)
        if suffix in (".tsv", ".csv"):
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", dtype=str, keep_default_na=False)
        if suffix == ".json":
            return pd.DataFrame(json.loads(path.read_text(encoding="utf-8")))
    except HarnessError:
        raise
    except Exception as e:  # a file pandas cannot parse
        raise HarnessError(f"{path}: not a readable {suffix[1:]} prediction file ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]})") from None
    raise HarnessError(f"{path}: not a VLMEvalKit prediction file (.xlsx, .tsv, .csv or .json)")


def _text(value: Any) -> str:
    """A cell as text; an empty cell (NaN, None) is the empty string."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _index(value: Any) -> int | None:
    text = _text(value).strip()
    try:
        return int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            return None
        return int(f) if f.is_integer() else None


def _joined(path: Path, table: pd.DataFrame, rows: list[dict]) -> list[tuple[dict, str]]:
    """(exported row, raw output) per prediction row; a row that does not match its exported row is an error.
    Rows are named as a spreadsheet numbers them (the header is row 1)."""
    for col in ("index", "prediction"):
        if col not in table.columns:
            cols = ", ".join(map(str, table.columns))
            raise HarnessError(f"{path}: no `{col}` column (columns: {cols[:200]}): not a VLMEvalKit prediction file")
    by_index = {r["index"]: r for r in rows}
    seen: dict[int, int] = {}
    out = []
    for i, rec in enumerate(table.to_dict("records")):
        where = f"{path}: row {i + 2}"
        idx = _index(rec["index"])
        if idx not in by_index:
            raise HarnessError(f"{where}: index {_text(rec['index'])!r} is not a row of the exported dataset "
                               f"({len(rows)} rows): was it re-exported after this run?")
        if idx in seen:
            raise HarnessError(f"{where}: index {idx} already on row {seen[idx]}")
        seen[idx] = i + 2
        row = by_index[idx]
        if "question" in rec and _text(rec["question"]) != row["prompt"]:
            raise HarnessError(f"{where}: the question of index {idx} is not the exported prompt "
                               f"({row['question_id']}, {row['variant']}): the run used another export")
        out.append(({k: v for k, v in row.items() if k != "index"}, _text(rec["prediction"])))  # index: no key
    return out


def _provenance(files: list[Path], harness_models: list[str]) -> dict[str, Any]:
    """What the prediction files and VLMEvalKit's ``status.json`` beside them (written by newer run.py) record."""
    status = {}
    for f in files:
        s = f.parent / "status.json"
        if s.is_file():
            try:
                status = {**json.loads(s.read_text()), "path": str(s)}
            except json.JSONDecodeError:
                pass
            break
    return {"harness": HARNESS,
            "harness_version": str(status.get("commit") or "not recorded: the prediction files carry none and "
                                   "status.json's commit is empty (a pip install) or absent"),
            "harness_model": ", ".join(sorted(set(harness_models))),
            "run_argv": " ".join(map(str, status.get("argv", []))) or "not recorded",
            "status_json": status.get("path", "not found"), "prediction_files": [str(f) for f in files]}


def import_vlmevalkit(pred_files: Sequence[str | Path], out: str | Path, export: str | Path | None = None,
                      model: str | None = None) -> ResultStore:
    """The result store of VLMEvalKit prediction files of an exported grid (module docstring): one row per
    prediction, scored by the study; ``model`` names the run (default: the export's ``--model``); ``export``: the
    folder the export wrote (default: ``$LMUData``, where VLMEvalKit read the TSVs). The store's manifest declares
    every exported request, so ``mmfragile merge STORE`` lists what the run left out."""
    folder = _export_folder(export)
    man = read_manifest(folder)
    if man.get("harness") != HARNESS:
        raise HarnessError(f"{folder / MANIFEST}: written by `mmfragile export {str(man.get('harness')).lower()}`, "
                           "not `export vlmevalkit`")
    names = list(man["datasets"])
    files = prediction_files(pred_files, names)
    scored: list[tuple[dict, str]] = []
    read_from: dict[str, Path] = {}
    harness_models = []
    for f in files:
        name = _name_of(f, names)
        if name is None:
            raise HarnessError(f"{f}: not a prediction file of this export (<model>_<dataset>.xlsx, dataset one of "
                               f"{', '.join(names)})")
        if name in read_from:
            raise HarnessError(f"{f}: predictions of {name} were already read from {read_from[name]}; import one "
                               "run's file per dataset")
        read_from[name] = f
        harness_models.append(f.stem[:-len(name) - 1])
        scored += _joined(f, read_predictions(f), read_jsonl(folder / man["datasets"][name]["data"]))
    return write_store(out, man, scored, model, _provenance(files, harness_models),
                       exported_rows(folder, man["datasets"]), "vlmevalkit-export")
