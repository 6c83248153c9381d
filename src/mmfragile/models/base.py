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
import re
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

#: An image marker in prompt text: ``<image k>``, k counted from 1 (MMMU / MMMU-Pro spelling; the regex
#: of MMMU-Pro's ``infer_transformers.py``, ``<image\s+(\d+)>``).
IMAGE_MARKER = re.compile(r"<image\s+(\d+)>")


def split_interleaved(text: str, n_images: int) -> list[str | int]:
    """``text`` cut at its ``<image k>`` markers: text segments (str) and 0-based image indices (int, k - 1)
    in reading order, e.g. ``"See <image 1> and <image 2>."`` -> ``["See ", 0, " and ", 1, "."]``.

    Empty segments (text starting with a marker, two adjacent markers) are left out; a marker named twice
    appears twice. Joining the segments with ``f"<image {i + 1}>"`` in place of each index gives back
    ``text``. Images never named in ``text`` are not in the result: :func:`unnamed_images` lists them
    (a chat template that interleaves puts them before the text, like a template that does not).
    Raises ``ValueError`` for a marker naming no image (k < 1 or k > n_images)."""
    out: list[str | int] = []
    pos = 0
    for m in IMAGE_MARKER.finditer(text):
        k = int(m.group(1))
        if not 1 <= k <= n_images:
            raise ValueError(f"{m.group(0)!r} at character {m.start()} names no image: the prompt has {n_images}")
        if m.start() > pos:
            out.append(text[pos:m.start()])
        out.append(k - 1)
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def unnamed_images(text: str, n_images: int) -> list[int]:
    """0-based indices of the images ``text`` never names with ``<image k>``, in order."""
    named = {int(k) - 1 for k in IMAGE_MARKER.findall(text)}
    return [i for i in range(n_images) if i not in named]


@dataclass
class Prompt:
    """One user turn. ``text`` may contain ``<image k>`` markers that refer to ``images[k-1]``
    (interleaved benchmarks such as MMMU-Pro); :func:`split_interleaved` cuts it for chat templates."""

    text: str
    images: list[Any] = field(default_factory=list)
    system: str | None = None
    #: text placed at the start of the assistant turn (e.g. "Answer:"), scored/generated after it.
    assistant_prefix: str = ""
    #: the images are the frames of one video, in order (families without video input get them as images)
    video: bool = False

    @property
    def media_key(self) -> tuple[tuple[str, ...], bool]:
        """What prompts must share to share a prefix-sharing engine group: the same images (by identity: a path,
        or the very image object), shown the same way."""
        return tuple(map(str, self.images)), self.video


class NoOutput(str):
    """What :meth:`MLLM.generate` returns for a reply that carries no text: an API reply whose ``content`` is null
    because the model refused (``reason="refusal: <its refusal text>"``), called a tool (``"tool_calls: <names>"``)
    or was stopped (``"finish_reason: content_filter"``).

    Nothing is dropped or filled in: it is a ``str`` - every caller and the result store take it - whose value
    ``"[no output] <reason>"`` is no option ID, so the row is out of coverage and incorrect, and the stored
    ``raw_output`` says why. ``reason`` holds the reason alone; :func:`is_no_output` also recognises the value
    read back from a store."""

    PREFIX = "[no output] "

    reason: str

    def __new__(cls, reason: str) -> "NoOutput":
        reason = str(reason).strip() or "no content"
        obj = super().__new__(cls, cls.PREFIX + reason)
        obj.reason = reason
        return obj

    def __reduce__(self) -> tuple[type, tuple[str]]:  # pickles (Ray, multiprocessing) as itself, not as a plain str
        return (NoOutput, (self.reason,))


def is_no_output(output: object) -> bool:
    """True for a :class:`NoOutput` - also one read back from a store as a plain string (by its prefix)."""
    return isinstance(output, NoOutput) or (isinstance(output, str) and output.startswith(NoOutput.PREFIX))


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
    # Capabilities, declared by each backend (the runner and the studies read them; nothing is probed):
    #: the backend accepts images; text-only models raise on prompts with images
    supports_images: bool = True
    #: seeded sampled decoding, ``generate_sampled(prompts, max_new_tokens, seeds, temperature, top_p)``, each
    #: prompt's text a function of its seed alone (not of its batch)
    can_sample: bool = False
    #: option logits are exact next-token scores (an API's top-k log-probabilities are not)
    exact_option_logits: bool = True
    #: answers and option-ID scores in one request: ``generate_with_option_logits(prompts, candidates, n)``
    fused_option_logits: bool = False
    #: the prefix-sharing engine (:mod:`mmfragile.engine`) may run it (a family may still refuse, with the reason)
    prefix_engine: bool = False
    #: a remote chat API (Promptception's proprietary answer formats, Appendix A)
    api: bool = False
    #: prompts per backend call the runner sends at least
    batch_size: int = 8
    #: how images are resized before the processor (pinned in a run's config.json); None if the backend says nothing
    image_policy: dict[str, Any] | None = None
    #: the local checkpoint folder it was loaded from (hashed into a run's provenance); None for an API model
    checkpoint: "Path | None" = None
    #: the :class:`~mmfragile.models.spec.ModelSpec` it was loaded from (set by ``ModelSpec.load``); None for a model
    #: built by hand (:func:`~mmfragile.models.spec.spec_of` then makes one from its name and capabilities)
    spec: "object | None" = None  # a ModelSpec (not imported here: models.spec imports this module)

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 16) -> list[str]:
        """Greedy continuation of each prompt's assistant turn, special tokens stripped; a :class:`NoOutput`
        (naming why) for a reply without text."""

    @abc.abstractmethod
    def option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """For prompt i, the next-token logit of the first token of each string in candidates[i]."""

    @abc.abstractmethod
    def loglikelihood(self, prompts: Sequence[Prompt], continuations: Sequence[str]) -> list[LogLik]:
        """log p(continuation | prompt) summed over the continuation's tokens."""

    def max_id_tokens(self, ids: Sequence[str]) -> int:
        """Longest tokenized length among option IDs (Sec. A.4 of the format-bias paper)."""
        return 1

    # Requests a backend offers where it declares the capability (the runner asks only then); the defaults say
    # that this backend does not.
    def generate_sampled(self, prompts: Sequence[Prompt], max_new_tokens: int, seeds: Sequence[int],
                         temperature: float = 0.7, top_p: float = 0.9) -> list[str]:
        """Seeded sampled decoding (``can_sample``): prompt i's text a function of ``seeds[i]`` alone."""
        raise Unsupported(f"{self.name}: this backend cannot sample with a seed (can_sample is False); use greedy "
                          "decoding (--decoding greedy)")

    def generate_with_option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]],
                                    max_new_tokens: int) -> tuple[list[str], list[np.ndarray]]:
        """Greedy texts and each candidate's first-token score from one request per prompt
        (``fused_option_logits``)."""
        raise Unsupported(f"{self.name}: this backend has no fused answer + option-score request "
                          "(fused_option_logits is False); the runner uses generate and option_logits")


class Unsupported(NotImplementedError):
    """A request the backend does not offer (its capability flag is off); the message says what to do instead."""


class HFTokenizerIds:
    """Option-ID token counts from a Hugging Face tokenizer at ``self.tokenizer`` (the HF and vLLM backends)."""

    tokenizer: Any

    def first_token_id(self, text: str) -> int:
        """The id of ``text``'s first token (an option ID's score is its first token's logit)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"candidate {text!r} tokenizes to nothing")
        return int(ids[0])

    def max_id_tokens(self, ids: Sequence[str]) -> int:
        """Longest tokenized length among option IDs (Sec. A.4 of the format-bias paper)."""
        return max(len(self.tokenizer(i, add_special_tokens=False)["input_ids"]) for i in ids)


def keyword_params(fn: Callable[..., Any], skip: tuple[str, ...] = ()) -> list[str]:
    """The parameters of ``fn`` that can be passed by keyword (a backend's declared options), but ``skip``."""
    import inspect

    return [n for n, p in inspect.signature(fn).parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in skip]
