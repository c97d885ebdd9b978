"""The OpenAI Responses API's ``input``, built from our history (the projection
``openai_responses`` describes): reasoning items carried in a ``ThinkingContent``
signature, function calls with their item ids, and their outputs."""

from __future__ import annotations

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
    ToolResultMessage,
    UserMessage,
    thaw_json,
)
from statemachine.core.tools import ToolDefinition
from statemachine.providers._projection import media_parts, normalise_id, sendable_history

__all__ = [
    "MAX_ID_LENGTH",
    "SIGNATURE_PREFIX",
    "project_input",
    "project_tools",
    "reasoning_signature",
    "split_call_id",
]

MAX_ID_LENGTH = 64
SIGNATURE_PREFIX = "openai-responses:"


def reasoning_signature(
    item: Mapping[str, Any], follower: Mapping[str, Any] | None = None
) -> str | None:
    """The ``ThinkingContent.signature`` that carries a reasoning item across turns:
    ``openai-responses:`` and a JSON object with the item id, the encrypted content,
    the summary parts and, when the item that followed it
    was a message, that message's id (and ``phase``), without which the API refuses
    the reasoning item ("provided without its required following item"). ``None``
    without encrypted content: such an item cannot be sent back when nothing is
    stored."""
    encrypted = item.get("encrypted_content")
    if not isinstance(encrypted, str) or not encrypted:
        return None
    kept: dict[str, Any] = {"id": item.get("id"), "encrypted_content": encrypted}
    kept["summary"] = [
        s.get("text", "") for s in item.get("summary") or () if isinstance(s, Mapping)
    ]
    if follower is not None and follower.get("type") == "message":
        message = {"id": follower.get("id")}
        if isinstance(follower.get("phase"), str):
            message["phase"] = follower["phase"]
        kept["message"] = message
    return SIGNATURE_PREFIX + json.dumps(kept, ensure_ascii=False, separators=(",", ":"))


def _signature_fields(block: ThinkingContent) -> dict[str, Any] | None:
    signature = block.signature or ""
    if not signature.startswith(SIGNATURE_PREFIX):
        return None
    try:
        kept = json.loads(signature[len(SIGNATURE_PREFIX) :])
    except json.JSONDecodeError:
        return None
    if not isinstance(kept, dict) or not isinstance(kept.get("encrypted_content"), str):
        return None
    return kept


def _reasoning_item(block: ThinkingContent, kept: Mapping[str, Any]) -> dict[str, Any]:
    # The summary goes back as the provider wrote it (the thinking text may be the
    # model's raw reasoning, which is no summary).
    parts = kept.get("summary")
    if not isinstance(parts, list):
        parts = [block.thinking] if block.thinking else []
    item: dict[str, Any] = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": str(p)} for p in parts],
        "encrypted_content": kept["encrypted_content"],
    }
    if isinstance(kept.get("id"), str):
        item["id"] = kept["id"]
    return item


def split_call_id(tool_call_id: str) -> tuple[str, str | None]:
    """``(call_id, item_id)`` from a ``ToolCall.id`` this adapter made
    (``"call_...|fc_..."``); other ids are the call id alone."""
    call_id, bar, item_id = tool_call_id.rpartition("|")
    if bar and call_id and item_id.startswith("fc"):
        return call_id, item_id
    return tool_call_id, None


def _call_id(tool_call_id: str) -> str:
    return normalise_id(split_call_id(tool_call_id)[0], MAX_ID_LENGTH)


def _data_url(block: ImageContent) -> str:
    return f"data:{block.mime_type};base64,{block.data}"


def _parts(content: Sequence[TextContent | ImageContent]) -> list[dict[str, Any]]:
    return media_parts(
        content,
        lambda text: {"type": "input_text", "text": text},
        lambda image: {"type": "input_image", "image_url": _data_url(image), "detail": "auto"},
    )


def _call_item(block: ToolCall) -> dict[str, Any]:
    call_id, item_id = split_call_id(block.id)
    call: dict[str, Any] = {
        "type": "function_call",
        "call_id": normalise_id(call_id, MAX_ID_LENGTH),
        "name": block.name,
        "arguments": json.dumps(
            thaw_json(block.arguments), ensure_ascii=False, separators=(",", ":")
        ),
    }
    if item_id is not None:
        call["id"] = item_id
    return call


def _assistant_items(message: AssistantMessage) -> list[dict[str, Any]]:
    """The items of one assistant message. A reasoning item goes back only together
    with the item that followed it, under that item's id (the API refuses it
    otherwise): a message whose id the signature kept, or a call of this API."""
    items: list[dict[str, Any]] = []
    content = [b for b in message.content if not (isinstance(b, TextContent) and not b.text)]
    at = 0
    while at < len(content):
        block = content[at]
        after = content[at + 1] if at + 1 < len(content) else None
        at += 1
        if isinstance(block, ThinkingContent):
            kept = _signature_fields(block)
            if kept is None:
                continue  # cannot be carried: see the module docstring
            follower = kept.get("message")
            if isinstance(after, TextContent) and isinstance(follower, Mapping):
                items.append(_reasoning_item(block, kept))
                items.append(_output_message(after.text, follower))
                at += 1  # that text is sent
            elif isinstance(after, ToolCall) and split_call_id(after.id)[1] is not None:
                items.append(_reasoning_item(block, kept))
        elif isinstance(block, TextContent):
            items.append({"role": "assistant", "content": block.text})
        elif isinstance(block, ToolCall):
            items.append(_call_item(block))
    return items


def _output_message(text: str, follower: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    if isinstance(follower.get("id"), str):
        message["id"] = follower["id"]
    if isinstance(follower.get("phase"), str):
        message["phase"] = follower["phase"]
    return message


def _result_item(message: ToolResultMessage) -> dict[str, Any]:
    output: str | list[dict[str, Any]]
    if any(isinstance(b, ImageContent) for b in message.content):
        output = _parts(message.content)
        if message.is_error:
            output.insert(0, {"type": "input_text", "text": "Error:"})
    else:
        text = message.text or "(no output)"
        output = f"Error: {text}" if message.is_error else text
    return {
        "type": "function_call_output",
        "call_id": _call_id(message.tool_call_id),
        "output": output,
    }


def project_input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Our history as the Responses ``input`` list (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for message in sendable_history(messages):
        if isinstance(message, UserMessage):
            content = message.content
            if len(content) == 1 and isinstance(content[0], TextContent) and content[0].text:
                out.append({"role": "user", "content": content[0].text})
            else:
                parts = _parts(content)
                out.append({"role": "user", "content": parts or "(empty message)"})
        elif isinstance(message, AssistantMessage):
            out.extend(_assistant_items(message))
        else:
            out.append(_result_item(message))
    return out


def project_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Our tool definitions as Responses ``tools`` (function tools, not strict: our
    schemas need not meet the rules of OpenAI's strict mode)."""
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.schema_dict(),
            "strict": False,
        }
        for t in tools
    ]
