"""``Agent``: a model, tools, instructions, hooks and settings, kept for many runs.

An ``Agent`` holds what every run of it repeats, as one record of the run's options
(``agent.options``, ``statemachine.agent.options``); each method hands that record,
with the run's own ``deps``, ``model_settings`` and ``signal`` in place, to the same
``AgentRun`` that ``run_agent`` runs (``resume`` to ``resume_run``): one code path,
one set of checks, one result type.

Per run: a prompt (a string or a ``UserMessage``) after an optional
``message_history``, ``deps`` (handed to tools, hooks and instructions that take a
``RunContext``), ``model_settings`` (field by field over the agent's), ``instructions``
(after the agent's own, for that run only, as PydanticAI's), a ``signal``, a
``session`` (``AgentRunKeywords``, declared once for every run method).

``as_tool`` makes the agent a tool of another run (a sub-agent; its rules, approvals
included, are in ``statemachine.agent.delegation``): the parent's abort reaches the
child through the tool's signal, its stats join the parent's, the parent's ``deps`` are
the child's unless given, and an ``output_type`` answers with its output as JSON.

``Agent[Deps, Output]`` is generic over its deps and output types, as PydanticAI's:
``Agent(model, deps_type=Shop, output_type=City)`` is an ``Agent[Shop, City]`` without
an annotation; its runs take ``deps: Shop`` and return ``RunResult[City]``, so
``result.output`` is a ``City | None`` to mypy (``Any`` for a type not given). The
decorators ``@agent.tool`` (a function taking ``RunContext[Shop]``: mypy refuses
another deps type), ``@agent.tool_plain`` and ``@agent.instructions_function`` add to
the agent what ``tools=`` and ``instructions=`` give.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Concatenate, Final, Generic, TypedDict, Unpack, overload

import attrs
from typing_extensions import ParamSpec, TypeVar

from statemachine.agent.context import (
    RunContext,
    check_deps,
    current_run_context,
    note_child_stats,
    usage_left,
)
from statemachine.agent.delegation import (
    DEFAULT_MAX_DEPTH,
    PROMPT_SCHEMA,
    child_output,
    decide_approvals,
    enter_depth,
    leave_depth,
    prompt_message,
)
from statemachine.agent.events import OutputT, RunResult, RunStats
from statemachine.agent.hooks import (
    BeforeToolCall,
    Deny,
)
from statemachine.agent.model import ModelClient, ModelSettings, resolve_model
from statemachine.agent.model_call import Instructions, join_instructions
from statemachine.agent.options import AgentOptions, Options, refuse_unknown, resolve
from statemachine.agent.output import (
    OutputValidator,
    Validated,
    check_output_validators,
    compile_output,
)
from statemachine.agent.resume import resume_run
from statemachine.agent.run import (
    AgentRun,
)
from statemachine.agent.session import (
    Session,
    SessionTurn,
    resume_in_session,
    run_in_session,
    session_history_only,
)
from statemachine.agent.steps import check_steps
from statemachine.agent.stream import StreamedRun
from statemachine.agent.sync import StreamedRunSync, refuse_running_loop, run_sync
from statemachine.agent.tools import Tool
from statemachine.agent.tools import tool as make_tool
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.checks import positive_int
from statemachine.core.limits import UsageLimits
from statemachine.core.messages import Message, UserMessage
from statemachine.core.tools import DEFAULT_TOOL_RETRIES, ToolDefinition, ToolOutput
from statemachine.errors import InvalidInputError

__all__ = ["DEFAULT_MAX_DEPTH", "Agent", "StreamedRun"]

DepsT = TypeVar("DepsT", default=Any)
"""The type of the ``deps`` an agent's runs take (``deps_type``; ``Any`` when unsaid)."""


class _OneRun(TypedDict, Generic[DepsT], total=False):
    """What one run of an agent is given beside its prompt (module docstring)."""

    deps: DepsT
    """Handed to tools, hooks and instructions that take a ``RunContext``."""
    model_settings: ModelSettings | None
    """Settings over the agent's, field by field."""
    signal: AbortSignal | None
    """Aborts the run when it fires."""
    session: Session | None
    """The session the run is read from and stored in (``statemachine.sessions``)."""
    instructions: Instructions | None
    """Instructions for this run only, after the agent's own (a string, or a function
    of the ``RunContext``; ``statemachine.agent.model_call``)."""


class AgentRunKeywords(_OneRun[DepsT], total=False):
    """The keywords of ``Agent.run``, ``run_sync`` and ``run_stream``."""

    message_history: Sequence[Message]
    """The messages before the prompt (not with a ``session``)."""


class AgentResumeKeywords(_OneRun[DepsT], total=False):
    """The keywords of ``Agent.resume`` and ``resume_sync``: ``resume_run``'s
    decisions and checks (``ResumeOptions``), and the run's own."""

    approvals: Mapping[str, bool | Deny] | None
    message: str | UserMessage | None
    key: bytes | str | None
    stats: RunStats | None


_P = ParamSpec("_P")

_KEEP: Final = object()
"""``Agent.override``'s default for ``deps``: keep the run's (``None`` is a deps value)."""


class Agent(Generic[DepsT, OutputT]):
    """What every run of an agent shares; ``run``, ``run_sync``, ``run_stream``,
    ``run_stream_sync``, ``resume``, ``resume_sync``, ``as_tool`` (module docstring).

    ``model`` is a ``ModelClient`` or a model string (``"openai:gpt-4.1"``). The other
    keywords are the options every run of the agent is given (``AgentOptions``), checked
    here as ``run_agent`` checks them (``InvalidInputError`` naming the argument) and
    kept in ``options``; ``deps_type``, when given, is checked against the ``deps`` of
    every run (as a tool's ``RunContext[T]`` is), before any model call. ``table`` is
    the agent's transition table, steps included (what ``statemachine check --agent``
    and ``diagram --agent`` read).
    """

    def __init__(
        self,
        model: ModelClient | str,
        *,
        name: str | None = None,
        deps_type: type[DepsT] | None = None,
        output_validators: Sequence[OutputValidator] = (),
        **options: Unpack[AgentOptions[OutputT]],
    ) -> None:
        self.options = resolve("Agent", options, AgentOptions)
        self.table = check_steps(self.options.steps)
        # Built here only to refuse a bad type or retry count now (the retries are read,
        # as by run_agent, only with an output type); each run builds its own.
        self.model = resolve_model(model)
        opts = self.options
        compile_output(
            opts.output_type, opts.output_retries, opts.output_mode, self.model, opts.end_strategy
        )
        self.name = name
        self.deps_type = deps_type
        self.output_validators = list(check_output_validators(output_validators))
        # What override() replaces, in the current context only.
        self._override: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
            "statemachine_agent_override", default=None
        )

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The agent's tools (``tools=``, then those its decorators added)."""
        return self.options.tools

    @tools.setter
    def tools(self, tools: Sequence[Tool]) -> None:
        self.options = attrs.evolve(self.options, tools=tools)  # checked by the record

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, model={self.model!r}, tools={len(self.tools)})"

    # -- decorators: tools and instructions tied to this agent's deps type -------------------

    @overload
    def tool(
        self, fn: Callable[Concatenate[RunContext[DepsT], _P], Any], /
    ) -> Callable[Concatenate[RunContext[DepsT], _P], Any]: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        retries: int = DEFAULT_TOOL_RETRIES,
        timeout: float | None = None,
    ) -> Callable[
        [Callable[Concatenate[RunContext[DepsT], ...], Any]],
        Callable[Concatenate[RunContext[DepsT], ...], Any],
    ]: ...

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        retries: int = DEFAULT_TOOL_RETRIES,
        timeout: float | None = None,
    ) -> Any:
        """Decorator: make ``fn`` (first parameter a ``RunContext`` of this agent's deps
        type) one of the agent's tools, as ``statemachine.tool`` does; mypy refuses a
        function whose ``RunContext[T]`` is not the agent's. Returns ``fn``."""

        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            self._add_tool(make_tool(name=name, retries=retries, timeout=timeout)(f))
            return f

        return register if fn is None else register(fn)

    def tool_plain(self, fn: Callable[_P, Any], /) -> Callable[_P, Any]:
        """Decorator: make ``fn`` (no ``RunContext``) one of the agent's tools. Returns it."""
        self._add_tool(make_tool(fn))
        return fn

    def _add_tool(self, added: Tool) -> None:
        self.tools = (*self.tools, added)  # a duplicate name is refused here, not at a run

    def instructions_function(
        self, fn: Callable[[RunContext[DepsT]], str]
    ) -> Callable[[RunContext[DepsT]], str]:
        """Decorator: ``fn(ctx)`` gives the agent's instructions at each model call (it
        replaces instructions given before). Returns ``fn``."""
        self.options = attrs.evolve(self.options, instructions=fn)  # checked by the record
        return fn

    def output_validator(self, fn: OutputValidator) -> OutputValidator:
        """Decorator: run ``fn`` on each output the type accepted (``fn(output)`` or
        ``fn(ctx, output)``, sync; it returns the output, or raises ``ModelRetry`` to ask
        the model for another, one of ``output_retries``)."""
        self.output_validators.append(*check_output_validators([fn]))
        return fn

    @contextlib.contextmanager
    def override(
        self, *, model: ModelClient | str | None = None, deps: object = _KEEP
    ) -> Iterator[None]:
        """Inside the block, this agent's runs (``run``, ``run_stream``, ``resume``, and
        as a sub-agent) use ``model`` and ``deps`` instead of their own or the caller's:
        for tests of code that runs an agent it does not build (``TestModel``, a fake
        model). Per context (a context variable): a concurrent test sees its own; blocks
        nest, the innermost wins."""
        current = dict(self._override.get() or {})
        if model is not None:
            current["model"] = resolve_model(model)
        if deps is not _KEEP:
            current["deps"] = deps
        token = self._override.set(current)
        try:
            yield
        finally:
            self._override.reset(token)

    # -- the keywords of one run ------------------------------------------------------------

    def _run_options(
        self, where: str, keywords: Mapping[str, Any], keys: type[Mapping[str, Any]]
    ) -> tuple[ModelClient, Options]:
        """The client and the options of one run of this agent, given the ``keywords``
        of its method ``where`` (``override``'s first)."""
        refuse_unknown(where, keywords, keys)
        model_settings, signal = keywords.get("model_settings"), keywords.get("signal")
        override = self._override.get() or {}
        model = override.get("model", self.model)
        deps = override.get("deps", keywords.get("deps"))
        check_deps(deps, [(f"Agent {self.name or ''}".rstrip(), self.deps_type)])
        o = self.options
        output_type = o.output_type
        if self.output_validators:
            output_type = Validated(output_type, tuple(self.output_validators))
        settings = (o.model_settings or ModelSettings()).merged(model_settings)
        instructions = join_instructions(o.instructions, keywords.get("instructions"))
        return model, attrs.evolve(
            o,
            deps=deps,
            model_settings=settings,
            signal=signal,
            output_type=output_type,
            instructions=instructions,
            unknown_tool_retries=(
                o.output_retries if o.unknown_tool_retries is None else o.unknown_tool_retries
            ),
        )

    # -- run --------------------------------------------------------------------------------

    async def run(
        self,
        prompt: str | UserMessage | None = None,
        **keywords: Unpack[AgentRunKeywords[DepsT]],
    ) -> RunResult[OutputT]:
        """``run_agent`` with this agent's model, tools, instructions, hooks and
        settings, on ``message_history`` followed by ``prompt``; with a ``session``
        (``statemachine.sessions``), on the session's history instead."""
        model, options = self._run_options("run", keywords, AgentRunKeywords)
        message_history, session = keywords.get("message_history", ()), keywords.get("session")
        messages = _messages(prompt, message_history)

        async def run(history: Sequence[Message]) -> RunResult[OutputT]:
            return await AgentRun(model=model, messages=history, options=options).run()

        if session is not None:
            session_history_only(message_history)
            return await run_in_session(session, messages, run)
        return attrs.evolve(await run(messages), given=len(message_history))

    def run_sync(
        self,
        prompt: str | UserMessage | None = None,
        **keywords: Unpack[AgentRunKeywords[DepsT]],
    ) -> RunResult[OutputT]:
        """``run`` for code without an event loop (as ``run_agent_sync``)."""
        refuse_running_loop("run_sync")
        return run_sync(self.run(prompt, **keywords), self.options.grace_period)

    @contextlib.asynccontextmanager
    async def run_stream(
        self,
        prompt: str | UserMessage | None = None,
        **keywords: Unpack[AgentRunKeywords[DepsT]],
    ) -> AsyncIterator[StreamedRun[OutputT]]:
        """``async with agent.run_stream(prompt) as run:`` iterate ``run`` for every
        ``RunEvent``, or ``run.stream_text()`` for the answer's text as it arrives;
        ``await run.result()`` for the ``RunResult``. Leaving the block early aborts
        the run (and waits for it to close). With a ``session``, the run's new messages
        are stored when the block ends."""
        model, options = self._run_options("run_stream", keywords, AgentRunKeywords)
        message_history, session = keywords.get("message_history", ()), keywords.get("session")
        messages, given = _messages(prompt, message_history), len(message_history)
        turn = None
        if session is not None:
            session_history_only(message_history)
            turn = await SessionTurn.open(session, messages)
            messages, given = turn.messages, turn.given
        try:
            run = AgentRun[OutputT](model=model, messages=messages, options=options)
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

    def run_stream_sync(
        self,
        prompt: str | UserMessage | None = None,
        **keywords: Unpack[AgentRunKeywords[DepsT]],
    ) -> StreamedRunSync[RunResult[OutputT]]:
        """``run_stream`` for code without an event loop: its ``stream_text()`` and
        ``result()`` (``StreamedRunSync``, in ``statemachine.agent.sync``); the same
        keywords (a ``signal`` given aborts the run as ``abort()`` does)."""
        refuse_running_loop("run_stream_sync")
        refuse_unknown("run_stream_sync", keywords, AgentRunKeywords)

        async def stream(signal: AbortSignal, put: Callable[[str], None]) -> RunResult[OutputT]:
            given = keywords.get("signal")
            if given is not None:  # the caller's signal, beside the handle's abort()
                either = AbortController()
                signal.add_listener(either.abort)
                given.add_listener(either.abort)
                signal = either.signal
            own: AgentRunKeywords[DepsT] = {**keywords, "signal": signal}
            async with self.run_stream(prompt, **own) as run:
                async for text in run.stream_text():
                    put(text)
                return await run.result()

        return StreamedRunSync(stream, self.options.grace_period)

    # -- resume -----------------------------------------------------------------------------

    async def resume(
        self,
        state: RunResult | Mapping[str, Any],
        **keywords: Unpack[AgentResumeKeywords[DepsT]],
    ) -> RunResult[OutputT]:
        """``resume_agent`` with this agent's model, tools, instructions, hooks, output
        type and usage limits (so the resumed run's output is typed again); with the
        ``session`` the run was suspended on, its turn is stored there once it ends."""
        model, options = self._run_options("resume", keywords, AgentResumeKeywords)
        session = keywords.get("session")

        async def resumed() -> RunResult[OutputT]:
            run = resume_run(
                state,
                model=model,
                options=options,
                approvals=keywords.get("approvals"),
                message=keywords.get("message"),
                key=keywords.get("key"),
                stats=keywords.get("stats"),
            )
            return await run.run()

        if session is None:
            return await resumed()
        return await resume_in_session(session, state, resumed)

    def resume_sync(
        self,
        state: RunResult | Mapping[str, Any],
        **keywords: Unpack[AgentResumeKeywords[DepsT]],
    ) -> RunResult[OutputT]:
        """``resume`` for code without an event loop."""
        refuse_running_loop("resume_sync")
        return run_sync(self.resume(state, **keywords), self.options.grace_period)

    # -- as a tool of another agent ---------------------------------------------------------

    def as_tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        deps: Callable[[object], object] | None = None,
        timeout: float | None = None,
        approve: BeforeToolCall | None = None,
        join_usage: bool = True,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> Tool:
        """This agent as a tool taking one ``prompt`` (module docstring): its result is
        the child's final text, or its output as JSON when the agent has an
        ``output_type``. ``deps`` turns the parent's deps into the child's (default:
        the same object). ``approve`` decides the calls the child stops to have
        approved (module docstring).

        ``join_usage`` (default): the child's usage and model calls join the parent's
        (``RunResult.usage``) and count against its ``usage_limits``; the child runs
        within what they leave (the tighter of its own limits and the parent's
        remainder), and is not run once they are reached. ``False`` keeps them apart
        (its stats still join the parent's ``stats``).

        ``max_depth`` bounds how deeply agents run as tools nest, counting this one (an
        agent that is its own sub-agent, or a chain of them): past it the child is not
        run and the call's error result names ``DelegationDepthError``."""
        tool_name = name or self.name
        if not tool_name:
            raise InvalidInputError("as_tool needs a name (or an Agent with one)")
        positive_int("max_depth", max_depth)
        if not isinstance(join_usage, bool):
            raise InvalidInputError("join_usage must be a bool")
        definition = ToolDefinition(
            name=tool_name,
            description=description or f"Ask the {tool_name} agent.",
            parameters=PROMPT_SCHEMA,
        )

        async def execute(arguments: dict[str, Any], signal: AbortSignal) -> ToolOutput:
            return await self._as_tool_call(
                arguments["prompt"], tool_name, deps, approve, join_usage, max_depth, signal
            )

        return Tool(definition, execute, timeout=timeout)

    async def _as_tool_call(
        self,
        prompt: str,
        tool_name: str,
        deps: Callable[[object], object] | None,
        approve: BeforeToolCall | None,
        join_usage: bool,
        max_depth: int,
        signal: AbortSignal,
    ) -> ToolOutput:
        """One call of ``as_tool``'s tool: the child's run, as its result."""
        token = enter_depth(tool_name, max_depth)
        parent = current_run_context()
        parent_deps = parent.deps if parent is not None else None
        child_deps: Any = deps(parent_deps) if deps is not None else parent_deps
        limits = self.options.usage_limits
        if join_usage:
            allowed, left = usage_left()
            if not allowed:
                return ToolOutput(
                    f"the {tool_name} agent was not run: the run's usage limits are reached",
                    is_error=True,
                )
            limits = left if limits is None else limits.tightest(left)
        try:
            result = await self._run_child(prompt, child_deps, signal, limits)
            result = await decide_approvals(self, result, tool_name, approve, child_deps, signal)
        finally:
            leave_depth(token)
        if result.stats is not None:
            note_child_stats(result.stats)
        output = child_output(tool_name, result, self.options.output_type is not None)
        if not join_usage:
            return output
        requests = result.stats.model_calls if result.stats is not None else result.turns
        return attrs.evolve(output, usage=result.usage, requests=requests)

    async def _run_child(
        self,
        prompt: str,
        deps: object,
        signal: AbortSignal,
        usage_limits: UsageLimits | None,
    ) -> RunResult[OutputT]:
        """``run`` as a sub-agent, held to ``usage_limits`` (the parent's remainder)."""
        model, options = self._run_options(
            "run", {"deps": deps, "signal": signal}, AgentRunKeywords
        )
        options = attrs.evolve(options, usage_limits=usage_limits)
        run = AgentRun[OutputT](model=model, messages=_messages(prompt, ()), options=options)
        return attrs.evolve(await run.run(), given=0)


def _messages(
    prompt: str | UserMessage | None, message_history: Sequence[Message]
) -> list[Message]:
    """The messages one run is given: ``message_history``, then ``prompt``."""
    if isinstance(message_history, (str, bytes)) or not isinstance(message_history, Sequence):
        raise InvalidInputError("message_history must be a sequence of messages")
    messages = list(message_history)
    if prompt is not None:
        messages.append(prompt_message(prompt, "prompt"))
    return messages
