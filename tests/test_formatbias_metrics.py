"""Study 1 metrics on tiny, hand-computed per-question and per-format frames."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from mmfragile.studies.format_bias import metrics as fb
from mmfragile.errors import DataError


def _rows(model, ds, fmt, items, **extra):
    """items: list of (question_id, shift, correct, covered, selected_position)."""
    oid, de, se = fmt
    return [dict(model=model, dataset=ds, question_id=q, shift=s, option_ids=oid, delimiter=de, separator=se,
                 correct=c, covered=v, selected_position=p, **extra) for q, s, c, v, p in items]


F_UP = ("uppercase", "dot", "comma")
F_NUM = ("numbers", "dot", "comma")


# ------------------------------------------------------------------------------------------ scoring

def test_format_scores_counts_every_shift():
    # 2 questions x 2 shifts = 4 evaluations per format (N x O)
    pq = pd.DataFrame(
        _rows("M", "D", F_UP, [("q1", 0, True, True, 0), ("q1", 1, True, True, 1),
                               ("q2", 0, False, True, 1), ("q2", 1, False, False, -1)])
        + _rows("M", "D", F_NUM, [("q1", 0, False, False, -1), ("q1", 1, False, False, -1),
                                  ("q2", 0, False, False, -1), ("q2", 1, True, True, 0)]))
    s = fb.format_scores(pq).set_index("option_ids")
    assert s.loc["uppercase", "accuracy"] == 50.0 and s.loc["uppercase", "coverage"] == 75.0
    assert s.loc["numbers", "accuracy"] == 25.0 and s.loc["numbers", "coverage"] == 25.0
    assert s.n_questions.tolist() == [4, 4]
    assert list(s.index) == ["uppercase", "numbers"]  # paper order


def test_format_accuracy_ci_resamples_questions_with_all_their_shifts():
    # F_UP: q1 right in all 3 shifts, q2 wrong in both of its 2 -> 3/5 = 60 % (as format_scores counts items);
    # a resample holds q1 twice (100 %), q1 + q2 (60 %) or q2 twice (0 %): the 95 % interval spans 0-100.
    # F_NUM: q1 1 of 3, q2 2 of 2 -> 60 %; resamples give 33.3 / 60 / 100 %.
    pq = pd.DataFrame(
        _rows("M", "D", F_UP, [("q1", 0, True, True, 0), ("q1", 1, True, True, 1), ("q1", 2, True, True, 2),
                               ("q2", 0, False, True, 1), ("q2", 1, False, True, 0)])
        + _rows("M", "D", F_NUM, [("q1", 0, True, True, 0), ("q1", 1, False, True, 0), ("q1", 2, False, True, 0),
                                  ("q2", 0, True, True, 0), ("q2", 1, True, True, 1)]))
    ci = fb.format_accuracy_ci(pq, n_boot=4000, seed=1).set_index("option_ids")
    scores = fb.format_scores(pq).set_index("option_ids")
    assert ci.accuracy.tolist() == pytest.approx(scores.accuracy.tolist()) == [60.0, 60.0]
    assert (ci.loc["uppercase", "ci_low"], ci.loc["uppercase", "ci_high"]) == (0.0, 100.0)
    assert ci.loc["numbers", "ci_low"] == pytest.approx(100 / 3) and ci.loc["numbers", "ci_high"] == 100.0
    assert ci.n_questions.tolist() == [2, 2]
    # one question: no spread; a higher level never narrows the interval
    one = fb.format_accuracy_ci(pq[pq.question_id == "q1"])
    assert (one.ci_low == one.accuracy).all() and (one.ci_high == one.accuracy).all()
    narrow = fb.format_accuracy_ci(pq, level=0.5, n_boot=4000, seed=1).set_index("option_ids")
    assert (narrow.ci_high - narrow.ci_low <= ci.ci_high - ci.ci_low).all()
    with pytest.raises(ValueError, match="level"):
        fb.format_accuracy_ci(pq, level=95)


def test_format_scores_rejects_bad_input():
    pq = pd.DataFrame(_rows("M", "D", F_UP, [("q1", 0, True, False, -1)]))
    with pytest.raises(DataError, match="row 0"):
        fb.format_scores(pq)
    with pytest.raises(DataError, match="missing column"):
        fb.format_scores(pq.drop(columns="covered"))


# ------------------------------------------------------------------------------------------ ranks

def _scores(values: dict, fmt=F_UP, ds="D", coverage=100.0):
    oid, de, se = fmt
    return pd.DataFrame([dict(model=m, dataset=ds, option_ids=oid, delimiter=de, separator=se, accuracy=a,
                              coverage=coverage) for m, a in values.items()])


def test_format_ranks_with_ties():
    s = pd.concat([_scores({"a": 80.0, "b": 80.0, "c": 70.0, "d": 90.0}),
                   _scores({"a": 10.0, "b": 30.0, "c": 20.0, "d": 20.0}, fmt=F_NUM),
                   _scores({"a": 1.0, "b": 2.0}, ds="E")])
    r = fb.format_ranks(s)
    got = {(ds, f, m): int(k) for ds, f, m, k in zip(r.dataset, r.option_ids, r.model, r["rank"])}
    assert got[("D", "uppercase", "d")] == 1
    assert got[("D", "uppercase", "a")] == got[("D", "uppercase", "b")] == 2   # tie -> both 2
    assert got[("D", "uppercase", "c")] == 4                                    # then 4 (competition)
    assert [got[("D", "numbers", m)] for m in "abcd"] == [4, 1, 2, 2]
    assert [got[("E", "uppercase", m)] for m in "ab"] == [2, 1]
    # rounding before ranking creates ties
    r2 = fb.format_ranks(_scores({"a": 50.0004, "b": 50.0001}), decimals=3)
    assert r2["rank"].tolist() == [1, 1]


def test_rank_distribution_counts():
    s = pd.concat([_scores({"a": 3.0, "b": 2.0, "c": 1.0}, fmt=F_UP),
                   _scores({"a": 1.0, "b": 2.0, "c": 3.0}, fmt=F_NUM),
                   _scores({"a": 3.0, "b": 1.0, "c": 1.0}, fmt=("roman", "dot", "comma"))])
    d = fb.rank_distribution(fb.format_ranks(s))
    a = d[d.model == "a"].set_index("rank")
    assert a.n_formats.tolist() == [2, 0, 1] and a.share.tolist() == pytest.approx([2 / 3, 0, 1 / 3])
    c = d[d.model == "c"].set_index("rank")
    assert c.n_formats.tolist() == [1, 1, 1]   # ranks 3, 1, 2 (tie with b at 2)
    assert c.median_rank.iloc[0] == 2.0 and c.min_rank.iloc[0] == 1 and c.max_rank.iloc[0] == 3


# ------------------------------------------------------------------------------------------ factor aggregates

EFFECTS = {"uppercase": 6, "lowercase": 0, "numbers": -10, "roman": 0, "dot": 0, "colon": 0, "bracket": 0,
           "double_brackets": -4, "line_break": 3, "comma": 0, "semicolon": 0}


def _additive(groups, noise=None):
    rows = []
    for gi, (m, ds) in enumerate(groups):
        for k, (oid, de, se) in enumerate(itertools.product(*(fb.LEVELS[f] for f in fb.FACTORS))):
            acc = 50 + 5 * gi + EFFECTS[oid] + EFFECTS[de] + EFFECTS[se]
            if noise is not None:
                acc += noise[gi * 48 + k]
            rows.append(dict(model=m, dataset=ds, option_ids=oid, delimiter=de, separator=se, accuracy=acc,
                             coverage=100.0))
    return pd.DataFrame(rows)


def test_deviation_from_mean_hand_computed():
    dev = fb.deviation_from_mean(_additive([("M", "D")]))
    d = dev.set_index("level")
    # ID effects 6, 0, -10, 0 (mean -1); delimiter 0, 0, 0, -4 (mean -1); separator 3, 0, 0 (mean 1)
    expect = {"uppercase": 7, "lowercase": 1, "numbers": -9, "roman": 1, "dot": 1, "colon": 1, "bracket": 1,
              "double_brackets": -3, "line_break": 2, "comma": -1, "semicolon": -1}
    for lvl, v in expect.items():
        assert d.loc[lvl, "deviation"] == pytest.approx(v)
    assert d.loc["uppercase", "n_formats"] == 12 and d.loc["comma", "n_formats"] == 16
    assert list(dev.level) == [l for f in fb.FACTORS for l in fb.LEVELS[f]]


def test_coverage_by_factor_and_neutral_filter():
    rows = [("uppercase", 80.0, 100.0), ("lowercase", 70.0, 75.0), ("numbers", 0.0, 0.0), ("roman", 30.0, 74.9)]
    s = pd.DataFrame([dict(model="M", dataset="D", option_ids=o, delimiter="dot", separator="comma",
                           accuracy=a, coverage=c) for o, a, c in rows])
    cov = fb.coverage_by_factor(s).set_index("level")
    assert cov.loc["numbers", "coverage"] == 0.0
    assert cov.loc["dot", "coverage"] == pytest.approx((100 + 75 + 0 + 74.9) / 4)
    full = fb.deviation_from_mean(s).set_index("level")       # mean 45
    assert full.loc["uppercase", "deviation"] == 35 and full.loc["numbers", "deviation"] == -45
    cn = fb.coverage_neutral(s).set_index("level")             # keeps coverage >= 75: mean (80+70)/2
    assert cn.loc["uppercase", "deviation"] == 5 and cn.loc["lowercase", "deviation"] == -5
    assert np.isnan(cn.loc["numbers", "deviation"]) and cn.loc["numbers", "n_formats"] == 0
    assert np.isnan(cn.loc["roman", "deviation"])               # 74.9 < 75 -> filtered
    assert cn.loc["dot", "deviation"] == 0 and cn.loc["dot", "n_formats"] == 2
    cn50 = fb.coverage_neutral(s, threshold=50).set_index("level")
    assert cn50.loc["roman", "deviation"] == pytest.approx(30 - 60)


def test_pseudo_gt_hand_computed():
    s = pd.concat([_scores({"a": 80.0, "b": 60.0}), _scores({"a": 40.0, "b": 60.0}, fmt=F_NUM)])
    pg = fb.pseudo_gt(s).set_index("model")
    assert pg.loc["a", "accuracy"] == 60 and pg.loc["b", "accuracy"] == 60
    assert pg["rank"].tolist() == [1, 1] and pg.n_formats.tolist() == [2, 2]


# ------------------------------------------------------------------------------------------ ranking agreement

def test_ranking_agreement_hand_computed():
    gt = pd.DataFrame({"dataset": "D", "model": list("abcd"), "accuracy": [90.0, 80.0, 70.0, 60.0]})
    meth = pd.DataFrame({"dataset": "D", "method": "x", "model": list("abcd"), "accuracy": [85.0, 88.0, 70.0, 50.0]})
    a = fb.ranking_agreement(meth, gt).iloc[0]
    # ranks 2,1,3,4 vs 1,2,3,4: sum d^2 = 2 -> rho = 1 - 6*2/(4*15) = 0.8; tau = (5-1)/6
    assert a.spearman == pytest.approx(0.8) and a.kendall == pytest.approx(4 / 6)
    assert a.correctly_ranked == 2 and a.n_models == 4

    tie = meth.assign(accuracy=[85.0, 85.0, 70.0, 50.0], method="tie")
    t = fb.ranking_agreement(tie, gt).iloc[0]
    # ranks 1,1,3,4 vs 1,2,3,4 -> Pearson of the rank vectors = 5.5 / sqrt(6.75 * 5)
    assert t.spearman == pytest.approx(5.5 / np.sqrt(6.75 * 5))
    assert t.correctly_ranked == 2                 # a matches rank 1 but is tied -> not counted
    assert fb.ranking_agreement(tie, gt, count_ties=True).iloc[0].correctly_ranked == 3

    # missing method (all NaN) -> NA; no method column -> no method in the output
    na = fb.ranking_agreement(meth.assign(accuracy=np.nan, method="na"), gt).iloc[0]
    assert np.isnan(na.spearman) and pd.isna(na.correctly_ranked) and na.n_models == 0
    plain = fb.ranking_agreement(meth.drop(columns="method"), gt)
    assert "method" not in plain.columns and plain.correctly_ranked.iloc[0] == 2


# ------------------------------------------------------------------------------------------ selection pattern

def test_selection_pattern_eq11_12():
    # q1 has 4 options (shifts 0-3), q2 has 2 options (shifts 0-1)
    items = [("q1", 0, True, True, 0), ("q1", 1, False, True, 0), ("q1", 2, False, True, 1),
             ("q1", 3, False, False, -1), ("q2", 0, True, True, 0), ("q2", 1, True, True, 1)]
    pq = pd.DataFrame(_rows("M", "D", F_UP, items))
    sp = fb.selection_pattern(pq).set_index("position")
    # n_i = 6, 6, 4, 4; s_i = 3, 2, 0, 0; f = .5, 1/3, 0, 0; normalised by 5/6
    assert sp.n_appeared.tolist() == [6, 6, 4, 4] and sp.n_selected.tolist() == [3, 2, 0, 0]
    assert sp.frequency.tolist() == pytest.approx([0.6, 0.4, 0.0, 0.0])
    # explicit n_options gives the same result
    sp2 = fb.selection_pattern(pq.assign(n_options=[4, 4, 4, 4, 2, 2]))
    assert sp2.frequency.tolist() == pytest.approx([0.6, 0.4, 0.0, 0.0])

    # a second format that never answers validly -> NaN; by_factor averages the normalised frequencies
    uniform = pd.DataFrame(_rows("M", "D", F_NUM, [(q, s, False, False, -1) for q, s, *_ in items]))
    roman = pd.DataFrame(_rows("M", "D", ("roman", "dot", "comma"),
                               [("q1", 0, True, True, 3), ("q1", 1, False, True, 3), ("q1", 2, False, True, 3),
                                ("q1", 3, False, True, 3), ("q2", 0, True, True, 0), ("q2", 1, True, True, 1)]))
    allf = pd.concat([pq, uniform, roman])
    per = fb.selection_pattern(allf)
    assert per[per.option_ids == "numbers"].frequency.isna().all()
    # roman: s = 1,1,0,4; n = 6,6,4,4; f = 1/6, 1/6, 0, 1 -> / (4/3)
    assert per[per.option_ids == "roman"].frequency.tolist() == pytest.approx([0.125, 0.125, 0.0, 0.75])
    bf = fb.selection_pattern(allf, by_factor=True)
    dot = bf[(bf.factor == "delimiter") & (bf.level == "dot")].set_index("position")
    assert dot.frequency.tolist() == pytest.approx([(0.6 + 0.125) / 2, (0.4 + 0.125) / 2, 0.0, 0.375])
    assert dot.n_formats.tolist() == [2, 2, 2, 2]    # NaN format skipped in the mean
    with pytest.raises(DataError, match="only 2 options"):
        fb.selection_pattern(pq.assign(selected_position=[0, 0, 0, 0, 0, 3]))


# ------------------------------------------------------------------------------------------ confidence bins

def _confidence_frame():
    ref = ("uppercase", "dot", "line_break")   # V*Bench standard format (Tab. 5)
    other = ("numbers", "dot", "line_break")
    qs = [f"q{i}" for i in range(10)]
    conf = {q: 10.0 - i for i, q in enumerate(qs)}          # q0 most confident
    ref_rows = _rows("M", "V*Bench", ref, [(q, 0, True, True, 0) for q in qs])
    for r in ref_rows:
        r["logit"] = conf[r["question_id"]]
    correct_other = {"q0": False, "q1": False, "q2": True, "q3": True, "q4": True, "q5": False, "q6": False,
                     "q7": False, "q8": True, "q9": True}
    oth_rows = _rows("M", "V*Bench", other, [(q, 0, correct_other[q], True, 0) for q in qs])
    for r in oth_rows:
        r["logit"] = -100.0 * conf[r["question_id"]]           # ignored: not the reference format
    return pd.DataFrame(ref_rows + oth_rows)


def test_confidence_bins_ten_questions():
    pq = _confidence_frame()
    bins = fb.assign_confidence_bins(pq, "logit")
    got = dict(zip(bins.question_id, bins.confidence_bin.astype(str)))
    assert [got[f"q{i}"] for i in range(10)] == ["top 20%"] * 2 + ["middle 60%"] * 6 + ["bottom 20%"] * 2
    cb = fb.confidence_bins(pq, "logit")
    acc = {(o, b): a for o, b, a in zip(cb.option_ids, cb.confidence_bin.astype(str), cb.accuracy)}
    assert acc[("uppercase", "top 20%")] == acc[("uppercase", "middle 60%")] == acc[("uppercase", "bottom 20%")] == 100
    assert acc[("numbers", "top 20%")] == 0.0
    assert acc[("numbers", "middle 60%")] == 50.0
    assert acc[("numbers", "bottom 20%")] == 100.0
    assert cb.n_questions.tolist() == [2, 6, 2, 2, 6, 2]
    assert cb.confidence_bin.astype(str).tolist()[:3] == list(fb.CONFIDENCE_BINS)
    # explicit reference = the other format flips the ranking (its logits are reversed)
    cb2 = fb.confidence_bins(pq, "logit", reference=("numbers", "dot", "line_break"))
    acc2 = {(o, b): a for o, b, a in zip(cb2.option_ids, cb2.confidence_bin.astype(str), cb2.accuracy)}
    assert acc2[("numbers", "top 20%")] == 100.0 and acc2[("numbers", "bottom 20%")] == 0.0


def test_confidence_bins_units_sizes_and_errors():
    assert fb._bin_sizes(10, (0.2, 0.6, 0.2)) == [2, 6, 2]
    assert fb._bin_sizes(7, (0.2, 0.6, 0.2)) == [1, 5, 1]
    assert fb._bin_sizes(596, (0.2, 0.6, 0.2)) == [119, 358, 119]
    # unit="question" averages the confidence over shifts; ties broken by question_id
    ref = ("uppercase", "dot", "line_break")
    rows = _rows("M", "V*Bench", ref, [(q, s, True, True, 0) for q in ("a", "b", "c", "d", "e") for s in (0, 1)])
    logit = {("a", 0): 5, ("a", 1): 1, ("b", 0): 2, ("b", 1): 2, ("c", 0): 9, ("c", 1): 9, ("d", 0): 0,
             ("d", 1): 0, ("e", 0): 3, ("e", 1): 1}
    for r in rows:
        r["logit"] = logit[(r["question_id"], r["shift"])]
    pq = pd.DataFrame(rows)
    b = fb.assign_confidence_bins(pq, "logit", unit="question")
    # means: a 3, b 2, c 9, d 0, e 2 -> order c, a, b, e (tie -> by id), d; sizes 1/3/1
    assert b.question_id.tolist() == ["c", "a", "b", "e", "d"]
    assert b.confidence_bin.astype(str).tolist() == ["top 20%"] + ["middle 60%"] * 3 + ["bottom 20%"]
    assert len(fb.assign_confidence_bins(pq, "logit")) == 10   # unit="item": every shift separately
    with pytest.raises(KeyError):
        fb.assign_confidence_bins(pq.assign(dataset="unknown-set"), "logit")
    with pytest.raises(DataError, match="reference format"):
        fb.assign_confidence_bins(pq, "logit", reference=("roman", "dot", "comma"))


# ------------------------------------------------------------------------------------------ LMM

def test_fit_lmm_recovers_known_effects():
    rng = np.random.default_rng(0)
    groups = [(m, d) for m in ("m1", "m2", "m3") for d in ("d1", "d2")]
    s = _additive(groups, noise=rng.normal(0, 0.5, 48 * len(groups)))
    t = fb.fit_lmm(s)
    est = dict(zip(t.level, t.coef))
    # treatment coding against lowercase / bracket / comma
    assert est["uppercase"] == pytest.approx(6, abs=0.3)
    assert est["numbers"] == pytest.approx(-10, abs=0.3)
    assert est["roman"] == pytest.approx(0, abs=0.3)
    assert est["double_brackets"] == pytest.approx(-4, abs=0.3)
    assert est["line_break"] == pytest.approx(3, abs=0.3)
    assert est["dot"] == pytest.approx(0, abs=0.3)
    assert t.loc[t.factor == "intercept", "coef"].iloc[0] == pytest.approx(50 + 12.5, abs=1.5)
    d = dict(zip(t.level, t.direction))
    assert d["uppercase"] == "positive" and d["numbers"] == "negative" and d["roman"] == "n.s."
    assert t.attrs["n_groups"] == 6 and t.attrs["method"].startswith("MixedLM")
    assert t.attrs["group_var"] > 1   # group intercepts 50, 55, ... 75


def test_fit_lmm_single_group_and_bad_base():
    rng = np.random.default_rng(1)
    s = _additive([("m", "d")], noise=rng.normal(0, 0.5, 48))
    t, res = fb.fit_lmm(s, return_result=True)
    assert t.attrs["method"] == "OLS" and hasattr(res, "params")
    assert dict(zip(t.level, t.coef))["numbers"] == pytest.approx(-10, abs=0.5)
    with pytest.raises(ValueError, match="base level"):
        fb.fit_lmm(s[s.option_ids != "lowercase"])


# ------------------------------------------------------------------------------------------ plots (smoke)

def test_plots_return_figures_with_note():
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from mmfragile.studies.format_bias import plots as pl

    rng = np.random.default_rng(2)
    rows = []
    for m in ("A", "B", "C"):
        for oid, de, se in itertools.product(*(fb.LEVELS[f] for f in fb.FACTORS)):
            for q in range(5):
                for s in range(2):
                    cov = bool(rng.random() < 0.9)
                    cor = cov and bool(rng.random() < 0.6)
                    rows.append(dict(model=m, dataset="V*Bench", question_id=f"q{q}", shift=s, option_ids=oid,
                                     delimiter=de, separator=se, correct=cor, covered=cov,
                                     selected_position=(s if cor else (1 - s)) if cov else -1, logit=float(q)))
    pq = pd.DataFrame(rows)
    scores = fb.format_scores(pq)
    agreement = fb.ranking_agreement(
        pd.DataFrame({"dataset": "V*Bench", "method": ["vanilla"] * 3 + ["pia"] * 3, "model": list("ABC") * 2,
                      "accuracy": [1.0, 2.0, 3.0] + [np.nan] * 3}), fb.pseudo_gt(scores))
    figs = [
        pl.plot_rank_distribution(fb.format_ranks(scores), note="NOTE"),
        pl.plot_format_accuracy_ci(fb.format_accuracy_ci(pq, n_boot=200), note="NOTE"),
        pl.plot_deviation_heatmap(fb.deviation_from_mean(scores), note="NOTE"),
        pl.plot_deviation_heatmap(fb.coverage_neutral(scores, threshold=95), note="NOTE"),
        pl.plot_coverage_heatmap(fb.coverage_by_factor(scores), note="NOTE"),
        pl.plot_lmm_coefficients(fb.fit_lmm(scores), note="NOTE"),
        pl.plot_confidence_bins(fb.confidence_bins(pq[pq.model == "A"], "logit"), note="NOTE"),
        pl.plot_mitigation(agreement, note="NOTE"),
        pl.plot_selection_pattern(fb.selection_pattern(pq, by_factor=True), note="NOTE"),
    ]
    for fig in figs:
        assert isinstance(fig, Figure)
        assert any(t.get_text() == "NOTE" for t in fig.texts)
        plt.close(fig)
