"""``--budget auto --target T`` (mmfragile.budget.auto): seeded rounds that stop when the widest interval is at
most the target - on a simulated grid with a known truth (the stopped estimate lies within the target of it), on a
grid where every answer is wrong (no evidence: it never stops early), and through ``run_study`` and the CLI with a
kill in the middle (the rerun runs the same cells and stops at the same round)."""
from __future__ import annotations

import contextlib
import io
import zlib
from functools import partial

import numpy as np
import pytest

from mmfragile.budget import validation as bv
from mmfragile.budget.auto import auto_stop, round_sizes
from mmfragile.models.base import MLLM
from mmfragile.store import ResultStore
from mmfragile.studies.format_bias.budget import FORMAT_BIAS
from mmfragile.study import run_study

from test_budget import _grid


def test_round_sizes_nest_and_end_at_the_grid():
    assert round_sizes(1000, 48, 0.01) == list(range(48, 1000, 48)) + [1000]   # at least one cell per unit
    assert round_sizes(1000, 5, 0.25) == [250, 500, 750, 1000]
    with pytest.raises(ValueError, match="round share"):
        round_sizes(10, 1, 0)


def test_the_stopped_estimate_is_within_the_target_of_the_truth():
    """A known logistic grid (48 formats x 24 questions x 4 shifts): stopping on the mean at 3 pp uses a part of
    the grid, stops at the first round whose interval is narrow enough, and lands within 3 pp of the true mean."""
    g = _grid(24, 0)
    curves = bv.auto_stop_curves(g, FORMAT_BIAS, 3.0, seeds=(0, 1), statistics=("mean",), round_share=0.02)
    assert curves["reached"].all() and curves["within"].all()
    assert (curves["share"] < 0.6).all() and (curves["share"] > 0.05).all()
    true_mean = 100 * g["correct"].mean()
    assert curves["truth"].to_numpy() == pytest.approx(true_mean)

    res = auto_stop(g, FORMAT_BIAS, 3.0, partial(bv.observed_only, g), statistics=("mean",), seed=0, round_share=0.02)
    widths = res.rounds["mean_width"].to_numpy()
    assert widths[-1] <= 3.0 and (widths[:-1] > 3.0).all()   # the first round that knows enough
    assert "of the grid" in str(res) and res.record()["cells"] == int(res.rounds["cells"].iloc[-1])


def test_a_grid_without_evidence_never_stops_early():
    """Every answer wrong: the estimate's intervals come from the prior alone, so no round is a reason to stop."""
    g = _grid(6, 0).assign(correct=0.0)

    res = auto_stop(g, FORMAT_BIAS, 50.0, partial(bv.observed_only, g), round_share=0.25)
    assert not res.reached and res.share == 1.0 and res.rounds["all_agree"].all()


class AnswersA(MLLM):
    """Answers A or B, seeded by the prompt; with ``interrupt_after`` a Ctrl-C arrives in the call that would pass
    that many prompts."""

    name = "answers-a"

    def __init__(self, interrupt_after=None):
        self.calls = 0
        self.interrupt_after = interrupt_after

    def generate(self, prompts, max_new_tokens=16):
        if self.interrupt_after is not None and self.calls + len(prompts) > self.interrupt_after:
            raise KeyboardInterrupt
        self.calls += len(prompts)
        # "A" or "B" by a hash of the prompt: right where the shift put the answer there (uppercase formats)
        return ["A" if zlib.crc32(p.text.encode()) % 2 else "B" for p in prompts]

    def option_logits(self, prompts, candidates):
        return [np.zeros(len(c), np.float32) for c in candidates]

    def loglikelihood(self, prompts, continuations):  # pragma: no cover - not used
        raise NotImplementedError


def _auto(model, out, **kw):
    return run_study("format-bias", model, "synthetic-text", n=3, out=out, budget="auto", budget_target=25.0,
                     budget_round=0.05, budget_stop_on=["mean"], progress=False, mode="generate", batch_size=8,
                     **kw)


def test_a_killed_auto_run_resumes_to_the_same_cells_and_stop(tmp_path):
    whole = _auto(AnswersA(), tmp_path / "whole")
    record = whole.stores["grid"].config["run_info"]["budget_auto"]["answers-a"]
    assert record["reached"] and 0 < record["share"] < 1 and record["cells"] == len(whole.table("grid"))
    with pytest.raises(KeyboardInterrupt):
        _auto(AnswersA(interrupt_after=record["cells"] // 2), tmp_path / "killed")
    assert 0 < len(ResultStore(tmp_path / "killed")) < record["cells"]
    again = _auto(AnswersA(), tmp_path / "killed")
    assert again.stores["grid"].config["run_info"]["budget_auto"]["answers-a"] == record
    keys = ["question_id", "variant"]
    assert sorted(map(tuple, again.table("grid")[keys].to_numpy())) == \
        sorted(map(tuple, whole.table("grid")[keys].to_numpy()))


def test_budget_auto_needs_a_target_and_the_cli_prints_the_share(tmp_path, monkeypatch):
    from mmfragile.cli import main
    from mmfragile.models.spec import ModelSpec

    with pytest.raises(ValueError, match="--budget auto stops at --target"):
        run_study("format-bias", AnswersA(), "synthetic-text", n=1, out=tmp_path / "x", budget="auto")
    fake = AnswersA()
    fake.name = "tiny-vlm"   # a name the CLI's model check knows; the fake answers in its place
    monkeypatch.setattr(ModelSpec, "load", lambda spec: fake)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["run", "format-bias", "--model", "tiny-vlm", "--dataset", "synthetic-text", "--n", "3",
                     "--out", str(tmp_path / "cli"), "--mode", "generate", "--budget", "auto", "--target", "25",
                     "--stop-on", "mean", "--budget-round", "0.05"]) == 0
    printed = buf.getvalue()
    assert "auto budget: stopped after round" in printed and "% of the grid)" in printed
