"""Native structured output: the final text is the output, validated in place of a
final-result call's arguments, with the same rows of the table (output_missing,
output_accepted, output_retries_exhausted); output_mode on run_agent and Agent; the
snapshot and the journal keep the mode."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from typing import Any

import pytest

import statemachine as sm
from statemachine.core.engine import Engine
from statemachine.core.events import CallModel, ModelResponded, Start
from statemachine.core.messages import AssistantMessage, StopReason, ToolCall, UserMessage
from statemachine.core.output import TEXT_OUTPUT
from statemachine.core.table import State, TurnState
from statemachine.core.tools import ToolDefinition
from statemachine.engine import OutputSpec
from statemachine.errors import InvalidInputError, UsageError
from statemachine.journal import Journal, JournalingEngine, replay
from statemachine.testing.models import ScriptedModel

S = TurnState
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["name", "population"],
}
LOOKUP = ToolDefinition("lookup", "Look up.", {"type": "object", "properties": {}})
PARIS = '{"name": "Paris", "population": 2100000}'


@dataclasses.dataclass
class City:
    name: str
    population: int


def _engine(retries: int = 2, **options: Any) -> Engine:
    return Engine(
        tools=[LOOKUP],
        messages=[UserMessage("biggest city?")],
        output=OutputSpec.of(SCHEMA, retries=retries, native=True),
        **options,
    )


def _state(engine: Engine) -> State:
    return engine.state


def _text(message: object) -> str:
    """The text of a user message or a tool result."""
    content = getattr(message, "content", ())
    return "".join(getattr(block, "text", "") for block in content)


# -- the engine ---------------------------------------------------------------------------------


def test_a_native_run_offers_no_final_result_tool() -> None:
    engine = _engine()
    [call] = engine.handle(Start())
    assert isinstance(call, CallModel)
    assert [t.name for t in call.tools] == ["lookup"]


def test_a_final_text_that_validates_is_the_output_and_ends_done() -> None:
    engine = _engine()
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage(PARIS)))
    assert _state(engine) is S.DONE
    assert engine.output_call == TEXT_OUTPUT
    assert engine.explanation == (
        "The model gave its final result as its final text; it is the run's output."
    )
    assert [t.dest for t in engine.trace][-1] is S.DONE


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("Paris, about two million", "the final text is not JSON"),
        ("[1, 2]", "the final text is a JSON list, not an object"),
        ('{"name": "Paris"}', "output: 'population' is a required property"),
        ('{"name": "Paris", "population": NaN}', "NaN is not JSON"),
        ("[" * 100_000 + "]" * 100_000, "the final text is not JSON"),
    ],
)
def test_invalid_text_goes_back_to_the_model_naming_the_problem(text: str, problem: str) -> None:
    engine = _engine()
    engine.handle(Start())
    [again] = [
        a for a in engine.handle(ModelResponded(AssistantMessage(text))) if isinstance(a, CallModel)
    ]
    assert _state(engine) is S.AWAITING_MODEL
    reminder = again.messages[-1]
    assert isinstance(reminder, UserMessage)
    assert problem in _text(reminder)
    assert "Answer with only a JSON object matching this JSON Schema" in _text(reminder)
    # The output_missing row: from AwaitingModel to the turn boundary, not to Done.
    assert (S.AWAITING_MODEL, S.TURN_BOUNDARY) in [(t.source, t.dest) for t in engine.trace]
    engine.handle(ModelResponded(AssistantMessage(PARIS)))
    assert _state(engine) is S.DONE


def test_text_that_never_validates_ends_output_invalid_within_the_retries() -> None:
    engine = _engine(retries=1)
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage("no")))
    engine.handle(ModelResponded(AssistantMessage('{"name": 3}')))
    assert _state(engine) is S.OUTPUT_INVALID
    assert engine.turns == 2
    assert "output.name: 3 is not of type 'string'" in (engine.explanation or "")


def test_tool_calls_run_as_usual_and_only_the_final_answer_is_judged() -> None:
    engine = _engine()
    engine.handle(Start())
    call = AssistantMessage([ToolCall("c1", "lookup", {})], stop_reason=StopReason.TOOL_USE)
    engine.handle(ModelResponded(call))
    assert _state(engine) is S.COLLECTING_RESULTS
    final_result = ToolCall("c2", "final_result", json.loads(PARIS))
    engine2 = _engine()
    engine2.handle(Start())
    engine2.handle(ModelResponded(AssistantMessage([final_result], stop_reason="toolUse")))
    # No such tool in native mode: the call is an unknown tool, not the output.
    assert engine2.output_call is None
    assert "Unknown tool: final_result. Available tools: lookup." in _text(engine2.messages[-1])


def test_a_truncated_or_failed_answer_is_not_the_output() -> None:
    engine = _engine()
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage(PARIS, stop_reason=StopReason.ERROR)))
    assert _state(engine) is S.FAILED
    assert engine.output_call is None


def test_a_native_run_survives_a_snapshot_and_old_snapshots_stay_tool_mode() -> None:
    engine = _engine(retries=1)
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage("not json")))
    engine.handle(ModelResponded(AssistantMessage(PARIS)))
    data = json.loads(json.dumps(engine.snapshot()))
    assert data["output"] == {"schema": SCHEMA, "retries": 1, "native": True}
    assert (data["outputCall"], data["outputFailures"]) == (TEXT_OUTPUT, 1)
    restored = Engine.restore(data)
    assert restored.output is not None
    assert restored.output.native
    assert restored.control_key() == engine.control_key()
    wrong = json.loads(json.dumps(data))
    wrong["outputCall"] = "c1"
    with pytest.raises(sm.errors.SnapshotError, match=r"snapshot\.outputCall"):
        Engine.restore(wrong)
    wrong = json.loads(json.dumps(data))
    wrong["output"]["native"] = "yes"
    with pytest.raises(sm.errors.SnapshotError, match=r"native"):
        Engine.restore(wrong)
    assert OutputSpec.of(SCHEMA).to_dict() == {"schema": SCHEMA, "retries": 2}  # as before


def test_replay_of_a_journal_gives_the_same_native_run() -> None:
    stream = io.StringIO()
    engine = JournalingEngine(
        journal=Journal(stream),
        tools=[LOOKUP],
        messages=[UserMessage("go")],
        output=OutputSpec.of(SCHEMA, retries=1, native=True),
    )
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage("text")))
    engine.handle(ModelResponded(AssistantMessage(PARIS)))
    assert _state(engine) is S.DONE
    result = replay(stream.getvalue().splitlines(keepends=True))
    assert result.state is S.DONE
    assert result.messages == tuple(engine.messages)


# -- the driver: output_mode --------------------------------------------------------------------


def _run(model: Any, **options: Any) -> sm.RunResult[Any]:
    return asyncio.run(
        sm.run_agent(model=model, messages="biggest city?", output_type=City, **options)
    )


@pytest.mark.timeout(30)
def test_auto_is_native_for_a_client_that_has_it_and_the_schema_reaches_it() -> None:
    model = ScriptedModel("not json", PARIS, native_output=True)
    result = _run(model)
    assert result.state is S.DONE
    assert result.output == City("Paris", 2_100_000)
    first, second = model.requests
    assert first.tool_names == ()
    assert first.output_schema is not None
    assert first.output_schema["required"] == ["name", "population"]
    assert "the final text is not JSON" in _text(second.messages[-1])


@pytest.mark.timeout(30)
def test_auto_is_the_tool_for_a_client_without_native_output() -> None:
    final = ToolCall("f1", "final_result", json.loads(PARIS))
    model = ScriptedModel(AssistantMessage([final], stop_reason="toolUse"))
    result = _run(model)
    assert result.output == City("Paris", 2_100_000)
    assert model.requests[0].tool_names == ("final_result",)
    assert model.requests[0].output_schema is None


@pytest.mark.timeout(30)
def test_tool_mode_is_kept_when_asked_for_a_client_that_has_native_output() -> None:
    final = ToolCall("f1", "final_result", json.loads(PARIS))
    model = ScriptedModel(AssistantMessage([final], stop_reason="toolUse"), native_output=True)
    result = _run(model, output_mode="tool")
    assert result.output == City("Paris", 2_100_000)
    assert model.requests[0].output_schema is None


def test_native_mode_for_a_client_without_it_is_refused_before_any_call() -> None:
    model = ScriptedModel(PARIS)
    with pytest.raises(UsageError, match=r"output_mode='native'.*ScriptedModel"):
        _run(model, output_mode="native")
    with pytest.raises(UsageError, match="output_mode='native'"):
        sm.Agent(model, output_type=City, output_mode="native")
    assert model.calls == 0


@pytest.mark.parametrize("mode", ["json", None, 1])
def test_an_unknown_output_mode_is_refused_naming_it(mode: Any) -> None:
    with pytest.raises(InvalidInputError, match="output_mode must be"):
        _run(ScriptedModel(PARIS), output_mode=mode)


@pytest.mark.timeout(30)
def test_an_agent_gives_its_output_natively_and_a_typed_sub_agent_answers_with_it() -> None:
    child = sm.Agent(ScriptedModel(PARIS, native_output=True), name="cities", output_type=City)
    result = child.run_sync("biggest city?")
    assert result.output == City("Paris", 2_100_000)

    child = sm.Agent(ScriptedModel(PARIS, native_output=True), name="cities", output_type=City)
    parent_model = ScriptedModel(
        AssistantMessage([ToolCall("c1", "cities", {"prompt": "biggest?"})], stop_reason="toolUse"),
        "done",
    )
    parent = sm.Agent(parent_model, tools=[child.as_tool()])
    parent.run_sync("ask")
    answer = parent_model.requests[1].messages[-1]
    assert json.loads(_text(answer)) == json.loads(PARIS)


@pytest.mark.timeout(30)
def test_a_native_run_resumed_after_an_approval_stays_native() -> None:
    @sm.tool
    def lookup() -> str:
        """Look up."""
        return "Paris"

    model = ScriptedModel(
        AssistantMessage([ToolCall("c1", "lookup", {})], stop_reason="toolUse"),
        PARIS,
        native_output=True,
    )

    asked: list[str] = []

    async def ask(call: Any, context: Any = None) -> Any:
        asked.append(call.id)  # asked again on resume: the person approved by then
        return sm.RequireApproval("check") if len(asked) == 1 else None

    waiting = asyncio.run(
        sm.run_agent(
            model=model,
            messages="go",
            tools=[lookup],
            output_type=City,
            before_tool_call=ask,
        )
    )
    assert waiting.state is S.AWAITING_USER
    resumed = asyncio.run(
        sm.resume_agent(
            waiting,
            model=model,
            tools=[lookup],
            approvals={"c1": True},
            output_type=City,
            before_tool_call=ask,
        )
    )
    assert resumed.state is S.DONE
    assert resumed.output == City("Paris", 2_100_000)
    assert model.requests[-1].output_schema is not None
    # The same snapshot with a client that has no native mode is refused, not half-run.
    with pytest.raises(UsageError, match="no JSON-schema output mode"):
        asyncio.run(
            sm.resume_agent(
                waiting,
                model=ScriptedModel(PARIS),
                tools=[lookup],
                approvals={"c1": True},
                before_tool_call=ask,
            )
        )
