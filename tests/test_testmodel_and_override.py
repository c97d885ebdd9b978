"""``TestModel`` (calls every tool, then fills a valid output from the schemas) and
``Agent.override`` (a test swaps an agent's model and deps)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Literal

import pydantic
import pytest

import statemachine as sm
from statemachine.testing import ScriptedModel, TestModel
from statemachine.testing.models import schema_value

pytestmark = pytest.mark.timeout(30)


@dataclasses.dataclass
class Weather:
    city: str
    degrees: float
    sky: Literal["clear", "cloudy"]


class Forecast(pydantic.BaseModel):
    days: list[Weather]
    note: str | None = None


@sm.tool
def weather(ctx: sm.RunContext[str], city: str, days: int = 1) -> str:
    """The weather in a city."""
    return f"{ctx.deps}: sunny in {city} for {days} day(s)"


@sm.tool
def count(items: list[int], unit: Literal["m", "km"]) -> int:
    """Count items."""
    return len(items)


def test_the_test_model_calls_every_tool_once_then_answers_with_their_results() -> None:
    model = TestModel()
    result = sm.Agent(model, tools=[weather, count]).run_sync("go", deps="station")
    assert result.ok
    calls = [c for m in result.messages if isinstance(m, sm.AssistantMessage) for c in m.tool_calls]
    assert [(c.name, c.arguments_dict()) for c in calls] == [
        ("weather", {"city": "a", "days": 0}),
        ("count", {"items": [0], "unit": "m"}),
    ]
    assert json.loads(result.final_text) == {
        "weather": "station: sunny in a for 0 day(s)",
        "count": "1",
    }
    assert model.calls == 2


def test_the_test_model_fills_a_valid_output_of_every_kind() -> None:
    cases: list[tuple[Any, Any]] = [
        (Weather, Weather("a", 0.0, "clear")),
        (Forecast, Forecast(days=[Weather("a", 0.0, "clear")], note="a")),
        (int, 0),
        (list[str], ["a"]),
        (Literal["no", "yes"], "no"),
    ]
    for output_type, expected in cases:
        result = sm.Agent(TestModel(), output_type=output_type).run_sync("go")
        assert result.ok, result.explanation
        assert result.output == expected


def test_the_test_model_takes_custom_output_and_a_choice_of_tools() -> None:
    model = TestModel(
        call_tools=["count"], custom_output_args={"city": "Oslo", "degrees": -3, "sky": "cloudy"}
    )
    result = sm.Agent(model, tools=[weather, count], output_type=Weather).run_sync("go", deps="x")
    assert result.output == Weather("Oslo", -3.0, "cloudy")
    assert [c.name for c in result.messages[1].tool_calls] == ["count"]  # type: ignore[union-attr]
    text = sm.Agent(TestModel(custom_output_text="fine")).run_sync("go")
    assert text.output == "fine"
    assert sm.Agent(TestModel()).run_sync("go").output == "success (no tool calls)"


def test_the_test_model_gives_a_native_output_as_json_text() -> None:
    model = TestModel(native_output=True)
    result = sm.Agent(model, output_type=Weather).run_sync("go")
    assert result.output == Weather("a", 0.0, "clear")
    assert model.requests[0].output_schema is not None


def test_schema_values_respect_bounds_refs_and_recursion() -> None:
    assert schema_value({"type": "integer", "minimum": 5}) == 5
    assert schema_value({"type": "number", "exclusiveMinimum": 1}) == 2.0
    assert schema_value({"type": "string", "minLength": 3}) == "aaa"
    assert schema_value({"type": "array", "items": {"type": "boolean"}, "minItems": 2}) == [
        False,
        False,
    ]
    assert schema_value({"anyOf": [{"type": "null"}, {"const": 7}]}) == 7
    looping = {
        "$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}},
        "$ref": "#/$defs/N",
    }
    value = schema_value(looping)
    depth = 0
    while isinstance(value, dict):
        value, depth = value["next"], depth + 1
    assert value is None
    assert depth < 40


def test_call_tools_must_be_all_or_names() -> None:
    with pytest.raises(sm.UsageError, match="call_tools"):
        TestModel(call_tools="some")


# -- override -----------------------------------------------------------------------------


support = sm.Agent(ScriptedModel(), tools=[weather], deps_type=str)  # fails if called


def application(question: str) -> str:
    """Code under test: it runs an agent it does not build."""
    return support.run_sync(question, deps="production").final_text


def test_override_swaps_the_model_and_deps_inside_the_block_only() -> None:
    model = TestModel(custom_output_text="checked")
    with support.override(model=model, deps="test"):
        assert application("weather?") == "checked"
    result_messages = model.requests[1].messages
    [answer] = [m for m in result_messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.text == "test: sunny in a for 0 day(s)"
    assert support.model is not model  # the agent itself is unchanged


def test_overrides_nest_and_each_context_sees_its_own() -> None:
    agent = sm.Agent(ScriptedModel("own"))
    outer, inner = ScriptedModel("outer", "outer"), ScriptedModel("inner")
    with agent.override(model=outer):
        with agent.override(model=inner):
            assert agent.run_sync("q").output == "inner"
        assert agent.run_sync("q").output == "outer"

        async def elsewhere() -> Any:
            # a task started here inherits the override; one that resets it does not leak
            return (await agent.run("q")).output

        assert asyncio.run(elsewhere()) == "outer"
    assert agent.run_sync("q").output == "own"


def test_override_reaches_a_sub_agent_run_as_a_tool() -> None:
    child = sm.Agent(ScriptedModel("never called"), name="helper")
    parent = sm.Agent(
        ScriptedModel(sm.ToolCall("p1", "helper", {"prompt": "help"}), "done"),
        tools=[child.as_tool()],
    )
    with child.override(model=TestModel(custom_output_text="from the test")):
        result = parent.run_sync("go")
    [answer] = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.text == "from the test"


def test_test_model_gives_a_union_output_through_the_first_member_tool() -> None:
    @dataclasses.dataclass
    class Found:
        name: str

    @dataclasses.dataclass
    class Missing:
        reason: str

    model = TestModel()
    result = sm.Agent(model, output_type=Found | Missing).run_sync("q")
    assert result.output == Found(name="a")
    assert [t.name for t in model.requests[0].tools] == [
        "final_result_Found",
        "final_result_Missing",
    ]
