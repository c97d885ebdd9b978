"""Which format a transcript is in, from the evidence of its shape.

``detect_format`` and ``format_evidence`` (public through
``statemachine.testing.transcript``) read the request body's keys and every item's
role, keys and content block types; the signs of how tool calls are written outweigh
the others. ``unwrap`` finds the history inside a request body, for the detection and
for the checks alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from statemachine.core.messages import AssistantMessage, ToolResultMessage, UserMessage

__all__ = ["detect_format", "format_evidence", "split_evidence", "unwrap"]


def unwrap(messages: Any) -> Sequence[Any]:
    """The history: ``messages`` itself, or the list a request body wraps (a Responses
    ``input`` string is one user message); ``TypeError`` for anything else."""
    if isinstance(messages, Mapping):
        for key in ("messages", "input", "contents"):
            inner = messages.get(key)
            if key == "input" and isinstance(inner, str):
                return [{"role": "user", "content": inner}]  # the Responses shorthand
            if isinstance(inner, Sequence) and not isinstance(inner, (str, bytes)):
                return inner
        raise TypeError("a mapping must wrap the history as 'messages', 'input' or 'contents'")
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a sequence, got {type(messages).__name__}")
    return messages


def detect_format(messages: Any) -> str:
    """The format a history is in, from all the evidence of its shape: the request
    body's keys (``contents``, ``modelId``, ``input``, ``system``, the shape of
    ``tools``) and every item's role, keys and content block types. A history with
    evidence of exactly one format is in that format; a plain one (roles and text only,
    read alike by every format) is ``"openai"``. ``"unknown"`` when the evidence points
    to no format or to several: ``format_evidence`` says what it saw."""
    strong, weak = split_evidence(messages)
    for signs in (strong, weak):
        if len(signs) == 1:
            return next(iter(signs))
        if signs:
            return "unknown"
    return "unknown" if _unrecognised(messages) else "openai"


def format_evidence(messages: Any) -> dict[str, list[str]]:
    """For each format the history shows a sign of, the first signs (a few words each,
    e.g. ``"messages[2]: a toolUse block"``). Plain user/assistant/system messages with
    string content or ``text`` blocks are no sign of any format: every one reads them.
    The signs of how tool calls are written (``tool_calls``, ``tool_use`` blocks,
    ``toolUse`` blocks, ``functionCall`` parts, ``*_call`` items, ...) outweigh the
    others (a ``thinking`` block, a body key): ``detect_format`` looks at the others
    only when the tool calls show no format."""
    strong, weak = split_evidence(messages)
    merged = {fmt: list(signs) for fmt, signs in strong.items()}
    for fmt, signs in weak.items():
        merged.setdefault(fmt, []).extend(signs)
    return {fmt: signs[:3] for fmt, signs in merged.items()}


def split_evidence(messages: Any) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The signs of each format, split into the strong ones (how tool calls and
    results are written, the key that holds the history) and the weak ones."""
    strong: dict[str, list[str]] = {}
    weak: dict[str, list[str]] = {}

    def sign(fmt: str, where: str, is_strong: bool = False) -> None:
        signs = (strong if is_strong else weak).setdefault(fmt, [])
        if len(signs) < 3:
            signs.append(where)

    if isinstance(messages, Mapping):
        _wrapper_evidence(messages, sign)
    try:
        items = unwrap(messages)
    except TypeError:
        return strong, weak
    key = _items_key(messages)
    for i, item in enumerate(items):
        if i >= _EVIDENCE_ITEMS:
            break
        _item_evidence(item, f"{key}[{i}]", sign)
    return strong, weak


class _Sign(Protocol):
    def __call__(self, fmt: str, where: str, is_strong: bool = False) -> None: ...


_EVIDENCE_ITEMS = 10_000  # items looked at by format_evidence; the format shows early


def _items_key(messages: Any) -> str:
    if isinstance(messages, Mapping):
        return next((k for k in ("messages", "input", "contents") if k in messages), "messages")
    return "messages"


def _wrapper_evidence(body: Mapping[str, Any], sign: _Sign) -> None:
    if "contents" in body:
        sign("gemini", "the body's 'contents'", True)
    for key in ("systemInstruction", "system_instruction", "generationConfig"):
        if key in body:
            sign("gemini", f"the body's {key!r}")
    for key in ("modelId", "inferenceConfig", "additionalModelRequestFields"):
        if key in body:
            sign("bedrock-converse", f"the body's {key!r}")
    tool_config = body.get("toolConfig")  # Converse: the tools; Gemini: how to call them
    if isinstance(tool_config, Mapping) and "tools" in tool_config:
        sign("bedrock-converse", "the body's 'toolConfig' with 'tools'")
    if isinstance(body.get("input"), (list, str)) and "messages" not in body:
        sign("openai-responses", "the body's 'input'", True)
    for key in ("previous_response_id", "max_output_tokens"):
        if key in body:
            sign("openai-responses", f"the body's {key!r}")
    for key in ("anthropic_version", "stop_sequences", "mcp_servers", "container"):
        if key in body:
            sign("anthropic", f"the body's {key!r}")
    for key in ("max_completion_tokens", "response_format", "stream_options", "logprobs"):
        if key in body and "messages" in body:
            sign("openai", f"the body's {key!r}")
    for key in ("instructions", "store", "include", "text", "reasoning"):
        if key in body and "input" in body:
            sign("openai-responses", f"the body's {key!r}")
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") in ("auto", "any", "tool", "none"):
        sign("anthropic", f"the body's tool_choice of type {choice['type']!r}")
    system = body.get("system")
    if isinstance(system, str):
        sign("anthropic", "a 'system' string in the body")
    elif isinstance(system, list) and system and isinstance(system[0], Mapping):
        if "type" in system[0]:
            sign("anthropic", "typed 'system' blocks in the body")
        elif "text" in system[0]:
            sign("bedrock-converse", "untyped 'system' blocks in the body")
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping):
            continue
        if "toolSpec" in tool:
            sign("bedrock-converse", "a 'toolSpec' tool")
        elif "functionDeclarations" in tool or "function_declarations" in tool:
            sign("gemini", "a 'functionDeclarations' tool")
        elif "input_schema" in tool:
            sign("anthropic", "a tool with 'input_schema'")
        elif tool.get("type") == "function" and "function" in tool:
            sign("openai", "a Chat Completions function tool")
        elif tool.get("type") == "function" and "name" in tool:
            sign("openai-responses", "a Responses function tool")


_ANTHROPIC_ONLY = frozenset(
    {
        "tool_use",
        "tool_result",
        "server_tool_use",
        "mcp_tool_use",
        "thinking",
        "redacted_thinking",
        "document",
        "image",
        "search_result",
    }
)
_ANTHROPIC_TOOLS = frozenset({"tool_use", "tool_result", "server_tool_use", "mcp_tool_use"})
_OPENAI_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
_RESPONSES_PARTS = frozenset(
    {"input_text", "output_text", "input_image", "input_file", "input_audio", "refusal"}
)
_RESPONSES_ITEMS = frozenset({"message", "reasoning", "item_reference", "compaction"})
_CONVERSE_KEYS = frozenset(
    {
        "toolUse",
        "toolResult",
        "reasoningContent",
        "cachePoint",
        "guardContent",
        "citationsContent",
        "video",
    }
)
_GEMINI_KEYS = frozenset(
    {
        "functionCall",
        "function_call",
        "functionResponse",
        "function_response",
        "inlineData",
        "inline_data",
        "fileData",
        "file_data",
        "thought",
        "thoughtSignature",
        "thought_signature",
        "executableCode",
        "codeExecutionResult",
    }
)


def _item_evidence(item: Any, where: str, sign: _Sign) -> None:
    if isinstance(item, (UserMessage, AssistantMessage, ToolResultMessage)):
        sign("statemachine", f"{where}: a statemachine message", True)
        return
    if not isinstance(item, Mapping):
        return
    role = item.get("role")
    kind = item.get("type")
    if role == "toolResult" or "stopReason" in item or "toolCallId" in item:
        sign("statemachine", f"{where}: a statemachine wire message", True)
    if "parts" in item or role == "model":
        sign("gemini", f"{where}: 'parts' or the role 'model'", True)
    if isinstance(kind, str) and (
        kind.endswith("_call") or kind.endswith("_output") or kind in _RESPONSES_ITEMS
    ):
        sign("openai-responses", f"{where}: a {kind!r} item", True)
    if "tool_calls" in item or "function_call" in item or role in ("tool", "function"):
        what = "tool_calls" if "tool_calls" in item else f"role {role!r}"
        sign("openai", f"{where}: {what}", True)
    content = item.get("content")
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, Mapping):
            continue
        btype = block.get("type")
        if btype is not None and not isinstance(btype, str):
            continue  # unreadable: the format's reader says so
        if btype is None:
            if "toolUse" in block or "toolResult" in block:
                sign("bedrock-converse", f"{where}: a {next(iter(block))!r} block", True)
            elif _CONVERSE_KEYS.intersection(block) or (
                set(block) <= {"text", "image", "document"} and block
            ):
                sign("bedrock-converse", f"{where}: an untyped {next(iter(block))!r} block")
        elif btype in _ANTHROPIC_TOOLS:
            sign("anthropic", f"{where}: a {btype!r} block", True)
        elif btype in _ANTHROPIC_ONLY:
            sign("anthropic", f"{where}: a {btype!r} block")
        elif btype == "toolCall":
            sign("statemachine", f"{where}: a 'toolCall' block", True)
        elif btype in _RESPONSES_PARTS and btype not in _OPENAI_PARTS:
            sign("openai-responses", f"{where}: an {btype!r} part")
        elif btype in _OPENAI_PARTS and btype not in _RESPONSES_PARTS:
            sign("openai", f"{where}: an {btype!r} part")
    parts = item.get("parts")
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, Mapping) and _GEMINI_KEYS.intersection(part):
            # "parts" already signed Gemini strongly
            sign("gemini", f"{where}: a {sorted(_GEMINI_KEYS.intersection(part))[0]!r} part")
            break


def _unrecognised(messages: Any) -> bool:
    """Whether a history without a sign of any format still holds something no format
    reads: a role none of them has, or an item that is not a message."""
    try:
        items = unwrap(messages)
    except TypeError:
        return False
    known = ("user", "assistant", "system", "developer", None)
    return any(
        not isinstance(item, Mapping) or item.get("role") not in known
        for item in items[:_EVIDENCE_ITEMS]
    )
