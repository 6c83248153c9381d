"""Judge data for the MM-JudgeBias study: a synthetic set built with Pillow, and a loader.

:func:`make_judge_set` draws simple scenes (coloured shapes on plain backgrounds) with a
question whose answer needs the image (a count, a colour or a shape), a correct and a wrong
response per scene (gold scores 9 and 2 by default), plus a few text-only items (arithmetic,
sorting, letter counting) so that the Unnecessary-Image perturbation has something to act on.
Everything is drawn from one ``numpy`` Generator, so a seed fixes the set byte for byte.

:func:`load_judge_dir` reads judge samples from a local folder/file of JSON or JSONL records, in
either of two shapes:

* **flat** - one judged item per record (what :func:`make_judge_set` and
  :func:`mmfragile.studies.judgebias.perturbations.save_perturbed` write)::

      {"sample_id": "...", "query": "...", "images": ["rel/or/abs.png"], "response": "...",
       "gold_score": 9, "meta": {...}}

  Aliases accepted: ``id``/``question_id`` for ``sample_id``; ``instruction``/``question``/
  ``prompt`` for ``query``; ``image``/``image_path``/``image_paths`` for ``images``; ``answer``/
  ``output`` for ``response``; ``score``/``rating`` for ``gold_score``; ``reference_answer``/``reference_response``
  for ``reference`` (a reference answer, kept in ``meta["reference"]``). Unknown keys go to meta (a ``caption`` of
  the image feeds the Detail-Description perturbation); ``meta["dataset"]`` defaults to the file's stem.
  ``docs/judge-data.md`` shows a user's file run through the study.

* **paired** - the released MM-JudgeBias records: HF ``naver-ai/MM-JudgeBias`` (split ``test``; the
  ``datasets`` parquet export ``data/test-*.parquet``, or JSON/JSONL), with the fields of the authors'
  ``mm_judgebias/data.py`` ``Sample``: ``id, bias_type, bias_category, task_type, domain_type, difficulty,
  unbiased_source, biased_source, response, unbiased_instruction, biased_instruction,
  unbiased_image, biased_image`` (image cells: HF Image structs ``{"bytes", "path"}``, null for restricted
  sources). The parquet file name is the ``datasets`` default, inferred: the repository names only the
  dataset id and split. Each record gives two samples with the same ``sample_id``
  (``str(id)``): the unbiased one (``meta["perturbation"] = "original"``) and the biased one
  (``meta["perturbation"] = bias_type``). The benchmark has no gold score (BD/BC compare a
  judge's unbiased and biased scores, Sec. 3.2), so ``gold_score`` is None. Images that ship as
  null cells (restricted sources) are looked up in ``images_dir`` as ``{id:04d}_{role}.jpg`` or
  ``{id:04d}.jpg``, the names the authors' reconstruction script writes.

Image fields may be a path (absolute, or relative to the record's file, to ``images_dir`` or to
an ``images/`` folder next to the file), a ``{"path": ...}`` or ``{"bytes": <base64>}`` dict, or a
list of those. Bad input raises :class:`~mmfragile.errors.DataError` naming the file and row.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import binascii
import io
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from PIL import Image, ImageDraw, UnidentifiedImageError

from mmfragile.data.images import store_image_bytes
from mmfragile.errors import DataError, row_error
from mmfragile.schema import check_image
from mmfragile.studies.judgebias.catalog import UNPERTURBED

__all__ = ["make_judge_set", "make_easy_vqa_judge_set", "EASY_VQA_JUDGE_DATASET", "load_judge_dir", "load_judge_dataset", "RELEASE_DATASET", "MANIFEST_NAME", "COLORS",
           "SHAPES", "BACKGROUNDS"]

#: ``meta["dataset"]`` of samples read from the released (paired) records.
RELEASE_DATASET = "mm-judgebias"
#: File name of the manifest :func:`make_judge_set` writes next to its images.
MANIFEST_NAME = "judge_set.jsonl"

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 80, 210),
    "yellow": (240, 200, 30),
    "purple": (140, 60, 170),
    "orange": (245, 130, 30),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (255, 255, 255),
    "light grey": (215, 215, 215),
    "beige": (240, 230, 200),
    "pale blue": (215, 230, 245),
}
_WORDS = ("banana", "window", "river", "elephant", "pencil", "mountain", "orchestra", "galaxy", "kitchen", "lantern")



# --------------------------------------------------------------------------------------------
# The shared sample type
# --------------------------------------------------------------------------------------------


@dataclass
class JudgeSample:
    """One item to be judged: query, image(s), candidate response.

    ``images`` holds PIL images (empty for a text-only item). ``gold_score`` is an optional
    reference score (the synthetic set uses 9 for a correct and 2 for a wrong response; the real
    MM-JudgeBias data has none - its BD/BC compare the judge's own unbiased vs biased scores).
    ``meta`` is free-form; conventions used across mmfragile:

    * ``perturbation``: :data:`UNPERTURBED` (``"original"``, the label the study-3 metrics use
      for the unbiased triplet) for an unbiased item, else a :data:`PERTURBATIONS` name;
    * ``operations``: list of dicts recording what a perturbation did (``op`` + parameters);
    * ``item_id``: samples sharing it come from the same source item (same query and image,
      different responses); misalignment never draws a replacement from the same item;
    * ``image_paths``: where the images were loaded from (see :meth:`load_images`).

    A perturbed sample keeps the ``sample_id`` of its source, so ``(sample_id,
    meta["perturbation"])`` pairs each biased sample with its unbiased one.
    """

    sample_id: str
    query: str
    images: list = field(default_factory=list)
    response: str = ""
    gold_score: float | None = None
    meta: dict = field(default_factory=dict)

    @property
    def image(self) -> Image.Image | None:
        """The first image, or None for a text-only sample."""
        return self.images[0] if self.images else None

    @property
    def is_text_only(self) -> bool:
        return len(self.images) == 0

    @property
    def perturbation(self) -> str:
        return str(self.meta.get("perturbation", UNPERTURBED))

    def copy(self) -> "JudgeSample":
        """A deep copy (images copied pixel for pixel, meta deep-copied)."""
        return JudgeSample(
            sample_id=self.sample_id,
            query=self.query,
            images=[_copy_image(im) for im in self.images],
            response=self.response,
            gold_score=self.gold_score,
            meta=copy.deepcopy(self.meta),
        )

    def load_images(self) -> "JudgeSample":
        """A copy whose ``images`` are read from ``meta["image_paths"]`` (for samples loaded lazily)."""
        out = self.copy()
        if out.images:
            return out
        out.images = [_open_image(p) for p in self.meta.get("image_paths", [])]
        return out


def _copy_image(im: Any) -> Any:
    return im.copy() if isinstance(im, Image.Image) else im


def _open_image(path: str | Path) -> Image.Image:
    with Image.open(path) as im:
        im.load()
        return im.copy()


def as_pil(im: Any) -> Image.Image:
    """A sample's image (PIL or a path) as a PIL image."""
    if isinstance(im, Image.Image):
        return im
    if isinstance(im, (str, Path)):
        return _open_image(im)
    raise TypeError(f"expected a PIL image or an image path, got {type(im).__name__}")


def image_sha256(im: Image.Image) -> str:
    """SHA-256 of an image's mode, size and raw pixels (format independent)."""
    h = hashlib.sha256()
    h.update(f"{im.mode}|{im.size[0]}x{im.size[1]}|".encode())
    h.update(im.tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Synthetic set
# --------------------------------------------------------------------------------------------


def _draw_shape(d: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill) -> None:
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        s = r * 0.9
        d.rectangle([cx - s, cy - s, cx + s, cy + s], fill=fill)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx + r * 0.95, cy + r * 0.8), (cx - r * 0.95, cy + r * 0.8)], fill=fill)
    elif shape == "diamond":
        d.polygon([(cx, cy - r), (cx + r * 0.8, cy), (cx, cy + r), (cx - r * 0.8, cy)], fill=fill)
    else:  # pragma: no cover - guarded by SHAPES
        raise ValueError(shape)


def _choice(rng: np.random.Generator, seq) -> Any:
    seq = list(seq)
    return seq[int(rng.integers(len(seq)))]


def _plural(word: str, k: int) -> str:
    return word if k == 1 else word + "s"


def colour_question(shape: str, colour: str, wrong: str) -> tuple[str, str, str]:
    """Query, correct and wrong response of a colour question about the only ``shape`` of a scene."""
    return (f"What colour is the {shape} in the image?", f"The {shape} is {colour}.", f"The {shape} is {wrong}.")


def shape_question(colour: str, shape: str, wrong: str) -> tuple[str, str, str]:
    """Query, correct and wrong response of a shape question about the only ``colour`` object of a scene."""
    return (f"What shape is the {colour} object in the image?", f"The {colour} object is a {shape}.",
            f"The {colour} object is a {wrong}.")


def _scene(rng: np.random.Generator, size: int) -> tuple[Image.Image, dict, str, str, str]:
    """One scene: image, facts, query, correct response, wrong response."""
    bg_name = _choice(rng, BACKGROUNDS)
    qtype = _choice(rng, ("count", "color", "shape"))
    colors, shapes = list(COLORS), list(SHAPES)
    objects: list[tuple[str, str]] = []  # (shape, colour)
    if qtype == "count":
        shape, color = _choice(rng, shapes), _choice(rng, colors)
        k = int(rng.integers(1, 5))
        objects += [(shape, color)] * k
        for _ in range(int(rng.integers(0, 3))):  # distractors differ in shape or colour
            while True:
                o = (_choice(rng, shapes), _choice(rng, colors))
                if o != (shape, color):
                    break
            objects.append(o)
        query = f"How many {color} {shape}s are there in the image?"
        wrong = _choice(rng, [j for j in range(1, 6) if j != k])
        good = f"There {'is' if k == 1 else 'are'} {k} {color} {_plural(shape, k)} in the image."
        bad = f"There {'is' if wrong == 1 else 'are'} {wrong} {color} {_plural(shape, wrong)} in the image."
        facts = {"target_shape": shape, "target_color": color, "count": k, "wrong": wrong}
    elif qtype == "color":
        shape, color = _choice(rng, shapes), _choice(rng, colors)
        objects.append((shape, color))
        for _ in range(int(rng.integers(0, 3))):  # distractors: other shapes, so "the <shape>" is unique
            objects.append((_choice(rng, [s for s in shapes if s != shape]), _choice(rng, colors)))
        wrong = _choice(rng, [c for c in colors if c != color])
        query, good, bad = colour_question(shape, color, wrong)
        facts = {"target_shape": shape, "target_color": color, "count": 1, "wrong": wrong}
    else:
        shape, color = _choice(rng, shapes), _choice(rng, colors)
        objects.append((shape, color))
        for _ in range(int(rng.integers(0, 3))):  # distractors: other colours, so "the <colour> object" is unique
            objects.append((_choice(rng, shapes), _choice(rng, [c for c in colors if c != color])))
        wrong = _choice(rng, [s for s in shapes if s != shape])
        query, good, bad = shape_question(color, shape, wrong)
        facts = {"target_shape": shape, "target_color": color, "count": 1, "wrong": wrong}

    order = rng.permutation(len(objects))
    objects = [objects[int(i)] for i in order]
    img = Image.new("RGB", (size, size), BACKGROUNDS[bg_name])
    d = ImageDraw.Draw(img)
    cell = size / 3.0
    cells = rng.choice(9, size=len(objects), replace=False)
    placed = []
    for (shape, color), c in zip(objects, cells):
        r = float(rng.uniform(0.26, 0.38)) * cell
        slack = cell / 2.0 - r
        cx = (int(c) % 3 + 0.5) * cell + float(rng.uniform(-slack, slack))
        cy = (int(c) // 3 + 0.5) * cell + float(rng.uniform(-slack, slack))
        _draw_shape(d, shape, cx, cy, r, COLORS[color])
        placed.append({"shape": shape, "color": color, "center": [round(cx, 1), round(cy, 1)], "radius": round(r, 1)})
    facts = {"question_type": qtype, "background": bg_name, **facts, "objects": placed}
    return img, facts, query, good, bad


def _text_item(rng: np.random.Generator) -> tuple[dict, str, str, str]:
    kind = _choice(rng, ("add", "multiply", "sort", "letters"))
    if kind == "add":
        a, b = int(rng.integers(10, 100)), int(rng.integers(10, 100))
        delta = _choice(rng, [x for x in range(-9, 10) if x != 0])
        q = f"What is {a} + {b}?"
        good, bad = f"{a} + {b} = {a + b}.", f"{a} + {b} = {a + b + delta}."
    elif kind == "multiply":
        a, b = int(rng.integers(3, 13)), int(rng.integers(3, 13))
        delta = _choice(rng, [x for x in range(-5, 6) if x != 0])
        q = f"What is {a} times {b}?"
        good, bad = f"{a} times {b} is {a * b}.", f"{a} times {b} is {a * b + delta}."
    elif kind == "sort":
        nums = [int(x) for x in rng.choice(np.arange(1, 100), size=4, replace=False)]
        s = sorted(nums)
        j = int(rng.integers(3))
        w = s.copy()
        w[j], w[j + 1] = w[j + 1], w[j]
        q = f"Sort the numbers {', '.join(map(str, nums))} from smallest to largest."
        good, bad = f"Sorted: {', '.join(map(str, s))}.", f"Sorted: {', '.join(map(str, w))}."
    else:
        word = _choice(rng, _WORDS)
        delta = _choice(rng, [-2, -1, 1, 2])
        q = f"How many letters are in the word '{word}'?"
        good, bad = f"The word '{word}' has {len(word)} letters.", f"The word '{word}' has {len(word) + delta} letters."
    return {"question_type": kind}, q, good, bad


def make_judge_set(n: int, seed: int, out_dir: str | Path, *, n_text: int | None = None, image_size: int = 256,
                   good_score: float = 9.0, bad_score: float = 2.0) -> list[JudgeSample]:
    """Build a small synthetic judge set, deterministic from ``seed``.

    ``n`` image scenes, each giving two samples with the same query and image: a correct
    response (``gold_score=good_score``, id ``img<i>-good``) and a wrong one - wrong count,
    colour or shape (``bad_score``, id ``img<i>-bad``); then ``n_text`` (default
    ``max(2, n // 4)``) text-only items, likewise a good and a bad response each (``txt<j>-...``).
    Samples of one item share ``meta["item_id"]``, which keeps the misalignment perturbations
    from drawing a sibling. Images are saved as ``out_dir/images/img<i>.png`` and every sample
    as a flat record in ``out_dir/judge_set.jsonl`` (so ``load_judge_dir(out_dir)`` reads the set
    back). ``meta`` holds the scene facts (question type, target shape/colour/count, every
    object's position), ``kind`` (good/bad), ``modality`` and ``image_paths``.
    """
    n = _check_count(n)
    rng = np.random.default_rng(int(seed))
    items = [_scene(rng, int(image_size)) for _ in range(n)]
    return _write_judge_set(out_dir, "synthetic-judge", seed, items, _text_items(rng, n, n_text), good_score,
                            bad_score)


def _check_count(n: int) -> int:
    if int(n) < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return int(n)


def _text_items(rng: np.random.Generator, n: int, n_text: int | None) -> list[tuple[dict, str, str, str]]:
    return [_text_item(rng) for _ in range(max(2, n // 4) if n_text is None else int(n_text))]


def _write_judge_set(out_dir: str | Path, dataset: str, seed: int, scenes, texts, good_score: float,
                     bad_score: float) -> list[JudgeSample]:
    """Samples (a good and a bad response per item: ``img<i>-good``, ``img<i>-bad``, then ``txt<j>-...``) of
    ``scenes`` ``(image, facts, query, good, bad)`` and text items ``(facts, query, good, bad)``; images saved as
    ``out_dir/images/img<i>.png``, every sample a flat record of ``out_dir/judge_set.jsonl``."""
    out_dir = Path(out_dir)
    img_dir = out_dir / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    samples: list[JudgeSample] = []
    records: list[dict] = []

    def add(item_id: str, query: str, image: Image.Image | None, rel: str | None, responses, facts: dict,
            modality: str) -> None:
        for kind, resp, score in responses:
            meta = {"dataset": dataset, "item_id": item_id, "kind": kind, "modality": modality,
                    "perturbation": UNPERTURBED, "generator_seed": int(seed), **facts}
            sid = f"{item_id}-{kind}"
            records.append({"sample_id": sid, "query": query, "images": [rel] if rel else [], "response": resp,
                            "gold_score": score, "meta": meta})
            m = dict(meta)
            if rel:
                m["image_paths"] = [str((out_dir / rel).resolve())]
            samples.append(JudgeSample(sample_id=sid, query=query, images=[image.copy()] if image else [],
                                       response=resp, gold_score=score, meta=m))

    for i, (img, facts, query, good, bad) in enumerate(scenes):
        rel = f"images/img{i:03d}.png"
        img.save(out_dir / rel, format="PNG")
        add(f"img{i:03d}", query, img, rel, [("good", good, float(good_score)), ("bad", bad, float(bad_score))],
            facts, "image")
    for j, (facts, query, good, bad) in enumerate(texts):
        add(f"txt{j:03d}", query, None, None, [("good", good, float(good_score)), ("bad", bad, float(bad_score))],
            facts, "text")

    with open(out_dir / MANIFEST_NAME, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
    return samples


#: ``meta["dataset"]`` of the easy-VQA judge set (:func:`make_easy_vqa_judge_set`)
EASY_VQA_JUDGE_DATASET = "easy-vqa-judge"
#: question types of the easy-VQA judge set: easy-VQA pictures hold one shape (no counting); the zoo's towers read
#: its colour (99 %) far better than its shape (SmolLM2's tower 56 %), so the default asks for the colour only
EASY_VQA_QUESTION_TYPES = ("color", "shape")
EASY_VQA_DEFAULT_TYPES = ("color",)


def easy_vqa_scene(path: str | Path, colour: str, shape: str, qtype: str, rng: np.random.Generator,
                   ) -> tuple[Image.Image, dict, str, str, str]:
    """One easy-VQA picture (one ``colour`` ``shape``) as a judge scene ``(image, facts, query, good, bad)``: a
    colour question about "the shape" (so that only the colour is claimed) or a shape question about the colour's
    object (``qtype``), in the set's templates, the wrong answer drawn with ``rng`` from easy-VQA's colours /
    shapes; the facts locate the shape (the pixels that differ from the background) for the Detail-Description
    caption."""
    from mmfragile.data import easyvqa

    img = _open_image(path).convert("RGB")
    if qtype == "color":
        wrong = _choice(rng, [c for c in easyvqa.image_colours() if c != colour])
        query, good, bad = colour_question("shape", colour, wrong)
    elif qtype == "shape":
        wrong = _choice(rng, [s for s in easyvqa.SHAPES if s != shape])
        query, good, bad = shape_question(colour, shape, wrong)
    else:
        raise ValueError(f"easy-VQA judge questions are {EASY_VQA_QUESTION_TYPES}, not {qtype!r}")
    px = np.asarray(img, dtype=int)
    ys, xs = np.nonzero(np.abs(px - px[0, 0]).sum(-1) > 60)
    cx, cy = (float(xs.mean()), float(ys.mean())) if len(xs) else (img.width / 2, img.height / 2)
    radius = float(max(np.ptp(xs), np.ptp(ys)) / 2) if len(xs) else 0.0
    obj = {"shape": shape, "color": colour, "center": [round(cx, 1), round(cy, 1)], "radius": round(radius, 1)}
    facts = {"question_type": qtype, "background": "light", "target_shape": shape, "target_color": colour,
             "count": 1, "wrong": wrong, "objects": [obj], "source_image": str(path)}
    return img, facts, query, good, bad


def make_easy_vqa_judge_set(n: int, seed: int, out_dir: str | Path, *, split: str = "test",
                            n_text: int | None = None, question_types: Sequence[str] = EASY_VQA_DEFAULT_TYPES,
                            good_score: float = 9.0, bad_score: float = 2.0) -> list[JudgeSample]:
    """A judge set of ``n`` easy-VQA pictures of ``split`` (distinct, drawn with ``seed``) - what the model zoo's
    towers read (colour 99 %, shape 56-86 % on the test split; they read :func:`make_judge_set`'s multi-shape
    scenes as one shape) - each with a question of ``question_types`` (default: the colour, what they read best),
    a correct and a wrong response in :func:`make_judge_set`'s templates and layout (ids, meta, ``judge_set.jsonl``),
    then ``n_text``
    (default ``max(2, n // 4)``) text-only items as there. ``meta["dataset"]`` is
    :data:`EASY_VQA_JUDGE_DATASET`. The zoo's judges train on the *train* split, the study evaluates the test split."""
    from mmfragile.data.easyvqa import known_pictures

    n = _check_count(n)
    pictures = known_pictures(split)
    if n > len(pictures):
        raise ValueError(f"{n} pictures asked, easy-VQA {split} has {len(pictures)} of known colour and shape")
    rng = np.random.default_rng(int(seed))
    chosen = rng.choice(len(pictures), size=n, replace=False)
    scenes = [easy_vqa_scene(*pictures[int(i)], _choice(rng, question_types), rng) for i in chosen]
    return _write_judge_set(out_dir, EASY_VQA_JUDGE_DATASET, seed, scenes, _text_items(rng, n, n_text), good_score,
                            bad_score)


# --------------------------------------------------------------------------------------------
# Loader
# --------------------------------------------------------------------------------------------

_ID_KEYS = ("sample_id", "id", "question_id", "idx")
_QUERY_KEYS = ("query", "instruction", "question", "prompt")
_RESPONSE_KEYS = ("response", "answer", "output", "candidate_response")
_IMAGE_KEYS = ("images", "image", "image_path", "image_paths", "img")
_SCORE_KEYS = ("gold_score", "score", "rating")
_REFERENCE_KEYS = ("reference", "reference_answer", "reference_response")
_PAIRED_REQUIRED = ("id", "bias_type", "response", "unbiased_instruction", "biased_instruction")
_LIST_KEYS = ("data", "samples", "records", "items")


def _first_key(rec: dict, keys) -> str | None:
    return next((k for k in keys if k in rec), None)


def _looks_like_record(rec: Any) -> bool:
    if not isinstance(rec, dict):
        return False
    return "unbiased_instruction" in rec or any(k in rec for k in _QUERY_KEYS + _RESPONSE_KEYS)


def _iter_records(path: Path) -> Iterator[tuple[int, str, dict]]:
    """(row, where, record) for every record of a .json/.jsonl/.parquet file; DataError on malformed content.
    Parquet (the HF ``datasets`` export of the release) is read in small batches: image cells stay bytes."""
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        try:
            row = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=16):
                for rec in batch.to_pylist():
                    yield row, f"{path}, row {row}", rec
                    row += 1
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: not a readable parquet file: {e}") from e
        return
    if path.suffix.lower() == ".jsonl":
        with open(path, encoding="utf-8") as f:
            row = 0
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}, row {row} (line {lineno})"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{where}: invalid JSON: {e}") from e
                if not isinstance(rec, dict):
                    raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
                yield row, where, rec
                row += 1
        return
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: invalid JSON: {e}") from e
    if isinstance(data, dict):
        lk = _first_key(data, _LIST_KEYS)
        if lk is not None and isinstance(data[lk], list):
            data = data[lk]
        elif _looks_like_record(data):
            data = [data]
        else:
            warnings.warn(f"{path}: not a judge record or list of records; skipped")
            return
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of records, got {type(data).__name__}")
    for i, rec in enumerate(data):
        where = f"{path}, row {i}"
        if not isinstance(rec, dict):
            raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
        yield i, where, rec


def _is_null_image(v: Any) -> bool:
    # HF image cells export as {"bytes": null, "path": null} when empty
    return v is None or v == "" or (isinstance(v, dict) and not v.get("bytes") and not v.get("path"))


def _image_entries(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [v for v in value if not _is_null_image(v)]
    return [] if _is_null_image(value) else [value]


def _resolve_path(p: str, base: Path, images_dir: Path | None, where: str) -> Path:
    raw = Path(p).expanduser()
    tried = [raw] if raw.is_absolute() else [base / raw] + ([images_dir / raw] if images_dir else []) + [
        base / "images" / raw]
    for t in tried:
        if t.is_file():
            return t.resolve()
    raise DataError(f"{where}: image file not found: {p!r} (tried {', '.join(str(t) for t in tried)})")


def _b64(data: str, where: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise DataError(f"{where}: undecodable image bytes: {e}") from e


def _decode_bytes(data: Any, where: str) -> Image.Image:
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else bytes(data)
        with Image.open(io.BytesIO(raw)) as im:
            im.load()
            return im.copy()
    except (binascii.Error, ValueError, TypeError, UnidentifiedImageError, OSError) as e:
        raise DataError(f"{where}: undecodable image bytes: {e}") from e


def _open(path: Path, where: str) -> Image.Image:
    check_image(path, where)
    with Image.open(path) as im:
        im.load()
        return im.copy()


def _load_images(value: Any, field: str, base: Path, images_dir: Path | None, where: str,
                 load: bool) -> tuple[list[Image.Image], list[str]]:
    images: list[Image.Image] = []
    paths: list[str] = []
    for k, entry in enumerate(_image_entries(value)):
        w = f"{where}, field {field!r}" + (f"[{k}]" if isinstance(value, (list, tuple)) else "")
        if isinstance(entry, dict):
            if entry.get("bytes"):
                if load:
                    images.append(_decode_bytes(entry["bytes"], w))
                else:  # keep a path, not pixels: the bytes go to the content-addressed image cache
                    data = entry["bytes"]
                    raw = _b64(data, w) if isinstance(data, str) else bytes(data)
                    paths.append(store_image_bytes(raw, w, "mm-judgebias"))
                continue
            entry = entry["path"]
        if not isinstance(entry, str):
            raise DataError(f"{w}: an image must be a path, a {{'path'|'bytes'}} dict or a list of those, "
                            f"got {type(entry).__name__}")
        p = _resolve_path(entry, base, images_dir, w)
        paths.append(str(p))
        if load:
            images.append(_open(p, w))
        else:
            check_image(p, w)
    return images, paths


def _score(rec: dict, where: str) -> float | None:
    k = _first_key(rec, _SCORE_KEYS)
    if k is None or rec[k] is None or rec[k] == "":
        return None
    try:
        v = float(rec[k])
    except (TypeError, ValueError):
        raise DataError(f"{where}: field {k!r} must be a number, got {rec[k]!r}") from None
    if not np.isfinite(v):
        raise DataError(f"{where}: field {k!r} must be finite, got {rec[k]!r}")
    return v


def _text_field(rec: dict, keys, name: str, where: str, allow_empty: bool = True) -> str:
    k = _first_key(rec, keys)
    if k is None:
        raise DataError(f"{where}: missing field {name!r} (any of {list(keys)}); record has {sorted(rec)}")
    v = rec[k]
    if not isinstance(v, str):
        raise DataError(f"{where}: field {k!r} must be a string, got {type(v).__name__}")
    if not allow_empty and not v.strip():
        raise DataError(f"{where}: field {k!r} is empty")
    return v


def _flat(rec: dict, where: str, file: Path, row: int, images_dir: Path | None, load: bool) -> JudgeSample:
    base = file.parent
    query = _text_field(rec, _QUERY_KEYS, "query", where)  # may be "" (image-dominance variants)
    response = _text_field(rec, _RESPONSE_KEYS, "response", where)
    ik = _first_key(rec, _IMAGE_KEYS)
    images, paths = _load_images(rec.get(ik) if ik else None, ik or "images", base, images_dir, where, load)
    idk = _first_key(rec, _ID_KEYS)
    sid = str(rec[idk]) if idk is not None and rec[idk] not in (None, "") else f"{file.stem}-{row}"
    rk = _first_key(rec, _REFERENCE_KEYS)
    used = {idk, _first_key(rec, _QUERY_KEYS), _first_key(rec, _RESPONSE_KEYS), ik, _first_key(rec, _SCORE_KEYS),
            rk, "meta", "image_sha256"}
    raw_meta = rec.get("meta") or {}
    if not isinstance(raw_meta, dict):
        raise DataError(f"{where}: field 'meta' must be an object, got {type(raw_meta).__name__}")
    meta = dict(raw_meta)
    meta.update({k: v for k, v in rec.items() if k not in used})
    if rk is not None and rec[rk] not in (None, ""):
        meta["reference"] = _text_field(rec, (rk,), "reference", where)
    meta.setdefault("perturbation", UNPERTURBED)
    meta.setdefault("dataset", file.stem)  # the store's dataset key: the file's name, unless the record names one
    if paths:
        meta["image_paths"] = paths
    expected = rec.get("image_sha256")
    if load and expected:
        got = [image_sha256(im) for im in images]
        if list(expected) != got:
            raise DataError(f"{where}: image pixels do not match the recorded image_sha256")
    meta["source_file"], meta["source_row"] = str(file), row
    return JudgeSample(sample_id=sid, query=query, images=images, response=response, gold_score=_score(rec, where),
                       meta=meta)


def _paired(rec: dict, where: str, file: Path, row: int, images_dir: Path | None, load: bool,
            strict_images: bool) -> list[JudgeSample]:
    base = file.parent
    missing = [k for k in _PAIRED_REQUIRED if k not in rec or rec[k] is None]
    if missing:
        raise DataError(f"{where}: missing field(s) {missing} of an MM-JudgeBias record")
    for k in ("response", "unbiased_instruction", "biased_instruction", "bias_type"):
        if not isinstance(rec[k], str):
            raise DataError(f"{where}: field {k!r} must be a string, got {type(rec[k]).__name__}")
    sid = str(rec["id"])
    bias = str(rec["bias_type"])
    common = {k: v for k, v in rec.items() if k not in (
        "id", "response", "unbiased_instruction", "biased_instruction", "unbiased_image", "biased_image")}
    out = []
    for role in ("unbiased", "biased"):
        field = f"{role}_image"
        value = rec.get(field)
        if not _image_entries(value) and images_dir is not None:
            try:
                stem = f"{int(rec['id']):04d}"
            except (TypeError, ValueError):
                stem = sid
            for name in (f"{stem}_{role}.jpg", f"{stem}.jpg", f"{stem}_{role}.png", f"{stem}.png"):
                if (images_dir / name).is_file():
                    value = str((images_dir / name).resolve())
                    break
        images, paths = _load_images(value, field, base, images_dir, where, load)
        text_only_ok = role == "unbiased" and bias == "unnecessary_image"
        if strict_images and not images and not paths and not text_only_ok:
            raise DataError(f"{where}: field {field!r} is empty and no {sid}_{role} image was found in images_dir="
                            f"{images_dir}; restricted-source images must be reconstructed first "
                            f"(or pass strict_images=False to load it as text-only)")
        meta = dict(common)
        meta.setdefault("dataset", RELEASE_DATASET)
        meta["role"] = role
        meta["perturbation"] = UNPERTURBED if role == "unbiased" else bias
        if paths:
            meta["image_paths"] = paths
        meta["source_file"], meta["source_row"] = str(file), row
        out.append(JudgeSample(sample_id=sid, query=rec[f"{role}_instruction"], images=images,
                               response=rec["response"], gold_score=_score(rec, where), meta=meta))
    return out


def load_judge_dir(path: str | Path, *, images_dir: str | Path | None = None, load_images: bool = True,
                   strict_images: bool = True, n: int | None = None,
                   skipped: list[dict] | None = None) -> list[JudgeSample]:
    """Load judge samples from a ``.json``/``.jsonl``/``.parquet`` file or every such file directly inside a
    folder (the released HF export is ``data/test-*.parquet``).

    See the module docstring for the two record shapes. ``load_images=False`` only checks that
    image files exist and decode (:func:`mmfragile.schema.check_image`) and leaves ``images``
    empty with the paths in ``meta["image_paths"]`` (materialise later with
    :meth:`JudgeSample.load_images`); inline image bytes are then written once to the image cache and
    referred to by path - useful for the ~1.8k real records. ``strict_images``
    (paired records only): a null image cell is an error unless it is the unbiased side of an
    ``unnecessary_image`` record. Each sample's ``meta`` gets ``source_file`` and ``source_row``; samples of
    released records get ``meta["dataset"] = "mm-judgebias"``. ``n``: the first ``n`` records only.

    Raises :class:`DataError` naming the file and row for: invalid JSON, a missing query/response
    field (or a missing field of a paired record), a non-numeric score, an image path that does not
    exist or does not decode, undecodable inline bytes, pixels that contradict a recorded
    ``image_sha256``, and a duplicate ``(sample_id, perturbation)``; also when no record is found.
    With a ``skipped`` list, a bad record is appended to it as ``{"file", "row", "reason"}`` and left out
    instead (a malformed file still raises).
    """
    path = Path(path)
    idir = Path(images_dir) if images_dir is not None else None
    exts = (".json", ".jsonl", ".parquet")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in exts)
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"{path}: no such file or directory")
    if not files:
        raise DataError(f"{path}: no .json, .jsonl or .parquet files found")
    samples: list[JudgeSample] = []
    seen: dict[tuple[str, str], str] = {}
    n_records = 0
    for f in files:
        for row, where, rec in _iter_records(f):
            if n is not None and n_records >= n:
                break
            try:
                if "unbiased_instruction" in rec or "biased_instruction" in rec:
                    new = _paired(rec, where, f, row, idir, load_images, strict_images)
                else:
                    new = [_flat(rec, where, f, row, idir, load_images)]
                for s in new:
                    key = (s.sample_id, s.perturbation)
                    if key in seen:
                        raise DataError(f"{where}: duplicate sample_id {s.sample_id!r} with perturbation "
                                        f"{s.perturbation!r} (first seen at {seen[key]})")
            except DataError as e:
                if skipped is None:
                    raise row_error(e, f, int(row))
                skipped.append({"file": str(f), "row": int(row), "reason": str(e)})
                continue
            for s in new:
                seen[(s.sample_id, s.perturbation)] = where
            samples.extend(new)
            n_records += 1
    if not samples:
        raise DataError(f"{path}: no judge records found" + (f" ({len(skipped)} bad)" if skipped else ""))
    return samples


def load_judge_dataset(spec: str, n: int | None = None, *, load_images: bool = True,
                       skipped: list[dict] | None = None) -> list[JudgeSample]:
    """Judge samples from a spec: ``mm-judgebias:<file or folder>[::<images_dir>]`` (the release, see
    :func:`load_judge_dir`; ``<images_dir>`` holds the restricted-source images the authors'
    ``scripts/prepare_dataset.py`` reconstructs) or ``judge-dir:<file or folder>`` (flat records)."""
    kind, _, rest = spec.partition(":")
    if kind not in ("mm-judgebias", "judge-dir") or not rest:
        raise DataError(f"unknown judge dataset spec {spec!r}; use mm-judgebias:<path>[::<images_dir>] or "
                        "judge-dir:<path>")
    path, _, images = rest.partition("::")
    return load_judge_dir(path, images_dir=images or None, load_images=load_images, n=n, skipped=skipped)
