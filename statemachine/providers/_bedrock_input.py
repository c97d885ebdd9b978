"""Bedrock Converse ``messages`` and ``toolConfig.tools``, built from our history (the
projection ``bedrock`` describes)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    thaw_json,
)
from statemachine.core.tools import ToolDefinition
from statemachine.errors import InvalidInputError
from statemachine.providers._projection import (
    alternating_turns,
    foreign_signature,
    normalise_id,
)

__all__ = ["MAX_ID_LENGTH", "project_messages", "project_tools"]

MAX_ID_LENGTH = 64
_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}


def _image(block: ImageContent) -> dict[str, Any]:
    image_format = _FORMATS.get(block.mime_type)
    if image_format is None:
        raise InvalidInputError(
            f"Bedrock cannot carry an image of type {block.mime_type!r} "
            f"(it takes {', '.join(sorted(_FORMATS))})"
        )
    return {"image": {"format": image_format, "source": {"bytes": base64.b64decode(block.data)}}}


def _text(text: str) -> dict[str, Any]:
    return {"text": text}


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, ThinkingContent):
            if not block.signature or foreign_signature(block.signature):
                continue  # cannot be carried: see the bedrock module docstring
            if block.redacted:
                raw = base64.b64decode(block.signature)
                out.append({"reasoningContent": {"redactedContent": raw}})
            else:
                text = {"text": block.thinking, "signature": block.signature}
                out.append({"reasoningContent": {"reasoningText": text}})
        elif isinstance(block, TextContent):
            if block.text:
                out.append(_text(block.text))
        elif isinstance(block, ToolCall):
            use = {
                "toolUseId": normalise_id(block.id, MAX_ID_LENGTH),
                "name": block.name,
                "input": thaw_json(block.arguments),
            }
            out.append({"toolUse": use})
    return out


def _tool_result(message: ToolResultMessage, content: list[dict[str, Any]]) -> dict[str, Any]:
    result = {"toolUseId": normalise_id(message.tool_call_id, MAX_ID_LENGTH), "content": content}
    if message.is_error:
        result["status"] = "error"
    return {"toolResult": result}


def project_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Our history as Converse ``messages``."""
    return alternating_turns(messages, _text, _image, _assistant_blocks, _tool_result)


def project_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Our tool definitions as Converse ``toolSpec`` entries (an empty description is
    left out: Converse wants one of at least one character, or none)."""
    specs: list[dict[str, Any]] = []
    for t in tools:
        spec: dict[str, Any] = {"name": t.name, "inputSchema": {"json": t.schema_dict()}}
        if t.description:
            spec["description"] = t.description
        specs.append({"toolSpec": spec})
    return specs
