"""The asyncio driver: performs the engine's actions and feeds back what happened.

The engine decides; this module only does I/O. Every outstanding operation (the model
call, each tool call, the permission checks) runs in its own task, and every task
reports exactly once, through one queue, as an input event. The main loop takes one
event at a time and hands it to the engine, so the engine sees a strict sequence of
events even though tools finish in any order; that sequence is all the history
depends on (I5).

Abort and the grace period
--------------------------
When the run's signal fires, the driver forwards it to the internal signal that
tools and the model client hold, and tells the engine (``AbortRequested``). The
engine answers with ``CancelOperations`` naming what is still outstanding. The driver
waits ``grace_period`` seconds for those operations to finish on their own (a result
that arrives then is kept as it is, I6), then cancels their tasks (each reports
``*Cancelled``). An operation that even ignores cancellation (a sync tool in a thread,
or code that swallows ``CancelledError``) is given up after a second grace period:
the driver reports it cancelled and stops waiting, so ``run_agent`` returns within
about two grace periods whatever a client or tool does.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import attrs
import structlog

from ._abort import AbortController, AbortSignal
from ._engine import Engine, TransitionRecord
from ._errors import (
    AbortedError,
    AwaitingUserError,
    InvalidInputError,
    ModelFailedError,
    ModelOutputError,
    RunEndedError,
    ToolOutputError,
    TurnLimitExceededError,
    UsageError,
)
from ._events import (
    AbortRequested,
    Action,
    CallModel,
    CancelOperations,
    CheckPermission,
    Event,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    RunEnded,
    Start,
    StartTool,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from ._messages import AssistantMessage, Message, ToolCall
from ._model import ModelClient
from ._table import TurnState
from ._tools import Tool, ToolOutput, tool_output_from

__all__ = ["BeforeToolCall", "Deny", "RunResult", "run_agent", "run_agent_sync"]

DEFAULT_GRACE_PERIOD = 1.0
"""Seconds an aborted operation is given to finish its cleanup before cancellation."""


@attrs.frozen
class Deny:
    """What ``before_tool_call`` returns to refuse a call.

    A policy denial (the default) stops the run in ``AwaitingUser`` at the turn
    boundary; an ``advisory`` one only tells the model, and the run goes on.
    """

    reason: str
    advisory: bool = False


BeforeToolCall: TypeAlias = Callable[[ToolCall], Awaitable[Deny | None] | (Deny | None)]
"""``before_tool_call(call)``: return ``None`` to allow, a ``Deny`` to refuse."""

_ERRORS: dict[TurnState, type[RunEndedError]] = {
    TurnState.Aborted: AbortedError,
    TurnState.TurnLimitExceeded: TurnLimitExceededError,
    TurnState.Failed: ModelFailedError,
    TurnState.AwaitingUser: AwaitingUserError,
}


@attrs.frozen
class RunResult:
    """How a run ended: its state, the whole history, and why."""

    state: TurnState
    messages: tuple[Message, ...]
    error: RunEndedError | None
    turns: int
    explanation: str
    trace: tuple[TransitionRecord, ...] = ()
    run_id: str = ""

    @property
    def ok(self) -> bool:
        """True when the run ended ``Done``."""
        return self.state is TurnState.Done

    @property
    def final_text(self) -> str:
        """The text of the last assistant message ('' if there is none)."""
        for message in reversed(self.messages):
            if isinstance(message, AssistantMessage):
                return message.text
        return ""

    def raise_for_state(self) -> RunResult:
        """Raise ``error`` unless the run is ``Done``; return self otherwise."""
        if self.error is not None:
            raise self.error
        return self


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Run:
    """The I/O around one engine."""

    def __init__(
        self,
        engine: Engine,
        model: ModelClient,
        tools: dict[str, Tool],
        signal: AbortSignal,
        before_tool_call: BeforeToolCall | None,
        grace_period: float,
        log: Any,
    ) -> None:
        self.engine = engine
        self.model = model
        self.tools = tools
        self.user_signal = signal
        self.controller = AbortController()  # what tools and the model client hold
        self.before_tool_call = before_tool_call
        self.grace_period = grace_period
        self.log = log
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.tasks: dict[str, asyncio.Task[None]] = {}  # "model" or a call id
        self.reported: set[str] = set()  # keys whose one event has been queued
        self.helpers: set[asyncio.Task[None]] = set()  # permission and grace tasks
        self.aborting = False

    # -- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()

        def on_abort(reason: object) -> None:
            # May run in any thread: only hand the news to the loop.
            try:
                loop.call_soon_threadsafe(self._abort, str(reason))
            except RuntimeError:
                pass  # the loop is closed: the run is over, nothing to abort

        remove = self.user_signal.add_listener(on_abort)
        try:
            if self.user_signal.aborted:
                self._abort(str(self.user_signal.reason))
            else:
                self._perform(self.engine.handle(Start()))
            while not self.engine.is_finished:
                event = await self.queue.get()
                self._perform(self.engine.handle(event))
        finally:
            remove()
            await self._cleanup()

    def _abort(self, reason: str) -> None:
        if self.aborting or self.engine.is_finished:
            return
        self.aborting = True
        self.controller.abort(reason)
        for task in self.helpers:
            task.cancel()  # permission checks: their calls are answered by the engine
        self.queue.put_nowait(AbortRequested(reason))

    def _post(self, key: str, event: Event) -> None:
        """Queue the one event of an operation; later reports of it are dropped."""
        if key in self.reported:
            return
        self.reported.add(key)
        self.queue.put_nowait(event)

    def _perform(self, actions: Sequence[Action]) -> None:
        checks: list[ToolCall] = []
        for action in actions:
            if isinstance(action, CallModel):
                self._spawn("model", self._call_model(action))
            elif isinstance(action, StartTool):
                self._spawn(action.call.id, self._run_tool(action.call))
            elif isinstance(action, CheckPermission):
                checks.append(action.call)
            elif isinstance(action, CancelOperations):
                keys = (["model"] if action.model else []) + list(action.tool_call_ids)
                self._helper(self._cancel_after_grace(keys, action.reason))
            elif isinstance(action, RunEnded):
                pass  # the loop condition sees it
        if checks:
            self._helper(self._check_permissions(checks))

    def _spawn(self, key: str, coro: Awaitable[None]) -> None:
        self.reported.discard(key)
        self.tasks[key] = asyncio.ensure_future(coro)

    def _helper(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self.helpers.add(task)
        task.add_done_callback(self.helpers.discard)

    async def _cleanup(self) -> None:
        # Normally nothing is left: every operation reported before the run ended.
        # Left over only when the caller cancelled run_agent itself.
        pending = [t for t in (*self.tasks.values(), *self.helpers) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=self.grace_period)

    # -- operations --------------------------------------------------------------------

    async def _call_model(self, action: CallModel) -> None:
        try:
            message = await self.model.complete(
                action.messages, action.tools, self.controller.signal
            )
        except asyncio.CancelledError:
            self._post("model", ModelCancelled())
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is one failed call
            self.log.warning("model_call_failed", turn=action.turn, error=_describe(exc))
            self._post("model", ModelFailed(_describe(exc)))
            return
        if not isinstance(message, AssistantMessage):
            error = ModelOutputError(
                f"the model client returned {type(message).__name__}, expected an AssistantMessage"
            )
            self._post("model", ModelFailed(_describe(error)))
            return
        self._post("model", ModelResponded(message))

    async def _run_tool(self, call: ToolCall) -> None:
        tool = self.tools[call.name]
        signal = self.controller.signal
        try:
            value = await tool.execute(call.arguments_dict(), signal)
        except asyncio.CancelledError:
            self._post(call.id, ToolCancelled(call.id))
            raise
        except Exception as exc:  # noqa: BLE001 - a tool's failure becomes its result
            if signal.aborted:
                output = ToolOutput(f"Operation aborted: {_describe(exc)}", is_error=True)
            else:
                output = ToolOutput(_describe(exc), is_error=True)
            self.log.info("tool_raised", call_id=call.id, tool=call.name, error=_describe(exc))
            self._post(call.id, ToolFinished(call.id, output))
            return
        normalised = tool_output_from(value)
        if normalised is None:
            error = ToolOutputError(
                f"tool {call.name} returned a {type(value).__name__}; expected a str, a "
                "list of content blocks, or a ToolOutput"
            )
            self.log.warning("tool_bad_output", call_id=call.id, tool=call.name)
            normalised = ToolOutput(str(error), is_error=True)
        self._post(call.id, ToolFinished(call.id, normalised))

    async def _check_permissions(self, calls: list[ToolCall]) -> None:
        hook = self.before_tool_call
        assert hook is not None
        # In call order, one at a time: a hook may ask a person, one question at a time.
        for call in calls:
            try:
                decision = hook(call)
                if inspect.isawaitable(decision):
                    decision = await decision
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken hook fails closed
                self.log.warning("before_tool_call_raised", call_id=call.id, error=_describe(exc))
                decision = Deny(
                    f"the before_tool_call hook raised {_describe(exc)}; the call was not run"
                )
            if decision is None:
                self.queue.put_nowait(ToolPermitted(call.id))
            elif isinstance(decision, Deny):
                self.queue.put_nowait(ToolDenied(call.id, decision.reason, decision.advisory))
            else:
                self.queue.put_nowait(
                    ToolDenied(
                        call.id,
                        f"the before_tool_call hook returned {type(decision).__name__}, "
                        "expected None or Deny; the call was not run",
                    )
                )

    async def _cancel_after_grace(self, keys: list[str], reason: str) -> None:
        tasks = [self.tasks[k] for k in keys if k in self.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=self.grace_period)
        stubborn = [k for k in keys if k in self.tasks and not self.tasks[k].done()]
        for key in stubborn:
            self.tasks[key].cancel()
        if stubborn:
            await asyncio.wait([self.tasks[k] for k in stubborn], timeout=self.grace_period)
        for key in stubborn:
            if not self.tasks[key].done():
                # It ignored cancellation too: stop waiting for it (module docstring).
                self.log.warning("operation_abandoned", key=key, reason=reason)
                self._post(
                    key,
                    ModelCancelled("abandoned: it ignored cancellation")
                    if key == "model"
                    else ToolCancelled(key, "abandoned: the tool ignored cancellation"),
                )


async def run_agent(
    *,
    model: ModelClient,
    messages: Sequence[Message],
    tools: Sequence[Tool] = (),
    max_turns: int = 8,
    signal: AbortSignal | None = None,
    before_tool_call: BeforeToolCall | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    logger: Any = None,
    run_id: str | None = None,
) -> RunResult:
    """Run the agent loop until a terminal state or ``AwaitingUser``.

    Never raises for how a run ends (see ``RunResult``); raises ``InvalidInputError``
    before any model call for an invalid history, duplicate tool names or bad
    arguments.
    """
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidInputError("tools must be a sequence of Tool")
    for i, item in enumerate(tools):
        if not isinstance(item, Tool):
            raise InvalidInputError(
                f"tools[{i}] is a {type(item).__name__}, not a Tool (see statemachine.tool)"
            )
    if not callable(getattr(model, "complete", None)):
        raise InvalidInputError("model must have an async complete(messages, tools, signal)")
    if not isinstance(grace_period, (int, float)) or grace_period < 0:
        raise InvalidInputError(f"grace_period must be a non-negative number, got {grace_period!r}")
    if signal is not None and not isinstance(signal, AbortSignal):
        raise InvalidInputError("signal must be an AbortSignal (AbortController().signal)")
    run_id = run_id or uuid.uuid4().hex[:12]
    base = logger if logger is not None else structlog.get_logger("statemachine")
    engine = Engine(
        tools=[t.definition for t in tools],
        messages=messages,
        max_turns=max_turns,
        check_permissions=before_tool_call is not None,
        run_id=run_id,
        logger=base,
    )
    run = _Run(
        engine,
        model,
        {t.name: t for t in tools},
        signal if signal is not None else AbortSignal(),
        before_tool_call,
        float(grace_period),
        base.bind(run_id=run_id),
    )
    await run.run()
    state = engine.state
    explanation = engine.explanation or ""
    error_type = _ERRORS.get(state)
    return RunResult(
        state=state,
        messages=tuple(engine.messages),
        error=error_type(explanation) if error_type is not None else None,
        turns=engine.turns,
        explanation=explanation,
        trace=tuple(engine.trace),
        run_id=run_id,
    )


def run_agent_sync(**kwargs: Any) -> RunResult:
    """``run_agent`` for code without an event loop (same keyword arguments)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_agent(**kwargs))
    raise UsageError(
        "run_agent_sync() cannot be called from a running event loop; "
        "use 'await run_agent(...)' instead"
    )
