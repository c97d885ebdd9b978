"""Input queued for a turn boundary: steering messages and follow-ups (rule 6).

A steering message or a follow-up may be queued in any live state. The engine holds
one ``InputQueue``: ``NO_INPUT``, the empty queue every run shares and none changes,
until input is first queued (most runs never queue any), then one of its own. When
a model call starts it asks ``take`` for what enters the history now: every steering
message (in queue order), or, when there is none and the model would otherwise
finish, every follow-up. What is still queued when a run ends is reported, never
dropped (``queued``).
"""

from __future__ import annotations

from typing import Final

from statemachine.core.events import InputKind, InputQueued
from statemachine.core.messages import UserMessage

__all__ = ["NO_INPUT", "InputQueue"]


class InputQueue:
    """Steering messages and follow-ups, each in the order they were queued."""

    __slots__ = ("follow_up", "steer")

    def __init__(
        self, steer: list[UserMessage] | None = None, follow_up: list[UserMessage] | None = None
    ) -> None:
        self.steer: list[UserMessage] = steer if steer is not None else []
        self.follow_up: list[UserMessage] = follow_up if follow_up is not None else []

    def copy(self) -> InputQueue:
        """An independent queue with the same input (none: the shared empty one)."""
        if not self:
            return NO_INPUT
        return InputQueue(list(self.steer), list(self.follow_up))

    def __bool__(self) -> bool:
        return bool(self.steer or self.follow_up)

    def __len__(self) -> int:
        return len(self.steer) + len(self.follow_up)

    def add(self, message: UserMessage, kind: InputKind) -> None:
        if kind is InputKind.FOLLOW_UP:
            self.follow_up.append(message)
        else:
            self.steer.append(message)

    def take(self, *, model_would_finish: bool) -> list[UserMessage]:
        """What enters the history as a model call starts, removed from the queue:
        the steering messages; else, if the model would finish, the follow-ups."""
        if self.steer:
            taken, self.steer = self.steer, []
        elif self.follow_up and model_would_finish:
            taken, self.follow_up = self.follow_up, []
        else:
            taken = []
        return taken

    def queued(self) -> tuple[InputQueued, ...]:
        """Everything queued, as the events that would queue it again: steering first,
        then follow-ups, each in order."""
        return tuple(InputQueued(m, InputKind.STEER) for m in self.steer) + tuple(
            InputQueued(m, InputKind.FOLLOW_UP) for m in self.follow_up
        )


# The empty queue of every run that has queued nothing: never changed (an engine puts a
# queue of its own in its place before it queues input).
NO_INPUT: Final = InputQueue()
