"""``Agent``: a model, tools, instructions, hooks and settings, kept for many runs.

An ``Agent`` holds what every run of it repeats; each method builds the keyword
arguments of the functional form and calls it, so ``Agent.run`` *is* ``run_agent``
(``run_stream`` builds the same ``AgentRun`` that ``run_agent`` runs, and ``resume``
calls ``resume_agent``): one code path, one set of checks, one result type.

Per run: a prompt (a string or a ``UserMessage``) after an optional
``message_history``, ``deps`` (handed to tools, hooks and instructions that take a
``RunContext``), ``model_settings`` (field by field over the agent's), a ``signal``.

``as_tool`` makes the agent a tool of another run (a sub-agent): the parent's abort
reaches the child through the tool's signal, the child's stats are added to the
parent's, and the parent's ``deps`` are the child's unless given. A sub-agent with an
``output_type`` answers with its output as JSON (its validated output), not with its
last text.

A child that stops for approval (its ``before_tool_call`` said ``RequireApproval``)
cannot make the *parent* run stop ``AwaitingUser``: the parent's call of the
sub-agent is running, and the table suspends a run only once nothing runs (rule 8),
with a snapshot that holds no running operation; carrying the child's suspension
through would need a row for a running call that waits for a person. So the child's
approvals are routed to a hook instead: ``as_tool(approve=...)`` takes a hook of
``before_tool_call``'s shape (the parent's own ``before_tool_call`` fits) and is asked
about each call the child waits on, named as the child's (``"<tool>.<child tool>"``,
same id and arguments): ``None`` approves it, ``Deny(reason)`` denies it, and the
child is resumed inside the parent's call, as often as it stops (at most its
``max_turns`` times). ``RequireApproval`` from that hook, or no hook, ends the
parent's call with an error result naming the waiting calls.

``Agent`` is generic over the output type: ``Agent(model, output_type=City)`` is an
``Agent[City]`` without an annotation, and its runs return ``RunResult[City]``, so
``result.output`` is a ``City | None`` to mypy (``Agent[Any]`` without an output type).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Generic, Unpack

import attrs

from statemachine.agent.calls import call_hook
from statemachine.agent.context import check_deps, current_run_context, note_child_stats
from statemachine.agent.events import OutputT, RunEvent, RunResult, RunStats, TextDelta
from statemachine.agent.hooks import (
    BeforeToolCall,
    Deny,
    RequireApproval,
)
from statemachine.agent.model import ModelClient, ModelSettings, resolve_model
from statemachine.agent.options import AgentOptions, Options, resolve
from statemachine.agent.output import compile_output, output_json
from statemachine.agent.resume import resume_run
from statemachine.agent.run import (
    AgentRun,
)
from statemachine.agent.session import Session, SessionTurn, resume_in_session, run_in_session
from statemachine.agent.steps import check_steps
from statemachine.agent.sync import refuse_running_loop, run_sync
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import Message, ToolCall, UserMessage, thaw_json
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.errors import InvalidInputError

__all__ = ["Agent", "StreamedRun"]

_PROMPT_SCHEMA = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "what to ask the agent"}},
    "required": ["prompt"],
    "additionalProperties": False,
}


class Agent(Generic[OutputT]):
    """What every run of an agent shares; ``run``, ``run_sync``, ``run_stream``,
    ``resume``, ``resume_sync``, ``as_tool`` (module docstring).

    ``model`` is a ``ModelClient`` or a model string (``"openai:gpt-4.1"``). The other
    keywords are ``run_agent``'s; ``deps_type``, when given, is checked against the
    ``deps`` of every run (as a tool's ``RunContext[T]`` is), before any model call.
    ``output_type``, ``output_retries``, ``output_mode`` and ``usage_limits`` are
    checked here, as
    ``run_agent`` checks them (``InvalidInputError`` naming the argument), and given to
    every run and every resume of the agent. ``steps`` (``statemachine.steps``) are
    checked here too and given to every run; ``table`` is the agent's transition
    table, steps included (what ``statemachine check --agent`` and ``diagram --agent``
    read).
    """

    def __init__(
        self,
        model: ModelClient | str,
        *,
        name: str | None = None,
        deps_type: type | None = None,
        **options: Unpack[AgentOptions[OutputT]],
    ) -> None:
        self.options = resolve("Agent", options, AgentOptions)
        self.table = check_steps(self.options.steps)
        # Built here only to refuse a bad type or retry count now (the retries are read,
        # as by run_agent, only with an output type); each run builds its own.
        self.model = resolve_model(model)
        opts = self.options
        compile_output(opts.output_type, opts.output_retries, opts.output_mode, self.model)
        self.name = name
        self.deps_type = deps_type

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The agent's tools."""
        return self.options.tools

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, model={self.model!r}, tools={len(self.tools)})"

    def _options(
        self, deps: object, model_settings: ModelSettings | None, signal: AbortSignal | None
    ) -> Options:
        """The options of one run of this agent."""
        check_deps(deps, [(f"Agent {self.name or ''}".rstrip(), self.deps_type)])
        settings = (self.options.model_settings or ModelSettings()).merged(model_settings)
        return attrs.evolve(self.options, deps=deps, model_settings=settings, signal=signal)

    def _messages(
        self, prompt: str | UserMessage | None, message_history: Sequence[Message]
    ) -> list[Message]:
        """The messages one run is given: ``message_history``, then ``prompt``."""
        if isinstance(message_history, (str, bytes)) or not isinstance(message_history, Sequence):
            raise InvalidInputError("message_history must be a sequence of messages")
        messages = list(message_history)
        if prompt is not None:
            messages.append(UserMessage(prompt) if isinstance(prompt, str) else prompt)
        return messages

    # -- run --------------------------------------------------------------------------------

    async def run(
        self,
        prompt: str | UserMessage | None = None,
        *,
        message_history: Sequence[Message] = (),
        deps: object = None,
        model_settings: ModelSettings | None = None,
        signal: AbortSignal | None = None,
        session: Session | None = None,
    ) -> RunResult[OutputT]:
        """``run_agent`` with this agent's model, tools, instructions, hooks and
        settings, on ``message_history`` followed by ``prompt``; with a ``session``
        (``statemachine.sessions``), on the session's history instead."""
        messages = self._messages(prompt, message_history)
        options = self._options(deps, model_settings, signal)

        async def run(history: Sequence[Message]) -> RunResult[OutputT]:
            return await AgentRun(model=self.model, messages=history, options=options).run()

        if session is not None:
            _one_history(message_history)
            return await run_in_session(session, messages, run)
        return attrs.evolve(await run(messages), given=len(message_history))

    def run_sync(
        self,
        prompt: str | UserMessage | None = None,
        *,
        message_history: Sequence[Message] = (),
        deps: object = None,
        model_settings: ModelSettings | None = None,
        signal: AbortSignal | None = None,
        session: Session | None = None,
    ) -> RunResult[OutputT]:
        """``run`` for code without an event loop (as ``run_agent_sync``)."""
        refuse_running_loop("run_sync")
        run = self.run(
            prompt,
            message_history=message_history,
            deps=deps,
            model_settings=model_settings,
            signal=signal,
            session=session,
        )
        return run_sync(run, self.options.grace_period)

    @contextlib.asynccontextmanager
    async def run_stream(
        self,
        prompt: str | UserMessage | None = None,
        *,
        message_history: Sequence[Message] = (),
        deps: object = None,
        model_settings: ModelSettings | None = None,
        signal: AbortSignal | None = None,
        session: Session | None = None,
    ) -> AsyncIterator[StreamedRun[OutputT]]:
        """``async with agent.run_stream(prompt) as run:`` iterate ``run`` for every
        ``RunEvent``, or ``run.stream_text()`` for the answer's text as it arrives;
        ``await run.result()`` for the ``RunResult``. Leaving the block early aborts
        the run (and waits for it to close). With a ``session``, the run's new messages
        are stored when the block ends."""
        messages, given = self._messages(prompt, message_history), len(message_history)
        options = self._options(deps, model_settings, signal)
        turn = None
        if session is not None:
            _one_history(message_history)
            turn = await SessionTurn.open(session, messages)
            messages, given = turn.messages, turn.given
        try:
            run = AgentRun[OutputT](model=self.model, messages=messages, options=options)
            streamed: StreamedRun[OutputT] = StreamedRun(run, given, turn)
        except BaseException:
            if turn is not None:
                turn.release()
            raise
        try:
            yield streamed
        except BaseException:
            streamed.run.abort("the run_stream block raised")
            with contextlib.suppress(Exception):
                await streamed.result()
            raise
        if not streamed.task.done():
            streamed.run.abort("the run_stream block ended before the run")
        await streamed.result()

    # -- resume -----------------------------------------------------------------------------

    async def resume(
        self,
        state: RunResult | Mapping[str, Any],
        *,
        approvals: Mapping[str, bool | Deny] | None = None,
        message: str | UserMessage | None = None,
        deps: object = None,
        model_settings: ModelSettings | None = None,
        signal: AbortSignal | None = None,
        key: bytes | str | None = None,
        stats: RunStats | None = None,
        session: Session | None = None,
    ) -> RunResult[OutputT]:
        """``resume_agent`` with this agent's model, tools, instructions, hooks, output
        type and usage limits (so the resumed run's output is typed again); with the
        ``session`` the run was suspended on, its turn is stored there once it ends."""
        if session is not None:
            return await resume_in_session(
                session,
                state,
                lambda: self.resume(
                    state,
                    approvals=approvals,
                    message=message,
                    deps=deps,
                    model_settings=model_settings,
                    signal=signal,
                    key=key,
                    stats=stats,
                ),
            )
        run = resume_run(
            state,
            model=self.model,
            options=self._options(deps, model_settings, signal),
            approvals=approvals,
            message=message,
            key=key,
            stats=stats,
        )
        return await run.run()

    def resume_sync(
        self,
        state: RunResult | Mapping[str, Any],
        *,
        approvals: Mapping[str, bool | Deny] | None = None,
        message: str | UserMessage | None = None,
        deps: object = None,
        model_settings: ModelSettings | None = None,
        signal: AbortSignal | None = None,
        key: bytes | str | None = None,
        stats: RunStats | None = None,
        session: Session | None = None,
    ) -> RunResult[OutputT]:
        """``resume`` for code without an event loop."""
        refuse_running_loop("resume_sync")
        run = self.resume(
            state,
            approvals=approvals,
            message=message,
            deps=deps,
            model_settings=model_settings,
            signal=signal,
            key=key,
            stats=stats,
            session=session,
        )
        return run_sync(run, self.options.grace_period)

    # -- as a tool of another agent ---------------------------------------------------------

    def as_tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        deps: Callable[[object], object] | None = None,
        timeout: float | None = None,
        approve: BeforeToolCall | None = None,
    ) -> Tool:
        """This agent as a tool taking one ``prompt`` (module docstring): its result is
        the child's final text, or its output as JSON when the agent has an
        ``output_type``. ``deps`` turns the parent's deps into the child's (default:
        the same object). ``approve`` decides the calls the child stops to have
        approved (module docstring)."""
        tool_name = name or self.name
        if not tool_name:
            raise InvalidInputError("as_tool needs a name (or an Agent with one)")
        definition = ToolDefinition(
            name=tool_name,
            description=description or f"Ask the {tool_name} agent.",
            parameters=_PROMPT_SCHEMA,
        )

        async def execute(arguments: dict[str, Any], signal: AbortSignal) -> ToolOutput:
            parent = current_run_context()
            parent_deps = parent.deps if parent is not None else None
            child_deps: Any = deps(parent_deps) if deps is not None else parent_deps
            result = await self.run(arguments["prompt"], deps=child_deps, signal=signal)
            result = await self._approved(result, tool_name, approve, child_deps, signal)
            if result.stats is not None:
                note_child_stats(result.stats)
            return _child_output(tool_name, result, self.options.output_type is not None)

        return Tool(definition, execute, timeout=timeout)

    async def _approved(
        self,
        result: RunResult[OutputT],
        tool_name: str,
        approve: BeforeToolCall | None,
        deps: object,
        signal: AbortSignal,
    ) -> RunResult[OutputT]:
        """The child's run once ``approve`` has decided each call it stopped for and it
        was resumed (``result`` itself without a hook, or when the hook asks for a
        person); the child's turns bound how often it can stop."""
        for _ in range(self.options.max_turns):
            if approve is None or not result.pending_approvals:
                return result
            decisions: dict[str, bool | Deny] = {}
            for call in result.pending_approvals:
                named = ToolCall(call.id, f"{tool_name}.{call.name}", thaw_json(call.arguments))
                decision = await call_hook(approve, named)
                if isinstance(decision, RequireApproval):
                    return result  # a person is needed: the call ends naming the calls
                if decision is not None and not isinstance(decision, Deny):
                    raise InvalidInputError(
                        f"as_tool's approve returned {type(decision).__name__}: expected "
                        "None (approve), Deny or RequireApproval"
                    )
                decisions[call.id] = True if decision is None else decision
            result = await self.resume(result, approvals=decisions, deps=deps, signal=signal)
        return result


def _one_history(message_history: Sequence[Message]) -> None:
    if message_history:
        raise InvalidInputError(
            "give message_history or session, not both: a session run starts from the "
            "session's history"
        )


def _child_output(name: str, result: RunResult[Any], typed: bool) -> ToolOutput:
    """The tool result of a sub-agent's run: its output as JSON when it has an output
    type, else its final text."""
    if result.state is TurnState.DONE:
        if typed:
            return ToolOutput(json.dumps(output_json(result.messages)))
        return ToolOutput(result.final_text)
    if result.state is TurnState.AWAITING_USER:
        calls = ", ".join(f"{c.name} ({c.id})" for c in result.pending_approvals)
        return ToolOutput(
            f"the {name} agent stopped to ask a person's approval for {calls or 'its input'}; "
            "a person cannot be asked inside a sub-agent's call (give as_tool an approve "
            "hook, such as the parent's before_tool_call, to decide them)",
            is_error=True,
        )
    return ToolOutput(
        f"the {name} agent ended {result.state.value}: {result.explanation}", is_error=True
    )


class StreamedRun(Generic[OutputT]):
    """A run being streamed (``Agent.run_stream``): its events, its text, its result."""

    def __init__(self, run: AgentRun[OutputT], given: int, turn: SessionTurn | None = None) -> None:
        self.run = run
        self._given = given
        self._turn = turn
        self._events = run.events()  # subscribed before the run starts: sees it all
        self.task: asyncio.Task[RunResult[OutputT]] = asyncio.ensure_future(run.run())

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        return self._events

    async def stream_text(self) -> AsyncIterator[str]:
        """The answer's text fragments as they arrive (``TextDelta`` events)."""
        async for event in self._events:
            if isinstance(event, TextDelta):
                yield event.text

    async def result(self) -> RunResult[OutputT]:
        """How the run returned (waits for it); stored in the run's session, if any."""
        try:
            result = attrs.evolve(await self.task, given=self._given)
        except BaseException:
            if self._turn is not None:
                self._turn.release()
            raise
        return result if self._turn is None else await self._turn.keep(result)
