"""Provider error classification, Retry-After parsing, the retry policy and redaction.

These are the provider-neutral pieces both adapters share; the adapter tests show
them at work against the real SDKs.
"""

from __future__ import annotations

import asyncio
import email.utils

import pytest
import structlog

import statemachine as sm
from statemachine import InvalidInputError
from statemachine.core import explanations
from statemachine.core.abort import AbortController
from statemachine.providers import (
    ContextOverflowError,
    ProviderAuthError,
    ProviderError,
    ProviderRequestError,
    ProviderUnavailableError,
    RetryPolicy,
)
from statemachine.providers._errors import (
    Failure,
    classify,
    connection_failure,
    parse_retry_after,
)
from statemachine.providers._retry import complete_with_retries
from statemachine.providers.redaction import redact

NOW = 1_764_681_600.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After-Ms": "250", "Retry-After": "9"}, 0.25),
        ({"retry-after": "2"}, 2.0),
        ({"Retry-After": "0.5"}, 0.5),
        ({"retry-after": email.utils.formatdate(NOW + 30, usegmt=True)}, 30.0),
        ({"retry-after": email.utils.formatdate(NOW - 30, usegmt=True)}, 0.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-3"}, None),
        ({"retry-after-ms": "nan", "retry-after": "4"}, 4.0),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, now=lambda: NOW) == expected


def body(message: str, kind: str | None = None, code: str | None = None) -> dict[str, object]:
    return {"type": "error", "error": {"type": kind, "code": code, "message": message}}


AUTH, DOWN = ProviderAuthError, ProviderUnavailableError
OVERFLOW, REFUSED = ContextOverflowError, ProviderRequestError


@pytest.mark.parametrize(
    ("status", "error_body", "error", "retryable"),
    [
        (401, body("bad key", "authentication_error"), AUTH, False),
        (403, body("forbidden"), AUTH, False),
        (None, body("no", "permission_error"), AUTH, False),  # inside a stream
        (429, body("slow down"), DOWN, True),
        (529, body("Overloaded", "overloaded_error"), DOWN, True),
        (503, "Service Unavailable", DOWN, True),
        (None, body("Overloaded", "overloaded_error"), DOWN, True),
        (408, None, DOWN, True),
        (400, body("too long", code="context_length_exceeded"), OVERFLOW, False),
        (400, body("prompt is too long: 9 tokens > 8", "invalid_request_error"), OVERFLOW, False),
        (400, body("the request exceeds the available context size"), OVERFLOW, False),
        (413, body("Request exceeds the maximum allowed number of bytes"), REFUSED, False),
        (400, body("Invalid 'tools[0].name'"), REFUSED, False),
        (404, body("model not found"), REFUSED, False),
    ],
)  # fmt: skip
def test_classify(
    status: int | None, error_body: object, error: type[ProviderError], retryable: bool
) -> None:
    failure = classify(
        "P", status=status, headers={}, body=error_body, message="fallback", key_hint="P_KEY"
    )
    assert type(failure.error) is error
    assert failure.retryable is retryable


def test_classify_explains_and_redacts() -> None:
    failure = classify(
        "OpenAI",
        status=401,
        headers={"retry-after": "1"},
        body={"error": {"message": "Incorrect API key provided: sk-abcdef123."}},
        message="ignored",
        key_hint="OPENAI_API_KEY",
        secrets=["sk-abcdef123"],
    )
    assert str(failure.error) == (
        "OpenAI returned HTTP 401: Incorrect API key provided: [REDACTED]. Authentication "
        "or permission failed; check OPENAI_API_KEY (retrying will not help)."
    )
    assert failure.retry_after is None  # auth failures are never retried, whatever the header


def test_classify_keeps_retry_after_for_retryable_failures() -> None:
    failure = classify(
        "A", status=429, headers={"retry-after": "7"}, body=None, message="", key_hint="K"
    )
    assert failure.retry_after == 7.0
    assert str(failure.error) == "A returned HTTP 429: no error message"


def test_redact_ignores_secrets_too_short_to_matter() -> None:
    assert redact("a key abc and sk-123456", ["abc", "sk-123456", ""]) == "a key abc and [REDACTED]"


def test_backoff_grows_is_capped_and_jitters_upwards() -> None:
    policy = RetryPolicy(initial_delay=1.0, multiplier=3.0, max_delay=5.0, jitter=0.5)
    assert [policy.backoff(n, lambda: 0.0) for n in range(4)] == [1.0, 3.0, 5.0, 5.0]
    assert policy.backoff(1, lambda: 1.0) == 4.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"max_attempts": True},
        {"initial_delay": -1},
        {"max_total_delay": -0.1},
        {"jitter": "0.1"},
    ],
)
def test_retry_policy_refuses_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidInputError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_huge_error_text_is_cut_short() -> None:
    failure = classify(
        "A",
        status=400,
        headers={},
        body={"error": {"message": "x" * 50_000}},
        message="",
        key_hint="K",
    )
    text = str(failure.error)
    assert len(text) < 2_200
    assert "\u2026 (48000 more characters). The request was refused as invalid." in text


@pytest.mark.parametrize("ending", ["?", "!", ".", "\u2026", ""])
def test_a_provider_text_and_ours_join_with_one_mark(ending: str) -> None:
    failure = classify(
        "P",
        status=400,
        headers={},
        body={"error": {"message": f"Is the model loaded{ending}"}},
        message="",
        key_hint="K",
    )
    text = str(failure.error)
    assert text.startswith(f"P returned HTTP 400: Is the model loaded{ending or '.'} The ")
    for doubled in ("?.", "!.", "..", "\u2026."):
        assert doubled not in text


def test_a_refused_connection_joins_the_run_explanation_with_one_mark() -> None:
    failure = connection_failure("P at http://127.0.0.1:9/v1", ConnectionRefusedError(), ())
    assert str(failure.error).endswith("Is the server running, and is base_url right?")
    text = explanations.failed(
        f"{type(failure.error).__name__}: {failure.error}", reported_by_response=False, turn=1
    )
    assert "base_url right? The run stopped" in text
    assert "?." not in text


@pytest.mark.timeout(30)
def test_giving_up_joins_the_last_failure_with_one_mark() -> None:
    async def attempt(_: object) -> sm.AssistantMessage:
        raise RuntimeError("overloaded")

    def overloaded(_: Exception) -> Failure:
        return Failure(ProviderUnavailableError("P returned HTTP 503: try later!"), True)

    async def no_wait(_: float) -> None:
        return None

    with pytest.raises(ProviderUnavailableError) as caught:
        asyncio.run(
            complete_with_retries(
                attempt,
                overloaded,
                provider="P",
                policy=RetryPolicy(max_attempts=2, jitter=0),
                signal=AbortController().signal,
                sleep=no_wait,
                random=lambda: 0.0,
                log=structlog.get_logger(),
            )
        )
    assert str(caught.value).startswith(
        "P returned HTTP 503: try later! Gave up after 2 attempt(s)"
    )


def test_a_404_names_base_url_and_the_model_not_an_invalid_request() -> None:
    failure = classify(
        "P at http://h/v1",
        status=404,
        headers={},
        body={"detail": "Not Found"},
        message="",
        key_hint="K",
    )
    assert type(failure.error) is ProviderRequestError
    assert not failure.retryable
    text = str(failure.error)
    assert "base_url" in text
    assert "model name" in text
    assert "refused as invalid" not in text
