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
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from functools import partial
from typing import Any, TypeVar

from statemachine.agent.events import ToolProgress
from statemachine.agent.hooks import (
    Deny,
    RequireApproval,
    Stop,
    _call_hook,
    _cancel_requested,
    _carried,
    _describe,
)
from statemachine.agent.loop import ActionLoop
from statemachine.agent.model import ModelClient
from statemachine.agent.tools import Tool, tool_output_from
from statemachine.core.abort import AbortController
from statemachine.core.engine import ABANDONED
from statemachine.core.errors import ModelOutputError, ToolOutputError
from statemachine.core.events import (
    ApprovalRequired,
    CallModel,
    ContinueDecided,
    Event,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.messages import AssistantMessage, Message, ToolCall
from statemachine.core.tools import ToolOutput

_T = TypeVar("_T")

__all__ = ["AsyncioExecutor", "current_tool_call", "report_progress"]

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


class _TimedOutError(Exception):
    """A tool call ran past its tool's timeout."""


def _nothing() -> None:
    """Nothing to undo."""


class AsyncioExecutor(ActionLoop):
    """Performs the loop's actions with asyncio tasks (module docstring)."""

    _model: ModelClient
    _tools: dict[str, Tool]
    _before: Callable[..., Any] | None
    _after: Callable[..., Any] | None
    _should_continue: Callable[..., Any] | None
    _transform: Callable[..., Any] | None
    _grace: float
    _loop: asyncio.AbstractEventLoop | None
    _loop_thread: int

    def _init_executor(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}  # "model" or a call id
        self._helpers: set[asyncio.Task[None]] = set()  # hooks and grace timers

    # -- the seam ------------------------------------------------------------------------

    def _start_model(self, action: CallModel, alone: bool) -> None:
        self._spawn("model", self._call_model(action), alone)

    def _start_tool(self, call: ToolCall, alone: bool) -> None:
        self._spawn(call.id, self._run_tool(call), alone)

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
        if tool.timeout is None:
            controller, unlink = self._controller, _nothing
        else:
            # A per-call signal: fires on the run's abort and on this call's timeout.
            controller = AbortController()
            unlink = self._controller.signal.add_listener(controller.abort)
        loop, loop_thread = self._loop, self._loop_thread
        assert loop is not None

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
