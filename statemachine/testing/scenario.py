"""Scenarios: a frozen description of one run, the one model of the kit and the specs.

A ``Scenario`` says everything that happens *outside* the loop under test: what the
model answers on each call (text, thinking, tool calls with known or unknown names and
valid, invalid or unreadable arguments, any stop reason, or a raise), how each tool
call behaves (return or raise, take event-loop ticks, wait for other calls or for the
abort, honour or ignore the abort, hang until cancelled), when the caller aborts, the
turn limit, and the hooks a person would install (permissions, a stop rule, messages
typed while the run goes on). Generated scenarios (``strategies``) use the kit's two
tools; a spec file (``specs/*.toml``, read by ``spec.py``) is a scenario written by
hand, with tools of its own and the expectations of its run.

``runner.run_scenario`` builds the scripted model, tools and hooks a scenario
describes (``world.py``), runs *any* loop of the shape::

    async def loop(*, model, tools, messages, max_turns, signal) -> Sequence[Message] | RunResult

and returns a ``RunRecord``: the transcript plus what the scripted model and tools
observed (which calls really ran, what the model was sent, whether cleanup finished
before the loop returned, when the abort fired). ``properties.py`` judges a record
against the invariants; ``spec.py`` against a spec's expectations.

Why the kit's tools find their behaviour through a ``key`` argument: a tool's
``execute`` receives only its arguments and the signal, never the call id (and a loop
may legitimately rename empty or repeated ids). Every generated call carries a unique
``key`` such as ``"t2c0"`` (turn 2, call 0). A call written with arguments of its own
is found by the order the driver starts the calls of a response in.

Timing is made of event-loop ticks (``await asyncio.sleep(0)``), so that completion
orders vary between calls yet repeat exactly between runs; real sleeps are at most a
few milliseconds. A hanging model or tool waits until it is cancelled, with a safety
net (``hang_limit``) so that a loop that never cancels still returns.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from statemachine.agent.events import (
    RunResult,
)
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import AssistantMessage, Message, StopReason, Usage, UserMessage
from statemachine.core.steps import StepSpec
from statemachine.core.tools import ToolDefinition
from statemachine.errors import ScriptedToolError

__all__ = [
    "DEFAULT_HISTORY",
    "KNOWN_TOOLS",
    "TOOL_DEFINITIONS",
    "UNKNOWN_TOOL",
    "AbortAt",
    "AbortKind",
    "AgentLoop",
    "Execution",
    "Hooks",
    "Input",
    "ModelTurn",
    "OnAbort",
    "Outcome",
    "RunRecord",
    "Scenario",
    "ScriptedCall",
    "ScriptedToolError",
    "ToolBehaviour",
    "call_key",
]

KNOWN_TOOLS: tuple[str, ...] = ("alpha", "beta")
"""The tools every scenario offers."""

UNKNOWN_TOOL = "ghost"
"""A tool name no scenario offers: calls to it must get an error result."""

_PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "properties": {"key": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["key"],
    "additionalProperties": False,
}

DEFAULT_HISTORY: tuple[Message, ...] = (UserMessage("Do the task."),)
"""The input history of a scenario unless it says otherwise."""


class AgentLoop(Protocol):
    """The shape of a loop under test (called with keyword arguments)."""

    def __call__(
        self,
        *,
        model: Any,
        tools: Sequence[Tool],
        messages: Sequence[Message],
        max_turns: int,
        signal: AbortSignal,
    ) -> Awaitable[Any]: ...


def _calls_tuple(value: Iterable[ScriptedCall]) -> tuple[ScriptedCall, ...]:
    return tuple(value)


def _turns_tuple(value: Iterable[ModelTurn]) -> tuple[ModelTurn, ...]:
    return tuple(value)


def _history_tuple(value: Iterable[Message]) -> tuple[Message, ...]:
    return tuple(value)


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _inputs_tuple(value: Iterable[Input]) -> tuple[Input, ...]:
    return tuple(value)


class OnAbort(enum.StrEnum):
    """What a scripted model call or tool does when the run is aborted under it."""

    HONOUR = "honour"  # stop promptly (after its cleanup) and report the abort
    IGNORE = "ignore"  # finish the scripted work as if nothing happened
    HANG = "hang"  # never finish on its own: wait until it is cancelled
    FINISH = "finish"  # a tool: stop cleanly and return its result, kept as it is
    RAISE = "raise"  # raise an error of its own while stopping
    STUBBORN = "stubborn"  # a tool: hang, swallow the cancellation, finish too late

    def __repr__(self) -> str:
        return f"OnAbort.{self.name}"


class Outcome(enum.StrEnum):
    """How a scripted tool ends when it is not interrupted."""

    RETURN = "return"
    RAISE = "raise"

    def __repr__(self) -> str:
        return f"Outcome.{self.name}"


@attrs.frozen
class ToolBehaviour:
    """How one scripted tool call behaves once a loop starts it."""

    outcome: Outcome = attrs.field(default=Outcome.RETURN, converter=Outcome)
    ticks: int = 0  # event-loop ticks before it finishes: varies completion order
    sleep: float = 0.0  # an extra real sleep in seconds (keep it to a few ms)
    on_abort: OnAbort = attrs.field(default=OnAbort.HONOUR, converter=OnAbort)
    cleanup_ticks: int = 0  # ticks its cleanup takes after an abort or cancellation
    returns: str | None = None  # the result text (default "<tool> output for <key>")
    is_error: bool = False  # the tool reports an error itself
    error: str = ""  # with outcome RAISE: raise RuntimeError(error) instead
    bad_output: bool = False  # return a value that is not a result
    after: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)  # keys to wait for
    until_abort: bool = False  # work until the abort fires, then do as ``on_abort`` says
    late_by: float = 0.0  # STUBBORN: seconds it goes on after being cancelled


@attrs.frozen
class ScriptedCall:
    """One tool call in a scripted model response.

    ``call_id`` None gives a unique id; ``""`` an empty one; any other text is used
    as it is, so two calls with the same text (or one that repeats an id of the
    input history) have duplicate ids.
    """

    tool: str = KNOWN_TOOLS[0]
    valid_arguments: bool = True
    call_id: str | None = None
    behaviour: ToolBehaviour = ToolBehaviour()
    arguments: Mapping[str, Any] | None = None  # as written; None: the generated ``key``
    parse_error: str | None = None  # the arguments could not be read

    @property
    def executable(self) -> bool:
        """True when a correct loop runs this call (known tool, valid arguments)."""
        return self.tool in KNOWN_TOOLS and self.valid_arguments


@attrs.frozen
class ModelTurn:
    """What the model does on one call: answer (text, tool calls, stop reason) or raise."""

    text: str = ""
    calls: tuple[ScriptedCall, ...] = attrs.field(default=(), converter=_calls_tuple)
    stop_reason: StopReason = attrs.field(default=StopReason.STOP, converter=StopReason)
    raises: bool = False
    ticks: int = 0
    on_abort: OnAbort = attrs.field(default=OnAbort.HONOUR, converter=OnAbort)
    thinking: str = ""
    error_message: str | None = None  # what a provider says with stop reason error/aborted
    error: str = ""  # with ``raises``: the text of the RuntimeError
    usage: Usage | None = None  # the token usage the response reports

    @property
    def asks_for_work(self) -> bool:
        """True when a correct loop runs tools after this response and calls again."""
        return (
            not self.raises
            and bool(self.calls)
            and self.stop_reason not in (StopReason.ERROR, StopReason.ABORTED)
        )


class AbortKind(enum.StrEnum):
    """When the caller aborts the run."""

    NEVER = "never"
    BEFORE_START = "before_start"  # the signal is aborted before the loop is called
    MODEL_CALL = "model_call"  # as model call ``turn`` (1-based) begins
    TOOL_START = "tool_start"  # as call ``call`` of turn ``turn``'s response starts
    PERMISSION = "permission"  # while the permission hook is asked about that call

    def __repr__(self) -> str:
        return f"AbortKind.{self.name}"


@attrs.frozen
class AbortAt:
    """The abort instant of a scenario."""

    kind: AbortKind = attrs.field(default=AbortKind.NEVER, converter=AbortKind)
    turn: int = 0
    call: int = 0
    reason: str = ""  # what the caller says; default: the instant in words

    def describe(self) -> str:
        """The instant in words."""
        if self.kind is AbortKind.NEVER:
            return "never"
        if self.kind is AbortKind.BEFORE_START:
            return "before the loop starts"
        if self.kind is AbortKind.MODEL_CALL:
            return f"during model call {self.turn}"
        if self.kind is AbortKind.PERMISSION:
            return f"while tool call {call_key(self.turn, self.call)} is asked about"
        return f"when tool call {call_key(self.turn, self.call)} starts"


def call_key(turn: int, index: int) -> str:
    """The ``key`` argument of call ``index`` of the response to model call ``turn``."""
    return f"t{turn}c{index}"


@attrs.frozen
class Input:
    """A message the user types while the run goes on, and when."""

    text: str
    kind: str = "steer"  # "steer" (next turn boundary) or "follow_up" (instead of stopping)
    before_start: bool = False
    model_call: int = 0  # during this model call (1-based)
    tool_start: str = ""  # when the call with this key starts


@attrs.frozen
class Hooks:
    """What a person installs around the run: a permission hook (by tool call id), a
    stop rule, and messages typed while it goes on. A scenario with hooks needs a loop
    that takes them (``agent_loop``)."""

    deny: Mapping[str, str] = attrs.field(factory=dict)  # policy denials
    advisory: Mapping[str, str] = attrs.field(factory=dict)  # denials the model reads
    approve: Mapping[str, str] = attrs.field(factory=dict)  # calls a person must approve
    raise_for: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)  # the hook raises
    permissions: bool = False  # install the permission hook
    stop_at_turn: int | None = None  # should_continue says stop at this boundary
    stop_reason: str = "should_continue said stop"
    inputs: tuple[Input, ...] = attrs.field(default=(), converter=_inputs_tuple)


@attrs.frozen
class Scenario:
    """One run, described completely: model script, tools, abort instant, limit,
    hooks. ``tools`` None offers the kit's tools (``KNOWN_TOOLS``)."""

    turns: tuple[ModelTurn, ...] = attrs.field(converter=_turns_tuple)
    abort: AbortAt = AbortAt()
    max_turns: int = 8
    history: tuple[Message, ...] = attrs.field(default=DEFAULT_HISTORY, converter=_history_tuple)
    tools: tuple[ToolDefinition, ...] | None = None
    hooks: Hooks | None = None
    script_must_last: bool = False  # a model call past the script raises instead of answering

    def turn(self, number: int) -> ModelTurn | None:
        """The scripted answer to model call ``number`` (1-based); None past the end."""
        return self.turns[number - 1] if 1 <= number <= len(self.turns) else None

    def behaviour(self, key: str) -> ToolBehaviour | None:
        """The behaviour of the scripted call with this ``key``."""
        for t, turn in enumerate(self.turns, 1):
            for c, call in enumerate(turn.calls):
                if call_key(t, c) == key:
                    return call.behaviour
        return None

    def describe(self) -> str:
        """The scenario as lines a person reads in a failure report."""
        lines = [f"max_turns={self.max_turns}; abort {self.abort.describe()}"]
        if self.history != DEFAULT_HISTORY:
            lines.append(f"input history: {len(self.history)} messages")
        if self.tools is not None:
            lines.append("tools: " + ", ".join(d.name for d in self.tools))
        if self.hooks is not None:
            lines.append(f"hooks: {self.hooks!r}")
        for t, turn in enumerate(self.turns, 1):
            head = f"model call {t}: "
            if turn.raises:
                head += "raises"
            else:
                head += f"stopReason={turn.stop_reason.value}"
                if turn.text:
                    head += f", text {turn.text!r}"
            if turn.ticks:
                head += f", {turn.ticks} ticks"
            if turn.on_abort is not OnAbort.HONOUR:
                head += f", on abort: {turn.on_abort.value}"
            lines.append(head)
            for c, call in enumerate(turn.calls):
                b = call.behaviour
                bits = [f"  {call_key(t, c)}: {call.tool}"]
                if not call.valid_arguments:
                    bits.append("invalid arguments")
                if call.call_id is not None:
                    bits.append(f"id {call.call_id!r}")
                if call.arguments is not None:
                    bits.append(f"arguments {dict(call.arguments)!r}")
                bits.append(b.outcome.value)
                if b.ticks:
                    bits.append(f"{b.ticks} ticks")
                if b.sleep:
                    bits.append(f"sleep {b.sleep * 1000:g} ms")
                if b.on_abort is not OnAbort.HONOUR:
                    bits.append(f"on abort: {b.on_abort.value}")
                if b.cleanup_ticks:
                    bits.append(f"cleanup {b.cleanup_ticks} ticks")
                lines.append(", ".join(bits))
        if not self.turns:
            lines.append("(no scripted response: the model answers plain text)")
        return "\n".join(lines)


def script_exhausted_message() -> AssistantMessage:
    """What the scripted model answers once its script has run out."""
    return AssistantMessage("The script has ended.", stop_reason=StopReason.STOP)


# -- what the run observed ------------------------------------------------------------


@attrs.define
class Execution:
    """One execution of a scripted tool, as the tool itself saw it."""

    key: str
    tool: str
    order: int  # 0-based start order within the run
    abort_fired_before_start: bool
    saw_abort: bool = False
    finished: bool = False  # the tool's code (cleanup included) has completed
    cleanup_done: bool = False  # it ran its abort/cancel cleanup
    how: str = "running"  # "returned", "raised", "aborted", "cancelled", "hang expired"
    output: str | None = None  # the text it returned, when it returned


@attrs.frozen
class RunRecord:
    """Everything one run of a scenario produced and observed."""

    scenario: Scenario
    transcript: tuple[Message, ...] | None  # None when the loop gave no usable history
    result: RunResult | None  # when the loop returned a RunResult
    error: str | None  # the exception that escaped the loop, or why it gave nothing
    timed_out: bool
    model_calls: int
    produced: tuple[AssistantMessage, ...]  # what the model returned, in order
    raised_at: tuple[int, ...]  # model calls that raised
    executions: tuple[Execution, ...]
    running_at_return: tuple[str, ...]  # keys of tools still running when it returned
    abort_fired: bool
    abort_fired_after_model_calls: int  # model calls begun when the abort fired
    model_calls_after_abort: int
    # A model call that ignored the abort and hung was never cancelled: it gave up by
    # itself after ``hang_limit`` (a tool's is its Execution's ``how``).
    model_hang_expired: bool = False
    requests: tuple[tuple[Message, ...], ...] = ()  # what the model was sent, per call
    finish_order: tuple[str, ...] = ()  # keys of the tool calls, in the order they ended
    # The team's steps of the run's table, and what they answered, (step, outcome) in
    # order (``_step_decisions.py``): ``expected_run`` takes them into account.
    steps: tuple[StepSpec, ...] = ()
    decisions: tuple[tuple[str, str], ...] = ()


TOOL_DEFINITIONS: Mapping[str, ToolDefinition] = {
    name: ToolDefinition(
        name, f"Scripted tool {name}: its behaviour follows the scenario.", _PARAMETERS
    )
    for name in KNOWN_TOOLS
}
"""The kit's tools. Made once: checking a schema costs far more than a whole run."""

_DEFINITIONS = TOOL_DEFINITIONS
