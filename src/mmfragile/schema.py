"""The one question schema every dataset, prompt builder and metric in mmfragile speaks.

A multiple-choice question is a row with these columns (a pandas DataFrame of them is a
"question table"); the loaders in :mod:`mmfragile.data` all return this shape, so the
prompt builders and evaluators never care where a question came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field, asdict
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from mmfragile.data.images import pixel_limit_lifted
from mmfragile.errors import DataError, row_error

#: Columns of a question table, in order.
QUESTION_COLUMNS = [
    "dataset",      # str: dataset name, e.g. "synthetic-vqa", "a-okvqa"
    "question_id",  # str: unique within the dataset
    "question",     # str: the question text without options
    "options",      # list[str]: answer options in their canonical order (2..N)
    "answer",       # int: index into options of the correct answer
    "images",       # list[str]: absolute paths of the images (0 = text-only, >1 = multi-image / video frames)
    "category",     # str: question type / sub-benchmark (free text, may be "")
    "modality",     # str: "image", "multi-image", "video" or "text"
]


#: Files a video question may list as ready frames (anything else is a video file or a frame folder).
_FRAME_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp"}


@dataclass
class MCQuestion:
    """One multiple-choice question. ``answer`` indexes ``options``."""

    dataset: str
    question_id: str
    question: str
    options: list[str]
    answer: int
    images: list[str] = field(default_factory=list)
    category: str = ""
    modality: str = "image"

    @property
    def answer_text(self) -> str:
        return self.options[self.answer]

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: Any) -> "MCQuestion":
        get = row.get if hasattr(row, "get") else lambda k, d=None: getattr(row, k, d)
        return cls(
            dataset=str(get("dataset")),
            question_id=str(get("question_id")),
            question=str(get("question")),
            options=[str(o) for o in get("options")],
            answer=int(get("answer")),
            images=[str(p) for p in (get("images") if get("images") is not None else [])],
            category=str(get("category", "") or ""),
            modality=str(get("modality", "image") or "image"),
        )


def check_question(q: "MCQuestion", where: str, check_images: bool = True) -> None:
    """Raise :class:`DataError` naming ``where`` for: fewer than two options, duplicate options, an answer
    index outside the options, and (``check_images``) a missing or unreadable image file - or, for a video
    question whose ``images`` name a video file or frame folder, a missing one (decoding happens when frames
    are sampled, :mod:`mmfragile.data.video`)."""
    opts = list(q.options)
    if len(opts) < 2:
        raise DataError(f"{where}: needs at least 2 options, got {len(opts)}")
    if len(set(map(str, opts))) != len(opts):
        raise DataError(f"{where}: duplicate options {opts}")
    ans = q.answer
    if not isinstance(ans, (int,)) and not (hasattr(ans, "dtype") and "int" in str(ans.dtype)):
        raise DataError(f"{where}: answer must be an option index, got {ans!r}")
    if not 0 <= int(ans) < len(opts):
        raise DataError(f"{where}: answer index {ans} is not among the {len(opts)} options {opts}")
    if check_images:
        for p in q.images:
            if q.modality == "video" and Path(p).suffix.lower() not in _FRAME_SUFFIXES:
                if not Path(p).exists():
                    raise DataError(f"{where}: video file or frame folder not found: {p}")
            else:
                check_image(p, where)


def validate_questions(df: pd.DataFrame, source: str | Path = "<table>", check_images: bool = True) -> pd.DataFrame:
    """Check a question table and return it with canonical column order.

    Raises :class:`DataError` naming ``source`` and the row for: a missing column, fewer than two
    options, duplicate options, an answer index outside the options, a duplicate question_id,
    and (``check_images``) a missing or unreadable image file (:func:`check_question`).
    """
    missing = [c for c in QUESTION_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"{source}: missing column(s) {missing}; a question table needs {QUESTION_COLUMNS}")
    seen: set[str] = set()
    for i, row in enumerate(df.itertuples(index=False)):
        where = f"{source}, row {i} (question_id={row.question_id!r})"
        q = MCQuestion(str(row.dataset), str(row.question_id), str(row.question), list(row.options), row.answer,
                       [str(p) for p in row.images], modality=str(row.modality))
        check_question(q, where, check_images)
        key = str(row.question_id)
        if key in seen:
            raise DataError(f"{where}: duplicate question_id")
        seen.add(key)
    return df[QUESTION_COLUMNS + [c for c in df.columns if c not in QUESTION_COLUMNS]].reset_index(drop=True)


def check_image(path: str | Path, where: str = "") -> None:
    """Raise :class:`DataError` if ``path`` is missing or not a decodable image. Reads the header (PNG:
    also the chunk CRCs), never the pixels; PIL's decompression-bomb limit does not apply here (an 8K or
    larger image is valid input - its size is the model side's resize policy)."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    prefix = f"{where}: " if where else ""
    if not p.is_file():
        raise DataError(f"{prefix}image file not found: {p}")
    try:
        with pixel_limit_lifted(), Image.open(p) as im:
            im.verify()
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise DataError(f"{prefix}corrupt or unreadable image {p}: {e}") from e


def row_where(rec: Any) -> str:
    """Where a question-table row came from, for error messages: ``"<file>, row <r> (question_id=...)"``
    when the loader recorded ``source_file`` / ``source_row``, else ``"dataset ..., question_id=..."``."""
    get = rec.get if hasattr(rec, "get") else lambda k, d=None: getattr(rec, k, d)
    f, r = get("source_file"), get("source_row")
    if f is not None and not (isinstance(f, float) and f != f):
        return f"{f}, row {int(r)} (question_id={get('question_id')!r})"
    return f"dataset {get('dataset')!r}, question_id={get('question_id')!r}"


def options_in_image(rec: Any) -> bool:
    """True for a row whose options are only in the image (MMMU-Pro vision; column ``options_in_image``)."""
    get = rec.get if hasattr(rec, "get") else lambda k, d=None: getattr(rec, k, d)
    v = get("options_in_image")
    if isinstance(v, bool):
        return v
    return bool(getattr(v, "dtype", None) == bool and v)  # numpy bool from parquet; NaN (other datasets) -> False


def skip_or_raise(rec: Any, error: Exception, skipped: list[dict] | None) -> None:
    """A question row a study cannot use: raise ``error`` (which names the row), or - with a ``skipped`` list
    (``skip_bad_rows``) - record it there (:func:`bad_row`) for the run's config.json."""
    if skipped is None:
        where = bad_row(rec, error)
        raise row_error(error, where["file"], where["row"]) if isinstance(error, DataError) else error
    skipped.append(bad_row(rec, error))


def bad_row(rec: Any, reason: Exception | str) -> dict:
    """``{"file", "row", "reason"}`` for a question-table row a run leaves out (``skip_bad_rows``)."""
    get = rec.get if hasattr(rec, "get") else lambda k, d=None: getattr(rec, k, d)
    f, r = get("source_file"), get("source_row")
    if f is None or (isinstance(f, float) and f != f):
        return {"file": f"dataset {get('dataset')}", "row": str(get("question_id")), "reason": str(reason)}
    return {"file": str(f), "row": int(r), "reason": str(reason)}


def answer_index(options: Sequence[str], answer_text: str, where: str) -> int:
    """Index of ``answer_text`` in ``options``; :class:`DataError` naming ``where`` if absent."""
    norm = [str(o).strip().lower() for o in options]
    key = str(answer_text).strip().lower()
    if key not in norm:
        raise DataError(f"{where}: answer {answer_text!r} is not among the options {list(options)}")
    return norm.index(key)


def questions_frame(questions: Sequence[MCQuestion]) -> pd.DataFrame:
    return pd.DataFrame([q.to_row() for q in questions], columns=QUESTION_COLUMNS)
