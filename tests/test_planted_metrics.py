"""The intervals the planted-fragility checks use, against hand-planted truths: a judge whose scores a perturbation
moves vs one it does not reach, a judge that prefers verbose responses vs coin flips, held-out prompts that lose
accuracy vs prompts that keep it. Found where planted, not found where absent."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mmfragile import bootstrap
from mmfragile.studies.judgebias import metrics as jm
from mmfragile.studies.promptception import metrics as pm


def test_bootstrap_ratio_of_unit_sums():
    """Resampling units keeps a unit's rows together: a statistic whose every unit has the same ratio never moves."""
    frame = pd.DataFrame({"u": ["a", "a", "b", "c", "c", "c"], "v": [1.0, 0.0, 0.5, 1.0, 0.0, np.nan]})
    s = bootstrap.unit_sums(frame, "u", "v")
    assert s.loc["a"].tolist() == [1.0, 2.0] and s.loc["c"].tolist() == [1.0, 2.0]
    draws = bootstrap.ratio_draws(bootstrap.unit_weights(3, 500, 1), s["sum"], s["n"])
    assert np.allclose(draws, 0.5)
    lo, hi = bootstrap.interval(np.arange(101.0), 0.9)
    assert (lo, hi) == pytest.approx((5.0, 95.0))
    with pytest.raises(ValueError):
        bootstrap.unit_weights(0)


def _judgments(n: int = 40, seed: int = 0) -> pd.DataFrame:
    """Two judges, two runs, 2n samples (good 9 / bad 2): ``sees`` drops every good response to 2 when the image is
    removed; ``blind`` draws 9 or 2 at random whatever the condition."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        for kind, gold in (("good", 9), ("bad", 2)):
            for run in (0, 1):
                sid = f"s{i}-{kind}"
                rows += [("sees", sid, "original", run, gold), ("sees", sid, "text_dominance", run, 2),
                         ("blind", sid, "original", run, int(rng.choice([9, 2]))),
                         ("blind", sid, "text_dominance", run, int(rng.choice([9, 2])))]
    return pd.DataFrame(rows, columns=["judge", "sample_id", "perturbation", "run", "score"])


def test_bias_deviation_intervals_separate_a_seeing_from_a_blind_judge():
    out = jm.bias_deviation_intervals(_judgments()).set_index("judge")
    sees, blind = out.loc["sees"], out.loc["blind"]
    assert sees.bd == pytest.approx(0.5 * 7 / 8) and sees.floor == 0 and sees.excess_low > 0.3
    assert sees.score_drop == pytest.approx(3.5) and sees.score_drop_low > 2
    # the blind judge's BD is all sampling noise: as large as its run-to-run floor, its excess and drop near 0
    assert blind.bd > 0.1 and blind.excess_low < 0 < blind.excess_high and blind.score_drop_low < 0 < blind.score_drop_high
    assert out.loc["sees", "n_samples"] == 80 and out.loc["sees", "runs"] == 2
    # the same judgments, one run only: no repeat, so the floor is 0
    one = jm.bias_deviation_intervals(_judgments().query("run == 0")).set_index("judge")
    assert one.loc["sees", "floor"] == 0 and one.loc["sees", "runs"] == 1


def test_pairwise_bias_intervals_find_a_planted_verbosity_preference():
    rng = np.random.default_rng(0)
    verb, pos = [], []
    for i in range(30):
        for run in (0, 1):
            for vp in ("A", "B"):
                verb += [("verbose", f"s{i}|run{run}", run, vp, vp),
                         ("coin", f"s{i}|run{run}", run, vp, str(rng.choice(["A", "B"])))]
            for swapped in (False, True):
                pos += [("verbose", f"s{i}", run, swapped, "B" if swapped else "A"),   # same response both orders
                        ("coin", f"s{i}", run, swapped, "A")]                          # always the first position
    out = jm.pairwise_bias_intervals(pd.DataFrame(pos, columns=["judge", "sample_id", "run", "swapped", "choice"]),
                                     pd.DataFrame(verb, columns=["judge", "sample_id", "run", "verbose_position",
                                                                 "choice"]))
    v = out.set_index(["judge", "measure"])
    assert v.loc[("verbose", "verbose_preference"), "value"] == 1.0
    coin = v.loc[("coin", "verbose_preference")]
    assert coin.ci_low < 0.5 < coin.ci_high and coin.n_samples == 30
    assert v.loc[("coin", "first_position_rate"), "value"] == 1.0 and v.loc[("coin", "position_consistency"), "value"] == 0
    assert v.loc[("verbose", "position_consistency"), "value"] == 1.0
    assert v.loc[("verbose", "first_position_rate"), "value"] == 0.5


def test_group_intervals_expose_held_out_prompts():
    """Prompts of categories 1-2 answered right 90 % of the time, of category 3 (held out) 50 %: the held-out group
    drops significantly, the trained group and the baseline do not differ, the trimmed mean falls in between."""
    rng = np.random.default_rng(1)
    prompts = ["1.1", "1.2", "1.3", "2.1", "2.2", "3.1", "3.2"]
    rows = [("bench", "m", p, f"q{q}", bool(rng.random() < (0.5 if p.startswith("3.") else 0.9)))
            for q in range(60) for p in prompts]
    df = pd.DataFrame(rows, columns=["benchmark", "model", "prompt_id", "question_id", "correct"])
    out = pm.group_intervals(df, {"trained": [1, 2], "held_out": [3]}).set_index("statistic")
    assert out.loc["held_out", "diff_high"] < 0 and out.loc["held_out", "prad_high"] < 0
    assert out.loc["trained", "diff_low"] < 0 < out.loc["trained", "diff_high"]
    assert out.loc["baseline", "diff"] == 0 and out.loc["trained", "n_prompts"] == 4
    assert out.loc["held_out", "accuracy"] < out.loc["trimmed_mean", "accuracy"] < out.loc["trained", "accuracy"]
    with pytest.raises(Exception, match="baseline prompt"):
        pm.group_intervals(df[df.prompt_id != "1.1"], {"x": [2]})
