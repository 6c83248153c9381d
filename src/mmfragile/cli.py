"""Command line: ``python -m mmfragile <command>`` (or ``mmfragile <command>``).

Commands
  reproduce   run notebooks/pipeline.yaml: every notebook over its grid -> figures/ and papermill_runs/
  grid        run one notebook over a parameter grid (-p key v1,v2 ...)
  formats     run the format-bias grid (48 formats x circular shifts) for a model and dataset into a store
              (--shard i/n for SLURM arrays, --workers N [--ray-address ADDR] for Ray; --budget 0.05
              [--adaptive] runs 5 % of it and estimates the whole grid, mmfragile.budget)
  promptception  Promptception prompt types for a model and dataset into a store (same --shard / --workers)
  judge       MM-JudgeBias judgments of a judge on the synthetic judge set (same --shard / --workers)
  merge       check a store against its manifests (missing / duplicate keys), compact it, merge shard stores
  prepare     build/convert the embedded models, the model zoo and data once (offline)
  report      a fragility report (report.html, report.md, report.json) of result stores of any study
"""
from __future__ import annotations

import argparse
import dataclasses
import sys


def _parse_params(pairs: list[list[str]] | None) -> dict:
    import yaml

    out: dict = {}
    for key, value in pairs or []:
        vals = [yaml.safe_load(v) for v in value.split(",")] if "," in value else [yaml.safe_load(value)]
        out[key] = vals
    return out


def _add_scale_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only shard I of N (0-based; e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT); all "
                        "shards write into the same --out, then `mmfragile merge OUT` checks completeness")
    p.add_argument("--workers", type=int, default=None,
                   help="run on N Ray workers, one model replica each (one GPU each when the cluster has GPUs)")
    p.add_argument("--ray-address", default=None, help="Ray cluster to join (default: start a local one)")
    p.add_argument("--tasks", type=int, default=None,
                   help="with --workers: split the work into this many tasks (default: one per 8 questions); keep "
                        "it the same when resuming")


def _run_study(a: argparse.Namespace, task, units: list, open_store):
    """Run a study task in one process (optionally one --shard of it) or on Ray (--workers); returns the
    store's table."""
    if a.ray_address and not a.workers:
        raise SystemExit("--ray-address needs --workers N")
    if a.workers:
        if a.shard:
            raise SystemExit("--shard and --workers exclude each other: Ray splits the work itself")
        from mmfragile.distributed import run_on_ray

        report = run_on_ray(task, units, open_store, a.model, workers=a.workers, address=a.ray_address,
                            n_tasks=a.tasks, progress=not a.quiet)
        print(report, file=sys.stderr)
        return report.store.read()
    from mmfragile.api import load_model
    from mmfragile.shards import Shard

    model = load_model(a.model)
    store = open_store(model.name)
    dataclasses.replace(task, progress=not a.quiet)(model, units, store, Shard.parse(a.shard))
    return store.read()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mmfragile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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

    f = sub.add_parser("formats", help="format-bias grid for one model and dataset (resumable)")
    f.add_argument("--model", default="zoo-smollm2-good")
    f.add_argument("--dataset", default="easy-vqa")
    f.add_argument("--n", type=int, default=None, help="first n questions")
    f.add_argument("--out", required=True, help="result store folder (resumes if it exists)")
    f.add_argument("--mode", default="auto", choices=["auto", "engine", "generate"])
    f.add_argument("--batch-size", type=int, default=32)
    f.add_argument("--flush-every", type=int, default=256, help="rows per Parquet part (smaller = less lost on a kill)")
    f.add_argument("--formats", default=None, help="comma-separated format names (default: all 48 + standard)")
    f.add_argument("--standard-format", default=None, metavar="NAME",
                   help="format of the 'standard' variant (e.g. uppercase-dot-line_break), needed for a dataset "
                        "without a Table 5 standard format (generic:...); 'none' leaves the standard variant out "
                        "(default: the dataset's standard format)")
    f.add_argument("--skip-bad-rows", action="store_true",
                   help="leave out bad input rows (missing file, corrupt image, answer not an option, ...) instead of "
                        "stopping; they are listed in the store's config.json under run_info.skipped_rows")
    f.add_argument("--n-frames", type=int, default=None, help="frames per video question (video datasets)")
    f.add_argument("--fps", type=float, default=None, help="sample video frames at this rate (capped by --n-frames)")
    f.add_argument("--no-video-bounds", action="store_true",
                   help="sample the whole clip even where the benchmark gives a start/end window (MVBench)")
    f.add_argument("--budget", type=float, default=None,
                   help="run only this share of the grid (e.g. 0.05; a number > 1 = cells) and estimate the rest "
                        "(mmfragile.budget); same store as a full run, budgets nest")
    f.add_argument("--adaptive", action="store_true",
                   help="with --budget: half the budget stratified, the rest in batches where they shrink the "
                        "uncertainty most")
    f.add_argument("--seed", type=int, default=0, help="seed of the budgeted design")
    f.add_argument("--batch", type=int, default=None, help="cells per adaptive batch (default: a tenth of the rest)")
    f.add_argument("--quiet", action="store_true")
    _add_scale_args(f)

    pc = sub.add_parser("promptception", help="Promptception run (61 prompt types) for a model and dataset "
                                              "(resumable)")
    pc.add_argument("--model", default="zoo-smollm2-good")
    pc.add_argument("--dataset", default="synthetic-vqa")
    pc.add_argument("--n", type=int, default=None, help="questions, spread over modalities (default: all)")
    pc.add_argument("--out", required=True, help="result store folder (resumes if it exists)")
    pc.add_argument("--prompt-ids", default=None, help="comma-separated prompt types (default: all 61)")
    pc.add_argument("--extractor", default=None, help="stage-2 answer matcher model (Appendix E), e.g. smollm2")
    pc.add_argument("--match-text", action="store_true", help="match an answer naming one option's text")
    pc.add_argument("--exclude-refusals", action="store_true", help="the paper's GPT-4o refusal policy")
    pc.add_argument("--model-kind", default="auto", choices=["auto", "open", "proprietary"])
    pc.add_argument("--max-new-tokens", type=int, default=48)
    pc.add_argument("--n-frames", type=int, default=16, help="frames per video question")
    pc.add_argument("--batch-size", type=int, default=16)
    pc.add_argument("--quiet", action="store_true")
    _add_scale_args(pc)

    j = sub.add_parser("judge", help="MM-JudgeBias score-wise (and pairwise) judgments on the synthetic judge set "
                                     "(resumable)")
    j.add_argument("--model", default="smollm2-vlm", help="the judge")
    j.add_argument("--out", required=True, help="results folder: data/, audit/, scores/ and pairwise/ stores")
    j.add_argument("--n-samples", type=int, default=8, help="image scenes of the synthetic judge set")
    j.add_argument("--perturbations", default=None, help="comma-separated (default: all nine of Table 1)")
    j.add_argument("--runs", type=int, default=2)
    j.add_argument("--variant", default="original", help="score-prompt variant (original, na, score_guide ...)")
    j.add_argument("--seed", type=int, default=0)
    j.add_argument("--decoding", default="sample", choices=["sample", "greedy"])
    j.add_argument("--temperature", type=float, default=0.7)
    j.add_argument("--top-p", type=float, default=0.9)
    j.add_argument("--max-new-tokens", type=int, default=80)
    j.add_argument("--pairwise", action="store_true", help="also the position and verbosity pairs")
    j.add_argument("--pairwise-max-new-tokens", type=int, default=64)
    j.add_argument("--batch-size", type=int, default=16)
    j.add_argument("--quiet", action="store_true")
    _add_scale_args(j)

    m = sub.add_parser("merge", help="check a result store against its manifests; compact it; bring in other stores")
    m.add_argument("store", help="the result store (created from the first SOURCE if missing)")
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

    a = ap.parse_args(argv)
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
    elif a.cmd == "formats":
        from mmfragile.studies.format_bias.prompts import NoStandardFormat
        from mmfragile.schema import DataError

        try:
            return _formats(a)
        except NoStandardFormat as e:  # a dataset without a Table 5 format: name the option to pass
            print(f"error: {_no_standard_message(e)}", file=sys.stderr)
            return 2
        except DataError as e:  # bad input: say which file and row, and what to do about it
            hint = "" if a.skip_bad_rows else "\n(--skip-bad-rows leaves bad rows out and lists them in config.json)"
            print(f"error: {e}{hint}", file=sys.stderr)
            return 2
    elif a.cmd == "promptception":
        from mmfragile.api import load_dataset
        from mmfragile.store import ResultStore
        from mmfragile.studies import promptception as pcs

        qs = pcs.select_questions(load_dataset(a.dataset), a.n)
        kind = pcs.resolve_model_kind(a.model, a.model_kind)
        task = pcs.PromptceptionTask(
            prompt_ids=tuple(a.prompt_ids.split(",")) if a.prompt_ids else None, model_kind=kind,
            max_new_tokens=a.max_new_tokens, n_frames=a.n_frames, extractor=a.extractor,
            exclude_refusals=a.exclude_refusals, match_text=a.match_text, batch_size=a.batch_size)
        cfg = pcs.run_config(a.model, a.dataset, kind, a.max_new_tokens, a.extractor, a.exclude_refusals, a.n_frames,
                             match_text=a.match_text)
        res = _run_study(a, task, qs.to_dict("records"), lambda name: ResultStore(a.out, cfg))
        print(pcs.summarize_run(res)["per_prompt"].round(1).to_string(index=False))
    elif a.cmd == "judge":
        from pathlib import Path

        from mmfragile.studies.judgebias.data import make_judge_set
        from mmfragile.studies import judgebias as jb

        root = Path(a.out)
        samples = make_judge_set(a.n_samples, a.seed, root / "data")
        perts = a.perturbations.split(",") if a.perturbations else list(jb.PERTURBATIONS)
        conditions = jb.build_judge_conditions(samples, perts, a.seed, root / "audit")
        gen = dict(runs=a.runs, decoding=a.decoding, temperature=a.temperature, top_p=a.top_p, seed=a.seed,
                   batch_size=a.batch_size)
        scores, pairs_store = jb.open_stores(root, jb.store_config(
            seed=a.seed, n_samples=a.n_samples, max_new_tokens=a.max_new_tokens, decoding=a.decoding,
            temperature=a.temperature, top_p=a.top_p, pairwise_max_new_tokens=a.pairwise_max_new_tokens))
        rows = _run_study(a, jb.JudgeTask(variant=a.variant, max_new_tokens=a.max_new_tokens, **gen), conditions,
                          lambda name: scores)
        print(jb.parse_failure_table(rows, by=("judge", "perturbation")).round(3).to_string(index=False))
        if a.pairwise:
            pairs = jb.position_pairs(samples) + jb.verbosity_pairs(samples, seed=a.seed)
            prs = _run_study(a, jb.PairwiseTask(max_new_tokens=a.pairwise_max_new_tokens, **gen), pairs,
                             lambda name: pairs_store)
            print(jb.parse_failure_table(prs, by=("judge", "experiment")).round(3).to_string(index=False))
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


def _formats(a: argparse.Namespace) -> int:
    """``mmfragile formats``: load, run the grid's items into the store (one process, a --shard, or Ray
    --workers), print the table."""
    from mmfragile.api import load_dataset
    from mmfragile.store import ResultStore
    from mmfragile.studies import format_bias as fbs

    qs = load_dataset(a.dataset, n=a.n, skip_bad_rows=a.skip_bad_rows)
    names = tuple(a.formats.split(",")) if a.formats else None
    bounds = not a.no_video_bounds
    video = fbs.video_settings(qs, a.n_frames, a.fps, bounds)
    info = fbs.run_info(qs, [])
    qs, include_standard, extra = _standard_option(a, qs)
    if info["skipped_rows"]:
        print(f"skipped {len(info['skipped_rows'])} bad row(s) (listed in {a.out}/config.json under run_info):",
              file=sys.stderr)
        for r in info["skipped_rows"][:10]:
            print(f"  {r['reason']}", file=sys.stderr)
    if a.budget is not None:
        return _formats_budgeted(a, qs, names, lambda name: ResultStore(
            a.out, config=fbs.run_config(name, a.dataset, a.n, names, video=video), run_info=info))
    task = fbs.FormatBiasTask(formats=names, mode=a.mode, batch_size=a.batch_size, flush_every=a.flush_every,
                              n_frames=a.n_frames, fps=a.fps, video_bounds=bounds, skip_bad_rows=a.skip_bad_rows,
                              include_standard=include_standard)
    res = _run_study(a, task, qs.to_dict("records"),
                     lambda name: ResultStore(a.out, config={**fbs.run_config(name, a.dataset, a.n, names, video=video),
                                                             **extra}, run_info=info))
    if res.empty:
        print(f"nothing to run: none of the {len(qs)} question(s) could be put in a prompt format "
              f"(see run_info in {a.out}/config.json)", file=sys.stderr)
        return 1
    acc = res.groupby("format")[["correct", "covered"]].mean().mul(100).round(1)
    print(acc.sort_values("correct", ascending=False).to_string())
    return 0


def _no_standard_message(e) -> str:
    names = ", ".join(repr(d) for d in e.datasets)
    return (f"no standard prompt format for dataset {names} (known: {', '.join(e.known)}); pass "
            "--standard-format NAME (e.g. --standard-format uppercase-dot-line_break) to give the format of the "
            "'standard' variant, or --standard-format none to leave that variant out")


def _standard_option(a: argparse.Namespace, qs):
    """``--standard-format``: (questions, include_standard, store config entries). A name sets every
    question's ``standard_format`` column (read by :func:`mmfragile.evaluate.format_bias_items`) and is recorded
    in the store's config; without it, a dataset with no Table 5 format stops here, before a model is loaded."""
    from mmfragile.studies.format_bias.items import STANDARD_FORMAT_COLUMN, standard_formats_for
    from mmfragile.studies.format_bias.prompts import PromptFormat

    value = (a.standard_format or "").strip()
    if value.lower() == "none":
        return qs, False, {"standard_format": "none"}
    if value:
        try:
            name = PromptFormat.from_name(value).name
        except ValueError as e:
            raise SystemExit(f"error: --standard-format: {e}") from None
        out = qs.assign(**{STANDARD_FORMAT_COLUMN: name})
        out.attrs = dict(qs.attrs)
        return out, True, {"standard_format": name}
    if a.budget is None:  # a budgeted run has no standard variant
        standard_formats_for(qs)  # NoStandardFormat -> the message of main()
    return qs, True, {}


def _formats_budgeted(a: argparse.Namespace, qs, names, open_store) -> int:
    """``formats --budget``: a budgeted share of the grid in one process, then the estimate of the whole grid."""
    from mmfragile.api import load_model
    from mmfragile.budget import attach_outcomes, item_cells, run_budgeted
    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.budget.estimator import FORMAT_BIAS, estimate
    from mmfragile.studies.format_bias.prompts import PromptFormat

    if a.workers or a.shard:
        raise SystemExit("--budget chooses its cells over the whole grid: run it without --shard / --workers")
    model = load_model(a.model)
    store = open_store(model.name)
    fmts = [PromptFormat.from_name(n) for n in names] if names else None
    skipped: list[dict] | None = [] if a.skip_bad_rows else None
    items = format_bias_items(model, qs, formats=fmts, include_standard=False, n_frames=a.n_frames, fps=a.fps,
                              video_bounds=not a.no_video_bounds, skipped=skipped)
    store.add_skipped_rows(skipped or [])
    run_budgeted(model, items, store, FORMAT_BIAS, a.budget if a.budget < 1 else int(a.budget), seed=a.seed,
                 adaptive=a.adaptive, batch=a.batch, mode=a.mode, batch_size=a.batch_size,
                 flush_every=a.flush_every, progress=not a.quiet)
    est = estimate(attach_outcomes(item_cells(items, FORMAT_BIAS), store, model.name), FORMAT_BIAS)
    print(est.budget.to_string(index=False))
    print(est.summary.drop(columns=["dataset"]).round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
