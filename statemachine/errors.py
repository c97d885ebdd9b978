"""The error hierarchy.

Everything the library raises on purpose is a ``StateMachineError``. ``UsageError``
is the caller's misuse (wrong arguments, a call at the wrong time); ``InvalidInputError``
is bad data from outside (a model's output, a tool's result, a file, a snapshot);
``ModelFailedError``, ``AbortedError`` and ``TurnLimitExceededError`` are how a run
ended, raised by ``RunResult.raise_for_state``.
"""

from __future__ import annotations

from statemachine.core.errors import (
    AbortedError,
    AwaitingUserError,
    BadOutputError,
    EngineInvariantError,
    InvalidInputError,
    ModelFailedError,
    ModelOutputError,
    ProtocolError,
    RunEndedError,
    SnapshotError,
    SnapshotSignatureError,
    StateMachineError,
    ToolOutputError,
    TurnLimitExceededError,
    UsageError,
    WireFormatError,
)

__all__ = [
    "AbortedError",
    "AwaitingUserError",
    "BadOutputError",
    "EngineInvariantError",
    "InvalidInputError",
    "ModelFailedError",
    "ModelOutputError",
    "ProtocolError",
    "RunEndedError",
    "SnapshotError",
    "SnapshotSignatureError",
    "StateMachineError",
    "ToolOutputError",
    "TurnLimitExceededError",
    "UsageError",
    "WireFormatError",
]
