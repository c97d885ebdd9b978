"""Fake models for your own tests: ``ScriptedModel``, ``FunctionModel`` and
``TestModel`` (which needs no script: it calls every tool, then fills a valid output).

Both are ``ModelClient``s that need no network and no account, and both record what
they were sent, so a test can check the context the loop built as well as the run's
result:

- ``ScriptedModel(*responses)`` answers call *n* with ``responses[n-1]``;
- ``FunctionModel(fn)`` answers with ``fn(messages, tools)``, so the answer can depend on
  the context (say, on the last tool result); with ``with_signal=True`` it is called
  ``fn(messages, tools, signal)``, for an answer that waits for or reacts to the abort.

A step of a script may also be such a function, for the one call whose answer depends
on what the model was sent: ``fn(messages, tools)``, or ``fn(messages, tools, signal)``
with ``ScriptedModel(..., with_signal=True)`` (a step that waits for the abort).

``record=False`` keeps only the count of calls (``calls``), not each request's context:
recording copies the whole history at every call, which a run of thousands of turns
(a benchmark) should not pay for.

Both take the run's ``CallOptions`` (``statemachine.agent.model``): each ``Request``
records the ``instructions`` and ``settings`` of its call, and a function that
declares a parameter named ``options`` is given them (``fn(messages, tools,
options=...)``), so a fake model can answer according to its instructions. With
``stream=True`` the text of each answer is also streamed to the run, word by word
(``TextDelta`` events, ``AgentRun.stream_text()``), and each tool call's arguments
as one fragment (``ToolCallDelta``), as a streaming provider would. With
``native_output=True`` a fake model says it has a JSON-schema output mode, so a run
with an ``output_type`` (``output_mode`` "auto" or "native") offers it no
``final_result`` tool and each ``Request`` records the ``output_schema`` sent: the
answer's text is then the output, validated by the run.

A response may be written short: a ``str`` is a text answer; a ``ToolCall`` (or a list
of them, with text blocks if you like) is a tool-calling answer with stop reason
``toolUse``; an ``AssistantMessage`` is used as it is. An exception class or instance
in a script is raised by that call (a failing provider).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from statemachine.agent.model import CallOptions, ModelSettings, declares_options
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.output import is_output_tool
from statemachine.core.tools import ToolDefinition
from statemachine.errors import UsageError

__all__ = [
    "FunctionModel",
    "ModelFunction",
    "Request",
    "Response",
    "ScriptedModel",
    "Step",
    "TestModel",
    "schema_value",
]

Response: TypeAlias = (
    AssistantMessage | str | ToolCall | Sequence[ToolCall | TextContent] | BaseException
)
"""What a fake model may answer (see the module docstring)."""


@attrs.frozen
class Request:
    """One call a fake model received: the context and the tools it was shown."""

    messages: tuple[Message, ...]
    tools: tuple[ToolDefinition, ...]
    instructions: str | None = None
    settings: ModelSettings = attrs.field(factory=ModelSettings)
    output_schema: Mapping[str, Any] | None = None

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The names of the tools offered, in order."""
        return tuple(t.name for t in self.tools)


def as_message(response: Response | type[BaseException]) -> AssistantMessage:
    """The ``AssistantMessage`` a short response stands for (or raise what it is)."""
    if isinstance(response, type) and issubclass(response, BaseException):
        raise response()
    if isinstance(response, BaseException):
        raise response
    if isinstance(response, AssistantMessage):
        return response
    if isinstance(response, str):
        return AssistantMessage(response)
    if isinstance(response, ToolCall):
        return AssistantMessage((response,), stop_reason=StopReason.TOOL_USE)
    blocks = tuple(response)
    if not all(isinstance(b, (ToolCall, TextContent)) for b in blocks):
        raise UsageError(
            "a fake model's response is an AssistantMessage, a str, a ToolCall, or a list "
            f"of ToolCall and TextContent blocks; got {type(response).__name__}"
        )
    has_calls = any(isinstance(b, ToolCall) for b in blocks)
    return AssistantMessage(blocks, stop_reason=StopReason.TOOL_USE if has_calls else "stop")


ModelFunction: TypeAlias = Callable[..., "Response | Awaitable[Response]"]
"""``fn(messages, tools)``, or ``fn(messages, tools, signal)`` with ``with_signal``."""

Step: TypeAlias = Response | type[BaseException] | ModelFunction
"""One step of a script: a response, an exception to raise, or a function deciding it."""


def _response(
    step: Step,
    messages: Sequence[Message],
    tools: Sequence[ToolDefinition],
    signal: AbortSignal | None,
    options: CallOptions | None,
    takes_options: bool,
) -> Response | type[BaseException] | Awaitable[Response]:
    """What ``step`` answers, to be awaited if it is awaitable (no coroutine of the fake
    model's own waits with it); ``takes_options``: a function step declares ``options``."""
    if not callable(step) or isinstance(step, type):
        return step
    extra: dict[str, CallOptions] = {}
    if takes_options:
        extra["options"] = options if options is not None else CallOptions()
    if signal is None:
        return step(messages, tools, **extra)
    return step(messages, tools, signal, **extra)


def _stream(message: AssistantMessage, options: CallOptions | None) -> None:
    """Tell the run the answer's fragments, as a streaming provider would."""
    if options is None:
        return
    for index, block in enumerate(message.content):
        if isinstance(block, TextContent) and options.on_text is not None:
            for word in re.findall(r"\S+\s*|\s+", block.text):
                options.on_text(word)
        elif isinstance(block, ToolCall) and options.on_tool_call_delta is not None:
            arguments = json.dumps(dict(block.arguments_dict()))
            options.on_tool_call_delta(index, block.id, block.name, arguments)


class _FakeModel:
    """What the fake models share: each call is recorded, answered by a step (the
    model's ``_step``), and streamed when asked to."""

    # Recording keeps the whole context of every call: quadratic in the run's length,
    # which a long run (a benchmark of 10,000 turns) turns off with record=False.
    def __init__(self, record: bool, stream: bool, native_output: bool, with_signal: bool) -> None:
        if not isinstance(native_output, bool):
            raise UsageError("native_output must be a bool")
        self.native_output = native_output
        self.requests: list[Request] = []
        self._record_requests = record
        self._stream = stream
        self._with_signal = with_signal
        self._calls = 0

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
        *,
        options: CallOptions | None = None,
    ) -> AssistantMessage:
        self._record(messages, tools, options)
        step, takes_options = self._step()
        signal_given = signal if self._with_signal else None
        response = _response(step, messages, tools, signal_given, options, takes_options)
        if inspect.isawaitable(response):
            response = await response
        message = as_message(response)
        if self._stream:
            _stream(message, options)
        return message

    def _step(self) -> tuple[Step, bool]:
        """What answers the call just recorded, and whether it is a function that
        declares ``options``."""
        raise NotImplementedError

    @property
    def calls(self) -> int:
        """How many times the model was called."""
        return self._calls

    @property
    def contexts(self) -> list[list[Message]]:
        """The messages of each request, in order (``requests`` without the tools)."""
        return [list(r.messages) for r in self.requests]

    @property
    def last_request(self) -> Request | None:
        """The last call's request (``None`` before the first, or without recording)."""
        return self.requests[-1] if self.requests else None

    def _record(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        options: CallOptions | None,
    ) -> None:
        self._calls += 1
        if self._record_requests:
            given = options if options is not None else CallOptions()
            self.requests.append(
                Request(
                    tuple(messages),
                    tuple(tools),
                    given.instructions,
                    given.settings,
                    given.output_schema,
                )
            )


class ScriptedModel(_FakeModel):
    """Answers model call *n* with the *n*-th response of the script.

    A call past the end of the script raises ``UsageError`` (the run ends ``Failed``,
    saying so), so a loop that calls the model more often than the test expected
    fails loudly instead of looping. A step that is a function is called
    ``fn(messages, tools)``, or ``fn(messages, tools, signal)`` with ``with_signal``.
    """

    def __init__(
        self,
        *responses: Step,
        with_signal: bool = False,
        record: bool = True,
        stream: bool = False,
        native_output: bool = False,
    ) -> None:
        super().__init__(record, stream, native_output, with_signal=with_signal)
        self._script = list(responses)
        self._takes_options = [
            callable(step) and not isinstance(step, type) and declares_options(step)
            for step in self._script
        ]

    @property
    def remaining(self) -> int:
        """Responses not used yet."""
        return len(self._script) - self.calls

    def _step(self) -> tuple[Step, bool]:
        number = self.calls
        if number > len(self._script):
            raise UsageError(
                f"ScriptedModel: model call {number}, but the script has "
                f"{len(self._script)} response(s)"
            )
        return self._script[number - 1], self._takes_options[number - 1]


class FunctionModel(_FakeModel):
    """Answers with ``fn(messages, tools)`` (``fn(messages, tools, signal)`` with
    ``with_signal``); ``fn`` may be sync or async."""

    def __init__(
        self,
        fn: ModelFunction,
        *,
        with_signal: bool = False,
        record: bool = True,
        stream: bool = False,
        native_output: bool = False,
    ) -> None:
        if not callable(fn):
            raise UsageError(f"FunctionModel needs a function, got {type(fn).__name__}")
        super().__init__(record, stream, native_output, with_signal=with_signal)
        self._fn = fn
        self._fn_takes_options = declares_options(fn)

    def _step(self) -> tuple[Step, bool]:
        return self._fn, self._fn_takes_options


class TestModel(_FakeModel):
    """A model that needs no script: it calls every tool it is offered once, with
    arguments made from each tool's JSON Schema, then gives a valid output made from
    the output's schema (as PydanticAI's ``TestModel``), so a test exercises an agent's
    tools and output type end to end.

    The first call of a run (no answer of its own since the last user message) calls
    the tools (``call_tools``: ``"all"``, or the names to call; the final-result tool
    never); the next gives the output: a call of the (first) final-result tool with
    ``custom_output_args`` or arguments made from its schema, or, without one, a
    text: ``custom_output_text``, the JSON of a native output's schema, or the JSON of
    the tools' results by tool name (``"success (no tool calls)"`` without any).

    Values from a schema: its ``const`` or first ``enum`` value, the first ``anyOf`` or
    ``oneOf`` member that is not null, every property of an object, one item of an array
    (or ``minItems``), ``"a"`` strings of ``minLength``, numbers at their ``minimum``
    (0 without one); ``$ref``\\ s into ``$defs`` are followed. A validator of the output
    type that refuses such a value is a failed attempt, as with any model.
    """

    __test__ = False  # a fake model, not a test class pytest should collect

    def __init__(
        self,
        *,
        call_tools: str | Sequence[str] = "all",
        custom_output_text: str | None = None,
        custom_output_args: Mapping[str, Any] | None = None,
        record: bool = True,
        stream: bool = False,
        native_output: bool = False,
    ) -> None:
        if call_tools != "all" and (isinstance(call_tools, str) or not _all_str(call_tools)):
            raise UsageError('TestModel: call_tools is "all" or a list of tool names')
        super().__init__(record, stream, native_output, with_signal=False)
        self._call_tools = call_tools
        self._text = custom_output_text
        self._args = custom_output_args

    def _step(self) -> tuple[Step, bool]:
        return self._answer, True

    def _answer(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        options: CallOptions,
    ) -> AssistantMessage:
        callable_tools = [
            t
            for t in tools
            if not is_output_tool(t.name)
            and (self._call_tools == "all" or t.name in self._call_tools)
        ]
        if callable_tools and _first_call(messages):
            calls = [
                ToolCall(f"test-{i}", t.name, schema_value(t.schema_dict()))
                for i, t in enumerate(callable_tools, 1)
            ]
            return AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)
        output = next((t for t in tools if is_output_tool(t.name)), None)
        if output is not None:
            arguments = self._args if self._args is not None else schema_value(output.schema_dict())
            call = ToolCall(f"test-out-{len(messages)}", output.name, arguments)
            return AssistantMessage([call], stop_reason=StopReason.TOOL_USE)
        if self._text is not None:
            return AssistantMessage(self._text)
        schema = options.output_schema
        if schema is not None:
            value = self._args if self._args is not None else schema_value(schema)
            return AssistantMessage(json.dumps(value))
        return AssistantMessage(_results_text(messages))


def _all_str(names: Sequence[object]) -> bool:
    return all(isinstance(name, str) for name in names)


def _first_call(messages: Sequence[Message]) -> bool:
    """Whether no answer of the model follows the last user message."""
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            return False
        if isinstance(message, UserMessage):
            return True
    return True


def _results_text(messages: Sequence[Message]) -> str:
    """The JSON of the tool results since the last user message, by tool name."""
    results: dict[str, str] = {}
    for message in reversed(messages):
        if isinstance(message, UserMessage):
            break
        if isinstance(message, ToolResultMessage):
            results.setdefault(message.tool_name, message.text)
    if not results:
        return "success (no tool calls)"
    return json.dumps(dict(reversed(results.items())))


_MAX_SCHEMA_DEPTH = 32
"""How deep ``schema_value`` follows nested schemas ($refs included) before it gives
``None`` (a recursive schema would otherwise never end)."""


def schema_value(schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> Any:
    """A value valid for the JSON Schema ``schema`` (``TestModel``'s rules), following
    ``$ref``\\ s into ``root``'s ``$defs`` (``root``: ``schema`` itself by default)."""
    return _value(schema, schema if root is None else root, 0)


def _value(schema: Any, root: Mapping[str, Any], depth: int) -> Any:
    if depth > _MAX_SCHEMA_DEPTH or not isinstance(schema, Mapping):
        return None
    deeper = depth + 1
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        return _value(target, root, deeper)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            chosen = next((o for o in options if _type_of(o) != "null"), options[0])
            return _value(chosen, root, deeper)
    kind = _type_of(schema)
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: _value(sub, root, deeper) for name, sub in properties.items()}
    if kind == "array":
        count = max(1, int(schema.get("minItems", 0)))
        return [_value(schema.get("items", {}), root, deeper) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", None))
        value = 0 if low is None else low + (1 if "exclusiveMinimum" in schema else 0)
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return "a" * max(1, int(schema.get("minLength", 1)))


def _type_of(schema: Any) -> str | None:
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    return kind if isinstance(kind, str) else None
