"""Secrets never leave the process: one redaction for everything that records or shows a model spec.

A secret is a model argument named secret (``api_key``, and any argument a backend declares in
:attr:`~mmfragile.models.spec.Backend.secrets`), a credential in a URL (``https://user:pass@host``, a
``?api_key=`` / ``?key=`` / ``?token=`` query parameter) or the value of a key variable (``$OPENAI_API_KEY``).
:func:`redact` replaces each by :data:`MARK` in a text, :func:`redact_obj` in every string of a JSON-like object.
Spec strings, config.json, provenance, reports, exports, error lines and logged arguments all pass through them.

Besides the patterns, every secret value this process has seen (:func:`remember`: a spec's secret arguments, a
URL's credentials) is masked wherever it appears - in an error a server or library writes back, say.
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any, Iterable
from urllib.parse import urlsplit

#: what a secret is replaced by
MARK = "***"
#: model arguments that are secrets for every backend (a backend adds its own: Backend.secrets)
SECRET_ARGS: set[str] = {"api_key"}
#: environment variables that hold keys (read by the API backends)
SECRET_ENV = ("OPENAI_API_KEY",)
#: URL query parameters that carry credentials
SECRET_QUERY = ("api_key", "apikey", "api-key", "key", "token", "access_token", "auth")
#: secret values shorter than this are not searched for as plain text (they would mask ordinary words)
MIN_SECRET_LEN = 6

_seen: set[str] = set()
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<info>[^/\s@?#]+)@")
# a query value ends at "&", "#", a quote, a space - or "::", which ends the URL of an openai spec
_QUERY = re.compile(r"(?P<k>[?&](?:" + "|".join(map(re.escape, SECRET_QUERY)) + r")=)"
                    r"(?P<v>(?:(?!::)[^&#\s'\",)])+)", re.IGNORECASE)


def declare_secret_args(names: Iterable[str]) -> None:
    """Add model arguments a backend declares secret (:class:`~mmfragile.models.spec.Backend` calls it)."""
    SECRET_ARGS.update(names)


def is_secret_arg(name: str) -> bool:
    return name in SECRET_ARGS


def remember(value: Any) -> None:
    """Mask ``value`` wherever it shows for the rest of this process (long enough values only)."""
    if isinstance(value, str) and len(value) >= MIN_SECRET_LEN and value != MARK:
        _seen.add(value)


def remember_url(url: str) -> None:
    """Remember the credentials of a URL: its user info and its secret query parameters."""
    parts = urlsplit(url)
    for secret in (parts.password, parts.username if parts.password is None else None):
        remember(secret)
    for m in _QUERY.finditer(url):
        remember(m["v"])


def _arg_pattern() -> re.Pattern:
    return _compiled_arg_pattern(frozenset(SECRET_ARGS))


@functools.lru_cache(maxsize=8)
def _compiled_arg_pattern(secret_args: frozenset[str]) -> re.Pattern:
    # "api_key=VALUE" as spec strings, --model-args and run hints write it; "api_key": "VALUE" as JSON does
    names = "|".join(map(re.escape, sorted(secret_args)))
    return re.compile(rf"(?P<k>\b(?:{names})(?:=|[\"']?\s*:\s*[\"']?))(?!\*\*\*)(?P<v>[^\s,'\"}}&)]+)")


def redact(text: Any) -> str:
    """``text`` with every secret replaced by :data:`MARK` (a non-string is turned into a string first)."""
    out = str(text)
    out = _USERINFO.sub(lambda m: m["scheme"] + MARK + "@", out)
    out = _QUERY.sub(lambda m: m["k"] + MARK, out)
    out = _arg_pattern().sub(lambda m: m["k"] + MARK, out)
    values = _seen | {v for v in (os.environ.get(k) for k in SECRET_ENV) if v and len(v) >= MIN_SECRET_LEN}
    for value in sorted(values, key=len, reverse=True):  # a longer secret before any secret inside it
        out = out.replace(value, MARK)
    return out


def without_credentials(text: Any) -> str:
    """``text`` with URL credentials left out altogether (user info, secret query parameters), masked or not:
    what a model's identity holds, so that a key - given, changed or masked - is not a model change."""
    text = str(text)
    out = _QUERY.sub(lambda m: m["k"][0], _USERINFO.sub(lambda m: m["scheme"], text))  # "?key=V&x=1" -> "?&x=1"
    if out == text:
        return out
    out = re.sub(r"\?&+", "?", re.sub(r"&{2,}", "&", out))  # the separators a left-out parameter leaves
    return re.sub(r"[?&](?=::|\s|$)", "", out)


def redact_obj(obj: Any) -> Any:
    """A JSON-like object with every string redacted and every secret argument's value replaced by :data:`MARK`."""
    if isinstance(obj, dict):
        return {k: (MARK if is_secret_arg(str(k)) and obj[k] is not None else redact_obj(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v) for v in obj)
    return redact(obj) if isinstance(obj, str) else obj
