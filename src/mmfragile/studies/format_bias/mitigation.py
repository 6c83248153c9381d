"""Bias-mitigation baselines of the format-bias paper (seed ``format-bias-mcvqa``, Sec. 4.3, B.3).

Pure numpy/pandas. Three methods, each reimplemented "according to the specifications
provided in their respective papers" (B.3):

* :func:`pia` / :func:`pia_score` - position-invariant accuracy, Eq. 7 [tan_ordermatters_2024];
* :func:`pride_prior`, :func:`pride_debias`, :func:`pride` - PriDe, Eq. 8 [zheng_llmsnotrobust_2024];
* :func:`cp_ln` - cloze prompt with length normalisation, Eq. 9-10 [robinson_leveraging_2023].

PIA and PriDe need a fixed number of options (Tab. 2, Sec. 5.4: "PIA and PriDe are not
compatible with evaluations on V*Bench ... which varies between 2 and 4"); both raise a
:class:`ValueError` naming the dataset when option counts vary. CP-LN handles any count.

Ties in every argmax/argmin go to the lowest option index (``numpy.argmax``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

_EPS = 1e-10  # same floor as the PriDe reference implementation uses inside its logs


@dataclass
class MitigationResult:
    """Predicted option index per question plus the accuracy they give (or PIA's score)."""

    method: str
    predictions: np.ndarray          # int, one per evaluated question (-1 = no prediction)
    accuracy: float                  # fraction in [0, 1]
    details: dict[str, Any] = field(default_factory=dict)


def accuracy(predictions: Sequence[int], answers: Sequence[int]) -> float:
    """Fraction of ``predictions`` equal to ``answers`` (Sec. A.3 accuracy)."""
    p = np.asarray(predictions)
    a = np.asarray(answers)
    if p.shape != a.shape:
        raise ValueError(f"{p.shape[0] if p.ndim else p} predictions vs {a.shape[0] if a.ndim else a} answers")
    if p.size == 0:
        raise ValueError("accuracy of an empty set of predictions is undefined")
    return float(np.mean(p == a))


def _label(dataset: str | None) -> str:
    return f"dataset {dataset!r}" if dataset else "the data"


def _check_fixed(counts: Sequence[int], dataset: str | None, method: str) -> int:
    uniq = sorted({int(c) for c in counts})
    if len(uniq) == 0:
        raise ValueError(f"{method}: no questions in {_label(dataset)}")
    if len(uniq) > 1:
        raise ValueError(
            f"{method} needs a fixed number of options, but {_label(dataset)} mixes questions with "
            f"{', '.join(map(str, uniq))} options (Sec. 4.3/5.4: not applicable to such datasets)")
    return uniq[0]


# ======================================================================================
# PIA (Eq. 7)
# ======================================================================================


def pia_score(selected: Sequence[int], answer: Sequence[int], n_options: int, n_questions: int) -> float:
    """Position-invariant accuracy, Eq. 7:  PIA = 1/M * sum_i (C_i / Pr_i) * (C_i / N).

    ``selected[r]`` / ``answer[r]``: selected and correct option *position* (index in the shown
    order) of evaluated row r; ``selected == -1`` marks an out-of-coverage answer, which counts
    in no Pr_i. ``C_i`` = rows with ``selected == answer == i``; ``Pr_i`` = rows with
    ``selected == i``; ``M = n_options``; ``N = n_questions``. A position never selected
    (Pr_i = 0, hence C_i = 0) contributes 0 (0/0 read as 0). Returns a fraction.
    """
    sel = np.asarray(selected, dtype=int)
    ans = np.asarray(answer, dtype=int)
    M = int(n_options)
    if sel.shape != ans.shape or sel.ndim != 1:
        raise ValueError(f"selected {sel.shape} and answer {ans.shape} must be 1-D of equal length")
    if M < 2:
        raise ValueError(f"n_options must be >= 2, got {M}")
    if n_questions <= 0:
        raise ValueError(f"n_questions must be positive, got {n_questions}")
    if np.any((sel < -1) | (sel >= M)):
        raise ValueError(f"selected positions must be -1 or in 0..{M - 1}")
    if np.any((ans < 0) | (ans >= M)):
        raise ValueError(f"answer positions must be in 0..{M - 1}")
    total = 0.0
    for i in range(M):
        pr = np.sum(sel == i)
        if pr == 0:
            continue
        c = np.sum((sel == i) & (ans == i))
        total += (c / pr) * (c / n_questions)
    return float(total / M)


def pia(results: pd.DataFrame, dataset: str | None = None, n_options: int | None = None,
        n_questions: int | None = None) -> MitigationResult:
    """PIA (Eq. 7) from a table of scored rows.

    ``results`` columns: ``question_id``, ``answer_position`` (correct position in the shown order),
    ``selected_position`` (chosen position, -1 if out of coverage; the grid store's columns), and ``n_options`` (or pass
    ``n_options``). Rows are typically the N x O circular-evaluation items of one format
    (Table 7: PIA complexity 4,580 = 1,145 x 4 on A-OKVQA), e.g. a grid store's rows of one format through
    :func:`mmfragile.studies.format_bias.analysis.results_to_metrics_frame`.

    Ambiguity - what is N, "the number of questions"? Default: the number of distinct
    ``question_id`` (the unshifted questions, 1,145 on A-OKVQA). In circular evaluation
    each position i is the correct answer of exactly N rows, so C_i/N is the recall of position
    i, C_i/Pr_i its precision, and a perfect model scores 1. For a uniform selector with
    accuracy a and coverage c this gives PIA = a^2/c, which reproduces all of Table 7(a)
    (A-OKVQA) from the Table 8 accuracy/coverage of the standard format within ~0.05 pp
    (e.g. Gemma-3 78.08 -> 61.00, LLaVA-1.5 12.29/13.87 -> 10.93) except Phi-4, and Qwen-2.5-VL
    in Table 7(b). The other six HRBench-4K values of Table 7(b) equal a^2/4, i.e. N = number
    of rows (N x O); pass ``n_questions=len(results)`` to reproduce those.
    """
    need = {"question_id", "answer_position", "selected_position"}
    missing = need - set(results.columns)
    if missing:
        raise ValueError(f"PIA: {_label(dataset)} results lack column(s) {sorted(missing)}")
    if len(results) == 0:
        raise ValueError(f"PIA: no rows for {_label(dataset)}")
    if "n_options" in results.columns:
        M = _check_fixed(results["n_options"].tolist(), dataset, "PIA")
        if n_options is not None and int(n_options) != M:
            raise ValueError(f"PIA: n_options={n_options} but {_label(dataset)} has {M} options")
    elif n_options is not None:
        M = int(n_options)
    else:
        raise ValueError(f"PIA: pass n_options or an 'n_options' column for {_label(dataset)}")
    N = int(results["question_id"].nunique()) if n_questions is None else int(n_questions)
    sel = results["selected_position"].to_numpy(dtype=int)
    ans = results["answer_position"].to_numpy(dtype=int)
    score = pia_score(sel, ans, M, N)
    C = [int(np.sum((sel == i) & (ans == i))) for i in range(M)]
    Pr = [int(np.sum(sel == i)) for i in range(M)]
    return MitigationResult("PIA", sel, score,
                            {"C": C, "Pr": Pr, "N": N, "M": M, "plain_accuracy": float(np.mean(sel == ans))})


# ======================================================================================
# PriDe (Eq. 8)
# ======================================================================================


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    z = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return z / np.sum(z, axis=axis, keepdims=True)


def _normalise(p: np.ndarray, logits: bool) -> np.ndarray:
    p = np.asarray(p, dtype=float)
    if logits:
        return _softmax(p, axis=-1)
    if np.any(p < 0) or not np.all(np.isfinite(p)):
        raise ValueError("option probabilities must be finite and >= 0 (pass logits=True for logits)")
    s = p.sum(axis=-1, keepdims=True)
    if np.any(s <= 0):
        raise ValueError("every question needs some probability mass on its option IDs")
    return p / s


def _stack(rows: Any, dataset: str | None, method: str) -> np.ndarray:
    """Rows of per-option values -> (N, M) array; ValueError naming the dataset if M varies."""
    if isinstance(rows, np.ndarray) and rows.ndim == 2:
        return rows.astype(float)
    rows = [np.asarray(r, dtype=float).ravel() for r in rows]
    _check_fixed([len(r) for r in rows], dataset, method)
    return np.stack(rows)


def pride_prior(calibration: Any, dataset: str | None = None, logits: bool = False) -> np.ndarray:
    """Estimate PriDe's prior P_prior(d_i) over option-ID positions (Eq. 8; Zheng et al. 2024).

    ``calibration``: observed option-ID probabilities of K calibration questions under all O
    circular shifts - either an array of shape (K, O, O) ``[question, shift, ID position]``,
    or a DataFrame with columns ``question_id``, ``shift`` and ``probs`` (list of O values).
    Per question, log-probabilities of each ID position are averaged over the shifts (each
    option content sits at each position once, so the content term cancels) and soft-maxed:
    ``prior_q = softmax(mean_k log P_obs^k(d_i))``; the global prior is the mean of the K
    per-question priors - as in the authors' reference code (``debias_utils.simple``).
    The paper calibrates on the 4-option questions of V*Bench (B.3). ``logits=True`` takes
    option-ID logits instead of probabilities (softmax over the IDs first).
    """
    if isinstance(calibration, pd.DataFrame):
        need = {"question_id", "shift", "probs"}
        if need - set(calibration.columns):
            raise ValueError(f"PriDe calibration for {_label(dataset)} needs columns {sorted(need)}")
        M = _check_fixed([len(p) for p in calibration["probs"]], dataset, "PriDe")
        blocks = []
        for qid, g in calibration.groupby("question_id", sort=False):
            g = g.sort_values("shift")
            if sorted(g["shift"].astype(int)) != list(range(M)):
                raise ValueError(f"PriDe calibration question {qid!r} of {_label(dataset)} needs all "
                                 f"{M} circular shifts 0..{M - 1}, got {sorted(g['shift'].tolist())}")
            blocks.append(np.stack([np.asarray(p, dtype=float) for p in g["probs"]]))
        arr = np.stack(blocks)
    else:
        arr = np.asarray(calibration, dtype=float)
    if arr.ndim != 3 or arr.shape[1] != arr.shape[2]:
        raise ValueError(f"PriDe calibration for {_label(dataset)} must have shape (K, O shifts, O IDs), got {arr.shape}")
    obs = _normalise(arr, logits)
    per_q = _softmax(np.log(obs + _EPS).mean(axis=1), axis=-1)  # (K, O)
    return per_q.mean(axis=0)


def pride_debias(probs: Any, prior: np.ndarray, dataset: str | None = None, logits: bool = False) -> np.ndarray:
    """Eq. 8: debiased log-scores ``log P_obs(d_i|q,x) - log P_prior(d_i)`` per question, (N, O).

    Proportional (in log space) to P_debiased(o_i|q,x); argmax of a row is the PriDe answer.
    Raises ValueError naming ``dataset`` if option counts vary or differ from the prior's.
    """
    P = _stack(probs, dataset, "PriDe")
    prior = np.asarray(prior, dtype=float)
    if P.shape[1] != prior.shape[0]:
        raise ValueError(f"PriDe: {_label(dataset)} has {P.shape[1]}-option questions but the prior was "
                         f"calibrated on {prior.shape[0]} options; priors only transfer to the same count (B.3)")
    obs = _normalise(P, logits)
    return np.log(obs + _EPS) - np.log(prior + _EPS)


def pride(probs: Any, answers: Sequence[int], prior: np.ndarray | None = None, calibration: Any = None,
          dataset: str | None = None, logits: bool = False) -> MitigationResult:
    """PriDe predictions and accuracy (Eq. 8): ``argmax_i P_obs(d_i|q,x) / P_prior(d_i)``.

    ``probs``: (N, O) option-ID probabilities (or logits with ``logits=True``) of the test
    questions in their default order (Table 7: PriDe complexity = N, e.g. 1,145 on A-OKVQA),
    or a list of per-question vectors (a ragged list -> ValueError naming ``dataset``).
    Give either a ready ``prior`` or ``calibration`` data for :func:`pride_prior`.
    Unlike Zheng et al.'s in-set calibration, the calibration questions are separate from
    the test questions (as in B.3, V*Bench 4-option questions), so every test question is
    predicted from a single forward pass.
    """
    if (prior is None) == (calibration is None):
        raise ValueError("pass exactly one of prior= or calibration=")
    if prior is None:
        prior = pride_prior(calibration, dataset=dataset, logits=logits)
    scores = pride_debias(probs, prior, dataset=dataset, logits=logits)
    pred = np.argmax(scores, axis=1)
    return MitigationResult("PriDe", pred, accuracy(pred, np.asarray(answers, dtype=int)),
                            {"prior": np.asarray(prior, dtype=float), "scores": scores})


# ======================================================================================
# CP-LN (Eq. 9-10)
# ======================================================================================


def perplexity(logprob: Any, n_tokens: Any) -> np.ndarray:
    """Eq. 9: PPL = (prod_i P(y_i | X_in, y_<i))^(-1/n) = exp(-logprob / n)."""
    lp = np.asarray(logprob, dtype=float)
    n = np.asarray(n_tokens, dtype=float)
    if lp.shape != n.shape:
        raise ValueError(f"logprob {lp.shape} and n_tokens {n.shape} differ in shape")
    if np.any(n <= 0):
        raise ValueError("perplexity needs n_tokens >= 1 for every option")
    with np.errstate(over="ignore"):
        return np.exp(-lp / n)


def cp_ln(scores: Any, answers: Sequence[int] | None = None, dataset: str | None = None) -> MitigationResult:
    """CP-LN (Eq. 9-10): pick the option whose text has the lowest perplexity given the question.

    ``scores``: a DataFrame with one row per (question, option) and columns ``question_id``,
    ``option`` (index in canonical order), ``logprob`` (summed log-probability of the option
    text, e.g. :meth:`MLLM.loglikelihood`'s ``LogLik.logprob``) and ``n_tokens``; or a list
    (one entry per question) of ``(logprobs, n_tokens)`` pairs of arrays. Option counts may
    vary. ``answers``: correct option index per question (order of first appearance of
    ``question_id`` in the DataFrame); without them accuracy is NaN.

    Eq. 10 ``argmin_o PPL^o`` equals ``argmax_o logprob_o / n_o`` (length-normalised
    log-likelihood, normalised by *token* count as in Eq. 9; Robinson et al.'s CP-LN
    normalisation, not the byte/char normalisation some harnesses use).
    """
    qids: list[Any] = []
    per_q: list[np.ndarray] = []
    if isinstance(scores, pd.DataFrame):
        need = {"question_id", "option", "logprob", "n_tokens"}
        if need - set(scores.columns):
            raise ValueError(f"CP-LN scores for {_label(dataset)} need columns {sorted(need)}")
        for qid, g in scores.groupby("question_id", sort=False):
            g = g.sort_values("option")
            opts = g["option"].astype(int).tolist()
            if opts != list(range(len(opts))):
                raise ValueError(f"CP-LN: question {qid!r} of {_label(dataset)} has option indices {opts}, "
                                 f"expected 0..{len(opts) - 1}")
            qids.append(qid)
            per_q.append((g["logprob"].to_numpy(dtype=float), g["n_tokens"].to_numpy(dtype=float)))
    else:
        for k, (lp, n) in enumerate(scores):
            qids.append(k)
            per_q.append((np.asarray(lp, dtype=float).ravel(), np.asarray(n, dtype=float).ravel()))
    ppl = [perplexity(lp, n) for lp, n in per_q]
    # argmin PPL == argmax mean log-prob; the latter cannot overflow, so decide on it.
    pred = np.array([int(np.argmax(lp / n)) for lp, n in per_q], dtype=int)
    if answers is not None and len(answers) != len(pred):
        raise ValueError(f"CP-LN: {len(answers)} answers for {len(pred)} questions of {_label(dataset)}")
    acc = accuracy(pred, np.asarray(answers, dtype=int)) if answers is not None else float("nan")
    return MitigationResult("CP-LN", pred, acc, {"question_id": qids, "perplexity": ppl})


__all__ = ["MitigationResult", "accuracy", "pia_score", "pia", "pride_prior", "pride_debias", "pride",
           "perplexity", "cp_ln"]
