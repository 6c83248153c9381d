"""Benchmark of the result store at the papers' scale: write, resume scan, read and compaction on synthetic rows
shaped like the format-bias grid (one row per question x format x circular shift, 19 columns including the
option-ID list and the option logits).

    python scripts/benchmark_store.py                      # 7 M rows (28,000 questions x 49 formats x 5 shifts)
    python scripts/benchmark_store.py --questions 2000     # a quick run (0.5 M rows)

Writes through ResultStore.append in parts of --flush rows (the CLI's default flush is 256) with the automatic
tiered compaction on, as a long run would; then, with a fresh handle each: the resume scan (the stored keys, and
the vectorised pending mask over every item of the run), read() of the whole table and of three columns, the
completeness check against the manifest, and a full compaction. Prints one table (seconds, rows/s, peak memory).
"""
from __future__ import annotations

import argparse
import gc
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from mmfragile.store import ResultStore  # noqa: E402

KEY = ["model", "dataset", "question_id", "variant"]
N_FORMATS, N_SHIFTS = 49, 5


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def batch(q0: int, q1: int, rng: np.random.Generator) -> pd.DataFrame:
    """Rows of questions q0..q1-1: every format x shift."""
    nq = q1 - q0
    n = nq * N_FORMATS * N_SHIFTS
    q = np.repeat(np.arange(q0, q1), N_FORMATS * N_SHIFTS)
    f = np.tile(np.repeat(np.arange(N_FORMATS), N_SHIFTS), nq)
    s = np.tile(np.arange(N_SHIFTS), nq * N_FORMATS)
    fmt = np.array([f"fmt{i:02d}" for i in range(N_FORMATS)], dtype=object)[f]
    ids = [["A", "B", "C", "D", "E"]] * n
    sel = rng.integers(-1, 5, n)
    return pd.DataFrame({
        "model": "model-7b", "dataset": "bench", "question_id": np.char.add("q", q.astype(str)).astype(object),
        "variant": fmt + np.char.add("|s", s.astype(str)).astype(object), "format": fmt,
        "option_id_set": "uppercase", "delimiter": "dot", "separator": "line_break", "shift": s, "n_options": 5,
        "category": "perception", "modality": "image",
        "raw_output": np.where(sel >= 0, np.array(["A", "B", "C", "D", "E"], dtype=object)[sel % 5], "I think"),
        "option_ids": ids, "answer_id": "C", "covered": sel >= 0, "correct": sel == 2, "selected_position": sel,
        "option_logits": list(rng.normal(size=(n, 5))),
    })


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=28_000, help="questions (x 245 rows each)")
    ap.add_argument("--flush", type=int, default=256 * 4, help="rows per appended part")
    ap.add_argument("--dir", default=None, help="where to build the store (default: a temporary folder, removed)")
    ap.add_argument("--reuse", action="store_true", help="with --dir: measure the store already there (no write)")
    a = ap.parse_args()
    root = Path(a.dir or tempfile.mkdtemp(prefix="mmfragile-bench-")) / "store"
    if root.exists() and not a.reuse:
        shutil.rmtree(root)
    per_q = N_FORMATS * N_SHIFTS
    n_rows = a.questions * per_q
    rng = np.random.default_rng(0)
    results = []

    def record(step, seconds, rows=None, note=""):
        results.append({"step": step, "seconds": round(seconds, 2),
                        "rows/s": f"{rows / seconds:,.0f}" if rows and seconds > 0 else "",
                        "RSS MB": round(rss_mb()), "peak MB": round(peak_mb()), "note": note})
        print(results[-1], flush=True)

    if a.reuse and root.exists():
        keys = ResultStore(root).expected_keys()
        n_rows = len(keys)
    else:
        st = ResultStore(root, config={"study": "benchmark"})
        q_per_batch = max(1, a.flush // per_q)
        t0 = time.perf_counter()
        all_keys = []
        for q0 in range(0, a.questions, q_per_batch * 64):
            chunk = batch(q0, min(a.questions, q0 + q_per_batch * 64), rng)
            all_keys.append(chunk[KEY])
            for s in range(0, len(chunk), q_per_batch * per_q):
                st.append(chunk.iloc[s:s + q_per_batch * per_q])
        keys = pd.concat(all_keys, ignore_index=True)
        st.declare(keys)
        disk = sum(p.stat().st_size for p in (root / "parts").glob("*.parquet")) / 2**20
        record("write (append + tiered compaction)", time.perf_counter() - t0, n_rows,
               f"{n_rows:,} rows in parts of {q_per_batch * per_q}; {len(_parts(root))} parts after compaction, "
               f"{disk:,.0f} MiB")
        del st
        gc.collect()
    print(f"measuring {len(_parts(root))} parts", flush=True)

    t0 = time.perf_counter()
    st = ResultStore(root)
    n = len(st)
    record("resume scan: stored keys", time.perf_counter() - t0, n, f"{n:,} keys")
    t0 = time.perf_counter()
    todo = st.pending(keys)
    record("resume scan: pending mask of every item", time.perf_counter() - t0, len(keys),
           f"{int(todo.sum())} pending")
    del st, todo
    gc.collect()

    t0 = time.perf_counter()
    df = ResultStore(root).read()
    record("read() whole table", time.perf_counter() - t0, len(df), f"{len(df):,} rows x {df.shape[1]} columns")
    del df
    gc.collect()
    t0 = time.perf_counter()
    df = ResultStore(root).read(columns=["format", "correct", "covered"])
    record("read(columns=[format, correct, covered])", time.perf_counter() - t0, len(df))
    del df
    gc.collect()

    t0 = time.perf_counter()
    rep = ResultStore(root).check()
    record("check() against the manifest", time.perf_counter() - t0, rep.n_stored,
           "complete" if rep.complete else "INCOMPLETE")
    t0 = time.perf_counter()
    merged = ResultStore(root).compact(full=True)
    record("compact(full=True)", time.perf_counter() - t0, n_rows,
           f"{merged} parts merged away, {len(_parts(root))} left")
    t0 = time.perf_counter()
    df = ResultStore(root).read()
    record("read() whole table after compaction", time.perf_counter() - t0, len(df))
    assert len(df) == n_rows and not df.duplicated(KEY).any()
    print()
    print(pd.DataFrame(results).to_markdown(index=False) if _has_tabulate() else pd.DataFrame(results).to_string())
    if not a.dir:
        shutil.rmtree(root.parent)
    return 0


def _parts(root: Path) -> list[Path]:
    return list((root / "parts").glob("part-*.parquet"))


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())
