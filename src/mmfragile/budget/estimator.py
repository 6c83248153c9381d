"""Budgeted fragility estimates: a model's accuracy distribution over prompt variants (the 48 formats of
study 1, the 61 prompts of Promptception) from a few percent of the (question, variant) grid.

Method - PromptEval (Maia Polo et al., "Efficient multi-prompt evaluation of LLMs", NeurIPS 2024):

* **Model.** Every grid cell (question x prompt variant x, for circular evaluation, shift) is a Bernoulli
  outcome ``correct`` with ``logit P = intercept + sum of term effects``. A term is a one-hot of one column or
  of a combination of columns (an interaction), each level with a zero-mean prior of scale ``sd`` (:class:`Term`;
  Student-t with ``GridSpec.nu`` = 3 degrees of freedom for the variant terms, Gaussian for the questions):
  the variant's covariates (option-ID set, delimiter, separator / category, supercategory, intent), the cell's
  covariates (circular shift, shown position of the correct answer), their interactions, a free effect per
  variant, and the *question effects* (a question's difficulty, optionally per answer position). PromptEval's
  variants are this model with other term sets: "PE-Rasch" = variant + question one-hots, "PE-discrete" =
  variant covariates + question one-hots. Their fit is scikit-learn's L2-penalised logistic regression (one
  penalty for all), i.e. the MAP under Gaussian priors; here every term has its own, learnt, prior.
* **Plug-in estimate** (PromptEval's estimator): observed cells keep their outcome, unobserved cells get the
  fitted probability; a variant's accuracy is the mean over its cells, the distribution over variants gives
  the mean, the quantiles (5/25/50/75/95 %, ``numpy.percentile``'s linear rule, as PromptEval), the best and
  worst variant and, across models, the ranking per variant. Where every observed cell of a group agrees (all
  wrong / all right), the unobserved cells get that outcome, not the prior's (:func:`_single_outcome`).
* **Prior scales** (not in PromptEval, which fixes one L2 penalty): learnt per model by empirical Bayes
  (:func:`fit_irt`), so a model whose formats barely differ gets its format effects shrunk to nothing and a
  model with a broken option-ID set keeps it; t priors let a single broken format stand out of the bulk.
  With fixed Gaussian priors the MAP equals scikit-learn's L2 logistic regression on prior-scaled columns
  (tested); it is computed by Newton steps on the block structure, which scikit-learn cannot exploit.
* **Coverage hurdle** (not in PromptEval): where cells carry ``covered`` (the output was a valid option ID /
  an answer letter was extracted), ``P(correct) = P(covered) x P(correct | covered)``, two fits - an
  uncovered output reveals a broken format at every answer position (:func:`estimate`).
* **Uncertainty** (not in PromptEval): Laplace approximation at the MAP (Gaussian with the inverse Hessian
  of the penalised log-likelihood; the question block is block-diagonal and handled by a Schur complement),
  then posterior-predictive draws: coefficients from the Laplace Gaussian, unobserved cells drawn as
  Bernoulli(p) - the targets are the accuracies of the *finite* grid, so the Bernoulli noise of the cells
  nobody ran is part of the error. The prior scales are uncertain too: the intervals integrate over factors
  on the variant terms' learnt scales - one on all of them, and one per term - weighted by their Laplace
  evidence under each term's own prior (Gaussian or Student-t, :func:`scale_posterior`, :func:`draw_scales`),
  with the Laplace draws at each draw of the scales centred on its plug-in (:func:`_centred_draws`) and pooled.
  That raises the coverage of every extreme statistic, but at 2 % of a grid the 90 % intervals of the best
  variant, the 95 % and the 25 / 50 % quantiles still hold only 70-80 % of the time on the paper grids
  (docs/budget.md says where and why).
* **Designs.** :func:`stratified_order`: a seeded sequence of cells balanced over variants, questions and
  shifts (PromptEval's ``StratSample`` balances variants and examples); every prefix is a design, so a larger
  budget extends a smaller one. :func:`adaptive_batch`: the next cells where they shrink the summed posterior
  variance of the per-variant accuracies most (greedy A-optimal design under the Laplace posterior, with the
  Bernoulli variance of the observed cell removed), a deterministic function of the observed cells + seed.

Cell frames (input of everything here) have one row per cell of the *complete* grid of one or more models:
``model`` (optional), ``question``, the spec's ``unit`` column (``format`` / ``prompt_id``), the term columns,
and ``correct`` (1 / 0, NaN = not observed). Builders: :mod:`mmfragile.budget` (from evaluation items and
stores) and :mod:`mmfragile.budget.validation` (complete grids, simulations from published tables).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy import linalg, special
from threadpoolctl import threadpool_limits

from mmfragile.errors import DataError

__all__ = ["Term", "GridSpec", "QUANTILES", "STATISTICS", "IRTFit", "fit_irt", "refit", "ScaleProfile",
           "scale_posterior", "draw_scales", "SCALE_FACTORS", "NEGLIGIBLE_SD", "BudgetEstimate", "estimate",
           "unit_accuracy", "summarize_units", "stratified_order", "budget_size", "adaptive_batch"]

#: Quantiles of the per-variant accuracy distribution (PromptEval's set), percent.
QUANTILES: tuple[int, ...] = (5, 25, 50, 75, 95)
#: Summary statistics of a model's per-variant accuracies, in output order.
#: the statistics of a grid's per-unit accuracy distribution; ``spread`` = q95 - q05 (the 5-95 % spread)
STATISTICS: tuple[str, ...] = ("mean", *(f"q{q:02d}" for q in QUANTILES), "best", "worst", "spread")


@dataclass(frozen=True)
class Term:
    """One-hot of ``columns`` (their combined values, i.e. an interaction for several columns) with a
    ``N(0, sd^2)`` prior on every level's effect (logit scale)."""

    columns: tuple[str, ...]
    sd: float

    @property
    def name(self) -> str:
        return ":".join(self.columns)


@dataclass(frozen=True)
class GridSpec:
    """What is estimated and with which covariates.

    ``unit``: the column whose accuracy distribution is estimated (a format, a prompt); ``question``: the
    column naming a question (its effects are the question block of the Laplace posterior: every term whose
    columns include it); ``terms``: the linear predictor (an unpenalised intercept is always added)."""

    name: str
    unit: str
    terms: tuple[Term, ...]
    question: str = "question"
    #: degrees of freedom of the Student-t prior of every term without the question (None: Gaussian). Format and
    #: prompt effects are mostly small with a few broken variants (a 4 % format among 60-80 % ones, Tab. 8-12):
    #: a Gaussian prior with a learnt scale shrinks such outliers into the bulk, a t prior lets them stand.
    nu: float | None = 3.0
    #: columns a budgeted design spreads each question's cells over (:func:`stratified_order`; study 1: the shift)
    balance: tuple[str, ...] = ()

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys(c for t in self.terms for c in t.columns))

    def question_terms(self) -> list[Term]:
        return [t for t in self.terms if self.question in t.columns]


# ================================================================================================ design
@dataclass
class _Design:
    """One-hot design of a cell frame: ``cols[i, t]`` = column of cell i in term t (dense terms first, then
    the question terms); ``X`` the same as a sparse 0/1 matrix; ``qidx`` (Q x K) the columns of each question's
    block (-1 = padding; empty without question terms)."""

    cols: np.ndarray
    X: sp.csr_matrix
    terms: list[Term]
    term_of: np.ndarray           # term index per column
    n_dense: int                  # columns of the dense terms
    n_dense_terms: int
    qidx: np.ndarray
    pos: np.ndarray               # position of every question-block column inside its block (-1 for dense)
    qof: np.ndarray               # question code per cell
    names: list[tuple[str, str]]

    @property
    def d(self) -> int:
        return self.X.shape[1]


def _check(cells: pd.DataFrame, spec: GridSpec, what: str) -> None:
    need = [spec.unit, spec.question, *spec.columns, "correct"]
    missing = [c for c in dict.fromkeys(need) if c not in cells.columns]
    if missing:
        raise DataError(f"{what}: cell frame lacks column(s) {missing}; have {list(cells.columns)}")
    y = pd.to_numeric(cells["correct"], errors="coerce")
    bad = cells["correct"].notna() & ~y.isin([0, 1])
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise DataError(f"{what}: row {i}: 'correct' must be 0/1 or missing, got {cells['correct'].iloc[i]!r}")


def _codes(cells: pd.DataFrame, cols: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """Codes of the combined values of ``cols`` and their level names, in sorted (row-order free) order."""
    code, names = None, None
    for c in cols:
        cc, lv = pd.factorize(cells[c].astype(str), sort=True)
        lv = np.asarray(lv, dtype=object)
        if code is None:
            code, names = cc.astype(np.int64), lv
        else:
            code = code * len(lv) + cc
            names = np.asarray([f"{a}|{b}" for a in names for b in lv], dtype=object)
    uniq, inv = np.unique(code, return_inverse=True)
    return inv.astype(np.int64), [str(names[u]) for u in uniq]


def _design(cells: pd.DataFrame, spec: GridSpec) -> _Design:
    dense = [t for t in spec.terms if spec.question not in t.columns]
    terms = dense + spec.question_terms()
    n = len(cells)
    qcodes, qlevels = _codes(cells, [spec.question])
    cols = np.empty((n, len(terms)), dtype=np.int64)
    names, term_of, qof_col = [], [], []
    off = 0
    for k, t in enumerate(terms):
        codes, levels = _codes(cells, t.columns)
        cols[:, k] = off + codes
        names += [(t.name, lv) for lv in levels]
        term_of += [k] * len(levels)
        if spec.question in t.columns:
            lvl_q = np.full(len(levels), -1)
            lvl_q[codes] = qcodes            # every level of a question term belongs to one question
            qof_col.append(lvl_q)
        off += len(levels)
    n_dense = int(sum(1 for k in term_of if k < len(dense)))
    pos = -np.ones(off, dtype=np.int64)
    if qof_col:
        block_of = np.concatenate(qof_col)
        Q = len(qlevels)
        counts = np.bincount(block_of, minlength=Q)
        order = np.argsort(block_of, kind="stable")
        starts = np.r_[0, np.cumsum(counts)[:-1]]
        p = np.arange(len(order)) - np.repeat(starts, counts)
        qidx = -np.ones((Q, int(counts.max())), dtype=np.int64)
        qidx[block_of[order], p] = n_dense + order
        pos[n_dense + order] = p
    else:
        qidx = np.zeros((0, 0), dtype=np.int64)
    X = sp.csr_matrix((np.ones(cols.size), cols.ravel(), np.arange(0, cols.size + 1, len(terms))), shape=(n, off))
    return _Design(cols, X, terms, np.asarray(term_of), n_dense, len(dense), qidx, pos, qcodes, names)


# ================================================================================================ fit
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -35, 35)))


class _Hessian:
    """The Hessian ``[1 | X]^T W [1 | X] + diag(prior precisions)`` of the observed cells in blocks: ``A`` the
    intercept + dense terms (D x D), ``Bq`` their cross terms with each question's block (Q x K x D), ``blocks``
    the question blocks (Q x K x K, identity padding). Solves and posterior draws go through the Schur
    complement ``S = A - sum_q Bq^T blocks^-1 Bq``; nothing of size d x d is formed."""

    def __init__(self, des: _Design, rows: np.ndarray, w: np.ndarray, prec: np.ndarray):
        D = 1 + des.n_dense
        cols = des.cols[rows]
        nd = des.n_dense_terms
        dcols = np.concatenate([np.zeros((len(rows), 1), np.int64), 1 + cols[:, :nd]], axis=1)  # 0 = intercept
        T = dcols.shape[1]
        A = np.bincount((dcols[:, :, None] * D + dcols[:, None, :]).ravel(), weights=np.repeat(w, T * T),
                        minlength=D * D)
        self.A = A.reshape(D, D) + np.diag(prec[:D])
        self.D = D
        self.des = des
        if not des.qidx.size:
            self.Q = 0
            return
        Q, K = des.qidx.shape
        qc, qpos = des.qof[rows], des.pos[cols[:, nd:]]          # question, position per question term
        R = (qc[:, None] * K + qpos)                              # row of (question, position) per q-term
        Tq = R.shape[1]
        blocks = np.bincount((R[:, :, None] * K + qpos[:, None, :]).ravel(), weights=np.repeat(w, Tq * Tq),
                             minlength=Q * K * K)
        Bq = np.bincount((R[:, :, None] * D + dcols[:, None, :]).ravel(), weights=np.repeat(w, Tq * T),
                         minlength=Q * K * D)
        blocks = blocks.reshape(Q, K, K)
        valid = des.qidx >= 0
        diag = np.where(valid, prec[1 + np.where(valid, des.qidx, 0)], 1.0)   # padding: identity
        blocks[:, np.arange(K), np.arange(K)] += diag
        self.Q, self.K = Q, K
        self.blocks = blocks
        self.Bq = Bq.reshape(Q, K, D)
        self.inv_blocks = np.linalg.inv(blocks) if K > 1 else 1.0 / blocks
        self.Dinv_B = self.inv_blocks @ self.Bq
        S = self.A - self.Bq.reshape(Q * K, D).T @ self.Dinv_B.reshape(Q * K, D)
        self.A = None
        self.S = (S + S.T) / 2

    @property
    def chol_S(self) -> np.ndarray:
        if not hasattr(self, "_chol"):
            self._chol = linalg.cholesky(self.S if self.Q else self.A, lower=True)
        return self._chol

    def _split(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.Q:
            return v, np.zeros((0, 0))
        q = np.zeros((self.Q, self.K))
        valid = self.des.qidx >= 0
        q[valid] = v[1 + self.des.qidx[valid]]
        return v[:self.D], q

    def _join(self, vd: np.ndarray, vq: np.ndarray) -> np.ndarray:
        out = np.zeros(1 + self.des.d)
        out[:self.D] = vd
        if self.Q:
            valid = self.des.qidx >= 0
            out[1 + self.des.qidx[valid]] = vq[valid]
        return out

    def solve(self, g: np.ndarray) -> np.ndarray:
        gd, gq = self._split(g)
        if not self.Q:
            return linalg.cho_solve((self.chol_S, True), gd)
        Dinv_g = (self.inv_blocks @ gq[..., None])[..., 0]
        dd = linalg.cho_solve((self.chol_S, True), gd - self.Bq.reshape(-1, self.D).T @ Dinv_g.ravel())
        return self._join(dd, Dinv_g - (self.Dinv_B.reshape(-1, self.D) @ dd).reshape(self.Q, self.K))

    def posterior_diag(self) -> np.ndarray:
        """Diagonal of the inverse Hessian (the Laplace posterior variances)."""
        Linv, info = linalg.lapack.dtrtri(self.chol_S, lower=1)          # S^-1 = Linv^T Linv
        if info:
            raise np.linalg.LinAlgError(f"triangular inverse failed (info={info})")
        dd = (Linv ** 2).sum(axis=0)
        if not self.Q:
            return dd
        LB = Linv @ self.Dinv_B.reshape(-1, self.D).T                    # D x (Q K)
        dq = np.einsum("qkk->qk", self.inv_blocks) + (LB ** 2).sum(axis=0).reshape(self.Q, self.K)
        return self._join(dd, dq)

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` draws (n x (1 + d)) from N(0, H^-1): the dense block from N(0, S^-1), each question block from
        its conditional N(-blocks^-1 Bq dd, blocks^-1)."""
        dd = linalg.solve_triangular(self.chol_S, rng.standard_normal((self.D, n)), lower=True, trans="T").T
        out = np.zeros((n, 1 + self.des.d))
        out[:, :self.D] = dd
        if self.Q:
            if not hasattr(self, "_cholinvT"):
                self._cholinvT = np.swapaxes(np.linalg.inv(np.linalg.cholesky(self.blocks)), 1, 2)
            noise = np.einsum("qkl,nql->nqk", self._cholinvT, rng.standard_normal((n, self.Q, self.K)))
            dq = noise - (dd @ self.Dinv_B.reshape(-1, self.D).T).reshape(n, self.Q, self.K)
            valid = self.des.qidx >= 0
            out[:, 1 + self.des.qidx[valid]] = dq[:, valid]
        return out

    def dense_inverse(self) -> np.ndarray:
        """The full (1 + d) x (1 + d) inverse (for the adaptive design on small grids), from the blocks:
        ``[[S^-1, -S^-1 B^T D^-1], [., D^-1 + D^-1 B S^-1 B^T D^-1]]``."""
        Sinv = linalg.cho_solve((self.chol_S, True), np.eye(self.D))
        if not self.Q:
            return Sinv
        valid = self.des.qidx >= 0
        cols = np.r_[np.arange(self.D), 1 + self.des.qidx[valid]]       # parameter index of every row below
        DB = self.Dinv_B[valid]                                         # (n_q, D): D^-1 B per question column
        qd = -DB @ Sinv
        qq = DB @ Sinv @ DB.T
        blk = np.zeros_like(qq)
        qrow = np.repeat(np.arange(self.Q), valid.sum(axis=1))
        kpos = np.concatenate([np.flatnonzero(v) for v in valid])
        same = qrow[:, None] == qrow[None, :]
        blk[same] = self.inv_blocks[qrow[:, None].repeat(len(qrow), 1)[same], kpos[:, None].repeat(len(qrow), 1)[same],
                                    kpos[None, :].repeat(len(qrow), 0)[same]]
        full = np.block([[Sinv, qd.T], [qd, qq + blk]])
        out = np.empty_like(full)
        out[np.ix_(cols, cols)] = full
        return out


@dataclass
class IRTFit:
    """A fitted model for one cell frame (one model's grid): ``coef`` (intercept, then one effect per design
    column), ``sd`` (prior scale per term, estimated by empirical Bayes unless fixed), ``eta`` (linear predictor
    of every cell), ``precision`` (the prior precisions at the optimum) and the Laplace posterior
    (:attr:`hessian`)."""

    spec: GridSpec
    design: _Design
    coef: np.ndarray
    sd: dict[str, float]
    eta: np.ndarray
    observed: np.ndarray
    hessian: _Hessian | None
    n_iter: int
    precision: np.ndarray         # prior precision of every coefficient (intercept: 0; t priors: weighted)
    pseudo_count: float = 0.5
    #: degrees of freedom of the Student-t prior of the terms without the question (None: every prior Gaussian)
    nu: float | None = None

    @property
    def term_sd(self) -> np.ndarray:
        """The prior scales :attr:`sd` as an array in ``design.terms`` order."""
        return np.array([self.sd[t.name] for t in self.design.terms])

    def heavy(self) -> np.ndarray:
        """Per effect (design column): whether its prior is the Student-t one."""
        return _heavy_terms(self.spec, self.design.terms, self.nu)[self.design.term_of]

    @property
    def p(self) -> np.ndarray:
        return _sigmoid(self.eta)

    def draw_coefs(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` coefficient vectors (n x (1 + d)) from the Laplace posterior."""
        return self.coef + self.hessian.draw(n, rng)

    def eta_of(self, coefs: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Linear predictors (cells[rows] x draws) for coefficient draws ``coefs`` (n x (1 + d))."""
        return np.asarray(self.design.X[rows] @ coefs[:, 1:].T) + coefs[:, 0]


class _Newton:
    """The penalised likelihood of the observed cells of one design and its damped Newton steps (penalised IRLS,
    the GLMM workhorse of lme4) with the Schur-complement solves of :class:`_Hessian`."""

    def __init__(self, des: _Design, rows: np.ndarray, y: np.ndarray, pseudo_count: float, max_iter: int,
                 tol: float):
        self.des, self.rows, self.y, self.cols = des, rows, y, des.cols[rows]
        self.pseudo_count, self.max_iter, self.tol = pseudo_count, max_iter, tol
        self.n_iter = 0

    def eta(self, th: np.ndarray) -> np.ndarray:
        return th[0] + th[1 + self.cols].sum(axis=1)

    def objective(self, th: np.ndarray, prec: np.ndarray) -> float:
        eta, pc = self.eta(th), self.pseudo_count
        nll = np.logaddexp(0, eta).sum() - (self.y * eta).sum()
        return float(nll + 0.5 * (prec * th ** 2).sum() + pc * (np.logaddexp(0, th[0]) + np.logaddexp(0, -th[0])))

    def hessian(self, th: np.ndarray, prec: np.ndarray) -> _Hessian:
        p = _sigmoid(self.eta(th))
        p0 = _sigmoid(th[0])
        return _Hessian(self.des, self.rows, p * (1 - p),
                        prec + np.r_[2 * self.pseudo_count * p0 * (1 - p0), np.zeros(self.des.d)])

    def step(self, th: np.ndarray, prec: np.ndarray, f: float) -> tuple[np.ndarray, float, float, _Hessian]:
        """One damped Newton step; returns (theta, objective, max |change|, Hessian at the old theta)."""
        self.n_iter += 1
        r = _sigmoid(self.eta(th)) - self.y
        g = prec * th
        g[0] += r.sum() + self.pseudo_count * (2 * _sigmoid(th[0]) - 1)
        g[1:] += np.bincount(self.cols.ravel(), weights=np.repeat(r, self.cols.shape[1]), minlength=self.des.d)
        H = self.hessian(th, prec)
        delta = H.solve(g)
        t = 1.0
        while True:
            new = th - t * delta
            fn = self.objective(new, prec)
            if fn <= f + 1e-12 or t < 1e-6:
                return new, fn, float(np.abs(t * delta).max()), H
            t /= 2

    def converge(self, th: np.ndarray, prec: np.ndarray) -> np.ndarray:
        f = self.objective(th, prec)
        for _ in range(self.max_iter):
            f_old = f
            th, f, moved, _ = self.step(th, prec, f)
            if moved < 1e-6 or f_old - f < self.tol * max(1.0, abs(f)):
                break
        return th


def fit_irt(cells: pd.DataFrame, spec: GridSpec, prior: str = "empirical", pseudo_count: float = 0.5,
            nu: float | None | str = "spec", max_iter: int = 200, tol: float = 1e-8,
            sd_bounds: tuple[float, float] = (1e-3, 5.0)) -> IRTFit:
    """Fit the model to the observed cells of ``cells`` (one model's grid).

    The MAP under the Gaussian priors is found by Newton's method (penalised IRLS, the GLMM workhorse of lme4)
    with the Schur-complement solves of :class:`_Hessian`, with step halving. ``prior="empirical"`` (default)
    re-estimates every term's prior sd from the data - MacKay's evidence fixed point
    ``sd_k^2 = |b_k|^2 / (m_k - tr(Cov_k) / sd_k^2)`` under the Laplace approximation, i.e. the variance
    components of a logistic GLMM: how much the formats, positions or questions really differ is learnt per
    model instead of assumed; the spec's sds are the starting values. ``prior="fixed"`` keeps them (Gaussian).
    ``nu`` (default: the spec's, 3): Student-t priors for the terms without the question, fitted by EM as a
    scale mixture of normals - every effect gets the weight ``(nu + 1) / (nu + E[b^2] / s^2)`` on its prior
    precision and the scale ``s_k`` the same fixed point with weighted sums; the Laplace posterior then uses
    these weighted precisions. ``nu=None``: Gaussian.
    ``pseudo_count``: half a correct and half a wrong answer at the baseline (every effect 0), which keeps the
    intercept finite when every observed cell is wrong (or right). The result does not depend on row order."""
    if prior not in ("empirical", "fixed"):
        raise ValueError(f"prior must be 'empirical' or 'fixed', not {prior!r}")
    _check(cells, spec, "fit_irt")
    obs = cells["correct"].notna().to_numpy()
    if not obs.any():
        raise DataError("fit_irt: no observed cell (every 'correct' is missing)")
    des = _design(cells, spec)
    rows = np.flatnonzero(obs)
    y = pd.to_numeric(cells["correct"], errors="coerce").to_numpy()[rows]
    nterm = len(des.terms)
    sd = np.array([t.sd for t in des.terms], float)
    ybar = (y.sum() + pseudo_count) / (len(y) + 2 * pseudo_count)
    theta = np.zeros(1 + des.d)
    theta[0] = np.log(ybar / (1 - ybar))
    newton = _Newton(des, rows, y, pseudo_count, max_iter, tol)

    nu = spec.nu if nu == "spec" else nu
    nu_ = np.inf if nu is None else float(nu)
    heavy = _heavy_terms(spec, des.terms, nu)

    with threadpool_limits(limits=1, user_api="blas"):  # small dense blocks: threads only add overhead
        prec = np.r_[0.0, 1.0 / sd[des.term_of] ** 2]
        theta = newton.converge(theta, prec)
        if prior == "empirical":
            lo, hi = sd_bounds
            f = newton.objective(theta, prec)
            p_prev = None
            for _ in range(max_iter):
                theta, f, moved, H = newton.step(theta, prec, f)
                var = H.posterior_diag()[1:]
                e2 = theta[1:] ** 2
                m = np.bincount(des.term_of, minlength=nterm)
                wt = np.where(heavy[des.term_of], _t_weights(e2 + var, sd[des.term_of] ** 2, nu_), 1.0)
                ss = np.bincount(des.term_of, weights=wt * e2, minlength=nterm)
                tr = np.bincount(des.term_of, weights=wt * var, minlength=nterm)
                gamma = np.maximum(m - tr / sd ** 2, 1e-8)
                new_sd = np.clip(np.sqrt(ss / gamma), lo, hi)
                # converged: every sd moved < 5 % or is shrinking below 0.05 logits (a negligible effect, which
                # the fixed point approaches only slowly), or - what the estimates depend on - no cell's fitted
                # probability moved by more than 0.1 pp in this sweep (the final Newton steps then settle theta)
                p_all = _sigmoid(theta[0] + theta[1 + des.cols].sum(axis=1))
                stable = p_prev is not None and float(np.abs(p_all - p_prev).max()) < 1e-3
                p_prev = p_all
                done = stable or bool(np.all((np.abs(np.log(new_sd / sd)) < 0.05) | ((new_sd < 0.05) & (new_sd <= sd))))
                sd = new_sd
                prec = np.r_[0.0, wt / sd[des.term_of] ** 2]
                f = newton.objective(theta, prec)
                if done:
                    break
            theta = newton.converge(theta, prec)
        return _fitted(spec, newton, theta, sd, obs, prec, nu if prior == "empirical" and heavy.any() else None)


def _heavy_terms(spec: GridSpec, terms: Sequence[Term], nu: float | None) -> np.ndarray:
    """Per term: whether its prior is Student-t (a finite ``nu``, a term without the question)."""
    t_prior = nu is not None and bool(np.isfinite(nu))
    return np.array([t_prior and spec.question not in t.columns for t in terms], bool)


def _t_weights(e2: np.ndarray, s2: np.ndarray, nu: float) -> np.ndarray:
    """The EM weight ``(nu + 1) / (nu + E[b^2] / s^2)`` of each effect's prior precision under a Student-t prior
    of scale ``s`` (a scale mixture of normals)."""
    return (nu + 1) / (nu + e2 / s2)


def _fitted(spec: GridSpec, newton: _Newton, theta: np.ndarray, sd: np.ndarray, observed: np.ndarray,
            prec: np.ndarray, nu: float | None) -> IRTFit:
    """The :class:`IRTFit` at the MAP ``theta``: its Laplace posterior factorised now (callers hold the BLAS
    thread limit) and the linear predictor of every cell."""
    des = newton.des
    H = newton.hessian(theta, prec)
    H.chol_S
    eta = theta[0] + theta[1 + des.cols].sum(axis=1)
    return IRTFit(spec, des, theta, {t.name: float(s) for t, s in zip(des.terms, sd)}, eta, observed, H,
                  newton.n_iter, prec, newton.pseudo_count, nu)


def refit(fit: IRTFit, cells: pd.DataFrame, sd: np.ndarray, sweeps: int = 10) -> IRTFit:
    """``fit`` (of ``cells``) again at other prior scales ``sd`` (one per term, in ``fit.design.terms`` order):
    the MAP by Newton from ``fit``'s coefficients, and its Laplace posterior. Student-t weights are re-estimated
    at the new scales (at most ``sweeps`` EM sweeps), each sweep's weights from the effects before its Newton
    steps: a broken variant's effect ``b`` keeps a precision of about ``(nu + 1) / b^2`` whatever the scale, so
    a smaller scale shrinks the bulk and leaves the outlier standing - as a t prior does, and as keeping the
    fit's weights (which scales every precision alike) did not."""
    des = fit.design
    rows = np.flatnonzero(fit.observed)
    y = pd.to_numeric(cells["correct"], errors="coerce").to_numpy()[rows]
    sd = np.asarray(sd, float)
    prec = fit.precision * np.r_[1.0, (fit.term_sd / sd)[des.term_of] ** 2]
    newton = _Newton(des, rows, y, fit.pseudo_count, 50, 1e-8)
    heavy, theta = fit.heavy(), fit.coef.copy()
    with threadpool_limits(limits=1, user_api="blas"):
        if heavy.any():
            s2 = sd[des.term_of] ** 2
            H = newton.hessian(theta, prec)
            for _ in range(sweeps):   # EM as in fit_irt: weights, then one Newton step
                var = H.posterior_diag()[1:]
                new = np.r_[0.0, np.where(heavy, _t_weights(theta[1:] ** 2 + var, s2, fit.nu), 1.0) / s2]
                settled = float(np.abs(np.log(new[1:] / prec[1:])).max()) < 1e-2
                prec = new
                if settled:
                    break
                theta, _, _, H = newton.step(theta, prec, newton.objective(theta, prec))
        return _fitted(fit.spec, newton, newton.converge(theta, prec), sd, fit.observed, prec, fit.nu)


#: factors ``c`` of a variant term's learnt prior scale at which :func:`scale_posterior` weighs the evidence
SCALE_FACTORS: tuple[float, ...] = tuple(float(c) for c in np.exp(np.linspace(np.log(0.03), np.log(4.0), 7)))
#: a learnt scale at most this (logits) is taken as known: any factor of it leaves the estimates as they are
NEGLIGIBLE_SD = 0.01


def _log_evidence(fit: IRTFit, cells: pd.DataFrame) -> float:
    """Laplace approximation of the marginal likelihood of ``fit``'s observed cells under its prior scales:
    ``log p(y | b) + log p(b) + d/2 log 2 pi - 1/2 log|H|`` at the MAP ``b``, with ``p(b)`` each effect's prior
    density - Gaussian, or the Student-t of the heavy terms (:meth:`IRTFit.heavy`) - and ``H`` the Hessian with
    the prior precisions of the fit (for t priors the EM-weighted ones: the t's own curvature turns negative at an
    outlier), through the Schur complement and the question blocks; the intercept's prior is its pseudo-count,
    unnormalised (the same constant at every scale)."""
    des = fit.design
    rows = np.flatnonzero(fit.observed)
    y = pd.to_numeric(cells["correct"], errors="coerce").to_numpy()[rows]
    # the objective without the effects' priors: -(log-likelihood + the intercept's pseudo-count)
    log_lik = -_Newton(des, rows, y, fit.pseudo_count, 1, 0.0).objective(fit.coef, np.zeros_like(fit.precision))
    b = fit.coef[1:]
    s2 = fit.term_sd[des.term_of] ** 2
    log_prior = -0.5 * np.log(2 * np.pi * s2) - b ** 2 / (2 * s2)
    heavy = fit.heavy()
    if heavy.any():
        nu = float(fit.nu)
        log_t = (special.gammaln((nu + 1) / 2) - special.gammaln(nu / 2) - 0.5 * np.log(nu * np.pi * s2)
                 - (nu + 1) / 2 * np.log1p(b ** 2 / (nu * s2)))
        log_prior = np.where(heavy, log_t, log_prior)
    H = fit.hessian
    logdet = 2 * np.log(np.diag(H.chol_S)).sum()
    if H.Q:
        logdet += np.linalg.slogdet(H.blocks)[1].sum()
    return float(log_lik + log_prior.sum() + 0.5 * len(b) * np.log(2 * np.pi) - 0.5 * logdet)


@dataclass(frozen=True)
class ScaleProfile:
    """The posterior of one factor ``c`` on the learnt prior scales of ``terms`` (the other terms at theirs):
    ``weights`` over :data:`SCALE_FACTORS`."""

    terms: tuple[str, ...]
    weights: np.ndarray


def scale_posterior(fit: IRTFit, cells: pd.DataFrame) -> list[ScaleProfile]:
    """The posterior of the variant terms' prior scales, as profiles of one factor ``c x`` the learnt scales
    (``c`` in :data:`SCALE_FACTORS`): first one factor on all variant terms together, then one per variant term
    with the others at their learnt scales (a term learnt at most :data:`NEGLIGIBLE_SD` has none: any factor of
    it leaves the estimates as they are). The question term keeps its own scale.

    Empirical Bayes keeps the scales that maximise the evidence, but at a few percent of a grid the variant terms
    say little about their scales: noise alone gives equal formats a few pp of spread - an interaction of them a
    learnt scale of the binomial noise of its levels (0.2-0.3 logits at 20 cells a format), which invents a best
    format several pp above the truth - and a real effect can be shrunk away. The joint factor moves the whole
    spread; the per-term ones can shrink an interaction that is noise while the broken option-ID set beside it
    keeps its scale, which no joint factor can. Each profile is the Laplace evidence (:func:`_log_evidence`) at
    each ``c`` under a log-uniform hyperprior on the grid (scale-free; a half-Cauchy puts little mass where the
    formats are equal - a spread of 0 - and covered the best variant less often)."""
    des = fit.design
    sd_hat = fit.term_sd
    dense = np.arange(len(des.terms)) < des.n_dense_terms
    moves = [dense] + [np.arange(len(des.terms)) == k for k in np.flatnonzero(dense & (sd_hat > NEGLIGIBLE_SD))]
    factors = np.asarray(SCALE_FACTORS)
    out = []
    for moved in moves:
        logpost = np.empty(len(factors))
        # two continuations outwards from the learnt scales, each fit started from its neighbour's
        for chain in (np.flatnonzero(factors < 1)[::-1], np.flatnonzero(factors >= 1)):
            prev = fit
            for i in chain:
                prev = refit(prev, cells, np.where(moved, factors[i] * sd_hat, sd_hat))
                logpost[i] = _log_evidence(prev, cells)
        w = np.exp(logpost - logpost.max())
        out.append(ScaleProfile(tuple(t.name for t, m in zip(des.terms, moved) if m), w / w.sum()))
    return out


def draw_scales(fit: IRTFit, cells: pd.DataFrame, n: int, rng: np.random.Generator) -> list[IRTFit]:
    """``n`` fits of ``cells`` at prior scales drawn from :func:`scale_posterior`, the MAP refitted at each
    (:func:`refit`): half of them from the joint factor, the rest with every term's own factor drawn
    independently - each factor by stratified inverse CDF with its strata shuffled (a Latin hypercube). Pooled,
    they cover the best format, the 95 % quantile and the spread more often on the paper grids than either half
    alone (docs/budget.md)."""
    des = fit.design
    sd_hat = fit.term_sd
    index = {t.name: k for k, t in enumerate(des.terms)}
    joint, *own = scale_posterior(fit, cells)
    n_joint = (n + 1) // 2

    def draw(w: np.ndarray, m: int) -> np.ndarray:
        u = (rng.permutation(m) + rng.random(m)) / m
        return np.asarray(SCALE_FACTORS)[np.minimum(np.searchsorted(np.cumsum(w), u), len(w) - 1)]

    factors = np.ones((n, len(des.terms)))
    factors[:n_joint, [index[t] for t in joint.terms]] = draw(joint.weights, n_joint)[:, None]
    for prof in own:
        factors[n_joint:, index[prof.terms[0]]] = draw(prof.weights, n - n_joint)
    return [refit(fit, cells, sd_hat * f) for f in factors]


# ================================================================================================ estimates
def unit_accuracy(cells: pd.DataFrame, spec: GridSpec, values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Per-unit accuracy (%) of cell values (n_cells, or n_cells x draws): ``(units, array units[ x draws])``."""
    codes, units = pd.factorize(cells[spec.unit].astype(str), sort=True)
    n = np.bincount(codes, minlength=len(units)).astype(float)
    v = np.asarray(values, float)
    if v.ndim == 1:
        return list(units), 100 * np.bincount(codes, weights=v, minlength=len(units)) / n
    M = sp.csr_matrix((np.ones(len(codes)), (codes, np.arange(len(codes)))), shape=(len(units), len(codes)))
    return list(units), 100 * np.asarray(M @ v) / n[:, None]


def summarize_units(acc: np.ndarray) -> np.ndarray:
    """Statistics of :data:`STATISTICS` over axis 0 of per-unit accuracies (units[ x draws])."""
    acc = np.asarray(acc, float)
    q = np.percentile(acc, QUANTILES, axis=0)
    spread = q[QUANTILES.index(95)] - q[QUANTILES.index(5)]
    return np.concatenate([acc.mean(axis=0)[None], q, acc.max(axis=0)[None], acc.min(axis=0)[None], spread[None]],
                          axis=0)


@dataclass
class BudgetEstimate:
    """Estimates per group (``model`` and, where present, ``dataset``), all accuracies in percent.

    * ``units``: per group x unit - ``estimate`` (plug-in), ``lo``/``hi`` (interval), ``observed`` (mean of
      the observed cells, NaN if none), ``n_cells``, ``n_observed``, ``p_best``/``p_worst`` (posterior share of
      draws in which the unit is the group's best / worst);
    * ``summary``: per group x statistic (:data:`STATISTICS`) - ``estimate``, ``lo``, ``hi``, ``naive`` (the
      same statistic of the per-unit observed means: PromptEval's "avg" baseline), and for best / worst the
      ``unit`` and its ``p_unit``;
    * ``ranks``: per dataset x unit x model (only with several models) - ``rank`` (1 = best, by the plug-in
      accuracies), ``rank_lo``/``rank_hi``, ``p_rank1``;
    * ``budget``: per group - ``n_cells``, ``n_observed``, ``fraction``, ``note`` (why the estimates are the
      observed value where every observed cell agrees - :func:`_single_outcome`; else empty).
    """

    units: pd.DataFrame
    summary: pd.DataFrame
    ranks: pd.DataFrame
    budget: pd.DataFrame
    level: float
    spec: GridSpec


def _groups(cells: pd.DataFrame) -> list[str]:
    return [c for c in ("dataset", "model") if c in cells.columns]


def estimate(cells: pd.DataFrame, spec: GridSpec, level: float = 0.9, n_draws: int = 400, seed: int = 0,
             prior: str = "empirical", coverage: bool | None = None, max_draw_cells: int = 4_000_000,
             scale_draws: int = 8) -> BudgetEstimate:
    """Estimate every group's (dataset x model) per-unit accuracies and their distribution from the observed
    cells of ``cells`` (see the module docstring); ``level``: interval coverage; ``n_draws``: posterior draws
    (0 = point estimates only). Draws are made in chunks of at most ``max_draw_cells`` cell x draw values.
    ``scale_draws``: prior-scale draws the intervals integrate over (:func:`scale_posterior`; 0 = the learnt
    scales only, the Laplace intervals that under-cover the extreme statistics).

    ``coverage`` (default: whenever the cells carry a ``covered`` column): a hurdle model,
    ``P(correct) = P(covered) x P(correct | covered)``, one fit each. A format the model cannot answer in (an
    output that is no option ID, Sec. 5.1 / Eq. 6) shows as *uncovered* in every observed cell, whatever the
    answer's position, while a wrong answer says less; the fits share the spec's terms."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    _check(cells, spec, "estimate")
    gcols = _groups(cells)
    alpha = (1 - level) / 2
    unit_rows, summ_rows, budget_rows = [], [], []
    draws_by_group: dict[tuple, tuple[list[str], np.ndarray, np.ndarray]] = {}
    groups = cells.groupby(gcols, sort=True) if gcols else [((), cells)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        g = g.reset_index(drop=True)
        gd = dict(zip(gcols, key))
        obs = g["correct"].notna().to_numpy()
        yobs = pd.to_numeric(g["correct"], errors="coerce").to_numpy()
        pred = _Predictor(g, spec, prior, coverage)
        flat = _single_outcome(yobs[obs])
        plug = np.where(obs, yobs, pred.p if flat is None else flat)
        units, acc = unit_accuracy(g, spec, plug)
        codes, _ = pd.factorize(g[spec.unit].astype(str), sort=True)
        n_u = np.bincount(codes, minlength=len(units))
        n_o = np.bincount(codes, weights=obs.astype(float), minlength=len(units))
        s_o = np.bincount(codes, weights=np.where(obs, yobs, 0.0), minlength=len(units))
        naive = np.where(n_o > 0, 100 * s_o / np.maximum(n_o, 1), np.nan)
        stats = summarize_units(acc)
        naive_stats = summarize_units(naive[~np.isnan(naive)]) if (n_o > 0).any() else np.full(len(STATISTICS), np.nan)
        budget_rows.append({**gd, "n_cells": len(g), "n_observed": int(obs.sum()), "fraction": obs.mean(),
                            "note": _single_outcome_note(flat, int(obs.sum()))})
        if n_draws > 0:
            sims, stat_sims = _posterior_accuracy(pred, g, spec, yobs, obs, n_draws, seed, max_draw_cells,
                                                  scale_draws, centre=flat is None)
            lo_u, hi_u = _draws_interval(acc, sims, alpha)
            best = np.bincount(sims.argmax(axis=0), minlength=len(units)) / sims.shape[1]
            worst = np.bincount(sims.argmin(axis=0), minlength=len(units)) / sims.shape[1]
            lo_s, hi_s = _draws_interval(stats, stat_sims, alpha)
            draws_by_group[key] = (units, acc, sims)
        else:
            lo_u = hi_u = best = worst = np.full(len(units), np.nan)
            lo_s = hi_s = np.full(len(STATISTICS), np.nan)
        for i, u in enumerate(units):
            unit_rows.append({**gd, spec.unit: u, "estimate": acc[i], "lo": lo_u[i], "hi": hi_u[i],
                              "observed": naive[i], "n_cells": int(n_u[i]), "n_observed": int(n_o[i]),
                              "p_best": best[i], "p_worst": worst[i]})
        ib, iw = int(np.argmax(acc)), int(np.argmin(acc))
        for j, st in enumerate(STATISTICS):
            row = {**gd, "statistic": st, "estimate": stats[j], "lo": lo_s[j], "hi": hi_s[j], "naive": naive_stats[j],
                   "unit": None, "p_unit": np.nan}
            if st in ("best", "worst"):
                i = ib if st == "best" else iw
                row["unit"] = units[i]
                row["p_unit"] = (best if st == "best" else worst)[i]
            summ_rows.append(row)
    ranks = _rank_table(draws_by_group, gcols, spec, alpha) if n_draws > 0 else pd.DataFrame()
    return BudgetEstimate(pd.DataFrame(unit_rows), pd.DataFrame(summ_rows), ranks, pd.DataFrame(budget_rows),
                          level, spec)


def _single_outcome(y: np.ndarray) -> float | None:
    """The one outcome (0 or 1) of observed cells that all agree, else None. Then the data cannot tell cells
    apart and the fit's probabilities are its prior: the pseudo-count (half a right and half a wrong answer at
    the baseline, :func:`fit_irt`) puts every unobserved cell at about ``0.5 / (n + 1)`` - an accuracy above 0
    that nothing observed supports - so the plug-in keeps the observed outcome (:func:`estimate`)."""
    seen = np.unique(y)
    return float(seen[0]) if len(seen) == 1 else None


def _single_outcome_note(flat: float | None, n_obs: int) -> str:
    if flat is None:
        return ""
    return (f"all {n_obs} observed cells {'right' if flat else 'wrong'}: estimates = the observed {100 * flat:.0f} %; "
            "intervals = posterior draws under the fit's prior")


def _draws_interval(point: np.ndarray, draws: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Equal-tailed interval of the draws themselves, widened to hold ``point`` - for groups whose observed
    cells all agree: the point is then the observed 0 / 100 % at the edge of the draws, and centring the draws
    on it (:func:`_centred_draws`) would move the interval by their prior-driven offset."""
    lo, hi = np.quantile(draws, [alpha, 1 - alpha], axis=-1)
    return np.clip(np.minimum(point, lo), 0, 100), np.clip(np.maximum(point, hi), 0, 100)


class _Predictor:
    """P(correct) of every cell of one group: one fit, or the coverage hurdle (see :func:`estimate`)."""

    def __init__(self, g: pd.DataFrame, spec: GridSpec, prior: str, coverage: bool | None):
        obs = g["correct"].notna()
        has_cov = "covered" in g.columns and g.loc[obs, "covered"].notna().all() and obs.any()
        if coverage and not has_cov:
            raise DataError("estimate(coverage=True): the observed cells need a 'covered' column (0/1)")
        self.hurdle = bool(has_cov if coverage is None else coverage)
        if not self.hurdle:
            self.frames = [g]
            self.fits = [fit_irt(g, spec, prior=prior)]
            return
        cov = pd.to_numeric(g["covered"], errors="coerce").where(obs)
        cor = pd.to_numeric(g["correct"], errors="coerce")
        bad = obs & (cor == 1) & (cov != 1)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DataError(f"estimate: row {i} is correct but not covered (a correct answer is a valid option ID)")
        # the frames each fit was made from (at_scales refits them): covered, then correct where covered
        self.frames = [g.assign(correct=cov)]
        given = g.assign(correct=cor.where(cov == 1))
        if given["correct"].notna().any():  # else nothing was ever covered: P(correct) = P(covered) x 0
            self.frames.append(given)
        self.fits = [fit_irt(fr, spec, prior=prior) for fr in self.frames]

    def at_scales(self, n: int, rng: np.random.Generator) -> list[_Predictor]:
        """``n`` predictors, each fit at prior scales drawn from their posterior (:func:`draw_scales`)."""
        picks = [draw_scales(f, fr, n, rng) for f, fr in zip(self.fits, self.frames)]
        out = []
        for k in range(n):
            p = copy.copy(self)
            p.fits = [pk[k] for pk in picks]
            out.append(p)
        return out

    @property
    def p(self) -> np.ndarray:
        if not self.hurdle:
            return self.fits[0].p
        return self.fits[0].p * (self.fits[1].p if len(self.fits) > 1 else 0.0)

    def draw_p(self, coefs: list[np.ndarray], rows: np.ndarray) -> np.ndarray:
        p = _sigmoid(self.fits[0].eta_of(coefs[0], rows))
        if self.hurdle:
            p = p * (_sigmoid(self.fits[1].eta_of(coefs[1], rows)) if len(self.fits) > 1 else 0.0)
        return p


def _posterior_accuracy(pred: _Predictor, g: pd.DataFrame, spec: GridSpec, y: np.ndarray, obs: np.ndarray,
                        n_draws: int, seed: int, max_draw_cells: int, scale_draws: int,
                        centre: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Posterior-predictive draws of the per-unit accuracies (units x draws) and of their :data:`STATISTICS`
    (statistics x draws).

    ``scale_draws=0``: coefficients from the Laplace posterior at the learnt scales, unobserved cells drawn as
    Bernoulli(p), centred on the plug-in (:func:`_centred_draws`). ``scale_draws=K``: the prior scales are
    uncertain too - K draws of the scales from their posterior (:func:`draw_scales`), at each the MAP again and
    ``n_draws / K`` draws from its Laplace posterior, pooled: a mixture over the scales, which lets the interval
    of a 5 % quantile or of the best variant reach a truth the learnt scales shrink away from (or invent). Each
    set's per-unit accuracies and mean are centred on its own plug-in; its quantiles, best, worst and spread enter
    twice, raw and centred: two approximations of the posterior predictive - Laplace's own centre, pulled towards
    50 %, and the plug-in's, the better point estimate, which cannot reach a variant's true 0 % from a 0.2 %
    estimate. Pooled, they cover the 5 % quantile and the worst variant far more often than the centred draws
    alone; the raw draws alone miss the mean half the time, so the mean keeps the centred ones (the coverage table
    of docs/budget.md). ``centre=False`` (a group whose observed cells all agree: its plug-in is the observed
    0 / 100 %, at the edge of the draws): the draws at the learnt scales, raw.
    Returns (unit draws, statistic draws; with scale draws 2 x ``n_draws`` columns)."""
    rng = np.random.default_rng(seed)
    if not centre or not scale_draws:
        sims = _predictive_draws(pred, g, spec, y, obs, n_draws, rng, max_draw_cells)
        if not centre:
            return sims, summarize_units(sims)
        acc = unit_accuracy(g, spec, np.where(obs, y, pred.p))[1]
        return _centred_draws(acc, sims), _centred_draws(summarize_units(acc), summarize_units(sims))
    preds = pred.at_scales(scale_draws, rng)
    per = [n_draws // scale_draws + (k < n_draws % scale_draws) for k in range(scale_draws)]
    units, stats = [], []
    for p_k, n_k in zip(preds, per):
        if not n_k:
            continue
        acc_k = unit_accuracy(g, spec, np.where(obs, y, p_k.p))[1]
        sims = _predictive_draws(p_k, g, spec, y, obs, n_k, rng, max_draw_cells)
        stat_k = summarize_units(sims)
        centred = _centred_draws(summarize_units(acc_k), stat_k)
        raw = stat_k.copy()
        mean = STATISTICS.index("mean")
        raw[mean] = centred[mean]            # the mean: Laplace's own centre is the one the raw draws get wrong
        units.append(_centred_draws(acc_k, sims))
        stats += [centred, raw]
    return np.concatenate(units, axis=1), np.concatenate(stats, axis=1)


def _centred_draws(point: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """``draws`` (last axis) moved so that their median is ``point``: under the Laplace approximation the draws'
    own centre is pulled towards 50 % (the mean of a sigmoid of a noisy logit) and the order statistics of noisy
    draws are pushed outwards, while the plug-in is the better point estimate (notebook 35)."""
    return draws - np.median(draws, axis=-1, keepdims=True) + np.asarray(point)[..., None]


def _predictive_draws(pred: _Predictor, g: pd.DataFrame, spec: GridSpec, y: np.ndarray, obs: np.ndarray,
                      n_draws: int, rng: np.random.Generator, max_draw_cells: int) -> np.ndarray:
    """Per-unit accuracies (units x draws): coefficient draws from ``pred``'s Laplace posterior, then the
    unobserved cells as Bernoulli(p) - the targets are the accuracies of the *finite* grid."""
    coefs = [f.draw_coefs(n_draws, rng) for f in pred.fits]
    un = np.flatnonzero(~obs)
    codes, units = pd.factorize(g[spec.unit].astype(str), sort=True)
    n_u = np.bincount(codes, minlength=len(units)).astype(float)
    base = np.bincount(codes, weights=np.where(obs, y, 0.0), minlength=len(units))
    tot = np.tile(base[:, None], (1, n_draws))
    step = max(1, max_draw_cells // max(n_draws, 1))
    for s in range(0, len(un), step):
        rows = un[s:s + step]
        p = pred.draw_p(coefs, rows)
        ysim = (rng.random(p.shape) < p).astype(float)
        M = sp.csr_matrix((np.ones(len(rows)), (codes[rows], np.arange(len(rows)))), shape=(len(units), len(rows)))
        tot += np.asarray(M @ ysim)
    return 100 * tot / n_u[:, None]


def _rank_table(draws: dict, gcols: list[str], spec: GridSpec, alpha: float) -> pd.DataFrame:
    """Model ranks per unit (within a dataset) from the plug-in estimates and the joint posterior draws."""
    if "model" not in gcols:
        return pd.DataFrame()
    by_ds: dict[tuple, list] = {}
    for key, val in draws.items():
        gd = dict(zip(gcols, key))
        by_ds.setdefault(tuple(v for c, v in gd.items() if c != "model"), []).append((gd["model"], *val))
    rows = []
    for ds_key, entries in by_ds.items():
        if len(entries) < 2:
            continue
        units = sorted(set.intersection(*(set(e[1]) for e in entries)))
        models = [e[0] for e in entries]
        idx = [[e[1].index(u) for u in units] for e in entries]
        est = np.stack([e[2][ix] for e, ix in zip(entries, idx)])          # models x units
        sims = np.stack([e[3][ix] for e, ix in zip(entries, idx)])         # models x units x draws
        r_est = pd.DataFrame(est).rank(axis=0, method="min", ascending=False).to_numpy()
        # competition ranks per draw: 1 + number of models strictly better
        r_sim = 1 + (sims[None, :, :, :] > sims[:, None, :, :]).sum(axis=1)
        lo, hi = np.quantile(r_sim, [alpha, 1 - alpha], axis=2)
        p1 = (r_sim == 1).mean(axis=2)
        ds = {c: v for c, v in zip([c for c in gcols if c != "model"], ds_key)}
        for mi, m in enumerate(models):
            for ui, u in enumerate(units):
                rows.append({**ds, spec.unit: u, "model": m, "accuracy": est[mi, ui], "rank": int(r_est[mi, ui]),
                             "rank_lo": lo[mi, ui], "rank_hi": hi[mi, ui], "p_rank1": p1[mi, ui]})
    return pd.DataFrame(rows)


# ================================================================================================ designs
def budget_size(n_cells: int, budget: float | int) -> int:
    """Cells for a budget: a fraction in (0, 1] of the grid, or an absolute count (an int > 1)."""
    if isinstance(budget, (int, np.integer)) and not isinstance(budget, bool) and budget > 1:
        return min(int(budget), n_cells)
    b = float(budget)
    if not 0 < b <= 1:
        raise ValueError(f"budget must be a fraction in (0, 1] or a cell count > 1, got {budget!r}")
    return min(n_cells, int(np.ceil(b * n_cells)))


def stratified_order(cells: pd.DataFrame, spec: GridSpec, n: int, seed: int = 0,
                     balance: Sequence[str] | None = None) -> np.ndarray:
    """The first ``n`` positions of a seeded cell sequence balanced over units, questions and ``balance``
    columns (default: the spec's): each step takes a unit with the fewest chosen cells, in it a question with the
    fewest chosen cells (among those with a cell left in that unit), in that (unit, question) the cell whose ``balance``
    values (e.g. the circular shift) the question has used least; ties broken at random. The sequence does not
    depend on ``n`` (a prefix of a longer run is the shorter run), so budgets nest."""
    n = int(min(n, len(cells)))
    rng = np.random.default_rng(seed)
    ucodes, units = pd.factorize(cells[spec.unit].astype(str), sort=True)
    qcodes, questions = pd.factorize(cells[spec.question].astype(str), sort=True)
    bal = [c for c in (spec.balance if balance is None else balance) if c in cells.columns]
    bcodes = (pd.factorize(cells[bal].astype(str).agg("|".join, axis=1), sort=True)[0] if bal
              else np.zeros(len(cells), int))
    U, Q, B = len(units), len(questions), int(bcodes.max()) + 1
    # cells of each (unit, question), in a random order: cells[order[start[g]:start[g] + size[g]]], g = u * Q + q
    perm = rng.permutation(len(cells))
    key = ucodes[perm].astype(np.int64) * Q + qcodes[perm]
    order = perm[np.argsort(key, kind="stable")]
    size = np.bincount(key, minlength=U * Q)
    start = np.r_[0, np.cumsum(size)[:-1]]
    used = np.zeros(len(cells), bool)
    left = size.reshape(U, Q).copy()
    left_u = left.sum(axis=1)
    u_cnt = np.zeros(U)
    q_cnt = np.zeros(Q)
    qb_cnt = np.zeros((Q, B))
    u_key = rng.random(U)
    out = []
    while len(out) < n:
        avail = left_u > 0
        cand = np.flatnonzero(avail & (u_cnt == u_cnt[avail].min()))
        u = int(cand[np.argmin(u_key[cand])])
        u_key[u] = rng.random()
        qs = np.flatnonzero(left[u] > 0)
        qmin = qs[q_cnt[qs] == q_cnt[qs].min()]
        q = int(qmin[rng.integers(len(qmin))])
        g = u * Q + q
        free = [k for k in range(start[g], start[g] + size[g]) if not used[k]]
        k = min(free, key=lambda k: (qb_cnt[q, bcodes[order[k]]], k))
        used[k] = True
        i = int(order[k])
        left[u, q] -= 1
        left_u[u] -= 1
        u_cnt[u] += 1
        q_cnt[q] += 1
        qb_cnt[q, bcodes[i]] += 1
        out.append(i)
    return np.asarray(out, dtype=int)


def adaptive_batch(cells: pd.DataFrame, spec: GridSpec, k: int, seed: int = 0, prior: str = "empirical",
                   max_params: int = 4000) -> np.ndarray:
    """Positions of the next ``k`` unobserved cells of one model's grid: greedy A-optimal design for the
    per-unit accuracies under the Laplace posterior of :func:`fit_irt`.

    Observing cell c (Fisher information ``w x x^T``, ``w = p(1-p)``) lowers the summed variance of the unit
    accuracies by ``w/N_u^2`` (its own Bernoulli variance) plus ``w |G S x|^2 / (1 + w x^T S x)`` (parameter
    uncertainty; ``S`` posterior covariance, ``G`` the gradient of the unit accuracies in the coefficients);
    after each pick ``S`` gets the rank-one update and c leaves ``G``. Deterministic in (observed cells, seed):
    the fit sorts its input, exact ties are broken by a seeded random key."""
    _check(cells, spec, "adaptive_batch")
    obs = cells["correct"].notna().to_numpy()
    cand = np.flatnonzero(~obs)
    if k <= 0 or not len(cand):
        return np.zeros(0, int)
    fit = fit_irt(cells, spec, prior=prior)
    d = fit.design.d + 1
    if d > max_params:
        raise ValueError(f"adaptive_batch: {d} parameters exceed max_params={max_params}; the dense posterior "
                         "covariance would be too large - use the stratified design for a grid this size")
    Xi = sp.hstack([sp.csr_matrix(np.ones((len(cells), 1))), fit.design.X], format="csr")
    p = fit.p
    w = p * (1 - p)
    S = fit.hessian.dense_inverse()
    ucodes, units = pd.factorize(cells[spec.unit].astype(str), sort=True)
    n_u = np.bincount(ucodes, minlength=len(units)).astype(float)
    Xc = Xi[cand]
    wc = w[cand]
    uc = ucodes[cand]
    # G: gradient of the unit accuracies (fractions) in the coefficients, over the still-unobserved cells
    Mu = sp.csr_matrix((wc / n_u[uc], (uc, np.arange(len(cand)))), shape=(len(units), len(cand)))
    G = np.asarray((Mu @ Xc).todense())
    tie = np.random.default_rng([seed, int(obs.sum())]).random(len(cand))
    alive = np.ones(len(cand), bool)
    SX = np.asarray(Xc @ S)                                # cand x d: S x_c
    q = np.asarray(Xc.multiply(SX).sum(axis=1)).ravel()  # x_c^T S x_c
    chosen: list[int] = []
    for _ in range(min(k, len(cand))):
        a = SX @ G.T                                       # cand x units: G S x_c
        score = wc / n_u[uc] ** 2 + wc * np.einsum("cu,cu->c", a, a) / (1 + wc * q)
        score[~alive] = -np.inf
        best = np.flatnonzero(score == score.max())
        j = int(best[np.argmin(tie[best])])
        chosen.append(int(cand[j]))
        alive[j] = False
        # rank-one update of S after observing cell j (kept as S X_c^T and the diagonal terms)
        v = SX[j].copy()
        c = wc[j] / (1 + wc[j] * q[j])
        xv = np.asarray(Xc @ v).ravel()
        SX -= c * np.outer(xv, v)
        q -= c * xv ** 2
        G[uc[j]] -= (wc[j] / n_u[uc[j]]) * Xc[j].toarray().ravel()
    return np.asarray(chosen, dtype=int)
