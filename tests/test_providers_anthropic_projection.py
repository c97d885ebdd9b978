"""AnthropicModel's projection: our history and tools as Messages API input."""

from __future__ import annotations

import itertools
import re
from typing import Any

from hypothesis import given
from providers_server import READ, provider_histories

import statemachine as sm
import statemachine.messages
from statemachine.providers.anthropic_messages import project_messages, project_tools
from statemachine.testing import check_transcript

ODD_ID = "call_abc|fc.9/x"


def mixed_history(odd_id: str) -> list[sm.Message]:
    """Two user messages in a row, signed, unsigned and cut-off thinking, results with a
    user message between them, an image result, an aborted and a failed response, and an
    error result."""
    return [
        sm.UserMessage("look"),
        sm.UserMessage((sm.TextContent("and this"), sm.ImageContent("R0lGOD", "image/gif"))),
        sm.AssistantMessage(
            (
                sm.messages.ThinkingContent("signed", "sig=="),
                sm.messages.ThinkingContent("unsigned (another provider)"),
                sm.TextContent(""),
                sm.ToolCall("toolu_1", "list_files", {"path": "."}),
                sm.ToolCall(odd_id, "read_file", {"path": "a.png"}),
            ),
            stop_reason=sm.messages.StopReason.TOOL_USE,
        ),
        sm.ToolResultMessage("toolu_1", "list_files", "a.png"),
        sm.UserMessage("hurry"),
        sm.ToolResultMessage(
            odd_id, "read_file", (sm.ImageContent("iVBOR", "image/png"),), is_error=False
        ),
        sm.AssistantMessage(
            (
                sm.messages.ThinkingContent("cut off", None),
                sm.TextContent("Partial"),
                sm.ToolCall("toolu_x", "read_file", {"path": "b"}),
            ),
            stop_reason=sm.messages.StopReason.ABORTED,
        ),
        sm.ToolResultMessage("toolu_x", "read_file", "Operation aborted", is_error=True),
        sm.UserMessage("go on"),
        sm.AssistantMessage((sm.TextContent("Hal"),), stop_reason=sm.messages.StopReason.ERROR),
        sm.UserMessage("again"),
        sm.AssistantMessage((sm.ToolCall("toolu_2", "read_file", {"path": "nope"}),)),
        sm.ToolResultMessage("toolu_2", "read_file", "File not found: nope", is_error=True),
    ]


def first_turn_projected(new_id: str) -> list[dict[str, Any]]:
    """The first turn of ``mixed_history`` as Messages API input (``odd_id`` -> ``new_id``)."""
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "text", "text": "and this"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/gif", "data": "R0lGOD"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "signed", "signature": "sig=="},
                {"type": "tool_use", "id": "toolu_1", "name": "list_files", "input": {"path": "."}},
                {"type": "tool_use", "id": new_id, "name": "read_file", "input": {"path": "a.png"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "a.png"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": new_id,
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": "iVBOR",
                            },
                        }
                    ],
                },
                {"type": "text", "text": "hurry"},
            ],
        },
    ]


def later_turns_projected() -> list[dict[str, Any]]:
    """The rest of ``mixed_history``: the failed turns' text, the merged user messages, and
    the last call with its error result."""
    return [
        {"role": "assistant", "content": [{"type": "text", "text": "Partial"}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "go on"}, {"type": "text", "text": "again"}],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "read_file",
                    "input": {"path": "nope"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "File not found: nope"}],
                    "is_error": True,
                }
            ],
        },
    ]


def test_projection_groups_results_merges_roles_and_handles_failed_turns() -> None:
    projected = project_messages(mixed_history(ODD_ID))
    new_id = projected[1]["content"][2]["id"]
    assert new_id != ODD_ID
    assert new_id.replace("_", "").replace("-", "").isalnum()
    assert projected == first_turn_projected(new_id) + later_turns_projected()


def test_a_history_opened_by_the_assistant_or_with_empty_input_stays_sendable() -> None:
    history: list[sm.Message] = [sm.AssistantMessage("Hello, how can I help?"), sm.UserMessage("")]
    assert project_messages(history) == [
        {"role": "user", "content": [{"type": "text", "text": "(conversation start)"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello, how can I help?"}]},
        {"role": "user", "content": [{"type": "text", "text": "(empty message)"}]},
    ]


def test_project_tools_uses_input_schema() -> None:
    assert project_tools([READ]) == [
        {"name": "read_file", "description": "Read a file.", "input_schema": READ.schema_dict()}
    ]


@given(provider_histories())
def test_every_projected_history_is_valid_messages_api_input(
    history: list[sm.Message],
) -> None:
    projected = project_messages(history)
    assert projected[0]["role"] == "user"
    assert check_transcript(projected, "anthropic") == []
    roles = [m["role"] for m in projected]
    assert all(a != b for a, b in itertools.pairwise(roles)), "roles must alternate"
    open_calls: list[str] = []
    seen: set[str] = set()
    for message in projected:
        blocks = message["content"]
        assert blocks, "no empty content"
        for block in blocks:
            if block["type"] == "text":
                assert block["text"], "no empty text block"
            if block["type"] == "thinking":
                assert block["signature"], "thinking goes back only with its signature"
        results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
        if message["role"] == "user":
            # The previous assistant message's calls, answered first and in order.
            assert results == open_calls
            assert [b["type"] for b in blocks[: len(results)]] == ["tool_result"] * len(results)
            open_calls = []
        else:
            assert not results
            assert open_calls == [], "calls must be answered in the next user message"
            open_calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
            for call_id in open_calls:
                assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", call_id)
                assert call_id not in seen
                seen.add(call_id)
    assert open_calls == []
