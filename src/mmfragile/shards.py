"""Deterministic split of a study's work by question group, for schedulers without Ray (SLURM arrays) and for
the tasks of a Ray run.

A *question group* is ``"<dataset>/<question_id>"``: every item of one question (all formats and shifts, all
prompt types, all perturbations and runs of one judge sample) falls in the same group, so a shard keeps what the
prefix-sharing engine shares. Shard ``i`` of ``n`` owns the groups whose SHA-1 is ``i`` modulo ``n`` - the same
on every machine and in every process, whatever the order of the input, so array task ``i`` needs nothing but
``i/n``::

    python -m mmfragile formats --model M --dataset D --out runs/fb --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT
    python -m mmfragile merge runs/fb        # once all tasks ended: compact, check completeness

Each shard records its keys in the store's manifest (``shard-<i>-of-<n>``), so ``merge`` can tell a finished run
from one with a shard that never started.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar

import pandas as pd

T = TypeVar("T")


def question_group(dataset: Any, question_id: Any) -> str:
    """The group of every item of one question (the unit that is never split)."""
    return f"{dataset}/{question_id}"


def shard_index(group: str, n: int) -> int:
    """Which of ``n`` shards owns ``group`` (stable across processes, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha1(group.encode("utf-8")).digest()[:8], "big") % n


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: need 0 <= i < n")

    @classmethod
    def parse(cls, spec: "str | Shard | None") -> "Shard":
        """``"i/n"`` (0-based, as SLURM array ids) -> Shard; None -> the whole run (0/1)."""
        if spec is None:
            return cls(0, 1)
        if isinstance(spec, Shard):
            return spec
        i, sep, n = str(spec).partition("/")
        try:
            return cls(int(i), int(n))
        except ValueError:
            raise ValueError(f"--shard wants i/n with 0 <= i < n (e.g. 0/4), got {spec!r}") from None

    @property
    def label(self) -> str:
        """The manifest label of this shard in a store."""
        return f"shard-{self.index}-of-{self.count}"

    def owns(self, group: str) -> bool:
        return shard_index(group, self.count) == self.index

    def select(self, units: Iterable[T], group_of: Callable[[T], str]) -> list[T]:
        """The units of this shard, in their input order."""
        return [u for u in units if self.owns(group_of(u))]

    def questions(self, questions: pd.DataFrame) -> pd.DataFrame:
        """The rows of a question table (``dataset``, ``question_id`` columns) that belong to this shard."""
        if self.count == 1:
            return questions
        keep = [self.owns(question_group(d, q)) for d, q in zip(questions["dataset"], questions["question_id"])]
        return questions[keep]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def split(units: Sequence[T], n: int, group_of: Callable[[T], str]) -> list[list[T]]:
    """All ``n`` shards of ``units`` at once (the tasks of a distributed run), empty shards included."""
    out: list[list[T]] = [[] for _ in range(n)]
    for u in units:
        out[shard_index(group_of(u), n)].append(u)
    return out
