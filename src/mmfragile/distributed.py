"""Distributed execution on Ray: any study's work split by question group over N model replicas.

The units of a study (question records for format bias and Promptception, ``(condition, sample)`` pairs or
:class:`~mmfragile.studies.judgebias.PairItem` s for the judge study) are split into tasks with
:func:`mmfragile.shards.split` - task ``j`` of ``K`` is exactly shard ``j/K`` of a ``--shard`` run, so both ways
of running fill the same manifests. Ray schedules the tasks (:class:`ray.util.ActorPool`: a task goes to
whichever actor is free) over ``workers`` actors, each holding one model replica loaded from its spec (one GPU
per actor when the cluster has GPUs, else one CPU). A task runs the stage's :class:`~mmfragile.study.StageTask`
(the one loop, ``run_items``) against a recording store and returns its rows; the driver is the only writer of the
:class:`~mmfragile.store.ResultStore` and appends each task's rows as it arrives.

Kills: a killed worker is restarted by Ray and its task retried (``max_restarts`` / ``max_task_retries``); a
killed driver loses only the tasks in flight - rerun the same command and it dispatches only the tasks whose
manifest is missing or whose keys are not all stored. The final table equals a single-process run's: every group
is evaluated whole by one replica, as in one process (the prefix-sharing engine and seeded sampling do not depend
on which other groups share a process; the naive ``generate`` path batches across groups and may differ where
padding changes a greedy tie).

``ray.init()`` starts a local cluster unless ``address`` names one (``"auto"``, ``"ray://head:10001"`` ...).
On a cluster, every node needs this package, the model and the data at the same paths (a study registered outside
the package: its module, which a worker imports from the task's ``origin``); only the driver's node needs the result
store. Usage statistics are off unless ``RAY_USAGE_STATS_ENABLED`` says otherwise.
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from mmfragile.faults import kill_point
from mmfragile.models.spec import ModelSpec
from mmfragile.shards import Shard, question_group, shard_index, split
from mmfragile.store import ResultStore, key_index, key_strings

#: questions per task by default: small enough that a kill loses little, large enough to amortise dispatch
GROUPS_PER_TASK = 8
#: environment passed to the workers (fault injection for tests, offline hub, tokenizer threads)
_PASS_ENV = ("MMFRAGILE_", "HF_", "TRANSFORMERS_", "TOKENIZERS_PARALLELISM")


class RecordingStore:
    """The store interface a study runner sees inside a worker: ``done`` keys as of dispatch (this task's groups
    only), declarations and appended rows recorded for the driver."""

    def __init__(self, key_columns: Sequence[str], done: pd.DataFrame | None = None):
        self.key_columns = list(key_columns)
        done = done if done is not None else pd.DataFrame(columns=self.key_columns)
        self._done = key_index(key_strings(done, self.key_columns))
        self._added: set[tuple] = set()
        self.declared: list[tuple[str, pd.DataFrame]] = []
        self.rows: list[dict] = []
        self.skipped_rows: list[dict] = []
        self.pinned: dict[str, Any] = {}

    def pin_run_info(self, key: str, value: Any, entry: str | None = None) -> None:
        self.pinned[(key, entry)] = value  # the driver pins it in the real store (and refuses a mismatch there)

    def add_skipped_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        self.skipped_rows += [dict(r) for r in rows]

    def declare(self, keys: pd.DataFrame | Iterable[Mapping[str, Any]], label: str = "shard-0-of-1") -> None:
        df = keys if isinstance(keys, pd.DataFrame) else pd.DataFrame(list(keys), columns=self.key_columns)
        self.declared.append((label, df[self.key_columns].reset_index(drop=True)))

    def _key(self, row: Mapping[str, Any]) -> tuple:
        return tuple(str(row[c]) for c in self.key_columns)

    def is_done(self, row: Mapping[str, Any]) -> bool:
        k = self._key(row)
        return k in self._added or k in self._done

    def pending(self, keys: pd.DataFrame | Iterable[Mapping[str, Any]]) -> np.ndarray:
        df = keys if isinstance(keys, pd.DataFrame) else pd.DataFrame(list(keys), columns=self.key_columns)
        return np.array([not self.is_done(r) for r in df[self.key_columns].to_dict("records")], dtype=bool)

    def append(self, rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> int:
        recs = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else [dict(r) for r in rows]
        n = 0
        for r in recs:
            k = self._key(r)
            if k not in self._added and k not in self._done:
                self._added.add(k)
                self.rows.append(r)
                n += 1
        return n

    def read(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def __len__(self) -> int:
        return len(self._done) + len(self._added)


class _Worker:
    """One model replica (a Ray actor)."""

    def __init__(self, model: ModelSpec, threads: int | None):
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        self.model = model.load()

    def info(self) -> dict:
        import ray

        return {"name": self.model.name, "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def run(self, task: Callable, units: list, shard: Shard, key_columns: list[str], done: pd.DataFrame) -> dict:
        store = RecordingStore(key_columns, done)
        task(self.model, units, store, shard)
        kill_point("worker.task")
        return {"shard": shard, "declared": store.declared, "rows": store.read(), "pid": os.getpid(),
                "skipped_rows": store.skipped_rows, "pinned": store.pinned}


@dataclass
class RayRunReport:
    """What :func:`run_on_ray` did."""

    model: str
    store: ResultStore
    workers: int
    n_tasks: int                      # shards of the split (K)
    n_dispatched: int = 0             # tasks sent to workers (the others were already complete)
    n_rows: int = 0                   # rows appended to the store by this run
    seconds: float = 0.0
    rows_by_worker: dict = field(default_factory=dict)   # worker pid -> rows it evaluated

    def __str__(self) -> str:
        return (f"{self.model}: {self.n_dispatched}/{self.n_tasks} tasks on {self.workers} Ray workers, "
                f"{self.n_rows} new rows in {self.seconds:.1f} s (rows per worker: {self.rows_by_worker})")


def _done_by_shard(store: ResultStore, n: int) -> dict[int, pd.DataFrame]:
    """The stored keys split by the shard that owns their question group (one pass over the keys)."""
    idx = store.stored_index()
    if len(idx) == 0:
        return {}
    keys = idx.to_frame(index=False, name=store.key_columns)
    groups = keys["dataset"].astype(str) + "/" + keys["question_id"].astype(str)
    codes, uniq = pd.factorize(groups)
    owner = np.array([shard_index(g, n) for g in uniq])[codes]
    return {int(j): keys[owner == j].reset_index(drop=True) for j in np.unique(owner)}


def _shard_complete(store: ResultStore, shard: Shard, manifests: dict[str, list]) -> bool:
    """The shard declared its keys (in an earlier run) and every one of them is stored."""
    if shard.label not in manifests:
        return False
    expected = store.expected_index(files=manifests[shard.label])
    return not store.pending_mask(expected).any()


def init_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Connect to the Ray cluster at ``address``, or start a local one with ``num_cpus`` CPUs; returns False if
    Ray was already initialised (then nothing changes). Usage statistics stay off unless asked for."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # offline by design: no usage report
    if address:
        ray.init(address=address, include_dashboard=False)
        return True
    # Ray gives its node processes a fixed 30 s to come up, which a busy machine can exceed: try again
    for attempt in range(3):
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False)
            return True
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for this
            ray.shutdown()
            if "timed out during startup" not in str(e) or attempt == 2:
                raise
            warnings.warn(f"local Ray cluster did not start in time ({e}); trying again")
    return True


def run_on_ray(task: Callable[[Any, list, Any, Shard], Any], units: Sequence[Any], store: ResultStore,
               model: "str | ModelSpec", *, workers: int = 2, address: str | None = None,
               group_of: Callable[[Any], str] | None = None, n_tasks: int | None = None,
               model_kwargs: Mapping[str, Any] | None = None, gpus_per_worker: float | None = None,
               threads_per_worker: int | None = 1, max_restarts: int = 3, progress: bool = True) -> RayRunReport:
    """Run ``task`` over ``units`` on ``workers`` Ray actors, each with its own replica of ``model`` (a
    :class:`~mmfragile.models.spec.ModelSpec` or its string, ``model_kwargs`` added), appending every task's rows
    to ``store`` as it completes.

    ``task(model, units, store, shard)`` is a :class:`mmfragile.study.StageTask` (any picklable callable with that
    signature). ``group_of(unit)`` names the unit's question group (default: the task's ``group_of``, else
    question records with ``dataset`` and ``question_id``). ``n_tasks``: shards of the split; default one per :data:`GROUPS_PER_TASK` groups - it
    depends only on the units, so a rerun with another worker count resumes the same split.
    ``gpus_per_worker``: default 1 when the cluster has GPUs, else 0 (one CPU per worker).
    """
    try:
        import ray
        from ray.util import ActorPool
    except ImportError as e:
        raise ImportError("distributed runs need Ray: pip install ray==2.60.0 (in requirements.txt), or use "
                          "--shard i/n with any scheduler") from e

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    group_of = group_of or getattr(task, "group_of", None) or (lambda rec: question_group(rec["dataset"],
                                                                                          rec["question_id"]))
    groups = {group_of(u) for u in units}
    n_tasks = n_tasks or max(1, -(-len(groups) // GROUPS_PER_TASK))
    t0 = time.perf_counter()
    # a local cluster gets room for every worker even on a small machine (oversubscribing a core beats actors
    # that wait forever for a CPU)
    started = init_ray(address, num_cpus=max(os.cpu_count() or 1, workers))
    try:
        if gpus_per_worker is None:
            gpus_per_worker = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        need = {"CPU": workers * 1.0, "GPU": workers * gpus_per_worker}
        have = ray.cluster_resources()
        short = {k: (v, have.get(k, 0)) for k, v in need.items() if v > have.get(k, 0)}
        if short:
            msg = f"{workers} workers need {need} but the Ray cluster has {dict(have)}"
            if not address:
                raise RuntimeError(msg + "; use fewer --workers")
            warnings.warn(msg + "; some workers wait until the cluster grows")
        env = {k: v for k, v in os.environ.items() if k.startswith(_PASS_ENV)}
        actor_cls = ray.remote(_Worker).options(
            num_cpus=1, num_gpus=gpus_per_worker, max_restarts=max_restarts, max_task_retries=max_restarts,
            runtime_env={"env_vars": env} if env else None)
        spec = ModelSpec.parse(model, **dict(model_kwargs or {}))
        actors = [actor_cls.remote(spec, threads_per_worker) for _ in range(workers)]
        name = spec.name
        report = RayRunReport(model=name, store=store, workers=workers, n_tasks=n_tasks)
        done = _done_by_shard(store, n_tasks)
        empty = pd.DataFrame(columns=store.key_columns)
        manifests = store.manifest_labels()
        todo = []
        for j, shard_units in enumerate(split(list(units), n_tasks, group_of)):
            shard = Shard(j, n_tasks)
            if not shard_units:
                store.declare(empty, shard.label)  # nothing to evaluate: the shard is complete as it is
            elif not _shard_complete(store, shard, manifests):
                todo.append((shard, shard_units, done.get(j, empty)))
        report.n_dispatched = len(todo)
        pool = ActorPool(actors)
        for shard, shard_units, shard_done in todo:
            pool.submit(lambda a, v: a.run.remote(v[0], v[1], v[2], store.key_columns, v[3]),
                        (task, shard_units, shard, shard_done))
        from tqdm.auto import tqdm

        with tqdm(total=len(todo), desc=f"{name} on {workers} Ray workers", unit="task",
                  disable=not progress) as bar:
            while pool.has_next():
                try:
                    res = pool.get_next_unordered()
                except ray.exceptions.RayError as e:
                    # a task's own error, or a worker that died more than max_restarts times
                    raise RuntimeError(f"a Ray task failed ({type(e).__name__}: {e}); the rows of the finished "
                                       f"tasks are in {store.root}: fix the cause and rerun to resume") from e
                for label, keys in res["declared"]:
                    store.declare(keys, label)
                n = store.append(res["rows"]) if len(res["rows"]) else 0
                store.add_skipped_rows(res["skipped_rows"])
                for (key, entry), value in res["pinned"].items():
                    store.pin_run_info(key, value, entry)
                report.n_rows += n
                report.rows_by_worker[res["pid"]] = report.rows_by_worker.get(res["pid"], 0) + len(res["rows"])
                bar.update(1)
        report.seconds = time.perf_counter() - t0
        for a in actors:
            ray.kill(a)
        return report
    finally:
        if started:
            ray.shutdown()
