"""The run: ``AgentRun`` (a handle for steering, aborting and watching one run),
``run_agent`` and ``run_agent_sync``.

``AgentRun`` holds the engine, the run's event stream (``statemachine.agent.stream``)
and, while it runs, the action loop (``statemachine.agent.loop``) with the in-process
executor (``statemachine.agent.executor``); what a caller holds is queued input
(``steer``, ``follow_up``), ``abort`` and the event stream (``events()``). The hooks
and their failure modes are in ``statemachine.agent.hooks``; resuming a suspended run
in ``statemachine.agent.resume``.

Exceptions that are not ``Exception``: ``KeyboardInterrupt`` and ``SystemExit`` from a
tool, client or hook abort the run and close it (every task cancelled and awaited,
every call answered), and then ``run()`` raises the exception to its caller;
``AgentRun.result`` holds how the run returned. When the caller cancels ``run()`` itself
(``asyncio.Runner`` does so on Ctrl-C), the run is aborted and closed the same way
before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Generic, Unpack

import attrs

from statemachine.agent.context import (
    RunContext,
    check_run_deps,
    engine_context,
    reset_run_context,
    run_context,
)
from statemachine.agent.events import (
    OutputT,
    RunEvent,
    RunResult,
    RunStats,
    TextDelta,
    ToolQuestion,
    run_error,
)
from statemachine.agent.executor import IN_PROCESS, AsyncioExecutor, Backend
from statemachine.agent.loop import ActionLoop, Inbox, RunInbox
from statemachine.agent.model import ModelClient, ModelSettings, check_settings, resolve_model
from statemachine.agent.model_call import RunModel
from statemachine.agent.options import DEFAULTS, NewRunOptions, Options, resolve
from statemachine.agent.output import Output, budget_options, compile_output, run_output
from statemachine.agent.questions import Answer
from statemachine.agent.running import current_tool_call
from statemachine.agent.session import run_in_session
from statemachine.agent.steps import check_steps
from statemachine.agent.stream import DEFAULT_MAX_BUFFERED_EVENTS, EventStream
from statemachine.agent.sync import DEFAULT_GRACE_PERIOD, refuse_running_loop, run_sync
from statemachine.agent.tools import check_tools, scheduling_of
from statemachine.core.abort import AbortController
from statemachine.core.engine import Engine
from statemachine.core.events import AbortRequested, Event, InputKind, InputQueued, Start
from statemachine.core.messages import Message, UserMessage
from statemachine.core.table import BASE_TABLE, Table, TurnState
from statemachine.errors import InvalidInputError, UsageError

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "AgentRun",
    "check_first",
    "check_tools",
    "continue_run",
    "run_agent",
    "run_agent_sync",
    "use_backend",
]


_NO_SETTINGS = ModelSettings()  # frozen, so one serves every run given none


def _checked_model(model: ModelClient | str, options: Options) -> tuple[ModelClient, ModelSettings]:
    """The run's client (a model string resolved) and settings, once what the client
    cannot send and deps of a type the tools do not take are refused."""
    client = resolve_model(model)
    if not callable(getattr(client, "complete", None)):
        raise InvalidInputError("model must have an async complete(messages, tools, signal)")
    settings = options.model_settings or _NO_SETTINGS
    if options.instructions is not None or settings != _NO_SETTINGS:  # else nothing to refuse
        check_settings(client, settings, options.instructions is not None)
    check_run_deps(options.deps, options.tools, options.instructions)
    return client, settings


class AgentRun(Generic[OutputT]):
    """One run of the loop, with a handle for steering, aborting and watching it.

    ``await AgentRun(...).run()`` is ``run_agent(...)``. Before or while it runs:
    ``steer(msg)`` queues a message for the next turn boundary, ``follow_up(msg)``
    one for when the model would otherwise finish, ``abort(reason)`` aborts, and
    ``events()`` is an async iterator of ``RunEvent``s (subscribe before ``run()``
    to see them all).

    Its parts: the ``engine``; an ``EventStream`` (the subscribers, the stats); and,
    while ``run()`` runs, an ``ActionLoop`` (``statemachine.agent.loop``) that hands
    the engine one event at a time and each action it answers with to an executor
    (``AsyncioExecutor``, ``statemachine.agent.executor``), whose operations report
    back to the loop's inbox.
    """

    # Slots: thousands of runs may wait in one process, each holding its handle.
    __slots__ = (
        "_backend",
        "_check_first",
        "_early",
        "_first",
        "_given",
        "_inbox",
        "_loop",
        "_loop_thread",
        "_model",
        "_on_handle",
        "_outcome",
        "_output",
        "_started",
        "_stream",
        "_tools",
        "engine",
        "options",
        "run_id",
    )

    def __init__(
        self,
        *,
        model: ModelClient | str,
        messages: Sequence[Message] | str = (),
        options: Options = DEFAULTS,
        previous_stats: RunStats | None = None,
        given: int | None = None,
        **keywords: Unpack[NewRunOptions[OutputT]],
    ) -> None:
        """``keywords``: the run's options (``NewRunOptions``), each in place of that
        field of ``options`` (a resolved ``Options``, what ``Agent``, resume and the
        durable runners hand on)."""
        opts = resolve("AgentRun", keywords, NewRunOptions, options)
        if opts.session is not None:  # its history is read before a run is built
            raise InvalidInputError(
                "AgentRun takes no session: run_agent(session=...) or Agent.run(session=...)"
            )
        model, settings = _checked_model(model, opts)
        output = compile_output(
            opts.output_type, opts.output_retries, opts.output_mode, model, opts.end_strategy
        )
        engine = opts.engine_factory(
            tools=[t.definition for t in opts.tools],
            messages=(UserMessage(messages),) if isinstance(messages, str) else messages,
            max_turns=opts.max_turns,
            **budget_options(opts.usage_limits, output, opts.tools, opts.unknown_tool_retries),
            **_table_option(check_steps(opts.steps)),
            check_permissions=opts.before_tool_call is not None,
            check_continue=opts.should_continue is not None,
            scheduling=scheduling_of(opts.tools),
            run_id=opts.run_id or secrets.token_hex(6),
            logger=opts.logger,
        )
        # Hooks are code, not in a snapshot: a restored engine asks this run's hooks.
        engine.check_permissions = opts.before_tool_call is not None
        engine.check_continue = opts.should_continue is not None
        self.engine = engine
        self.run_id = engine.run_id
        self.options = opts
        self._given = len(engine.messages) if given is None else given
        self._stream = EventStream(engine, previous_stats)
        # Given what a context is made of, not the run: a returned run is then no cycle.
        instructions = opts.instructions
        context = partial(_context, engine, opts.deps) if callable(instructions) else None
        if output is not None and output.spec.check is not None and engine.output is not None:
            # A restored engine's spec (resume) is judged by this run's output type.
            engine.output = attrs.evolve(engine.output, check=output.check)
        self._output = output or Output.untyped(engine.output)
        judge = output.judge if output is not None and output.awaits else None
        self._model = RunModel(model, instructions, settings, self._stream, context, engine, judge)
        self._tools = {t.name: t for t in opts.tools}
        self._not_started()

    def _not_started(self) -> None:
        """The state of a run before ``run()``."""
        # What starts the run: ``Start``, or the events a resumed run goes on with.
        self._first: tuple[Event, ...] = ()
        # What a backend may replace (``use_backend``).
        self._inbox: Inbox | None = None
        self._backend: Backend = IN_PROCESS
        self._on_handle: Callable[[Event], None] | None = None
        # Asked before anything runs (``check_first``): a resumed run's policy again.
        self._check_first: Callable[[], Awaitable[None]] | None = None
        # While run() runs: the action loop, bound to the event loop's thread.
        self._loop: ActionLoop | None = None
        self._loop_thread = 0
        # Input and aborts before run() started: a tuple, grown by a new one, as most
        # runs have none (an empty tuple is shared, a list would be one per run).
        self._early: tuple[Event, ...] = ()
        self._started = False
        self._outcome: RunResult[OutputT] | None = None

    @property
    def aborting(self) -> bool:
        """Whether the run is being aborted: an abort was asked while it runs, so no
        model call or tool call starts any more."""
        loop = self._loop
        return loop is not None and loop.aborting

    @property
    def result(self) -> RunResult[OutputT] | None:
        """How the run returned, once ``run()`` has returned or raised (a
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
        text = "aborted by the caller" if reason is None else str(reason)
        loop = self._loop
        if loop is None:
            if not self._started:
                self._early += (AbortRequested(text),)
            return  # ended: nothing left to abort; not an error (abort is idempotent)
        self._on_loop_thread(loop, loop.abort, text)

    def pending_questions(self) -> tuple[ToolQuestion, ...]:
        """The questions the run's running tools wait on a person for (an MCP server's
        elicitation, ``MCPServer(elicitation="run")``), oldest first."""
        return self._stream.questions.pending()

    def answer(self, question_id: str, answer: Answer) -> None:
        """Answer a pending question (thread-safe): a mapping of its schema's fields
        accepts, "decline" says no, "cancel" dismisses it. ``InvalidInputError`` for an
        answer that does not fit the schema, ``NotPendingError`` for a question that
        is not pending (``statemachine.agent.questions``)."""
        self._stream.questions.answer(question_id, answer)

    def events(self, max_buffered: int = DEFAULT_MAX_BUFFERED_EVENTS) -> AsyncIterator[RunEvent]:
        """An async iterator of this run's events; ends after ``RunReturned``.

        Subscribe before ``run()``, or in a task created before ``run()`` is
        awaited (``run()`` lets such tasks start first), to see ``RunStarted`` on.
        The run never waits for a subscriber: one that lags gets the newest progress
        of each call, and past ``max_buffered`` unread events an ``EventsDropped``
        in place of the events that only describe the run's progress (``MessageAdded``,
        ``ToolStarted``, ``ToolEnded``, ``RunReturned``, ``ToolAsked`` and
        ``ToolAnswered`` are always kept)."""
        return self._stream.subscribe(max_buffered)

    async def stream_text(self) -> AsyncIterator[str]:
        """The answer's text fragments as the model streams them (``TextDelta``), until
        the run returns; subscribe as for ``events()``. A client that does not stream
        (or takes no ``options``) gives none: read ``RunResult.final_text`` then.
        Every fragment is kept for it, however far it lags."""
        async for event in self._stream.subscribe(keep=(TextDelta,)):
            if isinstance(event, TextDelta):
                yield event.text

    def context(self) -> RunContext[Any]:
        """The run's context as it is now (what tools and hooks that ask receive)."""
        return _context(self.engine, self.options.deps)

    def _add_child_stats(self, stats: Any) -> None:
        """A sub-agent's stats, counted in this run's (``note_child_stats``)."""
        self._stream.add_child(stats)

    def _queue_input(self, message: str | UserMessage, kind: InputKind) -> None:
        if isinstance(message, str):
            message = UserMessage(message)
        if not isinstance(message, UserMessage):
            raise InvalidInputError("queued input must be a str or a UserMessage")
        loop = self._loop
        if self._outcome is not None or (loop is not None and loop.returned):
            raise UsageError(
                "the run has returned to its caller; give this message to resume_run "
                "or to a new run"
            )
        event = InputQueued(message, kind)
        if loop is None:
            self._early += (event,)
        else:
            # From a tool, hook or model client of this run: queued now (ordering
            # rule O4, ``agent/loop.py``).
            self._on_loop_thread(loop, loop.inbox.put_nowait, event)

    def _on_loop_thread(self, loop: ActionLoop, act: Callable[[Any], None], arg: Any) -> None:
        """``act(arg)`` now on the event loop's thread, else handed to ``loop`` (done
        before it handles its next event: O3, ``agent/loop.py``)."""
        if threading.get_ident() == self._loop_thread:
            act(arg)
            return
        try:
            loop.later(partial(act, arg), from_thread=True)
        except RuntimeError:
            pass  # the loop has closed: the run is over

    # -- the run ------------------------------------------------------------------------------

    async def run(self) -> RunResult[OutputT]:
        """Drive the run to a terminal state or ``AwaitingUser``; never raises for
        how it ends (see ``RunResult``), only a ``KeyboardInterrupt`` or
        ``SystemExit`` raised under it, once the run is closed (module docstring)."""
        check = self._check_first
        if check is not None:
            token = run_context(self)
            try:
                await check()
            finally:
                reset_run_context(token)
            self._check_first = None  # agreed: a second run() is refused below
        # Tasks created before run() was awaited (subscribers of events()) start first.
        await asyncio.sleep(0)
        if self._started:
            raise UsageError("an AgentRun runs once; create a new one (or resume_agent)")
        self._started = True
        self._loop_thread = threading.get_ident()
        loop, executor = self._action_loop()
        self._loop = loop
        remove = self._listen(loop)
        token = run_context(self)  # every task inherits it
        try:
            self._stream.run_started(self.run_id)
            self._first_events(loop, executor)
            try:
                await loop.drive(executor)
            except asyncio.CancelledError:
                # The caller cancelled run() (asyncio.Runner does on Ctrl-C): close the
                # run as an abort, so every call still gets its result, then go on.
                loop.abort("the caller cancelled the run")
                await loop.drive(executor)
                raise
        finally:
            reset_run_context(token)
            remove()
            try:
                await executor.close()
            finally:
                loop.close()
            self._outcome = self._result(loop)
            self._loop = None
        if loop.fatal is not None:
            raise loop.fatal
        return self._outcome

    def _action_loop(self) -> tuple[ActionLoop, AsyncioExecutor]:
        """The run's action loop, and the executor that reports to it (which the loop
        never holds: ``agent/loop.py``)."""
        loop = ActionLoop(
            self.engine,
            inbox=self._inbox if self._inbox is not None else RunInbox(),
            stream=self._stream,
            controller=AbortController(),  # what tools and the model client hold
            log=self.options.logger,  # None: the library's
            on_handle=self._on_handle,
        )
        executor = AsyncioExecutor(
            loop,
            model=self._model,
            tools=self._tools,
            hooks=self.options,  # the hooks are its fields
            grace=float(self.options.grace_period),
            backend=self._backend,
        )
        return loop, executor

    def _listen(self, loop: ActionLoop) -> Callable[[], None]:
        """Abort ``loop`` when the caller's signal fires; what removes the listener."""
        signal = self.options.signal  # None: the run is aborted by its handle only
        if signal is None:
            return _nothing_to_remove
        # On the loop's own thread (a tool or hook aborting), the abort acts at once, so
        # the signals that tools hold fire before the aborting code's next line.
        return signal.add_listener(
            lambda reason: self._on_loop_thread(loop, loop.abort, str(reason))
        )

    def _first_events(self, loop: ActionLoop, executor: AsyncioExecutor) -> None:
        """Hand the engine what starts the run: ``Start`` (or the events a resumed run
        goes on with), and what was queued before ``run()``; or, if it was aborted
        already, the abort."""
        early_inputs = [e for e in self._early if isinstance(e, InputQueued)]
        early_abort = next((e for e in self._early if isinstance(e, AbortRequested)), None)
        signal = self.options.signal
        if (signal is None or not signal.aborted) and early_abort is None:
            first: list[Event] = (
                [*self._first, *early_inputs] if self._first else [*early_inputs, Start()]
            )
            for event in first:
                loop.handle(event, executor)
            return
        # Aborted before anything started: no model call is made at all.
        if not self._first:
            for queued in early_inputs:
                loop.handle(queued, executor)  # kept as queued input, nothing is lost
        if early_abort is not None:
            reason = early_abort.reason
        else:
            assert signal is not None  # it was aborted, or the run would have started
            reason = str(signal.reason)
        loop.aborting = True
        loop.controller.abort(reason)
        loop.handle(AbortRequested(reason), executor)

    def _result(self, loop: ActionLoop) -> RunResult[OutputT]:
        engine = self.engine
        state = engine.state
        explanation = engine.explanation or ""
        error = run_error(state, explanation)
        if error is not None and state is TurnState.FAILED:
            error.__cause__ = loop.model_exception
        # Handed over, not kept: its traceback holds the executor, which holds the loop.
        loop.model_exception = None
        result_messages = tuple(engine.messages)
        return RunResult(
            state=state,
            messages=result_messages,
            error=error,
            turns=engine.turns,
            explanation=explanation,
            trace=tuple(engine.trace),
            run_id=self.run_id,
            stats=self._stream.stats(engine),
            pending_approvals=tuple(call for call, _ in engine.pending_approvals()),
            queued_input=engine.queued_input() + loop.late_input,
            snapshot=engine.snapshot() if state is TurnState.AWAITING_USER else None,
            given=self._given,
            usage=engine.usage,
            output=run_output(self._output, result_messages, engine.output_call)
            if state is TurnState.DONE
            else None,
        )


def _context(engine: Engine, deps: object) -> RunContext[Any]:
    """The context of the run of ``engine`` as it is now."""
    return engine_context(engine, deps, current_tool_call())


def _nothing_to_remove() -> None:
    """No signal was given, so no listener was added."""


def _table_option(table: Table) -> dict[str, Any]:
    """The run's table, given only for a run with steps (so that an ``engine_factory``
    written before steps still works for runs without them)."""
    return {} if table is BASE_TABLE else {"table": table}


def continue_run(engine: Engine, first_events: Sequence[Event], **options: Any) -> AgentRun:
    """A run that goes on with ``engine`` (restored from a snapshot, or a durable run's
    after a wait) by handing it ``first_events`` (the person's decisions, or a new
    message) instead of ``Start``; ``options`` are ``AgentRun``'s keywords
    (``messages``, ``max_turns`` and ``run_id`` are the engine's)."""
    run: AgentRun = AgentRun(engine_factory=lambda **_: engine, **options)
    run._first = tuple(first_events)
    return run


def check_first(run: AgentRun, check: Callable[[], Awaitable[None]]) -> None:
    """Have ``run`` await ``check()`` (in the run's context) before anything runs; an
    exception it raises is ``run()``'s, and nothing runs (a resumed run's policy,
    asked again). Before ``run()`` only."""
    if run._started:
        raise UsageError("a check is given before the run starts")
    run._check_first = check


def use_backend(
    run: AgentRun,
    *,
    inbox: Inbox,
    backend: Backend,
    on_handle: Callable[[Event], None] | None = None,
) -> None:
    """Run ``run`` with a backend's ``inbox`` and ``backend`` (``agent/executor.py``:
    how its operations are started, the durable ones recording each);
    ``on_handle`` is told of every event before the engine gets it. Before ``run()``
    only."""
    if run._started:
        raise UsageError("a backend is chosen before the run starts")
    run._inbox = inbox
    run._backend = backend
    run._on_handle = on_handle


async def run_agent(
    *,
    model: ModelClient | str,
    messages: Sequence[Message] | str,
    **options: Unpack[NewRunOptions[OutputT]],
) -> RunResult[OutputT]:
    """Run the agent loop until a terminal state or ``AwaitingUser``.

    Never raises for the state a run returns in (``RunResult``); raises ``InvalidInputError`` before
    any model call for an invalid history, duplicate tool names or bad arguments. ``AgentRun`` adds
    steering, abort by handle and the event stream. ``messages`` may be a string (one user message);
    ``model`` a model string (``statemachine.providers.registry``). The options (``tools``,
    ``max_turns``, the hooks, ``instructions``, ``deps``...) are ``NewRunOptions``, each
    documented there.
    """
    opts = resolve("run_agent", options, NewRunOptions)
    del options  # the keywords' dict, resolved: not held while the run waits
    if opts.session is not None:
        return await _run(model, messages, opts)
    run = AgentRun(model=model, messages=messages, options=opts)
    del opts
    return await run.run()


def run_agent_sync(
    *,
    model: ModelClient | str,
    messages: Sequence[Message] | str,
    **options: Unpack[NewRunOptions[OutputT]],
) -> RunResult[OutputT]:
    """``run_agent`` for code without an event loop (same keyword arguments).
    Like ``asyncio.run`` (Ctrl-C cancels the run, which is closed as an abort, then
    raises ``KeyboardInterrupt``), except that it never waits for what the run has
    abandoned: ``asyncio.run`` would wait for every leftover task and every executor
    thread, so a tool that ignores cancellation, or a sync tool blocked in its
    thread, would hold it forever. Such a thread keeps running after the return (a
    thread cannot be interrupted), and the interpreter waits for it when it exits.
    """
    refuse_running_loop("run_agent_sync")
    opts = resolve("run_agent_sync", options, NewRunOptions)
    return run_sync(_run(model, messages, opts), opts.grace_period)


async def _run(
    model: ModelClient | str, messages: Sequence[Message] | str, options: Options
) -> RunResult[Any]:
    """A new run of ``options``, built and run on the running event loop; with a
    ``session``, on the session's history, and stored there (``run_in_session``)."""
    session = options.session
    if session is None:
        return await AgentRun(model=model, messages=messages, options=options).run()
    options = attrs.evolve(options, session=None)

    async def start(history: Sequence[Message]) -> RunResult[Any]:
        return await AgentRun(model=model, messages=history, options=options).run()

    return await run_in_session(session, messages, start)
