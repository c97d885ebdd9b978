"""Readers that turn a provider's request history into turns of calls and results.

A turn is what the provider's pairing rules see: for Chat Completions one message,
for the Messages API a run of same-role messages merged as the API merges them. Each
call and result keeps the index of the message it came from, so a finding names the
caller's own index. A field that cannot be read gives one ``format`` finding and marks
its turn damaged; the pairing rules then stay silent about what that turn would have
said, so one bad field never turns into a finding on every call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from statemachine.core.invariants import Violation

__all__ = [
    "Call",
    "Result",
    "Turn",
    "read_anthropic",
    "read_converse",
    "read_gemini",
    "read_openai",
    "read_responses",
]


@attrs.define
class Call:
    id: str
    name: str
    index: int
    server: bool = False  # a provider-run tool (Anthropic server_tool_use, mcp_tool_use)
    legacy: bool = False  # Chat Completions' single ``function_call``, paired by name


@attrs.define
class Result:
    id: str
    name: str | None
    index: int
    server: bool = False
    legacy: bool = False
    after_other_content: bool = False  # Anthropic: a non-result block came before it


@attrs.define
class Turn:
    role: str  # "assistant", "user", "tool", "system" ("message" items: their role)
    index: int
    calls: list[Call] = attrs.field(factory=list)
    results: list[Result] = attrs.field(factory=list)
    damaged: bool = False
    # Anthropic assistant turns: server calls and results in block order
    server_blocks: list[Call | Result] = attrs.field(factory=list)
    # Anthropic user turns: a block other than tool_result has been seen
    other_content: bool = False
    # Converse user messages: the kinds of conversation block (text, image, document,
    # video) they hold, which some models refuse beside a toolResult
    conversation_blocks: list[str] = attrs.field(factory=list)


def _unreadable(i: int, detail: str, turns: list[Turn], problems: list[Violation]) -> None:
    """Item ``i`` cannot be read: a ``format`` finding, and a damaged turn in its place."""
    problems.append(Violation("format", i, detail))
    turns.append(Turn("unknown", i, damaged=True))


def _damaged(i: int, detail: str, turn: Turn, problems: list[Violation]) -> None:
    """A field of item ``i`` cannot be read: a ``format`` finding, and ``turn`` damaged."""
    problems.append(Violation("format", i, detail))
    turn.damaged = True


def _mappings(
    items: Sequence[Any], turns: list[Turn], problems: list[Violation]
) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """Each item that is a mapping, with its index; any other is ``_unreadable``."""
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            yield i, item
        else:
            _unreadable(i, f"a {type(item).__name__} is not a message", turns, problems)


# -- OpenAI Chat Completions ---------------------------------------------------------------


def _openai_calls(i: int, item: Mapping[str, Any], turn: Turn, problems: list[Violation]) -> None:
    raw = item.get("tool_calls")
    if raw is not None and (isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence)):
        _damaged(i, "tool_calls is not a list", turn, problems)
        raw = ()
    for j, call in enumerate(raw or ()):
        call_id = call.get("id") if isinstance(call, Mapping) else None
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(call_id, str):
            _damaged(i, f"tool_calls[{j}] has no string id", turn, problems)
            continue
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str):
            # Custom tools carry their name under "custom"; anything else is unreadable.
            custom = call.get("custom") if isinstance(call, Mapping) else None
            name = custom.get("name") if isinstance(custom, Mapping) else None
        if not isinstance(name, str):
            problems.append(Violation("format", i, f"tool_calls[{j}] has no function name"))
            name = ""
        turn.calls.append(Call(call_id, name, i))
    legacy = item.get("function_call")
    if legacy is not None:
        name = legacy.get("name") if isinstance(legacy, Mapping) else None
        if isinstance(name, str):
            turn.calls.append(Call(f"function_call:{name}", name, i, legacy=True))
        else:
            _damaged(i, "function_call has no name", turn, problems)


def read_openai(messages: Sequence[Any]) -> tuple[list[Turn], list[Violation]]:
    turns: list[Turn] = []
    problems: list[Violation] = []
    for i, item in _mappings(messages, turns, problems):
        role = item.get("role")
        turn = Turn(str(role), i)
        if role == "assistant":
            _openai_calls(i, item, turn, problems)
        elif role == "tool":
            call_id = item.get("tool_call_id")
            if isinstance(call_id, str):
                name = item.get("name")
                turn.results.append(Result(call_id, name if isinstance(name, str) else None, i))
            else:
                _damaged(i, "a tool message without a tool_call_id", turn, problems)
        elif role == "function":
            name = item.get("name")
            if isinstance(name, str):
                turn.results.append(Result(f"function_call:{name}", name, i, legacy=True))
            else:
                _damaged(i, "a function message without a name", turn, problems)
        elif role not in ("user", "system", "developer"):
            _damaged(i, f"unknown role {role!r}", turn, problems)
        turns.append(turn)
    return turns, problems


# -- OpenAI Responses input items ----------------------------------------------------------


def _responses_kind(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return str(kind)


# Calls the caller runs and must answer; other ``*_call`` items without a ``call_id``
# (``web_search_call``, ``mcp_call``, ...) are run by the provider and carry their result.
_CLIENT_CALLS = frozenset({"function_call", "custom_tool_call"})


def read_responses(items: Sequence[Any]) -> tuple[list[Turn], list[Violation]]:
    """Each input item is a turn: ``*_call`` items with a ``call_id`` are calls,
    ``*_call_output`` items their results, ``message`` items (or bare role dicts)
    messages; items a provider runs itself (``web_search_call``, ``mcp_call``, ...)
    carry their own result and need no pairing."""
    turns: list[Turn] = []
    problems: list[Violation] = []
    for i, item in _mappings(items, turns, problems):
        kind = _responses_kind(item)
        call_id = item.get("call_id")
        if kind == "message":
            turn = Turn(str(item.get("role")), i)
        elif kind.endswith("_call_output"):
            turn = Turn(kind, i)
            if isinstance(call_id, str):
                turn.results.append(Result(call_id, None, i))
            else:
                _damaged(i, f"a {kind} item without a call_id", turn, problems)
        elif kind.endswith("_call") and ("call_id" in item or kind in _CLIENT_CALLS):
            turn = Turn(kind, i)
            name = item.get("name")
            if isinstance(call_id, str):
                turn.calls.append(Call(call_id, name if isinstance(name, str) else kind, i))
            else:
                _damaged(i, f"a {kind} item whose call_id is unreadable", turn, problems)
        else:
            turn = Turn(kind, i)
        turns.append(turn)
        reasoning_id = item.get("id") if kind == "reasoning" else None
        if isinstance(reasoning_id, str) and reasoning_id.startswith("rs_"):
            _reasoning_followed(items, i, problems)
    return turns, problems


def _reasoning_followed(items: Sequence[Any], i: int, problems: list[Violation]) -> None:
    """A reasoning item OpenAI produced (its ``id`` starts with ``rs_``) must be followed
    by the item it produced after it (which has an ``id`` too): OpenAI rejects "Item 'rs_...'
    of type 'reasoning' was provided without its required following item" when that
    item was dropped or replaced by a message written by hand. (DeepSeek, whose ids
    are UUIDs, accepts such a history.)"""
    following = items[i + 1] if i + 1 < len(items) else None
    if isinstance(following, Mapping) and (
        "id" in following or _responses_kind(following) != "message"
    ):
        return
    what = "nothing" if following is None else "a message item without an id"
    problems.append(
        Violation(
            "I1",
            i,
            f"the reasoning item {items[i]['id']!r} is followed by {what}: OpenAI wants "
            "the item the model produced after it (its required following item)",
        )
    )


# -- Anthropic Messages -------------------------------------------------------------------


def _blocks(content: Any) -> list[Any] | None:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, Sequence) and not isinstance(content, bytes):
        return list(content)
    return None


def _is_server_result(kind: Any) -> bool:
    return isinstance(kind, str) and kind.endswith("_tool_result") and kind != "tool_result"


def _anthropic_assistant(i: int, blocks: list[Any], turn: Turn, problems: list[Violation]) -> None:
    for j, block in enumerate(blocks):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            call_id, name = block.get("id"), block.get("name")
            if not isinstance(call_id, str):
                _damaged(i, f"content[{j}] ({kind}) has no string id", turn, problems)
                continue
            call = Call(
                call_id, name if isinstance(name, str) else "", i, server=kind != "tool_use"
            )
            if call.server:
                turn.server_blocks.append(call)
            else:
                turn.calls.append(call)
        elif _is_server_result(kind):
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                _damaged(i, f"content[{j}] ({kind}) has no tool_use_id", turn, problems)
                continue
            turn.server_blocks.append(Result(call_id, None, i, server=True))


def _anthropic_user(i: int, blocks: list[Any], turn: Turn, problems: list[Violation]) -> None:
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_result" and isinstance(block, Mapping):
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                _damaged(i, f"content[{j}] (tool_result) has no tool_use_id", turn, problems)
                continue
            # In a merged turn, content of an earlier message also counts as "before".
            turn.results.append(Result(call_id, None, i, after_other_content=turn.other_content))
        else:
            turn.other_content = True


def read_anthropic(messages: Sequence[Any]) -> tuple[list[Turn], list[Violation]]:
    """Consecutive messages of one role are merged into one turn (the API does the
    same before it checks anything); ``system`` messages mid-conversation are turns
    of their own."""
    turns: list[Turn] = []
    problems: list[Violation] = []
    for i, item in _mappings(messages, turns, problems):
        role = item.get("role")
        if role not in ("user", "assistant", "system"):
            _unreadable(i, f"unknown role {role!r}", turns, problems)
            continue
        if turns and turns[-1].role == role and role != "system":
            turn = turns[-1]
        else:
            turn = Turn(role, i)
            turns.append(turn)
        blocks = _blocks(item.get("content"))
        if blocks is None:
            _damaged(i, "content is neither a string nor a list", turn, problems)
            continue
        if role == "assistant":
            _anthropic_assistant(i, blocks, turn, problems)
        elif role == "user":
            _anthropic_user(i, blocks, turn, problems)
    return turns, problems


# -- Amazon Bedrock Converse --------------------------------------------------------------

# Converse content blocks are one-key objects: {"text": ...}, {"toolUse": {...}}, ...
_CONVERSE_BLOCKS = frozenset(
    {
        "text",
        "toolUse",
        "toolResult",
        "image",
        "document",
        "video",
        "reasoningContent",
        "cachePoint",
        "guardContent",
        "citationsContent",
    }
)


def read_converse(messages: Sequence[Any]) -> tuple[list[Turn], list[Violation]]:
    """Converse messages, one turn each: ``toolUse`` blocks of an assistant message are
    calls, ``toolResult`` blocks of a user message results; a server tool's ``toolUse``
    (``"type": "server_tool_use"``) is answered by a ``toolResult`` in the same assistant
    message. Converse does not merge messages of one role: it requires them to
    alternate (``ValidationException``), which is reported here as an ``order`` finding.
    (A conversation that starts with an assistant message was accepted for Claude.)"""
    turns: list[Turn] = []
    problems: list[Violation] = []
    for i, item in _mappings(messages, turns, problems):
        role = item.get("role")
        if role not in ("user", "assistant"):
            _unreadable(i, f"unknown role {role!r}", turns, problems)
            continue
        _converse_alternation(i, role, turns, problems)
        turn = Turn(role, i)
        turns.append(turn)
        content = item.get("content")
        if not isinstance(content, Sequence) or isinstance(content, (str, bytes)):
            _damaged(i, "content is not a list of blocks", turn, problems)
            continue
        for j, block in enumerate(content):
            _converse_block(i, j, block, turn, problems)
    return turns, problems


def _converse_alternation(i: int, role: str, turns: list[Turn], problems: list[Violation]) -> None:
    """An ``order`` finding when message ``i`` has the role of the last readable message
    before it: Converse refuses two messages of one role in a row."""
    previous = next((t for t in reversed(turns) if t.role != "unknown"), None)
    if previous is not None and previous.role == role:
        problems.append(
            Violation(
                "order",
                i,
                f"two {role} messages in a row (messages {previous.index} and {i}): "
                "Converse requires the roles to alternate",
            )
        )


# The blocks Bedrock calls "conversation blocks" in its refusal of one beside a toolResult.
_CONVERSATION_BLOCKS = ("text", "image", "document", "video")


def _converse_block(i: int, j: int, block: Any, turn: Turn, problems: list[Violation]) -> None:
    """Content block ``j`` of message ``i``: a ``toolUse`` is a call, a ``toolResult`` a
    result (a server tool's when in an assistant message); a conversation block of a
    user message is noted (``Turn.conversation_blocks``); other blocks say nothing."""
    use = block.get("toolUse") if isinstance(block, Mapping) else None
    result = block.get("toolResult") if isinstance(block, Mapping) else None
    if turn.role == "user" and isinstance(block, Mapping):
        turn.conversation_blocks += [k for k in _CONVERSATION_BLOCKS if k in block]
    if use is not None:
        call_id = use.get("toolUseId") if isinstance(use, Mapping) else None
        name = use.get("name") if isinstance(use, Mapping) else None
        if not isinstance(call_id, str):
            _damaged(i, f"content[{j}].toolUse has no toolUseId", turn, problems)
            return
        if turn.role != "assistant":
            _damaged(i, f"content[{j}]: a toolUse block in a user message", turn, problems)
            return
        call = Call(call_id, name if isinstance(name, str) else "", i)
        # A server tool (Nova's code interpreter): its toolResult follows it
        # inside the assistant message.
        call.server = use.get("type") == "server_tool_use"
        (turn.server_blocks if call.server else turn.calls).append(call)
    elif result is not None:
        call_id = result.get("toolUseId") if isinstance(result, Mapping) else None
        if not isinstance(call_id, str):
            _damaged(i, f"content[{j}].toolResult has no toolUseId", turn, problems)
            return
        if turn.role == "assistant":  # a server tool's result
            turn.server_blocks.append(Result(call_id, None, i, server=True))
            return
        turn.results.append(Result(call_id, None, i))


# -- Google Gemini ------------------------------------------------------------------------


def _part(part: Mapping[str, Any], camel: str, snake: str) -> Any:
    return part.get(camel, part.get(snake))


def read_gemini(contents: Sequence[Any]) -> tuple[list[Turn], list[Violation]]:
    """Gemini ``contents``: ``functionCall`` parts of a ``model`` turn are calls,
    ``functionResponse`` parts (of a ``user`` turn, or the older ``function`` role)
    results. Consecutive contents of one side are merged into one turn, as Gemini
    merges them: a model turn with three ``functionCall`` parts answered by three
    ``user`` contents of one ``functionResponse`` each was accepted (crewAI's recorded
    requests). A part's ``id`` is optional: without one, the call's id is empty and
    results pair by name, as Gemini pairs them. Both the REST spelling (camelCase) and
    the Python SDK's (snake_case) are read."""
    turns: list[Turn] = []
    problems: list[Violation] = []
    for i, item in _mappings(contents, turns, problems):
        role = item.get("role", "user")
        if role not in ("user", "model", "function", "tool"):
            _unreadable(i, f"unknown role {role!r}", turns, problems)
            continue
        side = "assistant" if role == "model" else "user"
        if turns and turns[-1].role == side:
            turn = turns[-1]
        else:
            turn = Turn(side, i)
            turns.append(turn)
        parts = item.get("parts")
        if not isinstance(parts, Sequence) or isinstance(parts, (str, bytes)):
            _damaged(i, "parts is not a list", turn, problems)
            continue
        for j, part in enumerate(parts):
            if not isinstance(part, Mapping):
                continue
            call = _part(part, "functionCall", "function_call")
            response = _part(part, "functionResponse", "function_response")
            for kind, value in (("functionCall", call), ("functionResponse", response)):
                if value is None:
                    continue
                name = value.get("name") if isinstance(value, Mapping) else None
                if not isinstance(name, str):
                    _damaged(i, f"parts[{j}].{kind} has no name", turn, problems)
                    continue
                part_id = value.get("id")
                part_id = part_id if isinstance(part_id, str) else ""
                if kind == "functionCall":
                    turn.calls.append(Call(part_id, name, i))
                else:
                    turn.results.append(Result(part_id, name, i))
    return turns, problems
