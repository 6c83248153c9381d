"""A known answer for the noise floor: a model whose option scores carry planted, seeded Gaussian noise.

:class:`PlantedNoise` wraps a model: each prompt's option logits get independent N(0, sigma^2) noise - seeded by the
prompt itself and ``seed``, so a cell's noise does not depend on its batch - and its answer is the option with the
highest noisy logit. Against the same wrapper at sigma 0, a cell's flip probability follows from its logits alone
(:func:`flip_probability`), so the flip rate the numerics metrics measure can be checked against the planted one.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from mmfragile.models.base import MLLM, Prompt


class PlantedNoise(MLLM):
    """``model``'s option logits plus seeded N(0, ``sigma``^2) noise; the answer is their argmax (see the module)."""

    fused_option_logits = True
    exact_option_logits = True

    def __init__(self, model: MLLM, sigma: float, seed: int = 0, name: str | None = None):
        self.inner, self.sigma, self.seed = model, float(sigma), int(seed)
        self.name = name or f"{model.name}+noise{sigma:g}"
        self.supports_images = model.supports_images
        self.batch_size = model.batch_size

    def _noise(self, prompt: Prompt, n: int) -> np.ndarray:
        ident = repr((self.seed, prompt.text, prompt.system, prompt.assistant_prefix, [str(i) for i in prompt.images]))
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(ident.encode()).digest()[:8], "little"))
        return rng.normal(0.0, self.sigma, n) if self.sigma > 0 else np.zeros(n)

    def option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        clean = self.inner.option_logits(prompts, candidates)
        return [np.asarray(c, dtype=np.float64) + self._noise(p, len(c)) for p, c in zip(prompts, clean)]

    def generate_with_option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]],
                                    max_new_tokens: int) -> tuple[list[str], list[np.ndarray]]:
        noisy = self.option_logits(prompts, candidates)
        return [str(c[int(np.argmax(x))]) for c, x in zip(candidates, noisy)], noisy

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 16) -> list[str]:
        return self.inner.generate(prompts, max_new_tokens)

    def loglikelihood(self, prompts, continuations):
        return self.inner.loglikelihood(prompts, continuations)

    def max_id_tokens(self, ids: Sequence[str]) -> int:
        return self.inner.max_id_tokens(ids)


def flip_probability(logits: np.ndarray, sigma: float, nodes: int = 64) -> float:
    """P(argmax(logits + e) != argmax(logits)) for e ~ N(0, sigma^2 I), exactly (Gauss-Hermite quadrature of
    P(no flip) = E_z[prod_j Phi((l_top - l_j) / sigma + z)]); with two options, Phi(-margin / (sigma sqrt 2))."""
    from scipy.special import ndtr

    x = np.asarray(logits, dtype=np.float64)
    if sigma <= 0 or x.size < 2:
        return 0.0
    top = int(np.argmax(x))
    gaps = (x[top] - np.delete(x, top)) / sigma
    z, w = np.polynomial.hermite_e.hermegauss(nodes)          # probabilists' Hermite: weight exp(-z^2 / 2)
    stay = (w * np.prod(ndtr(gaps[None, :] + z[:, None]), axis=1)).sum() / np.sqrt(2 * np.pi)
    return float(1.0 - stay)
