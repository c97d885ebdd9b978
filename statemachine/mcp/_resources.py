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
from statemachine.errors import InvalidInputError
from statemachine.mcp._results import blob, block, capped

__all__ = [
    "MAX_COMPLETION_CHARS",
    "MAX_COMPLETION_VALUES",
    "MCPCompletion",
    "MCPPrompt",
    "MCPResource",
    "MCPResourceTemplate",
    "completion_of",
    "prompt_messages",
    "reference_of",
    "resource_blocks",
]

MAX_COMPLETION_VALUES = 100
"""Values of one ``completion/complete`` answer kept (the protocol's own maximum)."""
MAX_COMPLETION_CHARS = 1_000
"""Characters of one completion value; a longer value is dropped, not cut (a cut value
would be a wrong completion)."""


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


@attrs.frozen
class MCPCompletion:
    """A server's completions of a prompt's or a resource template's argument
    (``MCPServer.complete_argument``): at most ``MAX_COMPLETION_VALUES`` values, each
    at most ``MAX_COMPLETION_CHARS`` characters. ``total`` is how many the server says
    match (``None``: not said); ``has_more`` is true when it says more match than it
    sent, or when values were dropped here."""

    values: tuple[str, ...]
    total: int | None = None
    has_more: bool = False


def reference_of(
    of: MCPPrompt | MCPResourceTemplate,
) -> mcp_types.PromptReference | mcp_types.ResourceTemplateReference:
    """The protocol's reference to a prompt (by name) or a resource template (by its
    URI template), which ``completion/complete`` names."""
    if isinstance(of, MCPPrompt):
        return mcp_types.PromptReference(type="ref/prompt", name=of.name)
    if isinstance(of, MCPResourceTemplate):
        return mcp_types.ResourceTemplateReference(type="ref/resource", uri=of.uri_template)
    raise InvalidInputError(
        f"complete_argument completes an MCPPrompt or an MCPResourceTemplate, not {of!r}"
    )


def completion_of(result: mcp_types.CompleteResult) -> MCPCompletion:
    """The server's completions, bounded (``MCPCompletion``)."""
    said = result.completion
    values = said.values
    kept = tuple(v for v in values[:MAX_COMPLETION_VALUES] if len(v) <= MAX_COMPLETION_CHARS)
    total = said.total if said.total is not None and said.total >= 0 else None
    return MCPCompletion(kept, total, bool(said.has_more) or len(kept) < len(values))


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
