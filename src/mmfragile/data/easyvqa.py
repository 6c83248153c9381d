"""easy-VQA (PyPI package ``easy-vqa``) turned into multiple choice.

easy-VQA ships 64x64 images of one coloured shape with open questions about shape, colour and
yes/no. Each question becomes multiple choice: the true answer plus seeded distractors drawn
from the same answer family (shape / colour / yes-no), 2-5 options in total (yes/no questions
have exactly 2; shape questions at most 3, since easy-VQA has three shapes).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd

from mmfragile.errors import DataError
from mmfragile.schema import MCQuestion, questions_frame, validate_questions

SHAPES = ["circle", "rectangle", "triangle"]
YES_NO = ["yes", "no"]


def easy_vqa_root() -> Path:
    spec = importlib.util.find_spec("easy_vqa")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the easy-vqa package is not installed (pip install easy-vqa)")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def image_colours() -> list[str]:
    """The colour answers of easy-VQA (every answer that is neither a shape nor yes/no)."""
    answers = [a.strip() for a in (easy_vqa_root() / "answers.txt").read_text().splitlines() if a.strip()]
    return [a for a in answers if a not in SHAPES + YES_NO]


def load_easy_vqa(split: str = "test", n: int | None = 200, seed: int = 0, max_options: int = 5) -> pd.DataFrame:
    """The first ``n`` questions of a split (a seeded sample of questions if ``n`` is smaller), as MC."""
    root = easy_vqa_root()
    qfile = root / split / "questions.json"
    if not qfile.is_file():
        raise DataError(f"easy-vqa split {split!r} not found at {qfile}")
    records = json.loads(qfile.read_text())
    colours = image_colours()
    rng = np.random.default_rng(seed)
    idx = np.arange(len(records)) if n is None or n >= len(records) else np.sort(rng.choice(len(records), n, replace=False))
    qs = []
    for i in idx:
        text, answer, image_id = records[int(i)]
        where = f"{qfile}, row {int(i)}"
        family = SHAPES if answer in SHAPES else YES_NO if answer in YES_NO else colours
        if answer not in family:
            raise DataError(f"{where}: answer {answer!r} is in no easy-vqa answer family")
        k = 2 if family is YES_NO else int(rng.integers(2, min(max_options, len(family)) + 1))
        distractors = list(rng.choice([a for a in family if a != answer], size=k - 1, replace=False))
        opts = [str(o) for o in rng.permutation(distractors + [answer])]
        cat = "shape" if family is SHAPES else "yes/no" if family is YES_NO else "colour"
        img = root / split / "images" / f"{image_id}.png"
        qs.append(MCQuestion("easy-vqa", f"{split}-{int(i)}", text[0].upper() + text[1:], opts, opts.index(answer),
                             [str(img)], cat, "image"))
    return validate_questions(questions_frame(qs), source=str(qfile))


def image_attributes(split: str = "train") -> dict[str, dict[str, str]]:
    """Shape and colour of each easy-VQA image of ``split`` as its questions state them (``{path: {"shape": ...,
    "colour": ...}}``; an attribute no question reveals is absent). A yes/no question reveals the attribute it
    names when it is present: "is there a red shape?" -> yes, "is there not a circle?" -> no. Contradicting
    questions raise DataError naming the row."""
    root = easy_vqa_root()
    qfile = root / split / "questions.json"
    if not qfile.is_file():
        raise DataError(f"easy-vqa split {split!r} not found at {qfile}")
    colours = image_colours()
    out: dict[str, dict[str, str]] = {}
    for row, (text, answer, image_id) in enumerate(json.loads(qfile.read_text())):
        words = text.rstrip("?").split()
        negated = "not" in words or "no" in words
        if answer in YES_NO:
            named = [w for w in words if w in SHAPES or w in colours] if (answer == "yes") != negated else []
        else:
            named = [answer]
        facts = out.setdefault(str(root / split / "images" / f"{image_id}.png"), {})
        for w in named:
            key = "shape" if w in SHAPES else "colour"
            if facts.setdefault(key, w) != w:
                raise DataError(f"{qfile}, row {row}: says the {key} of image {image_id} is {w!r}, "
                                f"another question says {facts[key]!r}")
    return out


def load_easy_vqa_mc(n: int | None = None, seed: int = 0) -> pd.DataFrame:
    """The benchmark registry's ``easy-vqa``: the test split as multiple choice, 200 questions unless ``n``."""
    return load_easy_vqa(n=n or 200, seed=seed)


def has_caption(attributes: dict) -> bool:
    """Whether a picture's known attributes (:func:`image_attributes`) give its whole caption: both its shape and its
    colour."""
    return "shape" in attributes and "colour" in attributes


def known_pictures(split: str) -> list[tuple[str, str, str]]:
    """``(path, colour, shape)`` of every picture of ``split`` whose colour and shape its questions state (sorted by
    path): the pictures whose exact caption is known (:func:`has_caption`)."""
    return sorted((p, a["colour"], a["shape"]) for p, a in image_attributes(split).items() if has_caption(a))


def multi_image_question(rng: np.random.Generator, pictures: list[tuple[str, str, str]], qid: str,
                         dataset: str) -> MCQuestion:
    """Which of 2-3 easy-VQA pictures (of distinct colours) shows a <colour> shape; options "Image 1", ..."""
    k = int(rng.integers(2, 4))
    chosen = _distinct_colours(rng, pictures, k)
    target = int(rng.integers(k))
    return MCQuestion(dataset, qid, f"Which image shows a {chosen[target][1]} shape?",
                      [f"Image {i + 1}" for i in range(k)], target, [p for p, _, _ in chosen], "multi-image",
                      "multi-image")


def video_question(rng: np.random.Generator, pictures: list[tuple[str, str, str]], qid: str,
                   dataset: str) -> MCQuestion:
    """A 3-frame "video" of easy-VQA pictures of distinct colours: the colour of the shape at its start or end;
    the options are the frames' colours (+ one other colour, at random)."""
    frames = _distinct_colours(rng, pictures, 3)
    when = "start" if rng.random() < 0.5 else "end"
    answer = frames[0 if when == "start" else -1][1]
    opts = [c for _, c, _ in frames]
    if rng.random() < 0.5:
        opts.append(str(rng.choice([c for c in image_colours() if c not in opts])))
    opts = [str(o) for o in rng.permutation(opts)]
    return MCQuestion(dataset, qid, f"What colour is the shape at the {when} of the video?", opts, opts.index(answer),
                      [p for p, _, _ in frames], "video", "video")


def _distinct_colours(rng: np.random.Generator, pictures: list[tuple[str, str, str]], k: int) -> list:
    out: list[tuple[str, str, str]] = []
    while len(out) < k:
        pick = pictures[int(rng.integers(len(pictures)))]
        if pick[1] not in {c for _, c, _ in out}:
            out.append(pick)
    return out


def load_easy_vqa_media(split: str = "test", n: int | None = None, seed: int = 0, n_image: int = 200,
                        n_multi: int = 100, n_video: int = 100) -> pd.DataFrame:
    """easy-VQA in three modalities (study 2): ``n_image`` of its own questions as multiple choice
    (:func:`load_easy_vqa`), ``n_multi`` multi-image questions (:func:`multi_image_question`) and ``n_video`` 3-frame
    video questions (:func:`video_question`) built from pictures of ``split`` whose colour its questions state -
    the attribute the zoo's towers read best. ``n``: the first ``n`` rows (the study spreads its own selection
    over modalities). Question ids ``<split>-<i>``, ``<split>-multi-<i>``, ``<split>-video-<i>``."""
    pictures = known_pictures(split)
    rng = np.random.default_rng([seed, 1])
    name = "easy-vqa-media"
    qs = [multi_image_question(rng, pictures, f"{split}-multi-{i}", name) for i in range(n_multi)]
    qs += [video_question(rng, pictures, f"{split}-video-{i}", name) for i in range(n_video)]
    image = load_easy_vqa(split, n=n_image, seed=seed).assign(dataset=name)
    out = pd.concat([image, questions_frame(qs)], ignore_index=True)
    out = validate_questions(out, source=f"easy-vqa-media({split}, seed={seed})")
    return out if n is None else out.head(n).reset_index(drop=True)
