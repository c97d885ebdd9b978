"""The model boundary.

A ``ModelClient`` turns a context into one assistant message. It owns everything
provider-specific, retries of transient errors included (the engine never retries:
any exception from ``complete`` is one failed call and ends the run ``Failed``).

On abort, a well-behaved client stops promptly and *returns* an ``AssistantMessage``
with stop reason ``aborted`` holding what had arrived, partial tool calls dropped.
A client that ignores the signal is cancelled by the driver after the grace period.

What a call carries besides the context: ``CallOptions``
-----------------------------------------------------------
A run may have instructions (the system prompt), per-run ``ModelSettings`` and
listeners for streamed deltas. They reach the client as one keyword-only argument,
``options: CallOptions``, which the driver passes **only to a client whose
``complete`` declares a parameter named ``options``** (read once from its signature,
when the run is made). So every client written against
``complete(messages, tools, signal)`` keeps working unchanged; a run that *needs*
the options (instructions or settings given) with a client that does not take them
is refused with a ``UsageError`` before any model call, instead of silently dropping
the system prompt. One object rather than one keyword per feature: a client declares
it once and later fields (say, an output schema) reach it without another signature
change. A client says which settings it can send with ``supported_settings`` (a set
of ``ModelSettings`` field names); a setting outside it is refused the same way.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import CodeType
from typing import Any, Final, Protocol, cast, runtime_checkable

import attrs

from statemachine.core.abort import AbortSignal
from statemachine.core.messages import AssistantMessage, Message, freeze_json, thaw_json
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError, UsageError

__all__ = [
    "CallOptions",
    "ModelClient",
    "ModelSettings",
    "check_settings",
    "declares_options",
    "takes_options",
]


@runtime_checkable
class ModelClient(Protocol):
    """``async complete(messages, tools, signal) -> AssistantMessage``; a client may
    also take ``options: CallOptions`` (keyword-only; module docstring). ``complete``
    must be ``async def`` (or return an awaitable): one that returns the message itself
    fails the model call with a ``UsageError`` naming the client."""

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
    ) -> AssistantMessage: ...


def _optional_number(kind: type | tuple[type, ...], low: float, high: float | None) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, kind):
            raise InvalidInputError(
                f"ModelSettings.{attribute.name} must be a number, got {value!r}"
            )
        number = float(cast(float, value))
        if not number >= low or (high is not None and not number <= high):
            bound = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
            raise InvalidInputError(
                f"ModelSettings.{attribute.name} must be {bound}, got {value!r}"
            )

    return check


def _stop(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not (
        isinstance(value, tuple) and all(isinstance(s, str) and s for s in value)
    ):
        raise InvalidInputError("ModelSettings.stop must be a sequence of non-empty strings")


def _stop_tuple(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return (value,) if isinstance(value, str) else None
    return tuple(value) if isinstance(value, (list, tuple)) else value


REASONING_EFFORTS: Final = ("minimal", "low", "medium", "high")
"""The values of ``ModelSettings.reasoning_effort`` (OpenAI's ``reasoning_effort``)."""


def _headers(value: Any) -> Any:
    if value is None:
        return None
    pairs = tuple(value.items()) if isinstance(value, Mapping) else value  # or evolve()'s
    if not isinstance(pairs, tuple) or not all(
        isinstance(p, tuple) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs
    ):
        raise InvalidInputError("ModelSettings.extra_headers must map header names to strings")
    return pairs


def _one_of(*allowed: object) -> Any:
    def check(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None and (type(value), value) not in {(type(a), a) for a in allowed}:
            names = ", ".join(map(repr, allowed))
            raise InvalidInputError(
                f"ModelSettings.{attribute.name} must be one of {names}, got {value!r:.40}"
            )

    return check


def _extra_body(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInputError("ModelSettings.extra_body must be a JSON object (a dict)")
    try:
        return freeze_json(dict(value))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"ModelSettings.extra_body must be JSON: {exc}") from None


@attrs.frozen(kw_only=True)
class ModelSettings:
    """Settings of a model call; ``None`` leaves the client's own setting.

    Given to ``Agent`` they apply to its every run; given to a run they override the
    agent's field by field (``merged``). A client sends only those it declares in
    ``supported_settings``; any other set field refuses the run before a model call,
    naming it. Beside sampling (``temperature``, ``max_tokens``, ``top_p``, ``stop``):
    ``seed``, ``presence_penalty`` and ``frequency_penalty`` (OpenAI Chat, Gemini),
    ``parallel_tool_calls`` and ``reasoning_effort`` (OpenAI Chat and Responses),
    ``timeout`` in seconds and ``extra_headers`` (OpenAI Chat), ``extra_body`` (fields
    merged into the request: OpenAI Chat and Responses).
    """

    temperature: float | None = attrs.field(
        default=None, validator=_optional_number((int, float), 0.0, 2.0)
    )
    max_tokens: int | None = attrs.field(default=None, validator=_optional_number(int, 1, None))
    top_p: float | None = attrs.field(
        default=None, validator=_optional_number((int, float), 0.0, 1.0)
    )
    stop: tuple[str, ...] | None = attrs.field(default=None, converter=_stop_tuple, validator=_stop)
    seed: int | None = attrs.field(default=None, validator=_optional_number(int, -(2**63), None))
    presence_penalty: float | None = attrs.field(
        default=None, validator=_optional_number((int, float), -2.0, 2.0)
    )
    frequency_penalty: float | None = attrs.field(
        default=None, validator=_optional_number((int, float), -2.0, 2.0)
    )
    parallel_tool_calls: bool | None = attrs.field(default=None, validator=_one_of(True, False))
    reasoning_effort: str | None = attrs.field(default=None, validator=_one_of(*REASONING_EFFORTS))
    timeout: float | None = attrs.field(
        default=None, validator=_optional_number((int, float), 0.001, None)
    )
    # Frozen: headers as (name, value) pairs, the body as frozen JSON (set_fields thaws).
    extra_headers: tuple[tuple[str, str], ...] | None = attrs.field(
        default=None, converter=_headers
    )
    extra_body: Any = attrs.field(default=None, converter=_extra_body, hash=False)

    def set_fields(self) -> dict[str, Any]:
        """The fields that are set (not ``None``), by name (``extra_headers`` and
        ``extra_body`` as dicts)."""
        fields = {k: v for k, v in attrs.asdict(self, recurse=False).items() if v is not None}
        if "extra_headers" in fields:
            fields["extra_headers"] = dict(fields["extra_headers"])
        if "extra_body" in fields:
            fields["extra_body"] = thaw_json(fields["extra_body"])
        return fields

    def merged(self, override: ModelSettings | None) -> ModelSettings:
        """These settings, with every field that ``override`` sets taken from it."""
        if override is None:
            return self
        return attrs.evolve(self, **override.set_fields())


class ResponseListener(Protocol):
    """``CallOptions.on_response``: what the provider said of one response, each
    ``None`` when unknown: its id, the model that answered, and the reasoning tokens
    of its output when the provider counts them apart (a client that knows only the
    first two may pass only those)."""

    def __call__(
        self,
        response_id: str | None,
        response_model: str | None,
        reasoning_tokens: int | None = None,
        /,
    ) -> None: ...


@attrs.frozen
class CallOptions:
    """What one model call carries besides the context (module docstring).

    ``instructions``: the system prompt of this call (sent as the provider expects:
    OpenAI a first ``system`` message, Anthropic the ``system`` field), ``None`` for
    none. ``settings``: the run's ``ModelSettings``. ``on_text`` and
    ``on_tool_call_delta`` (``(index, call_id, name, arguments_fragment)``): called
    with each streamed fragment as it arrives, by a client that streams, on the event
    loop's thread (they hand run events to the run's subscribers). ``on_response``
    (``(response_id, response_model[, reasoning_tokens])``, a ``ResponseListener``,
    each ``None`` when unknown): called once per response by a client that knows them
    (the adapters do), for telemetry; nothing of it enters the history.
    ``output_schema``: the JSON Schema (an object) the final answer's text must match,
    sent in the provider's own JSON-schema output mode; given only to a client that
    declares ``native_output = True`` (``statemachine.agent.output``), ``None`` for
    none.
    """

    instructions: str | None = None
    settings: ModelSettings = attrs.field(factory=ModelSettings)
    on_text: Callable[[str], None] | None = None
    on_tool_call_delta: Callable[[int, str, str, str], None] | None = None
    output_schema: Mapping[str, Any] | None = None
    on_response: ResponseListener | None = None


# A function's parameter names are those of its code, which every closure made from one
# ``def`` and every client of one class share: read once per code object, so a client
# or fake model made per run reads no signature. Weak keys, so dropped code is freed. A
# callable that gives its signature otherwise (``__wrapped__``, ``__signature__``, a
# callable object) is read as ``inspect`` reads it, each time.
_options_known: weakref.WeakKeyDictionary[CodeType, bool] = weakref.WeakKeyDictionary()


def takes_options(model: object) -> bool:
    """True if ``model.complete`` declares a parameter named ``options``."""
    return declares_options(getattr(model, "complete", None))


def declares_options(fn: object) -> bool:
    """True if the callable ``fn`` declares a parameter named ``options``."""
    function = fn.__func__ if inspect.ismethod(fn) else fn
    if (
        not inspect.isfunction(function)
        or hasattr(function, "__wrapped__")
        or hasattr(function, "__signature__")
    ):
        return _reads_options(fn)
    known = _options_known.get(function.__code__)
    if known is None:
        known = _options_known[function.__code__] = _reads_options(fn)
    return known


def _reads_options(fn: object) -> bool:
    try:
        parameters = inspect.signature(fn).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return "options" in parameters


def check_settings(model: object, settings: ModelSettings, instructions: bool) -> None:
    """Refuse, before any call, what ``model`` could not send: instructions or settings
    for a client without ``options``, or a setting outside its ``supported_settings``."""
    wanted = settings.set_fields()
    if not takes_options(model):
        needs = [*(["instructions"] if instructions else []), *sorted(wanted)]
        if needs:
            raise UsageError(
                f"the model client {type(model).__name__} cannot receive "
                f"{', '.join(needs)}: its complete() takes no 'options' keyword "
                "(see statemachine.agent.model, CallOptions)"
            )
        return
    if instructions and getattr(model, "accepts_instructions", True) is False:
        raise UsageError(f"instructions: {type(model).__name__} cannot send instructions")
    supported = getattr(model, "supported_settings", None)
    if supported is None:
        return
    refused = sorted(set(wanted) - set(supported))
    if refused:
        raise UsageError(
            f"model_settings: {type(model).__name__} cannot send {', '.join(refused)} "
            f"(it sends {', '.join(sorted(supported)) or 'no settings'})"
        )


# -- model strings ("openai:gpt-4.1") --------------------------------------------------------

_string_models: list[Callable[[str], ModelClient]] = []
"""What turns a model string into a client: ``statemachine.providers.registry``'s
``model_from_string``, plugged in by ``statemachine`` (this layer imports nothing above
the core)."""


def use_model_strings(resolver: Callable[[str], ModelClient]) -> None:
    """Make ``resolver`` the function that turns ``"provider:model"`` into a client."""
    _string_models[:] = [resolver]


def resolve_model(model: ModelClient | str) -> ModelClient:
    """``model`` itself, or the client a model string names."""
    if not isinstance(model, str):
        return model
    if not _string_models:
        raise UsageError("model strings need statemachine.providers (import statemachine)")
    return _string_models[0](model)
