"""``check_transcript``: the history invariants over any transcript, ours or a provider's.

Three formats are read:

* ``"statemachine"``: our message objects, or their wire dicts (camelCase, see
  ``statemachine._messages``). Checked by ``statemachine._invariants.history_violations``, the same
  definition the engine uses to refuse an invalid input history.
* ``"openai"``: Chat Completions histories: assistant messages with ``tool_calls``
  (``{"id", "type": "function", "function": {"name", "arguments"}}``), answered by
  ``{"role": "tool", "tool_call_id", "content"}`` messages. ``system`` and
  ``developer`` messages are allowed anywhere.
* ``"anthropic"``: Messages API histories: ``tool_use`` blocks in assistant
  content, answered by ``tool_result`` blocks (``tool_use_id``, ``is_error``) in the
  next user message.

Provider formats are converted to our messages (the neutral form) while keeping,
for every converted message, the index of the message it came from, so a violation
names the index in the caller's own list. On top of the shared checks, each provider
has an adjacency rule its API enforces: OpenAI wants the ``tool`` messages directly
after the assistant message, Anthropic wants every result in the very next user
message. A message that cannot be read at all is reported (invariant ``"format"``)
rather than raised, so one bad entry does not hide the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from .._errors import WireFormatError
from .._invariants import Violation, history_violations
from .._messages import (
    AssistantMessage,
    Message,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    message_from_dict,
)

__all__ = ["TranscriptFormat", "check_transcript", "render_transcript"]

TranscriptFormat = Literal["statemachine", "openai", "anthropic"]

_Converted = tuple[list[Message], list[int], list[Violation]]


def check_transcript(
    messages: Sequence[Any], format: TranscriptFormat = "statemachine"
) -> list[Violation]:
    """Every pairing and order violation in a transcript, each with the invariant it
    breaks (``"I1"``, ``"I2"``), the index of the message where it shows, and a
    sentence. An empty list means the transcript is valid.

    Catches at least: a call without a result, two results for one call, a result
    without a call, results out of call order, a result after the next assistant
    message, and duplicate (or empty) call ids.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a sequence, got {type(messages).__name__}")
    if format == "statemachine":
        neutral, origin, problems = _from_statemachine(messages)
    elif format == "openai":
        neutral, origin, problems = _from_openai(messages)
    elif format == "anthropic":
        neutral, origin, problems = _from_anthropic(messages)
    else:
        raise ValueError(
            f"unknown transcript format {format!r}: use 'statemachine', 'openai' or 'anthropic'"
        )
    out = list(problems)
    for v in history_violations(neutral):
        index = origin[v.index] if 0 <= v.index < len(origin) else v.index
        out.append(Violation(v.invariant, index, _renumber(v.message, origin)))
    if format != "statemachine":
        out += _adjacency(neutral, origin, format)
    return sorted(out, key=lambda v: (v.index, v.invariant, v.message))


def _renumber(sentence: str, origin: list[int]) -> str:
    # history_violations names other messages as "message N" in neutral numbering.
    def sub(match: re.Match[str]) -> str:
        n = int(match.group(1))
        return f"message {origin[n] if 0 <= n < len(origin) else n}"

    return re.sub(r"message (\d+)", sub, sentence)


# -- our format ----------------------------------------------------------------------


def _from_statemachine(messages: Sequence[Any]) -> _Converted:
    neutral: list[Message] = []
    origin: list[int] = []
    problems: list[Violation] = []
    for i, item in enumerate(messages):
        if isinstance(item, (UserMessage, AssistantMessage, ToolResultMessage)):
            neutral.append(item)
            origin.append(i)
        elif isinstance(item, Mapping):
            try:
                neutral.append(message_from_dict(item, path=f"messages[{i}]"))
                origin.append(i)
            except WireFormatError as exc:
                problems.append(Violation("format", i, str(exc)))
        else:
            problems.append(
                Violation("format", i, f"a {type(item).__name__} is not a message or a wire dict")
            )
    return neutral, origin, problems


# -- OpenAI Chat Completions ---------------------------------------------------------------


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return ""


def _arguments(raw: Any) -> Mapping[str, Any]:
    # Arguments that are not a JSON object are the tool's problem, not the pairing's.
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return raw if isinstance(raw, Mapping) else {}


def _from_openai(messages: Sequence[Any]) -> _Converted:
    neutral: list[Message] = []
    origin: list[int] = []
    problems: list[Violation] = []
    names: dict[str, str] = {}
    for i, item in enumerate(messages):
        if not isinstance(item, Mapping):
            problems.append(Violation("format", i, f"a {type(item).__name__} is not a message"))
            continue
        role = item.get("role")
        if role in ("system", "developer"):
            continue
        if role == "user":
            neutral.append(UserMessage(_text_of(item.get("content"))))
        elif role == "assistant":
            content: list[Any] = []
            text = _text_of(item.get("content"))
            if text:
                content.append(TextContent(text))
            for j, call in enumerate(item.get("tool_calls") or ()):
                function = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(function, Mapping) or not isinstance(call.get("id"), str):
                    problems.append(
                        Violation("format", i, f"tool_calls[{j}] has no string id or no function")
                    )
                    continue
                name = str(function.get("name", ""))
                names.setdefault(call["id"], name)
                content.append(ToolCall(call["id"], name, _arguments(function.get("arguments"))))
            neutral.append(AssistantMessage(tuple(content)))
        elif role == "tool":
            call_id = item.get("tool_call_id")
            if not isinstance(call_id, str):
                problems.append(Violation("format", i, "a tool message without a tool_call_id"))
                continue
            name = names.get(call_id, str(item.get("name", "")))
            neutral.append(ToolResultMessage(call_id, name, _text_of(item.get("content"))))
        else:
            problems.append(Violation("format", i, f"unknown role {role!r}"))
            continue
        origin.append(i)
    return neutral, origin, problems


# -- Anthropic Messages -------------------------------------------------------------------


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, Sequence) else []


def _from_anthropic(messages: Sequence[Any]) -> _Converted:
    neutral: list[Message] = []
    origin: list[int] = []
    problems: list[Violation] = []
    names: dict[str, str] = {}
    for i, item in enumerate(messages):
        if not isinstance(item, Mapping):
            problems.append(Violation("format", i, f"a {type(item).__name__} is not a message"))
            continue
        role = item.get("role")
        blocks = _blocks(item.get("content"))
        if role == "assistant":
            content: list[Any] = []
            for block in blocks:
                if not isinstance(block, Mapping):
                    continue
                if block.get("type") == "text" and isinstance(block.get("text"), str):
                    content.append(TextContent(block["text"]))
                elif block.get("type") == "tool_use":
                    if not isinstance(block.get("id"), str):
                        problems.append(Violation("format", i, "a tool_use block without an id"))
                        continue
                    name = str(block.get("name", ""))
                    names.setdefault(block["id"], name)
                    content.append(ToolCall(block["id"], name, _arguments(block.get("input"))))
            neutral.append(AssistantMessage(tuple(content)))
            origin.append(i)
        elif role == "user":
            text_parts: list[str] = []
            for block in blocks:
                if not isinstance(block, Mapping):
                    continue
                if block.get("type") == "tool_result":
                    call_id = block.get("tool_use_id")
                    if not isinstance(call_id, str):
                        problems.append(
                            Violation("format", i, "a tool_result block without a tool_use_id")
                        )
                        continue
                    neutral.append(
                        ToolResultMessage(
                            call_id,
                            names.get(call_id, ""),
                            _text_of(_blocks(block.get("content"))),
                            is_error=bool(block.get("is_error", False)),
                        )
                    )
                    origin.append(i)
                elif block.get("type") == "text" and isinstance(block.get("text"), str):
                    text_parts.append(block["text"])
            if text_parts or not blocks:
                neutral.append(UserMessage("".join(text_parts)))
                origin.append(i)
        else:
            problems.append(Violation("format", i, f"unknown role {role!r}"))
    return neutral, origin, problems


def _adjacency(neutral: list[Message], origin: list[int], format: str) -> list[Violation]:
    """The provider's own rule: results come right after the message with the calls
    (OpenAI: the next messages; Anthropic: inside the very next message)."""
    out: list[Violation] = []
    for n, message in enumerate(neutral):
        if not isinstance(message, AssistantMessage) or not message.tool_calls:
            continue
        ids = {c.id for c in message.tool_calls}
        for m in range(n + 1, len(neutral)):
            later = neutral[m]
            if isinstance(later, AssistantMessage):
                break
            if isinstance(later, ToolResultMessage) and later.tool_call_id in ids:
                gap = (
                    origin[m] != origin[n] + 1
                    if format == "anthropic"
                    else any(not isinstance(neutral[k], ToolResultMessage) for k in range(n + 1, m))
                )
                if gap:
                    where = (
                        "in the user message right after the assistant message"
                        if format == "anthropic"
                        else "right after the assistant message, before any other message"
                    )
                    out.append(
                        Violation(
                            "I1",
                            origin[m],
                            f"the result for tool call {later.tool_call_id!r} must come "
                            f"{where} (message {origin[n]}) for this provider",
                        )
                    )
    return out


# -- rendering -----------------------------------------------------------------------------


def render_transcript(messages: Sequence[Message]) -> str:
    """One line per message, for failure reports."""
    lines = []
    for i, message in enumerate(messages):
        if isinstance(message, UserMessage):
            text = "".join(b.text for b in message.content if isinstance(b, TextContent))
            lines.append(f"{i:>3} user: {text!r}")
        elif isinstance(message, AssistantMessage):
            calls = ", ".join(
                f"{c.name}#{c.id}({json.dumps(dict(c.arguments), sort_keys=True)})"
                for c in message.tool_calls
            )
            bits = [f"{i:>3} assistant [{message.stop_reason.value}]"]
            if message.text:
                bits.append(repr(message.text))
            if calls:
                bits.append(f"calls {calls}")
            if message.error_message:
                bits.append(f"error {message.error_message!r}")
            lines.append(" ".join(bits))
        else:
            flag = " ERROR" if message.is_error else ""
            text = message.text if len(message.text) <= 100 else message.text[:99] + "\u2026"
            lines.append(
                f"{i:>3} result{flag} {message.tool_name}#{message.tool_call_id}: {text!r}"
            )
    return "\n".join(lines)
