"""Retries with backoff, and waiting on I/O that an abort must be able to interrupt.

The engine never retries (one exception from ``complete`` is one failed run), so the
adapters retry transient failures here, within a budget that bounds both the number
of attempts and the total time spent waiting. A wait honours the provider's
``Retry-After`` when it gives one. An abort ends a wait at once: the adapter then
returns an ``aborted`` assistant message instead of raising, as the model boundary
asks (see ``statemachine.agent.model``).

``sleep`` and ``random`` are injectable so that tests run the whole backoff path
without waiting and without randomness.
"""

from __future__ import annotations

import asyncio
import contextlib
import random as _random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import attrs

from statemachine.core.abort import AbortSignal
from statemachine.core.explanations import sentence
from statemachine.core.messages import AssistantMessage, StopReason
from statemachine.errors import InvalidInputError, ProviderError, ProviderUnavailableError
from statemachine.providers._errors import Failure, redacted_chain
from statemachine.providers.redaction import redact

__all__ = ["AbortWatch", "RetryPolicy", "Sleep", "complete_with_retries", "race_abort"]

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]


def _non_negative(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise InvalidInputError(f"RetryPolicy.{attribute.name} must be a non-negative number")


@attrs.frozen
class RetryPolicy:
    """How hard an adapter tries before it gives up.

    ``max_attempts`` counts every request, the first included. The n-th wait is
    ``initial_delay * multiplier**n`` capped at ``max_delay``, stretched by up to
    ``jitter`` (a fraction) so that many clients do not retry in step; a provider's
    ``Retry-After`` replaces it. The adapter gives up rather than wait beyond
    ``max_total_delay`` seconds in all. Since each attempt is bounded by the
    adapter's ``timeout``, one ``complete`` takes at most about
    ``max_attempts * timeout + max_total_delay`` (with the defaults, 4 attempts of
    600 s and 120 s of waiting: 2,520 s). Only transient failures are retried (429,
    408/409/425, 5xx, 529, overload or server errors inside a stream, a connection
    that broke); authentication, refused requests, unreadable responses, limits and
    refused connections end the call at once.
    """

    max_attempts: int = attrs.field(default=4)
    initial_delay: float = attrs.field(default=1.0, validator=_non_negative)
    multiplier: float = attrs.field(default=2.0, validator=_non_negative)
    max_delay: float = attrs.field(default=30.0, validator=_non_negative)
    max_total_delay: float = attrs.field(default=120.0, validator=_non_negative)
    jitter: float = attrs.field(default=0.1, validator=_non_negative)

    @max_attempts.validator
    def _check_attempts(self, _: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidInputError("RetryPolicy.max_attempts must be an integer >= 1")

    def backoff(self, retry: int, random: Callable[[], float] = _random.random) -> float:
        """The wait before retry number ``retry`` (0-based) when the provider named none."""
        base = min(self.max_delay, self.initial_delay * self.multiplier**retry)
        return base * (1.0 + self.jitter * random())


class AbortWatch:
    """An ``asyncio.Event`` that is set when the signal aborts, from whatever thread
    the abort happens in. Use as ``async with AbortWatch(signal) as watch``."""

    def __init__(self, signal: AbortSignal) -> None:
        self.signal = signal
        self.event = asyncio.Event()
        self._remove: Callable[[], None] = lambda: None

    async def __aenter__(self) -> AbortWatch:
        loop = asyncio.get_running_loop()

        def on_abort(_: object) -> None:
            try:
                loop.call_soon_threadsafe(self.event.set)
            except RuntimeError:
                pass  # the loop has closed: nobody is waiting any more

        self._remove = self.signal.add_listener(on_abort)
        return self

    async def __aexit__(self, *_: object) -> None:
        self._remove()


async def race_abort(watch: AbortWatch, work: Coroutine[Any, Any, T]) -> tuple[bool, T | None]:
    """Run ``work`` until it finishes or the signal aborts, whichever comes first.

    Returns ``(False, result)``, or ``(True, None)`` after cancelling ``work`` and
    waiting for its cleanup. Exceptions from ``work`` propagate.
    """
    task = asyncio.ensure_future(work)
    if watch.signal.aborted:
        watch.event.set()
    waiter = asyncio.ensure_future(watch.event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        waiter.cancel()
        raise
    waiter.cancel()
    if task.done():
        return False, task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return True, None


def aborted_message(note: str | None = None) -> AssistantMessage:
    """An empty response that records an abort (nothing had arrived yet)."""
    return AssistantMessage((), stop_reason=StopReason.ABORTED, error_message=note)


async def complete_with_retries(
    attempt: Callable[[AbortWatch], Awaitable[AssistantMessage]],
    classify: Callable[[Exception], Failure | None],
    *,
    provider: str,
    policy: RetryPolicy,
    signal: AbortSignal,
    sleep: Sleep,
    random: Callable[[], float],
    log: Any,
    secrets: Sequence[str] = (),
) -> AssistantMessage:
    """Call ``attempt`` until it returns, retrying what ``classify`` calls retryable.

    ``classify`` returns ``None`` for an exception that is not a provider failure (a
    bug): that one propagates untouched, unless its text holds a secret. A provider
    failure is raised with a redacted copy of the original chain as its cause (see
    ``redacted_chain``), never the SDK's exception itself, whose text may echo the key.
    """
    waited = 0.0
    async with AbortWatch(signal) as watch:
        for number in range(1, policy.max_attempts + 1):
            if signal.aborted:
                return aborted_message("aborted before the request was sent")
            try:
                return await attempt(watch)
            except Exception as exc:  # noqa: BLE001 - sorted out below, outside the handler
                failed: Exception = exc
            # Raising here, outside the handler, leaves no __context__ pointing at the
            # SDK's exception.
            failure = classify(failed)
            if failure is None:
                if redact(_text(failed), secrets) == _text(failed):
                    raise failed
                failure = Failure(ProviderError(redact(_text(failed), secrets)), False)
            # A ProviderError of our own is raised as it is, after its own causes.
            origin = failed.__cause__ if failure.error is failed else failed
            cause = redacted_chain(origin, secrets) if origin is not None else None
            del failed, origin
            delay = _next_wait(failure, number, waited, policy, random)
            if isinstance(delay, ProviderError):
                final_error = delay  # named for the traceback line that shows it
                raise final_error from cause
            log.warning(
                "provider_retry",
                provider=provider,
                attempt=number,
                delay=delay,
                error=str(failure.error),
            )
            aborted, _ = await race_abort(watch, _as_coroutine(sleep(delay)))
            if aborted:
                return aborted_message(f"aborted while waiting to retry ({failure.error})")
            waited += delay
    raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover


def _text(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - a broken __str__ is no secret
        return type(exc).__name__


def _next_wait(
    failure: Failure, number: int, waited: float, policy: RetryPolicy, random: Callable[[], float]
) -> float | ProviderError:
    """How long to wait before attempt ``number + 1``, or the error that ends the call."""
    if not failure.retryable:
        return failure.error
    reason = sentence(str(failure.error))
    if number == policy.max_attempts:
        return ProviderUnavailableError(
            f"{reason} Gave up after {number} attempt(s) (the retry budget "
            f"allows {policy.max_attempts}); try again later."
        )
    delay = failure.retry_after
    if delay is None:
        delay = policy.backoff(number - 1, random)
    if waited + delay > policy.max_total_delay:
        return ProviderUnavailableError(
            f"{reason} Gave up after {number} attempt(s): the next wait "
            f"({delay:g} s) would exceed the retry budget of "
            f"{policy.max_total_delay:g} s of waiting; try again later."
        )
    return delay


async def _as_coroutine(awaitable: Awaitable[None]) -> None:
    await awaitable
