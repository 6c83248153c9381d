"""The vLLM backend computes what the HF backend computes (issue 10), on the embedded models.

vLLM lives in its own environment (``scripts/install_vllm.sh``; ``.ci/run`` creates it). Each model's vLLM
side runs there through ``tests/vllm_worker.py`` - one engine start per model, ``enforce_eager`` - and is
compared here with the HF backend: the same token ids, the same greedy answers on a format-bias grid
(multi-token roman IDs, images, multi-image and video-frame questions), option-ID log-probabilities equal to
the HF logits' log-softmax, CP-LN log-likelihoods, and the stored run_items table. Marked ``vllm``
(``-m vllm`` runs only these, ``-m "not vllm"`` skips them); the default set runs them.
(tiny-vlm is not used: vLLM's CPU attention has no kernel for its 16-wide heads.)
"""
from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from mmfragile.runner import run_items

from mmfragile.studies.format_bias.prompts import exact_match_score

from mmfragile.studies.format_bias.items import format_bias_items
from mmfragile.models.base import Prompt
from mmfragile.paths import vllm_venv
from mmfragile.studies.format_bias.prompts import all_formats, build_cloze_prompt
from mmfragile.store import ResultStore

pytestmark = pytest.mark.vllm
# seeded sampling, HF against vLLM: one prompt, DIST_N seeds, one token each, at (temperature, top_p)
DIST_PROMPT = Prompt("Name one colour.", assistant_prefix="My favourite colour is")
DIST_N, DIST_PARAMS = 300, (0.7, 0.9)
REPO = Path(__file__).resolve().parents[1]
KEY = ["question_id", "variant"]


def run_vllm(spec: str, calls: list, tmp: Path) -> dict:
    """Run ``calls`` on ``vllm:<spec>`` in the vLLM environment; skip only if that environment is absent."""
    py = vllm_venv() / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no vLLM environment at {vllm_venv()}: create it with scripts/install_vllm.sh (.ci/run does)")
    from mmfragile.models.embedded import EMBEDDED_MODELS, embedded_model_path
    from mmfragile.models.zoo import ZOO_MODELS, zoo_model_path

    if spec.partition("@")[0] in EMBEDDED_MODELS:  # build the checkpoint here: the vLLM venv lacks the GGUF packages
        embedded_model_path(spec.partition("@")[0])
    if spec in ZOO_MODELS:
        zoo_model_path(spec)
    job, out = tmp / "job.pkl", tmp / "out.pkl"
    job.write_bytes(pickle.dumps({"spec": spec, "kwargs": {"enforce_eager": True}, "calls": calls}))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([str(py), str(REPO / "tests" / "vllm_worker.py"), str(job), str(out)], env=env,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        pytest.fail(f"vLLM worker failed ({p.returncode}):\n{p.stderr[-6000:]}")
    return pickle.loads(out.read_bytes())


def hf_ids(model, prompts) -> list[list[int]]:
    enc = model.encode(prompts)
    return [enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist() for i in range(len(prompts))]


def assert_same_grid(hf, vl, model, items):
    """Same answers row for row; vLLM's option scores are log-probabilities: HF logits minus logsumexp."""
    hf, vl = (t.sort_values(KEY).reset_index(drop=True) for t in (hf, vl))
    assert len(hf) == len(vl) == len(items)
    assert (hf[KEY] == vl[KEY]).all().all()
    assert (hf.raw_output == vl.raw_output).all(), hf[hf.raw_output != vl.raw_output][KEY + ["raw_output"]]
    assert (hf.correct == vl.correct).all() and (hf.covered == vl.covered).all()
    assert hf.covered.any()  # the grid scores real answers, not only out-of-coverage text
    # per row, logit - logprob is one constant (the log-partition function) for every option
    for a, b in zip(hf.option_logits, vl.option_logits):
        d = np.asarray(a) - np.asarray(b)
        assert np.all(np.asarray(b) < 0) and np.ptp(d) < 2e-3, (a, b)
    # ... and that constant is the HF logsumexp: vLLM's values are the exact log-softmax, not a top-k estimate
    by_key = {(it.key["question_id"], it.key["variant"]): it for it in items}
    rows = vl.iloc[:6]
    its = [by_key[(q, v)] for q, v in zip(rows.question_id, rows.variant)]
    logp = torch.log_softmax(model.next_token_logits([it.prompt for it in its]), -1)
    for i, (it, got) in enumerate(zip(its, rows.option_logits)):
        want = logp[i, [model.first_token_id(c) for c in it.option_ids]].numpy()
        np.testing.assert_allclose(got, want, atol=2e-3)


# ---------------------------------------------------------------------------------------------- text: smollm2
@pytest.fixture(scope="module")
def smollm2():
    from mmfragile.models.embedded import load_embedded

    return load_embedded("smollm2")


@pytest.fixture(scope="module")
def text_case(smollm2, synthetic, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_text")
    qs = synthetic[synthetic.modality == "text"].head(2)
    fmts = [f for f in all_formats() if f.separator == "line_break"]  # 4 ID sets x 4 delimiters
    items = format_bias_items(smollm2, qs, formats=fmts)
    cloze = [build_cloze_prompt(r) for r in qs.to_dict("records")]
    ll_prompts = [cz.to_prompt() for cz in cloze for _ in cz.continuations]
    ll_conts = [c for cz in cloze for c in cz.continuations]
    long_p = [Prompt("Write a long sentence about the sea.", system="Be verbose.")]
    long_c = [" The sea stretches out under a grey sky, waves rolling in one after another, the wind carrying salt "
              "and the calls of gulls over the harbour where the old boats rest."]
    gen_prompts = [Prompt("Name three colours."), Prompt("What is 2 plus 3?", assistant_prefix="The answer is"),
                   Prompt("Say hello.", system="You are terse.")]
    seeds = [11, 12, 13]
    calls = [("grid", "run_items", (items, str(tmp / "store"))),
             ("ids", "prompt_token_ids", ([it.prompt for it in items[:5]] + gen_prompts,)),
             ("gen", "generate", (gen_prompts, 12)),
             ("ll", "loglikelihood", (ll_prompts, ll_conts)),
             ("long1", "loglikelihood", (long_p, long_c)),
             ("long2", "loglikelihood", (long_p, long_c)),  # now a cached prefix covers scored positions
             ("stats", "stats", ()),
             ("sampled", "generate_sampled", (gen_prompts, 5, seeds)),
             ("sampled_rev", "generate_sampled", (gen_prompts[::-1], 5, seeds[::-1])),
             ("sampled_same", "generate_sampled", ([gen_prompts[0]] * 3, 5, [1, 2, 3])),
             ("sampled_dist", "generate_sampled", ([DIST_PROMPT] * DIST_N, 1, list(range(DIST_N)), *DIST_PARAMS))]
    vl = run_vllm("smollm2", calls, tmp)
    return dict(vl=vl, items=items, gen_prompts=gen_prompts, ll=(ll_prompts, ll_conts), long=(long_p, long_c), tmp=tmp)


def test_text_token_ids_are_the_hf_backends(smollm2, text_case):
    prompts = [it.prompt for it in text_case["items"][:5]] + text_case["gen_prompts"]
    assert text_case["vl"]["ids"] == hf_ids(smollm2, prompts)


def test_text_format_grid_equals_hf_engine(smollm2, text_case):
    items = text_case["items"]
    assert len(items) == 102
    hf = run_items(smollm2, items, ResultStore(text_case["tmp"] / "hf"), exact_match_score, mode="engine",
                   progress=False)
    assert_same_grid(hf, text_case["vl"]["grid"], smollm2, items)


def test_text_greedy_generation_equals_hf(smollm2, text_case):
    assert text_case["vl"]["gen"] == smollm2.generate(text_case["gen_prompts"], max_new_tokens=12)


def test_text_loglikelihood_equals_hf_including_cached_prefixes(smollm2, text_case):
    vl = text_case["vl"]
    for got, want in zip(vl["ll"], smollm2.loglikelihood(*text_case["ll"])):
        assert got.n_tokens == want.n_tokens and abs(got.logprob - want.logprob) < 2e-3 * max(1, want.n_tokens)
    want = smollm2.loglikelihood(*text_case["long"])[0]
    assert want.n_tokens > 32  # longer than one KV block, so the repeated request hits the prefix cache
    for k in ("long1", "long2"):
        assert vl[k][0].n_tokens == want.n_tokens and abs(vl[k][0].logprob - want.logprob) < 0.05
    assert vl["stats"]["loglik_cache_reruns"] >= 1  # the repeat was detected and recomputed, not read as 0


def test_seeded_sampling_depends_on_the_seed_not_the_batch(text_case):
    vl = text_case["vl"]
    assert vl["sampled"] == vl["sampled_rev"][::-1]
    assert len(set(vl["sampled_same"])) > 1  # one prompt, three seeds: three samples, not one greedy text


def test_sampling_draws_the_hf_distribution(smollm2, text_case):
    """HF and vLLM sample the same distribution, softmax(logits / T) over the top-p nucleus; not the same
    samples: vLLM's CPU sampler adds Gumbel noise from a fused kernel (per-token SplitMix64 streams seeded from
    the request's generator, ``topk_topp_sampler.forward_cpu``), the HF backend from one torch.Generator per
    prompt, so a seed names a different draw on each backend (documented in ``generate_sampled``). Both are
    checked against the exact distribution of the HF logits with a chi-square test over the same seeds."""
    from scipy.stats import chisquare

    from test_sampling import nucleus_distribution

    temperature, top_p = DIST_PARAMS
    logits = smollm2.next_token_logits([DIST_PROMPT])[0].double().numpy()
    want = nucleus_distribution(logits, temperature, top_p)
    support = np.flatnonzero(want)
    assert (want * DIST_N >= 5).sum() >= 5  # a spread-out first token: the test can tell distributions apart
    texts = [smollm2.tokenizer.decode([int(t)], skip_special_tokens=True) for t in range(len(want))]
    cells = sorted({texts[t] for t in support})
    expected = np.array([sum(want[t] for t in support if texts[t] == c) for c in cells])
    old, smollm2.batch_size = smollm2.batch_size, 50  # one short prompt: big batches, same draws (batch-invariant)
    try:
        hf = smollm2.generate_sampled([DIST_PROMPT] * DIST_N, 1, list(range(DIST_N)), temperature, top_p)
    finally:
        smollm2.batch_size = old
    for name, samples in (("hf", hf), ("vllm", text_case["vl"]["sampled_dist"])):
        assert set(samples) <= set(cells), (name, set(samples) - set(cells))  # nothing outside the nucleus
        counts = np.array([samples.count(c) for c in cells])
        big = expected * DIST_N >= 5  # pool the rare cells, as a chi-square test needs
        obs = np.append(counts[big], counts[~big].sum())
        exp = np.append(expected[big], expected[~big].sum()) * DIST_N
        obs, exp = obs[exp > 0], exp[exp > 0]
        assert chisquare(obs, exp).pvalue > 1e-3, (name, dict(zip(cells, counts)))
    assert hf != text_case["vl"]["sampled_dist"]  # same seeds, other draws (see the docstring)


# ---------------------------------------------------------------------------------------------- images: smollm2-vlm
@pytest.fixture(scope="module")
def smollm2_vlm():
    from mmfragile.models.embedded import load_embedded

    return load_embedded("smollm2-vlm")


@pytest.fixture(scope="module")
def vlm_case(smollm2_vlm, synthetic, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm_vlm")
    qs = synthetic[synthetic.modality != "text"].groupby("modality").head(1)  # image, multi-image, video frames
    fmts = [f for f in all_formats() if f.separator == "comma" and f.delimiter in ("dot", "double_brackets")]
    items = format_bias_items(smollm2_vlm, qs, formats=fmts)
    cloze = [build_cloze_prompt(r) for r in qs.to_dict("records")]
    ll_prompts = [cz.to_prompt() for cz in cloze for _ in cz.continuations]
    ll_conts = [c for cz in cloze for c in cz.continuations]
    gen_prompts = [Prompt("Describe the picture.", images=list(qs.iloc[0].images)),
                   Prompt("Compare the images.", images=list(qs.iloc[1].images)), Prompt("A text-only question?")]
    calls = [("grid", "run_items", (items, str(tmp / "store"))),
             ("ids", "prompt_token_ids", ([it.prompt for it in items[::9]] + gen_prompts,)),
             ("gen", "generate", (gen_prompts, 10)),
             ("ll", "loglikelihood", (ll_prompts, ll_conts))]
    vl = run_vllm("smollm2-vlm", calls, tmp)
    return dict(vl=vl, qs=qs, items=items, gen_prompts=gen_prompts, ll=(ll_prompts, ll_conts), tmp=tmp)


def test_image_placeholders_expand_to_the_hf_processors_ids(smollm2_vlm, vlm_case):
    prompts = [it.prompt for it in vlm_case["items"][::9]] + vlm_case["gen_prompts"]
    got = vlm_case["vl"]["ids"]
    assert got == hf_ids(smollm2_vlm, prompts)
    image_token = smollm2_vlm.model.config.image_token_index
    assert {len(p.images) * 16 for p in prompts} == {ids.count(image_token) for ids in got}


def test_image_format_grid_equals_hf_engine(smollm2_vlm, vlm_case):
    items = vlm_case["items"]
    assert set(vlm_case["qs"].modality) == {"image", "multi-image", "video"} and len(items) > 50
    hf = run_items(smollm2_vlm, items, ResultStore(vlm_case["tmp"] / "hf"), exact_match_score, mode="engine",
                   progress=False)
    assert_same_grid(hf, vlm_case["vl"]["grid"], smollm2_vlm, items)


def test_image_generation_and_loglikelihood_equal_hf(smollm2_vlm, vlm_case):
    vl = vlm_case["vl"]
    assert vl["gen"] == smollm2_vlm.generate(vlm_case["gen_prompts"], max_new_tokens=10)
    for got, want in zip(vl["ll"], smollm2_vlm.loglikelihood(*vlm_case["ll"])):
        assert got.n_tokens == want.n_tokens and abs(got.logprob - want.logprob) < 2e-3 * max(1, want.n_tokens)


# ---------------------------------------------------------------------------------------------- the zoo: gemma3
def test_zoo_model_runs_in_vllm_as_in_transformers(tmp_path):
    """A zoo checkpoint (Gemma-3 text model behind a trained tower, answering changes merged) is an ordinary LLaVA
    checkpoint: vLLM answers easy-VQA test questions in four formats exactly as the transformers engine does."""
    from mmfragile.api import load_model
    from mmfragile.data.easyvqa import load_easy_vqa

    model = load_model("zoo-gemma3-good")
    qs = load_easy_vqa("test", n=3, seed=0)
    fmts = [f for f in all_formats() if f.separator == "line_break" and f.delimiter in ("dot", "bracket")
            and f.option_ids in ("uppercase", "numbers")]
    items = format_bias_items(model, qs, formats=fmts)
    vl = run_vllm("zoo-gemma3-good", [("grid", "run_items", (items, str(tmp_path / "store")))], tmp_path)
    hf = run_items(model, items, ResultStore(tmp_path / "hf"), exact_match_score, mode="engine", progress=False)
    assert_same_grid(hf, vl["grid"], model, items)
    assert hf.correct.mean() > 0.5  # it sees: easy-VQA chance is about 0.46
