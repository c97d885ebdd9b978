"""A run's options, defined once: the keywords callers write (``HookOptions``,
``AgentOptions``, ``RunOptions``, ``NewRunOptions``, ``ResumeOptions``) and the
record they become (``Options``).

Why two forms. A caller writes keywords: ``run_agent(model=..., messages=...,
tools=[...], max_turns=8)``, ``Agent(model, instructions=...)``. Those keywords
are declared here once, as ``TypedDict``s, and every entry point takes them as
``**options: Unpack[RunOptions[OutputT]]``: mypy and IDEs still check each
keyword's name and type at the call (``tests/test_run_options.py``), and the
reference shows each option once, with its doc, instead of once per function.
Inside the driver a dict of keywords is the wrong thing to hand down (nothing says
which are set, a misspelt key would travel silently, every reader would repeat the
defaults), so
the keywords are resolved, once per entry point, into ``Options``: a frozen attrs
record holding every option with its default (written only there), each value
checked as it enters (``InvalidInputError`` naming the argument) and a misspelt
keyword refused (``TypeError`` naming the function, as Python would). ``AgentRun``
and resume then read fields of that record; ``Agent`` keeps one (``agent.options``)
and hands it on with the run's own ``deps``, ``model_settings`` and ``signal`` in
place (``AgentRun(options=...)``, ``resume_run(options=...)``, as the live server
does too); a keyword given beside a record replaces that one field. The durable
runners take their runs' options as names in their registry (``DurableRunOptions``
in ``statemachine.durable``, declared once too); a worker turns the names into
objects for its ``AgentRun`` subclass, which resolves them into this record.

Why attrs and not the dict itself, once checked: a frozen record is shared (a run
given no options holds ``DEFAULTS``, the same object as every such run), its fields
are attributes mypy knows (``options.max_turns``, not ``options.get(...)`` with a
default repeated at each reader), and ``attrs.evolve`` is how a field is replaced.

Why ``TypedDict`` and not a public options class that callers build: the keyword
form is how the library is written against, and must stay typed. A class beside it
would be a second way to say the same thing.

The dicts nest, each adding what its callers alone take: ``HookOptions`` (the hooks a
durable runner holds for every run of its worker: code, which a run's JSON input
cannot carry), ``AgentOptions`` (what an ``Agent`` holds for all its runs),
``RunOptions`` (plus one run's ``deps`` and ``signal``: what resuming takes too),
``NewRunOptions`` (plus ``run_id`` and ``engine_factory``, meaningful only for a run
that starts from its first message: ``run_agent``, ``AgentRun``; and ``session``,
which ``run_agent`` reads before the run is built), ``ResumeOptions`` (plus what
continuing a suspended run needs: ``resume_agent``). Checks that need the model
client (an output mode or model settings the client cannot honour) are
``AgentRun``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypedDict

import attrs

from statemachine.agent.events import OutputT, RunStats
from statemachine.agent.hooks import (
    AfterToolCall,
    BeforeToolCall,
    Deny,
    ShouldContinue,
    TransformContext,
)
from statemachine.agent.model import ModelSettings
from statemachine.agent.model_call import Instructions, check_instructions
from statemachine.agent.output import OutputMode, OutputType
from statemachine.agent.session import Session, check_session
from statemachine.agent.steps import Step, check_steps
from statemachine.agent.sync import DEFAULT_GRACE_PERIOD
from statemachine.agent.tools import Tool, check_tools
from statemachine.core.abort import AbortSignal
from statemachine.core.checks import positive_int
from statemachine.core.engine import Engine
from statemachine.core.limits import UsageLimits, check_usage_limits
from statemachine.core.messages import UserMessage
from statemachine.core.output import DEFAULT_OUTPUT_RETRIES, EndStrategy, check_end_strategy
from statemachine.core.tools import check_retry_budget
from statemachine.errors import InvalidInputError

__all__ = [
    "DEFAULT_MAX_TURNS",
    "AgentOptions",
    "HookOptions",
    "NewRunOptions",
    "Options",
    "ResumeOptions",
    "RunOptions",
    "refuse_unknown",
    "resolve",
]

DEFAULT_MAX_TURNS = 8
"""Model responses a run may take when ``max_turns`` is not given."""


class HookOptions(TypedDict, total=False):
    """The hooks of a run that a durable runner holds for every run of its worker
    (``DBOSRunner``, ``TemporalRunner``); every key optional."""

    before_tool_call: BeforeToolCall | None
    """Asked before each tool call: allow, ``Deny`` or ``RequireApproval``
    (``statemachine.hooks``)."""
    after_tool_call: AfterToolCall | None
    """Given each tool result; may replace it."""
    should_continue: ShouldContinue | None
    """Asked when the model would finish: whether the run goes on."""


class AgentOptions(HookOptions, Generic[OutputT], total=False):
    """The options of a run that an ``Agent`` holds for all its runs (every key
    optional): the hooks of ``HookOptions``, and these."""

    tools: Sequence[Tool]
    """The tools the model may call; their names are unique."""
    instructions: Instructions | None
    """The system instructions: a string, or a function of the ``RunContext`` called at
    each model call (``statemachine.agent.model_call``); reach clients that take
    ``options``."""
    model_settings: ModelSettings | None
    """Sampling settings sent with each model call (``ModelSettings``)."""
    max_turns: int
    """Model responses the run may take (default 8); the run ends ``MaxTurnsExceeded``
    past them. On resume, a new limit for the rest of the run."""
    usage_limits: UsageLimits | None
    """Requests and tokens the run may spend, checked before each further model call
    (a run that reached one ends ``UsageLimitExceeded``)."""
    output_type: OutputType[OutputT]
    """The type of the run's structured answer (``RunResult.output``): a dataclass, an
    attrs class, a ``TypedDict``, a pydantic model, several types (a list or a union),
    or a JSON Schema (``statemachine.agent.output``)."""
    output_retries: int
    """Invalid answers to ``output_type`` the model is asked to correct (default 1)."""
    output_mode: OutputMode
    """How the answer is asked for: ``"tool"``, ``"native"`` (the provider's structured
    output) or ``"auto"`` (native where the client supports it)."""
    unknown_tool_retries: int | None
    """Calls of one tool name the run does not offer that the model may make before
    the run ends ``ToolRetriesExceeded`` (rule 14). ``None``, the default of
    ``run_agent``: not counted, each answered with an error result and bounded by
    ``max_turns``. An ``Agent`` counts them against its ``output_retries`` unless
    given, as PydanticAI does."""
    end_strategy: EndStrategy
    """What becomes of the other tool calls of a response whose final result is valid:
    ``"early"`` (the default, as PydanticAI's) answers them as not run and ends the
    run; ``"exhaustive"`` runs them first. A resumed run keeps its own."""
    transform_context: TransformContext | None
    """Turns the history into what the model is sent, at each model call."""
    grace_period: float
    """Seconds an aborted operation is given to clean up before it is cancelled
    (default 1.0)."""
    logger: Any
    """A ``logging.Logger`` (or adapter) for the run's log records; ``None``: the
    library's."""
    steps: Sequence[Step]
    """Declared steps, each a state of the run's table (``statemachine.steps``)."""


class RunOptions(AgentOptions[OutputT], total=False):
    """``AgentOptions`` plus what belongs to one run."""

    deps: object
    """Handed to tools, hooks and instructions that take a ``RunContext``."""
    signal: AbortSignal | None
    """Aborts the run when it fires (``AbortController().signal``)."""


class NewRunOptions(RunOptions[OutputT], total=False):
    """``RunOptions`` plus what only a run that starts from its first message takes."""

    run_id: str | None
    """The run's id (default: 12 random hex digits)."""
    engine_factory: Callable[..., Engine]
    """Builds the run's engine from ``Engine``'s keywords (default ``Engine``)."""
    session: Session | None
    """A conversation session (``statemachine.sessions``): the run starts from its
    newest messages followed by ``messages``, and its new messages are stored there
    when it returns, as with ``Agent.run(session=...)``. Taken by ``run_agent`` and
    ``run_agent_sync``; an ``AgentRun``, built before a session could be read, refuses
    one."""


class ResumeOptions(RunOptions[OutputT], total=False):
    """``RunOptions`` plus what continuing a suspended run takes (``resume_run``)."""

    approvals: Mapping[str, bool | Deny] | None
    """Call id -> ``True``, ``False`` or ``Deny(reason)``, for every pending call."""
    message: str | UserMessage | None
    """A new message instead of decisions (the pending calls are then not approved)."""
    key: bytes | str | None
    """The key the snapshot was signed with; refused if its signature is missing or
    wrong."""
    max_snapshot_bytes: int
    """The largest snapshot accepted, in bytes of JSON text (default 32 MiB)."""
    stats: RunStats | None
    """The stats of the run before its suspension, when resuming from a snapshot alone
    (a ``RunResult`` carries its own)."""


def _tools(value: Sequence[Tool]) -> tuple[Tool, ...]:
    check_tools(value)
    return tuple(value)


def _steps(value: Sequence[Step]) -> tuple[Step, ...]:
    check_steps(value)
    return tuple(value)


def _instructions(_: object, __: object, value: Any) -> None:
    check_instructions(value)


def _model_settings(_: object, __: object, value: Any) -> None:
    if value is not None and not isinstance(value, ModelSettings):
        raise InvalidInputError("model_settings must be a ModelSettings")


def _max_turns(_: object, __: object, value: Any) -> None:
    positive_int("max_turns", value)


def _usage_limits(_: object, __: object, value: Any) -> None:
    check_usage_limits(value)


def _grace_period(_: object, __: object, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value >= 0  # also refuses NaN, with which the grace never ends
    ):
        raise InvalidInputError(f"grace_period must be a non-negative number, got {value!r}")


def _unknown_tool_retries(_: object, __: object, value: Any) -> None:
    if value is not None:
        check_retry_budget("unknown_tool_retries", value)


def _end_strategy(_: object, __: object, value: Any) -> None:
    check_end_strategy(value)


def _session(_: object, __: object, value: Any) -> None:
    if value is not None:
        check_session(value)


def _signal(_: object, __: object, value: Any) -> None:
    if value is not None and not isinstance(value, AbortSignal):
        raise InvalidInputError("signal must be an AbortSignal (AbortController().signal)")


@attrs.frozen(kw_only=True)
class Options:
    """A run's options resolved: every option of ``NewRunOptions`` with its default,
    each checked (module docstring). Built by ``resolve``; read by the driver."""

    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_tools)
    instructions: Instructions | None = attrs.field(default=None, validator=_instructions)
    model_settings: ModelSettings | None = attrs.field(default=None, validator=_model_settings)
    max_turns: int = attrs.field(default=DEFAULT_MAX_TURNS, validator=_max_turns)
    usage_limits: UsageLimits | None = attrs.field(default=None, validator=_usage_limits)
    output_type: Any = None  # OutputType, or Validated (an Agent's validators)
    output_retries: int = DEFAULT_OUTPUT_RETRIES  # checked with the type (compile_output)
    output_mode: OutputMode = "auto"
    unknown_tool_retries: int | None = attrs.field(default=None, validator=_unknown_tool_retries)
    end_strategy: EndStrategy = attrs.field(default="early", validator=_end_strategy)
    before_tool_call: BeforeToolCall | None = None
    after_tool_call: AfterToolCall | None = None
    should_continue: ShouldContinue | None = None
    transform_context: TransformContext | None = None
    grace_period: float = attrs.field(default=DEFAULT_GRACE_PERIOD, validator=_grace_period)
    logger: Any = None
    steps: tuple[Step, ...] = attrs.field(default=(), converter=_steps)
    deps: object = None
    signal: AbortSignal | None = attrs.field(default=None, validator=_signal)
    run_id: str | None = None
    engine_factory: Callable[..., Engine] = Engine
    session: Session | None = attrs.field(default=None, validator=_session)


DEFAULTS = Options()
"""The options of a run given none (frozen: one serves every such run)."""


def resolve(
    where: str, given: Mapping[str, Any], keys: type[Mapping[str, Any]], base: Options = DEFAULTS
) -> Options:
    """``base`` with the keywords ``given`` to the function ``where`` in place of its
    fields, each checked; a keyword that is not one of ``keys`` (the ``TypedDict`` that
    ``where`` takes) is the ``TypeError`` Python would raise."""
    if not given:
        return base
    refuse_unknown(where, given, keys)
    return attrs.evolve(base, **given)


def refuse_unknown(where: str, given: Mapping[str, Any], keys: type[Mapping[str, Any]]) -> None:
    """The ``TypeError`` Python raises for a keyword ``where`` does not take, for a
    keyword in ``given`` that is not one of the ``TypedDict`` ``keys`` (a call that
    mypy does not check passes it through ``**options``)."""
    known = keys.__required_keys__ | keys.__optional_keys__  # type: ignore[attr-defined]
    unknown = sorted(given.keys() - known)
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
