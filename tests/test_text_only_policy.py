"""One policy for a text-only model on questions with images, in every study: the items with images are left out
of the run before any request, one warning counts them, and the text items run. (Before: Promptception warned
and skipped, the judge study counted and warned, and format-bias failed mid-run inside the model.)"""
from __future__ import annotations

import pandas as pd
import pytest

from mmfragile.data.loaders import load_dataset
from mmfragile.models.base import MLLM
from mmfragile.study import run_study


class TextOnly(MLLM):
    """A text-only model that answers "A" - and fails, as the real backends do, on a prompt with images."""

    name = "text-only"
    supports_images = False

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, prompts, max_new_tokens=16):
        for p in prompts:
            assert not p.images, "a text-only model was sent an image"
        self.calls += len(prompts)
        return ["A"] * len(prompts)

    def option_logits(self, prompts, option_ids):
        return [[0.0] * len(ids) for ids in option_ids]

    def loglikelihood(self, prompts, continuations):
        raise NotImplementedError("generate only")


@pytest.fixture(scope="module")
def mixed() -> pd.DataFrame:
    """Synthetic questions: image ones and text ones."""
    qs = load_dataset("synthetic-vqa")
    table = pd.concat([qs[qs.modality == "image"].head(2), qs[qs.modality == "text"].head(1)]).reset_index(drop=True)
    table.attrs["spec"] = "synthetic-vqa"
    return table


def test_format_bias_leaves_out_the_image_questions_of_a_text_only_model(mixed, tmp_path):
    model = TextOnly()
    with pytest.warns(UserWarning, match=r"text-only takes no images: 2 of 3 questions"):
        run = run_study("format-bias", model, mixed, out=tmp_path / "fb", formats=["uppercase-dot-line_break"],
                        standard_format="none", mode="generate", progress=False)
    rows = run.table("grid")
    text_q = mixed.loc[mixed.modality == "text", "question_id"].tolist()
    assert sorted(rows.question_id.unique()) == text_q and model.calls == len(rows) > 0


def test_promptception_leaves_out_the_image_questions_of_a_text_only_model(mixed, tmp_path):
    model = TextOnly()
    with pytest.warns(UserWarning, match=r"text-only takes no images: 2 of 3 questions"):
        run = run_study("promptception", model, mixed, out=tmp_path / "pc", prompt_ids=["1.1"], max_new_tokens=4,
                        progress=False)
    rows = run.table("prompts")
    assert rows.question_id.unique().tolist() == mixed.loc[mixed.modality == "text", "question_id"].tolist()
    assert model.calls == len(rows) == 1   # 1.1, the baseline
