"""A whole agent run with the workspace tools through each newer adapter: the model
calls ``list_files``, the tool runs, the model answers. Every history, ours and each
request's, must stay valid, and the second request must carry the call, its
reasoning and its result back in the provider's own shape."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from providers_corpus import bedrock_event
from providers_server import LoopbackServer, Reply, Sleeps

import statemachine as sm
from statemachine.core.invariants import history_violations
from statemachine.providers import BedrockModel, GeminiModel, OpenAIResponsesModel
from statemachine.testing import check_transcript
from statemachine.workspace import workspace_tools

KEY = "sk-runs-test-0123456789abcdef"
SSE = (("Content-Type", "text/event-stream"),)


def run(model: sm.ModelClient, root: Path) -> sm.RunResult:
    (root / "README.md").write_text("# Demo\n")
    result = sm.run_agent_sync(
        model=model,
        tools=workspace_tools(root),
        messages=[sm.UserMessage("list the files")],
        max_turns=4,
    )
    assert result.state is sm.TurnState.DONE, result.explanation
    assert result.turns == 2
    assert history_violations(result.messages) == []
    assert check_transcript(result.messages) == []
    last = result.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.text == "Done."
    return result


def first_calls(result: sm.RunResult) -> tuple[sm.ToolCall, ...]:
    reply = result.messages[1]
    assert isinstance(reply, sm.AssistantMessage)
    return reply.tool_calls


def event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


USAGE = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 5,
    "output_tokens_details": {"reasoning_tokens": 3},
    "total_tokens": 15,
}


@pytest.mark.timeout(30)
def test_a_run_through_openai_responses_carries_reasoning_and_the_call_back(
    server: LoopbackServer, tmp_path: Path
) -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "ENC"}
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "list_files",
        "arguments": '{"path": "."}',
    }
    first = b"".join(
        [
            event("response.output_item.done", output_index=0, item=reasoning),
            event("response.output_item.done", output_index=1, item=call),
            event("response.completed", response={"status": "completed", "usage": USAGE}),
        ]
    )
    second = event("response.output_text.delta", output_index=0, delta="Done.") + event(
        "response.completed", response={"status": "completed", "usage": USAGE}
    )
    server.add(Reply(200, SSE, first), Reply(200, SSE, second))
    model = OpenAIResponsesModel("gpt-5-mini", api_key=KEY, base_url=server.url + "/v1")
    result = run(model, tmp_path)
    sent = server.bodies()[1]["input"]
    assert sent[1] == {**reasoning, "summary": []}
    assert sent[2] == {**call, "arguments": '{"path":"."}'}
    assert sent[3]["type"] == "function_call_output"
    assert sent[3]["call_id"] == "call_1"
    assert "README.md" in sent[3]["output"]
    assert first_calls(result)[0].id == "call_1|fc_1"


@pytest.mark.timeout(30)
def test_a_run_through_gemini_gives_an_id_less_call_an_id_and_sends_none_back(
    server: LoopbackServer, tmp_path: Path
) -> None:
    signature = base64.b64encode(b"sig").decode()
    call = {"functionCall": {"name": "list_files", "args": {"path": "."}}}
    first = {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{**call, "thoughtSignature": signature}]},
                "finishReason": "STOP",
            }
        ]
    }
    second = {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "Done."}]}, "finishReason": "STOP"}
        ]
    }
    server.add(
        *[
            Reply(200, SSE, b"data: " + json.dumps(c).encode() + b"\r\n\r\n")
            for c in (first, second)
        ]
    )
    result = run(GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url), tmp_path)
    [made] = first_calls(result)
    assert made.id.startswith("gemini_call_")
    contents = server.bodies()[1]["contents"]
    assert contents[1]["parts"] == [
        {"functionCall": {"name": "list_files", "args": {"path": "."}}, "thoughtSignature": "c2ln"}
    ]
    [response] = contents[2]["parts"]
    assert response["functionResponse"]["name"] == "list_files"
    assert "id" not in response["functionResponse"]
    assert "README.md" in response["functionResponse"]["response"]["output"]


@pytest.mark.timeout(30)
def test_a_run_through_bedrock_answers_the_tool_use_with_its_result(
    server: LoopbackServer, tmp_path: Path
) -> None:
    stream = (("Content-Type", "application/vnd.amazon.eventstream"),)
    start = {"toolUse": {"toolUseId": "tooluse_1", "name": "list_files"}}
    first = b"".join(
        [
            bedrock_event("contentBlockStart", {"contentBlockIndex": 0, "start": start}),
            bedrock_event(
                "contentBlockDelta",
                {"contentBlockIndex": 0, "delta": {"toolUse": {"input": '{"path": "."}'}}},
            ),
            bedrock_event("messageStop", {"stopReason": "tool_use"}),
        ]
    )
    second = bedrock_event(
        "contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Done."}}
    ) + bedrock_event("messageStop", {"stopReason": "end_turn"})
    server.add(Reply(200, stream, first), Reply(200, stream, second))
    model = BedrockModel(
        "amazon.nova-micro-v1:0",
        region="us-west-2",
        endpoint_url=server.url,
        aws_access_key_id="AKIAFAKEFAKEFAKE",
        aws_secret_access_key="fake-secret-value-0123456789",
        sleep=Sleeps(),
    )
    run(model, tmp_path)
    messages = server.bodies()[1]["messages"]
    assert messages[1]["content"] == [
        {"toolUse": {"toolUseId": "tooluse_1", "name": "list_files", "input": {"path": "."}}}
    ]
    [result] = messages[2]["content"]
    assert result["toolResult"]["toolUseId"] == "tooluse_1"
    assert "README.md" in result["toolResult"]["content"][0]["text"]
