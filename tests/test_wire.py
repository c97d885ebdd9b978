"""The one JSON form (statemachine.core.wire): round trips of everything it writes,
strict reading of what it is given, and the digest's text of a message."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import statemachine.messages as public_messages
from statemachine.core import wire
from statemachine.core.engine import Engine
from statemachine.core.events import Action, ModelResponded, ReturnToCaller, Start, ToolFinished
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
)
from statemachine.core.table import TurnState
from statemachine.core.tools import Scheduling, ToolDefinition, ToolOutput
from statemachine.errors import WireFormatError
from statemachine.journal import _digest

# -- strategies ---------------------------------------------------------------------------

# Any code point, lone surrogates and control characters included: a cut-off model
# stream can leave any of them in a string.
_text = st.text(st.characters(codec=None, categories=None), max_size=8)
_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),  # beyond 64 bits too
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_json = st.recursive(
    _json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=8,
)
_plain = st.builds(TextContent, _text)
_image = st.builds(ImageContent, _text, _text)
_thinking = st.builds(ThinkingContent, _text, st.none() | _text, redacted=st.booleans())
_call = st.builds(
    ToolCall,
    _text,
    _text,
    st.dictionaries(_text, _json, max_size=3),
    parse_error=st.none() | _text,
)
_usage = st.builds(
    Usage,
    *(st.integers(0, 2**40) for _ in range(5)),
    cost=st.none() | st.floats(0, 1e6) | st.integers(0, 100),
)
messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(UserMessage, st.lists(_plain | _image, max_size=3)),
    st.builds(
        AssistantMessage,
        st.lists(_plain | _thinking | _call, max_size=3),
        st.sampled_from(StopReason),
        st.none() | _text,
        st.none() | _usage,
    ),
    st.builds(
        ToolResultMessage, _text, _text, st.lists(_plain | _image, max_size=3), st.booleans()
    ),
)


def _through_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


# -- round trips --------------------------------------------------------------------------


@given(messages)
def test_every_message_round_trips_through_json(message: Message) -> None:
    d = wire.message_to_dict(message)
    assert wire.message_from_dict(_through_json(d)) == message
    assert wire.message_to_dict(wire.message_from_dict(d)) == d


@given(st.lists(messages, max_size=4))
def test_a_history_round_trips_and_paths_name_the_index(history: list[Message]) -> None:
    assert wire.messages_from_dicts(_through_json(wire.messages_to_dicts(history))) == history
    with pytest.raises(WireFormatError, match=r"messages\[1\]\.role"):
        wire.messages_from_dicts([wire.message_to_dict(UserMessage("a")), {"role": "x"}])


def test_tool_definitions_outputs_and_schedulings_round_trip() -> None:
    definition = ToolDefinition(
        "echo", "Echo.", {"type": "object", "properties": {"t": {"type": "string"}}}
    )
    assert (
        wire.tool_definition_from_dict(_through_json(wire.tool_definition_to_dict(definition)))
        == definition
    )
    output = ToolOutput((TextContent("hi"), ImageContent("AA==", "image/png")), is_error=True)
    assert wire.tool_output_from_dict(_through_json(wire.tool_output_to_dict(output))) == output
    assert wire.tool_output_to_dict(output) == {
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "image", "data": "AA==", "mimeType": "image/png"},
        ],
        "isError": True,
    }
    for scheduling in (Scheduling(), Scheduling(sequential=True)):
        assert wire.scheduling_from_dict(wire.scheduling_to_dict(scheduling)) == scheduling
    # A resources function cannot be written down: the form says there was one.
    with_function = Scheduling(resources=lambda arguments: ())
    assert wire.scheduling_to_dict(with_function) == {"sequential": False, "resources": True}


def _actions_of_a_run() -> list[Action]:
    definition = ToolDefinition("echo", "Echo.", {"type": "object", "properties": {}})
    engine = Engine(tools=[definition], messages=[UserMessage("go")], max_turns=2)
    actions = list(engine.handle(Start()))
    call = ToolCall("c1", "echo", {"x": [1, {"y": None}]})
    actions += engine.handle(ModelResponded(AssistantMessage((call,), StopReason.TOOL_USE)))
    actions += engine.handle(ToolFinished("c1", ToolOutput("done")))
    actions += engine.handle(ModelResponded(AssistantMessage("bye")))
    return actions


def test_every_action_of_a_run_round_trips_through_json() -> None:
    actions = _actions_of_a_run()
    kinds = {type(action).__name__ for action in actions}
    assert {"CallModel", "StartTool", "ReturnToCaller"} <= kinds
    for action in actions:
        d = wire.action_to_dict(action)
        assert d["type"] == type(action).__name__
        assert wire.action_to_dict(wire.action_from_dict(_through_json(d))) == d


def test_every_action_class_has_a_codec() -> None:
    assert set(wire.ACTION_CODECS) == {
        "CallModel",
        "CheckPermission",
        "StartTool",
        "CancelOperations",
        "CheckContinue",
        "RunStep",
        "ReturnToCaller",
    }


def test_an_action_written_under_its_former_name_still_reads() -> None:
    old = {"type": "RunEnded", "state": "Done", "explanation": "finished"}
    action = wire.action_from_dict(old)
    assert action == ReturnToCaller(TurnState.DONE, "finished")
    assert wire.action_to_dict(action)["type"] == "ReturnToCaller"


def test_an_event_is_not_an_action_nor_the_other_way_round() -> None:
    with pytest.raises(TypeError, match="not an action"):
        wire.action_to_dict(Start())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an engine event"):
        wire.event_to_dict(_actions_of_a_run()[0])  # type: ignore[arg-type]
    with pytest.raises(WireFormatError, match="'Start' is not an action type"):
        wire.action_from_dict({"type": "Start"})


# -- strict reading -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("read", "value", "where"),
    [
        (wire.message_from_dict, [], "message: expected an object"),
        (wire.message_from_dict, {"role": "user", "content": "hi"}, "message.content"),
        (wire.message_from_dict, {"role": "user", "content": [], "x": 1}, "unknown key"),
        (
            wire.message_from_dict,
            {"role": "user", "content": [{"type": "toolCall"}]},
            r"message.content\[0\].type",
        ),
        (wire.tool_definition_from_dict, {"name": 3, "description": ""}, "tool.name"),
        (wire.tool_definition_from_dict, "echo", "tool: expected an object"),
        (wire.tool_output_from_dict, {"content": []}, "output: expected an object with keys"),
        (wire.tool_output_from_dict, {"content": "x", "isError": False}, "output.content"),
        (wire.tool_output_from_dict, {"content": [], "isError": 1}, "output.isError"),
        (
            wire.tool_output_from_dict,
            {"content": [{"type": "thinking", "thinking": ""}], "isError": False},
            r"output.content\[0\].type",
        ),
        (wire.scheduling_from_dict, {"sequential": 1, "resources": False}, "scheduling"),
        # A CamelCase name may be a state a team declared with its steps; this is none.
        (wire.action_from_dict, {"type": "ReturnToCaller", "state": "no where"}, "action.state"),
        (wire.action_from_dict, {"type": "CheckContinue"}, "missing key 'turn'"),
        (wire.action_from_dict, {"type": "CheckContinue", "turn": True}, "action.turn"),
        (wire.event_from_dict, {"type": "Start", "extra": 1}, "unknown key"),
    ],
)
def test_what_is_not_the_shape_is_refused_naming_where(
    read: Callable[[Any], Any], value: Any, where: str
) -> None:
    with pytest.raises(WireFormatError, match=where):
        read(value)


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def test_arguments_nested_past_what_the_interpreter_can_walk_are_refused() -> None:
    call = {
        "type": "toolCall",
        "id": "c1",
        "name": "echo",
        "arguments": {"deep": _nested(100_000)},
    }
    message = {"role": "assistant", "content": [call], "stopReason": "toolUse"}
    with pytest.raises(WireFormatError, match=r"arguments: nested too deeply"):
        wire.message_from_dict(message)


def test_the_public_messages_module_exports_the_wire_codec() -> None:
    assert public_messages.message_to_dict is wire.message_to_dict
    assert public_messages.messages_from_dicts is wire.messages_from_dicts


# -- the digest's text of a message ----------------------------------------------------------


def _by_definition(message: Message) -> bytes:
    text = json.dumps(
        wire.message_to_dict(message), sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return text.encode("utf-8", "surrogatepass")


def _canonical_is_the_definition(message: Message) -> bool:
    return _digest.canonical_message(message) == _by_definition(message)


@given(messages)
def test_the_digest_text_of_a_message_is_its_sorted_wire_text(message: Message) -> None:
    assert _canonical_is_the_definition(message)


def test_the_digest_text_property_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    # Keys out of order: the property above must notice.
    monkeypatch.setitem(
        _digest._BLOCKS,
        TextContent,
        lambda b: b'{"type":"text","text":' + json.dumps(b.text).encode() + b"}",
    )
    assert not _canonical_is_the_definition(UserMessage("x"))
