"""Train the model zoo (caption towers, then the answering stage) and write weights + records to
src/mmfragile/resources/zoo/.

    python scripts/train_zoo.py --train caption             # both LMs' caption towers (~15 min per LM)
    python scripts/train_zoo.py --lm smollm2 --train answer # only SmolLM2's answering stage (~40 min on 2 cores)
    python scripts/train_zoo.py --mc 300 --no-train         # only re-measure the committed zoo on 300 test questions
    python scripts/train_zoo.py --train judges [--judge seeing] # study 3's judges (~35 min each, one thread)
    python scripts/train_zoo.py --train follower            # study 2's prompt follower (~25 min, one thread)

Stage ``caption``: tower + projector write a caption ("The image shows a red circle.") into the LM's embedding
space; towers ``<lm>-caption`` and ``<lm>-caption-weak`` (an early snapshot). Stage ``answer``: the LM's linear
weights learn to answer easy-VQA train questions in the standard prompt format from the exact caption embeddings
(stored as rank-32 changes, ``lora-<lm>-answer``); every answering zoo model merges them. Stage ``judges``: the
same fine-tuning on study 3's judge prompts (:mod:`mmfragile.training.judges`: ``lora-smollm2-judge-<recipe>``,
models ``zoo-judge-<recipe>``); stage ``follower``: on Promptception prompts of half the categories
(:mod:`mmfragile.training.follower`: ``lora-smollm2-follower``, model ``zoo-follower``). Seeded; CPU results can differ in
the last bits between machines (thread count, instruction set), so the committed weights are the reference.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict

import torch

from mmfragile.data.easyvqa import load_easy_vqa
from mmfragile.models import zoo
from mmfragile.training import follower, judges, zoo as train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lm", choices=sorted(zoo.LMS), action="append", help="default: every LM of the zoo")
    ap.add_argument("--train", choices=["caption", "answer", "judges", "follower"], action="append",
                    help="stages (default: caption)")
    ap.add_argument("--judge", choices=sorted(judges.JUDGES), action="append", help="judges (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mc", type=int, default=0, help="easy-VQA test questions for the multiple-choice accuracy")
    ap.add_argument("--no-train", action="store_true", help="keep the committed weights, only measure")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lms = a.lm or sorted(zoo.LMS)
    stages = [] if a.no_train else (a.train or ["caption"])
    specs = [s for s in zoo.ZOO_SPECS if s.lm in lms and s.role == "answer"]
    if "caption" in stages:
        data = train.training_data()
        held_out = train.evaluation_data()
        for lm in lms:
            snaps = {f"{lm}-caption": train.TRAIN["steps"], f"{lm}-caption-weak": train.TRAIN["weak_steps"]}
            states, rec = train.train_tower(lm, snapshots=list(snaps.values()), data=data)
            for key, step in snaps.items():
                train.save_weights("tower", key, states[step])
                vision = train.vision_accuracy(states[step], lm, held_out)
                for s in specs:
                    if s.tower == key:
                        train.save_record(s.name, dict(asdict(rec), steps=step, run_steps=rec.steps,
                                                     description=s.description, vision_accuracy=vision))
                print(key, vision)
            print(f"caption towers {lm}: {rec.train_seconds:.0f} s")
    if "answer" in stages:
        for lm in lms:
            states, rec = train.train_answering(lm, snapshots=[train.ANSWER["steps"]])
            train.save_weights("lora", f"{lm}-answer", states[train.ANSWER["steps"]])
            train.save_record(f"answer-{lm}", asdict(rec))
            print(f"answering {lm}: {rec.train_seconds:.0f} s, train accuracy {rec.train_accuracy}")
    if "judges" in stages:
        for name in a.judge or list(judges.JUDGES):
            fine_tune(f"judge-{name}", judges.JUDGE_LM, judges.judge_builder(name), judges.JUDGE_TRAIN,
                      recipe=judges.JUDGES[name].description, shares=judges.SHARES)
    if "follower" in stages:
        fine_tune("follower", follower.FOLLOWER_LM, follower.follower_examples, follower.FOLLOWER_TRAIN,
                  training_categories=follower.TRAINING_CATEGORIES, held_out=follower.HELD_OUT,
                  modality_shares=follower.MODALITY_SHARES)
    if a.mc:
        measure(specs, a.mc)


def fine_tune(key: str, lm: str, build, run: dict, **record) -> None:
    """An answering-stage fine-tune of ``lm`` on ``build``'s examples (``run``: steps, seed), stored as
    ``lora-<lm>-<key>`` with the record ``zoo-<key>``."""
    steps = run["steps"]
    states, rec = train.train_answering(lm, snapshots=[steps], build=build, steps=steps, seed=run["seed"])
    train.save_weights("lora", f"{lm}-{key}", states[steps])
    train.save_record(f"zoo-{key}", dict(asdict(rec), **record))
    print(f"{key}: {rec.train_seconds:.0f} s, train accuracy {rec.train_accuracy}")


def measure(specs, n_questions: int) -> None:
    """Multiple-choice accuracy of each zoo model on easy-VQA test questions, added to its record (the vision
    accuracy is measured where its tower is trained)."""
    qs = load_easy_vqa("test", n=n_questions, seed=0)
    for s in specs:
        model = zoo.load_zoo(s.name)
        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            mc = train.mc_accuracy(model, qs, d, progress=True)
        mc["prompts_per_s"] = round(mc["n_items"] / (time.perf_counter() - t), 2)
        train.save_record(s.name, dict(zoo.zoo_records().get(s.name, {}), easy_vqa_test=mc))
        print(s.name, mc)
        del model


if __name__ == "__main__":
    main()
