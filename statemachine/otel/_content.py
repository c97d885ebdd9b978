"""Captured content in the GenAI conventions' JSON shapes, within a budget per span."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.otel._guard import Attributes

# The conventions' finish reasons.
# The conventions' finish reasons.
FINISH_REASONS = {
    StopReason.STOP: "stop",
    StopReason.TOOL_USE: "tool_call",
    StopReason.LENGTH: "length",
    StopReason.ERROR: "error",
    StopReason.ABORTED: "error",
}
# The provider names of the library's own adapters (the conventions' values).


class Budget:
    """Characters of content a span may still take; JSON built within it.

    ``put`` adds an attribute only when something of it fits; whatever was cut or
    left out is said by ``statemachine.content.truncated`` (``mark``).
    """

    def __init__(self, chars: int) -> None:
        self.left = chars
        self.truncated = False

    def put(self, attributes: Attributes, key: str, value: object) -> None:
        text = self._fit(value, self.left)
        if text is not None:
            attributes[key] = text
            self.left -= len(text)

    def put_messages(
        self,
        attributes: Attributes,
        key: str,
        messages: Sequence[Message],
        cache: MessageCache | None = None,
    ) -> None:
        """The newest messages that fit, oldest first; the newest one cut if it
        alone does not fit. Costs what it keeps, not the history's length; with a
        ``cache``, each message of a run is made JSON once, not once per call."""
        if self.left < 2:
            self.truncated = True
            return
        room = self.left - 2  # the brackets
        kept: list[str] = []
        if cache is not None and len(cache) > 2 * len(messages) + 64:
            cache.clear()  # messages replaced (a transform_context hook): start over
        for message in reversed(messages):
            text = _json_of(message, cache)
            separator = 2 if kept else 0
            if len(text) + separator > room:
                self.truncated = True
                if not kept:
                    cut = self._fit(as_message(message), room)
                    if cut is not None:
                        kept.append(cut)
                        room -= len(cut)
                break
            room -= len(text) + separator
            kept.append(text)
        attributes[key] = "[" + ", ".join(reversed(kept)) + "]"
        self.left = room

    def mark(self, attributes: Attributes) -> None:
        if self.truncated:
            attributes["statemachine.content.truncated"] = True

    def _fit(self, value: object, room: int) -> str | None:
        """``value`` as JSON in at most ``room`` characters, its strings and
        containers cut as needed; None when not even its shape fits."""
        text = json.dumps(value, ensure_ascii=False, default=str)
        if len(text) <= room:
            return text
        self.truncated = True
        chars = room // 2
        while chars >= 1:
            text = json.dumps(cut(value, chars), ensure_ascii=False, default=str)
            if len(text) <= room:
                return text
            chars //= 2
        return None


MessageCache = dict[int, tuple[Message, str]]
"""A run's messages as JSON, by identity (each entry keeps its message alive, so an
identity is never reused while the entry exists)."""


def _json_of(message: Message, cache: MessageCache | None) -> str:
    if cache is not None:
        cached = cache.get(id(message))
        if cached is not None and cached[0] is message:
            return cached[1]
    text = json.dumps(as_message(message), ensure_ascii=False, default=str)
    if cache is not None:
        cache[id(message)] = (message, text)
    return text


def cut(value: object, chars: int) -> object:
    """``value`` with every string cut to ``chars`` characters and containers to
    ``chars`` items (enough to show the shape of something too long to keep)."""
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + "..."
    if isinstance(value, Mapping):
        return {k: cut(v, chars) for k, v in list(value.items())[:chars]}
    if isinstance(value, list | tuple):
        return [cut(v, chars) for v in value[:chars]]
    return value


def as_part(block: object) -> dict[str, Any]:
    if isinstance(block, TextContent):
        return {"type": "text", "content": block.text}
    if isinstance(block, ThinkingContent):
        return {"type": "reasoning", "content": "" if block.redacted else block.thinking}
    if isinstance(block, ToolCall):
        return {
            "type": "tool_call",
            "id": block.id,
            "name": block.name,
            "arguments": block.arguments_dict(),
        }
    if isinstance(block, ImageContent):
        return {
            "type": "blob",
            "modality": "image",
            "mime_type": block.mime_type,
            "content": block.data,
        }
    return {"type": str(getattr(block, "type", type(block).__name__))}


def as_result(content: Sequence[object]) -> object:
    if all(isinstance(b, TextContent) for b in content):
        return "".join(b.text for b in content if isinstance(b, TextContent))
    return [as_part(b) for b in content]


def as_message(message: Message) -> dict[str, Any]:
    if isinstance(message, ToolResultMessage):
        response = {
            "type": "tool_call_response",
            "id": message.tool_call_id,
            "response": as_result(message.content),
        }
        return {"role": "tool", "parts": [response]}
    if isinstance(message, AssistantMessage):
        return {"role": "assistant", "parts": [as_part(b) for b in message.content]}
    if isinstance(message, UserMessage):
        return {"role": "user", "parts": [as_part(b) for b in message.content]}
    return {"role": str(getattr(message, "role", "user")), "parts": []}


# -- the wrappers -------------------------------------------------------------------------------
