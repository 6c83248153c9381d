"""Command line: ``python -m mmfragile <command>`` (or ``mmfragile <command>``).

Commands
  reproduce   run notebooks/pipeline.yaml: every notebook over its grid -> figures/ and papermill_runs/
  grid        run one notebook over a parameter grid (-p key v1,v2 ...)
  formats     run the format-bias grid (48 formats x circular shifts) for a model and dataset into a store
  prepare     build/convert the embedded default models and data once (offline)
"""
from __future__ import annotations

import argparse
import sys


def _parse_params(pairs: list[list[str]] | None) -> dict:
    import yaml

    out: dict = {}
    for key, value in pairs or []:
        vals = [yaml.safe_load(v) for v in value.split(",")] if "," in value else [yaml.safe_load(value)]
        out[key] = vals
    return out


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
    f.add_argument("--model", default="smollm2-vlm")
    f.add_argument("--dataset", default="synthetic-image")
    f.add_argument("--n", type=int, default=None, help="first n questions")
    f.add_argument("--out", required=True, help="result store folder (resumes if it exists)")
    f.add_argument("--mode", default="auto", choices=["auto", "engine", "generate"])
    f.add_argument("--batch-size", type=int, default=32)
    f.add_argument("--flush-every", type=int, default=256, help="rows per Parquet part (smaller = less lost on a kill)")
    f.add_argument("--formats", default=None, help="comma-separated format names (default: all 48 + standard)")
    f.add_argument("--skip-bad-rows", action="store_true",
                   help="leave out bad input rows (missing file, corrupt image, answer not an option, ...) instead of "
                        "stopping; they are listed in the store's config.json under run_info.skipped_rows")
    f.add_argument("--n-frames", type=int, default=None, help="frames per video question (video datasets)")
    f.add_argument("--fps", type=float, default=None, help="sample video frames at this rate (capped by --n-frames)")
    f.add_argument("--no-video-bounds", action="store_true",
                   help="sample the whole clip even where the benchmark gives a start/end window (MVBench)")
    f.add_argument("--quiet", action="store_true")

    sub.add_parser("prepare", help="build the embedded models and data (no network)")

    a = ap.parse_args(argv)
    if a.cmd == "reproduce":
        from .grid import REPO_ROOT, run_pipeline

        run_pipeline(a.pipeline or REPO_ROOT / "notebooks" / "pipeline.yaml", profile=a.profile, only=a.only,
                     out_dir=a.out or REPO_ROOT / "papermill_runs")
    elif a.cmd == "grid":
        from .grid import run_grid

        run_grid(a.notebook, _parse_params(a.param), out_dir=a.out)
    elif a.cmd == "formats":
        from .schema import DataError

        try:
            return _formats(a)
        except DataError as e:  # bad input: say which file and row, and what to do about it
            hint = "" if a.skip_bad_rows else "\n(--skip-bad-rows leaves bad rows out and lists them in config.json)"
            print(f"error: {e}{hint}", file=sys.stderr)
            return 2
    elif a.cmd == "prepare":
        from .data.synthetic import make_synthetic_vqa
        from .models.embedded import EMBEDDED_MODELS, embedded_model_path

        for name in EMBEDDED_MODELS:
            print(name, embedded_model_path(name))
        print("synthetic-vqa:", len(make_synthetic_vqa(0)), "questions")
    return 0


def _formats(a: argparse.Namespace) -> int:
    """``mmfragile formats``: load, build the grid's items, run them into the store, print the table."""
    from .api import load_dataset, load_model
    from .evaluate import format_bias_items, run_items
    from .prompts.formats import PromptFormat
    from .store import ResultStore
    from .studies.format_bias import run_config, run_info, video_settings

    model = load_model(a.model)
    qs = load_dataset(a.dataset, n=a.n, skip_bad_rows=a.skip_bad_rows)
    fmts = [PromptFormat.from_name(n) for n in a.formats.split(",")] if a.formats else None
    bounds = not a.no_video_bounds
    skipped: list[dict] | None = [] if a.skip_bad_rows else None
    items = format_bias_items(model, qs, formats=fmts, n_frames=a.n_frames, fps=a.fps, video_bounds=bounds,
                              skipped=skipped)
    cfg = run_config(model.name, a.dataset, a.n, a.formats.split(",") if a.formats else None,
                     video=video_settings(qs, a.n_frames, a.fps, bounds))
    info = run_info(qs, skipped or [])
    store = ResultStore(a.out, config=cfg, run_info=info)
    if info["skipped_rows"]:
        print(f"skipped {len(info['skipped_rows'])} bad row(s) (listed in {store.root / 'config.json'}):",
              file=sys.stderr)
        for r in info["skipped_rows"][:10]:
            print(f"  {r['reason']}", file=sys.stderr)
    if not items:
        print(f"nothing to run: none of the {len(qs)} question(s) could be put in a prompt format "
              f"(see run_info in {store.root / 'config.json'})", file=sys.stderr)
        return 1
    res = run_items(model, items, store, mode=a.mode, batch_size=a.batch_size, flush_every=a.flush_every,
                    progress=not a.quiet)
    acc = res.groupby("format")[["correct", "covered"]].mean().mul(100).round(1)
    print(acc.sort_values("correct", ascending=False).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
