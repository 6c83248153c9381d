"""Resumable per-question result store (Parquet).

A store is a folder::

    <root>/config.json          the run's configuration (checked on resume); its ``run_info`` entry
                                (e.g. the bad input rows a run left out) is rewritten by every run, not checked
    <root>/parts/part-*.parquet one file per flushed batch, each written atomically (tmp + rename)

Rows are keyed by ``key_columns`` (by default model, dataset, question_id, variant). A run asks the
store which keys are done, evaluates only the rest and appends them in batches; a run killed at any
point loses at most the batch in flight and never leaves a half-written file. ``read()`` returns one
row per key even if a part was written twice (e.g. two processes raced), keeping the first.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

DEFAULT_KEY = ("model", "dataset", "question_id", "variant")


class ConfigMismatch(ValueError):
    """A store is being resumed with a configuration different from the one it was created with."""


def _canonical(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


RUN_INFO = "run_info"


class ResultStore:
    """``run_info`` (optional): facts about this run that do not change any row's value - e.g. the bad input
    rows it left out (``skipped_rows``) - stored in config.json under ``"run_info"``, replaced by each run
    that passes one and ignored by the resume check."""

    def __init__(self, root: str | Path, config: Mapping[str, Any] | None = None,
                 key_columns: Sequence[str] = DEFAULT_KEY, run_info: Mapping[str, Any] | None = None):
        self.root = Path(root)
        self.parts = self.root / "parts"
        self.parts.mkdir(parents=True, exist_ok=True)
        self.key_columns = list(key_columns)
        cfg_file = self.root / "config.json"
        if config is not None:
            config = _canonical({**{k: v for k, v in config.items() if k != RUN_INFO}, "key_columns": self.key_columns})
            stored = json.loads(cfg_file.read_text()) if cfg_file.exists() else None
            if stored is not None:
                old = {k: v for k, v in stored.items() if k != RUN_INFO}
                diff = {k: (old.get(k), config.get(k)) for k in set(old) | set(config) if old.get(k) != config.get(k)}
                if diff:
                    raise ConfigMismatch(f"{cfg_file}: the store was created with another configuration; "
                                         f"differences (stored, requested): {diff}. Use a new output folder.")
            if stored is None or run_info is not None:
                info = _canonical(dict(run_info)) if run_info is not None else (stored or {}).get(RUN_INFO)
                self._write_config({**config, **({RUN_INFO: info} if info is not None else {})})
        self._done: set[tuple] | None = None

    def set_run_info(self, info: Mapping[str, Any]) -> None:
        """Replace the ``run_info`` entry of config.json (see the class docstring)."""
        cfg = self.config
        if not cfg:
            raise FileNotFoundError(f"{self.root}: no config.json to record run_info in")
        self._write_config({**cfg, RUN_INFO: _canonical(dict(info))})

    def _write_config(self, config: Mapping[str, Any]) -> None:
        cfg_file = self.root / "config.json"
        tmp = cfg_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(config, indent=2, sort_keys=True))
        tmp.replace(cfg_file)

    @property
    def config(self) -> dict:
        f = self.root / "config.json"
        return json.loads(f.read_text()) if f.exists() else {}

    def _files(self) -> list[Path]:
        return sorted(self.parts.glob("part-*.parquet"))

    def _key(self, row: Mapping[str, Any]) -> tuple:
        return tuple(str(row[c]) for c in self.key_columns)

    def done_keys(self) -> set[tuple]:
        if self._done is None:
            self._done = set()
            for f in self._files():
                df = pd.read_parquet(f, columns=self.key_columns)
                self._done.update(map(tuple, df.astype(str).itertuples(index=False, name=None)))
        return self._done

    def is_done(self, row: Mapping[str, Any]) -> bool:
        return self._key(row) in self.done_keys()

    def append(self, rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> int:
        """Write rows not already stored as one new part; returns how many were written."""
        df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
        if df.empty:
            return 0
        missing = [c for c in self.key_columns if c not in df.columns]
        if missing:
            raise KeyError(f"rows lack key column(s) {missing}")
        keys = [tuple(map(str, k)) for k in df[self.key_columns].itertuples(index=False, name=None)]
        done = self.done_keys()
        keep, seen = [], set()
        for k in keys:
            keep.append(k not in done and k not in seen)
            seen.add(k)
        df = df[keep]
        if df.empty:
            return 0
        name = f"part-{len(self._files()):06d}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.parts / f".{name}.tmp"
        df.to_parquet(tmp, index=False)
        os.replace(tmp, self.parts / name)
        done.update(k for k, kept in zip(keys, keep) if kept)
        return len(df)

    def read(self) -> pd.DataFrame:
        files = self._files()
        if not files:
            return pd.DataFrame()
        df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
        key = df[self.key_columns].astype(str)
        return df[~key.duplicated(keep="first")].reset_index(drop=True)

    def __len__(self) -> int:
        return len(self.done_keys())


def find_stores(root: str | Path, study: str, default_study: str | None = None) -> list[ResultStore]:
    """The stores under ``root`` (any depth) whose config names ``study``; a config without a ``study`` key
    counts as ``default_study``. Folders with a config.json but no ``parts/`` (a model checkpoint, say) are
    not stores and are skipped."""
    out = []
    for cfg in sorted(Path(root).rglob("config.json")):
        if (cfg.parent / "parts").is_dir():
            st = ResultStore(cfg.parent)
            if st.config.get("study", default_study) == study:
                out.append(st)
    return out
