"""The architecture table of docs/architectures.md: every family's tiny checkpoint (or a real checkpoint) through
every check of :mod:`mmfragile.models.conformance` - the same checks ``tests/test_architectures.py`` asserts -
and the engine's agreement with batched generate in bfloat16 (measured, not asserted: flipped answers of 30
prompts and the max |delta option logit|; ``--no-bf16`` leaves it out).

    python scripts/architecture_table.py                    # all families of mmfragile.models.tiny, markdown
    python scripts/architecture_table.py --family qwen2_vl --details
    python scripts/architecture_table.py --path /models/Qwen2.5-VL-7B-Instruct --details
"""
from __future__ import annotations

import argparse
import os
import warnings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append", help="tiny family (repeatable; default: all)")
    ap.add_argument("--path", action="append", help="a real checkpoint folder (repeatable)")
    ap.add_argument("--details", action="store_true", help="print what each check compared")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--no-bf16", action="store_true", help="leave out the bfloat16 engine-vs-generate column")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from mmfragile.api import load_model
    from mmfragile.models.conformance import CHECKS, Check, agreement_mark, engine_agreement, run_checks
    from mmfragile.models.tiny import FAMILIES, build_tiny

    targets = [(p, p) for p in a.path or []]
    if a.family or not a.path:
        targets += [(f"{f} ({', '.join(FAMILIES[f].seeds_models)})", str(build_tiny(f))) for f in a.family or FAMILIES]
    cols = ["load", *CHECKS]
    extra = [] if a.no_bf16 else ["engine bf16 vs generate"]
    print("| architecture | " + " | ".join(cols + extra) + " |\n|---|" + "---|" * len(cols + extra))
    notes = []
    for name, path in targets:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = load_model(path)
                results = {"load": Check(True, type(model.model).__name__), **run_checks(model)}
        except Exception as e:  # a checkpoint that does not load fails every column
            results = {c: Check(False, f"load failed: {type(e).__name__}: {e}") for c in cols}
        marks = [results[c].mark for c in cols]
        if extra:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    agreement = engine_agreement(load_model(path, dtype="bfloat16"))
            except Exception as e:  # noqa: BLE001 - a family that does not run in bf16 says why
                agreement = {"refused": f"{type(e).__name__}: {e}"}
            marks.append(agreement_mark(agreement))
            if a.details or "refused" in agreement:
                notes.append(f"- {name} / bf16: {agreement}")
        print(f"| {name} | " + " | ".join(marks) + " |", flush=True)
        notes += [f"- {name} / {c}: {r.detail}" for c, r in results.items() if a.details or r.ok is not True]
    if notes:
        print("\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
