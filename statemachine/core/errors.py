"""The one error hierarchy.

Like h11's split between ``LocalProtocolError`` and ``RemoteProtocolError``, the
hierarchy separates three kinds of trouble, because each calls for a different
reaction:

* ``UsageError``: the *caller* misused the library (an invalid history, duplicate
  tool names, an event the engine does not accept in its current state). Raised
  immediately; fix the calling code.
* ``BadOutputError``: a *model or tool* produced something unusable (a model client
  that returned the wrong type, a tool that returned an unsupported value). The
  driver turns these into an error tool result or a ``Failed`` run; they reach the
  caller only as explanations, never as a crash.
* ``RunEndedError``: how a run that did not end ``Done`` explains itself. ``run_agent``
  never raises these; it puts one in ``RunResult.error`` (and
  ``RunResult.raise_for_state()`` raises it for callers who prefer exceptions).

Apart from the three, ``EngineInvariantError`` reports a bug: the engine broke a
guarantee of its own (no input can cause it), for example internal transitions that
never settle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from statemachine.core.engine import TransitionRecord

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


class StateMachineError(Exception):
    """Base class of every error this library raises on purpose."""


class EngineInvariantError(StateMachineError):
    """The engine broke one of its own guarantees: a bug in the library, in an
    ``Engine`` subclass or in a patched table, never something a caller's input can
    cause. For example, internal transitions that do not settle after one event.
    ``trace`` holds the transitions that led there, oldest first.
    """

    def __init__(self, message: str, trace: Sequence[TransitionRecord] = ()) -> None:
        super().__init__(message)
        self.trace: tuple[TransitionRecord, ...] = tuple(trace)


# -- the caller's misuse -------------------------------------------------------


class UsageError(StateMachineError):
    """The calling code used the library in a way it does not support."""


class ProtocolError(UsageError):
    """An event that the engine does not accept in its current state.

    The engine's state, history and transition log are exactly as they were before
    the refused event (invariant I8).
    """


class InvalidInputError(UsageError, ValueError):
    """Input refused before anything ran: an invalid history, tool list or schema."""


class WireFormatError(InvalidInputError):
    """A message dictionary that does not have the wire shape; names the bad path."""


class SnapshotError(WireFormatError):
    """A snapshot refused by ``Engine.restore`` before anything ran: malformed, too
    large or too deep, inconsistent with itself (its pending calls are not the
    unanswered calls of its last assistant message...), or refused by the policy when
    asked again on resume. The message starts with the path of the bad field
    (``snapshot.batch[1].call``)."""


class SnapshotSignatureError(SnapshotError):
    """A key was given to restore, and the snapshot's signature is missing or does
    not match it: the snapshot was not written by a holder of the key, or was changed
    since."""


# -- a model's or a tool's bad output ------------------------------------------------


class BadOutputError(StateMachineError):
    """A model or a tool produced output that cannot be used as it is."""


class ModelOutputError(BadOutputError):
    """The model client returned something that is not an ``AssistantMessage``."""


class ToolOutputError(BadOutputError):
    """A tool returned a value of a type that cannot become a tool result."""


# -- how a run that is not Done explains itself ----------------------------------


class RunEndedError(StateMachineError):
    """A run ended in a state other than ``Done``; the message says why."""


class AbortedError(RunEndedError):
    """The run was aborted (by the caller's signal or by the model's own report)."""


class TurnLimitExceededError(RunEndedError):
    """The turn limit was reached while the model still had work to do."""


class ModelFailedError(RunEndedError):
    """The model provider failed in a way that retrying in the loop will not fix."""


class AwaitingUserError(RunEndedError):
    """The run stopped to wait for a person (a call was denied by policy)."""
