"""Study 1 (prompt-format bias in MC-VQA), the read side: read the grid and CP-LN result stores back in the shape
:mod:`mmfragile.studies.format_bias.metrics` expects, and compare the mitigation methods as in Tab. 7. The run side
(:mod:`~mmfragile.studies.format_bias.study`, :mod:`~mmfragile.studies.format_bias.items`) writes them: the study's
``folder`` and each stage's store say where, ``run_config`` under which config.

Paper: "Unexplored Flaws in Multiple-Choice VQA Evaluations" (seed ``format-bias-mcvqa``), Sec. 4-5, A.2-A.4,
B.3, C. The notebooks ``30_format_bias_run`` (runs) and ``31``-``34`` (one per results section) are thin
wrappers around this module.

Stores (each a resumable :class:`~mmfragile.store.ResultStore`):

* ``<results_dir>/<model>/<dataset>`` - the 48-format x circular-shift grid plus the dataset's standard format
  (variant ``standard|s<k>``), the ``grid`` stage; config ``{"model", "dataset", "n", "formats"}`` and the tag
  ``{"study": "format-bias", "stage": "grid"}`` - the CLI and the notebooks both run :func:`mmfragile.study.run_study`,
  so a CLI run and a notebook run resume each other.
* ``<results_dir>/<model>/<dataset>/cp_ln`` - CP-LN log-likelihoods (the ``cp_ln`` stage), one row per question x
  option (``variant`` = option index); tag stage ``cp_ln``.

Column adapter (:func:`results_to_metrics_frame`): ``run_items`` stores ``option_ids`` = the option IDs shown
(``["A", "B", "C"]``) and ``option_id_set`` = the ID-set level (``uppercase``); the metrics module calls the
level ``option_ids`` (Tab. 1 factor name, shared with :mod:`mmfragile.studies.format_bias.prompts`). The adapter renames
``option_ids -> option_labels`` and ``option_id_set -> option_ids``, adds ``answer_position`` (shown position
of the correct option), ``answer_logit`` (the engine's logit of the correct option ID, Sec. 5.3) and
``is_standard``, and by default drops the ``standard`` rows: the standard format is also one of the 48 grid
formats, so keeping both would count it twice in every per-format aggregate.

Mitigation inputs (Sec. 4.3, B.3; Tab. 7):

* pseudo GT - mean accuracy over the 48 formats (:func:`mmfragile.studies.format_bias.metrics.pseudo_gt`);
* vanilla - accuracy in the dataset's standard format (Tab. 5) under circular evaluation. This reproduces
  Tab. 7's vanilla column from the standard-format cells of Tabs. 8-12 (A-OKVQA: 5 of 7 models, e.g. Gemma-3
  78.079 -> 78.08; HRBench-4K: 5 of 7), although Tab. 7 prints N (not N x O) as its complexity;
* PIA - Eq. 7 on the N x O standard-format rows (selected / correct *position*), N = distinct questions
  (the default reading of :func:`mmfragile.studies.format_bias.mitigation.pia`);
* PriDe - Eq. 8 on the standard format's option-ID logits (``option_logits``, stored by the engine path):
  the prior is estimated from all O circular shifts of the calibration questions, the test prediction uses
  the unshifted prompt (shift 0, complexity N as in Tab. 7). The paper calibrates on V*Bench's 4-option
  questions; here the default calibration set is the evaluated questions themselves (in-set calibration as in
  Zheng et al.'s PriDe), or pass ``calibration=`` (a metrics frame of other questions);
* CP-LN - Eq. 9-10 on :meth:`MLLM.loglikelihood` of each option text after the cloze prompt
  (:func:`mmfragile.studies.format_bias.prompts.build_cloze_prompt`: the question alone, images included), normalised by
  the option's token count.

PIA and PriDe refuse datasets whose questions have different option counts (their ``ValueError`` names the
dataset); :func:`mitigation_scores` re-raises by default, ``on_mixed="na"`` records them as NA (as Tab. 7 does
for V*Bench), and :func:`subset_option_count` restricts every input to one option count.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from mmfragile.models.spec import figure_note_for
from mmfragile.paths import safe_name
from mmfragile.errors import DataError
from mmfragile.store import find_stores
from mmfragile.studies.format_bias import metrics as fb
from mmfragile.studies.format_bias import mitigation as mit
from mmfragile.studies.format_bias.items import STUDY_NAME
from mmfragile.studies.format_bias.prompts import PromptFormat, standard_format as prompt_standard_format

__all__ = [
    "METHOD_ORDER", "safe_name", "load_runs", "load_cp_ln", "results_to_metrics_frame", "grid_rows",
    "standard_rows", "reference_formats", "StudyData", "load_study", "default_figures_dir", "figure_note_for", "per_format_table",
    "answer_confidence_bins", "fit_lmm_with_fallback", "most_common_option_count", "subset_option_count",
    "mitigation_inputs", "pseudo_gt_scores", "vanilla_scores", "pia_scores", "pride_scores", "cp_ln_scores",
    "cp_ln_predictions", "mitigation_scores", "MitigationComparison", "compare_mitigation", "table7_layout",
]

#: Column order of Tab. 7.
METHOD_ORDER = ["pseudo_gt", "vanilla", "pia", "pride", "cp_ln"]

_RUN_COLUMNS = ["model", "dataset", "question_id", "variant", "format", "option_id_set", "delimiter", "separator",
                "shift", "option_ids", "answer_id", "covered", "correct", "selected_position"]


# ================================================================================================ reading
def load_runs(results_dir: str | Path, stage: str = "grid") -> pd.DataFrame:
    """All stores of the study's ``stage`` (``grid``, ``cp_ln``) under ``results_dir`` (any depth) as one
    per-question frame (raw run columns), by their tags (:func:`mmfragile.store.store_tag`). Raises
    FileNotFoundError naming the folder if there is none."""
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such results folder")
    frames = []
    for st in find_stores(root, STUDY_NAME, stage):
        df = st.read()
        if len(df):
            frames.append(df)
    if not frames:
        raise FileNotFoundError(f"{root}: no {STUDY_NAME}/{stage} result stores with rows under this folder")
    df = pd.concat(frames, ignore_index=True)
    key = ["model", "dataset", "question_id", "variant"]
    return df[~df[key].astype(str).duplicated(keep="first")].reset_index(drop=True)


def load_cp_ln(results_dir: str | Path) -> pd.DataFrame:
    """All CP-LN stores under ``results_dir``; an empty frame if there is none."""
    try:
        return load_runs(results_dir, stage="cp_ln")
    except FileNotFoundError:
        return pd.DataFrame(columns=["model", "dataset", "question_id", "variant", "option", "logprob", "n_tokens",
                                     "answer", "n_options"])


def _as_list(v: Any) -> list | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return list(v)


def results_to_metrics_frame(df: pd.DataFrame, include_standard: bool = False) -> pd.DataFrame:
    """Per-question rows of :func:`~mmfragile.runner.run_items` -> the input of :mod:`metrics.formatbias`.

    Renames ``option_ids`` (IDs shown) -> ``option_labels`` and ``option_id_set`` (level) -> ``option_ids``;
    adds ``answer_position`` (0-based shown position of the correct ID), ``answer_logit`` (logit of the correct
    ID from ``option_logits``; NaN on the naive ``generate`` path), ``is_standard``; casts ``correct``,
    ``covered`` to bool and ``shift``, ``selected_position``, ``n_options`` to int. Rows of the ``standard``
    variant are dropped unless ``include_standard`` (they duplicate one of the 48 grid formats). Idempotent.
    """
    if "option_labels" in df.columns:  # already adapted
        out = df.copy()
        return out if include_standard or "is_standard" not in out else out[~out["is_standard"]].reset_index(drop=True)
    missing = [c for c in _RUN_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"results_to_metrics_frame: run rows lack column(s) {missing}; have {list(df.columns)}")
    out = df.rename(columns={"option_ids": "option_labels", "option_id_set": "option_ids"}).copy()
    out["option_labels"] = [[str(x) for x in _as_list(v) or []] for v in out["option_labels"]]
    pos = []
    for i, (labels, ans) in enumerate(zip(out["option_labels"], out["answer_id"])):
        if str(ans) not in labels:
            raise DataError(f"results_to_metrics_frame: row {i} (question_id={out['question_id'].iloc[i]!r}, "
                            f"variant={out['variant'].iloc[i]!r}): answer_id {ans!r} is not among {labels}")
        pos.append(labels.index(str(ans)))
    out["answer_position"] = pos
    if "n_options" not in out.columns:
        out["n_options"] = [len(l) for l in out["option_labels"]]
    logits = out["option_logits"] if "option_logits" in out.columns else [None] * len(out)
    out["answer_logit"] = [float(_as_list(lg)[p]) if _as_list(lg) is not None else np.nan
                           for lg, p in zip(logits, pos)]
    out["is_standard"] = out["format"].astype(str).eq("standard")
    out["correct"] = out["correct"].astype(bool)
    out["covered"] = out["covered"].astype(bool)
    for c in ("shift", "selected_position", "n_options"):
        out[c] = out[c].astype(int)
    if not include_standard:
        out = out[~out["is_standard"]]
    return out.reset_index(drop=True)


def grid_rows(pq: pd.DataFrame) -> pd.DataFrame:
    """The 48-format rows of an adapted frame (standard rows removed)."""
    return pq[~pq["is_standard"]] if "is_standard" in pq.columns else pq


def _fallback_standard(dataset: str) -> tuple[str, str, str]:
    f = prompt_standard_format(dataset, default=PromptFormat())
    return (f.option_ids, f.delimiter, f.separator)


def standard_rows(pq: pd.DataFrame) -> pd.DataFrame:
    """Rows of the reference ("vanilla") prompt format per model x dataset: the ``standard`` variant if it was
    run, else the grid rows in the dataset's standard format (Tab. 5; uppercase/dot/line break if unknown)."""
    parts = []
    for (model, ds), g in pq.groupby(["model", "dataset"], sort=False):
        if "is_standard" in g.columns and g["is_standard"].any():
            parts.append(g[g["is_standard"]])
            continue
        ref = _fallback_standard(ds)
        m = np.ones(len(g), dtype=bool)
        for c, v in zip(fb.FORMAT_COLS, ref):
            m &= (g[c] == v).to_numpy()
        parts.append(g[m])
    return pd.concat(parts, ignore_index=True) if parts else pq.iloc[:0]


def reference_formats(pq: pd.DataFrame) -> dict[str, tuple[str, str, str]]:
    """Dataset -> its reference format ``(option_ids, delimiter, separator)`` as it was run."""
    st = standard_rows(pq)
    out = {}
    for ds, g in st.groupby("dataset", sort=False):
        out[str(ds)] = tuple(str(g[c].iloc[0]) for c in fb.FORMAT_COLS)
    for ds in pq["dataset"].unique():
        out.setdefault(str(ds), _fallback_standard(str(ds)))
    return out




@dataclass
class StudyData:
    """What a section notebook works on: format-level ``scores`` (published Tabs. 8-12 or computed from runs),
    and for runs the adapted per-question frame (standard rows flagged ``is_standard``) and CP-LN rows."""

    source: str
    published: bool
    scores: pd.DataFrame
    per_question: pd.DataFrame | None = None
    cp_ln: pd.DataFrame | None = None
    note: str | None = None
    models: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)

    @property
    def grid(self) -> pd.DataFrame | None:
        return None if self.per_question is None else grid_rows(self.per_question)


def _parse_list(v: Any) -> list[str] | None:
    """A notebook list parameter: None, a list, a JSON list string or a comma-separated string."""
    if v is None or isinstance(v, (list, tuple)):
        return None if v is None else [str(x) for x in v]
    text = str(v).strip()
    if not text or text.lower() == "none":
        return None
    if text.startswith("["):
        import json

        return [str(x) for x in json.loads(text)]
    return [x.strip() for x in text.split(",") if x.strip()]


def default_figures_dir(source: str | Path, figures_dir: str | Path | None = None) -> Path:
    """``figures_dir`` if given, else ``figures/format_bias/<published | name of the results folder>``."""
    if figures_dir:
        return Path(figures_dir)
    tag = "published" if str(source) == "published" else safe_name(Path(str(source)).resolve().name)
    return Path("figures") / "format_bias" / tag


def load_study(source: str | Path, datasets: Sequence[str] | str | None = None) -> StudyData:
    """``source="published"``: Tabs. 8-12 (:func:`fb.load_published_results`); otherwise a results folder of
    runs (:func:`load_runs` + :func:`results_to_metrics_frame` + :func:`load_cp_ln`). ``datasets`` filters
    (a list, or a JSON / comma-separated string as papermill passes it)."""
    datasets = _parse_list(datasets)
    if str(source) == "published":
        scores = fb.load_published_results()
        if datasets:
            scores = scores[scores["dataset"].isin(list(datasets))].reset_index(drop=True)
        return StudyData("published", True, scores, models=list(dict.fromkeys(scores["model"])),
                         datasets=list(dict.fromkeys(scores["dataset"])))
    pq = results_to_metrics_frame(load_runs(source), include_standard=True)
    cp = load_cp_ln(source)
    if datasets:
        pq = pq[pq["dataset"].isin(list(datasets))].reset_index(drop=True)
        cp = cp[cp["dataset"].isin(list(datasets))].reset_index(drop=True)
    scores = fb.format_scores(grid_rows(pq))
    models = list(dict.fromkeys(pq["model"].astype(str)))
    return StudyData(str(source), False, scores, pq, cp, figure_note_for(models), models,
                     list(dict.fromkeys(pq["dataset"].astype(str))))


# ================================================================================================ analyses
def per_format_table(pq: pd.DataFrame) -> pd.DataFrame:
    """Accuracy / coverage (%) per model x dataset x format, the standard format included and flagged
    (``format`` = ``<ids>-<delimiter>-<separator>`` or ``standard``), best accuracy first."""
    keys = ["model", "dataset", "format", *fb.FORMAT_COLS]
    g = pq.groupby(keys, sort=False)
    out = pd.DataFrame({"accuracy": g["correct"].mean() * 100, "coverage": g["covered"].mean() * 100,
                        "n_items": g.size()}).reset_index()
    return out.sort_values(["model", "dataset", "accuracy", "coverage"], ascending=[True, True, False, False],
                           kind="stable").reset_index(drop=True)


def answer_confidence_bins(pq: pd.DataFrame, unit: str = "item") -> pd.DataFrame:
    """Fig. 7 input (Sec. 5.3): items ranked by the logit of the correct option ID under the reference format
    that was run (:func:`reference_formats`), binned top 20 / middle 60 / bottom 20 %, accuracy per bin under
    every format (:func:`fb.confidence_bins`). Needs ``option_logits`` (the engine path)."""
    g = grid_rows(pq)
    if g["answer_logit"].isna().all():
        raise DataError("answer_confidence_bins: no option logits stored (run with mode='engine' or 'auto')")
    return fb.confidence_bins(g, "answer_logit", reference=reference_formats(pq), unit=unit)


def fit_lmm_with_fallback(scores: pd.DataFrame, **kwargs) -> pd.DataFrame:
    """:func:`fb.fit_lmm`; if the mixed model cannot be fitted (singular covariance - e.g. a random model whose
    accuracy is 0 in every format - or too few groups) the same fixed effects are fitted by OLS on the pooled
    data, as ``fit_lmm`` does for a single group. ``attrs["fallback"]`` names the reason (else None).
    In a balanced design (every group has every format) the OLS coefficients equal the LMM's; only the
    standard errors ignore the group intercepts."""
    try:
        t = fb.fit_lmm(scores, **kwargs)
        t.attrs["fallback"] = None
        if np.isfinite(t["coef"]).all() and np.isfinite(t["std_err"]).all():
            return t
        reason = "the mixed model returned non-finite estimates"
    except (np.linalg.LinAlgError, ValueError) as e:  # statsmodels raises these on singular designs
        reason = f"{type(e).__name__}: {e}"
    pooled = scores.assign(model="pooled", dataset="pooled")
    t = fb.fit_lmm(pooled, **kwargs)
    t.attrs["fallback"] = reason
    t.attrs["n_groups"] = int(scores[["model", "dataset"]].drop_duplicates().shape[0])
    return t


# ================================================================================================ mitigation
def _question_counts(pq: pd.DataFrame) -> pd.Series:
    return pq.drop_duplicates(["dataset", "question_id"])["n_options"].astype(int)


def most_common_option_count(pq: pd.DataFrame) -> int:
    """Most frequent option count over the distinct questions (ties: the larger count)."""
    c = Counter(_question_counts(pq).tolist())
    if not c:
        raise DataError("most_common_option_count: no questions")
    best = max(c.values())
    return max(k for k, v in c.items() if v == best)


def subset_option_count(frame: pd.DataFrame | None, n_options: int) -> pd.DataFrame | None:
    """Rows of questions with exactly ``n_options`` options (per-question or CP-LN frames)."""
    if frame is None:
        return None
    return frame[frame["n_options"].astype(int) == int(n_options)].reset_index(drop=True)


def _label(model: str, ds: str) -> str:
    return f"{ds} ({model})"


def _std_keep(st: pd.DataFrame) -> pd.DataFrame:
    return st[["model", "dataset", "question_id", "shift", "n_options"]]


def _pia_input(pq: pd.DataFrame) -> pd.DataFrame:
    st = standard_rows(pq)
    return _std_keep(st).assign(answer_position=st["answer_position"].astype(int),
                                selected_position=st["selected_position"].astype(int)).reset_index(drop=True)


def _pride_input(pq: pd.DataFrame) -> pd.DataFrame:
    st = standard_rows(pq)
    logits = st["option_logits"] if "option_logits" in st.columns else [None] * len(st)
    probs = [None if _as_list(v) is None else np.asarray(_as_list(v), float) for v in logits]
    return _std_keep(st).assign(answer=st["answer_position"].astype(int), probs=probs).reset_index(drop=True)


def mitigation_inputs(pq: pd.DataFrame, cp_ln: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """The inputs each method of Tab. 7 needs, per model x dataset, from an adapted frame with standard rows:

    * ``pseudo_gt``: format-level scores of the 48 grid formats (:func:`fb.format_scores`);
    * ``vanilla``: standard-format rows ``model, dataset, question_id, shift, n_options, correct``;
    * ``pia``: the same rows as :func:`mit.pia` reads them: ``question_id, answer_position, selected_position,
      n_options`` (shown positions, as the grid store holds them; -1 = not covered);
    * ``pride``: ``question_id, shift, n_options, answer, probs`` - ``probs`` are the standard format's
      option-ID *logits* in shown order (pass ``logits=True`` to PriDe), every circular shift;
    * ``cp_ln``: ``question_id, option, logprob, n_tokens, answer, n_options`` (empty if no CP-LN run).
    """
    st = standard_rows(pq)
    cols = ["model", "dataset", "question_id", "option", "logprob", "n_tokens", "answer", "n_options"]
    return {"pseudo_gt": fb.format_scores(grid_rows(pq)),
            "vanilla": _std_keep(st).assign(correct=st["correct"].astype(bool)).reset_index(drop=True),
            "pia": _pia_input(pq), "pride": _pride_input(pq),
            "cp_ln": (cp_ln[cols].reset_index(drop=True) if cp_ln is not None and len(cp_ln)
                      else pd.DataFrame(columns=cols))}


def pseudo_gt_scores(pq: pd.DataFrame) -> pd.DataFrame:
    """Pseudo GT (Sec. 4.2): mean accuracy over the grid formats; complexity = evaluated grid items."""
    g = grid_rows(pq)
    pg = fb.pseudo_gt(fb.format_scores(g))
    n = g.groupby(["dataset", "model"]).size().rename("complexity").reset_index()
    return pg.merge(n, on=["dataset", "model"]).assign(method="pseudo_gt")[
        ["dataset", "model", "method", "accuracy", "complexity"]]


def vanilla_scores(pq: pd.DataFrame) -> pd.DataFrame:
    """Vanilla: accuracy (%) in the standard format under circular evaluation (see module doc)."""
    st = standard_rows(pq)
    g = st.groupby(["dataset", "model"], sort=False)
    return pd.DataFrame({"accuracy": g["correct"].mean() * 100, "complexity": g.size()}).reset_index().assign(
        method="vanilla")[["dataset", "model", "method", "accuracy", "complexity"]]


def pia_scores(pq: pd.DataFrame) -> pd.DataFrame:
    """PIA (Eq. 7) x 100 on the standard-format rows. ValueError (naming dataset and model) on mixed counts."""
    inp = _pia_input(pq)
    rows = []
    for (model, ds), g in inp.groupby(["model", "dataset"], sort=False):
        r = mit.pia(g, dataset=_label(model, ds))
        rows.append(dict(dataset=ds, model=model, method="pia", accuracy=100 * r.accuracy, complexity=len(g)))
    return pd.DataFrame(rows, columns=["dataset", "model", "method", "accuracy", "complexity"])


def _pride_block(frame: pd.DataFrame, what: str) -> pd.DataFrame:
    if any(p is None for p in frame["probs"]):
        raise DataError(f"PriDe: {what} has rows without option logits (run with mode='engine' or 'auto')")
    return frame


def pride_scores(pq: pd.DataFrame, calibration: pd.DataFrame | None = None) -> pd.DataFrame:
    """PriDe (Eq. 8): prior from all circular shifts of the calibration questions (default: the same model x
    dataset's evaluated questions), prediction from the shift-0 logits. ValueError (naming dataset and model)
    when option counts vary, in the test or the calibration set."""
    inp = _pride_input(pq)
    cal_all = _pride_input(calibration) if calibration is not None else inp
    rows = []
    for (model, ds), g in inp.groupby(["model", "dataset"], sort=False):
        label = _label(model, ds)
        cal = cal_all[cal_all["model"] == model] if calibration is not None else g
        _pride_block(cal, f"calibration of {label}")
        test = _pride_block(g[g["shift"] == 0], label)
        prior = mit.pride_prior(cal[["question_id", "shift", "probs"]], dataset=label, logits=True)
        r = mit.pride(list(test["probs"]), test["answer"].to_numpy(), prior=prior, dataset=label, logits=True)
        rows.append(dict(dataset=ds, model=model, method="pride", accuracy=100 * r.accuracy, complexity=len(test)))
    return pd.DataFrame(rows, columns=["dataset", "model", "method", "accuracy", "complexity"])


def cp_ln_predictions(cp_ln: pd.DataFrame) -> pd.DataFrame:
    """CP-LN choice per question (Eq. 10: lowest perplexity = highest log-likelihood per token):
    ``model, dataset, question_id, predicted, answer, correct, n_options``."""
    parts = []
    for (model, ds), g in cp_ln.groupby(["model", "dataset"], sort=False):
        g = g.assign(option=g["option"].astype(int))
        answers = g.groupby("question_id", sort=False)["answer"].first()
        r = mit.cp_ln(g[["question_id", "option", "logprob", "n_tokens"]], answers.to_numpy(),
                      dataset=_label(model, ds))
        nopt = g.groupby("question_id", sort=False)["option"].size()
        parts.append(pd.DataFrame({"model": model, "dataset": ds, "question_id": r.details["question_id"],
                                   "predicted": r.predictions, "answer": answers.loc[r.details["question_id"]].to_numpy(),
                                   "n_options": nopt.loc[r.details["question_id"]].to_numpy()}))
    if not parts:
        return pd.DataFrame(columns=["model", "dataset", "question_id", "predicted", "answer", "correct", "n_options"])
    out = pd.concat(parts, ignore_index=True)
    out["correct"] = out["predicted"].astype(int) == out["answer"].astype(int)
    return out


def cp_ln_scores(cp_ln: pd.DataFrame) -> pd.DataFrame:
    """CP-LN accuracy (%) per model x dataset; complexity = scored (question, option) pairs."""
    pred = cp_ln_predictions(cp_ln)
    n = cp_ln.groupby(["dataset", "model"]).size().rename("complexity")
    g = pred.groupby(["dataset", "model"], sort=False)
    out = pd.DataFrame({"accuracy": g["correct"].mean() * 100}).join(n).reset_index()
    return out.assign(method="cp_ln")[["dataset", "model", "method", "accuracy", "complexity"]]


def mitigation_scores(pq: pd.DataFrame, cp_ln: pd.DataFrame | None = None, on_mixed: str = "raise",
                      calibration: pd.DataFrame | None = None) -> pd.DataFrame:
    """Long table ``dataset, model, method, accuracy, complexity, note`` for pseudo GT, vanilla, PIA, PriDe and
    (if ``cp_ln`` rows are given) CP-LN. ``on_mixed``: ``"raise"`` re-raises PIA's / PriDe's ValueError for
    datasets with mixed option counts; ``"na"`` records NA with the message in ``note`` (Tab. 7's V*Bench)."""
    if on_mixed not in ("raise", "na"):
        raise ValueError("on_mixed must be 'raise' or 'na'")
    parts = [pseudo_gt_scores(pq), vanilla_scores(pq)]
    for meth, fn in (("pia", lambda d: pia_scores(d)), ("pride", lambda d: pride_scores(d, calibration))):
        for (model, ds), g in pq.groupby(["model", "dataset"], sort=False):
            try:
                parts.append(fn(g))
            except ValueError as e:
                if on_mixed == "raise" or isinstance(e, DataError):
                    raise
                parts.append(pd.DataFrame([dict(dataset=ds, model=model, method=meth, accuracy=np.nan,
                                                 complexity=np.nan, note=str(e))]))
    if cp_ln is not None and len(cp_ln):
        parts.append(cp_ln_scores(cp_ln))
    out = pd.concat([p for p in parts if len(p)], ignore_index=True)
    if "note" not in out.columns:
        out["note"] = None
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    out["_o"] = out["method"].map(order).fillna(99)
    return out.sort_values(["dataset", "_o", "model"], kind="stable").drop(columns="_o").reset_index(drop=True)


@dataclass
class MitigationComparison:
    """Tab. 7 for a set of methods: ``scores`` (long, with competition ``rank`` per dataset x method),
    ``agreement`` (per dataset x method vs pseudo GT: spearman, kendall, correctly_ranked, n_models,
    complexity) and ``table`` (the wide Tab. 7 layout, see :func:`table7_layout`)."""

    scores: pd.DataFrame
    agreement: pd.DataFrame
    table: pd.DataFrame


def compare_mitigation(scores: pd.DataFrame, complexity: pd.DataFrame | None = None,
                       count_ties: bool = False, decimals: int | None = None) -> MitigationComparison:
    """Rank every method's accuracies per dataset and compare them with the pseudo GT (Sec. 5.4, Tab. 7, Fig. 8).

    ``scores``: long ``dataset, model, method, accuracy`` with ``method == "pseudo_gt"`` rows (e.g.
    :func:`mitigation_scores` or ``fb.load_published_mitigation()``); optional ``complexity`` column or a
    ``complexity`` frame ``dataset, method, complexity`` (e.g. Tab. 7's footer). Ranks are competition ranks
    (1 = best, ties share the smallest rank), agreement is :func:`fb.ranking_agreement` (Spearman on competition
    ranks, "correctly ranked" ignoring tied models unless ``count_ties``). ``decimals`` rounds accuracies before
    ranking (e.g. 2 for the printed precision)."""
    fb.require_columns(scores, ["dataset", "model", "method", "accuracy"], "compare_mitigation")
    s = scores.copy()
    s["accuracy"] = pd.to_numeric(s["accuracy"], errors="coerce")
    vals = s["accuracy"].round(decimals) if decimals is not None else s["accuracy"]
    s["rank"] = vals.groupby([s["dataset"], s["method"]], sort=False).rank(method="min", ascending=False).astype("Int64")
    gt = s[s["method"] == "pseudo_gt"]
    if gt.empty:
        raise DataError("compare_mitigation: no pseudo_gt rows to compare against")
    others = s[s["method"] != "pseudo_gt"]
    agr = fb.ranking_agreement(others.assign(accuracy=vals[others.index]), gt.assign(accuracy=vals[gt.index]),
                               count_ties=count_ties)
    if complexity is not None:
        cx = complexity[["dataset", "method", "complexity"]]
    elif "complexity" in s.columns:
        cx = s.groupby(["dataset", "method"], sort=False)["complexity"].max().reset_index()
    else:
        cx = pd.DataFrame(columns=["dataset", "method", "complexity"])
    cx = cx.astype({"complexity": "float"})
    n_models = s.groupby("dataset")["model"].nunique().rename("n_models_total")
    gt_rows = pd.DataFrame({"dataset": gt["dataset"].unique(), "method": "pseudo_gt"})
    agr = pd.concat([gt_rows, agr], ignore_index=True).merge(cx, on=["dataset", "method"], how="left")
    agr = agr.merge(n_models, on="dataset", how="left")
    agr["n_models"] = agr["n_models"].fillna(agr["n_models_total"]).astype(int)
    agr = agr.drop(columns="n_models_total")
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    agr = agr.sort_values(["dataset", "method"], key=lambda c: c.map(order).fillna(99) if c.name == "method" else c,
                          kind="stable").reset_index(drop=True)
    agr["correctly_ranked"] = agr["correctly_ranked"].astype("Int64")
    return MitigationComparison(s, agr, table7_layout(s, agr))


def _fmt_num(v: Any, nd: int = 2) -> str:
    if v is None or pd.isna(v):
        return "NA"
    return f"{float(v):.{nd}f}"


def table7_layout(scores: pd.DataFrame, agreement: pd.DataFrame) -> pd.DataFrame:
    """The wide Tab. 7 layout: rows ``(dataset, model)`` then ``Complexity [#]``, ``Ranking correlation`` and
    ``Correctly ranked`` (``(k/n)``); columns ``(method label, "Acc. [%]" | "Rank")`` in Tab. 7's method order.
    Strings, ready to print; NA for methods that do not apply."""
    methods = sorted(scores["method"].unique(), key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else 99, m))
    cols = pd.MultiIndex.from_tuples([(fb.METHOD_LABELS.get(m, m), k) for m in methods for k in ("Acc. [%]", "Rank")])
    blocks = []
    for ds in list(dict.fromkeys(scores["dataset"])):
        sub = scores[scores["dataset"] == ds]
        models = [m for m in fb.MODELS if m in set(sub["model"])] + sorted(set(sub["model"]) - set(fb.MODELS))
        rows, index = [], []
        for model in models:
            r = []
            for m in methods:
                x = sub[(sub["model"] == model) & (sub["method"] == m)]
                acc = x["accuracy"].iloc[0] if len(x) else np.nan
                rk = x["rank"].iloc[0] if len(x) else pd.NA
                r += [_fmt_num(acc), "" if pd.isna(acc) or pd.isna(rk) else str(int(rk))]
            rows.append(r)
            index.append((ds, model))
        a = agreement[agreement["dataset"] == ds].set_index("method")
        comp, corr, hit = [], [], []
        for m in methods:
            row = a.loc[m] if m in a.index else None
            cx = row["complexity"] if row is not None and "complexity" in a.columns else np.nan
            comp += ["NA" if pd.isna(cx) else f"{int(cx):,}", ""]
            if m == "pseudo_gt":
                corr += ["", ""]
                hit += ["", ""]
                continue
            sp = row["spearman"] if row is not None else np.nan
            k = row["correctly_ranked"] if row is not None else pd.NA
            n = row["n_models"] if row is not None else len(models)
            corr += [_fmt_num(sp), ""]
            hit += ["NA" if pd.isna(k) else f"({int(k)}/{int(n)})", ""]
        rows += [comp, corr, hit]
        index += [(ds, "Complexity [#]"), (ds, "Ranking correlation"), (ds, "Correctly ranked")]
        blocks.append(pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["dataset", "model"]),
                                   columns=cols))
    return pd.concat(blocks) if blocks else pd.DataFrame(columns=cols)
