"""The sans-IO engine, for embedding the loop in a driver of your own.

``Engine`` takes events (``Start``, ``ModelResponded``, ``ToolFinished``...) and returns
the actions to perform (``CallModel``, ``StartTool``, ``CheckPermission``...). It does no
I/O and never awaits; ``statemachine.run_agent`` is one driver built on it. The
transition table it follows is ``TRANSITIONS``; ``TurnState`` and ``Trigger`` name its
states and triggers. A ``TransitionHook`` given to an engine sees every transition.
"""

from __future__ import annotations

import typing as _typing

from statemachine._deprecated import renamed as _renamed
from statemachine.core.engine import Engine, TransitionHook, TransitionRecord
from statemachine.core.events import (
    EVENT_TYPES,
    AbortRequested,
    Action,
    ApprovalDecided,
    ApprovalRequired,
    CallModel,
    CancelOperations,
    CheckContinue,
    CheckPermission,
    ContinueDecided,
    Event,
    HistoryView,
    InputKind,
    InputQueued,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    ReturnToCaller,
    Start,
    StartTool,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.limits import UsageLimits
from statemachine.core.output import OutputSpec
from statemachine.core.table import TRANSITIONS, Guard, Transition, Trigger, TurnState
from statemachine.core.tools import Scheduling, ToolDefinition, ToolOutput, validate_arguments
from statemachine.core.trace import Trace
from statemachine.errors import OutputInvalidError, UsageLimitExceededError

__all__ = [
    "EVENT_TYPES",
    "TRANSITIONS",
    "AbortRequested",
    "Action",
    "ApprovalDecided",
    "ApprovalRequired",
    "CallModel",
    "CancelOperations",
    "CheckContinue",
    "CheckPermission",
    "ContinueDecided",
    "Engine",
    "Event",
    "Guard",
    "HistoryView",
    "InputKind",
    "InputQueued",
    "ModelCancelled",
    "ModelFailed",
    "ModelResponded",
    "OutputInvalidError",
    "OutputSpec",
    "ReturnToCaller",
    "Scheduling",
    "Start",
    "StartTool",
    "ToolCancelled",
    "ToolDefinition",
    "ToolDenied",
    "ToolFinished",
    "ToolOutput",
    "ToolPermitted",
    "Trace",
    "Transition",
    "TransitionHook",
    "TransitionRecord",
    "Trigger",
    "TurnState",
    "UsageLimitExceededError",
    "UsageLimits",
    "validate_arguments",
]


if not _typing.TYPE_CHECKING:  # a type checker reports the old name as missing

    def __getattr__(name: str) -> _typing.Any:
        return _renamed(__name__, name, {"RunEnded": "ReturnToCaller"}, globals())
