"""The engine's errors, defined in ``statemachine.errors`` (the one error module)."""

from __future__ import annotations

from statemachine.errors import (
    AbortedError,
    AwaitingUserError,
    BadDataError,
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
    "BadDataError",
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
