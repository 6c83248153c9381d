"""Train the model zoo (vision towers, then LM adapters) and write weights + records to src/mmfragile/resources/zoo/.

    python scripts/train_zoo.py                          # both LMs: towers, then adapters, measure, save
    python scripts/train_zoo.py --lm smollm2 --train lora  # only SmolLM2's LoRA adapter (its tower as committed)
    python scripts/train_zoo.py --mc 200                 # also the easy-VQA test multiple-choice accuracy (200 q)
    python scripts/train_zoo.py --mc 200 --no-train      # only re-measure the committed zoo

Stage ``tower``: one run per LM gives its -weak (early) and -good (final) tower snapshot (minutes). Stage ``lora``:
a low-rank adapter of the LM's top layers trained on easy-VQA train questions in the prompt formats of study 1,
reading pictures through the frozen -good tower. Seeded; CPU results can differ in the last bits between machines
(thread count, instruction set), so the committed weights are the reference.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict

import torch

from mmfragile.data.easyvqa import load_easy_vqa
from mmfragile.models import zoo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lm", choices=sorted(zoo.LMS), action="append", help="default: every LM of the zoo")
    ap.add_argument("--train", choices=["tower", "lora"], action="append", help="stages to train (default: both)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mc", type=int, default=0, help="easy-VQA test questions for the multiple-choice accuracy")
    ap.add_argument("--no-train", action="store_true", help="keep the committed weights, only measure")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lms = a.lm or sorted(zoo.LMS)
    stages = [] if a.no_train else (a.train or ["tower", "lora"])
    specs = [s for s in zoo.ZOO_SPECS if s.lm in lms]
    if "tower" in stages:
        t = time.perf_counter()
        data = zoo.training_data()
        print(f"training data: {len(data.pixels)} images in {time.perf_counter() - t:.0f} s")
        held_out = zoo.evaluation_data()
        for lm in lms:
            snaps = {f"{lm}-good": zoo.TRAIN["steps"], f"{lm}-weak": zoo.TRAIN["weak_steps"]}
            states, rec = zoo.train_tower(lm, snapshots=list(snaps.values()), data=data)
            for key, steps in snaps.items():
                zoo.save_weights("tower", key, states[steps])
                r = dict(asdict(rec), steps=steps, run_steps=rec.steps,
                         vision_accuracy=zoo.vision_accuracy(states[steps], lm, held_out))
                for s in specs:
                    if s.tower == key:
                        zoo.save_record(s.name, dict(zoo.zoo_records().get(s.name, {}), **r, description=s.description))
                print(key, f"train {rec.train_seconds:.0f} s (whole run)", r["vision_accuracy"])
    if "lora" in stages:
        for lm in lms:
            states, rec = zoo.train_lora(lm, snapshots=[zoo.LORA["steps"]])
            zoo.save_weights("lora", lm, states[zoo.LORA["steps"]])
            for s in specs:
                if s.lora == lm:
                    zoo.save_record(s.name, dict(zoo.zoo_records().get(s.name, {}), lora=asdict(rec),
                                                 description=s.description))
            print(f"LoRA {lm}: {rec.train_seconds:.0f} s")
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
