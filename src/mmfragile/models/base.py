"""The one small model interface every backend implements (cf. lm-evaluation-harness' LM class).

A :class:`Prompt` is a chat turn: text plus zero or more images (PIL or paths) - or the frames of one video -
with an optional system message. The text may name images as ``<image k>`` (MMMU style); families whose chat
templates interleave put image k there (:mod:`mmfragile.models.adapters`). Backends implement three deterministic calls:

* :meth:`MLLM.generate` - greedy decoding, ``max_new_tokens`` tokens at most;
* :meth:`MLLM.option_logits` - next-token logits of the first token of each candidate string
  (option IDs) after the assistant-turn prefix, in one forward pass per prompt;
* :meth:`MLLM.loglikelihood` - summed log-probability and token count of a continuation
  given the prompt (used for CP-LN and cloze scoring).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np



@dataclass
class Prompt:
    text: str
    images: list = field(default_factory=list)
    system: str | None = None
    #: text placed at the start of the assistant turn (e.g. "Answer:"), scored/generated after it.
    assistant_prefix: str = ""
    #: the images are the frames of one video, in order (families without video input get them as images)
    video: bool = False


@dataclass
class LogLik:
    logprob: float  # sum of log p(token) over the continuation
    n_tokens: int

    @property
    def mean_logprob(self) -> float:
        return self.logprob / max(self.n_tokens, 1)


class MLLM(abc.ABC):
    """A (multimodal) language model behind one small, deterministic interface."""

    name: str = "model"
    #: True if the backend accepts images; text-only models raise on prompts with images.
    supports_images: bool = True

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 16) -> list[str]:
        """Greedy continuation of each prompt's assistant turn, special tokens stripped."""

    @abc.abstractmethod
    def option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """For prompt i, the next-token logit of the first token of each string in candidates[i]."""

    @abc.abstractmethod
    def loglikelihood(self, prompts: Sequence[Prompt], continuations: Sequence[str]) -> list[LogLik]:
        """log p(continuation | prompt) summed over the continuation's tokens."""

    def max_id_tokens(self, ids: Sequence[str]) -> int:
        """Longest tokenized length among option IDs (Sec. A.4 of the format-bias paper)."""
        return 1
