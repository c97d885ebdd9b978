"""The compact transcript form the spec files are written in, and readable diffs.

One message is one string: ``user: TEXT``; ``assistant(STOP): PART | PART ...``;
``result ID TOOL: TEXT`` or ``error ID TOOL: TEXT``. An expected line ending in
``...`` matches any line that starts with what comes before it.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    TextContent,
    ThinkingContent,
    ToolCall,
    UserMessage,
)

__all__ = ["compact", "diff", "lines_match"]


def _args(arguments: Mapping[str, Any]) -> str:
    return json.dumps(dict(arguments), ensure_ascii=False, sort_keys=True)


def compact(message: Message) -> str:
    """One message as one readable string (the form scenarios write transcripts in).

    ``user: TEXT``; ``assistant(STOP): TEXT | call ID NAME {ARGS} | error: MSG``;
    ``result ID NAME: TEXT`` or ``error ID NAME: TEXT`` for a tool result.
    """
    if isinstance(message, UserMessage):
        return "user: " + " | ".join(
            b.text if isinstance(b, TextContent) else "[image]" for b in message.content
        )
    if isinstance(message, AssistantMessage):
        parts = []
        for block in message.content:
            if isinstance(block, TextContent):
                parts.append(block.text)
            elif isinstance(block, ThinkingContent):
                parts.append(
                    "thinking: (redacted)" if block.redacted else f"thinking: {block.thinking}"
                )
            elif isinstance(block, ToolCall):
                unreadable = (
                    "" if block.parse_error is None else f" (unreadable: {block.parse_error})"
                )
                parts.append(f"call {block.id} {block.name} {_args(block.arguments)}{unreadable}")
        if message.error_message is not None:
            parts.append(f"error: {message.error_message}")
        return f"assistant({message.stop_reason.value}): " + " | ".join(parts)
    kind = "error" if message.is_error else "result"
    text = " | ".join(
        b.text if isinstance(b, TextContent) else "[image]"
        for b in message.content
        if isinstance(b, (TextContent, ImageContent))
    )
    return f"{kind} {message.tool_call_id} {message.tool_name}: {text}"


def _matches(expected: str, actual: str) -> bool:
    # "..." at the end of an expected line stands for any rest (long error texts).
    if expected.endswith("..."):
        return actual.startswith(expected[:-3])
    return expected == actual


def lines_match(expected: Sequence[str], actual: Sequence[str]) -> bool:
    return len(expected) == len(actual) and all(
        _matches(e, a) for e, a in zip(expected, actual, strict=True)
    )


def diff(label: str, expected: Sequence[str], actual: Sequence[str]) -> str:
    # One JSON string per line, so a message with newlines stays one diff line.
    shown = [a if not _matches(e, a) else e for e, a in zip(expected, actual, strict=False)]
    shown += list(actual[len(expected) :])
    lines = difflib.unified_diff(
        [json.dumps(e, ensure_ascii=False) for e in expected],
        [json.dumps(a, ensure_ascii=False) for a in shown],
        fromfile=f"expected {label}",
        tofile=f"actual {label}",
        lineterm="",
    )
    return "\n".join(lines)
