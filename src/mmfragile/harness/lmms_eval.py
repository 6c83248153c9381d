"""lmms-eval bridge: a study's grid as an lmms-eval task group, and lmms-eval's sample logs back as a result store.

Export (:func:`export_lmms_eval`) writes one folder, run with ``lmms-eval --include_path DIR --tasks GROUP``:

* ``GROUP.yaml`` - the group, one task per prompt variant (format) and answer budget;
* ``TASK.yaml`` - lmms-eval's task config (``dataset_path: json`` over the task's data file, greedy
  ``generate_until``, ``max_new_tokens`` = the variant's answer budget, the hooks of ``utils.py``);
* ``data/TASK.jsonl`` - one row per request (every circular shift is a row) carrying mmfragile's keys (dataset,
  question_id, variant, format factors, shift ...), the user text as mmfragile renders it before the chat template,
  the image paths, option IDs, answer ID and budget;
* ``utils.py`` - ``doc_to_visual`` / ``doc_to_text`` / ``doc_to_target`` and ``process_results``, which scores
  with mmfragile's own :func:`mmfragile.extraction.score_exact_match` (mmfragile installed in lmms-eval's venv:
  ``scripts/install_lmms_eval.sh``);
* ``mmfragile_export.json`` - the study, model, dataset, parameters and the config of the native store.

lmms-eval's sample log keeps only ``doc_id``, ``target``, ``filtered_resps``, ``input`` (the user text), the
task's metrics: import (:func:`import_lmms_eval`) joins each sample to its task's data file on ``doc_id``, checks
that the logged ``input`` is the exported prompt (a sample that does not match is an error naming file and line)
and scores the raw output with the study's score function into a store with the native config.

The eos trap: lmms-eval's ``llava_hf`` passes ``eos_token_id=tokenizer.eos_token_id`` to ``generate`` (overriding
the checkpoint's ``generation_config``: Gemma-3 ends a turn with ``<end_of_turn>``, not ``<eos>``) and ignores
``until``; with a budget of one token this cannot matter, with more (e.g. roman IDs "III" of two tokens) the answer
runs on past the end of the turn and differs from mmfragile's. The export writes each task's budget; see
docs/harnesses.md.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from mmfragile.harness.common import (MANIFEST, HarnessError, eos_view, item_row, iter_jsonl, read_jsonl, read_manifest,
                                      study_grid, until_stop, write_jsonl, write_store)
from mmfragile.store import ResultStore

HARNESS = "lmms-eval"
#: Studies whose grid lmms-eval can run: their (first-stage) score function is a pure function of the raw output.
STUDIES = ("format-bias", "promptception")

UTILS = '''"""lmms-eval hooks of a task group written by `mmfragile export lmms-eval` (re-export rather than edit).
Scoring is mmfragile's own: the study's score function, rebuilt from mmfragile_export.json beside this file
(exact match for format-bias, Sec. A.3; the first, model-free stage of the answer extraction for promptception,
App. E) - install mmfragile in lmms-eval's venv (scripts/install_lmms_eval.sh does)."""
import json
from pathlib import Path

from PIL import Image

from mmfragile.harness.common import scorer, until_stop

MANIFEST = json.loads(Path(__file__).with_name("mmfragile_export.json").read_text())
SCORE = scorer(MANIFEST)


def doc_to_visual(doc):
    return [Image.open(p).convert("RGB") for p in doc["images"]]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return doc["prompt"]


def doc_to_target(doc):
    return doc["answer_id"]


def process_results(doc, results):
    scored = SCORE(doc, until_stop(results[0], MANIFEST["stop_strings"]))
    return {"exact_match": float(scored["correct"]), "coverage": float(scored["covered"])}
'''

TASK_YAML = """# written by `mmfragile export lmms-eval`: {what}
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_visual: !function utils.doc_to_visual
doc_to_text: !function utils.doc_to_text
doc_to_target: !function utils.doc_to_target
process_results: !function utils.process_results
# greedy, mmfragile's answer budget; `until`: the checkpoint's end-of-turn tokens. llava_hf ignores `until` and
# stops only at tokenizer.eos_token_id (Gemma-3 runs on past <end_of_turn>): process_results and
# `mmfragile import lmms-eval` cut each response at the first of them, where mmfragile's generation stops.
generation_kwargs:
  max_new_tokens: {max_new_tokens}
  until: {until}
  temperature: 0
  do_sample: false
  num_beams: 1
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
  - metric: coverage
    aggregation: mean
    higher_is_better: true
metadata:
  version: 0.0
"""


def _slug(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", str(text)).strip("_").lower()


def group_name(study: str, dataset: str) -> str:
    return f"mmfragile_{_slug(study)}_{_slug(dataset)}"


# ============================================================================================== export
def export_lmms_eval(study: str, model: str, dataset: str, out: str | Path, n: int | None = None,
                     **params: Any) -> dict[str, Any]:
    """Write the lmms-eval task group of ``study``'s grid (module docstring); returns the manifest written.
    ``model`` is the checkpoint whose tokenizer sizes each variant's answer budget and that names the imported
    store (what ``run_study``'s ``model`` is); ``params``: the study's parameters (``formats`` ...)."""
    if study not in STUDIES:
        raise ValueError(f"export lmms-eval: study {study!r} is not supported (supported: {', '.join(STUDIES)})")
    grid = study_grid(study, model, dataset, n, params)
    out = Path(out).resolve()
    (out / "data").mkdir(parents=True, exist_ok=True)
    group = group_name(study, dataset)
    by_task: dict[str, list[dict]] = defaultdict(list)
    for it in grid.items:  # one task per variant and budget: lmms-eval's generation settings are per task
        name = f"{group}_{_slug(it.key['variant'].split('|')[0])}"
        by_task[f"{name}_t{it.max_new_tokens}" if it.max_new_tokens > 1 else name].append(item_row(it))
    tasks = {}
    for task, rows in sorted(by_task.items()):
        data = out / "data" / f"{task}.jsonl"
        write_jsonl(data, rows)
        (out / f"{task}.yaml").write_text(TASK_YAML.format(
            what=f"study {study}, variant {rows[0]['variant'].split('|')[0]}, {len(rows)} requests",
            task=task, data=json.dumps(str(data)), max_new_tokens=rows[0]["max_new_tokens"],
            until=json.dumps(grid.stop_strings)))
        tasks[task] = {"data": f"data/{task}.jsonl", "rows": len(rows), "max_new_tokens": rows[0]["max_new_tokens"]}
    (out / f"{group}.yaml").write_text(f"group: {group}\ntask:\n" + "".join(f"- {t}\n" for t in tasks))
    (out / "utils.py").write_text(UTILS)
    view = eos_view(grid, out)
    manifest = grid.manifest(HARNESS, dataset, n, group=group, tasks=tasks,
                             checkpoint=str(view or grid.checkpoint))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


# ============================================================================================== import
def sample_files(run_dirs: Sequence[str | Path]) -> list[Path]:
    """Every ``*_samples_<task>.jsonl`` under the run folders (or the files themselves)."""
    files: list[Path] = []
    for d in map(Path, run_dirs):
        if d.is_file():
            files.append(d)
        elif d.is_dir():
            files += sorted(d.rglob("*_samples_*.jsonl"))
        else:
            raise HarnessError(f"{d}: no such lmms-eval output folder or sample file")
    if not files:
        raise HarnessError(f"no *_samples_*.jsonl under {', '.join(map(str, run_dirs))}: run lmms_eval with "
                           "--log_samples --output_path DIR")
    return files


def task_of(path: Path) -> str:
    name = path.name
    if "_samples_" not in name or not name.endswith(".jsonl"):
        raise HarnessError(f"{path}: not an lmms-eval sample log (<date>_samples_<task>.jsonl)")
    return name.split("_samples_", 1)[1][:-len(".jsonl")]


def results_files(run_dirs: Sequence[str | Path]) -> list[dict]:
    """The ``*_results.json`` of the runs (model, model_args, version and each task's config)."""
    out = []
    for d in map(Path, run_dirs):
        for f in sorted((d if d.is_dir() else d.parent).rglob("*results*.json")):
            out.append({"path": f, **json.loads(f.read_text())})
    return out


def _export_folder(task: str, results: list[dict], export: Path | None, samples: Path) -> Path:
    if export is not None:
        return export
    for res in results:
        files = (res.get("configs", {}).get(task, {}).get("dataset_kwargs") or {}).get("data_files") or {}
        test = files.get("test") if isinstance(files, dict) else None
        if isinstance(test, str) and (Path(test).parent.parent / MANIFEST).is_file():
            return Path(test).parent.parent
    raise HarnessError(f"{samples}: cannot find the export of task {task!r} (no results.json naming a data file "
                       "beside mmfragile_export.json); pass --export DIR, the folder `mmfragile export` wrote")


def _joined(samples: Path, rows: list[dict]) -> Iterable[tuple[dict, str]]:
    """(exported row, raw output) per sample line; a line that does not match its row is an error."""
    seen: dict[int, int] = {}
    for line_no, s in iter_jsonl(samples):
        where = f"{samples}:{line_no}"
        doc_id = s.get("doc_id")
        if not isinstance(doc_id, int) or not 0 <= doc_id < len(rows):
            raise HarnessError(f"{where}: doc_id {doc_id!r} is not a row of the task's data file "
                               f"({len(rows)} rows): was the task re-exported after this run?")
        if doc_id in seen:
            raise HarnessError(f"{where}: doc_id {doc_id} already logged on line {seen[doc_id]}")
        seen[doc_id] = line_no
        row = rows[doc_id]
        if "input" in s and s["input"] != row["prompt"]:
            raise HarnessError(f"{where}: the logged input is not the exported prompt of doc_id {doc_id} "
                               f"({row['question_id']}, {row['variant']}): the run used another export")
        yield row, _raw(s.get("filtered_resps"), where)


def _raw(resp: Any, where: str) -> str:
    while isinstance(resp, list) and len(resp) == 1:  # lmms-eval flattens one response per doc, not always twice
        resp = resp[0]
    if not isinstance(resp, str):
        raise HarnessError(f"{where}: filtered_resps {resp!r} is not one generated text")
    return resp


def _provenance(results: list[dict], files: list[Path]) -> dict[str, Any]:
    cfg = results[0].get("config", {}) if results else {}
    return {"harness": HARNESS, "harness_version": str(results[0].get("lmms_eval_version", "not recorded"))
            if results else "not recorded: no results.json",
            "harness_model": str(cfg.get("model", "not recorded")),
            "harness_model_backend": str(cfg.get("model_backend", "not recorded")),
            "model_args": str(cfg.get("model_args", "not recorded")),
            "results_json": [str(r["path"]) for r in results], "sample_logs": [str(f) for f in files]}


def import_lmms_eval(run_dirs: Sequence[str | Path], out: str | Path, export: str | Path | None = None,
                     model: str | None = None) -> ResultStore:
    """The result store of lmms-eval runs of exported task groups (module docstring): one row per logged sample,
    scored by the study; ``model`` names the run (default: the export's ``--model``). The store's manifest declares
    every exported request, so ``mmfragile merge STORE`` lists what the runs left out (``--limit``)."""
    files = sample_files(run_dirs)
    results = results_files(run_dirs)
    export = None if export is None else Path(export)
    manifests: dict[Path, dict] = {}
    scored: list[tuple[dict, str]] = []
    for f in files:
        task = task_of(f)
        folder = _export_folder(task, results, export, f)
        man = manifests.setdefault(folder, read_manifest(folder))
        if task not in man["tasks"]:
            raise HarnessError(f"{f}: task {task!r} is not in {folder / MANIFEST} (tasks: {', '.join(man['tasks'])})")
        scored += _joined(f, read_jsonl(folder / man["tasks"][task]["data"]))
    man = _one_manifest(manifests)
    name = model or man["model"]
    stops = man.get("stop_strings", [])
    cut = [(row, until_stop(raw, stops)) for row, raw in scored]
    provenance = {**_provenance(results, files), "cut_at_end_of_turn": {
        "strings": stops, "responses": sum(len(a) != len(b) for (_, a), (_, b) in zip(scored, cut))}}
    store = write_store(out, man, cut, name, provenance)
    all_rows = [r for t in man["tasks"].values() for r in read_jsonl(next(iter(manifests)) / t["data"])]
    store.declare([{"model": name, **{k: r[k] for k in ("dataset", "question_id", "variant")}} for r in all_rows],
                  label="lmms-eval-export")
    return store


def _one_manifest(manifests: dict[Path, dict]) -> dict:
    first, *rest = manifests.items()
    for folder, man in rest:
        if man["config"] != first[1]["config"]:
            raise HarnessError(f"{folder}: exported for {man['config']}, but {first[0]} for {first[1]['config']}: "
                               "import runs of one export (one store per study, model, dataset) at a time")
    return first[1]
