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
    out: list[Violation] = []
    seen_ids: dict[str, int] = {}
    # calls of the current assistant message still waiting for their result, in order
    open_calls: list[tuple[str, str]] = []
    open_owner = -1
    answered: set[str] = set()
    for index, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            for call_id, name in open_calls:
                out.append(
                    Violation(
                        "I1",
                        open_owner,
                        f"tool call {call_id!r} ({name}) has no result before the next "
                        f"assistant message (message {index})",
                    )
                )
            open_calls = []
            open_owner = index
            for call in message.tool_calls:
                if not call.id:
                    out.append(Violation("I1", index, f"tool call {call.name} has an empty id"))
                if call.id in seen_ids:
                    out.append(
                        Violation(
                            "I1",
                            index,
                            f"tool call id {call.id!r} repeats the id of a call in "
                            f"message {seen_ids[call.id]}",
                        )
                    )
                else:
                    seen_ids[call.id] = index
                open_calls.append((call.id, call.name))
        elif isinstance(message, ToolResultMessage):
            call_id = message.tool_call_id
            position = next((i for i, (cid, _) in enumerate(open_calls) if cid == call_id), None)
            if position is None:
                if call_id in answered:
                    out.append(Violation("I1", index, f"a second result for tool call {call_id!r}"))
                elif call_id in seen_ids:
                    out.append(
                        Violation(
                            "I1",
                            index,
                            f"result for tool call {call_id!r} comes after the next "
                            "assistant message",
                        )
                    )
                else:
                    out.append(
                        Violation(
                            "I1",
                            index,
                            f"result for tool call {call_id!r} has no matching call",
                        )
                    )
                continue
            if position != 0:
                skipped = ", ".join(repr(cid) for cid, _ in open_calls[:position])
                out.append(
                    Violation(
                        "I2",
                        index,
                        f"result for tool call {call_id!r} comes before the result(s) "
                        f"of earlier call(s) {skipped} of the same assistant message",
                    )
                )
            name = open_calls[position][1]
            if message.tool_name != name:
                out.append(
                    Violation(
                        "I1",
                        index,
                        f"result for tool call {call_id!r} names tool {message.tool_name!r}, "
                        f"but the call was to {name!r}",
                    )
                )
            del open_calls[position]
            answered.add(call_id)
        elif not isinstance(message, UserMessage):
            out.append(Violation("I8", index, f"not a message: {type(message).__name__}"))
    if open_calls and not allow_open_tail:
        for call_id, name in open_calls:
            out.append(
                Violation(
                    "I1",
                    open_owner,
                    f"tool call {call_id!r} ({name}) has no result",
                )
            )
    return out
