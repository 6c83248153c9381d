"""Study 2 (Promptception) on any model: evaluation items, two-stage scoring, video frame sampling, and
reading the result stores back into the accuracy frames of :mod:`mmfragile.metrics.promptception`.

Protocol (seed ``promptception``):

* Sec. 2.1 / 3: every question is asked once per prompt type, zero-shot; the prompt of
  :func:`mmfragile.prompts.promptception.render` is the whole user turn, the images (or video frames)
  come before it. The 61 prompt types are run by default - 59 on image / multi-image / text questions,
  61 on video questions (11.4 and 11.5 are video-only, Sec. 4.2.2). The catalog's ``"baseline"`` prompt
  (Fig. 3) is the same text as Type 1.1, so it is not run twice: the metrics take 1.1 as the baseline
  (:func:`mmfragile.metrics.promptception.baseline_accuracy`); pass ``prompt_ids=[..., "baseline"]`` to
  run it explicitly anyway.
* Generation is greedy with one ``max_new_tokens`` for every prompt (default 48: enough for the answer
  formats and a short rationale of the CoT / "explain" prompts, cheap enough for CPU runs; the paper does
  not state its limit). A truncated rationale that never names a letter goes to stage 2 like any other.
* App. E: answers are extracted in two stages (regex, then a text model - GPT-4o mini in the paper,
  SmolLM2 in the notebooks) by :func:`make_score_fn`. Unresolved answers are **incorrect and kept**.
  ``exclude_refusals=True`` is the paper's GPT-4o policy: refusal-aware matching prompt (Fig. 8) and the
  ``refusal`` flag, so that :func:`accuracy_frame` drops refusals from that model's denominator.
* App. F: video inputs are frames sampled by :func:`sample_frames` (1 fps capped at N frames in the
  paper, N = 16-64 depending on the model; here ``n_frames`` / ``fps`` per run).

Results go through :func:`mmfragile.evaluate.run_items` into a resumable
:class:`~mmfragile.store.ResultStore` at ``<results_dir>/<model>/<dataset>`` (:func:`store_dir`).
"""
from __future__ import annotations

import hashlib
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from ..evaluate import EvalItem
from ..extraction import extract_answer, is_refusal
from ..models.base import MLLM
from ..paths import cache_dir
from ..prompts.promptception import BASELINE_ID, get_prompt_type, prompt_ids as catalog_prompt_ids
from ..schema import DataError, MCQuestion
from ..store import find_stores

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS", "PromptceptionItem", "promptception_items", "resolve_model_kind", "make_score_fn",
    "PromptceptionTask", "frame_indices",
    "sample_frames", "select_questions", "store_dir", "run_config", "load_results", "accuracy_frame",
    "load_accuracy", "split_zero_baselines", "figure_note_for", "summarize_run",
]

#: Generation limit of every prompt (see the module docstring).
DEFAULT_MAX_NEW_TOKENS = 48
#: Order in which :func:`select_questions` spreads a small sample over modalities.
MODALITY_ORDER = ("image", "video", "multi-image", "text")
IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif"}
VIDEO_EXTS = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".flv", ".mpg", ".mpeg", ".wmv", ".3gp"}


# ---------------------------------------------------------------------------------------------- items
@dataclass
class PromptceptionItem(EvalItem):
    """An :class:`EvalItem` that also carries the question text and the options as rendered (including
    options a prompt adds, 7.6), which the stage-2 extraction prompt shows to the matcher model."""

    question: str = ""
    options: list[str] = field(default_factory=list)


def resolve_model_kind(model: MLLM | str, model_kind: str = "auto") -> str:
    """The prompt variant of Appendix A: ``model_kind`` "open" / "proprietary" as given; "auto" gives
    "proprietary" for OpenAI-compatible API models (or ``openai:`` model specs) and "open" for everything else."""
    if model_kind == "auto":  # API models get the proprietary variant (Appendix A), local ones the open one
        api = model.startswith("openai:") if isinstance(model, str) else type(model).__name__ == "OpenAIChatModel"
        return "proprietary" if api else "open"
    return model_kind


def promptception_items(model: MLLM, questions: pd.DataFrame, prompt_ids: Sequence[str] | None = None,
                        model_kind: str = "open", max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                        n_frames: int | None = None, fps: float | None = None, source_fps: float | None = None,
                        omit_dollar: bool = False, system: str | None = None) -> list[PromptceptionItem]:
    """One item per question x prompt type (Sec. 3), grouped by question for the prefix-sharing engine.

    ``prompt_ids`` (a list, or one comma-separated string) defaults to the 61 prompt types (no separate
    baseline, see the module docstring);
    prompts a question's modality does not support (11.4 / 11.5 on non-video questions) are skipped.
    ``model_kind`` is "open", "proprietary" (Appendix A's two answer-format variants) or "auto"
    (proprietary for OpenAI-compatible API models). ``omit_dollar`` drops the ``$`` of ``$LETTER``
    (Appendix J, GPT-4o). Video questions get their frames through :func:`sample_frames` with
    ``n_frames`` / ``fps`` / ``source_fps`` (a question whose ``images`` is one video file, GIF or frame
    folder is decoded there). Questions with images are skipped, with a warning, for a text-only model.

    Key columns: ``dataset, question_id, variant (= prompt_id), prompt_id, category`` (prompt category
    1-15), ``supercategory`` (1-6), ``intent, modality, n_options`` (the question's own options) and
    ``question_category``. ``answer_id`` is the correct letter, ``option_ids`` every letter shown.
    """
    kind = resolve_model_kind(model, model_kind)
    if isinstance(prompt_ids, str):  # "1.1,6.1" from a command line / papermill -p
        prompt_ids = [p.strip() for p in prompt_ids.split(",") if p.strip()]
    pids = [str(p) for p in (prompt_ids if prompt_ids is not None else catalog_prompt_ids(include_baseline=False))]
    types = [get_prompt_type(p) for p in pids]  # KeyError for an unknown id, before any work
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    items: list[PromptceptionItem] = []
    skipped: list[str] = []
    for rec in questions.to_dict("records"):
        q = MCQuestion.from_row(rec)
        if q.images and not getattr(model, "supports_images", True):
            skipped.append(q.question_id)
            continue
        images = list(q.images)
        if q.modality == "video" and images:
            images = sample_frames(images, n_frames=n_frames, fps=fps, source_fps=source_fps)
        for pt in types:
            if not pt.supports(q.modality):
                continue
            r = pt.render(q, model_kind=kind, omit_dollar=omit_dollar)
            items.append(PromptceptionItem(
                key={"dataset": q.dataset, "question_id": q.question_id, "variant": pt.prompt_id,
                     "prompt_id": pt.prompt_id, "category": int(pt.category), "supercategory": int(pt.supercategory),
                     "intent": pt.intent if pt.intent is not None else ("neutral" if pt.prompt_id == BASELINE_ID else ""),
                     "modality": q.modality, "n_options": len(q.options), "question_category": q.category},
                prompt=r.to_prompt(images=images, system=system), option_ids=list(r.valid_letters),
                answer_id=r.answer_letter, max_new_tokens=int(max_new_tokens),
                question=q.question, options=list(r.options)))
    if skipped:
        warnings.warn(f"{getattr(model, 'name', 'model')} is text-only: skipped {len(skipped)} question(s) with "
                      f"images ({skipped[:5]}{' ...' if len(skipped) > 5 else ''})", stacklevel=2)
    items.sort(key=lambda it: (it.group, it.max_new_tokens))  # stable: prompt order kept within a question
    return items


# ---------------------------------------------------------------------------------------------- scoring
def make_score_fn(extractor_model: MLLM | None = None, exclude_refusals: bool = False,
                  max_new_tokens: int = 8, match_text: bool = False) -> Callable[[str, EvalItem], dict[str, Any]]:
    """A ``run_items`` score function applying the two-stage extraction of Appendix E.

    Stage 1 is the regex of :func:`mmfragile.extraction.extract_letter_regex`; stage 2 (only when stage 1
    finds no letter and ``extractor_model`` is given) asks that text model with the Fig. 7 prompt, or the
    refusal-aware Fig. 8 prompt when ``exclude_refusals`` is set (the paper's GPT-4o policy).

    ``match_text`` adds :func:`mmfragile.extraction.match_option_text` between the two stages (a response that
    names exactly one option's text; stage "text"), a free stand-in for a weak or absent stage-2 model.

    Returns ``letter`` (None if unresolved), ``extraction_stage`` ("regex", "text", "model", "failed", "refusal"),
    ``refusal``, ``correct`` (False whenever no letter - never dropped here), ``covered`` (a valid letter was
    extracted; a prompt's added options such as 7.6's "Not sure" count as covered, never correct) and
    ``extractor_output`` (the raw stage-2 output, None if stage 2 did not run).

    ``refusal``: with ``exclude_refusals`` it is the extraction's refusal verdict (stage "refusal", which
    :func:`accuracy_frame` then leaves out of the denominator); without it the Fig. 7 pipeline runs and an
    unresolved response is "failed", but ``refusal`` still flags responses that read as refusals
    (:func:`mmfragile.extraction.is_refusal`) for reporting - they stay incorrect.
    """

    def score(raw: str, item: EvalItem) -> dict[str, Any]:
        question = getattr(item, "question", "") or item.prompt.text
        options = list(getattr(item, "options", None) or [])
        res = extract_answer(raw, question, item.option_ids, extractor_model, options=options,
                             refusals=exclude_refusals, max_new_tokens=max_new_tokens, match_text=match_text)
        refusal = res.refusal if exclude_refusals else (res.letter is None and is_refusal(raw))
        return {"letter": res.letter, "extraction_stage": res.stage, "refusal": bool(refusal),
                "correct": bool(res.is_correct(item.answer_id)), "covered": res.letter is not None,
                "extractor_output": res.model_output}

    return score


_EXTRACTORS: dict[str, MLLM] = {}


def _extractor_model(spec: str | None, model: MLLM) -> MLLM | None:
    """The stage-2 matcher ``spec`` (the evaluated model itself if it has that name), loaded once per process."""
    if not spec:
        return None
    if spec == model.name:
        return model
    if spec not in _EXTRACTORS:
        from ..api import load_model

        _EXTRACTORS[spec] = load_model(spec)
    return _EXTRACTORS[spec]


@dataclass(frozen=True)
class PromptceptionTask:
    """Every question of a batch x prompt type through :func:`mmfragile.evaluate.run_items` with the two-stage
    scoring of :func:`make_score_fn` - the notebook's run as one picklable call, for ``--shard`` runs and
    :func:`mmfragile.distributed.run_on_ray` (``extractor`` is a model spec, loaded once per worker)."""

    prompt_ids: tuple[str, ...] | None = None
    model_kind: str = "auto"
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    n_frames: int | None = None
    fps: float | None = None
    extractor: str | None = None
    exclude_refusals: bool = False
    match_text: bool = False
    batch_size: int = 16
    flush_every: int = 256
    progress: bool = False

    def __call__(self, model: MLLM, units: list[dict], store: Any, shard: Any) -> None:
        from ..evaluate import run_items
        from ..shards import Shard

        shard = Shard.parse(shard)
        questions = shard.questions(pd.DataFrame(units))
        items = promptception_items(model, questions, self.prompt_ids, model_kind=self.model_kind,
                                    max_new_tokens=self.max_new_tokens, n_frames=self.n_frames, fps=self.fps)
        score = make_score_fn(_extractor_model(self.extractor, model), exclude_refusals=self.exclude_refusals,
                              match_text=self.match_text)
        run_items(model, items, store, score, batch_size=self.batch_size, flush_every=self.flush_every,
                  progress=self.progress, shard=shard)


# ---------------------------------------------------------------------------------------------- video
def frame_indices(total: int, n_frames: int | None = None, fps: float | None = None,
                  source_fps: float | None = None) -> list[int]:
    """Indices of the frames kept out of ``total`` (Appendix F, Table 11: "FPS" and "Frames").

    The rule is the one of the LLaVA-OneVision video loader (Table 11's first model): take every
    ``round(source_fps / fps)``-th frame (sampling at ``fps``); if that gives more than ``n_frames``
    frames - or when only ``n_frames`` is given - sample ``n_frames`` uniformly over the whole video,
    endpoints included: ``floor(linspace(0, total - 1, n_frames))``. E.g. 10 frames -> 4: 0, 3, 6, 9;
    6 -> 4: 0, 1, 3, 5; 10 frames at 2 fps sampled at 1 fps: 0, 2, 4, 6, 8. With ``n_frames >= total``
    every frame is kept once (no frame is repeated). Neither argument: all frames.
    """
    total = int(total)
    if total < 1:
        raise ValueError(f"a video needs at least one frame, got {total}")
    if n_frames is not None and int(n_frames) < 1:
        raise ValueError(f"n_frames must be >= 1, got {n_frames}")
    idx = list(range(total))
    if fps is not None:
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        if not source_fps or source_fps <= 0:
            raise ValueError("sampling at a frame rate (fps) needs the source frame rate (source_fps); frame lists "
                             "and folders carry none - pass source_fps, or use n_frames")
        step = max(1, int(round(source_fps / fps)))
        idx = list(range(0, total, step))
    if n_frames is not None and len(idx) > int(n_frames):
        idx = [int(i) for i in np.linspace(0, total - 1, int(n_frames)).astype(int)]
    return idx


def _natural_key(p: Path) -> list:
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", p.name)]


def _frames_dir(source: Path, out_dir: str | Path | None) -> Path:
    if out_dir is not None:
        d = Path(out_dir)
    else:
        st = source.stat()
        tag = hashlib.sha1(f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
        d = cache_dir("frames", f"{source.stem}-{tag}")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _save_frame(img, path: Path) -> str:
    if not path.exists():  # same source + index -> same frame: keep the file written once
        tmp = path.with_name(f".{path.stem}.tmp.png")
        img.convert("RGB").save(tmp, format="PNG")
        tmp.replace(path)
    return str(path.resolve())


def _gif_frames(path: Path, n_frames, fps, source_fps, out_dir) -> list[str]:
    from PIL import Image, ImageSequence, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            total = getattr(im, "n_frames", 1)
            if source_fps is None and fps is not None:
                durs = [fr.info.get("duration", 0) for fr in ImageSequence.Iterator(im)]
                mean = float(np.mean(durs)) if durs else 0.0
                source_fps = 1000.0 / mean if mean > 0 else None
            keep = frame_indices(total, n_frames, fps, source_fps)
            out = _frames_dir(path, out_dir)
            paths = {}
            for i, fr in enumerate(ImageSequence.Iterator(im)):
                if i in keep and i not in paths:
                    paths[i] = _save_frame(fr, out / f"frame_{i:06d}.png")
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise DataError(f"{path}: unreadable animated image: {e}") from e
    return [paths[i] for i in keep]


def _video_frames(path: Path, n_frames, fps, source_fps, out_dir) -> list[str]:
    try:
        import av  # PyAV: optional, only for real video files
    except ImportError as e:
        raise ImportError(f"{path}: decoding {path.suffix} video needs PyAV (`pip install av`), which is not "
                          "installed; alternatively pass a folder of extracted frames, a list of frame paths "
                          "or a GIF") from e
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            rate = float(stream.average_rate) if stream.average_rate else None
            total = int(stream.frames or 0)
            if total <= 0:  # container without a frame count: count by decoding
                total = sum(1 for _ in container.decode(video=0))
        keep = frame_indices(total, n_frames, fps, source_fps if source_fps is not None else rate)
        want = set(keep)
        out = _frames_dir(path, out_dir)
        paths = {}
        with av.open(str(path)) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i in want:
                    paths[i] = _save_frame(frame.to_image(), out / f"frame_{i:06d}.png")
                if i >= max(keep):
                    break
    except (OSError, ValueError, IndexError, getattr(av, "FFmpegError", OSError)) as e:
        raise DataError(f"{path}: unreadable video: {e}") from e
    missing = [i for i in keep if i not in paths]
    if missing:
        raise DataError(f"{path}: video ended before frame(s) {missing[:5]} (reported {total} frames)")
    return [paths[i] for i in keep]


def sample_frames(frames_or_path: str | Path | Sequence[str | Path], n_frames: int | None = None,
                  fps: float | None = None, source_fps: float | None = None,
                  out_dir: str | Path | None = None) -> list[str]:
    """Uniformly sampled frames of a video as image paths, in temporal order (rule: :func:`frame_indices`).

    ``frames_or_path`` is a list of frame paths (already in order; a one-element list holding a video,
    GIF or folder is opened), a folder of frame images (natural order of the file names: ``f2`` before
    ``f10``), a GIF / animated image (decoded with Pillow; its frame durations give ``source_fps``), or a
    video file (.mp4, .avi, ...; needs PyAV - an :class:`ImportError` saying so otherwise). Decoded frames
    are written once as PNG under ``out_dir`` (default: a cache folder keyed by the file). A missing path,
    an empty folder or an unreadable file raises :class:`DataError` naming it.
    """
    if isinstance(frames_or_path, (list, tuple)):
        frames = [str(f) for f in frames_or_path]
        if not frames:
            raise DataError("sample_frames: empty frame list")
        if len(frames) == 1:
            p = Path(frames[0])
            if p.is_dir() or p.suffix.lower() in VIDEO_EXTS or p.suffix.lower() == ".gif":
                return sample_frames(p, n_frames, fps, source_fps, out_dir)
        return [frames[i] for i in frame_indices(len(frames), n_frames, fps, source_fps)]
    path = Path(frames_or_path)
    if not path.exists():
        raise DataError(f"sample_frames: video / frames not found: {path}")
    if path.is_dir():
        files = sorted((f for f in path.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_EXTS
                        and not f.name.startswith(".")), key=_natural_key)
        if not files:
            raise DataError(f"sample_frames: no frame images ({sorted(IMAGE_EXTS)}) in folder {path}")
        return [str(files[i]) for i in frame_indices(len(files), n_frames, fps, source_fps)]
    suffix = path.suffix.lower()
    if suffix in VIDEO_EXTS:
        return _video_frames(path, n_frames, fps, source_fps, out_dir)
    if suffix in IMAGE_EXTS:
        return _gif_frames(path, n_frames, fps, source_fps, out_dir)  # a still image is a 1-frame video
    raise DataError(f"sample_frames: {path} is neither a frame folder, an image/GIF nor a known video type "
                    f"({sorted(VIDEO_EXTS)})")


# ---------------------------------------------------------------------------------------------- runs
def select_questions(questions: pd.DataFrame, n: int | None = None) -> pd.DataFrame:
    """``n`` questions spread evenly over modalities (order :data:`MODALITY_ORDER`, then others) and,
    within a modality, over question categories - round robin, deterministic, in table order otherwise.
    The first ``n`` of a larger selection are the selection of ``n``, so growing ``n`` resumes a run."""
    if n is None or n >= len(questions):
        n = len(questions)
    df = questions.reset_index(drop=True)
    mods = [m for m in MODALITY_ORDER if m in set(df.modality)] + \
           [m for m in dict.fromkeys(df.modality) if m not in MODALITY_ORDER]

    def round_robin(lists: list[list[int]]) -> list[int]:
        out: list[int] = []
        for k in range(max((len(l) for l in lists), default=0)):
            out += [l[k] for l in lists if k < len(l)]
        return out

    per_mod = []
    for m in mods:
        sub = df[df.modality == m]
        per_mod.append(round_robin([list(g.index) for _, g in sub.groupby("category", sort=False)]))
    order = round_robin(per_mod)[:n]
    return df.loc[order].reset_index(drop=True)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@=-]+", "_", str(name)).strip("_") or "_"


def store_dir(results_dir: str | Path, model: str, dataset: str) -> Path:
    """``<results_dir>/<model>/<dataset>`` with characters unsafe in file names replaced by ``_``."""
    return Path(results_dir) / _safe(model) / _safe(dataset)


def run_config(model: str, dataset: str, model_kind: str = "open", max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
               extractor: str | None = None, exclude_refusals: bool = False, n_frames: int | None = None,
               fps: float | None = None, omit_dollar: bool = False, match_text: bool = False) -> dict[str, Any]:
    """The store configuration: everything that changes a row's value (not which rows are run - questions
    and prompts can be added to a store later)."""
    return {"study": "promptception", "model": model, "dataset": dataset, "model_kind": model_kind,
            "max_new_tokens": int(max_new_tokens), "extractor": extractor, "exclude_refusals": bool(exclude_refusals),
            "n_frames": n_frames, "fps": fps, "omit_dollar": bool(omit_dollar), "match_text": bool(match_text)}


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """Every Promptception store under ``results_dir`` (any depth) as one per-question frame, with the
    store's ``exclude_refusals`` policy and folder added as columns. Empty frame if none."""
    root = Path(results_dir)
    if not root.exists():
        raise DataError(f"{root}: results folder not found")
    frames = []
    for store in find_stores(root, "promptception", default_study="promptception"):
        df = store.read()
        if df.empty:
            continue
        df = df.assign(exclude_refusals=bool(store.config.get("exclude_refusals", False)), store=str(store.root))
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def accuracy_frame(per_question: pd.DataFrame, benchmark_by: str = "modality") -> pd.DataFrame:
    """Accuracy per (benchmark, model, prompt_id) from store rows, via
    :func:`mmfragile.metrics.promptception.prompt_accuracy` (unresolved answers incorrect; refusals left out
    only for stores run with ``exclude_refusals``).

    ``benchmark_by="modality"`` splits a dataset that mixes modalities into one benchmark per modality,
    ``"<dataset>[<modality>]"`` - the paper's benchmarks are single-modality (MMStar image, MVBench video),
    so each gets its own prompt set (59 / 61) and baseline; ``"dataset"`` keeps one benchmark per dataset.
    """
    from ..metrics.promptception import prompt_accuracy

    if per_question.empty:
        raise DataError("accuracy_frame: no result rows")
    df = per_question.copy()
    if benchmark_by == "modality":
        n_mod = df.groupby("dataset").modality.transform("nunique")
        df["benchmark"] = np.where(n_mod > 1, df.dataset + "[" + df.modality + "]", df.dataset)
    elif benchmark_by == "dataset":
        df["benchmark"] = df.dataset
    else:
        raise ValueError(f"benchmark_by must be 'modality' or 'dataset', not {benchmark_by!r}")
    if "exclude_refusals" not in df.columns:
        df["exclude_refusals"] = False
    parts = [prompt_accuracy(g, exclude_refusals=bool(excl)) for excl, g in df.groupby("exclude_refusals")]
    return pd.concat(parts, ignore_index=True)


def load_accuracy(source: str | Path, benchmark_by: str = "modality") -> pd.DataFrame:
    """``"published"`` -> the paper's Tables 6-8; otherwise a results folder -> :func:`accuracy_frame`."""
    from ..metrics.promptception import load_published_accuracy

    if str(source) == "published":
        return load_published_accuracy()
    rows = load_results(source)
    if rows.empty:
        raise DataError(f"{source}: no Promptception result stores (config.json + parts/) found")
    return accuracy_frame(rows, benchmark_by=benchmark_by)


def split_zero_baselines(acc: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows usable for PRA / PRAD, the (benchmark, model) baselines that are 0 or missing).

    PRA (Eq. 2) divides by the baseline accuracy, which is undefined at 0 - possible on the few-question
    embedded runs, never in the paper; such (benchmark, model) pairs are left out of the relative analyses."""
    from ..metrics.promptception import baseline_accuracy

    base = baseline_accuracy(acc)
    bad = base[~(base.baseline > 0)]
    key = set(zip(bad.benchmark, bad.model))
    keep = [(b, m) not in key for b, m in zip(acc.benchmark, acc.model)]
    return acc[np.asarray(keep, dtype=bool)].reset_index(drop=True), bad.reset_index(drop=True)


def figure_note_for(models: Iterable[str]) -> str | None:
    """The footer for figures of these models: the notes of the embedded ones (random vision tower,
    text-only), joined; None when no embedded model is involved."""
    from ..api import figure_note

    notes = list(dict.fromkeys(n for n in (figure_note(str(m)) for m in models) if n))
    return "; ".join(notes) or None


def summarize_run(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Tables printed after a run: ``per_prompt`` (accuracy %, n, unresolved and refusals per prompt),
    ``stages`` (extraction-stage counts per modality) and ``per_modality`` (accuracy per modality)."""
    from ..metrics.promptception import prompt_sort_key

    df = rows.copy()
    df["unresolved"] = ~df.covered.astype(bool)
    per_prompt = df.groupby("prompt_id").agg(accuracy=("correct", "mean"), n=("correct", "size"),
                                             unresolved=("unresolved", "sum"), refusals=("refusal", "sum"),
                                             stage2=("extraction_stage", lambda s: int((s == "model").sum())))
    per_prompt["accuracy"] *= 100
    per_prompt = per_prompt.iloc[sorted(range(len(per_prompt)), key=lambda i: prompt_sort_key(per_prompt.index[i]))]
    stages = df.groupby([df.modality.astype(str), df.extraction_stage.astype(str)]).size().unstack(fill_value=0)
    stages.loc["all"] = stages.sum()
    per_modality = df.groupby("modality").agg(accuracy=("correct", "mean"), n=("correct", "size"),
                                              questions=("question_id", "nunique"), refusals=("refusal", "sum"))
    per_modality["accuracy"] *= 100
    return {"per_prompt": per_prompt.reset_index(), "stages": stages, "per_modality": per_modality.reset_index()}
