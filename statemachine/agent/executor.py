"""The in-process executor: the action loop's operations, performed as asyncio tasks.

Each operation (the model call, each tool call) is an asyncio task, which is what the
abort and its grace period act on (``start_task`` says when it starts); the
permission and should_continue hooks run as helper tasks. Every operation reports
exactly once (``report``, which is ``ActionLoop.post``).

Backends
--------
``AsyncioExecutor`` is the driver's own half and is never subclassed: how an
operation is started, and where what it reports is kept, is the ``Backend`` it is
given. The driver describes each operation as an ``Operation`` (its kind, its key,
what it acts on) and hands it to ``Backend.start``; the backend starts it as a task
the driver keeps (``keep``), performing it in this process
(``perform``, reporting to the driver or to a ``Reports`` of its own, such as a
durable step that records what the operation reported) or elsewhere (an activity).
``IN_PROCESS`` is ``run_agent``'s: each operation a task here, reporting to the loop;
the durable backends (``statemachine.durable``) reuse ``perform`` for the work.

Abort and the grace period
--------------------------
When the run's signal fires, the driver forwards it to the internal signal that tools
and the model client hold, and tells the engine (``AbortRequested``) before any event
that was already waiting (ordering rule O2, ``agent/loop.py``), so that no model call
and no tool call starts after the abort. The engine answers with ``CancelOperations``
naming what is still outstanding. The grace period is one budget, counted from then:
for its first half the operations may finish on their own (a result that arrives then
is kept as it is, I6); then their tasks are cancelled (each reports ``*Cancelled``
once its cleanup has run); an operation still running when the grace period ends (one
that swallows ``CancelledError`` and keeps going, a sync tool in its thread) is
abandoned: the driver records it as such (result text, ``ToolEnded.abandoned``, the
explanation) and stops waiting for it. So ``run_agent`` returns within the grace
period after the abort is seen, whatever a client or tool does. Code that blocks the
event loop delays when the abort is seen (nothing can interrupt it); the grace period
then runs from when the loop is free again.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple, Protocol, TypeVar

from statemachine.agent.calls import cancel_requested, carried, describe
from statemachine.agent.context import start_spending, stop_spending
from statemachine.agent.events import RunEvent
from statemachine.agent.hook_calls import HookCaller
from statemachine.agent.loop import ActionLoop
from statemachine.agent.model import ModelClient
from statemachine.agent.model_call import RunModel
from statemachine.agent.options import Options
from statemachine.agent.questions import Answer, MakeQuestion, RunQuestions
from statemachine.agent.running import running_call
from statemachine.agent.tools import Tool, tool_output_from
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.engine import ABANDONED
from statemachine.core.events import (
    CallModel,
    Event,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    RunStep,
    ToolCancelled,
    ToolFinished,
)
from statemachine.core.messages import AssistantMessage, ToolCall
from statemachine.core.tools import ToolOutput
from statemachine.errors import ModelOutputError, ModelRetry, ToolOutputError

_T = TypeVar("_T")

__all__ = [
    "IN_PROCESS",
    "AsyncioExecutor",
    "Backend",
    "InProcess",
    "Operation",
    "Reports",
    "start_task",
]


def start_task(coro: Coroutine[Any, Any, _T], *, eager: bool) -> asyncio.Task[_T]:
    """A task for ``coro``, in a context of its own.

    ``eager``: on Python 3.12+ the task runs up to its first wait at once, in the
    caller's step (``asyncio.Task(..., eager_start=True)``): an operation that does not
    wait has reported before the loop takes its next event, and a backend that numbers
    its steps (DBOS) sees them begin in the order they were asked for. Python 3.11 has
    no eager start: there the task is a plain one, started at the event loop's next
    pass, in the order the tasks were created; what it does is the same.
    """
    loop = asyncio.get_running_loop()
    if eager and sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)
    return loop.create_task(coro)


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark as seen the outcome of a task that nobody awaits any more (a tool that ran
    past its timeout and then raised), so that asyncio does not log it as lost."""
    if not task.cancelled():
        task.exception()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in the caller's thread, if any (a sync tool's worker
    thread has none)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _TimedOutError(Exception):
    """A tool call ran past its tool's timeout."""


# -- what the driver hands a backend ------------------------------------------------------------

MODEL = "model"
TOOL = "tool"
PERMISSIONS = "permissions"
CONTINUE = "continue"
STEP = "step"


class Operation(NamedTuple):
    """One operation the engine asked for, as the driver hands it to its ``Backend``.

    ``kind``: ``MODEL``, ``TOOL`` (keyed: one report), ``PERMISSIONS``, ``CONTINUE`` or
    ``STEP`` (a hook, started as a helper: key ``""``); ``key``: ``"model"``, the call
    id, or ``""``; ``subject``: the ``CallModel``, the ``ToolCall``, the calls to check,
    the turn, or the ``RunStep``; ``alone``: the only action of its step (nothing
    started behind it that it could overtake).
    """

    kind: str
    key: str
    subject: Any
    alone: bool = False


class Reports(Protocol):
    """Where an operation performed in this process reports: the driver itself, or a
    backend's own record of one operation (a durable step)."""

    def report(self, key: str, event: Event) -> None:
        """The one event of the operation ``key``."""

    def put(self, event: Event) -> None:
        """One of several events of a hook's operation (a permission check's answers)."""


class Backend(Protocol):
    """How a run's operations are started and where what they report is kept (module
    docstring); the driver is given one and calls nothing else of it."""

    def start(self, driver: AsyncioExecutor, op: Operation) -> None:
        """Start ``op`` as a task the driver keeps (``driver.keep``)."""

    def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
        """End the operations ``keys`` within the grace period, after an abort; each
        one not yet reported is then reported cancelled or abandoned."""

    def reported(self, key: str) -> None:
        """The driver has just posted the report of operation ``key`` to the loop."""

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer | None:
        """Ask a person the question ``make(question_id)`` that the running ``call``
        asks (an MCP server's elicitation), and wait for the answer: "cancel" once
        ``signal``, the call's own, fires. ``None``: no one can be asked here (the
        server is refused at once)."""


class InProcess:
    """The backend of ``run_agent``: each operation an asyncio task of this process
    (``start_task``, eager when it is alone), reporting straight to the driver; after
    an abort, the grace period (``AsyncioExecutor.cancel_after_grace``). It holds
    nothing, so one serves every run (``IN_PROCESS``)."""

    __slots__ = ()

    def start(self, driver: AsyncioExecutor, op: Operation) -> None:
        driver.keep(op, start_task(driver.perform(op, driver), eager=op.alone))

    def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
        driver.track_helper(start_task(driver.cancel_after_grace(keys, reason), eager=False))

    def reported(self, key: str) -> None:
        """Nothing to do: the loop holds the report."""

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer | None:
        """Pending on the run (``AgentRun.pending_questions``) until a person answers
        it (``AgentRun.answer``); "cancel" once ``signal`` fires."""
        aborting = driver.loop.controller.signal
        questions: RunQuestions = driver.loop.stream.questions
        return await questions.ask(make, signal, lambda: aborting.aborted)


IN_PROCESS = InProcess()


class AsyncioExecutor:
    """Performs the loop's actions as asyncio tasks started by its ``backend`` (module
    docstring); an ``Executor`` and a ``Reports``. It is given the ``loop`` it reports
    to, which never holds it (``agent/loop.py``). Slots, and the hook caller made when
    first asked for, as ``ActionLoop``'s."""

    __slots__ = (
        "_event_loop",
        "_hook_caller",
        "backend",
        "grace",
        "hooks",
        "loop",
        "model",
        "signal",
        "tasks",
        "tools",
    )

    def __init__(
        self,
        loop: ActionLoop,
        *,
        model: ModelClient | RunModel,
        tools: Mapping[str, Tool],
        hooks: Options,
        grace: float,
        backend: Backend = IN_PROCESS,
    ) -> None:
        self.loop = loop
        self.model = model
        self.tools = tools
        self.tasks: dict[str, asyncio.Future[None]] = {}  # "model" or a call id
        self.hooks = hooks  # the run's options record: its hooks are fields of it
        self.grace = grace
        self.backend = backend  # how each operation starts (module docstring)
        self.signal = loop.controller.signal  # the run's, which the model and tools hold
        self._event_loop = asyncio.get_running_loop()
        self._hook_caller: HookCaller | None = None

    @property
    def helpers(self) -> set[asyncio.Future[None]]:
        """The hook calls and grace timers under way: the loop's, as an abort cancels
        them (``ActionLoop.helpers``)."""
        return self.loop.helpers

    @property
    def hook_caller(self) -> HookCaller:
        """Made when a hook is first asked: most runs have none."""
        if self._hook_caller is None:
            self._hook_caller = HookCaller(self.hooks, self.loop.log, self.loop.note_failure)
        return self._hook_caller

    # -- reporting -------------------------------------------------------------------------

    def report(self, key: str, event: Event) -> None:
        """The one event of the operation ``key``, whose task is then forgotten (one
        that ends without a word is kept, for the grace period to answer)."""
        self.tasks.pop(key, None)
        self.loop.post(key, event)
        self.backend.reported(key)

    def put(self, event: Event) -> None:
        """A hook's answer (one of several for one permission check)."""
        self.loop.inbox.put_nowait(event)

    def tell(self, event: Callable[[], RunEvent]) -> None:
        """A running tool's progress report or log message, handed to the subscribers
        on the loop (built only if someone listens)."""
        deliver = partial(self.loop.stream.emit, event)
        if _running_loop() is self._event_loop:
            deliver()
        else:
            self._event_loop.call_soon_threadsafe(deliver)

    # -- the Executor protocol ---------------------------------------------------------------

    def start_model(self, action: CallModel, alone: bool) -> None:
        self.backend.start(self, Operation(MODEL, "model", action, alone))

    def start_tool(self, call: ToolCall, alone: bool) -> None:
        self.backend.start(self, Operation(TOOL, call.id, call, alone))

    def start_permission_checks(self, calls: Sequence[ToolCall]) -> None:
        self.backend.start(self, Operation(PERMISSIONS, "", tuple(calls)))

    def start_continue_check(self, turn: int) -> None:
        self.backend.start(self, Operation(CONTINUE, "", turn))

    def start_step(self, action: RunStep) -> None:
        self.backend.start(self, Operation(STEP, "", action))

    def start_cancellation(self, keys: Sequence[str], reason: str) -> None:
        self.backend.cancel(self, keys, reason)

    async def close(self) -> None:
        # Normally nothing is left: every operation reported before the run ended,
        # and an abandoned one is not waited for again. Left over only when the
        # caller cancelled run() twice.
        abandoned = self.loop.abandoned
        tasks = [t for k, t in self.tasks.items() if k not in abandoned]
        pending = [t for t in (*tasks, *self.helpers) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=self.grace)

    # -- tasks -------------------------------------------------------------------------------

    def keep(self, op: Operation, task: asyncio.Future[None]) -> None:
        """Keep ``task``, which performs ``op``: as the keyed operation's, which the
        grace period acts on, or as a hook's helper (``track_helper``)."""
        if not op.key:
            self.track_helper(task)
        elif not task.done():  # an eager one may have reported already
            self.tasks[op.key] = task

    def track_helper(self, task: asyncio.Future[None]) -> None:
        """Keep ``task`` (a hook call, a grace timer) as a helper, which an abort cancels."""
        self.helpers.add(task)
        task.add_done_callback(self.helpers.discard)

    def perform(self, op: Operation, to: Reports) -> Coroutine[Any, Any, None]:
        """The work of ``op`` in this process, reporting to ``to``."""
        kind, subject = op.kind, op.subject
        if kind == MODEL:
            return self.call_model(subject, to)
        if kind == TOOL:
            return self.run_tool(subject, to)
        if kind == PERMISSIONS:
            return self.check_permissions(subject, to)
        if kind == CONTINUE:
            return self.check_continue(subject, to)
        return self.run_step(subject, to)

    # -- operations --------------------------------------------------------------------------

    async def call_model(self, action: CallModel, to: Reports | None = None) -> None:
        """The model call; reports its one event (to the driver, or to ``to``)."""
        to = to or self
        try:
            context = action.messages
            if self.hooks.transform_context is not None or self.hooks.steps:
                context = await self.hook_caller.transformed(context)
            message = await self.model.complete(context, action.tools, self.signal)
        except BaseException as exc:
            if self._model_raised(exc, action, to):
                raise
            return
        if isinstance(message, AssistantMessage):
            to.report("model", ModelResponded(message))
            return
        error = ModelOutputError(
            f"the model client returned {type(message).__name__}, expected an AssistantMessage"
        )
        to.report("model", ModelFailed(describe(error)))

    def _model_raised(self, exc: BaseException, action: CallModel, to: Reports) -> bool:
        """Report the model call's failure; True for a cancellation someone asked for
        (reported as such, and to be raised on)."""
        if isinstance(exc, asyncio.CancelledError):
            if cancel_requested():
                to.report("model", ModelCancelled())
                return True
            # Nobody cancelled this task: the client leaked a CancelledError of its own.
            # That is one failed call, not a cancellation the engine never asked for.
            to.report("model", ModelFailed("CancelledError raised by the model client"))
            return False
        self.loop.log.warning("model_call_failed", turn=action.turn, error=describe(exc))
        # The engine records text (runs replay from data); the caller also gets the
        # exception itself as the cause of RunResult.error, e.g. to detect context
        # overflow and compact.
        self.loop.model_exception = exc
        to.report("model", ModelFailed(describe(exc)))
        self.loop.note_failure(exc, "the model client")
        return False

    async def run_tool(self, call: ToolCall, to: Reports | None = None) -> None:
        """The tool call, then the after_tool_call hook; reports its one event (to the
        driver, or to ``to``), with what the call spent on the run's behalf
        (``RunContext.add_usage``)."""
        to = to or self
        spent, token = start_spending()
        try:
            output = await self.execute(call)
            if self.hooks.after_tool_call is not None:
                output = await self.hook_caller.after_tool_call(call, output)
        except asyncio.CancelledError:
            to.report(call.id, ToolCancelled(call.id))
            raise
        except BaseException as exc:
            if call.id in self.loop.reported:
                raise  # abandoned, and now closed by its loop: nothing left to answer
            self.loop.log.warning("tool_output_unusable", call_id=call.id, error=describe(exc))
            output = ToolOutput(
                f"tool {call.name} returned output that could not be read: {describe(exc)}",
                is_error=True,
            )
            self.loop.note_failure(exc, f"tool {call.name}")
        finally:
            stop_spending(token)
        to.report(call.id, ToolFinished(call.id, spent.joined(output)))

    async def execute(self, call: ToolCall) -> ToolOutput:
        """Run the tool of ``call``, the call set in its context (``running_call``):
        its result, or the error result of its failure."""
        tool = self.tools[call.name]
        run_signal = self.signal
        token = running_call.set((self, call))
        try:
            if tool.timeout is None:
                value = await tool.execute(call.arguments_dict(), run_signal)
            else:
                # A per-call signal: fires on the run's abort and on this call's timeout.
                controller = AbortController()
                unlink = run_signal.add_listener(controller.abort)
                try:
                    value = await self._with_timeout(tool, call, controller)
                finally:
                    unlink()
        except BaseException as exc:
            output = self._tool_raised(call, exc)
            if output is None:
                raise
            return output
        finally:
            try:
                running_call.reset(token)
            except ValueError:
                pass  # an abandoned call closed later, from another context
        normalised = tool_output_from(value)
        if normalised is None:
            error = ToolOutputError(
                f"tool {call.name} returned a {type(value).__name__}; expected a str, a "
                "list of content blocks, or a ToolOutput"
            )
            self.loop.log.warning("tool_bad_output", call_id=call.id, tool=call.name)
            return ToolOutput(str(error), is_error=True)
        return normalised

    def _tool_raised(self, call: ToolCall, exc: BaseException) -> ToolOutput | None:
        """The result of a call that raised ``exc``; None for a cancellation someone
        asked for (to be raised on)."""
        log = self.loop.log
        aborted = self.signal.aborted
        if isinstance(exc, asyncio.CancelledError):
            if cancel_requested():
                return None
            # Nobody cancelled this task: the tool leaked a CancelledError of its own,
            # which is its failure like any other exception (one error result).
            log.info("tool_raised", call_id=call.id, tool=call.name, error="CancelledError")
            if aborted:
                return ToolOutput("Operation aborted: CancelledError", is_error=True)
            return ToolOutput("CancelledError raised by the tool", is_error=True)
        if isinstance(exc, _TimedOutError):
            return ToolOutput(str(exc), is_error=True)
        if isinstance(exc, ModelRetry) and not aborted:
            # asked, not failed: the model reads the message and calls again (rule 14)
            log.info("tool_retry", call_id=call.id, tool=call.name)
            return ToolOutput(str(exc) or "Try again.", is_error=True, retry=True)
        log.info("tool_raised", call_id=call.id, tool=call.name, error=describe(exc))
        self.loop.note_failure(exc, f"tool {call.name}")
        if aborted:
            return ToolOutput(f"Operation aborted: {describe(exc)}", is_error=True)
        return ToolOutput(describe(exc), is_error=True)

    async def _with_timeout(self, tool: Tool, call: ToolCall, controller: AbortController) -> Any:
        assert tool.timeout is not None
        task = asyncio.ensure_future(
            carried(tool.execute(call.arguments_dict(), controller.signal))
        )
        try:
            done, _ = await asyncio.wait({task}, timeout=tool.timeout)
            if task in done:
                return task.result()
            # Timed out: signal, give its cleanup the grace period, then cancel. What
            # the call does from now on is nobody's result.
            task.add_done_callback(_retrieve)
            text = f"Tool {call.name} timed out after {tool.timeout:g} s"
            controller.abort(text)
            await asyncio.wait({task}, timeout=self.grace)
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=self.grace)
            raise _TimedOutError(text)
        except asyncio.CancelledError:
            task.add_done_callback(_retrieve)
            task.cancel()
            raise

    async def check_permissions(self, calls: Sequence[ToolCall], to: Reports | None = None) -> None:
        """Ask ``before_tool_call`` about ``calls``; one event each."""
        loop = self.loop
        await self.hook_caller.check_permissions(
            calls, (to or self).put, lambda: loop.aborting or loop.fatal is not None
        )

    async def check_continue(self, turn: int, to: Reports | None = None) -> None:
        """Ask ``should_continue``; one ``ContinueDecided``."""
        (to or self).put(await self.hook_caller.check_continue(self.loop.engine.messages, turn))

    async def run_step(self, action: RunStep, to: Reports | None = None) -> None:
        """Call a declared step; one ``StepDecided``. An abort cancels it (a helper)."""
        event = await self.hook_caller.run_step(action.step, self.loop.engine.messages)
        (to or self).put(event)

    async def cancel_after_grace(self, keys: Sequence[str], reason: str) -> None:
        """One grace period from the abort on: half to finish on their own, half for
        the cleanup of a cancellation; then give up (module docstring)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        tasks = [self.tasks[k] for k in keys if k in self.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=self.grace / 2)
        stubborn = [k for k in keys if k in self.tasks and not self.tasks[k].done()]
        for key in stubborn:
            self.tasks[key].cancel()
        if stubborn:
            # At least one pass of the loop, even when a blocked loop used up the
            # grace period: a cancelled task that ends at once is not abandoned.
            remaining = max(deadline - loop.time(), 0.0)
            await asyncio.wait([self.tasks[k] for k in stubborn], timeout=remaining)
        for key in keys:
            task = self.tasks.get(key)
            if key in self.loop.reported or task is None:
                continue
            event: Event
            if task.done():  # it ended without a word: still one answer
                event = ModelCancelled() if key == "model" else ToolCancelled(key)
            else:
                # It ignored cancellation too: stop waiting for it.
                self.loop.abandoned.add(key)
                self.loop.log.warning("operation_abandoned", key=key, reason=reason)
                event = (
                    ModelCancelled(f"{ABANDONED}: it ignored cancellation")
                    if key == "model"
                    else ToolCancelled(key, f"{ABANDONED}: the tool ignored cancellation")
                )
            self.report(key, event)
