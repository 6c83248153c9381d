"""The study contract and the one runner every study uses.

A :class:`Study` is a named record (as a task in ``inspect_ai``): its parameters, how it loads its data, and its
stages. A :class:`Stage` is one kind of work into one result store: the units it splits by question group
(question records, judge conditions, response pairs ...), the evaluation items it makes of them, how it scores
an output, the store's configuration, and whether a budgeted design applies. Study 1 has the format grid and
CP-LN, study 2 the prompts and (with an extractor) their stage-2 answer extraction, study 3 the score-wise
judgments, the pairwise ones, the generators' responses and the judge's scores of them (self-enhancement).

:func:`run_study` runs any of them the same way - in one process, as one ``--shard i/n`` of it, on Ray workers
(:func:`mmfragile.distributed.run_on_ray`) or as a budgeted share of a grid (:mod:`mmfragile.budget`) - through
:func:`mmfragile.runner.run_items`, the one loop that resumes, batches, flushes and reports progress. A stage's
work crosses processes as a :class:`StageTask`: the study and stage *names*, the parameters and the units, and
where the study was registered (its module and file: a Ray worker imports it to know a study defined outside
this package).

Registry: :func:`get_study` finds the built-in studies by name (``format-bias``, ``promptception``,
``judge``) and any registered with :func:`register`; ``mmfragile run <study>`` takes its options from the
study's :class:`Param` list. CONTRIBUTING.md says how to add one.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import numbers
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, cast

import numpy as np
import pandas as pd

from mmfragile.determinism import torch_threads
from mmfragile.models.base import MLLM
from mmfragile.models.spec import ModelSpec, as_spec, spec_of
from mmfragile.paths import safe_name
from mmfragile.runner import EvalItem, ScoreFn, run_items
from mmfragile.shards import Shard, question_group
from mmfragile.store import ResultStore

#: the built-in studies: name -> module defining ``STUDY`` (imported on first use, so the core imports no study)
BUILTIN = {
    "format-bias": "mmfragile.studies.format_bias.study",
    "promptception": "mmfragile.studies.promptception.study",
    "judge": "mmfragile.studies.judgebias.study",
    "numerics": "mmfragile.studies.numerics.study",
}
#: other names a study answers to (the CLI's older commands)
ALIASES = {"formats": "format-bias", "judgebias": "judge", "mm-judgebias": "judge"}
#: the CLI's top-level shortcuts for ``run <study>`` (``mmfragile formats`` = ``mmfragile run format-bias``)
SHORTCUTS = ("formats", "promptception", "judge")
_REGISTRY: dict[str, "Study"] = {}
#: where each study was registered: name -> (module, file) - what another process imports to register it too
_ORIGINS: dict[str, tuple[str, str | None]] = {}


#: a stage's view of the study's parameters: name -> value (``Study.resolve``), ``budgeted`` added
Params = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Param:
    """One parameter of a study: a keyword of :func:`run_study`, a notebook parameter and a CLI option
    (``--name-with-dashes``; a boolean whose default is True is switched off with ``--no-...``)."""

    name: str
    default: Any = None
    help: str = ""
    type: Callable[[str], Any] | None = None   # parses a CLI string (bool: a flag; list: comma-separated)
    choices: tuple[Any, ...] | None = None

    @property
    def flag(self) -> str:
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.type is bool and self.default is True else f"--{dashed}"

    def check(self, value: Any, where: str) -> Any:
        """``value`` as this parameter holds it - a string parsed by ``type`` where the parameter is no string (a
        notebook's ``"1.1,2.1"``, a list) - or a one-line TypeError naming ``where``, the parameter and the type
        it needs. None passes where the default is None (unset)."""
        if value is None and self.default is None:
            return None
        if isinstance(value, str) and self.type not in (str, bool, None):   # bool("no") is True: not parsed
            try:
                value = self.type(value)
            except ValueError:
                pass   # reported below with the type it needs
        held = VALUE_TYPES.get(self.type)
        if held is not None and (not isinstance(value, held[0]) or (isinstance(value, bool) and self.type is not bool)):
            raise TypeError(f"{where}: {self.name} takes {held[1]}{' or None' if self.default is None else ''}, "
                            f"not {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{where}: {self.name} must be one of {self.choices}, not {value!r}")
        return list(value) if self.type is csv_list else value


#: how a study's generate and sample requests run (:func:`mmfragile.runner.run_items`' ``mode``; no store config:
#: every mode stores the same outputs)
MODE = Param(name="mode", default="auto",
             help="auto: the prefix-sharing engine where exact; engine: refuse otherwise; generate: batched generate",
             type=str, choices=("auto", "engine", "generate"))


def csv_list(text: str) -> list[str]:
    """A CLI list: ``"a,b,c"`` -> ``["a", "b", "c"]``."""
    return [p.strip() for p in str(text).split(",") if p.strip()]


#: what a parameter of each declared ``type`` holds, and how an error names it (a type not listed is not checked)
VALUE_TYPES: dict[Any, tuple[tuple[type, ...], str]] = {
    int: ((numbers.Integral,), "an integer"), float: ((numbers.Real,), "a number"),
    bool: ((bool, np.bool_), "True or False"), str: ((str,), "a string"),
    csv_list: ((list, tuple), "a list (or a comma-separated string)")}


def question_records(ctx: "RunContext") -> list[dict[str, Any]]:
    """A stage's units when they are the loaded question table's rows (as records)."""
    return cast(list[dict[str, Any]], ctx.data.to_dict("records"))


def record_group(rec: Mapping[str, Any]) -> str:
    """The question group of a question record."""
    return question_group(rec["dataset"], rec["question_id"])


@dataclass
class RunContext:
    """What a stage knows on the driver: the study's parameters, the model's spec, the dataset and the data the
    study loaded, its results folder."""

    study: "Study"
    model: ModelSpec
    model_name: str
    dataset: str | None
    n: int | None
    folder: Path
    params: dict[str, Any]
    data: Any = None
    run_info: dict[str, Any] = field(default_factory=dict)
    budget: float | int | str | None = None
    table: Any = None   # the study's data given to run_study instead of a spec (a question table, judge samples)

    def questions(self, n: int | None = None, skip_bad_rows: bool = False) -> pd.DataFrame:
        """The question table: the one given to :func:`run_study` (its first ``n`` rows), else
        :func:`~mmfragile.data.loaders.load_dataset` of the spec."""
        if self.table is not None:
            table: pd.DataFrame = self.table.head(n) if n else self.table
            return table.reset_index(drop=True)
        from mmfragile.data.loaders import load_dataset

        if self.dataset is None:   # run_study refuses a study that needs a dataset without one
            raise ValueError(f"study {self.study.name!r}: no dataset to read questions from")
        return load_dataset(self.dataset, n=n, skip_bad_rows=skip_bad_rows)


def table_name(table: pd.DataFrame) -> str:
    """The dataset name a question table is stored under: the spec :func:`~mmfragile.data.loaders.load_dataset`
    read it from (``attrs["spec"]``), else its ``dataset`` column's values. A table without rows or without the
    question columns raises, naming them."""
    from mmfragile.schema import QUESTION_COLUMNS

    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"dataset: a dataset spec or a question table (mf.load_dataset's DataFrame), not a "
                         f"{type(table).__name__}")
    missing = [c for c in QUESTION_COLUMNS if c not in table.columns]
    if missing or table.empty:
        raise ValueError(f"dataset: a question table needs rows and the columns {QUESTION_COLUMNS} (mf.load_dataset "
                         f"returns one); " + (f"this one lacks {missing}" if missing else "this one is empty"))
    if table.attrs.get("spec"):
        return str(table.attrs["spec"])
    return "+".join(sorted(table["dataset"].astype(str).unique()))


@dataclass(frozen=True, kw_only=True)
class CommittedGrid:
    """A complete grid of a stage committed under ``mmfragile/resources/budget/`` (``budget.validation``'s
    ``"embedded"`` source): its ``file``, the cell-frame ``columns`` the file keeps, ``expand`` (the file's frame,
    with ``question`` and a float ``correct`` added, -> the stage's cell frame: the study's columns derived from
    those kept) and a ``note`` on what it is."""

    file: str
    columns: tuple[str, ...]
    expand: Callable[[pd.DataFrame], pd.DataFrame]
    note: str


@dataclass(frozen=True, kw_only=True)
class BudgetGrid:
    """A stage's grid as :mod:`mmfragile.budget` samples and estimates it: ``spec`` (a
    :class:`~mmfragile.budget.estimator.GridSpec`: the unit and the covariates), ``cells(rows)`` (the complete
    cell frame of every (model, question) in the stage's store rows, ``correct`` where stored) and, optionally,
    ``simulate(datasets=, max_items=, seed=, ...)`` (complete grids matching the seed paper's published
    accuracies, for ``budget.validation``); ``read(store)``: the store's rows (Promptception joins its stage-2
    extractions in); ``embedded``: the stage's committed complete grid (:class:`CommittedGrid`,
    :func:`mmfragile.budget.validation.load_embedded_grid`), if it has one."""

    spec: Any
    cells: Callable[[pd.DataFrame], pd.DataFrame]
    simulate: Callable[..., pd.DataFrame] | None = None
    read: Callable[[ResultStore], pd.DataFrame] = ResultStore.read   # a store's rows as ``cells`` wants them
    embedded: CommittedGrid | None = None


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One kind of work of a study into one store (see the module docstring).

    ``units(ctx)`` runs on the driver before any model loads (earlier stages' stores may be read);
    ``items(model, units, params, skipped)`` and ``score(raw, item, **kw)`` run where the model is (a worker):
    ``score`` is a plain function of one output and its item, given as keywords the study parameters named in
    ``score_params`` (Promptception's extraction policy);
    ``skipped`` is a list to append bad rows to (``skip_bad_rows``) or None (raise); ``params`` holds the study's
    parameters and ``budgeted`` (a budgeted design samples the items); ``run_params`` name the parameters the
    run loop takes (``batch_size`` ...), ``run_kw(params)`` adds computed ones. ``models(ctx)``: the specs to
    run the stage with, if not the study's model (the generators of self-generated responses). ``budget``: the
    grid a budget samples (None: the stage always runs whole). ``subfolder``: its store's folder under the study's
    results folder (stages may share one; "" is the results folder itself); the store's stage tag is :attr:`tag`.
    ``runs_under(params)``: a context manager the stage's
    work runs inside, where the model is (the numerics study's thread count); none by default."""

    name: str
    units: Callable[[RunContext], list[Any]]
    items: Callable[[MLLM, list[Any], Params, list[dict[str, Any]] | None], list[EvalItem]]
    score: Callable[..., dict[str, Any]]
    config: Callable[[RunContext], dict[str, Any]]
    subfolder: str = ""
    group_of: Callable[[Any], str] = record_group
    when: Callable[[Params], bool] = lambda params: True
    budget: BudgetGrid | None = None
    models: Callable[[RunContext], list[ModelSpec]] | None = None
    run_kw: Callable[[Params], dict[str, Any]] = lambda params: {}
    unit: str = "prompt"   # what one item is (the progress bar counts items): prompt, option, judgment ...
    runs_under: Callable[[Params], Any] = lambda params: contextlib.nullcontext()
    score_params: tuple[str, ...] = ()
    run_params: tuple[str, ...] = ()   # study parameters the run loop takes as keywords (batch_size, flush_every)

    def scorer(self, params: Mapping[str, Any]) -> ScoreFn:
        """``score`` with its ``score_params`` bound from ``params``: ``fn(raw, item) -> row``."""
        return partial(self.score, **{name: params[name] for name in self.score_params})

    @property
    def tag(self) -> str:
        """The stage's name in its store's config (``"stage"``): the store it writes, the same for stages that
        share one."""
        return self.subfolder or self.name


@dataclass(frozen=True, kw_only=True)
class Study:
    """A study: ``name`` (registry key), ``title``, the seed paper, its parameters, ``load(ctx)`` (the driver's
    data: a question table, judge samples and conditions ...), its stages, ``folder(results_dir, model, dataset)``
    (where its stores go when a results folder rather than a store folder is given) and ``summarize(stores)``
    (the tables the CLI prints after a run).

    What the shared layers learn from it: ``report(doc, stores, opts)`` - its section of the fragility report
    (:func:`mmfragile.report.build_report`) from its stores by stage tag (those in ``report_stages``; other
    stages' stores are listed under provenance only), returning ``(section or None, how-to-report entries)``;
    ``errors`` - exception type -> one-line message for the CLI (an error a user can cause, and what to pass);
    each stage's ``budget`` grid (:mod:`mmfragile.budget`); ``report_absent(studies)`` - the report's notes when it
    has no store of this study but stores of ``studies`` (names): what was not measured, and the command;
    ``report_floors(stages, opts)`` - the numerical noise floor (pp) per model its stores measured, computed before
    every section so that each study shows its effects beside it (``Doc.floors``)."""

    name: str
    title: str
    paper: str
    params: tuple[Param, ...]
    load: Callable[[RunContext], Any]
    stages: tuple[Stage, ...]
    summarize: Callable[[dict[str, ResultStore]], dict[str, pd.DataFrame]] = lambda stores: {}
    folder: Callable[[str | Path, str, str | None], Path] = \
        lambda results_dir, model, dataset: Path(results_dir) / safe_name(model) / safe_name(dataset or "data")
    default_model: str = "zoo-smollm2-good"
    default_dataset: str | None = None
    needs_dataset: bool = True
    data_name: Callable[[Any], str] = table_name   # the dataset name in-memory data given to run_study is stored under
    report: Callable[..., tuple[Any, list[dict[str, Any]]]] | None = None
    report_stages: tuple[str, ...] = ()
    errors: Mapping[type, Callable[[BaseException], str]] = field(default_factory=dict)
    report_absent: Callable[[Sequence[str]], list[str]] | None = None
    report_floors: Callable[[Mapping[str, list[ResultStore]], Any], Mapping[str, float]] | None = None

    def error_line(self, exc: BaseException) -> str | None:
        """The study's one-line message for ``exc`` (its ``errors``), or None."""
        return next((message(exc) for kind, message in self.errors.items() if isinstance(exc, kind)), None)

    def stage_store(self, folder: str | Path, stage: str, config: Mapping[str, Any] | None = None,
                    **kw: Any) -> ResultStore:
        """The store of ``stage`` in the study's results ``folder`` (``folder / stage.subfolder``): opened as it is
        (``config`` None), or created / resumed with ``config`` plus the study's tag (:func:`tag`) - the one place a
        store's identity is written. ``kw`` go to :class:`~mmfragile.store.ResultStore`."""
        st = self.stage(stage)
        return ResultStore(Path(folder) / st.subfolder, config=None if config is None else {**config, **tag(self, st)},
                           **kw)

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"study {self.name!r} has no stage {name!r}; stages: {[s.name for s in self.stages]}")

    def resolve(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` over the defaults; an unknown name raises, listing the known ones."""
        known = {p.name: p for p in self.params}
        bad = sorted(set(params) - set(known))
        if bad:
            raise TypeError(f"study {self.name!r} has no parameter(s) {bad}; its parameters: {sorted(known)}")
        out = {p.name: p.default for p in self.params}
        out.update({name: known[name].check(value, self.name) for name, value in params.items()})
        return out

    def check(self) -> None:
        """What :func:`register` checks: parameter names unique, each default of its declared type, stage names
        unique, every stage's ``score_params`` and ``run_params`` a parameter."""
        names = [p.name for p in self.params]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"study {self.name!r} declares the parameter(s) {twice} twice")
        for p in self.params:
            p.check(p.default, f"study {self.name!r}, the default of")
        stages = [s.name for s in self.stages]
        if len(set(stages)) != len(stages):
            raise ValueError(f"study {self.name!r} has two stages of one name: {stages}")
        for st in self.stages:
            for field_name in ("score_params", "run_params"):
                unknown = sorted(set(getattr(st, field_name)) - set(names))
                if unknown:
                    raise ValueError(f"study {self.name!r}, stage {st.name!r}: {field_name} {unknown} are no "
                                     f"parameter of the study; its parameters: {names}")


def register(study: Study) -> Study:
    """Add a study to the registry (replacing one of the same name); returns it. The calling module (its name
    and file) is recorded as the study's origin: a process that lacks the study (a Ray worker) imports it."""
    study.check()
    caller = sys._getframe(1).f_globals
    _REGISTRY[study.name] = study
    _ORIGINS[study.name] = (caller.get("__name__", ""), caller.get("__file__"))
    return study


def study_origin(name: str) -> tuple[str, str | None] | None:
    """The module and file that registered study ``name`` in this process (None: not registered here)."""
    return _ORIGINS.get(ALIASES.get(name, name))


def import_origin(name: str, origin: tuple[str, str | None]) -> None:
    """Register study ``name`` in this process from its ``origin`` (:func:`study_origin` of the process that
    has it): import the module by name, else - not importable here (a test tree or a script not on this
    process's path) - execute its file. A script (``__main__``) is executed under another name, so its
    ``if __name__ == "__main__"`` part does not run."""
    module, file = origin
    if module and module != "__main__":
        try:
            importlib.import_module(module)
            return
        except ModuleNotFoundError as e:
            if not e.name or not (module == e.name or module.startswith(e.name + ".")):
                raise   # the module was found: one of its own imports is missing
    if not file or not Path(file).is_file():
        raise KeyError(f"study {name!r} was registered by {module} ({file}), which this process can neither import "
                       "nor read: install that module (or put its file at the same path) where the work runs")
    as_name = module if module and module != "__main__" else f"_mmfragile_study_{safe_name(name)}"
    found = importlib.util.spec_from_file_location(as_name, file)
    if found is None or found.loader is None:
        raise KeyError(f"study {name!r}: {file} is no Python module this process can load")
    mod = importlib.util.module_from_spec(found)
    sys.modules[as_name] = mod
    try:
        found.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(as_name, None)
        raise


def get_study(name: "str | Study") -> Study:
    """A study by name (or alias); the built-in ones are imported on first use."""
    if isinstance(name, Study):
        return name
    key = ALIASES.get(name, name)
    if key not in _REGISTRY and key in BUILTIN:
        importlib.import_module(BUILTIN[key])  # its module registers it
    if key not in _REGISTRY:
        raise KeyError(f"unknown study {name!r}; studies: {sorted(set(BUILTIN) | set(_REGISTRY))}")
    return _REGISTRY[key]


def study_names() -> list[str]:
    """Every study's name: the built-in ones in their order (the report's), then the registered ones."""
    return list(BUILTIN) + sorted(set(_REGISTRY) - set(BUILTIN))


def budget_stage(study: "str | Study", stage: str | None = None) -> Stage:
    """``study``'s stage with a budget grid (``stage``, or its first one that has one); a study without one
    raises, naming the studies that have."""
    st = get_study(study)
    grids = [s for s in st.stages if s.budget is not None and stage in (None, s.name, s.tag)]
    if not grids:
        have = [n for n in study_names() if any(s.budget for s in get_study(n).stages)]
        raise ValueError(f"study {st.name!r} has no grid a budget can sample (stage {stage or 'any'}); "
                         f"studies with one: {have}")
    return grids[0]


def budget_grid(study: "str | Study", stage: str | None = None) -> BudgetGrid:
    """The budget grid of :func:`budget_stage`."""
    return cast(BudgetGrid, budget_stage(study, stage).budget)   # budget_stage finds a stage that has one


def store_stage(config: Mapping[str, Any], where: Any = "store") -> tuple[Study, str]:
    """The study (from the registry) and stage tag of a store's config (:func:`mmfragile.store.store_tag`)."""
    from mmfragile.store import store_tag

    name, stage = store_tag(config, where)
    return get_study(name), stage


# ============================================================================================== one stage's work
@dataclass(frozen=True)
class StageTask:
    """A stage's work on some units, as one picklable call ``task(model, units, store, shard)`` - what a
    ``--shard`` run, a Ray worker (:func:`mmfragile.distributed.run_on_ray`) and a budgeted run all execute."""

    study: str
    stage: str
    params: tuple[tuple[str, Any], ...] = ()
    budget: float | int | str | None = None   # a share, a cell count or "auto" (stop at budget_target)
    adaptive: bool = False
    budget_seed: int = 0
    budget_batch: int | None = None
    budget_target: float | None = None        # "auto": the widest interval (pp) to stop at
    budget_stop_on: tuple[str, ...] | None = None   # "auto": the statistics (default: mean and spread)
    budget_round: float = 0.01                # "auto": the share of the grid one round adds
    progress: bool = False
    threads: int | None = None   # torch CPU threads where the work runs (None: as set)
    stop_after: int | None = None   # end after that many new rows (a killed run, in tests)
    origin: tuple[str, str | None] | None = None   # where the study was registered (default: this process's)

    def __post_init__(self) -> None:
        if self.origin is None:
            object.__setattr__(self, "origin", study_origin(self.study))

    def _study(self) -> Study:
        """The study, imported from its origin where this process has not registered it (a Ray worker)."""
        key = ALIASES.get(self.study, self.study)
        if key not in _REGISTRY and key not in BUILTIN and self.origin is not None:
            import_origin(self.study, self.origin)
        return get_study(self.study)

    def _stage(self) -> Stage:
        return self._study().stage(self.stage)

    def resolved(self) -> dict[str, Any]:
        """The study's parameters: the task's over the defaults, and ``budgeted``."""
        return {**self._study().resolve(dict(self.params)), "budgeted": self.budget is not None}

    def group_of(self, unit: Any) -> str:
        return self._stage().group_of(unit)

    def __call__(self, model: MLLM, units: list[Any], store: Any, shard: "Shard | str | None" = None) -> None:
        stage, params = self._stage(), self.resolved()
        shard = Shard.parse(shard)
        units = shard.select(units, stage.group_of) if shard.count > 1 else list(units)
        skipped: list[dict[str, Any]] | None = [] if params.get("skip_bad_rows") else None
        items = answerable(model, stage.items(model, units, params, skipped), stage.unit)
        if skipped:
            store.add_skipped_rows(skipped)
        score = stage.scorer(params)
        kw = {"progress": self.progress, "desc": f"{model.name} {self.study}/{self.stage}", "unit": stage.unit,
              **{name: params[name] for name in stage.run_params}, **stage.run_kw(params)}
        with torch_threads(self.threads), stage.runs_under(params):   # a budgeted run too
            if self.budget is None:
                run_items(model, items, store, score, shard=shard, stop_after=self.stop_after, **kw)
                return
            from mmfragile.budget import run_auto, run_budgeted
            from mmfragile.budget.auto import AUTO, AUTO_STATISTICS

            if stage.budget is None:
                raise ValueError(f"{self.study}/{self.stage} is no grid a budget can sample")
            kw.pop("desc")
            if self.budget == AUTO:
                run_auto(model, items, store, stage.budget.spec, float(cast(float, self.budget_target)),
                         score_fn=score, seed=self.budget_seed, statistics=self.budget_stop_on or AUTO_STATISTICS,
                         round_share=self.budget_round, **kw)
                return
            run_budgeted(model, items, store, stage.budget.spec, cast("float | int", self.budget),
                         seed=self.budget_seed, adaptive=self.adaptive, batch=self.budget_batch, score_fn=score, **kw)


# ============================================================================================== a whole run
@dataclass
class StudyRun:
    """What :func:`run_study` did: the stores it wrote (stage -> store), seconds per stage and the study's
    summary tables of them."""

    study: Study
    model: str
    folder: Path
    data: Any = None
    stores: dict[str, ResultStore] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    new_rows: dict[str, int] = field(default_factory=dict)
    new_questions: dict[str, int] = field(default_factory=dict)   # question groups that got new rows

    def __str__(self) -> str:
        return "; ".join(f"{self.study.name}/{s}: {self.new_rows[s]} new rows ({self.new_questions[s]} questions) "
                         f"in {self.seconds[s]:.1f} s" for s in self.stores)

    def table(self, stage: str | None = None) -> pd.DataFrame:
        """The stored rows of ``stage`` (default: the first one run)."""
        return self.stores[stage or next(iter(self.stores))].read()

    def summary(self) -> dict[str, pd.DataFrame]:
        return self.study.summarize(self.stores)

    def outcome(self) -> pd.DataFrame:
        """One row per store written: ``store`` (folder), ``stages``, ``rows`` (stored now), ``new`` (by this run),
        ``already`` (there before: resumed), ``skipped`` (bad input rows left out) and ``coverage`` (% of rows with
        ``covered``; NaN where the stage has no such column)."""
        rows: dict[Path, dict[str, Any]] = {}
        for stage, store in self.stores.items():
            # stages that share a store see it grow: count it once, as it is now
            r = rows.setdefault(store.root, {"store": store.root, "stages": [], "rows": len(ResultStore(store.root)),
                                             "new": 0,
                                             "skipped": len(store.config.get("run_info", {}).get("skipped_rows", [])),
                                             "coverage": _coverage(store)})
            r["stages"].append(stage)
            r["new"] += self.new_rows.get(stage, 0)
        out = pd.DataFrame(list(rows.values()), columns=["store", "stages", "rows", "new", "skipped", "coverage"])
        out.insert(4, "already", out["rows"] - out["new"])
        return out


def _coverage(store: ResultStore) -> float:
    """% of the store's rows whose answer was one of the options (NaN without a ``covered`` column)."""
    rows = store.read(columns=["covered"])   # a part without the column reads as missing, never quarantined
    if "covered" not in rows or rows["covered"].isna().all():
        return float("nan")
    return float(rows["covered"].astype(float).mean() * 100)


class _Models:
    """Models of one run, each loaded once (a loaded model may be passed in for its spec)."""

    def __init__(self, given: MLLM | None = None, spec: ModelSpec | None = None):
        self._loaded: dict[str, MLLM] = {}
        if given is not None and spec is not None:
            self._loaded[str(spec)] = given

    def __call__(self, spec: ModelSpec) -> MLLM:
        if str(spec) not in self._loaded:
            self._loaded[str(spec)] = spec.load()
        return self._loaded[str(spec)]


def run_study(study: "str | Study", model: "str | ModelSpec | MLLM | None" = None,
              dataset: Any = None, *,
              n: int | None = None, out: str | Path | None = None, results_dir: str | Path | None = None,
              model_args: Mapping[str, Any] | str | None = None, stages: Sequence[str] | None = None,
              shard: "Shard | str | None" = None, workers: int | None = None, ray_address: str | None = None,
              tasks: int | None = None, budget: float | int | str | None = None, adaptive: bool = False,
              budget_seed: int = 0, budget_batch: int | None = None, budget_target: float | None = None,
              budget_stop_on: Sequence[str] | None = None, budget_round: float = 0.01, progress: bool = True,
              threads: int | None = None,
              models: Callable[[ModelSpec], MLLM] | None = None, **params: Any) -> StudyRun:
    """Run ``study`` for ``model`` on ``dataset`` into resumable stores, stage by stage, and return what it did.

    ``out``: the study's results folder (its stores go there and in its stage subfolders); or ``results_dir``,
    under which the study places it (``<results_dir>/<model>/<dataset>`` for the grid studies, the folder itself
    for the judge study). ``model``: a spec string, a :class:`~mmfragile.models.spec.ModelSpec` or a loaded
    model (not with ``workers``); ``model_args``: the backend's keyword arguments (``{"max_pixels": ...}`` or
    ``"max_pixels=...,trust_remote_code=true"``). ``dataset``: a spec string or the study's data in memory - a
    question table (``mf.load_dataset(...)``'s DataFrame, used as given - its first ``n`` rows with ``n``) or, for
    the judge study, a list of judge samples - stored under the study's ``data_name`` of it (:func:`table_name`).
    ``params``: the study's parameters (see its ``params``).

    Scale: ``shard="i/n"`` runs one shard of every stage (by question group; ``mmfragile merge`` checks the
    stores afterwards); ``workers=N`` runs every stage on N Ray workers, one model replica each
    (``ray_address``, ``tasks``). ``budget`` (a share such as 0.05, or a cell count) runs a seeded stratified
    subset of each grid stage - with ``adaptive``, half of it stratified and the rest where it shrinks the
    uncertainty most (:mod:`mmfragile.budget`); stages that are no grid run whole. A budget covers the whole
    grid, so it takes neither ``shard`` nor ``workers``. ``stages``: run only these stages. ``threads``: torch CPU
    threads where the models work (None: torch's default; on a shared 2-core machine 1 is often faster)."""
    study = get_study(study)
    if (budget == "auto") != (budget_target is not None):
        raise ValueError("--budget auto stops at --target PP (the widest interval, in percentage points): give both, "
                         "or a share / cell count as --budget without --target")
    if budget == "auto" and adaptive:
        raise ValueError("--budget auto runs the stratified design in rounds: leave out --adaptive")
    if budget is not None and (Shard.parse(shard).count > 1 or workers):
        raise ValueError("a budgeted run chooses its cells over the whole grid: run it without --shard / --workers")
    if workers and shard is not None and Shard.parse(shard).count > 1:
        raise ValueError("--shard and --workers exclude each other: Ray splits the work itself")
    if ray_address and not workers:
        raise ValueError("--ray-address needs --workers N")
    loaded = model if isinstance(model, MLLM) else None
    if loaded is not None and workers:
        raise ValueError("a loaded model cannot be sent to Ray workers: pass its spec")
    spec = (spec_of(loaded) if loaded is not None
            else as_spec(cast("str | ModelSpec", model or study.default_model), model_args=model_args))
    name = spec.name
    table = None if dataset is None or isinstance(dataset, str) else dataset
    dataset = study.data_name(table) if table is not None else dataset or study.default_dataset
    if study.needs_dataset and not dataset:
        raise ValueError(f"study {study.name!r} needs a dataset (e.g. easy-vqa, synthetic-vqa, mmbench:<file.tsv>)")
    if out is None:
        if results_dir is None:
            raise ValueError("give out= (the study's results folder) or results_dir=")
        out = study.folder(results_dir, name, dataset)
    ctx = RunContext(study, spec, name, dataset, n, Path(out), study.resolve(params), budget=budget, table=table)
    _preflight(ctx, loaded)
    ctx.data = study.load(ctx)
    _warn_short(ctx)
    load_model = models or _Models(loaded, spec)
    run = StudyRun(study, name, ctx.folder, ctx.data)
    provenance: dict[str, dict[str, Any]] = {}   # per model spec, computed once
    for stage in study.stages:
        if not stage.when(ctx.params) or (stages is not None and stage.name not in stages):
            continue
        t0 = time.perf_counter()
        units = stage.units(ctx)
        store = study.stage_store(ctx.folder, stage.name, stage.config(ctx), run_info=ctx.run_info or None)
        before = stored_keys(store)
        task = StageTask(study.name, stage.name, tuple(sorted(ctx.params.items())),
                         budget if stage.budget else None, adaptive, budget_seed, budget_batch,
                         budget_target=budget_target, budget_stop_on=None if budget_stop_on is None else
                         tuple(budget_stop_on), budget_round=budget_round, progress=progress, threads=threads)
        mspecs = stage.models(ctx) if stage.models else [spec]
        for mspec in mspecs:  # every model's identity is checked before any of them loads
            _pin_model(store, mspec, loaded if mspec is spec else None, dataset, provenance)
        for mspec in mspecs:
            if workers:
                from mmfragile.distributed import run_on_ray

                report = run_on_ray(task, units, store, mspec, workers=workers, address=ray_address, n_tasks=tasks,
                                    progress=progress)
                if progress:
                    print(report)
            else:
                task(load_model(mspec), units, store, shard)
        run.stores[stage.name] = ResultStore(store.root)
        run.seconds[stage.name] = time.perf_counter() - t0
        new = stored_keys(run.stores[stage.name]) - before
        run.new_rows[stage.name] = len(new)
        run.new_questions[stage.name] = len({k[:2] for k in new})
        if new:   # this machine's rate for the model, what `mmfragile plan` times a grid by
            store.merge_run_info("rate", {name: {"rows": len(new), "seconds": round(run.seconds[stage.name], 3),
                                                 "workers": workers or 1}})
    return run


def tag(study: Study, stage: Stage) -> dict[str, str]:
    """What every store's config says it holds: ``{"study": <study name>, "stage": <stage tag>}`` - the one name
    the report, the budget, ``merge`` and the analyses read it by."""
    return {"study": study.name, "stage": stage.tag}


def _pin_model(store: ResultStore, spec: ModelSpec, loaded: MLLM | None, dataset: str | None,
               known: dict[str, dict[str, Any]]) -> None:
    """Refuse a store that holds another model under ``spec.name`` (:meth:`ResultStore.pin_model`), then record
    the model's provenance if the store has none for it yet (never rewritten over rows it did not produce)."""
    from mmfragile.provenance import model_identity

    if str(spec) not in known:
        known[str(spec)] = _provenance(spec, loaded, dataset)
    prov = known[str(spec)]
    store.pin_model(spec.name, model_identity(spec, prov["checkpoint_sha256"]))
    if spec.name not in ((store.config.get("run_info") or {}).get("provenance") or {}):
        store.merge_run_info("provenance", {spec.name: prov})


def _preflight(ctx: RunContext, loaded: MLLM | None) -> None:
    """The mistakes a run can see before it reads data or loads a model (:class:`~mmfragile.errors.UsageError`)."""
    from mmfragile.errors import UsageError
    from mmfragile.paths import check_writable_folder

    if ctx.n is not None and ctx.n < 1:
        raise UsageError(f"--n (n=) must be 1 or more, got {ctx.n}; leave it out to run every question")
    if loaded is None:
        ctx.model.check()
    check_writable_folder(ctx.folder)


def _warn_short(ctx: RunContext) -> None:
    """Say so where ``n`` asks for more questions than the dataset has."""
    if ctx.n is not None and isinstance(ctx.data, pd.DataFrame) and len(ctx.data) < ctx.n:
        import warnings

        warnings.warn(f"--n {ctx.n} but the dataset has {len(ctx.data)} questions: running {len(ctx.data)}",
                      stacklevel=3)


def _provenance(spec: ModelSpec, loaded: MLLM | None, dataset: str | None) -> dict[str, Any]:
    """What the run ran on (:mod:`mmfragile.provenance`); a run is never stopped by it: what cannot be found out
    is recorded as not recorded, with the reason. The checkpoint is the spec's (as for a run given the spec
    string), or what a model built by hand says it was loaded from."""
    from mmfragile.provenance import run_provenance

    try:
        own = loaded is not None and (loaded.spec is None or loaded.checkpoint is not None)
        folder = loaded.checkpoint if loaded is not None and own else spec.checkpoint_dir()
        return run_provenance(str(spec), folder, dataset)
    except (OSError, ValueError) as e:
        return {"model_spec": str(spec), "checkpoint_sha256": f"not recorded: {type(e).__name__}: {e}"}


def answerable(model: MLLM, items: list[EvalItem], unit: str = "prompt") -> list[EvalItem]:
    """The one policy for a model that takes no images (``supports_images`` False), in every study: the items of
    questions with images are left out of the run before any request, with one warning that counts them; the
    text questions run. A model that takes images gets every item."""
    if model.supports_images:
        return items
    kept = [it for it in items if not it.prompt.images]
    if len(kept) < len(items):
        import warnings

        with_images = {it.group for it in items if it.prompt.images}
        warnings.warn(f"{model.name} takes no images: {len(with_images)} of {len({it.group for it in items})} "
                      f"questions have images; their {len(items) - len(kept)} {unit}(s) are left out of this run",
                      stacklevel=3)
    return kept


def stored_keys(store: ResultStore) -> set[tuple[str, ...]]:
    """The stored keys (dataset, question_id, model, variant) - what a stage added is the difference."""
    if not len(store):
        return set()
    cols = ["dataset", "question_id", "model", "variant"]
    return set(store.read(columns=cols)[cols].astype(str).itertuples(index=False, name=None))  # in this order
