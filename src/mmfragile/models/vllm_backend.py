"""vLLM backend: offline ``vllm.LLM`` behind :class:`MLLM`, for grids larger than one HF process can run.

``load_model("vllm:<path or embedded name>")`` (or ``load_model(spec, backend="vllm")``) returns a
:class:`VLLMModel`. It computes what :class:`~mmfragile.models.hf.HFModel` computes, on the same token ids:

* prompts are rendered by the family adapter the HF backend uses (:mod:`mmfragile.models.adapters`: the
  checkpoint's chat template through its processor / tokenizer) and tokenized as the HF backend tokenizes them;
  images go in as vLLM multimodal data in the order the template places them, so vLLM's processor expands the
  image placeholders exactly as the checkpoint's HF processor does. A video's frames go in as images
  (:func:`frames_as_images`; the HF backend gives video-capable families a native video input instead);
* :meth:`~VLLMModel.generate` decodes greedily and stops at the checkpoint's generation-config EOS ids,
  the tokens decoded as the HF backend decodes them;
* :meth:`~VLLMModel.option_logits` returns the **exact** log-probability of each candidate's first token at
  the first generated position (vLLM's ``logprob_token_ids``: gathered from the full-vocabulary
  log-softmax, not a top-k list). They equal the HF backend's option logits minus one per-prompt
  constant (the log-partition function), so every softmax over options, argmax and PriDe prior is the same;
* :meth:`~VLLMModel.loglikelihood` sums prompt log-probabilities over the continuation's tokens (CP-LN);
* :meth:`~VLLMModel.generate_with_option_logits` gives both in one request per prompt (what
  :func:`mmfragile.runner.run_items` uses, as it uses the engine for HF models).

Automatic prefix caching is on (the 48 formats x shifts of a question share their system prompt, image
tokens and question), and so is vLLM's multimodal processor cache (a question's image is processed once, not once
per variant; each image file is also decoded once per call), tensor parallelism is ``tensor_parallel_size``. vLLM needs its own environment
(``scripts/install_vllm.sh``); on a CPU build the engine gets all cores, 32-token KV blocks (larger blocks
rarely fill with a shared prefix, so the cache would never hit) and float32 weights, as the HF backend uses
on CPU. Checkpoints whose CLIP / SigLIP vision tower transformers 5 saved without the ``vision_model.``
level vLLM expects are exported once, renamed, to ``$MMFRAGILE_CACHE/vllm-export`` (:func:`vllm_checkpoint`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mmfragile.paths import build_once, cache_dir
from mmfragile.errors import DataError
from mmfragile.models.adapters import adapter_for
from mmfragile.models.base import HFTokenizerIds, LogLik, MLLM, Prompt
from mmfragile.models.hf import load_image

#: vision configs whose vLLM module nests the encoder under ``vision_model.`` (CLIPVisionModel, SiglipVisionModel)
_NESTED_VISION_TOWERS = {"clip_vision_model", "siglip_vision_model"}


def frames_as_images(prompt: Prompt) -> Prompt:
    """This backend passes a video's frames as images (vLLM's native video input is not wired up), so a video
    prompt renders as the same prompt with its frames as images - for every family, video-capable or not."""
    return dataclasses.replace(prompt, video=False) if prompt.video else prompt


def load_processor(path: str | Path):
    """The checkpoint's processor (vision checkpoints) or tokenizer, chosen as the HF backend chooses it."""
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    if getattr(config, "vision_config", None) is not None:
        return AutoProcessor.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def eos_token_ids(path: str | Path, tokenizer) -> list[int]:
    """The ids that end HF greedy generation for this checkpoint: its generation config's ``eos_token_id``
    (generation_config.json, else config.json), else the tokenizer's EOS."""
    from transformers import AutoConfig, GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json: transformers derives it from config.json
        gen = GenerationConfig.from_model_config(AutoConfig.from_pretrained(path))
    eos = gen.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    if not ids or ids[0] is None:
        raise ValueError(f"{path}: no eos_token_id in generation_config.json, config.json or the tokenizer")
    return [int(i) for i in ids]


# ---------------------------------------------------------------------------------------------- checkpoints
def _weight_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no *.safetensors weights (vLLM export reads safetensors checkpoints only)")
    return files


def _safetensors_keys(file: Path) -> list[str]:
    """Tensor names from the safetensors header (no tensor is read)."""
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]


def _vllm_key(key: str) -> str:
    for prefix in ("model.vision_tower.", "vision_tower."):
        if key.startswith(prefix) and not key.startswith(prefix + "vision_model."):
            return prefix + "vision_model." + key[len(prefix):]
    return key


def needs_vllm_export(path: str | Path) -> bool:
    """True if the checkpoint's vision tower is a CLIP / SigLIP encoder saved without the ``vision_model.``
    level (transformers 5 layout) that vLLM's CLIP / SigLIP modules load."""
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    if (cfg.get("vision_config") or {}).get("model_type") not in _NESTED_VISION_TOWERS:
        return False
    return any(_vllm_key(k) != k for f in _weight_files(path) for k in _safetensors_keys(f))


def vllm_checkpoint(path: str | Path) -> Path:
    """``path`` itself if vLLM loads it as saved, else its export in vLLM's layout (built once, atomically;
    keyed by the source folder and its weight files' sizes and mtimes, so a changed checkpoint re-exports)."""
    from safetensors.torch import load_file, save_file

    path = Path(path).resolve()
    if not needs_vllm_export(path):
        return path
    stamp = hashlib.sha256(str(path).encode())
    for f in _weight_files(path):
        st = f.stat()
        stamp.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())

    def build(out: Path) -> None:
        for f in path.iterdir():  # configs, tokenizer, processor: as they are
            if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
                shutil.copy2(f, out / f.name)
        for f in _weight_files(path):
            save_file({_vllm_key(k): v for k, v in load_file(f).items()}, out / f.name, metadata={"format": "pt"})
        index = path / "model.safetensors.index.json"
        if index.is_file():
            idx = json.loads(index.read_text())
            idx["weight_map"] = {_vllm_key(k): v for k, v in idx["weight_map"].items()}
            (out / index.name).write_text(json.dumps(idx, indent=2))

    return build_once(cache_dir("vllm-export") / f"{path.name}-{stamp.hexdigest()[:12]}", build)


# ---------------------------------------------------------------------------------------------- the backend
class VLLMModel(HFTokenizerIds, MLLM):
    """A checkpoint served by an offline ``vllm.LLM`` engine (started in the constructor).

    Args:
        path: a local checkpoint folder (``transformers`` layout).
        name: the model name stored with results (default: the folder name).
        tensor_parallel_size: GPUs (or CPU worker processes) the model is split over.
        enable_prefix_caching: automatic prefix caching (on by default; off only to measure what it buys).
        mm_processor_cache_gb: vLLM's multimodal processor cache (GiB): an image it has processed - every variant
            of a question repeats it - is not resized, normalised and patched again; 0 turns it off.
        enforce_eager: skip torch.compile / CUDA graphs (much faster start, slower steps).
        max_images_per_prompt: most images (or video frames) one prompt may carry.
        dtype: ``"auto"`` for the checkpoint's dtype; default float32 on CPU (as the HF backend) else auto.
        block_size: KV-cache block size; default 32 on CPU, vLLM's default on GPU.
        llm_kwargs: passed on to ``vllm.LLM`` (``max_model_len``, ``gpu_memory_utilization``, ...).

    On a CPU build, set ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache, default 4) to fit the machine.
    """

    #: prompts :func:`mmfragile.runner.run_items` hands over per call: vLLM schedules a large batch itself
    batch_size: int = 256
    can_sample = True
    fused_option_logits = True

    def __init__(self, path: str | Path, name: str | None = None, tensor_parallel_size: int = 1,
                 enable_prefix_caching: bool = True, mm_processor_cache_gb: float = 4.0, enforce_eager: bool = False,
                 max_images_per_prompt: int = 16,
                 dtype: str | None = None, block_size: int | None = None, seed: int = 0, **llm_kwargs: Any):
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as e:
            raise ImportError(f"the vLLM backend needs vLLM ({e}); create its environment with "
                              "scripts/install_vllm.sh and run mmfragile from it") from e
        self.path = self.checkpoint = Path(path)
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(f"{self.path}: not a checkpoint folder (no config.json)")
        self.name = name or self.path.name
        self.processor = load_processor(self.path)
        from transformers import AutoConfig

        self.adapter = adapter_for(AutoConfig.from_pretrained(self.path))
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.supports_images = hasattr(self.processor, "image_processor")
        self.eos_ids = eos_token_ids(self.path, self.tokenizer)
        if current_platform.is_cpu():
            dtype = dtype or "float32"
            block_size = block_size or 32
            # all cores to the model (vLLM keeps one to itself by default), and with one worker the engine
            # runs in this process: no process spawns (a 60-90 s start on 2 cores becomes ~30 s)
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
            # a fixed KV cache; unset, vLLM reserves 92% of RAM and refuses to start if other processes hold it
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
            if tensor_parallel_size == 1:
                os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
                llm_kwargs.setdefault("distributed_executor_backend", "uni")
        kwargs: dict[str, Any] = dict(tensor_parallel_size=tensor_parallel_size,
                                      enable_prefix_caching=enable_prefix_caching, enforce_eager=enforce_eager,
                                      dtype=dtype or "auto", seed=seed, generation_config="vllm")
        if block_size:
            kwargs["block_size"] = block_size
        if self.supports_images:
            kwargs["limit_mm_per_prompt"] = {"image": max_images_per_prompt}
            kwargs["mm_processor_cache_gb"] = mm_processor_cache_gb
        kwargs.update(llm_kwargs)
        self.max_images_per_prompt = max_images_per_prompt
        #: loglikelihood requests rerun because their prefix-cache hit covered a scored position
        self.stats = {"loglik_cache_reruns": 0}
        self.llm = LLM(model=str(vllm_checkpoint(self.path)), tokenizer=str(self.path), **kwargs)

    # ------------------------------------------------------------------ inputs
    def render(self, prompt: Prompt) -> str:
        """The exact text the HF backend feeds its processor (chat template + generation prompt + assistant
        prefix), through the same family adapter."""
        prompt = frames_as_images(prompt)
        if prompt.images and not self.supports_images:
            raise DataError(f"{self.name} is a text-only model but the prompt has {len(prompt.images)} image(s)")
        return self.adapter.render(self.processor, prompt)

    def prompt_token_ids(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids before vLLM expands image placeholders: the HF backend's tokenization
        (its processor tokenizes with the tokenizer's special tokens; text-only models without)."""
        return self.tokenizer(self.render(prompt), add_special_tokens=self.supports_images)["input_ids"]

    def _inputs(self, prompts: Sequence[Prompt], continuations: Sequence[str] | None = None) -> list[dict]:
        out = []
        loaded: dict[str, Any] = {}  # an image file shared by the variants of a question is decoded once per call
        for i, p in enumerate(prompts):
            ids = self.prompt_token_ids(p)
            if continuations is not None:
                cids = self.tokenizer(continuations[i], add_special_tokens=False)["input_ids"]
                if not cids:
                    raise ValueError(f"continuation {i} is empty after tokenization: {continuations[i]!r}")
                ids = ids + cids
            req: dict[str, Any] = {"prompt_token_ids": ids}
            if p.images:  # (a text-only model has refused images in render)
                if len(p.images) > self.max_images_per_prompt:
                    raise ValueError(f"prompt {i} has {len(p.images)} images; this engine was started with "
                                     f"max_images_per_prompt={self.max_images_per_prompt}")
                order = self.adapter.image_order(frames_as_images(p))  # images in the order the template places them
                req["multi_modal_data"] = {"image": [self._load(p.images[k], f"prompt {i}", loaded) for k in order]}
            out.append(req)
        return out

    @staticmethod
    def _load(image, where: str, loaded: dict):
        if not isinstance(image, (str, Path)):
            return load_image(image, where)
        if str(image) not in loaded:
            loaded[str(image)] = load_image(image, where)
        return loaded[str(image)]

    def _params(self, max_new_tokens: int, logprob_token_ids: list[int] | None = None, prompt_logprobs: int | None = None,
                skip_reading_prefix_cache: bool | None = None):
        from vllm import SamplingParams

        # greedy; stop exactly where HF generate stops (the generation config's EOS ids, nothing else)
        return SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=self.eos_ids, ignore_eos=True,
                              detokenize=False, logprob_token_ids=logprob_token_ids, prompt_logprobs=prompt_logprobs,
                              skip_reading_prefix_cache=skip_reading_prefix_cache)

    def _run(self, inputs: list[dict], params) -> list:
        return self.llm.generate(inputs, params, use_tqdm=False)

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    # ------------------------------------------------------------------ the interface
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 16) -> list[str]:
        outs = self._run(self._inputs(prompts), self._params(max_new_tokens))
        return [self._decode(o.outputs[0].token_ids) for o in outs]

    def generate_with_option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]],
                                    max_new_tokens: int) -> tuple[list[str], list[np.ndarray]]:
        """Greedy texts and, from the same request, each candidate's first-token log-probability at the first
        generated position (see :meth:`option_logits`)."""
        if len(prompts) != len(candidates):
            raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
        cand_ids = [[self.first_token_id(c) for c in cands] for cands in candidates]
        params = [self._params(max_new_tokens, sorted(set(ids))) for ids in cand_ids]
        outs = self._run(self._inputs(prompts), params)
        texts, scores = [], []
        for o, ids in zip(outs, cand_ids):
            first = o.outputs[0].logprobs[0]  # {token id: Logprob} at the first generated position
            texts.append(self._decode(o.outputs[0].token_ids))
            scores.append(np.array([first[t].logprob for t in ids], dtype=np.float32))
        return texts, scores

    def generate_sampled(self, prompts: Sequence[Prompt], max_new_tokens: int, seeds: Sequence[int],
                         temperature: float = 0.7, top_p: float = 0.9) -> list[str]:
        """Seeded sampling for repeated judge runs: prompt i samples with vLLM's per-request generator seeded
        ``seeds[i]``, so its text depends on its seed, not on its batch. (Not the HF backend's random stream:
        the same seed gives a different sample on the two backends.)"""
        from vllm import SamplingParams

        if len(seeds) != len(prompts):
            raise ValueError("generate_sampled: one seed per prompt")
        if temperature <= 0 or not 0 < top_p <= 1:
            raise ValueError(f"sampling needs temperature > 0 and top_p in (0, 1], got {temperature}, {top_p}")
        params = [SamplingParams(temperature=temperature, top_p=top_p, seed=int(s), max_tokens=max_new_tokens,
                                 stop_token_ids=self.eos_ids, ignore_eos=True, detokenize=False) for s in seeds]
        return [self._decode(o.outputs[0].token_ids) for o in self._run(self._inputs(prompts), params)]

    def option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Exact next-token log-probabilities of each candidate's first token (log-softmax over the whole
        vocabulary): the HF backend's logits minus a per-prompt constant."""
        return self.generate_with_option_logits(prompts, candidates, 1)[1]

    def loglikelihood(self, prompts: Sequence[Prompt], continuations: Sequence[str]) -> list[LogLik]:
        """Sum of the continuation tokens' prompt log-probabilities (prompt + continuation in one request).

        Requests may read the prefix cache (vLLM's default skips it whenever prompt log-probabilities are
        asked for): a cached position has no log-probability, so any request whose cache hit reaches into the
        continuation's scored positions is rerun without reading the cache. Every sum is exact."""
        if len(prompts) != len(continuations):
            raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
        inputs = self._inputs(prompts, continuations)
        n_cont = [len(self.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in continuations]
        outs = self._run(inputs, self._params(1, prompt_logprobs=0, skip_reading_prefix_cache=False))
        res: list[LogLik | None] = [None] * len(prompts)
        redo = []
        for i, (o, n) in enumerate(zip(outs, n_cont)):
            first_scored = len(o.prompt_token_ids) - n  # position of the first continuation token
            if o.num_cached_tokens > first_scored - 1:  # its predicting position came from the cache
                redo.append(i)
            else:
                res[i] = self._loglik(o, n)
        if redo:
            self.stats["loglik_cache_reruns"] += len(redo)
            outs = self._run([inputs[i] for i in redo], self._params(1, prompt_logprobs=0, skip_reading_prefix_cache=True))
            for i, o in zip(redo, outs):
                res[i] = self._loglik(o, n_cont[i])
        return res  # type: ignore[return-value]

    @staticmethod
    def _loglik(out, n: int) -> LogLik:
        ids, lps = out.prompt_token_ids, out.prompt_logprobs
        total = 0.0
        for pos in range(len(ids) - n, len(ids)):
            total += lps[pos][ids[pos]].logprob  # prompt_logprobs[pos]: log p(token pos | tokens < pos)
        return LogLik(float(total), n)

