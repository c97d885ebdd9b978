"""The errors a provider adapter raises, and the classification that picks them.

An adapter's ``complete`` raises only when it has given up, and the driver turns any
exception into one ``Failed`` run. So the class of the exception is for callers who
use an adapter directly (a compaction loop catches ``ContextOverflowError``), and its
text is for people: the driver puts ``"<ClassName>: <text>"`` into the run's
explanation. Every text here therefore says what happened and what to do about it.

``classify`` is provider-neutral: each adapter extracts the HTTP status, headers and
error body from its SDK's exception and hands them over. Mid-stream errors carry no
useful status (the HTTP status was 200), so the error *type* in the body counts as
much as the status.
"""

from __future__ import annotations

import email.utils
import itertools
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping

import attrs

from statemachine.core.explanations import sentence
from statemachine.errors import (
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderRequestError,
    ProviderUnavailableError,
)
from statemachine.providers.redaction import redact

__all__ = [
    "Failure",
    "RedactedCauseError",
    "classify",
    "missing_extra",
    "parse_retry_after",
    "redacted_chain",
]


class RedactedCauseError(Exception):
    """Stands in for an SDK exception in a ``ProviderError``'s chain: the original's
    type and text with every secret removed (SDK texts can echo the key)."""


def missing_extra(extra: str) -> ImportError:
    """The one message for an adapter whose SDK is not installed."""
    return ImportError(
        f"the {extra!r} SDK is not installed; the {extra} adapter needs it: "
        f"pip install 'agent-statemachine[{extra}]'"
    )


@attrs.frozen
class Failure:
    """What one failed attempt means: the error to raise, whether a retry may help,
    and how long the provider asked us to wait."""

    error: ProviderError
    retryable: bool
    retry_after: float | None = None


# Context overflow is reported as a plain 400 by every provider; only the text tells.
# The patterns cover OpenAI, Anthropic, Gemini, Bedrock, and the common
# OpenAI-compatible servers.
_OVERFLOW = re.compile(
    r"context[_ ]length[_ ]exceeded"
    r"|exceeds the maximum number of tokens"
    r"|maximum context length"
    r"|prompt is too long"
    r"|exceeds? the (?:available )?context"
    r"|context window"
    r"|too many tokens"
    r"|input is too long",
    re.IGNORECASE,
)
_RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
_RETRYABLE_TYPES = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "server_error", "timeout_error"}
)
_AUTH_TYPES = frozenset({"authentication_error", "permission_error", "invalid_api_key"})

NOT_FOUND = (
    "Nothing was found at that address: base_url or the model name is most likely wrong "
    "(an OpenAI-compatible server's base_url usually ends in /v1, without "
    "/chat/completions); retrying will not help."
)
"""What an HTTP 404 means for an adapter that takes a ``base_url``."""


def redacted_chain(exc: BaseException, secrets: Iterable[str]) -> RedactedCauseError:
    """A copy of ``exc``'s chain (``__cause__``, else unsuppressed ``__context__``) in
    which each exception is a ``RedactedCauseError`` naming the original's type and text.

    The copies carry no tracebacks: a traceback keeps frames alive whose locals (the
    request headers) hold the key, and tools that render locals would show it.
    """
    keys = tuple(secrets)
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 16 and all(c is not current for c in chain):
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    copies = [RedactedCauseError(redact(_describe(e), keys)) for e in chain]
    for copy, cause in itertools.pairwise(copies):
        copy.__cause__ = cause
    return copies[0]


def _describe(exc: BaseException) -> str:
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the error
        text = "(its text could not be read)"
    return f"{kind}: {text}" if text else kind


def parse_retry_after(
    headers: Mapping[str, str], *, now: Callable[[], float] = time.time
) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` or ``retry-after`` (seconds or an
    HTTP date); ``None`` when absent or unusable."""
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - now())
    return value if math.isfinite(value) and value >= 0 else None


def error_details(body: object) -> tuple[str | None, str | None, str | None]:
    """``(type, code, message)`` from an error body in either provider's shape
    (``{"error": {...}}`` or the inner object itself)."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            body = inner
    if not isinstance(body, Mapping):
        return None, None, body if isinstance(body, str) and body else None
    kind, code, message = body.get("type"), body.get("code"), body.get("message")
    return (
        kind if isinstance(kind, str) else None,
        str(code) if isinstance(code, (str, int)) else None,
        message if isinstance(message, str) else None,
    )


def classify(
    provider: str,
    *,
    status: int | None,
    headers: Mapping[str, str],
    body: object,
    message: str,
    key_hint: str,
    secrets: Iterable[str] = (),
    not_found: str = NOT_FOUND,
) -> Failure:
    """Decide what an HTTP-level failure means.

    ``status`` is ``None`` for an error reported inside a stream and for connection
    failures; ``key_hint`` names where the key comes from (for the auth message);
    ``not_found`` says what an HTTP 404 most likely means for this provider.
    """
    kind, code, body_message = error_details(body)
    text = _shorten(redact(body_message or message or "no error message", secrets))
    where = f"{provider} returned HTTP {status}" if status else f"{provider} reported an error"
    detail = f"{where}: {text}"
    if code == "context_length_exceeded" or (
        (status in (None, 400, 413, 422) or kind == "invalid_request_error")
        and _OVERFLOW.search(text)
    ):
        return Failure(
            ContextOverflowError(
                f"{sentence(detail)} The conversation no longer fits the model's context "
                "window; compact or truncate the history and try again."
            ),
            retryable=False,
        )
    if status in (401, 403) or kind in _AUTH_TYPES or code in _AUTH_TYPES:
        return Failure(
            ProviderAuthError(
                f"{sentence(detail)} Authentication or permission failed; check {key_hint} "
                "(retrying will not help)."
            ),
            retryable=False,
        )
    if (status is not None and (status in _RETRYABLE_STATUS or status >= 500)) or (
        kind in _RETRYABLE_TYPES
    ):
        return Failure(
            ProviderUnavailableError(detail), retryable=True, retry_after=parse_retry_after(headers)
        )
    if status == 404:
        return Failure(ProviderRequestError(f"{sentence(detail)} {not_found}"), False)
    return Failure(
        ProviderRequestError(f"{sentence(detail)} The request was refused as invalid."), False
    )


def validation_detail(exc: BaseException) -> str:
    """The SDK's validation message plus the first lines of pydantic's reason."""
    text = str(exc)
    cause = exc.__cause__
    if cause is not None:
        lines = str(cause).splitlines()[:3]
        text = f"{text} ({'; '.join(line.strip() for line in lines)})"
    return text[:600]


def connection_failure(where: str, exc: BaseException, secrets: Iterable[str]) -> Failure:
    """A request that got no response at all; ``where`` names the URL and the model.

    A refused connection is not retried: nothing listens at that address, which a few
    seconds of backoff will not change (an overloaded provider answers 503 instead).
    Anything else (reset, dropped, cut off mid-stream) is retryable.
    """
    text = str(exc).rstrip().rstrip(".") or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause):
        # The SDK's own text ("Connection error.") says little; its cause says what.
        text = f"{text} ({type(cause).__name__}: {cause})"
    text = _shorten(redact(text, secrets))
    if _refused(exc):
        return Failure(
            ProviderUnavailableError(
                f"could not connect to {where}: the connection was refused ({text}). "
                "Is the server running, and is base_url right?"
            ),
            retryable=False,
        )
    return Failure(ProviderUnavailableError(f"could not reach {where}: {text}"), retryable=True)


MAX_ERROR_TEXT = 2000  # characters of a provider's own error text kept in ours


def _shorten(text: str) -> str:
    """``text`` cut to ``MAX_ERROR_TEXT``: a server's error body can be megabytes, and
    ours ends up in explanations, journals and logs. No trailing full stop: ours follow
    with ``sentence``, which adds one where the text has no mark of its own."""
    text = text.strip().rstrip(".")
    if len(text) > MAX_ERROR_TEXT:
        text = f"{text[:MAX_ERROR_TEXT]}\u2026 ({len(text) - MAX_ERROR_TEXT} more characters)"
    return text


def _refused(exc: BaseException) -> bool:
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 16:
        if isinstance(current, ConnectionRefusedError):
            return True
        seen += 1
        current = current.__cause__ or current.__context__
    return False
