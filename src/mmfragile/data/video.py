"""Video questions -> sampled frames as image files (PyAV for video files, Pillow for GIFs, frame folders as is).

A video question's ``images`` is either a list of ready frame images (the synthetic clips) or one video
source: a video file (.mp4, .webm, .avi, ...), an animated GIF or a folder of frame images (MVBench's
TVQA frames). :func:`sample_frames` picks frames by :func:`frame_indices` - the rule the Promptception
study uses (Appendix F: sampling at an FPS, capped at N frames) - optionally inside a time window
``bound=(start, end)`` in seconds (MVBench's ``start``/``end`` fields), decodes only the kept frames and
writes them once as PNG to a cache folder keyed by the source file. :func:`question_frames` does this
for one question-table row, reading the window and the source frame rate of frame folders from the
row's ``video_start`` / ``video_end`` / ``video_fps`` columns (written by the MVBench loader).

Errors: a missing source, an empty folder or a file that does not decode raises
:class:`~mmfragile.errors.DataError` naming it (and ``where``, e.g. the question's file and row).
"""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from mmfragile.paths import build_once, cache_dir
from mmfragile.errors import DataError
from mmfragile.data.images import IMAGE_EXTS

VIDEO_EXTS = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".flv", ".mpg", ".mpeg", ".wmv", ".3gp"}


def frame_indices(total: int, n_frames: int | None = None, fps: float | None = None,
                  source_fps: float | None = None) -> list[int]:
    """Indices of the frames kept out of ``total`` (Promptception Appendix F, Table 11: "FPS" and "Frames").

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


def window_indices(total: int, n_frames: int | None = None, fps: float | None = None,
                   source_fps: float | None = None, bound: tuple[float, float] | None = None) -> list[int]:
    """:func:`frame_indices` applied inside a time window: ``bound=(start, end)`` seconds keeps frames
    ``round(start * source_fps) .. round(end * source_fps)`` (clipped to the video; the convention of
    MVBench's own loader, ``get_index``), then samples those as if they were the whole video.
    Without ``bound`` this is :func:`frame_indices`."""
    if bound is None:
        return frame_indices(total, n_frames, fps, source_fps)
    start, end = float(bound[0]), float(bound[1])
    if not source_fps or source_fps <= 0:
        raise ValueError("a time window (bound) needs the source frame rate (source_fps)")
    if not end > start:
        raise ValueError(f"bound end must be after start, got {bound}")
    lo = max(0, int(round(start * source_fps)))
    hi = min(int(total) - 1, int(round(end * source_fps)))
    if hi < lo:
        raise ValueError(f"bound {bound} s lies outside the video ({total} frames at {source_fps:g} fps)")
    return [lo + i for i in frame_indices(hi - lo + 1, n_frames, fps, source_fps)]


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
    # same source + index -> same frame: keep the file written once
    return str(build_once(path, lambda tmp: img.convert("RGB").save(tmp, format="PNG"), file=True).resolve())


def _gif_frames(path: Path, n_frames, fps, source_fps, out_dir, bound, where) -> list[str]:
    from PIL import Image, ImageSequence, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            total = getattr(im, "n_frames", 1)
            if source_fps is None and (fps is not None or bound is not None):
                durs = [fr.info.get("duration", 0) for fr in ImageSequence.Iterator(im)]
                mean = float(np.mean(durs)) if durs else 0.0
                source_fps = 1000.0 / mean if mean > 0 else None
            keep = window_indices(total, n_frames, fps, source_fps, bound)
            out = _frames_dir(path, out_dir)
            paths = {}
            for i, fr in enumerate(ImageSequence.Iterator(im)):
                if i in keep and i not in paths:
                    paths[i] = _save_frame(fr, out / f"frame_{i:06d}.png")
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise DataError(f"{where}{path}: unreadable animated image: {e}") from e
    return [paths[i] for i in keep]


def _video_frames(path: Path, n_frames, fps, source_fps, out_dir, bound, where) -> list[str]:
    try:
        import av  # PyAV: only for real video files
    except ImportError as e:
        raise ImportError(f"{path}: decoding {path.suffix} video needs PyAV (`pip install av`), which is not "
                          "installed; alternatively pass a folder of extracted frames, a list of frame paths "
                          "or a GIF") from e
    errors = (OSError, ValueError, IndexError, getattr(av, "FFmpegError", OSError))
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DataError(f"{where}{path}: no video stream in the file")
            stream = container.streams.video[0]
            rate = float(stream.average_rate) if stream.average_rate else None
            total = int(stream.frames or 0)
            if total <= 0:  # container without a frame count: count by decoding
                total = sum(1 for _ in container.decode(video=0))
        if total <= 0:
            raise DataError(f"{where}{path}: the video has no decodable frames")
        keep = window_indices(total, n_frames, fps, source_fps if source_fps is not None else rate, bound)
        want = set(keep)
        out = _frames_dir(path, out_dir)
        paths = {}
        with av.open(str(path)) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i in want:
                    paths[i] = _save_frame(frame.to_image(), out / f"frame_{i:06d}.png")
                if i >= max(keep):
                    break
    except errors as e:
        raise DataError(f"{where}{path}: unreadable video: {e}") from e
    missing = [i for i in keep if i not in paths]
    if missing:
        raise DataError(f"{where}{path}: video ended before frame(s) {missing[:5]} (reported {total} frames)")
    return [paths[i] for i in keep]


def sample_frames(frames_or_path: str | Path | Sequence[str | Path], n_frames: int | None = None,
                  fps: float | None = None, source_fps: float | None = None,
                  out_dir: str | Path | None = None, bound: tuple[float, float] | None = None,
                  where: str = "") -> list[str]:
    """Uniformly sampled frames of a video as image paths, in temporal order (rule: :func:`frame_indices`,
    inside ``bound`` seconds if given: :func:`window_indices`).

    ``frames_or_path`` is a list of frame paths (already in order; a one-element list holding a video,
    GIF or folder is opened), a folder of frame images (natural order of the file names: ``f2`` before
    ``f10``; their rate must be given as ``source_fps`` for ``fps`` or ``bound``), a GIF / animated image
    (decoded with Pillow; its frame durations give ``source_fps``), or a video file (.mp4, .webm, ...;
    decoded with PyAV - an :class:`ImportError` saying so if it is missing; the stream's average rate is
    ``source_fps`` unless given). Decoded frames are written once as PNG under ``out_dir`` (default: a
    cache folder keyed by the file). A missing path, an empty folder or an unreadable file raises
    :class:`DataError` naming it, prefixed by ``where`` (e.g. ``"<file>, row 3: "``).
    """
    w = f"{where}: " if where and not where.endswith(": ") else where
    if isinstance(frames_or_path, (list, tuple)):
        frames = [str(f) for f in frames_or_path]
        if not frames:
            raise DataError(f"{w}sample_frames: empty frame list")
        if len(frames) == 1:
            p = Path(frames[0])
            if p.is_dir() or p.suffix.lower() in VIDEO_EXTS or p.suffix.lower() == ".gif":
                return sample_frames(p, n_frames, fps, source_fps, out_dir, bound, where)
        return [frames[i] for i in _indices(len(frames), n_frames, fps, source_fps, bound, w)]
    path = Path(frames_or_path)
    if not path.exists():
        raise DataError(f"{w}sample_frames: video / frames not found: {path}")
    if path.is_dir():
        files = sorted((f for f in path.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_EXTS
                        and not f.name.startswith(".")), key=_natural_key)
        if not files:
            raise DataError(f"{w}sample_frames: no frame images ({sorted(IMAGE_EXTS)}) in folder {path}")
        return [str(files[i]) for i in _indices(len(files), n_frames, fps, source_fps, bound, w)]
    suffix = path.suffix.lower()
    if suffix in VIDEO_EXTS:
        return _video_frames(path, n_frames, fps, source_fps, out_dir, bound, w)
    if suffix in IMAGE_EXTS:
        return _gif_frames(path, n_frames, fps, source_fps, out_dir, bound, w)  # a still image: 1-frame video
    raise DataError(f"{w}sample_frames: {path} is neither a frame folder, an image/GIF nor a known video type "
                    f"({sorted(VIDEO_EXTS)})")


def _indices(total, n_frames, fps, source_fps, bound, w) -> list[int]:
    try:
        return window_indices(total, n_frames, fps, source_fps, bound)
    except ValueError as e:  # a window outside the video, a frame folder without its rate: the row's problem
        raise DataError(f"{w}{e}") from e


def _number(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def question_bound(rec: Mapping[str, Any]) -> tuple[float, float] | None:
    """``(video_start, video_end)`` of a question-table row, or None when the row has no window."""
    start, end = _number(rec.get("video_start")), _number(rec.get("video_end"))
    return None if start is None or end is None else (start, end)


def is_video_source(images: Sequence[str | Path]) -> bool:
    """True when ``images`` is one video file, GIF or frame folder (not a list of ready frames)."""
    if len(images) != 1:
        return False
    p = Path(images[0])
    return p.suffix.lower() in VIDEO_EXTS | {".gif"} or p.is_dir()


def question_frames(rec: Mapping[str, Any], n_frames: int | None = None, fps: float | None = None,
                    use_bounds: bool = True, source_fps: float | None = None,
                    out_dir: str | Path | None = None, require_budget: bool = False) -> list[str]:
    """The frames shown for one question-table row: :func:`sample_frames` of its ``images`` with the
    row's ``video_fps`` (source rate of a frame folder; else ``source_fps``) and - if ``use_bounds`` - its
    ``video_start``/``video_end`` window. Errors name the row (:func:`mmfragile.schema.row_where`).
    ``require_budget``: a video source with neither ``n_frames`` nor ``fps`` is an error (for studies whose
    protocol has no video, where keeping every frame would be a silent choice)."""
    from mmfragile.schema import row_where

    images = list(rec.get("images") if rec.get("images") is not None else [])
    if require_budget and n_frames is None and fps is None and is_video_source(images):
        raise DataError(f"{row_where(rec)}: a video question needs n_frames or fps (this study has no video "
                        "protocol, so the frame budget must be chosen)")
    bound = question_bound(rec) if use_bounds else None
    rate = _number(rec.get("video_fps"))
    return sample_frames(images, n_frames=n_frames, fps=fps, source_fps=rate if rate is not None else source_fps,
                         out_dir=out_dir, bound=bound, where=row_where(rec))


def question_media(rec: Mapping[str, Any], cannot_show: str | None = None, **frames: Any) -> list:
    """What a prompt of one question-table row shows: its images, or - for a video question - the frames
    :func:`question_frames` samples (``frames``: ``n_frames``, ``fps``, ``use_bounds``, ``source_fps``,
    ``require_budget``). ``cannot_show``: why the calling study cannot show a row whose options are only in the
    image (MMMU-Pro vision) - such a row is then a :class:`DataError` naming it; None where it can."""
    from mmfragile.schema import options_in_image, row_where

    if cannot_show and options_in_image(rec):
        raise DataError(f"{row_where(rec)}: the options are in the image (MMMU-Pro vision setting); {cannot_show}")
    images = list(rec.get("images") if rec.get("images") is not None else [])
    if rec.get("modality") == "video" and images:
        return question_frames(rec, **frames)
    return images
