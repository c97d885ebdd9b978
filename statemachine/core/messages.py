"""Messages and their content blocks.

Everything here is a frozen, slotted attrs class holding tuples, never lists, so a
message that has entered a history can never change under it (invariant I2 holds by
construction, not by discipline). Tool-call arguments are JSON values; they are
frozen deeply (objects become read-only mappings, arrays become tuples) and thawed
back into plain ``dict``/``list`` for a tool and for the wire, so a tool that mutates
its arguments cannot rewrite the history.

The wire shape is a camelCase JSON (see the README). ``message_from_dict``
is strict: anything that is not exactly that shape raises ``WireFormatError`` naming
the path of the first problem (``message.content[2].arguments``), because a
transcript that half-parses is worse than one that is refused.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Final, TypeAlias, TypeGuard

import attrs

from statemachine.errors import WireFormatError

__all__ = [
    "AssistantContent",
    "AssistantMessage",
    "ImageContent",
    "Message",
    "StopReason",
    "TextContent",
    "ThinkingContent",
    "ToolCall",
    "ToolResultContent",
    "ToolResultMessage",
    "Usage",
    "UserContent",
    "UserMessage",
    "freeze_json",
    "thaw_json",
]


# dict first: a concrete-type check is far cheaper than the Mapping ABC check, and
# almost every value here is a dict (parsed JSON) or a MappingProxyType (frozen).
_MAPPINGS: tuple[type, ...] = (dict, MappingProxyType, Mapping)


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(value, _MAPPINGS)


class StopReason(enum.StrEnum):
    """Why the model stopped. It explains a state; it never drives control flow."""

    STOP = "stop"
    TOOL_USE = "toolUse"
    LENGTH = "length"
    ERROR = "error"
    ABORTED = "aborted"


# -- JSON values -----------------------------------------------------------------


def freeze_json(value: Any, path: str = "value") -> Any:
    """Return a deeply immutable copy of a JSON value; raise on non-JSON values."""
    try:
        return _freeze(value)
    except _NotJsonError:
        # Walk again to name the bad value's path: building a path for every key on
        # the way down would cost more than the freezing itself (replay, bench/).
        _explain_not_json(value, path)
        raise AssertionError("unreachable: _freeze refused a value that is JSON") from None
    except RecursionError:
        # Deeper than the interpreter can walk: no JSON a run writes nests like this.
        raise WireFormatError(f"{path}: nested too deeply to be read") from None


class _NotJsonError(Exception):
    """Raised by ``_freeze``; ``freeze_json`` turns it into a ``WireFormatError``."""


_JSON_SCALARS: Final = frozenset({str, int, bool, type(None)})


def _freeze(value: Any) -> Any:
    kind = type(value)
    if kind in _JSON_SCALARS:
        return value
    # Arrays before objects: the Mapping ABC check that objects may need is slow.
    if isinstance(value, (list, tuple)):
        return tuple([_freeze(item) for item in value])
    if _is_mapping(value):
        frozen: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _NotJsonError
            frozen[key] = _freeze(item)
        return MappingProxyType(frozen)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJsonError
        return value
    if isinstance(value, (bool, int, str)) or value is None:  # subclasses of scalars
        return value
    raise _NotJsonError


def _explain_not_json(value: Any, path: str) -> None:
    """Raise ``WireFormatError`` naming the first non-JSON value under ``value``."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise WireFormatError(f"{path}: {value!r} is not a JSON number")
        return
    if _is_mapping(value):
        for key, item in value.items():
            if not isinstance(key, str):
                raise WireFormatError(f"{path}: object keys must be strings, got {key!r}")
            _explain_not_json(item, f"{path}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _explain_not_json(item, f"{path}[{i}]")
        return
    raise WireFormatError(f"{path}: {type(value).__name__} is not a JSON value")


def thaw_json(value: Any) -> Any:
    """Return a plain, mutable ``dict``/``list`` copy of a frozen JSON value."""
    if type(value) in _JSON_SCALARS:
        return value
    if _is_mapping(value):
        return {key: thaw_json(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [thaw_json(item) for item in value]
    return value


def _freeze_arguments(value: Mapping[str, Any]) -> Mapping[str, Any]:
    if value.__class__ is dict or value.__class__ is MappingProxyType:
        # The common case (an object of scalars, string keys) in one pass; anything
        # else takes the general path below, which also names what is wrong.
        frozen: dict[str, Any] = {}
        try:
            for key, item in value.items():
                if key.__class__ is not str:
                    raise _NotJsonError
                frozen[key] = item if item.__class__ in _JSON_SCALARS else _freeze(item)
        except (_NotJsonError, RecursionError):
            pass
        else:
            return MappingProxyType(frozen)
    if not _is_mapping(value):
        raise WireFormatError(
            f"tool call arguments must be a JSON object, got {type(value).__name__}"
        )
    general: Mapping[str, Any] = freeze_json(value, "arguments")
    return general


# -- content blocks -------------------------------------------------------------


# Fields the wire format reads back strictly are checked on the way in too, so that
# every message that can be built survives message_to_dict/message_from_dict.
_optional_str = attrs.validators.optional(attrs.validators.instance_of(str))

# The classes a run builds on every turn (text, tool calls, the three messages) write
# their own ``__init__``: the common case (exact types) is one type test per field,
# and anything else goes through the field's own attrs validator, which raises the
# very error the attrs-made ``__init__`` raised. Converters run first, then the
# checks, in field order, as attrs orders them.
_set = object.__setattr__


def _validate(cls: type, name: str, instance: object, value: object) -> None:
    """Run the attrs validator of ``cls.name`` on ``value`` (it raises if it must)."""
    field = attrs.fields_dict(cls)[name]
    assert field.validator is not None
    field.validator(instance, field, value)


@attrs.frozen(init=False)
class TextContent:
    """Plain text."""

    type: ClassVar[str] = "text"
    text: str = attrs.field(validator=attrs.validators.instance_of(str))

    def __init__(self, text: str) -> None:
        if text.__class__ is not str:
            _validate(TextContent, "text", self, text)
        _set(self, "text", text)


@attrs.frozen
class ThinkingContent:
    """A model's reasoning, with the provider's opaque signature when it gives one.

    A ``redacted`` block is reasoning the provider encrypted (Anthropic's
    ``redacted_thinking``): ``thinking`` is empty and ``signature`` holds the encrypted
    data, which must go back to the provider unchanged for the conversation to go on.
    """

    type: ClassVar[str] = "thinking"
    thinking: str = attrs.field(validator=attrs.validators.instance_of(str))
    signature: str | None = attrs.field(default=None, validator=_optional_str)
    redacted: bool = attrs.field(
        default=False, kw_only=True, validator=attrs.validators.instance_of(bool)
    )


@attrs.frozen
class ImageContent:
    """An image as base64 data and its MIME type."""

    type: ClassVar[str] = "image"
    data: str = attrs.field(validator=attrs.validators.instance_of(str))
    mime_type: str = attrs.field(validator=attrs.validators.instance_of(str))


_NO_ARGUMENTS: Final[Mapping[str, Any]] = MappingProxyType({})  # never frozen, only compared


@attrs.frozen(init=False)
class ToolCall:
    """A request by the model to run a tool. ``arguments`` is a read-only JSON object.

    ``parse_error`` is set when the model's argument text could not be read as a JSON
    object (a provider adapter says why and quotes the text; ``arguments`` is then
    empty). The engine answers such a call with an error result and never runs it,
    whatever the tool's schema would have let through.
    """

    type: ClassVar[str] = "toolCall"
    id: str = attrs.field(validator=attrs.validators.instance_of(str))
    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    arguments: Mapping[str, Any] = attrs.field(
        factory=lambda: MappingProxyType({}), converter=_freeze_arguments
    )
    parse_error: str | None = attrs.field(default=None, validator=_optional_str, kw_only=True)

    def __init__(
        self,
        id: str,
        name: str,
        arguments: Mapping[str, Any] = _NO_ARGUMENTS,
        *,
        parse_error: str | None = None,
    ) -> None:
        if arguments is _NO_ARGUMENTS:
            frozen: Mapping[str, Any] = MappingProxyType({})
        else:
            frozen = _freeze_arguments(arguments)
        _set(self, "id", id)
        _set(self, "name", name)
        _set(self, "arguments", frozen)
        _set(self, "parse_error", parse_error)
        if id.__class__ is not str:
            _validate(ToolCall, "id", self, id)
        if name.__class__ is not str:
            _validate(ToolCall, "name", self, name)
        if parse_error is not None and parse_error.__class__ is not str:
            _validate(ToolCall, "parse_error", self, parse_error)

    def arguments_dict(self) -> dict[str, Any]:
        """A fresh, mutable copy of the arguments (what a tool receives)."""
        # One pass over the (usually flat) object; nested values are thawed in turn.
        return {
            key: item if item.__class__ in _JSON_SCALARS else thaw_json(item)
            for key, item in self.arguments.items()
        }


UserContent: TypeAlias = TextContent | ImageContent
AssistantContent: TypeAlias = TextContent | ThinkingContent | ToolCall
ToolResultContent: TypeAlias = TextContent | ImageContent


def _blocks(value: Any, allowed: tuple[type, ...], role: str) -> tuple[Any, ...]:
    if value.__class__ is tuple:
        # The common case, a tuple of exact block classes: nothing to convert.
        for block in value:
            if block.__class__ not in allowed:
                break
        else:
            return value
    if isinstance(value, str):
        value = (TextContent(value),)
    elif not isinstance(value, Iterable):
        raise TypeError(f"{role} content must be a str or a sequence of blocks")
    blocks = tuple(value)
    for i, block in enumerate(blocks):
        if not isinstance(block, allowed):
            names = ", ".join(cls.__name__ for cls in allowed)
            raise TypeError(f"{role} content[{i}] is a {type(block).__name__}; expected {names}")
    return blocks


_USER_BLOCKS: Final = (TextContent, ImageContent)
_ASSISTANT_BLOCKS: Final = (TextContent, ThinkingContent, ToolCall)
_RESULT_BLOCKS: Final = (TextContent, ImageContent)


def _user_content(value: Any) -> tuple[UserContent, ...]:
    return _blocks(value, _USER_BLOCKS, "user message")


def _assistant_content(value: Any) -> tuple[AssistantContent, ...]:
    return _blocks(value, _ASSISTANT_BLOCKS, "assistant message")


def _result_content(value: Any) -> tuple[ToolResultContent, ...]:
    return _blocks(value, _RESULT_BLOCKS, "tool result")


# -- usage ----------------------------------------------------------------------------


def _count(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"usage {attribute.name} must be an int, got {value!r}")


def _cost(_: object, __: object, value: float | None) -> None:
    # NaN is refused too: it is never equal to itself, so no round trip could match.
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or value != value
    ):
        raise TypeError(f"usage cost must be a number or None, got {value!r}")


@attrs.frozen
class Usage:
    """Token usage of one model response; ``cost`` is in USD when a provider gives it."""

    input: int = attrs.field(default=0, validator=_count)
    output: int = attrs.field(default=0, validator=_count)
    cache_read: int = attrs.field(default=0, validator=_count)
    cache_write: int = attrs.field(default=0, validator=_count)
    total_tokens: int = attrs.field(default=0, validator=_count)
    cost: float | None = attrs.field(default=None, validator=_cost)

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        cost: float | None
        if self.cost is None and other.cost is None:
            cost = None
        else:
            cost = (self.cost or 0.0) + (other.cost or 0.0)
        return Usage(
            input=self.input + other.input,
            output=self.output + other.output,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            total_tokens=self.total_tokens + other.total_tokens,
            cost=cost,
        )


# -- messages -----------------------------------------------------------------------


@attrs.frozen(init=False)
class UserMessage:
    """Input from a person (or a caller speaking for one). A str becomes one text block."""

    role: ClassVar[str] = "user"
    content: tuple[UserContent, ...] = attrs.field(converter=_user_content)

    def __init__(self, content: Any) -> None:
        _set(self, "content", _blocks(content, _USER_BLOCKS, "user message"))

    @property
    def text(self) -> str:
        """All text blocks joined by newlines (images excluded)."""
        return "\n".join(b.text for b in self.content if isinstance(b, TextContent))


@attrs.frozen(init=False)
class AssistantMessage:
    """One model response: text, thinking and tool calls, in the order the model gave them."""

    role: ClassVar[str] = "assistant"
    content: tuple[AssistantContent, ...] = attrs.field(converter=_assistant_content)
    stop_reason: StopReason = attrs.field(default=StopReason.STOP, converter=StopReason)
    error_message: str | None = attrs.field(default=None, validator=_optional_str)
    usage: Usage | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Usage))
    )

    def __init__(
        self,
        content: Any,
        stop_reason: StopReason | str = StopReason.STOP,
        error_message: str | None = None,
        usage: Usage | None = None,
    ) -> None:
        _set(self, "content", _blocks(content, _ASSISTANT_BLOCKS, "assistant message"))
        if stop_reason.__class__ is not StopReason:
            stop_reason = StopReason(stop_reason)
        _set(self, "stop_reason", stop_reason)
        _set(self, "error_message", error_message)
        _set(self, "usage", usage)
        if error_message is not None and error_message.__class__ is not str:
            _validate(AssistantMessage, "error_message", self, error_message)
        if usage is not None and usage.__class__ is not Usage:
            _validate(AssistantMessage, "usage", self, usage)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls, in content order. Their presence, not the stop reason,
        decides whether tools run."""
        return tuple([block for block in self.content if isinstance(block, ToolCall)])

    @property
    def text(self) -> str:
        """All text blocks joined (thinking excluded)."""
        return "".join(b.text for b in self.content if isinstance(b, TextContent))


@attrs.frozen(init=False)
class ToolResultMessage:
    """The one result of one tool call. ``is_error`` marks every failure path."""

    role: ClassVar[str] = "toolResult"
    tool_call_id: str = attrs.field(validator=attrs.validators.instance_of(str))
    tool_name: str = attrs.field(validator=attrs.validators.instance_of(str))
    content: tuple[ToolResultContent, ...] = attrs.field(converter=_result_content)
    is_error: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    def __init__(
        self,
        tool_call_id: str,
        tool_name: str,
        content: Any,
        is_error: bool = False,
    ) -> None:
        _set(self, "tool_call_id", tool_call_id)
        _set(self, "tool_name", tool_name)
        _set(self, "content", _blocks(content, _RESULT_BLOCKS, "tool result"))
        _set(self, "is_error", is_error)
        if tool_call_id.__class__ is not str:
            _validate(ToolResultMessage, "tool_call_id", self, tool_call_id)
        if tool_name.__class__ is not str:
            _validate(ToolResultMessage, "tool_name", self, tool_name)
        if is_error.__class__ is not bool:
            _validate(ToolResultMessage, "is_error", self, is_error)

    @property
    def text(self) -> str:
        """All text blocks joined by newlines."""
        return "\n".join(b.text for b in self.content if isinstance(b, TextContent))


def checked_result(
    tool_call_id: str, tool_name: str, content: tuple[ToolResultContent, ...], is_error: bool
) -> ToolResultMessage:
    """A ``ToolResultMessage`` of values that were checked when they were made (a
    ``ToolCall``'s id and name, a ``ToolOutput``'s content and flag): the engine's
    results, built without checking them again."""
    message: ToolResultMessage = object.__new__(ToolResultMessage)
    _set(message, "tool_call_id", tool_call_id)
    _set(message, "tool_name", tool_name)
    _set(message, "content", content)
    _set(message, "is_error", is_error)
    return message


Message: TypeAlias = UserMessage | AssistantMessage | ToolResultMessage
