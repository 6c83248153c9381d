"""Tiny copies of the benchmark releases, written offline in the authors' published layouts (for tests, demos
and trying the loaders without the real downloads).

Each ``write_<benchmark>(root, bad_rows=False)`` writes a few questions - random-noise images with a
coloured square (so images are distinct, compressible JPEGs of a realistic structure), real MP4 / WebM /
AVI clips encoded with PyAV, a frame folder - in the file names, columns and encodings of
:mod:`mmfragile.data.loaders`' module docstring, and returns the :func:`~mmfragile.data.loaders.load_dataset`
spec that reads it. ``bad_rows=True`` appends bad rows of the kinds that release can contain (corrupt base64, answer
not among the options, missing video, ...); each writer's comments say which.

Command line (prints the spec)::

    python -m mmfragile.data.fixtures mvbench mvbench_fixture [--bad-rows]
"""
from __future__ import annotations

import argparse
import ast
import base64
import io
import json
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from mmfragile.data.benchmarks import BENCHMARKS

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 20)}
NAMES = list(COLOURS)


def noise_image(seed: int, size: tuple[int, int] = (64, 48), colour: str | None = None):
    """A PIL image: uniform noise with a filled square of ``colour`` (default: by seed) in the middle."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    c = COLOURS[colour or NAMES[seed % len(NAMES)]]
    arr[h // 4: 3 * h // 4, w // 4: 3 * w // 4] = c
    return Image.fromarray(arr)


def jpeg_bytes(seed: int, size: tuple[int, int] = (64, 48), quality: int = 90) -> bytes:
    buf = io.BytesIO()
    noise_image(seed, size).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_video(path: str | Path, n_frames: int = 8, fps: int = 4, size: tuple[int, int] = (32, 32),
                seed: int = 0) -> Path:
    """A real video file (codec by suffix: .mp4 H.264, .webm VP8, .avi MJPEG) whose frame ``i`` is filled
    with grey level ``(seed * 37 + i * 25) % 256`` - so a decoded frame tells which one it is."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    codec, pix = {".webm": ("libvpx", "yuv420p"), ".avi": ("mjpeg", "yuvj420p")}.get(path.suffix.lower(),
                                                                                     ("libx264", "yuv420p"))
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height = size
        s.pix_fmt = pix
        for i in range(n_frames):
            grey = np.full((size[1], size[0], 3), (seed * 37 + i * 25) % 256, np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(grey, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def _question(seed: int) -> tuple[str, list[str], int]:
    answer = seed % 4
    return "What colour is the square in the middle?", list(NAMES), answer


# ---------------------------------------------------------------------------------------------- image benchmarks
def write_aokvqa(root: str | Path, bad_rows: bool = False) -> str:
    root = Path(root)
    (root / "coco" / "val2017").mkdir(parents=True, exist_ok=True)
    recs = []
    for i in range(3):
        q, opts, a = _question(i)
        image_id = 1000 + i
        (root / "coco" / "val2017" / f"{image_id:012d}.jpg").write_bytes(jpeg_bytes(i))
        recs.append({"split": "val", "image_id": image_id, "question_id": f"q{i}", "question": q, "choices": opts,
                     "correct_choice_idx": a, "direct_answers": [opts[a]] * 10, "difficult_direct_answer": False,
                     "rationales": ["The square has that colour."]})
    if bad_rows:
        recs.append({**recs[0], "question_id": "bad-idx", "correct_choice_idx": 7})   # answer not among choices
        recs.append({**recs[0], "question_id": "bad-img", "image_id": 999999})        # image missing
    ann = root / "aokvqa_v1p0_val.json"
    ann.write_text(json.dumps(recs))
    return f"aokvqa:{ann}::{root / 'coco'}"


def _tsv_rows(n: int, size=(64, 48)) -> list[dict]:
    rows = []
    for i in range(n):
        q, opts, a = _question(i)
        rows.append({"index": i, "question": q, "hint": "Look at the middle." if i % 2 else "",
                     **dict(zip("ABCD", opts)), "answer": "ABCD"[a], "category": "attribute_recognition",
                     "image": b64(jpeg_bytes(i, size)), "source": "fixture", "l2-category": "finegrained_perception",
                     "comment": "", "split": "dev"})
    return rows


def _circular_copy(main: dict, k: int, shift: int, **changes) -> dict:
    """VLMEvalKit's circular copy ``k`` of a main MMBench row: index + k * 1e6, options rotated left by
    ``shift`` (the answer letter with them), image = the main row's index; ``changes`` overwrite cells."""
    letters = [c for c in "ABCD" if main[c]]
    opts = [main[c] for c in letters]
    rot = opts[shift:] + opts[:shift]
    ans = "ABCD"[(letters.index(main["answer"]) - shift) % len(opts)]
    return {**main, **dict(zip(letters, rot)), "index": main["index"] + k * 1_000_000, "answer": ans,
            "image": str(main["index"]), **changes}


def write_mmbench(root: str | Path, bad_rows: bool = False, bad_copies: bool = False) -> str:
    """``MMBench_DEV_EN_V11.tsv``: 3 questions and a circular copy of question 0 (row 3). ``bad_copies``
    appends rows ``index >= 1e6`` of which only the first is a circular copy (rows 4-8 without ``bad_rows``;
    see the comments)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = _tsv_rows(3)
    rows[2].update(C="", D="", answer="B")  # a 2-option question (MMBench has 2-4 options)
    # VLMEvalKit's circular copy of question 0: index + 1e6, options rotated, image = the main row's index
    rows.append({**rows[0], "index": 1_000_000, "A": rows[0]["B"], "B": rows[0]["C"], "C": rows[0]["D"],
                 "D": rows[0]["A"], "answer": "D", "image": "0"})
    if bad_copies:
        main = [dict(r) for r in rows[:3]]
        rows += [
            _circular_copy(main[0], 2, 2),                                          # a true copy (rotated by 2)
            _circular_copy(main[1], 1, 1, question="How many squares are there?"),  # a real question, not a copy
            _circular_copy(main[0], 3, 3, A=main[0]["A"], B=main[0]["D"]),          # options not a rotation
            _circular_copy(main[2], 1, 1, answer="B"),                              # answer not rotated (A)
            _circular_copy({**main[1], "index": 7}, 1, 1, image="1"),               # copy of index 7: no such row
        ]
    if bad_rows:
        good = rows[1]["image"]
        rows.append({**rows[1], "index": 3, "image": good[:200] + "!?" + good[202:]})  # corrupt base64 text
        rows.append({**rows[1], "index": 4, "answer": "E"})                                       # answer not an option
    f = root / "MMBench_DEV_EN_V11.tsv"
    pd.DataFrame(rows).to_csv(f, sep="\t", index=False)
    return f"mmbench:{f}"


def write_mmstar(root: str | Path, bad_rows: bool = False) -> str:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(3):
        q, opts, a = _question(i)
        inline = ", ".join(f"{l}: {o}" for l, o in zip("ABCD", opts))
        rows.append({"index": i, "question": f"{q}\nOptions: {inline}", "image": jpeg_bytes(i), "answer": "ABCD"[a],
                     "category": "fine-grained perception", "l2_category": "attribute recognition",
                     "meta_info": {"source": "fixture", "split": "val", "image_path": f"{i}.jpg"}})
    if bad_rows:
        rows.append({**rows[0], "index": 3, "question": "What colour is it?"})   # no Options: block
        rows.append({**rows[0], "index": 4, "image": b"GIF89a truncated"})      # corrupt image bytes
    f = root / "mmstar.parquet"
    pd.DataFrame(rows).to_parquet(f)
    return f"mmstar:{f}"


def write_vstar(root: str | Path, bad_rows: bool = False) -> str:
    root = Path(root)
    for t, task in enumerate(("direct_attributes", "relative_position")):
        d = root / task
        d.mkdir(parents=True, exist_ok=True)
        for i in range(2):
            noise_image(10 * t + i, (96, 64)).save(d / f"sa_{100 * t + i}.jpg", quality=90)
            opts = ["red", "green", "blue", "yellow"] if task == "direct_attributes" else ["left", "right"]
            (d / f"sa_{100 * t + i}.json").write_text(json.dumps(
                {"target_object": ["square"], "bbox": [[16, 12, 48, 32]], "question": "Where is the square?",
                 "options": opts}))
    (root / "OCR").mkdir(exist_ok=True)  # shipped in the repo, not part of the benchmark
    (root / "OCR" / "ocr_1.json").write_text(json.dumps({"question": "not read", "answer": "x"}))
    if bad_rows:
        (root / "direct_attributes" / "sa_9.json").write_text(json.dumps({"question": "No image?",
                                                                          "options": ["a", "b"]}))
    return f"vstar:{root}"


def write_hrbench(root: str | Path, version: str = "4k", bad_rows: bool = False, fmt: str = "tsv",
                  bad_later_cycles: bool = False) -> str:
    """``hr_bench_{version}.tsv``: 2 questions x 4 cycles (options rotated per cycle), as the 800-row release.
    ``bad_rows`` inserts bad rows into cycle 1 (rows 2 and 3); ``bad_later_cycles`` spoils rows of cycles 2-4
    instead, which ``cycles="first"`` reads but does not return: row 3 (cycle 2) answer "E", row 4 (cycle 3)
    a truncated JPEG, row 7 (cycle 4) text that is not base64."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    base = [_question(i) for i in range(2)]
    for cycle in range(4):
        for i, (q, opts, a) in enumerate(base):
            rot = opts[cycle:] + opts[:cycle]
            rows.append({"index": cycle * 2 + i, "question": q, "answer": "ABCD"[rot.index(opts[a])],
                         "category": "single" if i == 0 else "cross", **dict(zip("ABCD", rot)),
                         "cycle_category": f"cycle{cycle + 1}", "image": b64(jpeg_bytes(i, (80, 60)))})
    if bad_later_cycles:
        rows[3]["answer"] = "E"                                    # cycle 2: not among A-D
        rows[4]["image"] = b64(jpeg_bytes(0, (80, 60))[:700])     # cycle 3: a JPEG cut short
        good = rows[7]["image"]
        rows[7]["image"] = good[:100] + "*!" + good[102:]         # cycle 4: not base64
    if bad_rows:
        rows.insert(2, {**rows[0], "index": 100, "image": rows[0]["image"][: len(rows[0]["image"]) // 2]})
        rows.insert(3, {**rows[1], "index": 101, "answer": "F"})
    f = root / f"hr_bench_{version}.{fmt}"
    if fmt == "tsv":
        pd.DataFrame(rows).to_csv(f, sep="\t", index=False)
    else:
        pd.DataFrame(rows).to_parquet(f)
    return f"hrbench{version}:{f}"


def write_mme_realworld_lite(root: str | Path, bad_rows: bool = False, fmt: str = "tsv") -> str:
    """``mme_realworld_lite.tsv`` (VLMEvalKit / MME-RealWorld-Base64) or the lmms-eval parquet (``bytes``)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(3):
        q, opts, a = _question(i)
        five = [f"({l}) {o}" for l, o in zip("ABCDE", opts + ["The image does not feature the square."])]
        if i == 2:
            five = [o.replace("(", "（", 1).replace(")", "）", 1) for o in five]  # full-width brackets occur
        rows.append({"index": i, "question": q, "multi-choice options": five, "answer": "ABCDE"[a],
                     "category": "Perception/Monitoring", "l2-category": "color", "image": b64(jpeg_bytes(i))})
    if bad_rows:
        rows.append({**rows[0], "index": 3, "multi-choice options": ["red", "(B) green"]})  # no (A) prefix
        rows.append({**rows[0], "index": 4, "answer": "F"})
    if fmt == "tsv":
        f = root / "mme_realworld_lite.tsv"
        pd.DataFrame([{**r, "multi-choice options": str(r["multi-choice options"])} for r in rows]).to_csv(
            f, sep="\t", index=False)
    else:
        (root / "data").mkdir(exist_ok=True)
        f = root / "data" / "train-00000-of-00001.parquet"
        lmms = [{**{k: v for k, v in r.items() if k != "image"}, "bytes": r["image"]} for r in rows]
        pd.DataFrame(lmms).to_parquet(f)
    return f"mme-realworld-lite:{f}"


def write_mmmu_pro(root: str | Path, bad_rows: bool = False) -> str:
    """An ``MMMU/MMMU_Pro`` snapshot: the three config folders with one parquet shard each."""
    root = Path(root)
    img = lambda s: {"bytes": jpeg_bytes(s), "path": None}  # noqa: E731 - HF Image struct
    std = [
        {"id": "test_Art_1", "question": "<image 1> shows a square. Which colour is it?", "options": str(NAMES),
         "explanation": "", "image_1": img(0), "img_type": "['Paintings']", "answer": "A",
         "topic_difficulty": "Easy", "subject": "Art"},
        {"id": "test_Design_2",
         "question": "Compare <image 1> and <image 2>: which one shows the colour of <image 2>?",
         "options": str(["<image 1>", "<image 2>", "neither", "both"]), "explanation": "", "image_1": img(1),
         "image_2": img(2), "img_type": "['Diagrams']", "answer": "B", "topic_difficulty": "Medium",
         "subject": "Design"},
        {"id": "test_Math_3", "question": "Which option is right?",
         "options": str(["<image 1>", "<image 2>", "x", "y"]), "explanation": "", "image_1": img(3),
         "image_2": img(4), "img_type": "['Plots']", "answer": "C", "topic_difficulty": "Hard", "subject": "Math"},
    ]
    if bad_rows:
        std.append({**std[0], "id": "test_Art_9", "question": "What is in <image 3>?"})  # names a missing image
        std.append({**std[1], "id": "test_Design_9", "image_1": None})                  # gap: image_2 without image_1
    more = lambda r, tag: list(ast.literal_eval(r["options"])) + [f"{tag} {k}" for k in range(6)]  # noqa: E731
    ten = [{**r, "options": str(more(r, "distractor"))} for r in std]
    vision = [{"id": r["id"], "image": img(10 + k), "options": more(r, "d"), "answer": r["answer"],
               "subject": r["subject"]} for k, r in enumerate(std[:3])]
    if bad_rows:
        vision.append({**vision[0], "id": "test_Art_9", "answer": "K"})  # 10 options: A-J
    for folder, rows in (("standard (4 options)", std), ("standard (10 options)", ten), ("vision", vision)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        frame = pd.DataFrame(rows)
        for k in range(1, 8):
            if folder != "vision" and f"image_{k}" not in frame:
                frame[f"image_{k}"] = None
        frame.to_parquet(root / folder / "test-00000-of-00001.parquet")
    return f"mmmu-pro-s4:{root}"


# ---------------------------------------------------------------------------------------------- MVBench
def write_mvbench(root: str | Path, bad_rows: bool = False, per_task: int = 1) -> str:
    """All 20 task files with ``per_task`` questions each; real clips under ``video/<prefix>/`` (MP4, the
    SSv2 clips as WebM, NTU RGB+D as AVI, the STAR clips 4 s long for their start/end bounds) and TVQA as a
    folder of JPEG frames ``00001.jpg ...`` at 3 fps. The CLEVRER clips sit under ``video/data0613/`` as
    the HF zips unpack them."""
    from mmfragile.data.loaders import MVBENCH_TASKS

    root = Path(root)
    (root / "json").mkdir(parents=True, exist_ok=True)
    for t, (task, (prefix, dtype, bounded)) in enumerate(MVBENCH_TASKS.items()):
        recs = []
        for k in range(per_task):
            seed = 10 * t + k
            ext = {"ssv2_video": ".webm", "nturgbd": ".avi"}.get(prefix, ".mp4")
            name = f"{task}_{k}" + ("" if dtype == "frame" else ext)
            folder = root / "video" / ("data0613/" + prefix if prefix.startswith("clevrer") else prefix)
            if dtype == "frame":
                (folder / name).mkdir(parents=True, exist_ok=True)
                for j in range(1, 13):  # 4 s at 3 fps
                    noise_image(seed + j, (32, 24)).save(folder / name / f"{j:05d}.jpg", quality=85)
            else:
                write_video(folder / name, n_frames=16 if bounded else 8, fps=4, seed=seed)
            cands = [f"answer {j} of {task}" for j in range(3 + (t % 2))]
            rec = {"video": name, "question": f"What happens in the clip ({task})?", "candidates": cands,
                   "answer": cands[seed % len(cands)]}
            if bounded:
                rec.update(start=1.0, end=3.0)
            recs.append(rec)
        if bad_rows and task == "action_antonym":
            recs.append({**recs[0], "video": "missing_clip.webm"})
            recs.append({**recs[0], "answer": "not a candidate"})
        if bad_rows and task == "unexpected_action":
            broken = root / "video" / prefix / "broken.mp4"
            broken.write_bytes(b"\x00\x00\x00\x18ftypmp42 not really a video")
            recs.append({**recs[0], "video": "broken.mp4"})  # loads (the file exists); fails when decoded
        (root / "json" / f"{task}.json").write_text(json.dumps(recs, indent=1))
    return f"mvbench:{root}"


# ---------------------------------------------------------------------------------------------- MM-JudgeBias
def write_mm_judgebias(root: str | Path, bad_rows: bool = False) -> str:
    """The ``naver-ai/MM-JudgeBias`` release as the HF ``datasets`` parquet export
    (``data/test-00000-of-00001.parquet``) with the columns of the authors' ``mm_judgebias/data.py``
    ``Sample``; image cells are HF Image structs. Record 3 is a restricted source: null image cells, its
    images reconstructed by the authors' ``prepare_dataset.py`` as ``images/0003_{unbiased,biased}.jpg``."""
    root = Path(root)
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    img = lambda s: {"bytes": jpeg_bytes(s), "path": None}  # noqa: E731
    base = {"bias_category": "", "task_type": "perception", "domain_type": "daily", "difficulty": "hard",
            "unbiased_source": "COCO 2017", "biased_source": "COCO 2017",
            "response": "The square in the middle is red."}
    recs = [
        {**base, "id": 1, "bias_type": "text_dominance", "bias_category": "integrality",
         "unbiased_instruction": "What colour is the square?", "biased_instruction": "What colour is the square?",
         "unbiased_image": img(0), "biased_image": img(100)},
        {**base, "id": 2, "bias_type": "image_dominance", "bias_category": "integrality",
         "unbiased_instruction": "What colour is the square?", "biased_instruction": "",
         "unbiased_image": img(0), "biased_image": img(0)},
        {**base, "id": 3, "bias_type": "visual_transformation", "bias_category": "robustness",
         "unbiased_source": "VCR", "biased_source": "VCR", "unbiased_instruction": "Describe the square.",
         "biased_instruction": "Describe the square.", "unbiased_image": None, "biased_image": None},
        {**base, "id": 4, "bias_type": "unnecessary_image", "bias_category": "robustness",
         "unbiased_instruction": "What is 12 + 30?", "biased_instruction": "What is 12 + 30?",
         "response": "12 + 30 = 42.", "unbiased_image": None, "biased_image": img(5)},
    ]
    noise_image(3).save(root / "images" / "0003_unbiased.jpg")
    noise_image(3).rotate(90).save(root / "images" / "0003_biased.jpg")
    if bad_rows:
        recs.append({**recs[0], "id": 5, "biased_image": {"bytes": b"\x89PNG broken", "path": None}})
        recs.append({**recs[1], "id": 6, "unbiased_image": None})  # no image and none reconstructed
    pd.DataFrame(recs).to_parquet(root / "data" / "test-00000-of-00001.parquet")
    return f"mm-judgebias:{root / 'data'}::{root / 'images'}"


def write_hrbench_4k(root: str | Path, bad_rows: bool = False) -> str:
    return write_hrbench(root, "4k", bad_rows)


def write_hrbench_8k(root: str | Path, bad_rows: bool = False) -> str:
    return write_hrbench(root, "8k", bad_rows)


def write_mmmu_pro_s4(root: str | Path, bad_rows: bool = False) -> str:
    return write_mmmu_pro(root, bad_rows)


def write_mmmu_pro_s10(root: str | Path, bad_rows: bool = False) -> str:
    return write_mmmu_pro(root, bad_rows).replace("-s4:", "-s10:", 1)


def write_mmmu_pro_vision(root: str | Path, bad_rows: bool = False) -> str:
    return write_mmmu_pro(root, bad_rows).replace("-s4:", "-vision:", 1)


def write_generic(root: str | Path, bad_rows: bool = False) -> str:
    """``generic:<file>``: a user's JSONL - the answer as an index, a letter or the option's text; one image, two,
    none. Bad rows: an answer that is no option, an image that is not there."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for name, seed in (("g0.jpg", 0), ("g1a.jpg", 1), ("g1b.jpg", 2)):
        noise_image(seed).save(root / name)
    recs = [
        {"question_id": "g0", "question": "What colour is the square?", "options": NAMES, "answer": 0,
         "image": "g0.jpg", "category": "colour"},
        {"question_id": "g1", "question": "Is the square of the first picture green?", "options": ["yes", "no"],
         "answer": "A", "images": ["g1a.jpg", "g1b.jpg"], "category": "colour"},
        {"question_id": "g2", "question": "How many sides has a square?", "options": ["three", "four", "five"],
         "answer": "four", "category": "text"},
    ]
    if bad_rows:
        recs += [{**recs[0], "question_id": "g3", "answer": "purple"}, {**recs[0], "question_id": "g4",
                                                                       "image": "missing.jpg"}]
    f = root / "mcq.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f"generic:{f}"


def write_mmmu_pro_folder(root: str | Path, bad_rows: bool = False) -> str:
    """``mmmu-pro:<config folder>``: the setting read from the folder's name (``standard (10 options)``)."""
    write_mmmu_pro(root, bad_rows)
    return f"mmmu-pro:{Path(root) / 'standard (10 options)'}"


#: spec prefix -> writer of a tiny copy in the published layout (from the benchmark registry)
FIXTURES: dict[str, Callable[..., str]] = {b.prefix: b.write_fixture for b in BENCHMARKS if b.fixture}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mmfragile.data.fixtures", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("benchmark", choices=sorted(FIXTURES))
    ap.add_argument("out", help="folder to write the fixture into")
    ap.add_argument("--bad-rows", action="store_true", help="also write the bad rows that release can contain")
    a = ap.parse_args(argv)
    print(FIXTURES[a.benchmark](a.out, bad_rows=a.bad_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
