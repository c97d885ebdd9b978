"""Replay's common case, fast: reading an event line's parsed JSON into its event.

Replay reads each line with orjson and builds its event with the functions below. They
check exactly what ``event_from_dict`` checks (and the classes' validators would), but
name no path and build no error text: the first thing that is not as expected raises,
whatever it is, and the line is then read again by the exact decoder (the stdlib's json
and ``event_from_dict``), which accepts what they refused if it is valid after all (an
integer beyond 64 bits, which orjson reads as a float; a lone surrogate) or says
precisely what is wrong. tests/test_journal_hostile.py checks that both build equal
events.
"""

from __future__ import annotations

import enum
import functools
import types
import typing
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Final

import attrs

from statemachine.core import events as _events
from statemachine.core.events import Event
from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    Usage,
    UserMessage,
)
from statemachine.core.tools import ToolOutput
from statemachine.core.wire import EVENT_CODECS, STOP_REASONS, ClassCodec
from statemachine.journal._reader import MAX_DEPTH

__all__ = ["FAST_EVENTS", "INEXACT", "NotFastError", "new", "setters"]


class NotFastError(Exception):
    """Raised by the fast decoder for anything but the common case."""


INEXACT: Final = object()
"""Put by the fast decoders into a parsed message where orjson would not write the
digest's text of what they built (an optional key at its default, which the wire form
leaves out; a float, which orjson writes otherwise): orjson cannot write it, so the
digest writes that message from the object (``RunningDigest.know``)."""


new = object.__new__
# orjson reads an integer outside the 64-bit range as a float; the exact decoder reads
# it as the integer it was written as. A float this large may be one, so it goes there.
_FLOAT_BOUND: Final = float(2**63)


def _fast_str(value: Any) -> str:
    if type(value) is str:
        return value
    raise NotFastError


def _fast_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    raise NotFastError


def _fast_count(value: Any) -> int:
    if type(value) is int:
        return value
    raise NotFastError


# The depth of a tool call's arguments in an event line: record, event, message,
# content, block, arguments.
_ARGUMENTS_DEPTH: Final = 6


def _fast_freeze(value: Any, depth: int) -> Any:
    """``freeze_json`` of what orjson returned (only JSON types, string keys) at ``depth``
    in its line, in place: the parsed value belongs to replay alone, so its dicts are
    wrapped, not copied. The depth limit is counted here, where the only deep values
    of an event line can be (every other field has a fixed shape)."""
    if depth > MAX_DEPTH:
        raise NotFastError
    if type(value) is dict:
        if _NESTED.isdisjoint(map(type, value.values())):  # flat: the common case
            return MappingProxyType(value)
        for key, item in value.items():
            if type(item) in _NESTED:
                value[key] = _fast_item(item, depth)  # a new value, not a new key
        return MappingProxyType(value)
    if _NESTED.isdisjoint(map(type, value)):
        return tuple(value)
    return tuple([_fast_item(item, depth) if type(item) in _NESTED else item for item in value])


def _fast_item(item: Any, depth: int) -> Any:
    if type(item) is float:
        if -_FLOAT_BOUND < item < _FLOAT_BOUND:
            return item
        raise NotFastError
    return _fast_freeze(item, depth + 1)


# Types that need more than a look: containers, and floats (which may be big integers).
_NESTED: Final = frozenset({dict, list, float})


def setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot setters of a frozen class's fields: a fast, direct write into an
    instance being built (its frozen ``__setattr__`` stands in the way of plain ones)."""
    out = []
    for name in names:
        slot = cls.__dict__.get(name)
        if isinstance(slot, types.MemberDescriptorType):
            out.append(slot.__set__)
        else:
            out.append(functools.partial(_set_named, name))
    return tuple(out)


def _set_named(name: str, instance: Any, value: Any) -> None:
    object.__setattr__(instance, name, value)


(_SET_TEXT,) = setters(TextContent, "text")
_SET_THINKING = setters(ThinkingContent, "thinking", "signature", "redacted")
_SET_IMAGE = setters(ImageContent, "data", "mime_type")
_SET_CALL = setters(ToolCall, "id", "name", "arguments", "parse_error")
_SET_USAGE = setters(Usage, "input", "output", "cache_read", "cache_write", "total_tokens", "cost")
_SET_ASSISTANT = setters(AssistantMessage, "content", "stop_reason", "error_message", "usage")
(_SET_USER,) = setters(UserMessage, "content")
_SET_OUTPUT = setters(ToolOutput, "content", "is_error", "usage", "requests", "retry")


def _fast_text(block: dict[str, Any]) -> TextContent:
    text = block["text"]
    if len(block) != 2 or type(text) is not str:  # "type" and "text"
        raise NotFastError
    out = new(TextContent)
    _SET_TEXT(out, text)
    return out


def _fast_thinking(block: dict[str, Any]) -> ThinkingContent:
    thinking = block["thinking"]
    signature = block.get("signature")
    redacted = block.get("redacted")
    if (
        len(block) != 2 + ("signature" in block) + ("redacted" in block)
        or type(thinking) is not str
        or (signature is not None and type(signature) is not str)
        or (redacted is not None and type(redacted) is not bool)
    ):
        raise NotFastError
    if ("signature" in block and signature is None) or ("redacted" in block and not redacted):
        block["type"] = INEXACT  # the wire form leaves these out
    out = new(ThinkingContent)
    set_thinking, set_signature, set_redacted = _SET_THINKING
    set_thinking(out, thinking)
    set_signature(out, signature)
    set_redacted(out, bool(redacted))
    return out


def _fast_image(block: dict[str, Any]) -> ImageContent:
    data = block["data"]
    mime_type = block["mimeType"]
    if len(block) != 3 or type(data) is not str or type(mime_type) is not str:
        raise NotFastError
    out = new(ImageContent)
    set_data, set_mime_type = _SET_IMAGE
    set_data(out, data)
    set_mime_type(out, mime_type)
    return out


def _fast_call(block: dict[str, Any]) -> ToolCall:
    call_id = block["id"]
    name = block["name"]
    arguments = block["arguments"]
    parse_error = block.get("parseError")
    if (
        len(block) != 4 + ("parseError" in block)
        or type(call_id) is not str
        or type(name) is not str
        or type(arguments) is not dict
        or (parse_error is not None and type(parse_error) is not str)
    ):
        raise NotFastError
    if _NESTED.isdisjoint(map(type, arguments.values())):  # flat: the common case
        frozen: Any = MappingProxyType(arguments)
        if parse_error is None and "parseError" in block:
            block["type"] = INEXACT  # the wire form leaves it out
    else:  # nested values are frozen in place, and floats are written otherwise
        frozen = _fast_freeze(arguments, _ARGUMENTS_DEPTH)
        block["type"] = INEXACT
    out = new(ToolCall)
    set_id, set_name, set_arguments, set_parse_error = _SET_CALL
    set_id(out, call_id)
    set_name(out, name)
    set_arguments(out, frozen)
    set_parse_error(out, parse_error)
    return out


_Blocks = dict[str, Callable[[dict[str, Any]], Any]]
_ASSISTANT_BLOCKS: Final[_Blocks] = {
    "text": _fast_text,
    "thinking": _fast_thinking,
    "toolCall": _fast_call,
}
_RESULT_BLOCKS: Final[_Blocks] = {"text": _fast_text, "image": _fast_image}


def _fast_blocks(content: Any, allowed: _Blocks) -> tuple[Any, ...]:
    if type(content) is not list:
        raise NotFastError
    # A block that is not an object, or of a type not allowed, raises here (TypeError,
    # KeyError): any exception sends the line to the exact decoder.
    if len(content) == 1:  # the common case, without a comprehension's frame
        block = content[0]
        return (allowed[block["type"]](block),)
    return tuple([allowed[block["type"]](block) for block in content])


def _fast_usage(value: Any) -> Usage:
    if type(value) is not dict or len(value) != 5 + ("cost" in value):
        raise NotFastError
    counts = (
        value["input"],
        value["output"],
        value["cacheRead"],
        value["cacheWrite"],
        value["totalTokens"],
    )
    if any(type(count) is not int for count in counts):
        raise NotFastError
    cost = value.get("cost")
    if cost is not None:
        kind = type(cost)
        if (kind is not float and kind is not int) or not -_FLOAT_BOUND < cost < _FLOAT_BOUND:
            raise NotFastError
        cost = float(cost)
    out = new(Usage)
    for setter, count in zip(_SET_USAGE, (*counts, cost), strict=True):
        setter(out, count)
    return out


def _fast_assistant(value: Any) -> AssistantMessage:
    if type(value) is not dict:
        raise NotFastError
    error = value.get("errorMessage")
    usage = value.get("usage")
    if (
        len(value) != 3 + ("errorMessage" in value) + ("usage" in value)
        or value["role"] != "assistant"
        or (error is not None and type(error) is not str)
    ):
        raise NotFastError
    out = new(AssistantMessage)
    set_content, set_stop_reason, set_error, set_usage = _SET_ASSISTANT
    set_content(out, _fast_blocks(value["content"], _ASSISTANT_BLOCKS))
    set_stop_reason(out, STOP_REASONS[value["stopReason"]])
    set_error(out, error)
    if usage is None:
        set_usage(out, None)
        if "usage" in value:
            value["role"] = INEXACT  # the wire form leaves it out
    else:
        set_usage(out, _fast_usage(usage))
        if "cost" in usage:  # a float, or null which the wire form leaves out
            value["role"] = INEXACT
    if error is None and "errorMessage" in value:
        value["role"] = INEXACT
    return out


def _fast_user(value: Any) -> UserMessage:
    if type(value) is not dict or len(value) != 2 or value["role"] != "user":
        raise NotFastError
    out = new(UserMessage)
    _SET_USER(out, _fast_blocks(value["content"], _RESULT_BLOCKS))
    return out


def _fast_output(value: Any) -> ToolOutput:
    if type(value) is not dict or len(value) != 2:  # "content" and "isError"
        raise NotFastError
    is_error = value["isError"]
    if type(is_error) is not bool:
        raise NotFastError
    out = new(ToolOutput)
    set_content, set_is_error, set_usage, set_requests, set_retry = _SET_OUTPUT
    set_content(out, _fast_blocks(value["content"], _RESULT_BLOCKS))
    set_is_error(out, is_error)
    # an output with usage (a sub-agent's) or a retry request has more keys: the exact
    # reader's
    set_usage(out, None)
    set_requests(out, 0)
    set_retry(out, False)
    return out


def _fast_field(field: attrs.Attribute[Any], hint: Any) -> Callable[[Any], Any]:
    """The fast decoder of one event field (a field with no entry here leaves its
    class to the exact decoder, which is always right, only slower)."""
    # The fast decoders check types; a field that checks or converts more must be
    # built by the class itself.
    if field.converter is not None and not (
        isinstance(hint, type) and issubclass(hint, enum.Enum) and field.converter is hint
    ):
        raise LookupError(field.name)
    if field.validator is not None and not isinstance(field.validator, _INSTANCE_OF):
        raise LookupError(field.name)
    if hint is str:
        return _fast_str
    if hint is bool:
        return _fast_bool
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {m.value: m for m in hint}.__getitem__
    fast: dict[Any, Callable[[Any], Any]] = {
        AssistantMessage: _fast_assistant,
        UserMessage: _fast_user,
        ToolOutput: _fast_output,
    }
    if hint in fast:
        return fast[hint]
    raise LookupError(field.name)


_INSTANCE_OF: Final = type(attrs.validators.instance_of(str))
_REQUIRED: Final = object()


_Spec = tuple[Callable[[Any, Any], None], str, Callable[[Any], Any], Any]
# (slot setter, wire key, decoder, default or _REQUIRED) of one event field


def _fast_event_builder(codec: ClassCodec) -> Callable[[dict[str, Any]], Event]:
    cls = codec.cls
    hints = typing.get_type_hints(cls, vars(_events))
    specs: list[_Spec] = []
    for field, (_, key, _, _, _) in zip(attrs.fields(cls), codec.fields, strict=True):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            raise LookupError(field.name)
        default = _REQUIRED if field.default is attrs.NOTHING else field.default
        (setter,) = setters(cls, field.name)
        specs.append((setter, key, _fast_field(field, hints[field.name]), default))

    if 1 <= len(specs) <= 2 and all(default is _REQUIRED for *_, default in specs):
        return _required_fields_builder(cls, specs)

    def build(data: dict[str, Any]) -> Event:
        event: Event = new(cls)
        known = 1  # "type"
        for setter, key, decode, default in specs:
            if key in data:
                setter(event, decode(data[key]))
                known += 1
            elif default is _REQUIRED:
                raise NotFastError
            else:
                setter(event, default)
        if known != len(data):  # a key that is not a field
            raise NotFastError
        return event

    return build


def _required_fields_builder(cls: type, specs: list[_Spec]) -> Callable[[dict[str, Any]], Event]:
    """The builder of an event of one or two fields, none with a default (the events
    of every turn: ``model_responded``, ``tool_finished``), unrolled: the same checks
    as the general builder (every field's key, and no other key than "type")."""
    if len(specs) == 1:
        ((setter, key, decode, _),) = specs

        def build_one(data: dict[str, Any]) -> Event:
            if len(data) != 2:
                raise NotFastError
            event: Event = new(cls)
            setter(event, decode(data[key]))  # KeyError when absent: not fast either
            return event

        return build_one
    (set_a, key_a, decode_a, _), (set_b, key_b, decode_b, _) = specs

    def build_two(data: dict[str, Any]) -> Event:
        if len(data) != 3:
            raise NotFastError
        event: Event = new(cls)
        set_a(event, decode_a(data[key_a]))
        set_b(event, decode_b(data[key_b]))
        return event

    return build_two


def _fast_event_builders() -> dict[str, Callable[[dict[str, Any]], Event]]:
    builders = {}
    for name, codec in EVENT_CODECS.items():
        try:
            builders[name] = _fast_event_builder(codec)
        except LookupError:
            continue
    return builders


FAST_EVENTS: Final = _fast_event_builders()
