"""Typed tools: parameter types to JSON Schema and back, return values to result text."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import json
from typing import Annotated, Any, Literal, NotRequired, TypedDict

import attrs
import pydantic
import pytest

import statemachine as sm
import statemachine.engine
import statemachine.messages
from statemachine.agent.signature import compile_annotation
from statemachine.testing import ScriptedModel


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: float
    y: float = 0.0


@dataclasses.dataclass
class Shape:
    name: str
    corners: list[Point]
    color: Color | None = None


@attrs.define
class Box:
    width: int
    label: Annotated[str, "what is written on it"] = ""


class Filter(TypedDict):
    field: str
    value: NotRequired[int]


class Person(pydantic.BaseModel):
    name: str
    age: int


@dataclasses.dataclass
class Node:
    value: int
    children: list[Node]


def _schema(tool: sm.Tool) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(json.dumps(tool.definition.schema_dict()))
    return schema


async def _call(tool: sm.Tool, arguments: dict[str, Any]) -> Any:
    problems = sm.engine.validate_arguments(tool.definition, arguments)
    assert not problems, problems
    return await tool.execute(arguments, sm.AbortController().signal)


def test_structured_parameters_become_schemas_and_arrive_as_python_values() -> None:
    seen: dict[str, Any] = {}

    @sm.tool
    def draw(shape: Shape, box: Box, where: Filter, color: Color, tags: set[str]) -> str:
        """Draw a shape.

        Args:
            shape: what to draw
        """
        seen.update(shape=shape, box=box, where=where, color=color, tags=tags)
        return "ok"

    properties = _schema(draw)["properties"]
    assert properties["shape"] == {
        "type": "object",
        "title": "Shape",
        "properties": {
            "name": {"type": "string"},
            "corners": {
                "type": "array",
                "items": {
                    "type": "object",
                    "title": "Point",
                    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                    "additionalProperties": False,
                    "required": ["x"],
                },
            },
            "color": {"anyOf": [{"enum": ["red", "blue"]}, {"type": "null"}]},
        },
        "additionalProperties": False,
        "required": ["name", "corners"],
        "description": "what to draw",
    }
    assert properties["box"]["properties"]["label"] == {
        "type": "string",
        "description": "what is written on it",
    }
    assert properties["box"]["required"] == ["width"]
    assert properties["where"]["required"] == ["field"]
    assert properties["tags"] == {"type": "array", "uniqueItems": True, "items": {"type": "string"}}
    arguments = {
        "shape": {"name": "tri", "corners": [{"x": 1}, {"x": 2, "y": 3}], "color": "red"},
        "box": {"width": 2},
        "where": {"field": "f"},
        "color": "blue",
        "tags": ["a", "b"],
    }
    assert asyncio.run(_call(draw, arguments)) == "ok"
    assert seen["shape"] == Shape("tri", [Point(1.0), Point(2.0, 3.0)], Color.RED)
    assert isinstance(seen["shape"].corners[0].x, float)
    assert seen["box"] == Box(2)
    assert seen["where"] == {"field": "f"}
    assert seen["color"] is Color.BLUE
    assert seen["tags"] == {"a", "b"}


def test_optional_literal_and_pydantic_parameters() -> None:
    seen: list[Any] = []

    @sm.tool
    async def act(
        person: Person,
        mode: Literal["fast", "slow"] = "fast",
        point: Point | None = None,
        size: Annotated[int, "in pixels"] = 1,
    ) -> str:
        """Act."""
        seen.extend([person, mode, point, size])
        return "ok"

    properties = _schema(act)["properties"]
    assert properties["person"]["properties"]["age"] == {"title": "Age", "type": "integer"}
    assert properties["mode"] == {"enum": ["fast", "slow"], "default": "fast"}
    assert properties["size"] == {"type": "integer", "description": "in pixels", "default": 1}
    asyncio.run(_call(act, {"person": {"name": "A", "age": 3}, "point": {"x": 1.5}}))
    assert seen == [Person(name="A", age=3), "fast", Point(1.5), 1]
    seen.clear()
    asyncio.run(_call(act, {"person": {"name": "B", "age": 4}, "point": None}))
    assert seen[2] is None


@pytest.mark.parametrize(
    ("annotation", "needle"),
    [
        (Node, "Node contains itself (a recursive type)"),
        (Point | Shape, "a union of Point, Shape is ambiguous"),
        (bytes, "cannot express bytes"),
        (dict[int, str], "JSON object keys are strings"),
    ],
)
def test_types_that_cannot_be_arguments_are_refused_naming_the_parameter(
    annotation: Any, needle: str
) -> None:
    def fn(value: Any) -> str:
        return ""

    fn.__annotations__ = {"value": annotation, "return": str}
    with pytest.raises(sm.InvalidInputError) as caught:
        sm.tool(fn)
    assert "@tool fn, parameter 'value'" in str(caught.value)
    assert needle in str(caught.value)


def test_return_annotations_are_checked_when_the_tool_is_defined() -> None:
    def fn() -> bytes:
        return b""

    with pytest.raises(sm.InvalidInputError, match=r"@tool fn: cannot express bytes.*return"):
        sm.tool(fn)
    for ok in (str, sm.ToolOutput, list[sm.TextContent], dict[str, int], Point, None, Any):

        def good() -> Any:
            return ""

        good.__annotations__ = {"return": ok}
        sm.tool(good)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"a": 1, "b": [True, None]}, '{"a": 1, "b": [true, null]}'),
        ([1, 2.5, "x"], '[1, 2.5, "x"]'),
        (3, "3"),
        (False, "false"),
        (None, "null"),
        ([], "[]"),
        (Point(1.0, 2.0), '{"x": 1.0, "y": 2.0}'),
        (Box(3, "lid"), '{"width": 3, "label": "lid"}'),
        (Person(name="Ann", age=40), '{"name": "Ann", "age": 40}'),
        (Color.RED, '"red"'),
        ({"b", "a"}, '["a", "b"]'),
        ("plain text", "plain text"),
        ("ünïcode", "ünïcode"),
    ],
)
def test_return_values_become_result_text_in_one_documented_way(value: Any, text: str) -> None:
    @sm.tool
    def give() -> Any:
        """Give."""
        return value

    output = asyncio.run(_call(give, {}))
    assert output == text


def test_content_blocks_and_tool_outputs_are_results_as_they_are() -> None:
    blocks: list[sm.TextContent | sm.ImageContent] = [
        sm.TextContent("a"),
        sm.ImageContent("AAAA", "image/png"),
    ]

    @sm.tool
    def show() -> list[sm.TextContent | sm.ImageContent]:
        """Show."""
        return blocks

    @sm.tool
    def fail() -> sm.ToolOutput:
        """Fail."""
        return sm.ToolOutput("no", is_error=True)

    assert asyncio.run(_call(show, {})) == blocks
    assert asyncio.run(_call(fail, {})) == sm.ToolOutput("no", is_error=True)


@pytest.mark.parametrize(
    ("value", "why"),
    [(object(), "a object is not JSON data"), (float("nan"), "nan is not a JSON number")],
)
def test_a_value_that_is_not_json_data_is_an_error_result(value: Any, why: str) -> None:
    @sm.tool
    def give() -> Any:
        """Give."""
        return value

    model = ScriptedModel(sm.ToolCall("c1", "give", {}), "done")
    result = sm.run_agent_sync(model=model, tools=[give], messages=[sm.UserMessage("go")])
    (answer,) = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.is_error
    assert f"tool give returned a {type(value).__name__} that is not JSON data: {why}" in (
        answer.text
    )


def test_float_parameters_receive_floats_and_unions_keep_other_values() -> None:
    schema, convert = compile_annotation(float, "x")
    assert schema == {"type": "number"}
    assert convert is not None
    assert isinstance(convert(3), float)
    schema, convert = compile_annotation(int | float, "x")
    assert convert is None  # an int stays an int when the union allows one
    _, convert = compile_annotation(Color | str, "x")
    assert convert is not None
    assert convert("red") is Color.RED
    assert convert("green") == "green"
    _, convert = compile_annotation(Point | int, "x")
    assert convert is not None
    assert convert({"x": 1}) == Point(1.0)
    assert convert(7) == 7


# -- a functools.partial of a typed function ---------------------------------------------------


def lookup(table: str, key: str, limit: int = 3) -> str:
    """Look a key up in a table.

    Args:
        table: the table, chosen by the application.
        key: what to look up.
        limit: how many rows at most.
    """
    return f"{table}:{key}:{limit}"


async def alookup(root: str, path: str, signal: sm.AbortSignal) -> str:
    """Read a path under a root."""
    return f"{root}/{path} aborted={signal.aborted}"


def test_a_partial_is_a_tool_named_and_described_by_its_function() -> None:
    made = sm.tool(functools.partial(lookup, table="users"))
    assert made.name == "lookup"
    assert made.definition.description == "Look a key up in a table."
    schema = _schema(made)
    # The bound argument is the application's: not shown to the model, nor its value.
    assert schema["properties"] == {
        "key": {"type": "string", "description": "what to look up."},
        "limit": {"type": "integer", "description": "how many rows at most.", "default": 3},
    }
    assert schema["required"] == ["key"]
    assert "users" not in json.dumps(schema)
    assert asyncio.run(_call(made, {"key": "ada"})) == "users:ada:3"


def test_a_partial_binding_positional_arguments_of_an_async_function_is_a_tool() -> None:
    made = sm.tool(name="read", description="Read a file.")(functools.partial(alookup, "/srv"))
    assert made.name == "read"
    assert _schema(made)["properties"] == {"path": {"type": "string"}}
    assert asyncio.run(_call(made, {"path": "a.txt"})) == "/srv/a.txt aborted=False"


def test_the_model_cannot_override_an_argument_the_partial_binds() -> None:
    made = sm.tool(functools.partial(lookup, table="users"))
    problems = sm.engine.validate_arguments(made.definition, {"key": "k", "table": "admins"})
    assert problems


def test_a_partial_of_a_context_taking_function_receives_the_run_context() -> None:
    def greet(ctx: sm.RunContext[str], greeting: str, name: str) -> str:
        return f"{greeting}, {name} (deps={ctx.deps})"

    made = sm.tool(functools.partial(greet, greeting="Hello"))
    assert made.deps_type is str
    assert _schema(made)["properties"] == {"name": {"type": "string"}}
    model = ScriptedModel(
        sm.AssistantMessage(
            (sm.ToolCall("c1", "greet", {"name": "Ada"}),),
            stop_reason=sm.messages.StopReason.TOOL_USE,
        ),
        sm.AssistantMessage("done"),
    )
    result = sm.run_agent_sync(model=model, messages="hi", tools=[made], deps="shop")
    answers = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert [a.text for a in answers] == ["Hello, Ada (deps=shop)"]


def test_a_callable_without_a_name_is_refused_asking_for_one() -> None:
    class Lookup:
        def __call__(self, key: str) -> str:
            return key

    with pytest.raises(
        sm.InvalidInputError, match=r"a Lookup has no __name__ to name the tool by: pass name="
    ):
        sm.tool(Lookup())
