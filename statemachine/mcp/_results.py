"""What an MCP server's answers become: tool result blocks, bounded and checked."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable
from typing import Any

import mcp.types as mcp_types

from statemachine.core.messages import ImageContent, TextContent, ToolResultContent
from statemachine.core.tools import ToolOutput

# A MIME type of the image/* family: ``image/`` and an RFC 6838 subtype name.
IMAGE_MIME = re.compile(r"image/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")
# How much of a server's or the SDK's error text an MCPError quotes.
CAUSE_CHARS = 300


def describe(exc: BaseException) -> str:
    """A short account of an exception: the leaves of a group, the first line of each."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(describe(e) for e in exc.exceptions))
    errors = getattr(exc, "errors", None)
    text = ""
    if callable(errors):  # pydantic's ValidationError: its first error's message
        try:
            text = str(errors()[0]["msg"])
        except Exception:  # noqa: BLE001 - any other errors() is not pydantic's
            text = ""
    if not text and str(exc).strip():
        text = str(exc).strip().splitlines()[0]
    name = type(exc).__name__
    text = f"{name}: {text}" if text else name
    return text if len(text) <= CAUSE_CHARS else text[:CAUSE_CHARS] + "..."


def block(item: Any) -> ToolResultContent:
    if isinstance(item, mcp_types.TextContent):
        return TextContent(item.text)
    if isinstance(item, mcp_types.ImageContent):
        return image(item.data, item.mime_type)
    if isinstance(item, mcp_types.AudioContent):
        return TextContent(f"[audio: {item.mime_type}, {len(item.data)} base64 characters]")
    if isinstance(item, mcp_types.ResourceLink):
        return TextContent(f"[resource link: {item.uri}]")
    if isinstance(item, mcp_types.EmbeddedResource):
        resource = item.resource
        if isinstance(resource, mcp_types.TextResourceContents):
            return TextContent(resource.text)
        return TextContent(f"[resource: {resource.uri}, {resource.mime_type or 'binary'}]")
    return TextContent(f"[{getattr(item, 'type', type(item).__name__)} content]")


def image(data: str, mime_type: str) -> ToolResultContent:
    """An image block, or a line saying why the server's image was refused."""
    if not IMAGE_MIME.fullmatch(mime_type):
        return TextContent(f"[image refused: MIME type {mime_type[:60]!r} is not image/*]")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return TextContent(f"[image refused ({mime_type}): its data is not base64]")
    return ImageContent(data, mime_type)


def capped(
    blocks: Iterable[ToolResultContent], max_chars: int, max_bytes: int
) -> list[ToolResultContent]:
    """The blocks with their text cut to ``max_chars`` characters in all and the
    whole cut to ``max_bytes`` bytes (text in UTF-8, image data as sent), saying so."""
    out: list[ToolResultContent] = []
    chars, room = max_chars, max_bytes
    cut_chars = cut_bytes = dropped_images = 0
    for block in blocks:
        if isinstance(block, ImageContent):
            if len(block.data) <= room:
                out.append(block)
                room -= len(block.data)
            else:
                dropped_images += 1
                cut_bytes += len(block.data)
            continue
        assert isinstance(block, TextContent)
        text = block.text
        if len(text) > chars:
            cut_chars += len(text) - chars
            text = text[:chars]
        chars -= len(text)
        encoded = text.encode("utf-8", "surrogatepass")
        if len(encoded) > room:
            cut_bytes += len(encoded) - room
            text = encoded[:room].decode("utf-8", "ignore")
            encoded = text.encode("utf-8", "surrogatepass")
        room -= len(encoded)
        if text or not block.text:
            out.append(TextContent(text) if text is not block.text else block)
    if cut_chars:
        out.append(TextContent(f"[{cut_chars} more characters cut: max_output_chars={max_chars}]"))
    if cut_bytes:
        images = f", {dropped_images} images dropped" if dropped_images else ""
        out.append(
            TextContent(f"[{cut_bytes} more bytes cut{images}: max_output_bytes={max_bytes}]")
        )
    return out


def tool_output(
    result: mcp_types.CallToolResult, max_chars: int, max_bytes: int, max_blocks: int
) -> ToolOutput:
    """A tool call's result, bounded: at most ``max_blocks`` blocks (the rest dropped,
    saying so), text and bytes capped (``capped``); structured content without blocks
    becomes its JSON."""
    items = result.content
    blocks = [block(item) for item in items[:max_blocks]]
    if not blocks and result.structured_content is not None:
        blocks.append(TextContent(json.dumps(result.structured_content, ensure_ascii=False)))
    if not blocks:
        blocks.append(TextContent("(no content)"))
    out = capped(blocks, max_chars, max_bytes)
    if len(items) > max_blocks:
        dropped = len(items) - max_blocks
        out.append(TextContent(f"[{dropped} more content blocks dropped: max_blocks={max_blocks}]"))
    return ToolOutput(out, is_error=bool(result.is_error))
