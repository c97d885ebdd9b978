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
# MIME types whose bytes are text: a blob of one becomes a text block.
TEXT_MIME = re.compile(
    r"text/.*|application/(json|xml|yaml|x-yaml|javascript|toml|x-sh|sql)|.*\+(json|xml)",
    re.IGNORECASE,
)
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
        return blob(str(resource.uri), resource.blob, resource.mime_type or "")
    return TextContent(f"[{getattr(item, 'type', type(item).__name__)} content]")


def blob(uri: str, data: str, mime_type: str) -> ToolResultContent:
    """A blob's block: an image stays an image (``image``), bytes of a text MIME type
    that are UTF-8 become text, anything else a line saying what it was. Its size is
    bounded by the result's bounds after (``capped``); base64 of more than
    ``MAX_BLOB_CHARS`` characters is not even decoded."""
    if mime_type.startswith("image/"):
        return image(data, mime_type)
    kind = mime_type or "binary"
    if TEXT_MIME.fullmatch(mime_type) and len(data) <= MAX_BLOB_CHARS:
        try:
            return TextContent(base64.b64decode(data, validate=True).decode("utf-8"))
        except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
            return TextContent(f"[resource: {uri[:200]}, {kind[:60]}: not base64 UTF-8 text]")
    size = len(data) * 3 // 4 - data[-2:].count("=")  # what the base64 holds, undecoded
    return TextContent(f"[resource: {uri[:200]}, {kind[:60]}, {size} bytes]")


MAX_BLOB_CHARS = 32 * 1024 * 1024
"""Characters of base64 (24 MiB of bytes) a text blob may have to be decoded."""


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
