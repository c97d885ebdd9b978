"""The run's side of a model call: instructions, settings and streamed deltas.

``RunModel`` stands between the executor and the user's ``ModelClient``: at each
model call it works out the instructions (a string, or a function of the
``RunContext`` called then), and hands the client one ``CallOptions`` with them, the
run's ``ModelSettings``, the output's JSON Schema in native mode
(``statemachine.agent.output``) and the listeners that turn streamed fragments into run
events. A client that does not declare ``options`` is called as before
(``statemachine.agent.model`` says why, and what is refused up front). A ``complete``
that is not ``async def`` (it returns the message itself, not an awaitable) fails the
call with a ``UsageError`` that says so.

An engine that records instructions (``JournalingEngine.record_instructions``) is told
those of every call, so a journal holds what each call was sent; and, when the client
reports it (``CallOptions.on_response``), the model that answered (``record_model``).

Instructions that raise fail that model call: the run ends ``Failed`` with an
explanation naming ``InstructionsError`` and what the function raised (the exception
is the cause of ``RunResult.error``), never a crash of the driver.

Instructions for one run (``Agent.run(..., instructions=...)``) come after the
agent's own, as PydanticAI adds them: ``join_instructions`` makes one string of two,
or a ``JoinedInstructions`` that asks each part at every call; the texts are joined by
a blank line, and a part that gives no text adds none.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import CoroutineType
from typing import Any, TypeAlias, cast

import attrs

from statemachine.agent.context import RunContext
from statemachine.agent.model import CallOptions, ModelClient, ModelSettings, takes_options
from statemachine.agent.output import supports_native_output
from statemachine.agent.stream import EventStream
from statemachine.core.abort import AbortSignal
from statemachine.core.engine import Engine
from statemachine.core.messages import AssistantMessage, Message
from statemachine.core.output import OutputSpec
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InstructionsError, InvalidInputError, UsageError

__all__ = [
    "Instructions",
    "InstructionsError",
    "JoinedInstructions",
    "RunModel",
    "answer_of",
    "awaitable_answer",
    "check_instructions",
    "join_instructions",
]

Instructions: TypeAlias = str | Callable[..., Any]
"""A system prompt: a string, or a function called at each model call with the run's
``RunContext`` (or with nothing), sync or async, returning a string."""


def check_instructions(instructions: object) -> None:
    if (
        instructions is not None
        and not isinstance(instructions, str)
        and not callable(instructions)
    ):
        raise InvalidInputError(
            "instructions must be a str or a function of the RunContext returning one, "
            f"got {type(instructions).__name__}"
        )


def join_instructions(first: Instructions | None, then: Instructions | None) -> Instructions | None:
    """``first`` followed by ``then`` (module docstring); either alone when the other is
    ``None`` or empty."""
    check_instructions(then)
    if first is None or first == "":
        return then
    if then is None or then == "":
        return first
    if isinstance(first, str) and isinstance(then, str):
        return f"{first}\n\n{then}"
    return JoinedInstructions((first, then))


@attrs.frozen
class JoinedInstructions:
    """Instructions made of ``parts`` (strings and functions of the ``RunContext``),
    each asked at every model call; a function of the context itself, so the run
    treats it as any instructions function."""

    parts: tuple[Instructions, ...]

    async def __call__(self, ctx: RunContext[Any]) -> str | None:
        texts: list[str | None] = []
        for part in self.parts:
            if isinstance(part, str):
                texts.append(part)
            else:
                texts.append(await _ask(part, _takes_an_argument(part), lambda: ctx))
        return "\n\n".join(text for text in texts if text) or None


async def _ask(
    given: Callable[..., Any], takes_context: bool, context: Callable[[], RunContext[Any]] | None
) -> str | None:
    """The text an instructions function gives (``InstructionsError`` if it fails)."""
    try:
        if takes_context:
            assert context is not None  # refused when the run was made otherwise
            value = given(context())
        else:
            value = given()
        if inspect.isawaitable(value):
            value = await value
    except InstructionsError:
        raise  # a part of JoinedInstructions, named already
    except Exception as exc:
        raise InstructionsError(
            f"the instructions function {getattr(given, '__name__', given)!r} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if value is not None and not isinstance(value, str):
        raise InstructionsError(
            f"the instructions function returned a {type(value).__name__}, not a str"
        )
    return value or None


class RunModel:
    """Calls ``client`` with this run's ``CallOptions`` (``complete`` as a
    ``ModelClient``'s, returning what to await). ``context`` makes the run's
    ``RunContext``, for instructions given by a function (``None`` for others). Slots:
    every waiting run holds one."""

    __slots__ = (
        "_answered",
        "_base",
        "_context",
        "_fixed",
        "_function_takes_context",
        "_instructions",
        "_judge",
        "_note",
        "client",
    )

    def __init__(
        self,
        client: ModelClient,
        instructions: Instructions | None,
        settings: ModelSettings,
        stream: EventStream,
        context: Callable[[], RunContext[Any]] | None,
        engine: Engine | None = None,
        judge: Callable[[AssistantMessage], Awaitable[None]] | None = None,
    ) -> None:
        self.client = client
        # Awaits the async output validators on each response (``Output.judge``).
        self._judge = judge
        output = engine.output if engine is not None else None
        # An engine that records what each call was told (a JournalingEngine) hears the
        # instructions of every call; it writes them when they change.
        self._note: Callable[[str | None], None] | None = getattr(
            engine, "record_instructions", None
        )
        # It hears the model that answered too, from a client that reports it.
        self._answered: Callable[[str], None] | None = getattr(engine, "record_model", None)
        self._instructions = instructions
        if callable(instructions) and context is None:
            raise UsageError("instructions given by a function need the run's context")
        self._context = context  # only for instructions given by a function
        schema = _native_schema(client, output)
        # Options for a client that takes them (none are made for one that does not):
        # the same for every call, unless a function gives the instructions.
        self._base: CallOptions | None = None
        if takes_options(client):
            self._base = CallOptions(
                instructions=instructions
                if isinstance(instructions, str) and instructions
                else None,
                settings=settings,
                on_text=stream.text_delta,
                on_tool_call_delta=stream.tool_call_delta,
                output_schema=schema,
                on_response=None if self._answered is None else self._on_response,
            )
        self._fixed = None if callable(instructions) else self._base
        self._function_takes_context = callable(instructions) and _takes_an_argument(instructions)

    def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> Awaitable[AssistantMessage]:
        """The client's answer, for the caller to await: no coroutine of this wrapper
        stays alive across the model's wait, unless a function gives the instructions."""
        if self._judge is not None:  # only a run with an async output validator
            return self._complete_judging(messages, tools, signal)
        return self._complete(messages, tools, signal)

    async def _complete_judging(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> AssistantMessage:
        message = await self._complete(messages, tools, signal)
        if self._judge is not None and isinstance(message, AssistantMessage):
            await self._judge(message)
        return message

    def _complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> Awaitable[AssistantMessage]:
        client = self.client
        base = self._base
        if base is None:  # a client without options
            return awaitable_answer(client, client.complete(messages, tools, signal))
        if self._fixed is None:  # instructions from a function: asked again at every call
            return self._complete_asking(messages, tools, signal, base)
        return self._send(messages, tools, signal, self._fixed)

    async def _complete_asking(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
        base: CallOptions,
    ) -> AssistantMessage:
        options = attrs.evolve(base, instructions=await self.instructions())
        return await self._send(messages, tools, signal, options)

    def _send(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
        options: CallOptions,
    ) -> Awaitable[AssistantMessage]:
        if self._note is not None:
            self._note(options.instructions)
        client = self.client
        return awaitable_answer(
            client,
            client.complete(messages, tools, signal, options=options),  # type: ignore[call-arg]
        )

    def _on_response(
        self, response_id: str | None, model: str | None, reasoning: int | None = None, /
    ) -> None:
        """What a client reports of its response: the model that answered is journaled."""
        if model and self._answered is not None:
            self._answered(model)

    async def instructions(self) -> str | None:
        """The instructions of this call (``InstructionsError`` if the function fails)."""
        given = self._instructions
        if given is None or isinstance(given, str):
            return given or None
        return await _ask(given, self._function_takes_context, self._context)


def _native_schema(client: ModelClient, output: OutputSpec | None) -> Mapping[str, Any] | None:
    """The schema a native-mode output sends (``None`` in tool mode); a ``UsageError``
    for a client without a JSON-schema output mode (a run resumed with another)."""
    if output is None or not output.native:
        return None
    if not supports_native_output(client):
        raise UsageError(
            f"the run gives its output natively (output_mode), but the model client "
            f"{type(client).__name__} has no JSON-schema output mode"
        )
    return output.definition.schema_dict()


async def answer_of(client: object, pending: object) -> AssistantMessage:
    """What ``client.complete`` returned (``pending``), awaited; a ``UsageError`` (which
    fails the call) when it cannot be: a ``complete`` that is not ``async def``."""
    return await awaitable_answer(client, pending)


def awaitable_answer(client: object, pending: object) -> Awaitable[AssistantMessage]:
    """``pending`` (what ``client.complete`` returned) once it is known to be awaitable,
    for the caller to await itself (no coroutine of its own stays alive across the
    model's wait); a ``UsageError`` for a ``complete`` that is not ``async def``."""
    # A coroutine, as an async def's complete gives, is known at a glance.
    if not (isinstance(pending, CoroutineType) or inspect.isawaitable(pending)):
        kind = type(pending).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise UsageError(
            f"the model client {type(client).__name__}'s complete() returned "
            f"{article} {kind} instead of an awaitable: complete must be an async def "
            "(async def complete(self, messages, tools, signal) -> AssistantMessage)"
        )
    return cast(Awaitable[AssistantMessage], pending)


def _takes_an_argument(fn: Callable[..., Any]) -> bool:
    """True if ``fn`` can be called with one positional argument (the context)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters
    )
