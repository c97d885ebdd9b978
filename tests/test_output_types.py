"""Every output type a run may ask for: text, scalars, lists, dicts, unions, Literal,
several types at once, pydantic models and dataclasses, each validated by the type
itself (its validators too), each refusal one failed attempt within output_retries."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

import attrs
import pydantic
import pytest

import statemachine as sm
from statemachine.agent.output import WRAPPER_KEY, compile_output
from statemachine.core.engine import Engine
from statemachine.core.output import OutputSpec
from statemachine.testing import ScriptedModel

pytestmark = pytest.mark.timeout(30)


def final(call_id: str = "f1", **arguments: Any) -> sm.AssistantMessage:
    return sm.AssistantMessage([sm.ToolCall(call_id, "final_result", arguments)], "toolUse")


def answered(value: Any, call_id: str = "f1") -> sm.AssistantMessage:
    """A final result carrying ``value`` in the wrapper of a non-object output."""
    return final(call_id, **{WRAPPER_KEY: value})


@dataclasses.dataclass
class Point:
    x: int
    y: int

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("x must not be negative")


class Person(pydantic.BaseModel):
    name: str
    age: int

    @pydantic.field_validator("name")
    @classmethod
    def capitalised(cls, value: str) -> str:
        if not value[:1].isupper():
            raise ValueError("the name must start with a capital letter")
        return value


class Failure(pydantic.BaseModel):
    reason: str


def test_a_text_agents_output_is_its_final_text() -> None:
    for output_type in (None, str):
        result = sm.Agent(ScriptedModel("plain words"), output_type=output_type).run_sync("q")
        assert result.output == "plain words"
    failed = sm.Agent(ScriptedModel(ValueError("down"))).run_sync("q")
    assert failed.output is None  # only a Done run has an output


@pytest.mark.parametrize(
    ("output_type", "value", "expected", "schema"),
    [
        (int, 42, 42, {"type": "integer"}),
        (float, 2, 2.0, {"type": "number"}),
        (bool, True, True, {"type": "boolean"}),
        (list[int], [1, 2], [1, 2], {"type": "array", "items": {"type": "integer"}}),
        (
            dict[str, int],
            {"a": 1},
            {"a": 1},
            {"type": "object", "additionalProperties": {"type": "integer"}},
        ),
        (Literal["yes", "no"], "no", "no", {"enum": ["yes", "no"]}),
    ],
)
def test_an_output_that_is_not_an_object_is_wrapped_in_a_response_object(
    output_type: Any, value: Any, expected: Any, schema: dict[str, Any]
) -> None:
    model = ScriptedModel(answered(value))
    result = sm.Agent(model, output_type=output_type).run_sync("q")
    assert result.ok, result.explanation
    assert result.output == expected
    assert type(result.output) is type(expected)
    [tool] = model.requests[0].tools
    assert tool.schema_dict() == {
        "type": "object",
        "properties": {WRAPPER_KEY: schema},
        "required": [WRAPPER_KEY],
        "additionalProperties": False,
    }


def test_a_wrong_scalar_is_a_failed_attempt_naming_the_problem() -> None:
    model = ScriptedModel(answered("three"), answered(3, "f2"))
    result = sm.Agent(model, output_type=int).run_sync("q")
    assert result.output == 3
    first = next(m for m in result.messages if isinstance(m, sm.ToolResultMessage))
    assert first.is_error
    assert "'three' is not of type 'integer'" in first.text


def test_a_union_with_str_takes_the_final_text_or_the_tool() -> None:
    agent: sm.Agent[Any, Person | str] = sm.Agent(
        ScriptedModel("just text"), output_type=Person | str
    )
    as_text = agent.run_sync("q")
    assert as_text.output == "just text"
    as_model = sm.Agent(
        ScriptedModel(final(name="Ada", age=36)), output_type=Person | str
    ).run_sync("q")
    # one member besides the text: the model's own object, not wrapped
    assert as_model.output == Person(name="Ada", age=36)


def _called(tool: str, arguments: dict[str, Any], call_id: str = "f1") -> sm.AssistantMessage:
    return sm.AssistantMessage([sm.ToolCall(call_id, tool, arguments)], "toolUse")


def test_several_output_types_at_once_give_the_member_the_value_is() -> None:
    output_types: list[Any] = [Person, Failure]
    model = ScriptedModel(_called("final_result_Failure", {"reason": "unknown"}))
    result = sm.Agent(model, output_type=output_types).run_sync("q")
    assert result.output == Failure(reason="unknown")
    offered = {t.name: t.schema_dict() for t in model.requests[0].tools}
    assert list(offered) == ["final_result_Person", "final_result_Failure"]
    assert offered["final_result_Failure"]["title"] == "Failure"  # its own schema, unwrapped
    either: sm.Agent[Any, int | Point] = sm.Agent(
        ScriptedModel(_called("final_result_int", {WRAPPER_KEY: 7})), output_type=int | Point
    )
    union = either.run_sync("q")
    assert union.output == 7
    point: sm.Agent[Any, int | Point] = sm.Agent(
        ScriptedModel(_called("final_result_Point", {"x": 1, "y": 2})), output_type=int | Point
    )
    assert point.run_sync("q").output == Point(1, 2)


def test_a_union_member_tool_validates_its_own_member_only() -> None:
    # {"x": 1, "y": 2} is a Point, but given to the int's tool it is refused by that
    # tool's schema; the retry then gives it to the Point's tool.
    model = ScriptedModel(
        _called("final_result_int", {WRAPPER_KEY: {"x": 1, "y": 2}}),
        _called("final_result_Point", {"x": 1, "y": 2}, "f2"),
    )
    result = sm.Agent(model, output_type=[int, Point]).run_sync("q")
    assert result.output == Point(1, 2)
    refusal = next(m for m in result.messages if isinstance(m, sm.ToolResultMessage))
    assert refusal.is_error
    assert refusal.tool_name == "final_result_int"
    # Point's own validation (its __post_init__) judges a value given to its tool
    refused: sm.RunResult[Any] = sm.Agent(
        ScriptedModel(
            _called("final_result_Point", {"x": -1, "y": 0}),
            _called("final_result_int", {WRAPPER_KEY: 3}, "f2"),
        ),
        output_type=Point | int,
    ).run_sync("q")
    assert refused.output == 3
    first = next(m for m in refused.messages if isinstance(m, sm.ToolResultMessage))
    assert first.is_error
    assert "ValueError" in first.text


def test_a_single_type_keeps_its_one_tool_and_a_union_with_text_offers_its_members() -> None:
    model = ScriptedModel(final(x=1, y=2))
    sm.Agent(model, output_type=Point).run_sync("q")
    assert [t.name for t in model.requests[0].tools] == ["final_result"]
    scalar = ScriptedModel(answered(3))
    sm.Agent(scalar, output_type=int).run_sync("q")
    assert [t.name for t in scalar.requests[0].tools] == ["final_result"]
    texts = ScriptedModel("plain")
    result = sm.Agent(texts, output_type=str | Point | int).run_sync("q")
    assert result.output == "plain"
    assert [t.name for t in texts.requests[0].tools] == ["final_result_Point", "final_result_int"]


def test_a_pydantic_validator_that_refuses_is_a_retry_not_a_crash() -> None:
    model = ScriptedModel(final(name="ada", age=36), final("f2", name="Ada", age=36))
    result = sm.Agent(model, output_type=Person).run_sync("q")
    assert result.ok
    assert result.output == Person(name="Ada", age=36)
    refusal = next(m for m in result.messages if isinstance(m, sm.ToolResultMessage))
    assert refusal.is_error
    assert "the name must start with a capital letter" in refusal.text


def test_a_dataclass_post_init_that_refuses_spends_the_retries_then_ends_output_invalid() -> None:
    model = ScriptedModel(final(x=-1, y=0), final("f2", x=-2, y=0))
    result = sm.Agent(model, output_type=Point, output_retries=1).run_sync("q")
    assert result.state is sm.TurnState.OUTPUT_INVALID
    assert "x must not be negative" in result.explanation
    assert result.output is None
    assert model.calls == 2


def test_a_wrapped_output_that_refuses_is_retried_too() -> None:
    model = ScriptedModel(answered([{"x": -1, "y": 0}]), answered([{"x": 1, "y": 0}], "f2"))
    result = sm.Agent(model, output_type=list[Point]).run_sync("q")
    assert result.output == [Point(1, 0)]
    assert model.calls == 2


def test_a_native_output_that_is_not_an_object_is_wrapped_as_well() -> None:
    model = ScriptedModel('{"response": [1, 2, 3]}', native_output=True)
    result = sm.Agent(model, output_type=list[int]).run_sync("q")
    assert result.output == [1, 2, 3]
    assert model.requests[0].output_schema is not None
    assert model.requests[0].output_schema["required"] == [WRAPPER_KEY]


def test_a_native_output_its_validator_refuses_is_a_failed_attempt() -> None:
    model = ScriptedModel(
        '{"name": "ada", "age": 3}', '{"name": "Ada", "age": 3}', native_output=True
    )
    result = sm.Agent(model, output_type=Person).run_sync("q")
    assert result.output == Person(name="Ada", age=3)
    reminder = model.requests[1].messages[-1]
    assert "capital letter" in reminder.text


def test_nested_models_in_a_wrapped_output_keep_their_definitions() -> None:
    class Team(pydantic.BaseModel):
        lead: Person
        members: list[Person]

    value = {"lead": {"name": "Ada", "age": 36}, "members": []}
    model = ScriptedModel(answered([value]))
    result = sm.Agent(model, output_type=list[Team]).run_sync("q")
    assert result.ok, result.explanation
    assert result.output == [Team(lead=Person(name="Ada", age=36), members=[])]
    schema = model.requests[0].tools[0].schema_dict()
    assert "Person" in schema["$defs"]


def test_resuming_with_another_output_type_is_refused_before_anything_runs() -> None:
    ran: list[str] = []

    @sm.tool
    def lookup() -> str:
        """Look up."""
        ran.append("lookup")
        return "found"

    model = ScriptedModel(
        sm.AssistantMessage(
            [sm.ToolCall("c1", "lookup", {}), sm.ToolCall("f1", "final_result", {"x": 1, "y": 2})],
            "toolUse",
        )
    )
    first = sm.Agent(
        model,
        tools=[lookup],
        output_type=Point,
        end_strategy="exhaustive",  # the other call waits for its approval
        before_tool_call=lambda call: sm.RequireApproval("check"),
    ).run_sync("q")
    assert first.state is sm.TurnState.AWAITING_USER
    changed = sm.Agent(
        model, tools=[lookup], output_type=Person, before_tool_call=lambda call: None
    )
    with pytest.raises(sm.errors.OutputTypeChangedError, match="output_type"):
        changed.resume_sync(first, approvals={"c1": True})
    assert ran == []
    same = sm.Agent(model, tools=[lookup], output_type=Point, before_tool_call=lambda call: None)
    resumed = same.resume_sync(first, approvals={"c1": True})
    assert resumed.output == Point(1, 2)
    assert ran == ["lookup"]


def test_a_run_suspended_with_a_union_as_one_tool_resumes_with_that_tool() -> None:
    # A snapshot written when a union was offered as one final_result tool (its
    # members in {"response": ...}): resumed with the same union, the model's call of
    # that tool is judged and converted as it was shown, and the run keeps the tool.
    @sm.tool
    def lookup() -> str:
        """Look up."""
        return "found"

    union = compile_output(int | Point)
    assert union is not None
    assert union.legacy is not None
    legacy = union.legacy.to_dict()
    assert "tools" not in legacy  # one schema, as such snapshots hold it
    asks = sm.AssistantMessage([sm.ToolCall("c1", "lookup", {})], "toolUse")
    model = ScriptedModel(asks, answered({"x": 1, "y": 2}, "f2"))
    first = sm.run_agent_sync(
        model=model,
        messages="q",
        tools=[lookup],
        output_type=int | Point,
        before_tool_call=lambda call: sm.RequireApproval("check"),
        engine_factory=lambda **kw: Engine(**{**kw, "output": union.legacy}),
    )
    assert first.state is sm.TurnState.AWAITING_USER
    assert first.snapshot is not None
    assert first.snapshot["output"]["schema"] == legacy["schema"]
    snapshot = json.loads(json.dumps(first.snapshot))
    agent: sm.Agent[Any, Any] = sm.Agent(
        model, tools=[lookup], output_type=int | Point, before_tool_call=lambda call: None
    )
    resumed = agent.resume_sync(snapshot, approvals={"c1": True})
    assert resumed.ok, resumed.explanation
    assert resumed.output == Point(1, 2)
    assert [t.name for t in model.requests[-1].tools] == ["lookup", "final_result"]


def test_a_union_offered_a_tool_per_member_survives_a_snapshot() -> None:
    union = compile_output([Person, Failure])
    assert union is not None
    data = json.loads(json.dumps(union.spec.to_dict()))
    assert [t["name"] for t in data["tools"]] == ["final_result_Person", "final_result_Failure"]
    assert "schema" not in data
    back = OutputSpec.from_dict(data, "output")
    assert [d.name for d in back.tools] == ["final_result_Person", "final_result_Failure"]
    assert back == attrs.evolve(union.spec, check=None)
    with pytest.raises(sm.InvalidInputError, match=r"output\.tools"):
        OutputSpec.from_dict({**data, "tools": [{"name": "mine", "schema": {}}] * 2}, "output")


def test_an_output_recorded_without_its_tool_converts_to_its_member() -> None:
    # A durable run records the validated JSON alone: it is read back as the member
    # whose tool's schema it matches, or as the union's one tool's value it was before.
    union = compile_output(int | Point)
    assert union is not None
    assert union.from_json({"x": 1, "y": 2}) == Point(1, 2)
    assert union.from_json({WRAPPER_KEY: 3}) == 3
    assert union.from_json({WRAPPER_KEY: {"x": 1, "y": 2}}) == Point(1, 2)
