"""strands-agents as a peer of the conformance kit: each defect the kit reports, on the
smallest scenario that shows it (examples/conformance/REPORT.md reads each one against
strands' source). strands-agents is installed beside the package, without its pin of
mcp<2.2 (its agent loop does not import mcp): see examples/conformance/README.md."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from statemachine.messages import StopReason
from statemachine.testing import (
    AbortAt,
    AbortKind,
    ModelTurn,
    Scenario,
    ScriptedCall,
    check_record,
    run_conformance,
    run_scenario,
)
from statemachine.testing.strategies import PRIOR_EXCHANGE

if os.environ.get("CI") == "true":
    import strands  # noqa: F401 - run.sh installs it for the tests: fail here, never skip
else:
    pytest.importorskip("strands", reason="strands-agents is not installed (run.sh test does)")
sys.path.insert(0, str(Path(__file__).parents[1] / "examples" / "conformance"))
LOOP = importlib.import_module("python_peers").strands_loop()


def _call(tool: str = "alpha", call_id: str | None = None) -> ScriptedCall:
    return ScriptedCall(tool=tool, call_id=call_id)


def _text(message: Any) -> str:
    return "".join(getattr(block, "text", "") for block in message.content)


def _problems(scenario: Scenario) -> tuple[Any, dict[str, list[str]]]:
    record = run_scenario(LOOP, scenario)
    return record, check_record(record)


@pytest.mark.timeout(60)
def test_a_plain_tool_turn_passes() -> None:
    scenario = Scenario(turns=(ModelTurn(calls=(_call(),), stop_reason=StopReason.TOOL_USE),))
    record, problems = _problems(scenario)
    assert problems == {}
    assert [m.role for m in record.transcript] == ["user", "assistant", "toolResult", "assistant"]


@pytest.mark.timeout(60)
def test_two_calls_with_one_id_both_run_and_both_are_answered() -> None:
    turn = ModelTurn(calls=(_call("alpha", "dup"), _call("beta", "dup")), stop_reason="toolUse")
    record, problems = _problems(Scenario(turns=(turn,), max_turns=2))
    assert [e.key for e in record.executions] == ["t1c0", "t1c1"]
    assert [m.role for m in record.transcript].count("toolResult") == 2
    assert any("tool call id 'dup' repeats the id" in p for p in problems["I1"])


@pytest.mark.timeout(60)
def test_an_empty_call_id_drops_the_call_and_leaves_empty_messages() -> None:
    turn = ModelTurn(calls=(_call(call_id=""),), stop_reason=StopReason.TOOL_USE)
    record, problems = _problems(Scenario(turns=(turn,)))
    assert record.executions == ()
    assistant, user = record.transcript[1], record.transcript[2]
    assert assistant.content == ()
    assert (user.role, _text(user)) == ("user", "")
    assert any("is not the model's next response" in p for p in problems["I2"])


@pytest.mark.timeout(60)
def test_an_abort_replaces_the_models_response_with_an_invented_one() -> None:
    turn = ModelTurn(calls=(_call(),), stop_reason=StopReason.TOOL_USE, text="Working on it.")
    scenario = Scenario(turns=(turn,), max_turns=2, abort=AbortAt(AbortKind.MODEL_CALL, 1))
    record, problems = _problems(scenario)
    assert record.transcript[-1].text == "Cancelled by user"
    assert any("is not the model's next response" in p for p in problems["I2"])


@pytest.mark.timeout(60)
def test_a_tool_use_stop_without_calls_appends_an_empty_user_message_and_calls_again() -> None:
    scenario = Scenario(turns=(ModelTurn(stop_reason=StopReason.TOOL_USE),), max_turns=3)
    record, problems = _problems(scenario)
    assert record.model_calls == 2
    assert (record.transcript[2].role, _text(record.transcript[2])) == ("user", "")
    assert any("called the model 2 times" in p for p in problems["I3"])


@pytest.mark.timeout(60)
def test_an_abort_before_the_start_still_makes_one_model_call() -> None:
    scenario = Scenario(turns=(ModelTurn(text="hi"),), abort=AbortAt(AbortKind.BEFORE_START))
    record, problems = _problems(scenario)
    assert record.model_calls_after_abort == 1
    assert problems["I6"] == ["the loop called the model 1 time(s) after the abort"]


@pytest.mark.timeout(60)
def test_a_model_exception_escapes_invoke_async() -> None:
    record, problems = _problems(Scenario(turns=(ModelTurn(raises=True),)))
    assert record.transcript is None
    assert problems["I8"] == [
        "the loop did not return a history: RuntimeError: scripted model failure on call 1"
    ]


@pytest.mark.timeout(60)
def test_a_max_tokens_stop_replaces_the_call_with_text_and_stops() -> None:
    turn = ModelTurn(calls=(_call(),), stop_reason=StopReason.LENGTH)
    record, problems = _problems(Scenario(turns=(turn,), max_turns=2))
    assert "tool use was incomplete due to maximum token limits" in record.transcript[1].text
    assert "I2" in problems
    assert "I3" in problems


@pytest.mark.timeout(120)
def test_the_search_sets_aside_what_strands_cannot_express() -> None:
    report = run_conformance(LOOP, max_examples=20, seed=20261202, properties=["I1"])
    reasons = " ".join(why for _, why in report.not_expressible)
    assert "no stop reason, and no documented exception, for a failed request" in reasons


@pytest.mark.timeout(60)
def test_an_id_of_the_input_history_used_again_runs_and_is_answered() -> None:
    turn = ModelTurn(calls=(_call("beta", "prev_1"),), stop_reason=StopReason.TOOL_USE)
    record, problems = _problems(Scenario(turns=(turn,), history=PRIOR_EXCHANGE))
    assert [e.key for e in record.executions] == ["t1c0"]
    result = record.transcript[len(PRIOR_EXCHANGE) + 1]
    assert (result.tool_call_id, result.tool_name) == ("prev_1", "beta")
    assert problems["I1"] == [
        "I1 at message 5: tool call id 'prev_1' repeats the id of a call in message 1"
    ]
