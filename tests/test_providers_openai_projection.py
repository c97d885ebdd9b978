"""OpenAIChatModel's projection: our history and tools as Chat Completions input."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given
from providers_server import LIST, provider_histories

import statemachine as sm
import statemachine.messages
from statemachine.providers.openai_chat import project_messages, project_tools
from statemachine.testing import check_transcript

LONG_ID = "fc_68a1|call.with/odd:chars-and-far-too-long-for-openai-0123456789"


def mixed_history(long_id: str) -> list[sm.Message]:
    """Results out of order with a user message between them, an image result, an
    aborted and a failed response, and an error result."""
    return [
        sm.UserMessage("look at the files"),
        sm.AssistantMessage(
            (
                sm.messages.ThinkingContent("hidden", "sig"),
                sm.TextContent("Looking."),
                sm.ToolCall("call_1", "list_files", {"path": "."}),
                sm.ToolCall(long_id, "read_file", {"path": "a.png"}),
            ),
            stop_reason=sm.messages.StopReason.TOOL_USE,
        ),
        sm.ToolResultMessage("call_1", "list_files", "a.png\nb.txt"),
        sm.UserMessage("also check b.txt"),  # arrived between the results
        sm.ToolResultMessage(
            long_id,
            "read_file",
            (sm.TextContent("binary"), sm.ImageContent("iVBORw0KGgo=", "image/png")),
        ),
        sm.AssistantMessage(
            (sm.TextContent("Partial ans"), sm.ToolCall("call_x", "read_file", {"path": "b"})),
            stop_reason=sm.messages.StopReason.ABORTED,
        ),
        sm.ToolResultMessage("call_x", "read_file", "Operation aborted", is_error=True),
        sm.UserMessage("go on"),
        sm.AssistantMessage((), stop_reason=sm.messages.StopReason.ERROR, error_message="HTTP 500"),
        sm.UserMessage("please"),
        sm.AssistantMessage(
            (sm.ToolCall("call_2", "read_file", {"path": "nope"}),),
            stop_reason=sm.messages.StopReason.TOOL_USE,
        ),
        sm.ToolResultMessage("call_2", "read_file", "File not found: nope", is_error=True),
    ]


def mixed_history_projected(new_id: str) -> list[dict[str, Any]]:
    """``mixed_history`` as Chat Completions messages, the long id replaced by ``new_id``."""
    return [
        {"role": "user", "content": "look at the files"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "list_files", "arguments": '{"path": "."}'},
                },
                {
                    "id": new_id,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.png"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.png\nb.txt"},
        {"role": "tool", "tool_call_id": new_id, "content": "binary"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"(image output of tool call {new_id})"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
        {"role": "user", "content": "also check b.txt"},
        {"role": "assistant", "content": "Partial ans"},
        {"role": "user", "content": "go on"},
        {"role": "user", "content": "please"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "nope"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "Error: File not found: nope"},
    ]


def test_projection_orders_results_moves_user_messages_and_drops_failed_turns() -> None:
    history = mixed_history(LONG_ID)
    projected = project_messages(history)
    new_id = projected[1]["tool_calls"][1]["id"]
    assert len(new_id) <= 40
    assert new_id.replace("_", "").replace("-", "").isalnum()
    assert project_messages(history)[3]["tool_call_id"] == new_id  # stable across requests
    assert projected == mixed_history_projected(new_id)


def test_projection_answers_a_call_that_lacks_its_result_and_drops_an_orphan_result() -> None:
    history: list[sm.Message] = [
        sm.UserMessage("hi"),
        sm.ToolResultMessage("ghost", "read_file", "stray"),
        sm.AssistantMessage((sm.ToolCall("c1", "read_file", {"path": "x"}),)),
        sm.UserMessage("hello?"),
    ]
    assert project_messages(history) == [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "x"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": "Error: No result was recorded for this tool call (the history was "
            "missing it); the call may not have run.",
        },
        {"role": "user", "content": "hello?"},
    ]


def test_empty_user_content_and_empty_results_are_never_sent_empty() -> None:
    history: list[sm.Message] = [
        sm.UserMessage(""),
        sm.AssistantMessage((sm.ToolCall("c1", "list_files", {}),)),
        sm.ToolResultMessage("c1", "list_files", ()),
    ]
    assert [m.get("content") for m in project_messages(history)] == [
        "(empty message)",
        None,
        "(no output)",
    ]


def test_project_tools_uses_the_schema_dict() -> None:
    assert project_tools([LIST]) == [
        {
            "type": "function",
            "function": {
                "name": "list_files",
                "description": "List a directory.",
                "parameters": LIST.schema_dict(),
            },
        }
    ]


@given(provider_histories())
def test_every_projected_history_is_valid_chat_completions_input(
    history: list[sm.Message],
) -> None:
    projected = project_messages(history, "sys")
    assert check_transcript(projected, "openai") == []
    assert projected[0] == {"role": "system", "content": "sys"}
    seen: set[str] = set()
    index = 1
    while index < len(projected):
        message = projected[index]
        index += 1
        assert message["role"] in ("user", "assistant"), f"stray {message['role']} message"
        assert message.get("content") or message.get("tool_calls")
        calls = message.get("tool_calls", [])
        for call in calls:
            assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", call["id"])
            assert call["id"] not in seen
            seen.add(call["id"])
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
        # The results follow directly, one per call, in call order.
        answers = projected[index : index + len(calls)]
        assert [m["role"] for m in answers] == ["tool"] * len(calls)
        assert [m["tool_call_id"] for m in answers] == [c["id"] for c in calls]
        assert all(isinstance(m["content"], str) and m["content"] for m in answers)
        index += len(calls)
    # Nothing of a failed response is sent: no call of an aborted or errored message.
    sent_calls = sum(len(m.get("tool_calls", [])) for m in projected)
    assert sent_calls == sum(
        len(m.tool_calls)
        for m in history
        if isinstance(m, sm.AssistantMessage)
        and m.stop_reason not in (sm.messages.StopReason.ERROR, sm.messages.StopReason.ABORTED)
    )
