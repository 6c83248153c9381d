"""Budgeted estimates (mmfragile.budget.estimator, mmfragile.budget): the estimator against scikit-learn and exact
complete-grid values, the designs' balance / nesting / determinism, the simulations against the published tables,
budgeted runs through the real engine (tiny-vlm) and the 5 % target on the committed embedded grid."""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from mmfragile.budget import estimator as bd
from mmfragile.budget import validation as bv
from mmfragile.errors import DataError
from mmfragile.studies.format_bias.prompts import exact_match_score
from mmfragile.studies.format_bias.budget import FORMAT_BIAS
from mmfragile.studies.format_bias.budget import cells as format_bias_cells
from mmfragile.studies.format_bias.budget import simulate_published as simulate_format_grid
from mmfragile.studies.promptception.budget import simulate_published as simulate_promptception_grid


def _grid(n_q: int = 24, seed: int = 0) -> pd.DataFrame:
    """A complete 48-format x circular grid from a known logistic model: format-factor effects, a position bias
    and question difficulties (4 options, so 4 shifts per question)."""
    from mmfragile.studies.format_bias.prompts import all_formats

    rng = np.random.default_rng(seed)
    fx = {"uppercase": 0.4, "lowercase": -0.3, "numbers": 0.1, "roman": -1.2, "dot": 0.2, "colon": 0.0,
          "bracket": -0.1, "double_brackets": -0.6, "line_break": 0.1, "comma": 0.0, "semicolon": -0.1}
    rows = []
    for q in range(n_q):
        b, a0 = rng.normal(0, 1.5), int(rng.integers(4))
        for f in all_formats():
            for s in range(4):
                pos = (a0 - s) % 4
                eta = b + fx[f.option_ids] + fx[f.delimiter] + fx[f.separator] + (0.8 if pos == 0 else -0.2 * pos)
                rows.append({"question": f"q{q}", "format": f.name, "option_id_set": f.option_ids, "delimiter": f.delimiter,
                             "separator": f.separator, "shift": s, "answer_position": pos,
                             "correct": float(rng.random() < 1 / (1 + np.exp(-eta)))})
    return pd.DataFrame(rows).assign(model="m", dataset="d")


def test_map_equals_scikit_learn_logistic_regression():
    g = _grid(8)
    mask = np.zeros(len(g), bool)
    mask[bd.stratified_order(g, FORMAT_BIAS, 600, seed=1)] = True
    h = bv.hide(g, mask)
    fit = bd.fit_irt(h, FORMAT_BIAS, prior="fixed")
    from sklearn.linear_model import LogisticRegression

    sd = np.array([t.sd for t in fit.design.terms])[fit.design.term_of]
    X = fit.design.X[mask] @ sp.diags(sd)                          # prior N(0, sd^2) = L2 on scaled columns
    Xf = sp.vstack([X, sp.csr_matrix((2, X.shape[1]))]).tocsr()   # the two half pseudo-observations at 0
    y = g["correct"].to_numpy()[mask]
    lr = LogisticRegression(C=1.0, tol=1e-12, max_iter=20000).fit(Xf, np.r_[y, 0, 1],
                                                                  sample_weight=np.r_[np.ones(len(y)), .5, .5])
    ref = np.r_[lr.intercept_, lr.coef_.ravel() * sd]
    assert np.abs(fit.coef - ref).max() < 1e-4


def test_laplace_blocks_equal_the_dense_inverse_hessian():
    """The Schur-complement solves, variances and draws equal the plain dense algebra on [1 | X]^T W [1 | X] + P."""
    g = _grid(5)
    mask = np.zeros(len(g), bool)
    mask[bd.stratified_order(g, FORMAT_BIAS, 300, seed=0)] = True
    fit = bd.fit_irt(bv.hide(g, mask), FORMAT_BIAS)
    X = np.hstack([np.ones((mask.sum(), 1)), fit.design.X[mask].toarray()])
    p = fit.p[mask]
    p0 = 1 / (1 + np.exp(-fit.coef[0]))
    prior = np.r_[p0 * (1 - p0), fit.precision[1:]]                     # intercept: the 2 x 0.5 pseudo-obs
    H = X.T @ (X * (p * (1 - p))[:, None]) + np.diag(prior)
    cov = np.linalg.inv(H)
    np.testing.assert_allclose(fit.hessian.dense_inverse(), cov, atol=1e-8)
    np.testing.assert_allclose(fit.hessian.posterior_diag(), np.diag(cov), atol=1e-8)
    draws = fit.hessian.draw(20000, np.random.default_rng(0))
    np.testing.assert_allclose(np.cov(draws[:, :6].T), cov[:6, :6], atol=0.05 * np.abs(cov[:6, :6]).max())


def test_complete_grid_estimates_are_the_grid_itself():
    g = _grid(6)
    est = bd.estimate(g, FORMAT_BIAS, n_draws=50)
    acc = g.groupby("format")["correct"].mean() * 100
    u = est.units.set_index("format")
    np.testing.assert_allclose(u.loc[acc.index, "estimate"], acc, atol=1e-9)
    assert (u["hi"] - u["lo"]).abs().max() < 1e-9                   # nothing left unobserved: no uncertainty
    s = est.summary.set_index("statistic")
    assert s.loc["mean", "estimate"] == pytest.approx(acc.mean())
    assert s.loc["q25", "estimate"] == pytest.approx(np.percentile(acc, 25))
    assert s.loc["best", "unit"] == acc.idxmax() and s.loc["worst", "estimate"] == pytest.approx(acc.min())
    assert est.budget["fraction"].iloc[0] == 1.0


def test_stratified_design_is_balanced_and_nested():
    g = _grid(10)
    spec = FORMAT_BIAS
    a = bd.stratified_order(g, spec, 200, seed=3)
    assert len(set(a)) == 200
    per_format = g.iloc[a]["format"].value_counts()
    assert len(per_format) == 48 and per_format.max() - per_format.min() <= 1
    per_q = g.iloc[a]["question"].value_counts()
    assert len(per_q) == 10 and per_q.max() - per_q.min() <= 2
    # within a question the shifts are used evenly
    shifts = g.iloc[a].groupby("question")["shift"].agg(lambda s: s.value_counts().max() - s.value_counts().min())
    assert shifts.max() <= 1
    # budgets nest and the seed fixes the sequence
    assert list(bd.stratified_order(g, spec, 80, seed=3)) == list(a[:80])
    assert list(bd.stratified_order(g, spec, 80, seed=4)) != list(a[:80])
    assert bd.budget_size(len(g), 0.05) == int(np.ceil(0.05 * len(g))) and bd.budget_size(len(g), 37) == 37


def test_adaptive_batch_is_deterministic_and_row_order_free():
    g = _grid(6)
    mask = np.zeros(len(g), bool)
    mask[bd.stratified_order(g, FORMAT_BIAS, 150, seed=0)] = True
    h = bv.hide(g, mask)
    a = bd.adaptive_batch(h, FORMAT_BIAS, 20, seed=0)
    assert len(a) == 20 and len(set(a)) == 20 and not mask[a].any()
    perm = np.random.default_rng(1).permutation(len(h))
    b = bd.adaptive_batch(h.iloc[perm].reset_index(drop=True), FORMAT_BIAS, 20, seed=0)
    assert sorted(perm[b]) == sorted(a)


def test_estimate_refuses_bad_outcomes():
    g = _grid(2)
    g.loc[3, "correct"] = 2
    with pytest.raises(DataError, match="row 3"):
        bd.estimate(g, FORMAT_BIAS)
    with pytest.raises(DataError, match="lacks column"):
        bd.estimate(g.drop(columns="shift"), FORMAT_BIAS)


def test_simulated_grids_reproduce_the_published_tables():
    from mmfragile.studies.format_bias import metrics as fb
    from mmfragile.studies.promptception import metrics as pc

    sim = simulate_format_grid(datasets=["HRBench-4K"], models=["LLaVA-1.5", "Phi-4"])
    spec = bv.simulation_spec(FORMAT_BIAS)
    tu, _ = bv.truth(sim, spec)
    pub = fb.load_published_results().query("dataset == 'HRBench-4K' and model in ['LLaVA-1.5', 'Phi-4']")
    pub = pub.assign(format=pub.option_ids + "-" + pub.delimiter + "-" + pub.separator)
    m = tu.merge(pub, on=["model", "format"], suffixes=("", "_pub"))
    assert len(m) == 96 and sim.groupby("model")["question"].nunique().eq(800).all()   # Tab. 5: 800 circular items
    assert (m["accuracy"] - m["accuracy_pub"]).abs().max() <= 100 / 800 / 2 + 1e-9      # exact to the item
    ps = simulate_promptception_grid(datasets=["MMStar"], models=["GPT-4o"], max_items=300)
    acc = ps.groupby("prompt_id")["correct"].mean() * 100
    pub = pc.load_published_accuracy().query("benchmark == 'MMStar' and model == 'GPT-4o'").set_index("prompt_id")
    assert len(acc) == 59 and (acc - pub.loc[acc.index, "accuracy"]).abs().max() <= 100 / 300 / 2 + 1e-9


@pytest.mark.parametrize("study, dataset, n_variants", [("format-bias", "HRBench-4K", 48),
                                                         ("promptception", "MMStar", 59)])
def test_every_study_with_a_published_grid_simulates_it_through_the_one_budget_interface(study, dataset, n_variants):
    """What notebooks 35 / 42 call: ``complete_grid("published", study, datasets=...)`` for each study's grid
    (promptception's simulate took ``benchmarks=``, so its notebook failed with a TypeError)."""
    cells, spec, what = bv.complete_grid("published", study, datasets=[dataset], max_items=20)
    assert set(cells["dataset"]) == {dataset} and cells.groupby("model")["question"].nunique().eq(20).all()
    assert cells.groupby("model")[spec.unit].nunique().eq(n_variants).all() and "published" in what


def test_estimator_beats_the_per_format_average_on_a_simulated_grid():
    """PromptEval's finding (their Fig. 3) on a simulated Tab. 9 grid: at 5 % of the cells the model-based
    quantiles are closer to the full grid than the quantiles of the per-format observed means."""
    sim = simulate_format_grid(datasets=["HRBench-4K"], models=["LLaVA-1.5", "Qwen-2.5-VL"], max_items=300)
    cur = bv.error_curves(sim, bv.simulation_spec(FORMAT_BIAS), [0.05], seeds=[0, 1], n_draws=0)
    s = bv.summarize_curves(cur).set_index("method")
    assert s.loc["irt", "quantile_abs_err"] < 0.6 * s.loc["avg", "quantile_abs_err"]
    assert s.loc["irt", "kendall_tau"] >= s.loc["avg", "kendall_tau"]


def test_two_percent_of_a_paper_size_grid_meets_the_targets_and_beats_prompteval():
    """Issue 38's targets at 2 % of the cells, on the simulated Tab. 8 A-OKVQA grid at paper size (4,580 circular
    items x 48 formats x 7 models, seeds 0-1): W1 of the per-format accuracy distribution <= 0.015, 5 / 95 %
    quantile errors <= 2 pp, Kendall tau of the model ranking per format >= 0.85 - and PromptEval's own
    estimators (PE-Rasch, PE-discrete) on the same cells further off in W1. Measured over 10 seeds on all five
    Tab. 8-12 grids (docs/budget.md): the targets hold on the three large datasets, not on HRBench-4K and
    V*Bench (596-800 items: 12-16 cells per format at 2 %)."""
    sim = simulate_format_grid(datasets=["A-OKVQA"])
    assert sim["model"].nunique() == 7 and sim.groupby("model").size().iloc[0] == 4580 * 48
    err = bv.distribution_errors(sim, bv.simulation_spec(FORMAT_BIAS), [0.02], seeds=[0, 1])
    by = err.groupby("method")[["w1", "q05_err", "q95_err", "kendall_tau"]].mean()
    assert by.loc["irt", "w1"] <= 0.015
    assert by.loc["irt", ["q05_err", "q95_err"]].max() <= 2.0
    assert by.loc["irt", "kendall_tau"] >= 0.85
    assert by.loc["irt", "w1"] < by.loc[["pe-rasch", "pe-discrete", "avg"], "w1"].min()


def test_prompteval_estimator_is_their_logistic_regression():
    """PE-Rasch is PromptEval's ExtendedRaschModel: scikit-learn's liblinear L2 logistic regression (C = 100, no
    fitted intercept) on one-hots of the format and the question; observed cells keep their outcome."""
    from sklearn.linear_model import LogisticRegression

    g = _grid(n_q=6)
    h = bv.hide(g, bv.design_mask(g, FORMAT_BIAS, 0.2, 0))
    got = bv.prompteval_estimate(h, FORMAT_BIAS, "pe-rasch").set_index("format")["estimate"]
    X = pd.get_dummies(h[["format", "question"]].astype(str), dtype=float).to_numpy()
    obs = h["correct"].notna().to_numpy()
    lr = LogisticRegression(C=100.0, solver="liblinear", fit_intercept=False, random_state=0)
    p = lr.fit(X[obs], h.loc[obs, "correct"]).predict_proba(X)[:, 1]
    want = h.assign(v=np.where(obs, h["correct"], p)).groupby("format")["v"].mean() * 100
    np.testing.assert_allclose(got.loc[want.index], want, atol=1e-9)


def _planted_formats(roman: float) -> pd.DataFrame:
    from mmfragile.studies.format_bias.prompts import all_formats

    table = pd.DataFrame([{"dataset": "d", "model": "m", "format": f.name, "option_id_set": f.option_ids,
                           "delimiter": f.delimiter, "separator": f.separator,
                           "accuracy": roman if f.option_ids == "roman" else 70.0} for f in all_formats()])
    return bv.simulate_grid(table, "dataset", ["format", "option_id_set", "delimiter", "separator"], {"d": 300},
                            2.0, 0.8, 0, None)


@pytest.mark.parametrize("roman, spread_below, share", [(70.0, 1.0, (0.4, 1.0)), (30.0, 5.0, (0.0, 0.0))])
def test_scale_posterior_finds_a_planted_format_effect_and_none_where_none(roman, spread_below, share):
    """Known answers for the prior-scale posterior (5 % of a simulated 300-item grid, 40 scale draws): with every
    format at 70 % (no effect planted: the true spread is 0) at least 40 % of the draws have per-format accuracies
    that spread less than 1 pp (measured 31 of 40) - the learnt scales alone say more (1.07 pp); with the 12 roman
    formats planted at 30 % (a true standard deviation of 17.3 pp) none lies below 5 pp."""
    spec = bv.simulation_spec(FORMAT_BIAS)
    g = _planted_formats(roman)
    h = bv.hide(g, bv.design_mask(g, spec, 0.05, 0))
    fit = bd.fit_irt(h, spec)
    joint, *own = bd.scale_posterior(fit, h)
    variant_terms = [t for t in fit.sd if t != "question"]
    assert all(len(p.weights) == len(bd.SCALE_FACTORS) and np.isclose(p.weights.sum(), 1.0) for p in [joint, *own])
    assert list(joint.terms) == variant_terms
    assert [p.terms for p in own] == [(t,) for t in variant_terms if fit.sd[t] > bd.NEGLIGIBLE_SD]
    draws = bd.draw_scales(fit, h, 40, np.random.default_rng(0))
    spread = np.array([bd.unit_accuracy(h, spec, f.p)[1].std() for f in draws])
    lo, hi = share
    assert lo <= (spread < spread_below).mean() <= hi
    learnt = bd.unit_accuracy(h, spec, fit.p)[1].std()
    assert learnt >= spread_below if roman == 70.0 else learnt > 15


def test_scale_mixture_intervals_cover_more_often_than_the_learnt_scales():
    """Coverage against a known truth: 5 % of the simulated Tab. 8 A-OKVQA grid (400 items, 7 models, seeds 0-3),
    nominal 90 % intervals. With the prior scales integrated over (the default) the mean and the per-format
    accuracies are covered 85-97 % of the time (measured 0.93 / 0.93), the 5 % quantile and the worst format at
    least 80 % (0.86 / 0.82; at the learnt scales alone 0.50 / 0.46), and all statistics together more often
    (0.81 vs 0.69); the best format and the median stay below nominal (0.57 / 0.61: docs/budget.md)."""
    spec = bv.simulation_spec(FORMAT_BIAS)
    sim = simulate_format_grid(datasets=["A-OKVQA"], max_items=400)
    cov = {}
    for draws in (0, 8):
        cur = bv.error_curves(sim, spec, [0.05], seeds=range(4), n_draws=200, scale_draws=draws)
        st = cur["stats"][cur["stats"]["method"] == "irt"]
        cov[draws] = (st.groupby("statistic")["covered"].mean(), cur["units"]["coverage"].mean())
    by_stat, per_variant = cov[8]
    assert 0.85 <= by_stat["mean"] <= 0.97 and 0.85 <= per_variant <= 0.97
    assert by_stat[["q05", "worst"]].min() >= 0.8 > cov[0][0][["q05", "worst"]].max()
    assert by_stat.mean() >= cov[0][0].mean() + 0.05


def test_the_best_format_interval_reaches_a_flat_models_truth():
    """Simulated LLaVA-OneVision on MMBench (Tab. 8: 44 of 48 formats at 84-85.5 %, the lowercase double-bracket
    formats broken) at 2 %: noise among 20 cells a format puts the best format's estimate at 88-91 %, 85.5 % true.
    With one factor per variant term in the scale posterior the 90 % intervals reach the truth for the best format
    in 3 of 4 seeds and for the 95 % quantile in 4 of 4 (one joint factor on all terms: 0 and 2 of 4)."""
    spec = bv.simulation_spec(FORMAT_BIAS)
    sim = simulate_format_grid(datasets=["MMBench"], max_items=1000)
    cur = bv.error_curves(sim[sim["model"] == "LLaVA-OV"].reset_index(drop=True), spec, [0.02], seeds=range(4),
                          n_draws=200)
    st = cur["stats"][cur["stats"]["method"] == "irt"].set_index(["statistic", "seed"])
    assert np.allclose(st.loc["best", "truth"], 85.5, atol=0.05)
    assert (st.loc["best", "estimate"] > 88).all()                 # the invented top the intervals must reach
    assert st.loc["best", "covered"].sum() >= 3 and st.loc["q95", "covered"].sum() == 4


def _errors(cells, design, seed):
    spec = FORMAT_BIAS
    truth = bv.truth(cells, spec)[1].set_index("statistic")["truth"]
    est = bd.estimate(bv.hide(cells, bv.design_mask(cells, spec, 0.05, seed, design)), spec, n_draws=0)
    assert est.budget["n_observed"].iloc[0] == 108                          # 5 % of 2,160 cells
    return (est.summary.set_index("statistic")["estimate"] - truth).abs()


def test_five_percent_of_the_embedded_grid():
    """Issue 13's target on a fixed complete grid - the committed smollm2-vlm x easy-VQA grid (20 questions,
    48 formats x circular shifts = 2,160 cells): from 5 % of the cells (108 model calls) the 48-format mean
    within 1 pp and the quantiles within 2 pp of the full grid.

    Measured on this grid (the same code; notebook 35 shows the curves):
    * adaptive design, seeds 0-9: mean |error| max 0.70 pp (10/10 within 1 pp); 50/75/95 % quantiles max
      0.62 pp; 25 % quantile mean 0.99, max 2.09 pp (9/10 within 2 pp); 5 % quantile mean 3.0, max 6.5 pp
      (3/10 within 2 pp);
    * stratified design, seeds 0-19: mean |error| mean 0.61, max 2.12 pp (17/20 within 1 pp); 50-95 %
      quantiles max 1.23 pp; 25 % quantile mean 1.13, max 3.03 pp; 5 % quantile mean 6.0, max 13.3 pp.
    So the target is met for the mean and the 25-95 % quantiles with the adaptive design and NOT for the 5 %
    quantile: it lies among the 3-4 formats the model cannot answer in (lowercase IDs with double brackets:
    coverage 0-4 %; with a colon: 44-56 %), and 108 cells leave about 2 per format - whether a lowercase-colon
    format scores 20 or 30 % is not in the data. The asserted bounds are the target where it is met and the
    measured maximum (rounded up) where it is not; the seeds are the first ones, not picked."""
    cells = bv.load_embedded_grid("format-bias")
    assert len(cells) == 2160 and cells["question"].nunique() == 20
    for seed in (0, 1):
        e = _errors(cells, "adaptive", seed)
        assert e["mean"] <= 1.0
        assert e[["q25", "q50", "q75", "q95"]].max() <= 2.0
        assert e["q05"] <= 7.0                                                 # target 2 pp: not reached, see above
    strat = pd.DataFrame([_errors(cells, "stratified", seed) for seed in range(5)])
    assert strat["mean"].mean() <= 1.0 and strat[["q50", "q75", "q95"]].max().max() <= 2.0
    assert strat["q25"].max() <= 3.1 and strat["q05"].max() <= 13.5             # measured maxima (20 seeds)


def test_the_committed_promptception_grid_recovers_the_planted_categories():
    """Study 2's committed grid (zoo-follower on 60 easy-VQA questions x the 59 image prompts = 3,540 cells; its
    fine-tune planted prompt sensitivity in the 7 held-out categories: true accuracy 72.2 % on the trained
    categories' prompts, 64.5 % on the held-out ones; the two lowest categories, 2 (structured formatting, 50.9 %)
    and 3 (prompt position, 63.3 %), both held out). From 5 % and 10 % of the cells (177 / 354; seeds 0-4, not
    picked) the estimate puts the held-out prompts below the trained ones every time and its lowest category is
    always category 2 or 3, and the per-prompt 90 % intervals hold the full grid's accuracy 85-97 % of the time
    (measured: gap 0.8-9.5 pp, coverage 0.90 on average)."""
    from mmfragile.studies.promptception.budget import PROMPTCEPTION

    cells = bv.load_embedded_grid("promptception")
    assert len(cells) == 3540 and cells["question"].nunique() == 60
    assert cells.groupby("question")["prompt_id"].nunique().eq(59).all()
    held_out = {"2", "3", "6", "7", "10", "11", "15"}
    units, _ = bv.truth(cells, PROMPTCEPTION)

    def by_category(frame, col):
        cat = frame["prompt_id"].str.split(".").str[0]
        return frame[~cat.isin(held_out)][col].mean() - frame[cat.isin(held_out)][col].mean(), \
            frame.groupby(cat)[col].mean().idxmin()

    true_gap, true_worst = by_category(units, "accuracy")
    assert round(true_gap, 1) == 7.7 and true_worst == "2"
    covered = []
    for budget in (0.05, 0.1):
        for seed in range(5):
            est = bd.estimate(bv.hide(cells, bv.design_mask(cells, PROMPTCEPTION, budget, seed)), PROMPTCEPTION,
                              n_draws=200)
            gap, worst = by_category(est.units, "estimate")
            assert gap > 0 and worst in {"2", "3"}, (budget, seed, gap, worst)
            m = est.units.merge(units, on="prompt_id")
            covered.append(((m["lo"] <= m["accuracy"]) & (m["accuracy"] <= m["hi"])).mean())
    assert 0.85 <= np.mean(covered) <= 0.97


# ---------------------------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def tiny_items(tiny_vlm, synthetic):
    from mmfragile.studies.format_bias.items import format_bias_items

    return format_bias_items(tiny_vlm, synthetic.head(2), include_standard=False)


def _done(store, items, name):
    return {tuple(it.key[c] for c in ("question_id", "variant")) for it in items
            if store.is_done({"model": name, **it.key})}


def test_budgeted_run_is_resumable_and_budgets_nest(tiny_vlm, tiny_items, tmp_path):
    from mmfragile.budget import run_budgeted
    from mmfragile.store import ResultStore

    spec = FORMAT_BIAS
    full = ResultStore(tmp_path / "a", config={"study": "format-bias"})
    run_budgeted(tiny_vlm, tiny_items, full, spec, 0.1, score_fn=exact_match_score, seed=2, progress=False)
    want = _done(full, tiny_items, tiny_vlm.name)
    assert len(want) == bd.budget_size(len(tiny_items), 0.1)
    killed = ResultStore(tmp_path / "b", config={"study": "format-bias"})
    run_budgeted(tiny_vlm, tiny_items, killed, spec, 0.1, score_fn=exact_match_score, seed=2, progress=False,
                 stop_after=10, flush_every=5)
    assert 0 < len(killed) < len(want)
    run_budgeted(tiny_vlm, tiny_items, killed, spec, 0.1, score_fn=exact_match_score, seed=2, progress=False)
    assert _done(killed, tiny_items, tiny_vlm.name) == want
    run_budgeted(tiny_vlm, tiny_items, full, spec, 0.2, score_fn=exact_match_score, seed=2, progress=False)
    more = _done(full, tiny_items, tiny_vlm.name)
    assert want < more and len(more) == bd.budget_size(len(tiny_items), 0.2)


def test_adaptive_run_depends_only_on_store_and_seed(tiny_vlm, tiny_items, tmp_path):
    from mmfragile.budget import attach_outcomes, item_cells, run_budgeted
    from mmfragile.store import ResultStore

    spec = FORMAT_BIAS
    sets = []
    for name in ("x", "y"):
        st = ResultStore(tmp_path / name, config={"study": "format-bias"})
        run_budgeted(tiny_vlm, tiny_items, st, spec, 0.12, score_fn=exact_match_score, seed=5, adaptive=True,
                     batch=8, progress=False)
        sets.append(_done(st, tiny_items, tiny_vlm.name))
    assert sets[0] == sets[1] and len(sets[0]) == bd.budget_size(len(tiny_items), 0.12)
    # the store alone rebuilds the same grid as the items (answer positions from option IDs and shifts)
    cells = attach_outcomes(item_cells(tiny_items, spec), st, tiny_vlm.name)
    rebuilt = format_bias_cells(st.read())
    m = rebuilt.merge(cells, on=["dataset", "question_id", "variant"], suffixes=("", "_items"))
    assert len(m) == len(cells) == len(rebuilt)
    assert (m["answer_position"] == m["answer_position_items"]).all()
    assert (m["correct"].fillna(-1) == m["correct_items"].fillna(-1)).all()


def test_promptception_budget_from_the_cli_and_the_api_is_the_same_design(tmp_path, tiny_vlm, capsys):
    """`mmfragile run promptception --budget` runs the stratified share of the question x prompt grid - the same
    cells as run_study(..., budget=) - and prints the estimate of the whole grid; a second budget only adds cells."""
    from mmfragile.cli import main
    from mmfragile.store import ResultStore
    from mmfragile.study import run_study

    args = ["run", "promptception", "--model", "tiny-vlm", "--dataset", "synthetic-vqa", "--n", "4",
            "--prompt-ids", "1.1,2.1,5.2,7.6,12.1", "--max-new-tokens", "4", "--n-frames", "2", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "cli"), "--budget", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "n_observed" in out and "mean" in out                     # the estimate of the whole grid
    api = run_study("promptception", tiny_vlm, "synthetic-vqa", n=4, out=tmp_path / "api", budget=0.3,
                    prompt_ids=["1.1", "2.1", "5.2", "7.6", "12.1"], max_new_tokens=4, n_frames=2, progress=False)
    cli_rows = ResultStore(tmp_path / "cli").read()
    n_cells = 4 * 5                                                  # 4 questions x 5 prompts (none video-only)
    assert len(cli_rows) == round(0.3 * n_cells) == len(api.table())
    key = ["question_id", "variant"]
    assert sorted(map(tuple, cli_rows[key].values)) == sorted(map(tuple, api.table()[key].values))
    assert main([*args, "--out", str(tmp_path / "cli"), "--budget", "0.5"]) == 0     # budgets nest
    assert len(ResultStore(tmp_path / "cli").read()) == round(0.5 * n_cells)


@pytest.mark.parametrize("outcome", [0.0, 1.0])
def test_observations_that_all_agree_give_the_observed_value(outcome):
    """Every observed cell wrong (right): the estimate of every format and statistic is the observed 0 % (100 %),
    not the fit's prior (its pseudo-count put every unobserved cell near 0.5 / (n + 1), i.e. ~1 %); the interval
    keeps the observed value, is not a point (the draws), and is at most twice the rule-of-three bound 3 / n."""
    g = _grid(8)
    mask = np.zeros(len(g), bool)
    mask[bd.stratified_order(g, FORMAT_BIAS, int(0.05 * len(g)), seed=0)] = True
    est = bd.estimate(bv.hide(g.assign(correct=outcome), mask), FORMAT_BIAS, n_draws=200)
    n_obs = int(mask.sum())
    assert est.budget["n_observed"].iloc[0] == n_obs == 76
    level = est.summary[est.summary["statistic"] != "spread"]
    assert (est.units["estimate"] == 100 * outcome).all() and (level["estimate"] == 100 * outcome).all()
    assert est.summary.set_index("statistic").loc["spread", "estimate"] == 0   # every format the same
    mean = est.summary.set_index("statistic").loc["mean"]
    near, far = (mean["lo"], mean["hi"]) if outcome == 0 else (100 - mean["hi"], 100 - mean["lo"])
    assert near == 0 and 0 < far <= 2 * 100 * 3 / n_obs
    assert ((est.units["lo"] <= 100 * outcome) & (100 * outcome <= est.units["hi"])).all()
    assert est.budget["note"].iloc[0].startswith(f"all {n_obs} observed cells {'right' if outcome else 'wrong'}")


def _printed_table(out: str, header: list[str]) -> pd.DataFrame:
    """The console table whose column line starts with ``header`` (whitespace-separated; only its last column may
    hold spaces), up to the next heading or column line."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.split()[:len(header)] == header)
    head = lines[start].split()
    body = []
    for ln in lines[start + 1:]:
        row = ln.split(None, len(head) - 1)
        if ln.startswith("#") or len(row) != len(head):
            break
        body.append(row)
    return pd.DataFrame(body, columns=head)


BUDGET_HEADER, ESTIMATE_HEADER = ["dataset", "model", "n_cells"], ["model", "statistic", "estimate"]


@pytest.fixture(scope="module")
def budgeted_console(tmp_path_factory, tiny_vlm):
    """A budgeted format-bias store on tiny-vlm (run_study, 10 % of 2 questions) and what `mmfragile run --budget`
    prints for it (the run resumes: nothing left to run, only the tables)."""
    from mmfragile.cli import main
    from mmfragile.study import run_study

    out = tmp_path_factory.mktemp("budgeted") / "fb"
    run = run_study("format-bias", tiny_vlm, "synthetic-vqa", n=2, out=out, budget=0.1, progress=False)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["run", "format-bias", "--model", "tiny-vlm", "--dataset", "synthetic-vqa", "--n", "2", "--out",
                     str(out), "--budget", "0.1", "--quiet"]) == 0
    return out, buf.getvalue(), list(run.summary())


def test_console_and_report_print_the_same_budget_estimate(budgeted_console, tiny_vlm, tmp_path):
    """`mmfragile run --budget` and `mmfragile report` on one budgeted store print the same estimate - one function
    (estimate_store), one level / draw count / seed: every statistic and interval end equal to display precision."""
    from mmfragile.report import build_report, metric_key

    out, printed, _ = budgeted_console
    console = _printed_table(printed, ESTIMATE_HEADER)
    rep = build_report([out], tmp_path / "report", n_boot=20)
    prefix = metric_key("budget", "formats", tiny_vlm.name, "synthetic-vqa")
    assert rep.metrics[f"{prefix}/n_observed"] == int(_printed_table(printed, BUDGET_HEADER)["n_observed"].iloc[0])
    assert list(console["statistic"]) == list(bd.STATISTICS)
    for row in console.itertuples():
        for col, suffix in (("estimate", ""), ("lo", "/ci_low"), ("hi", "/ci_high")):
            shown = float(getattr(row, col))
            assert shown == pytest.approx(rep.metrics[f"{prefix}/{row.statistic}{suffix}"], abs=0.05 + 1e-9), (
                row.statistic, col)


def test_every_console_table_has_a_heading(budgeted_console):
    """The study's summary tables, then the budget and the estimate: each under its own `# name` line."""
    _, printed, summaries = budgeted_console
    lines = [ln for ln in printed.splitlines() if ln.strip()]
    headings = [(i, ln) for i, ln in enumerate(lines) if ln.startswith("# ")]
    assert [ln.split()[1] for _, ln in headings] == [*summaries, "budget", "estimate"]
    assert lines[headings[-2][0] + 1].split()[:3] == BUDGET_HEADER
    assert lines[headings[-1][0] + 1].split()[:3] == ESTIMATE_HEADER



@pytest.mark.parametrize("study, subset, n, n_cells", [
    ("promptception", ["--prompt-ids", "1.1,2.1,5.2", "--max-new-tokens", "4"], 4, 4 * 3),
    ("format-bias", ["--formats", "uppercase-dot-line_break,numbers-colon-comma"], 2, None)])
def test_a_budget_over_a_subset_estimates_that_subset_not_the_catalogue(tmp_path, capsys, study, subset, n, n_cells):
    """A budgeted run over --prompt-ids / --formats samples that subset's grid, and the estimate it prints (the
    report's numbers) is over that grid - 4 questions x 3 prompts; 2 questions x 2 formats x every shift - not
    over the whole catalogue of 59 prompts / 48 formats it never asked for."""
    from mmfragile.cli import main
    from mmfragile.store import ResultStore

    out = tmp_path / "b"
    assert main(["run", study, "--model", "tiny-vlm", "--dataset", "synthetic-vqa", "--n", str(n), *subset,
                 "--out", str(out), "--budget", "0.5", "--quiet"]) == 0
    printed = capsys.readouterr().out
    table = printed.split("# budget")[1].splitlines()
    cols, values = table[1].split(), table[2].split()
    if n_cells is None:   # every (question, format, shift) cell: 2 formats x the question's option count
        rows = ResultStore(out).read()
        n_cells = 2 * sum(len(o) for o in rows.drop_duplicates("question_id")["option_ids"])
    assert int(values[cols.index("n_cells")]) == n_cells


@pytest.mark.parametrize("what", ["errors", "coverage", "auto"])
def test_the_comparison_script_runs_on_the_embedded_grid(what, tmp_path, capsys, load_script):
    """scripts/budget_comparison.py (docs/budget.md's tables) on one budget and seed of the embedded grid."""
    mod = load_script("budget_comparison")
    args = ["--target", "10", "--stop-on", "mean"] if what == "auto" else []
    assert mod.main([what, "embedded", "format-bias", "--budgets", "0.05", "--seeds", "1", "--out", str(tmp_path),
                     *args]) == 0
    suffix = "_target10_mean" if what == "auto" else ""
    table = pd.read_csv(tmp_path / f"{what}_format-bias_embedded{suffix}.csv")
    if what == "auto":   # stopped where the mean's interval is <= 10 pp wide: a share, and the error it made
        (row,) = table.to_dict("records")
        assert row["statistic"] == "mean" and 0 < row["share"] <= 1 and row["reached"]
        assert row["within"] == (abs(row["estimate"] - row["truth"]) <= 10)
    elif what == "errors":
        w1 = table.set_index("method")["w1"]
        assert set(w1.index) == {"irt", "pe-rasch", "pe-discrete", "avg"} and w1["irt"] < w1["avg"]
    else:
        assert sorted(table["scale_draws"]) == [0, 8] and {"mean", "q05", "worst", "variant"} <= set(table.columns)
        assert table[["mean", "variant"]].stack().between(0, 1).all()
    assert "embedded" in capsys.readouterr().out


def test_make_budget_grid_writes_the_committed_grid_of_a_promptception_store(tmp_path, tiny_vlm, load_script):
    """scripts/make_budget_grid.py --study promptception on a complete tiny grid (2 questions x every image
    prompt): the file keeps the study's CommittedGrid columns, and load_embedded_grid's expansion of it gives the
    store's cell frame back - every covariate and outcome - with covered as stored."""
    from mmfragile.store import find_stores
    from mmfragile.study import budget_stage, run_study
    from mmfragile.studies.promptception.budget import COMMITTED, GRID
    from mmfragile.studies.promptception.prompts import get_prompt_type, prompt_ids

    run_study("promptception", tiny_vlm, "synthetic-vqa", n=2, out=tmp_path / "run", max_new_tokens=4,
              n_frames=2, progress=False)
    load_script("make_budget_grid").main(["--study", "promptception", str(tmp_path / "run"), str(tmp_path / "grid.parquet")])
    raw = pd.read_parquet(tmp_path / "grid.parquet")
    assert list(raw.columns) == list(COMMITTED.columns)
    got = bv.committed_cells(COMMITTED, raw)
    (store,) = find_stores(tmp_path / "run", "promptception", budget_stage("promptception").tag)
    rows = GRID.read(store)
    want = GRID.cells(rows)
    key = ["question_id", "prompt_id"]
    m = want.merge(got, on=key, suffixes=("", "_file"))
    assert len(m) == len(want) == len(got) == len(rows) and set(got["question_id"]) == set(rows["question_id"])
    per_question = got.groupby("question_id").agg(n=("prompt_id", "nunique"), modality=("modality", "first"))
    assert all(n == sum(get_prompt_type(p).supports(modality) for p in prompt_ids(include_baseline=False))
               for n, modality in zip(per_question["n"], per_question["modality"]))
    for col in ("variant", "category", "supercategory", "intent", "question", "answer_position", "correct"):
        assert (m[col].astype(str) == m[f"{col}_file"].astype(str)).all(), col
    stored = rows.astype({"question_id": str, "variant": str}).set_index(["question_id", "variant"])["covered"]
    assert (got.set_index(["question_id", "prompt_id"])["covered"] == stored.reindex(
        got.set_index(["question_id", "prompt_id"]).index).astype(bool)).all()
