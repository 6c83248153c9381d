"""`transformers` backend: any local causal LM or image-text-to-text checkpoint behind :class:`MLLM`.

The same class drives the embedded default models (:mod:`mmfragile.models.embedded`) and real
checkpoints from a local path or the HF cache (LLaVA, Qwen2-VL, Phi, Gemma-3, ...): the prompt is
rendered with the checkpoint's own chat template, images go through its own processor.

All three calls are deterministic (greedy, no sampling) and batched with left padding, so the
last position of every row is the next-token position.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from mmfragile.errors import DataError
from mmfragile.models.base import HFTokenizerIds, LogLik, MLLM, Prompt


def load_image(img: Any, where: str = "prompt", max_pixels: int | None = None):
    """PIL image in RGB from a PIL image or a path; DataError naming the file if missing/corrupt.

    ``max_pixels``: downscale (aspect kept, Lanczos; JPEGs decoded at reduced size first) so width x height stays
    within it - the run's image policy (:attr:`HFModel.image_policy`). Without it, an image above PIL's safety
    limit (~179 M pixels) is refused with a DataError saying to set one."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(img, Image.Image):
        return _cap_pixels(img.convert("RGB"), max_pixels)
    p = Path(img)
    if not p.is_file():
        raise DataError(f"{where}: image file not found: {p}")
    limit = Image.MAX_IMAGE_PIXELS
    try:
        if max_pixels is not None:
            Image.MAX_IMAGE_PIXELS = None  # a cap is set: the image is downscaled right after decoding
        with Image.open(p) as im:
            if max_pixels is not None and im.width * im.height > max_pixels:
                scale = (max_pixels / (im.width * im.height)) ** 0.5
                im.draft("RGB", (int(im.width * scale) + 1, int(im.height * scale) + 1))  # JPEG: decode smaller
            return _cap_pixels(im.convert("RGB"), max_pixels)
    except Image.DecompressionBombError as e:
        raise DataError(f"{where}: {p} is larger than PIL's safety limit ({e}); load the model with "
                        "max_pixels=... to downscale images on load") from e
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise DataError(f"{where}: corrupt or unreadable image {p}: {e}") from e
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def _cap_pixels(im, max_pixels: int | None):
    if max_pixels is None or im.width * im.height <= max_pixels:
        return im
    scale = (max_pixels / (im.width * im.height)) ** 0.5
    from PIL import Image

    return im.resize((max(1, int(im.width * scale)), max(1, int(im.height * scale))), Image.Resampling.LANCZOS)


#: image-processor settings that decide how large an image reaches the model (recorded as the run's image policy)
IMAGE_SIZE_KEYS = ("size", "crop_size", "min_pixels", "max_pixels", "patch_size", "merge_size", "max_patches",
                   "min_patches", "crop_to_patches", "max_image_tiles", "do_image_splitting", "max_image_size",
                   "image_grid_pinpoints", "dynamic_hd", "image_seq_length", "do_resize", "do_center_crop")


def left_pad(rows: Sequence[torch.Tensor], value) -> torch.Tensor:
    """Stack tensors of different lengths (first dim) into one batch, left-padded with ``value``."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width, *rows[0].shape[1:]), value, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[i, width - len(r):] = r
    return out


def extend_per_token(values: torch.Tensor, n: int, fill: int) -> torch.Tensor:
    """One row's per-token processor output followed by ``n`` entries for appended text tokens: ``fill``, or the last
    entry repeated when ``fill`` is -1 (the family adapter's ``per_token`` value; -1 is what generate does for
    Llama-3.2-Vision's cross-attention mask)."""
    add = (values[-1:].expand(n, *values.shape[1:]) if fill == -1 else
           torch.full((n, *values.shape[1:]), fill, dtype=values.dtype))
    return torch.cat([values, add])


def _auto_class(config, default: str) -> str:
    """The Auto class to load a checkpoint with: remote code names its own in auto_map (first of the usual ones);
    a vision checkpoint whose type the image-text-to-text mapping lacks is a causal LM with vision (Phi-4)."""
    auto_map = getattr(config, "auto_map", None) or {}
    for name in ("AutoModelForImageTextToText", "AutoModelForVision2Seq", "AutoModelForCausalLM", "AutoModel"):
        if name in auto_map:
            return name if name != "AutoModelForVision2Seq" else "AutoModelForImageTextToText"
    return default


#: transformers' loading keywords that ``from_pretrained`` takes through ``**kwargs`` (its named ones come from its
#: signature: :func:`load_options`); a key of the checkpoint's config.json is accepted too (it overrides the config)
TRANSFORMERS_LOAD_KWARGS = ("attn_implementation", "device_map", "max_memory", "quantization_config", "subfolder",
                            "variant", "torch_dtype", "offload_folder", "offload_buffers", "gguf_file", "key_mapping",
                            "tp_plan", "tp_size", "use_kernels", "experts_implementation", "generation_config")
#: files that hold a tokenizer's vocabulary (one is enough)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def load_options() -> tuple[list[str], list[str]]:
    """The keyword arguments :meth:`HFModel.from_pretrained` takes: (its own, transformers' loading keywords)."""
    from transformers import PreTrainedModel

    from mmfragile.models.base import keyword_params

    own = keyword_params(HFModel.from_pretrained, ("cls", "path"))
    library = keyword_params(PreTrainedModel.from_pretrained, ("pretrained_model_name_or_path", "config"))
    return own, sorted(set(library) | set(TRANSFORMERS_LOAD_KWARGS))


def check_checkpoint(path: str | Path, trust_remote_code: bool = False) -> dict:
    """What :meth:`HFModel.from_pretrained` (and the vLLM backend) will need from a checkpoint folder, checked without
    loading it: config.json with a model type transformers knows (or the checkpoint's own code, trusted), weights,
    a tokenizer and - for a vision model - an image-processor config. :class:`~mmfragile.errors.UsageError` naming
    the missing file; returns the config.json dict."""
    import json
    from types import SimpleNamespace

    from transformers import CONFIG_MAPPING

    from mmfragile.errors import UsageError
    from mmfragile.models.adapters import ADAPTERS, adapter_for

    folder = Path(path)
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise UsageError(f"{folder}: not a checkpoint folder (no config.json)") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{folder / 'config.json'}: unreadable ({e})") from None
    model_type, remote = config.get("model_type"), bool(config.get("auto_map"))
    if model_type is not None and model_type not in CONFIG_MAPPING:
        if not remote:
            import transformers

            raise UsageError(f"{folder / 'config.json'}: model_type {model_type!r} is unknown to transformers "
                             f"{transformers.__version__}; supported families: {', '.join(sorted(ADAPTERS))} (others "
                             "that transformers knows run without the prefix-sharing engine)")
        if not trust_remote_code:
            raise UsageError(f"{folder}: this checkpoint ships its own model code (config.json auto_map); load it "
                             "with --model-args trust_remote_code=true (load_model(path, trust_remote_code=True)) if "
                             "you trust that code")
    if remote and trust_remote_code:
        return config  # its own code decides which files it reads
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise UsageError(f"{folder}: no weights (model.safetensors, model-*.safetensors or pytorch_model*.bin)")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES) and not any(folder.glob("*.tiktoken")):
        raise UsageError(f"{folder}: no tokenizer file (one of {', '.join(TOKENIZER_FILES)})")
    cfg = SimpleNamespace(**config)
    vision = config.get("vision_config") is not None or \
        _auto_class(cfg, adapter_for(cfg).auto_class) != "AutoModelForCausalLM"
    if vision and not (folder / "preprocessor_config.json").is_file() and "image_processor" not in _json(
            folder / "processor_config.json"):
        raise UsageError(f"{folder}: no image-processor config (preprocessor_config.json, or processor_config.json "
                         "with an image_processor entry) - copy it from the model's release")
    return config


def _json(path: Path) -> dict:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX or AVX512-BF16); without it torch emulates
    them and a bfloat16 model runs slower than float32 (docs/speed.md, "The CPU fast path")."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")   # torch.cpu's own probes (torch >= 2.3)
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def _check_cpu_dtype(dtype: Any, device: str, path: str | Path) -> None:
    """A bfloat16 model on a CPU that emulates bfloat16: one warning, before the weights load."""
    if device == "cpu" and str(dtype).removeprefix("torch.") == "bfloat16" and not cpu_has_bf16_matmul():
        import warnings

        warnings.warn(f"{Path(str(path)).name}: dtype=bfloat16 on a CPU without bfloat16 matrix instructions (no AMX "
                      "or AVX512-BF16: torch emulates them) runs slower than float32 here; --model-args dtype=float32 "
                      "runs it in float32 (another arithmetic: docs/speed.md, 'The CPU fast path')", stacklevel=3)


class SeededGumbelSampler:
    """Logits processor that turns greedy decoding into sampling from ``softmax(logits / T)`` restricted
    to the top-``p`` nucleus, with one independent random stream per batch row (Gumbel-max trick:
    ``argmax(l_i + G_i)`` with ``G_i ~ Gumbel(0, 1)`` is a sample from ``softmax(l)``)."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.t = float(temperature)
        self.top_p = float(top_p)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        s = scores.float() / self.t
        if self.top_p < 1.0:
            srt, idx = torch.sort(s, dim=-1, descending=True)
            p = torch.softmax(srt, dim=-1)
            drop_sorted = (torch.cumsum(p, dim=-1) - p) > self.top_p  # keep the smallest set with mass >= top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
            s = s.masked_fill(drop, float("-inf"))
        v = s.shape[-1]
        u = torch.stack([torch.rand(v, generator=g) for g in self.gens]).to(s.device)
        gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
        return s + gumbel


class HFModel(HFTokenizerIds, MLLM):
    """A `transformers` model + its processor (or tokenizer, for text-only LMs). Family differences (prompt
    rendering, processor inputs, per-token tensors) come from its :class:`~mmfragile.models.adapters.FamilyAdapter`."""

    can_sample = True
    prefix_engine = True

    def __init__(self, model, processor, name: str | None = None, batch_size: int = 8, max_pixels: int | None = None):
        from mmfragile.models.adapters import adapter_for

        self.model = model.eval()
        self.processor = processor
        self.adapter = adapter_for(model.config)
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.supports_images = hasattr(processor, "image_processor")
        self.name = name or Path(str(getattr(model.config, "_name_or_path", "model"))).name or "model"
        self.batch_size = batch_size
        self.max_pixels = None if max_pixels is None else int(max_pixels)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = next(model.parameters()).device

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, name: str | None = None, device: str | None = None,
                        dtype: torch.dtype | str | None = None, batch_size: int = 8, trust_remote_code: bool = False,
                        max_pixels: int | None = None, **kwargs) -> "HFModel":
        """Load a local checkpoint folder (or a model id already in the HF cache; no download is attempted
        when ``HF_HUB_OFFLINE=1``) with its family's Auto class and its own processor (tokenizer for text LMs).

        ``trust_remote_code=True`` runs the checkpoint's own modeling / processing code (Phi-3.5-vision,
        MiniCPM-V, Molmo): only for checkpoints you trust. Such models run generate / option_logits /
        loglikelihood through their processor and template where those follow the transformers conventions;
        the prefix-sharing engine refuses them (their internals are not a known family's).

        ``max_pixels`` caps every image's width x height before the processor sees it (e.g. 4096 * 4096 for
        HRBench-8K on a memory budget); by default images reach the processor as they are and its own resize
        policy applies. Either way :attr:`image_policy` records what happened, and a run stores it."""
        import transformers
        from transformers import AutoConfig

        from mmfragile.models.adapters import adapter_for

        device = device or default_device()
        if dtype is None:
            dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        _check_cpu_dtype(dtype, device, path)
        kwargs = {**kwargs, "trust_remote_code": trust_remote_code}
        try:
            config = AutoConfig.from_pretrained(path, **kwargs)
        except ValueError as e:
            if "trust_remote_code" in str(e) and not trust_remote_code:
                raise ValueError(f"{path}: this checkpoint ships its own model code (config.json auto_map). Load it "
                                 "with load_model(path, trust_remote_code=True) if you trust that code.") from e
            raise
        auto_class = _auto_class(config, adapter_for(config).auto_class)
        model = getattr(transformers, auto_class).from_pretrained(path, dtype=dtype, **kwargs)
        if getattr(config, "vision_config", None) is not None or auto_class != "AutoModelForCausalLM":
            processor = transformers.AutoProcessor.from_pretrained(path, **kwargs)
        else:
            processor = transformers.AutoTokenizer.from_pretrained(path, **kwargs)
        out = cls(model.to(device), processor, name=name or Path(str(path)).name, batch_size=batch_size,
                  max_pixels=max_pixels)
        out.checkpoint = Path(path) if Path(path).is_dir() else None
        return out

    @property
    def image_policy(self) -> dict[str, Any]:
        """How large an image reaches the model: the load-time cap and the image processor's own size settings
        (its defaults unless the checkpoint overrides them). :func:`mmfragile.runner.run_items` pins it in the
        store's config.json (``run_info.image_policy``) and refuses to resume a store under another policy."""
        ip = getattr(self.processor, "image_processor", None)
        settings = {} if ip is None else {k: v for k, v in ip.to_dict().items() if k in IMAGE_SIZE_KEYS}
        return {"max_pixels": self.max_pixels, "processor": type(ip).__name__ if ip is not None else None,
                **settings}

    # ------------------------------------------------------------------ prompts
    def render(self, prompt: Prompt) -> str:
        """The exact text fed to the processor: chat template + generation prompt + assistant prefix."""
        if prompt.images and not self.supports_images:
            raise DataError(f"{self.name} is a text-only model but the prompt has {len(prompt.images)} image(s)")
        return self.adapter.render(self.processor, prompt)

    def encode(self, prompts: Sequence[Prompt], continuations: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """Left-padded model inputs (processor outputs that forward() takes); with ``continuations`` their tokens
        are appended to each prompt - with every per-token tensor extended as the family's adapter says - and
        ``cont_lengths`` gives how many trailing tokens of each row are the continuation."""
        texts = [self.render(p) for p in prompts]
        if self.supports_images:
            media = self.adapter.media(prompts, lambda im, where: load_image(im, where, self.max_pixels))
            enc = self.processor(text=texts, return_tensors="pt", padding=True, **media)
        else:
            enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v for k, v in dict(enc).items() if k not in self.adapter.drop_keys}
        if continuations is not None:
            conts = []
            for i, cont in enumerate(continuations):
                cids = self.tokenizer(cont, add_special_tokens=False)["input_ids"]
                if not cids:
                    raise ValueError(f"continuation {i} is empty after tokenization: {cont!r}")
                conts.append(cids)
            enc = self._append_tokens(enc, conts)
            enc["cont_lengths"] = torch.tensor([len(c) for c in conts])
        return enc

    def _append_tokens(self, enc: dict, conts: list[list[int]]) -> dict:
        """Append token ids to each row and re-left-pad every per-token tensor (input_ids, attention_mask and the
        adapter's per-token outputs, whose new entries take the adapter's fill value; -1 repeats the last one)."""
        mask = enc["attention_mask"].bool()
        fills = {"input_ids": None, "attention_mask": 1, **{k: v for k, v in self.adapter.per_token.items() if k in enc}}
        rows: dict[str, list[torch.Tensor]] = {k: [] for k in fills}
        for i, cids in enumerate(conts):
            new = torch.tensor(cids)
            for k, fill in fills.items():
                old = enc[k][i][mask[i]]
                rows[k].append(torch.cat([old, new.to(old.dtype)]) if k == "input_ids" else
                               extend_per_token(old, len(cids), fill))
        out = dict(enc)
        pad = {"input_ids": self.tokenizer.pad_token_id}
        for k, rs in rows.items():
            out[k] = left_pad(rs, pad.get(k, 0))
        return out

    def to_device(self, enc: dict) -> dict:
        """The processor's tensors on the model's device, floating ones in its dtype (what every forward takes)."""
        out = {}
        for k, v in enc.items():
            if isinstance(v, torch.Tensor):
                v = v.to(self.device)
                if v.is_floating_point():
                    v = v.to(self.model.dtype)
            out[k] = v
        return out

    def _batches(self, prompts: Sequence[Prompt]):
        """Index lists of at most ``batch_size`` prompts that may share one processor call (the adapter's
        ``batch_key``: e.g. SmolVLM cannot mix video and image prompts), in the callers' order within a key."""
        by_key: dict[Any, list[int]] = {}
        for i, p in enumerate(prompts):
            by_key.setdefault(self.adapter.batch_key(p), []).append(i)
        for idx in by_key.values():
            for s in range(0, len(idx), self.batch_size):
                yield idx[s:s + self.batch_size]

    def _map_batches(self, prompts: Sequence[Prompt], fn) -> list:
        """``fn(index_list) -> one result per index``, over :meth:`_batches`, returned in prompt order."""
        out: list = [None] * len(prompts)
        for idx in self._batches(prompts):
            for i, r in zip(idx, fn(idx)):
                out[i] = r
        return out

    # ------------------------------------------------------------------ the interface
    @torch.inference_mode()
    def _generate(self, prompts: Sequence[Prompt], max_new_tokens: int, idx: list[int], **kwargs) -> list[str]:
        enc = self.to_device(self.encode([prompts[i] for i in idx]))
        gen = self.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                  pad_token_id=self.tokenizer.pad_token_id, temperature=None, top_p=None, top_k=None,
                                  **kwargs)
        return self.tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 16) -> list[str]:
        return self._map_batches(prompts, lambda idx: self._generate(prompts, max_new_tokens, idx))

    def generate_sampled(self, prompts: Sequence[Prompt], max_new_tokens: int, seeds: Sequence[int],
                         temperature: float = 0.7, top_p: float = 0.9) -> list[str]:
        """Seeded sampling (for repeated judge runs): prompt i samples with its own stream ``seeds[i]`` through a
        Gumbel-max logits processor on the greedy path, so its text depends on its seed, not on its batch."""
        from transformers import LogitsProcessorList

        if len(seeds) != len(prompts):
            raise ValueError("generate_sampled: one seed per prompt")
        return self._map_batches(prompts, lambda idx: self._generate(
            prompts, max_new_tokens, idx,
            logits_processor=LogitsProcessorList([SeededGumbelSampler([seeds[i] for i in idx], temperature, top_p)])))

    @torch.inference_mode()
    def next_token_logits(self, prompts: Sequence[Prompt]) -> torch.Tensor:
        """[len(prompts), vocab] logits of the next token, float32 on CPU (one forward pass per batch)."""
        def run(idx):
            enc = self.to_device(self.encode([prompts[i] for i in idx]))
            return self.model(**enc, logits_to_keep=1).logits[:, -1, :].float().cpu()

        return torch.stack(self._map_batches(prompts, run))

    def option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        logits = self.next_token_logits(prompts)
        return [logits[i, [self.first_token_id(c) for c in cands]].numpy() for i, cands in enumerate(candidates)]

    @torch.inference_mode()
    def loglikelihood(self, prompts: Sequence[Prompt], continuations: Sequence[str]) -> list[LogLik]:
        return self._map_batches(prompts, lambda idx: self._loglikelihood([prompts[i] for i in idx],
                                                                          [continuations[i] for i in idx]))

    def _loglikelihood(self, prompts: Sequence[Prompt], continuations: Sequence[str]) -> list[LogLik]:
        enc = self.encode(prompts, continuations)
        cont_lens = enc.pop("cont_lengths")
        enc = self.to_device(enc)
        keep = int(cont_lens.max()) + 1  # logits of the last n + 1 positions predict the continuation
        logp = torch.log_softmax(self.model(**enc, logits_to_keep=keep).logits.float(), dim=-1)
        out: list[LogLik] = []
        for i, n in enumerate(cont_lens.tolist()):
            target = enc["input_ids"][i, -n:]
            pred = logp[i, keep - n - 1:keep - 1, :]  # position t predicts token t+1
            out.append(LogLik(float(pred.gather(1, target[:, None]).sum()), n))
        return out

