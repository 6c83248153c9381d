"""Bias mitigation maths (format-bias seed, Sec. B.3 Eq. 7-10, Table 7)."""
import numpy as np
import pandas as pd
import pytest

from mmfragile.studies.format_bias.mitigation import (
    accuracy,
    cp_ln,
    perplexity,
    pia,
    pia_score,
    pride,
    pride_debias,
    pride_prior,
)


# ================================================================ PIA (Eq. 7)

def _pia_toy():
    # N = 2 questions, M = 3 options, circular evaluation -> 6 rows.
    # q1 (correct option originally at 0): shifts 0,1,2 put it at positions 0,2,1.
    # q2 (correct option originally at 1): shifts 0,1,2 put it at positions 1,0,2.
    return pd.DataFrame({
        "question_id": ["q1"] * 3 + ["q2"] * 3,
        "shift": [0, 1, 2] * 2,
        "n_options": 3,
        "answer_position": [0, 2, 1, 1, 0, 2],
        "selected_position": [0, 2, 0, 1, 0, -1],   # last row out of coverage
    })


def test_pia_hand_computed():
    df = _pia_toy()
    # position 0: Pr_0 = 3 (rows 0,2,4), C_0 = 2 (rows 0,4)
    # position 1: Pr_1 = 1 (row 3),      C_1 = 1
    # position 2: Pr_2 = 1 (row 1),      C_2 = 1
    # N = 2:  PIA = 1/3 * [(2/3)(2/2) + (1/1)(1/2) + (1/1)(1/2)] = 1/3 * 5/3 = 5/9
    r = pia(df)
    assert r.accuracy == pytest.approx(5 / 9)
    assert r.details["C"] == [2, 1, 1] and r.details["Pr"] == [3, 1, 1] and r.details["N"] == 2
    assert r.details["plain_accuracy"] == pytest.approx(4 / 6)
    # N = number of rows (6): 1/3 * [(2/3)(2/6) + (1)(1/6) + (1)(1/6)] = 1/3 * 5/9 = 5/27
    assert pia(df, n_questions=6).accuracy == pytest.approx(5 / 27)
    assert pia_score(df.selected_position, df.answer_position, 3, 2) == pytest.approx(5 / 9)


def test_pia_perfect_model_is_one_and_never_selected_position_is_zero():
    ans = np.array([0, 1, 2] * 4)
    assert pia_score(ans, ans, 3, 4) == pytest.approx(1.0)
    # always answers position 0: Pr_0 = 12, C_0 = 4 -> 1/3 * (4/12)(4/4) = 1/9; positions 1,2 never chosen -> 0
    assert pia_score(np.zeros(12, int), ans, 3, 4) == pytest.approx(1 / 9)


def _circular_uniform(n_q, M, correct_per_pos, wrong_covered_per_pos):
    """Synthetic circular-eval rows: per position i, n_q rows have their answer at i; of those,
    correct_per_pos[i] are answered correctly and wrong_covered_per_pos[i] pick position (i+1)%M,
    the rest are out of coverage (-1)."""
    ans, sel = [], []
    for i in range(M):
        c, w = correct_per_pos[i], wrong_covered_per_pos[i]
        ans += [i] * n_q
        sel += [i] * c + [(i + 1) % M] * w + [-1] * (n_q - c - w)
    qids = [f"q{j}" for j in range(n_q)] * M  # each question once per shift
    return pd.DataFrame({"question_id": qids, "answer_position": ans, "selected_position": sel, "n_options": M})


def test_pia_reproduces_table7a_aokvqa():
    # Table 8 (A-OKVQA, standard format lowercase/double brackets/line break), N = 1,145, 4 options:
    # Gemma-3: acc 78.079 %, cov 100 % -> 3576 correct of 4580 rows = 894 per position, 251 wrong.
    # Uniform selection: PIA = (894/1145)^2 = 0.60963 -> Table 7(a) PIA 61.00.
    g = _circular_uniform(1145, 4, [894] * 4, [251] * 4)
    assert g.selected_position.ge(0).mean() == 1.0 and (g.selected_position == g.answer_position).mean() == pytest.approx(0.78079, abs=1e-4)
    assert 100 * pia(g, dataset="A-OKVQA").accuracy == pytest.approx(61.00, abs=0.1)
    # LLaVA-1.5: acc 12.293 %, cov 13.865 % -> 563 correct, 635 covered rows (72 wrong-covered).
    # PIA ~ a^2/c = 0.1090 -> Table 7(a) 10.93.
    l = _circular_uniform(1145, 4, [141, 141, 141, 140], [18] * 4)
    assert (l.selected_position == l.answer_position).sum() == 563 and l.selected_position.ge(0).sum() == 635
    assert 100 * pia(l, dataset="A-OKVQA").accuracy == pytest.approx(10.93, abs=0.1)


def test_pia_hrbench_reading_with_n_rows():
    # Table 7(b) HRBench-4K (200 questions, 800 rows): Phi-3.5 vanilla 50.50 -> 101 correct per position.
    # With N = number of rows, PIA = (101/200)(101/800) = 0.06376 -> published 6.4.
    d = _circular_uniform(200, 4, [101] * 4, [99] * 4)
    assert 100 * pia(d, n_questions=len(d)).accuracy == pytest.approx(6.4, abs=0.1)
    # LLaVA-OV 65.00 -> 130 per position: (130/200)(130/800) = 0.10563 -> published 10.61.
    d = _circular_uniform(200, 4, [130] * 4, [70] * 4)
    assert 100 * pia(d, n_questions=len(d)).accuracy == pytest.approx(10.61, abs=0.1)


def test_pia_rejects_varying_option_counts():
    df = pd.DataFrame({"question_id": ["a", "a", "b", "b", "b", "b"], "answer_position": [0, 1, 0, 1, 2, 3],
                       "selected_position": [0, 1, 0, 1, 2, 3], "n_options": [2, 2, 4, 4, 4, 4]})
    with pytest.raises(ValueError, match=r"PIA.*'V\*Bench'.*2, 4 options"):
        pia(df, dataset="V*Bench")
    with pytest.raises(ValueError):
        pia(df.drop(columns="n_options"))  # no option count given


# ================================================================ PriDe (Eq. 8)

CALIB = np.array([
    # calibration question 1: same observation under all 3 shifts -> prior_1 = [.5, .25, .25]
    [[0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.5, 0.25, 0.25]],
    # calibration question 2: the model follows the content -> geometric means equal -> prior_2 uniform
    [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]],
])
# global prior = mean(prior_1, prior_2) = [5/12, 7/24, 7/24]
PRIOR = np.array([5 / 12, 7 / 24, 7 / 24])

TEST_PROBS = np.array([
    [0.40, 0.35, 0.25],  # /prior -> [0.960, 1.200, 0.857] -> 1 (vanilla argmax 0)
    [0.50, 0.30, 0.20],  # /prior -> [1.200, 1.029, 0.686] -> 0
    [0.30, 0.30, 0.40],  # /prior -> [0.720, 1.029, 1.371] -> 2
])
TEST_ANSWERS = [1, 0, 0]  # PriDe: right, right, wrong -> 2/3; vanilla argmax [0,0,2]: 1/3


def test_pride_prior_hand_computed():
    assert pride_prior(CALIB) == pytest.approx(PRIOR, abs=1e-8)
    # unnormalised probabilities and logits give the same prior
    assert pride_prior(CALIB * 7.0) == pytest.approx(PRIOR, abs=1e-8)
    assert pride_prior(np.log(CALIB) + 3.0, logits=True) == pytest.approx(PRIOR, abs=1e-8)


def test_pride_prior_from_dataframe():
    rows = [{"question_id": f"c{k}", "shift": s, "probs": list(CALIB[k, s])} for k in range(2) for s in (2, 0, 1)]
    assert pride_prior(pd.DataFrame(rows)) == pytest.approx(PRIOR, abs=1e-8)
    with pytest.raises(ValueError, match="all 3 circular shifts"):
        pride_prior(pd.DataFrame(rows[:-1]), dataset="V*Bench")


def test_pride_predictions_hand_computed():
    r = pride(TEST_PROBS, TEST_ANSWERS, calibration=CALIB, dataset="HRBench-4K")
    assert r.predictions.tolist() == [1, 0, 2]
    assert r.accuracy == pytest.approx(2 / 3)
    assert accuracy(TEST_PROBS.argmax(1), TEST_ANSWERS) == pytest.approx(1 / 3)  # vanilla
    scores = pride_debias(TEST_PROBS, PRIOR)
    assert np.exp(scores[0]) == pytest.approx([0.40 * 12 / 5, 0.35 * 24 / 7, 0.25 * 24 / 7], rel=1e-6)
    # same answer from logits
    assert pride(np.log(TEST_PROBS), TEST_ANSWERS, prior=PRIOR, logits=True).predictions.tolist() == [1, 0, 2]
    # uniform prior = plain argmax
    assert pride(TEST_PROBS, TEST_ANSWERS, prior=np.ones(3) / 3).predictions.tolist() == [0, 0, 2]


def test_pride_rejects_varying_option_counts():
    ragged = [[0.5, 0.5], [0.2, 0.3, 0.5, 0.0]]
    with pytest.raises(ValueError, match=r"PriDe.*'V\*Bench'.*2, 4 options"):
        pride(ragged, [0, 2], prior=np.ones(4) / 4, dataset="V*Bench")
    with pytest.raises(ValueError, match=r"'MMBench'.*calibrated on 3"):
        pride(np.ones((2, 4)) / 4, [0, 1], prior=PRIOR, dataset="MMBench")
    with pytest.raises(ValueError):
        pride(TEST_PROBS, TEST_ANSWERS)  # neither prior nor calibration


# ================================================================ CP-LN (Eq. 9-10)

CP = [
    # q1: mean log-prob [-2, -1.5, -3] -> option 1 (sum would pick option 0)
    (np.array([-2.0, -3.0, -9.0]), np.array([1, 2, 3])),
    # q2 (2 options): [-2, -1.5] -> option 1
    (np.array([-4.0, -4.5]), np.array([2, 3])),
    # q3 (4 options): [-1, -1.5, -2, -3] -> option 0
    (np.array([-1.0, -6.0, -2.0, -12.0]), np.array([1, 4, 1, 4])),
]


def test_perplexity_eq9():
    assert perplexity([-2.0, -3.0], [1, 2]) == pytest.approx([np.exp(2.0), np.exp(1.5)])
    # geometric mean of token probabilities 0.5 and 0.125 -> PPL = 1/sqrt(0.0625) = 4
    assert perplexity(np.log(0.5) + np.log(0.125), 2) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        perplexity([-1.0], [0])


def test_cp_ln_hand_computed_variable_option_counts():
    r = cp_ln(CP, answers=[1, 0, 0], dataset="V*Bench")
    assert r.predictions.tolist() == [1, 1, 0]
    assert r.accuracy == pytest.approx(2 / 3)
    assert r.details["perplexity"][0] == pytest.approx([np.exp(2), np.exp(1.5), np.exp(3)])
    assert np.isnan(cp_ln(CP).accuracy)


def test_cp_ln_from_dataframe():
    rows = []
    for k, (lp, n) in enumerate(CP):
        for o in reversed(range(len(lp))):  # order of rows must not matter
            rows.append({"question_id": f"q{k + 1}", "option": o, "logprob": lp[o], "n_tokens": n[o]})
    r = cp_ln(pd.DataFrame(rows), answers=[1, 0, 0])
    assert r.details["question_id"] == ["q1", "q2", "q3"]
    assert r.predictions.tolist() == [1, 1, 0] and r.accuracy == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="option indices"):
        cp_ln(pd.DataFrame(rows[:2] + rows[3:]))  # q1 without option 0 -> indices [1, 2]
