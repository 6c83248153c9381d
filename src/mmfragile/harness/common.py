"""What every harness bridge shares: a study's grid as the rows mmfragile would send (export), and a result store
in the native layout built from another tool's raw outputs (import).

Export builds the items with the study's own stage (``Stage.items``: the same prompts, option IDs, answer IDs and
per-item answer budgets as ``run_study``), so only the model call moves to the other tool; import scores the
other tool's raw outputs with the study's own ``score`` function and writes a :class:`~mmfragile.store.ResultStore`
with the config a native run of the same study, model, dataset and ``n`` writes - ``mmfragile report`` reads it
unchanged. The option logits (study 1's confidence analysis) are not in any harness' logs and stay absent.
"""
from __future__ import annotations

import importlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from mmfragile.models.base import Prompt
from mmfragile.runner import EvalItem
from mmfragile.store import ResultStore

#: The file an export writes beside its tasks: study, model, dataset, the native store config, task -> data file.
MANIFEST = "mmfragile_export.json"
#: Columns of an exported data row besides the item's key (what import rebuilds the item from); a study's own item
#: class adds its fields (Promptception's ``question`` and ``options``, which its score function reads).
ITEM_COLUMNS = ("prompt", "images", "option_ids", "answer_id", "max_new_tokens")
_EVAL_ITEM_FIELDS = {f.name for f in fields(EvalItem)}


class HarnessError(ValueError):
    """A harness file that cannot be read back (names the file, line and what to do)."""


class TokenBudget:
    """What the grid's item builder asks of a model before it runs - the token length of the longest option ID
    (Sec. A.4), its spec (Promptception's answer formats follow the backend) - answered from the checkpoint's
    tokenizer alone, so exporting loads no weights. The harness shows the images: ``supports_images``."""

    supports_images = True

    def __init__(self, spec):
        from transformers import AutoTokenizer

        folder = spec.checkpoint_dir()
        if folder is None:
            raise ValueError(f"--model {spec}: no local checkpoint folder whose tokenizer sizes the answer budget; "
                             "pass a checkpoint folder, zoo or embedded model name")
        self.name = spec.name
        self.spec = spec
        self.folder = folder
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))

    def max_id_tokens(self, ids: Sequence[str]) -> int:
        return max(len(self.tokenizer(i, add_special_tokens=False)["input_ids"]) for i in ids)

    def stop_strings(self) -> list[str]:
        """The text of every token that ends the model's turn (``generation_config.eos_token_id``, which may list
        more than the tokenizer's ``eos_token``: Gemma-3's ``<end_of_turn>``) - where mmfragile's generation stops."""
        from transformers import GenerationConfig

        try:
            eos = GenerationConfig.from_pretrained(str(self.folder)).eos_token_id
        except OSError:  # no generation_config.json: the tokenizer's eos is the only stop
            eos = None
        ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        found = [t for t in self.tokenizer.convert_ids_to_tokens(ids) if t]
        return list(dict.fromkeys([*found, *([self.tokenizer.eos_token] if self.tokenizer.eos_token else [])]))


@dataclass
class StudyGrid:
    """A study's grid stage for one model, dataset and ``n``: its items, the native store config and run_info."""

    study: str
    stage: Any
    params: dict[str, Any]
    model: str
    items: list[EvalItem]
    config: dict[str, Any]
    run_info: dict[str, Any]
    provenance: dict[str, Any]
    stop_strings: list[str]
    checkpoint: Path
    eos_token: str | None

    def manifest(self, harness: str, dataset: str, n: int | None, **extra: Any) -> dict[str, Any]:
        """The export's :data:`MANIFEST`: what import and the exported scoring hooks rebuild the study from."""
        cls = type(self.items[0]) if self.items else EvalItem
        return {"harness": harness, "study": self.study, "stage": self.stage.name, "model": self.model,
                "dataset": dataset, "n": n, "params": jsonable(self.params),
                "config": self.config, "run_info": self.run_info, "provenance": self.provenance,
                "item_class": f"{cls.__module__}:{cls.__qualname__}", "stop_strings": self.stop_strings, **extra}


#: The head of an exported task's YAML, in the lm-eval dialect lmms-eval shares (``{harness}`` filled by the
#: bridge, the rest per task): the task, its data file, free generation, the hooks of the export's ``utils.py``.
TASK_HEAD_YAML = """# written by `mmfragile export {harness}`: {what}
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: !function utils.doc_to_text
doc_to_target: !function utils.doc_to_target
process_results: !function utils.process_results
"""


#: The metrics every exported task reports (its ``process_results``: :func:`task_hooks`), in lm-eval's YAML.
METRICS_YAML = """metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
  - metric: coverage
    aggregation: mean
    higher_is_better: true
metadata:
  version: 0.0
"""


def study_grid(study: str, model: str, dataset: str, n: int | None, params: Mapping[str, Any],
               harness: str = "", supported: Sequence[str] | None = None) -> StudyGrid:
    """The items ``run_study(study, model, dataset, n=n, **params)`` would evaluate in its grid stage; a study
    the ``harness`` bridge cannot run (not in ``supported``) is refused first."""
    if supported is not None and study not in supported:
        raise ValueError(f"export {harness}: study {study!r} is not supported (supported: {', '.join(supported)})")
    from mmfragile.models.spec import as_spec
    from mmfragile.provenance import run_provenance
    from mmfragile.study import RunContext, get_study

    st = get_study(study)
    spec = as_spec(model)
    ctx = RunContext(st, spec, spec.name, dataset, n, Path("."), st.resolve(dict(params)))
    ctx.data = st.load(ctx)
    stage = st.stages[0]
    resolved = {**ctx.params, "budgeted": False}
    budget = TokenBudget(spec)
    items = stage.items(budget, stage.units(ctx), resolved, None)
    for it in items:
        if it.request != "generate" or it.prompt.system or it.prompt.assistant_prefix:
            raise ValueError(f"{study}: item {it.key['variant']} needs a system prompt, assistant prefix or a "
                             "non-generate request, which a harness' task cannot express")
    return StudyGrid(st.name, stage, resolved, spec.name, items, stage.config(ctx), dict(ctx.run_info),
                     run_provenance(str(spec), spec.checkpoint_dir(), dataset), budget.stop_strings(),
                     Path(budget.folder), budget.tokenizer.eos_token)


def _extra_fields(cls: type) -> list[str]:
    return [f.name for f in fields(cls) if f.name not in _EVAL_ITEM_FIELDS]


def eos_view(grid: StudyGrid, out: Path) -> Path | None:
    """A view of the checkpoint whose tokenizer's ``eos_token`` is the end of the model's turn, for harness model
    classes that stop only at ``tokenizer.eos_token_id`` and decode with the special tokens skipped (lmms-eval's
    ``llava_hf`` and ``huggingface``): past Gemma-3's ``<end_of_turn>`` they generate on, and the text after it
    cannot be told apart. Every file is a link to the checkpoint's except ``tokenizer_config.json``; None when the
    tokenizer's eos already ends the turn or no answer has more than one token (nothing to stop)."""
    turn = [t for t in grid.stop_strings if t != grid.eos_token]
    if not turn or all(it.max_new_tokens <= 1 for it in grid.items):
        return None
    view = out / "checkpoint"
    view.mkdir(parents=True, exist_ok=True)
    for f in grid.checkpoint.iterdir():
        if f.name != "tokenizer_config.json" and not (view / f.name).exists():
            (view / f.name).symlink_to(f.resolve())
    cfg = json.loads((grid.checkpoint / "tokenizer_config.json").read_text())
    (view / "tokenizer_config.json").write_text(json.dumps({**cfg, "eos_token": turn[0]}, indent=2))
    return view


def item_row(item: EvalItem) -> dict[str, Any]:
    """One exported data row: the item's key columns plus the user text before the chat template, the image paths,
    option IDs, answer ID, answer budget and the fields of the study's own item class."""
    return {**item.key, "prompt": item.prompt.text, "images": [str(Path(p).resolve()) for p in item.prompt.images],
            "option_ids": list(item.option_ids), "answer_id": item.answer_id, "max_new_tokens": item.max_new_tokens,
            **{f: getattr(item, f) for f in _extra_fields(type(item))}}


def item_class(manifest: Mapping[str, Any]) -> type:
    """The study's item class an export recorded (``module:QualName``; exports before it: :class:`EvalItem`)."""
    module, _, name = manifest.get("item_class", "mmfragile.runner:EvalItem").partition(":")
    return getattr(importlib.import_module(module), name)


def row_item(row: Mapping[str, Any], cls: type = EvalItem) -> EvalItem:
    """The item (of the study's class ``cls``) back from an exported row: what the study's score function takes."""
    extra = _extra_fields(cls)
    key = {k: v for k, v in row.items() if k not in ITEM_COLUMNS and k not in extra}
    return cls(key=key, prompt=Prompt(text=row["prompt"], images=list(row["images"])),
               option_ids=list(row["option_ids"]), answer_id=row["answer_id"],
               max_new_tokens=int(row["max_new_tokens"]), **{f: row[f] for f in extra})


def until_stop(raw: str, stops: Sequence[str]) -> str:
    """``raw`` up to the first of the model's end-of-turn strings: a harness that stops only at the tokenizer's
    ``eos`` (lmms-eval's ``llava_hf``) runs on past Gemma-3's ``<end_of_turn>``; greedy decoding makes the text
    before it the text mmfragile's generation, which stops there, returns."""
    cut = min((i for i in (raw.find(s) for s in stops if s) if i >= 0), default=len(raw))
    return raw[:cut]


def scorer(manifest: Mapping[str, Any]) -> tuple[type, Callable[[str, EvalItem], dict[str, Any]]]:
    """(the study's item class, ``score(raw, item) -> columns``): the study's own score function of the exported
    stage, for a harness' raw output on an exported row's item (:func:`row_item`) - what import stores and the
    exported ``process_results`` reports."""
    from mmfragile.study import get_study

    return item_class(manifest), get_study(manifest["study"]).stage(manifest["stage"]).scorer(manifest["params"])


def task_hooks(manifest_file: str | Path) -> tuple[Callable, ...]:
    """``doc_to_visual``, ``doc_to_text``, ``doc_to_target``, ``process_results`` of an exported task group (what
    its ``utils.py`` binds; :func:`utils_module`): the exported row's images, prompt and answer ID, and the study's
    own scoring of the response cut at the model's end of turn (format-bias: exact match, Sec. A.3; promptception:
    the first, model-free stage of the answer extraction, App. E), reported as ``exact_match`` and ``coverage``."""
    manifest = json.loads(Path(manifest_file).read_text())
    (cls, score), stops = scorer(manifest), manifest.get("stop_strings", [])

    def doc_to_visual(doc):
        from PIL import Image

        return [Image.open(p).convert("RGB") for p in doc["images"]]

    def doc_to_text(doc, lmms_eval_specific_kwargs=None):
        return doc["prompt"]

    def doc_to_target(doc):
        return doc["answer_id"]

    def process_results(doc, results):
        scored = score(until_stop(results[0], stops), row_item(doc, cls))
        return {"exact_match": float(scored["correct"]), "coverage": float(scored["covered"])}

    return doc_to_visual, doc_to_text, doc_to_target, process_results


def utils_module(harness: str) -> str:
    """The ``utils.py`` of an export: the hooks of :func:`task_hooks` bound to the manifest beside it."""
    return (f'"""{harness} hooks of a task group written by `mmfragile export {harness}` (re-export rather than edit):\n'
            "mmfragile's prompts and scoring (mmfragile.harness.common.task_hooks) - install mmfragile in the\n"
            f'harness\' venv (scripts/install_{harness.replace("-", "_")}.sh does)."""\n'
            "from pathlib import Path\n\nfrom mmfragile.harness.common import task_hooks\n\n"
            "doc_to_visual, doc_to_text, doc_to_target, process_results = task_hooks(\n"
            '    Path(__file__).with_name("mmfragile_export.json"))\n')


def slug(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", str(text)).strip("_").lower()


def group_name(study: str, dataset: str) -> str:
    """The task group an export writes: ``mmfragile_<study>_<dataset>``."""
    return f"mmfragile_{slug(study)}_{slug(dataset)}"


def jsonable(params: Mapping[str, Any]) -> dict:
    return json.loads(json.dumps(params, default=str))


def task_rows(group: str, items: Sequence[EvalItem]) -> dict[str, list[dict]]:
    """The exported rows by task: one task per prompt variant (without its shift) and answer budget - a harness'
    generation settings are per task - named ``<group>_<variant>`` (``..._t<budget>`` for a budget over one)."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for it in items:
        name = f"{group}_{slug(it.key['variant'].split('|')[0])}"
        by_task[f"{name}_t{it.max_new_tokens}" if it.max_new_tokens > 1 else name].append(item_row(it))
    return dict(sorted(by_task.items()))


def write_export(harness: str, grid: StudyGrid, dataset: str, n: int | None, out: str | Path,
                 task_yaml: Callable[[str, list[dict], Path], str], utils: str, **extra: Any) -> dict[str, Any]:
    """Write a harness' task group of ``grid`` into ``out``: ``data/TASK.jsonl`` (:func:`task_rows`), ``TASK.yaml``
    (``task_yaml(task, rows, data file)``), ``GROUP.yaml``, ``utils.py`` (``utils``) and the manifest
    (:data:`MANIFEST`: study, model, dataset, ``n``, parameters, the native store's config, task -> data file,
    ``extra``); returns the manifest."""
    out = Path(out).resolve()
    (out / "data").mkdir(parents=True, exist_ok=True)
    group = group_name(grid.study, dataset)
    tasks = {}
    for task, rows in task_rows(group, grid.items).items():
        data = out / "data" / f"{task}.jsonl"
        write_jsonl(data, rows)
        (out / f"{task}.yaml").write_text(task_yaml(task, rows, data))
        tasks[task] = {"data": f"data/{task}.jsonl", "rows": len(rows), "max_new_tokens": rows[0]["max_new_tokens"]}
    (out / f"{group}.yaml").write_text(f"group: {group}\ntask:\n" + "".join(f"- {t}\n" for t in tasks))
    (out / "utils.py").write_text(utils)
    manifest = grid.manifest(harness, dataset, n, group=group, tasks=tasks, **extra)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, record) of each non-blank line; a line that is no JSON is a :class:`HarnessError` naming it."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as e:
                    raise HarnessError(f"{path}:{line_no}: not a JSON line ({e.msg})") from None


def read_jsonl(path: Path) -> list[dict]:
    return [rec for _, rec in iter_jsonl(path)]


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise HarnessError(f"{folder}: no {MANIFEST}; pass the folder `mmfragile export` wrote (--export DIR)")
    return json.loads(path.read_text())


def find_files(run_dirs: Sequence[str | Path], pattern: str, harness: str, hint: str) -> list[Path]:
    """Every file matching ``pattern`` under the run folders (or the files themselves); none is an error."""
    files: list[Path] = []
    for d in map(Path, run_dirs):
        if d.is_file():
            files.append(d)
        elif d.is_dir():
            files += sorted(d.rglob(pattern))
        else:
            raise HarnessError(f"{d}: no such {harness} output folder or sample file")
    if not files:
        raise HarnessError(f"no {pattern} under {', '.join(map(str, run_dirs))}: {hint}")
    return files


def read_results(run_dirs: Sequence[str | Path], pattern: str) -> list[dict]:
    """The harness' aggregated results files of the runs (model, model_args, version and each task's config),
    each with its ``path``."""
    out = []
    for d in map(Path, run_dirs):
        for f in sorted((d if d.is_dir() else d.parent).rglob(pattern)):
            out.append({"path": f, **json.loads(f.read_text())})
    return out


def export_folder(task: str, results: Sequence[Mapping], export: Path | None, samples: Path) -> Path:
    """The export folder of ``task``: ``export`` if given, else the folder whose data file a results file's
    ``configs.<task>.dataset_kwargs.data_files.test`` names (``data/TASK.jsonl`` beside the manifest)."""
    if export is not None:
        return export
    for res in results:
        files = (res.get("configs", {}).get(task, {}).get("dataset_kwargs") or {}).get("data_files") or {}
        test = files.get("test") if isinstance(files, dict) else None
        if isinstance(test, str) and (Path(test).parent.parent / MANIFEST).is_file():
            return Path(test).parent.parent
    raise HarnessError(f"{samples}: cannot find the export of task {task!r} (no results file naming a data file "
                       "beside mmfragile_export.json); pass --export DIR, the folder `mmfragile export` wrote")


#: A harness' check of one logged sample against its exported row: raises :class:`HarnessError` (``where`` is
#: ``file:line``) when the sample is not that row's request.
SampleCheck = Callable[[Mapping[str, Any], Mapping[str, Any], str], None]


def joined(samples: Path, rows: Sequence[dict], check: SampleCheck) -> Iterable[tuple[dict, str]]:
    """(exported row, raw output) per sample line, joined on ``doc_id``; a line whose ``doc_id`` is not a row or
    was logged before, that ``check`` rejects or whose ``filtered_resps`` is not one text is an error."""
    seen: dict[int, int] = {}
    for line_no, s in iter_jsonl(samples):
        where = f"{samples}:{line_no}"
        doc_id = s.get("doc_id") if isinstance(s, dict) else None
        if not isinstance(doc_id, int) or isinstance(doc_id, bool) or not 0 <= doc_id < len(rows):
            raise HarnessError(f"{where}: doc_id {doc_id!r} is not a row of the task's data file "
                               f"({len(rows)} rows): was the task re-exported after this run?")
        if doc_id in seen:
            raise HarnessError(f"{where}: doc_id {doc_id} already logged on line {seen[doc_id]}")
        seen[doc_id] = line_no
        check(s, rows[doc_id], where)
        yield rows[doc_id], raw_response(s.get("filtered_resps"), where)


def raw_response(resp: Any, where: str) -> str:
    while isinstance(resp, list) and len(resp) == 1:  # one response per doc, nested once or twice
        resp = resp[0]
    if not isinstance(resp, str):
        raise HarnessError(f"{where}: filtered_resps {resp!r} is not one generated text")
    return resp


def harness_provenance(harness: str, results: Sequence[Mapping], files: Sequence[Path], version_key: str,
                       **entries: str) -> dict[str, Any]:
    """What a run of ``harness`` records of itself: its version (``results[version_key]``), the ``entries``
    (store key -> dotted key in the results file: ``config.model`` for the model class, ``config.model_args`` ...)
    and the files read."""
    def get(res: Mapping, dotted: str) -> str:
        for part in dotted.split("."):
            res = res.get(part, {}) if isinstance(res, Mapping) else {}
        return "not recorded" if res in ({}, None) else str(res)

    first = results[0] if results else {}
    return {"harness": harness, "harness_version": get(first, version_key) if results
            else "not recorded: no results file",
            **{k: get(first, v) for k, v in entries.items()},
            "results_json": [str(r["path"]) for r in results], "sample_logs": [str(f) for f in files]}


def import_samples(harness: str, run_dirs: Sequence[str | Path], out: str | Path, export: str | Path | None, *,
                   model: str | None, logs: str, results: str, hint: str, task_of: Callable[[Path], str],
                   check: SampleCheck, version_key: str, **entries: str) -> ResultStore:
    """The result store of a harness' runs of exported tasks: one row per line of the sample logs under
    ``run_dirs`` (files matching ``logs``, each of task ``task_of(file)``; none: an error ending in ``hint``), joined
    to its task's data file (:func:`joined`, ``check``) and scored by the study (:func:`write_store`); ``model``
    names the run (default: the export's ``--model``). Provenance: :func:`harness_provenance` of the results files
    matching ``results`` (``version_key``, ``entries``). The store's manifest declares every exported request, so
    ``mmfragile merge STORE`` lists what the runs left out (``--limit``)."""
    files = find_files(run_dirs, logs, harness, hint)
    found = read_results(run_dirs, results)
    export = None if export is None else Path(export)
    manifests: dict[Path, dict] = {}
    scored: list[tuple[dict, str]] = []
    for f in files:
        task = task_of(f)
        folder = export_folder(task, found, export, f)
        man = manifests.setdefault(folder, read_manifest(folder))
        if task not in man["tasks"]:
            raise HarnessError(f"{f}: task {task!r} is not in {folder / MANIFEST} (tasks: {', '.join(man['tasks'])})")
        scored += joined(f, read_jsonl(folder / man["tasks"][task]["data"]), check)
    man = one_manifest(manifests)
    return write_store(out, man, scored, model, harness_provenance(harness, found, files, version_key, **entries),
                       exported_rows(next(iter(manifests)), man["tasks"]), f"{harness}-export")


def one_manifest(manifests: Mapping[Path, dict]) -> dict:
    first, *rest = manifests.items()
    for folder, man in rest:
        if man["config"] != first[1]["config"]:
            raise HarnessError(f"{folder}: exported for {man['config']}, but {first[0]} for {first[1]['config']}: "
                               "import runs of one export (one store per study, model, dataset) at a time")
    return first[1]


def exported_rows(folder: Path, entries: Mapping[str, Mapping[str, Any]]) -> list[dict]:
    """Every row an export wrote: the data files (``data``) of its ``entries`` (tasks, datasets) under ``folder``."""
    return [r for e in entries.values() for r in read_jsonl(Path(folder) / e["data"])]


def write_store(out: str | Path, manifest: Mapping[str, Any], scored: Sequence[tuple[dict, str]], model: str | None,
                provenance: Mapping[str, Any], exported: Sequence[Mapping[str, Any]], label: str) -> ResultStore:
    """The result store of ``scored`` = (exported row, raw output) pairs: every output cut at the model's end of
    turn (:func:`until_stop`; the provenance counts the outputs cut) and scored by the study's own score function,
    under the config of a native run (``model`` names the run as ``--model`` would; default: the export's). The
    store's manifest (``label``) declares every ``exported`` request, so ``mmfragile merge STORE`` lists what the
    harness' run left out."""
    from mmfragile.study import get_study, tag

    model = model or manifest["model"]
    study = get_study(manifest["study"])
    stage = study.stage(manifest["stage"])
    cls, score = scorer(manifest)
    config = {**manifest["config"], **tag(study, stage), "model": model}   # tagged as run_study tags its stores
    store = ResultStore(out, config=config, run_info=manifest["run_info"] or None)
    if len(store):
        raise HarnessError(f"{out}: the store already holds {len(store)} rows; import into a new folder")
    stops = manifest.get("stop_strings", [])
    cut = [(row, until_stop(raw, stops)) for row, raw in scored]
    n_cut = sum(len(raw) != len(kept) for (_, raw), (_, kept) in zip(scored, cut))
    # the checkpoint and dataset hashes of the export's model, then what the harness ran
    store.merge_run_info("provenance", {model: {**manifest.get("provenance", {}), **provenance,
                                                "cut_at_end_of_turn": {"strings": stops, "responses": n_cut}}})
    rows = []
    for row, raw in cut:
        it = row_item(row, cls)
        rows.append({"model": model, **it.key, "raw_output": raw, "option_ids": list(it.option_ids),
                     "answer_id": it.answer_id, **score(raw, it)})
    store.append(rows)
    store = ResultStore(store.root)
    store.declare([{"model": model, **{k: r[k] for k in ("dataset", "question_id", "variant")}} for r in exported],
                  label=label)
    return store
