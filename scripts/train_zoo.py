"""Train the model zoo's vision towers and write their weights + records to src/mmfragile/resources/zoo/.

    python scripts/train_zoo.py                      # both LMs: train, measure vision accuracy, save (minutes)
    python scripts/train_zoo.py --lm smollm2         # one LM
    python scripts/train_zoo.py --mc 200             # also the easy-VQA test multiple-choice accuracy (200 questions)
    python scripts/train_zoo.py --mc 200 --no-train  # only re-measure the committed zoo

Seeded; one training run per LM gives its -weak (early) and -good (final) snapshot. CPU results can differ in the
last bits between machines (thread count, instruction set), so the committed weights are the reference.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import torch

from mmfragile.data.easyvqa import load_easy_vqa
from mmfragile.models import zoo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lm", choices=sorted(zoo.LMS), action="append", help="default: every LM of the zoo")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mc", type=int, default=0, help="easy-VQA test questions for the multiple-choice accuracy")
    ap.add_argument("--no-train", action="store_true", help="keep the committed weights, only measure")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lms = a.lm or sorted(zoo.LMS)
    specs = [s for s in zoo.ZOO_SPECS if s.lm in lms]
    if not a.no_train:
        t = time.perf_counter()
        data = zoo.training_data()
        print(f"training data: {len(data.pixels)} images in {time.perf_counter() - t:.0f} s")
        held_out = zoo.evaluation_data()
        for lm in lms:
            mine = [s for s in specs if s.lm == lm]
            states, rec = zoo.train_tower(lm, snapshots=[s.steps for s in mine], data=data)
            for s in mine:
                r = dict(vars(rec), steps=s.steps, run_steps=rec.steps, description=s.description,
                         vision_accuracy=zoo.vision_accuracy(states[s.steps], lm, held_out))
                zoo.save_weights(s.name, states[s.steps], r)
                print(s.name, f"train {rec.train_seconds:.0f} s (whole run)", r["vision_accuracy"])
    if a.mc:
        qs = load_easy_vqa("test", n=a.mc, seed=0)
        for s in specs:
            model = zoo.load_zoo(s.name)
            t = time.perf_counter()
            with tempfile.TemporaryDirectory() as d:
                mc = zoo.mc_accuracy(model, qs, d, progress=True)
            mc["prompts_per_s"] = round(mc["n_items"] / (time.perf_counter() - t), 2)
            zoo.save_record(s.name, dict(zoo.zoo_records().get(s.name, {}), easy_vqa_test=mc))
            print(s.name, mc)
            del model


if __name__ == "__main__":
    main()
