"""A server's resources and prompts, as the library's values, bounded like tool results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import mcp.types as mcp_types

from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    TextContent,
    ToolResultContent,
    UserMessage,
)
from statemachine.mcp._results import blob, block, capped

__all__ = ["MCPPrompt", "MCPResource", "MCPResourceTemplate", "prompt_messages", "resource_blocks"]


@attrs.frozen
class MCPResource:
    """A resource a server lists: read it with ``MCPServer.read_resource(uri)``."""

    uri: str
    name: str
    description: str | None = None
    mime_type: str | None = None


@attrs.frozen
class MCPResourceTemplate:
    """A resource template a server lists (RFC 6570: ``file:///{path}``): read one of
    its resources with ``MCPServer.read_resource(uri)``, the template filled in."""

    uri_template: str
    name: str
    description: str | None = None
    mime_type: str | None = None


@attrs.frozen
class MCPPrompt:
    """A prompt a server lists: get it with ``MCPServer.get_prompt(name, arguments)``."""

    name: str
    description: str | None = None
    arguments: tuple[str, ...] = ()
    required: tuple[str, ...] = ()


def resource_of(item: mcp_types.Resource) -> MCPResource:
    return MCPResource(str(item.uri), item.name, item.description, item.mime_type)


def template_of(item: mcp_types.ResourceTemplate) -> MCPResourceTemplate:
    return MCPResourceTemplate(item.uri_template, item.name, item.description, item.mime_type)


def prompt_of(item: mcp_types.Prompt) -> MCPPrompt:
    arguments = item.arguments or []
    return MCPPrompt(
        item.name,
        item.description,
        tuple(a.name for a in arguments),
        tuple(a.name for a in arguments if a.required),
    )


def resource_blocks(
    result: mcp_types.ReadResourceResult, max_chars: int, max_bytes: int, max_blocks: int
) -> tuple[ToolResultContent, ...]:
    """A resource's contents as text and image blocks, bounded like a tool result:
    text stays text, an image stays an image (when valid), a blob of a text MIME type
    becomes its text (when UTF-8), other binary data a line saying what it was."""
    contents = result.contents
    blocks: list[ToolResultContent] = []
    for item in contents[:max_blocks]:
        if isinstance(item, mcp_types.TextResourceContents):
            blocks.append(TextContent(item.text))
        else:
            blocks.append(blob(str(item.uri), item.blob, item.mime_type or ""))
    out = capped(blocks, max_chars, max_bytes)
    if len(contents) > max_blocks:
        dropped = len(contents) - max_blocks
        out.append(TextContent(f"[{dropped} more contents dropped: max_blocks={max_blocks}]"))
    return tuple(out)


def prompt_messages(
    result: mcp_types.GetPromptResult, max_chars: int, max_bytes: int, max_blocks: int
) -> tuple[Message, ...]:
    """A prompt's messages as user and assistant messages: at most ``max_blocks``
    of them, each bounded to its share of ``max_chars`` and ``max_bytes`` (so that
    all of them together are bounded like one tool result)."""
    messages = result.messages[:max_blocks]
    count = max(len(messages), 1)
    chars, room = max(max_chars // count, 1), max(max_bytes // count, 1)
    out = [_message(m.role, capped([block(m.content)], chars, room)) for m in messages]
    if len(result.messages) > max_blocks:
        dropped = len(result.messages) - max_blocks
        note = TextContent(f"[{dropped} more messages dropped: max_blocks={max_blocks}]")
        out.append(UserMessage((note,)))
    return tuple(out)


def _message(role: Any, content: Sequence[ToolResultContent]) -> Message:
    if role == "assistant":
        texts = [b.text if isinstance(b, TextContent) else "[image]" for b in content]
        return AssistantMessage((TextContent("".join(texts)),))
    blocks: tuple[TextContent | ImageContent, ...] = tuple(content)
    return UserMessage(blocks)
