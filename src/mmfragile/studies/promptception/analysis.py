"""Study 2 (Promptception) - the read side: stores -> per-question frames (stage-2 extractions joined in) ->
accuracy per model x benchmark x prompt (:func:`accuracy_frame`) and the CLI's summary. The run side (items,
scoring, store config) is :mod:`mmfragile.studies.promptception.items`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mmfragile.models.spec import figure_note_for  # noqa: F401  (re-exported)
from mmfragile.errors import DataError
from mmfragile.store import find_stores
from mmfragile.studies.promptception.extraction import read_answers

__all__ = ["load_results", "accuracy_frame", "load_accuracy", "split_zero_baselines", "figure_note_for", "summarize_run", "with_benchmark", "read_answers"]


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """Every Promptception store under ``results_dir`` (any depth) as one per-question frame (stage-2 extractions
    joined in, :func:`~mmfragile.studies.promptception.extraction.read_answers`), with the store's
    ``exclude_refusals`` policy and folder added as columns. Empty frame if none."""
    root = Path(results_dir)
    if not root.exists():
        raise DataError(f"{root}: results folder not found")
    frames = []
    for store in find_stores(root, "promptception", "prompts"):
        df = read_answers(store)
        if df.empty:
            continue
        df = df.assign(exclude_refusals=bool(store.config.get("exclude_refusals", False)), store=str(store.root))
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def with_benchmark(per_question: pd.DataFrame, benchmark_by: str = "modality") -> pd.DataFrame:
    """Store rows with a ``benchmark`` column: ``benchmark_by="modality"`` splits a dataset that mixes modalities
    into ``"<dataset>[<modality>]"``, ``"dataset"`` keeps one benchmark per dataset (see :func:`accuracy_frame`)."""
    df = per_question.copy()
    if benchmark_by == "modality":
        n_mod = df.groupby("dataset").modality.transform("nunique")
        df["benchmark"] = np.where(n_mod > 1, df.dataset + "[" + df.modality + "]", df.dataset)
    elif benchmark_by == "dataset":
        df["benchmark"] = df.dataset
    else:
        raise ValueError(f"benchmark_by must be 'modality' or 'dataset', not {benchmark_by!r}")
    return df


def accuracy_frame(per_question: pd.DataFrame, benchmark_by: str = "modality") -> pd.DataFrame:
    """Accuracy per (benchmark, model, prompt_id) from store rows, via
    :func:`mmfragile.studies.promptception.metrics.prompt_accuracy` (unresolved answers incorrect; refusals left out
    only for stores run with ``exclude_refusals``).

    ``benchmark_by="modality"`` splits a dataset that mixes modalities into one benchmark per modality,
    ``"<dataset>[<modality>]"`` - the paper's benchmarks are single-modality (MMStar image, MVBench video),
    so each gets its own prompt set (59 / 61) and baseline; ``"dataset"`` keeps one benchmark per dataset.
    """
    from mmfragile.studies.promptception.metrics import prompt_accuracy

    if per_question.empty:
        raise DataError("accuracy_frame: no result rows")
    df = with_benchmark(per_question, benchmark_by)
    if "exclude_refusals" not in df.columns:
        df["exclude_refusals"] = False
    parts = [prompt_accuracy(g, exclude_refusals=bool(excl)) for excl, g in df.groupby("exclude_refusals")]
    return pd.concat(parts, ignore_index=True)


def load_accuracy(source: str | Path, benchmark_by: str = "modality") -> pd.DataFrame:
    """``"published"`` -> the paper's Tables 6-8; otherwise a results folder -> :func:`accuracy_frame`."""
    from mmfragile.studies.promptception.metrics import load_published_accuracy

    if str(source) == "published":
        return load_published_accuracy()
    rows = load_results(source)
    if rows.empty:
        raise DataError(f"{source}: no Promptception result stores (config.json + parts/) found")
    return accuracy_frame(rows, benchmark_by=benchmark_by)


def split_zero_baselines(acc: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows usable for PRA / PRAD, the (benchmark, model) baselines that are 0 or missing).

    PRA (Eq. 2) divides by the baseline accuracy, which is undefined at 0 - possible on the few-question
    embedded runs, never in the paper; such (benchmark, model) pairs are left out of the relative analyses."""
    from mmfragile.studies.promptception.metrics import baseline_accuracy

    base = baseline_accuracy(acc)
    bad = base[~(base.baseline > 0)]
    key = set(zip(bad.benchmark, bad.model))
    keep = [(b, m) not in key for b, m in zip(acc.benchmark, acc.model)]
    return acc[np.asarray(keep, dtype=bool)].reset_index(drop=True), bad.reset_index(drop=True)




def summarize_run(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Tables printed after a run: ``per_prompt`` (accuracy %, n, unresolved and refusals per prompt),
    ``stages`` (extraction-stage counts per modality) and ``per_modality`` (accuracy per modality)."""
    from mmfragile.studies.promptception.metrics import prompt_sort_key

    df = rows.copy()
    df["unresolved"] = ~df.covered.astype(bool)
    per_prompt = df.groupby("prompt_id").agg(accuracy=("correct", "mean"), n=("correct", "size"),
                                             unresolved=("unresolved", "sum"), refusals=("refusal", "sum"),
                                             stage2=("extraction_stage", lambda s: int((s == "model").sum())))
    per_prompt["accuracy"] *= 100
    per_prompt = per_prompt.iloc[sorted(range(len(per_prompt)), key=lambda i: prompt_sort_key(per_prompt.index[i]))]
    stages = df.groupby([df.modality.astype(str), df.extraction_stage.astype(str)]).size().unstack(fill_value=0)
    stages.loc["all"] = stages.sum()
    per_modality = df.groupby("modality").agg(accuracy=("correct", "mean"), n=("correct", "size"),
                                              questions=("question_id", "nunique"), refusals=("refusal", "sum"))
    per_modality["accuracy"] *= 100
    return {"per_prompt": per_prompt.reset_index(), "stages": stages, "per_modality": per_modality.reset_index()}
