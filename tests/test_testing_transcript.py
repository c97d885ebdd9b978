"""``check_transcript`` over our histories and OpenAI / Anthropic ones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from statemachine import (
    AssistantMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    message_to_dict,
)
from statemachine.testing import check_transcript, render_transcript

# -- our format ---------------------------------------------------------------------------


def _ours(*ids_and_results: Any) -> list[Any]:
    return [UserMessage("go"), *ids_and_results]


def _call(*ids: str) -> AssistantMessage:
    return AssistantMessage(tuple(ToolCall(i, "read", {}) for i in ids), stop_reason="toolUse")


def _res(call_id: str) -> ToolResultMessage:
    return ToolResultMessage(call_id, "read", "ok")


def test_valid_history_has_no_violation() -> None:
    history = _ours(_call("a", "b"), _res("a"), _res("b"), AssistantMessage("done"))
    assert check_transcript(history) == []
    assert check_transcript([message_to_dict(m) for m in history]) == []


@pytest.mark.parametrize(
    ("history", "invariant", "index", "words"),
    [
        (_ours(_call("a"), AssistantMessage("done")), "I1", 1, "no result"),
        (_ours(_call("a"), _res("a"), _res("a")), "I1", 3, "second result"),
        (_ours(_res("z")), "I1", 1, "no matching call"),
        (_ours(_call("a", "b"), _res("b"), _res("a")), "I2", 2, "comes before"),
        (
            _ours(_call("a"), AssistantMessage("x"), _res("a")),
            "I1",
            3,
            "after the next assistant message",
        ),
        (_ours(_call("a"), _res("a"), _call("a"), _res("a")), "I1", 3, "repeats the id"),
    ],
)
def test_each_kind_of_damage_is_named(
    history: list[Any], invariant: str, index: int, words: str
) -> None:
    violations = check_transcript(history)
    assert any(
        v.invariant == invariant and v.index == index and words in v.message for v in violations
    ), violations


def test_unreadable_wire_dict_is_reported_not_raised() -> None:
    violations = check_transcript([{"role": "user", "content": 3}, message_to_dict(_call("a"))])
    assert [v.invariant for v in violations] == ["format", "I1"]
    assert violations[0].index == 0


def test_unknown_format_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown transcript format 'gemini'"):
        check_transcript([], format="gemini")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a sequence"):
        check_transcript("not a list")


# -- OpenAI Chat Completions ---------------------------------------------------------------


def _oa_call(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": i,
                "type": "function",
                "function": {"name": "read", "arguments": json.dumps({"path": "a"})},
            }
            for i in ids
        ],
    }


def _oa_res(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


SYSTEM = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "go"}


def test_openai_valid_history() -> None:
    history = [SYSTEM, USER, _oa_call("a", "b"), _oa_res("a"), _oa_res("b")]
    history.append({"role": "assistant", "content": "done"})
    assert check_transcript(history, format="openai") == []


@pytest.mark.parametrize(
    ("history", "invariant", "index", "words"),
    [
        ([SYSTEM, USER, _oa_call("a"), USER], "I1", 2, "has no result"),
        ([USER, _oa_call("a"), _oa_res("a"), _oa_res("a")], "I1", 3, "second result"),
        ([USER, _oa_res("zz")], "I1", 1, "no matching call"),
        ([SYSTEM, USER, _oa_call("a", "b"), _oa_res("b"), _oa_res("a")], "I2", 3, "before"),
        (
            [USER, _oa_call("a"), {"role": "assistant", "content": "x"}, _oa_res("a")],
            "I1",
            3,
            "after the next assistant",
        ),
        ([USER, _oa_call("a", "a"), _oa_res("a"), _oa_res("a")], "I1", 1, "repeats the id"),
        ([USER, _oa_call("a"), USER, _oa_res("a")], "I1", 3, "right after the assistant"),
    ],
)
def test_openai_damage_is_named_with_the_original_index(
    history: list[Any], invariant: str, index: int, words: str
) -> None:
    violations = check_transcript(history, format="openai")
    assert any(
        v.invariant == invariant and v.index == index and words in v.message for v in violations
    ), violations


# -- Anthropic Messages -------------------------------------------------------------------


def _an_call(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": "let me look"}]
        + [{"type": "tool_use", "id": i, "name": "read", "input": {}} for i in ids],
    }


def _an_res(*ids: str, text: str | None = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in ids
    ]
    if text is not None:
        blocks.append({"type": "text", "text": text})
    return {"role": "user", "content": blocks}


def test_anthropic_valid_history() -> None:
    history = [
        {"role": "user", "content": "go"},
        _an_call("a", "b"),
        _an_res("a", "b", text="and then?"),
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
    ]
    assert check_transcript(history, format="anthropic") == []


@pytest.mark.parametrize(
    ("history", "invariant", "index", "words"),
    [
        ([{"role": "user", "content": "go"}, _an_call("a")], "I1", 1, "has no result"),
        ([_an_res("x")], "I1", 0, "no matching call"),
        (
            [{"role": "user", "content": "go"}, _an_call("a", "b"), _an_res("b", "a")],
            "I2",
            2,
            "comes before",
        ),
        (
            [{"role": "user", "content": "go"}, _an_call("a"), _an_res("a"), _an_res("a")],
            "I1",
            3,
            "second result",
        ),
        (
            [
                {"role": "user", "content": "go"},
                _an_call("a"),
                {"role": "user", "content": "wait"},
                _an_res("a"),
            ],
            "I1",
            3,
            "in the user message right after",
        ),
        (
            [{"role": "user", "content": "go"}, _an_call("a"), _an_res("a"), _an_call("a")],
            "I1",
            3,
            "repeats the id",
        ),
    ],
)
def test_anthropic_damage_is_named(
    history: list[Any], invariant: str, index: int, words: str
) -> None:
    violations = check_transcript(history, format="anthropic")
    assert any(
        v.invariant == invariant and v.index == index and words in v.message for v in violations
    ), violations


def test_render_transcript_is_one_line_per_message() -> None:
    history = _ours(_call("a"), ToolResultMessage("a", "read", "boom", is_error=True))
    lines = render_transcript(history).splitlines()
    assert len(lines) == 3
    assert "read#a" in lines[1]
    assert "ERROR" in lines[2]
