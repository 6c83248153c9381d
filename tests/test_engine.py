"""The prefix-sharing engine gives exactly the naive path's predictions (issue: fast evaluation engine)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from mmfragile.api import load_model
from mmfragile.engine import PrefixSharingEngine, _common_prefix_len
from mmfragile.models.conformance import engine_variants, sample_images
from mmfragile.models.tiny import REAL_PROCESSOR_FAMILIES, build_tiny
from mmfragile.runner import run_items
from mmfragile.studies.format_bias.prompts import exact_match_score
from mmfragile.studies.format_bias.items import format_bias_items
from mmfragile.studies.format_bias.prompts import all_formats
from mmfragile.store import ResultStore


def test_common_prefix_len():
    rows = [torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 5]), torch.tensor([1, 2, 3])]
    assert _common_prefix_len(rows) == 2
    assert _common_prefix_len([torch.tensor([7, 8]), torch.tensor([7, 8])]) == 2


def test_engine_equals_greedy_generation_on_format_grid(tiny_vlm, synthetic, tmp_path):
    qs = synthetic[synthetic.category.isin(["count", "text", "multi-image"])].groupby("category").head(2)
    fmts = [f for f in all_formats() if f.delimiter in ("dot", "double_brackets") and f.separator != "semicolon"]
    items = format_bias_items(tiny_vlm, qs, formats=fmts)
    eng = run_items(tiny_vlm, items, ResultStore(tmp_path / "e"), exact_match_score, mode="engine", progress=False,
                    batch_size=7)
    gen = run_items(tiny_vlm, items, ResultStore(tmp_path / "g"), exact_match_score, mode="generate", progress=False,
                    batch_size=5)
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


# ---------------------------------------------------------------------------------------------- engine at scale


def _hd_image(tmp_path, size=(640, 360)):
    from PIL import Image

    rng = np.random.default_rng(1)
    path = tmp_path / f"hd-{size[0]}x{size[1]}.jpg"
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path, quality=90)
    return str(path)


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "tiny"


@pytest.mark.parametrize("family", REAL_PROCESSOR_FAMILIES)
def test_splice_equals_full_render_with_the_real_processor(family, tiny_root, tmp_path):
    """With the image processor as the real checkpoint ships it (Qwen's pixel bounds, anyres, tiles, image
    splitting, 896 px) a high-resolution image becomes hundreds to thousands of tokens; the group's rows spliced
    onto one processor call equal each variant's full render, and the engine equals generate."""
    from mmfragile.engine import _unpad_key

    model = load_model(str(build_tiny(family, root=tiny_root, real_processor=True)))
    ps = engine_variants([_hd_image(tmp_path)])[:4]
    engine = PrefixSharingEngine(model, verify_every=1)
    rows, prefix, extra = engine.group_rows(ps)
    n_image = int(torch.isin(rows[0], engine._media).sum())
    assert n_image >= 256, f"{family}: {n_image} image tokens - not the real processor's resolution"
    for i, p in enumerate(ps):
        full = model.encode([p])
        assert torch.equal(rows[i], _unpad_key(full, "input_ids")[0]), f"{family} variant {i}"
        for k, v in extra.items():
            assert torch.equal(v[i], _unpad_key(full, k)[0]), f"{family} variant {i}: {k}"
    outs = engine.run_group(ps, [["A", "B"]] * len(ps), 2)
    assert [o.text for o in outs] == model.generate(ps, max_new_tokens=2)
    assert engine.stats["spliced_groups"] == 2 and engine.stats["full_render_groups"] == 0


@pytest.mark.parametrize("corrupt,reason", [(0, "processed ids do not end with its tokenised text"),
                                            (-1, "differ from its full render")])
def test_splice_mismatch_falls_back_to_full_renders_with_a_warning(tiny_root, monkeypatch, corrupt, reason):
    """Where the spliced ids would not equal a full render (forced here by corrupting one variant's text tokens),
    the group is rendered in full, with a warning naming the reason, and the result stays exact."""
    model = load_model(str(build_tiny("qwen2_5_vl", root=tiny_root)))
    ps = engine_variants([sample_images(1)[0]])
    engine = PrefixSharingEngine(model, verify_every=1)
    tokenize = engine.tokenize

    def corrupted(texts):
        rows = tokenize(texts)
        rows[corrupt] = torch.cat([rows[corrupt][:-1], rows[corrupt][-1:] + 1])
        return rows

    monkeypatch.setattr(engine, "tokenize", corrupted)
    with pytest.warns(UserWarning, match=reason):
        outs = engine.run_group(ps, [["A", "B"]] * len(ps), 2)
    assert engine.stats["full_render_groups"] == 1 and engine.stats["spliced_groups"] == 0
    assert [o.text for o in outs] == model.generate(ps, max_new_tokens=2)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "mllama"])
def test_shared_prefix_cache_views_equal_per_batch_copies(family, tiny_root):
    """Tail batches read the prefix's KV cache through expanded views (no copy per batch); the texts and option
    logits are those of the per-batch deep copies, bit for bit - on M-RoPE, sliding-window and cross-attention
    caches."""
    model = load_model(str(build_tiny(family, root=tiny_root)))
    ps = engine_variants([sample_images(1)[0]])
    cands = [["A", "B"]] * len(ps)
    views = PrefixSharingEngine(model, batch_size=4)
    copies = PrefixSharingEngine(model, batch_size=4, share_cache=False)
    a, b = views.run_group(ps, cands, 4), copies.run_group(ps, cands, 4)
    assert views.stats["shared_cache_views"] == 2 and views.stats["cache_copies"] == 0
    assert copies.stats["cache_copies"] == 2 and copies.stats["shared_cache_views"] == 0
    assert [o.text for o in a] == [o.text for o in b] == model.generate(ps, max_new_tokens=4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.option_logits, y.option_logits)


def test_tail_batch_respects_a_small_memory_budget(tiny_root):
    """The tail batch is sized from a memory budget (free memory by default; on the host at most
    HOST_TAIL_BUDGET): with room for three rows, no forward takes more than three tails, and the result is
    unchanged."""
    from mmfragile.engine import HOST_TAIL_BUDGET, _row_bytes

    model = load_model(str(build_tiny("qwen2_5_vl", root=tiny_root)))
    ps = engine_variants([sample_images(1)[0]])
    rows, _, _ = PrefixSharingEngine(model).group_rows(ps)
    longest, plen = max(map(len, rows)), _common_prefix_len(rows)
    per_row = _row_bytes(model.model, longest + 1, longest - plen)
    engine = PrefixSharingEngine(model, memory_budget=3 * per_row + 1)
    assert engine.tail_batch_size(len(ps), longest + 1, longest - plen) == 3
    outs = engine.run_group(ps, [["A", "B"]] * len(ps), 1)
    assert engine.stats["max_tail_batch"] <= 3 and engine.stats["tail_batches"] >= 2
    assert [o.text for o in outs] == model.generate(ps, max_new_tokens=1)
    assert PrefixSharingEngine(model, memory_budget=0).tail_batch_size(len(ps), longest + 1, 10) == 1
    assert PrefixSharingEngine(model).tail_budget() <= HOST_TAIL_BUDGET  # CPU: capped whatever is free
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the budget never changes exactness: no fallback warning
        PrefixSharingEngine(model, memory_budget=per_row).run_group(ps, [["A", "B"]] * len(ps), 1)


def test_one_prefix_serves_variants_with_different_answer_lengths(tiny_vlm, synthetic):
    """Option IDs of different token lengths (A / (a) / iv) give variants different max_new_tokens; they share
    one prefix and each stops where generate with its own limit stops."""
    r = synthetic.iloc[0]
    from mmfragile.models.base import Prompt

    prompts = [Prompt(f"{r.question} Variant {k}: answer with {w}.", images=list(r.images))
               for k, w in enumerate(["one word", "a short sentence please", "x", "two words"])]
    limits = [1, 5, 3, 2]
    engine = PrefixSharingEngine(tiny_vlm)
    outs = engine.run_group(prompts, [["A", "B"]] * 4, limits)
    assert engine.stats["groups"] == 1
    assert [o.text for o in outs] == [tiny_vlm.generate([p], max_new_tokens=n)[0] for p, n in zip(prompts, limits)]
