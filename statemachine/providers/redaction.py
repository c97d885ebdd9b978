"""Keeping API keys out of error texts and logs: the library's one redaction.

``redact(text, secrets)`` replaces each secret, and the pieces of it that providers
echo, by ``[REDACTED]``; the adapters' errors (``_errors``) and the ``run`` command's
console use it.

``RedactSecrets`` is a structlog processor. The library never configures structlog;
an application that logs provider activity adds this processor to its own chain (the
``run`` command does), so that a key that reaches an event by any route (an error
text that echoes it, a header, a repr) is replaced before anything is rendered.

``protect_secret`` covers the standard-library logging of the layers below us: at
DEBUG level the HTTP stack logs response headers, which a server may have filled
with the key. Each adapter registers its key, and a filter on the loggers of the
SDKs and of their HTTP stack redacts it from every record they create (the SDKs
filter their own loggers the same way, for request headers). Nothing is emitted,
and no level or handler is touched.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

__all__ = ["RedactSecrets", "protect_secret", "redact"]

_FRAGMENT = 8  # a key's pieces this long or longer are secret too


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (of a useful length) replaced by ``[REDACTED]``.

    A secret of 8 characters or more is also removed where only a piece of it (8
    characters or more) appears: providers echo keys half-masked
    (``"sk-abc123...wxyz"``), and servers cut them into URLs and headers.
    """
    for secret in secrets:
        # A one-character "secret" would shred the text and protect nothing.
        if not secret or len(secret) < 4:
            continue
        if len(secret) < _FRAGMENT:
            text = text.replace(secret, "[REDACTED]")
        else:
            text = _redact_fragments(text, secret)
    return text


@functools.lru_cache(maxsize=16)
def _fragments(secret: str) -> frozenset[str]:
    return frozenset(secret[i : i + _FRAGMENT] for i in range(len(secret) - _FRAGMENT + 1))


def _redact_fragments(text: str, secret: str) -> str:
    spans: list[tuple[int, int]] = []
    for fragment in _fragments(secret):
        # str.find runs in C: cheap even for long texts with nothing to hide.
        at = text.find(fragment)
        while at != -1:
            spans.append((at, at + _FRAGMENT))
            at = text.find(fragment, at + 1)
    if not spans:
        return text
    spans.sort()
    out: list[str] = []
    kept = 0  # text[:kept] has been written or redacted
    for start, end in spans:
        if not out or start > kept:
            out += (text[kept:start], "[REDACTED]")
        kept = max(kept, end)
    out.append(text[kept:])
    return "".join(out)


_PROTECTED: set[str] = set()
_LIBRARIES = ("httpx2", "httpcore2", "openai", "anthropic", "google_genai", "botocore", "boto3")


class _RedactRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is logging's to report
            return True
        cleaned = redact(message, _PROTECTED)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


_FILTER = _RedactRecords()


def protect_secret(secret: str) -> None:
    """Redact ``secret`` from the log records of the SDKs and their HTTP stack.

    A logger's filter sees only the records created on that very logger, so the
    filter goes on each of theirs that exists (they are made when those modules are
    imported, which an adapter has done before it calls this).
    """
    _PROTECTED.add(secret)
    names = [*logging.Logger.manager.loggerDict, *_LIBRARIES]
    for name in names:
        if name.split(".")[0] in _LIBRARIES:
            logger = logging.getLogger(name)
            if _FILTER not in logger.filters:
                logger.addFilter(_FILTER)


_SENSITIVE_KEYS = frozenset({"api_key", "apikey", "authorization", "x-api-key", "token"})


class RedactSecrets:
    """Replace each secret, wherever it occurs in an event, by ``[REDACTED]``; values
    under keys such as ``api_key`` or ``authorization`` are redacted whole."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = tuple(s for s in secrets if s)

    def _clean(self, value: Any) -> Any:
        if isinstance(value, str):
            return redact(value, self.secrets)
        if isinstance(value, Mapping):
            return {
                k: "[REDACTED]" if str(k).lower() in _SENSITIVE_KEYS else self._clean(v)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            return type(value)(self._clean(v) for v in value)
        if isinstance(value, BaseException):
            return redact(f"{type(value).__name__}: {value}", self.secrets)
        return value

    def __call__(
        self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key in list(event_dict):
            if key.lower() in _SENSITIVE_KEYS:
                event_dict[key] = "[REDACTED]"
            else:
                event_dict[key] = self._clean(event_dict[key])
        return event_dict
