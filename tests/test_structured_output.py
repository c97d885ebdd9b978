"""Structured output: the final-result tool, its rows of the table (output_missing,
output_accepted, output_retries_exhausted), the retry budget, the typed output, the
snapshot, resume and the journal."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from typing import Any, TypedDict

import pytest

import statemachine as sm
from statemachine.core.engine import Engine
from statemachine.core.events import CallModel, ContinueDecided, ModelResponded, Start, ToolFinished
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import State, TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.engine import OutputInvalidError, OutputSpec
from statemachine.errors import InvalidInputError, UsageError
from statemachine.hooks import RequireApproval
from statemachine.journal import Journal, JournalingEngine, replay
from statemachine.testing.models import ScriptedModel

S = TurnState
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["name", "population"],
}
LOOKUP = ToolDefinition("lookup", "Look up.", {"type": "object", "properties": {}})


@dataclasses.dataclass
class City:
    name: str
    population: int


class CityDict(TypedDict):
    name: str
    population: int


def _final(call_id: str, **arguments: Any) -> AssistantMessage:
    return AssistantMessage(
        [ToolCall(call_id, "final_result", arguments)], stop_reason=StopReason.TOOL_USE
    )


PARIS: dict[str, Any] = {"name": "Paris", "population": 2_100_000}


def _engine(retries: int = 2, **options: Any) -> Engine:
    return Engine(
        tools=[LOOKUP],
        messages=[UserMessage("biggest city?")],
        output=OutputSpec.of(SCHEMA, retries=retries),
        **options,
    )


def _state(engine: Engine) -> State:
    """The state now (a call, so that mypy does not narrow it across events)."""
    return engine.state


def _results(engine: Engine) -> list[ToolResultMessage]:
    return [m for m in engine.messages if isinstance(m, ToolResultMessage)]


# -- the engine's rows -------------------------------------------------------------------------


def test_the_model_is_offered_the_final_result_tool() -> None:
    engine = _engine()
    [call] = engine.handle(Start())
    assert isinstance(call, CallModel)
    assert [t.name for t in call.tools] == ["lookup", "final_result"]
    assert call.tools[-1].schema_dict() == SCHEMA
    assert engine.tools == (LOOKUP,)  # the user's tools; the final-result tool is the run's


def test_a_valid_final_result_ends_done_and_gets_its_result() -> None:
    engine = _engine()
    engine.handle(Start())
    actions = engine.handle(ModelResponded(_final("f1", **PARIS)))
    assert _state(engine) is S.DONE
    assert not any(isinstance(a, CallModel) for a in actions)
    [result] = _results(engine)  # I1: the final-result call has its result
    assert (result.tool_call_id, result.text, result.is_error) == (
        "f1",
        "Final result accepted.",
        False,
    )
    assert engine.output_call == "f1"
    assert "final result (call f1)" in (engine.explanation or "")


def test_other_calls_of_the_batch_still_run_before_the_run_ends() -> None:
    engine = _engine()
    engine.handle(Start())
    message = AssistantMessage(
        [ToolCall("c1", "lookup", {}), ToolCall("f1", "final_result", PARIS)],
        stop_reason=StopReason.TOOL_USE,
    )
    actions = engine.handle(ModelResponded(message))
    assert _state(engine) is S.COLLECTING_RESULTS
    assert [a.call.id for a in actions if hasattr(a, "call")] == ["c1"]  # not final_result
    engine.handle(ToolFinished("c1", ToolOutput("found")))
    assert _state(engine) is S.DONE
    assert [r.tool_call_id for r in _results(engine)] == ["c1", "f1"]  # call order (I2)


def test_invalid_arguments_go_back_to_the_model_within_the_retries() -> None:
    engine = _engine(retries=1)
    engine.handle(Start())
    actions = engine.handle(ModelResponded(_final("f1", name="Paris", population="many")))
    assert _state(engine) is S.AWAITING_MODEL
    assert any(isinstance(a, CallModel) for a in actions)
    [result] = _results(engine)
    assert result.is_error
    assert "population" in result.text
    assert "JSON Schema" in result.text
    engine.handle(ModelResponded(_final("f2", name="Paris")))
    assert _state(engine) is S.OUTPUT_INVALID
    text = engine.explanation or ""
    assert "2 attempt(s) (output_retries=1)" in text
    assert "Last error: Invalid arguments for tool final_result" in text
    assert "population" in text


def test_a_final_text_answer_is_answered_with_a_reminder() -> None:
    engine = _engine(retries=2)
    engine.handle(Start())
    actions = engine.handle(ModelResponded(AssistantMessage("Paris, I think.")))
    assert _state(engine) is S.AWAITING_MODEL
    [call] = [a for a in actions if isinstance(a, CallModel)]
    reminder = call.messages[-1]
    assert isinstance(reminder, UserMessage)
    [block] = reminder.content
    assert isinstance(block, TextContent)
    assert "Call the tool final_result" in block.text
    engine.handle(ModelResponded(_final("f1", **PARIS)))
    assert _state(engine) is S.DONE


def test_a_model_that_never_gives_output_ends_output_invalid_and_never_loops() -> None:
    engine = _engine(retries=2)
    engine.handle(Start())
    for _ in range(3):
        engine.handle(ModelResponded(AssistantMessage("no")))
    assert _state(engine) is S.OUTPUT_INVALID
    assert engine.turns == 3
    assert "instead of calling final_result" in (engine.explanation or "")


def test_a_second_valid_final_result_is_not_used() -> None:
    engine = _engine()
    engine.handle(Start())
    message = AssistantMessage(
        [ToolCall("f1", "final_result", PARIS), ToolCall("f2", "final_result", PARIS)],
        stop_reason=StopReason.TOOL_USE,
    )
    engine.handle(ModelResponded(message))
    assert _state(engine) is S.DONE
    assert engine.output_call == "f1"
    assert [r.is_error for r in _results(engine)] == [False, True]


def test_a_user_tool_named_final_result_is_refused() -> None:
    clash = ToolDefinition("final_result", "Mine.", {"type": "object"})
    with pytest.raises(InvalidInputError, match="final_result"):
        Engine(tools=[clash], messages=[UserMessage("x")], output=OutputSpec.of(SCHEMA))


def test_output_spec_refuses_what_is_not_an_object_schema() -> None:
    with pytest.raises(InvalidInputError, match="output_type must give a JSON Schema of an object"):
        OutputSpec.of({"type": "string"})
    with pytest.raises(InvalidInputError, match="output_type"):
        OutputSpec.of({"type": "object", "properties": 3})
    with pytest.raises(InvalidInputError, match="output_retries"):
        OutputSpec.of(SCHEMA, retries=-1)


# -- snapshot and journal --------------------------------------------------------------------


def test_the_output_survives_a_snapshot() -> None:
    engine = _engine(retries=1)
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage("text")))
    engine.handle(ModelResponded(_final("f1", **PARIS)))
    data = json.loads(json.dumps(engine.snapshot()))
    assert data["output"] == {"schema": SCHEMA, "retries": 1}
    assert (data["outputCall"], data["outputFailures"]) == ("f1", 1)
    restored = Engine.restore(data)
    assert restored.control_key() == engine.control_key()
    data["outputCall"] = "c9"
    with pytest.raises(sm.errors.SnapshotError, match=r"snapshot\.outputCall"):
        Engine.restore(data)


def test_replay_gives_the_same_output_run() -> None:
    stream = io.StringIO()
    engine = JournalingEngine(
        journal=Journal(stream),
        tools=[LOOKUP],
        messages=[UserMessage("go")],
        output=OutputSpec.of(SCHEMA, retries=0),
    )
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage("text")))
    assert _state(engine) is S.OUTPUT_INVALID
    result = replay(stream.getvalue().splitlines(keepends=True))
    assert result.state is S.OUTPUT_INVALID
    assert result.messages == tuple(engine.messages)


# -- the driver: output_type ------------------------------------------------------------------


@pytest.mark.parametrize("output_type", [City, CityDict, SCHEMA])
def test_run_agent_gives_the_output_as_its_type(output_type: Any) -> None:
    model = ScriptedModel(_final("f1", name="Paris", population="many"), _final("f2", **PARIS))
    result = sm.run_agent_sync(
        model=model, messages=[UserMessage("biggest city?")], output_type=output_type
    )
    assert result.state is S.DONE
    expected = City(**PARIS) if output_type is City else PARIS
    assert result.output == expected
    assert model.calls == 2


def test_a_pydantic_model_is_an_output_type() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Town(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        name: str
        population: int

    result = sm.run_agent_sync(
        model=ScriptedModel(_final("f1", **PARIS)),
        messages=[UserMessage("biggest city?")],
        output_type=Town,
    )
    assert result.output == Town(**PARIS)


def test_the_output_is_typed_for_mypy() -> None:
    result: sm.RunResult[City] = sm.run_agent_sync(
        model=ScriptedModel(_final("f1", **PARIS)),
        messages=[UserMessage("biggest city?")],
        output_type=City,
    )
    assert result.output is not None
    assert result.output.population == 2_100_000


def test_spent_retries_raise_output_invalid_error() -> None:
    result = sm.run_agent_sync(
        model=ScriptedModel(AssistantMessage("no"), AssistantMessage("still no")),
        messages=[UserMessage("q")],
        output_type=City,
        output_retries=1,
    )
    assert result.state is S.OUTPUT_INVALID
    assert result.output is None
    with pytest.raises(OutputInvalidError, match="Last error"):
        result.raise_for_state()


@pytest.mark.parametrize("bad", [complex, list[complex], "City", 3, []])
def test_an_output_type_without_a_json_schema_is_refused_first(bad: Any) -> None:
    model = ScriptedModel(AssistantMessage("hi"))
    with pytest.raises(UsageError, match="output_type"):
        sm.run_agent_sync(model=model, messages=[UserMessage("q")], output_type=bad)
    assert model.calls == 0


def test_a_user_tool_named_final_result_is_refused_by_run_agent() -> None:
    @sm.tool
    def final_result() -> str:
        """Mine."""
        return "x"

    with pytest.raises(InvalidInputError, match="rename the tool"):
        sm.run_agent_sync(
            model=ScriptedModel(),
            messages=[UserMessage("q")],
            tools=[final_result],
            output_type=City,
        )


def test_a_resumed_run_keeps_its_output_type() -> None:
    @sm.tool
    def lookup() -> str:
        """Look up."""
        return "found"

    model = ScriptedModel(
        AssistantMessage([ToolCall("c1", "lookup", {})], stop_reason=StopReason.TOOL_USE),
        _final("f1", **PARIS),
    )
    first = sm.run_agent_sync(
        model=model,
        messages=[UserMessage("q")],
        tools=[lookup],
        output_type=City,
        before_tool_call=lambda call: RequireApproval("check"),
    )
    assert first.state is S.AWAITING_USER
    snapshot = json.loads(json.dumps(first.snapshot))
    resumed = asyncio.run(
        sm.resume_agent(
            snapshot,
            model=model,
            tools=[lookup],
            approvals={"c1": True},
            before_tool_call=lambda call: None,
            output_type=City,
        )
    )
    assert resumed.state is S.DONE
    assert resumed.output == City(**PARIS)


def test_an_unknown_tool_is_answered_with_the_final_result_tool_among_those_available() -> None:
    engine = _engine()
    engine.handle(Start())
    message = AssistantMessage([ToolCall("c1", "search", {})], stop_reason=StopReason.TOOL_USE)
    engine.handle(ModelResponded(message))
    [result] = _results(engine)
    assert "Available tools: lookup, final_result." in result.text
    assert engine.output_call is None


def test_a_final_result_held_behind_an_approval_survives_a_snapshot() -> None:
    @sm.tool
    def lookup() -> str:
        """Look up."""
        return "found"

    message = AssistantMessage(
        [ToolCall("c1", "lookup", {}), ToolCall("f1", "final_result", PARIS)],
        stop_reason=StopReason.TOOL_USE,
    )
    first = sm.run_agent_sync(
        model=ScriptedModel(message),
        messages=[UserMessage("q")],
        tools=[lookup],
        output_type=City,
        end_strategy="exhaustive",  # the other call waits for its approval
        before_tool_call=lambda call: RequireApproval("check"),
    )
    assert first.state is S.AWAITING_USER
    assert first.snapshot is not None
    # f1's result waits behind c1's (I2), so it is not in the history yet.
    assert not any(isinstance(m, ToolResultMessage) for m in first.messages)
    resumed = asyncio.run(
        sm.resume_agent(
            json.loads(json.dumps(first.snapshot)),
            model=ScriptedModel(),
            tools=[lookup],
            approvals={"c1": True},
            before_tool_call=lambda call: None,
            output_type=City,
        )
    )
    assert resumed.state is S.DONE
    assert resumed.output == City(**PARIS)
    assert [m.tool_call_id for m in resumed.messages if isinstance(m, ToolResultMessage)] == [
        "c1",
        "f1",
    ]


def test_a_stop_asked_with_a_valid_final_result_keeps_both() -> None:
    engine = _engine(check_continue=True)
    engine.handle(Start())
    engine.handle(ModelResponded(_final("f1", **PARIS)))
    assert _state(engine) is S.TURN_BOUNDARY  # should_continue is asked first (rule 7)
    engine.handle(ContinueDecided(True, "enough"))
    assert _state(engine) is S.DONE
    assert "enough" in (engine.explanation or "")  # the stop's row won
    assert engine.output_call == "f1"  # and the output stands
