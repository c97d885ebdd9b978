"""``check_transcript`` over Bedrock Converse and Gemini histories, and how ``auto``
tells the formats apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from statemachine import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from statemachine.testing import check_transcript, transcript_findings
from statemachine.testing.transcript import detect_format, format_evidence

CORPUS = Path(__file__).parent / "fixtures" / "transcripts"  # sources: SOURCES.md there


def _corpus(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((CORPUS / name).read_text())
    return body


# -- Bedrock Converse ----------------------------------------------------------------------


def _cv_user(text: str = "go") -> dict[str, Any]:
    return {"role": "user", "content": [{"text": text}]}


def _cv_call(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"text": "let me look"}]
        + [{"toolUse": {"toolUseId": i, "name": "read", "input": {"path": "a"}}} for i in ids],
    }


def _cv_res(*ids: str, text: str | None = None) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"toolResult": {"toolUseId": i, "content": [{"text": "ok"}], "status": "success"}}
        for i in ids
    ]
    if text is not None:
        blocks.append({"text": text})
    return {"role": "user", "content": blocks}


def _cv_done() -> dict[str, Any]:
    return {"role": "assistant", "content": [{"text": "done"}]}


def test_converse_valid_history() -> None:
    history = [_cv_user(), _cv_call("a", "b"), _cv_res("a", "b", text="and?"), _cv_done()]
    body = {"modelId": "anthropic.claude-3-haiku", "messages": history}
    assert detect_format(body) == "bedrock-converse"
    assert detect_format(history) == "bedrock-converse"
    assert transcript_findings(body, "auto") == []


# A toolResult beside text in one user message: the body Bedrock refused for Llama 4
# Maverick, derived from pydantic-ai's recording of the accepted one (SOURCES.md).
LLAMA_REFUSED = "converse_rejected_tool_result_with_text_for_llama.json"


def test_converse_text_beside_a_tool_result_is_an_error_for_a_model_that_refuses_it() -> None:
    body = _corpus(LLAMA_REFUSED)
    [error] = check_transcript(body, "auto")
    assert (error.invariant, error.index) == ("I1", 2)
    assert "a text block cannot share a user message with a toolResult" in error.message
    assert "nor on 'us.meta.llama4-maverick-17b-instruct-v1:0'" in error.message
    # The accepted recording: pydantic-ai put an assistant message between the two.
    accepted = _corpus(
        "converse_recorded_bedrock_llama_tool_result_followed_by_text_accepted_0.json"
    )
    assert transcript_findings(accepted, "auto") == []


@pytest.mark.parametrize(
    ("model_id", "level"),
    [
        (None, "warning"),  # no model named: Anthropic and Nova accept it, others refuse
        ("mistral.mistral-large-2407-v1:0", "error"),
        ("writer.palmyra-x5-v1:0", "error"),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", None),
        ("us.amazon.nova-2-lite-v1:0", None),
    ],
)
def test_converse_text_beside_a_tool_result_follows_the_model_family(
    model_id: str | None, level: str | None
) -> None:
    body = {k: v for k, v in _corpus(LLAMA_REFUSED).items() if k != "modelId"}
    if model_id is not None:
        body["modelId"] = model_id
    assert [f.level for f in transcript_findings(body, "bedrock-converse")] == (
        [level] if level else []
    )
    strict = check_transcript(body, "bedrock-converse", strict=True)
    assert len(strict) == (1 if level else 0)


def test_converse_a_video_beside_a_tool_result_is_refused_for_anthropic() -> None:
    history = [_cv_user(), _cv_call("a"), _cv_res("a")]
    history[2]["content"].append({"video": {"format": "mp4", "source": {"bytes": "AA"}}})
    body = {"modelId": "anthropic.claude-3-haiku", "messages": history}
    [error] = check_transcript(body, "bedrock-converse")
    assert "a video block cannot share" in error.message


@pytest.mark.parametrize(
    ("history", "invariant", "index", "words"),
    [
        ([_cv_user(), _cv_call("a"), _cv_user("no result")], "I1", 1, "no result before"),
        ([_cv_user(), _cv_call("a"), _cv_res("a"), _cv_done(), _cv_res("a")], "I1", 4, "second"),
        ([_cv_res("z")], "I1", 0, "no matching call"),
        ([_cv_user(), _cv_call("a", "a"), _cv_res("a", "a")], "I1", 1, "appears twice"),
        ([_cv_user(), _cv_user()], "order", 1, "alternate"),
        ([_cv_user(), _cv_call("a")], "I1", 1, "transcript ends"),
        ([_cv_user(), {"role": "assistant", "content": "hi"}], "format", 1, "not a list"),
    ],
)
def test_converse_damage_is_named(
    history: list[Any], invariant: str, index: int, words: str
) -> None:
    errors = check_transcript(history, "bedrock-converse")
    assert any(
        v.invariant == invariant and v.index == index and words in v.message for v in errors
    ), errors


def test_converse_removing_a_tool_result_is_found_by_auto() -> None:
    history = [_cv_user(), _cv_call("a"), _cv_res("a"), _cv_done()]
    history[2] = _cv_user("I ran it")
    [error] = check_transcript(history, "auto")
    assert (error.invariant, error.index) == ("I1", 1)


def test_converse_unreadable_tool_use_is_one_format_finding() -> None:
    call = _cv_call("a")
    call["content"][1]["toolUse"].pop("toolUseId")
    found = transcript_findings([_cv_user(), call, _cv_res("a")], "bedrock-converse")
    assert [(f.invariant, f.index) for f in found] == [("format", 1)]


# -- Gemini ---------------------------------------------------------------------------------


def _gm_user(text: str = "go") -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def _gm_call(*names: str, ids: tuple[str, ...] = ()) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for n, name in enumerate(names):
        call: dict[str, Any] = {"name": name, "args": {}}
        if ids:
            call["id"] = ids[n]
        parts.append({"functionCall": call})
    return {"role": "model", "parts": parts}


def _gm_res(*names: str, ids: tuple[str, ...] = ()) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for n, name in enumerate(names):
        response: dict[str, Any] = {"name": name, "response": {"result": "ok"}}
        if ids:
            response["id"] = ids[n]
        parts.append({"functionResponse": response})
    return {"role": "user", "parts": parts}


def test_gemini_valid_histories() -> None:
    history = [_gm_user(), _gm_call("read", "read"), _gm_res("read", "read")]
    history.append({"role": "model", "parts": [{"text": "done"}]})
    body = {"contents": history, "systemInstruction": {"parts": [{"text": "be brief"}]}}
    assert detect_format(body) == "gemini"
    assert transcript_findings(body, "auto") == []
    with_ids = [_gm_user(), _gm_call("a", "b", ids=("1", "2")), _gm_res("b", "a", ids=("2", "1"))]
    assert transcript_findings(with_ids, "gemini") == []
    snake = [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [{"function_call": {"name": "read", "args": {}}}]},
        {"role": "user", "parts": [{"function_response": {"name": "read", "response": {}}}]},
    ]
    assert detect_format(snake) == "gemini"
    assert transcript_findings(snake, "auto") == []


@pytest.mark.parametrize(
    ("history", "index", "words"),
    [
        ([_gm_user(), _gm_call("read"), _gm_user("and?")], 1, "right after the function call"),
        ([_gm_user(), _gm_res("read")], 1, "no function call turn right before"),
        ([_gm_user(), _gm_call("a", "b"), _gm_res("a")], 2, "as many responses as calls"),
        ([_gm_user(), _gm_call("a"), _gm_res("a", "a")], 2, "as many responses as calls"),
        ([_gm_user(), _gm_call("a")], 1, "the transcript ends"),
        ([_gm_user(), _gm_call("a", "b", ids=("1", "1")), _gm_res("a", "b")], 1, "twice"),
    ],
)
def test_gemini_damage_is_named(history: list[Any], index: int, words: str) -> None:
    errors = check_transcript(history, "gemini")
    assert any(v.invariant == "I1" and v.index == index and words in v.message for v in errors), (
        errors
    )


def test_gemini_response_naming_no_call_is_a_warning() -> None:
    history = [_gm_user(), _gm_call("read"), _gm_res("write")]
    [warning] = transcript_findings(history, "gemini")
    assert (warning.level, warning.index) == ("warning", 2)
    assert "answers no functionCall of message 1 by name" in warning.message


def test_gemini_responses_in_consecutive_user_contents_answer_one_call_turn() -> None:
    # crewAI's recorded request (SOURCES.md): a model turn with three functionCall parts,
    # then three user contents of one functionResponse each; Gemini accepted it.
    body = _corpus("gemini_recorded_crewai_parallel_native_tool_calling_agent_kickoff_1.json")
    roles = [(c.get("role"), len(c["parts"])) for c in body["contents"]]
    assert roles == [("user", 1), ("model", 3), ("user", 1), ("user", 1), ("user", 1)]
    assert transcript_findings(body, "auto") == []
    # Merged, the three contents are still held to the count: one dropped is an error
    # at the content that holds the first response.
    del body["contents"][3]
    [error] = check_transcript(body, "gemini")
    assert error.index == 2
    assert error.message.startswith("2 functionResponse part(s) answer the 3 functionCall")


def test_gemini_a_text_content_after_the_responses_joins_their_turn() -> None:
    # crewAI's recorded request (SOURCES.md): the three responses, then the user's text.
    body = _corpus("gemini_recorded_crewai_parallel_native_tool_calling_crew_1.json")
    assert [c.get("role") for c in body["contents"]][2:] == ["user"] * 4
    assert "text" in body["contents"][5]["parts"][0]
    assert transcript_findings(body, "auto") == []


def test_gemini_open_tail() -> None:
    assert check_transcript([_gm_user(), _gm_call("a")], "gemini", allow_open_tail=True) == []


# -- telling the formats apart ---------------------------------------------------------------


ANTHROPIC_PLAIN = {
    "model": "claude-sonnet-4-5",
    "system": "be brief",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
}
RESPONSES_PLAIN = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]},
]


@pytest.mark.parametrize(
    ("log", "fmt"),
    [
        (ANTHROPIC_PLAIN, "anthropic"),
        (RESPONSES_PLAIN, "openai-responses"),
        ([{"role": "user", "content": "hi"}], "openai"),
        ({"messages": [_cv_user()], "system": [{"text": "be brief"}]}, "bedrock-converse"),
        ({"contents": [_gm_user()]}, "gemini"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "openai"),
    ],
)
def test_auto_detects_logs_without_tool_items(log: Any, fmt: str) -> None:
    assert detect_format(log) == fmt
    assert fmt in format_evidence(log) or fmt == "openai"


def test_a_log_matching_several_formats_is_one_format_finding() -> None:
    mixed = [_cv_user(), _cv_call("a"), {"role": "tool", "tool_call_id": "a", "content": "ok"}]
    assert detect_format(mixed) == "unknown"
    [finding] = transcript_findings(mixed, "auto")
    assert (finding.invariant, finding.level) == ("format", "error")
    assert "matches several formats differently" in finding.message
    assert "bedrock-converse: messages[1]: a 'toolUse' block" in finding.message
    assert "openai: messages[2]: role 'tool'" in finding.message
    # Given its format, it is read as that format.
    assert [f.invariant for f in transcript_findings(mixed, "openai")] == ["I1"]


def test_how_tool_calls_are_written_outweighs_other_signs() -> None:
    # Mistral's Chat Completions with a "thinking" content block, as recorded.
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]}
    call = _oa_call("a")
    call["content"] = [thinking]
    log = [{"role": "user", "content": "go"}, call, _oa_res("a")]
    assert set(format_evidence(log)) == {"anthropic", "openai"}
    assert detect_format(log) == "openai"
    assert transcript_findings(log, "auto") == []
    # Without tool calls, the weak signs decide, and must agree.
    assert detect_format([{"role": "assistant", "content": [thinking]}]) == "anthropic"
    plain_mixed = [
        {"role": "assistant", "content": [thinking]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
    ]
    assert detect_format(plain_mixed) == "unknown"


def test_a_log_matching_no_format_is_one_format_finding() -> None:
    cohere = [{"role": "USER", "message": "hi"}, {"role": "CHATBOT", "message": "yo"}]
    assert detect_format(cohere) == "unknown"
    [finding] = check_transcript(cohere, "auto")
    assert "matches no known format" in finding.message


# -- a result under a wrong id -----------------------------------------------------------------


def _oa_call(*ids: str) -> dict[str, Any]:
    calls = [
        {"id": i, "type": "function", "function": {"name": "read", "arguments": "{}"}} for i in ids
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def _oa_res(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


def _an_call(*ids: str) -> dict[str, Any]:
    blocks = [{"type": "tool_use", "id": i, "name": "read", "input": {}} for i in ids]
    return {"role": "assistant", "content": blocks}


def _an_res(*ids: str) -> dict[str, Any]:
    blocks = [{"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in ids]
    return {"role": "user", "content": blocks}


def _ours(*calls: str, results: tuple[str, ...]) -> list[Any]:
    call = AssistantMessage(tuple(ToolCall(i, "read", {}) for i in calls), stop_reason="toolUse")
    return [UserMessage("go"), call, *(ToolResultMessage(r, "read", "ok") for r in results)]


@pytest.mark.parametrize(
    ("fmt", "history", "index"),
    [
        (
            "openai",
            [
                {"role": "user", "content": "go"},
                _oa_call("a", "b", "c"),
                _oa_res("x"),
                _oa_res("b"),
                _oa_res("c"),
            ],
            2,
        ),
        (
            "anthropic",
            [{"role": "user", "content": "go"}, _an_call("a", "b", "c"), _an_res("x", "b", "c")],
            2,
        ),
        ("bedrock-converse", [_cv_user(), _cv_call("a", "b", "c"), _cv_res("x", "b", "c")], 2),
        ("statemachine", _ours("a", "b", "c", results=("x", "b", "c")), 2),
        # the stand-in after the results of later calls
        (
            "openai",
            [{"role": "user", "content": "go"}, _oa_call("a", "b"), _oa_res("b"), _oa_res("x")],
            3,
        ),
        ("statemachine", _ours("a", "b", results=("b", "x")), 3),
    ],
)
def test_a_result_under_a_wrong_id_is_the_one_finding(
    fmt: str, history: list[Any], index: int
) -> None:
    [finding] = transcript_findings(history, fmt)  # type: ignore[arg-type]
    assert (finding.invariant, finding.index, finding.level) == ("I1", index, "error")
    assert (
        "the result for tool call 'x' answers no call: it stands where the result of call 'a'"
        in finding.message
    )


def test_unclear_wrong_ids_are_reported_as_they_are() -> None:
    # Two strangers for one unanswered call: which one stands for it is not clear.
    history = _ours("a", "b", results=("x", "y", "b"))
    found = [(f.invariant, f.index) for f in transcript_findings(history)]
    assert {("I1", 1), ("I1", 2), ("I1", 3)} <= set(found)
    assert not any("stands where" in f.message for f in transcript_findings(history))
    # A genuine order mistake among the others is still reported.
    mixed = _ours("a", "b", "c", results=("x", "c", "b"))
    assert [f.invariant for f in transcript_findings(mixed)] == ["I1", "I2"]


def test_responses_reasoning_needs_its_following_item() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    user = {"role": "user", "content": "why?"}
    produced = {"type": "message", "id": "msg_1", "role": "assistant", "content": "42"}
    assert check_transcript([user, reasoning, produced, user], "openai-responses") == []
    by_hand = {"role": "assistant", "content": "42"}
    [error] = check_transcript([user, reasoning, by_hand, user], "openai-responses")
    assert (error.invariant, error.index) == ("I1", 1)
    assert "required following item" in error.message
    assert len(check_transcript([user, reasoning], "openai-responses")) == 1
    # DeepSeek's reasoning ids are UUIDs, and DeepSeek accepts it.
    deepseek = {**reasoning, "id": "1e97d346-aa16-46e5-866d-b34e91c5d499"}
    assert check_transcript([user, deepseek, by_hand, user], "openai-responses") == []


@pytest.mark.parametrize("fmt", ["auto", "bedrock-converse", "gemini", "anthropic", "openai"])
def test_unhashable_values_where_names_belong_are_read_not_raised(fmt: str) -> None:
    log = [
        {"role": {"a": 1}, "content": [{"type": ["x"]}, {"toolUse": {"toolUseId": 3}}]},
        {"role": "model", "parts": [{"functionCall": {"name": ["f"]}}, "text"]},
        {"role": "assistant", "content": [{"type": {"k": "v"}, "text": "hi"}]},
    ]
    found = transcript_findings(log, fmt)  # type: ignore[arg-type]
    assert found
    assert all(f.invariant in ("format", "order", "I1") for f in found)
