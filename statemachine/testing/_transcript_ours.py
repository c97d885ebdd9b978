"""Our own format: message objects or their wire dicts (with ``{"role": "system",
"content": ...}`` items for the instructions a journal recorded), checked by
``statemachine.core.invariants.history_violations`` (the definition the engine uses to
refuse an invalid input history). Each finding names the caller's own index; a wire
dict that cannot be read is one ``format`` finding, and what pairing needs from it is
salvaged so that one bad field does not orphan every call around it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from statemachine.core.invariants import history_violations
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.wire import message_from_dict
from statemachine.errors import WireFormatError
from statemachine.testing._transcript_rules import Finding, Level, stand_ins, wrong_id

__all__ = ["check_statemachine"]


def check_statemachine(items: Sequence[Any], allow_open_tail: bool, reuse: Level) -> list[Finding]:
    """Every finding of a history in our format, each at the caller's own index; an id
    reused across turns is at level ``reuse``, everything else an error."""
    neutral: list[Message] = []
    origin: list[int] = []
    out: list[Finding] = []
    for i, item in enumerate(items):
        if isinstance(item, (UserMessage, AssistantMessage, ToolResultMessage)):
            neutral.append(item)
            origin.append(i)
        elif isinstance(item, Mapping) and item.get("role") == "system":
            # The instructions a turn was sent with (``ReplayResult.transcript``): not
            # part of the history the invariants pair, but a well-formed item.
            if set(item) != {"role", "content"} or not isinstance(item["content"], str):
                out.append(
                    Finding("format", i, 'a system item is {"role": "system", "content": <str>}')
                )
        elif isinstance(item, Mapping):
            try:
                neutral.append(message_from_dict(item, path=f"messages[{i}]"))
            except WireFormatError as exc:
                out.append(Finding("format", i, str(exc)))
                salvaged = _salvage(item)
                if salvaged is None:
                    continue
                neutral.append(salvaged)
            origin.append(i)
        else:
            out.append(
                Finding("format", i, f"a {type(item).__name__} is not a message or a wire dict")
            )
    stand_in_calls = _mend_wrong_ids(neutral, origin, out)
    for v in history_violations(neutral, allow_open_tail=allow_open_tail):
        index = origin[v.index] if 0 <= v.index < len(origin) else v.index
        if v.invariant == "I2" and _skips_only(v.message, stand_in_calls):
            continue  # the mended result is named already; the results after it are in place
        level: Level = "error"
        if "repeats the id" in v.message and f"message {v.index}" not in v.message:
            level = reuse
        out.append(Finding(v.invariant, index, _renumber(v.message, origin), level))
    return out


def _mend_wrong_ids(neutral: list[Message], origin: list[int], out: list[Finding]) -> set[str]:
    """Names each result sent under a wrong id (``stand_ins``) and gives it the id of
    the call it stands for, so that the pairing check does not also accuse the call of
    having no result or the results after it of coming early. Returns those calls' ids."""
    known = {c.id for m in neutral if isinstance(m, AssistantMessage) for c in m.tool_calls}
    mended: set[str] = set()
    for n, message in enumerate(neutral):
        if not isinstance(message, AssistantMessage) or not message.tool_calls:
            continue
        run = n + 1
        while run < len(neutral) and isinstance(neutral[run], ToolResultMessage):
            run += 1
        results = [m for m in neutral[n + 1 : run] if isinstance(m, ToolResultMessage)]
        calls = message.tool_calls
        pairs = stand_ins([c.id for c in calls], [r.tool_call_id for r in results], known)
        for r, c in pairs:
            call = calls[c]
            out.append(
                Finding(
                    "I1",
                    origin[n + 1 + r],
                    wrong_id(results[r].tool_call_id, call.id, call.name, origin[n]),
                )
            )
            neutral[n + 1 + r] = attrs.evolve(results[r], tool_call_id=call.id, tool_name=call.name)
            mended.add(call.id)
    return mended


def _skips_only(sentence: str, call_ids: set[str]) -> bool:
    """Whether an I2 sentence ("... before the result(s) of earlier call(s) 'a', 'b' of
    the same assistant message") names only calls in ``call_ids``."""
    match = re.search(r"earlier call\(s\) (.+) of the same", sentence)
    if match is None or not call_ids:
        return False
    named = set(re.findall(r"'([^']*)'", match.group(1)))
    return bool(named) and named <= call_ids


def _salvage(item: Mapping[str, Any]) -> Message | None:
    """What pairing needs from an unreadable wire dict (its calls, or the call its
    result answers), so that one bad field does not orphan every call around it."""
    role = item.get("role")
    if role == "assistant":
        content = item.get("content")
        calls = [
            ToolCall(b["id"], str(b.get("name", "")), {})
            for b in (content if isinstance(content, list) else ())
            if isinstance(b, Mapping)
            and b.get("type") == "toolCall"
            and isinstance(b.get("id"), str)
        ]
        return AssistantMessage(tuple(calls), stop_reason="toolUse" if calls else "stop")
    if role == "toolResult" and isinstance(item.get("toolCallId"), str):
        name = item.get("toolName")
        return ToolResultMessage(item["toolCallId"], name if isinstance(name, str) else "", "")
    return UserMessage("") if role == "user" else None


def _renumber(sentence: str, origin: list[int]) -> str:
    # history_violations names other messages as "message N" in neutral numbering.
    def sub(match: re.Match[str]) -> str:
        n = int(match.group(1))
        return f"message {origin[n] if 0 <= n < len(origin) else n}"

    return re.sub(r"message (\d+)", sub, sentence)
