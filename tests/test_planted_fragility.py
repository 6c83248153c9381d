"""The toolkit finds fragility where it was planted, and not where it was not (issue 21).

The model zoo's fine-tunes carry known properties (docs/zoo.md, "The zoo's fine-tunes"): ``zoo-judge-seeing`` scores against the
picture, ``zoo-judge-blind`` learnt with image slots that say nothing about the judged picture (modality neglect),
``zoo-judge-verbose`` sees and was rewarded for length (verbosity bias); ``zoo-follower`` never saw the prompts of
7 of Promptception's 15 categories. The fast tests read the committed run records of the default profile
(``src/mmfragile/resources/zoo/runs/``, written by ``scripts/record_planted_runs.py``) and assert the planted truths
with bootstrap intervals over samples / questions; the slow tests re-measure them on the models.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

from mmfragile.models.zoo import FOLLOWER_CATEGORIES, ZOO_SPECS, weights_dir
from mmfragile.studies.judgebias import metrics as jm, position_table, verbosity_table
from mmfragile.studies.promptception import metrics as pm
from mmfragile.studies.promptception.analysis import with_benchmark

RECORDS = weights_dir() / "runs"
JUDGES = {s.name: s.planted for s in ZOO_SPECS if s.role == "judge"}
SEEING = [j for j, planted in JUDGES.items() if planted != "modality neglect"]
IMAGE_SIDE = ("text_dominance", "image_misalignment")   # the image removed (black) / another sample's image


def _records(name: str) -> pd.DataFrame:
    return pd.read_parquet(RECORDS / f"{name}.parquet")


# ================================================================================================ checks
def check_judges(scores: pd.DataFrame, pairs: pd.DataFrame, min_samples: int) -> None:
    """Every planted judge property found with its interval, and none where it was not planted."""
    assert set(scores["judge"]) == set(JUDGES)
    for judge, g in scores.groupby("judge"):
        assert (g["status"] == "unparseable").mean() <= 0.05, judge
    for judge, g in pairs.groupby("judge"):
        assert (g["status"] == "unparseable").mean() <= 0.05, judge
    bd = jm.bias_deviation_intervals(scores, IMAGE_SIDE).set_index(["judge", "perturbation"])
    assert (bd["n_samples"] >= min_samples).all()
    for pert in IMAGE_SIDE:
        for judge in SEEING:        # sees the picture: its scores drop when the picture goes or is another's
            r = bd.loc[(judge, pert)]
            assert r.excess_low > 0.1 and r.score_drop_low > 0, (judge, pert, r.to_dict())
        # neglects it: no more change than sampling alone gives (BD not above its run-to-run floor; it can fall below:
        # a run samples every condition with one seed, so a judge the perturbation does not reach tends to repeat
        # that run's unperturbed draw), and no mean score change
        r = bd.loc[("zoo-judge-blind", pert)]
        assert r.excess_low <= 0 and r.score_drop_low <= 0 <= r.score_drop_high, (pert, r.to_dict())
    pb = jm.pairwise_bias_intervals(position_table(pairs), verbosity_table(pairs)).set_index(["judge", "measure"])
    for judge, planted in JUDGES.items():
        v = pb.loc[(judge, "verbose_preference")]
        if planted == "verbosity bias":
            assert v.ci_low > 0.5, v.to_dict()
        else:
            assert v.ci_low <= 0.5, (judge, v.to_dict())
        for measure in ("first_position_rate", "position_consistency"):   # reported for every judge
            assert pd.notna(pb.loc[(judge, measure), "value"])


def check_follower(rows: pd.DataFrame) -> None:
    """Prompt sensitivity found where it was planted and not where it was not: the held-out categories' prompts lose
    accuracy against the trained ones (paired contrast, interval below zero) and, on the image questions, against the
    baseline prompt; the trained categories do not differ from the baseline prompt (interval around zero); the
    baseline prompt is at least halfway from chance to perfect. (Pooled over modalities, PRAD against the one baseline
    prompt carries that prompt's own sampling noise, and the video third of the questions is at chance - nothing to
    be sensitive about - so its interval is not the test.)"""
    rows = with_benchmark(rows, "dataset")
    contrast = [("held_out", "trained")]
    g = pm.group_intervals(rows, FOLLOWER_CATEGORIES, contrasts=contrast).set_index("statistic")
    held_vs_trained, trained = g.loc["held_out - trained"], g.loc["trained"]
    assert held_vs_trained.diff_high < 0 and held_vs_trained.prad_high < 0, held_vs_trained.to_dict()
    assert trained.diff_low <= 0 <= trained.diff_high and trained.prad_low <= 0 <= trained.prad_high, trained.to_dict()
    image = pm.group_intervals(rows[rows["modality"] == "image"], FOLLOWER_CATEGORIES).set_index("statistic")
    assert image.loc["held_out"].diff_high < 0 and image.loc["held_out"].prad_high < 0, image.loc["held_out"].to_dict()
    base = rows[rows["prompt_id"] == "1.1"]
    chance = (1 / base["n_options"]).mean()
    assert (base["correct"].mean() - chance) / (1 - chance) >= 0.5


# ================================================================================================ fast: the records
def test_committed_records_are_the_default_profiles():
    cfg = json.loads((RECORDS / "runs.json").read_text())
    assert cfg["judges"]["dataset"] == "easy-vqa-judge" and cfg["judges"]["seed"] == 0
    assert set(cfg["judge_models"]) == set(JUDGES)
    assert cfg["follower_models"] == ["zoo-follower"] and cfg["follower_datasets"] == ["easy-vqa-media"]


def test_planted_judge_biases_are_found_in_the_records():
    check_judges(_records("judge_scores"), _records("judge_pairs"), min_samples=30)


def test_planted_prompt_sensitivity_is_found_in_the_records():
    check_follower(_records("follower_prompts"))


# ================================================================================================ slow: the models
@pytest.mark.slow
def test_planted_judge_biases_are_found_on_the_models(tmp_path):
    from mmfragile.study import run_study
    from mmfragile.studies import judgebias as jb

    for judge in JUDGES:
        run = run_study("judge", judge, "easy-vqa-judge", out=tmp_path, n_samples=16, runs=2, pairwise=True,
                        perturbations=list(IMAGE_SIDE), progress=False)
    scores = jb.judgment_table(run.stores["scores"])
    check_judges(scores, run.stores["pairwise"].read(), min_samples=20)


@pytest.mark.slow
def test_planted_prompt_sensitivity_is_found_on_the_model(tmp_path):
    from mmfragile.study import run_study

    run = run_study("promptception", "zoo-follower", "easy-vqa-media", n=48, out=tmp_path, match_text=True,
                    progress=False)
    check_follower(run.table())
