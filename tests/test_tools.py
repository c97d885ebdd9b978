"""Tool definitions, argument validation, and the ``@tool`` decorator."""

from __future__ import annotations

import asyncio
import enum
import gc
import re
import threading
from typing import Any, Literal, Optional

import pytest

import statemachine as sm
import statemachine.engine


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def _schema(t: sm.Tool) -> dict[str, Any]:
    return t.definition.schema_dict()


def _execute(t: sm.Tool, arguments: dict[str, Any], signal: sm.AbortSignal | None = None) -> Any:
    async def go() -> Any:
        return await t.execute(arguments, signal or sm.AbortSignal())

    return asyncio.run(go())


# -- @tool: schema generation ------------------------------------------------------------


def test_scalar_annotations() -> None:
    @sm.tool
    def f(s: str, i: int, x: float, b: bool) -> str:
        return ""

    assert _schema(f) == {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "x": {"type": "number"},
            "b": {"type": "boolean"},
        },
        "required": ["s", "i", "x", "b"],
        "additionalProperties": False,
    }


def test_optional_literal_enum_and_containers() -> None:
    @sm.tool
    def f(
        maybe: Optional[int],  # noqa: UP045 - the typing spelling is what is under test
        either: int | None,
        mode: Literal["r", "w"],
        color: Color,
        names: list[str],
        counts: dict[str, int],
        pair: tuple[int, str],
        many: tuple[float, ...],
    ) -> str:
        return ""

    props = _schema(f)["properties"]
    assert props["maybe"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert props["either"] == props["maybe"]
    assert props["mode"] == {"enum": ["r", "w"]}
    assert props["color"] == {"enum": ["red", "blue"]}
    assert props["names"] == {"type": "array", "items": {"type": "string"}}
    assert props["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["pair"] == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert props["many"] == {"type": "array", "items": {"type": "number"}}


def test_defaults_make_a_parameter_optional_and_are_advertised() -> None:
    @sm.tool
    def f(path: str, limit: int = 10, note: str | None = None) -> str:
        return ""

    schema = _schema(f)
    assert schema["required"] == ["path"]
    assert schema["properties"]["limit"] == {"type": "integer", "default": 10}
    assert schema["properties"]["note"]["default"] is None


def test_a_default_that_is_not_json_is_not_advertised() -> None:
    marker = object()

    @sm.tool
    def f(x: Any = marker) -> str:
        return ""

    assert _schema(f)["properties"]["x"] == {}
    assert "required" not in _schema(f)


def test_no_parameters_gives_an_empty_object_schema() -> None:
    @sm.tool
    async def list_files() -> str:
        return ""

    assert _schema(list_files) == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


def test_docstring_gives_description_and_argument_descriptions() -> None:
    @sm.tool
    def read_file(path: str, limit: int = 100) -> str:
        """Read a file of the workspace.

        Returns its text.

        Args:
            path: the path, relative to the root,
                never absolute.
            limit (int): the most lines to return
        Returns:
            text: ignored, not a parameter
        """
        return ""

    assert read_file.definition.description == "Read a file of the workspace.\n\nReturns its text."
    props = _schema(read_file)["properties"]
    assert props["path"]["description"] == "the path, relative to the root, never absolute."
    assert props["limit"]["description"] == "the most lines to return"
    assert set(props) == {"path", "limit"}


def test_name_and_description_can_be_given() -> None:
    @sm.tool(name="grep-files", description="search")
    def f(pattern: str) -> str:
        """Ignored."""
        return pattern

    assert f.name == "grep-files"
    assert f.definition.name == "grep-files"
    assert f.definition.description == "search"


def test_signal_is_injected_and_hidden_from_the_model() -> None:
    seen: list[sm.AbortSignal] = []

    @sm.tool
    async def slow(n: int, signal: sm.AbortSignal) -> str:
        seen.append(signal)
        return str(n)

    @sm.tool
    def untyped(signal) -> str:  # type: ignore[no-untyped-def]
        seen.append(signal)
        return "u"

    assert "signal" not in _schema(slow)["properties"]
    assert _schema(slow)["required"] == ["n"]
    assert _schema(untyped)["properties"] == {}
    controller = sm.AbortController()
    assert _execute(slow, {"n": 3}, controller.signal) == "3"
    assert _execute(untyped, {}, controller.signal) == "u"
    assert seen == [controller.signal, controller.signal]


def test_a_parameter_named_signal_with_another_type_is_a_normal_argument() -> None:
    @sm.tool
    def f(signal: str) -> str:
        return signal

    assert _schema(f)["properties"] == {"signal": {"type": "string"}}
    assert _execute(f, {"signal": "hi"}) == "hi"


@pytest.mark.parametrize(
    ("annotation", "needle"),
    [
        ("complex", "cannot express complex as JSON Schema"),
        ("object", "cannot express object as JSON Schema"),
        ("dict[int, str]", "JSON object keys are strings"),
        ("list[complex]", "cannot express complex"),
        ("int | bytes", "cannot express bytes"),
    ],
)
def test_unsupported_annotations_are_refused_clearly(annotation: str, needle: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def bad(x: {annotation}) -> str:\n    return ''", namespace)
    with pytest.raises(sm.InvalidInputError) as caught:
        sm.tool(namespace["bad"])
    assert "@tool bad, parameter 'x'" in str(caught.value)
    assert needle in str(caught.value)


def test_var_args_and_positional_only_are_refused() -> None:
    def star(*args: int) -> str:
        return ""

    def stars(**kwargs: int) -> str:
        return ""

    def positional(x: int, /) -> str:
        return ""

    for fn in (star, stars):
        with pytest.raises(sm.InvalidInputError, match=r"\*args and \*\*kwargs"):
            sm.tool(fn)
    with pytest.raises(sm.InvalidInputError, match="positional-only parameter 'x'"):
        sm.tool(positional)


def test_unresolvable_hints_are_refused_clearly() -> None:
    namespace: dict[str, Any] = {}
    exec("def bad(x: 'NoSuchType') -> str:\n    return ''", namespace)
    with pytest.raises(sm.InvalidInputError, match="@tool bad: cannot read type hints"):
        sm.tool(namespace["bad"])


def test_a_function_name_that_is_not_a_valid_tool_name_is_refused() -> None:
    def f(x: int) -> str:
        return ""

    with pytest.raises(sm.InvalidInputError, match="tool name 'has space' is invalid"):
        sm.tool(name="has space")(f)


# -- @tool: execution ------------------------------------------------------------------------


def test_a_sync_tool_runs_in_a_worker_thread() -> None:
    threads: list[threading.Thread] = []

    @sm.tool
    def where(x: int) -> str:
        threads.append(threading.current_thread())
        return str(x * 2)

    assert _execute(where, {"x": 21}) == "42"
    assert threads
    assert threads[0] is not threading.main_thread()


def test_an_async_tool_runs_on_the_loop_thread() -> None:
    threads: list[threading.Thread] = []

    @sm.tool
    async def where() -> str:
        threads.append(threading.current_thread())
        return "ok"

    assert _execute(where, {}) == "ok"
    assert threads == [threading.main_thread()]


def test_execute_returns_what_the_function_returns_and_raises_what_it_raises() -> None:
    @sm.tool
    def out() -> sm.ToolOutput:
        return sm.ToolOutput("partial", is_error=True)

    @sm.tool
    async def boom() -> str:
        raise KeyError("missing")

    assert _execute(out, {}) == sm.ToolOutput("partial", is_error=True)
    with pytest.raises(KeyError):
        _execute(boom, {})


def test_tool_rejects_a_definition_that_is_not_one() -> None:
    async def run(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
        return ""

    with pytest.raises(TypeError):
        sm.Tool({"name": "x"}, run)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sm.Tool(sm.ToolDefinition("x", ""), "not callable")  # type: ignore[arg-type]


# -- ToolDefinition --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "has space", "a.b", "x" * 65, "ünï"])
def test_bad_tool_names_are_refused(name: str) -> None:
    with pytest.raises(sm.InvalidInputError, match="is invalid: use 1 to 64 letters"):
        sm.ToolDefinition(name, "d", {"type": "object"})


@pytest.mark.parametrize("name", ["a", "read_file", "list-files", "X9", "x" * 64])
def test_good_tool_names_are_accepted(name: str) -> None:
    assert sm.ToolDefinition(name, "d").name == name


def test_the_default_parameters_are_an_empty_object() -> None:
    definition = sm.ToolDefinition("t", "d")
    assert definition.schema_dict() == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("parameters", "needle"),
    [
        ({"type": "string"}, "whose type is 'object'"),
        ({"properties": {}}, "whose type is 'object'"),
        ([], "must be a JSON Schema object (a mapping), got list"),
        ("object", "got str"),
        (
            {"type": "object", "properties": {"a": {"type": "nope"}}},
            "not a valid JSON Schema at properties/a/type",
        ),
        ({"type": "object", "required": "a"}, "not a valid JSON Schema at required"),
    ],
)
def test_bad_schemas_are_refused(parameters: Any, needle: str) -> None:
    with pytest.raises(sm.InvalidInputError) as caught:
        sm.ToolDefinition("t", "d", parameters)
    assert needle in str(caught.value)


def test_the_schema_is_frozen_and_schema_dict_is_a_copy() -> None:
    source: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    definition = sm.ToolDefinition("t", "d", source)
    source["properties"]["a"]["type"] = "string"  # the caller's dict is not shared
    copy = definition.schema_dict()
    copy["properties"]["a"]["type"] = "boolean"
    assert definition.schema_dict()["properties"]["a"] == {"type": "integer"}
    with pytest.raises(TypeError):
        definition.parameters["type"] = "array"  # type: ignore[index]


# -- validate_arguments ------------------------------------------------------------------------

NESTED = sm.ToolDefinition(
    "t",
    "d",
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {"b": {"type": "array", "items": {"type": "integer"}}},
            },
            "z": {"type": "string"},
        },
        "required": ["q"],
    },
)


def test_valid_arguments_give_no_problem() -> None:
    assert sm.engine.validate_arguments(NESTED, {"q": 1, "a": {"b": [1, 2]}, "z": "s"}) == []


def test_every_failing_path_is_named_in_path_order() -> None:
    problems = sm.engine.validate_arguments(NESTED, {"a": {"b": [1, "x", 2.5]}, "z": 3})
    assert problems == [
        "arguments: 'q' is a required property",
        "arguments.a.b[1]: 'x' is not of type 'integer'",
        "arguments.a.b[2]: 2.5 is not of type 'integer'",
        "arguments.z: 3 is not of type 'string'",
    ]


def test_validation_does_not_depend_on_key_order() -> None:
    first = sm.engine.validate_arguments(NESTED, {"z": 3, "a": {"b": ["x"]}, "extra": None})
    second = sm.engine.validate_arguments(NESTED, {"extra": None, "a": {"b": ["x"]}, "z": 3})
    assert first == second
    assert len(first) == 3


def test_validate_arguments_with_a_generated_schema() -> None:
    @sm.tool
    def f(path: str, mode: Literal["r", "w"] = "r") -> str:
        return ""

    problems = sm.engine.validate_arguments(f.definition, {"mode": "x", "other": 1})
    assert problems == [
        "arguments: 'path' is a required property",
        "arguments: Additional properties are not allowed ('other' was unexpected)",
        "arguments.mode: 'x' is not one of ['r', 'w']",
    ]


# -- ToolOutput ------------------------------------------------------------------------------


def test_tool_output_accepts_text_or_blocks() -> None:
    assert sm.ToolOutput("hi").content == (sm.TextContent("hi"),)
    image = sm.ImageContent("AAAA", "image/png")
    assert sm.ToolOutput([sm.TextContent("a"), image]).content == (sm.TextContent("a"), image)


def test_tool_output_refuses_other_blocks() -> None:
    with pytest.raises(TypeError, match=r"content\[0\] is a ToolCall"):
        sm.ToolOutput([sm.ToolCall("c", "t", {})])


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), True, "5"])
def test_a_tool_timeout_must_be_a_positive_number(timeout: Any) -> None:
    async def execute(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
        return ""

    with pytest.raises(sm.InvalidInputError, match="timeout must be a positive number"):
        sm.Tool(sm.ToolDefinition("t", ""), execute, timeout=timeout)


def test_a_tool_timeout_may_be_fractional() -> None:
    async def execute(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
        return ""

    assert sm.Tool(sm.ToolDefinition("t", ""), execute, timeout=0.5).timeout == 0.5


def test_tool_output_is_error_must_be_a_bool() -> None:
    with pytest.raises(TypeError):
        sm.ToolOutput("x", is_error="yes")  # type: ignore[arg-type]


class _Text(str):
    pass


def test_tool_output_own_init_gives_what_the_fields_would() -> None:
    # ToolOutput writes its own __init__: a str is wrapped on one type test, anything
    # else meets the field's converter and validator (the same values and errors).
    text, image = sm.TextContent("t"), sm.ImageContent("AA==", "image/png")
    assert sm.ToolOutput("x").content == (sm.TextContent("x"),)
    assert sm.ToolOutput("x").is_error is False
    assert sm.ToolOutput(_Text("y"), True).content == (sm.TextContent("y"),)
    assert sm.ToolOutput([text, image]).content == (text, image)
    assert sm.ToolOutput((text,), is_error=True) == sm.ToolOutput([text], True)
    assert hash(sm.ToolOutput("x")) == hash(sm.ToolOutput([sm.TextContent("x")]))
    with pytest.raises(TypeError, match=r"content\[1\] is a int; expected TextContent"):
        sm.ToolOutput([text, 1])
    with pytest.raises(TypeError, match="'is_error' must be <class 'bool'>"):
        sm.ToolOutput("x", 1)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        sm.ToolOutput("x").is_error = True  # type: ignore[misc]


# -- references in a schema ------------------------------------------------------------

_INTEGER_DEF = {"$defs": {"n": {"type": "integer", "minimum": 0}}}


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        (
            {
                **_object(a={"$ref": "#/$defs/n"}, b={"items": {"$ref": "#/$defs/n"}}),
                **_INTEGER_DEF,
            },
            "a",
        ),
        ({**_object(a={"$ref": "#/definitions/n"}), "definitions": _INTEGER_DEF["$defs"]}, "a"),
        (
            {
                **_object(a={"$ref": "#count"}),
                "$defs": {"c": {"$anchor": "count", "type": "integer"}},
            },
            "a",
        ),
        ({**_object(a={"$ref": "#/$defs/a~1b"}), "$defs": {"a/b": {"type": "integer"}}}, "a"),
        (_object(a={"type": "integer"}, b={"$ref": "#/properties/a"}), "b"),
    ],
    ids=["defs", "definitions", "anchor", "escaped-pointer", "sibling-property"],
)
def test_local_references_keep_working(parameters: dict[str, Any], field: str) -> None:
    definition = sm.ToolDefinition("t", "d", parameters)
    assert sm.engine.validate_arguments(definition, {field: 3}) == []
    assert sm.engine.validate_arguments(definition, {field: "x"}) == [
        f"arguments.{field}: 'x' is not of type 'integer'"
    ]


@pytest.mark.parametrize(
    "ref",
    [
        "https://example.com/schemas/n.json",
        "http://127.0.0.1:1/n.json",
        "file:///etc/passwd",
        "n.json",
        "urn:example:n",
        "https://json-schema.org/draft/2020-12/schema",
    ],
)
def test_remote_and_relative_references_are_refused_at_definition(ref: str) -> None:
    with pytest.raises(sm.InvalidInputError) as caught:
        sm.ToolDefinition("fetcher", "d", _object(a={"$ref": ref}))
    message = str(caught.value)
    assert message.startswith(f"tool 'fetcher': parameters reference {ref!r} (at properties/a)")
    assert "is not local: it would be fetched at validation time" in message


def test_a_remote_reference_anywhere_is_refused() -> None:
    # In an unused definition, inside anyOf, as a $dynamicRef: all refused all the same.
    for parameters, where in [
        ({**_object(), "$defs": {"x": {"$ref": "https://e.com/x"}}}, "$defs/x"),
        (
            _object(a={"anyOf": [{"type": "null"}, {"$ref": "https://e.com/x"}]}),
            "properties/a/anyOf/1",
        ),
        (_object(a={"$dynamicRef": "https://e.com/x"}), "properties/a"),
    ]:
        with pytest.raises(sm.InvalidInputError, match=re.escape(f"at {where}) is not local")):
            sm.ToolDefinition("t", "d", parameters)


def test_a_tool_made_with_the_decorator_is_checked_the_same_way() -> None:
    # @tool builds its schema from annotations and never writes a $ref; the check
    # sits in ToolDefinition, which @tool goes through, so a schema handed to a Tool
    # by any route is checked once, before the run.
    @sm.tool
    def count(n: int) -> str:
        return str(n)

    assert "$ref" not in str(_schema(count))
    with pytest.raises(sm.InvalidInputError, match="'count': parameters reference"):
        sm.ToolDefinition(count.name, "d", _object(n={"$ref": "https://e.com/n"}))


@pytest.mark.parametrize(
    ("parameters", "ref", "where"),
    [
        (_object(child={"$ref": "#"}), "#", "properties/child"),
        (
            {
                **_object(a={"$ref": "#/$defs/node"}),
                "$defs": {"node": _object(next={"$ref": "#/$defs/node"})},
            },
            "#/$defs/node",
            "$defs/node/properties/next",
        ),
        (
            {
                **_object(a={"$ref": "#/$defs/a"}),
                "$defs": {
                    "a": {"items": {"$ref": "#/$defs/b"}},
                    "b": {"anyOf": [{"$ref": "#/$defs/a"}]},
                },
            },
            "#/$defs/a",
            "$defs/b/anyOf/0",
        ),
        (
            {
                **_object(a={"$ref": "#tree"}),
                "$defs": {"t": {"$anchor": "tree", "items": {"$ref": "#tree"}}},
            },
            "#tree",
            "$defs/t/items",
        ),
    ],
    ids=["root", "self", "mutual", "anchor"],
)
def test_recursive_references_are_refused_at_definition(
    parameters: dict[str, Any], ref: str, where: str
) -> None:
    with pytest.raises(sm.InvalidInputError) as caught:
        sm.ToolDefinition("tree", "d", parameters)
    assert str(caught.value).startswith(
        f"tool 'tree': parameters reference {ref!r} (at {where}) makes the schema recursive"
    )


def test_dangling_references_and_embedded_ids_are_refused() -> None:
    with pytest.raises(sm.InvalidInputError, match=r"'#/\$defs/missing' .* does not resolve"):
        sm.ToolDefinition("t", "d", {**_object(a={"$ref": "#/$defs/missing"}), **_INTEGER_DEF})
    with pytest.raises(sm.InvalidInputError, match=r"'#nowhere' .* does not resolve"):
        sm.ToolDefinition("t", "d", _object(a={"$ref": "#nowhere"}))
    with pytest.raises(sm.InvalidInputError, match=r"is an embedded \$id"):
        sm.ToolDefinition("t", "d", _object(a={"$id": "https://e.com/a", "$ref": "#/x"}))


def test_what_only_looks_like_a_reference_is_left_alone() -> None:
    # Data (a default, an enum, a const) may hold a "$ref" key; it is not a reference.
    # A definition nested in a definition that refers to its parent is not reached
    # by validating the parent, so it is not recursion.
    data = {"$ref": "https://e.com/x"}
    sm.ToolDefinition("t", "d", _object(a={"default": data, "enum": [data], "const": data}))
    nested = {
        **_object(a={"$ref": "#/$defs/outer"}),
        "$defs": {"outer": {"type": "object", "$defs": {"inner": {"$ref": "#/$defs/outer"}}}},
    }
    sm.ToolDefinition("t", "d", nested)
    diamond = {
        **_object(a={"$ref": "#/$defs/pair"}, b={"$ref": "#/$defs/n"}),
        "$defs": {"pair": {"items": {"$ref": "#/$defs/n"}}, "n": {"type": "integer"}},
    }
    sm.ToolDefinition("t", "d", diamond)


def test_validation_never_fetches_a_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.request

    import jsonschema
    import referencing.exceptions

    fetched: list[str] = []

    def urlopen(request: Any, *args: Any, **kwargs: Any) -> Any:
        fetched.append(getattr(request, "full_url", str(request)))
        raise OSError("no network in tests")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    remote = {"$ref": "https://example.com/n.json"}
    # What the check guards against: jsonschema's default registry fetches unknown URIs.
    with pytest.raises(referencing.exceptions.Unresolvable):
        list(jsonschema.Draft202012Validator(remote).iter_errors(1))
    assert fetched == ["https://example.com/n.json"]
    fetched.clear()
    # A definition's validator retrieves nothing, even for a schema swapped in later.
    definition = sm.ToolDefinition("t", "d", {**_object(a={"$ref": "#/$defs/n"}), **_INTEGER_DEF})
    assert sm.engine.validate_arguments(definition, {"a": -1}) == [
        "arguments.a: -1 is less than the minimum of 0"
    ]
    evolved = definition._validator.evolve(schema=remote)
    with pytest.raises(referencing.exceptions.Unresolvable, match="Unresolvable"):
        list(evolved.iter_errors(1))
    assert fetched == []


@pytest.mark.timeout(30)
def test_checking_a_schemas_references_leaves_no_cyclic_garbage() -> None:
    # Checked for every run's tools: what the check makes is freed by reference counting.
    parameters = {**_object(a={"$ref": "#/$defs/n"}), **_INTEGER_DEF}
    sm.ToolDefinition("warm", "", parameters)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        sm.ToolDefinition("count", "", parameters)
        gc.collect()
        garbage = [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert garbage == []
