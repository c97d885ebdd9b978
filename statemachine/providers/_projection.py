"""What every adapter shares between our history and a provider's wire format.

Outbound, ``sendable_history`` reduces a history to what any provider accepts, in a
shape each adapter can translate one message at a time:

* An assistant message that ended in ``error`` is dropped whole: its content may be
  cut off anywhere, and a provider would take it as the model's own words.
* One that ended in ``aborted`` keeps its text (the person saw it; the model should
  too) but loses its thinking (a cut-off thinking block has no valid signature) and
  its tool calls (they never ran). The results the engine gave those calls are
  dropped with them, so no result is left without its call.
* Every remaining tool call is followed directly by its results, in call order;
  user messages that arrived between a call and its result move after the results
  (the APIs require the results first). The engine keeps I1 by construction; for a
  history built by hand, a call without a result gets an error result saying so and
  a result without a call is dropped, because a request the provider refuses helps
  nobody.

``alternating_turns`` lays a history out for the APIs whose roles alternate and that
want the user first (Anthropic's Messages, Bedrock's Converse); ``media_parts`` turns
a message's text and image blocks into a provider's parts, with the one rule they
share (empty text is left out). ``function_tools`` is the tool list of OpenAI's Chat
Completions, which its compatible servers and Ollama take too.

Inbound, ``MessageBuilder`` reassembles a stream (text and thinking deltas, tool-call
argument fragments) into one ``AssistantMessage``, and ``parse_arguments`` turns the
argument text into a JSON object without ever raising: text that is not one becomes
a call with empty arguments and a ``parse_error`` that names the problem and quotes
the text. The engine answers such a call with an error result and never runs it.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from statemachine.core.messages import (
    AssistantContent,
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from statemachine.core.tools import ToolDefinition
from statemachine.errors import WireFormatError

__all__ = [
    "Block",
    "MessageBuilder",
    "add_turn",
    "alternating_turns",
    "foreign_signature",
    "function_tools",
    "generated_call_id",
    "media_parts",
    "normalise_id",
    "parse_arguments",
    "sendable_history",
]

_ID_OK = re.compile(r"[A-Za-z0-9_-]+")


def normalise_id(raw: str, max_length: int) -> str:
    """``raw`` if a provider accepts it as a tool-call id, else a stable substitute.

    The substitute depends only on ``raw``, so a call and its result map to the same
    id in every request, and a provider's prompt cache stays valid.
    """
    if raw and len(raw) <= max_length and _ID_OK.fullmatch(raw):
        return raw
    digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:12]
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", raw)[: max_length - len(digest) - 1]
    return f"{clean}_{digest}" if clean.strip("_") else f"call_{digest}"


# Signatures our adapters write for providers whose reasoning is not a plain signed
# block: a provider that takes signed thinking (Anthropic, Bedrock) must not send
# these as its own.
_TAGGED_SIGNATURES = ("openai-responses:", "gemini:")


def foreign_signature(signature: str) -> bool:
    """Whether ``signature`` is one of the tagged signatures another adapter wrote."""
    return signature.startswith(_TAGGED_SIGNATURES)


def generated_call_id(prefix: str = "call_") -> str:
    """A new call id, for a call the provider sent without one (or with one it had
    already used in the same response): unique, and valid for every provider."""
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """The JSON object in ``raw`` and ``None``, or ``{}`` and why ``raw`` is not one.

    Never raises. Empty text is ``{}`` (servers send it for tools that take no
    arguments). The reason names the parse problem and quotes the start of the text,
    so the model, which reads it in the call's error result, can see what it sent.
    """
    if not raw.strip():
        return {}, None
    problem: str
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except (ValueError, RecursionError) as exc:
        problem = f"not valid JSON ({exc})"
    else:
        if isinstance(value, dict):
            return value, None
        problem = f"a JSON {type(value).__name__} where an object was expected"
    return {}, _quoting(problem, raw)


def _quoting(problem: str, raw: str) -> str:
    excerpt = raw if len(raw) <= _QUOTE_LIMIT else raw[:_QUOTE_LIMIT] + "\u2026"
    return f"the arguments are {problem}: {excerpt}"


_QUOTE_LIMIT = 2000


# -- outbound -------------------------------------------------------------------------


_MISSING_RESULT = (
    "No result was recorded for this tool call (the history was missing it); "
    "the call may not have run."
)


def sendable_history(messages: Sequence[Message]) -> list[Message]:
    """The history reduced to what every provider accepts (see the module docstring)."""
    dropped_calls: set[str] = set()
    kept: list[Message] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            if message.stop_reason in (StopReason.ERROR, StopReason.ABORTED):
                dropped_calls.update(call.id for call in message.tool_calls)
                if message.stop_reason is StopReason.ERROR:
                    continue
                text = tuple(b for b in message.content if isinstance(b, TextContent) and b.text)
                if not text:
                    continue
                message = attrs.evolve(message, content=text)
            kept.append(message)
        elif isinstance(message, ToolResultMessage):
            if message.tool_call_id not in dropped_calls:
                kept.append(message)
        else:
            kept.append(message)

    out: list[Message] = []
    index = 0
    while index < len(kept):
        message = kept[index]
        index += 1
        if not (isinstance(message, AssistantMessage) and message.tool_calls):
            if not isinstance(message, ToolResultMessage):
                out.append(message)  # a result with no call before it is dropped
            continue
        # Gather everything up to the next assistant message.
        segment: list[Message] = []
        while index < len(kept) and not isinstance(kept[index], AssistantMessage):
            segment.append(kept[index])
            index += 1
        results = {m.tool_call_id: m for m in segment if isinstance(m, ToolResultMessage)}
        out.append(message)
        for call in message.tool_calls:
            result = results.get(call.id)
            if result is None:
                result = ToolResultMessage(call.id, call.name, _MISSING_RESULT, is_error=True)
            out.append(result)
        out.extend(m for m in segment if isinstance(m, UserMessage))
    return out


def function_tools(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    """Our tool definitions as Chat Completions ``tools`` (the ``function`` kind)."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.schema_dict(),
            },
        }
        for t in tools
    ]


def media_parts(
    content: Sequence[TextContent | ImageContent],
    text: Callable[[str], dict[str, Any]],
    image: Callable[[ImageContent], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Text and image blocks as a provider's parts: each text through ``text`` (an empty
    one is left out, the APIs refuse empty text), each image through ``image``."""
    return [
        image(block) if isinstance(block, ImageContent) else text(block.text)
        for block in content
        if isinstance(block, ImageContent) or block.text
    ]


def add_turn(
    out: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]], key: str = "content"
) -> None:
    """``blocks`` of ``role`` added to ``out``: to its last entry when that has the same
    role (the APIs want the roles to alternate), else as a new entry; none, nothing."""
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1][key].extend(blocks)
    else:
        out.append({"role": role, key: blocks})


def alternating_turns(
    messages: Sequence[Message],
    text: Callable[[str], dict[str, Any]],
    image: Callable[[ImageContent], dict[str, Any]],
    assistant: Callable[[AssistantMessage], list[dict[str, Any]]],
    result: Callable[[ToolResultMessage, list[dict[str, Any]]], dict[str, Any]],
) -> list[dict[str, Any]]:
    """``sendable_history(messages)`` as ``{"role", "content"}`` entries for the APIs
    whose roles alternate and that want the user to open (Anthropic's Messages,
    Bedrock's Converse).

    A user message's blocks are its parts (``media_parts`` with ``text`` and ``image``),
    or ``(empty message)``: the APIs refuse empty content, and the model should still
    see that a turn of the person's passed. An assistant message's come from
    ``assistant``. A tool result is the user's: ``result(message, content)``, its
    content made as a user message's (``(no output)`` when empty). Consecutive messages
    of one role share an entry, so the results of a call come first in the user entry
    after it; a message with no blocks is left out; and a history that would begin
    with the assistant opens with ``(conversation start)``.
    """
    out: list[dict[str, Any]] = []
    for message in sendable_history(messages):
        if isinstance(message, UserMessage):
            parts = media_parts(message.content, text, image) or [text("(empty message)")]
            role, blocks = "user", parts
        elif isinstance(message, AssistantMessage):
            role, blocks = "assistant", assistant(message)
        else:
            parts = media_parts(message.content, text, image) or [text("(no output)")]
            role, blocks = "user", [result(message, parts)]
        add_turn(out, role, blocks)
    if out and out[0]["role"] == "assistant":
        out.insert(0, {"role": "user", "content": [text("(conversation start)")]})
    return out


# -- inbound --------------------------------------------------------------------------


def _tool_call(call_id: str, name: str, raw: str) -> ToolCall:
    arguments, problem = parse_arguments(raw)
    if problem is not None:
        return ToolCall(call_id, name, parse_error=problem)
    try:
        return ToolCall(call_id, name, arguments)
    except (WireFormatError, RecursionError) as exc:
        # Valid JSON that our messages cannot hold (nested too deeply to freeze).
        problem = f"JSON that cannot be used as arguments ({type(exc).__name__})"
        return ToolCall(call_id, name, parse_error=_quoting(problem, raw))


@attrs.define
class Block:
    """One block of a streamed response as it is built (``MessageBuilder``)."""

    kind: str  # "text", "thinking" or "tool"
    text: list[str] = attrs.Factory(list)
    signature: str | None = None
    redacted: bool = False  # thinking the provider encrypted; ``signature`` holds it
    call_id: str = ""
    name: str = ""


@attrs.define
class MessageBuilder:
    """Accumulates one streamed response. Blocks are addressed by the provider's
    index (OpenAI tool-call index, Anthropic content-block index) and kept in the
    order they first appeared."""

    on_text: Callable[[str], None] | None = None
    # Told each fragment of a call's arguments: (index, call id, name, fragment).
    on_call: Callable[[int, str, str, str], None] | None = None
    blocks: list[Block] = attrs.Factory(list)
    _by_key: dict[tuple[str, int], Block] = attrs.Factory(dict)

    def block(self, key: tuple[str, int], kind: str) -> Block:
        """The block at ``key``, created on first use."""
        found = self._by_key.get(key)
        if found is None:
            found = Block(kind)
            self._by_key[key] = found
            self.blocks.append(found)
        return found

    def restart(self, key: tuple[str, int], kind: str) -> Block:
        """A new block at ``key``, leaving the old one where it was (for servers that
        reuse an index for a second, different call)."""
        self._by_key.pop(key, None)
        return self.block(key, kind)

    def append_text(self, text: str) -> None:
        """Text with no index of its own (OpenAI): extends the last block if it is
        text, so that text after a tool call starts a new block."""
        if not text:
            return
        if not self.blocks or self.blocks[-1].kind != "text":
            self.blocks.append(Block("text"))
        self.blocks[-1].text.append(text)
        if self.on_text is not None:
            self.on_text(text)

    def add_arguments(self, block: Block, text: str) -> None:
        """A fragment of a tool call's argument text."""
        block.text.append(text)
        if self.on_call is not None and text:
            self.on_call(self.blocks.index(block), block.call_id, block.name, text)

    def add_text(self, block: Block, text: str) -> None:
        block.text.append(text)
        if self.on_text is not None and block.kind == "text" and text:
            self.on_text(text)

    def content(self, *, with_calls: bool) -> tuple[AssistantContent, ...]:
        out: list[AssistantContent] = []
        for block in self.blocks:
            text = "".join(block.text)
            if block.kind == "text":
                if text:
                    out.append(TextContent(text))
            elif block.kind == "thinking":
                if text or block.signature:
                    out.append(ThinkingContent(text, block.signature, redacted=block.redacted))
            elif with_calls:
                out.append(_tool_call(block.call_id, block.name, text))
        return tuple(out)

    def unique_call_ids(self) -> None:
        """Give each call without an id, or with one an earlier call of this response
        has, a new id (``generated_call_id``), so that every result finds its call."""
        seen: set[str] = set()
        for block in self.blocks:
            if block.kind != "tool":
                continue
            if not block.call_id or block.call_id in seen:
                block.call_id = generated_call_id()
            seen.add(block.call_id)

    def finish(
        self, stop_reason: StopReason, usage: Usage | None, error_message: str | None = None
    ) -> AssistantMessage:
        """The complete message."""
        return AssistantMessage(
            self.content(with_calls=True),
            stop_reason=stop_reason,
            error_message=error_message,
            usage=usage,
        )

    def aborted(self, usage: Usage | None) -> AssistantMessage:
        """What had arrived when the signal aborted: text and thinking, no tool call
        (a call may be cut off mid-argument, and an aborted response runs none)."""
        return AssistantMessage(
            self.content(with_calls=False),
            stop_reason=StopReason.ABORTED,
            error_message="aborted while the response was streaming",
            usage=usage,
        )
