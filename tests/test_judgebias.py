"""Study 3 (MM-JudgeBias): judge prompts, score parsing, BD/BC metrics, aggregation, published tables."""
from __future__ import annotations

from pathlib import Path

from mmfragile.paths import seed_missing, seed_path

import numpy as np
import pandas as pd
import pytest

from mmfragile.studies.judgebias import metrics as jb
from mmfragile.models.base import Prompt
from mmfragile.studies.judgebias.prompts import (
    ScoreParseError, na_prompt, pairwise_prompt, parse_pairwise, parse_score, parse_score_or_na, score_prompt,
)
from mmfragile.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
SEED = seed_path("mm-judgebias.txt")


# ------------------------------------------------------------------------------------------ prompts

def test_score_prompt_renders_query_response_and_images():
    p = score_prompt("How many red bars exceed 40?", "Three bars exceed 40.", images=["chart.png"])
    assert isinstance(p, Prompt)
    assert p.images == ["chart.png"]
    assert "How many red bars exceed 40?" in p.text and "Three bars exceed 40." in p.text
    assert p.text.index("How many red bars") < p.text.index("Three bars exceed")
    assert "between 1 and 10" in p.text and "detailed feedback" in p.text
    assert p.text.rstrip().endswith("Score: <an integer between 1 and 10>")
    assert "N/A" not in p.text


def test_score_prompt_variants_and_na():
    base = score_prompt("Q?", "R.").text
    texts = {v: score_prompt("Q?", "R.", variant=v).text for v in ("score_guide", "constraints", "reasoning")}
    assert "Score guide" in texts["score_guide"] and "Score guide" not in base
    assert "Modality constraints" in texts["constraints"] and "Modality constraints" not in base
    assert "Rubric decomposition" in texts["reasoning"] and "Modality-wise inspection" in texts["reasoning"]
    assert len(set(texts.values()) | {base}) == 4
    na = na_prompt("Q?", "R.", images=["a.png", "b.png"])
    assert "N/A" in na.text and na.images == ["a.png", "b.png"]
    assert score_prompt("Q?", "R.", variant="constraints", allow_na=True).text.count("N/A") >= 2
    # an empty (perturbed) query still renders; no images -> text-only prompt
    empty = score_prompt("", "R.")
    assert "[Instruction]\n\n[End of Instruction]" in empty.text and empty.images == []
    with pytest.raises(ValueError, match="variant"):
        score_prompt("Q", "R", variant="fancy")


def test_pairwise_prompt_order():
    p = pairwise_prompt("Describe the scene.", "first answer", "second answer", images=["x.png"])
    assert p.text.index("first answer") < p.text.index("second answer")
    assert "[Response A]\nfirst answer" in p.text and "[Response B]\nsecond answer" in p.text
    assert "[[A]]" in p.text and p.images == ["x.png"]


# ------------------------------------------------------------------------------------------ parsing

SCORE_CASES = [
    ("Feedback: The response reads the chart correctly and explains each step.\nScore: 8", 8),
    ("Feedback: Mostly right.\n[[7]]", 7),
    ("The answer identifies the landmark.\n\n**Score:** 7/10", 7),
    ("Rating: 6", 6),
    ("I would rate this response 7 out of 10.", 7),
    ("Feedback: The count of 3 apples is wrong; the image shows 5.\nScore: 2", 2),
    ("Feedback: Accurate and grounded.\n[RESULT] 9", 9),
    ("Overall, a decent answer with one slip. Final score: 6/10.", 6),
    ("Feedback: fine\nScore: [8]", 8),
    ("<think>Maybe 3? no, 9 is too high.</think>Feedback: Reasonable.\nScore: 5", 5),
    ("The response misses 2 out of 3 sub-questions. Score: 4", 4),
    ("Score: 8\nNote: the response lists 3 items and cites the legend.", 8),
    ("Feedback: Accurate, grounded in the image.\n\n7", 7),
    ("Feedback: Correct.\nScore: **9**", 9),
    ("Score (1-10): 6", 6),
    ("The explanation is clear. I give it a 6.", 6),
    ("This response deserves a 3.", 3),
    ("Score: ten", 10),
    ("## Feedback\nGood use of the table.\n## Score\n8", 8),
    ("Score: 6 (out of 10)", 6),
    ("The response answers 3/4 of the sub-questions correctly. Score: 5", 5),
    ("Score: 7\n\nOn reflection I would rate it 6 out of 10.", 6),
    ("Overall Score = 4", 4),
    ("Feedback: It ignores the image entirely.\nScore: 1", 1),
    ("Feedback: Flawless.\nScore: 10/10", 10),
    ("Score: 8\nExplanation: the response gives 3 examples and rates 2 of them.", 8),
    ("I would rate this response a 4 because it misreads the legend.", 4),
]


@pytest.mark.parametrize("text,expected", SCORE_CASES)
def test_parse_score_realistic(text, expected):
    assert parse_score(text) == expected


SCORE_FAILURES = [
    ("", "empty"),
    ("Feedback: nice answer, clear explanation.", "no score"),
    ("Feedback: great.\nScore: 11", "out of range"),
    ("Score: 0", "out of range"),
    ("Score: 7.5", "non-integer"),
    ("Score: 7-8", "range"),
    ("Score: N/A", "N/A"),
    ("Score: 4/5", "different scale"),
    ("The response should be rated on a scale from 1 to 10", "range/scale"),
    ("Score: -2", "out of range"),
    ("The score is high.", "no score"),
]


@pytest.mark.parametrize("text,reason", SCORE_FAILURES)
def test_parse_score_failures_raise_with_text(text, reason):
    with pytest.raises(ScoreParseError, match=reason) as e:
        parse_score(text)
    assert repr(text) in str(e.value)  # the offending text is quoted


def test_parse_score_other_scale():
    assert parse_score("Score: 4/5", scale=5) == 4
    with pytest.raises(ScoreParseError, match="out of range"):
        parse_score("Score: 7", scale=5)


@pytest.mark.parametrize("text,expected", [
    ("Feedback: The image is missing, so the answer cannot be verified.\nScore: N/A", None),
    ("[[N/A]]", None),
    ("Feedback: The query is empty.\nN/A", None),
    ("Feedback: I considered N/A at first but\nScore: 6", 6),
    ("Score: 5\nOn second thought the inputs contradict each other. Score: N/A", None),
    ("Feedback: ok\nScore: 8", 8),
])
def test_parse_score_or_na(text, expected):
    assert parse_score_or_na(text) == expected


def test_parse_score_or_na_still_raises():
    with pytest.raises(ScoreParseError):
        parse_score_or_na("Feedback: no verdict given")


@pytest.mark.parametrize("text,expected", [
    ("[[A]]", "A"),
    ("Feedback: B is longer but adds nothing.\nFinal Answer: [[A]]", "A"),
    ("Final answer: Response B", "B"),
    ("Response A is better because it reads the axis correctly.", "A"),
    ("I prefer B.", "B"),
    ("B", "B"),
    ("**A**", "A"),
    ("Verdict: (A)", "A"),
    ("The better response is B", "B"),
    ("Feedback: x\nFinal Answer: [[A]] or [[B]]\nFinal Answer: [[B]]", "B"),
    ("<think>A seems fine... [[A]]</think>Feedback: B is grounded.\nFinal Answer: [[B]]", "B"),
    # single brackets, seen in SmolLM2 judge outputs
    ("Your final choice is [B].", "B"),
    ("The answer is: [Response B]", "B"),
    ("Verdict: [A]", "A"),
])
def test_parse_pairwise(text, expected):
    assert parse_pairwise(text) == expected


@pytest.mark.parametrize("text", ["", "Both are equally good. [[C]]", "Answer: Apple",
                                  "Final Answer: [[A]] or [[B]]", "Final answer: a draw"])
def test_parse_pairwise_failures(text):
    with pytest.raises(ScoreParseError):
        parse_pairwise(text)


def test_scores_from_outputs_counts_failures():
    df = pd.DataFrame({"output": ["Score: 7", "no idea", "Score: N/A"]})
    out = jb.scores_from_outputs(df)
    assert out["status"].tolist() == ["ok", "unparseable", "unparseable"]
    out = jb.scores_from_outputs(df, allow_na=True)
    assert out["status"].tolist() == ["ok", "unparseable", "na"]
    assert out["score"].iloc[0] == 7 and np.isnan(out["score"].iloc[2])
    assert "no score" in out["parse_error"].iloc[1]


# ------------------------------------------------------------------------------------------ BD / BC

def test_bd_terms_edge_cases():
    y = np.array([8, 1, 10, 5, 6, 1])
    yh = np.array([4, 1, 10, 7, np.nan, 3])
    t = jb.bd_terms(y, yh)
    assert t[0] == pytest.approx(4 / 7)
    assert np.isnan(t[1]) and np.isnan(t[5])  # y = 1 excluded, whatever the perturbed score
    assert t[2] == 0.0  # y = S, tie
    assert t[3] == 0.0  # score increase counts as 0 (positive part)
    assert np.isnan(t[4])
    assert jb.bias_deviation(y, yh) == pytest.approx((4 / 7) / 3)
    assert np.isnan(jb.bias_deviation([1, 1], [1, 5]))  # no eligible sample
    assert jb.bias_deviation([10], [1]) == 1.0  # full drop


def test_bc_terms_edge_cases():
    y = np.array([8, 1, 10, 5, 6, 10, 5, 1])
    yh = np.array([8, 3, 7, 5, 1, 1, 10, 10])
    t = jb.bc_terms(y, yh, scale=10)
    np.testing.assert_allclose(t, [1, 1 - 2 / 9, 1 - 3 / 9, 1, 1 - 5 / 5, 0, 1 - 5 / 5, 0])
    assert jb.bias_conformity([8, 1, 10, 5, 6], [8, 3, 7, 5, 1]) == pytest.approx(31 / 45)
    assert jb.bc_terms([3], [4], scale=5)[0] == pytest.approx(1 - 1 / 2)


def _frame(original: dict, perturbed: dict, pert="text_dominance", judge="J", run=0):
    rows = [(judge, s, "original", run, v) for s, v in original.items()]
    rows += [(judge, s, pert, run, v) for s, v in perturbed.items()]
    return pd.DataFrame(rows, columns=["judge", "sample_id", "perturbation", "run", "score"])


def test_bias_scores_hand_computed():
    orig = {"s1": 8, "s2": 1, "s3": 10, "s4": 5, "s5": 6}
    df = pd.concat([
        _frame(orig, {"s1": 4, "s2": 1, "s3": 10, "s4": 7, "s5": np.nan}, "text_dominance"),
        _frame({}, {"s1": 8, "s2": 3, "s3": 7, "s4": 5, "s5": 1}, "detail_description"),
    ])
    s = jb.bias_scores(df).set_index("perturbation")
    bd = s.loc["text_dominance"]
    assert bd["metric"] == "BD" and bd["dimension"] == "integrality"
    assert bd["value"] == pytest.approx(4 / 21)
    assert (bd["n_pairs"], bd["n_y1"], bd["n_unparseable"], bd["n_total"]) == (3, 1, 1, 5)
    bc = s.loc["detail_description"]
    assert bc["metric"] == "BC" and bc["dimension"] == "robustness"
    assert bc["value"] == pytest.approx(31 / 45)
    assert bc["n_pairs"] == 5 and bc["n_y1"] == 0  # BC is defined at y = 1


def test_unparseable_original_drops_pair():
    df = _frame({"s1": np.nan, "s2": 9}, {"s1": 2, "s2": 3, "s3": 4})
    s = jb.bias_scores(df).iloc[0]
    assert s["value"] == pytest.approx(6 / 8) and s["n_pairs"] == 1 and s["n_unparseable"] == 1
    assert s["n_no_reference"] == 1 and s["n_total"] == 3  # s3 has no unbiased judgment


def test_run_pairing_vs_mean():
    df = pd.concat([_frame({"s1": 6}, {"s1": 3}, run=0), _frame({"s1": 8}, {"s1": 8}, run=1)])
    assert jb.bias_scores(df).iloc[0]["value"] == pytest.approx((3 / 5 + 0) / 2)
    assert jb.bias_scores(df, pairing="mean").iloc[0]["value"] == pytest.approx(1.5 / 6)


def test_abstention_excluded_and_counted():
    df = _frame({"s1": 8, "s2": 6, "s3": 9, "s4": 5}, {"s1": 4, "s2": 2, "s3": 9, "s4": 5})
    df["status"] = "ok"
    df.loc[(df.sample_id == "s1") & (df.perturbation == "original"), ["status", "score"]] = ["na", np.nan]
    df.loc[(df.sample_id == "s2") & (df.perturbation != "original"), ["status", "score"]] = ["na", np.nan]
    s = jb.bias_scores(df).iloc[0]
    assert s["n_abstained"] == 2 and s["abstain_ratio"] == 0.5 and s["n_pairs"] == 2
    assert s["value"] == pytest.approx(0.0)


def test_validate_judgments_errors():
    df = _frame({"s1": 8}, {"s1": 11})
    with pytest.raises(DataError, match="outside 1..10"):
        jb.bias_scores(df)
    with pytest.raises(DataError, match="non-integer"):
        jb.bias_scores(_frame({"s1": 8}, {"s1": 7.5}))
    dup = pd.concat([_frame({"s1": 8}, {"s1": 7}), _frame({}, {"s1": 6})])
    with pytest.raises(DataError, match="duplicate"):
        jb.bias_scores(dup)
    with pytest.raises(DataError, match="reference"):
        jb.bias_scores(_frame({}, {"s1": 6}))
    with pytest.raises(DataError, match="missing column"):
        jb.bias_scores(pd.DataFrame({"judge": ["J"]}))


def test_custom_reference_and_metric():
    # Table 13 [C]: reference "blank_image", perturbed "unnecessary_image"
    df = pd.DataFrame({"judge": "J", "sample_id": ["a", "a"], "perturbation": ["blank_image", "unnecessary_image"],
                       "score": [7, 5]})
    s = jb.bias_scores(df, reference="blank_image").iloc[0]
    assert s["metric"] == "BC" and s["value"] == pytest.approx(1 - 2 / 6)


# ------------------------------------------------------------------------------------------ aggregation

def test_aggregate_reliability_hand_computed():
    vals = dict(zip(jb.PERTURBATIONS, [0.1, 0.2, 0.3, 0.9, 0.5, 0.8, 0.9, 0.7, 0.6]))
    a = jb.aggregate_reliability(vals)
    assert a["integrality"] == pytest.approx(0.2)
    assert a["congruity"] == pytest.approx(0.7)
    assert a["robustness"] == pytest.approx(0.75)
    assert a["overall"] == pytest.approx(5.0 / 9)  # mean of the 9 types, not of the 3 categories
    assert a["overall"] != pytest.approx((0.2 + 0.7 + 0.75) / 3)


def test_table2_from_judgments():
    rng = np.random.default_rng(1)
    rows = []
    for j in ("J1", "J2"):
        for s in range(6):
            for r in range(3):
                y = int(rng.integers(2, 11))
                rows.append((j, f"s{s}", "original", r, y))
                for p in jb.PERTURBATIONS:
                    rows.append((j, f"s{s}", p, r, int(np.clip(y - rng.integers(-1, 4), 1, 10))))
    df = pd.DataFrame(rows, columns=["judge", "sample_id", "perturbation", "run", "score"])
    t = jb.table2(df)
    assert list(t.index) == ["J1", "J2"]
    assert list(t.columns) == list(jb.PERTURBATIONS) + list(jb.AGGREGATE_COLUMNS) + [
        "inter_run_variance", "inter_sample_variance"]
    assert t.loc["J1", "overall"] == pytest.approx(t.loc["J1", list(jb.PERTURBATIONS)].mean())
    one = jb.bias_scores(df[df.judge == "J1"], perturbations=["image_misalignment"]).iloc[0]
    assert t.loc["J1", "image_misalignment"] == pytest.approx(one["value"])


def test_variances_hand_computed():
    df = pd.DataFrame({"judge": "J", "perturbation": "original",
                       "sample_id": ["s1"] * 3 + ["s2"] * 3, "run": [0, 1, 2] * 2,
                       "score": [5, 6, 7, 8, 8, 8]})
    assert jb.inter_run_variance(df)["J"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert jb.inter_sample_variance(df)["J"] == pytest.approx((4.5 + 2 + 0.5) / 3)
    assert jb.inter_run_variance(df, ddof=0)["J"] == pytest.approx((2 / 3) / 2)


def test_abstention_ratio_categories_and_pooled_overall():
    rows = []
    for p, n, n_na in (("text_dominance", 4, 2), ("image_dominance", 4, 0), ("unnecessary_image", 2, 1)):
        for k in range(n):
            rows.append(("J", f"{p}{k}", "original", 0, 7, "ok"))
            rows.append(("J", f"{p}{k}", p, 0, np.nan if k < n_na else 5, "na" if k < n_na else "ok"))
    df = pd.DataFrame(rows, columns=["judge", "sample_id", "perturbation", "run", "score", "status"])
    r = jb.abstention_ratio(df).loc["J"]
    assert r["text_dominance"] == 0.5 and r["image_dominance"] == 0 and r["unnecessary_image"] == 0.5
    assert r["integrality"] == pytest.approx(0.25) and r["robustness"] == 0.5
    assert r["overall"] == pytest.approx(3 / 10)  # pooled, not mean of type ratios (1/3)


# ------------------------------------------------------------------------------------------ existing biases

def test_position_consistency_toy_swap_table():
    df = pd.DataFrame({
        "judge": "J",
        "sample_id": ["s1", "s1", "s2", "s2", "s3", "s3", "s4", "s4"],
        "swapped": [False, True] * 4,
        "choice": ["A", "B", "A", "A", "B", "A", "A", np.nan],
    })
    two = pd.concat([df, df.assign(judge="K", sample_id=df.sample_id + "k")])
    assert jb.position_consistency(two).loc["K", "n_pairs"] == 3
    r = jb.position_consistency(df).loc["J"]
    assert r["n_pairs"] == 3 and r["n_consistent"] == 2
    assert r["consistency"] == pytest.approx(2 / 3)
    assert r["first_position_rate"] == pytest.approx(5 / 7)
    assert r["n_unparseable"] == 1
    with pytest.raises(DataError, match="choice"):
        jb.position_consistency(df.assign(choice="C"))


def test_verbosity_robustness_balanced():
    df = pd.DataFrame({
        "judge": "J",
        "sample_id": ["s1", "s1", "s2", "s2", "s3", "s3"],
        "verbose_position": ["A", "B"] * 3,
        "choice": ["B", "B", "A", "A", "B", "A"],
    })
    r = jb.verbosity_robustness(df).loc["J"]
    assert r["robustness"] == pytest.approx(4 / 6)
    assert r["robustness_verbose_first"] == pytest.approx(2 / 3)
    assert r["robustness_verbose_second"] == pytest.approx(2 / 3)
    assert r["both_orders_original"] == pytest.approx(1 / 3)


def test_self_enhancement():
    df = pd.DataFrame({
        "judge": "GPT-5 mini (high)", "perturbation": "original",
        "sample_id": [f"s{i}" for i in range(6)],
        "generator": ["GPT-5 mini", "GPT-5 mini", "Qwen2.5-VL-7B", "Gemini-2.0-Flash-Lite", "Gemini-2.0-Flash-Lite",
                      "Qwen2.5-VL-7B"],
        "score": [8, 9, 6, 7, 5, np.nan],
    })
    r = jb.self_enhancement(df, {"GPT-5 mini (high)": "GPT-5 mini"}).loc["GPT-5 mini (high)"]
    assert r["self_score"] == pytest.approx(8.5) and r["other_score"] == pytest.approx(6.0)
    assert r["delta"] == pytest.approx(2.5) and (r["n_self"], r["n_other"]) == (2, 3)
    assert jb.self_enhancement(df).empty  # without the mapping the judge never matches a generator


# ------------------------------------------------------------------------------------------ published

def _settings():
    return jb.load_published("prompt_settings")


def test_published_table2_reliability_is_mean_of_nine_types():
    t = jb.published_table2()
    assert len(t) == 30 and t["think"].sum() == 13
    for judge, row in t.iterrows():
        agg = jb.aggregate_reliability(row[list(jb.PERTURBATIONS)])
        assert agg["overall"] == pytest.approx(row["overall"], abs=1e-3), judge
    assert t.loc["Gemini-3-Pro (high)", "text_dominance"] == 0.912
    assert t.loc["Claude-Opus-4.5 (think)", "overall"] == 0.858 and t.loc["Claude-Opus-4.5", "overall"] == 0.815


def test_published_table2_mean_row():
    t = jb.published_table2()
    full = jb.published_table2(include_mean=True)
    cols = list(jb.PERTURBATIONS) + ["overall"]
    np.testing.assert_allclose(t[cols].mean().to_numpy(), full.loc["Avg.", cols].astype(float).to_numpy(), atol=1e-3)
    var = ["inter_run_variance", "inter_sample_variance"]
    np.testing.assert_allclose(t[var].mean().to_numpy(), full.loc["Avg.", var].astype(float).to_numpy(), atol=0.051)


def test_published_categories_and_overall_tables_14_16():
    s = _settings()
    n = 0
    for (tab, judge, setting), g in s.groupby(["source_table", "judge", "setting"]):
        v = g.set_index("column")["value"]
        agg = jb.aggregate_reliability(v[list(jb.PERTURBATIONS)])
        for c in jb.AGGREGATE_COLUMNS:
            assert agg[c] == pytest.approx(v[c], abs=1e-3), (tab, judge, setting, c)
        n += 1
    assert n == 6 + 12


def test_published_summaries_match_full_tables():
    s = _settings()
    summ = jb.load_published("summary")
    full = s.set_index(["source_table", "judge", "setting", "column"])["value"]
    t3 = summ[(summ.source_table == 3) & (summ.column != "ratio")]
    for r in t3.itertuples():
        assert full[(14, r.judge, r.setting, r.column)] == r.value
    for r in summ[summ.source_table == 4].itertuples():
        assert full[(16, r.judge, r.setting, "overall")] == r.value
    # LLaVA-Critic original (Tables 14/16) is the LLaVA-Critic-7B row of Table 2
    t2 = jb.published_table2()
    for p in jb.PERTURBATIONS:
        assert full[(14, "LLaVA-Critic", "original", p)] == t2.loc["LLaVA-Critic-7B", p]


def test_published_abstention_ratios():
    r = jb.load_published("abstention_ratio").pivot(index="judge", columns="column", values="ratio")
    for judge, row in r.iterrows():
        for d in jb.DIMENSIONS:
            types = [p for p in jb.PERTURBATIONS if jb.DIMENSION_OF[p] == d]
            assert row[types].mean() == pytest.approx(row[d], abs=1e-3), (judge, d)
    # overall: the unweighted type mean falls short for every judge ...
    types = r[list(jb.PERTURBATIONS)]
    short = r["overall"] - types.mean(axis=1)
    assert (short > 0).all() and short.max() > 3e-3  # 0.169 vs 0.172, 0.257 vs 0.261, 0.064 vs 0.065
    # ... while pooling over samples (197 Unnecessary-Image pairs, App. H; n for each other type)
    # reproduces all three printed ratios with one common n.
    x = types.drop(columns="unnecessary_image").sum(axis=1).to_numpy()
    u = (types["unnecessary_image"] * 197).to_numpy()
    best = min(range(150, 400), key=lambda n: np.abs((x * n + u) / (8 * n + 197) - r["overall"].to_numpy()).max())
    resid = np.abs((x * best + u) / (8 * best + 197) - r["overall"].to_numpy()).max()
    assert resid < 6e-4 and 200 <= best <= 260


def test_published_ablation_table13():
    a = jb.load_published("unnecessary_image_ablation")
    assert len(a) == 9 and set(a.setting) == {"[A]", "[B]", "[C]"}
    w = a.pivot(index="judge", columns="setting", values="bc")
    assert (w["[A]"] < w["[B]"]).all()  # "[A] consistently yields lower BC scores than [B]"
    gap = w["[B]"] - w["[A]"]
    assert np.corrcoef(w["[C]"], gap)[0, 1] < 0  # "[C] is negatively correlated with the gap"


@pytest.mark.skipif(SEED is None, reason=seed_missing("mm-judgebias.txt"))
def test_extraction_script_reproduces_csvs(load_script):
    mod = load_script("extract_judgebias")
    tables = mod.extract(SEED)
    pub = ROOT / "src" / "mmfragile" / "resources" / "published"
    for name, df in tables.items():
        on_disk = pd.read_csv(pub / name)
        pd.testing.assert_frame_equal(df.reset_index(drop=True), on_disk, check_dtype=False)


# ------------------------------------------------------------------------------------------ plots

def test_plots_return_figures_with_note():
    from matplotlib.figure import Figure

    from mmfragile.studies.judgebias import plots as pj

    t = jb.published_table2()
    small = t.loc[["Gemini-3-Pro (high)", "GPT-5 mini (high)", "LLaVA-Critic-7B"]]
    figs = [
        pj.plot_table2_heatmap(t, note="NOTE-X"),
        pj.plot_bias_heatmap(small, note="NOTE-X"),
        pj.plot_bias_bars(small, note="NOTE-X"),
        pj.plot_category_scores(small[list(jb.PERTURBATIONS)], note="NOTE-X"),
        pj.plot_setting_comparison(_settings(), note="NOTE-X"),
        pj.plot_variance(t, note="NOTE-X"),
        pj.plot_position_verbosity(pd.DataFrame({"consistency": [0.8, 0.6]}, index=["a", "b"]),
                                   pd.DataFrame({"robustness": [0.3, 0.7]}, index=["a", "b"]), note="NOTE-X"),
        pj.plot_self_enhancement(pd.DataFrame({"judge": ["J1", "J1"], "generator": ["J1", "G"],
                                               "is_self": [True, False], "mean_score": [7.5, 6.0], "n": [3, 3]}),
                                 note="NOTE-X"),
    ]
    import matplotlib.pyplot as plt

    for f in figs:
        assert isinstance(f, Figure)
        texts = [t_.get_text() for t_ in f.findobj(lambda a: hasattr(a, "get_text"))]
        assert "NOTE-X" in texts
        plt.close(f)


def test_table2_frame_layout(tmp_path):
    from mmfragile.studies.judgebias.plots import save_table2_csv, table2_frame

    t = jb.published_table2()
    f = table2_frame(t)
    assert f.columns[0] == ("Integrality (BD↑)", "TextDom.")
    assert f.columns[-3] == ("", "Avg.") and f.columns[-1] == ("Variance", "Inter-sample")
    assert f.index[-1] == "Avg." and f.loc["Avg.", ("", "Avg.")] == pytest.approx(0.679, abs=1e-3)
    p = save_table2_csv(t, tmp_path / "t2.csv")
    back = pd.read_csv(p, index_col=0)
    assert back.shape == (31, 12) and "Robustness (BC↑) | TextInsert." in back.columns


def test_a_model_that_cannot_sample_is_refused_before_the_run_with_what_to_pass(tmp_path, capsys):
    """An API judge cannot sample with a seed: the default --decoding sample is refused in one line before any model
    loads or any row runs (it failed mid-run with a TypeError before); --decoding greedy is the way."""
    from mmfragile.cli import main
    from mmfragile.models.spec import ModelSpec

    assert not ModelSpec.parse("openai:http://127.0.0.1:9/v1::m").can("can_sample")
    assert ModelSpec.parse("tiny-vlm").can("can_sample")
    out = tmp_path / "jb"
    rc = main(["judge", "--model", "openai:http://127.0.0.1:9/v1::m", "--n-samples", "1", "--perturbations",
               "text_dominance", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0] == ("error: m (openai backend) cannot sample with a seed, which --decoding sample (the default: "
                      "seeded runs) needs: pass --decoding greedy")
    assert not any(out.rglob("*.parquet"))    # nothing ran
