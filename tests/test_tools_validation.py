"""The fast "certainly valid" path of argument validation agrees with jsonschema.

It may only ever say "valid" where jsonschema finds no error; everything else falls
through to jsonschema, so decisions and messages are exactly jsonschema's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jsonschema
from hypothesis import given
from hypothesis import strategies as st

import statemachine as sm
import statemachine.engine
from statemachine.core.tools import _fast_check
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


def agrees_with_jsonschema(
    check: Callable[[Mapping[str, Any]], bool], schema: dict[str, Any], arguments: dict[str, Any]
) -> bool:
    """The fast path's contract: "valid" only where jsonschema finds no error."""
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
    return not check(arguments) or errors == []


@given(flat_schemas(), st.dictionaries(st.sampled_from("abcde"), values, max_size=5))
def test_fast_path_says_valid_only_where_jsonschema_agrees(
    schema: dict[str, Any], arguments: dict[str, Any]
) -> None:
    check = _fast_check(schema)
    assert check is not None  # every flat schema gets a fast path
    assert agrees_with_jsonschema(check, schema, arguments)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
    definition = sm.ToolDefinition("t", "", schema)
    assert len(sm.engine.validate_arguments(definition, arguments)) == len(errors)


def test_schemas_beyond_flat_primitives_take_the_jsonschema_path() -> None:
    nullable = {"type": "object", "properties": {"a": {"type": ["string", "null"]}}}
    assert _fast_check(nullable) is None
    bounded = {"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}}
    assert _fast_check(bounded) is None
    assert _fast_check({"type": "object", "additionalProperties": {"type": "string"}}) is None
    assert _fast_check({"type": "object", "$defs": {}}) is None


def test_the_contract_catches_a_fast_path_that_only_checks_required_keys() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

    def lying(arguments: Mapping[str, Any]) -> bool:
        return "a" in arguments

    assert not agrees_with_jsonschema(lying, schema, {"a": "x"})
    real = _fast_check(schema)
    assert real is not None
    assert agrees_with_jsonschema(real, schema, {"a": "x"})


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
