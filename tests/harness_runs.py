"""The committed real runs of the sample-log harnesses (``tests/data/<harness>_run`` for study 1,
``tests/data/<harness>_promptception`` for study 2: the export, the run's logs and mmfragile's own rows and store
config on the same prompts; each folder's README says how it was made), and how their tests compare rows."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from mmfragile.harness import lm_eval, lmms_eval
from mmfragile.store import ResultStore

DATA = Path(__file__).parent / "data"
KEY = ["model", "dataset", "question_id", "variant"]


@dataclass(frozen=True)
class RecordedRun:
    """A committed real run of one harness and where its files are."""
    harness: str
    root: Path
    importer: Callable[..., ResultStore]
    task_of: Callable[[Path], str]  # a sample log's task, from its file name
    model: str
    rows: int  # requests logged, each a row of the store
    log_glob: str  # the sample log the tests edit
    data_file: str  # that log's task's exported data file
    results_glob: str

    def import_(self, run: Path, tmp_path: Path) -> ResultStore:
        return self.importer([run], tmp_path / "store", export=self.root / "export")

    def copy_run(self, tmp_path: Path) -> Path:
        shutil.copytree(self.root / "run", tmp_path / "run")
        return tmp_path / "run"

    def one_log(self, run: Path) -> Path:
        return sorted(run.rglob(self.log_glob))[0]

    def edit_third_line(self, tmp_path: Path, edit: Callable[[dict], dict]) -> tuple[Path, Path]:
        """A copy of the run whose :meth:`one_log` has ``edit`` applied to its third sample line; (run, log)."""
        run = self.copy_run(tmp_path)
        log = self.one_log(run)
        lines = log.read_text().splitlines()
        lines[2] = json.dumps(edit(json.loads(lines[2])))
        log.write_text("\n".join(lines) + "\n")
        return run, log

    def point_results_at(self, run: Path, export: Path) -> None:
        """Rewrite results.json's data-file paths (the recording machine's /tmp) to ``export/data``."""
        res = next(run.rglob(self.results_glob))
        doc = json.loads(res.read_text())
        for cfg in doc["configs"].values():
            test = Path(cfg["dataset_kwargs"]["data_files"]["test"])
            cfg["dataset_kwargs"]["data_files"]["test"] = str(export / "data" / test.name)
        res.write_text(json.dumps(doc))


LM_EVAL_GROUP = "mmfragile_format_bias_synthetic_text"
RUNS = [
    RecordedRun("lmms-eval", DATA / "lmms_eval_run", lmms_eval.import_lmms_eval, lmms_eval.task_of,
                "zoo-gemma3-good", 16, "*_samples_*standard.jsonl", "mmfragile_format_bias_easy_vqa_standard.jsonl",
                "*_results.json"),
    RecordedRun("lmms-eval", DATA / "lmms_eval_promptception", lmms_eval.import_lmms_eval, lmms_eval.task_of,
                "zoo-gemma3-good", 12, "*_samples_*_1_1_t24.jsonl", "mmfragile_promptception_easy_vqa_1_1_t24.jsonl",
                "*_results.json"),
    RecordedRun("lm-eval", DATA / "lm_eval_run", lm_eval.import_lm_eval, lm_eval.task_of, "zoo-smollm2-good", 16,
                f"samples_{LM_EVAL_GROUP}_uppercase_dot_line_break_*.jsonl",
                f"{LM_EVAL_GROUP}_uppercase_dot_line_break.jsonl", "results_*.json"),
    RecordedRun("lm-eval", DATA / "lm_eval_promptception", lm_eval.import_lm_eval, lm_eval.task_of, "smollm2", 12,
                "samples_*_1_1_t24_*.jsonl", "mmfragile_promptception_synthetic_text_1_1_t24.jsonl", "results_*.json"),
]
harnesses = pytest.mark.parametrize("rec", RUNS, ids=[f"{r.harness}:{r.root.name}" for r in RUNS])


def native_rows(rec: RecordedRun) -> pd.DataFrame:
    return pd.DataFrame(json.loads((rec.root / "native_rows.json").read_text()))


def cells(col: pd.Series) -> list:
    return [list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in col.tolist()]


def by_key(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(KEY).reset_index(drop=True)
