"""``mmfragile plan STUDY --model M --dataset D``: what a run would cost, before any model loads.

Per stage of the study: the grid's size in prompts (the stage's own items, made from the dataset with a stand-in
that has the model's declared capabilities - no weights) and in prompt-text tokens (the model's tokenizer alone:
the text of every prompt, system prompt included, before the chat template; image tokens are the processor's and
not counted - none for an API model, whose tokenizer is the server's); the time at
this machine's measured rate for that model (the ``rate`` a run through :func:`mmfragile.study.run_study` records
in its store, read from ``--out`` - model loading included; none measured: the command that measures it); what
each budget would cost; and, for a grid, how many questions detect a per-variant effect of ``--effect`` pp: the
two-sided z-test of one variant's accuracy against another at 80 % power and alpha 0.05, each question giving the
variant ``cells per question`` cells, independent - a *lower bound*: cells of one question are correlated.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from mmfragile.budget.estimator import budget_size
from mmfragile.models.base import MLLM
from mmfragile.store import ResultStore

__all__ = ["Plan", "plan_study", "questions_for_effect", "DEFAULT_BUDGETS"]

DEFAULT_BUDGETS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 1.0)
_Z_ALPHA, _Z_POWER = 1.959964, 0.841621   # two-sided alpha 0.05, power 80 %


def questions_for_effect(effect_pp: float, accuracy: float, cells_per_question: int) -> int:
    """Questions needed to tell two variants ``effect_pp`` apart (see the module docstring), at ``accuracy`` (0-1,
    the variants' mean; 0.5 is the worst case)."""
    if not effect_pp > 0:
        raise ValueError(f"--effect must be > 0 pp, got {effect_pp}")
    p = min(max(accuracy, 1e-3), 1 - 1e-3)
    d = effect_pp / 100
    return math.ceil((_Z_ALPHA + _Z_POWER) ** 2 * 2 * p * (1 - p) / (d * d * max(cells_per_question, 1)))


def _tokenizer(spec: Any) -> tuple[Any, str | None]:
    """The model's tokenizer without its weights, or None and why not."""
    if spec.origin == "api":
        return None, f"{spec.name} is an API model: its tokenizer is the server's"
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(spec.checkpoint_dir())), None
    except (OSError, ValueError) as e:
        return None, f"{spec.name}'s tokenizer did not load ({type(e).__name__}: {str(e).splitlines()[0]})"


def text_tokens(tokenizer: Any, prompts: Sequence[Any]) -> int:
    """The tokens of the prompts' text (system prompt + user turn, no special tokens, no chat template)."""
    texts = [f"{p.system}\n{p.text}" if p.system else p.text for p in prompts]
    return sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else 0


class _StandIn(MLLM):
    """The model's declared capabilities without the model (items are made, nothing is run)."""

    def __init__(self, name: str, supports_images: bool):
        self.name, self.supports_images = name, supports_images

    def generate(self, prompts, max_new_tokens=16):  # pragma: no cover - a plan runs nothing
        raise RuntimeError("a plan runs nothing")

    def option_logits(self, prompts, candidates):  # pragma: no cover
        raise RuntimeError("a plan runs nothing")

    def loglikelihood(self, prompts, continuations):  # pragma: no cover
        raise RuntimeError("a plan runs nothing")


@dataclass
class Plan:
    """``stages``: per stage - ``prompts``, ``tokens`` (prompt-text tokens, NaN without a tokenizer), ``questions``,
    ``variants``, ``cells_per_question`` (a variant's cells
    per question), ``rate`` (rows/s measured here, NaN if none), ``seconds`` (the whole stage at that rate);
    ``budgets``: per grid stage x budget - ``cells``, ``seconds``; ``power``: per grid stage - ``effect_pp``,
    ``accuracy`` (the stored one, else 0.5), ``questions`` needed, ``questions_here``; ``notes``."""

    stages: pd.DataFrame
    budgets: pd.DataFrame
    power: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        parts = [("# grid", self.stages), ("# budgets", self.budgets), ("# questions to detect an effect", self.power)]
        text = "\n".join(f"{h}\n{t.to_string(index=False)}" for h, t in parts if not t.empty)
        return text + "".join(f"\nnote: {n}" for n in self.notes)


def _measured(store_root: Path | None, model: str) -> tuple[float, float]:
    """(rows per second the last run of ``model`` into the store at ``store_root`` measured, its stored accuracy
    0-1); NaN for what is not there."""
    if store_root is None or not (store_root / "config.json").is_file():
        return float("nan"), float("nan")
    store = ResultStore(store_root)
    got = ((store.config.get("run_info") or {}).get("rate") or {}).get(model)
    rate = float(got["rows"]) / float(got["seconds"]) if got and float(got["seconds"]) > 0 else float("nan")
    rows = store.read(columns=["correct"])
    acc = float(rows["correct"].astype(float).mean()) if "correct" in rows and len(rows) else float("nan")
    return rate, acc


def plan_study(study: Any, model: str | None = None, dataset: str | None = None, *, n: int | None = None,
               out: str | Path | None = None, model_args: Mapping[str, Any] | str | None = None,
               budgets: Sequence[float] = DEFAULT_BUDGETS, effect: float = 2.0, **params: Any) -> Plan:
    """The :class:`Plan` of ``study`` for ``model`` on ``dataset`` (see the module docstring); ``out``: the results
    folder a run would use (its stores' measured rate and stored accuracy are read; nothing is written there)."""
    from mmfragile.models.spec import as_spec
    from mmfragile.study import RunContext, answerable, get_study

    st = get_study(study)
    spec = as_spec(model or st.default_model, model_args=model_args)
    dataset = dataset or st.default_dataset
    folder = Path(out) if out is not None else None
    rows, budget_rows, power_rows, notes = [], [], [], []
    tokenizer, no_tokens = _tokenizer(spec)
    with tempfile.TemporaryDirectory() as scratch:   # a study's load may write (the judge set's pictures)
        ctx = RunContext(st, spec, spec.name, dataset, n, Path(scratch), st.resolve(params))
        ctx.data = st.load(ctx)
        stand_in = _StandIn(spec.name, spec.can("supports_images"))
        for stage in st.stages:
            if not stage.when(ctx.params) or stage.models is not None:
                continue
            try:
                units = stage.units(ctx)
            except (OSError, ValueError) as e:   # a stage that reads an earlier stage's store
                notes.append(f"{st.name}/{stage.name}: not planned ({e})")
                continue
            items = answerable(stand_in, stage.items(stand_in, units, {**ctx.params, "budgeted": False}, None),
                               stage.unit)   # what the run would send: a text-only model's image items left out
            keys = pd.DataFrame([it.key for it in items])
            store_root = (folder / stage.subfolder) if folder is not None else None
            rate, acc = _measured(store_root, spec.name)
            n_q = keys[["dataset", "question_id"]].drop_duplicates().shape[0] if len(keys) else 0
            unit = stage.budget.spec.unit if stage.budget is not None else None
            by = unit if unit and unit in keys else "variant"
            n_var = int(keys[by].nunique()) if len(keys) else 0
            per_q = len(items) / max(n_q * max(n_var, 1), 1)
            tokens = text_tokens(tokenizer, [it.prompt for it in items]) if tokenizer is not None else float("nan")
            rows.append({"stage": stage.name, "prompts": len(items), "tokens": tokens, "questions": n_q,
                         "variants": n_var,
                         "cells_per_question": round(per_q, 2), "rate": rate, "seconds": len(items) / rate})
            if stage.budget is None:
                continue
            for b in budgets:
                cells = budget_size(len(items), b)
                budget_rows.append({"stage": stage.name, "budget": b, "cells": cells, "seconds": cells / rate})
            p = 0.5 if math.isnan(acc) else acc
            power_rows.append({"stage": stage.name, "effect_pp": effect, "accuracy": round(100 * p, 1),
                               "questions": questions_for_effect(effect, p, max(1, round(per_q))),
                               "questions_here": n_q})
    if rows and all(math.isnan(r["rate"]) for r in rows):
        notes.append(f"no measured rate for {spec.name} here: a short run records one, e.g. `python -m mmfragile run "
                     f"{st.name} --model {spec.name} --dataset {dataset} --n 2 --out <folder>`; then plan with "
                     "--out <folder>")
    if no_tokens:
        notes.append(f"tokens not counted: {no_tokens}")
    notes.append("tokens: the prompts' text, before the chat template and without image tokens; the questions "
                 "needed assume independent cells, a lower bound")
    return Plan(pd.DataFrame(rows), pd.DataFrame(budget_rows), pd.DataFrame(power_rows), notes)
