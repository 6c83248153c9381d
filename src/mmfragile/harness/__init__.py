"""Bridges to other evaluation harnesses: export a study's grid as their tasks, import their logs as result stores
(docs/harnesses.md). One record per harness in :data:`BRIDGES`; the CLI's ``export`` / ``import`` commands are
built from it. A bridge module ``mmfragile.harness.<module>`` defines ``STUDIES`` (the studies it can run),
``export_<module>(study, model, dataset, out, n=None, **params) -> manifest``, ``run_hint(manifest, out) -> str``
(the command that runs the export) and ``import_<module>(runs, out, export=None, model=None) -> ResultStore``."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Bridge:
    """One harness: its CLI name, its bridge module, what its export is and what its import reads."""

    name: str
    module: str
    exports: str           # "an lmms-eval task group"
    reads: str             # what import reads, for --help
    runs_metavar: str      # what import takes: RUN_DIR, PRED_FILE
    runs_help: str
    default_dataset: str = "easy-vqa"

    def load(self) -> ModuleType:
        return importlib.import_module(f"mmfragile.harness.{self.module}")

    def export(self, *args, **kwargs) -> dict:
        return getattr(self.load(), f"export_{self.module}")(*args, **kwargs)

    def import_runs(self, *args, **kwargs):
        return getattr(self.load(), f"import_{self.module}")(*args, **kwargs)


BRIDGES: dict[str, Bridge] = {b.name: b for b in (
    Bridge("lmms-eval", "lmms_eval", "an lmms-eval task group",
           "lmms-eval's results.json and *_samples_*.jsonl (joined to the exported data files on doc_id)",
           "RUN_DIR", "lmms-eval --output_path folders (or sample files)"),
    Bridge("lm-eval", "lm_eval", "an lm-evaluation-harness task group of text-only questions",
           "lm-eval's results_*.json and samples_*.jsonl (joined to the exported data files on doc_id)",
           "RUN_DIR", "lm_eval --output_path folders (or sample files)", default_dataset="synthetic-text"),
    Bridge("vlmevalkit", "vlmevalkit", "VLMEvalKit custom VQA datasets (TSV, the rendered prompt as the question)",
           "VLMEvalKit's prediction files (<model>_<dataset>.xlsx/.tsv/.csv/.json, column `prediction`, joined to "
           "the exported rows on `index`)", "PRED_FILE",
           "prediction files (or VLMEvalKit --work-dir folders holding them)"),
)}
