"""``mmfragile plan`` (mmfragile.budget.plan): the grid's size equals what the run stores, nothing loads a model,
the rate a run recorded times the grid and the budgets, and the questions needed match the z-test by hand."""
from __future__ import annotations

import contextlib
import io
import math

import pytest

from mmfragile.budget.plan import plan_study, questions_for_effect
from mmfragile.models.spec import ModelSpec
from mmfragile.study import get_study, run_study

FORMATS = ["uppercase-dot-line_break", "roman-colon-comma"]


def test_questions_for_an_effect_by_hand():
    # (1.959964 + 0.841621)^2 * 2 * 0.25 / (0.02^2 * 4) = 2452.9
    assert questions_for_effect(2.0, 0.5, 4) == 2453
    assert questions_for_effect(2.0, 0.9, 4) == math.ceil(7.848879 * 2 * 0.09 / (0.0004 * 4))
    assert questions_for_effect(4.0, 0.5, 4) == math.ceil(2453 / 4)   # a twice larger effect: a quarter
    with pytest.raises(ValueError, match="--effect"):
        questions_for_effect(0, 0.5, 4)


def test_the_plan_counts_what_the_run_stores_and_times_it_by_the_recorded_rate(tmp_path, tiny_vlm, monkeypatch):
    monkeypatch.setattr(ModelSpec, "load", lambda spec: pytest.fail("a plan loads no model"))
    before = plan_study("format-bias", "tiny-vlm", "synthetic-vqa", n=2, formats=FORMATS)
    grid = before.stages.set_index("stage").loc["grid"]
    assert math.isnan(grid["rate"]) and any("no measured rate" in n for n in before.notes)
    monkeypatch.undo()
    run = run_study("format-bias", tiny_vlm, "synthetic-vqa", n=2, out=tmp_path / "fb", formats=FORMATS,
                    progress=False)
    assert grid["prompts"] == len(run.table("grid")) and grid["questions"] == 2
    # tokens: the tokenizer alone counts every prompt's text, as the model's own tokenizer does (by hand here)
    study = get_study("format-bias")
    params = {**study.resolve({"formats": FORMATS}), "budgeted": False}
    items = study.stage("grid").items(tiny_vlm, run.data.to_dict("records"), params, None)
    tok = tiny_vlm.tokenizer
    assert grid["tokens"] == sum(len(tok(it.prompt.text, add_special_tokens=False)["input_ids"]) for it in items) > 0
    after = plan_study("format-bias", "tiny-vlm", "synthetic-vqa", n=2, out=tmp_path / "fb", formats=FORMATS)
    rate = after.stages.set_index("stage").loc["grid", "rate"]
    info = run.stores["grid"].config["run_info"]["rate"]["tiny-vlm"]
    assert rate == pytest.approx(info["rows"] / info["seconds"]) and info["rows"] == grid["prompts"]
    b = after.budgets.set_index("budget")
    assert b.loc[0.05, "cells"] == math.ceil(0.05 * grid["prompts"])
    assert b.loc[1.0, "seconds"] == pytest.approx(grid["prompts"] / rate)
    power = after.power.iloc[0]
    stored = 100 * run.table("grid")["correct"].mean()
    assert power["accuracy"] == pytest.approx(stored, abs=0.05)


def test_the_cli_prints_the_plan():
    from mmfragile.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["plan", "format-bias", "--model", "tiny-vlm", "--dataset", "synthetic-vqa", "--n", "1",
                     "--formats", FORMATS[0], "--effect", "3"]) == 0
    out = buf.getvalue()
    assert "# grid" in out and "# budgets" in out and "# questions to detect an effect" in out
