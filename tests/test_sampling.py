"""Seeded sampling on the HF backend (the judge study's inter-run variance, MM-JudgeBias's repeated runs).

``HFModel.generate_sampled(prompts, n, seeds, temperature, top_p)`` gives prompt i its own random stream
``seeds[i]``: the same seed gives the same text, another seed another sample, and a prompt's text does not depend
on the batch it is in. The sampler itself is checked against the distribution it must draw from,
``softmax(logits / T)`` restricted to the top-p nucleus, computed by hand. (HF against vLLM: the same
distribution, not the same samples - see ``test_vllm_backend.test_sampling_draws_the_hf_distribution``.)
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from mmfragile.models.base import Prompt
from mmfragile.models.hf import SeededGumbelSampler


def nucleus_distribution(logits, temperature: float, top_p: float) -> np.ndarray:
    """The distribution a temperature / top-p sampler draws from: keep the most likely tokens until their mass
    reaches top_p, renormalise."""
    p = np.exp(np.asarray(logits, float) / temperature)
    p /= p.sum()
    order = np.argsort(-p)
    keep = np.zeros_like(p, bool)
    mass = 0.0
    for i in order:
        keep[i] = True
        mass += p[i]
        if mass >= top_p:
            break
    q = np.where(keep, p, 0.0)
    return q / q.sum()


def test_nucleus_distribution_by_hand():
    # logits ln 5, ln 3, ln 1, ln 1 -> p = .5, .3, .1, .1; top_p .75 keeps {0, 1} -> .625, .375
    got = nucleus_distribution(np.log([5, 3, 1, 1]), 1.0, 0.75)
    np.testing.assert_allclose(got, [0.625, 0.375, 0, 0])
    # T = 2 halves the logits: p ~ sqrt(5), sqrt(3), 1, 1
    got = nucleus_distribution(np.log([5, 3, 1, 1]), 2.0, 1.0)
    w = np.array([math.sqrt(5), math.sqrt(3), 1, 1])
    np.testing.assert_allclose(got, w / w.sum())


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (2.0, 0.75)])
def test_gumbel_sampler_draws_softmax_over_the_nucleus(temperature, top_p):
    logits = torch.tensor([[2.0, 1.5, 0.3, 0.0, -1.0, -4.0]])
    n = 3000
    draws = np.array([int(SeededGumbelSampler([s], temperature, top_p)(None, logits.clone()).argmax(-1))
                      for s in range(n)])
    want = nucleus_distribution(logits[0].numpy(), temperature, top_p)
    counts = np.bincount(draws, minlength=len(want))
    assert counts[want == 0].sum() == 0  # nothing outside the nucleus, ever
    keep = want > 0
    stat = chisquare(counts[keep], want[keep] * n)
    assert stat.pvalue > 1e-3, (counts, want * n)
    # and a sampler at another temperature is told apart by the same test (the test can fail)
    wrong = nucleus_distribution(logits[0].numpy(), temperature * 2, top_p)
    if (wrong > 0).sum() == keep.sum():
        assert chisquare(counts[keep], wrong[keep] / wrong[keep].sum() * n).pvalue < 1e-3


def test_gumbel_sampler_rows_are_independent_streams():
    logits = torch.zeros((3, 50))
    together = SeededGumbelSampler([7, 8, 7], 1.0, 1.0)(None, logits.clone())
    alone = [SeededGumbelSampler([s], 1.0, 1.0)(None, logits[:1].clone())[0] for s in (7, 8, 7)]
    for row, single in zip(together, alone):
        assert torch.equal(row, single)
    assert torch.equal(together[0], together[2]) and not torch.equal(together[0], together[1])


@pytest.fixture(scope="module")
def smollm2():
    from mmfragile.models.embedded import load_embedded

    return load_embedded("smollm2")


PROMPTS = [Prompt("Name three colours."), Prompt("Write one word about the sea."),
           Prompt("What is 2 plus 3?", assistant_prefix="The answer is"), Prompt("Say hello.", system="Be terse.")]


def test_hf_seeded_sampling_same_seed_same_text_other_seed_other_text(smollm2):
    seeds = [101, 102, 103, 104]
    a = smollm2.generate_sampled(PROMPTS, 8, seeds, temperature=1.0, top_p=0.95)
    assert a == smollm2.generate_sampled(PROMPTS, 8, seeds, temperature=1.0, top_p=0.95)
    b = smollm2.generate_sampled(PROMPTS, 8, [s + 1000 for s in seeds], temperature=1.0, top_p=0.95)
    assert sum(x != y for x, y in zip(a, b)) >= 2, (a, b)
    # one prompt, many seeds: many samples, and they are not the greedy text
    many = smollm2.generate_sampled([PROMPTS[1]] * 6, 8, list(range(6)), temperature=1.0, top_p=0.95)
    assert len(set(many)) >= 3, many
    assert any(m != smollm2.generate([PROMPTS[1]], 8)[0] for m in many)


def test_hf_seeded_sampling_batched_equals_one_at_a_time(smollm2):
    seeds = [5, 6, 7, 8]
    one_by_one = [smollm2.generate_sampled([p], 8, [s], temperature=1.0, top_p=0.95)[0] for p, s in zip(PROMPTS, seeds)]
    batched = smollm2.generate_sampled(PROMPTS, 8, seeds, temperature=1.0, top_p=0.95)
    reversed_batch = smollm2.generate_sampled(PROMPTS[::-1], 8, seeds[::-1], temperature=1.0, top_p=0.95)[::-1]
    old = smollm2.batch_size
    try:
        smollm2.batch_size = 3  # other batch boundaries
        reshaped = smollm2.generate_sampled(PROMPTS, 8, seeds, temperature=1.0, top_p=0.95)
    finally:
        smollm2.batch_size = old
    assert one_by_one == batched == reversed_batch == reshaped, (one_by_one, batched, reversed_batch, reshaped)


def test_hf_seeded_sampling_with_images_is_batch_invariant(tiny_vlm, synthetic):
    prompts = [Prompt(f"Describe picture {i}.", images=list(synthetic.iloc[i].images)) for i in range(3)]
    prompts.append(Prompt("A text-only question?"))
    seeds = [1, 2, 3, 4]
    one_by_one = [tiny_vlm.generate_sampled([p], 5, [s], temperature=1.0, top_p=1.0)[0] for p, s in zip(prompts, seeds)]
    assert tiny_vlm.generate_sampled(prompts, 5, seeds, temperature=1.0, top_p=1.0) == one_by_one


def test_hf_seeded_sampling_rejects_bad_arguments(smollm2):
    with pytest.raises(ValueError, match="one seed per prompt"):
        smollm2.generate_sampled(PROMPTS, 4, [1])
    with pytest.raises(ValueError, match="temperature"):
        smollm2.generate_sampled(PROMPTS[:1], 4, [1], temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        smollm2.generate_sampled(PROMPTS[:1], 4, [1], top_p=0.0)
