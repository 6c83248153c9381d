"""OpenAI-compatible chat backend: API models and local servers (vLLM, llama.cpp server, ...).

HTTP goes through the official ``openai`` client (``AsyncOpenAI``, on one event-loop thread per model
instance, so the synchronous MLLM calls work from scripts, threads and notebooks alike); the requests of a
call run concurrently, at most ``max_concurrency`` in flight per instance. The request bodies are built here
and sent as they are (``client.post``), so every OpenAI-compatible server and field (vLLM's
``continue_final_message``, ``top_k`` ...) works and the disk cache keys on exactly what was sent. One
:class:`OpenAIChatModel` talks to ``{base_url}/chat/completions`` (e.g. ``base_url="http://127.0.0.1:8000/v1"``)
and implements the :class:`~mmfragile.models.base.MLLM` interface:

* :meth:`OpenAIChatModel.generate` - ``temperature=0`` chat completion, ``max_tokens=max_new_tokens``.
* :meth:`OpenAIChatModel.option_logits` - one request per prompt with ``logprobs=true``,
  ``top_logprobs=20``, ``max_tokens=1``; each candidate string is matched (whitespace-stripped,
  case-sensitive, exact) against the returned top-k *first-token* alternatives. **This is an
  approximation of logits limited by the API**: the values are log-probabilities (logits up to a
  per-prompt constant, so argmax and softmax over the candidates are unaffected), only the top-k
  tokens are visible, and every candidate outside the top-k gets ``-inf``. When several returned
  tokens strip to the same candidate (``"A"`` and ``" A"``) their probabilities are merged
  (``variant_merge="logsumexp"``, default; ``"max"`` keeps the best one).
* :meth:`OpenAIChatModel.loglikelihood` - chat APIs do not return prompt log-probabilities, so this
  raises :class:`NotImplementedError` unless ``completions_echo=True``: then text-only prompts are
  rendered as plain text and scored through ``{base_url}/completions`` with ``echo=true,
  logprobs=1, max_tokens=1`` (legacy completions format; vLLM supports it, OpenAI's chat models
  do not).

Determinism protocol: ``temperature`` is always 0 (it cannot be overridden through
``extra_body``); ``seed`` is passed through when given. Servers may still be non-deterministic
(batching, floating point); the disk cache makes reruns reproducible.

Prompt -> messages: an optional ``{"role": "system"}`` message, then one user message whose
content is a list of parts: the images first (``{"type": "image_url", "image_url": {"url":
"data:image/png;base64,..."}}``, PIL images or file paths re-encoded as PNG; strings that already
are ``data:``/``http(s)://`` URLs are passed through), then ``{"type": "text", "text": ...}``.
``Prompt.assistant_prefix`` is handled per ``assistant_prefix_mode``:

* ``"user"`` (default, works everywhere): the prefix is appended to the user text on a new line
  (``"<text>\\n<prefix>"``); in :meth:`generate` a reply that starts by repeating the prefix has
  that repetition removed, so results match "continue after the prefix" as closely as possible.
* ``"continue"``: the prefix is sent as a final partial assistant message together with vLLM's
  ``continue_final_message=true, add_generation_prompt=false``; the model continues it exactly.
* ``"prefill"``: the prefix is sent as a final assistant message without extra flags (servers
  that treat a trailing assistant message as a prefill, e.g. recent llama.cpp server).

Disk cache (``cache_dir``): one JSON file per request, ``<cache_dir>/<sha256>.json``, where the
key is the SHA-256 of the canonical JSON (sorted keys, compact) of ``{endpoint, request body}``
with every image data URL replaced by the SHA-256 of its bytes. The body contains the model
name, the messages and all parameters (temperature, seed, max_tokens, logprobs, extra_body);
``base_url`` and the API key are *not* part of the key, so a cache can be reused across ports
or hosts serving the same model name. A cache hit makes no HTTP request. Files are written
atomically; a cache file that cannot be used (invalid or truncated JSON, no response object, another request's
entry, a read error) is requested again with a :class:`CorruptCacheWarning` naming it, and overwritten by the new
reply. A cache file that cannot be written (a full disk) warns the same way; the reply is still returned.

Replies without text: a chat reply whose ``content`` is null - a refusal (``message.refusal``), a tool call
(``message.tool_calls``), a content filter - is returned by :meth:`OpenAIChatModel.generate` as a
:class:`~mmfragile.models.base.NoOutput` naming the reason (``"[no output] refusal: <text>"``,
``"[no output] tool_calls: <names>"``, ``"[no output] finish_reason: <reason>"``), never as ``""``: the row keeps the
reason in ``raw_output`` and is out of coverage (no option ID matches); one warning per call counts them.

Loopback base URLs (``localhost``, ``127.*``, ``::1``) bypass any ``HTTP(S)_PROXY`` environment
setting; other hosts use the client's default proxy handling. Without an API key no ``Authorization``
header is sent (local servers).

Errors: :class:`APIError` carries ``status`` (``None`` for connection errors), ``url`` and the
server's message body. 429, 408 and 5xx responses and connection errors / timeouts are retried
up to ``max_retries`` times with exponential backoff and jitter
(``min(backoff_max, backoff_base * 2**attempt) * U(0.5, 1)``), honouring a ``Retry-After``
header (seconds or HTTP date; capped at ``max_retry_after``); other 4xx fail immediately. The client's own
retries are switched off so that this one, tested policy applies (its default caps Retry-After at 60 s).

Other providers through their OpenAI-compatible endpoints (keys from the environment, never from files):

* OpenAI: ``https://api.openai.com/v1``, models such as ``gpt-4o`` / ``gpt-4o-mini``, key ``OPENAI_API_KEY``;
  logprobs yes (``top_logprobs`` <= 20), so :meth:`OpenAIChatModel.option_logits` works.
* Gemini: ``https://generativelanguage.googleapis.com/v1beta/openai/``, models such as ``gemini-2.5-flash``, key
  ``GEMINI_API_KEY``; logprobs are not part of the documented compatibility surface - if the response carries
  none, ``option_logits`` raises saying so.
* Claude: ``https://api.anthropic.com/v1/``, Claude model names (e.g. ``claude-sonnet-4-5``), key
  ``ANTHROPIC_API_KEY``; Anthropic documents ``logprobs``, ``top_logprobs`` and ``seed`` as ignored and
  ``temperature`` as 0-1, so only ``generate`` applies (``option_logits`` raises: no logprobs).

e.g. ``OpenAIChatModel("https://generativelanguage.googleapis.com/v1beta/openai/", "gemini-2.5-flash",
api_key=os.environ["GEMINI_API_KEY"])``. Without logprobs use ``generate`` with exact-match / extraction
scoring, as the papers do for API models.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import hashlib
import inspect
import io
import json
import math
import os
import random
import threading
import time
import urllib.parse
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mmfragile.models.base import MLLM, LogLik, NoOutput, Prompt
from mmfragile.redaction import redact, remember, remember_url
from mmfragile.errors import DataError

__all__ = ["APIError", "CorruptCacheWarning", "OpenAIChatModel", "build_messages", "image_to_data_url",
           "request_cache_key"]

#: bump when the cache layout or key recipe changes (part of every key).
CACHE_VERSION = 1
#: HTTP statuses retried with backoff; every other 4xx is a client error and fails at once.
RETRYABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
_ASSISTANT_PREFIX_MODES = ("user", "continue", "prefill")
#: request fields the determinism protocol owns; ``extra_body`` may not override them.
_PROTECTED_FIELDS = ("temperature", "model", "messages", "n", "stream")


class CorruptCacheWarning(UserWarning):
    """A disk-cache file could not be used (corrupt, truncated, unreadable) or written; the request is sent."""


class _Aborted(Exception):
    """A request not sent because another request of its batch failed for good."""


class APIError(RuntimeError):
    """An OpenAI-compatible server call failed (after retries, where retryable).

    Attributes: ``status`` (HTTP status, ``None`` for connection errors / bad responses without
    one), ``url``, ``body`` (the server's message body, or the connection error text),
    ``retryable``, ``attempts`` (number of HTTP attempts made) and ``retry_after``.
    """

    def __init__(self, message: str, *, status: int | None, url: str, body: str = "",
                 retryable: bool = False, attempts: int = 1, retry_after: float | None = None):
        self.status = status
        self.url = redact(url)
        self.body = redact(body)  # a server may echo the request, key and all
        self.retryable = retryable
        self.attempts = attempts
        #: seconds asked for by the server's ``Retry-After`` header, if any
        self.retry_after = retry_after
        super().__init__(redact(message))


# --------------------------------------------------------------------------------------------
# images and messages
# --------------------------------------------------------------------------------------------

_PNG_MODES = {"1", "L", "LA", "P", "RGB", "RGBA", "I"}


def _pil_to_png_bytes(img: Any) -> bytes:
    if img.mode not in _PNG_MODES:
        has_alpha = "A" in img.getbands()
        img = img.convert("RGBA" if has_alpha else "RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def image_to_data_url(image: Any) -> str:
    """A ``data:image/png;base64,...`` URL for a PIL image or an image file path.

    File paths are decoded with PIL and re-encoded as PNG (so every image reaches the server as
    PNG); a missing or unreadable file raises :class:`~mmfragile.errors.DataError` naming it.
    Strings that already are ``data:`` or ``http(s)://`` URLs are returned unchanged.
    """
    if isinstance(image, str) and image.startswith(("data:", "http://", "https://")):
        return image
    if isinstance(image, (str, os.PathLike)):
        from PIL import Image

        path = Path(image)
        try:
            with Image.open(path) as im:
                im.load()
                png = _pil_to_png_bytes(im)
        except (OSError, ValueError) as e:  # FileNotFoundError, UnidentifiedImageError
            raise DataError(f"{path}: cannot read image ({type(e).__name__}: {e})") from e
    elif hasattr(image, "save") and hasattr(image, "mode"):
        png = _pil_to_png_bytes(image)
    else:
        raise TypeError(f"image must be a PIL image, a path or a data/http URL, got {type(image).__name__}")
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def build_messages(prompt: Prompt, assistant_prefix_mode: str = "user") -> list[dict]:
    """OpenAI chat ``messages`` for one :class:`Prompt` (see the module docstring for the layout)."""
    if assistant_prefix_mode not in _ASSISTANT_PREFIX_MODES:
        raise ValueError(f"assistant_prefix_mode must be one of {_ASSISTANT_PREFIX_MODES}, got {assistant_prefix_mode!r}")
    messages: list[dict] = []
    if prompt.system:
        messages.append({"role": "system", "content": prompt.system})
    text = prompt.text
    prefix = prompt.assistant_prefix or ""
    if prefix and assistant_prefix_mode == "user":
        text = f"{text}\n{prefix}" if text else prefix
    images = list(prompt.images or [])
    if images:
        content: Any = [{"type": "image_url", "image_url": {"url": image_to_data_url(im)}} for im in images]
        content.append({"type": "text", "text": text})
    else:
        content = text
    messages.append({"role": "user", "content": content})
    if prefix and assistant_prefix_mode in ("continue", "prefill"):
        messages.append({"role": "assistant", "content": prefix})
    return messages


# --------------------------------------------------------------------------------------------
# cache key
# --------------------------------------------------------------------------------------------

def _hash_data_urls(obj: Any) -> Any:
    """Copy of a request body with each image data URL replaced by the SHA-256 of its bytes."""
    if isinstance(obj, dict):
        return {k: _hash_data_urls(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hash_data_urls(v) for v in obj]
    if isinstance(obj, str) and obj.startswith("data:") and ";base64," in obj:
        head, _, payload = obj.partition(";base64,")
        try:
            data = base64.b64decode(payload, validate=True)
        except (ValueError, binascii.Error):  # not really a data URL: hash the text itself
            data = obj.encode("utf-8")
        return f"{head};sha256,{hashlib.sha256(data).hexdigest()}"
    return obj


def _canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def request_cache_key(endpoint: str, body: dict) -> str:
    """SHA-256 hex key of a request: canonical JSON of the endpoint and the body, images hashed."""
    canon = {"v": CACHE_VERSION, "endpoint": endpoint, "body": _hash_data_urls(body)}
    return hashlib.sha256(_canonical_json(canon).encode("utf-8")).hexdigest()


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date); ``None`` if absent/bad."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _logsumexp(values: list[float]) -> float:
    m = max(values)
    if m == -math.inf:
        return m
    return m + math.log(sum(math.exp(v - m) for v in values))


# --------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------

class OpenAIChatModel(MLLM):
    """An :class:`MLLM` behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Parameters
    ----------
    base_url: server root including the version, e.g. ``"http://127.0.0.1:8000/v1"``.
    model: the ``model`` field sent with every request.
    api_key: bearer token; defaults to ``$OPENAI_API_KEY``; no ``Authorization`` header if neither.
    max_concurrency: requests in flight at once (thread pool size, and a per-instance semaphore
        so the limit also holds when several threads share the model), default 8.
    max_retries: retries after the first attempt for 429/408/5xx/connection errors.
    backoff_base, backoff_max: exponential backoff ``min(backoff_max, backoff_base * 2**k)``
        seconds, multiplied by a jitter factor drawn from U(0.5, 1).
    max_retry_after: upper bound on an honoured ``Retry-After`` delay (seconds).
    timeout: socket timeout per HTTP attempt (seconds).
    cache_dir: directory of the JSON disk cache (``None``: no cache).
    seed: passed through as the request's ``seed`` when not ``None``.
    assistant_prefix_mode: ``"user"`` | ``"continue"`` | ``"prefill"`` (module docstring).
    top_logprobs: alternatives requested by :meth:`option_logits` (OpenAI's maximum is 20).
    variant_merge: ``"logsumexp"`` | ``"max"``, how tokens stripping to the same candidate merge.
    max_tokens_field: name of the token-limit field (``"max_completion_tokens"`` for some APIs).
    extra_body: extra JSON fields for every request (e.g. vLLM's ``chat_template_kwargs``);
        may not set ``temperature``/``model``/``messages``/``n``/``stream``.
    completions_echo: score :meth:`loglikelihood` via ``/completions`` with ``echo`` (text only).
    supports_images: set ``False`` for text-only models (prompts with images then raise).
    name: display name (defaults to ``model``).
    """

    api = True
    exact_option_logits = False  # top_logprobs of the first generated token, not the full vocabulary

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        max_concurrency: int = 8,
        max_retries: int = 5,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        max_retry_after: float = 300.0,
        timeout: float = 120.0,
        cache_dir: str | os.PathLike | None = None,
        seed: int | None = None,
        assistant_prefix_mode: str = "user",
        top_logprobs: int = 20,
        variant_merge: str = "logsumexp",
        max_tokens_field: str = "max_tokens",
        extra_body: dict | None = None,
        completions_echo: bool = False,
        supports_images: bool = True,
        name: str | None = None,
    ):
        if not base_url:
            raise ValueError("base_url is required, e.g. 'http://127.0.0.1:8000/v1'")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if assistant_prefix_mode not in _ASSISTANT_PREFIX_MODES:
            raise ValueError(f"assistant_prefix_mode must be one of {_ASSISTANT_PREFIX_MODES}, got {assistant_prefix_mode!r}")
        if variant_merge not in ("logsumexp", "max"):
            raise ValueError(f"variant_merge must be 'logsumexp' or 'max', got {variant_merge!r}")
        extra_body = dict(extra_body or {})
        bad = [k for k in _PROTECTED_FIELDS if k in extra_body]
        if bad:
            raise ValueError(f"extra_body may not set {bad}: temperature is always 0 and the backend builds model/messages itself")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY") or None
        remember(self.api_key)  # masked wherever it could show (mmfragile.redaction)
        remember_url(self.base_url)
        self.max_concurrency = int(max_concurrency)
        self.max_retries = int(max_retries)
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self.max_retry_after = float(max_retry_after)
        self.timeout = float(timeout)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.seed = seed
        self.assistant_prefix_mode = assistant_prefix_mode
        self.top_logprobs = int(top_logprobs)
        self.variant_merge = variant_merge
        self.max_tokens_field = max_tokens_field
        self.extra_body = extra_body
        self.completions_echo = bool(completions_echo)
        self.supports_images = bool(supports_images)
        self.name = name or model
        # loopback servers (vLLM, llama.cpp on this machine) never go through an HTTP(S)_PROXY
        host = (urllib.parse.urlsplit(self.base_url).hostname or "").lower()
        self._loopback = host in ("localhost", "::1") or host.startswith("127.")
        #: replaceable for tests (records backoff delays without waiting); may return an awaitable
        self._sleep: Callable[[float], Any] = asyncio.sleep
        self._rng = random.Random(0)
        self._lock = threading.Lock()
        # one event loop thread per instance runs every request: the client, the connection pool and the
        # concurrency limit live there, so the limit holds across threads calling generate() at once
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._slots: asyncio.Semaphore | None = None
        #: counters: HTTP attempts made, cache hits, retries performed
        self.n_http_requests = 0
        self.n_cache_hits = 0
        self.n_retries = 0
        self._cache_problems: list[str] = []  # found on the loop thread, warned about in the caller's

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={redact(self.base_url)!r}, model={self.model!r})"

    # ---------------------------------------------------------------- request plumbing

    def _base_body(self) -> dict:
        body: dict[str, Any] = dict(self.extra_body)
        body["model"] = self.model
        body["temperature"] = 0
        if self.seed is not None:
            body["seed"] = self.seed
        return body

    def _chat_body(self, prompt: Prompt, max_tokens: int) -> dict:
        if prompt.images and not self.supports_images:
            raise ValueError(f"{self.name} is text-only (supports_images=False) but a prompt has {len(prompt.images)} image(s)")
        body = self._base_body()
        body["messages"] = build_messages(prompt, self.assistant_prefix_mode)
        body[self.max_tokens_field] = int(max_tokens)
        if prompt.assistant_prefix and self.assistant_prefix_mode == "continue":
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        return body

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        with self._lock:
            jitter = self._rng.uniform(0.5, 1.0)
        return min(self.backoff_max, self.backoff_base * (2 ** attempt)) * jitter

    # -- the event loop thread and the official client
    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=f"mmfragile-api-{self.name}", daemon=True).start()
                self._loop = loop
            return self._loop

    def _run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._event_loop()).result()

    def _ensure_client(self) -> Any:
        """The AsyncOpenAI client (created on the loop thread, where it is used). Its own retries are off: the
        retry policy above (Retry-After honoured and capped, exponential backoff) is the one that applies."""
        if self._client is None:
            try:
                import openai
            except ImportError as e:
                raise ImportError("the OpenAI-compatible backend needs the official client: pip install "
                                  "openai==3.51.0 (in requirements.txt)") from e

            # a key in the URL's query (``?key=``, as some APIs take it) goes with every request, not into the path
            parts = urllib.parse.urlsplit(self.base_url)
            self._client = openai.AsyncOpenAI(
                base_url=urllib.parse.urlunsplit(parts._replace(query="")), api_key=self.api_key or "none",
                default_query=dict(urllib.parse.parse_qsl(parts.query)) or None, max_retries=0, timeout=self.timeout,
                http_client=openai.DefaultAsyncHttpx2Client(trust_env=False) if self._loopback else None)
            self._slots = asyncio.Semaphore(self.max_concurrency)
        return self._client

    def close(self) -> None:
        """Close the HTTP client and stop the loop thread (a later call starts them again)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._client.close(), loop).result()
            self._client = None
        loop.call_soon_threadsafe(loop.stop)

    async def _attempt(self, url: str, endpoint: str, body: dict) -> dict:
        """One HTTP POST through the client; the decoded JSON, or APIError (``retryable`` set)."""
        client = self._ensure_client()
        import httpx2  # noqa: E402 - after _ensure_client, which explains a missing openai package
        import openai
        with self._lock:
            self.n_http_requests += 1
        # no key: send no Authorization header at all (local servers), as the client allows when asked explicitly
        options = {} if self.api_key else {"headers": {"Authorization": openai.Omit()}}
        try:
            resp = await client.post(f"/{endpoint}", cast_to=httpx2.Response, body=body, options=options)
        except openai.APIStatusError as e:
            text = e.response.text
            raise APIError(
                f"HTTP {e.status_code} from {url}: {text.strip() or e.message}",
                status=e.status_code, url=url, body=text, retryable=e.status_code in RETRYABLE_STATUS,
                retry_after=_parse_retry_after(e.response.headers.get("retry-after"))) from None
        except openai.APIConnectionError as e:  # refused / reset / timeout
            reason = e.__cause__ or e
            raise APIError(f"connection error for {url}: {type(reason).__name__}: {reason}",
                           status=None, url=url, body=str(reason), retryable=True) from None
        status, text = resp.status_code, resp.text
        try:
            out = json.loads(text)
        except json.JSONDecodeError:
            raise APIError(f"HTTP {status} from {url}: response is not JSON: {text[:500]!r}",
                           status=status, url=url, body=text) from None
        if not isinstance(out, dict):
            raise APIError(f"HTTP {status} from {url}: expected a JSON object, got {type(out).__name__}",
                           status=status, url=url, body=text)
        if "error" in out and "choices" not in out:  # some servers report errors with status 200
            raise APIError(f"HTTP {status} from {url}: server error: {_canonical_json(out['error'])}",
                           status=status, url=url, body=text)
        return out

    async def _post(self, endpoint: str, body: dict, stop: asyncio.Event) -> dict:
        """POST with retries, through the disk cache. ``stop`` is set by the first request of a batch that fails
        for good; requests of that batch not yet sent are then not sent (:class:`_Aborted`)."""
        key = request_cache_key(endpoint, body) if self.cache_dir is not None else None
        if key is not None:
            hit = self._cache_read(key)
            if hit is not None:
                with self._lock:
                    self.n_cache_hits += 1
                return hit
        url = f"{self.base_url}/{endpoint}"
        self._ensure_client()
        attempt = 0
        while True:
            async with self._slots:  # the limit holds across concurrent generate/option_logits calls
                if stop.is_set():
                    raise _Aborted()
                try:
                    out = await self._attempt(url, endpoint, body)
                    break
                except APIError as e:
                    e.attempts = attempt + 1
                    if not e.retryable or attempt >= self.max_retries:
                        stop.set()  # before the slot is released: no sibling request starts after a failure
                        if e.retryable:
                            e.args = (f"{e.args[0]} (gave up after {attempt + 1} attempt(s))",)
                        raise
                    delay = self._backoff(attempt, e.retry_after)
            with self._lock:
                self.n_retries += 1
            waited = self._sleep(delay)  # outside the slot: a backing-off request holds no concurrency
            if inspect.isawaitable(waited):
                await waited
            attempt += 1
        if key is not None:
            self._cache_write(key, endpoint, body, out)
        return out

    def _post_many(self, endpoint: str, bodies: Sequence[dict]) -> list[dict]:
        """The responses to ``bodies``, in order, with up to ``max_concurrency`` requests in flight. The first
        failure (in input order) is raised once the requests in flight have ended; requests not yet sent by then
        are not sent."""
        if not bodies:
            return []

        async def batch() -> list:
            stop = asyncio.Event()
            results = await asyncio.gather(*(self._post(endpoint, b, stop) for b in bodies), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException) and not isinstance(r, _Aborted):
                    raise r
            return results

        try:
            return self._run(batch())
        finally:
            with self._lock:
                problems, self._cache_problems = self._cache_problems, []
            for msg in problems:
                warnings.warn(msg, CorruptCacheWarning, stacklevel=3)

    def _cache_path(self, key: str) -> Path:
        assert self.cache_dir is not None
        return self.cache_dir / f"{key}.json"

    def _cache_problem(self, msg: str) -> None:
        with self._lock:
            self._cache_problems.append(msg)

    def _cache_read(self, key: str) -> dict | None:
        """The cached response, or None: no file (a miss), or a file that cannot be used - corrupt, truncated,
        another request's entry, unreadable - which is reported (:class:`CorruptCacheWarning`) and requested
        again (the new reply overwrites it)."""
        path = self._cache_path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._cache_problem(f"{path}: cannot read cache file ({type(e).__name__}: {e}); requesting again")
            return None
        try:
            rec = json.loads(data.decode("utf-8"))
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            problem = f"not valid JSON ({e}; {len(data)} bytes - truncated?)"
        else:
            if not isinstance(rec, dict) or not isinstance(rec.get("response"), dict):
                problem = "no response object in it"
            elif rec.get("key", key) != key:
                problem = f"it holds the entry of another request (key {str(rec.get('key'))[:16]}...)"
            else:
                return rec["response"]
        self._cache_problem(f"{path}: corrupt cache file ({problem}); requesting again (the reply overwrites it)")
        return None

    def _cache_write(self, key: str, endpoint: str, body: dict, response: dict) -> None:
        path = self._cache_path(key)
        rec = {"key": key, "endpoint": endpoint, "request": _hash_data_urls(body), "response": response}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(rec, f, ensure_ascii=False, sort_keys=True)
            os.replace(tmp, path)
        except OSError as e:  # a full disk, say: the reply is good, only the cache misses it
            try:
                tmp.unlink()
            except OSError:
                pass
            self._cache_problem(f"{path}: cannot write cache file ({type(e).__name__}: {e}); the reply is used "
                                "but not cached")

    # ---------------------------------------------------------------- response parsing

    @staticmethod
    def _first_choice(out: dict, url: str) -> dict:
        choices = out.get("choices")
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise APIError(f"response from {url} has no choices: {_canonical_json(out)[:500]}",
                           status=200, url=url, body=_canonical_json(out))
        return choices[0]

    def _strip_echoed_prefix(self, text: str, prefix: str) -> str:
        if self.assistant_prefix_mode != "user" or not prefix.strip():
            return text
        p = prefix.strip()
        s = text.lstrip()
        if s.startswith(p):
            return s[len(p):].lstrip(" ")
        return text

    # ---------------------------------------------------------------- MLLM interface

    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 16) -> list[str]:
        """Greedy (``temperature=0``) reply for each prompt, in prompt order.

        With ``assistant_prefix_mode="user"`` a reply that starts by repeating the assistant prefix
        has that repetition removed (the prefix was asked for in the user turn).
        """
        url = f"{self.base_url}/chat/completions"
        bodies = [self._chat_body(p, max_new_tokens) for p in prompts]

        outs = self._post_many("chat/completions", bodies)

        def one(i: int) -> str:
            choice = self._first_choice(outs[i], url)
            msg = choice.get("message") or {}
            content = msg.get("content")
            refusal = msg.get("refusal")
            if isinstance(content, list):  # some servers return content parts (text, refusal)
                parts = [c for c in content if isinstance(c, dict)]
                texts = [c["text"] for c in parts if isinstance(c.get("text"), str) and c.get("type") != "refusal"]
                refusal = refusal or " ".join(str(c.get("refusal") or "") for c in parts if c.get("type") == "refusal")
                content = "".join(texts) if texts else None
            if not content and (content is None or refusal or msg.get("tool_calls") or msg.get("function_call")):
                return NoOutput(self._no_output_reason(choice, msg, refusal))
            return self._strip_echoed_prefix(content, prompts[i].assistant_prefix or "")

        raws = [one(i) for i in range(len(bodies))]
        empty = [r for r in raws if isinstance(r, NoOutput)]
        if empty:
            warnings.warn(f"{self.name}: {len(empty)} of {len(raws)} replies carried no text (first: "
                          f"{empty[0].reason}); recorded as unparseable outputs {NoOutput.PREFIX.strip()!r} with the "
                          "reason, out of coverage", stacklevel=2)
        return raws

    @staticmethod
    def _no_output_reason(choice: dict, msg: dict, refusal: Any) -> str:
        """Why a reply has no text: ``refusal: <text>``, ``tool_calls: <names>``, ``finish_reason: <reason>``."""
        if isinstance(refusal, str) and refusal.strip():
            return "refusal: " + " ".join(refusal.split())
        calls = msg.get("tool_calls")
        if calls:
            names = [str((c.get("function") or {}).get("name") or c.get("type") or "?") if isinstance(c, dict) else "?"
                     for c in (calls if isinstance(calls, list) else [calls])]
            return "tool_calls: " + ", ".join(names)
        if msg.get("function_call"):
            fc = msg["function_call"]
            return "function_call: " + str(fc.get("name") if isinstance(fc, dict) else fc)
        finish = choice.get("finish_reason")
        return f"finish_reason: {finish}" if finish else "content: null"

    @staticmethod
    def _top_alternatives(choice: dict) -> list[tuple[str, float]] | None:
        """(token, logprob) alternatives for the first generated token, from either the chat
        format (``logprobs.content[0].top_logprobs``) or the legacy completions format
        (``logprobs.top_logprobs[0]`` as a dict)."""
        lp = choice.get("logprobs")
        if not isinstance(lp, dict):
            return None
        content = lp.get("content")
        if isinstance(content, list) and content:
            first = content[0]
            alts = [(t["token"], float(t["logprob"])) for t in first.get("top_logprobs") or []
                    if t.get("token") is not None and t.get("logprob") is not None]
            if first.get("token") is not None and first.get("logprob") is not None:
                alts.append((first["token"], float(first["logprob"])))
            return alts
        top = lp.get("top_logprobs")
        if isinstance(top, list) and top and isinstance(top[0], dict):
            alts = [(t, float(v)) for t, v in top[0].items() if v is not None]
            toks, tlps = lp.get("tokens"), lp.get("token_logprobs")
            if toks and tlps and tlps[0] is not None:
                alts.append((toks[0], float(tlps[0])))
            return alts
        return None

    def option_logits(self, prompts: Sequence[Prompt], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Approximate first-token log-probs of each candidate, from the API's top-k logprobs.

        One request per prompt (``logprobs=true, top_logprobs=self.top_logprobs, max_tokens=1``).
        Candidate ``c`` matches a returned token ``t`` iff ``t.strip() == c.strip()`` (exact,
        case-sensitive); several matching tokens merge per ``variant_merge``; unmatched candidates
        get ``-inf``. The values are log-probabilities, i.e. logits up to a per-prompt constant;
        this is an approximation limited by the API (only top-k visible, multi-token candidates
        only match if the whole string is one token).
        """
        if len(prompts) != len(candidates):
            raise ValueError(f"{len(prompts)} prompts but {len(candidates)} candidate lists")
        url = f"{self.base_url}/chat/completions"
        bodies = []
        for p in prompts:
            body = self._chat_body(p, 1)
            body["logprobs"] = True
            body["top_logprobs"] = self.top_logprobs
            bodies.append(body)

        outs = self._post_many("chat/completions", bodies)

        def one(i: int) -> np.ndarray:
            out = outs[i]
            alts = self._top_alternatives(self._first_choice(out, url))
            if alts is None:
                raise APIError(
                    f"response from {url} has no logprobs (does the server support logprobs/top_logprobs?): "
                    f"{_canonical_json(out)[:500]}", status=200, url=url, body=_canonical_json(out))
            by_text: dict[str, dict[str, float]] = {}
            for tok, lp in alts:  # dedupe identical tokens (chosen token repeated in top-k)
                by_text.setdefault(tok.strip(), {})[tok] = lp
            scores = []
            for c in candidates[i]:
                vals = list(by_text.get(str(c).strip(), {}).values())
                if not vals:
                    scores.append(-math.inf)
                elif self.variant_merge == "max":
                    scores.append(max(vals))
                else:
                    scores.append(_logsumexp(vals))
            return np.asarray(scores, dtype=float)

        return [one(i) for i in range(len(bodies))]

    @staticmethod
    def render_plain(prompt: Prompt) -> str:
        """Plain-text rendering of a text-only prompt for ``/completions`` scoring:
        ``[system + "\\n\\n"] + text + ["\\n" + assistant_prefix]``."""
        s = f"{prompt.system}\n\n" if prompt.system else ""
        s += prompt.text
        if prompt.assistant_prefix:
            s += f"\n{prompt.assistant_prefix}"
        return s

    def loglikelihood(self, prompts: Sequence[Prompt], continuations: Sequence[str]) -> list[LogLik]:
        """Not available through chat APIs (they return no prompt log-probabilities).

        With ``completions_echo=True`` (servers such as vLLM): text-only prompts are rendered with
        :meth:`render_plain` (no chat template), ``context + continuation`` is sent to
        ``/completions`` with ``echo=true, logprobs=1, max_tokens=1`` (``max_tokens=0`` is rejected by
        some servers), and the log-probs of the echoed tokens that end after the context and start
        inside the sent text (``text_offset + len(token) > len(context)`` and ``text_offset <
        len(context + continuation)``; a token straddling the boundary counts towards the
        continuation; the one generated token is ignored) are summed.
        """
        if not self.completions_echo:
            raise NotImplementedError(
                f"{self.name}: loglikelihood needs prompt log-probabilities, which OpenAI-compatible chat "
                "APIs do not return. Use option_logits / generate, or pass completions_echo=True if the "
                "server supports echo=true on /completions (e.g. vLLM; text-only prompts).")
        if len(prompts) != len(continuations):
            raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
        url = f"{self.base_url}/completions"
        jobs = []
        for p, cont in zip(prompts, continuations):
            if p.images:
                raise ValueError(f"{self.name}: loglikelihood via /completions is text-only, but a prompt has images")
            ctx = self.render_plain(p)
            body = self._base_body()
            body.update({"prompt": ctx + cont, "echo": True, "logprobs": 1, self.max_tokens_field: 1})
            jobs.append((len(ctx), len(ctx + cont), body))

        outs = self._post_many("completions", [body for _, _, body in jobs])

        def one(i: int) -> LogLik:
            ctx_len, full_len, _ = jobs[i]
            out = outs[i]
            lp = self._first_choice(out, url).get("logprobs") or {}
            toks, tlps, offs = lp.get("tokens"), lp.get("token_logprobs"), lp.get("text_offset")
            if not toks or tlps is None or offs is None:
                raise APIError(f"response from {url} has no echoed token logprobs (echo unsupported?): "
                               f"{_canonical_json(out)[:500]}", status=200, url=url, body=_canonical_json(out))
            total, n = 0.0, 0
            for tok, tlp, off in zip(toks, tlps, offs):
                if off + len(tok) > ctx_len and off < full_len:
                    if tlp is None:
                        raise APIError(f"response from {url}: continuation token {tok!r} has no logprob",
                                       status=200, url=url, body=_canonical_json(out))
                    total += float(tlp)
                    n += 1
            return LogLik(logprob=total, n_tokens=n)

        return [one(i) for i in range(len(jobs))]
