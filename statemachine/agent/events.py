"""What a run reports: its event stream, its stats, and how it ended.

``AgentRun.events()`` yields the ``RunEvent``s below, derived from what the engine
did (built only when someone listens); ``RunResult`` is what ``run()`` returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeAlias

import attrs
from typing_extensions import TypeVar

from statemachine.core.engine import TransitionRecord
from statemachine.core.errors import (
    AbortedError,
    AwaitingUserError,
    ModelFailedError,
    RunEndedError,
    TurnLimitExceededError,
)
from statemachine.core.events import InputQueued
from statemachine.core.limits import UsageLimitExceededError
from statemachine.core.messages import AssistantMessage, Message, ToolCall, Usage
from statemachine.core.output import OutputInvalidError
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolOutput

__all__ = [
    "MessageAdded",
    "RunEvent",
    "RunFinished",
    "RunResult",
    "RunStarted",
    "RunStats",
    "StateChanged",
    "ToolEnded",
    "ToolProgress",
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
class ToolEnded:
    """A tool call's outcome, in completion order (history keeps call order)."""

    call: ToolCall
    output: ToolOutput
    seconds: float
    cancelled: bool = False
    # Still running when the grace period ended: given up on, its cleanup unfinished.
    abandoned: bool = False


@attrs.frozen
class TurnEnded:
    turn: int
    seconds: float


@attrs.frozen
class RunFinished:
    state: TurnState
    explanation: str
    stats: RunStats


RunEvent: TypeAlias = (
    RunStarted
    | TurnStarted
    | MessageAdded
    | StateChanged
    | ToolStarted
    | ToolProgress
    | ToolEnded
    | TurnEnded
    | RunFinished
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


_ERROR_TYPES: dict[TurnState, type[RunEndedError]] = {
    TurnState.Aborted: AbortedError,
    TurnState.TurnLimitExceeded: TurnLimitExceededError,
    TurnState.UsageLimitExceeded: UsageLimitExceededError,
    TurnState.OutputInvalid: OutputInvalidError,
    TurnState.Failed: ModelFailedError,
    TurnState.AwaitingUser: AwaitingUserError,
}


def run_error(state: TurnState, explanation: str) -> RunEndedError | None:
    """``RunResult.error`` of a run that ended in ``state``: the one place where a state
    becomes its error (``None`` for ``Done``)."""
    error_type = _ERROR_TYPES.get(state)
    return None if error_type is None else error_type(explanation)


OutputT = TypeVar("OutputT", default=Any)
"""The type of ``RunResult.output``: the run's ``output_type`` (``Any`` when unsaid)."""


@attrs.frozen
class RunResult(Generic[OutputT]):
    """How a run ended: its state, the whole history, and why.

    ``output`` is the run's structured output: with an ``output_type``, the validated
    arguments of the model's ``final_result`` call as that type, once the run is
    ``Done``; ``None`` otherwise. ``RunResult[T]`` types it for mypy.
    """

    # The history, the log and the snapshot grow with the run: they are left out of
    # repr(), which a long run would otherwise make megabytes long (task reprs, logs).
    state: TurnState
    messages: tuple[Message, ...] = attrs.field(repr=False)
    error: RunEndedError | None
    turns: int
    explanation: str
    trace: tuple[TransitionRecord, ...] = attrs.field(default=(), repr=False)
    run_id: str = ""
    stats: RunStats | None = attrs.field(default=None, repr=False)
    pending_approvals: tuple[ToolCall, ...] = ()
    queued_input: tuple[InputQueued, ...] = ()
    snapshot: Mapping[str, Any] | None = attrs.field(default=None, repr=False)
    usage: Usage = attrs.field(factory=Usage, repr=False)
    output: OutputT | None = None
    """The usage the provider reported on this run's responses, summed (a resumed run's
    includes what it used before it was suspended; ``turns`` is its request count)."""

    @property
    def ok(self) -> bool:
        """True when the run ended ``Done``."""
        return self.state is TurnState.Done

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
