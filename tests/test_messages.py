"""Messages and the wire format."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import statemachine as sm
import statemachine.engine
import statemachine.errors
import statemachine.messages
from statemachine.messages import StopReason

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
texts = st.builds(sm.TextContent, st.text(max_size=20))
images = st.builds(
    sm.ImageContent, st.text(max_size=8), st.sampled_from(["image/png", "image/jpeg"])
)
calls = st.builds(
    sm.ToolCall,
    st.text(min_size=1, max_size=6),
    st.text(min_size=1, max_size=6),
    st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    parse_error=st.none() | st.text(max_size=8),
)
thinking = st.builds(
    sm.messages.ThinkingContent,
    st.text(max_size=10),
    st.none() | st.text(max_size=5),
    redacted=st.booleans(),
)
usage = st.builds(
    sm.messages.Usage,
    *(st.integers(0, 10**6) for _ in range(5)),
    cost=st.none() | st.floats(0, 100, allow_nan=False),
)
messages = st.one_of(
    st.builds(sm.UserMessage, st.lists(texts | images, max_size=3)),
    st.builds(
        sm.AssistantMessage,
        st.lists(texts | thinking | calls, max_size=4),
        stop_reason=st.sampled_from(sm.messages.StopReason),
        error_message=st.none() | st.text(max_size=10),
        usage=st.none() | usage,
    ),
    st.builds(
        sm.ToolResultMessage,
        st.text(max_size=5),
        st.text(max_size=5),
        st.lists(texts | images, max_size=3),
        is_error=st.booleans(),
    ),
)


@given(messages)
def test_wire_round_trip_is_exact(message: sm.Message) -> None:
    import json

    wire = sm.messages.message_to_dict(message)
    assert sm.messages.message_from_dict(json.loads(json.dumps(wire))) == message
    assert sm.messages.message_to_dict(sm.messages.message_from_dict(wire)) == wire


def _same_structure(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (``==`` alone lets a list pass
    for a tuple inside a mapping, or a str for a StopReason)."""
    if type(a) is not type(b):
        return False
    if attrs.has(type(a)):
        return all(
            _same_structure(getattr(a, f.name), getattr(b, f.name)) for f in attrs.fields(type(a))
        )
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(_same_structure, a, b))
    if isinstance(a, MappingProxyType):
        return a.keys() == b.keys() and all(_same_structure(a[k], b[k]) for k in a)
    return bool(a == b)


@given(messages)
def test_parsed_messages_are_what_their_constructors_build(message: sm.Message) -> None:
    # The parser builds messages without re-running the classes' validators and
    # converters (its own checks are the same); what it builds must be exactly what
    # the constructor builds from the same values.
    import json

    parsed = sm.messages.message_from_dict(
        json.loads(json.dumps(sm.messages.message_to_dict(message)))
    )
    fields = attrs.fields(type(message))
    rebuilt = type(message)(**{f.name: getattr(parsed, f.name) for f in fields})
    assert _same_structure(parsed, message)
    assert _same_structure(parsed, rebuilt)


def test_wire_shape_matches_the_seed() -> None:
    assert sm.messages.message_to_dict(sm.UserMessage("list the files")) == {
        "role": "user",
        "content": [{"type": "text", "text": "list the files"}],
    }
    call = sm.AssistantMessage([sm.ToolCall("c1", "list_files", {})], stop_reason="toolUse")
    assert sm.messages.message_to_dict(call) == {
        "role": "assistant",
        "stopReason": "toolUse",
        "content": [{"type": "toolCall", "id": "c1", "name": "list_files", "arguments": {}}],
    }
    result = sm.ToolResultMessage("c1", "list_files", "README.md\nsrc/index.ts")
    assert sm.messages.message_to_dict(result) == {
        "role": "toolResult",
        "toolCallId": "c1",
        "toolName": "list_files",
        "isError": False,
        "content": [{"type": "text", "text": "README.md\nsrc/index.ts"}],
    }


@pytest.mark.parametrize(
    ("bad", "path"),
    [
        ({"role": "robot", "content": []}, "message.role"),
        ({"content": []}, "message: missing key 'role'"),
        ({"role": "user", "content": "hi"}, "message.content: expected list"),
        ({"role": "user", "content": [{"type": "toolCall"}]}, "message.content[0].type"),
        (
            {"role": "assistant", "stopReason": "done", "content": []},
            "message.stopReason: 'done' is not one of",
        ),
        (
            {
                "role": "assistant",
                "stopReason": "stop",
                "content": [{"type": "toolCall", "id": "a", "name": "x", "arguments": []}],
            },
            "message.content[0].arguments: expected Mapping",
        ),
        (
            {"role": "toolResult", "toolCallId": "a", "toolName": "x", "content": [], "isError": 0},
            "message.isError: expected bool",
        ),
        ({"role": "user", "content": [], "extra": 1}, "unknown key(s) 'extra'"),
        (
            {"role": "assistant", "stopReason": "stop", "content": [], "usage": {"input": True}},
            "message.usage.input: expected a number",
        ),
        ([], "message: expected an object"),
    ],
)
def test_malformed_wire_dicts_name_the_path(bad: Any, path: str) -> None:
    with pytest.raises(sm.errors.WireFormatError) as info:
        sm.messages.message_from_dict(bad)
    assert path in str(info.value)
    assert isinstance(info.value, ValueError)


def test_messages_from_dicts_names_the_index() -> None:
    with pytest.raises(sm.errors.WireFormatError, match=r"messages\[1\]\.role"):
        sm.messages.messages_from_dicts([{"role": "user", "content": []}, {"role": "x"}])


def test_tool_call_arguments_are_frozen_and_tools_get_a_copy() -> None:
    call = sm.ToolCall("c1", "t", {"a": [1, {"b": 2}]})
    with pytest.raises(TypeError):
        call.arguments["a"] = 3  # type: ignore[index]
    copy = call.arguments_dict()
    copy["a"].append(4)
    assert call.arguments_dict() == {"a": [1, {"b": 2}]}


def test_messages_are_immutable() -> None:
    message = sm.UserMessage("hi")
    with pytest.raises(AttributeError):
        message.content = ()  # type: ignore[misc]
    assert message.content == (sm.TextContent("hi"),)


def test_content_type_errors_are_clear() -> None:
    with pytest.raises(TypeError, match="user message content\\[0\\] is a ToolCall"):
        sm.UserMessage([sm.ToolCall("a", "b", {})])


def test_usage_adds_up() -> None:
    total = sm.messages.Usage(1, 2, 3, 4, 10, None) + sm.messages.Usage(1, 1, 1, 1, 4, 0.5)
    assert total == sm.messages.Usage(2, 3, 4, 5, 14, 0.5)


def test_wire_keys_beyond_the_seed_example() -> None:
    message = sm.AssistantMessage(
        [sm.messages.ThinkingContent("hmm", "sig"), sm.TextContent("a"), sm.TextContent("b")],
        stop_reason=sm.messages.StopReason.ERROR,
        error_message="overloaded",
        usage=sm.messages.Usage(1, 2, 3, 4, 10, 0.5),
    )
    assert sm.messages.message_to_dict(message) == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "a"},
            {"type": "text", "text": "b"},
        ],
        "stopReason": "error",
        "errorMessage": "overloaded",
        "usage": {
            "input": 1,
            "output": 2,
            "cacheRead": 3,
            "cacheWrite": 4,
            "totalTokens": 10,
            "cost": 0.5,
        },
    }
    unreadable = sm.AssistantMessage([sm.ToolCall("c1", "f", parse_error="not JSON: {x")])
    assert sm.messages.message_to_dict(unreadable)["content"] == [
        {"type": "toolCall", "id": "c1", "name": "f", "arguments": {}, "parseError": "not JSON: {x"}
    ]
    image = sm.UserMessage([sm.ImageContent("AAAA", "image/png")])
    assert sm.messages.message_to_dict(image)["content"] == [
        {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    ]


def test_text_joins_only_text_blocks() -> None:
    assistant = sm.AssistantMessage(
        [sm.messages.ThinkingContent("not this"), sm.TextContent("a"), sm.TextContent("b")]
    )
    assert assistant.text == "ab"
    result = sm.ToolResultMessage(
        "c", "t", [sm.TextContent("x"), sm.ImageContent("A", "image/png"), sm.TextContent("y")]
    )
    assert result.text == "x\ny"


@pytest.mark.parametrize(
    ("arguments", "needle"),
    [
        ({"a": {1, 2}}, "arguments.a: set is not a JSON value"),
        ({"a": float("nan")}, "arguments.a: nan is not a JSON number"),
        ({1: 2}, "arguments: object keys must be strings, got 1"),
        ({"a": [object()]}, "arguments.a[0]: object is not a JSON value"),
    ],
)
def test_tool_call_arguments_must_be_json(arguments: Any, needle: str) -> None:
    with pytest.raises(sm.errors.WireFormatError) as caught:
        sm.ToolCall("c1", "t", arguments)
    assert needle in str(caught.value)


def test_tool_calls_are_read_from_content_in_order() -> None:
    first, second = sm.ToolCall("a", "x", {}), sm.ToolCall("b", "y", {})
    message = sm.AssistantMessage([first, sm.TextContent("between"), second])
    assert message.tool_calls == (first, second)
    assert sm.AssistantMessage("only text").tool_calls == ()


@pytest.mark.parametrize(
    ("kind", "arguments"),
    [
        (sm.ToolResultMessage, {"is_error": "yes"}),
        (sm.ToolResultMessage, {"is_error": 1}),
        (sm.AssistantMessage, {"error_message": 5}),
        (sm.AssistantMessage, {"usage": {"input": 1}}),
        (sm.messages.ThinkingContent, {"signature": b"sig"}),
    ],
)
def test_fields_the_wire_reads_strictly_are_checked_when_built(
    kind: Any, arguments: dict[str, Any]
) -> None:
    # Otherwise a message could be built whose wire form cannot be read back, and a
    # journal or snapshot holding it would fail only when it is restored.
    positional = {
        sm.ToolResultMessage: ("c", "t", "x"),
        sm.AssistantMessage: ("x",),
        sm.messages.ThinkingContent: ("hm",),
    }[kind]
    with pytest.raises(TypeError):
        kind(*positional, **arguments)


@pytest.mark.parametrize(
    "arguments",
    [
        {"input": 1.5},
        {"output": True},
        {"total_tokens": "3"},
        {"cost": float("nan")},
        {"cost": "1"},
    ],
)
def test_usage_refuses_values_the_wire_cannot_carry_back(arguments: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="usage"):
        sm.messages.Usage(**arguments)


def test_usage_accepts_an_integer_cost() -> None:
    usage = sm.messages.Usage(cost=2)
    assert sm.messages.message_from_dict(
        sm.messages.message_to_dict(sm.AssistantMessage("x", usage=usage))
    ) == (sm.AssistantMessage("x", usage=usage))


# -- the hand-written constructors: the same checks and errors as attrs' own ------------


class _Text(str):
    """A str subclass: attrs' instance_of(str) accepts it, so must the fast path."""


_WRONG_FIELDS: list[tuple[Callable[[], object], type, str, object]] = [
    (lambda: sm.TextContent(1), sm.TextContent, "text", 1),  # type: ignore[arg-type]
    (lambda: sm.ToolCall(1, "n"), sm.ToolCall, "id", 1),  # type: ignore[arg-type]
    (lambda: sm.ToolCall("i", b"n"), sm.ToolCall, "name", b"n"),  # type: ignore[arg-type]
    (lambda: sm.ToolCall(2, b"n"), sm.ToolCall, "id", 2),  # type: ignore[arg-type]
    (
        lambda: sm.ToolCall("i", "n", parse_error=3),  # type: ignore[arg-type]
        sm.ToolCall,
        "parse_error",
        3,
    ),
    (
        lambda: sm.AssistantMessage("x", error_message=3),  # type: ignore[arg-type]
        sm.AssistantMessage,
        "error_message",
        3,
    ),
    (
        lambda: sm.AssistantMessage("x", usage={}),  # type: ignore[arg-type]
        sm.AssistantMessage,
        "usage",
        {},
    ),
    (
        lambda: sm.ToolResultMessage(1, "n", "t"),  # type: ignore[arg-type]
        sm.ToolResultMessage,
        "tool_call_id",
        1,
    ),
    (
        lambda: sm.ToolResultMessage("i", None, "t"),  # type: ignore[arg-type]
        sm.ToolResultMessage,
        "tool_name",
        None,
    ),
    (
        lambda: sm.ToolResultMessage("i", "n", "t", 1),  # type: ignore[arg-type]
        sm.ToolResultMessage,
        "is_error",
        1,
    ),
    (
        lambda: sm.engine.ModelResponded("x"),  # type: ignore[arg-type]
        sm.engine.ModelResponded,
        "message",
        "x",
    ),
    (
        lambda: sm.engine.ToolFinished(1, sm.ToolOutput("x")),  # type: ignore[arg-type]
        sm.engine.ToolFinished,
        "call_id",
        1,
    ),
    (
        lambda: sm.engine.ToolFinished("i", "x"),  # type: ignore[arg-type]
        sm.engine.ToolFinished,
        "output",
        "x",
    ),
]


@pytest.mark.parametrize(("build", "cls", "name", "value"), _WRONG_FIELDS)
def test_a_wrong_field_raises_the_error_of_its_attrs_validator(
    build: Callable[[], object], cls: type, name: str, value: object
) -> None:
    field = attrs.fields_dict(cls)[name]
    assert field.validator is not None
    with pytest.raises(TypeError) as expected:
        field.validator(None, field, value)
    with pytest.raises(TypeError) as raised:
        build()
    assert raised.value.args == expected.value.args


def test_subclasses_of_the_field_types_are_accepted_as_before() -> None:
    call = sm.ToolCall(_Text("i"), _Text("n"), {"a": _Text("b")}, parse_error=_Text("p"))
    assert call == sm.ToolCall("i", "n", {"a": "b"}, parse_error="p")
    assert sm.TextContent(_Text("t")) == sm.TextContent("t")
    result = sm.ToolResultMessage(_Text("i"), _Text("n"), _Text("t"))
    assert result == sm.ToolResultMessage("i", "n", "t")
    assert sm.AssistantMessage("x", error_message=_Text("e")).error_message == "e"


def test_converters_run_as_before() -> None:
    assert sm.ToolCall("i", "n").arguments == {}
    with pytest.raises(sm.errors.WireFormatError, match="must be a JSON object"):
        sm.ToolCall("i", "n", None)  # type: ignore[arg-type]
    with pytest.raises(sm.errors.WireFormatError, match=r"arguments\.k"):
        sm.ToolCall("i", "n", {"k": float("inf")})
    with pytest.raises(sm.errors.WireFormatError, match="keys must be strings"):
        sm.ToolCall("i", "n", {1: "v"})  # type: ignore[dict-item]
    nested = sm.ToolCall("i", "n", {"k": [{"x": 1}]})
    assert nested.arguments_dict() == {"k": [{"x": 1}]}
    assert sm.AssistantMessage("x", stop_reason="toolUse").stop_reason is StopReason.TOOL_USE
    with pytest.raises(ValueError, match="bogus"):
        sm.AssistantMessage("x", stop_reason="bogus")
    blocks = [sm.TextContent("a")]
    assert sm.UserMessage(blocks).content == (sm.TextContent("a"),)
    message = sm.AssistantMessage((sm.ToolCall("i", "n", {"a": 1}),), stop_reason="toolUse")
    assert attrs.evolve(message, error_message="e") == sm.AssistantMessage(
        message.content, StopReason.TOOL_USE, "e"
    )


def test_a_result_of_checked_values_equals_one_built_with_checks() -> None:
    from statemachine.core.messages import checked_result

    content = (sm.TextContent("ok"),)
    built = checked_result("c1", "echo", content, False)
    assert type(built) is sm.ToolResultMessage
    assert built == sm.ToolResultMessage("c1", "echo", content, is_error=False)
    assert hash(built) == hash(sm.ToolResultMessage("c1", "echo", "ok"))
    assert repr(built) == repr(sm.ToolResultMessage("c1", "echo", "ok"))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.is_error = True  # type: ignore[misc]
