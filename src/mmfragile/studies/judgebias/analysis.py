"""Study 3 (MM-JudgeBias) - the read side: stored rows -> the tables of :mod:`mmfragile.studies.judgebias.metrics`
(:func:`judgment_table`, :func:`position_table`, :func:`verbosity_table`, :func:`selfgen_table`,
:func:`parse_failure_table`). The run side (conditions, pairs, scoring, store config) is
:mod:`mmfragile.studies.judgebias.items`."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from mmfragile.store import ResultStore
from mmfragile.studies.judgebias.items import SELFGEN_DATASET_SUFFIX
from mmfragile.studies.judgebias.metrics import AGGREGATE_COLUMNS, PERTURBATIONS, bias_scores
from mmfragile.studies.judgebias.perturbations import UNPERTURBED

__all__ = ["main_rows", "selfgen_rows", "judgment_table", "bias_table", "position_table", "verbosity_table",
           "selfgen_table", "parse_failure_table", "read_run", "prompt_variants", "setting_table",
           "PROMPT_VARIANT_ORDER"]

#: the score-prompt variants in the paper's order (Tables 14/16); others follow, sorted
PROMPT_VARIANT_ORDER = ("original", "score_guide", "constraints", "reasoning", "na")


def _rows(rows: pd.DataFrame | ResultStore) -> pd.DataFrame:
    return rows.read() if isinstance(rows, ResultStore) else rows


def _split_selfgen(rows: pd.DataFrame | ResultStore, selfgen: bool) -> pd.DataFrame:
    d = _rows(rows)
    if d.empty:
        return d
    return d[d["dataset"].astype(str).str.endswith(SELFGEN_DATASET_SUFFIX) == selfgen]


def main_rows(rows: pd.DataFrame | ResultStore) -> pd.DataFrame:
    """The main-study score rows: every dataset (the synthetic set or the MM-JudgeBias release) except the
    self-enhancement ones (``<dataset>-selfgen``)."""
    return _split_selfgen(rows, selfgen=False)


def selfgen_rows(rows: pd.DataFrame | ResultStore) -> pd.DataFrame:
    """The self-enhancement score rows (``<dataset>-selfgen``): the judge's scores of the generators' responses."""
    return _split_selfgen(rows, selfgen=True)


def judgment_table(rows: pd.DataFrame | ResultStore, prompt_variant: str | None = "original", *,
                   dataset: str | None = "main", label_variant: bool = False) -> pd.DataFrame:
    """Stored score rows -> the judgment table of :mod:`mmfragile.studies.judgebias.metrics` (``judge, sample_id,
    perturbation, run, score, status`` + ``prompt_variant, generator, kind, modality, gold_score``).

    ``prompt_variant`` filters one prompt variant (None: all - then use ``label_variant=True``, which makes
    ``judge`` = ``"<judge> [<variant>]"``, so the variants do not collide). ``dataset`` filters the main
    judgments: ``"main"`` (default) every dataset but the self-enhancement ones (:func:`main_rows`), a
    name that dataset only, None all datasets (e.g. with the self-enhancement rows)."""
    d = _rows(rows)
    if d.empty:
        return pd.DataFrame(columns=["judge", "sample_id", "perturbation", "run", "score", "status"])
    if "experiment" in d.columns:
        d = d[d["experiment"].isna()]
    if prompt_variant is not None:
        d = d[d["prompt_variant"] == prompt_variant]
    if dataset == "main":
        d = main_rows(d)
    elif dataset is not None:
        d = d[d["dataset"] == dataset]
    d = d.copy()
    if label_variant:
        d["judge"] = d["judge"] + " [" + d["prompt_variant"] + "]"
    cols = ["judge", "sample_id", "perturbation", "run", "score", "status", "prompt_variant", "generator", "kind",
            "modality", "gold_score", "parse_error"]
    d["run"] = d["run"].astype(int)
    return d[cols].reset_index(drop=True)


def bias_table(rows: pd.DataFrame | ResultStore, prompt_variant: str = "original") -> pd.DataFrame:
    """BD / BC per judge and perturbation of the main score rows of ``prompt_variant``
    (:func:`~mmfragile.studies.judgebias.metrics.bias_scores`: ``value``, ``n_pairs``, ``n_unparseable`` ...); empty
    without unbiased judgments to compare with."""
    d = judgment_table(rows, prompt_variant)
    if d.empty or not (d["perturbation"] == UNPERTURBED).any():
        return pd.DataFrame()
    return bias_scores(d)


def selfgen_table(rows: pd.DataFrame | ResultStore, prompt_variant: str = "original") -> pd.DataFrame:
    """The self-enhancement judgments (datasets ending in ``-selfgen``) with their ``generator`` column,
    for :func:`~mmfragile.studies.judgebias.metrics.self_enhancement` / ``score_by_generator``."""
    d = judgment_table(rows, prompt_variant, dataset=None)
    if d.empty:
        return d
    full = _rows(rows)
    sg = set(full.loc[full["dataset"].astype(str).str.endswith(SELFGEN_DATASET_SUFFIX), "question_id"])
    return d[d["sample_id"].isin(sg)].reset_index(drop=True)


def _pair_rows(rows: pd.DataFrame | ResultStore, experiment: str) -> pd.DataFrame:
    d = _rows(rows)
    if d.empty or "experiment" not in d.columns:
        return pd.DataFrame(columns=["judge", "sample_id", "run", "choice", "status"])
    d = d[d["experiment"] == experiment].copy()
    d["choice"] = d["choice"].where(d["status"] == "ok", None)
    d["run"] = d["run"].astype(int)
    return d


def position_table(rows: pd.DataFrame | ResultStore) -> pd.DataFrame:
    """Position-bias rows (``judge, sample_id, run, swapped, choice``) for
    :func:`~mmfragile.studies.judgebias.metrics.position_consistency`."""
    d = _pair_rows(rows, "position")
    return d.reindex(columns=["judge", "sample_id", "run", "swapped", "choice", "status"]).reset_index(drop=True)


def verbosity_table(rows: pd.DataFrame | ResultStore) -> pd.DataFrame:
    """Verbosity rows for :func:`~mmfragile.studies.judgebias.metrics.verbosity_robustness`. The metric takes one
    judgment per (sample, verbose position); with several runs each run is its own pseudo-sample
    (``sample_id = "<id>|run<r>"``), so ``both_orders_original`` is per (sample, run)."""
    d = _pair_rows(rows, "verbosity")
    d = d.reindex(columns=["judge", "sample_id", "run", "verbose_position", "choice", "status"])
    d["sample_id"] = d["sample_id"].astype(str) + "|run" + d["run"].astype(str)
    return d.reset_index(drop=True)


def parse_failure_table(rows: pd.DataFrame | ResultStore, by: Sequence[str] = ("judge", "perturbation")) -> pd.DataFrame:
    """Share of unparseable judge outputs per group (score rows by perturbation; pairwise rows by
    experiment when ``by`` names it), with counts and the most frequent parse-error reasons."""
    d = _rows(rows)
    if d.empty:
        return pd.DataFrame()
    by = [b for b in by if b in d.columns]
    d = d.dropna(subset=by)
    g = d.groupby(list(by), sort=False)
    out = g.agg(n=("status", "size"), n_unparseable=("status", lambda s: int((s == "unparseable").sum())),
                n_abstained=("status", lambda s: int((s == "na").sum())))
    out["parse_failure_rate"] = out["n_unparseable"] / out["n"]
    reasons = g["parse_error"].agg(lambda s: "; ".join(f"{k} ({v})" for k, v in
                                                      s[s.astype(bool)].value_counts().head(2).items()))
    out["top_reasons"] = reasons
    return out.reset_index()


def read_run(folder: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The score and pairwise rows of a judge study's results folder (``50_judgebias_run``'s ``results_dir``);
    a folder with no score rows raises FileNotFoundError, naming it and the notebook that writes it."""
    from mmfragile.study import get_study

    study = get_study("judge")   # through the registry: the study module imports this one
    if not (Path(folder) / "scores").is_dir():
        raise FileNotFoundError(f"{str(folder)!r} is neither 'published' nor a results folder of "
                                "50_judgebias_run.ipynb")
    rows, pairs = (study.stage_store(folder, stage).read() for stage in ("scores", "pairwise"))
    if rows.empty:
        raise FileNotFoundError(f"no score rows under {folder}/scores - run 50_judgebias_run.ipynb first")
    return rows, pairs


def prompt_variants(rows: pd.DataFrame) -> list[str]:
    """The score-prompt variants the rows hold, in :data:`PROMPT_VARIANT_ORDER` (then the others, sorted)."""
    held = set(rows["prompt_variant"])
    return [v for v in PROMPT_VARIANT_ORDER if v in held] + sorted(held - set(PROMPT_VARIANT_ORDER))


def setting_table(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Table 2 of each prompt variant (variant -> judge x column table) as the long table the setting comparison
    draws (``judge, setting, column, value``: every bias type and aggregate)."""
    columns = [*PERTURBATIONS, *AGGREGATE_COLUMNS]
    return pd.DataFrame([{"judge": judge, "setting": variant, "column": c, "value": r[c]}
                         for variant, t in tables.items() for judge, r in t.iterrows()
                         for c in columns if c in r.index])
