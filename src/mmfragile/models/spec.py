"""A model spec, parsed once: backend x source x keyword arguments.

Every entrance (the CLI, the notebooks, :func:`mmfragile.run_study`, a Ray driver) turns the user's string into a
:class:`ModelSpec` first. Its :attr:`~ModelSpec.name` names result stores and the Ray driver's store *before* any
model loads, and :meth:`~ModelSpec.figure_note` gives figure footers; :meth:`~ModelSpec.load` is the only place a
spec becomes a model.

Spec strings (the backend prefix is optional; ``hf`` by default):

* ``smollm2`` | ``gemma3`` | ``smollm2-vlm`` | ``smollm2-vlm-hd`` | ``tiny-vlm`` (optionally ``@seed``): embedded
  defaults (the ``-vlm`` ones have RANDOM vision towers: for tests);
* ``zoo-*``: the model zoo - real LMs with vision towers trained here (:mod:`mmfragile.models.zoo`);
* a local checkpoint folder, or a model id already in the HF cache (never downloaded: ``HF_HUB_OFFLINE=1``);
* ``vllm:<any of the above>``: the same checkpoint in an offline vLLM engine;
* ``openai:<base_url>::<model>``: an OpenAI-compatible server (vLLM serve, llama.cpp, an API).

Keyword arguments (``max_pixels``, ``trust_remote_code``, ``batch_size``, ``tensor_parallel_size`` ...) go to the
backend's constructor; on the command line they are ``--model-args k=v,k=v`` (values read as YAML scalars).
``name=NEW`` names the model in stores and reports (two models must not share a name in one store: docs/stores.md).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import yaml

from mmfragile.models.base import MLLM, keyword_params
from mmfragile.redaction import MARK, declare_secret_args, is_secret_arg, redact, remember, remember_url

#: keyword arguments that change where and how fast a model runs, not its outputs: left out of a store's model
#: identity (:func:`mmfragile.provenance.model_identity`), so a resume may change them. ``device`` is where it runs
#: (like the hardware, not part of the identity); ``api_key`` is a secret: never recorded nor shown
#: (:mod:`mmfragile.redaction`), and a key change is not a model change.
SPEED_ONLY = frozenset({
    "name", "batch_size", "memory_budget", "max_batch", "device", "tensor_parallel_size", "gpu_memory_utilization",
    "enable_prefix_caching", "mm_processor_cache_gb", "enforce_eager", "block_size", "max_model_len",
    "max_images_per_prompt", "max_concurrency", "max_retries", "backoff_base", "backoff_max", "max_retry_after",
    "timeout", "cache_dir", "api_key"})

#: footers of figures made with a model that does not really see (tests and smoke runs)
_NOTES = {
    "tiny-vlm": "embedded tiny-vlm: RANDOM weights throughout (a test model, not a real VLM)",
    "smollm2-vlm": None,   # filled in from the embedded module (EMBEDDED_NOTE) on first use
    "smollm2-vlm-hd": None,
    "smollm2": "embedded default: SmolLM2-135M-Instruct (text only)",
    "gemma3": "embedded: Gemma-3-270M base (text only)",
}


def parse_model_args(text: str | None) -> dict[str, Any]:
    """``"max_pixels=1048576,trust_remote_code=true"`` -> ``{"max_pixels": 1048576, "trust_remote_code": True}``
    (values as YAML scalars; an empty string gives ``{}``)."""
    out: dict[str, Any] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--model-args wants key=value pairs separated by commas, got {part!r}")
        out[key.strip()] = yaml.safe_load(value.strip())
    return out


@dataclass(frozen=True)
class ModelSpec:
    """What to load: ``backend`` (hf, vllm, openai), ``source`` (embedded or zoo name, folder, cached model id,
    or ``<base_url>::<model>``) and the constructor's keyword arguments (a sorted tuple of pairs: hashable and
    picklable for Ray)."""

    backend: str
    source: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        # every secret this spec carries is masked wherever it shows for the rest of the process (mmfragile.redaction)
        for key, value in self.kwargs:
            if is_secret_arg(key):
                remember(str(value))
        remember_url(self.source)

    @classmethod
    def parse(cls, spec: "str | ModelSpec", backend: str | None = None, **kwargs: Any) -> "ModelSpec":
        """A spec string (or a spec, whose keyword arguments ``kwargs`` extend) -> :class:`ModelSpec`."""
        if isinstance(spec, ModelSpec):
            return spec if not kwargs and backend in (None, spec.backend) else \
                cls(backend or spec.backend, spec.source, tuple(sorted({**spec.options, **kwargs}.items())))
        text = str(spec).strip()
        if not text:
            raise ValueError("empty model spec")
        prefix, sep, rest = text.partition(":")
        if sep and prefix in BACKENDS and prefix != DEFAULT_BACKEND:
            if backend not in (None, prefix, DEFAULT_BACKEND):
                raise ValueError(f"model spec {text!r} names backend {prefix!r} but backend={backend!r} was given")
            backend, text = prefix, rest
        backend = backend or DEFAULT_BACKEND
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)} ({'; '.join(b.form for b in BACKENDS.values())}), "
                             f"not {backend!r}")
        BACKENDS[backend].check_source(text, spec)
        return cls(backend, text, tuple(sorted(kwargs.items())))

    @property
    def backend_entry(self) -> "Backend":
        """This spec's entry in the backend registry (:data:`BACKENDS`)."""
        return BACKENDS[self.backend]

    def can(self, capability: str) -> bool:
        """Whether the model this spec loads has ``capability`` (an :class:`~mmfragile.models.base.MLLM` capability
        attribute such as ``can_sample``), from its backend's class, before it loads. A backend whose module is
        not installed answers True: loading it then says what to install."""
        entry = self.backend_entry
        try:
            cls = entry.model_class() if entry.model_class is not None else None
        except ImportError:
            return True
        return cls is None or bool(getattr(cls, capability))

    # ------------------------------------------------------------------ what it is
    @property
    def options(self) -> dict[str, Any]:
        return dict(self.kwargs)

    @property
    def output_options(self) -> dict[str, Any]:
        """The keyword arguments that change the model's outputs (``dtype``, ``max_pixels``, ``trust_remote_code``
        ...): all but :data:`SPEED_ONLY` and the secrets."""
        return {k: v for k, v in self.kwargs if k not in SPEED_ONLY and not is_secret_arg(k)}

    @property
    def base_name(self) -> str:
        """The source without an ``@seed`` suffix."""
        return self.source.partition("@")[0]

    @property
    def origin(self) -> str:
        """``embedded``, ``zoo``, ``api``, ``folder`` (a local checkpoint) or ``cached`` (a model id in the HF cache)."""
        from mmfragile.models.embedded import EMBEDDED_MODELS
        from mmfragile.models.zoo import ZOO_MODELS

        if self.backend_entry.origin:
            return self.backend_entry.origin
        if self.source in ZOO_MODELS:
            return "zoo"
        if self.base_name in EMBEDDED_MODELS:
            return "embedded"
        return "folder" if Path(self.source).exists() else "cached"

    @property
    def name(self) -> str:
        """The model's name in result stores, figures and reports - the name the loaded model carries."""
        if "name" in self.options:
            return str(self.options["name"])
        if self.origin == "api":
            return self.source.partition("::")[2]
        if self.origin in ("embedded", "zoo"):
            return self.source
        return Path(self.source.rstrip("/")).name or self.source

    def figure_note(self) -> str | None:
        """The footer of every figure made with this model where it does not really see (random vision tower,
        random weights, text only); None for a model whose answers are real."""
        if self.base_name in ("smollm2-vlm", "smollm2-vlm-hd"):
            from mmfragile.models.embedded import EMBEDDED_NOTE

            return EMBEDDED_NOTE
        return _NOTES.get(self.base_name)

    def __str__(self) -> str:
        """The spec as a user writes it, secrets masked (``api_key=***``, URL credentials): what is recorded and
        shown."""
        head = "" if self.backend == DEFAULT_BACKEND else f"{self.backend}:"
        return redact(head + self.source + "".join(f" {k}={MARK if is_secret_arg(k) else v}" for k, v in self.kwargs))

    def __repr__(self) -> str:
        return f"ModelSpec({str(self)!r})"

    # ------------------------------------------------------------------ checking
    def check(self) -> None:
        """Every mistake in the spec that shows without loading the model, as a :class:`~mmfragile.errors.UsageError`
        naming the piece: a keyword argument the backend does not take (the accepted ones listed), a folder or model
        id that is not there, a checkpoint without config / weights / tokenizer / image-processor config or with a
        model type transformers does not know. :func:`mmfragile.run_study` calls it before it reads any data."""
        from mmfragile.errors import UsageError

        need = self.backend_entry.requires
        if need and importlib.util.find_spec(need[0]) is None:
            raise UsageError(f"{self}: the {self.backend} backend needs {need[0]}; {need[1]}")
        folder = None if self.origin in ("api", "embedded", "zoo") else self._local_folder()
        config = {}
        if folder is not None and "gguf_file" not in self.options:  # a GGUF file holds config, weights, tokenizer
            from mmfragile.models.hf import check_checkpoint

            config = check_checkpoint(folder / str(self.options.get("subfolder") or ""),
                                      trust_remote_code=bool(self.options.get("trust_remote_code")))
        self._check_options(config)

    def accepted_options(self) -> dict[str, list[str]]:
        """The keyword arguments this spec's backend takes, by where they go (the backend's own; its library's)."""
        return self.backend_entry.options()

    def _check_options(self, config: Mapping[str, Any]) -> None:
        accepted = self.accepted_options()
        known = {"name", *config, *(k for keys in accepted.values() for k in keys)}
        bad = sorted(k for k in self.options if k not in known)
        if not bad:
            return
        import difflib

        from mmfragile.errors import UsageError

        close = difflib.get_close_matches(bad[0], sorted(known), n=1)
        lists = "; ".join(f"{what}: {', '.join(keys)}" for what, keys in accepted.items())
        raise UsageError(f"--model-args: unknown key{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))} for "
                         + redact(f"{self.backend}:{self.source}") + (f" (did you mean {close[0]!r}?)" if close else "")
                         + f"; {lists}" + ("; or a key of its config.json" if config else ""))

    def _local_folder(self) -> Path:
        """The checkpoint folder of a ``folder`` or ``cached`` spec; UsageError where there is none."""
        if self.origin == "folder":
            return Path(self.source)
        from mmfragile.errors import UsageError

        if _looks_like_path(self.source):
            raise UsageError(f"model folder {self.source} does not exist")
        try:
            folder = self.checkpoint_dir()
        except FileNotFoundError as e:
            raise UsageError(str(e)) from None
        if folder is None:
            raise UsageError(f"{self}: an API model has no checkpoint folder")
        return folder

    # ------------------------------------------------------------------ loading
    def load(self) -> MLLM:
        """The model (:class:`~mmfragile.models.base.MLLM`). No network: a model id must be in the HF cache."""
        from mmfragile.determinism import apply

        apply()  # the deterministic mode's torch settings, where it is on
        self.check()
        model = self._load({k: v for k, v in self.kwargs if k != "name"})
        model.name = self.name
        model.spec = self  # what a run records and the studies read the backend from (spec_of)
        return model

    def _load(self, kw: dict[str, Any]) -> MLLM:
        return self.backend_entry.load(self, kw)

    def checkpoint_dir(self) -> Path | None:
        """The local checkpoint folder (built first for embedded and zoo models); None for an API model."""
        origin = self.origin
        if origin == "api":
            return None
        if origin == "embedded":
            from mmfragile.models.embedded import embedded_model_path

            return embedded_model_path(self.base_name, int(self.source.partition("@")[2] or 0))
        if origin == "zoo":
            from mmfragile.models.zoo import zoo_model_path

            return zoo_model_path(self.source)
        if origin == "folder":
            return Path(self.source)
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:  # a model id already in the HF cache, as for the HF backend; never a download
            return Path(snapshot_download(self.source, local_files_only=True))
        except (LocalEntryNotFoundError, ValueError) as e:
            from mmfragile.models.embedded import EMBEDDED_MODELS
            from mmfragile.models.zoo import ZOO_MODELS

            raise FileNotFoundError(f"model {self.source!r}: neither an embedded model ({', '.join(EMBEDDED_MODELS)}), "
                                    f"a zoo model ({', '.join(ZOO_MODELS)}), a local folder nor a model id in the "
                                    "local HF cache (nothing is downloaded)") from e


def _looks_like_path(source: str) -> bool:
    """A source written as a path (``/x``, ``./x``, ``~/x``, ``a/b/c``), never a model id (``org/name``)."""
    return source.startswith(("/", ".", "~")) or source.count("/") > 1 or os.sep != "/" and os.sep in source


def figure_note_for(models: Iterable[object]) -> str | None:
    """One footer for a figure of several models (their specs or names): the distinct notes of those that do not
    really see, joined; None when every model's answers are real."""
    notes = list(dict.fromkeys(n for n in (ModelSpec.parse(str(m)).figure_note() for m in models) if n))
    return "; ".join(notes) or None


def spec_of(model: MLLM) -> ModelSpec:
    """The spec of a loaded model: the one it was loaded from (:meth:`ModelSpec.load` sets ``model.spec``), or for a
    model built by hand one made from its name - an ``openai:`` spec for a model that declares itself an API
    (``model.api``), so that what depends on the backend (Promptception's answer formats) follows what it is."""
    spec = getattr(model, "spec", None)
    if spec is None:
        api = next(b.name for b in BACKENDS.values() if b.origin == "api")
        spec = (ModelSpec(api, f"{getattr(model, 'base_url', '')}::{model.name}") if model.api
                else ModelSpec.parse(model.name))
    return spec if spec.name == model.name else as_spec(spec, name=model.name)


def as_spec(model: "str | ModelSpec", backend: str | None = None, model_args: Mapping[str, Any] | str | None = None,
            **kwargs: Any) -> ModelSpec:
    """``model`` (+ ``model_args``, a mapping or ``"k=v,..."``) as a :class:`ModelSpec`."""
    extra = parse_model_args(model_args) if isinstance(model_args, str) else dict(model_args or {})
    return ModelSpec.parse(model, backend, **{**extra, **kwargs})


# ============================================================================================== backends
@dataclass(frozen=True, kw_only=True)
class Backend:
    """One backend, in the one registry of them (:data:`BACKENDS`): its name (the spec's prefix, none for the
    default), ``form`` (how its spec is written, for errors), ``origin`` (what every spec of it is - ``api`` - or
    None: by source), ``load(spec, kwargs)`` -> the model, ``options()`` -> the keyword arguments it takes by
    where they go, ``check_source(source, spec)`` (raises ValueError on a malformed spec), ``requires`` (a
    module it needs, and how to get it) and ``model_class()`` (the class it loads, imported on demand). What a
    model can do is declared on that class (:class:`~mmfragile.models.base.MLLM`'s capability attributes) and checked
    before anything loads - except whether a checkpoint takes images, which only its files say: ``HFModel`` reads
    it from the processor when it loads (no image processor: text-only), and :func:`mmfragile.study.answerable`
    then leaves out the items with images."""

    name: str
    form: str
    load: Callable[["ModelSpec", dict[str, Any]], MLLM]
    options: Callable[[], dict[str, list[str]]]
    origin: str | None = None
    check_source: Callable[[str, Any], None] = lambda source, spec: None
    requires: tuple[str, str] | None = None
    #: keyword arguments that are secrets (masked wherever a spec is recorded or shown: mmfragile.redaction)
    secrets: frozenset[str] = frozenset()
    model_class: Callable[[], type] | None = None

    def __post_init__(self) -> None:
        declare_secret_args(self.secrets)


def _load_openai(spec: ModelSpec, kw: dict[str, Any]) -> MLLM:
    from mmfragile.models.openai_api import OpenAIChatModel

    url, _, model = spec.source.partition("::")
    return OpenAIChatModel(url, model, **kw)


def _openai_class() -> type:
    from mmfragile.models.openai_api import OpenAIChatModel

    return OpenAIChatModel


def _openai_options() -> dict[str, list[str]]:
    from mmfragile.models.openai_api import OpenAIChatModel

    return {"accepted": keyword_params(OpenAIChatModel.__init__, ("self", "base_url", "model"))}


def _openai_source(source: str, spec: Any) -> None:
    if "::" not in source:
        raise ValueError(f"openai model spec needs '<base_url>::<model>', got {spec!r}")


def _load_vllm(spec: ModelSpec, kw: dict[str, Any]) -> MLLM:
    from mmfragile.models.vllm_backend import VLLMModel

    folder = spec.checkpoint_dir()
    if folder is None:
        raise ValueError(f"{spec}: the vLLM backend runs a local checkpoint, and an API model has none")
    return VLLMModel(folder, **kw)


def _vllm_class() -> type:
    from mmfragile.models.vllm_backend import VLLMModel

    return VLLMModel


def _vllm_options() -> dict[str, list[str]]:
    from mmfragile.models.vllm_backend import VLLMModel

    own = keyword_params(VLLMModel.__init__, ("self", "path"))
    try:
        import dataclasses

        from vllm.engine.arg_utils import EngineArgs

        return {"accepted": own, "vLLM engine arguments": sorted(f.name for f in dataclasses.fields(EngineArgs))}
    except ImportError:
        return {"accepted": own}


def _load_hf(spec: ModelSpec, kw: dict[str, Any]) -> MLLM:
    """Embedded and zoo models by name, else a checkpoint folder or a model id in the local HF cache."""
    origin = spec.origin
    if origin == "zoo":
        from mmfragile.models.zoo import load_zoo

        zoo_model: MLLM = load_zoo(spec.source, **kw)
        return zoo_model
    if origin == "embedded":
        from mmfragile.models.embedded import load_embedded

        return load_embedded(spec.base_name, seed=int(spec.source.partition("@")[2] or 0), **kw)
    from mmfragile.models.hf import HFModel

    if origin == "cached":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # only the local HF cache, never the network
    return HFModel.from_pretrained(spec.source, **kw)


def _hf_class() -> type:
    from mmfragile.models.hf import HFModel   # zoo and embedded models are HFModels too

    return HFModel


def _hf_options() -> dict[str, list[str]]:
    from mmfragile.models.hf import load_options

    own, library = load_options()
    return {"accepted": sorted(own), "transformers loading keywords": library}


DEFAULT_BACKEND = "hf"
#: every backend: spec prefix -> :class:`Backend`
BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend(name="hf", form="<embedded or zoo name | checkpoint folder | cached model id>", load=_load_hf,
            options=_hf_options,
            model_class=_hf_class),
    Backend(name="vllm", form="vllm:<the same as hf>", load=_load_vllm, options=_vllm_options,
            requires=("vllm", "create its environment with scripts/install_vllm.sh and run mmfragile from it"),
            model_class=_vllm_class),
    Backend(name="openai", form="openai:<base_url>::<model>", load=_load_openai, options=_openai_options, origin="api",
            check_source=_openai_source, secrets=frozenset({"api_key"}), model_class=_openai_class),
)}
