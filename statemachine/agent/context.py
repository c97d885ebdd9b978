"""The run's context, handed to tools, hooks and instruction functions that ask for it.

A tool function whose first parameter is annotated ``RunContext[MyDeps]`` (or bare
``RunContext``) receives the context of the run calling it; that parameter is not
part of the tool's JSON Schema. Hooks and instruction functions receive it the same
way (a first parameter annotated ``RunContext``). ``deps`` is the object given to the
run (``run_agent(deps=...)``, ``Agent.run(deps=...)``); when a tool declares its type
(``RunContext[MyDeps]``), a run whose ``deps`` is not a ``MyDeps`` is refused with a
``UsageError`` before any model call.

The context is the run's while the run runs: the driver sets it (a context variable)
for every task it starts, so a tool's worker thread sees it too.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import typing
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attrs

from statemachine.core.limits import UsageLimits
from statemachine.core.messages import Usage
from statemachine.core.tools import ToolOutput

if TYPE_CHECKING:
    from statemachine.core.engine import Engine
from statemachine.core.messages import Message, ToolCall
from statemachine.errors import InvalidInputError, UsageError

__all__ = [
    "RunContext",
    "RunSource",
    "Spent",
    "check_deps",
    "check_run_deps",
    "context_type",
    "current_run_context",
    "deps_type_of",
    "engine_context",
    "note_child_stats",
    "output_context",
    "reset_run_context",
    "run_context",
    "start_spending",
    "stop_spending",
    "usage_left",
    "wants_context",
]

DepsT = TypeVar("DepsT")


@attrs.frozen
class RunContext(Generic[DepsT]):
    """What a tool, hook or instruction function learns of the run calling it.

    ``deps``: the run's dependencies; ``run_id``; ``turn``: the number of the turn
    under way (1 for the first; the turns started so far);
    ``messages``: the history as it is now; ``tool_call``: the call being executed
    (``None`` outside a tool); ``retry``: in a tool, how many retry requests in a row
    (``ModelRetry``) it made before this call (0 on a first attempt); ``max_retries``:
    the tool's budget of them (``Tool(retries=...)``), so ``last_attempt`` is true when
    one more retry request would end the run ``ToolRetriesExceeded``. ``tool_name``:
    the tool being executed, or in an output validator the final-result tool that
    carried the output (``None`` for a text output); there ``retry`` counts the run's
    failed attempts at the final result so far and ``max_retries`` is
    ``output_retries``, as PydanticAI's output validators read them.

    ``usage`` and ``requests``: what the run has spent so far, as its usage limits
    count it (tokens; model calls, sub-agents' included). A tool that spends on the
    run's behalf (it calls a model itself) says so with ``add_usage``, as PydanticAI's
    ``ctx.usage.incr``: what it adds joins the run's usage with the call's result
    (``ToolOutput.usage``, ``requests``), so it is in ``RunResult.usage``, in the
    snapshot and the journal, and counts against ``UsageLimits`` before the next model
    call.
    """

    deps: DepsT
    run_id: str
    turn: int
    messages: Sequence[Message] = attrs.field(repr=False)
    tool_call: ToolCall | None = None
    retry: int = 0
    max_retries: int = 0
    tool_name: str | None = None
    # The run's usage when the context was made; the property adds the call's own.
    _usage: Usage = attrs.field(factory=Usage, alias="usage", repr=False)
    _requests: int = attrs.field(default=0, alias="requests", repr=False)
    # What the tool call under way spent (add_usage); None outside one.
    _spent: Spent | None = attrs.field(default=None, alias="spent", repr=False, eq=False)

    @property
    def usage(self) -> Usage:
        """The run's token usage so far (what ``RunResult.usage`` would say now), with
        what this tool call added."""
        added = None if self._spent is None else self._spent.usage
        return self._usage if added is None else self._usage + added

    @property
    def requests(self) -> int:
        """The run's model calls so far (``UsageLimits.requests`` counts them), with
        those this tool call added."""
        return self._requests + (0 if self._spent is None else self._spent.requests)

    def add_usage(self, usage: Usage | None = None, *, requests: int = 0) -> None:
        """Count ``usage`` (tokens) and ``requests`` (model calls) that this tool call
        spent on the run's behalf: they join the run's with the call's result. Only in a
        tool's call (``UsageError`` elsewhere)."""
        if self._spent is None:
            raise UsageError("add_usage is for a tool's call: it joins the call's result")
        if usage is not None and not isinstance(usage, Usage):
            raise InvalidInputError(f"usage must be a Usage, got {type(usage).__name__}")
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
            raise InvalidInputError(f"requests must be an integer >= 0, got {requests!r:.40}")
        self._spent.add(usage, requests)

    @property
    def last_attempt(self) -> bool:
        """In a tool (or an output tool's validator): whether a retry request now would
        end the run (``retry`` has reached ``max_retries``), so the tool can answer with
        what it has instead."""
        return self.tool_name is not None and self.retry >= self.max_retries


# One lock for every call's ``Spent``, not one made per call: most calls add nothing,
# and a call that adds holds it for two additions.
_SPENDING_LOCK = threading.Lock()


class Spent:
    """What one tool call spent on the run's behalf (``RunContext.add_usage``), shared by
    every context made in the call (its threads and tasks too). A plain class: one is
    made for every tool call, and most calls add nothing."""

    __slots__ = ("requests", "usage")

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.requests = 0

    def add(self, usage: Usage | None, requests: int) -> None:
        with _SPENDING_LOCK:  # a sync tool adds from its worker thread
            if usage is not None:
                self.usage = usage if self.usage is None else self.usage + usage
            self.requests += requests

    def joined(self, output: ToolOutput) -> ToolOutput:
        """``output`` carrying what was spent too (unchanged when nothing was)."""
        with _SPENDING_LOCK:
            usage, requests = self.usage, self.requests
        if usage is None and not requests:
            return output
        if usage is None:
            usage = output.usage
        elif output.usage is not None:
            usage = output.usage + usage
        return attrs.evolve(output, usage=usage, requests=output.requests + requests)


_spending: contextvars.ContextVar[Spent | None] = contextvars.ContextVar(
    "statemachine_tool_spending", default=None
)
"""What the tool call whose task is running spent (set by the executor for each call)."""


def start_spending() -> tuple[Spent, contextvars.Token[Spent | None]]:
    """A new ``Spent`` for the tool call about to run in this context (the executor's),
    and the token that ``stop_spending`` takes."""
    spent = Spent()
    return spent, _spending.set(spent)


def stop_spending(token: contextvars.Token[Spent | None]) -> None:
    """Undo ``start_spending`` (the call is over)."""
    try:
        _spending.reset(token)
    except ValueError:
        pass  # an abandoned call closed later, from another context


class RunSource(Protocol):
    """The run whose task is running, as this module sees it (``AgentRun`` is one)."""

    def context(self) -> RunContext[Any]:
        """The run's context as it is now."""

    def _add_child_stats(self, stats: Any) -> None:
        """Count a sub-agent's ``RunStats`` in the run's."""

    @property
    def engine(self) -> Engine:
        """The run's engine (what its usage limits read)."""


_context: contextvars.ContextVar[RunSource | None] = contextvars.ContextVar(
    "statemachine_run_context", default=None
)
"""The run whose task is running: what builds its context, and what counts the stats
of a sub-agent it runs."""


def run_context(source: RunSource) -> contextvars.Token[Any]:
    """Make ``source`` the run of ``current_run_context()`` in this context (and of
    ``note_child_stats``)."""
    return _context.set(source)


def note_child_stats(stats: object) -> bool:
    """Add a sub-agent's ``RunStats`` to the run calling this code; False outside one."""
    source = _context.get()
    if source is None:
        return False
    source._add_child_stats(stats)
    return True


def usage_left() -> tuple[bool, UsageLimits | None]:
    """Whether the usage limits of the run calling this code still allow a model call,
    and what they leave (``None``: no limits, or outside a run)."""
    source = _context.get()
    limits = None if source is None else source.engine.usage_limits
    if source is None or limits is None:
        return True, None
    engine = source.engine
    left = limits.remaining(engine.usage, engine.requests, engine.tool_calls)
    return left is not None, left


def engine_context(engine: Engine, deps: object, call: ToolCall | None) -> RunContext[Any]:
    """The context of the run of ``engine`` as it is now, in ``call`` (or outside one)."""
    run = (deps, engine.run_id, engine.turns, engine.messages)
    usage, requests = engine.usage, engine.requests
    if call is None:
        return RunContext(*run, usage=usage, requests=requests)
    retry, budget = engine.tool_failures(call.name), engine.retry_budget(call.name)
    spent = _spending.get()
    return RunContext(
        *run, call, retry, budget, call.name, usage=usage, requests=requests, spent=spent
    )


def output_context(tool: str | None) -> RunContext[Any] | None:
    """The context an output validator is given (``None`` outside a run): the run's,
    with the final result's attempt (``retry``: the failed attempts so far), its budget
    (``max_retries``: ``output_retries``) and ``tool``, the tool that carried it."""
    source = _context.get()
    if source is None:
        return None
    engine = source.engine
    budget = engine.output.retries if engine.output is not None else 0
    retry = engine.output_failures
    return attrs.evolve(source.context(), retry=retry, max_retries=budget, tool_name=tool)


def check_run_deps(deps: object, tools: Sequence[Any], instructions: object) -> None:
    """``check_deps`` for the deps types a run's tools and instructions function name
    (instructions are asked at every model call: refused before the first, not
    mid-run)."""
    declared = [(f"tool {t.name}", t.deps_type) for t in tools]
    # The agent's and one run's instructions (model_call.JoinedInstructions): each part.
    for part in getattr(instructions, "parts", (instructions,)):
        if callable(part):
            declared.append(("the instructions function", deps_type_of(part)))
    check_deps(deps, declared)


def reset_run_context(token: contextvars.Token[Any]) -> None:
    """Undo ``run_context`` (the run has returned)."""
    _context.reset(token)


def current_run_context(call: ToolCall | None = None) -> RunContext[Any] | None:
    """The context of the run calling this code (``None`` outside a run)."""
    source = _context.get()
    if source is None:
        return None
    context = source.context()
    return context if call is None else attrs.evolve(context, tool_call=call, tool_name=call.name)


def context_type(annotation: Any) -> tuple[bool, Any]:
    """Whether ``annotation`` is ``RunContext`` (bare or subscripted), and the deps
    type it names (``None`` when it names none, or ``Any``)."""
    if annotation is RunContext:
        return True, None
    if typing.get_origin(annotation) is RunContext:
        (deps,) = typing.get_args(annotation)
        return True, None if deps is Any else deps
    return False, None


def _first_parameter(fn: Callable[..., Any]) -> inspect.Parameter | None:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    return parameters[0] if parameters else None


def _annotation(fn: Callable[..., Any], parameter: inspect.Parameter) -> Any:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unreadable hints: no context asked for
        return parameter.annotation
    return hints.get(parameter.name, parameter.annotation)


def wants_context(fn: Callable[..., Any]) -> bool:
    """True if ``fn``'s first parameter is annotated ``RunContext`` (remembered for the
    hooks a run asks again and again)."""
    try:
        return _wants_context(fn)
    except TypeError:  # an unhashable callable: read it each time
        return _wants_context.__wrapped__(fn)


@functools.lru_cache(maxsize=256)
def _wants_context(fn: Callable[..., Any]) -> bool:
    first = _first_parameter(fn)
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    return first is not None and context_type(_annotation(target, first))[0]


def deps_type_of(fn: Callable[..., Any]) -> Any:
    """The deps type ``fn``'s first parameter names (``RunContext[T]``), or ``None``."""
    first = _first_parameter(fn)
    if first is None:
        return None
    return context_type(_annotation(fn, first))[1]


def check_deps(deps: object, declared: Sequence[tuple[str, Any]]) -> None:
    """Refuse ``deps`` that is not of a type a tool declares (``(tool, type)`` pairs)."""
    for where, expected in declared:
        if expected is None:
            continue
        check = typing.get_origin(expected) or expected
        if isinstance(check, type) and not isinstance(deps, check):
            raise UsageError(
                f"deps: {where} takes {_context_name(expected)}, "
                f"but deps is a {type(deps).__name__}"
            )


def _context_name(expected: Any) -> str:
    return f"RunContext[{getattr(expected, '__name__', expected)}]"
