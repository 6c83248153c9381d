"""Command line: ``python -m mmfragile <command>`` (or ``mmfragile <command>``).

Commands
  reproduce   run notebooks/pipeline.yaml: every notebook over its grid -> figures/ and papermill_runs/
  grid        run one notebook over a parameter grid (-p key v1,v2 ...)
  formats     run the format-bias grid (48 formats x circular shifts) for a model and dataset into a store
  prepare     build/convert the embedded models, the model zoo and data once (offline)
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
        from .api import load_dataset, load_model
        from .evaluate import format_bias_items, run_items
        from .store import ResultStore

        model = load_model(a.model)
        qs = load_dataset(a.dataset, n=a.n)
        store = ResultStore(a.out, config={"study": "format-bias", "model": model.name, "dataset": a.dataset, "n": a.n,
                                           "formats": a.formats})
        from .prompts.formats import PromptFormat

        fmts = [PromptFormat.from_name(n) for n in a.formats.split(",")] if a.formats else None
        items = format_bias_items(model, qs, formats=fmts)
        res = run_items(model, items, store, mode=a.mode, batch_size=a.batch_size, flush_every=a.flush_every,
                        progress=not a.quiet)
        acc = res.groupby("format")[["correct", "covered"]].mean().mul(100).round(1)
        print(acc.sort_values("correct", ascending=False).to_string())
    elif a.cmd == "prepare":
        from .data.synthetic import make_synthetic_vqa
        from .models.embedded import EMBEDDED_MODELS, embedded_model_path
        from .models.zoo import ZOO_MODELS, zoo_model_path

        for name in EMBEDDED_MODELS:
            print(name, embedded_model_path(name))
        for name in ZOO_MODELS:  # committed tower weights + the LM -> LLaVA checkpoints (seconds each)
            print(name, zoo_model_path(name))
        print("synthetic-vqa:", len(make_synthetic_vqa(0)), "questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
