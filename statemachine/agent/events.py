"""What a run reports: its event stream, its stats, and how it returned.

``AgentRun.events()`` yields the ``RunEvent``s below, derived from what the engine
did (built only when someone listens); ``RunResult`` is what ``run()`` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeAlias

import attrs
from typing_extensions import TypeVar

from statemachine._deprecated import renamed as _renamed
from statemachine.core.engine import TransitionRecord
from statemachine.core.events import InputQueued
from statemachine.core.messages import AssistantMessage, Message, ToolCall, Usage
from statemachine.core.table import DeclaredState, State, TurnState
from statemachine.core.tools import ToolOutput
from statemachine.errors import (
    AbortedError,
    AwaitingUserError,
    ModelFailedError,
    OutputInvalidError,
    RunNotDoneError,
    StepEndedError,
    ToolRetriesExceededError,
    TurnLimitExceededError,
    UsageLimitExceededError,
)

__all__ = [
    "EventsDropped",
    "MessageAdded",
    "RunEvent",
    "RunResult",
    "RunReturned",
    "RunStarted",
    "RunStats",
    "StateChanged",
    "TextDelta",
    "ToolAnswered",
    "ToolAsked",
    "ToolCallDelta",
    "ToolEnded",
    "ToolLog",
    "ToolProgress",
    "ToolQuestion",
    "ToolStarted",
    "TurnEnded",
    "TurnStarted",
    "run_error",
]


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
class ToolLog:
    """A log message from a running tool (``report_log``; an MCP server's
    ``notifications/message`` during a call): ``level`` as in syslog ("debug",
    "info", ..., "emergency"), ``logger`` the name it gave, if any."""

    call_id: str
    level: str
    data: object
    logger: str | None = None


@attrs.frozen
class ToolQuestion:
    """A question a running tool waits on a person for (an MCP server's elicitation
    asked through the run): ``message``, and the JSON schema of the answer (a flat
    object), or a ``url`` to open. ``id`` names it to ``AgentRun.answer``; ``source``
    says who asks (the MCP server's name)."""

    id: str
    call_id: str
    tool_name: str
    message: str
    schema: Mapping[str, Any] = attrs.field(factory=dict)
    url: str | None = None
    source: str = ""


@attrs.frozen
class ToolAsked:
    """A running tool asked a person ``question``; it waits until ``AgentRun.answer``
    answers it, or the call ends (its timeout, an abort)."""

    question: ToolQuestion


@attrs.frozen
class ToolAnswered:
    """How ``question`` ended: ``outcome`` is "accept", "decline" or "cancel" (a
    person's answer), "timed out" (nobody answered within the call's time: the asker
    was told "cancel"), "aborted" (the run was aborted: likewise) or "cancelled" (the
    call ended first)."""

    question: ToolQuestion
    outcome: str


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
class TextDelta:
    """A fragment of the answer's text as the model streams it (``turn`` counts from
    1). The complete message follows as ``MessageAdded``; a retried attempt streams
    its text again."""

    turn: int
    text: str


@attrs.frozen
class ToolCallDelta:
    """A fragment of a tool call's JSON arguments as the model streams it; ``index``
    is the call's place in the response, ``call_id`` and ``name`` as far as known."""

    turn: int
    index: int
    call_id: str
    name: str
    arguments: str


@attrs.frozen
class TurnEnded:
    turn: int
    seconds: float


@attrs.frozen
class EventsDropped:
    """``count`` events a subscriber did not read in time were dropped here (only
    ``TextDelta``, ``ToolCallDelta``, ``StateChanged``, ``TurnStarted``, ``TurnEnded``,
    ``ToolProgress`` and ``ToolLog`` are ever dropped: ``AgentRun.events()``)."""

    count: int


@attrs.frozen
class RunReturned:
    """The last event of a run: it returned to its caller in ``state``, a terminal state
    (the run has ended) or ``AwaitingUser`` (it resumes with a new message).
    ``RunFinished`` is its deprecated name."""

    state: State
    explanation: str
    stats: RunStats


RunEvent: TypeAlias = (
    RunStarted
    | TurnStarted
    | MessageAdded
    | StateChanged
    | ToolStarted
    | ToolProgress
    | ToolLog
    | ToolAsked
    | ToolAnswered
    | ToolEnded
    | TurnEnded
    | RunReturned
    | TextDelta
    | ToolCallDelta
    | EventsDropped
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

    def __add__(self, other: RunStats) -> RunStats:
        """The stats of both parts of a run (before and after a resume, or a parent
        and the sub-agents it called): counts and usage summed, times of both."""
        tool_calls: dict[str, dict[str, int]] = {}
        for part in (self.tool_calls, other.tool_calls):
            for name, outcomes in part.items():
                counts = tool_calls.setdefault(name, {})
                for outcome, count in outcomes.items():
                    counts[outcome] = counts.get(outcome, 0) + count
        return RunStats(
            model_calls=self.model_calls + other.model_calls,
            tool_calls=tool_calls,
            usage=self.usage + other.usage,
            turn_seconds=(*self.turn_seconds, *other.turn_seconds),
            tool_seconds={**self.tool_seconds, **other.tool_seconds},
            wall_seconds=self.wall_seconds + other.wall_seconds,
        )


_ERROR_TYPES: dict[TurnState, type[RunNotDoneError]] = {
    TurnState.ABORTED: AbortedError,
    TurnState.TURN_LIMIT_EXCEEDED: TurnLimitExceededError,
    TurnState.USAGE_LIMIT_EXCEEDED: UsageLimitExceededError,
    TurnState.OUTPUT_INVALID: OutputInvalidError,
    TurnState.TOOL_RETRIES_EXCEEDED: ToolRetriesExceededError,
    TurnState.FAILED: ModelFailedError,
    TurnState.AWAITING_USER: AwaitingUserError,
}


def run_error(state: State, explanation: str) -> RunNotDoneError | None:
    """``RunResult.error`` of a run that returned in ``state``: the one place where a state
    becomes its error (``None`` for ``Done``; ``StepEndedError`` for a state a declared
    step ended the run in)."""
    if isinstance(state, DeclaredState):
        return StepEndedError(explanation)
    error_type = _ERROR_TYPES.get(state)
    return None if error_type is None else error_type(explanation)


OutputT = TypeVar("OutputT", default=Any)
"""The type of ``RunResult.output``: the run's ``output_type`` (``Any`` when unsaid)."""


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@attrs.frozen
class RunResult(Generic[OutputT]):
    """How a run returned to its caller: its state (terminal, or ``AwaitingUser``), the
    whole history, and why.

    ``output`` is the run's structured output: with an ``output_type``, the validated
    arguments of the model's ``final_result`` call as that type, once the run is
    ``Done``; ``None`` otherwise. ``RunResult[T]`` types it for mypy.
    """

    # The history, the log and the snapshot grow with the run: they are left out of
    # repr(), which a long run would otherwise make megabytes long (task reprs, logs).
    state: State
    messages: tuple[Message, ...] = attrs.field(repr=False)
    error: RunNotDoneError | None
    turns: int
    explanation: str
    trace: tuple[TransitionRecord, ...] = attrs.field(default=(), repr=False)
    run_id: str = ""
    stats: RunStats | None = attrs.field(default=None, repr=False)
    pending_approvals: tuple[ToolCall, ...] = ()
    queued_input: tuple[InputQueued, ...] = ()
    snapshot: Mapping[str, Any] | None = attrs.field(default=None, repr=False)
    # How many messages of ``messages`` the run was given (or resumed with).
    given: int = attrs.field(default=0, repr=False)

    def new_messages(self) -> tuple[Message, ...]:
        """The messages this run (or this resumed part) added after the history it
        was given: the prompt's continuation, to store or send on."""
        return self.messages[self.given :]

    usage: Usage = attrs.field(factory=Usage, repr=False)
    """The usage the provider reported on this run's responses, summed (a resumed run's
    includes what it used before it was suspended; ``turns`` is its request count)."""
    # A text agent's output is its final text, which a long run makes long: repr() shows
    # its start only.
    output: OutputT | None = attrs.field(default=None, repr=_short_repr)
    """The run's output once it is ``Done``: the validated value of its ``output_type``
    (``None`` otherwise)."""

    @property
    def ok(self) -> bool:
        """True when the run ended ``Done``."""
        return self.state is TurnState.DONE

    @property
    def final_text(self) -> str:
        """The text of the last assistant message ('' if there is none)."""
        for message in reversed(self.messages):
            if isinstance(message, AssistantMessage):
                return message.text
        return ""

    def raise_for_state(self) -> RunResult[OutputT]:
        """Raise ``error`` unless the run is ``Done``; return self otherwise."""
        if self.error is not None:
            raise self.error
        return self


if not TYPE_CHECKING:  # a type checker reports the old name as missing

    def __getattr__(name: str) -> Any:
        return _renamed(__name__, name, {"RunFinished": "RunReturned"}, globals())
