"""The one JSON form of everything the library writes down or sends: messages and
their content blocks, tool definitions, tool outputs, schedulings, the engine's events
and its actions.

The journal, the engine snapshot, the test kit's bridge and transcripts all read and
write through these functions, so there is one shape of each thing and one place
that decides it. The shape is camelCase JSON (see the README). Every ``*_to_dict``
returns plain ``dict``/``list`` values ready for ``json``; every ``*_from_dict`` is
strict: anything that is not exactly that shape raises ``WireFormatError`` naming the
path of the first problem (``message.content[2].arguments``), because a record that
half-parses is worse than one that is refused.

The event and action codecs are derived from the classes: every member of the
``Event`` and ``Action`` unions is encoded field by field from its type hints, under
its class name (a new class needs no code here as long as its fields have types
``_value_codec`` knows).
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

import attrs

from statemachine.core import events as _events
from statemachine.core.events import Action, Event
from statemachine.core.messages import (
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
    _is_mapping,
    freeze_json,
    thaw_json,
)
from statemachine.core.table import DeclaredState, State, TurnState
from statemachine.core.tools import Scheduling, ToolDefinition, ToolOutput
from statemachine.errors import WireFormatError

__all__ = [
    "STOP_REASONS",
    "action_from_dict",
    "action_to_dict",
    "block_from_dict",
    "block_to_dict",
    "event_from_dict",
    "event_to_dict",
    "message_from_dict",
    "message_to_dict",
    "messages_from_dicts",
    "messages_to_dicts",
    "scheduling_from_dict",
    "scheduling_to_dict",
    "tool_definition_from_dict",
    "tool_definition_to_dict",
    "tool_output_from_dict",
    "tool_output_to_dict",
    "usage_from_dict",
    "usage_to_dict",
]

_MESSAGE_TYPES: Final[tuple[type, ...]] = (UserMessage, AssistantMessage, ToolResultMessage)


# -- wire format: to dict ---------------------------------------------------------------


def block_to_dict(block: Any) -> dict[str, Any]:
    if isinstance(block, TextContent):
        return {"type": "text", "text": block.text}
    if isinstance(block, ThinkingContent):
        out: dict[str, Any] = {"type": "thinking", "thinking": block.thinking}
        if block.signature is not None:
            out["signature"] = block.signature
        if block.redacted:
            out["redacted"] = True
        return out
    if isinstance(block, ImageContent):
        return {"type": "image", "data": block.data, "mimeType": block.mime_type}
    if isinstance(block, ToolCall):
        call: dict[str, Any] = {
            "type": "toolCall",
            "id": block.id,
            "name": block.name,
            "arguments": thaw_json(block.arguments),
        }
        if block.parse_error is not None:
            call["parseError"] = block.parse_error
        return call
    raise TypeError(f"not a content block: {block!r}")


def usage_to_dict(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "input": usage.input,
        "output": usage.output,
        "cacheRead": usage.cache_read,
        "cacheWrite": usage.cache_write,
        "totalTokens": usage.total_tokens,
    }
    if usage.cost is not None:
        out["cost"] = usage.cost
    return out


def message_to_dict(message: Message) -> dict[str, Any]:
    """The JSON wire shape of a message (plain dicts and lists, ready for ``json``)."""
    if isinstance(message, UserMessage):
        return {"role": "user", "content": [block_to_dict(b) for b in message.content]}
    if isinstance(message, AssistantMessage):
        out: dict[str, Any] = {
            "role": "assistant",
            "content": [block_to_dict(b) for b in message.content],
            "stopReason": message.stop_reason.value,
        }
        if message.error_message is not None:
            out["errorMessage"] = message.error_message
        if message.usage is not None:
            out["usage"] = usage_to_dict(message.usage)
        return out
    if isinstance(message, ToolResultMessage):
        return {
            "role": "toolResult",
            "toolCallId": message.tool_call_id,
            "toolName": message.tool_name,
            "content": [block_to_dict(b) for b in message.content],
            "isError": message.is_error,
        }
    raise TypeError(f"not a message: {message!r}")


def messages_to_dicts(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """``message_to_dict`` over a history."""
    return [message_to_dict(m) for m in messages]


# -- wire format: from dict -----------------------------------------------------------


def _expect(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    if key not in d:
        raise WireFormatError(f"{path}: missing key {key!r}")
    value = d[key]
    # bool is an int in Python; a JSON true is never a token count.
    if isinstance(value, bool) and kind in (int, (int, float)):
        raise WireFormatError(f"{path}.{key}: expected a number, got a boolean")
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        raise WireFormatError(f"{path}.{key}: expected {names}, got {type(value).__name__}")
    return value


def _optional(d: Mapping[str, Any], key: str, kind: type, path: str) -> Any:
    if key not in d or d[key] is None:
        return None
    return _expect(d, key, kind, path)


def _check_keys(d: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    if d.keys() <= allowed:
        return
    extra = sorted(set(d) - allowed)
    raise WireFormatError(f"{path}: unknown key(s) {', '.join(map(repr, extra))}")


_BLOCK_KEYS: dict[str, frozenset[str]] = {
    "text": frozenset({"type", "text"}),
    "thinking": frozenset({"type", "thinking", "signature", "redacted"}),
    "image": frozenset({"type", "data", "mimeType"}),
    "toolCall": frozenset({"type", "id", "name", "arguments", "parseError"}),
}
_USER_KEYS: Final = frozenset({"role", "content"})
_ASSISTANT_KEYS: Final = frozenset({"role", "content", "stopReason", "errorMessage", "usage"})
_RESULT_KEYS: Final = frozenset({"role", "toolCallId", "toolName", "content", "isError"})
_USAGE_KEYS: Final = frozenset(
    {"input", "output", "cacheRead", "cacheWrite", "totalTokens", "cost"}
)
STOP_REASONS: Final[dict[str, StopReason]] = {s.value: s for s in StopReason}
_T = TypeVar("_T")


def _checked(cls: type[_T], *values: Any) -> _T:
    """An instance of the frozen ``cls`` from values the wire parser has already checked.

    The parser checks every field against exactly what the class's validators and
    converters would (types, the stop reason, frozen arguments, tuples of the right
    blocks) and names the bad path when one fails; running them again costs as much
    as the parsing (replay, bench/). Only the functions below call this, each right
    after its checks; tests/test_messages.py checks that what it builds equals what
    the class's own ``__init__`` builds.
    """
    instance = object.__new__(cls)
    for name, value in zip(_field_names(cls), values, strict=True):
        object.__setattr__(instance, name, value)
    return instance


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(field.name for field in attrs.fields(cls))
    return names


def block_from_dict(d: Any, allowed: tuple[str, ...], path: str) -> Any:
    if not _is_mapping(d):
        raise WireFormatError(f"{path}: expected an object, got {type(d).__name__}")
    kind = _expect(d, "type", str, path)
    if kind not in allowed:
        raise WireFormatError(
            f"{path}.type: {kind!r} is not allowed here (expected one of "
            f"{', '.join(map(repr, allowed))})"
        )
    _check_keys(d, _BLOCK_KEYS[kind], path)
    if kind == "text":
        return _checked(TextContent, _expect(d, "text", str, path))
    if kind == "thinking":
        return _checked(
            ThinkingContent,
            _expect(d, "thinking", str, path),
            _optional(d, "signature", str, path),
            _optional(d, "redacted", bool, path) or False,
        )
    if kind == "image":
        return ImageContent(_expect(d, "data", str, path), _expect(d, "mimeType", str, path))
    arguments = _expect(d, "arguments", Mapping, path)
    return _checked(
        ToolCall,
        _expect(d, "id", str, path),
        _expect(d, "name", str, path),
        freeze_json(arguments, f"{path}.arguments"),
        _optional(d, "parseError", str, path),
    )


def _content_from(d: Mapping[str, Any], allowed: tuple[str, ...], path: str) -> tuple[Any, ...]:
    content = _expect(d, "content", list, path)
    return tuple(
        block_from_dict(block, allowed, f"{path}.content[{i}]") for i, block in enumerate(content)
    )


def usage_from_dict(d: Any, path: str) -> Usage:
    if not _is_mapping(d):
        raise WireFormatError(f"{path}: expected an object, got {type(d).__name__}")
    _check_keys(d, _USAGE_KEYS, path)
    cost = None
    if d.get("cost") is not None:
        cost = float(_expect(d, "cost", (int, float), path))
    return Usage(
        input=_expect(d, "input", int, path),
        output=_expect(d, "output", int, path),
        cache_read=_expect(d, "cacheRead", int, path),
        cache_write=_expect(d, "cacheWrite", int, path),
        total_tokens=_expect(d, "totalTokens", int, path),
        cost=cost,
    )


def message_from_dict(d: Mapping[str, Any], *, path: str = "message") -> Message:
    """Parse the JSON wire shape; raise ``WireFormatError`` naming the first bad path."""
    if not _is_mapping(d):
        raise WireFormatError(f"{path}: expected an object, got {type(d).__name__}")
    role = _expect(d, "role", str, path)
    if role == "user":
        _check_keys(d, _USER_KEYS, path)
        return _checked(UserMessage, _content_from(d, ("text", "image"), path))
    if role == "assistant":
        _check_keys(d, _ASSISTANT_KEYS, path)
        raw_stop = _expect(d, "stopReason", str, path)
        stop = STOP_REASONS.get(raw_stop)
        if stop is None:
            valid = ", ".join(repr(s.value) for s in StopReason)
            raise WireFormatError(f"{path}.stopReason: {raw_stop!r} is not one of {valid}")
        usage = None
        if d.get("usage") is not None:
            usage = usage_from_dict(d["usage"], f"{path}.usage")
        return _checked(
            AssistantMessage,
            _content_from(d, ("text", "thinking", "toolCall"), path),
            stop,
            _optional(d, "errorMessage", str, path),
            usage,
        )
    if role == "toolResult":
        _check_keys(d, _RESULT_KEYS, path)
        return _checked(
            ToolResultMessage,
            _expect(d, "toolCallId", str, path),
            _expect(d, "toolName", str, path),
            _content_from(d, ("text", "image"), path),
            _expect(d, "isError", bool, path),
        )
    raise WireFormatError(f"{path}.role: {role!r} is not one of 'user', 'assistant', 'toolResult'")


def messages_from_dicts(items: Sequence[Mapping[str, Any]]) -> list[Message]:
    """``message_from_dict`` over a history; paths name the index (``messages[3]``)."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise WireFormatError("messages: expected an array of messages")
    return [message_from_dict(d, path=f"messages[{i}]") for i, d in enumerate(items)]


# -- tools: definitions, outputs, schedulings ------------------------------------------------


def _fail(path: str, expected: str, value: Any) -> WireFormatError:
    return WireFormatError(f"{path}: expected {expected}, got {type(value).__name__}")


def tool_definition_to_dict(definition: ToolDefinition) -> dict[str, Any]:
    """``{"name", "description", "parameters"}``: what a model is told about a tool."""
    return {
        "name": definition.name,
        "description": definition.description,
        "parameters": definition.schema_dict(),
    }


def tool_definition_from_dict(d: Any, path: str = "tool") -> ToolDefinition:
    """Parse ``tool_definition_to_dict``'s shape (the schema is checked as the class
    checks it; its failure is the class's error)."""
    if not _is_mapping(d):
        raise _fail(path, "an object", d)
    name, description = d.get("name"), d.get("description")
    if type(name) is not str:
        raise _fail(f"{path}.name", "str", name)
    if type(description) is not str:
        raise _fail(f"{path}.description", "str", description)
    return ToolDefinition(name, description, d.get("parameters"))


def tool_output_to_dict(output: ToolOutput) -> dict[str, Any]:
    """``{"content": [<blocks>], "isError": bool}``, with ``"usage"`` and ``"requests"``
    when the tool spent some (a sub-agent's)."""
    out = {"content": [block_to_dict(b) for b in output.content], "isError": output.is_error}
    if output.usage is not None:
        out["usage"] = usage_to_dict(output.usage)
    if output.requests:
        out["requests"] = output.requests
    if output.retry:
        out["retry"] = True
    return out


_OUTPUT_KEYS: Final = frozenset({"content", "isError"})


def tool_output_from_dict(value: Any, path: str = "output") -> ToolOutput:
    """Parse ``tool_output_to_dict``'s shape (text and image blocks only)."""
    if not _is_mapping(value) or not (
        _OUTPUT_KEYS <= set(value) <= _OUTPUT_KEYS | {"usage", "requests", "retry"}
    ):
        raise WireFormatError(f"{path}: expected an object with keys 'content' and 'isError'")
    usage = None
    if "usage" in value:
        usage = usage_from_dict(value["usage"], f"{path}.usage")
    requests = value.get("requests", 0)
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 0:
        raise _fail(f"{path}.requests", "an integer >= 0", requests)
    retry = value.get("retry", False)
    if not isinstance(retry, bool):
        raise _fail(f"{path}.retry", "a boolean", retry)
    content = value["content"]
    if not isinstance(content, list):
        raise _fail(f"{path}.content", "an array", content)
    if not isinstance(value["isError"], bool):
        raise _fail(f"{path}.isError", "a boolean", value["isError"])
    blocks = [
        block_from_dict(b, ("text", "image"), f"{path}.content[{i}]") for i, b in enumerate(content)
    ]
    return ToolOutput(
        tuple(blocks), is_error=value["isError"], usage=usage, requests=requests, retry=retry
    )


def scheduling_to_dict(scheduling: Scheduling) -> dict[str, bool]:
    """``{"sequential": bool, "resources": bool}``. A resources function cannot be
    written down: the form says only whether there was one."""
    return {"sequential": scheduling.sequential, "resources": scheduling.resources is not None}


def scheduling_from_dict(value: Any, path: str = "scheduling") -> Scheduling:
    """Parse ``scheduling_to_dict``'s shape; the resources function, if there was one,
    is not in it (the reader must be given it back)."""
    if (
        not _is_mapping(value)
        or set(value) != {"sequential", "resources"}
        or type(value["sequential"]) is not bool
        or type(value["resources"]) is not bool
    ):
        raise WireFormatError(f"{path}: expected {{'sequential': bool, 'resources': bool}}")
    return Scheduling(sequential=value["sequential"])


# -- events and actions: derived from their classes ------------------------------------------

_Encode = Callable[[Any], Any]
_Decode = Callable[[Any, str], Any]


def _scalar(kind: type) -> tuple[_Encode, _Decode]:
    def decode(value: Any, path: str) -> Any:
        # bool is an int in Python, but a JSON true is never a count.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _fail(path, kind.__name__, value)
        return value

    return _same, decode


def _same(value: Any) -> Any:
    return value


def _enum_codec(kind: type[enum.Enum]) -> tuple[_Encode, _Decode]:
    def decode(value: Any, path: str) -> Any:
        try:
            return kind(value)
        except ValueError:
            valid = ", ".join(repr(m.value) for m in kind)
            raise WireFormatError(f"{path}: {value!r} is not one of {valid}") from None

    return (lambda v: v.value), decode


def _message_codec(kind: type) -> tuple[_Encode, _Decode]:
    def decode(value: Any, path: str) -> Any:
        message = message_from_dict(value, path=path)
        if not isinstance(message, kind):
            raise WireFormatError(f"{path}: expected a {kind.__name__} message")
        return message

    return message_to_dict, decode


def _decode_call(value: Any, path: str) -> ToolCall:
    call: ToolCall = block_from_dict(value, ("toolCall",), path)
    return call


def _decode_json(value: Any, path: str) -> Any:
    return freeze_json(value, path)


def _decode_state(value: Any, path: str) -> State:
    """A state by its name: the library's, else one a team declared (only a state a
    run returns in is written down, so a declared one is terminal)."""
    if isinstance(value, str) and value in _BASE_STATES:
        return TurnState(value)
    if not isinstance(value, str) or not _DECLARED_NAME.fullmatch(value):
        raise _fail(path, "a state name", value)
    return DeclaredState(value, True, "")


_BASE_STATES: Final = frozenset(s.value for s in TurnState)
_DECLARED_NAME: Final = re.compile(r"[A-Z][A-Za-z0-9]{0,47}")  # as core/steps.py names them

# Field types with a codec of their own (the rest are scalars, enums, or built from these).
_CLASS_CODECS: Final[dict[Any, tuple[_Encode, _Decode]]] = {
    Message: _message_codec(object),
    ToolOutput: (tool_output_to_dict, tool_output_from_dict),
    ToolCall: (block_to_dict, _decode_call),
    ToolDefinition: (tool_definition_to_dict, tool_definition_from_dict),
    State: (lambda state: state.value, _decode_state),
    **{kind: _message_codec(kind) for kind in _MESSAGE_TYPES},
}


def _value_codec(hint: Any, where: str) -> tuple[_Encode, _Decode]:
    """The codec of one field type. Extend here when a class grows a new field type."""
    if hint in (str, bool, int, float):
        return _scalar(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_codec(hint)
    if hint in _CLASS_CODECS:
        return _CLASS_CODECS[hint]
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner_encode, inner_decode = _value_codec(rest[0], where)
            return (
                lambda v: None if v is None else inner_encode(v),
                lambda v, p: None if v is None else inner_decode(v, p),
            )
    if (origin is tuple and len(args) == 2 and args[1] is Ellipsis) or origin is Sequence:
        item_encode, item_decode = _value_codec(args[0], where)

        def decode_items(value: Any, path: str) -> tuple[Any, ...]:
            if not isinstance(value, list):
                raise _fail(path, "an array", value)
            return tuple(item_decode(v, f"{path}[{i}]") for i, v in enumerate(value))

        return (lambda v: [item_encode(x) for x in v]), decode_items
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        return thaw_json, _decode_json
    raise TypeError(f"the wire form has no codec for {where}: {hint!r}; add one to _value_codec")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@attrs.frozen
class ClassCodec:
    """How one event or action class is written: its fields, each with its camelCase
    key, encoder, decoder and whether it must be present."""

    cls: type
    fields: tuple[tuple[str, str, _Encode, _Decode, bool], ...]  # attr, key, enc, dec, required
    keys: frozenset[str]  # the keys its dicts may have: "type" and the fields'


def _class_codec(cls: type) -> ClassCodec:
    hints = typing.get_type_hints(cls, vars(_events))
    fields = []
    for field in attrs.fields(cls):
        encode, decode = _value_codec(hints[field.name], f"{cls.__name__}.{field.name}")
        required = field.default is attrs.NOTHING
        fields.append((field.name, _camel(field.name), encode, decode, required))
    return ClassCodec(cls, tuple(fields), frozenset({"type", *(f[1] for f in fields)}))


# Every member of the Event and Action unions, by class name: adding a class to its
# union is all it takes to write it down.
EVENT_CODECS: Final[dict[str, ClassCodec]] = {
    cls.__name__: _class_codec(cls) for cls in typing.get_args(Event)
}
ACTION_CODECS: Final[dict[str, ClassCodec]] = {
    cls.__name__: _class_codec(cls) for cls in typing.get_args(Action)
}
# Names that dicts written by earlier versions use, read as the class's current name.
_FORMER_NAMES: Final[dict[str, str]] = {"RunEnded": "ReturnToCaller"}
_BY_CLASS: Final[dict[type, ClassCodec]] = {
    c.cls: c for c in (*EVENT_CODECS.values(), *ACTION_CODECS.values())
}


def _to_dict(value: Any, codecs: Mapping[str, ClassCodec], what: str) -> dict[str, Any]:
    codec = _BY_CLASS.get(type(value))
    if codec is None or codecs.get(codec.cls.__name__) is not codec:
        raise TypeError(f"not {what}: {value!r}")
    out: dict[str, Any] = {"type": codec.cls.__name__}
    for name, key, encode, _, _ in codec.fields:
        out[key] = encode(getattr(value, name))
    return out


def _from_dict(d: Any, codecs: Mapping[str, ClassCodec], what: str, path: str) -> Any:
    if not isinstance(d, Mapping):
        raise _fail(path, "an object", d)
    kind = d.get("type")
    codec = codecs.get(_FORMER_NAMES.get(kind, kind)) if isinstance(kind, str) else None
    if codec is None:
        raise WireFormatError(
            f"{path}.type: {kind!r} is not {what} type (expected one of "
            f"{', '.join(sorted(codecs))})"
        )
    if not d.keys() <= codec.keys:
        extra = sorted(set(d) - codec.keys)
        raise WireFormatError(f"{path}: unknown key(s) {', '.join(map(repr, extra))}")
    kwargs: dict[str, Any] = {}
    for name, key, _, decode, required in codec.fields:
        if key not in d:
            if required:
                raise WireFormatError(f"{path}: missing key {key!r}")
            continue
        kwargs[name] = decode(d[key], f"{path}.{key}")
    try:
        return codec.cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise WireFormatError(f"{path}: {exc}") from None


def event_to_dict(event: Event) -> dict[str, Any]:
    """The JSON shape of an engine event: ``{"type": <class name>, <camelCase fields>}``."""
    return _to_dict(event, EVENT_CODECS, "an engine event")


def event_from_dict(d: Mapping[str, Any], *, path: str = "event") -> Event:
    """Parse ``event_to_dict``'s shape; raise ``WireFormatError`` naming the bad path."""
    event: Event = _from_dict(d, EVENT_CODECS, "an event", path)
    return event


def action_to_dict(action: Action) -> dict[str, Any]:
    """The JSON shape of an action: ``{"type": <class name>, <camelCase fields>}``."""
    return _to_dict(action, ACTION_CODECS, "an action")


def action_from_dict(d: Mapping[str, Any], *, path: str = "action") -> Action:
    """Parse ``action_to_dict``'s shape; raise ``WireFormatError`` naming the bad path."""
    action: Action = _from_dict(d, ACTION_CODECS, "an action", path)
    return action
