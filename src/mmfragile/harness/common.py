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
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

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
                "dataset": dataset, "n": n, "params": json.loads(json.dumps(self.params, default=str)),
                "config": self.config, "run_info": self.run_info, "provenance": self.provenance,
                "item_class": f"{cls.__module__}:{cls.__qualname__}", "stop_strings": self.stop_strings, **extra}


def study_grid(study: str, model: str, dataset: str, n: int | None, params: Mapping[str, Any]) -> StudyGrid:
    """The items ``run_study(study, model, dataset, n=n, **params)`` would evaluate in its grid stage."""
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
    view.mkdir(exist_ok=True)
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


def scorer(manifest: Mapping[str, Any]) -> Callable[[Mapping[str, Any], str], dict[str, Any]]:
    """``score(row, raw) -> columns``: the study's own score function on an exported row and a harness' raw output
    (what import stores and the exported ``process_results`` reports)."""
    from mmfragile.study import get_study

    score = get_study(manifest["study"]).stage(manifest["stage"]).score(None, manifest["params"])
    cls = item_class(manifest)
    return lambda row, raw: score(raw, row_item(row, cls))


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


def write_store(out: str | Path, manifest: Mapping[str, Any], scored: Sequence[tuple[dict, str]], model: str,
                provenance: Mapping[str, Any]) -> ResultStore:
    """The result store of ``scored`` = (exported row, raw output) pairs: every row scored by the study's own
    score function, under the config of a native run (``model`` names the run as ``--model`` would)."""
    from mmfragile.study import get_study, tag

    study = get_study(manifest["study"])
    stage = study.stage(manifest["stage"])
    score = scorer(manifest)
    config = {**manifest["config"], **tag(study, stage), "model": model}   # tagged as run_study tags its stores
    store = ResultStore(out, config=config, run_info=manifest["run_info"] or None)
    if len(store):
        raise HarnessError(f"{out}: the store already holds {len(store)} rows; import into a new folder")
    # the checkpoint and dataset hashes of the export's model, then what the harness ran
    store.merge_run_info("provenance", {model: {**manifest.get("provenance", {}), **provenance}})
    rows = []
    cls = item_class(manifest)
    for row, raw in scored:
        it = row_item(row, cls)
        rows.append({"model": model, **it.key, "raw_output": raw, "option_ids": list(it.option_ids),
                     "answer_id": it.answer_id, **score(row, raw)})
    store.append(rows)
    return ResultStore(store.root)
