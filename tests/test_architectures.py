"""Architecture conformance suite (issue: every architecture must load, score and run fast).

For every family of :mod:`mmfragile.models.tiny` a tiny random checkpoint is built offline with the family's real
processor / image processor / video processor classes, special tokens and published chat template, saved with
``save_pretrained`` and loaded by path through :func:`mmfragile.load_model`, exactly as a downloaded checkpoint.
Each check of :mod:`mmfragile.models.conformance` must pass: batched == one at a time (mixed image counts),
option logits, log-likelihoods, multi-image placement, video, and the prefix-sharing engine token for token
equal to greedy ``generate`` (or an explicit refusal with the reason where it cannot be exact).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from mmfragile.api import load_model
from mmfragile.models.adapters import EngineInexact
from mmfragile.models.base import Prompt
from mmfragile.models.conformance import CHECKS, engine_variants, mixed_prompts, sample_images
from mmfragile.models.tiny import FAMILIES, build_tiny
from mmfragile.studies.format_bias.prompts import exact_match_score

#: the engine refuses these families, with these reasons (anything else must be exact)
ENGINE_REFUSES = {"paligemma": "bidirectionally over the whole prompt"}

#: real processor classes each family must load with (the classes a downloaded checkpoint resolves to)
PROCESSORS = {
    "llava": "LlavaProcessor", "llava_next": "LlavaNextProcessor", "llava_onevision": "LlavaOnevisionProcessor",
    "qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor",
    "gemma3": "Gemma3Processor", "internvl": "InternVLProcessor", "idefics3": "Idefics3Processor",
    "smolvlm": "SmolVLMProcessor", "paligemma": "PaliGemmaProcessor", "phi4_multimodal": "Phi4MultimodalProcessor",
    "mllama": "MllamaProcessor",
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_model(request, tmp_path_factory):
    family = request.param
    path = build_tiny(family, root=tmp_path_factory.getbasetemp() / "tiny")
    return family, load_model(str(path))


def test_every_family_has_a_processor_expectation():
    assert set(PROCESSORS) == set(FAMILIES)


def test_loads_by_path_with_its_real_classes(family_model):
    family, model = family_model
    assert type(model.processor).__name__ == PROCESSORS[family]
    assert model.adapter.model_types and model.model.config.model_type in model.adapter.model_types
    assert model.supports_images
    template = model.processor.chat_template
    # PaliGemma publishes none; Phi-4's processor loses its template on load while its tokenizer keeps it
    assert (template is None) == (family in ("paligemma", "phi4_multimodal"))
    if family == "phi4_multimodal":
        assert model.tokenizer.chat_template and model.render(mixed_prompts(model)[0]).startswith("<|user|><|image|>")
    saved = json.loads((Path(model.model.config._name_or_path) / "config.json").read_text())
    assert saved["model_type"] == model.model.config.model_type  # loaded from the folder, as a download would be


@pytest.mark.parametrize("check", [c for c in CHECKS if c != "engine exact"])
def test_check(family_model, check):
    family, model = family_model
    result = CHECKS[check](model)
    if result.ok is None:
        assert check == "video" and not FAMILIES[family].video, result.detail
        return
    assert result.ok, f"{family} / {check}: {result.detail}"


def test_engine_exact_or_refuses_with_reason(family_model):
    family, model = family_model
    result = CHECKS["engine exact"](model)
    if family in ENGINE_REFUSES:
        assert result.ok is None and ENGINE_REFUSES[family] in result.detail
    else:
        assert result.ok, f"{family}: {result.detail}"


def test_study_item_builders_run_on_every_family(family_model, tmp_path):
    """Format-bias items (engine path, falling back with a warning where it refuses), Promptception items and a
    judge prompt all run end to end."""
    import pandas as pd

    from mmfragile.runner import run_items


    from mmfragile.studies.format_bias.items import format_bias_items
    from mmfragile.studies.format_bias.prompts import PromptFormat
    from mmfragile.studies.judgebias.prompts import score_prompt
    from mmfragile.store import ResultStore
    from mmfragile.studies.promptception import promptception_items

    family, model = family_model
    img = sample_images(1)[0]
    path = tmp_path / "q.png"
    img.save(path)
    qs = pd.DataFrame([{"dataset": "t", "question_id": "q1", "question": "What colour dominates?",
                        "options": ["red", "green", "blue"], "answer": 1, "images": [str(path)],
                        "category": "colour", "modality": "image"}])
    fmts = [PromptFormat.from_name(n) for n in ("uppercase-dot-line_break", "numbers-double_brackets-comma")]
    items = format_bias_items(model, qs, formats=fmts, include_standard=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_items(model, items, ResultStore(tmp_path / "fb"), exact_match_score, progress=False)
    assert len(res) == len(items) == 2 * 3 and res.covered.notna().all()
    assert res.option_logits.map(len).eq(3).all()  # engine or fallback: logits stored for every row
    pc = promptception_items(model, qs, prompt_ids=["1.1", "5.2"], max_new_tokens=4)
    outs = model.generate([it.prompt for it in pc], max_new_tokens=4)
    assert len(outs) == len(pc) == 2
    judge = score_prompt("What colour dominates?", "Green.", images=[str(path)])
    assert isinstance(model.generate([judge], max_new_tokens=3)[0], str)


def test_engine_refusal_falls_back_to_exact_generate_with_a_warning(tmp_path_factory):
    from mmfragile.engine import PrefixSharingEngine
    from mmfragile.runner import EvalItem, run_items
    from mmfragile.store import ResultStore

    model = load_model(str(build_tiny("paligemma", root=tmp_path_factory.getbasetemp() / "tiny")))
    with pytest.raises(EngineInexact, match="bidirectionally"):
        PrefixSharingEngine(model)
    ps = engine_variants([sample_images(1)[0]])
    items = [EvalItem({"dataset": "d", "question_id": "q", "variant": str(i)}, p, ["A", "B"], "A", 2)
             for i, p in enumerate(ps)]
    with pytest.warns(UserWarning, match="engine not used"):
        res = run_items(model, items, ResultStore(tmp_path_factory.mktemp("pg")), exact_match_score, progress=False)
    assert res.sort_values("variant").raw_output.tolist() == model.generate(ps, max_new_tokens=2)
    with pytest.raises(EngineInexact):
        run_items(model, items, ResultStore(tmp_path_factory.mktemp("pg2")), exact_match_score, mode="engine",
                  progress=False)


def test_engine_refuses_rows_beyond_a_sliding_window(tmp_path_factory):
    """Gemma-3's local layers see a window of cache slots: padding between prefix and tail would shift it, so
    the engine refuses rows that reach past the window instead of approximating."""
    from mmfragile.engine import PrefixSharingEngine

    model = load_model(str(build_tiny("gemma3", root=tmp_path_factory.getbasetemp() / "tiny")))
    old = model.model.config.text_config.sliding_window
    try:
        model.model.config.text_config.sliding_window = 16
        with pytest.raises(EngineInexact, match="sliding-window"):
            PrefixSharingEngine(model).run_group(engine_variants([sample_images(1)[0]]), [["A", "B"]] * 6, 1)
    finally:
        model.model.config.text_config.sliding_window = old


def test_mixed_prompts_cover_zero_one_and_two_images(family_model):
    family, model = family_model
    counts = [len(p.images) for p in mixed_prompts(model)]
    assert counts == ([1, 2, 0] if family != "paligemma" else [1, 2, 1])


def test_remote_code_checkpoints_need_trust_remote_code_and_run_through_the_generic_path(tmp_path_factory):
    """Phi-3.5-vision, MiniCPM-V and Molmo ship their own modeling code (config.json ``auto_map``). Offline we can
    test the mechanism: a checkpoint whose classes live in the folder loads only with trust_remote_code=True, runs
    generate / option_logits like the built-in class it wraps, and the engine refuses it with the reason."""
    import shutil

    from mmfragile.engine import engine_refusal

    src = build_tiny("llava", root=tmp_path_factory.getbasetemp() / "tiny")
    path = tmp_path_factory.mktemp("remote") / "tiny-remote"
    shutil.copytree(src, path)
    (path / "configuration_tiny_remote.py").write_text(
        "from transformers import LlavaConfig\n\n\nclass TinyRemoteConfig(LlavaConfig):\n"
        "    model_type = 'tiny_remote_llava'\n")
    (path / "modeling_tiny_remote.py").write_text(
        "from transformers import LlavaForConditionalGeneration\n\nfrom .configuration_tiny_remote import "
        "TinyRemoteConfig\n\n\nclass TinyRemoteForCausalLM(LlavaForConditionalGeneration):\n"
        "    config_class = TinyRemoteConfig\n")
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(model_type="tiny_remote_llava", architectures=["TinyRemoteForCausalLM"],
               auto_map={"AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
                         "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM"})
    (path / "config.json").write_text(json.dumps(cfg))
    builtin = load_model(str(src))
    # the built-in checkpoint's key layout is llava's: give the remote class the same weights in its own layout
    from transformers import AutoModelForCausalLM

    own = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
    own.load_state_dict(builtin.model.state_dict())
    own.save_pretrained(path)

    with pytest.raises(ValueError, match="trust_remote_code=True"):
        load_model(str(path))
    remote = load_model(str(path), trust_remote_code=True)
    assert type(remote.model).__name__ == "TinyRemoteForCausalLM"
    assert "remote code" in engine_refusal(remote)
    # prompts without "<image k>" references: the generic adapter interleaves them, llava's template does not
    ps = [p for p in mixed_prompts(builtin) if "<image" not in p.text]
    assert remote.generate(ps, max_new_tokens=3) == builtin.generate(ps, max_new_tokens=3)
    np.testing.assert_allclose(np.stack(remote.option_logits(ps, [["A", "B"]] * 2)),
                               np.stack(builtin.option_logits(ps, [["A", "B"]] * 2)), atol=1e-5)


def test_image_policy_caps_large_images_and_is_pinned_in_the_store(tmp_path_factory, tmp_path):
    """A 4K-class image is downscaled to ``max_pixels`` before the processor (the run records the policy with the
    processor's own size settings), and a store made under one policy refuses to resume under another."""
    from PIL import Image

    from mmfragile.runner import EvalItem, run_items
    from mmfragile.models.hf import load_image
    from mmfragile.store import ConfigMismatch, ResultStore

    big = tmp_path / "big.jpg"
    Image.new("RGB", (4096, 2048), (200, 30, 30)).save(big, quality=80)
    small = load_image(str(big), max_pixels=512 * 512)
    assert small.width * small.height <= 512 * 512 and abs(small.width / small.height - 2) < 0.01
    assert load_image(str(big)).size == (4096, 2048)

    path = str(build_tiny("qwen2_vl", root=tmp_path_factory.getbasetemp() / "tiny"))
    capped = load_model(path, max_pixels=512 * 512)
    policy = capped.image_policy
    assert policy["max_pixels"] == 512 * 512 and policy["processor"] == "Qwen2VLImageProcessor"
    assert "size" in policy and "patch_size" in policy  # the processor's own resize settings ride along
    items = [EvalItem({"dataset": "d", "question_id": "q", "variant": "v"}, Prompt("A or B?", images=[str(big)]),
                      ["A", "B"], "A")]
    store = ResultStore(tmp_path / "s", config={"study": "t"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_items(capped, items, store, exact_match_score, progress=False)
    assert ResultStore(tmp_path / "s").config["run_info"]["image_policy"][capped.name]["max_pixels"] == 512 * 512
    with pytest.raises(ConfigMismatch, match="image_policy"):
        run_items(load_model(path), items, ResultStore(tmp_path / "s", config={"study": "t"}), exact_match_score,
                  progress=False)


def test_engine_splices_variant_texts_onto_one_processor_call(family_model):
    """The engine runs the processor once per question group (the first variant) and joins every variant's own
    text tokens to its ids: every row - and every per-token tensor - equals the variant's full render."""
    from mmfragile.engine import PrefixSharingEngine, _unpad_key

    family, model = family_model
    if family in ENGINE_REFUSES:
        return
    engine = PrefixSharingEngine(model)
    imgs = sample_images()
    for images in ([imgs[0]], [imgs[1], imgs[2]]):
        ps = engine_variants(images)
        rows, prefix, extra = engine.group_rows(ps)
        assert engine.stats["full_render_groups"] == 0
        for i, p in enumerate(ps):
            full = model.encode([p])
            assert rows[i].tolist() == _unpad_key(full, "input_ids")[0].tolist(), f"{family} variant {i}"
            for k, v in extra.items():
                assert torch.equal(v[i], _unpad_key(full, k)[0]), f"{family} variant {i}: {k}"
        assert prefix["input_ids"].shape[0] == 1  # the one processor call: variant 0's encode


def test_engine_agreement_in_bfloat16_is_measured_against_a_hand_count(tmp_path_factory):
    """The architecture table's bf16 column (conformance.engine_agreement): in float32 it finds what "engine exact"
    asserts (no flip, |d logit| < 1e-4); in bfloat16 its flip count equals a count made here from the engine's and
    generate's own answers, and its |d logit| is that arithmetic's (above float32's, far below a logit)."""
    from mmfragile.engine import PrefixSharingEngine
    from mmfragile.models.conformance import ATOL, engine_agreement
    from mmfragile.models.hf import cpu_has_bf16_matmul

    path = str(build_tiny("qwen2_5_vl", root=tmp_path_factory.getbasetemp() / "tiny"))
    fp32 = engine_agreement(load_model(path))
    assert (fp32["prompts"], fp32["flips"], fp32["first_token_flips"]) == (30, 0, 0) and fp32["max_dlogit"] < ATOL
    model = load_model(path, dtype="bfloat16")
    assert model.model.dtype == torch.bfloat16
    got = engine_agreement(model)
    imgs = sample_images()
    engine, flips = PrefixSharingEngine(model, batch_size=4), 0
    for images in ([imgs[0]], [imgs[1]], [imgs[2]], [imgs[1], imgs[2]], [imgs[2], imgs[0]]):
        ps = engine_variants(images)
        outs = engine.run_group(ps, [["A", "B"]] * len(ps), 4)
        flips += sum(o.text != r for o, r in zip(outs, model.generate(ps, max_new_tokens=4)))
    assert got["flips"] == flips and got["prompts"] == 30
    assert got["max_dlogit"] < 0.1
    if cpu_has_bf16_matmul():   # hardware bf16 GEMMs round the engine's tail shapes and generate's differently;
        assert fp32["max_dlogit"] < got["max_dlogit"]   # an emulating CPU (AVX2) may round both alike: 0 measured
