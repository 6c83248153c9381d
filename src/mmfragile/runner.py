"""The one run loop: evaluation items through a model into a resumable per-question result store.

An :class:`EvalItem` is one model call - a *request* in lm-evaluation-harness' sense - plus the columns that
identify it (``dataset``, ``question_id``, ``variant``) and describe it (format factors, prompt id, perturbation
...). Three kinds of request cover every study:

* ``"generate"`` - greedy decoding; where the item lists ``option_ids`` their first-token logits are stored too
  (study 1's confidence bins and PriDe; study 2; the judge's greedy mode and self-generated responses);
* ``"sample"`` - seeded sampled decoding (the judge's repeated runs): the text of an item depends only on its
  ``seed``, never on its batch;
* ``"loglikelihood"`` - the log-probability of ``continuation`` after the prompt (CP-LN).

:func:`run_items` is the only loop that declares, resumes, batches, flushes and reports progress: it skips items
already in the store, declares the keys of its shard in the store's manifest, runs the rest - ``generate`` and
``sample`` through the prefix-sharing engine where the backend allows it (whole question groups), else batched -
scores each output with the study's ``score_fn`` and appends rows as it goes, so a killed run resumes where it
stopped without losing or duplicating a row. Studies build items (:mod:`mmfragile.studies`); :mod:`mmfragile.study`
runs them by stage, shard, Ray task or budget.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from itertools import groupby
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence, cast

import pandas as pd
from tqdm.auto import tqdm

from mmfragile.engine import EngineInexact, PrefixSharingEngine, engine_refusal
from mmfragile.models.base import MLLM, Prompt
from mmfragile.shards import Shard, question_group
from mmfragile.store import ResultStore

if TYPE_CHECKING:
    from mmfragile.models.hf import HFModel

REQUESTS = ("generate", "sample", "loglikelihood")


@dataclass
class EvalItem:
    key: dict[str, Any]            # must hold dataset, question_id, variant; any extra columns are stored too
    prompt: Prompt
    option_ids: list[str] = field(default_factory=list)   # generate: candidates whose first-token logits are kept
    answer_id: str | None = None
    max_new_tokens: int = 1
    group: str = ""                # items of one group share images and (most of) their prompt prefix
    request: str = "generate"      # generate | sample | loglikelihood
    continuation: str = ""         # loglikelihood: the scored text
    seed: int | None = None        # sample: this item's own random stream
    temperature: float = 1.0       # sample
    top_p: float = 1.0             # sample
    batch_with: str = ""           # items of one group with another label run in another batch (numerics study)

    def __post_init__(self) -> None:
        if self.request not in REQUESTS:
            raise ValueError(f"request must be one of {REQUESTS}, not {self.request!r}")
        if self.request == "sample" and self.seed is None:
            raise ValueError("a sampled request needs its seed")
        if not self.group:
            self.group = question_group(self.key["dataset"], self.key["question_id"])


#: ``score_fn(output, item) -> columns``: output is the generated text (generate, sample) or the
#: :class:`~mmfragile.models.base.LogLik` (loglikelihood)
ScoreFn = Callable[[Any, EvalItem], dict[str, Any]]


def run_items(model: MLLM, items: Sequence[EvalItem], store: ResultStore, score_fn: ScoreFn, mode: str = "auto",
              batch_size: int = 16, flush_every: int = 256, progress: bool = True, desc: str | None = None,
              stop_after: int | None = None, shard: Shard | str | None = None, unit: str = "prompt",
              engine_batch: int | None = None, generate_logits: bool = False) -> pd.DataFrame:
    """Evaluate the items not yet in ``store``, each output scored into columns by the study's ``score_fn``, and
    return the store's full table.

    ``mode`` (``generate`` and ``sample`` requests): ``"engine"`` (prefix-sharing engine; refuses with the reason
    where it cannot be exact), ``"generate"`` (one batched ``generate`` / ``generate_sampled`` per batch - the
    naive path), or ``"auto"`` (the engine where it is exact - for free-text requests, sampled or greedy, the
    consecutive items of a group with the same images and decoding, where there are two or more; a backend with
    fused answers and option scores - vLLM: one request per prompt, at least ``model.batch_size`` prompts per
    call - uses that; elsewhere - a family the engine refuses, or a question
    group whose variants it cannot share - batched ``generate`` plus ``option_logits``, with a warning naming the
    reason). ``shard`` (``"i/n"`` or a :class:`~mmfragile.shards.Shard`): evaluate only the items of that shard's
    question groups. The item keys are declared in the store's manifest under the shard's label first, so
    ``mmfragile merge`` can check the run for completeness. ``stop_after`` ends the run after that many new rows
    (used to simulate a killed run in tests). Items keep their order (a study sorts them as it likes batches).
    ``auto`` never switches backends: which of the engine and vLLM is faster depends on the workload (README,
    "Speed" and "vLLM backend"); load the model with ``vllm:`` to choose vLLM. ``batch_size``: prompts per batched
    ``generate`` call (the engine sizes its tail batches from free memory). ``unit``: what the progress bar counts,
    one item (a prompt, an option's log-likelihood, a judgment ...). ``engine_batch``: at most that many tails per
    engine forward (None: as many as fit in memory; the numerics study varies it). ``generate_logits``: mode
    ``"generate"`` stores the option logits too (one more forward per batch; the numerics study compares them with
    the engine's; the benchmarks' naive baseline leaves it off). An interrupt (KeyboardInterrupt; the CLI makes
    SIGTERM one too) stores the rows finished so far before it propagates."""
    if mode not in ("auto", "engine", "generate"):
        raise ValueError(f"mode must be auto, engine or generate, not {mode!r}")
    shard = Shard.parse(shard)
    if shard.count > 1:
        items = [it for it in items if shard.owns(it.group)]
    keys = pd.DataFrame([{"model": model.name, **it.key} for it in items], columns=store.key_columns)
    if items:
        store.declare(keys, shard.label)
        if model.image_policy is not None and any(it.prompt.images for it in items):
            store.pin_run_info("image_policy", model.image_policy, entry=model.name)
    todo = [it for it, p in zip(items, store.pending(keys)) if p]
    call = _Caller(model, mode, batch_size, any(it.request == "generate" and it.option_ids for it in todo),
                   any(it.request == "sample" or (it.request == "generate" and not it.option_ids) for it in todo),
                   engine_batch, generate_logits)
    bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=desc or model.name, disable=not progress,
               unit=unit, smoothing=0.05)
    buffer: list[dict[str, Any]] = []
    written = 0
    try:
        for chunk, through_engine in call.chunks(todo):
            for it, out in zip(chunk, call(chunk, through_engine)):
                buffer.append({"model": model.name, **it.key, **out.columns, **score_fn(out.value, it), **out.tail})
            bar.update(len(chunk))
            if len(buffer) >= flush_every:
                written += store.append(buffer)
                buffer.clear()
            if stop_after is not None and written + len(buffer) >= stop_after:
                break
    except KeyboardInterrupt:  # Ctrl-C (the CLI turns SIGTERM into one too): keep the finished rows, then stop
        store.append(buffer)
        raise
    finally:
        bar.close()
    written += store.append(buffer)
    return store.read()


@dataclass
class _Output:
    value: Any                       # what score_fn sees
    columns: dict[str, Any]          # stored before the score's columns
    tail: dict[str, Any] = field(default_factory=dict)   # stored after them


class _Caller:
    """How one run sends its requests to the model: chunking and the backend call per request kind."""

    def __init__(self, model: MLLM, mode: str, batch_size: int, scored: bool, decoded: bool = False,
                 engine_batch: int | None = None, generate_logits: bool = False):
        """``scored``: the run has option-scored generate requests (the engine's work wherever it is exact);
        ``decoded``: it has free-text ones (sampled, or greedy without option IDs), which the engine takes where the
        backend is an HF model it drives; ``engine_batch``: the engine's tails per forward (None: what fits in
        memory); ``generate_logits``: batched generate stores the option logits in every mode."""
        self.model, self.mode = model, mode
        self.fused = mode == "auto" and model.fused_option_logits
        self.batch_size = max(batch_size, model.batch_size) if self.fused else batch_size
        wants = mode != "generate" and not self.fused and (scored or (decoded and model.prefix_engine))
        refusal = engine_refusal(model) if wants else None
        if refusal is not None and mode == "engine":
            raise EngineInexact(f"{model.name}: {refusal}")
        # where the engine is refused in auto mode, a model with exact option logits still stores them
        self.stand_in_logits = (mode == "auto" or generate_logits) and model.exact_option_logits
        if refusal is not None and (self.stand_in_logits or model.prefix_engine):  # say so, once
            warnings.warn(f"{model.name}: prefix-sharing engine not used ({refusal}); running batched generate",
                          stacklevel=3)
        # the engine sizes its tail batches from free memory; batch_size is batched generate's
        # (no refusal: the backend declares ``prefix_engine``, an HF model the engine drives)
        self.engine = (PrefixSharingEngine(cast("HFModel", model), batch_size=engine_batch)
                       if wants and refusal is None else None)

    def chunks(self, items: Sequence[EvalItem]) -> Iterable[tuple[list[EvalItem], bool]]:
        """``(chunk, through the engine)``. Engine: the consecutive generate / sample items of a group with the same
        images and decoding together - one shared prefix, each item decoded to its own ``max_new_tokens`` (the
        engine batches internally); a free-text group of one item shares nothing and joins the plain batches.
        Otherwise plain batches of one request kind and one decoding setting, so every item gets its own protocol."""
        def plain(it: EvalItem) -> tuple[Any, ...]:
            return (it.request, it.max_new_tokens, it.temperature, it.top_p, it.batch_with)

        def decoding(it: EvalItem) -> tuple[Any, ...]:
            return (it.request, it.temperature, it.top_p, it.batch_with)

        def engine_group(it: EvalItem) -> tuple[Any, ...] | None:
            if self.engine is None or it.request not in ("generate", "sample"):
                return None
            return (bool(it.option_ids), it.request, it.temperature, it.top_p, it.group, it.batch_with,
                    it.prompt.media_key)

        waiting: list[EvalItem] = []
        joint: list[EvalItem] = []   # free-text groups the engine decodes together (same decoding)

        def flush() -> list[tuple[list[EvalItem], bool]]:
            out = [(list(joint), True)] if joint else []
            out += [(grp[s:s + self.batch_size], False) for _, same in groupby(waiting, key=plain)
                    for grp in [list(same)] for s in range(0, len(grp), self.batch_size)]
            waiting.clear()
            joint.clear()
            return out

        for key, same in groupby(items, key=engine_group):
            grp = list(same)
            if key is not None and key[0]:   # option-scored: one group per chunk, whatever its size
                yield from flush()
                yield grp, True
            elif key is not None and len(grp) > 1:
                if joint and (decoding(joint[0]) != decoding(grp[0]) or len(joint) + len(grp) > JOINT_ROWS):
                    yield from flush()
                joint.extend(grp)
            else:   # a free-text group of one item shares nothing: it joins the plain batches
                waiting.extend(grp)
        yield from flush()

    def __call__(self, chunk: list[EvalItem], through_engine: bool = False) -> list[_Output]:
        m, prompts, request = self.model, [it.prompt for it in chunk], chunk[0].request
        new_tokens = max(it.max_new_tokens for it in chunk)
        if request == "loglikelihood":
            lls = m.loglikelihood(prompts, [it.continuation for it in chunk])
            return [_Output(ll, {"logprob": float(ll.logprob), "n_tokens": int(ll.n_tokens)}) for ll in lls]
        with_options = any(it.option_ids for it in chunk)
        if request == "sample" and not m.can_sample:
            raise TypeError(f"{m.name!r} cannot sample with a seed (no generate_sampled); use greedy decoding")
        if not with_options:   # free text: sampled or greedy
            texts = self._engine_texts(chunk) if through_engine else self._texts(chunk, new_tokens)
            return [_Output(raw, {"raw_output": raw}) for raw in texts]
        option_ids = [it.option_ids for it in chunk]
        if self.fused:
            raws, logits = m.generate_with_option_logits(prompts, option_ids, new_tokens)
        elif self.engine is None:
            raws, logits = self._naive(chunk, self.stand_in_logits)
        else:
            try:
                outs = self._engine(chunk).run_group(prompts, option_ids, [it.max_new_tokens for it in chunk])
                raws, logits = [o.text for o in outs], [o.option_logits for o in outs]
            except EngineInexact as e:
                self._falls_back(chunk, e)
                raws, logits = self._naive(chunk, True)
        return [_Output(raw, {"raw_output": raw, "option_ids": list(it.option_ids), "answer_id": it.answer_id},
                        {"option_logits": None if lg is None else [float(x) for x in lg]})
                for it, raw, lg in zip(chunk, raws, logits)]

    def _engine(self, chunk: list[EvalItem]) -> PrefixSharingEngine:
        assert self.engine is not None, f"{chunk[0].group}: an engine chunk without an engine"
        return self.engine

    def _falls_back(self, chunk: list[EvalItem], e: EngineInexact) -> None:
        """An engine group that cannot be shared exactly: in ``engine`` mode the refusal stands, in ``auto`` the
        group runs batched, with a warning naming the reason."""
        if self.mode == "engine":
            raise e
        warnings.warn(f"{self.model.name}, {chunk[0].group}: {e}; this group runs through batched generate",
                      stacklevel=4)

    def _engine_texts(self, chunk: list[EvalItem]) -> list[str]:
        """A free-text group through the engine: greedy, or each item sampled from its own seed (the same texts as
        ``generate`` / ``generate_sampled``: tested per family); batched where the engine cannot share exactly."""
        first = chunk[0]
        sampled = first.request == "sample"
        groups = [list(same) for _, same in groupby(chunk, key=lambda it: (it.group, it.prompt.media_key))]
        try:
            shared = self._engine(chunk).run_groups(
                [([it.prompt for it in g], None, [it.max_new_tokens for it in g],
                  [cast(int, it.seed) for it in g] if sampled else None) for g in groups],
                temperature=first.temperature, top_p=first.top_p)
            return [o.text for group in shared for o in group]
        except EngineInexact as e:
            self._falls_back(chunk, e)
        return self._naive(chunk, False)[0]

    def _texts(self, items: list[EvalItem], max_new_tokens: int) -> list[Any]:
        """One batched call for items of one request kind and decoding: ``generate_sampled`` (each item's seed)
        or greedy ``generate``."""
        prompts, first = [it.prompt for it in items], items[0]
        if first.request == "sample":
            return self.model.generate_sampled(prompts, max_new_tokens, [cast(int, it.seed) for it in items],
                                               first.temperature, first.top_p)
        return self.model.generate(prompts, max_new_tokens=max_new_tokens)

    def _naive(self, chunk: list[EvalItem], with_logits: bool) -> tuple[list[Any], list[Any]]:
        """Batched generate or generate_sampled (+ option logits), each item to its own ``max_new_tokens`` (an
        engine group that falls back holds several)."""
        raws: list[Any] = [None] * len(chunk)
        logits: list[Any] = [None] * len(chunk)
        for new_tokens, idx in _by_length(chunk).items():
            prompts = [chunk[i].prompt for i in idx]
            outs = self._texts([chunk[i] for i in idx], new_tokens)
            lgs = (self.model.option_logits(prompts, [chunk[i].option_ids for i in idx]) if with_logits
                   else [None] * len(prompts))
            for i, raw, lg in zip(idx, outs, lgs):
                raws[i], logits[i] = raw, lg
        return raws, logits


#: most free-text items (of consecutive groups with one decoding setting) the engine decodes together: a multi-token
#: answer then costs the decode steps of one batch, not of one per group; also the rows one store flush may lose
JOINT_ROWS = 64


def _by_length(chunk: list[EvalItem]) -> dict[int, list[int]]:
    """The chunk's indices by ``max_new_tokens`` (one batched call per limit)."""
    out: dict[int, list[int]] = {}
    for i, it in enumerate(chunk):
        out.setdefault(it.max_new_tokens, []).append(i)
    return out
