"""The alternatives the numerics study reruns a study's cells under: one registry, each with what it changes and
the backends it applies to. Every alternative is a run of the same cells under the model's name plus
``~<alternative>``; the reference is the run's own default settings."""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from mmfragile.runner import EvalItem


@dataclass(frozen=True)
class Alternative:
    """``spec_kwargs``: model arguments it loads with (dtype, attention implementation, vLLM's prefix caching);
    ``run_kw``: how the run loop sends the cells (path, batch sizes); ``threads``: torch threads during the run;
    ``composition``: each cell among a seeded subset and order of its question's variants; ``backends``: where
    it applies."""

    name: str
    what: str
    backends: tuple[str, ...] = ("hf",)
    spec_kwargs: dict[str, Any] = field(default_factory=dict)
    run_kw: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None
    composition: bool = False


ALTERNATIVES: dict[str, Alternative] = {a.name: a for a in (
    Alternative("repeat", "the reference settings, rerun after a fresh load (must change nothing)",
                ("hf", "vllm", "openai")),
    Alternative("float32", "weights and activations in float32", ("hf", "vllm"), {"dtype": "float32"}),
    Alternative("bfloat16", "weights and activations in bfloat16", ("hf", "vllm"), {"dtype": "bfloat16"}),
    Alternative("float16", "weights and activations in float16", ("hf", "vllm"), {"dtype": "float16"}),
    Alternative("batch-1", "one prompt per forward (engine tails and batched generate)",
                run_kw={"batch_size": 1, "engine_batch": 1}),
    Alternative("batch-7", "seven prompts per forward", run_kw={"batch_size": 7, "engine_batch": 7}),
    Alternative("composition", "each cell among a seeded third of its question's variants, in a seeded order",
                composition=True),
    Alternative("generate", "batched generate + option logits instead of the prefix-sharing engine",
                run_kw={"mode": "generate", "generate_logits": True}),
    Alternative("threads-1", "one torch thread", threads=1),
    Alternative("eager", "eager attention (transformers' attn_implementation)", spec_kwargs={"attn_implementation": "eager"}),
    Alternative("sdpa", "scaled-dot-product attention", spec_kwargs={"attn_implementation": "sdpa"}),
    Alternative("no-prefix-cache", "vLLM without automatic prefix caching", ("vllm",),
                {"enable_prefix_caching": False}),
)}
#: what ``--alternatives auto`` runs, of those that apply to the backend
DEFAULT = ("repeat", "bfloat16", "batch-1", "composition", "generate", "threads-1", "no-prefix-cache")
COMPOSITION_PARTS = 3


class UnknownAlternative(ValueError):
    """An alternative the registry does not have, or one that does not apply to the model's backend."""


def reference_dtype(spec: Any) -> str | None:
    """The dtype the reference runs in where the model's spec decides it: its ``dtype=`` argument, else a zoo
    model's own (the fine-tunes of studies 2 and 3: bfloat16); None: the backend's default (float32 on a CPU)."""
    given = dict(spec.kwargs).get("dtype")
    if given:
        return str(given).removeprefix("torch.")
    from mmfragile.models.zoo import ZOO_MODELS, zoo_spec

    return zoo_spec(spec.source).dtype if spec.backend == "hf" and spec.source in ZOO_MODELS else None


def resolve(names: list[str] | str, backend: str, dtype: str | None = None) -> list[str]:
    """The alternatives to run: ``auto`` -> :data:`DEFAULT` where they apply to ``backend``, its bfloat16 made
    float32 for a reference in a half precision (``dtype``: :func:`reference_dtype`); named ones checked - one
    that is the reference's own dtype is refused (it would rerun the reference)."""
    names = [names] if isinstance(names, str) else list(names)
    if names in (["auto"], []):
        half = dtype in ("bfloat16", "float16")
        return [("float32" if half and n == "bfloat16" else n) for n in DEFAULT if backend in ALTERNATIVES[n].backends]
    for n in names:
        if dtype is not None and ALTERNATIVES.get(n) is not None and ALTERNATIVES[n].spec_kwargs.get("dtype") == dtype:
            raise UnknownAlternative(f"--alternatives: {n} is the reference's own dtype (the model runs in {dtype}): "
                                     "it would rerun the reference; choose another precision (float32, bfloat16, "
                                     "float16)")
        if n not in ALTERNATIVES:
            raise UnknownAlternative(f"--alternatives: no alternative {n!r}; choose from {', '.join(ALTERNATIVES)} "
                                     "or auto")
        if backend not in ALTERNATIVES[n].backends:
            raise UnknownAlternative(f"--alternatives: {n} ({ALTERNATIVES[n].what}) does not apply to the {backend} "
                                     f"backend (it applies to {', '.join(ALTERNATIVES[n].backends)})")
    return list(dict.fromkeys(names))


def sample_cells(items: list[EvalItem], per_question: int | None, seed: int) -> list[EvalItem]:
    """A seeded sample of ``per_question`` cells of each question group (all with None), in their order."""
    if not per_question:
        return list(items)
    by_group: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        by_group.setdefault(it.group, []).append(i)
    keep: set[int] = set()
    for group, idx in by_group.items():
        rng = random.Random(f"{seed}|{group}")   # string seeds are the same in every process
        keep.update(rng.sample(idx, min(per_question, len(idx))))
    return [it for i, it in enumerate(items) if i in keep]


def recompose(items: list[EvalItem], seed: int, parts: int = COMPOSITION_PARTS) -> list[EvalItem]:
    """The same cells, each question's split into ``parts`` seeded subsets run apart, in a seeded order."""
    out = []
    by_group: dict[str, list[EvalItem]] = {}
    for it in items:
        by_group.setdefault(it.group, []).append(it)
    for group, its in by_group.items():
        order = list(range(len(its)))
        random.Random(f"{seed}|{group}|composition").shuffle(order)
        out += [replace(its[j], batch_with=f"part{k % parts}") for k, j in enumerate(order)]
    return sorted(out, key=lambda it: (it.group, it.batch_with))   # stable: the shuffled order within a part