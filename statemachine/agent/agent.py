"""``Agent``: a model, tools, instructions, hooks and settings, kept for many runs.

An ``Agent`` holds what every run of it repeats; each method builds the keyword
arguments of the functional form and calls it, so ``Agent.run`` *is* ``run_agent``
(``run_stream`` builds the same ``AgentRun`` that ``run_agent`` runs, and ``resume``
calls ``resume_agent``): one code path, one set of checks, one result type.

Per run: a prompt (a string or a ``UserMessage``) after an optional
``message_history``, ``deps`` (handed to tools, hooks and instructions that take a
``RunContext``), ``model_settings`` (field by field over the agent's), a ``signal``.

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
from typing import Any, Concatenate, Final, Generic, overload

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
    AfterToolCall,
    BeforeToolCall,
    Deny,
    ShouldContinue,
    TransformContext,
)
from statemachine.agent.model import ModelClient, ModelSettings, resolve_model
from statemachine.agent.model_call import Instructions, check_instructions
from statemachine.agent.output import (
    OutputMode,
    OutputType,
    OutputValidator,
    Validated,
    check_output_validators,
    compile_output,
)
from statemachine.agent.resume import resume_agent
from statemachine.agent.run import (
    DEFAULT_GRACE_PERIOD,
    AgentRun,
    check_tools,
    run_agent,
)
from statemachine.agent.session import (
    Session,
    SessionTurn,
    resume_in_session,
    run_in_session,
    session_history_only,
)
from statemachine.agent.steps import Step, check_steps
from statemachine.agent.stream import StreamedRun
from statemachine.agent.sync import StreamedRunSync, refuse_running_loop, run_sync
from statemachine.agent.tools import Tool
from statemachine.agent.tools import tool as make_tool
from statemachine.core.abort import AbortSignal
from statemachine.core.checks import positive_int
from statemachine.core.limits import UsageLimits, check_usage_limits
from statemachine.core.messages import Message, UserMessage
from statemachine.core.output import DEFAULT_OUTPUT_RETRIES
from statemachine.core.tools import DEFAULT_TOOL_RETRIES, ToolDefinition, ToolOutput
from statemachine.errors import InvalidInputError

__all__ = ["DEFAULT_MAX_DEPTH", "Agent", "StreamedRun"]

DepsT = TypeVar("DepsT", default=Any)
"""The type of the ``deps`` an agent's runs take (``deps_type``; ``Any`` when unsaid)."""

_P = ParamSpec("_P")

_KEEP: Final = object()
"""``Agent.override``'s default for ``deps``: keep the run's (``None`` is a deps value)."""


class Agent(Generic[DepsT, OutputT]):
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
        tools: Sequence[Tool] = (),
        instructions: Instructions | None = None,
        model_settings: ModelSettings | None = None,
        max_turns: int = 8,
        before_tool_call: BeforeToolCall | None = None,
        after_tool_call: AfterToolCall | None = None,
        should_continue: ShouldContinue | None = None,
        transform_context: TransformContext | None = None,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        logger: Any = None,
        deps_type: type[DepsT] | None = None,
        output_type: OutputType[OutputT] = None,
        output_retries: int = DEFAULT_OUTPUT_RETRIES,
        output_mode: OutputMode = "auto",
        usage_limits: UsageLimits | None = None,
        steps: Sequence[Step] = (),
        output_validators: Sequence[OutputValidator] = (),
    ) -> None:
        check_tools(tools)
        self.table = check_steps(steps)  # refused now, before any run
        self.steps = tuple(steps)
        check_instructions(instructions)
        check_usage_limits(usage_limits)
        # Built here only to refuse a bad type or retry count now (the retries are read,
        # as by run_agent, only with an output type); each run builds its own.
        self.model = resolve_model(model)
        compile_output(output_type, output_retries, output_mode, self.model)
        if model_settings is not None and not isinstance(model_settings, ModelSettings):
            raise InvalidInputError("model_settings must be a ModelSettings")
        self.name = name
        self.tools = tuple(tools)
        self.instructions = instructions
        self.model_settings = model_settings or ModelSettings()
        self.max_turns = max_turns
        self.hooks: dict[str, Any] = {
            "before_tool_call": before_tool_call,
            "after_tool_call": after_tool_call,
            "should_continue": should_continue,
            "transform_context": transform_context,
        }
        self.grace_period = grace_period
        self.logger = logger
        self.deps_type = deps_type
        self.output_type = output_type
        self.output_validators = list(check_output_validators(output_validators))
        self.output_retries = output_retries
        self.output_mode = output_mode
        self.usage_limits = usage_limits
        # What override() replaces, in the current context only.
        self._override: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
            "statemachine_agent_override", default=None
        )

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
        tools = (*self.tools, added)
        check_tools(tools)  # a duplicate name is refused here, not at the first run
        self.tools = tools

    def instructions_function(
        self, fn: Callable[[RunContext[DepsT]], str]
    ) -> Callable[[RunContext[DepsT]], str]:
        """Decorator: ``fn(ctx)`` gives the agent's instructions at each model call (it
        replaces instructions given before). Returns ``fn``."""
        check_instructions(fn)
        self.instructions = fn
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

    def _shared(self, deps: object, model_settings: ModelSettings | None) -> dict[str, Any]:
        override = self._override.get()
        model = self.model if override is None else override.get("model", self.model)
        if override is not None and "deps" in override:
            deps = override["deps"]
        check_deps(deps, [(f"Agent {self.name or ''}".rstrip(), self.deps_type)])
        return {
            "model": model,
            "tools": self.tools,
            "instructions": self.instructions,
            "model_settings": self.model_settings.merged(model_settings),
            "deps": deps,
            "grace_period": self.grace_period,
            "logger": self.logger,
            **self.hooks,
            "output_type": Validated(self.output_type, tuple(self.output_validators))
            if self.output_validators
            else self.output_type,
            "output_retries": self.output_retries,
            "usage_limits": self.usage_limits,
        }

    def _run_options(
        self,
        prompt: str | UserMessage | None,
        message_history: Sequence[Message],
        deps: object,
        model_settings: ModelSettings | None,
        signal: AbortSignal | None,
    ) -> tuple[dict[str, Any], int]:
        """``run_agent``'s keywords for one run, and how many messages it is given."""
        if isinstance(message_history, (str, bytes)) or not isinstance(message_history, Sequence):
            raise InvalidInputError("message_history must be a sequence of messages")
        messages = list(message_history)
        if prompt is not None:
            messages.append(prompt_message(prompt, "prompt"))
        options = self._shared(deps, model_settings)
        options.update(
            messages=messages, max_turns=self.max_turns, signal=signal, output_mode=self.output_mode
        )
        if self.steps:
            options["steps"] = self.steps
        return options, len(message_history)

    # -- run --------------------------------------------------------------------------------

    async def run(
        self,
        prompt: str | UserMessage | None = None,
        *,
        message_history: Sequence[Message] = (),
        deps: DepsT = None,  # type: ignore[assignment] # refused at run time if typed
        model_settings: ModelSettings | None = None,
        signal: AbortSignal | None = None,
        session: Session | None = None,
    ) -> RunResult[OutputT]:
        """``run_agent`` with this agent's model, tools, instructions, hooks and
        settings, on ``message_history`` followed by ``prompt``; with a ``session``
        (``statemachine.sessions``), on the session's history instead."""
        options, given = self._run_options(prompt, message_history, deps, model_settings, signal)
        if session is not None:
            session_history_only(message_history)
            return await run_in_session(
                session,
                options["messages"],
                lambda history: run_agent(**options | {"messages": history}),
            )
        return attrs.evolve(await run_agent(**options), given=given)

    def run_sync(
        self,
        prompt: str | UserMessage | None = None,
        *,
        message_history: Sequence[Message] = (),
        deps: DepsT = None,  # type: ignore[assignment] # refused at run time if typed
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
        return run_sync(run, self.grace_period)

    @contextlib.asynccontextmanager
    async def run_stream(
        self,
        prompt: str | UserMessage | None = None,
        *,
        message_history: Sequence[Message] = (),
        deps: DepsT = None,  # type: ignore[assignment] # refused at run time if typed
        model_settings: ModelSettings | None = None,
        signal: AbortSignal | None = None,
        session: Session | None = None,
    ) -> AsyncIterator[StreamedRun[OutputT]]:
        """``async with agent.run_stream(prompt) as run:`` iterate ``run`` for every
        ``RunEvent``, or ``run.stream_text()`` for the answer's text as it arrives;
        ``await run.result()`` for the ``RunResult``. Leaving the block early aborts
        the run (and waits for it to close). With a ``session``, the run's new messages
        are stored when the block ends."""
        options, given = self._run_options(prompt, message_history, deps, model_settings, signal)
        turn = None
        if session is not None:
            session_history_only(message_history)
            turn = await SessionTurn.open(session, options["messages"])
            options["messages"], given = turn.messages, turn.given
        try:
            streamed: StreamedRun[OutputT] = StreamedRun(AgentRun(**options), given, turn)
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
        *,
        message_history: Sequence[Message] = (),
        deps: DepsT = None,  # type: ignore[assignment] # refused at run time if typed
        model_settings: ModelSettings | None = None,
    ) -> StreamedRunSync[RunResult[OutputT]]:
        """``run_stream`` for code without an event loop: its ``stream_text()`` and
        ``result()`` (``StreamedRunSync``, in ``statemachine.agent.sync``)."""
        refuse_running_loop("run_stream_sync")

        async def stream(signal: AbortSignal, put: Callable[[str], None]) -> RunResult[OutputT]:
            async with self.run_stream(
                prompt,
                message_history=message_history,
                deps=deps,
                model_settings=model_settings,
                signal=signal,
            ) as run:
                async for text in run.stream_text():
                    put(text)
                return await run.result()

        return StreamedRunSync(stream, self.grace_period)

    # -- resume -----------------------------------------------------------------------------

    async def resume(
        self,
        state: RunResult | Mapping[str, Any],
        *,
        approvals: Mapping[str, bool | Deny] | None = None,
        message: str | UserMessage | None = None,
        deps: DepsT = None,  # type: ignore[assignment] # refused at run time if typed
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
        options = self._shared(deps, model_settings)
        if self.steps:
            options["steps"] = self.steps
        return await resume_agent(
            state,
            approvals=approvals,
            message=message,
            signal=signal,
            key=key,
            stats=stats,
            **options,
        )

    def resume_sync(
        self,
        state: RunResult | Mapping[str, Any],
        *,
        approvals: Mapping[str, bool | Deny] | None = None,
        message: str | UserMessage | None = None,
        deps: DepsT = None,  # type: ignore[assignment] # refused at run time if typed
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
        return run_sync(run, self.grace_period)

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
        limits = self.usage_limits
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
        output = child_output(tool_name, result, self.output_type is not None)
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
        options, given = self._run_options(prompt, (), deps, None, signal)
        options["usage_limits"] = usage_limits
        return attrs.evolve(await run_agent(**options), given=given)
