"""The scripted world of a scenario: the model, the tools and the hooks it describes.

``Scripted(scenario)`` builds them for one run, bound to one ``_Observer`` that
records what they saw (the ``RunRecord`` of ``runner.py`` is made from it) and fires
the abort at the scenario's instant. Everything here answers from the scenario alone,
never from a clock: a tool that must finish after another waits for it, and a tool
that works until the abort polls the signal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from statemachine.agent.hooks import (
    Deny,
    RequireApproval,
    Stop,
)
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
)
from statemachine.core.tools import ToolDefinition, ToolOutput, ToolReturn
from statemachine.testing.scenario import (
    KNOWN_TOOLS,
    TOOL_DEFINITIONS,
    AbortKind,
    Execution,
    Hooks,
    ModelTurn,
    OnAbort,
    Outcome,
    Scenario,
    ScriptedToolError,
    ToolBehaviour,
    call_key,
    script_exhausted_message,
)

__all__ = ["ScenarioHooks", "ScenarioModel", "Scripted", "scripted_tools"]


class _Steerable(Protocol):
    def steer(self, text: str) -> None: ...
    def follow_up(self, text: str) -> None: ...


class _Observer:
    """Shared bookkeeping of one run: what the model and tools saw."""

    def __init__(self, scenario: Scenario, controller: AbortController, hang_limit: float):
        self.scenario = scenario
        self.controller = controller
        self.hang_limit = hang_limit
        self.model_calls = 0
        self.produced: list[AssistantMessage] = []
        self.requests: list[tuple[Message, ...]] = []
        self.raised_at: list[int] = []
        self.executions: list[Execution] = []
        self.finish_order: list[str] = []
        self.abort_fired = False
        self.abort_fired_after = 0
        self.model_calls_after_abort = 0
        self.model_hang_expired = False
        self.batch: list[tuple[str, ToolCall]] = []  # the latest response's calls, by key
        self.started: set[str] = set()  # keys of that batch whose tool has started
        self.done: dict[str, asyncio.Event] = {}
        self.run: _Steerable | None = None  # the run handle, for typed input

    def fire_abort(self, where: str) -> None:
        if not self.abort_fired:
            self.abort_fired = True
            self.abort_fired_after = self.model_calls
            self.controller.abort(self.scenario.abort.reason or f"scenario abort {where}")

    def done_event(self, key: str) -> asyncio.Event:
        return self.done.setdefault(key, asyncio.Event())

    def which_call(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The key of the scripted call a tool is executing.

        A generated call says it in its ``key`` argument. One written with arguments
        of its own is the first call of the latest response to this tool with these
        arguments that has not started yet: the driver starts calls in call order.
        """
        key = arguments.get("key")
        if isinstance(key, str) and self.scenario.behaviour(key) is not None:
            return key
        for batch_key, call in self.batch:
            fits = call.name == name and call.arguments_dict() == dict(arguments)
            if fits and batch_key not in self.started:
                self.started.add(batch_key)
                return batch_key
        return str(key) if isinstance(key, str) else ""

    def key_of(self, call: ToolCall) -> str:
        """The key of the latest response's call with this id ("" when none has it)."""
        return next((key for key, c in self.batch if c.id == call.id), "")

    async def typed(
        self, *, before_start: bool = False, model_call: int = 0, tool: str = ""
    ) -> None:
        """Queue the inputs the user types at this point (steer or follow up).

        The driver posts queued input on the loop's next turn; yielding once lets it
        reach the engine before the answer of the call in progress, which is what
        "during the call" means in a scenario.
        """
        hooks = self.scenario.hooks
        if hooks is None or self.run is None:
            return
        queued = False
        for item in hooks.inputs:
            at_start = before_start and item.before_start
            if (
                at_start
                or (model_call and item.model_call == model_call)
                or (tool and item.tool_start == tool)
            ):
                queued = True
                if item.kind == "follow_up":
                    self.run.follow_up(item.text)
                else:
                    self.run.steer(item.text)
        if queued:
            await asyncio.sleep(0)


async def _ticks(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _until_aborted(signal: AbortSignal) -> None:
    while not signal.aborted:
        await asyncio.sleep(0.001)


def _build_message(number: int, turn: ModelTurn) -> AssistantMessage:
    content: list[Any] = []
    if turn.thinking:
        content.append(ThinkingContent(turn.thinking))
    if turn.text:
        content.append(TextContent(turn.text))
    for c, call in enumerate(turn.calls):
        if call.arguments is not None:
            arguments: dict[str, Any] = dict(call.arguments)
        else:
            arguments = {"key": call_key(number, c)}
            if not call.valid_arguments:
                arguments["count"] = "many"  # the schema says integer
        call_id = f"call_{number}_{c}" if call.call_id is None else call.call_id
        content.append(ToolCall(call_id, call.tool, arguments, parse_error=call.parse_error))
    return AssistantMessage(
        tuple(content),
        stop_reason=turn.stop_reason,
        error_message=turn.error_message,
        usage=turn.usage,
    )


class ScenarioModel:
    """A ``ModelClient`` that answers model call *n* with ``scenario.turns[n-1]``.

    Its answers do not depend on the context it is sent, so what a correct loop must
    do follows from the scenario alone. Past the end of the script it answers plain
    text with no tool call (or raises, for a scenario whose script must last).
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
        obs.requests.append(tuple(messages))
        number = obs.model_calls
        turn = obs.scenario.turn(number)
        await obs.typed(model_call=number)
        abort = obs.scenario.abort
        if abort.kind is AbortKind.MODEL_CALL and abort.turn == number:
            aborted = await self._aborted_call(number, turn, signal)
            if aborted is not None:
                return self._produce(aborted)
        if turn is None:
            if obs.scenario.script_must_last:
                raise RuntimeError(
                    f"the scenario scripts {len(obs.scenario.turns)} model response(s); "
                    f"call {number} has none"
                )
            return self._produce(script_exhausted_message())
        await _ticks(turn.ticks)
        if turn.raises:
            obs.raised_at.append(number)
            raise RuntimeError(turn.error or f"scripted model failure on call {number}")
        message = self._produce(_build_message(number, turn))
        obs.batch = [(call_key(number, c), call) for c, call in enumerate(message.tool_calls)]
        obs.started = set()
        return message

    def _produce(self, message: AssistantMessage) -> AssistantMessage:
        self._obs.produced.append(message)
        return message

    async def _aborted_call(
        self, number: int, turn: ModelTurn | None, signal: AbortSignal
    ) -> AssistantMessage | None:
        """The abort fires while this call is in flight; what the call does then (None:
        it goes on to its scripted answer)."""
        obs = self._obs
        obs.fire_abort(f"during model call {number}")
        # Give the loop one tick to hear of it before this call can possibly return.
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
            return AssistantMessage(
                (TextContent(text),) if text else (),
                stop_reason=StopReason.ABORTED,
                error_message=turn.error_message if turn is not None else None,
            )
        if behaviour is OnAbort.RAISE:
            await _until_aborted(signal)
            raise RuntimeError("the request was aborted")
        if behaviour is OnAbort.HANG:
            await asyncio.sleep(obs.hang_limit)
            obs.model_hang_expired = True
        return None


def _make_tool(definition: ToolDefinition, observer: _Observer) -> Tool:
    name = definition.name

    async def execute(arguments: dict[str, Any], signal: AbortSignal) -> ToolReturn:
        obs = observer
        key = obs.which_call(name, arguments)
        behaviour = obs.scenario.behaviour(key) or ToolBehaviour()
        ex = Execution(key, name, len(obs.executions), obs.abort_fired)
        obs.executions.append(ex)
        # Every await is inside the try, the first one included: a loop that cancels
        # the tool as soon as it has started must see it recorded as ended (cancelled).
        try:
            return await _behave(obs, name, key, behaviour, ex, signal)
        except asyncio.CancelledError:
            ex.how = "cancelled"
            if behaviour.on_abort is OnAbort.STUBBORN:
                await asyncio.sleep(behaviour.late_by)
                return "a result too late to count"
            await _ticks(behaviour.cleanup_ticks)
            ex.cleanup_done = True
            raise
        finally:
            ex.finished = True
            obs.finish_order.append(key)
            obs.done_event(key).set()

    execute.__name__ = f"scripted_{name}"
    return Tool(definition, execute)


async def _behave(
    obs: _Observer,
    name: str,
    key: str,
    b: ToolBehaviour,
    ex: Execution,
    signal: AbortSignal,
) -> ToolReturn:
    abort = obs.scenario.abort
    if abort.kind is AbortKind.TOOL_START and call_key(abort.turn, abort.call) == key:
        obs.fire_abort(f"when tool call {key} started")
        await asyncio.sleep(0)  # as for the model: the abort lands mid-call
    await obs.typed(tool=key)
    for other in b.after:
        await obs.done_event(other).wait()
    if b.until_abort:
        await _until_aborted(signal)
        ex.saw_abort = True
        if b.on_abort is OnAbort.RAISE:
            ex.how = "raised"
            raise RuntimeError("interrupted while cleaning up")
        if b.on_abort in (OnAbort.HANG, OnAbort.STUBBORN):
            await asyncio.sleep(obs.hang_limit)
            ex.how = "hang expired"
    honour = b.on_abort is OnAbort.HONOUR
    for _ in range(b.ticks):
        if honour and signal.aborted:
            break
        await asyncio.sleep(0)
    if b.sleep and not (honour and signal.aborted):
        await asyncio.sleep(b.sleep)
    if b.on_abort is OnAbort.HANG and not b.until_abort:
        await asyncio.sleep(obs.hang_limit)
        ex.how = "hang expired"
    if honour and signal.aborted:
        ex.saw_abort = True
        await _ticks(b.cleanup_ticks)
        ex.cleanup_done = True
        ex.how = "aborted"
        raise ScriptedToolError(f"Operation aborted in {name} ({key})")
    return _outcome(name, key, b, ex)


def _outcome(name: str, key: str, b: ToolBehaviour, ex: Execution) -> ToolReturn:
    """What the tool ends with when nothing stopped it."""
    if b.outcome is Outcome.RAISE:
        ex.how = "raised"
        if b.error:
            raise RuntimeError(b.error)
        raise ScriptedToolError(f"{name} failed for {key}")
    if b.bad_output:
        ex.how = "returned"
        return 42  # type: ignore[return-value]
    output = b.returns if b.returns is not None else f"{name} output for {key}"
    if ex.how == "running":
        ex.how = "returned"
    ex.output = output
    return ToolOutput(output, is_error=True) if b.is_error else output


def scripted_tools(observer: _Observer) -> tuple[Tool, ...]:
    """The scenario's tools (the kit's two unless it names its own), bound to one
    run's observer."""
    tools = observer.scenario.tools
    definitions = tools if tools is not None else [TOOL_DEFINITIONS[n] for n in KNOWN_TOOLS]
    return tuple(_make_tool(d, observer) for d in definitions)


class ScenarioHooks:
    """The hooks a scenario installs, for a loop that takes them (``agent_loop``)."""

    def __init__(self, observer: _Observer, hooks: Hooks) -> None:
        self._obs = observer
        self.hooks = hooks

    async def attach(self, run: _Steerable) -> None:
        """Give the hooks the run's handle, and queue what is typed before the start."""
        self._obs.run = run
        await self._obs.typed(before_start=True)

    async def before_tool_call(self, call: ToolCall) -> Deny | RequireApproval | None:
        obs, rules = self._obs, self.hooks
        abort = obs.scenario.abort
        key = obs.key_of(call)
        if abort.kind is AbortKind.PERMISSION and call_key(abort.turn, abort.call) == key:
            obs.fire_abort(f"while tool call {key} was asked about")
            await asyncio.Event().wait()
        if call.id in rules.raise_for:
            raise RuntimeError("the policy service is unreachable")
        if call.id in rules.deny:
            return Deny(rules.deny[call.id])
        if call.id in rules.advisory:
            return Deny(rules.advisory[call.id], advisory=True)
        if call.id in rules.approve:
            return RequireApproval(rules.approve[call.id])
        return None

    async def should_continue(self, messages: Sequence[Message], turn: int) -> Stop | None:
        if self.hooks.stop_at_turn == turn:
            return Stop(self.hooks.stop_reason)
        return None


class Scripted:
    """A scenario's scripted model, tools, hooks and abort controller, for driving a
    loop by hand (``run_scenario`` does this for you and records the outcome)."""

    def __init__(self, scenario: Scenario, *, hang_limit: float = 1.0) -> None:
        self.controller = AbortController()
        self._observer = _Observer(scenario, self.controller, hang_limit)
        self.model = ScenarioModel(self._observer)
        self.tools = scripted_tools(self._observer)
        self.hooks = (
            ScenarioHooks(self._observer, scenario.hooks) if scenario.hooks is not None else None
        )
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

    @property
    def observer(self) -> _Observer:
        """What the model and tools saw so far (the runner's record is made of it)."""
        return self._observer
