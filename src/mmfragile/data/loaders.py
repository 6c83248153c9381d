"""Loaders for the real benchmarks of the three studies, from local copies of the authors' releases (no hub access).

Every loader returns a question table (:mod:`mmfragile.schema`) plus two columns naming where each question
came from, ``source_file`` and ``source_row`` (0-based data row of that file). Images stay files on disk:
embedded ones (base64 in TSVs, bytes in parquet) are written once to a cache folder
(:mod:`mmfragile.data.images`); videos stay video files / frame folders until a study samples frames
(:mod:`mmfragile.data.video`). A bad row - missing file, corrupt base64 or image, answer not among the
options, unparseable options, duplicate id - raises :class:`~mmfragile.errors.DataError` naming the file and
row; with ``skip_bad_rows=True`` such rows are left out instead and listed in ``df.attrs["skipped_rows"]``
(``[{"file", "row", "reason"}, ...]``, :func:`skipped_rows`), which the study runners store in the run's
``config.json``. ``n`` keeps the first ``n`` good questions and stops reading there.

Spec strings for :func:`load_dataset` (``::`` separates a second path where a layout needs one):

=============================== =================================================================================
``aokvqa:<json>[::<coco>]``     A-OKVQA (github.com/allenai/aokvqa): ``aokvqa_v1p0_{split}.json`` - a list of
                                ``{question_id, question, choices, correct_choice_idx, image_id, ...}`` - and COCO
                                2017 images. ``<coco>`` is the COCO root, read as the A-OKVQA helper
                                ``get_coco_path`` does (``<coco>/<split>2017/<image_id:012d>.jpg``, split from the
                                file name), or the split folder itself; default: the json's folder.
``mmbench:<tsv>``               MMBench (github.com/open-compass/MMBench, the TSVs VLMEvalKit downloads, e.g.
                                ``MMBench_DEV_EN_V11.tsv``): ``index, question, hint, A..D, answer, category,
                                image, ...``; ``image`` is base64, or (<= 64 chars) the ``index`` of the row whose
                                image it reuses. Rows with ``index >= 1e6`` are the circular copies VLMEvalKit's
                                ``mcq_circular_eval`` groups by ``index % 1e6``: skipped by default (the studies
                                rotate options themselves; format-bias Tab. 5 counts 1,292 questions, 4,876
                                circular items), ``circular_copies=True`` keeps them. A row is skipped only when
                                it is such a copy: row ``index % 1e6`` exists, same question and hint, options a
                                rotation of its options and the answer letter rotated with them; any other row
                                ``>= 1e6`` (a copy of a row not in the file too) is a bad row, as is a copy whose
                                options, answer or image fail the checks of a loaded row.
``mmstar:<parquet|tsv>``        MMStar (HF ``Lin-Chen/MMStar`` ``mmstar.parquet``: ``index, question, image
                                (bytes), answer, category, l2_category, meta_info``; options inline as
                                ``"...\\nOptions: A: x, B: y"``) or VLMEvalKit's ``MMStar.tsv`` (``A..D`` columns,
                                base64 image).
``vstar:<folder>``              V*Bench (HF ``craigwu/vstar_bench``): ``direct_attributes/`` and
                                ``relative_position/``, each ``<name>.jpg`` + ``<name>.json`` (``question``,
                                ``options``, ``target_object``, ``bbox``); the correct option is listed first
                                (the V* evaluation scores option 0). Other folders (``OCR/``, ``GPT4V-hard/``) are
                                not part of the benchmark and are not read.
``hrbench4k:<tsv|parquet>``     HR-Bench 4K / 8K (HF ``DreamMr/HR-Bench``: ``hr_bench_4k.tsv`` / ``.parquet``,
``hrbench8k:<tsv|parquet>``     ``hr_bench_8k.*``): ``index, question, A..D, answer, category (single|cross),
                                cycle_category, image (base64)``. The 800 rows are 200 questions x 4 cycles
                                (VLMEvalKit / lmms-eval average accuracy over ``cycle_category`` groups); the
                                loader keeps the rows of the first cycle in file order (``cycles="first"``: 200
                                questions, as format-bias Tab. 5 counts them - the studies rotate options
                                themselves); ``cycles="all"`` keeps all 800. The rows of the other cycles are
                                checked all the same (options, answer, unique index; the image decoded, then
                                discarded): a bad one is a bad row. That the four cycles hold the same
                                questions with rotated options is inferred from the 200/800 counts (HR-Bench
                                README: 100 FSP + 100 FCP samples), not stated in the release.
``mme-realworld-lite:<file>``   MME-RealWorld-Lite: VLMEvalKit's ``mme_realworld_lite.tsv`` (HF
``[::<images>]``                ``yifanzhang114/MME-RealWorld-Base64``: ``index, image (base64), question,
                                multi-choice options, answer, category, l2-category``; options are a list literal
                                ``['(A) x', ..., '(E) y']``), the lmms-eval parquet (HF
                                ``yifanzhang114/MME-RealWorld-lite-lmms-eval``, same columns, image in ``bytes``)
                                or the official JSON (github.com/yfzhang114/MME-RealWorld: ``Question_id, Image,
                                Text, Answer choices, Ground truth, Task, Subtask, Category``; ``Image`` relative
                                to ``<images>``). The ``(A) `` prefixes are stripped (half- or full-width
                                brackets) and must run A, B, C, ... in order.
``mmmu-pro-s4:<path>``          MMMU-Pro (HF ``MMMU/MMMU_Pro``): ``<path>`` is the snapshot root (holding the
``mmmu-pro-s10:<path>``         folders ``standard (4 options)``, ``standard (10 options)``, ``vision``), one of
``mmmu-pro-vision:<path>``      those folders (parquet shards) or one parquet / JSON file. Standard: ``id,
``[::<images>]``                question, options (list literal), explanation, image_1..image_7, img_type, answer,
                                topic_difficulty, subject``; vision: ``id, image, options, answer, subject``. JSON
                                files with the same columns and image file names (the Promptception authors'
                                ``MMMU-Pro_standard_4options.json``) read images from ``<images>``.
                                ``mmmu-pro:<path>`` infers the setting from a config folder's name.
``mvbench:<root>``              MVBench (HF ``OpenGVLab/MVBench``): ``json/<task>.json`` for the 20 tasks
                                (``{video, question, candidates, answer (text), start?, end?}``) and the videos
                                unzipped under ``video/<prefix>/`` (or ``video/data0613/<prefix>/``). The
                                per-task prefix, data type (``video``; ``frame``: a folder of JPEG frames at 3 fps,
                                Episodic Reasoning) and whether ``start``/``end`` bound the clip are MVBench's
                                ``data_list`` (as in VLMEvalKit ``vlmeval/dataset/mvbench.py``).
``generic:<file>``              parquet / JSONL / JSON with ``question, options, answer`` (index, letter or option
                                text) and ``image`` / ``images``.
=============================== =================================================================================

Interleaved images (MMMU-Pro): the question and option texts keep their ``<image k>`` markers exactly as
published and ``images`` lists *every* image the row has, ``image_1 .. image_n`` in order, so that
``<image k>`` is ``images[k-1]`` (the :class:`~mmfragile.models.base.Prompt` convention, split with
:func:`mmfragile.models.base.split_interleaved`). Why every image, not only the named ones: the
Promptception authors' inference scripts pass all non-null ``image_1..image_7`` in order
(``Infer/mmmu-pro/infer_mmmu-pro_qwen2-vl-7B.py``, ``origin_mmmu_doc_to_visual``), VLMEvalKit keeps all of
a question's images and indexes them as ``images[k-1]`` (``MMMUDataset.split_MMMU``), and dropping an
unnamed ``image_j`` would shift every later marker. lmms-eval (sorted named images) and MMMU-Pro's own
``infer_transformers.py`` (named images in order of mention) send only named ones; an adapter can do that
with :func:`~mmfragile.models.base.unnamed_images`. A marker naming a missing image, or a gap in
``image_1..image_n``, is a bad row. The vision setting has no question text: ``question`` is empty, the
options (needed for scoring) are in the ``options`` column and ``options_in_image`` is True.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

from mmfragile.errors import row_error
from mmfragile.paths import cache_dir
from mmfragile.errors import DataError
from mmfragile.schema import QUESTION_COLUMNS, MCQuestion, answer_index, check_question
from mmfragile.data.images import REFERENCE_MAX_CHARS, looks_like_path, check_image_bytes, decode_base64, image_field

LETTERS = string.ascii_uppercase


# ============================================================================================== collecting rows
@dataclass
class _Collector:
    """Questions of one load, checked row by row; bad rows raise or are recorded (``skip_bad_rows``)."""

    skip_bad_rows: bool = False
    n: int | None = None
    rows: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        return self.n is not None and len(self.rows) >= self.n

    @contextlib.contextmanager
    def row(self, file: str | Path, row: int) -> Iterator[None]:
        try:
            yield
        except DataError as e:
            if not self.skip_bad_rows:
                raise row_error(e, file, row)
            self.skipped.append({"file": str(file), "row": int(row), "reason": str(e)})

    def add(self, q: MCQuestion, file: str | Path, row: int, where: str, **extra: Any) -> None:
        check_question(q, where)
        if q.question_id in self.seen:
            raise DataError(f"{where}: duplicate question_id {q.question_id!r} (first at {self.seen[q.question_id]})")
        self.seen[q.question_id] = where
        self.rows.append({**q.to_row(), "source_file": str(file), "source_row": int(row), **extra})

    def frame(self, source: str | Path) -> pd.DataFrame:
        if not self.rows:
            why = (f"; all {len(self.skipped)} rows read were bad, e.g. {self.skipped[0]['reason']}"
                   if self.skipped else "")
            raise DataError(f"{source}: no questions loaded{why}")
        df = pd.DataFrame(self.rows)
        df = df[QUESTION_COLUMNS + [c for c in df.columns if c not in QUESTION_COLUMNS]].reset_index(drop=True)
        df.attrs["skipped_rows"] = list(self.skipped)
        return df


def skipped_rows(df: pd.DataFrame) -> list[dict]:
    """The bad rows a ``skip_bad_rows`` load left out: ``[{"file", "row", "reason"}, ...]``."""
    return list(df.attrs.get("skipped_rows", []))


def run_info(questions: pd.DataFrame, skipped: list[dict] | tuple = ()) -> dict:
    """What a run records in its store's config.json without it changing any row
    (:class:`~mmfragile.store.ResultStore` ``run_info``): the number of questions and the bad rows left
    out - by the load (``skip_bad_rows``) and by the item building (``skipped``)."""
    return {"n_questions": int(len(questions)), "skipped_rows": skipped_rows(questions) + [dict(r) for r in skipped]}


def _where(file: str | Path, row: int, qid: Any = None) -> str:
    return f"{file}, row {row}" + (f" (index={qid})" if qid is not None else "")


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v) or (isinstance(v, str) and not v.strip())


def _text(v: Any) -> str:
    return "" if _blank(v) else str(v)


# ============================================================================================== reading tables
def _table_rows(path: Path, columns: list[str] | None = None, chunksize: int = 64) -> Iterator[tuple[Path, int, dict]]:
    """``(file, row, record)`` of a TSV (strings; empty cells ""), JSON / JSONL list, parquet file or folder
    of parquet shards (``row`` counts within each file), read in chunks so that a multi-GB base64 TSV is
    never held in memory at once."""
    if path.is_dir():
        files = sorted(path.glob("*.parquet"))
        if not files:
            raise DataError(f"{path}: no parquet files in the folder")
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"{path}: file not found")
    for f in files:
        suffix = f.suffix.lower()
        row = 0
        if suffix in (".tsv", ".csv"):
            try:
                reader = pd.read_csv(f, sep="\t" if suffix == ".tsv" else ",", dtype=str, keep_default_na=False,
                                     chunksize=chunksize, usecols=columns)
                for chunk in reader:
                    for rec in chunk.to_dict("records"):
                        yield f, row, rec
                        row += 1
            except (pd.errors.ParserError, ValueError, UnicodeDecodeError) as e:
                raise DataError(f"{f}: not a readable {suffix[1:].upper()} file near data row {row}: {e}") from e
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=chunksize, columns=columns):
                    for rec in batch.to_pylist():
                        yield f, row, rec
                        row += 1
            except (OSError, ValueError) as e:
                raise DataError(f"{f}: not a readable parquet file near row {row}: {e}") from e
        elif suffix in (".json", ".jsonl"):
            for i, rec in _json_records(f):
                yield f, i, rec
        else:
            raise DataError(f"{f}: unsupported file type {suffix!r} (tsv, parquet, json, jsonl)")


def _json_records(f: Path) -> list[tuple[int, dict]]:
    try:
        if f.suffix.lower() == ".jsonl":
            out = []
            for i, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
                if line.strip():
                    try:
                        out.append((i, json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise DataError(f"{f}, row {i}: invalid JSON: {e}") from e
            return out
        data = json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{f}: invalid JSON: {e}") from e
    if not isinstance(data, list):
        raise DataError(f"{f}: expected a JSON list of records, got {type(data).__name__}")
    return list(enumerate(data))


def _letter_options(rec: dict, letters: list[str], where: str) -> list[str]:
    """Options from the letter columns (VLMEvalKit TSVs): empty trailing cells are absent options; an
    empty cell followed by a filled one is an error (the letters would no longer index the options)."""
    vals = [_text(rec.get(c)).strip() for c in letters]
    n = len(vals)
    while n and not vals[n - 1]:
        n -= 1
    if not all(vals[:n]):
        gap = letters[vals[:n].index("")]
        raise DataError(f"{where}: option {gap} is empty but a later option is not")
    return [_text(rec.get(c)) for c in letters[:n]]


def _letter_columns(columns) -> list[str]:
    cols = []
    for letter in LETTERS:
        if letter not in columns:
            break
        cols.append(letter)
    return cols


def _answer_letter(ans: Any, options: list[str], where: str) -> int:
    a = _text(ans).strip()
    if len(a) != 1 or a not in LETTERS[: len(options)]:
        raise DataError(f"{where}: answer {a!r} is not among the option letters {list(LETTERS[:len(options)])}")
    return LETTERS.index(a)


def _columns(path: Path) -> list[str]:
    """Column names of a TSV / parquet file (or the first shard of a folder), without reading the data."""
    if path.is_dir():
        shards = sorted(path.glob("*.parquet"))
        if not shards:
            raise DataError(f"{path}: no parquet files in the folder")
        path = shards[0]
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    if path.suffix.lower() in (".json", ".jsonl"):
        recs = _json_records(path)
        return list(recs[0][1]) if recs else []
    return list(pd.read_csv(path, sep="\t", nrows=0).columns)


# ============================================================================================== A-OKVQA
def aokvqa_image_path(coco_dir: str | Path, split: str, image_id: int) -> Path:
    """``<coco>/<split>2017/<image_id:012d>.jpg`` (A-OKVQA's ``get_coco_path``); if ``coco_dir`` has no
    ``<split>2017`` folder it is taken to be that folder itself."""
    root = Path(coco_dir)
    sub = root / f"{split}2017"
    return (sub if sub.is_dir() else root) / f"{int(image_id):012d}.jpg"


def load_aokvqa(annotation_file: str | Path, coco_dir: str | Path | None = None, n: int | None = None,
                skip_bad_rows: bool = False) -> pd.DataFrame:
    f = Path(annotation_file)
    if not f.is_file():
        raise DataError(f"A-OKVQA annotation file not found: {f}")
    m = re.search(r"aokvqa_v\d+p\d+_([a-z]+)", f.name)  # val, train, test (test_w_ans: COCO's test2017)
    split = m.group(1) if m else "val"
    coco = Path(coco_dir) if coco_dir else f.parent
    col = _Collector(skip_bad_rows, n)
    for i, r in _json_records(f):
        if col.full:
            break
        where = f"{f}, row {i}"
        with col.row(f, i):
            if not isinstance(r, dict):
                raise DataError(f"{where}: a record must be a JSON object")
            try:
                choices, idx = list(r["choices"]), r.get("correct_choice_idx")
                qid, question, image_id = r["question_id"], r["question"], r["image_id"]
            except KeyError as e:
                raise DataError(f"{where}: missing field {e}") from e
            if idx is None:
                raise DataError(f"{where}: no correct_choice_idx (the test split has no answers)")
            if not 0 <= int(idx) < len(choices):
                raise DataError(f"{where}: correct_choice_idx {idx} is not among the {len(choices)} choices")
            img = aokvqa_image_path(coco, split, image_id)
            col.add(MCQuestion("a-okvqa", str(qid), question, choices, int(idx), [str(img)], "", "image"), f, i, where)
    return col.frame(f)


# ============================================================================================== VLMEvalKit TSVs
#: VLMEvalKit's circular copies: row ``index = k * 1e6 + i`` (k >= 1) is main row ``i`` with its options rotated.
CIRCULAR_OFFSET = 1_000_000


@dataclass
class _Unused:
    """Rows a VLMEvalKit table load reads but does not return (HR-Bench cycles 2-4, MMBench circular copies):
    checked all the same - options, answer, a decode-check of the image (bytes discarded), a unique index -
    and, for circular copies, against their main row."""

    base: Path
    dataset: str
    own_images: set[str] = field(default_factory=set)     # indices whose image cell holds an image (not a reference)
    checked: set[str] = field(default_factory=set)        # sha256[:24] of image bytes checked in this load
    refs: list[tuple[int, str, str]] = field(default_factory=list)  # (row, where, index named) to resolve
    seen: dict[str, str] = field(default_factory=dict)    # index -> where, unused rows
    mains: dict[str, dict] = field(default_factory=dict)  # main index -> its text cells, for the copy check
    copies: list[tuple[int, str, str, dict]] = field(default_factory=list)  # (row, index, where, cells)

    def note_image(self, idx: str, value: Any, paths: list[str] | None = None) -> None:
        if not _blank(value) and not _is_reference(value):
            self.own_images.add(idx)
        if paths:  # an embedded image's cache file is named by its sha256[:24] (mmfragile.data.images)
            folder = cache_dir("images", self.dataset)
            self.checked.update(Path(p).stem for p in paths if Path(p).parent == folder)

    def check_image(self, i: int, value: Any, where: str) -> None:
        """Decode-check one image cell without keeping it: one image in memory at a time; bytes equal to an
        image already checked in this load (HR-Bench's four cycles share theirs) are not decoded again."""
        if _blank(value):
            return
        if _is_reference(value):
            ref = str(value).strip()
            if ref not in self.own_images:
                self.refs.append((i, where, ref))  # may name a later row: resolved after the pass
            return
        if isinstance(value, Mapping):
            value = value.get("bytes") if value.get("bytes") is not None else value.get("path")
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        elif isinstance(value, str) and not value.strip().startswith("[") and not looks_like_path(value.strip(),
                                                                                                   self.base):
            data = decode_base64(value, where)
        else:  # a path or a list of images: what a used row would get (paths are not decoded there either)
            image_field(value, self.base, where, self.dataset)
            return
        digest = hashlib.sha256(data).hexdigest()[:24]
        if digest not in self.checked:
            check_image_bytes(data, where)
            self.checked.add(digest)
        del data

    def unresolved(self, complete: bool, images: Mapping[str, str]) -> list[tuple[int, str, str]]:
        """References of unused rows that name no row with an image (all rows read: ``complete``; else only
        those whose target could still come later are given the benefit of the doubt)."""
        if not complete:
            return []
        return [(i, where, ref) for i, where, ref in self.refs if ref not in self.own_images and ref not in images]


def _is_reference(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value.strip()) <= REFERENCE_MAX_CHARS


def _copy_main(rec: dict) -> str | None:
    """The main row index of a circular copy (``index >= 1e6``), else None."""
    try:
        idx = int(float(_text(rec.get("index"))))
    except ValueError:
        return None
    return str(idx % CIRCULAR_OFFSET) if idx >= CIRCULAR_OFFSET else None


def _mcq_cells(rec: dict, letters: list[str]) -> dict:
    return {"question": _text(rec.get("question")).strip(), "hint": _text(rec.get("hint")).strip(),
            "options": [_text(rec.get(c)).strip() for c in letters], "answer": _text(rec.get("answer")).strip()}


def _check_circular_copy(copy: dict, main: dict | None, main_idx: str, letters: list[str], where: str) -> None:
    """A row ``index >= 1e6`` is dropped only when it is VLMEvalKit's circular copy of main row
    ``index % 1e6``: that row exists, the question and hint are the same, the options are a rotation of the
    main row's and the answer letter is rotated with them (the correct option text is the same)."""
    what = f"index >= 1e6 marks a circular copy of index {main_idx}"
    if main is None:
        raise DataError(f"{where}: {what}, but the file has no row with index {main_idx}; not dropped silently "
                        "(load with circular_copies=True to keep such rows as questions)")
    for key in ("question", "hint"):
        if copy[key] != main[key]:
            raise DataError(f"{where}: {what}, but its {key} {copy[key][:60]!r} is not that row's "
                            f"({main[key][:60]!r}): a different question, not a copy")
    n_copy, n_main = _n_options(copy["options"]), _n_options(main["options"])
    c_opts, m_opts = copy["options"][:n_copy], main["options"][:n_main]
    shifts = [s for s in range(n_main) if n_copy == n_main and c_opts == m_opts[s:] + m_opts[:s]]
    if not shifts:
        raise DataError(f"{where}: {what}, but its options {c_opts} are not a rotation of that row's {m_opts}")
    m_ans, c_ans = LETTERS.find(main["answer"]), LETTERS.find(copy["answer"])
    if len(main["answer"]) != 1 or not 0 <= m_ans < n_main:
        raise DataError(f"{where}: circular copy of index {main_idx}, whose answer {main['answer']!r} is not "
                        "among its options: the copy cannot be checked")
    if not any(c_ans == (m_ans - s) % n_main for s in shifts):
        want = sorted({LETTERS[(m_ans - s) % n_main] for s in shifts})
        raise DataError(f"{where}: {what}, but its answer {copy['answer']!r} does not follow the rotation of the "
                        f"options (expected {' or '.join(want)}: {m_opts[m_ans]!r})")


def _n_options(vals: list[str]) -> int:
    n = len(vals)
    while n and not vals[n - 1]:
        n -= 1
    return n


def _mcq_table(path: Path, dataset: str, n: int | None, skip_bad_rows: bool, *,
               keep: Callable[[dict], bool] | None = None, circular: bool = False, hint: bool = False,
               category_col: str = "category", extra_cols: tuple[str, ...] = ()) -> pd.DataFrame:
    """A VLMEvalKit-style MCQ table: ``index, question, [hint,] A, B, ..., answer, image, category``.

    Every row read is checked, returned or not: rows that ``keep`` leaves out get the checks a returned row
    gets (options, answer, image decode-checked then discarded, unique index); with ``circular``, rows with
    ``index >= 1e6`` are VLMEvalKit's circular copies, checked against their main row
    (:func:`_check_circular_copy`) and left out - a bad one is a bad row like any other. (``n`` stops
    reading at the ``n``-th good question; rows after it are not read, hence not checked.)"""
    cols = _columns(path)
    letters = _letter_columns(cols)
    missing = [c for c in ("index", "question", "answer", "image") if c not in cols]
    if missing or len(letters) < 2:
        raise DataError(f"{path}: expected the columns index, question, A, B, ..., answer, image; "
                        f"missing {missing or 'option columns'}; got {cols}")
    col = _Collector(skip_bad_rows, n)
    unused = _Unused(path.parent, dataset)
    images: dict[str, str] = {}  # index -> image path, for rows that name another row's image
    pending: list[tuple[int, dict]] = []
    complete = True  # every row of the file read
    for _, i, rec in _table_rows(path):
        if col.full:
            complete = False
            break
        idx = _text(rec.get("index")).strip() or str(i)
        where = _where(path, i, idx)
        img = rec.get("image")
        unused.note_image(idx, img)
        main_idx = _copy_main(rec) if circular else None
        if circular and main_idx is None:
            unused.mains.setdefault(idx, _mcq_cells(rec, letters))
        if main_idx is not None or (keep is not None and not keep(rec)):
            with col.row(path, i):
                _check_unused(rec, letters, idx, where, i, unused, col)
                if main_idx is not None:
                    unused.copies.append((i, main_idx, where, _mcq_cells(rec, letters)))
            continue  # not stored; a kept row naming its image finds it in the second pass below
        if isinstance(img, str) and 0 < len(img.strip()) <= 64 and img.strip() not in images:
            pending.append((i, rec))  # names a row not seen (or not kept) so far: resolved after the pass
            continue
        with col.row(path, i):
            _not_seen_unused(idx, where, unused)
            paths = image_field(img, path.parent, where, dataset, images)
            if paths:
                images[idx] = paths[0]
                unused.note_image(idx, img, paths)
            _add_mcq(col, rec, letters, paths, path, i, where, dataset, hint, category_col, extra_cols)
    bad_refs = unused.unresolved(complete, images)
    if pending and not col.full:
        wanted = {_text(r.get("image")).strip() for _, r in pending}
        for _, i, rec in _table_rows(path, columns=["index", "image"]):
            idx = _text(rec.get("index")).strip()
            if idx in wanted and idx not in images and len(_text(rec.get("image"))) > 64:
                with contextlib.suppress(DataError):  # a bad target row fails the rows that name it below
                    images[idx] = image_field(rec.get("image"), path.parent, _where(path, i, idx), dataset)[0]
        for i, rec in pending:
            if col.full:
                break
            idx = _text(rec.get("index")).strip()
            where = _where(path, i, idx)
            with col.row(path, i):
                _not_seen_unused(idx, where, unused)
                paths = image_field(rec.get("image"), path.parent, where, dataset, images)
                _add_mcq(col, rec, letters, paths, path, i, where, dataset, hint, category_col, extra_cols)
    for i, where, ref in bad_refs:
        with col.row(path, i):
            raise DataError(f"{where}: image field {ref!r} names no row with an image (VLMEvalKit rows reuse "
                            "another row's image by naming its index)")
    failed = {r["row"] for r in col.skipped}
    for i, main_idx, where, cells in unused.copies:
        if i in failed or (not complete and main_idx not in unused.mains):
            continue  # already a bad row / reading stopped (n) before its main row could be seen
        with col.row(path, i):
            _check_circular_copy(cells, unused.mains.get(main_idx), main_idx, letters, where)
    col.rows.sort(key=lambda r: r["source_row"])
    col.skipped.sort(key=lambda r: r["row"])
    return col.frame(path)


def _not_seen_unused(idx: str, where: str, unused: _Unused) -> None:
    if idx in unused.seen:
        raise DataError(f"{where}: duplicate index {idx!r} (first at {unused.seen[idx]})")


def _check_unused(rec: dict, letters: list[str], idx: str, where: str, i: int, unused: _Unused,
                  col: _Collector) -> None:
    """The checks of a returned row (:func:`_add_mcq`, :func:`~mmfragile.schema.check_question`) for a row that is
    read but not returned; its image is decode-checked and discarded."""
    opts = _letter_options(rec, letters, where)
    ans = _answer_letter(rec.get("answer"), opts, where)
    check_question(MCQuestion("", idx, _text(rec.get("question")), opts, ans), where, check_images=False)
    first = unused.seen.get(idx) or col.seen.get(idx)
    if first is not None:
        raise DataError(f"{where}: duplicate index {idx!r} (first at {first})")
    unused.seen[idx] = where
    unused.check_image(i, rec.get("image"), where)


def _add_mcq(col: _Collector, rec: dict, letters: list[str], paths: list[str], path: Path, i: int, where: str,
             dataset: str, hint: bool, category_col: str, extra_cols: tuple[str, ...]) -> None:
    opts = _letter_options(rec, letters, where)
    ans = _answer_letter(rec.get("answer"), opts, where)
    q = _text(rec.get("question"))
    if hint and _text(rec.get("hint")).strip():
        q = f"{rec['hint']}\n{q}"
    qid = _text(rec.get("index")).strip() or str(i)
    extra = {c.replace("-", "_"): _text(rec.get(c)) for c in extra_cols}
    col.add(MCQuestion(dataset, qid, q, opts, ans, paths, _text(rec.get(category_col)), "image"), path, i, where,
            **extra)


def load_mmbench(tsv_file: str | Path, n: int | None = None, use_hint: bool = True, circular_copies: bool = False,
                 skip_bad_rows: bool = False) -> pd.DataFrame:
    """MMBench TSV (see the module docstring); ``use_hint`` puts the hint on the line before the question.
    Without ``circular_copies`` a row ``index >= 1e6`` is left out only if it is the circular copy of row
    ``index % 1e6`` (:func:`_check_circular_copy`); anything else raises :class:`DataError` naming file and row."""
    f = Path(tsv_file)
    if not f.is_file():
        raise DataError(f"MMBench TSV not found: {f}")
    return _mcq_table(f, "mmbench", n, skip_bad_rows, circular=not circular_copies, hint=use_hint,
                      extra_cols=("l2-category",) if "l2-category" in _columns(f) else ())


def load_hrbench(path: str | Path, n: int | None = None, cycles: str = "first", name: str | None = None,
                 skip_bad_rows: bool = False) -> pd.DataFrame:
    """HR-Bench 4K / 8K (``hr_bench_{4k,8k}.tsv`` or ``.parquet``); ``cycles`` "first" (200 questions) or
    "all" (800 rows) - with "first" the rows of cycles 2-4 are still checked (a bad one raises or, with
    ``skip_bad_rows``, is listed). ``name`` defaults from the file name (``hrbench-4k`` / ``hrbench-8k``)."""
    f = Path(path)
    if cycles not in ("first", "all"):
        raise ValueError(f"cycles must be 'first' or 'all', got {cycles!r}")
    if name is None:
        m = re.search(r"([48])k", f.name.lower())
        name = f"hrbench-{m.group(1)}k" if m else "hrbench"
    if not f.exists():
        raise DataError(f"HR-Bench file not found: {f}")
    keep = None
    if cycles == "first":
        first: list[str] = []

        def keep(rec: dict) -> bool:  # the first cycle_category value seen in file order
            c = _text(rec.get("cycle_category"))
            if not first:
                first.append(c)
            return c == first[0]
    return _mcq_table(f, name, n, skip_bad_rows, keep=keep, extra_cols=("cycle_category",))


_INLINE_OPTS = re.compile(r"\n?Options?:\s*(.*)$", re.S)
_INLINE_SPLIT = re.compile(r"(?:^|,\s*|\n)([A-Z])\s*[:.]\s*")


def parse_inline_options(text: str, where: str) -> tuple[str, list[str]]:
    """Split "Question?\\nOptions: A: x, B: y" into ("Question?", ["x", "y"]) (MMStar's parquet layout)."""
    m = _INLINE_OPTS.search(text)
    if not m:
        raise DataError(f"{where}: no 'Options:' block in the question text {text[:80]!r}")
    body = m.group(1)
    parts = _INLINE_SPLIT.split(body)
    letters, opts = parts[1::2], [p.strip().rstrip(",").strip() for p in parts[2::2]]
    if letters != list(LETTERS[: len(letters)]) or len(opts) < 2:
        raise DataError(f"{where}: cannot parse the options block {body[:80]!r}")
    return text[: m.start()].strip(), opts


def load_mmstar(path: str | Path, n: int | None = None, skip_bad_rows: bool = False) -> pd.DataFrame:
    f = Path(path)
    if not f.exists():
        raise DataError(f"MMStar file not found: {f}")
    if _letter_columns(_columns(f)):  # VLMEvalKit's MMStar.tsv: options in A..D columns
        return _mcq_table(f, "mmstar", n, skip_bad_rows)
    col = _Collector(skip_bad_rows, n)
    for _, i, r in _table_rows(f):
        if col.full:
            break
        where = _where(f, i, r.get("index"))
        with col.row(f, i):
            q, opts = parse_inline_options(_text(r.get("question")), where)
            ans = _answer_letter(r.get("answer"), opts, where)
            imgs = image_field(r.get("image"), f.parent, where, "mmstar")
            col.add(MCQuestion("mmstar", str(r.get("index", i)), q, opts, ans, imgs, _text(r.get("category")),
                               "image"), f, i, where, l2_category=_text(r.get("l2_category")))
    return col.frame(f)


# ============================================================================================== V*Bench
VSTAR_TASKS = ("direct_attributes", "relative_position")


def load_vstar(folder: str | Path, n: int | None = None, skip_bad_rows: bool = False) -> pd.DataFrame:
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"V*Bench folder not found: {root}")
    missing = [t for t in VSTAR_TASKS if not (root / t).is_dir()]
    if missing:
        raise DataError(f"{root}: not a V*Bench folder; missing {missing} (expected {list(VSTAR_TASKS)})")
    col = _Collector(skip_bad_rows, n)
    for task in VSTAR_TASKS:
        for jf in sorted((root / task).glob("*.json")):
            if col.full:
                break
            where = str(jf)
            with col.row(jf, 0):
                try:
                    r = json.loads(jf.read_text(encoding="utf-8"))
                    opts, question = list(r["options"]), r["question"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise DataError(f"{where}: unreadable V*Bench record: {e}") from e
                imgs = [p for p in (jf.with_suffix(s) for s in (".jpg", ".jpeg", ".png")) if p.is_file()]
                img = jf.parent / r["image"] if r.get("image") else (imgs[0] if imgs else jf.with_suffix(".jpg"))
                # V*Bench lists the correct option first
                col.add(MCQuestion("vstar", f"{task}/{jf.stem}", question, opts, 0, [str(img)], task, "image"),
                        jf, 0, where)
    return col.frame(root)


# ============================================================================================== MME-RealWorld-Lite
_LETTER_PREFIX = re.compile(r"^\s*[(（]\s*([A-Z])\s*[)）]\s?")


def strip_letter_prefixes(options: list[str], where: str) -> list[str]:
    """``["(A) x", "(B) y"]`` -> ``["x", "y"]``; the letters must run A, B, C, ... (half- or full-width
    brackets, as MME-RealWorld writes them)."""
    out = []
    for k, o in enumerate(options):
        m = _LETTER_PREFIX.match(str(o))
        if not m or m.group(1) != LETTERS[k]:
            raise DataError(f"{where}: option {k + 1} {str(o)[:40]!r} does not start with ({LETTERS[k]})")
        out.append(str(o)[m.end():])
    return out


def _list_cell(v: Any, where: str, name: str) -> list:
    if isinstance(v, str):
        try:
            v = ast.literal_eval(v)
        except (ValueError, SyntaxError) as e:
            raise DataError(f"{where}: column {name!r} is not a list literal: {e}") from None
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise DataError(f"{where}: column {name!r} must be a list, got {type(v).__name__}")
    return [str(x) for x in v]


def load_mme_realworld_lite(path: str | Path, images_dir: str | Path | None = None, n: int | None = None,
                            skip_bad_rows: bool = False) -> pd.DataFrame:
    f = Path(path)
    if not f.exists():
        raise DataError(f"MME-RealWorld-Lite file not found: {f}")
    base = Path(images_dir) if images_dir else (f if f.is_dir() else f.parent)
    col = _Collector(skip_bad_rows, n)
    for fi, i, r in _table_rows(f):
        if col.full:
            break
        official = "Answer choices" in r
        qid = r.get("Question_id") if official else r.get("index")
        where = _where(fi, i, qid)
        with col.row(fi, i):
            if official:
                raw, ans, q = r.get("Answer choices"), r.get("Ground truth"), r.get("Text")
                img, l2 = r.get("Image"), _text(r.get("Category"))
                cat = "/".join(_text(r.get(k)) for k in ("Task", "Subtask"))
            else:
                missing = [k for k in ("index", "question", "multi-choice options", "answer") if k not in r]
                if missing:
                    raise DataError(f"{where}: missing column(s) {missing}")
                raw, ans, q = r.get("multi-choice options"), r.get("answer"), r.get("question")
                img = r.get("image") if not _blank(r.get("image")) else r.get("bytes")
                cat, l2 = _text(r.get("category")), _text(r.get("l2-category"))
            opts = strip_letter_prefixes(_list_cell(raw, where, "options"), where)
            a = _answer_letter(ans, opts, where)
            imgs = image_field(img, base, where, "mme-realworld-lite")
            col.add(MCQuestion("mme-realworld-lite", _text(qid) or str(i), _text(q), opts, a, imgs, cat, "image"),
                    fi, i, where, l2_category=l2)
    return col.frame(f)


# ============================================================================================== MMMU-Pro
MMMU_PRO_SETTINGS = {"s4": "standard (4 options)", "s10": "standard (10 options)", "vision": "vision"}
_IMAGE_MARK = re.compile(r"<image\s+(\d+)>")


def _mmmu_pro_source(path: Path, setting: str | None) -> tuple[Path, str]:
    if setting is not None and setting not in MMMU_PRO_SETTINGS:
        raise ValueError(f"MMMU-Pro setting must be one of {list(MMMU_PRO_SETTINGS)}, got {setting!r}")
    if path.is_dir() and not any(path.glob("*.parquet")):
        if setting is None:
            raise DataError(f"{path}: an MMMU-Pro snapshot folder; name the setting (mmmu-pro-s4, mmmu-pro-s10 "
                            "or mmmu-pro-vision)")
        sub = path / MMMU_PRO_SETTINGS[setting]
        if not sub.is_dir():
            raise DataError(f"{path}: no {MMMU_PRO_SETTINGS[setting]!r} folder (MMMU-Pro config {setting})")
        return sub, setting
    if not path.exists():
        raise DataError(f"MMMU-Pro file or folder not found: {path}")
    if setting is None:
        name = f"{(path if path.is_dir() else path.parent).name} {path.name}".lower()
        m = re.search(r"(?<!\d)(4|10)[\W_]*options?", name) or re.search(r"\bs(4|10)\b", name)
        setting = "vision" if "vision" in name else f"s{m.group(1)}" if m else None
        if setting is None:
            raise DataError(f"{path}: cannot tell the MMMU-Pro setting from the name; use mmmu-pro-s4, "
                            "mmmu-pro-s10 or mmmu-pro-vision")
    return path, setting


def mmmu_pro_images(rec: dict, where: str, base: Path, dataset: str, texts: list[str]) -> list[str]:
    """``image_1 .. image_n`` of a standard-setting row, in order (the module docstring gives the rule):
    no gaps, and every ``<image k>`` named in ``texts`` must exist."""
    cells = [rec.get(f"image_{k}") for k in range(1, 8)]
    present = [not _blank(c) and not (isinstance(c, dict) and not c.get("bytes") and not c.get("path")) for c in cells]
    n = max((k + 1 for k, p in enumerate(present) if p), default=0)
    if not all(present[:n]):
        raise DataError(f"{where}: image_{present.index(False) + 1} is empty but image_{n} is not; <image k> "
                        "must stay images[k-1]")
    named = sorted({int(k) for t in texts for k in _IMAGE_MARK.findall(t)})
    bad = [k for k in named if not 1 <= k <= n]
    if bad:
        raise DataError(f"{where}: the text names <image {bad[0]}> but the row has {n} image(s)")
    out = []
    for k in range(n):
        got = image_field(cells[k], base, f"{where}, image_{k + 1}", dataset)
        if len(got) != 1:
            raise DataError(f"{where}: image_{k + 1} holds {len(got)} images")
        out += got
    return out


def load_mmmu_pro(path: str | Path, setting: str | None = None, images_dir: str | Path | None = None,
                  n: int | None = None, skip_bad_rows: bool = False) -> pd.DataFrame:
    """MMMU-Pro in the setting ``s4``, ``s10`` or ``vision`` (see the module docstring)."""
    src, setting = _mmmu_pro_source(Path(path), setting)
    dataset = f"mmmu-pro-{setting}"
    base = Path(images_dir) if images_dir else (src if src.is_dir() else src.parent)
    col = _Collector(skip_bad_rows, n)
    for fi, i, r in _table_rows(src):
        if col.full:
            break
        where = _where(fi, i, r.get("id"))
        with col.row(fi, i):
            if "options" not in r:
                raise DataError(f"{where}: no 'options' column (the answer letters need the option list)")
            opts = _list_cell(r.get("options"), where, "options")
            ans = _answer_letter(r.get("answer"), opts, where)
            qid, subject = _text(r.get("id")) or str(i), _text(r.get("subject"))
            if setting == "vision":
                imgs = image_field(r.get("image"), base, where, "mmmu-pro")
                if len(imgs) != 1:
                    raise DataError(f"{where}: the vision setting needs one image, got {len(imgs)}")
                col.add(MCQuestion(dataset, qid, "", opts, ans, imgs, subject, "image"), fi, i, where,
                        options_in_image=True)
                continue
            q = _text(r.get("question"))
            imgs = mmmu_pro_images(r, where, base, "mmmu-pro", [q, *opts])
            col.add(MCQuestion(dataset, qid, q, opts, ans, imgs, subject, "multi-image" if len(imgs) > 1 else "image"),
                    fi, i, where, options_in_image=False, img_type=_text(r.get("img_type")),
                    topic_difficulty=_text(r.get("topic_difficulty")))
    return col.frame(src)


# ============================================================================================== MVBench
#: MVBench's ``data_list``: task json -> (video prefix under video/, data type, start/end bound the clip).
MVBENCH_TASKS: dict[str, tuple[str, str, bool]] = {
    "action_sequence": ("star/Charades_v1_480", "video", True),
    "action_prediction": ("star/Charades_v1_480", "video", True),
    "action_antonym": ("ssv2_video", "video", False),
    "fine_grained_action": ("Moments_in_Time_Raw/videos", "video", False),
    "unexpected_action": ("FunQA_test/test", "video", False),
    "object_existence": ("clevrer/video_validation", "video", False),
    "object_interaction": ("star/Charades_v1_480", "video", True),
    "object_shuffle": ("perception/videos", "video", False),
    "moving_direction": ("clevrer/video_validation", "video", False),
    "action_localization": ("sta/sta_video", "video", True),
    "scene_transition": ("scene_qa/video", "video", False),
    "action_count": ("perception/videos", "video", False),
    "moving_count": ("clevrer/video_validation", "video", False),
    "moving_attribute": ("clevrer/video_validation", "video", False),
    "state_change": ("perception/videos", "video", False),
    "fine_grained_pose": ("nturgbd", "video", False),
    "character_order": ("perception/videos", "video", False),
    "egocentric_navigation": ("vlnqa", "video", False),
    "episodic_reasoning": ("tvqa/frames_fps3_hq", "frame", True),
    "counterfactual_inference": ("clevrer/video_validation", "video", False),
}
#: Frame rate of MVBench's frame folders (``read_frame(..., fps=3)``; the folder is ``frames_fps3_hq``).
MVBENCH_FRAME_FPS = 3.0


def _mvbench_video(root: Path, prefix: str, video: str) -> Path | None:
    for p in (root / "video" / prefix / video, root / "video" / "data0613" / prefix / video):
        if p.exists():
            return p
    return None


def load_mvbench(root: str | Path, tasks: list[str] | None = None, n: int | None = None,
                 skip_bad_rows: bool = False) -> pd.DataFrame:
    """MVBench (see the module docstring); ``tasks`` restricts to some of the 20 (default: all, and all
    20 task files must be present). Extra columns: ``video_type`` (video / frame / gif), ``video_start``,
    ``video_end`` (seconds, NaN without a bound) and ``video_fps`` (3 for frame folders, else NaN)."""
    root = Path(root)
    jdir = root / "json"
    if not jdir.is_dir():
        raise DataError(f"{root}: not an MVBench folder (no json/ folder with the task files)")
    names = list(tasks) if tasks else list(MVBENCH_TASKS)
    unknown = [t for t in names if t not in MVBENCH_TASKS]
    if unknown:
        raise DataError(f"unknown MVBench task(s) {unknown}; the 20 tasks are {list(MVBENCH_TASKS)}")
    absent = [t for t in names if not (jdir / f"{t}.json").is_file()]
    if absent:
        raise DataError(f"{jdir}: missing task file(s) {[f'{t}.json' for t in absent]}")
    col = _Collector(skip_bad_rows, n)
    for task in names:
        prefix, dtype, bounded = MVBENCH_TASKS[task]
        jf = jdir / f"{task}.json"
        for i, r in _json_records(jf):
            if col.full:
                break
            where = f"{jf}, row {i}"
            with col.row(jf, i):
                try:
                    video, question, cands, answer = r["video"], r["question"], list(r["candidates"]), r["answer"]
                except (KeyError, TypeError) as e:
                    raise DataError(f"{where}: missing field {e}") from e
                ans = answer_index(cands, answer, where)
                src = _mvbench_video(root, prefix, str(video))
                if src is None:
                    raise DataError(f"{where}: video not found: {root / 'video' / prefix / video} (nor under "
                                    "video/data0613/)")
                if dtype == "frame" and not src.is_dir():
                    raise DataError(f"{where}: {src} should be a folder of frames (task {task})")
                kind = "gif" if src.suffix.lower() == ".gif" else dtype
                start = end = float("nan")
                if bounded and "start" in r and "end" in r:
                    start, end = float(r["start"]), float(r["end"])
                    if not end > start:
                        raise DataError(f"{where}: end {end} is not after start {start}")
                col.add(MCQuestion("mvbench", f"{task}/{i}", str(question), [str(c) for c in cands], ans,
                                   [str(src)], task, "video"), jf, i, where, video_type=kind, video_start=start,
                        video_end=end, video_fps=MVBENCH_FRAME_FPS if kind == "frame" else float("nan"))
        if col.full:
            break
    return col.frame(root)


# ============================================================================================== generic
def load_generic(path: str | Path, dataset: str | None = None, n: int | None = None,
                 skip_bad_rows: bool = False) -> pd.DataFrame:
    """Parquet (also a HF ``datasets`` folder of parquet shards), JSONL or JSON records."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.rglob("*.parquet"))
        if not files:
            raise DataError(f"{p}: no parquet files in folder")
        records = (rec for f in files for rec in _table_rows(f))
    elif not p.exists():
        raise DataError(f"dataset file not found: {p}")
    elif p.suffix in (".parquet", ".jsonl", ".json"):
        records = _table_rows(p)
    else:
        raise DataError(f"{p}: unsupported dataset file type {p.suffix!r} (parquet, jsonl, json)")
    name = dataset or p.stem
    base = p if p.is_dir() else p.parent
    col = _Collector(skip_bad_rows, n)
    for f, i, r in records:
        if col.full:
            break
        where = f"{f}, row {i}"
        with col.row(f, i):
            for c in ("question", "options", "answer"):
                if c not in r:
                    raise DataError(f"{where}: missing field {c!r}")
            opts = [str(o) for o in list(r["options"])]
            a = r["answer"]
            if isinstance(a, str) and not a.isdigit():
                ans = LETTERS.index(a) if (len(a) == 1 and a in LETTERS[: len(opts)]) else answer_index(opts, a, where)
            else:
                ans = int(a)
                if not 0 <= ans < len(opts):
                    raise DataError(f"{where}: answer index {ans} is not among the {len(opts)} options {opts}")
            imgs = image_field(r.get("images", r.get("image")), base, where, name)
            modality = r.get("modality") or ("text" if not imgs else "image" if len(imgs) == 1 else "multi-image")
            col.add(MCQuestion(name, str(r.get("question_id", r.get("id", i))), str(r["question"]), opts, ans, imgs,
                               str(r.get("category", "") or ""), modality), f, i, where)
    return col.frame(p)


# ============================================================================================== one entry point
def synthetic_vqa(n: int | None = None, seed: int = 0) -> pd.DataFrame:
    """The synthetic multiple-choice set (image, multi-image, video, text questions)."""
    from mmfragile.data.synthetic import make_synthetic_vqa

    return make_synthetic_vqa(seed)


def synthetic_image(n: int | None = None, seed: int = 0) -> pd.DataFrame:
    """The image questions of the synthetic set: the first n of the four kinds in turn (count, colour, shape,
    position, count, ...)."""
    from mmfragile.data.synthetic import make_synthetic_vqa

    per_kind = max(10, -(-(n or 0) // 4))
    df = make_synthetic_vqa(seed, n_per_kind=per_kind).query("modality == 'image'")
    df = df.assign(_i=df.groupby("category").cumcount()).sort_values("_i", kind="stable")
    return df.drop(columns="_i").reset_index(drop=True)


def synthetic_text(n: int | None = None, seed: int = 0) -> pd.DataFrame:
    from mmfragile.data.synthetic import make_synthetic_vqa

    return make_synthetic_vqa(seed).query("modality == 'text'").reset_index(drop=True)


def load_dataset(spec: str, n: int | None = None, seed: int = 0, skip_bad_rows: bool = False) -> pd.DataFrame:
    """One entry point, by name: the built-in sets (``synthetic-vqa``, ``synthetic-image`` / ``synthetic-text``
    - its image / text-only subsets -, ``easy-vqa``), or ``<prefix>:<path>`` for a benchmark release. Every one
    is a record of the benchmark registry (:mod:`mmfragile.data.benchmarks`; ``python -m mmfragile benchmarks``
    lists them; layouts in this module's docstring). ``skip_bad_rows``: leave bad rows out (listed in
    ``df.attrs["skipped_rows"]``) instead of raising :class:`DataError`; ``df.attrs["spec"]`` is ``spec``."""
    from mmfragile.data.benchmarks import benchmark, by_prefix, spec_prefixes

    prefix, sep, path = str(spec).partition(":")
    try:
        record = by_prefix(prefix) if sep else benchmark(spec)
    except KeyError:
        record = None
    if sep and (record is None or record.builtin):
        raise DataError(f"unknown dataset prefix {prefix!r}; use one of {', '.join(spec_prefixes())}")
    if record is None or record.builtin == bool(sep):
        raise DataError(f"unknown dataset {spec!r}: use synthetic-vqa, synthetic-image, synthetic-text, easy-vqa "
                        f"or <prefix>:<path> with prefix in {', '.join(spec_prefixes())}")
    if record.study:
        raise DataError(f"{spec!r} is the {record.study} study's data, not a question table: run that study with it "
                        f"(python -m mmfragile run {record.study} --dataset {spec})")
    if not record.builtin:
        out = record.load(path, n=n, skip_bad_rows=skip_bad_rows)
    else:
        out = record.load(n=n, seed=seed)
        if record.prefix != "easy-vqa":  # easy-VQA's loader takes n itself (200 unless given) and is kept as loaded
            out = out.head(n).reset_index(drop=True) if n else out
            out.attrs["skipped_rows"] = []
    out.attrs["spec"] = str(spec)  # the name run_study stores a table under (mmfragile.study.table_name)
    return out
