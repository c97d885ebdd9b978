"""The asyncio driver: performs the engine's actions and feeds back what happened.

The engine decides; this module only does I/O and runs the caller's hooks. Every
outstanding operation (the model call, each tool call, the permission and
should_continue hooks) runs in its own task, and every task reports exactly once,
through one queue, as an input event. The main loop takes one event at a time and
hands it to the engine, so the engine sees a strict sequence of events even though
tools finish in any order; that sequence is all the history depends on (I5).

Abort and the grace period
--------------------------
When the run's signal fires, the driver forwards it to the internal signal that
tools and the model client hold, and tells the engine (``AbortRequested``) before any
event that was already waiting, so that no model call and no tool call starts after
the abort. The engine answers with ``CancelOperations`` naming what is still
outstanding. The grace period is one budget, counted from then: for its first half
the operations may finish on their own (a result that arrives then is kept as it is,
I6); then their tasks are cancelled (each reports ``*Cancelled`` once its cleanup has
run); an operation still running when the grace period ends (one that swallows
``CancelledError`` and keeps going, a sync tool in its thread) is abandoned: the
driver records it as such (result text, ``ToolEnded.abandoned``, the explanation)
and stops waiting for it. So ``run_agent`` returns within the grace period after the
abort is seen, whatever a client or tool does. Code that blocks the event loop
delays when the abort is seen (nothing can interrupt it); the grace period then runs
from when the loop is free again.

Exceptions that are not ``Exception``
-------------------------------------
A tool, model client or hook may raise any ``BaseException``. ``GeneratorExit`` or a
class of its own is that operation's failure like any exception (an error result, a
failed model call, the hook's failure path). ``KeyboardInterrupt`` and ``SystemExit``
mean "stop": the operation is answered the same way, the run is aborted and closed
(every task cancelled and awaited, every call answered), and then ``run()`` raises
the exception to its caller; ``AgentRun.result`` holds how the run ended. A
``CancelledError`` that nothing asked for is the operation's failure too. When the
caller cancels ``run()`` itself (``asyncio.Runner`` does so on Ctrl-C), the run is
aborted and closed the same way before the cancellation goes on.

Hooks and their failure modes
-----------------------------
- ``before_tool_call(call)``: ``None`` allows, ``Deny(reason)`` refuses (a policy
  denial stops the run in ``AwaitingUser`` at the turn boundary; ``advisory=True``
  only tells the model), ``RequireApproval(reason)`` suspends the call until a person
  decides. A hook that raises fails closed: a policy denial naming the error.
- ``after_tool_call(call, output)``: may return a replacement ``ToolOutput``. A hook
  that raises turns the result into an error result that names the hook's error and
  keeps the tool's own text (nothing is lost).
- ``should_continue(messages, turn)``: asked at each turn boundary; ``Stop(reason)``
  ends the run ``Done`` with the reason as explanation. A hook that raises stops the
  run the same way, with the error as the reason.
- ``transform_context(messages)``: what the model is sent (for compaction); the
  history itself stays append-only. A hook that raises fails that model call, so the
  run ends ``Failed`` with the hook's error as explanation.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeAlias, TypeVar

import attrs

from statemachine._log import library_logger
from statemachine.agent.model import ModelClient
from statemachine.agent.tools import Tool, tool_output_from
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.engine import ABANDONED, DEFAULT_MAX_SNAPSHOT_BYTES, Engine, TransitionRecord
from statemachine.core.errors import (
    AbortedError,
    AwaitingUserError,
    InvalidInputError,
    ModelFailedError,
    ModelOutputError,
    RunEndedError,
    SnapshotError,
    ToolOutputError,
    TurnLimitExceededError,
    UsageError,
)
from statemachine.core.events import (
    AbortRequested,
    Action,
    ApprovalDecided,
    ApprovalRequired,
    CallModel,
    CancelOperations,
    CheckContinue,
    CheckPermission,
    ContinueDecided,
    Event,
    InputKind,
    InputQueued,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    Start,
    StartTool,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.messages import AssistantMessage, Message, ToolCall, Usage, UserMessage
from statemachine.core.table import RETURNS_TO_CALLER, TurnState
from statemachine.core.tools import ToolOutput, validate_arguments

__all__ = [
    "AfterToolCall",
    "AgentRun",
    "BeforeToolCall",
    "Deny",
    "MessageAdded",
    "RequireApproval",
    "RunEvent",
    "RunFinished",
    "RunResult",
    "RunStarted",
    "RunStats",
    "ShouldContinue",
    "StateChanged",
    "Stop",
    "ToolEnded",
    "ToolProgress",
    "ToolStarted",
    "TransformContext",
    "TurnEnded",
    "TurnStarted",
    "current_tool_call",
    "report_progress",
    "resume_agent",
    "run_agent",
    "run_agent_sync",
]

DEFAULT_GRACE_PERIOD = 1.0
"""Seconds an aborted operation is given to finish its cleanup before cancellation."""

_T = TypeVar("_T")

# -- hook decisions ----------------------------------------------------------------


@attrs.frozen
class Deny:
    """What ``before_tool_call`` returns to refuse a call.

    A policy denial (the default) stops the run in ``AwaitingUser`` at the turn
    boundary; an ``advisory`` one only tells the model, and the run goes on.
    """

    # Checked here, inside the hook's own call: a bad value then takes the hook's
    # failure path (fail closed) instead of killing the permission task later.
    reason: str = attrs.field(validator=attrs.validators.instance_of(str))
    advisory: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


@attrs.frozen
class RequireApproval:
    """What ``before_tool_call`` returns when a person must approve the call first."""

    reason: str = attrs.field(default="", validator=attrs.validators.instance_of(str))


@attrs.frozen
class Stop:
    """What ``should_continue`` returns to end the run at a turn boundary."""

    reason: str = attrs.field(validator=attrs.validators.instance_of(str))


BeforeToolCall: TypeAlias = Callable[
    [ToolCall], Awaitable[Deny | RequireApproval | None] | Deny | RequireApproval | None
]
AfterToolCall: TypeAlias = Callable[
    [ToolCall, ToolOutput], Awaitable[ToolOutput | None] | ToolOutput | None
]
ShouldContinue: TypeAlias = Callable[[Sequence[Message], int], Awaitable[Stop | None] | Stop | None]
TransformContext: TypeAlias = Callable[
    [Sequence[Message]], Awaitable[Sequence[Message]] | Sequence[Message]
]

# -- the event stream ----------------------------------------------------------------


@attrs.frozen
class RunStarted:
    run_id: str


@attrs.frozen
class TurnStarted:
    turn: int


@attrs.frozen
class MessageAdded:
    index: int
    message: Message


@attrs.frozen
class StateChanged:
    record: TransitionRecord


@attrs.frozen
class ToolStarted:
    call: ToolCall


@attrs.frozen
class ToolProgress:
    call_id: str
    data: object


@attrs.frozen
class ToolEnded:
    """A tool call's outcome, in completion order (history keeps call order)."""

    call: ToolCall
    output: ToolOutput
    seconds: float
    cancelled: bool = False
    # Still running when the grace period ended: given up on, its cleanup unfinished.
    abandoned: bool = False


@attrs.frozen
class TurnEnded:
    turn: int
    seconds: float


@attrs.frozen
class RunFinished:
    state: TurnState
    explanation: str
    stats: RunStats


RunEvent: TypeAlias = (
    RunStarted
    | TurnStarted
    | MessageAdded
    | StateChanged
    | ToolStarted
    | ToolProgress
    | ToolEnded
    | TurnEnded
    | RunFinished
)


@attrs.frozen
class RunStats:
    """What a run cost. Times are measured by the driver, never by the engine."""

    model_calls: int
    tool_calls: Mapping[str, Mapping[str, int]]  # tool -> outcome ("ok"/"error"/"cancelled")
    usage: Usage
    turn_seconds: tuple[float, ...]
    tool_seconds: Mapping[str, float]  # call id -> seconds
    wall_seconds: float


_ERRORS: dict[TurnState, type[RunEndedError]] = {
    TurnState.Aborted: AbortedError,
    TurnState.TurnLimitExceeded: TurnLimitExceededError,
    TurnState.Failed: ModelFailedError,
    TurnState.AwaitingUser: AwaitingUserError,
}


@attrs.frozen
class RunResult:
    """How a run ended: its state, the whole history, and why."""

    # The history, the log and the snapshot grow with the run: they are left out of
    # repr(), which a long run would otherwise make megabytes long (task reprs, logs).
    state: TurnState
    messages: tuple[Message, ...] = attrs.field(repr=False)
    error: RunEndedError | None
    turns: int
    explanation: str
    trace: tuple[TransitionRecord, ...] = attrs.field(default=(), repr=False)
    run_id: str = ""
    stats: RunStats | None = attrs.field(default=None, repr=False)
    pending_approvals: tuple[ToolCall, ...] = ()
    queued_input: tuple[InputQueued, ...] = ()
    snapshot: Mapping[str, Any] | None = attrs.field(default=None, repr=False)

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


def _cancel_requested() -> bool:
    """True if someone called ``cancel()`` on the running task (not a stray raise)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


_FATAL = (KeyboardInterrupt, SystemExit)
"""What a tool, client or hook may raise to stop the process: re-raised after the run."""

_MODEL_NOT_STARTED = "not started: the run was aborted before the call began"
_TOOL_NOT_STARTED = "not started: the run was aborted before the tool began"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _EscapedError):
        exc = exc.original
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not kill the reporting task
        text = "(its text could not be read)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _maybe_await(value: Awaitable[_T] | _T) -> _T:
    if inspect.isawaitable(value):
        return await value
    return value


class StrayCancelledError(Exception):
    """User code raised ``CancelledError`` although nothing cancelled its task."""


class _EscapedError(Exception):
    """A ``BaseException`` that is not an ``Exception``, carried as an ordinary failure
    so that the failure path of whatever raised it runs (module docstring)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(_describe(original))
        self.original = original


def _fatal_in(exc: BaseException) -> BaseException | None:
    """The ``KeyboardInterrupt`` or ``SystemExit`` that ``exc`` is or carries."""
    original = exc.original if isinstance(exc, _EscapedError) else exc
    return original if isinstance(original, _FATAL) else None


async def _call_hook(hook: Callable[..., Awaitable[_T] | _T], *args: Any) -> _T:
    """Call a hook; whatever it raises reaches the caller as an ``Exception``, so the
    hook's failure path runs (otherwise its task dies silently and the run hangs)."""
    try:
        return await _maybe_await(hook(*args))
    except asyncio.CancelledError:
        if _cancel_requested():
            raise
        raise StrayCancelledError("raised by the hook though nothing cancelled it") from None
    except BaseException as exc:
        if isinstance(exc, Exception):
            raise
        raise _EscapedError(exc) from exc


async def _carried(awaitable: Awaitable[_T]) -> _T:
    """Await in a task of its own: a ``KeyboardInterrupt`` or ``SystemExit`` escaping a
    task is raised out of the event loop itself, so it leaves the task as a failure."""
    try:
        return await awaitable
    except _FATAL as exc:
        raise _EscapedError(exc) from exc


# -- progress reports from inside tools ------------------------------------------------

_progress_sink: contextvars.ContextVar[Callable[[object], None] | None] = contextvars.ContextVar(
    "statemachine_progress_sink", default=None
)


_current_call: contextvars.ContextVar[ToolCall | None] = contextvars.ContextVar(
    "statemachine_current_call", default=None
)


def current_tool_call() -> ToolCall | None:
    """The call a tool is executing (its id, name and arguments), or ``None``
    outside a tool run by the driver; works in sync tools' worker threads too."""
    return _current_call.get()


def report_progress(data: object) -> bool:
    """Report progress from inside a running tool (async or sync, any thread).

    Subscribers of ``AgentRun.events()`` receive a ``ToolProgress`` event. Returns
    False (and does nothing) outside a tool run by the driver.
    """
    sink = _progress_sink.get()
    if sink is None:
        return False
    sink(data)
    return True


# -- the run ------------------------------------------------------------------------------


class AgentRun:
    """One run of the loop, with a handle for steering, aborting and watching it.

    ``await AgentRun(...).run()`` is ``run_agent(...)``. Before or while it runs:
    ``steer(msg)`` queues a message for the next turn boundary, ``follow_up(msg)``
    one for when the model would otherwise finish, ``abort(reason)`` aborts, and
    ``events()`` is an async iterator of ``RunEvent``s (subscribe before ``run()``
    to see them all).
    """

    def __init__(
        self,
        *,
        model: ModelClient,
        messages: Sequence[Message] = (),
        tools: Sequence[Tool] = (),
        max_turns: int = 8,
        signal: AbortSignal | None = None,
        before_tool_call: BeforeToolCall | None = None,
        after_tool_call: AfterToolCall | None = None,
        should_continue: ShouldContinue | None = None,
        transform_context: TransformContext | None = None,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        logger: Any = None,
        run_id: str | None = None,
        engine_factory: Callable[..., Engine] = Engine,
        _engine: Engine | None = None,
        _resume_events: Sequence[Event] = (),
    ) -> None:
        _check_tools(tools)
        if not callable(getattr(model, "complete", None)):
            raise InvalidInputError("model must have an async complete(messages, tools, signal)")
        if (
            isinstance(grace_period, bool)
            or not isinstance(grace_period, (int, float))
            or not grace_period >= 0  # also refuses NaN, with which the grace never ends
        ):
            raise InvalidInputError(
                f"grace_period must be a non-negative number, got {grace_period!r}"
            )
        if signal is not None and not isinstance(signal, AbortSignal):
            raise InvalidInputError("signal must be an AbortSignal (AbortController().signal)")
        base = logger if logger is not None else library_logger()
        if _engine is None:
            run_id = run_id or uuid.uuid4().hex[:12]
            _engine = engine_factory(
                tools=[t.definition for t in tools],
                messages=messages,
                max_turns=max_turns,
                check_permissions=before_tool_call is not None,
                check_continue=should_continue is not None,
                scheduling={t.name: t.scheduling for t in tools},
                run_id=run_id,
                logger=base,
            )
        else:
            # A restored engine asks the hooks that this run has: hooks are code, they
            # do not travel in a snapshot.
            _engine.check_permissions = before_tool_call is not None
            _engine.check_continue = should_continue is not None
        self.engine = _engine
        self.run_id = _engine.run_id
        self._resume_events = tuple(_resume_events)
        self._model = model
        self._tools = {t.name: t for t in tools}
        self._user_signal = signal if signal is not None else AbortSignal()
        self._controller = AbortController()  # what tools and the model client hold
        self._before = before_tool_call
        self._after = after_tool_call
        self._should_continue = should_continue
        self._transform = transform_context
        self._grace = float(grace_period)
        self._log = base.bind(run_id=self.run_id)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._late_input: list[InputQueued] = []  # queued, but the run had already ended
        self._inbox: asyncio.Queue[Event] | None = None
        self._early: list[Event] = []  # input queued before run() started
        self._tasks: dict[str, asyncio.Task[None]] = {}  # "model" or a call id
        self._reported: set[str] = set()  # keys whose one event has been queued
        self._helpers: set[asyncio.Task[None]] = set()  # hooks and grace timers
        self._aborting = False
        self._started = False
        self._finished = False
        self._subscribers: list[asyncio.Queue[RunEvent | None]] = []
        # bookkeeping for the event stream and stats
        self._seen_messages = len(_engine.messages)
        self._seen_trace = len(_engine.trace)
        self._t0 = 0.0
        self._turn_start: float | None = None
        self._turn_seconds: list[float] = []
        self._tool_start: dict[str, float] = {}
        self._tool_seconds: dict[str, float] = {}
        self._tool_counts: dict[str, dict[str, int]] = {}
        self._usage = Usage()
        self._model_calls = 0
        self._model_exception: BaseException | None = None
        self._fatal: BaseException | None = None  # raised again once the run is closed
        self._abort_first: AbortRequested | None = None  # handled before queued events
        self._abandoned: set[str] = set()  # keys given up on at the end of the grace
        self._outcome: RunResult | None = None

    @property
    def result(self) -> RunResult | None:
        """How the run ended, once ``run()`` has returned or raised (a
        ``KeyboardInterrupt`` or ``SystemExit`` from a tool, client or hook, or the
        caller's cancellation); ``None`` before."""
        return self._outcome

    # -- the caller's handle ------------------------------------------------------------

    def steer(self, message: str | UserMessage) -> None:
        """Queue a message for the model, injected at the next turn boundary."""
        self._queue_input(message, InputKind.STEER)

    def follow_up(self, message: str | UserMessage) -> None:
        """Queue a message used when the model would otherwise finish."""
        self._queue_input(message, InputKind.FOLLOW_UP)

    def abort(self, reason: object = None) -> None:
        """Abort the run (thread-safe); same as aborting the run's signal."""
        reason = "aborted by the caller" if reason is None else reason
        if self._loop is None:
            self._early.append(AbortRequested(str(reason)))
        elif self._finished:
            return  # nothing left to abort; not an error (abort is idempotent)
        elif threading.get_ident() == self._loop_thread:
            self._abort(str(reason))
        else:
            try:
                self._loop.call_soon_threadsafe(self._abort, str(reason))
            except RuntimeError:
                pass  # the loop has closed: the run is over

    def events(self) -> AsyncIterator[RunEvent]:
        """An async iterator of this run's events; ends after ``RunFinished``."""
        queue: asyncio.Queue[RunEvent | None] = asyncio.Queue()
        if self._finished:
            queue.put_nowait(None)
        self._subscribers.append(queue)

        async def iterate() -> AsyncIterator[RunEvent]:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item

        return iterate()

    def _queue_input(self, message: str | UserMessage, kind: InputKind) -> None:
        if isinstance(message, str):
            message = UserMessage(message)
        if not isinstance(message, UserMessage):
            raise InvalidInputError("queued input must be a str or a UserMessage")
        if self._finished:
            raise UsageError("the run has ended; start a new run with this message")
        event = InputQueued(message, kind)
        if self._loop is None:
            self._early.append(event)
        elif threading.get_ident() == self._loop_thread:
            # From a tool, hook or model client of this run: queue it now, so it is
            # ahead of the event that the calling operation reports next.
            self._post_input(event)
        else:
            self._loop.call_soon_threadsafe(self._post_input, event)

    def _post_input(self, event: Event) -> None:
        assert self._inbox is not None
        self._inbox.put_nowait(event)

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Drive the run to a terminal state or ``AwaitingUser``; never raises for
        how it ends (see ``RunResult``), only a ``KeyboardInterrupt`` or
        ``SystemExit`` raised under it, once the run is closed (module docstring)."""
        if self._started:
            raise UsageError("an AgentRun runs once; create a new one (or resume_agent)")
        self._started = True
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._inbox = asyncio.Queue()
        self._t0 = time.perf_counter()

        loop_thread = threading.get_ident()

        def on_abort(reason: object) -> None:
            # On the loop's own thread (a tool or hook aborting), act at once, so the
            # signals that tools hold fire before the aborting code's next line; from
            # any other thread, only hand the news to the loop.
            if threading.get_ident() == loop_thread:
                self._abort(str(reason))
                return
            try:
                loop.call_soon_threadsafe(self._abort, str(reason))
            except RuntimeError:
                pass  # the loop is closed: the run is over, nothing to abort

        remove = self._user_signal.add_listener(on_abort)
        try:
            self._emit(partial(RunStarted, self.run_id))
            early_inputs = [e for e in self._early if isinstance(e, InputQueued)]
            early_abort = next((e for e in self._early if isinstance(e, AbortRequested)), None)
            if self._user_signal.aborted or early_abort is not None:
                # Aborted before anything started: no model call is made at all.
                if not self._resume_events:
                    for queued in early_inputs:
                        self._handle(queued)  # kept as queued input, nothing is lost
                reason = (
                    str(self._user_signal.reason) if early_abort is None else early_abort.reason
                )
                self._aborting = True
                self._controller.abort(reason)
                self._handle(AbortRequested(reason))
            else:
                first: list[Event] = (
                    [*self._resume_events, *early_inputs]
                    if self._resume_events
                    else [*early_inputs, Start()]
                )
                for event in first:
                    self._handle(event)
            try:
                await self._drive()
            except asyncio.CancelledError:
                # The caller cancelled run() (asyncio.Runner does on Ctrl-C): close the
                # run as an abort, so every call still gets its result, then go on.
                self._abort("the caller cancelled the run")
                await self._drive()
                raise
        finally:
            remove()
            await self._cleanup()
            self._outcome = self._result()
        if self._fatal is not None:
            raise self._fatal
        return self._outcome

    async def _drive(self) -> None:
        engine = self.engine
        inbox = self._inbox
        assert inbox is not None
        while not engine.is_finished:
            event = await inbox.get()
            first = self._abort_first
            if first is not None:
                # An abort goes ahead of what was already queued: a result queued
                # before it must not start a new model call or tool call.
                self._abort_first = None
                self._handle(first)
                if event is first:
                    continue
                if engine.is_finished:
                    self._keep_late(event)
                    break
            self._handle(event)
        # Input that was queued but arrived after the run ended is not dropped: it
        # is reported with the result, like input the run never got to inject.
        while not inbox.empty():
            self._keep_late(inbox.get_nowait())

    def _keep_late(self, event: Event) -> None:
        if isinstance(event, InputQueued):
            self._late_input.append(event)

    def _handle(self, event: Event) -> None:
        if isinstance(event, (ToolFinished, ToolCancelled)):
            self._tool_done(event)
        actions = self.engine.handle(event)
        self._observe()
        self._perform(actions)

    def _abort(self, reason: str, urgent: bool = True) -> None:
        """Abort the run; ``urgent`` puts the abort ahead of the events already queued
        (a caller's abort), otherwise it follows them (an operation's own failure)."""
        if self._aborting or self._finished:
            return
        self._aborting = True
        event = AbortRequested(reason)
        if urgent:
            self._abort_first = event
        try:
            self._controller.abort(reason)
        except _FATAL as exc:  # a tool's abort listener: first close the run
            self._fatal = self._fatal or exc
        for task in self._helpers:
            task.cancel()  # hooks: their calls are answered by the engine
        if self._inbox is not None:
            self._inbox.put_nowait(event)

    def _note_failure(self, exc: BaseException, where: str) -> None:
        """After an operation has reported its failure: if it was a KeyboardInterrupt
        or SystemExit, abort the run (behind that report) and raise it afterwards."""
        fatal = _fatal_in(exc)
        if fatal is None:
            return
        self._fatal = self._fatal or fatal
        self._log.warning("run_interrupted", by=where, error=_describe(fatal))
        reason = f"{type(fatal).__name__} raised by {where}"
        asyncio.get_running_loop().call_soon(self._abort, reason, False)

    def _post(self, key: str, event: Event) -> None:
        """Queue the one event of an operation; later reports of it are dropped."""
        if key in self._reported:
            return
        self._reported.add(key)
        assert self._inbox is not None
        self._inbox.put_nowait(event)

    def _perform(self, actions: Sequence[Action]) -> None:
        checks: list[ToolCall] = []
        for action in actions:
            if isinstance(action, CallModel):
                if self._aborting:
                    self._not_started("model", ModelCancelled(_MODEL_NOT_STARTED))
                    continue
                self._model_calls += 1
                self._spawn("model", self._call_model(action))
            elif isinstance(action, StartTool):
                if self._aborting:
                    call_id = action.call.id
                    self._not_started(call_id, ToolCancelled(call_id, _TOOL_NOT_STARTED))
                    continue
                self._tool_start[action.call.id] = time.perf_counter()
                self._emit(partial(ToolStarted, action.call))
                self._spawn(action.call.id, self._run_tool(action.call))
            elif isinstance(action, CheckPermission):
                checks.append(action.call)
            elif isinstance(action, CheckContinue):
                self._helper(self._check_continue(action.turn))
            elif isinstance(action, CancelOperations):
                keys = (["model"] if action.model else []) + list(action.tool_call_ids)
                self._helper(self._cancel_after_grace(keys, action.reason))
        if checks:
            self._helper(self._check_permissions(checks))

    def _not_started(self, key: str, event: Event) -> None:
        """An operation the engine asked for after the abort (queued events it handled
        first): it is never begun, and answered as such once the abort is handled."""
        self._reported.discard(key)
        self._post(key, event)

    def _spawn(self, key: str, coro: Awaitable[None]) -> None:
        self._reported.discard(key)
        self._tasks[key] = asyncio.ensure_future(coro)

    def _helper(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._helpers.add(task)
        task.add_done_callback(self._helpers.discard)

    async def _cleanup(self) -> None:
        # Normally nothing is left: every operation reported before the run ended,
        # and an abandoned one is not waited for again. Left over only when the
        # caller cancelled run() twice.
        tasks = [t for k, t in self._tasks.items() if k not in self._abandoned]
        pending = [t for t in (*tasks, *self._helpers) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=self._grace)

    # -- deriving the event stream and stats from what the engine did -----------------

    def _emit(self, make: Callable[[], RunEvent]) -> None:
        if not self._subscribers:
            return  # nobody listens: build nothing (keeps the hot path flat)
        event = make()
        for queue in self._subscribers:
            queue.put_nowait(event)

    def _observe(self) -> None:
        engine = self.engine
        history = engine.messages
        for index in range(self._seen_messages, len(history)):
            message = history[index]
            if isinstance(message, AssistantMessage) and message.usage is not None:
                self._usage = self._usage + message.usage
            self._emit(partial(MessageAdded, index, message))
        self._seen_messages = len(history)
        trace = engine.trace
        for index in range(self._seen_trace, len(trace)):
            record = trace[index]
            self._emit(partial(StateChanged, record))
            if record.dest is TurnState.AwaitingModel:
                self._turn_start = time.perf_counter()
                self._emit(partial(TurnStarted, record.turn + 1))
            elif self._turn_start is not None and (
                record.dest is TurnState.TurnBoundary or record.dest in RETURNS_TO_CALLER
            ):
                seconds = time.perf_counter() - self._turn_start
                self._turn_start = None
                self._turn_seconds.append(seconds)
                self._emit(partial(TurnEnded, record.turn, seconds))
        self._seen_trace = len(trace)
        if engine.is_finished and not self._finished:
            self._finished = True
            stats = self._stats()
            explanation = engine.explanation or ""
            self._emit(partial(RunFinished, engine.state, explanation, stats))
            for queue in self._subscribers:
                queue.put_nowait(None)

    def _tool_done(self, event: ToolFinished | ToolCancelled) -> None:
        call = next((c for c in self.engine.pending_calls() if c.id == event.call_id), None)
        started = self._tool_start.pop(event.call_id, None)
        seconds = 0.0 if started is None else time.perf_counter() - started
        self._tool_seconds[event.call_id] = seconds
        if isinstance(event, ToolFinished):
            output, outcome = event.output, ("error" if event.output.is_error else "ok")
        else:
            output = ToolOutput(f"Operation aborted: {event.reason}", is_error=True)
            outcome = "cancelled"
        if call is not None:
            counts = self._tool_counts.setdefault(call.name, {})
            counts[outcome] = counts.get(outcome, 0) + 1
            cancelled = isinstance(event, ToolCancelled)
            abandoned = cancelled and event.call_id in self._abandoned
            self._emit(partial(ToolEnded, call, output, seconds, cancelled, abandoned))

    def _stats(self) -> RunStats:
        return RunStats(
            model_calls=self._model_calls,
            tool_calls={k: dict(v) for k, v in self._tool_counts.items()},
            usage=self._usage,
            turn_seconds=tuple(self._turn_seconds),
            tool_seconds=dict(self._tool_seconds),
            wall_seconds=time.perf_counter() - self._t0,
        )

    def _result(self) -> RunResult:
        engine = self.engine
        state = engine.state
        explanation = engine.explanation or ""
        error_type = _ERRORS.get(state)
        error = error_type(explanation) if error_type is not None else None
        if error is not None and state is TurnState.Failed:
            error.__cause__ = self._model_exception
        return RunResult(
            state=state,
            messages=tuple(engine.messages),
            error=error,
            turns=engine.turns,
            explanation=explanation,
            trace=tuple(engine.trace),
            run_id=self.run_id,
            stats=self._stats(),
            pending_approvals=tuple(call for call, _ in engine.pending_approvals()),
            queued_input=engine.queued_input() + tuple(self._late_input),
            snapshot=engine.snapshot() if state is TurnState.AwaitingUser else None,
        )

    # -- operations ------------------------------------------------------------------------

    async def _call_model(self, action: CallModel) -> None:
        try:
            context: Sequence[Message] = action.messages
            if self._transform is not None:
                try:
                    context = await _call_hook(self._transform, action.messages)
                except Exception as exc:
                    self._note_failure(exc, "the transform_context hook")
                    raise ModelOutputError(
                        f"the transform_context hook raised {_describe(exc)}"
                    ) from exc
            message = await self._model.complete(context, action.tools, self._controller.signal)
        except asyncio.CancelledError:
            if _cancel_requested():
                self._post("model", ModelCancelled())
                raise
            # Nobody cancelled this task: the client leaked a CancelledError of its own.
            # That is one failed call, not a cancellation the engine never asked for.
            self._post("model", ModelFailed("CancelledError raised by the model client"))
            return
        except BaseException as exc:  # noqa: BLE001 - every failure is one failed call
            self._log.warning("model_call_failed", turn=action.turn, error=_describe(exc))
            # The engine records text (runs replay from data); the caller also gets the
            # exception itself as the cause of RunResult.error, e.g. to detect context
            # overflow and compact.
            self._model_exception = exc
            self._post("model", ModelFailed(_describe(exc)))
            self._note_failure(exc, "the model client")
            return
        if not isinstance(message, AssistantMessage):
            error = ModelOutputError(
                f"the model client returned {type(message).__name__}, expected an AssistantMessage"
            )
            self._post("model", ModelFailed(_describe(error)))
            return
        self._post("model", ModelResponded(message))

    async def _run_tool(self, call: ToolCall) -> None:
        try:
            output = await self._tool_output(call)
            if self._after is not None:
                output = await self._after_hook(call, output)
        except asyncio.CancelledError:
            self._post(call.id, ToolCancelled(call.id))
            raise
        except BaseException as exc:
            if call.id in self._reported:
                raise  # abandoned, and now closed by its loop: nothing left to answer
            self._log.warning("tool_output_unusable", call_id=call.id, error=_describe(exc))
            output = ToolOutput(
                f"tool {call.name} returned output that could not be read: {_describe(exc)}",
                is_error=True,
            )
            self._note_failure(exc, f"tool {call.name}")
        self._post(call.id, ToolFinished(call.id, output))

    async def _tool_output(self, call: ToolCall) -> ToolOutput:
        tool = self._tools[call.name]
        # A per-call signal: fires on the run's abort and on this call's timeout.
        controller = AbortController()
        unlink = self._controller.signal.add_listener(controller.abort)
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()

        def sink(data: object) -> None:
            def deliver() -> None:
                self._emit(partial(ToolProgress, call.id, data))

            if threading.get_ident() == loop_thread:
                deliver()
            else:
                loop.call_soon_threadsafe(deliver)

        token = _progress_sink.set(sink)
        call_token = _current_call.set(call)
        try:
            return await self._execute(tool, call, controller)
        finally:
            unlink()
            try:
                _current_call.reset(call_token)
                _progress_sink.reset(token)
            except ValueError:
                pass  # an abandoned call closed later, from another context

    async def _execute(self, tool: Tool, call: ToolCall, controller: AbortController) -> ToolOutput:
        signal = controller.signal
        try:
            if tool.timeout is None:
                value = await tool.execute(call.arguments_dict(), signal)
            else:
                value = await self._with_timeout(tool, call, controller)
        except asyncio.CancelledError:
            if _cancel_requested():
                raise
            # Nobody cancelled this task: the tool leaked a CancelledError of its own,
            # which is its failure like any other exception (one error result).
            self._log.info("tool_raised", call_id=call.id, tool=call.name, error="CancelledError")
            if self._controller.signal.aborted:
                return ToolOutput("Operation aborted: CancelledError", is_error=True)
            return ToolOutput("CancelledError raised by the tool", is_error=True)
        except _TimedOutError as timed_out:
            return ToolOutput(str(timed_out), is_error=True)
        except BaseException as exc:  # noqa: BLE001 - a tool's failure becomes its result
            self._log.info("tool_raised", call_id=call.id, tool=call.name, error=_describe(exc))
            self._note_failure(exc, f"tool {call.name}")
            if self._controller.signal.aborted:
                return ToolOutput(f"Operation aborted: {_describe(exc)}", is_error=True)
            return ToolOutput(_describe(exc), is_error=True)
        normalised = tool_output_from(value)
        if normalised is None:
            error = ToolOutputError(
                f"tool {call.name} returned a {type(value).__name__}; expected a str, a "
                "list of content blocks, or a ToolOutput"
            )
            self._log.warning("tool_bad_output", call_id=call.id, tool=call.name)
            return ToolOutput(str(error), is_error=True)
        return normalised

    async def _with_timeout(self, tool: Tool, call: ToolCall, controller: AbortController) -> Any:
        assert tool.timeout is not None
        task = asyncio.ensure_future(
            _carried(tool.execute(call.arguments_dict(), controller.signal))
        )
        try:
            done, _ = await asyncio.wait({task}, timeout=tool.timeout)
            if task in done:
                return task.result()
            # Timed out: signal, give its cleanup the grace period, then cancel.
            text = f"Tool {call.name} timed out after {tool.timeout:g} s"
            controller.abort(text)
            await asyncio.wait({task}, timeout=self._grace)
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=self._grace)
            raise _TimedOutError(text)
        except asyncio.CancelledError:
            task.cancel()
            raise

    async def _after_hook(self, call: ToolCall, output: ToolOutput) -> ToolOutput:
        assert self._after is not None
        try:
            replaced = await _call_hook(self._after, call, output)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken hook must not lose the result
            self._log.warning("after_tool_call_raised", call_id=call.id, error=_describe(exc))
            self._note_failure(exc, "the after_tool_call hook")
            original = "\n".join(getattr(b, "text", "[image]") for b in output.content)
            return ToolOutput(
                f"The after_tool_call hook raised {_describe(exc)}. The tool's own result "
                f"was:\n{original}",
                is_error=True,
            )
        if replaced is None:
            return output
        if not isinstance(replaced, ToolOutput):
            return ToolOutput(
                f"The after_tool_call hook returned {type(replaced).__name__}, expected a "
                "ToolOutput or None; the tool's own result was kept out",
                is_error=True,
            )
        return replaced

    async def _check_permissions(self, calls: list[ToolCall]) -> None:
        hook = self._before
        assert hook is not None
        assert self._inbox is not None
        # In call order, one at a time: a hook may ask a person, one question at a time.
        for call in calls:
            if self._aborting or self._fatal is not None:
                return  # the engine answers the calls left unchecked when it aborts
            decision: object
            try:
                decision = await _call_hook(hook, call)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a broken hook fails closed
                self._log.warning("before_tool_call_raised", call_id=call.id, error=_describe(exc))
                self._note_failure(exc, "the before_tool_call hook")
                decision = Deny(
                    f"the before_tool_call hook raised {_describe(exc)}; the call was not run"
                )
            event: Event
            if decision is None:
                event = ToolPermitted(call.id)
            elif isinstance(decision, Deny):
                event = ToolDenied(call.id, decision.reason, decision.advisory)
            elif isinstance(decision, RequireApproval):
                event = ApprovalRequired(call.id, decision.reason)
            else:
                event = ToolDenied(
                    call.id,
                    f"the before_tool_call hook returned {type(decision).__name__}, "
                    "expected None or Deny or RequireApproval; the call was not run",
                )
            self._inbox.put_nowait(event)

    async def _check_continue(self, turn: int) -> None:
        hook = self._should_continue
        assert hook is not None
        assert self._inbox is not None
        try:
            decision: object = await _call_hook(hook, self.engine.messages, turn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken hook stops the run, explained
            self._log.warning("should_continue_raised", turn=turn, error=_describe(exc))
            self._note_failure(exc, "the should_continue hook")
            decision = Stop(f"the should_continue hook raised {_describe(exc)}")
        if decision is None:
            self._inbox.put_nowait(ContinueDecided(False))
        elif isinstance(decision, Stop):
            self._inbox.put_nowait(ContinueDecided(True, decision.reason))
        else:
            self._inbox.put_nowait(
                ContinueDecided(
                    True,
                    f"the should_continue hook returned {type(decision).__name__}, "
                    "expected None or Stop",
                )
            )

    async def _cancel_after_grace(self, keys: list[str], reason: str) -> None:
        # One grace period from the abort on: half to finish on their own, half for
        # the cleanup of a cancellation; then give up (module docstring).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._grace
        tasks = [self._tasks[k] for k in keys if k in self._tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=self._grace / 2)
        stubborn = [k for k in keys if k in self._tasks and not self._tasks[k].done()]
        for key in stubborn:
            self._tasks[key].cancel()
        if stubborn:
            # At least one pass of the loop, even when a blocked loop used up the
            # grace period: a cancelled task that ends at once is not abandoned.
            remaining = max(deadline - loop.time(), 0.0)
            await asyncio.wait([self._tasks[k] for k in stubborn], timeout=remaining)
        for key in keys:
            task = self._tasks.get(key)
            if key in self._reported or task is None:
                continue
            event: Event
            if task.done():  # it ended without a word: still one answer
                event = ModelCancelled() if key == "model" else ToolCancelled(key)
            else:
                # It ignored cancellation too: stop waiting for it.
                self._abandoned.add(key)
                self._log.warning("operation_abandoned", key=key, reason=reason)
                event = (
                    ModelCancelled(f"{ABANDONED}: it ignored cancellation")
                    if key == "model"
                    else ToolCancelled(key, f"{ABANDONED}: the tool ignored cancellation")
                )
            self._post(key, event)


class _TimedOutError(Exception):
    """A tool call ran past its tool's timeout."""


def _check_tools(tools: Sequence[Tool]) -> None:
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidInputError("tools must be a sequence of Tool")
    seen: set[str] = set()
    for i, item in enumerate(tools):
        if not isinstance(item, Tool):
            raise InvalidInputError(
                f"tools[{i}] is a {type(item).__name__}, not a Tool (see statemachine.tool)"
            )
        if item.name in seen:
            raise InvalidInputError(f"duplicate tool name {item.name!r}: tool names must be unique")
        seen.add(item.name)


async def run_agent(
    *,
    model: ModelClient,
    messages: Sequence[Message],
    tools: Sequence[Tool] = (),
    max_turns: int = 8,
    signal: AbortSignal | None = None,
    before_tool_call: BeforeToolCall | None = None,
    after_tool_call: AfterToolCall | None = None,
    should_continue: ShouldContinue | None = None,
    transform_context: TransformContext | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    logger: Any = None,
    run_id: str | None = None,
    engine_factory: Callable[..., Engine] = Engine,
) -> RunResult:
    """Run the agent loop until a terminal state or ``AwaitingUser``.

    Never raises for how a run ends (see ``RunResult``); raises ``InvalidInputError``
    before any model call for an invalid history, duplicate tool names or bad
    arguments. For steering, abort by handle, or the event stream, use ``AgentRun``.
    ``engine_factory`` (called with ``Engine``'s keyword arguments) lets a caller run
    an ``Engine`` subclass, e.g. ``functools.partial(JournalingEngine, journal=j)``.
    """
    run = AgentRun(
        model=model,
        messages=messages,
        tools=tools,
        max_turns=max_turns,
        signal=signal,
        before_tool_call=before_tool_call,
        after_tool_call=after_tool_call,
        should_continue=should_continue,
        transform_context=transform_context,
        grace_period=grace_period,
        logger=logger,
        run_id=run_id,
        engine_factory=engine_factory,
    )
    return await run.run()


def resume_run(
    state: RunResult | Mapping[str, Any],
    *,
    model: ModelClient,
    tools: Sequence[Tool] = (),
    approvals: Mapping[str, bool | Deny] | None = None,
    message: str | UserMessage | None = None,
    max_turns: int | None = None,
    key: bytes | str | None = None,
    max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
    **kwargs: Any,
) -> AgentRun:
    """An ``AgentRun`` that continues a run suspended in ``AwaitingUser``.

    ``state`` is the ``RunResult`` or its ``snapshot`` (JSON-ready, so it may come
    from another process). Give ``approvals`` (call id -> True, False, or a
    ``Deny`` with the person's reason) for every pending call, or a new ``message``
    (which answers pending calls "not approved"). ``max_turns`` may raise the limit.

    Before anything runs, the snapshot is checked against itself
    (``Engine.restore``: its pending calls must be exactly the unanswered calls of its
    last assistant message) and, with ``key``, against its signature
    (``SnapshotSignatureError`` if it is missing or wrong); ``max_snapshot_bytes``
    bounds its size (default 32 MiB of JSON text). ``tools`` must hold the
    tool of every call that may run (else ``UsageError`` naming the missing ones), and
    the calls' arguments must fit those tools' schemas. When calls may run (resuming
    with ``approvals``), ``before_tool_call`` is asked again about each of them as the
    run starts, because the snapshot's record of what it allowed could have been
    edited: if it now denies a call, or requires approval for a call the snapshot
    marks as permitted, ``run()`` raises ``SnapshotError`` and nothing runs. A run
    suspended under a ``before_tool_call`` hook must be resumed with one.
    """
    snapshot = state.snapshot if isinstance(state, RunResult) else state
    if snapshot is None:
        raise UsageError("only a run that stopped in AwaitingUser can be resumed")
    _check_tools(tools)
    engine = Engine.restore(
        snapshot,
        scheduling={t.name: t.scheduling for t in tools},
        logger=kwargs.get("logger"),
        key=key,
        max_bytes=max_snapshot_bytes,
    )
    if engine.state is not TurnState.AwaitingUser:
        raise UsageError(f"only a run in AwaitingUser can be resumed, not {engine.state}")
    if max_turns is not None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise InvalidInputError(f"max_turns must be a positive integer, got {max_turns!r}")
        engine.max_turns = max_turns
    events = _resume_events(engine, approvals, message)
    if message is not None:
        # Every open call is answered "not approved": nothing of the batch runs.
        return AgentRun(model=model, tools=tools, _engine=engine, _resume_events=events, **kwargs)
    approved = {e.call_id for e in events if isinstance(e, ApprovalDecided) and e.approved}
    waiting = {call.id for call, _ in engine.pending_approvals()}
    may_run = [c for c in engine.pending_calls() if c.id in approved or c.id not in waiting]
    _check_tools_for(may_run, tools)
    policy = kwargs.get("before_tool_call")
    if policy is None and engine.check_permissions:
        raise UsageError(
            "this run was suspended under a before_tool_call hook: resume it with the hook, "
            "which is asked again about the calls that may run"
        )
    return _ResumedRun(
        policy=policy,
        recheck=tuple((c, c.id in waiting) for c in may_run),
        model=model,
        tools=tools,
        _engine=engine,
        _resume_events=events,
        **kwargs,
    )


def _resume_events(
    engine: Engine,
    approvals: Mapping[str, bool | Deny] | None,
    message: str | UserMessage | None,
) -> list[Event]:
    events: list[Event] = []
    pending = [call.id for call, _ in engine.pending_approvals()]
    for call_id, decision in (approvals or {}).items():
        if call_id not in pending:
            raise InvalidInputError(f"call {call_id!r} is not waiting for approval")
        if isinstance(decision, Deny):
            events.append(ApprovalDecided(call_id, False, decision.reason))
        elif isinstance(decision, bool):
            events.append(ApprovalDecided(call_id, decision))
        else:
            raise InvalidInputError("an approval is True, False, or a Deny(reason)")
    if message is not None:
        events.append(InputQueued(UserMessage(message) if isinstance(message, str) else message))
    elif len(events) != len(pending) or not pending:
        missing = sorted(set(pending) - {e.call_id for e in events if hasattr(e, "call_id")})
        raise InvalidInputError(
            "resume needs a decision for every pending call "
            f"(missing: {', '.join(missing) or 'none are pending'}) or a new message"
        )
    return events


def _check_tools_for(calls: Sequence[ToolCall], tools: Sequence[Tool]) -> None:
    """Refuse at once what would otherwise fail inside a tool's task."""
    by_name = {t.name: t for t in tools}
    missing = sorted({c.name for c in calls} - by_name.keys())
    if missing:
        ids = ", ".join(c.id for c in calls if c.name not in by_name)
        raise UsageError(
            f"tools lacks {', '.join(missing)}, needed by the pending call(s) {ids}: "
            "resume with the tools of the suspended run"
        )
    for call in calls:
        if validate_arguments(by_name[call.name].definition, call.arguments):
            raise InvalidInputError(
                f"the arguments of pending call {call.id!r} do not fit the schema of tool "
                f"{call.name!r} as given now"
            )


async def _ask_policy_again(
    policy: BeforeToolCall, recheck: Sequence[tuple[ToolCall, bool]]
) -> None:
    """Ask the policy about every call of a restored batch that may still run.

    A call may go on only if the policy allows it now: permitted, or, for a call that
    waits for a person, also "requires approval" (the person decides). Anything else
    refuses the resume before anything runs; like the run's own dispatch, a hook that
    raises counts as a denial.
    """
    for call, awaits_person in recheck:
        decision: object
        try:
            decision = await _call_hook(policy, call)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken hook fails closed
            decision = Deny(f"the before_tool_call hook raised {_describe(exc)}")
        if decision is None or (awaits_person and isinstance(decision, RequireApproval)):
            continue
        if isinstance(decision, Deny):
            answer = f"denies it ({decision.reason})"
        elif isinstance(decision, RequireApproval):
            answer = "requires a person's approval for it"
        else:
            answer = f"returns a {type(decision).__name__}"
        marked = "waits for approval" if awaits_person else "is marked permitted"
        raise SnapshotError(
            f"snapshot.batch: call {call.id!r} ({call.name}) {marked} in the snapshot, but "
            f"the before_tool_call hook, asked again on resume, {answer}; nothing was run "
            "(resume with a message instead, or find out who changed the snapshot)"
        )


class _ResumedRun(AgentRun):
    """A resumed ``AgentRun`` that asks the policy again before it goes on."""

    def __init__(
        self,
        *,
        policy: BeforeToolCall | None,
        recheck: Sequence[tuple[ToolCall, bool]],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._policy_again = policy
        self._recheck = tuple(recheck)

    async def run(self) -> RunResult:
        if self._policy_again is not None:
            await _ask_policy_again(self._policy_again, self._recheck)
            self._policy_again = None  # agreed: a second run() is refused by AgentRun
        return await super().run()


async def resume_agent(
    state: RunResult | Mapping[str, Any],
    *,
    model: ModelClient,
    tools: Sequence[Tool] = (),
    approvals: Mapping[str, bool | Deny] | None = None,
    message: str | UserMessage | None = None,
    max_turns: int | None = None,
    key: bytes | str | None = None,
    max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
    **kwargs: Any,
) -> RunResult:
    """Continue a run suspended in ``AwaitingUser`` (see ``resume_run``, which also
    says what is checked before anything runs)."""
    run = resume_run(
        state,
        model=model,
        tools=tools,
        approvals=approvals,
        message=message,
        max_turns=max_turns,
        key=key,
        max_snapshot_bytes=max_snapshot_bytes,
        **kwargs,
    )
    return await run.run()


def run_agent_sync(**kwargs: Any) -> RunResult:
    """``run_agent`` for code without an event loop (same keyword arguments).

    Like ``asyncio.run`` (Ctrl-C cancels the run, which is closed as an abort, then
    raises ``KeyboardInterrupt``), except that it never waits for what the run has
    abandoned: ``asyncio.run`` would wait for every leftover task and every executor
    thread, so a tool that ignores cancellation, or a sync tool blocked in its
    thread, would hold it forever. Such a thread keeps running after the return (a
    thread cannot be interrupted), and the interpreter waits for it when it exits.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise UsageError(
            "run_agent_sync() cannot be called from a running event loop; "
            "use 'await run_agent(...)' instead"
        )
    grace = kwargs.get("grace_period", DEFAULT_GRACE_PERIOD)
    runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
    loop = runner.get_loop()
    try:
        return runner.run(run_agent(**kwargs))
    finally:
        _close_loop(loop, grace if isinstance(grace, (int, float)) else DEFAULT_GRACE_PERIOD)


def _close_loop(loop: asyncio.AbstractEventLoop, grace: float) -> None:
    """Close ``loop`` without waiting past ``grace`` for tasks that ignore cancellation,
    nor at all for executor threads (``loop.close()`` does not join them)."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=max(float(grace), 0.0)))
        for task in pending:
            if not task.done():
                # Abandoned, and reported as such by the run: asyncio need not say
                # again, when the task is collected, that it never finished.
                setattr(task, "_log_destroy_pending", False)  # noqa: B010
        loop.run_until_complete(
            asyncio.wait(
                [loop.create_task(loop.shutdown_asyncgens())], timeout=max(float(grace), 0.0)
            )
        )
    finally:
        loop.close()
