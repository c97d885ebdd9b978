"""Argument validation: jsonschema decides, and its errors read the same every time."""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import given
from hypothesis import strategies as st

import statemachine as sm
import statemachine.engine
from statemachine.testing import ScriptedModel

TYPES = ["string", "integer", "number", "boolean"]
values = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=3)
    | st.lists(st.integers(), max_size=2)
)


@st.composite
def flat_schemas(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from("abcd"), unique=True, max_size=4))
    properties = {n: {"type": draw(st.sampled_from(TYPES))} for n in names}
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    wants_required: bool = draw(st.booleans())
    if names and wants_required:
        schema["required"] = draw(st.lists(st.sampled_from(names), unique=True))
    if draw(st.booleans()):
        schema["additionalProperties"] = draw(st.booleans())
    return schema


@given(flat_schemas(), st.dictionaries(st.sampled_from("abcde"), values, max_size=5))
def test_a_call_is_refused_exactly_where_jsonschema_finds_an_error(
    schema: dict[str, Any], arguments: dict[str, Any]
) -> None:
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
    definition = sm.ToolDefinition("t", "", schema)
    found = sm.engine.validate_arguments(definition, arguments)
    assert len(found) == len(errors)
    assert sorted(e.message for e in errors) == sorted(f.split(": ", 1)[1] for f in found)


def test_errors_sort_array_indices_by_number() -> None:
    definition = sm.ToolDefinition(
        "t",
        "",
        {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}},
    )
    values = [0, 1, 2, "x", 4, 5, 6, 7, 8, 9, 10, "y"]
    assert sm.engine.validate_arguments(definition, {"a": values}) == [
        "arguments.a[3]: 'x' is not of type 'integer'",
        "arguments.a[11]: 'y' is not of type 'integer'",
    ]


def test_an_optional_signal_parameter_is_injected_not_shown() -> None:
    @sm.tool
    async def job(n: int, signal: sm.AbortSignal | None = None) -> str:
        """A job."""
        return "signal" if signal is not None else "none"

    assert set(job.definition.parameters["properties"]) == {"n"}
    result = sm.run_agent_sync(
        model=ScriptedModel(
            sm.AssistantMessage((sm.ToolCall("c", "job", {"n": 1}),)), sm.AssistantMessage("done")
        ),
        tools=[job],
        messages=[sm.UserMessage("go")],
    )
    assert [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)] == ["signal"]
