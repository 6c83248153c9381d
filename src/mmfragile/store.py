"""Resumable per-question result store (Parquet), safe for concurrent writers and kills at any point.

A store is a folder::

    <root>/config.json                     the run's configuration (checked on resume); its ``run_info`` entry
                                           (e.g. the bad input rows a run left out) is rewritten, not checked,
                                           but for ``model_identity``: one model per name (:meth:`pin_model`)
    <root>/parts/part-<ns>-<id>-n<rows>.parquet   one file per flushed batch of rows
    <root>/manifest/<label>.<digest>.parquet      the keys a run (or shard ``label``) set out to evaluate
    <root>/quarantine/                     parts that failed to read, with the reason beside each

Rows are keyed by ``key_columns`` (by default model, dataset, question_id, variant). A run asks the store which
keys are done, evaluates only the rest and appends them in batches.

Why no row is lost or duplicated:

* a part is written to a temporary file, fsynced, renamed to a name no other writer can pick (time + random
  id) and the folder is fsynced: a killed writer leaves at most a temporary file, never a half part;
* any number of processes (shards, a Ray driver, a rerun) may append at once; if two of them evaluated the same
  key, :meth:`ResultStore.read` keeps one row per key (the first part in name order);
* a part that cannot be parsed (truncated, bad page checksum, not Parquet) is moved to ``quarantine/`` with a
  :class:`CorruptPartWarning` naming it; its rows count as not done, so the next run evaluates them again. A part
  whose bytes cannot be *read* (an ``OSError`` from the operating system: EIO, EAGAIN, a flaky network mount) is
  not known to be corrupt: the read is retried (``READ_RETRY_DELAYS``) and then :class:`PartReadError` names the
  file - a good part is never quarantined for a transient read error;
* a full disk (ENOSPC / EDQUOT) while a part, manifest or config is written raises :class:`StoreDiskFull` naming
  the store folder; the temporary file is removed, so the store stays readable and holds no half part, and the
  batch's rows count as not done: rerunning once space is free stores each row exactly once. A compaction that
  runs out of space inside :meth:`ResultStore.append` (whose rows are stored by then) only warns;
* :meth:`ResultStore.compact` merges small parts into one and deletes them only after the merged part is durable
  (a kill in between leaves duplicates, which reads drop and the next compaction removes); readers that lose a
  part to a concurrent compaction list the folder again.

Manifests make a run checkable: :meth:`ResultStore.declare` records the keys a run or shard is responsible for and
:meth:`ResultStore.check` compares them with the stored rows (missing keys, unexpected keys, duplicates, shards
that never started).
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import socket
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping, Sequence, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from mmfragile.faults import fail_point, kill_point
from mmfragile.redaction import redact_obj

DEFAULT_KEY = ("model", "dataset", "question_id", "variant")
#: Small parts are merged once ``COMPACT_FANOUT`` of them of similar size (same power of the fan-out) pile up.
COMPACT_FANOUT = 16
#: Parts of at least this many rows are never merged further.
TARGET_PART_ROWS = 1_000_000
_PART_RE = re.compile(r"^part-(\d+)-([0-9a-f]+)(?:-n(\d+))?\.parquet$")
_SHARD_RE = re.compile(r"^shard-(\d+)-of-(\d+)$")
#: Seconds to wait before each retry of a part whose read failed with an OSError (then PartReadError).
READ_RETRY_DELAYS = (0.05, 0.2, 1.0)
_sleep = time.sleep  # replaceable in tests: the backoff between read retries
#: errno values that mean "no space left" (a full disk, a full quota).
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class ConfigMismatch(ValueError):
    """A store is being resumed with a configuration different from the one it was created with."""


class CorruptPartWarning(UserWarning):
    """A part could not be parsed (corrupt, truncated, not Parquet) and was moved to the quarantine folder."""


class PartReadError(OSError):
    """A part could not be read from disk (an OSError such as EIO, not a parse error) even after retries. The
    part is left in place: it is not known to be corrupt. ``filename`` is the part's path."""


class StoreDiskFull(OSError):
    """The disk (or quota) of a store filled up while it wrote; nothing half-written is visible and the rows not
    written count as not done. ``filename`` is the store folder."""


class _Vanished(Exception):
    """A listed part disappeared (a concurrent compaction replaced it): list the folder again."""


class _ReadFailed(Exception):
    """The operating system failed to read a part (``error``): retry, do not quarantine."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def _canonical(obj: Any) -> Any:
    """``obj`` as config.json holds it: JSON values, every secret masked (:mod:`mmfragile.redaction`)."""
    return redact_obj(json.loads(json.dumps(obj, sort_keys=True, default=str)))


RUN_INFO = "run_info"
#: ``run_info`` entry: model name -> the identity of the model whose rows the store holds under it
MODEL_IDENTITY = "model_identity"


#: The tags of stores written before :func:`mmfragile.study.run_study` wrote ``{"study", "stage"}`` into every
#: config: old ``study`` value -> (study, stage). Judge stores named their stage in ``kind`` (stage None here).
LEGACY_TAGS: dict[str, tuple[str, str | None]] = {
    "format-bias": ("format-bias", "grid"), "format-bias-cp-ln": ("format-bias", "cp_ln"),
    "promptception": ("promptception", "prompts"), "promptception-extraction": ("promptception", "extraction"),
    "judgebias": ("judge", None)}


class UntaggedStore(ValueError):
    """A store whose config.json names no study."""


def store_tag(config: Mapping[str, Any], where: Any = "store") -> tuple[str, str]:
    """(study, stage) of a store's config - ``{"study", "stage"}``, or an old tag through :data:`LEGACY_TAGS`
    (a study outside that table without a stage: stage ``""``). A config without ``study`` raises, naming
    ``where``: which study its rows belong to is not guessed."""
    if not config.get("study"):
        raise UntaggedStore(f"{where}: its config.json names no study (\"study\": ...); a store is read only as "
                            "the study that wrote it - rerun it with `mmfragile run`, or add the study's name")
    study, stage = str(config["study"]), config.get("stage")
    if stage is not None:
        return study, str(stage)
    study, stage = LEGACY_TAGS.get(study, (study, ""))
    return study, str(config.get("kind", "scores")) if stage is None else stage


def tagged_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with its tag in today's form (``study``, ``stage``; an old judge store's ``kind`` dropped):
    what the resume check compares, so a store written under an old tag resumes."""
    if not config.get("study") or "stage" in config:
        return dict(config)
    study, stage = store_tag(config)
    legacy_kind = LEGACY_TAGS.get(str(config["study"]), ("", ""))[1] is None
    return {**{k: v for k, v in config.items() if not (legacy_kind and k == "kind")}, "study": study, "stage": stage}


def _config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """key -> (old value, new value) for the configuration keys that differ (``run_info`` is no configuration;
    tags compare in today's form, :func:`tagged_config`)."""
    old, new = tagged_config(old), tagged_config(new)
    keys = (set(old) | set(new)) - {RUN_INFO}
    return {k: (old.get(k), new.get(k)) for k in sorted(keys) if old.get(k) != new.get(k)}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durable(table: pa.Table, dest: Path) -> None:
    """Write ``table`` to ``dest`` so that ``dest`` either does not exist or is complete: temporary file in the
    same folder, fsync, rename, fsync of the folder."""
    tmp = dest.with_name(f".{dest.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, write_page_checksum=True)
    data = sink.getvalue().to_pybytes()
    try:
        with open(tmp, "wb") as f:
            half = len(data) // 2
            f.write(data[:half])
            f.flush()
            kill_point("store.write")
            fail_point("store.write")
            f.write(data[half:])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        _unlink_quietly(tmp)  # a failed write (a full disk, say) leaves no temporary file behind
        raise
    _fsync_dir(dest.parent)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _write_text_atomic(dest: Path, text: str, link: bool = False) -> None:
    """``dest`` replaced by (``link``: created with, if it does not exist yet) ``text`` via a temporary file,
    which is removed whatever happens."""
    tmp = dest.with_name(f".{dest.stem}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(text)
        if link:
            try:
                os.link(tmp, dest)  # first writer wins atomically
            except FileExistsError:
                pass
        else:
            tmp.replace(dest)
    finally:
        if link or tmp.exists():
            _unlink_quietly(tmp)


def _disk_full(root: Path, e: OSError, what: str) -> StoreDiskFull:
    err = StoreDiskFull(e.errno, f"{root}: disk full ({e.strerror or e}) while writing {what}; nothing half-written "
                                 "was left (the temporary file is removed) and the rows not written count as not "
                                 "done - free some space and rerun the same command to resume")
    err.filename = str(root)
    return err


def _open_part(path: Path) -> BinaryIO:
    """The part's file, opened for reading (the OS-level read: tests inject faults by replacing this)."""
    return open(path, "rb", buffering=0)


class _ReadGuard:
    """A file object for pyarrow that remembers any OSError of the operating system's reads, so that a failed
    *read* (retried) is told apart from a failed *parse* (pyarrow raises OSError for some parse errors too)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.error: OSError | None = None

    def _do(self, name: str, *args: Any) -> Any:
        try:
            if name == "read":
                fail_point("store.read")
            return getattr(self._f, name)(*args)
        except OSError as e:
            if e.errno != errno.EINVAL:  # EINVAL: a bad offset (e.g. from corrupt metadata) - a parse problem
                self.error = e
            raise

    def read(self, n: int = -1) -> bytes:
        return bytes(self._do("read", n))

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._do("seek", offset, whence))

    def tell(self) -> int:
        return int(self._do("tell"))

    @property
    def closed(self) -> bool:
        return bool(self._f.closed)

    def close(self) -> None:
        self._f.close()


def _part_rows(path: Path) -> int | None:
    """Rows of a part: from its name, or (parts written before names carried it) from its Parquet footer."""
    m = _PART_RE.match(path.name)
    if m and m.group(3):
        return int(m.group(3))
    try:
        return pq.ParquetFile(path).metadata.num_rows if m else None
    except (OSError, pa.ArrowException):
        return None  # vanished or unreadable: not a candidate (reads quarantine it)


def key_strings(table: pa.Table | pd.DataFrame, columns: Sequence[str]) -> list[pd.Series]:
    """Key columns as strings (keys compare by their text, so 3 and "3" are the same key)."""
    if isinstance(table, pa.Table):
        return [table.column(c).to_pandas() if pa.types.is_string(table.column(c).type)
                else table.column(c).to_pandas().astype(str) for c in columns]
    return [table[c].astype(str) for c in columns]


def key_index(cols: list[pd.Series]) -> pd.MultiIndex:
    """The key columns (from :func:`key_strings`) as one index, so keys compare as tuples."""
    return pd.MultiIndex.from_arrays([np.asarray(c, dtype=object) if len(c) == 0 else c for c in cols])


@dataclass
class Completeness:
    """What :meth:`ResultStore.check` found: the keys the manifests expect against the rows stored."""

    root: Path
    n_expected: int
    n_stored: int
    missing: pd.DataFrame            # expected, not stored
    unexpected: pd.DataFrame         # stored, in no manifest
    duplicates: pd.DataFrame         # keys stored in more than one row (``read`` keeps one), with ``copies``
    missing_shards: list[str] = field(default_factory=list)   # "i/n" of shards that declared nothing
    quarantined: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.n_expected > 0 and self.missing.empty and not self.missing_shards

    def __str__(self) -> str:
        lines = [f"{self.root}: {self.n_stored} rows stored, {self.n_expected} expected by the manifests - "
                 + ("COMPLETE" if self.complete else "INCOMPLETE")]
        if self.n_expected == 0:
            lines.append("  no manifest: nothing says which keys this store should hold (run with this version)")
        if self.missing_shards:
            lines.append(f"  shards that never declared their items (not started?): {', '.join(self.missing_shards)}")
        for name, df in (("missing", self.missing), ("unexpected (in no manifest)", self.unexpected),
                         ("duplicate (kept once)", self.duplicates)):
            if len(df):
                lines.append(f"  {len(df)} {name} key(s), e.g.:")
                lines += ["    " + " | ".join(map(str, r)) for r in df.head(5).itertuples(index=False, name=None)]
        if self.quarantined:
            lines.append(f"  quarantined parts: {', '.join(self.quarantined)}")
        return "\n".join(lines)


class ResultStore:
    """A folder of Parquet parts holding one row per key; see the module docstring.

    ``run_info`` (optional): facts about this run that do not change any row's value - e.g. the bad input rows it
    left out (``skipped_rows``) - stored in config.json under ``"run_info"``, its keys replaced by each run that
    passes them (the other keys - the pinned model identities, provenance, image policies - are kept) and ignored
    by the resume check (the model identities are checked by :meth:`pin_model`)."""

    def __init__(self, root: str | Path, config: Mapping[str, Any] | None = None,
                 key_columns: Sequence[str] = DEFAULT_KEY, run_info: Mapping[str, Any] | None = None, *,
                 compact_fanout: int = COMPACT_FANOUT, target_part_rows: int = TARGET_PART_ROWS):
        self.root = Path(root)
        self.parts = self.root / "parts"
        self.parts.mkdir(parents=True, exist_ok=True)
        self.key_columns = list(key_columns)
        self.compact_fanout = int(compact_fanout)
        self.target_part_rows = int(target_part_rows)
        if config is not None:
            self._clean_secrets()
            config = {k: v for k, v in config.items() if k != RUN_INFO}
            self._settle_config(_canonical({**config, "key_columns": self.key_columns}))
            if run_info is not None:  # its keys replaced; the others (model identities, provenance ...) kept
                self.set_run_info({**(self.config.get(RUN_INFO) or {}), **_canonical(dict(run_info))})
        self._index: pd.MultiIndex | None = None   # keys on disk when last scanned
        self._added: set[tuple[str, ...]] = set()            # keys this handle appended since

    # ------------------------------------------------------------------------------------------ config
    def _clean_secrets(self) -> None:
        """Mask the secrets a config.json written before they were masked holds (an API key in a model spec), with
        a one-line warning; called when the store is opened for writing."""
        held = self._raw_config()
        clean = redact_obj(held)
        if clean != held:
            self._write_config(clean)
            warnings.warn(f"{self.root / 'config.json'} held a secret (an API key or URL credentials) and has been "
                          "cleaned", stacklevel=3)

    def _settle_config(self, config: dict[str, Any]) -> None:
        cfg_file = self.root / "config.json"
        if not cfg_file.exists():  # first writer wins atomically; the others compare below
            try:
                _write_text_atomic(cfg_file, json.dumps(config, indent=2, sort_keys=True), link=True)
            except OSError as e:
                if e.errno in _FULL_ERRNOS:
                    raise _disk_full(self.root, e, "config.json") from e
                raise
        diff = _config_diff(json.loads(cfg_file.read_text()), config)
        if diff:
            raise ConfigMismatch(f"{cfg_file}: the store was created with another configuration; "
                                 f"differences (stored, requested): {diff}. Use a new output folder.")

    def set_run_info(self, info: Mapping[str, Any]) -> None:
        """Replace the ``run_info`` entry of config.json (see the class docstring)."""
        cfg = self.config
        if not cfg:
            raise FileNotFoundError(f"{self.root}: no config.json to record run_info in")
        self._write_config({**cfg, RUN_INFO: _canonical(dict(info))})

    def pin_run_info(self, key: str, value: Any, entry: str | None = None) -> None:
        """Record ``run_info[key]`` (with ``entry``: ``run_info[key][entry]``, e.g. one model's image policy in a
        store several models write) the first time; later runs must bring the same value (a store is never resumed
        with images processed another way) - :class:`ConfigMismatch` otherwise. A store opened without a
        configuration (no config.json) records nothing."""
        if not self.config:
            return
        info = dict(self.config.get(RUN_INFO) or {})
        value = _canonical(value)
        held = dict(info.get(key) or {}) if entry is not None else info
        name = entry if entry is not None else key
        if name not in held:
            self.set_run_info({**info, key: {**held, name: value}} if entry is not None else {**info, key: value})
        elif held[name] != value:
            where = f"run_info.{key}" + (f"[{entry!r}]" if entry is not None else "")
            raise ConfigMismatch(f"{self.root / 'config.json'}: {where} was {held[name]}, this run has {value}; "
                                 "results under both would mix. Use a new output folder.")

    def pin_model(self, name: str, identity: Mapping[str, Any]) -> None:
        """Record that this store's rows of model ``name`` come from ``identity``
        (:func:`mmfragile.provenance.model_identity`) the first time - also in a store made before identities were
        recorded; a later run of another model (spec or checkpoint) under that name is refused with a one-line
        :class:`ConfigMismatch` naming both, as a changed configuration is."""
        from mmfragile.provenance import identity_clash, same_model

        held = ((self.config.get(RUN_INFO) or {}).get(MODEL_IDENTITY) or {}).get(name)
        if held is None:
            self.pin_run_info(MODEL_IDENTITY, dict(identity), entry=name)
        elif not same_model(held, _canonical(dict(identity))):
            raise ConfigMismatch(identity_clash(self.root / "config.json", name, held, _canonical(dict(identity)),
                                                one_model=self.config.get("model") == name))

    def merge_run_info(self, key: str, entries: Mapping[str, Any]) -> None:
        """Add ``entries`` to the mapping ``run_info[key]`` (e.g. each model's provenance in a store several models
        write), keeping the others'. A store opened without a configuration records nothing."""
        if not self.config:
            return
        info = dict(self.config.get(RUN_INFO) or {})
        merged = {**(info.get(key) or {}), **_canonical(dict(entries))}
        if merged != info.get(key):
            self.set_run_info({**info, key: merged})

    def add_skipped_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Add bad input rows a run (or one shard / worker of it) left out to ``run_info.skipped_rows``, keeping
        those recorded before (the load's, other shards')."""
        info = dict(self.config.get(RUN_INFO) or {})
        known = info.get("skipped_rows", [])
        new = [r for r in _canonical([dict(r) for r in rows]) if r not in known]
        if new or "skipped_rows" not in info:
            self.set_run_info({**info, "skipped_rows": known + new})

    def _write_config(self, config: Mapping[str, Any]) -> None:
        try:
            _write_text_atomic(self.root / "config.json", json.dumps(config, indent=2, sort_keys=True))
        except OSError as e:
            if e.errno in _FULL_ERRNOS:
                raise _disk_full(self.root, e, "config.json") from e
            raise

    @property
    def config(self) -> dict[str, Any]:
        """config.json, secrets masked (a store written before they were masked may hold a key: it is never read
        back, and is cleaned when the store is next opened for writing)."""
        return cast("dict[str, Any]", redact_obj(self._raw_config()))

    def _raw_config(self) -> dict[str, Any]:
        f = self.root / "config.json"
        return json.loads(f.read_text()) if f.exists() else {}

    # ------------------------------------------------------------------------------------------ parts
    def _files(self) -> list[Path]:
        return sorted(p for p in self.parts.glob("part-*.parquet"))

    def _read_part(self, path: Path, columns: Sequence[str] | None = None) -> pa.Table | None:
        """The part's table, or None if it does not parse (then it is quarantined); _Vanished if it is gone.

        An OSError of the reads themselves (EIO, EAGAIN ...) says nothing about the part's bytes: the read is
        retried after each of ``READ_RETRY_DELAYS`` and then :class:`PartReadError` is raised; the part stays."""
        delays = list(READ_RETRY_DELAYS)
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._parse_part(path, columns)
            except _ReadFailed as rf:
                e = rf.error
            if not delays:
                err = PartReadError(e.errno, f"{path}: cannot read result part ({type(e).__name__}: {e}) after "
                                             f"{attempt} attempt(s); the part is left in place (a read error is "
                                             "not corruption) - check the disk or file system and rerun")
                err.filename = str(path)
                raise err from e
            _sleep(delays.pop(0))

    def _parse_part(self, path: Path, columns: Sequence[str] | None) -> pa.Table | None:
        try:
            f = _open_part(path)
        except FileNotFoundError:
            raise _Vanished(path) from None
        except OSError as e:
            raise _ReadFailed(e) from e
        guard = _ReadGuard(f)
        try:
            part = pq.ParquetFile(pa.PythonFile(guard, mode="r"), page_checksum_verification=True)
            # a column asked for that this part lacks (written before the column existed) is read as missing,
            # never as corruption: the read's caller gets nulls for it, the part stays
            table = part.read(columns=None if columns is None else
                              [c for c in columns if c in part.schema_arrow.names])
            missing = [c for c in self.key_columns if c not in table.column_names]
            if missing:
                raise ValueError(f"lacks key column(s) {missing}")
            return table
        except (pa.ArrowException, OSError, ValueError) as e:
            if guard.error is not None:  # the OS failed to deliver the bytes: not the part's fault
                raise _ReadFailed(guard.error) from e
            self._quarantine(path, f"{type(e).__name__}: {e}")
            return None
        finally:
            try:
                f.close()
            except OSError:
                pass

    def _quarantine(self, path: Path, reason: str) -> None:
        qdir = self.root / "quarantine"
        qdir.mkdir(exist_ok=True)
        dest = qdir / path.name
        try:
            os.replace(path, dest)
        except FileNotFoundError:  # another reader quarantined it (or a compaction replaced it) first
            return
        (qdir / f"{path.name}.reason.txt").write_text(reason + "\n")
        warnings.warn(f"{path}: unreadable result part ({reason}); moved to {dest}. Its rows count as not done "
                      f"and the next run evaluates them again.", CorruptPartWarning, stacklevel=4)

    def _read_all(self, columns: Sequence[str] | None = None) -> list[tuple[Path, pa.Table]]:
        for _ in range(20):
            try:
                out = []
                for f in self._files():
                    t = self._read_part(f, columns)
                    if t is not None:
                        out.append((f, t))
                return out
            except _Vanished:
                continue  # a concurrent compaction replaced a part: list again
        raise RuntimeError(f"{self.parts}: parts kept vanishing while reading (20 tries); is a compaction looping?")

    # ------------------------------------------------------------------------------------------ keys
    def _key(self, row: Mapping[str, Any]) -> tuple[str, ...]:
        return tuple(str(row[c]) for c in self.key_columns)

    def _scan(self) -> pd.MultiIndex:
        tables = [t for _, t in self._read_all(self.key_columns)]
        if not tables:
            return key_index([pd.Series([], dtype=object)] * len(self.key_columns))
        cols = [pd.concat(c, ignore_index=True) for c in zip(*(key_strings(t, self.key_columns) for t in tables))]
        return key_index(cols).unique()

    def stored_index(self) -> pd.MultiIndex:
        """The keys in the store's parts on disk (strings; cached until :meth:`refresh`), without the rows this
        writer appended since."""
        if self._index is None:
            self._index = self._scan()
        return self._index

    def refresh(self) -> None:
        """Forget the cached keys (the next query scans the parts again, seeing other writers' rows)."""
        self._index = None
        self._added = set()

    def done_keys(self) -> set[tuple[str, ...]]:
        """All stored keys as tuples of strings (memory grows with the store; prefer :meth:`pending`)."""
        return set(self.stored_index()) | self._added

    def is_done(self, row: Mapping[str, Any]) -> bool:
        k = self._key(row)
        return k in self._added or k in self.stored_index()

    def pending(self, keys: pd.DataFrame | Iterable[Mapping[str, Any]]) -> np.ndarray:
        """Boolean mask: which of ``keys`` (rows with the key columns) are not stored yet. Vectorised: use it
        for large item lists instead of calling :meth:`is_done` per item."""
        df = keys if isinstance(keys, pd.DataFrame) else pd.DataFrame(list(keys), columns=self.key_columns)
        if df.empty:
            return np.zeros(0, dtype=bool)
        return self.pending_mask(key_index(key_strings(df, self.key_columns)))

    def pending_mask(self, q: pd.MultiIndex) -> np.ndarray:
        """Boolean mask: which keys of the key index ``q`` (:func:`key_index` of strings) are not stored yet."""
        done = q.isin(self.stored_index())
        if self._added:
            done |= np.fromiter((k in self._added for k in q), dtype=bool, count=len(q))
        return np.asarray(~done)

    def __len__(self) -> int:
        return len(self.stored_index()) + len(self._added)

    # ------------------------------------------------------------------------------------------ writing
    def append(self, rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> int:
        """Write the rows whose keys are not stored yet as one new part; returns how many were written."""
        kill_point("store.append")
        df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
        if df.empty:
            return 0
        missing = [c for c in self.key_columns if c not in df.columns]
        if missing:
            raise KeyError(f"rows lack key column(s) {missing}")
        keys = key_index(key_strings(df, self.key_columns))
        keep = self.pending_mask(keys) & ~keys.duplicated(keep="first")
        df = df[keep]
        if df.empty:
            return 0
        table = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
        self._write(table, self._new_part_path(len(df)), f"a result part of {len(df)} row(s)")
        kill_point("store.renamed")
        self._added.update(keys[keep])
        if len(self._added) > max(50_000, len(self.stored_index()) // 4):
            # fold this session's keys into the index (geometric: O(rows) in all; a set of tuples costs ~300 B a key)
            self._index = self.stored_index().append(pd.MultiIndex.from_tuples(list(self._added)))
            self._added = set()
        if self.compact_fanout > 1:
            try:
                self.compact(full=False)
            except (StoreDiskFull, PartReadError) as e:  # the rows are stored; merging them can wait
                warnings.warn(f"{e.strerror} (the {len(df)} row(s) of this append are stored; only the compaction "
                              "was skipped)", RuntimeWarning, stacklevel=2)
        return len(df)

    def _write(self, table: pa.Table, dest: Path, what: str) -> None:
        """:func:`_write_durable`, a full disk reported as :class:`StoreDiskFull` naming this store."""
        try:
            _write_durable(table, dest)
        except OSError as e:
            if e.errno in _FULL_ERRNOS:
                raise _disk_full(self.root, e, f"{what} ({dest.name})") from e
            raise

    def _new_part_path(self, n_rows: int, stamp: int | None = None) -> Path:
        stamp = time.time_ns() if stamp is None else stamp
        return self.parts / f"part-{stamp:020d}-{uuid.uuid4().hex[:12]}-n{n_rows}.parquet"

    # ------------------------------------------------------------------------------------------ reading
    def read(self, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The stored table, one row per key (the first copy in part-name order). ``columns``: read only these
        (the key columns are always included). Parts that do not parse are quarantined, never raised; a part the
        disk fails to read even after retries raises :class:`PartReadError` naming it (and is left in place)."""
        if columns is not None:
            columns = list(dict.fromkeys([*self.key_columns, *columns]))
        parts = self._read_all(columns)
        if not parts:
            return pd.DataFrame()
        tables = [t for _, t in parts]
        try:
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            # parts whose column types cannot be unified in Arrow (e.g. int in one, str in another): let pandas
            df = pd.concat([t.to_pandas() for t in tables], ignore_index=True)
            dup = key_index(key_strings(df, self.key_columns)).duplicated(keep="first")
            return (df[~dup] if dup.any() else df).reset_index(drop=True)
        # drop duplicate keys in Arrow, before the (costly) conversion of every column to pandas
        dup = key_index(key_strings(table, self.key_columns)).duplicated(keep="first")
        if dup.any():
            table = table.filter(pa.array(~dup))
        return table.to_pandas()

    # ------------------------------------------------------------------------------------------ compaction
    def compact(self, full: bool = True) -> int:
        """Merge small parts; returns the number of parts merged away.

        ``full=False`` (done after every append): size-tiered - only once ``compact_fanout`` parts of the same
        size tier (rows within the same power of the fan-out) exist, so every row is rewritten about
        log_fanout(target / flush) times. ``full=True``: every part under ``target_part_rows`` rows, merged into
        as few parts as possible. Safe against concurrent writers, readers, other compactions (a lock file
        avoids duplicate work; correctness does not depend on it) and kills (see the module docstring)."""
        lock_path = self.root / ".compact.lock"
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # another process is compacting this store
            try:
                return sum(self._merge(batch) for batch in self._compaction_batches(full))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _compaction_batches(self, full: bool) -> list[list[Path]]:
        small = [(f, n) for f in self._files() if (n := _part_rows(f)) is not None and n < self.target_part_rows]
        batches: list[list[Path]] = []
        if full:
            cur: list[Path] = []
            rows = 0
            for f, n in small:
                if cur and rows + n > self.target_part_rows:
                    batches.append(cur)
                    cur, rows = [], 0
                cur.append(f)
                rows += n
            batches.append(cur)
            return [b for b in batches if len(b) > 1]
        fan = self.compact_fanout
        tiers: dict[int, list[Path]] = {}
        for f, n in small:
            tiers.setdefault(int(math.log(max(n, 1), fan)), []).append(f)
        for files in tiers.values():
            batches += [files[i:i + fan] for i in range(0, len(files) - fan + 1, fan)]
        return batches

    def _merge(self, batch: list[Path]) -> int:
        tables, used = [], []
        for f in batch:
            try:
                t = self._read_part(f)
            except _Vanished:
                continue  # someone else merged it already: its rows live in their part
            if t is not None:
                tables.append(t)
                used.append(f)
        if len(used) < 2:
            return 0
        try:
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return 0  # incompatible column types: leave these parts as they are (reads handle them)
        dup = key_index(key_strings(table, self.key_columns)).duplicated(keep="first")
        if dup.any():
            table = table.filter(pa.array(~dup))
        first = _PART_RE.match(used[0].name)   # a compaction batch holds parts named by this store
        stamp = int(first.group(1)) if first else None  # keeps the merged rows where the first part sorted
        self._write(table, self._new_part_path(table.num_rows, stamp), f"a compacted part of {table.num_rows} row(s)")
        kill_point("store.compact")
        for f in used:
            try:
                f.unlink()
            except FileNotFoundError:
                pass
        _fsync_dir(self.parts)
        return len(used) - 1

    def clean_temporary(self, min_age_s: float = 3600.0) -> list[Path]:
        """Delete temporary files left by killed writers (older than ``min_age_s``; a live writer's file is
        seconds old). Returns the deleted paths."""
        out = []
        now = time.time()
        for d in (self.parts, self.root / "manifest"):
            for p in d.glob(".*.tmp") if d.exists() else []:
                try:
                    if now - p.stat().st_mtime >= min_age_s:
                        p.unlink()
                        out.append(p)
                except FileNotFoundError:
                    pass
        return out

    # ------------------------------------------------------------------------------------------ manifests
    def declare(self, keys: pd.DataFrame | Iterable[Mapping[str, Any]], label: str = "shard-0-of-1") -> Path:
        """Record that a run (or shard ``label``, ``shard-<i>-of-<n>``) is responsible for ``keys``. Several
        declarations add up; the same key set under the same label is written once."""
        df = keys if isinstance(keys, pd.DataFrame) else pd.DataFrame(list(keys), columns=self.key_columns)
        cols = key_strings(df, self.key_columns)  # an empty declaration still says "this shard has no items"
        frame = pd.DataFrame({c: s.to_numpy(dtype=object) for c, s in zip(self.key_columns, cols)})
        frame = frame.drop_duplicates().sort_values(self.key_columns).reset_index(drop=True)
        digest = hashlib.sha1(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes()).hexdigest()[:16]
        mdir = self.root / "manifest"
        mdir.mkdir(exist_ok=True)
        dest = mdir / f"{label}.{digest}.parquet"
        if not dest.exists():
            self._write(pa.Table.from_pandas(frame, preserve_index=False), dest, f"the manifest {label}")
        return dest

    def _manifests(self) -> list[Path]:
        mdir = self.root / "manifest"
        return sorted(mdir.glob("*.parquet")) if mdir.exists() else []

    def manifest_labels(self) -> dict[str, list[Path]]:
        """Manifest files by label (``shard-<i>-of-<n>``)."""
        out: dict[str, list[Path]] = {}
        for m in self._manifests():
            out.setdefault(m.name.split(".")[0], []).append(m)
        return out

    def expected_index(self, label: str | None = None, files: Sequence[Path] | None = None) -> pd.MultiIndex:
        """The declared keys (a key index of strings) of every manifest, of shard ``label``'s, or of the
        manifest ``files`` given."""
        if files is None:
            files = [m for m in self._manifests() if label is None or m.name.split(".")[0] == label]
        tables = [pq.read_table(m) for m in files]
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return key_index([pd.Series([], dtype=object)] * len(self.key_columns))
        cols = [pd.concat(c, ignore_index=True) for c in zip(*(key_strings(t, self.key_columns) for t in tables))]
        return key_index(cols).unique()

    def expected_keys(self, label: str | None = None) -> pd.DataFrame:
        """The union of all declared keys (strings), one row per key; ``label``: of that shard only."""
        return self.expected_index(label).to_frame(index=False, name=self.key_columns)

    def missing_shards(self) -> list[str]:
        """``"i/n"`` for every shard of a declared split that has declared nothing."""
        seen: dict[int, set[int]] = {}
        for m in self._manifests():
            s = _SHARD_RE.match(m.name.split(".")[0])
            if s:
                seen.setdefault(int(s.group(2)), set()).add(int(s.group(1)))
        return [f"{i}/{n}" for n in sorted(seen) for i in range(n) if i not in seen[n]]

    def check(self) -> Completeness:
        """Compare the stored rows with the manifests (see :class:`Completeness`)."""
        tables = [t for _, t in self._read_all(self.key_columns)]
        cols = ([pd.concat(c, ignore_index=True) for c in zip(*(key_strings(t, self.key_columns) for t in tables))]
                if tables else [pd.Series([], dtype=object)] * len(self.key_columns))
        stored = key_index(cols)
        dup_mask = stored.duplicated(keep=False)
        dups = stored[dup_mask].to_frame(index=False, name=self.key_columns).value_counts(sort=False)
        got = stored[~stored.duplicated(keep="first")]
        exp = self.expected_index()

        def frame(mi: pd.MultiIndex) -> pd.DataFrame:
            return mi.to_frame(index=False, name=self.key_columns).astype(object)

        qdir = self.root / "quarantine"
        return Completeness(
            root=self.root, n_expected=len(exp), n_stored=len(got),
            missing=frame(exp[~exp.isin(got)]), unexpected=frame(got[~got.isin(exp)]),
            duplicates=dups.rename("copies").reset_index(),
            missing_shards=self.missing_shards(),
            quarantined=sorted(p.name for p in qdir.glob("*.parquet")) if qdir.exists() else [])


def merge_stores(target: str | Path, sources: Sequence[str | Path] = (), compact: bool = True) -> Completeness:
    """Bring the rows and manifests of ``sources`` (e.g. per-shard stores written on separate disks) into the
    store at ``target``, compact it and check it against its manifests. The returned report lists duplicates as
    found before the compaction removed them.

    Every configuration must match and every model name must be the same model (``run_info.model_identity``):
    all of it is checked before anything is written. A ``target`` that does not exist (or is empty) is built in a
    temporary sibling folder, renamed to ``target`` at the end: a merge that fails leaves no half-made store behind."""
    target = Path(target)
    for s in [target, *map(Path, sources)]:
        if not (s / "parts").is_dir() and (s != target or not sources):
            raise FileNotFoundError(f"{s}: not a result store (no parts/ folder)")
    srcs = [ResultStore(s) for s in sources]
    base = target if (target / "config.json").exists() or not srcs else srcs[0].root   # whose config rules
    cfg = ResultStore(base).config   # secrets masked: a merged store never carries an old store's key
    info = _mergeable(base, cfg, srcs)
    if target.exists() and any(target.iterdir()):
        return _merge_into(_merge_target(target, cfg, info), srcs, compact)
    tmp = target.with_name(f".{target.name}.merging-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        report = _merge_into(_merge_target(tmp, cfg, info), srcs, compact)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report.root = target
    return report


def _mergeable(base: Path, cfg: Mapping[str, Any], srcs: Sequence[ResultStore]) -> dict[str, Any] | None:
    """The merged ``run_info`` of ``cfg`` (``base``'s) and the sources' (None without a configuration);
    :class:`ConfigMismatch` if a source has another configuration or holds another model under a name."""
    info = dict(cfg.get(RUN_INFO) or {}) if cfg else None
    for s in srcs:
        diff = _config_diff(cfg, s.config)
        if diff:
            raise ConfigMismatch(f"{s.root}: its config differs from {base}'s; only runs of one configuration "
                                 f"merge - differences ({base.name}, {s.root.name}): {diff}")
        info = _merge_run_info(info or {}, s.config.get(RUN_INFO) or {}, s.root)
    return info


def _pinned() -> dict[str, tuple[Callable[[Any, Any], bool], Callable[[Any], str]]]:
    """``run_info`` entries (name -> value) that stores must agree on to merge: how values compare and read."""
    from mmfragile.provenance import describe_identity, same_model

    return {MODEL_IDENTITY: (same_model, describe_identity), "image_policy": (lambda a, b: a == b, str)}


def _merge_run_info(into: Mapping[str, Any], other: Mapping[str, Any], where: Path) -> dict[str, Any]:
    """``into`` with ``other``'s (``where``'s) entries added: lists (skipped rows) joined, mappings (provenance,
    identities per model) keep ``into``'s entries, pinned ones (:func:`_pinned`) must agree; other values stay
    ``into``'s."""
    out = dict(into)
    for key, value in other.items():
        mine = out.setdefault(key, value)
        if isinstance(mine, list) and isinstance(value, list):
            out[key] = mine + [v for v in value if v not in mine]
        elif isinstance(mine, dict) and isinstance(value, dict):
            pinned = _pinned().get(key)
            for name in sorted(set(mine) & set(value)) if pinned else ():
                same, describe = cast("tuple[Callable[[Any, Any], bool], Callable[[Any], str]]", pinned)
                if not same(mine[name], value[name]):
                    raise ConfigMismatch(f"{where}: its run_info.{key}[{name!r}] is {describe(value[name])}, the "
                                         f"stores before it have {describe(mine[name])}; their rows would mix, so "
                                         "they do not merge")
            out[key] = {**value, **mine}
    return out


def _merge_target(root: Path, cfg: Mapping[str, Any], info: Mapping[str, Any] | None) -> ResultStore:
    if not cfg:
        return ResultStore(root)
    return ResultStore(root, config={k: v for k, v in cfg.items() if k != "key_columns"},
                       key_columns=cfg.get("key_columns", list(DEFAULT_KEY)), run_info=info or None)


def _merge_into(out: ResultStore, srcs: Sequence[ResultStore], compact: bool) -> Completeness:
    for s in srcs:
        for m in s._manifests():
            dest = out.root / "manifest" / m.name
            if not dest.exists():
                dest.parent.mkdir(exist_ok=True)
                out._write(pq.read_table(m), dest, f"the manifest {m.name}")
        for _, t in s._read_all():
            out.append(t.to_pandas())
    report = out.check()
    if compact:
        out.compact(full=True)
        after = out.check()
        after.duplicates = report.duplicates
        report = after
    return report


def store_folders(root: str | Path) -> list[Path]:
    """The result-store folders at or below ``root`` (any depth), in the order of their config.json paths. Folders
    with a config.json but no ``parts/`` (a model checkpoint, say) are not stores and are skipped."""
    return [cfg.parent for cfg in sorted(Path(root).rglob("config.json")) if (cfg.parent / "parts").is_dir()]


def find_stores(root: str | Path, study: str, stage: str | None = None) -> list[ResultStore]:
    """The stores under ``root`` (:func:`store_folders`) of ``study`` (and ``stage``), by :func:`store_tag` - a
    store without a tag raises, naming it."""
    out = []
    for folder in store_folders(root):
        st = ResultStore(folder)
        tag = store_tag(st.config, folder / "config.json")
        if tag[0] == study and stage in (None, tag[1]):
            out.append(st)
    return out
