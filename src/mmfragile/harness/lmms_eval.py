"""lmms-eval bridge: a study's grid as an lmms-eval task group, and lmms-eval's sample logs back as a result store.

Export (:func:`export_lmms_eval`) writes one folder, run with ``lmms-eval --include_path DIR --tasks GROUP``:

* ``GROUP.yaml`` - the group, one task per prompt variant (format) and answer budget;
* ``TASK.yaml`` - lmms-eval's task config (``dataset_path: json`` over the task's data file, greedy
  ``generate_until``, ``max_new_tokens`` = the variant's answer budget, the hooks of ``utils.py``);
* ``data/TASK.jsonl`` - one row per request (every circular shift is a row) carrying mmfragile's keys (dataset,
  question_id, variant, format factors, shift ...), the user text as mmfragile renders it before the chat template,
  the image paths, option IDs, answer ID and budget;
* ``utils.py`` - ``doc_to_visual`` / ``doc_to_text`` / ``doc_to_target`` and ``process_results``, which scores
  with the exported stage's own score function (study 1: exact match; mmfragile installed in lmms-eval's venv:
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
from pathlib import Path
from typing import Any, Mapping, Sequence

from mmfragile.harness.common import (METRICS_YAML, TASK_HEAD_YAML, HarnessError, eos_view, import_samples, study_grid,
                                      utils_module, write_export)
from mmfragile.store import ResultStore

HARNESS = "lmms-eval"
#: Studies whose grid lmms-eval can run: their (first-stage) score function is a pure function of the raw output.
STUDIES = ("format-bias", "promptception")

UTILS = utils_module(HARNESS)

TASK_YAML = TASK_HEAD_YAML.replace("{harness}", HARNESS) + """\
doc_to_visual: !function utils.doc_to_visual
# greedy, mmfragile's answer budget; `until`: the checkpoint's end-of-turn tokens. llava_hf ignores `until` and
# stops only at tokenizer.eos_token_id (Gemma-3 runs on past <end_of_turn>): process_results and
# `mmfragile import lmms-eval` cut each response at the first of them, where mmfragile's generation stops.
generation_kwargs:
  max_new_tokens: {max_new_tokens}
  until: {until}
  temperature: 0
  do_sample: false
  num_beams: 1
""" + METRICS_YAML


# ============================================================================================== export
def export_lmms_eval(study: str, model: str, dataset: str, out: str | Path, n: int | None = None,
                     **params: Any) -> dict[str, Any]:
    """Write the lmms-eval task group of ``study``'s grid (module docstring); returns the manifest written.
    ``model`` is the checkpoint whose tokenizer sizes each variant's answer budget and that names the imported
    store (what ``run_study``'s ``model`` is); ``params``: the study's parameters (``formats`` ...)."""
    grid = study_grid(study, model, dataset, n, params, "lmms-eval", STUDIES)
    out = Path(out).resolve()
    view = eos_view(grid, out)  # before the manifest, which names the checkpoint lmms-eval is to run
    return write_export(HARNESS, grid, dataset, n, out, lambda task, rows, data: TASK_YAML.format(
        what=f"study {study}, variant {rows[0]['variant'].split('|')[0]}, {len(rows)} requests",
        task=task, data=json.dumps(str(data)), max_new_tokens=rows[0]["max_new_tokens"],
        until=json.dumps(grid.stop_strings)), UTILS, checkpoint=str(view or grid.checkpoint))


def run_hint(manifest: dict[str, Any], out: str | Path) -> str:
    """What the export holds and the lmms-eval command that runs it (the checkpoint the export names)."""
    rows = sum(t["rows"] for t in manifest["tasks"].values())
    return (f"{out}: group {manifest['group']}, {len(manifest['tasks'])} tasks, {rows} requests\n"
            f"run: lmms-eval --model llava_hf --model_args pretrained={manifest['checkpoint']},device_map=cpu "
            f"--include_path {out} --tasks {manifest['group']} --log_samples --output_path RUN_DIR")


# ============================================================================================== import
def task_of(path: Path) -> str:
    name = path.name
    if "_samples_" not in name or not name.endswith(".jsonl"):
        raise HarnessError(f"{path}: not an lmms-eval sample log (<date>_samples_<task>.jsonl)")
    return name.split("_samples_", 1)[1][:-len(".jsonl")]


def _check(s: Mapping[str, Any], row: Mapping[str, Any], where: str) -> None:
    """lmms-eval logs the user text as ``input``: it must be the exported prompt."""
    if "input" in s and s["input"] != row["prompt"]:
        raise HarnessError(f"{where}: the logged input is not the exported prompt of doc_id {s['doc_id']} "
                           f"({row['question_id']}, {row['variant']}): the run used another export")


def import_lmms_eval(run_dirs: Sequence[str | Path], out: str | Path, export: str | Path | None = None,
                     model: str | None = None) -> ResultStore:
    """The result store of lmms-eval runs of exported task groups (module docstring): one row per logged sample, scored
    by the study, every exported request declared (:func:`mmfragile.harness.common.import_samples`); ``model``
    names the run (default: the export's ``--model``)."""
    return import_samples(HARNESS, run_dirs, out, export, model=model, logs="*_samples_*.jsonl",
                          results="*results*.json", hint="run lmms_eval with --log_samples --output_path DIR",
                          task_of=task_of, check=_check, version_key="lmms_eval_version",
                          harness_model="config.model", harness_model_backend="config.model_backend",
                          model_args="config.model_args")
