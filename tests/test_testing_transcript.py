"""``check_transcript`` over our histories and OpenAI / Anthropic ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

from statemachine import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from statemachine.cli import usage
from statemachine.cli.transcript import DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, cli_transcript
from statemachine.messages import message_to_dict
from statemachine.testing import (
    Finding,
    Violation,
    check_transcript,
    render_transcript,
    transcript_findings,
)
from statemachine.testing.transcript import STRICT_RULES, detect_format, format_evidence

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
    with pytest.raises(ValueError, match="unknown transcript format 'cohere'"):
        check_transcript([], format="cohere")  # type: ignore[arg-type]
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
        (
            [USER, _oa_call("a"), {"role": "assistant", "content": "x"}, _oa_res("a")],
            "I1",
            3,
            "after the next assistant",
        ),
        ([USER, _oa_call("a", "a"), _oa_res("a"), _oa_res("a")], "I1", 1, "appears twice"),
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
            [{"role": "user", "content": "go"}, _an_call("a"), _an_res("a"), _an_res("a")],
            "I1",
            3,
            "second result",
        ),
        (
            [
                {"role": "user", "content": "go"},
                _an_call("a"),
                {"role": "system", "content": "wait"},
                _an_res("a"),
            ],
            "I1",
            3,
            "in the user message right after",
        ),
        (
            [{"role": "user", "content": "go"}, _an_call("a", "a"), _an_res("a", "a")],
            "I1",
            1,
            "appears twice",
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


# -- a team's run: handoffs are calls like any other ----------------------------------------


def _team_history() -> list[Any]:
    """A team's run: triage hands the run to billing; billing's own transfer to sales
    is refused (an error result: the run stays with billing), and billing answers."""
    from statemachine import Agent, run_agent_sync
    from statemachine.steps import Handoffs
    from statemachine.testing import ScriptedModel

    team = Handoffs(
        {
            "triage": Agent(ScriptedModel(ToolCall("h1", "transfer_to_billing", {}))),
            "billing": Agent(ScriptedModel(ToolCall("h2", "transfer_to_sales", {}), "Refunded.")),
            "sales": Agent(ScriptedModel("Buy more.")),
        },
        routes={"triage": ["billing", "sales"]},
        start="triage",
    )
    result = run_agent_sync(
        model=team.agent.model,
        tools=team.agent.tools,
        steps=team.agent.options.steps,
        messages="Refund A17.",
    )
    assert result.state.value == "Done"
    return list(result.messages)


@pytest.mark.timeout(30)
def test_a_handoff_is_judged_as_one_call_with_its_one_result() -> None:
    history = _team_history()
    assert check_transcript(history) == []
    assert transcript_findings([message_to_dict(m) for m in history], "auto") == []
    # The transfer is held to I1 as every call is: a second result, or none, is found.
    twice = [*history[:3], history[2], *history[3:]]
    assert [v.invariant for v in check_transcript(twice)] == ["I1"]
    unanswered = [*history[:2], *history[3:]]
    assert {v.invariant for v in check_transcript(unanswered)} == {"I1"}


@pytest.mark.timeout(30)
def test_render_transcript_names_the_agent_that_speaks() -> None:
    history = _team_history()
    lines = render_transcript(history, first_agent="triage").splitlines()
    assert lines[1].startswith("  1 assistant (triage) [toolUse] calls transfer_to_billing#h1")
    assert lines[2].endswith("(handed to billing)")
    assert lines[3].startswith("  3 assistant (billing) [toolUse] calls transfer_to_sales#h2")
    # The refused transfer is an error result: it hands nothing on.
    assert " ERROR transfer_to_sales#h2" in lines[4]
    assert "handed to" not in lines[4]
    assert lines[5] == "  5 assistant (billing) [stop] 'Refunded.'"
    # Without the team's start the first agent is unnamed; a run without transfers
    # stays as it was.
    unnamed = render_transcript(history).splitlines()
    assert unnamed[1].startswith("  1 assistant (the first agent) [toolUse]")
    assert unnamed[3].startswith("  3 assistant (billing) [toolUse]")
    plain = render_transcript(_ours(_call("a"), ToolResultMessage("a", "read", "ok")))
    assert "(" not in plain.splitlines()[1].split("[")[0]


def _errors(history: Any, format: str, **options: Any) -> list[Finding]:
    return [f for f in transcript_findings(history, format, **options) if f.level == "error"]  # type: ignore[arg-type]


def _warnings(history: Any, format: str, **options: Any) -> list[Finding]:
    return [f for f in transcript_findings(history, format, **options) if f.level == "warning"]  # type: ignore[arg-type]


# -- the corpus: what providers accepted and rejected ---------------------------------------

CORPUS = Path(__file__).parent / "fixtures" / "transcripts"
MANIFEST: list[dict[str, Any]] = json.loads((CORPUS / "manifest.json").read_text())


def test_corpus_holds_both_outcomes_for_every_format() -> None:
    for fmt in ("openai", "openai-responses", "anthropic", "bedrock-converse", "gemini"):
        entries = [e for e in MANIFEST if e["format"] == fmt]
        assert any(e["status"] == 200 and "source" in e for e in entries), fmt
        assert any(e["status"] >= 400 and e["expect"] for e in entries), fmt
    recorded = [e for e in MANIFEST if "source" in e]
    assert len(recorded) >= 60
    assert all(e["source"]["commit"] and e["source"]["license"] for e in recorded)
    sources = (CORPUS / "SOURCES.md").read_text()
    assert all(f"`{e['file']}`" in sources for e in MANIFEST)


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["file"] for e in MANIFEST])
def test_corpus(entry: dict[str, Any]) -> None:
    body = json.loads((CORPUS / entry["file"]).read_text())
    # A plain history (roles and text, no sign of any format) reads alike in every
    # format, and auto reads it as Chat Completions.
    plain = format_evidence(body) == {}
    assert detect_format(body) == ("openai" if plain else entry["format"])
    found = transcript_findings(body, entry["format"])
    assert found == transcript_findings(body, "auto")
    if entry["expect"] is None:  # accepted, or rejected for something else than the history
        assert [f for f in found if f.level == "error"] == [], found
        return
    want = entry["expect"]
    assert any(
        f.invariant == want["invariant"]
        and f.index == want["index"]
        and want["words"] in f.message
        and f.level == want["level"]
        for f in found
    ), (entry["provider_error"], found)
    if want["level"] == "error":
        assert check_transcript(body, entry["format"]) != []
    if want.get("strict"):  # a rule some servers enforce: an error under strict
        strict = check_transcript(body, entry["format"], strict=True)
        assert any(f.index == want["index"] and want["words"] in f.message for f in strict)


# -- ids reused across turns, names checked against the call that owns the id --------------


def _gpt4o_turn(call_id: str, tool: str, query: str, answer: str) -> list[dict[str, Any]]:
    # The shape of a logged gpt-4o turn whose ids restart at every turn, with the
    # tool message carrying the optional "name".
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps({"q": query})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "name": tool, "content": answer},
    ]


def test_reused_id_pairs_with_the_call_that_owns_it() -> None:
    history = [
        SYSTEM,
        {"role": "user", "content": "weather in Paris, then book a table"},
        *_gpt4o_turn("call_0", "get_weather", "Paris", "sunny"),
        *_gpt4o_turn("call_0", "book_table", "Chez Nous", "booked"),
        {"role": "assistant", "content": "Sunny, and your table is booked."},
    ]
    assert check_transcript(history, "openai") == []
    [warning] = _warnings(history, "openai")
    assert warning.invariant == "I1"
    assert warning.index == 4
    assert "reuses the id of a call in message 2" in warning.message
    assert "wrong" not in str(warning)
    assert "names tool" not in warning.message


def test_a_result_naming_another_tool_than_its_owner_is_a_warning() -> None:
    history = [USER, *_gpt4o_turn("call_0", "get_weather", "Paris", "sunny")]
    history[2] = {**history[2], "name": "book_table"}
    assert check_transcript(history, "openai") == []
    [warning] = _warnings(history, "openai")
    assert "names tool 'book_table', but the call (message 1) was to 'get_weather'" in (
        warning.message
    )


def test_reused_ids_in_our_format_pair_with_their_owner() -> None:
    history = [
        UserMessage("go"),
        AssistantMessage((ToolCall("c0", "read", {}),), stop_reason="toolUse"),
        ToolResultMessage("c0", "read", "ok"),
        AssistantMessage((ToolCall("c0", "write", {}),), stop_reason="toolUse"),
        ToolResultMessage("c0", "write", "ok"),
    ]
    # The engine refuses reused ids: an error by default in our format, ...
    assert [v.invariant for v in check_transcript(history)] == ["I1"]
    # ... a warning on request, and the names are checked against the owning call.
    assert check_transcript(history, id_reuse="warning") == []
    history[4] = ToolResultMessage("c0", "read", "ok")
    assert [v.message for v in check_transcript(history, id_reuse="warning")] == [
        "result for tool call 'c0' names tool 'read', but the call was to 'write'"
    ]


def test_id_reuse_can_be_made_an_error() -> None:
    history = [USER, *_gpt4o_turn("c", "a", "1", "x"), *_gpt4o_turn("c", "b", "2", "y")]
    [error] = check_transcript(history, "openai", id_reuse="error")
    assert "reuses the id" in error.message
    responses = [
        {"type": "function_call", "call_id": "c", "name": "a", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
        {"type": "function_call", "call_id": "c", "name": "b", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "y"},
    ]
    assert check_transcript(responses, "openai-responses") == []
    assert len(check_transcript(responses, "openai-responses", id_reuse="error")) == 1


def test_results_out_of_call_order_are_a_warning_for_providers() -> None:
    history = [SYSTEM, USER, _oa_call("a", "b"), _oa_res("b"), _oa_res("a")]
    assert check_transcript(history, "openai") == []
    [warning] = _warnings(history, "openai")
    assert warning.invariant == "I2"
    assert warning.index == 3
    anthropic = [{"role": "user", "content": "go"}, _an_call("a", "b"), _an_res("b", "a")]
    assert check_transcript(anthropic, "anthropic") == []
    assert [w.invariant for w in _warnings(anthropic, "anthropic")] == ["I2"]


# -- Anthropic: merged turns, system turns, server tools, tool_result first ----------------

GO = {"role": "user", "content": "go"}


def test_anthropic_merges_consecutive_messages_of_one_role() -> None:
    text_then_results = [GO, _an_call("a"), {"role": "user", "content": "wait"}, _an_res("a")]
    # Merged, the user turn opens with text: the API finds no result right after the call.
    errors = check_transcript(text_then_results, "anthropic")
    assert [(v.index, v.invariant) for v in errors] == [(1, "I1"), (3, "I1")]
    assert "has no result" in errors[0].message
    assert "tool_result blocks must come first" in errors[1].message
    results_then_text = [GO, _an_call("a"), _an_res("a"), {"role": "user", "content": "more"}]
    assert transcript_findings(results_then_text, "anthropic") == []
    split_assistant = [
        GO,
        {"role": "assistant", "content": [{"type": "text", "text": "let me look"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "a", "name": "r", "input": {}}],
        },
        _an_res("a"),
    ]
    assert transcript_findings(split_assistant, "anthropic") == []


def test_anthropic_text_before_tool_result_is_flagged() -> None:
    history = [GO, _an_call("a")]
    history.append(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "here you go"},
                {"type": "tool_result", "tool_use_id": "a", "content": "ok"},
            ],
        }
    )
    errors = check_transcript(history, "anthropic")
    assert {(v.index, v.invariant) for v in errors} == {(1, "I1"), (2, "I1")}
    assert any("tool_result blocks must come first" in v.message for v in errors)


def test_anthropic_system_turns_are_read() -> None:
    system = {"role": "system", "content": [{"type": "text", "text": "be brief"}]}
    assert transcript_findings([GO, _an_call("a"), _an_res("a"), system], "anthropic") == []
    between = check_transcript([GO, _an_call("a"), system, _an_res("a")], "anthropic")
    assert any(v.index == 1 and "before message 2 (system)" in v.message for v in between)


def _server(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def _use(kind: str, block_id: str, name: str = "web_search") -> dict[str, Any]:
    return {"type": kind, "id": block_id, "name": name, "input": {}}


def _server_result(kind: str, block_id: str) -> dict[str, Any]:
    return {"type": kind, "tool_use_id": block_id, "content": []}


@pytest.mark.parametrize(
    ("call", "result"),
    [
        ("server_tool_use", "web_search_tool_result"),
        ("server_tool_use", "code_execution_tool_result"),
        ("server_tool_use", "bash_code_execution_tool_result"),
        ("mcp_tool_use", "mcp_tool_result"),
    ],
)
def test_anthropic_server_tools_are_paired(call: str, result: str) -> None:
    ok = [GO, _server(_use(call, "s1"), _server_result(result, "s1")), GO]
    assert transcript_findings(ok, "anthropic") == []
    orphan = [GO, _server(_server_result(result, "s1")), GO]
    [error] = check_transcript(orphan, "anthropic")
    assert error.index == 1
    assert "has no server_tool_use" in error.message
    unanswered = [GO, _server(_use(call, "s1")), GO, _server({"type": "text", "text": "x"})]
    [error] = check_transcript(unanswered, "anthropic")
    assert "server tool call 's1'" in error.message
    assert "no result block" in error.message
    twice = [
        GO,
        _server(_use(call, "s1"), _server_result(result, "s1"), _server_result(result, "s1")),
    ]
    assert ["a second result" in v.message for v in check_transcript(twice, "anthropic")] == [True]


def test_anthropic_last_message_may_pause_mid_server_call() -> None:
    # pause_turn: the caller sends the paused assistant message back as it is.
    paused = [GO, _server({"type": "text", "text": "searching"}, _use("server_tool_use", "s1"))]
    assert check_transcript(paused, "anthropic") == []


# -- OpenAI: system/developer between call and result, legacy functions, Responses ---------


@pytest.mark.parametrize("role", ["system", "developer", "user"])
def test_openai_message_between_call_and_result_is_flagged(role: str) -> None:
    history = [USER, _oa_call("a"), {"role": role, "content": "x"}, _oa_res("a")]
    errors = check_transcript(history, "openai")
    assert any(v.index == 1 and f"before message 2 ({role})" in v.message for v in errors)
    assert any(v.index == 3 and "right after the assistant" in v.message for v in errors)


def _legacy_call(name: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "function_call": {"name": name, "arguments": "{}"},
    }


def test_openai_legacy_function_calls_are_read() -> None:
    history = [USER, _legacy_call("lookup"), {"role": "function", "name": "lookup", "content": "1"}]
    assert transcript_findings(history, "openai") == []
    mismatched = [
        USER,
        _legacy_call("lookup"),
        {"role": "function", "name": "other", "content": "1"},
    ]
    # The API does not pair legacy functions: a mismatch is worth a warning only.
    assert check_transcript(mismatched, "openai") == []
    assert len(_warnings(mismatched, "openai")) == 2
    assert detect_format(history) == "openai"


def test_responses_items_are_paired() -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "..."},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"role": "assistant", "content": "done"},
    ]
    assert transcript_findings({"input": items}, "openai-responses") == []
    assert detect_format({"input": items}) == "openai-responses"
    early = [items[4], items[2]]
    [error] = check_transcript(early, "openai-responses")
    assert error.index == 0
    assert "comes before its call" in error.message
    twice = [items[2], items[4], items[4]]
    assert ["second output" in v.message for v in check_transcript(twice, "openai-responses")] == [
        True
    ]


def test_responses_message_between_call_and_output_is_a_warning() -> None:
    items = [
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"role": "assistant", "content": "thinking aloud"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    assert check_transcript(items, "openai-responses") == []
    [warning] = _warnings(items, "openai-responses")
    assert warning.index == 2
    assert "comes after a message item" in warning.message


def test_responses_continuation_may_answer_calls_the_input_lacks() -> None:
    output = {"type": "function_call_output", "call_id": "c9", "output": "ok"}
    assert len(check_transcript({"input": [output]}, "openai-responses")) == 1
    body = {"previous_response_id": "resp_1", "input": [output]}
    assert check_transcript(body, "openai-responses") == []


# -- one unreadable field, one finding; wrappers ---------------------------------------------


def test_unreadable_tool_calls_give_one_format_finding() -> None:
    damaged = {"role": "assistant", "content": None, "tool_calls": {"id": "a"}}
    history = [USER, damaged, _oa_res("a"), _oa_res("b"), {"role": "assistant", "content": "ok"}]
    assert [(f.invariant, f.index) for f in transcript_findings(history, "openai")] == [
        ("format", 1)
    ]


def test_unreadable_call_among_readable_ones_does_not_orphan_the_others() -> None:
    call = _oa_call("a", "b", "c")
    del call["tool_calls"][1]["id"]
    history = [USER, call, _oa_res("a"), _oa_res("b"), _oa_res("c")]
    assert [(f.invariant, f.index) for f in transcript_findings(history, "openai")] == [
        ("format", 1)
    ]


def test_unreadable_result_does_not_report_its_call_as_unanswered() -> None:
    history = [USER, _oa_call("a", "b"), _oa_res("a"), {"role": "tool", "content": "?"}, USER]
    assert [(f.invariant, f.index) for f in transcript_findings(history, "openai")] == [
        ("format", 3)
    ]
    anthropic = [GO, _an_call("a"), {"role": "user", "content": [{"type": "tool_result"}]}]
    assert [f.invariant for f in transcript_findings(anthropic, "anthropic")] == ["format"]
    no_id = [
        GO,
        {"role": "assistant", "content": [{"type": "tool_use", "name": "r"}]},
        _an_res("a"),
    ]
    assert [f.invariant for f in transcript_findings(no_id, "anthropic")] == ["format"]


def test_unreadable_wire_dict_keeps_its_calls_for_pairing() -> None:
    call = message_to_dict(_call("a", "b"))
    call["content"][0]["arguments"] = "not an object"
    history = [message_to_dict(UserMessage("go")), call]
    history += [message_to_dict(_res("a")), message_to_dict(_res("b"))]
    assert [(f.invariant, f.index) for f in transcript_findings(history)] == [("format", 1)]


def test_wrappers_are_accepted() -> None:
    history = [USER, _oa_call("a"), _oa_res("a")]
    assert check_transcript({"model": "gpt-4o", "messages": history}, "openai") == []
    assert transcript_findings({"model": "gpt-5", "input": "hello"}, "auto") == []
    with pytest.raises(TypeError, match="as 'messages', 'input' or 'contents'"):
        check_transcript({"conversation": history}, "openai")


# -- a log that ends mid-turn ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("format", "history"),
    [
        ("openai", [USER, _oa_call("a", "b"), _oa_res("a")]),
        ("anthropic", [GO, _an_call("a")]),
        ("openai-responses", [{"type": "function_call", "call_id": "c", "name": "r"}]),
        ("statemachine", [UserMessage("go"), _call("a")]),
    ],
)
def test_open_tail_is_accepted_on_request(format: str, history: list[Any]) -> None:
    assert [v.invariant for v in check_transcript(history, format)] == ["I1"]  # type: ignore[arg-type]
    assert check_transcript(history, format, allow_open_tail=True) == []  # type: ignore[arg-type]


def test_open_tail_does_not_excuse_an_earlier_unanswered_call() -> None:
    history = [USER, _oa_call("a"), USER, _oa_call("b")]
    [error] = check_transcript(history, "openai", allow_open_tail=True)
    assert error.index == 1
    items = [
        {"type": "function_call", "call_id": "c", "name": "r"},
        {"role": "user", "content": "and?"},
    ]
    assert len(check_transcript(items, "openai-responses", allow_open_tail=True)) == 1


# -- the command line --------------------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli_transcript(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_clean_file_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.json"
    path.write_text(json.dumps({"messages": [USER, _oa_call("a"), _oa_res("a")]}))
    code, out, err = _run([str(path)], capsys)
    assert (code, err) == (0, "")
    assert out == f"{path}: ok (openai, 3 messages, 0 errors, 0 warnings)\n"


def test_cli_findings_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.json"
    path.write_text(json.dumps([USER, _oa_call("a"), USER]))
    code, out, _ = _run([str(path)], capsys)
    assert code == 1
    assert out.splitlines()[0].endswith("FAIL (openai, 3 messages, 1 error, 0 warnings)")
    assert out.splitlines()[1].startswith("  error I1 at message 1: tool call 'a'")
    code, _, _ = _run(["--allow-open-tail", str(path)], capsys)
    assert code == 1  # the call is not in the last message
    path.write_text(json.dumps([USER, _oa_call("a")]))
    assert _run(["--allow-open-tail", str(path)], capsys)[0] == 0


def test_cli_names_a_log_of_no_clear_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log.json"
    converse_call = {"role": "assistant", "content": [{"toolUse": {"toolUseId": "a"}}]}
    path.write_text(json.dumps([USER, converse_call, _oa_res("a")]))
    code, out, _ = _run([str(path)], capsys)
    assert code == 1
    assert "FAIL (unknown, 3 messages, 1 error, 0 warnings)" in out
    assert "error format at message 0: the log matches several formats differently" in out
    assert _run(["--format", "openai", str(path)], capsys)[0] == 1  # read as told


def test_cli_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.json"
    path.write_text(json.dumps([GO, _an_call("a"), _an_res("a"), _an_call("a"), _an_res("a")]))
    code, out, _ = _run([str(path)], capsys)
    assert code == 0
    assert "(anthropic, 5 messages, 0 errors, 1 warning)" in out
    code, out, _ = _run(["--strict", str(path)], capsys)
    assert code == 1
    assert "  error I1 at message 3: tool call id 'a' reuses the id" in out


def test_cli_jsonl_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    per_message = tmp_path / "messages.jsonl"
    per_message.write_text("\n".join(json.dumps(m) for m in [USER, _oa_call("a"), _oa_res("a")]))
    assert _run([str(per_message)], capsys)[:2] == (
        0,
        f"{per_message}: ok (openai, 3 messages, 0 errors, 0 warnings)\n",
    )
    per_line = tmp_path / "runs.jsonl"
    runs = [{"messages": [USER, _oa_call("a"), _oa_res("a")]}, {"messages": [USER, _oa_res("z")]}]
    per_line.write_text("\n".join(json.dumps(r) for r in runs) + "\n")
    code, out, _ = _run([str(per_line)], capsys)
    assert code == 1
    assert out.startswith(f"{per_line}:1: ok")
    assert f"{per_line}:2: FAIL" in out


def test_cli_unreadable_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps([USER]))
    broken = tmp_path / "broken.json"
    broken.write_text('[{"role": "user"')
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe[]")
    scalar = tmp_path / "scalar.json"
    scalar.write_text("42")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for path, words in [
        (broken, "not JSON"),
        (binary, "not UTF-8"),
        (deep, "nested too deeply"),
        (scalar, "messages must be a sequence, got int"),
        (tmp_path / "missing.json", "No such file"),
    ]:
        code, out, err = _run([str(good), str(path)], capsys)
        assert code == 2, path
        assert out.startswith(f"{good}: ok")
        assert err.count("\n") == 1
        assert words in err
        assert str(path) in err


def test_cli_refuses_files_over_the_size_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps([USER] * 100))
    code, out, err = _run(["--max-bytes", "64", str(path)], capsys)
    assert (code, out) == (2, "")
    assert "over the limit of 64 (--max-bytes)" in err
    assert err.count("\n") == 1
    assert DEFAULT_MAX_BYTES == 32 * 1024 * 1024
    assert _run(["--max-bytes", "0", str(path)], capsys)[0] == 2


def _logs(root: Path) -> dict[str, Path]:
    """Three logs in a tree (one failing), and a file that is not a log."""
    (root / "b" / "c").mkdir(parents=True)
    paths = {
        "one": root / "one.json",
        "two": root / "b" / "two.jsonl",
        "bad": root / "b" / "c" / "bad.json",
    }
    paths["one"].write_text(json.dumps([USER, _oa_call("a"), _oa_res("a")]))
    paths["two"].write_text("\n".join(json.dumps(m) for m in [USER, _oa_call("a"), _oa_res("a")]))
    paths["bad"].write_text(json.dumps([USER, _oa_res("z")]))
    (root / "b" / "notes.txt").write_text("not a log")
    return paths


def test_cli_checks_a_directory_in_one_call_with_a_summary_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = _logs(tmp_path)
    code, out, err = _run([str(tmp_path)], capsys)
    assert (code, err) == (1, "")
    lines = [line for line in out.splitlines() if not line.startswith("  ")]
    assert lines == [
        f"{logs['bad']}: FAIL (openai, 2 messages, 1 error, 0 warnings)",
        f"{logs['two']}: ok (openai, 3 messages, 0 errors, 0 warnings)",
        f"{logs['one']}: ok (openai, 3 messages, 0 errors, 0 warnings)",
        "3 files, 3 transcripts: 2 ok, 1 failed, 0 unreadable (1 error, 0 warnings)",
    ]
    # One file: no summary line, as before.
    assert _run([str(logs["one"])], capsys)[1].count("\n") == 1


def test_cli_expands_a_glob_pattern_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = _logs(tmp_path)
    code, out, _ = _run([str(tmp_path / "**" / "*.json")], capsys)
    assert code == 1
    assert f"{logs['one']}: ok" in out
    assert f"{logs['bad']}: FAIL" in out
    assert str(logs["two"]) not in out  # .jsonl: not matched by the pattern
    assert out.endswith(
        "2 files, 2 transcripts: 1 ok, 1 failed, 0 unreadable (1 error, 0 warnings)\n"
    )


def test_cli_summary_counts_the_unreadable_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = _logs(tmp_path)
    (tmp_path / "broken.json").write_text("[{")
    code, out, err = _run([str(tmp_path)], capsys)
    assert code == 2
    assert err.count("\n") == 1
    assert "broken.json: not JSON" in err
    assert out.endswith(
        "4 files, 3 transcripts: 2 ok, 1 failed, 1 unreadable (1 error, 0 warnings)\n"
    )
    assert str(logs["one"]) in out


def test_cli_a_directory_or_pattern_naming_no_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    code, out, err = _run([str(empty)], capsys)
    assert (code, out) == (2, "")
    assert err == f"transcript: {empty}: no .json or .jsonl file in this directory\n"
    code, out, err = _run([str(tmp_path / "*.nothing")], capsys)
    assert (code, out) == (2, "")
    assert "the pattern matches no file" in err


@pytest.mark.timeout(30)
def test_cli_does_not_follow_a_directory_link_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = _logs(tmp_path)
    (tmp_path / "b" / "c" / "loop").symlink_to(tmp_path, target_is_directory=True)
    code, out, _ = _run([str(tmp_path)], capsys)
    assert code == 1
    assert out.count(str(logs["one"])) == 1


def test_cli_refuses_more_files_than_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _logs(tmp_path)
    code, out, err = _run(["--max-files", "2", str(tmp_path)], capsys)
    assert (code, out) == (2, "")
    assert err == "transcript: more than 2 files to check (--max-files): name fewer\n"
    assert _run(["--max-files", "3", str(tmp_path)], capsys)[0] == 1
    assert _run(["--max-files", "0", str(tmp_path)], capsys)[0] == 2
    assert DEFAULT_MAX_FILES == 10_000


def test_cli_usage_errors_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_transcript(["--format", "cohere", "x.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "invalid choice: 'cohere'" in err
    assert cli_transcript([]) == 2
    assert capsys.readouterr().err.startswith("transcript: ")


@pytest.mark.timeout(60)
def test_cli_is_registered_and_has_help() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "statemachine", "transcript", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0
    assert "exit status: 0 ok, 1 error-level findings, 2 bad arguments" in done.stdout
    assert "--allow-open-tail" in done.stdout
    assert "--max-bytes" in done.stdout
    assert "transcript" in usage()


def test_cli_checks_the_whole_corpus(capsys: pytest.CaptureFixture[str]) -> None:
    accepted = [str(CORPUS / e["file"]) for e in MANIFEST if e["expect"] is None]
    code, out, _ = _run(accepted, capsys)
    assert code == 0
    assert out.count(": ok (") == len(accepted)
    rejected = [
        str(CORPUS / e["file"])
        for e in MANIFEST
        if e["status"] >= 400 and e["expect"] and e["expect"]["level"] == "error"
    ]
    code, out, _ = _run(rejected, capsys)
    assert code == 1
    assert out.count(": FAIL (") == len(rejected)


def test_anthropic_reused_tool_use_ids_are_a_warning_and_an_error_under_strict() -> None:
    history = [GO, _an_call("a"), _an_res("a"), _an_call("a"), _an_res("a")]
    assert check_transcript(history, "anthropic") == []
    [warning] = transcript_findings(history, "anthropic")
    assert (warning.level, warning.index) == ("warning", 3)
    assert "an error under strict" in warning.message
    [error] = check_transcript(history, "anthropic", strict=True)
    assert error.index == 3
    assert "(ids must be unique across the request)" in error.message
    assert check_transcript(history, "anthropic", strict=True, id_reuse="warning") == []
    # Two calls with one id in one message stay errors, strict or not.
    twice = [GO, _an_call("a", "a"), _an_res("a", "a")]
    assert [e.index for e in check_transcript(twice, "anthropic")] == [1]


def test_strict_makes_a_responses_output_after_a_message_item_an_error() -> None:
    items = [
        {"type": "function_call", "call_id": "c", "name": "r", "arguments": "{}"},
        {"role": "user", "content": "and?"},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]
    assert check_transcript(items, "openai-responses") == []
    [error] = check_transcript(items, "openai-responses", strict=True)
    assert (error.index, error.invariant) == (2, "I1")
    assert "DeepSeek" in error.message


def test_strict_rules_are_each_documented() -> None:
    assert set(STRICT_RULES) == {
        "anthropic-id-reuse",
        "converse-tool-result-with-content",
        "responses-output-after-message",
    }
    guide = (Path(__file__).parents[1] / "docs" / "guides" / "conformance-kit.md").read_text()
    for rule in STRICT_RULES:
        assert f"`{rule}`" in guide


# -- properties over generated provider histories -----------------------------------------
#
# A conversation is a list of turns, each a list of (call id, tool name). It is rendered
# as a provider would receive it; the valid rendering must give no error, and one
# damage of the kind providers reject must give an error where the damage is.

Turns = list[list[tuple[str, str]]]
Checker = Callable[[list[dict[str, Any]], str], list[Violation]]


@st.composite
def conversations(draw: st.DrawFn, *, restart_ids: bool) -> Turns:
    turns: Turns = []
    for t in range(draw(st.integers(1, 4))):
        names = draw(st.lists(st.sampled_from(["read", "write", "grep"]), max_size=3))
        # Logs that restart their ids every turn ("call_0", "call_1", ...) are accepted
        # by OpenAI; Anthropic wants every id unique.
        ids = [f"call_{j}" if restart_ids else f"toolu_{t}_{j}" for j in range(len(names))]
        turns.append(list(zip(ids, names, strict=True)))
    return turns


def _render_openai(turns: Turns) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "s"}, USER]
    for calls in turns:
        if not calls:
            out.append({"role": "assistant", "content": "thinking"})
            continue
        out.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}
                    for i, n in calls
                ],
            }
        )
        out += [{"role": "tool", "tool_call_id": i, "name": n, "content": "ok"} for i, n in calls]
    out.append({"role": "assistant", "content": "done"})
    return out


def _render_anthropic(turns: Turns) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [GO]
    for calls in turns:
        blocks = [{"type": "tool_use", "id": i, "name": n, "input": {}} for i, n in calls]
        out.append({"role": "assistant", "content": [{"type": "text", "text": "t"}, *blocks]})
        results = [{"type": "tool_result", "tool_use_id": i, "content": "ok"} for i, _ in calls]
        out.append({"role": "user", "content": [*results, {"type": "text", "text": "go on"}]})
    out.append({"role": "assistant", "content": [{"type": "text", "text": "done"}]})
    return out


def _valid_histories_have_no_error(check: Checker, fmt: str, turns: Turns) -> None:
    history = _render_openai(turns) if fmt == "openai" else _render_anthropic(turns)
    assert check(history, fmt) == []


def _damage(fmt: str, turns: Turns, data: st.DataObject) -> tuple[list[dict[str, Any]], int]:
    """One damage a provider rejects, and the index of the message that shows it."""
    history = _render_openai(turns) if fmt == "openai" else _render_anthropic(turns)
    owners = [n for n, m in enumerate(history) if m.get("tool_calls") or _has_tool_use(m)]
    owner = data.draw(st.sampled_from(owners))
    kind = data.draw(st.sampled_from(["drop", "interpose", "duplicate"]))
    if fmt == "openai":
        first_result = owner + 1
        if kind == "drop":
            del history[first_result]
            return history, owner
        if kind == "interpose":
            role = data.draw(st.sampled_from(["user", "system", "developer"]))
            history.insert(first_result, {"role": role, "content": "x"})
            return history, owner
        history.insert(first_result + 1, dict(history[first_result]))
        return history, first_result + 1
    blocks = history[owner + 1]["content"]
    if kind == "drop":
        del blocks[0]
        return history, owner
    if kind == "interpose":
        blocks.insert(0, {"type": "text", "text": "first"})
        return history, owner
    blocks.insert(1, dict(blocks[0]))
    return history, owner + 1


def _has_tool_use(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(b.get("type") == "tool_use" for b in content)


def _damage_is_found(check: Checker, fmt: str, turns: Turns, data: st.DataObject) -> None:
    assume(any(turns))
    history, index = _damage(fmt, turns, data)
    errors = check(history, fmt)
    assert any(v.index == index and v.invariant == "I1" for v in errors), (history, errors)


def _real_checker(history: list[dict[str, Any]], fmt: str) -> list[Violation]:
    return check_transcript(history, fmt)  # type: ignore[arg-type]


@given(turns=conversations(restart_ids=True))
def test_property_valid_openai_histories_have_no_error(turns: Turns) -> None:
    _valid_histories_have_no_error(_real_checker, "openai", turns)


@given(turns=conversations(restart_ids=False))
def test_property_valid_anthropic_histories_have_no_error(turns: Turns) -> None:
    _valid_histories_have_no_error(_real_checker, "anthropic", turns)


@given(turns=conversations(restart_ids=True), data=st.data())
def test_property_a_damaged_openai_history_has_an_error_where_the_damage_is(
    turns: Turns, data: st.DataObject
) -> None:
    _damage_is_found(_real_checker, "openai", turns, data)


@given(turns=conversations(restart_ids=False), data=st.data())
def test_property_a_damaged_anthropic_history_has_an_error_where_the_damage_is(
    turns: Turns, data: st.DataObject
) -> None:
    _damage_is_found(_real_checker, "anthropic", turns, data)


def _first_name_wins(history: list[dict[str, Any]], fmt: str) -> list[Violation]:
    """The checker as it was: reused ids are I1 errors and a result's tool name is the
    first name ever seen for its id."""
    first: dict[str, str] = {}
    out = check_transcript(history, fmt, id_reuse="error")  # type: ignore[arg-type]
    for n, message in enumerate(history):
        for call in message.get("tool_calls") or ():
            first.setdefault(call["id"], call["function"]["name"])
        if message.get("role") == "tool" and message["name"] != first[message["tool_call_id"]]:
            out.append(Violation("I1", n, "wrong tool name"))
    return out


def _pairs_by_id_anywhere(history: list[dict[str, Any]], fmt: str) -> list[Violation]:
    """A naive checker: every call has a result with its id somewhere after it."""
    out = []
    for n, message in enumerate(history):
        for call in message.get("tool_calls") or ():
            later = [m for m in history[n + 1 :] if m.get("tool_call_id") == call["id"]]
            if not later:
                out.append(Violation("I1", n, "no result"))
    return out


@pytest.mark.timeout(120)
def test_the_properties_catch_broken_checkers() -> None:
    # No shrinking: only whether a counterexample is found matters here.
    quick = settings(max_examples=300, database=None, derandomize=True, phases=[Phase.generate])
    valid = quick(given(turns=conversations(restart_ids=True))(_valid_property(_first_name_wins)))
    with pytest.raises(AssertionError):
        valid()
    damaged = quick(
        given(turns=conversations(restart_ids=True), data=st.data())(
            _damage_property(_pairs_by_id_anywhere)
        )
    )
    with pytest.raises(AssertionError):
        damaged()


def _valid_property(check: Checker) -> Callable[[Turns], None]:
    def run(turns: Turns) -> None:
        _valid_histories_have_no_error(check, "openai", turns)

    return run


def _damage_property(check: Checker) -> Callable[[Turns, st.DataObject], None]:
    def run(turns: Turns, data: st.DataObject) -> None:
        _damage_is_found(check, "openai", turns, data)

    return run


def test_responses_function_call_without_call_id_is_one_format_finding() -> None:
    items = [
        {"type": "function_call", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]
    found = transcript_findings(items, "openai-responses")
    assert [(f.invariant, f.index) for f in found] == [("format", 0)]


@pytest.mark.timeout(60)
def test_the_checker_works_without_hypothesis_and_the_searches_say_what_to_install() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "import statemachine.testing as t\n"
        "assert t.check_transcript([], 'statemachine') == []\n"
        "try:\n"
        "    from statemachine.testing import run_conformance\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'agent-statemachine[test]'" in proc.stdout
