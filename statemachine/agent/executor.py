"""The in-process executor: the action loop's operations, performed with asyncio.

Each operation (the model call, each tool call) starts at once, in the loop's own
step; if it has to wait it goes on as an asyncio task, which is what the abort and
its grace period act on. The permission and should_continue hooks run as helper
tasks. Every operation reports exactly once (``ActionLoop._post``).

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
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from functools import partial
from typing import Any, TypeVar, cast

from statemachine.agent.events import ToolProgress
from statemachine.agent.hook_calls import HookCalls
from statemachine.agent.hooks import (
    _call_hook,
    _cancel_requested,
    _carried,
    _describe,
)
from statemachine.agent.loop import ActionLoop
from statemachine.agent.model import ModelClient
from statemachine.agent.tools import Tool, tool_output_from
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.engine import ABANDONED
from statemachine.core.errors import ModelOutputError, ToolOutputError
from statemachine.core.events import (
    CallModel,
    Event,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    ToolCancelled,
    ToolFinished,
)
from statemachine.core.messages import AssistantMessage, Message, ToolCall
from statemachine.core.tools import ToolOutput

_T = TypeVar("_T")

__all__ = ["AsyncioExecutor", "current_tool_call", "report_progress"]

# -- progress reports from inside tools ------------------------------------------------

_running: contextvars.ContextVar[tuple[AsyncioExecutor, ToolCall] | None] = contextvars.ContextVar(
    "statemachine_running_call", default=None
)
"""The executor running a tool call, and the call: set in the call's own context."""


def current_tool_call() -> ToolCall | None:
    """The call a tool is executing (its id, name and arguments), or ``None``
    outside a tool run by the driver; works in sync tools' worker threads too."""
    running = _running.get()
    return None if running is None else running[1]


def report_progress(data: object) -> bool:
    """Report progress from inside a running tool (async or sync, any thread).

    Subscribers of ``AgentRun.events()`` receive a ``ToolProgress`` event. Returns
    False (and does nothing) outside a tool run by the driver.
    """
    running = _running.get()
    if running is None:
        return False
    executor, call = running
    executor._progress(call.id, data)
    return True


def _start(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` up to its first wait, in a context of its own (as a task would);
    ``None`` if it finished, else the task that carries it on from there."""
    context = contextvars.copy_context()
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration:
        return None
    except asyncio.CancelledError:
        return None  # it reported its cancellation; the loop's own task is cancelled
    return asyncio.get_running_loop().create_task(_carry_on(coro, waiting_on), context=context)


async def _carry_on(coro: Coroutine[Any, Any, _T], waiting_on: Any) -> _T:
    """Carry on, as a task, a coroutine already run to its first wait; its result."""
    result: _T = await _Resumed(coro, waiting_on)
    return result


class _Resumed:
    """Awaiting this goes on with a coroutine that has already run to its first wait
    (on ``waiting_on``): the task passes what it receives straight through."""

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self._coro = coro
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self._coro, self._waiting_on
        while True:
            try:
                try:
                    sent = yield value
                except GeneratorExit:
                    # Closed (a task destroyed while pending, e.g. abandoned at the
                    # loop's close): close the coroutine too, which may be closed
                    # already, being garbage in the same collection.
                    coro.close()
                    raise
                except BaseException as exc:  # noqa: BLE001 - passed on, as the task would
                    value = coro.throw(exc)
                else:
                    value = coro.send(sent)
            except StopIteration as stop:
                return stop.value


_UNKNOWN: Any = object()
"""Not looked at yet (``AsyncioExecutor._direct``)."""


class _TimedOutError(Exception):
    """A tool call ran past its tool's timeout."""


def _nothing() -> None:
    """Nothing to undo."""


class AsyncioExecutor(HookCalls):
    """Performs the loop's actions with asyncio tasks (module docstring)."""

    _model: ModelClient
    _tools: dict[str, Tool]
    _transform: Callable[..., Any] | None
    _grace: float
    _signal: AbortSignal  # self._controller.signal
    _loop: asyncio.AbstractEventLoop | None
    _loop_thread: int

    def _init_executor(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}  # "model" or a call id
        self._helpers: set[asyncio.Task[None]] = set()  # hooks and grace timers
        # Whether an operation can be started by sending into the client's or the
        # tool's own coroutine (see _start_model): for the model, and by tool name
        # (the tool, or None if not).
        self._direct_model: bool | None = None
        self._direct: dict[str, Tool | None] = {}
        # An operation that ended at once queues its event itself, unless _post is
        # another executor's (which then has its own _start_model and _start_tool).
        self._own_post = type(self)._post is ActionLoop._post

    # -- the seam ------------------------------------------------------------------------

    def _start_model(self, action: CallModel, alone: bool) -> None:
        direct = self._direct_model
        if direct is None:
            direct = self._direct_model = inspect.iscoroutinefunction(self._model.complete)
        if not alone or not direct or self._transform is not None:
            self._spawn("model", self._call_model(action), alone)
            return
        # Alone and plain: the client's own coroutine is started here, without the
        # layers of _call_model around it, which it gets only if it has to wait.
        # Its one event is queued as _post would (nothing else can report it meanwhile).
        context = contextvars.copy_context()
        coro = self._model.complete(action.messages, action.tools, self._signal)
        try:
            waiting_on = context.run(coro.send, None)
        except StopIteration as stop:
            message = stop.value
            if message.__class__ is AssistantMessage and self._own_post:
                self._reported.add("model")
                self._inbox.put_nowait(ModelResponded(message))  # type: ignore[union-attr]
            else:
                self._reported.discard("model")
                self._model_answered(message)
        except BaseException as exc:  # noqa: BLE001 - what _call_model does with it
            self._reported.discard("model")
            context.run(self._model_raised, exc, action)
        else:
            self._reported.discard("model")
            rest = self._call_model(action, _Resumed(coro, waiting_on))
            self._tasks["model"] = asyncio.get_running_loop().create_task(rest, context=context)
            return
        if self._tasks:
            self._tasks.pop("model", None)
        self._yield_due = True  # see ActionLoop._drive

    def _start_tool(self, call: ToolCall, alone: bool) -> None:
        name = call.name
        tool = self._direct.get(name, _UNKNOWN)
        if tool is _UNKNOWN:
            tool = self._tools[name]
            plain = inspect.iscoroutinefunction(tool.execute) and tool.timeout is None
            tool = self._direct[name] = tool if plain and self._after is None else None
        if not alone or tool is None:
            self._spawn(call.id, self._run_tool(call), alone)
            return
        # As _start_model: the tool's own coroutine, in a context of its own.
        key = call.id
        context = contextvars.copy_context()
        context.run(_running.set, (self, call))
        try:
            # A coroutine: its execute is a coroutine function (self._direct).
            coro = cast(Coroutine[Any, Any, Any], tool.execute(call.arguments_dict(), self._signal))
            waiting_on = context.run(coro.send, None)
        except StopIteration as stop:
            value = stop.value
            # A str is the usual result: wrapped here, as tool_output_from would.
            output = ToolOutput(value) if value.__class__ is str else self._readable(call, value)
            event: Event = ToolFinished(key, output)
        except BaseException as exc:  # noqa: BLE001 - what _execute does with it
            failed = context.run(self._tool_raised, call, exc)
            event = ToolCancelled(key) if failed is None else ToolFinished(key, failed)
        else:
            self._reported.discard(key)
            rest = self._run_tool(call, _Resumed(coro, waiting_on))
            self._tasks[key] = asyncio.get_running_loop().create_task(rest, context=context)
            return
        if self._own_post:
            self._reported.add(key)
            self._inbox.put_nowait(event)  # type: ignore[union-attr]
        else:
            self._reported.discard(key)
            self._post(key, event)
        if self._tasks:
            self._tasks.pop(key, None)
        self._yield_due = True

    def _start_permission_checks(self, calls: list[ToolCall]) -> None:
        self._helper(self._check_permissions(calls))

    def _start_continue_check(self, turn: int) -> None:
        self._helper(self._check_continue(turn))

    def _start_cancellation(self, keys: list[str], reason: str) -> None:
        self._helper(self._cancel_after_grace(keys, reason))

    def _on_abort(self) -> None:
        for task in self._helpers:
            task.cancel()  # hooks: their calls are answered by the engine

    # -- tasks ---------------------------------------------------------------------------

    def _spawn(self, key: str, coro: Coroutine[Any, Any, None], alone: bool) -> None:
        """Start an operation; at once when it is the only one of its step (nothing
        else is started behind it that it could overtake), else as a task."""
        self._reported.discard(key)
        if not alone:
            self._tasks[key] = asyncio.ensure_future(coro)
            return
        task = _start(coro)
        if task is None:
            self._tasks.pop(key, None)
            self._yield_due = True  # see ActionLoop._drive
        else:
            self._tasks[key] = task

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

    # -- operations ------------------------------------------------------------------------

    async def _call_model(self, action: CallModel, started: _Resumed | None = None) -> None:
        """The model call; ``started``: the client's call, already begun."""
        try:
            if started is None:
                context: Sequence[Message] = action.messages
                if self._transform is not None:
                    context = await self._transformed(action.messages)
                message = await self._model.complete(context, action.tools, self._controller.signal)
            else:
                message = await started
        except BaseException as exc:
            if self._model_raised(exc, action):
                raise
            return
        self._model_answered(message)

    async def _transformed(self, messages: Sequence[Message]) -> Sequence[Message]:
        assert self._transform is not None
        try:
            context: Sequence[Message] = await _call_hook(self._transform, messages)
        except Exception as exc:
            self._note_failure(exc, "the transform_context hook")
            raise ModelOutputError(f"the transform_context hook raised {_describe(exc)}") from exc
        return context

    def _model_answered(self, message: object) -> None:
        if message.__class__ is AssistantMessage or isinstance(message, AssistantMessage):
            self._post("model", ModelResponded(message))
            return
        error = ModelOutputError(
            f"the model client returned {type(message).__name__}, expected an AssistantMessage"
        )
        self._post("model", ModelFailed(_describe(error)))

    def _model_raised(self, exc: BaseException, action: CallModel) -> bool:
        """Report the model call's failure; True for a cancellation someone asked for
        (reported as such, and to be raised on)."""
        if isinstance(exc, asyncio.CancelledError):
            if _cancel_requested():
                self._post("model", ModelCancelled())
                return True
            # Nobody cancelled this task: the client leaked a CancelledError of its own.
            # That is one failed call, not a cancellation the engine never asked for.
            self._post("model", ModelFailed("CancelledError raised by the model client"))
            return False
        self._log.warning("model_call_failed", turn=action.turn, error=_describe(exc))
        # The engine records text (runs replay from data); the caller also gets the
        # exception itself as the cause of RunResult.error, e.g. to detect context
        # overflow and compact.
        self._model_exception = exc
        self._post("model", ModelFailed(_describe(exc)))
        self._note_failure(exc, "the model client")
        return False

    async def _run_tool(self, call: ToolCall, started: _Resumed | None = None) -> None:
        """The tool call; ``started``: the tool's coroutine, already begun in this
        context (by ``_start_tool``)."""
        try:
            if started is None:
                output = await self._tool_output(call)
            else:
                output = await self._resumed_output(call, started)
            if self._after is not None:
                output = await self._after_hook(call, output)
        except asyncio.CancelledError:
            self._post(call.id, ToolCancelled(call.id))
            raise
        except BaseException as exc:
            if call.id in self._reported:
                raise  # abandoned, and now closed by its loop: nothing left to answer
            output = self._unreadable(call, exc)
        self._post(call.id, ToolFinished(call.id, output))

    def _unreadable(self, call: ToolCall, exc: BaseException) -> ToolOutput:
        self._log.warning("tool_output_unusable", call_id=call.id, error=_describe(exc))
        output = ToolOutput(
            f"tool {call.name} returned output that could not be read: {_describe(exc)}",
            is_error=True,
        )
        self._note_failure(exc, f"tool {call.name}")
        return output

    def _readable(self, call: ToolCall, value: object) -> ToolOutput:
        """What a tool returned, normalised (``_run_tool``'s answer if that fails)."""
        try:
            return self._normalised(call, value)
        except BaseException as exc:  # noqa: BLE001 - as _run_tool
            return self._unreadable(call, exc)

    async def _resumed_output(self, call: ToolCall, started: _Resumed) -> ToolOutput:
        try:
            value = await started
        except BaseException as exc:
            output = self._tool_raised(call, exc)
            if output is None:
                raise
            return output
        return self._normalised(call, value)

    async def _tool_output(self, call: ToolCall) -> ToolOutput:
        tool = self._tools[call.name]
        if tool.timeout is None:
            controller, unlink = self._controller, _nothing
        else:
            # A per-call signal: fires on the run's abort and on this call's timeout.
            controller = AbortController()
            unlink = self._controller.signal.add_listener(controller.abort)
        token = _running.set((self, call))
        try:
            return await self._execute(tool, call, controller)
        finally:
            unlink()
            try:
                _running.reset(token)
            except ValueError:
                pass  # an abandoned call closed later, from another context

    def _progress(self, call_id: str, data: object) -> None:
        """A running tool's progress report, handed to the subscribers on the loop."""
        loop = self._loop
        assert loop is not None

        def deliver() -> None:
            self._emit(partial(ToolProgress, call_id, data))

        if threading.get_ident() == self._loop_thread:
            deliver()
        else:
            loop.call_soon_threadsafe(deliver)

    async def _execute(self, tool: Tool, call: ToolCall, controller: AbortController) -> ToolOutput:
        try:
            if tool.timeout is None:
                value = await tool.execute(call.arguments_dict(), controller.signal)
            else:
                value = await self._with_timeout(tool, call, controller)
        except BaseException as exc:
            output = self._tool_raised(call, exc)
            if output is None:
                raise
            return output
        return self._normalised(call, value)

    def _tool_raised(self, call: ToolCall, exc: BaseException) -> ToolOutput | None:
        """The result of a call that raised ``exc``; None for a cancellation someone
        asked for (to be raised on)."""
        if isinstance(exc, asyncio.CancelledError):
            if _cancel_requested():
                return None
            # Nobody cancelled this task: the tool leaked a CancelledError of its own,
            # which is its failure like any other exception (one error result).
            self._log.info("tool_raised", call_id=call.id, tool=call.name, error="CancelledError")
            if self._controller.signal.aborted:
                return ToolOutput("Operation aborted: CancelledError", is_error=True)
            return ToolOutput("CancelledError raised by the tool", is_error=True)
        if isinstance(exc, _TimedOutError):
            return ToolOutput(str(exc), is_error=True)
        self._log.info("tool_raised", call_id=call.id, tool=call.name, error=_describe(exc))
        self._note_failure(exc, f"tool {call.name}")
        if self._controller.signal.aborted:
            return ToolOutput(f"Operation aborted: {_describe(exc)}", is_error=True)
        return ToolOutput(_describe(exc), is_error=True)

    def _normalised(self, call: ToolCall, value: object) -> ToolOutput:
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
