"""The embedded default dataset: multiple-choice VQA generated with Pillow, deterministic from a seed.

Question types (``category``):

* ``count``     - how many shapes are there (2-5 options)
* ``colour``    - what colour is the <shape> (2-5 options)
* ``shape``     - which shape is <colour> (2-4 options)
* ``position``  - where is the <colour> <shape> relative to the <colour> <shape> (2-4 options)
* ``text``      - text-only arithmetic / word questions, no image (modality "text")
* ``multi-image`` - which of two images contains a <colour> <shape> (modality "multi-image")
* ``video``     - frames of a shape moving; which direction did it move (modality "video")

Every image is written once as PNG under ``out_dir`` and the table refers to it by absolute path,
so runs can be audited and the same file is reused across formats.

Each question draws from its own random stream ``(seed, kind, index)``, so question ``i`` of a kind is the same
whatever the table's size (a larger ``n_per_kind`` only appends questions). :func:`training_scenes` draws
scenes for training vision towers (:mod:`mmfragile.models.zoo`) from other seeds and drops any scene that
equals one of the evaluation scenes, so a tower never sees a test picture.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from mmfragile.paths import build_once, cache_dir
from mmfragile.schema import MCQuestion, questions_frame, validate_questions

COLOURS = {
    "red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (235, 210, 40),
    "purple": (140, 60, 170), "orange": (245, 140, 30), "black": (20, 20, 20), "gray": (130, 130, 130),
}
SHAPES = ["circle", "square", "triangle", "star"]
DIRECTIONS = ["left", "right", "up", "down"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven"]
SIZE = 96  # px; large enough for the shapes to be visible, small enough for tiny models
IMAGE_KINDS = ("count", "colour", "shape", "position")
#: one random stream per (kind, question index); the index of a kind in this tuple names its stream
_STREAMS = (*IMAGE_KINDS, "text", "multi-image", "video")
#: cache layout version: bump when the generator's output changes, so stale PNGs are never reused
_LAYOUT = "v2"


@dataclass(frozen=True)
class Placed:
    shape: str
    colour: str
    x: int  # centre
    y: int
    r: int


def _draw(draw: ImageDraw.ImageDraw, s: Placed) -> None:
    fill = COLOURS[s.colour]
    x, y, r = s.x, s.y, s.r
    if s.shape == "circle":
        draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)
    elif s.shape == "square":
        draw.rectangle([x - r, y - r, x + r, y + r], fill=fill)
    elif s.shape == "triangle":
        draw.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fill)
    else:  # star: five points
        ang = np.linspace(-np.pi / 2, 1.5 * np.pi, 11)[:-1]
        rad = np.where(np.arange(10) % 2 == 0, r, r * 0.45)
        draw.polygon([(x + float(rr * np.cos(t)), y + float(rr * np.sin(t))) for rr, t in zip(rad, ang)], fill=fill)


def render_scene(shapes: list[Placed], size: int = SIZE, background=(245, 245, 240)) -> Image.Image:
    img = Image.new("RGB", (size, size), background)
    d = ImageDraw.Draw(img)
    for s in shapes:
        _draw(d, s)
    return img


def _place(rng: np.random.Generator, n: int, size: int = SIZE, r: int = 10) -> list[tuple[int, int]]:
    """n non-overlapping centres on a coarse grid (deterministic given rng)."""
    cells = [(cx, cy) for cx in range(4) for cy in range(4)]
    pick = rng.choice(len(cells), size=n, replace=False)
    step = size // 4
    return [(cells[i][0] * step + step // 2, cells[i][1] * step + step // 2) for i in pick]


def _options(rng: np.random.Generator, correct: str, pool: list[str], n_options: int) -> tuple[list[str], int]:
    distractors = [p for p in pool if p != correct]
    chosen = list(rng.choice(distractors, size=n_options - 1, replace=False))
    opts = chosen + [correct]
    order = rng.permutation(len(opts))
    opts = [str(opts[i]) for i in order]
    return opts, opts.index(correct)


def random_scene(rng: np.random.Generator, kind: str) -> list[Placed]:
    """A scene for an image question of ``kind``: 1-4 shapes for counting (shapes may repeat), else 2-3 shapes,
    each shape unique so the question has one answer; colours always distinct."""
    n = int(rng.integers(1, 5)) if kind == "count" else int(rng.integers(2, 4))
    shapes = list(rng.choice(SHAPES, size=n, replace=kind == "count"))
    colours = list(rng.choice(list(COLOURS), size=n, replace=False))
    return [Placed(str(s), str(c), x, y, 10) for s, c, (x, y) in zip(shapes, colours, _place(rng, n))]


def _stream(seed: int, stream: str, i: int) -> np.random.Generator:
    return np.random.default_rng([seed, _STREAMS.index(stream), i])


def question_scene(seed: int, kind: str, i: int) -> list[Placed]:
    """The scene of image question ``i`` of ``kind`` in the table of ``seed`` (cheap: nothing is drawn)."""
    return random_scene(_stream(seed, kind, i), kind)


class SyntheticVQA:
    """Generator of the embedded default question table (see module docstring)."""

    def __init__(self, seed: int = 0, out_dir: str | Path | None = None):
        self.seed = seed
        self.out_dir = Path(out_dir) if out_dir else cache_dir("synthetic-vqa", f"{_LAYOUT}-seed{seed}")
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def _save(self, img: Image.Image, name: str) -> str:
        # deterministic content, so an existing file is the same image
        path = build_once(self.out_dir / f"{name}.png", lambda tmp: img.save(tmp, format="PNG"), file=True)
        return str(path.resolve())

    def _n_options(self, rng, lo: int, hi: int) -> int:
        return int(rng.integers(lo, hi + 1))

    def _rng(self, stream: str, i: int) -> np.random.Generator:
        return _stream(self.seed, stream, i)

    def _single_image(self, i: int, kind: str) -> MCQuestion:
        rng = self._rng(kind, i)
        scene = random_scene(rng, kind)
        n = len(scene)
        qid = f"{kind}-{i:04d}"
        if kind == "count":
            correct = NUMBER_WORDS[n]
            opts, ans = _options(rng, correct, NUMBER_WORDS[1:7], self._n_options(rng, 2, 5))
            q = "How many shapes are in the image?"
        elif kind == "colour":
            t = scene[0]
            opts, ans = _options(rng, t.colour, list(COLOURS), self._n_options(rng, 2, 5))
            q = f"What is the colour of the {t.shape}?"
        elif kind == "shape":
            t = scene[0]
            opts, ans = _options(rng, t.shape, SHAPES, self._n_options(rng, 2, 4))
            q = f"Which shape is {t.colour}?"
        else:  # position: relation of scene[0] to scene[1]
            a, b = scene[0], scene[1]
            dx, dy = a.x - b.x, a.y - b.y
            rel = ("left of" if dx < 0 else "right of") if abs(dx) >= abs(dy) else ("above" if dy < 0 else "below")
            opts, ans = _options(rng, rel, ["left of", "right of", "above", "below"], self._n_options(rng, 2, 4))
            q = f"Where is the {a.colour} {a.shape} relative to the {b.colour} {b.shape}?"
        path = self._save(render_scene(scene), qid)
        return MCQuestion("synthetic-vqa", qid, q, opts, ans, [path], kind, "image")

    def _text_only(self, i: int) -> MCQuestion:
        rng = self._rng("text", i)
        a, b = int(rng.integers(1, 9)), int(rng.integers(1, 9))
        correct = str(a + b)
        pool = [str(v) for v in range(2, 17)]
        opts, ans = _options(rng, correct, pool, self._n_options(rng, 2, 5))
        return MCQuestion("synthetic-vqa", f"text-{i:04d}", f"What is {a} plus {b}?", opts, ans, [], "text", "text")

    def _multi_image(self, i: int) -> MCQuestion:
        rng = self._rng("multi-image", i)
        colour = str(rng.choice(list(COLOURS)))
        shape = str(rng.choice(SHAPES))
        n_img = int(rng.integers(2, 4))
        target = int(rng.integers(0, n_img))
        paths = []
        for k in range(n_img):
            if k == target:
                sc = [Placed(shape, colour, 48, 48, 18)]
            else:
                other_c = str(rng.choice([c for c in COLOURS if c != colour]))
                sc = [Placed(str(rng.choice(SHAPES)), other_c, 48, 48, 18)]
            paths.append(self._save(render_scene(sc), f"multi-{i:04d}-{k}"))
        names = [f"Image {k + 1}" for k in range(n_img)]
        return MCQuestion("synthetic-vqa", f"multi-{i:04d}", f"Which image contains a {colour} {shape}?",
                          names, target, paths, "multi-image", "multi-image")

    def _video(self, i: int, n_frames: int = 6) -> MCQuestion:
        rng = self._rng("video", i)
        direction = str(rng.choice(DIRECTIONS))
        colour, shape = str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES))
        dx, dy = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}[direction]
        paths = []
        for f in range(n_frames):
            x = 48 + dx * (f - n_frames // 2) * 10
            y = 48 + dy * (f - n_frames // 2) * 10
            paths.append(self._save(render_scene([Placed(shape, colour, x, y, 10)]), f"video-{i:04d}-f{f}"))
        opts, ans = _options(rng, direction, DIRECTIONS, self._n_options(rng, 2, 4))
        return MCQuestion("synthetic-vqa", f"video-{i:04d}", f"In which direction does the {colour} {shape} move?",
                          opts, ans, paths, "video", "video")

    def generate(self, n_per_kind: int = 10, n_text: int = 10, n_multi: int = 4, n_video: int = 4) -> pd.DataFrame:
        """The question table; the same seed and sizes always give the same rows and image bytes."""
        qs: list[MCQuestion] = []
        for kind in IMAGE_KINDS:
            qs += [self._single_image(i, kind) for i in range(n_per_kind)]
        qs += [self._text_only(i) for i in range(n_text)]
        qs += [self._multi_image(i) for i in range(n_multi)]
        qs += [self._video(i) for i in range(n_video)]
        return validate_questions(questions_frame(qs), source=f"synthetic-vqa(seed={self.seed})")


def make_synthetic_vqa(seed: int = 0, out_dir: str | Path | None = None, **sizes) -> pd.DataFrame:
    """Convenience wrapper: ``SyntheticVQA(seed, out_dir).generate(**sizes)``."""
    return SyntheticVQA(seed, out_dir).generate(**sizes)


#: evaluation tables up to this many questions per kind (of ``exclude_seed``) are kept out of training scenes
EVAL_SCENES_PER_KIND = 2000


def training_scenes(n: int, seed: int = 1, exclude_seed: int = 0,
                    exclude_per_kind: int = EVAL_SCENES_PER_KIND) -> list[tuple[str, list[Placed]]]:
    """``n`` ``(kind, scene)`` pairs for training, the image kinds in turn, drawn from generator ``seed`` (never
    the evaluation seed); a scene equal to one of the first ``exclude_per_kind`` scenes of any kind of
    ``exclude_seed`` is skipped (single-shape scenes repeat often: there are only 512 of them)."""
    if seed == exclude_seed:
        raise ValueError(f"training seed {seed} is the evaluation seed")
    held_out = {tuple(question_scene(exclude_seed, k, i)) for k in IMAGE_KINDS for i in range(exclude_per_kind)}
    out: list[tuple[str, list[Placed]]] = []
    i = 0
    while len(out) < n:
        for kind in IMAGE_KINDS:
            sc = question_scene(seed, kind, i)
            if tuple(sc) not in held_out and len(out) < n:
                out.append((kind, sc))
        i += 1
    return out


# ---------------------------------------------------------------------------------------------- benchmark questions
#: 4-option questions in the style of MMBench / A-OKVQA / HR-Bench (the benchmarks' cost depends on their lengths)
BENCHMARK_QUESTIONS = [
    ("Which of the following best describes the object held by the person in the image?",
     ["a red umbrella", "a wooden walking stick", "a blue shopping bag", "a folded newspaper"]),
    ("What is the colour of the small sign on the left side of the image?", ["red", "blue", "green", "yellow"]),
    ("How many people are sitting at the table in the background?", ["one", "two", "three", "four"]),
    ("What is the most likely season in which this photo was taken?", ["spring", "summer", "autumn", "winter"]),
    ("Which text appears on the banner above the entrance?", ["OPEN DAILY", "GRAND SALE", "WELCOME HOME", "NO PARKING"]),
    ("Where is the bicycle relative to the bench?", ["to the left", "to the right", "behind it", "in front of it"]),
]


def benchmark_questions(folder: str | Path, size: tuple[int, int], n: int = 1, dataset: str = "HRBench-4K",
                        prefix: str = "q") -> pd.DataFrame:
    """``n`` 4-option questions (48 formats + standard x 4 circular shifts = 196 prompts each), each on its own
    photo-sized JPEG of ``size`` (width, height): a ramp plus noise, which compresses and decodes as a photo does.
    What the speed benchmarks time at real image sizes (``dataset`` picks the Table 5 standard format). An image
    already in ``folder`` is reused, so a process that measures memory can be handed images made elsewhere."""
    w, h = size
    rows = []
    for i in range(n):
        path = Path(folder) / f"{prefix}-{w}x{h}-{i}.jpg"
        if not path.exists():
            noise = np.random.default_rng(i).integers(0, 77, (h, w, 3), dtype=np.uint8)
            ramp = np.linspace(0, 178, w).astype(np.uint8)[None, :, None]
            Image.fromarray(noise + ramp).save(path, quality=90)  # <= 76 + 178: no overflow
        question, options = BENCHMARK_QUESTIONS[i % len(BENCHMARK_QUESTIONS)]
        rows.append({"dataset": dataset, "question_id": f"{prefix}-{w}x{h}-{i}", "question": question,
                     "options": options, "answer": i % 4, "images": [str(path)], "category": "benchmark",
                     "modality": "image"})
    return pd.DataFrame(rows)
