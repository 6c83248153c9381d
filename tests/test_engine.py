"""The prefix-sharing engine gives exactly the naive path's predictions (issue: fast evaluation engine)."""
from __future__ import annotations

import numpy as np

from mmfragile.engine import PrefixSharingEngine, _common_prefix_len
from mmfragile.runner import run_items
from mmfragile.studies.format_bias.items import format_bias_items
from mmfragile.studies.format_bias.prompts import all_formats
from mmfragile.store import ResultStore


def test_common_prefix_len():
    import torch

    rows = [torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 5]), torch.tensor([1, 2, 3])]
    assert _common_prefix_len(rows) == 2
    assert _common_prefix_len([torch.tensor([7, 8]), torch.tensor([7, 8])]) == 2


def test_engine_equals_greedy_generation_on_format_grid(tiny_vlm, synthetic, tmp_path):
    qs = synthetic[synthetic.category.isin(["count", "text", "multi-image"])].groupby("category").head(2)
    fmts = [f for f in all_formats() if f.delimiter in ("dot", "double_brackets") and f.separator != "semicolon"]
    items = format_bias_items(tiny_vlm, qs, formats=fmts)
    eng = run_items(tiny_vlm, items, ResultStore(tmp_path / "e"), mode="engine", progress=False, batch_size=7)
    gen = run_items(tiny_vlm, items, ResultStore(tmp_path / "g"), mode="generate", progress=False, batch_size=5)
    key = ["question_id", "variant"]
    eng, gen = eng.sort_values(key).reset_index(drop=True), gen.sort_values(key).reset_index(drop=True)
    assert len(eng) == len(items) == len(gen)
    assert (eng.raw_output == gen.raw_output).all()
    assert (eng.correct == gen.correct).all() and (eng.covered == gen.covered).all()


def test_engine_multi_token_decoding_matches_generate(tiny_vlm, synthetic):
    rows = synthetic.iloc[:2]
    from mmfragile.models.base import Prompt

    for r in rows.itertuples():
        prompts = [Prompt(f"{r.question} Variant {k}: answer with {w}.", images=list(r.images))
                   for k, w in enumerate(["one word", "a short sentence please", "x"])]
        eng = PrefixSharingEngine(tiny_vlm, batch_size=2).run_group(prompts, [["A", "B"]] * 3, max_new_tokens=6)
        assert [o.text for o in eng] == tiny_vlm.generate(prompts, max_new_tokens=6)
        ref = tiny_vlm.option_logits(prompts, [["A", "B"]] * 3)
        for o, lg in zip(eng, ref):
            np.testing.assert_allclose(o.option_logits, lg, atol=1e-4)


def test_engine_shares_the_prefix(tiny_vlm, synthetic):
    r = synthetic.iloc[0]
    items = format_bias_items(tiny_vlm, synthetic.iloc[:1], formats=all_formats()[:4], include_standard=False)
    eng = PrefixSharingEngine(tiny_vlm, batch_size=64)
    eng.run_group([it.prompt for it in items], [it.option_ids for it in items], 1)
    enc = tiny_vlm.encode([items[0].prompt])
    # the shared prefix covers system prompt, 16 image tokens and the question
    assert eng.stats["groups"] == 1 and eng.stats["prefix_tokens"] > 16 + len(tiny_vlm.tokenizer(r.question)["input_ids"])
    assert eng.stats["prefix_tokens"] < enc["input_ids"].shape[1]
