"""Command line: ``python -m mmfragile <command>`` (or ``mmfragile <command>``).

Commands
  reproduce   run notebooks/pipeline.yaml: every notebook over its grid -> figures/ and papermill_runs/
  grid        run one notebook over a parameter grid (-p key v1,v2 ...)
  run STUDY   run a study (format-bias, promptception, judge) for a model and dataset into resumable stores:
              --model-args k=v,..., --shard i/n (SLURM arrays) or --workers N [--ray-address ADDR] (Ray),
              --budget 0.05 [--adaptive] for the grid studies (5 % of the grid, the rest estimated); the
              study's own parameters as options (mmfragile run STUDY --help)
  formats, promptception, judge   the same as run format-bias / promptception / judge
  benchmarks  the benchmark registry (names, spec prefixes, standard formats, sources)
  merge       check a store against its manifests (missing / duplicate keys), compact it, merge shard stores
  prepare     build/convert the embedded models, the model zoo and data once (offline)
  report      a fragility report (report.html, report.md, report.json) of result stores of any study
  export      a study's grid as another harness' tasks (export lmms-eval|lm-eval|vlmevalkit ...)
  import      another harness' outputs as a result store (import lmms-eval|lm-eval|vlmevalkit RUN... --out STORE)
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import warnings
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    """A mistake in the arguments is one line (``error: ...``, exit 2) saying where the help is."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: a run stops as on Ctrl-C (its finished rows stored)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def _one_line(e: BaseException) -> str:
    """An error or warning as one line, its secrets masked (an API key never reaches a terminal or a log)."""
    from mmfragile.redaction import redact

    return redact(" ".join(str(e).split()))


#: what the vLLM environment (scripts/install_vllm.sh) leaves out: the notebook runners of `reproduce` and `grid`
_NOTEBOOK_MODULES = ("papermill", "nbformat", "ipykernel")


def _missing_module(e: ModuleNotFoundError) -> str:
    """A module this environment lacks, as one line naming the script that builds the environment that has it."""
    venv = os.environ.get("VIRTUAL_ENV") or sys.prefix
    module = e.name.partition(".")[0]
    import importlib.util

    in_vllm_env = "vllm" in Path(venv).name or importlib.util.find_spec("vllm") is not None
    if in_vllm_env and module in _NOTEBOOK_MODULES:
        return (f"this environment ({venv}) has no module {module!r}: the vLLM environment runs every command but "
                "the notebooks; run `reproduce` / `grid` in the main environment (`bash scripts/install.sh`)")
    script = "scripts/install_vllm.sh" if in_vllm_env else "scripts/install.sh"
    return (f"this environment ({venv}) has no module {module!r}; (re)build it with `bash {script}` from the "
            "repository (it installs everything mmfragile imports)")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {_one_line(message)}", file=sys.stderr)


class _Redacting:
    """A text stream whose every write has its secrets masked: whatever the CLI prints (summaries, the "next:" line,
    run hints, merge and store reports, progress) never shows an API key."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        from mmfragile.redaction import redact

        return self._stream.write(redact(text))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _parse_params(pairs: list[list[str]] | None) -> dict:
    import yaml

    out: dict = {}
    for key, value in pairs or []:
        vals = [yaml.safe_load(v) for v in value.split(",")] if "," in value else [yaml.safe_load(value)]
        out[key] = vals
    return out


def _add_model_data_args(p: argparse.ArgumentParser, study, out_help: str, out_required: bool) -> None:
    """The model, dataset, question count and results folder options (``run`` and ``plan``)."""
    p.add_argument("--model", default=None,
                   help="model spec: embedded / zoo name, checkpoint folder, cached model id, vllm:..., "
                        f"openai:<url>::<model> (mmfragile.models.spec; default {study.default_model})")
    p.add_argument("--model-args", default=None, metavar="K=V,...",
                   help="keyword arguments of the model's backend, e.g. max_pixels=1048576,trust_remote_code=true; "
                        "name=NEW names the model in stores and reports (a store holds one model per name: resuming "
                        "with another checkpoint or output-changing argument is refused; docs/stores.md)")
    p.add_argument("--dataset", default=study.default_dataset,
                   help="dataset spec (python -m mmfragile benchmarks lists them)")
    p.add_argument("--n", type=int, default=None, help="questions, 1 or more (default: all)")
    p.add_argument("--out", required=out_required, default=None, help=out_help)


def _add_run_args(p: argparse.ArgumentParser, study) -> None:
    """The options of ``run <study>`` (and its alias): the runner's, then the study's own parameters."""
    from mmfragile.study import csv_list

    _add_model_data_args(p, study, "results folder of the run (resumes if it exists)", out_required=True)
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only shard I of N (0-based; e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT); all "
                        "shards write into the same --out, then `mmfragile merge OUT` checks completeness")
    p.add_argument("--workers", type=int, default=None,
                   help="run on N Ray workers, one model replica each (one GPU each when the cluster has GPUs)")
    p.add_argument("--ray-address", default=None, help="Ray cluster to join (default: start a local one)")
    p.add_argument("--tasks", type=int, default=None,
                   help="with --workers: split the work into this many tasks (default: one per 8 questions); keep "
                        "it the same when resuming")
    if any(s.budget for s in study.stages):
        p.add_argument("--budget", type=_budget_arg, default=None,
                       help="run only this share of the grid (e.g. 0.05; a number > 1 = cells) and estimate the rest "
                            "(mmfragile.budget); same store as a full run, budgets nest. 'auto' (with --target): "
                            "seeded rounds until the widest interval is at most the target")
        p.add_argument("--target", type=float, default=None,
                       help="with --budget auto: stop when the widest 90 %% interval of the --stop-on statistics is "
                            "at most this many percentage points (e.g. 1.0)")
        p.add_argument("--stop-on", type=csv_list, default=None,
                       help="with --budget auto: the statistics to stop on (default: mean,spread; also q05 ... q95, "
                            "best, worst)")
        p.add_argument("--budget-round", type=float, default=0.01,
                       help="with --budget auto: the share of the grid each round adds (default 0.01)")
        p.add_argument("--adaptive", action="store_true",
                       help="with --budget: half the budget stratified, the rest in batches where they shrink the "
                            "uncertainty most")
        p.add_argument("--budget-seed", type=int, default=0, help="seed of the budgeted design")
        p.add_argument("--budget-batch", type=int, default=None,
                       help="cells per adaptive batch (default: a tenth of the rest)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads where the models work (default: torch's; 1 is often faster on a shared "
                        "2-core machine)")
    p.add_argument("--quiet", action="store_true")
    _add_params(p.add_argument_group(f"{study.name} parameters"), study.params)


def _budget_arg(text: str) -> float | str:
    """``--budget``: ``auto`` or a number."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share (0.05), a cell count (600) or 'auto', not {text!r}")


def _add_params(group, params, given_only: bool = False) -> None:
    """The options of study parameters; ``given_only``: absent from the namespace unless given (export, where
    several studies' options share one parser)."""
    for prm in params:
        default = argparse.SUPPRESS if given_only else prm.default
        if prm.type is bool:
            group.add_argument(prm.flag, dest=prm.name, action="store_false" if prm.default else "store_true",
                               default=default, help=prm.help)
        else:
            group.add_argument(prm.flag, dest=prm.name, type=prm.type or str, default=default,
                               choices=prm.choices, help=prm.help)


def _run(a: argparse.Namespace, study) -> int:
    """``run <study>``: the study through :func:`mmfragile.study.run_study`; prints its summary tables."""
    from mmfragile.study import run_study
    from mmfragile.errors import DataError

    params = {prm.name: getattr(a, prm.name) for prm in study.params}
    budget = getattr(a, "budget", None)
    if a.model is None:  # say which model runs, before it runs
        a.model = study.default_model
        print(f"model: {a.model} (default; pass --model to choose)", file=sys.stderr)
    before = _stored_rows(a.out)
    try:
        run = run_study(study, a.model, a.dataset, n=a.n, out=a.out, model_args=a.model_args, shard=a.shard,
                        workers=a.workers, ray_address=a.ray_address, tasks=a.tasks,
                        budget=None if budget is None else (budget if budget == "auto" or budget < 1 else int(budget)),
                        adaptive=getattr(a, "adaptive", False), budget_seed=getattr(a, "budget_seed", 0),
                        budget_batch=getattr(a, "budget_batch", None), budget_target=getattr(a, "target", None),
                        budget_stop_on=getattr(a, "stop_on", None), budget_round=getattr(a, "budget_round", 0.01),
                        progress=not a.quiet, threads=a.threads, **params)
    except tuple(study.errors) as e:  # the study's own errors: its one line names what to pass
        print(f"error: {_one_line(study.error_line(e))}", file=sys.stderr)
        return 2
    except DataError as e:  # bad input: say which file and row, and what to do about it
        hint = "" if params.get("skip_bad_rows") or e.row is None else \
            "\n(--skip-bad-rows leaves bad rows out and lists them in config.json)"
        print(f"error: {_one_line(e)}{hint}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        return _interrupted(e, a.out, before)
    skipped = next(iter(run.stores.values())).config.get("run_info", {}).get("skipped_rows", []) if run.stores else []
    if skipped:
        print(f"skipped {len(skipped)} bad row(s) (listed in {a.out}/config.json under run_info):", file=sys.stderr)
        for r in skipped[:10]:
            print(f"  {r['reason']}", file=sys.stderr)
    if run.stores and all(len(s) == 0 for s in run.stores.values()):
        print(f"nothing to run: no item could be made (see run_info in {a.out}/config.json)", file=sys.stderr)
        return 1
    for name, table in run.summary().items():
        print(f"# {name}")
        print(table.round(1).to_string(index=table.index.name is not None))
    if budget is not None:
        from mmfragile.budget import estimate_store, estimate_tables, grid_units

        for stage in study.stages:
            if stage.budget and stage.name in run.stores:  # the same numbers as `mmfragile report` on this store
                store = run.stores[stage.name]
                est = estimate_store(stage.budget.read(store), stage.budget, units=grid_units([store.config]))
                for name, table in estimate_tables(est).items():
                    print(f"# {name} ({stage.budget.spec.name} grid estimate)")
                    print(table.to_string(index=False))
    _print_outcome(run, a.out)
    return 0


def _print_outcome(run, out: str) -> None:
    """What the run did (stderr): each store with its rows new / already there / skipped and coverage, then the
    command that comes next."""
    for r in run.outcome().itertuples(index=False):
        stages = ", ".join(f"{run.study.name}/{s}" for s in r.stages)
        cov = "" if r.coverage != r.coverage else f"; coverage {r.coverage:.1f} %"
        print(f"stored: {r.store} ({stages}): {r.rows} rows - {r.new} new, {r.already} already there, "
              f"{r.skipped} bad input rows skipped{cov}", file=sys.stderr)
    q = shlex.quote(str(out))
    print(f"next: python -m mmfragile report {q} --out {shlex.quote(str(Path(out) / 'report'))}", file=sys.stderr)


def _stored_rows(out: str) -> dict[Path, int]:
    """Rows per result store under ``out``, read-only."""
    from mmfragile.store import ResultStore, store_folders

    return {folder: len(ResultStore(folder)) for folder in store_folders(out)} if Path(out).is_dir() else {}


def _interrupted(e: KeyboardInterrupt, out: str, before: dict[Path, int]) -> int:
    """Ctrl-C / SIGTERM during a run: how many rows are safe, how to go on; exit 130 / 143."""
    now = _stored_rows(out)
    total, new = sum(now.values()), sum(n - before.get(p, 0) for p, n in now.items())
    print(f"\ninterrupted: {total} rows saved in {out} ({new} new); rerun the same command to resume",
          file=sys.stderr)
    return _interrupt_code(e)


def _interrupt_code(e: KeyboardInterrupt) -> int:
    return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    """Run a command. A user's mistake is one line ``error: ...`` (exit 2); any other failure is one line
    ``error: <Type>: <message>`` (exit 1; ``--debug`` or ``MMFRAGILE_DEBUG=1`` shows the traceback); Ctrl-C exits
    130 and SIGTERM 143, both without a traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("MMFRAGILE_DEBUG", "") not in ("", "0")
    argv = [x for x in argv if x != "--debug"]  # accepted anywhere on the line
    if "--deterministic" in argv:  # accepted anywhere too: pins the arithmetic before torch loads (determinism)
        from mmfragile.determinism import enable

        try:
            enable()
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        argv = [x for x in argv if x != "--deterministic"]
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Redacting(sys.stdout), _Redacting(sys.stderr)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning  # one line each
            return _main(argv)
    except SystemExit as e:  # argparse: --help (0) or a mistake in the arguments, already said (2)
        return e.code if isinstance(e.code, int) else int(e.code is not None) * 2
    except BrokenPipeError:  # output piped into `head`: nothing more to say (Python docs, "Note on SIGPIPE")
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as e:
        print("\ninterrupted", file=sys.stderr)
        return _interrupt_code(e)
    except Exception as e:
        from mmfragile.errors import DataError, UsageError
        from mmfragile.store import ConfigMismatch

        if debug:
            raise
        if isinstance(e, (UsageError, ConfigMismatch, DataError)):  # the user's to mend: say what, exit 2
            print(f"error: {_one_line(e)}", file=sys.stderr)
            return 2
        if isinstance(e, ModuleNotFoundError) and e.name:
            print(f"error: {_one_line(_missing_module(e))}", file=sys.stderr)
            return 1
        print(f"error: {type(e).__name__}: {_one_line(e)} (mmfragile --debug ... or MMFRAGILE_DEBUG=1 shows the "
              "traceback)", file=sys.stderr)
        return 1
    finally:
        sys.stdout, sys.stderr = streams
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _main(argv: list[str]) -> int:
    ap = _Parser(prog="mmfragile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--debug", action="store_true",
                    help="show the traceback of an error (also MMFRAGILE_DEBUG=1; accepted anywhere on the line)")
    ap.add_argument("--deterministic", action="store_true",
                    help="pin what decides the arithmetic (CPU ISA, MKL, oneDNN: the same numbers on any x86-64 "
                         "machine; also MMFRAGILE_DETERMINISTIC=1; accepted anywhere on the line; docs/numerics.md)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("reproduce", help="run the whole pipeline (notebooks/pipeline.yaml)")
    r.add_argument("--pipeline", default=None)
    r.add_argument("--profile", default="default", help="grid profile in the pipeline file (default, quick, full)")
    r.add_argument("--only", nargs="*", help="run only notebooks whose name contains one of these")
    r.add_argument("--out", default=None, help="folder for executed notebooks (default papermill_runs/)")

    g = sub.add_parser("grid", help="run one notebook over a parameter grid")
    g.add_argument("notebook")
    g.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUES"),
                   help="parameter and comma-separated values; several -p make a cartesian grid")
    g.add_argument("--out", default="papermill_runs")

    from mmfragile.study import SHORTCUTS, get_study, study_names

    run = sub.add_parser("run", help=f"run a study ({', '.join(study_names())}) for a model into result stores")
    studies = run.add_subparsers(dest="study", required=True)
    for name in study_names():
        st = get_study(name)
        _add_run_args(studies.add_parser(name, help=st.title, description=st.title), st)
    for alias in SHORTCUTS:
        st = get_study(alias)
        _add_run_args(sub.add_parser(alias, help=f"= run {st.name}: {st.title}"), st)

    pl = sub.add_parser("plan", help="what a study's run would cost, before any model loads: prompts, time at this "
                                     "machine's measured rate, budgets, questions to detect an effect")
    plans = pl.add_subparsers(dest="study", required=True)
    for name in study_names():
        st = get_study(name)
        q = plans.add_parser(name, help=st.title)
        _add_model_data_args(q, st, "the results folder of a run (its measured rate and accuracy are read)",
                             out_required=False)
        q.add_argument("--effect", type=float, default=2.0, help="per-variant effect to detect, pp (default 2)")
        q.add_argument("--budgets", type=lambda s: [float(x) for x in s.split(",")], default=None,
                       help="budgets to cost (default 0.01,0.02,0.05,0.1,1)")
        _add_params(q.add_argument_group(f"{st.name} parameters"), st.params)

    sub.add_parser("benchmarks", help="the benchmark registry: names, spec prefixes, standard formats, sources")

    m = sub.add_parser("merge", help="check a result store against its manifests; compact it; bring in other stores")
    m.add_argument("store", help="the result store (if missing: built from the SOURCEs in a temporary folder, "
                                 "renamed when complete)")
    m.add_argument("sources", nargs="*", help="stores whose rows and manifests to add (e.g. per-shard stores)")
    m.add_argument("--no-compact", action="store_true", help="leave the parts as they are")
    m.add_argument("--show", type=int, default=5, help="example keys to print per problem")

    sub.add_parser("prepare", help="build the embedded models and data (no network)")

    rp = sub.add_parser("report", help="fragility report of result stores: self-contained report.html + .md + .json")
    rp.add_argument("stores", nargs="+", help="result stores, or folders holding stores (any study)")
    rp.add_argument("--out", required=True, help="folder for report.html, report.md, report.json and figures/")
    rp.add_argument("--n-boot", type=int, default=1000, help="bootstrap draws over questions (default 1000)")
    rp.add_argument("--seed", type=int, default=0, help="bootstrap seed (the report is deterministic)")
    rp.add_argument("--level", type=float, default=0.95, help="interval coverage (default 0.95)")
    rp.add_argument("--title", default=None)
    rp.add_argument("--screenshot", default=None, metavar="PNG",
                    help="also a PNG screenshot of the page (needs chromium: scripts/install_browser.sh)")
    rp.add_argument("--screenshot-height", type=int, default=None, help="screenshot height in px (default: whole page)")

    _add_export_args(sub)
    _add_import_args(sub)

    a = ap.parse_args(argv)
    if a.cmd == "export":
        return _export(a)
    if a.cmd == "import":
        return _import(a)
    if a.cmd == "reproduce":
        from mmfragile.grid import REPO_ROOT, run_pipeline

        run_pipeline(a.pipeline or REPO_ROOT / "notebooks" / "pipeline.yaml", profile=a.profile, only=a.only,
                     out_dir=a.out or REPO_ROOT / "papermill_runs")
        if not a.only or any(o in "report" for o in a.only):  # the profile's fragility report (pipeline.yaml `report`)
            from mmfragile.report import report_for_profile

            report_for_profile(a.pipeline or REPO_ROOT / "notebooks" / "pipeline.yaml", profile=a.profile)
    elif a.cmd == "grid":
        from mmfragile.grid import run_grid

        run_grid(a.notebook, _parse_params(a.param), out_dir=a.out)
    elif a.cmd == "run":
        return _run(a, get_study(a.study))
    elif a.cmd in SHORTCUTS:
        return _run(a, get_study(a.cmd))
    elif a.cmd == "plan":
        from mmfragile.budget.plan import DEFAULT_BUDGETS, plan_study

        st = get_study(a.study)
        print(plan_study(st, a.model, a.dataset, n=a.n, out=a.out, model_args=a.model_args,
                         budgets=a.budgets or DEFAULT_BUDGETS, effect=a.effect,
                         **{prm.name: getattr(a, prm.name) for prm in st.params}))
    elif a.cmd == "benchmarks":
        from mmfragile.data.benchmarks import benchmark_table

        print(benchmark_table().to_string(index=False))
    elif a.cmd == "merge":
        from mmfragile.store import merge_stores

        report = merge_stores(a.store, a.sources, compact=not a.no_compact)
        print(report)
        return 0 if report.complete else 1
    elif a.cmd == "report":
        from mmfragile.report import build_report

        rep = build_report(a.stores, a.out, n_boot=a.n_boot, seed=a.seed, level=a.level, title=a.title)
        print(f"{rep.html}\n{rep.markdown}\n{rep.json}")
        for n in rep.notes:
            print(f"note: {n}", file=sys.stderr)
        if a.screenshot:
            from mmfragile.report.browser import BrowserUnavailable, screenshot_page

            try:
                print(screenshot_page(rep.html, a.screenshot, height=a.screenshot_height))
            except BrowserUnavailable as e:
                print(f"no screenshot: {e}", file=sys.stderr)
                return 1
    elif a.cmd == "prepare":
        from mmfragile.data.synthetic import make_synthetic_vqa
        from mmfragile.models.embedded import EMBEDDED_MODELS, embedded_model_path
        from mmfragile.models.zoo import ZOO_MODELS, zoo_model_path

        for name in EMBEDDED_MODELS:
            print(name, embedded_model_path(name))
        for name in ZOO_MODELS:  # committed tower weights + the LM -> LLaVA checkpoints (seconds each)
            print(name, zoo_model_path(name))
        print("synthetic-vqa:", len(make_synthetic_vqa(0)), "questions")
    return 0


def _add_export_args(sub) -> None:
    """``export <harness>``: a study's grid as a harness' tasks (:data:`mmfragile.harness.BRIDGES`), with each
    exportable study's own parameters (``--formats``, ``--prompt-ids`` ...)."""
    from mmfragile.harness import BRIDGES
    from mmfragile.study import get_study

    ex = sub.add_parser("export", help=f"a study's grid as another harness' tasks ({', '.join(BRIDGES)})")
    harness = ex.add_subparsers(dest="harness", required=True)
    for bridge in BRIDGES.values():
        studies = bridge.load().STUDIES
        p = harness.add_parser(bridge.name, help=bridge.exports,
                               description=f"Write {bridge.exports} of a study's grid (mmfragile's prompts, keys and "
                                           "scoring; the command that runs it is printed), read its outputs back "
                                           f"with `mmfragile import {bridge.name}` (docs/harnesses.md).")
        p.add_argument("--study", default=studies[0], choices=studies, help=f"the study (default {studies[0]})")
        p.add_argument("--model", required=True,
                       help=f"the model {bridge.name} will run (checkpoint folder, zoo or embedded name): its tokenizer "
                            "sizes each variant's answer budget and gives its end-of-turn tokens, its name names the "
                            "imported store")
        p.add_argument("--dataset", default=bridge.default_dataset,
                       help="dataset spec (python -m mmfragile benchmarks lists them)")
        p.add_argument("--n", type=int, default=None, help="questions (default: all)")
        seen: set[str] = set()
        for name in studies:  # each study's own parameters, in the namespace only where given
            fresh = [prm for prm in get_study(name).params if prm.name not in seen]
            seen |= {prm.name for prm in fresh}
            _add_params(p.add_argument_group(f"{name} parameters"), fresh, given_only=True)
        p.add_argument("--out", required=True, help="folder for the export (tasks, data files, manifest)")


def _export(a: argparse.Namespace) -> int:
    from mmfragile.harness import BRIDGES
    from mmfragile.study import get_study

    bridge = BRIDGES[a.harness]
    params = {k: v for k, v in vars(a).items()
              if any(k == prm.name for s in bridge.load().STUDIES for prm in get_study(s).params)}
    other = sorted(set(params) - {prm.name for prm in get_study(a.study).params})
    if other:
        print(f"error: {', '.join('--' + k.replace('_', '-') for k in other)}: not a parameter of --study {a.study}",
              file=sys.stderr)
        return 2
    try:
        man = bridge.export(a.study, a.model, a.dataset, a.out, n=a.n, **params)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    print(bridge.load().run_hint(man, a.out))
    return 0


def _add_import_args(sub) -> None:
    """``import <harness>``: a harness' outputs of an exported grid as a result store."""
    from mmfragile.harness import BRIDGES

    im = sub.add_parser("import", help=f"another harness' logs as a result store ({', '.join(BRIDGES)})")
    harness = im.add_subparsers(dest="harness", required=True)
    for bridge in BRIDGES.values():
        p = harness.add_parser(bridge.name, help=f"{bridge.name} outputs of an exported grid -> a result store",
                               description=f"Read {bridge.reads} into the study's result store; `mmfragile report "
                                           "STORE` reads it.")
        p.add_argument("runs", nargs="+", metavar=bridge.runs_metavar, help=bridge.runs_help)
        p.add_argument("--out", required=True, help="the result store to create")
        p.add_argument("--export", default=None, metavar="DIR",
                       help="the folder `mmfragile export` wrote (default: found from the run's own files)")
        p.add_argument("--model", default=None, help="name of the model in the store (default: the export's --model)")


def _import(a: argparse.Namespace) -> int:
    from mmfragile.harness import BRIDGES
    from mmfragile.harness.common import HarnessError
    from mmfragile.store import ConfigMismatch

    try:
        store = BRIDGES[a.harness].import_runs(a.runs, a.out, export=a.export, model=a.model)
    except (HarnessError, ConfigMismatch) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    print(store.check())
    return 0


if __name__ == "__main__":
    sys.exit(main())
