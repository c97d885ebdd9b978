"""Scenarios: a frozen description of one run, and the deterministic runner.

A ``Scenario`` says everything that happens *outside* the loop under test: what the
model answers on each call (text, tool calls with known or unknown names and valid
or invalid arguments, any stop reason, or a raise), how each tool call behaves
(return, raise, take some event-loop ticks, honour or ignore the abort signal, hang
until cancelled), when the caller aborts, and the turn limit. ``run_scenario``
builds a scripted ``ModelClient`` and scripted ``Tool`` objects from it, runs *any*
loop of the shape::

    async def loop(*, model, tools, messages, max_turns, signal) -> Sequence[Message] | RunResult

and returns a ``RunRecord``: the transcript plus what the scripted model and tools
observed (which calls really ran, whether their cleanup finished before the loop
returned, when the abort fired). The properties in ``properties.py`` judge that
record.

Why the scripted tools find their behaviour through a ``key`` argument: a tool's
``execute`` receives only its arguments and the signal, never the call id (and a
loop may legitimately rename empty or repeated ids). Every scripted call carries a
unique ``key`` such as ``"t2c0"`` (turn 2, call 0), so a tool knows which scripted
call it is executing whatever the loop did to the ids.

Timing is made of event-loop ticks (``await asyncio.sleep(0)``), so that completion
orders vary between calls yet repeat exactly between runs; real sleeps are at most a
few milliseconds. A hanging model or tool waits until it is cancelled, with a safety
net (``hang_limit``) so that a loop that never cancels still returns.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

import attrs

from statemachine.agent.run import RunResult, run_agent
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    message_from_dict,
)
from statemachine.core.tools import ToolDefinition
from statemachine.testing.clock import runner_for

__all__ = [
    "DEFAULT_HISTORY",
    "KNOWN_TOOLS",
    "UNKNOWN_TOOL",
    "AbortAt",
    "AbortKind",
    "AgentLoop",
    "Execution",
    "ModelTurn",
    "OnAbort",
    "Outcome",
    "RunRecord",
    "Scenario",
    "ScenarioModel",
    "ScenarioRunner",
    "Scripted",
    "ScriptedCall",
    "ToolBehaviour",
    "agent_loop",
    "call_key",
    "run_scenario",
    "run_scenario_async",
    "scripted_tools",
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


class OnAbort(enum.StrEnum):
    """What a scripted model call or tool does when the run is aborted under it."""

    HONOUR = "honour"  # stop promptly (after its cleanup) and report the abort
    IGNORE = "ignore"  # finish the scripted work as if nothing happened
    HANG = "hang"  # never finish on its own: wait until it is cancelled

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

    def __repr__(self) -> str:
        return f"AbortKind.{self.name}"


@attrs.frozen
class AbortAt:
    """The abort instant of a scenario."""

    kind: AbortKind = attrs.field(default=AbortKind.NEVER, converter=AbortKind)
    turn: int = 0
    call: int = 0

    def describe(self) -> str:
        """The instant in words."""
        if self.kind is AbortKind.NEVER:
            return "never"
        if self.kind is AbortKind.BEFORE_START:
            return "before the loop starts"
        if self.kind is AbortKind.MODEL_CALL:
            return f"during model call {self.turn}"
        return f"when tool call {call_key(self.turn, self.call)} starts"


def call_key(turn: int, index: int) -> str:
    """The ``key`` argument of call ``index`` of the response to model call ``turn``."""
    return f"t{turn}c{index}"


@attrs.frozen
class Scenario:
    """One run, described completely: model script, tools, abort instant, limit."""

    turns: tuple[ModelTurn, ...] = attrs.field(converter=_turns_tuple)
    abort: AbortAt = AbortAt()
    max_turns: int = 8
    history: tuple[Message, ...] = attrs.field(default=DEFAULT_HISTORY, converter=_history_tuple)

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


# -- the scripted model and tools ---------------------------------------------------------


class _Observer:
    """Shared bookkeeping of one run: what the model and tools saw."""

    def __init__(self, scenario: Scenario, controller: AbortController, hang_limit: float):
        self.scenario = scenario
        self.controller = controller
        self.hang_limit = hang_limit
        self.model_calls = 0
        self.produced: list[AssistantMessage] = []
        self.raised_at: list[int] = []
        self.executions: list[Execution] = []
        self.abort_fired = False
        self.abort_fired_after = 0
        self.model_calls_after_abort = 0
        self.model_hang_expired = False

    def fire_abort(self, where: str) -> None:
        if not self.abort_fired:
            self.abort_fired = True
            self.abort_fired_after = self.model_calls
            self.controller.abort(f"scenario abort {where}")


async def _ticks(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _build_message(scenario: Scenario, number: int, turn: ModelTurn) -> AssistantMessage:
    content: list[Any] = []
    if turn.text:
        content.append(TextContent(turn.text))
    for c, call in enumerate(turn.calls):
        key = call_key(number, c)
        arguments: dict[str, Any] = {"key": key}
        if not call.valid_arguments:
            arguments["count"] = "many"  # the schema says integer
        call_id = f"call_{number}_{c}" if call.call_id is None else call.call_id
        content.append(ToolCall(call_id, call.tool, arguments))
    return AssistantMessage(tuple(content), stop_reason=turn.stop_reason)


class ScenarioModel:
    """A ``ModelClient`` that answers model call *n* with ``scenario.turns[n-1]``.

    Its answers do not depend on the context it is sent, so what a correct loop must
    do follows from the scenario alone. Past the end of the script it answers plain
    text with no tool call.
    """

    def __init__(self, observer: _Observer) -> None:
        self._obs = observer

    @property
    def calls(self) -> int:
        """Model calls made so far."""
        return self._obs.model_calls

    @property
    def produced(self) -> tuple[AssistantMessage, ...]:
        """The messages returned so far, in order."""
        return tuple(self._obs.produced)

    async def complete(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolDefinition],
        signal: AbortSignal,
    ) -> AssistantMessage:
        obs = self._obs
        if obs.abort_fired:
            obs.model_calls_after_abort += 1
        obs.model_calls += 1
        number = obs.model_calls
        scenario = obs.scenario
        turn = scenario.turn(number)
        abort = scenario.abort
        if abort.kind is AbortKind.MODEL_CALL and abort.turn == number:
            obs.fire_abort(f"during model call {number}")
            # The abort happens while the call is in flight: give the loop one tick
            # to hear of it before this call can possibly return.
            await asyncio.sleep(0)
            behaviour = turn.on_abort if turn is not None else OnAbort.HONOUR
            if behaviour is OnAbort.HONOUR:
                # Give the loop a few ticks to forward the abort to this signal; a
                # provider whose connection is cut reports the abort either way.
                for _ in range(50):
                    if signal.aborted:
                        break
                    await asyncio.sleep(0)
                text = turn.text if turn is not None else ""
                message = AssistantMessage(
                    (TextContent(text),) if text else (), stop_reason=StopReason.ABORTED
                )
                obs.produced.append(message)
                return message
            if behaviour is OnAbort.HANG:
                await asyncio.sleep(obs.hang_limit)
                obs.model_hang_expired = True
        if turn is None:
            message = script_exhausted_message()
            obs.produced.append(message)
            return message
        await _ticks(turn.ticks)
        if turn.raises:
            obs.raised_at.append(number)
            raise RuntimeError(f"scripted model failure on call {number}")
        message = _build_message(scenario, number, turn)
        obs.produced.append(message)
        return message


class ScriptedToolError(RuntimeError):
    """What a scripted tool with outcome ``raise`` raises."""


# Made once: checking a schema costs far more than a whole scripted run.
_DEFINITIONS: Mapping[str, ToolDefinition] = {
    name: ToolDefinition(
        name, f"Scripted tool {name}: its behaviour follows the scenario.", _PARAMETERS
    )
    for name in KNOWN_TOOLS
}


def _make_tool(name: str, observer: _Observer) -> Tool:
    definition = _DEFINITIONS[name]

    async def execute(arguments: dict[str, Any], signal: AbortSignal) -> str:
        obs = observer
        key = str(arguments.get("key", ""))
        behaviour = obs.scenario.behaviour(key) or ToolBehaviour()
        ex = Execution(key, name, len(obs.executions), obs.abort_fired)
        obs.executions.append(ex)
        abort = obs.scenario.abort
        # Every await is inside the try, the first one included: a loop that cancels
        # the tool as soon as it has started must see it recorded as ended (cancelled).
        try:
            if abort.kind is AbortKind.TOOL_START and call_key(abort.turn, abort.call) == key:
                obs.fire_abort(f"when tool call {key} started")
                await asyncio.sleep(0)  # as for the model: the abort lands mid-call
            honour = behaviour.on_abort is OnAbort.HONOUR
            for _ in range(behaviour.ticks):
                if honour and signal.aborted:
                    break
                await asyncio.sleep(0)
            if behaviour.sleep and not (honour and signal.aborted):
                await asyncio.sleep(behaviour.sleep)
            if behaviour.on_abort is OnAbort.HANG:
                await asyncio.sleep(obs.hang_limit)
                ex.how = "hang expired"
            if honour and signal.aborted:
                ex.saw_abort = True
                await _ticks(behaviour.cleanup_ticks)
                ex.cleanup_done = True
                ex.how = "aborted"
                raise ScriptedToolError(f"Operation aborted in {name} ({key})")
            if behaviour.outcome is Outcome.RAISE:
                ex.how = "raised"
                raise ScriptedToolError(f"{name} failed for {key}")
            output = f"{name} output for {key}"
            if ex.how == "running":
                ex.how = "returned"
            ex.output = output
            return output
        except asyncio.CancelledError:
            ex.how = "cancelled"
            await _ticks(behaviour.cleanup_ticks)
            ex.cleanup_done = True
            raise
        finally:
            ex.finished = True

    execute.__name__ = f"scripted_{name}"
    return Tool(definition, execute)


def scripted_tools(observer: _Observer) -> tuple[Tool, ...]:
    """The scenario's known tools, bound to one run's observer."""
    return tuple(_make_tool(name, observer) for name in KNOWN_TOOLS)


class Scripted:
    """A scenario's scripted model, tools and abort controller, for driving a loop by
    hand (``run_scenario`` does this for you and records the outcome)."""

    def __init__(self, scenario: Scenario, *, hang_limit: float = 1.0) -> None:
        self.controller = AbortController()
        self._observer = _Observer(scenario, self.controller, hang_limit)
        self.model = ScenarioModel(self._observer)
        self.tools = scripted_tools(self._observer)
        if scenario.abort.kind is AbortKind.BEFORE_START:
            self._observer.fire_abort("before the loop started")

    @property
    def signal(self) -> AbortSignal:
        """The signal to give the loop; the scenario's abort instant fires it."""
        return self.controller.signal

    @property
    def executions(self) -> tuple[Execution, ...]:
        """The tool executions so far, in start order."""
        return tuple(self._observer.executions)


# -- running a loop --------------------------------------------------------------------


def _as_messages(value: Any) -> tuple[tuple[Message, ...] | None, RunResult | None, str | None]:
    """Read what a loop returned: a RunResult, or a sequence of messages or wire dicts."""
    if isinstance(value, RunResult):
        return tuple(value.messages), value, None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return None, None, f"the loop returned a {type(value).__name__}, not a message sequence"
    out: list[Message] = []
    for i, item in enumerate(value):
        if isinstance(item, (UserMessage, AssistantMessage, ToolResultMessage)):
            out.append(item)
        elif isinstance(item, Mapping):
            try:
                out.append(message_from_dict(item, path=f"messages[{i}]"))
            except ValueError as exc:
                return None, None, f"the loop returned an unreadable message: {exc}"
        else:
            return None, None, f"the loop returned messages[{i}] of type {type(item).__name__}"
    return tuple(out), None, None


async def run_scenario_async(
    loop: AgentLoop,
    scenario: Scenario,
    *,
    timeout: float = 10.0,
    hang_limit: float = 1.0,
) -> RunRecord:
    """Run ``scenario`` through ``loop`` and record what happened.

    ``timeout`` bounds the whole run (a loop still running then is recorded as not
    returning); ``hang_limit`` is how long a hanging model call or tool waits to be
    cancelled before it gives up and finishes on its own (which I6 reports: a loop must
    cancel a call that ignores the abort, so raise it for a loop whose grace period is
    longer; on the idle-skipping loop a longer wait costs no real time).
    """
    controller = AbortController()
    obs = _Observer(scenario, controller, hang_limit)
    model = ScenarioModel(obs)
    tools = scripted_tools(obs)
    if scenario.abort.kind is AbortKind.BEFORE_START:
        obs.fire_abort("before the loop started")
    transcript: tuple[Message, ...] | None = None
    result: RunResult | None = None
    error: str | None = None
    timed_out = False
    try:
        value = await asyncio.wait_for(
            loop(
                model=model,
                tools=tools,
                messages=list(scenario.history),
                max_turns=scenario.max_turns,
                signal=controller.signal,
            ),
            timeout,
        )
    except TimeoutError:
        timed_out = True
        error = f"the loop did not return within {timeout:g} s"
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the runner itself is being cancelled: not the loop's doing
        error = "CancelledError escaped the loop"
    except Exception as exc:  # noqa: BLE001 - an escaping exception is what I8 judges
        error = f"{type(exc).__name__}: {exc}"
    else:
        transcript, result, error = _as_messages(value)
    running = tuple(ex.key for ex in obs.executions if not ex.finished)
    # Let stragglers the loop abandoned finish, so they cannot leak into the next run.
    for _ in range(5):
        if all(ex.finished for ex in obs.executions):
            break
        await asyncio.sleep(0)
    return RunRecord(
        scenario=scenario,
        transcript=transcript,
        result=result,
        error=error,
        timed_out=timed_out,
        model_calls=obs.model_calls,
        produced=tuple(obs.produced),
        raised_at=tuple(obs.raised_at),
        executions=tuple(attrs.evolve(ex) for ex in obs.executions),
        running_at_return=running,
        abort_fired=obs.abort_fired,
        abort_fired_after_model_calls=obs.abort_fired_after,
        model_calls_after_abort=obs.model_calls_after_abort,
        model_hang_expired=obs.model_hang_expired,
    )


ScenarioRunner: TypeAlias = Callable[[AgentLoop, Scenario], RunRecord]


def run_scenario(
    loop: AgentLoop,
    scenario: Scenario,
    *,
    timeout: float = 10.0,
    hang_limit: float = 1.0,
    virtual_time: bool | None = None,
) -> RunRecord:
    """``run_scenario_async`` for code without an event loop (one fresh loop per call).

    ``virtual_time`` as in ``run_conformance``: by default the run goes on an event
    loop whose clock skips idle waits, unless ``loop.needs_real_time`` is set.
    """
    with runner_for(loop, virtual_time) as runner:
        return runner.run(
            run_scenario_async(loop, scenario, timeout=timeout, hang_limit=hang_limit)
        )


def agent_loop(*, grace_period: float = 0.02, **run_agent_kwargs: Any) -> AgentLoop:
    """``statemachine.run_agent`` in the loop shape the kit runs.

    The grace period is short (scripted tools that honour the abort stop within a
    few ticks) so conformance runs stay fast; the driver's logs are discarded unless
    ``logger=`` is given, because thousands of runs would otherwise flood the output.
    """
    if "logger" not in run_agent_kwargs:
        run_agent_kwargs["logger"] = _quiet_logger()

    async def loop(
        *,
        model: Any,
        tools: Sequence[Tool],
        messages: Sequence[Message],
        max_turns: int,
        signal: AbortSignal,
    ) -> RunResult:
        return await run_agent(
            model=model,
            tools=tools,
            messages=messages,
            max_turns=max_turns,
            signal=signal,
            grace_period=grace_period,
            **run_agent_kwargs,
        )

    return loop


def _quiet_logger() -> Any:
    import logging

    import structlog

    return structlog.wrap_logger(
        structlog.ReturnLogger(),
        processors=[],
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
    )
