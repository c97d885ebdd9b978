"""The history invariants, as a checker over a finished or in-progress transcript.

The engine enforces I1 and I2 by construction at each transition; this module states
them as a plain function over a list of messages, so that the same definition
validates a caller's input history before a run, backs the property tests, and is
offered to other teams through ``statemachine.testing``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from statemachine.core.messages import AssistantMessage, Message, ToolResultMessage, UserMessage

__all__ = ["Violation", "history_violations"]


@attrs.frozen
class Violation:
    """One broken invariant: which one, where, and a sentence a person understands."""

    invariant: str  # "I1", "I2", ...
    index: int  # the message index where it shows
    message: str

    def __str__(self) -> str:
        return f"{self.invariant} at message {self.index}: {self.message}"


def history_violations(
    messages: Sequence[Message], *, allow_open_tail: bool = False
) -> list[Violation]:
    """Every pairing and order violation (I1, I2) in ``messages``.

    Checks: each tool call has exactly one result; no result lacks its call; a
    call's result comes after its assistant message and before the next assistant
    message; the results of one assistant message are in tool-call order; tool-call
    ids are unique. With ``allow_open_tail`` the calls of the *last* assistant
    message may still lack results (a history in the middle of a turn).
    """
    pairing = _Pairing()
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            pairing.assistant(index, message)
        elif isinstance(message, ToolResultMessage):
            pairing.result(index, message)
        elif not isinstance(message, UserMessage):
            pairing.out.append(Violation("I8", index, f"not a message: {type(message).__name__}"))
    if not allow_open_tail:
        pairing.close()
    return pairing.out


class _Pairing:
    """One pass over a history: which calls wait for their results, and what broke."""

    def __init__(self) -> None:
        self.out: list[Violation] = []
        self.seen_ids: dict[str, int] = {}  # call id -> index of the message that made it
        # calls of the current assistant message still waiting for their result, in order
        self.open_calls: list[tuple[str, str]] = []
        self.open_owner = -1
        self.answered: set[str] = set()

    def assistant(self, index: int, message: AssistantMessage) -> None:
        """A new assistant message: every call still open lost its chance (I1)."""
        for call_id, name in self.open_calls:
            self.out.append(
                Violation(
                    "I1",
                    self.open_owner,
                    f"tool call {call_id!r} ({name}) has no result before the next "
                    f"assistant message (message {index})",
                )
            )
        self.open_calls = []
        self.open_owner = index
        for call in message.tool_calls:
            if not call.id:
                self.out.append(Violation("I1", index, f"tool call {call.name} has an empty id"))
            if call.id in self.seen_ids:
                self.out.append(
                    Violation(
                        "I1",
                        index,
                        f"tool call id {call.id!r} repeats the id of a call in "
                        f"message {self.seen_ids[call.id]}",
                    )
                )
            else:
                self.seen_ids[call.id] = index
            self.open_calls.append((call.id, call.name))

    def result(self, index: int, message: ToolResultMessage) -> None:
        """A tool result: it must answer the first open call of its message (I1, I2)."""
        call_id = message.tool_call_id
        position = next((i for i, (cid, _) in enumerate(self.open_calls) if cid == call_id), None)
        if position is None:
            self.out.append(Violation("I1", index, self._unmatched(call_id)))
            return
        if position != 0:
            skipped = ", ".join(repr(cid) for cid, _ in self.open_calls[:position])
            self.out.append(
                Violation(
                    "I2",
                    index,
                    f"result for tool call {call_id!r} comes before the result(s) "
                    f"of earlier call(s) {skipped} of the same assistant message",
                )
            )
        name = self.open_calls[position][1]
        if message.tool_name != name:
            self.out.append(
                Violation(
                    "I1",
                    index,
                    f"result for tool call {call_id!r} names tool {message.tool_name!r}, "
                    f"but the call was to {name!r}",
                )
            )
        del self.open_calls[position]
        self.answered.add(call_id)

    def _unmatched(self, call_id: str) -> str:
        """Why a result that answers no open call is wrong, in words."""
        if call_id in self.answered:
            return f"a second result for tool call {call_id!r}"
        if call_id in self.seen_ids:
            return f"result for tool call {call_id!r} comes after the next assistant message"
        return f"result for tool call {call_id!r} has no matching call"

    def close(self) -> None:
        """The end of the history: the calls still open have no result (I1)."""
        for call_id, name in self.open_calls:
            self.out.append(
                Violation("I1", self.open_owner, f"tool call {call_id!r} ({name}) has no result")
            )
