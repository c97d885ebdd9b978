"""``FallbackModel``: a ``ModelClient`` that asks its models in order, moving to the
next when one is out of service.

``FallbackModel([primary, backup, ...])`` calls ``primary``; when that call fails with
an error that says the model could not answer now (``ProviderUnavailableError``: rate
limits, overload, server errors and broken connections that outlasted the model's
own retries; ``ProviderLimitError``: it took longer than its ``timeout``, went silent
past its ``idle_timeout`` or sent more than its ``max_response_bytes``), it calls
``backup`` with the same context, and so on. An
error that another model would meet too (a bad key, a refused request, a context
overflow, a response that cannot be read) is raised at once, and so is the last
model's error when every one failed. ``fallback_on`` replaces the classes that move
on. Each model keeps its own retry policy: a model is given up when its retries are.

The models may be clients or model strings (``"groq:llama-3.3-70b-versatile"``).

Which model answered is told where the run records responses: the call's
``on_response`` gets the answering model's name (the provider's own, as an adapter
reports it, or the client's ``model`` for a client that reports none), so a traced
run's ``chat`` span has it as ``gen_ai.response.model``; and each move to the next
model is logged at warning level (``model_fallback``, with the model given up and
the error, redacted as the adapters' errors are) on the ``statemachine.providers``
logger, or the ``logger`` given.

What the run may send (instructions, settings, native structured output) is what
every model can send: a run whose needs one of them lacks is refused before the
first call, as for that model alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from statemachine._log import library_logger
from statemachine.agent.model import CallOptions, ModelClient, resolve_model, takes_options
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import AssistantMessage, Message
from statemachine.core.tools import ToolDefinition
from statemachine.errors import (
    InvalidInputError,
    ProviderError,
    ProviderLimitError,
    ProviderUnavailableError,
)

__all__ = ["FallbackModel"]

DEFAULT_FALLBACK_ON: tuple[type[ProviderError], ...] = (
    ProviderUnavailableError,
    ProviderLimitError,
)


def _name(model: ModelClient) -> str:
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else type(model).__name__


class FallbackModel:
    """A model client over ``models``, tried in order (see the module docstring)."""

    def __init__(
        self,
        models: Sequence[ModelClient | str],
        *,
        fallback_on: tuple[type[ProviderError], ...] = DEFAULT_FALLBACK_ON,
        logger: Any = None,
    ) -> None:
        if isinstance(models, str) or not models:
            raise InvalidInputError("FallbackModel takes a non-empty list of models")
        if not isinstance(fallback_on, tuple) or not all(
            isinstance(k, type) and issubclass(k, ProviderError) for k in fallback_on
        ):
            raise InvalidInputError("fallback_on must be a tuple of ProviderError classes")
        self.models: tuple[ModelClient, ...] = tuple(resolve_model(m) for m in models)
        self.fallback_on = fallback_on
        self.log = logger if logger is not None else library_logger("statemachine.providers")
        first = self.models[0]
        self.model = _name(first)  # what a tracer names the request by
        self.base_url = getattr(first, "base_url", None)
        optioned = all(takes_options(m) for m in self.models)
        self.accepts_instructions = optioned and all(
            getattr(m, "accepts_instructions", False) for m in self.models
        )
        supported = [frozenset(getattr(m, "supported_settings", ())) for m in self.models]
        self.supported_settings = frozenset.intersection(*supported) if optioned else frozenset()
        self.native_output = optioned and all(
            getattr(m, "native_output", False) is True for m in self.models
        )

    def __repr__(self) -> str:
        return f"FallbackModel([{', '.join(repr(m) for m in self.models)}])"

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
        *,
        options: CallOptions | None = None,
    ) -> AssistantMessage:
        last = len(self.models) - 1
        for index, model in enumerate(self.models):
            reported: list[str | None] = []
            given = _reporting(options, reported)
            reply: AssistantMessage
            try:
                if takes_options(model):
                    client: Any = model  # declares options (checked above)
                    reply = await client.complete(messages, tools, signal, options=given)
                else:
                    reply = await model.complete(messages, tools, signal)
            except self.fallback_on as exc:
                if index == last or signal.aborted:
                    raise
                self.log.warning(
                    "model_fallback",
                    given_up=_name(model),
                    next=_name(self.models[index + 1]),
                    error=f"{type(exc).__name__}: {exc}"[:500],
                )
                continue
            if options is not None and options.on_response is not None and not any(reported):
                options.on_response(None, _name(model))
            return reply
        raise AssertionError("unreachable: the last model's error is raised")  # pragma: no cover


def _reporting(options: CallOptions | None, reported: list[str | None]) -> CallOptions | None:
    """``options`` whose ``on_response`` also notes the model the client reported."""
    if options is None or options.on_response is None:
        return options
    told = options.on_response

    def on_response(
        response_id: str | None, model: str | None, reasoning_tokens: int | None = None, /
    ) -> None:
        reported.append(model)
        if reasoning_tokens is None:  # as the client said it: only what it knew
            told(response_id, model)
        else:
            told(response_id, model, reasoning_tokens)

    return attrs.evolve(options, on_response=on_response)
