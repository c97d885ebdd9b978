"""Input queued for a turn boundary: steering messages and follow-ups (rule 6).

A steering message or a follow-up may be queued in any live state. The engine holds
one ``InputQueue``; when a model call starts it asks ``take`` for what enters the
history now: every steering message (in queue order), or, when there is none and
the model would otherwise finish, every follow-up. What is still queued when a run
ends is reported, never dropped (``queued``).
"""

from __future__ import annotations

from collections.abc import Sequence

from statemachine.core.events import InputKind, InputQueued
from statemachine.core.messages import UserMessage

__all__ = ["InputQueue"]


class InputQueue:
    """Steering messages and follow-ups, each in the order they were queued.

    Each kind is a tuple, replaced as input is queued or taken: an empty queue (most
    runs never queue input) holds no container the garbage collector tracks.
    """

    __slots__ = ("follow_up", "steer")

    def __init__(
        self,
        steer: Sequence[UserMessage] = (),
        follow_up: Sequence[UserMessage] = (),
    ) -> None:
        self.steer: tuple[UserMessage, ...] = tuple(steer)
        self.follow_up: tuple[UserMessage, ...] = tuple(follow_up)

    def copy(self) -> InputQueue:
        return InputQueue(self.steer, self.follow_up)

    def __bool__(self) -> bool:
        return bool(self.steer or self.follow_up)

    def __len__(self) -> int:
        return len(self.steer) + len(self.follow_up)

    def add(self, message: UserMessage, kind: InputKind) -> None:
        if kind is InputKind.FOLLOW_UP:
            self.follow_up += (message,)
        else:
            self.steer += (message,)

    def take(self, *, model_would_finish: bool) -> tuple[UserMessage, ...]:
        """What enters the history as a model call starts, removed from the queue:
        the steering messages; else, if the model would finish, the follow-ups."""
        if self.steer:
            taken, self.steer = self.steer, ()
        elif self.follow_up and model_would_finish:
            taken, self.follow_up = self.follow_up, ()
        else:
            taken = ()
        return taken

    def queued(self) -> tuple[InputQueued, ...]:
        """Everything queued, as the events that would queue it again: steering first,
        then follow-ups, each in order."""
        return tuple(InputQueued(m, InputKind.STEER) for m in self.steer) + tuple(
            InputQueued(m, InputKind.FOLLOW_UP) for m in self.follow_up
        )
