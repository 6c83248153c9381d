"""lm-evaluation-harness bridge: a study's grid of text-only questions as an lm-eval task group, and lm-eval's
sample logs back as a result store.

lm-eval (EleutherAI's ``lm_eval``) runs language models on text: the export refuses a grid whose items carry
images (easy-VQA, synthetic-vqa's image questions ...) with a one-line reason; use a text-only dataset
(``synthetic-text``, or ``generic:<file>`` / a benchmark whose questions have no images).

Export (:func:`export_lm_eval`) writes one folder, run with ``lm_eval --include_path DIR --tasks GROUP``:

* ``GROUP.yaml`` - the group, one task per prompt variant (format) and answer budget;
* ``TASK.yaml`` - lm-eval's task config: ``dataset_path: json`` over the task's data file, ``generate_until``,
  greedy, ``max_gen_toks`` = the variant's answer budget and ``until: []`` (no stop strings of the task: the
  model's own end of turn - its ``generation_config`` eos list, and the tokenizer's eos lm-eval adds - ends the
  answer, as in mmfragile), the hooks of ``utils.py``;
* ``data/TASK.jsonl`` - one row per request (every circular shift is a row) carrying mmfragile's keys, the user
  text as mmfragile renders it before the chat template, option IDs, answer ID and budget (the columns of
  :func:`mmfragile.harness.common.item_row`);
* ``utils.py`` - ``doc_to_text`` / ``doc_to_target`` and ``process_results``, which scores with the study's own
  score function (study 1: exact match; study 2: the first stage of the two-stage extraction, the raw response kept
  for the second, which ``mmfragile run promptception --extractor`` runs on the imported store; mmfragile is
  installed in lm-eval's venv: ``scripts/install_lm_eval.sh``);
* ``mmfragile_export.json`` - the study, model, dataset, parameters and the config of the native store.

Run it with ``--apply_chat_template`` (the user text goes through the tokenizer's chat template, as mmfragile's
backends send it) and ``--log_samples``. lm-eval writes ``OUTPUT/<model>/results_<date>.json`` and one
``samples_<task>_<date>.jsonl`` per task; each sample line logs ``doc_id``, the whole ``doc`` (the exported row),
``arguments`` (the templated prompt), ``resps`` / ``filtered_resps`` and the task's metrics. Import
(:func:`import_lm_eval`) joins each line to its task's data file on ``doc_id``, checks that the logged ``doc`` is
that row (keys and prompt; a line that does not match is an error naming file and line) and scores the raw output
with the study's score function into a store with the native config.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from mmfragile.harness.common import (ITEM_COLUMNS, METRICS_YAML, TASK_HEAD_YAML, HarnessError, import_samples,
                                      study_grid, utils_module, write_export)
from mmfragile.store import ResultStore

HARNESS = "lm-eval"
#: Studies whose grid lm-eval can run: their (first-stage) score function is a pure function of the raw output.
STUDIES = ("format-bias", "promptception")

UTILS = utils_module(HARNESS)

TASK_YAML = TASK_HEAD_YAML.replace("{harness}", HARNESS) + """\
# greedy, the variant's answer budget as mmfragile sets it (study 1: the longest option ID in tokens, Sec. A.4;
# study 2: --max-new-tokens); no stop strings of the task (until: []): the model's own end of turn ends the
# answer, as in mmfragile
generation_kwargs:
  until: []
  max_gen_toks: {max_new_tokens}
  do_sample: false
  temperature: 0.0
""" + METRICS_YAML


# ============================================================================================== export
def export_lm_eval(study: str, model: str, dataset: str, out: str | Path, n: int | None = None,
                   **params: Any) -> dict[str, Any]:
    """Write the lm-eval task group of ``study``'s grid (module docstring); returns the manifest written.
    ``model`` is the checkpoint whose tokenizer sizes each variant's answer budget and that names the imported
    store (what ``run_study``'s ``model`` is); ``params``: the study's parameters (``formats`` ...). A grid with
    images is refused (lm-eval runs text)."""
    grid = study_grid(study, model, dataset, n, params, "lm-eval", STUDIES)
    with_images = [it for it in grid.items if it.prompt.images]
    if with_images:
        it = with_images[0]
        raise ValueError(f"export lm-eval: {dataset} has questions with images ({len(with_images)} of "
                         f"{len(grid.items)} requests, e.g. {it.key['question_id']}) and lm-eval runs text only: "
                         "use a text-only dataset (--dataset synthetic-text, or a generic:<file> without images), "
                         "or lmms-eval for images (export lmms-eval)")
    return write_export(HARNESS, grid, dataset, n, out, lambda task, rows, data: TASK_YAML.format(
        what=f"study {study}, variant {rows[0]['variant'].split('|')[0]}, {len(rows)} requests",
        task=task, data=json.dumps(str(data)), max_new_tokens=rows[0]["max_new_tokens"]), UTILS)


def run_hint(manifest: dict[str, Any], out: str | Path) -> str:
    """What the export holds and the lm-eval command that runs it."""
    rows = sum(t["rows"] for t in manifest["tasks"].values())
    return (f"{out}: group {manifest['group']}, {len(manifest['tasks'])} tasks, {rows} requests\n"
            f"run: lm_eval --model hf --model_args pretrained=CHECKPOINT --device cpu --apply_chat_template "
            f"--include_path {out} --tasks {manifest['group']} --log_samples --output_path RUN_DIR (--model "
            "hf-multimodal for a LLaVA / zoo checkpoint)")


# ============================================================================================== import
#: ``samples_<task>_<date>.jsonl``: the date is ``datetime.now().isoformat()`` with ``:`` as ``-``
#: (lm_eval/loggers/evaluation_tracker.py)
SAMPLES = re.compile(r"samples_(?P<task>.+)_(?P<date>\d{4}-\d\d-\d\dT[\d.-]+)\.jsonl")


def task_of(path: Path) -> str:
    m = SAMPLES.fullmatch(path.name)
    if not m:
        raise HarnessError(f"{path}: not an lm-eval sample log (samples_<task>_<date>.jsonl)")
    return m["task"]


def _check(s: Mapping[str, Any], row: Mapping[str, Any], where: str) -> None:
    """lm-eval logs the whole doc: it must be the exported row (its keys and prompt)."""
    doc = s.get("doc")
    if not isinstance(doc, dict):
        raise HarnessError(f"{where}: no logged doc (lm-eval's sample line has one): not an lm-eval sample log")
    for col in ("question_id", "variant", *ITEM_COLUMNS):
        if col in doc and doc[col] != row.get(col):
            raise HarnessError(f"{where}: the logged doc's {col} is not the exported row's of doc_id {s['doc_id']} "
                               f"({row['question_id']}, {row['variant']}): the run used another export")


def import_lm_eval(run_dirs: Sequence[str | Path], out: str | Path, export: str | Path | None = None,
                   model: str | None = None) -> ResultStore:
    """The result store of lm-eval runs of exported task groups (module docstring): one row per logged sample, scored
    by the study, every exported request declared (:func:`mmfragile.harness.common.import_samples`); ``model``
    names the run (default: the export's ``--model``)."""
    return import_samples(HARNESS, run_dirs, out, export, model=model, logs="samples_*.jsonl",
                          results="results_*.json", hint="run lm_eval with --log_samples --output_path DIR",
                          task_of=task_of, check=_check, version_key="lm_eval_version",
                          harness_model="config.model", model_args="config.model_args", device="config.device",
                          transformers_version="transformers_version", chat_template_sha="chat_template_sha")
