"""Study 4 - the noise floor (``mmfragile run numerics``): another study's cells rerun under each alternative the
backend supports (:mod:`~mmfragile.studies.numerics.alternatives`), into one store; the floor per alternative
(:func:`~mmfragile.studies.numerics.metrics.floor_table`) is what the report shows beside every effect.

The cells: a seeded sample (``--per-question``) of each question's cells of a study's grid - study 1's format grid
by default, study 2's prompts with ``--of promptception`` - made, run and scored by that study's own stage, with
its defaults. Each alternative is one stage of this study: the same cells, its model loaded under
``<model>~<alternative>`` with its arguments, run under its settings. Shards, resume, Ray and the report come from
the shared layers.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import pandas as pd

from mmfragile.determinism import torch_threads
from mmfragile.models.spec import as_spec
from mmfragile.store import ResultStore
from mmfragile.study import Param, RunContext, Stage, Study, budget_stage, csv_list, get_study, register
from mmfragile.studies.numerics import report
from mmfragile.studies.numerics.alternatives import (ALTERNATIVES, UnknownAlternative, recompose, reference_dtype,
                                                     resolve, sample_cells)
from mmfragile.studies.numerics.metrics import SEPARATOR, floor_table

NAME = "numerics"
STORE = "cells"
#: the studies whose grid the numerics study can rerun
OF = ("format-bias", "promptception")


@dataclass
class Cells:
    """What the driver loaded: the other study's context (its data) and the units of its grid stage."""

    of: RunContext
    units: list


def _of(params: dict) -> tuple[Study, Stage, dict]:
    """The study whose cells are rerun, its grid stage and its parameters (its defaults)."""
    other = get_study(params["of"])
    return other, budget_stage(other), {**other.resolve({}), "budgeted": False}


def load(ctx: RunContext) -> Cells:
    ctx.params["alternatives"] = resolve(ctx.params["alternatives"], ctx.model.backend,   # before any model loads
                                         reference_dtype(ctx.model))
    other, stage, oparams = _of(ctx.params)
    octx = RunContext(other, ctx.model, ctx.model_name, ctx.dataset, ctx.n, ctx.folder, dict(oparams),
                      table=ctx.table)
    octx.data = other.load(octx)
    ctx.run_info.update(octx.run_info)
    return Cells(octx, stage.units(octx))


def _items(alternative: str | None):
    def items(model, units: list, params: dict, skipped: list | None):
        _, stage, oparams = _of(params)
        cells = sample_cells(stage.items(model, units, oparams, skipped), params["per_question"], params["seed"])
        alt = ALTERNATIVES.get(alternative)
        return recompose(cells, params["seed"]) if alt is not None and alt.composition else cells
    return items


@functools.lru_cache(maxsize=None)
def _cell_scorer(of: str):
    """The score function of ``of``'s grid stage under that study's defaults (resolved once, not once per cell)."""
    _, stage, oparams = _of({"of": of})
    return stage.scorer(oparams)


def score_cell(raw, item, of: str) -> dict:
    """A cell's output scored as the study it comes from (``of``) scores it, under that study's defaults."""
    return _cell_scorer(of)(raw, item)


def _config(ctx: RunContext) -> dict:
    return {"model": ctx.model_name, "dataset": ctx.dataset, "n": ctx.n, "of": ctx.params["of"],
            "per_question": ctx.params["per_question"], "seed": ctx.params["seed"]}


def _stage(alternative: str | None) -> Stage:
    """The reference run (None) or one alternative's: the same cells into the one store."""
    alt = ALTERNATIVES.get(alternative)
    return Stage(
        name=alternative or "reference", units=lambda ctx: ctx.data.units, items=_items(alternative), score=score_cell,
        score_params=("of",),
        config=_config, subfolder=STORE,
        when=(lambda p: True) if alt is None else (lambda p: alternative in p["alternatives"]),
        models=None if alt is None else (lambda ctx: [as_spec(ctx.model, **alt.spec_kwargs,
                                                              name=f"{ctx.model_name}{SEPARATOR}{alt.name}")]),
        run_params=("batch_size",), run_kw=lambda p: {} if alt is None else alt.run_kw,
        runs_under=lambda p: torch_threads(None if alt is None else alt.threads))


def summarize(stores: dict[str, ResultStore]) -> dict[str, pd.DataFrame]:
    store = stores.get("reference")
    if store is None:
        return {}
    table = floor_table(ResultStore(store.root).read())
    table["max_dlogit"] = table["max_dlogit"].map(lambda v: f"{v:.2g}")   # far below the table's 0.1
    return {"noise floor (flip rate %, delta accuracy pp)": table[
        ["model", "alternative", "cells", "flips", "flip_rate", "flip_lo", "flip_hi", "delta_acc", "delta_lo",
         "delta_hi", "mcnemar_p", "max_dlogit", "rank_changes"]]}


STUDY = register(Study(
    name=NAME,
    title="Numerics: the noise floor of an evaluation (answers under arithmetic-only changes)",
    paper="numerics",
    params=(Param(name="of", default="format-bias", help="the study whose cells are rerun", type=str, choices=OF),
            Param(name="alternatives", default=["auto"],
                  help="alternatives to rerun under (auto: those the backend supports): " + ", ".join(ALTERNATIVES),
                  type=csv_list),
            Param(name="per_question", default=16, help="cells sampled per question (seeded; 0: all)", type=int),
            Param(name="seed", default=0, help="seed of the cell sample and of the batch composition", type=int),
            Param(name="batch_size", default=16, help="prompts per batched generate (the reference's)", type=int)),
    load=load,
    stages=(_stage(None), *(_stage(a) for a in ALTERNATIVES)),
    summarize=summarize,
    report=report.section,
    report_stages=(STORE,),
    errors={UnknownAlternative: str},
    report_absent=report.absent,
    report_floors=report.floors,
    default_model="zoo-smollm2-good",
    default_dataset="easy-vqa",
))
