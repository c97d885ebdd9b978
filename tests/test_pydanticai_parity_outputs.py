"""PydanticAI's own agent-loop tests of outputs, ported to this library's API.

Each test keeps the meaning of a test of PydanticAI's suite (``tests/test_agent.py``,
``tests/models/test_model_test.py``, ``tests/models/test_model_function.py``): the
same script of model answers, the same messages sent back, the same outcome. A comment
names the source test. Where PydanticAI raises (``UnexpectedModelBehavior``), a run
here returns in a named terminal state (``OutputInvalid``), and ``raise_for_state``
raises; a retry prompt is an error ``ToolResultMessage`` (or, for a text answer, a
user message asking for the tool).

Not expressible here, by design:

- The union "text envelope" fallback (``{"result": {"kind": ..., "data": ...}}`` as
  text, ``test_output_type_union_text_fallback*``, ``test_prompted_output*``): there
  is no prompted output mode; a union is offered as one tool per member.
- A list output given as a JSON *string* under ``response``
  (``test_result_list_of_models_with_stringified_response``): the arguments are judged
  by the JSON Schema as sent, so a string where an array is asked is a failed attempt.
- Output functions (``ToolOutput(fn)``, ``TextOutput(fn)``, ``test_output_type_function*``,
  ``test_output_function_retries``, ``test_tool_output_function_retries``): the output
  is a type; a function that transforms or refuses it is an output validator.
- Output validators of a plain text output (``test_retry_str``,
  ``test_text_path_honors_output_retry_budget``, ``TestPartialOutput``): a text agent
  has no output to validate (refused with ``InvalidInputError``); give an
  ``output_type`` that includes ``str``.
- A second final result judged after the first was accepted
  (``test_exhaustive_strategy_valid_first_invalid_second_output``): once one is
  accepted, the others of the response are answered "not used", never validated.
- ``TestModel(custom_output_text=...)`` refused beside an output tool, and
  ``TestModel`` answering text for a union with ``str`` (``test_custom_output_text``,
  ``test_response_union_allow_str``): the fake model cannot tell from the tools it is
  shown whether text is allowed, so it gives the output tool's arguments.
- Run-level ``retries=`` overrides (``test_run_level_output_retry_override*``) and
  per-output ``max_retries`` (``ToolOutput(max_retries=)``): ``output_retries`` is
  the agent's, one budget for every member.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic
import pytest

import statemachine as sm
from statemachine.testing import FunctionModel, ScriptedModel, TestModel


class Foo(pydantic.BaseModel):
    a: int
    b: str


class Bar(pydantic.BaseModel):
    """This is a bar model."""

    b: str


class Value(pydantic.BaseModel):
    value: str


def _calls(*calls: tuple[str, dict[str, Any]]) -> sm.AssistantMessage:
    """One response calling each ``(name, arguments)``, ids "1", "2"... in order."""
    blocks = [sm.ToolCall(str(i), name, args) for i, (name, args) in enumerate(calls, 1)]
    return sm.AssistantMessage(blocks, "toolUse")


def _kinds(result: sm.RunResult[Any]) -> list[str]:
    """Each message's role, with ``!`` for an error result (PydanticAI's retry prompt)."""
    return [
        m.role + ("!" if isinstance(m, sm.ToolResultMessage) and m.is_error else "")
        for m in result.messages
    ]


def _results(result: sm.RunResult[Any]) -> list[tuple[str, str, bool]]:
    return [
        (m.tool_name, m.text, m.is_error)
        for m in result.messages
        if isinstance(m, sm.ToolResultMessage)
    ]


# -- output types -------------------------------------------------------------------------


def test_a_tuple_output_travels_wrapped_in_response() -> None:
    # test_result_tuple
    def answer(messages: Any, tools: Any) -> sm.ToolCall:
        return sm.ToolCall("c1", tools[0].name, {"response": ["foo", "bar"]})

    result = sm.Agent(FunctionModel(answer), output_type=tuple[str, str]).run_sync("Hello")
    assert result.output == ("foo", "bar")
    assert result.state is sm.TurnState.DONE


def test_a_pydantic_model_is_the_output() -> None:
    # test_result_pydantic_model
    model = ScriptedModel(sm.ToolCall("c1", "final_result", {"a": 1, "b": "foo"}))
    result = sm.Agent(model, output_type=Foo).run_sync("Hello")
    assert isinstance(result.output, Foo)
    assert result.output.model_dump() == {"a": 1, "b": "foo"}


def test_arguments_that_fail_the_schema_are_sent_back_and_the_fix_accepted() -> None:
    # test_result_pydantic_model_retry
    def answer(messages: Any, tools: Any) -> sm.ToolCall:
        a: object = "wrong" if len(messages) == 1 else 42
        return sm.ToolCall(f"c{len(messages)}", "final_result", {"a": a, "b": "foo"})

    result = sm.Agent(FunctionModel(answer), output_type=Foo).run_sync("Hello")
    assert result.output == Foo(a=42, b="foo")
    assert _kinds(result) == ["user", "assistant", "toolResult!", "assistant", "toolResult"]
    retry = _results(result)[0][1]
    assert "arguments.a" in retry
    assert "'wrong'" in retry
    assert _results(result)[1] == ("final_result", "Final result accepted.", False)


def test_a_field_validator_that_refuses_is_a_retry_naming_its_message() -> None:
    # test_result_pydantic_model_validation_error
    class Checked(pydantic.BaseModel):
        a: int
        b: str

        @pydantic.field_validator("b")
        @classmethod
        def check_b(cls, v: str) -> str:
            if v == "foo":
                raise ValueError("must not be foo")
            return v

    def answer(messages: Any, tools: Any) -> sm.ToolCall:
        b = "foo" if len(messages) == 1 else "bar"
        return sm.ToolCall(f"c{len(messages)}", "final_result", {"a": 1, "b": b})

    result = sm.Agent(FunctionModel(answer), output_type=Checked).run_sync("Hello")
    assert result.output is not None
    assert result.output.model_dump() == {"a": 1, "b": "bar"}
    assert _kinds(result) == ["user", "assistant", "toolResult!", "assistant", "toolResult"]
    assert "must not be foo" in _results(result)[0][1]


def test_a_dict_json_schema_output_is_the_validated_dict() -> None:
    # test_output_type_structured_dict (one member: StructuredDict is a JSON Schema)
    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    model = ScriptedModel(sm.ToolCall("c1", "final_result", {"name": "John", "age": 30}))
    result = sm.Agent(model, output_type=person).run_sync("Generate a person")
    assert result.output == {"name": "John", "age": 30}
    assert model.requests[0].tools[0].schema_dict()["required"] == ["name", "age"]


def test_a_text_answer_where_a_tuple_is_asked_is_reminded_then_accepted() -> None:
    # test_plain_response_then_tuple
    model = ScriptedModel("hello", sm.ToolCall("c2", "final_result", {"response": ["foo", "bar"]}))
    result = sm.Agent(model, output_type=tuple[str, str]).run_sync("Hello")
    assert result.output == ("foo", "bar")
    assert model.calls == 2
    assert _kinds(result) == ["user", "assistant", "user", "assistant", "toolResult"]
    assert "final_result" in result.messages[2].text


def test_an_empty_text_beside_the_final_result_call_is_harmless() -> None:
    # test_empty_text_part
    model = ScriptedModel(
        [sm.TextContent(""), sm.ToolCall("c1", "final_result", {"response": ["foo", "bar"]})]
    )
    assert sm.Agent(model, output_type=tuple[str, str]).run_sync("Hello").output == ("foo", "bar")


def test_empty_answers_where_a_tuple_is_asked_spend_the_output_retries() -> None:
    # test_empty_response_exceeds_max_retries
    empty = sm.AssistantMessage([])
    agent = sm.Agent(ScriptedModel(empty, empty), output_type=tuple[str, int], output_retries=1)
    result = agent.run_sync("Hello")
    assert result.state is sm.TurnState.OUTPUT_INVALID
    assert _kinds(result) == ["user", "assistant", "user", "assistant"]
    with pytest.raises(sm.errors.OutputInvalidError):
        result.raise_for_state()


# -- unions: one tool per member ------------------------------------------------------------


def test_a_union_with_str_offers_one_final_result_tool_and_takes_text() -> None:
    # test_response_union_allow_str (the model answers text; see the module docstring)
    seen: list[tuple[object, str | None]] = []
    model = ScriptedModel("success (no tool calls)")
    agent: sm.Agent[None, Foo | str] = sm.Agent(model, output_type=Foo | str)

    @agent.output_validator
    def validate_output(ctx: sm.RunContext[None], output: Any) -> Any:
        seen.append((output, ctx.tool_name))
        return output.upper() if isinstance(output, str) else output

    result = agent.run_sync("Hello")
    assert result.output == "SUCCESS (NO TOOL CALLS)"
    assert seen == [("success (no tool calls)", None)]
    assert model.requests[0].tool_names == ("final_result",)
    assert model.requests[0].tools[0].schema_dict()["required"] == ["a", "b"]


@pytest.mark.parametrize("union", [Foo | Bar, [Foo, Bar]], ids=["Foo | Bar", "[Foo, Bar]"])
def test_a_union_of_models_is_one_tool_per_member(union: Any) -> None:
    # test_response_multiple_return_tools
    model = TestModel()
    agent: sm.Agent[None, Foo | Bar] = sm.Agent(model, output_type=union)
    result = agent.run_sync("Hello")
    assert result.output == Foo(a=0, b="a")
    assert model.requests[0].tool_names == ("final_result_Foo", "final_result_Bar")
    assert model.requests[0].tools[1].schema_dict()["required"] == ["b"]
    bar = sm.Agent(
        ScriptedModel(sm.ToolCall("c1", "final_result_Bar", {"b": "b"})), output_type=union
    )
    assert bar.run_sync("Hello").output == Bar(b="b")


# -- output validators ----------------------------------------------------------------------


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_an_output_validator_refuses_a_text_answer_within_the_output_retries(
    is_async: bool,
) -> None:
    # test_text_path_honors_output_retry_budget (the text of a union with str)
    seen: list[tuple[object, int]] = []

    def refuse(ctx: sm.RunContext[None], output: Any) -> Any:
        seen.append((output, ctx.retry))
        raise sm.ModelRetry(f"retry {ctx.retry}")

    async def refuse_async(ctx: sm.RunContext[None], output: Any) -> Any:
        return refuse(ctx, output)

    model = FunctionModel(lambda messages, tools: "hello")
    agent: sm.Agent[None, Foo | str] = sm.Agent(
        model,
        output_type=Foo | str,
        output_retries=2,
        output_validators=[refuse_async if is_async else refuse],
    )
    result = agent.run_sync("Hello")
    assert result.state is sm.TurnState.OUTPUT_INVALID
    assert seen == [("hello", 0), ("hello", 1), ("hello", 2)]
    assert [m.role for m in result.messages] == ["user", "assistant"] * 3
    assert "retry 0" in result.messages[2].text
    assert "retry 2" in result.explanation


def _always_a_is_1(messages: Any, tools: Any) -> sm.ToolCall:
    return sm.ToolCall(f"c{len(messages)}", "final_result", {"a": 1, "b": "foo"})


def test_an_output_validator_asks_for_another_answer_with_model_retry() -> None:
    # test_output_validator
    def answer(messages: Any, tools: Any) -> sm.ToolCall:
        a = 41 if len(messages) == 1 else 42
        return sm.ToolCall(f"c{len(messages)}", "final_result", {"a": a, "b": "foo"})

    agent = sm.Agent(FunctionModel(answer), output_type=Foo)

    @agent.output_validator
    def validate_output(ctx: sm.RunContext[None], o: Foo) -> Foo:
        if o.a == 42:
            return o
        raise sm.ModelRetry('"a" should be 42')

    result = agent.run_sync("Hello")
    assert result.output == Foo(a=42, b="foo")
    assert _kinds(result) == ["user", "assistant", "toolResult!", "assistant", "toolResult"]
    assert _results(result)[0][1].endswith('"a" should be 42')


def test_an_output_validator_reads_its_attempt_and_budget() -> None:
    # test_output_validator_retries
    seen: list[tuple[int, int]] = []
    agent = sm.Agent(FunctionModel(_always_a_is_1), output_type=Foo, output_retries=3)

    @agent.output_validator
    def validate_output(ctx: sm.RunContext[None], o: Foo) -> Foo:
        seen.append((ctx.retry, ctx.max_retries))
        if ctx.retry == 3:
            return o
        raise sm.ModelRetry(f"Retry {ctx.retry}")

    result = agent.run_sync("Hello")
    assert result.output == Foo(a=1, b="foo")
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]


def test_an_output_validator_that_never_accepts_ends_the_run_output_invalid() -> None:
    # test_output_validator_exceeds_output_retries, test_output_tool_retry_error_handled
    seen: list[int] = []
    agent = sm.Agent(FunctionModel(_always_a_is_1), output_type=Foo, output_retries=2)

    @agent.output_validator
    def validate_output(ctx: sm.RunContext[None], o: Foo) -> Foo:
        seen.append(ctx.retry)
        raise sm.ModelRetry(f"Retry {ctx.retry}")

    result = agent.run_sync("Hello")
    assert result.state is sm.TurnState.OUTPUT_INVALID
    assert seen == [0, 1, 2]
    assert "Retry 2" in result.explanation


def test_an_output_validator_sees_the_tool_that_carried_the_output() -> None:
    # test_response_multiple_return_tools (got_tool_call_name), test_output_validator
    names: list[str | None] = []
    agent: sm.Agent[None, Foo | Bar] = sm.Agent(
        ScriptedModel(sm.ToolCall("c1", "final_result_Bar", {"b": "x"})), output_type=[Foo, Bar]
    )

    @agent.output_validator
    def validate_output(ctx: sm.RunContext[None], o: Foo | Bar) -> Foo | Bar:
        names.append(ctx.tool_name)
        return o

    assert agent.run_sync("Hello").output == Bar(b="x")
    assert names == ["final_result_Bar"]


def test_the_output_retry_count_runs_across_member_tools() -> None:
    # test_output_validator_retry_counter_with_tool_switch
    seen: list[tuple[int, int]] = []

    def answer(messages: Any, tools: Any) -> sm.ToolCall:
        name = "final_result_Bar" if len(messages) == 1 else "final_result_Value"
        args = {"b": "x"} if name.endswith("Bar") else {"value": "hello"}
        return sm.ToolCall(f"c{len(messages)}", name, args)

    agent: sm.Agent[None, Value | Bar] = sm.Agent(
        FunctionModel(answer), output_type=[Value, Bar], output_retries=2
    )

    @agent.output_validator
    def validate_output(ctx: sm.RunContext[None], o: Value | Bar) -> Value | Bar:
        seen.append((ctx.retry, ctx.max_retries))
        if ctx.retry < 2:
            raise sm.ModelRetry(f"Retry {ctx.retry}")
        return o

    assert agent.run_sync("Hello").output == Value(value="hello")
    assert seen == [(0, 2), (1, 2), (2, 2)]


def test_an_async_output_validator_retries_a_structured_output() -> None:
    # test_retry_result_type (test_model_function.py)
    class X(pydantic.BaseModel):
        x: int

    def answer(messages: Any, tools: Any) -> sm.ToolCall:
        return sm.ToolCall(f"c{len(messages)}", "final_result", {"x": (len(messages) + 1) // 2})

    agent = sm.Agent(FunctionModel(answer), output_type=X)

    @agent.output_validator
    async def validate_output(o: X) -> X:
        if o.x == 1:
            raise sm.ModelRetry("Try again")
        return o

    assert agent.run_sync("").output == X(x=2)


# -- end strategies -------------------------------------------------------------------------

_ran: list[str] = []


@sm.tool
def regular_tool(x: int) -> int:
    """A regular tool."""
    _ran.append("regular_tool")
    return x


@sm.tool
def another_tool(y: int) -> int:
    """Another tool."""
    _ran.append("another_tool")
    return y


@pytest.fixture(autouse=True)
def _fresh_ran() -> None:
    _ran.clear()


NOT_RUN = "Tool call not run: a final result was already accepted."
NOT_USED = "Not used: a final result was already accepted."


def test_early_ends_at_the_first_final_result_and_runs_no_other_call() -> None:
    # TestMultipleToolCalls.test_early_strategy_stops_after_first_final_result
    model = ScriptedModel(
        _calls(
            ("final_result", {"value": "final"}),
            ("regular_tool", {"x": 1}),
            ("another_tool", {"y": 2}),
        )
    )
    agent = sm.Agent(model, tools=[regular_tool, another_tool], output_type=Value)
    result = agent.run_sync("test early strategy")
    assert result.output == Value(value="final")
    assert _ran == []
    assert _results(result) == [
        ("final_result", "Final result accepted.", False),
        ("regular_tool", NOT_RUN, True),
        ("another_tool", NOT_RUN, True),
    ]


def test_early_uses_the_first_of_two_final_results() -> None:
    # TestMultipleToolCalls.test_early_strategy_uses_first_final_result
    model = ScriptedModel(
        _calls(
            ("final_result", {"value": "first"}),
            ("final_result", {"value": "second"}),
        )
    )
    result = sm.Agent(model, output_type=Value, end_strategy="early").run_sync("x")
    assert result.output == Value(value="first")
    assert [text for _, text, _ in _results(result)] == ["Final result accepted.", NOT_USED]


def test_early_finds_the_final_result_in_the_middle_of_the_calls() -> None:
    # TestMultipleToolCalls.test_early_strategy_with_final_result_in_middle
    model = ScriptedModel(
        _calls(
            ("regular_tool", {"x": 1}),
            ("final_result", {"value": "final"}),
            ("another_tool", {"y": 2}),
            ("unknown_tool", {"value": "???"}),
        )
    )
    result = sm.Agent(model, tools=[regular_tool, another_tool], output_type=Value).run_sync("x")
    assert result.output == Value(value="final")
    assert _ran == []
    assert [r[1] for r in _results(result)] == [NOT_RUN, "Final result accepted.", NOT_RUN, NOT_RUN]


def test_exhaustive_runs_every_call_and_keeps_the_first_final_result() -> None:
    # TestMultipleToolCalls.test_exhaustive_strategy_executes_all_tools
    model = ScriptedModel(
        _calls(
            ("regular_tool", {"x": 42}),
            ("final_result", {"value": "first"}),
            ("another_tool", {"y": 2}),
            ("final_result", {"value": "second"}),
            ("unknown_tool", {"value": "???"}),
        )
    )
    agent = sm.Agent(
        model, tools=[regular_tool, another_tool], output_type=Value, end_strategy="exhaustive"
    )
    result = agent.run_sync("test exhaustive strategy")
    assert result.output == Value(value="first")
    assert sorted(_ran) == ["another_tool", "regular_tool"]
    results = _results(result)
    assert results[:4] == [
        ("regular_tool", "42", False),
        ("final_result", "Final result accepted.", False),
        ("another_tool", "2", False),
        ("final_result", NOT_USED, True),
    ]
    assert results[4][0] == "unknown_tool"
    assert results[4][2]
    assert "Unknown tool: unknown_tool" in results[4][1]


class First(pydantic.BaseModel):
    value: str

    @pydantic.field_validator("value")
    @classmethod
    def refuse(cls, v: str) -> str:
        raise ValueError("First output validation failed")


class Second(pydantic.BaseModel):
    value: str


@pytest.mark.parametrize("strategy", ["early", "exhaustive"])
def test_an_invalid_first_output_gives_way_to_a_valid_second(strategy: Any) -> None:
    # TestMultipleToolCalls.test_exhaustive_strategy_invalid_first_valid_second_output
    model = ScriptedModel(
        _calls(
            ("final_result_First", {"value": "invalid"}),
            ("final_result_Second", {"value": "valid"}),
        )
    )
    agent: sm.Agent[None, First | Second] = sm.Agent(
        model, output_type=[First, Second], end_strategy=strategy
    )
    result = agent.run_sync("test invalid first valid second")
    assert result.output == Second(value="valid")
    (first, first_text, first_error), second = _results(result)
    assert first == "final_result_First"
    assert first_error
    assert "First output validation failed" in first_text
    assert second == ("final_result_Second", "Final result accepted.", False)


def test_without_a_final_result_early_runs_every_call() -> None:
    # TestMultipleToolCalls.test_early_strategy_does_not_apply_to_tool_calls_without_final_tool
    model = ScriptedModel(
        _calls(("regular_tool", {"x": 0})),
        sm.ToolCall("2", "final_result", {"value": "done"}),
    )
    result = sm.Agent(model, tools=[regular_tool], output_type=Value).run_sync("x")
    assert result.output == Value(value="done")
    assert _ran == ["regular_tool"]
    assert _results(result)[0] == ("regular_tool", "0", False)


# -- TestModel's outputs -------------------------------------------------------------------


def test_test_model_fills_a_tuple_and_offers_only_the_output_tool() -> None:
    # test_response_tuple, test_output_type (test_model_test.py)
    model = TestModel()
    result = sm.Agent(model, output_type=tuple[str, str]).run_sync("x")
    assert result.output == ("a", "a")
    assert model.requests[-1].tool_names == ("final_result",)
    schema = model.requests[-1].tools[0].schema_dict()
    assert schema["required"] == ["response"]
    assert schema["properties"]["response"]["maxItems"] == 2
    assert _kinds(result) == ["user", "assistant", "toolResult"]


def test_test_model_gives_custom_output_args() -> None:
    # test_custom_output_args, test_custom_output_args_model
    tuple_agent = sm.Agent(
        TestModel(custom_output_args={"response": ["a", "b"]}), output_type=tuple[str, str]
    )
    assert tuple_agent.run_sync("x").output == ("a", "b")

    @dataclasses.dataclass
    class FooBar:
        foo: str
        bar: int

    model_agent = sm.Agent(TestModel(custom_output_args={"foo": "a", "bar": 1}), output_type=FooBar)
    result = model_agent.run_sync("x")
    assert result.output == FooBar(foo="a", bar=1)
    assert _results(result) == [("final_result", "Final result accepted.", False)]


def test_test_model_with_custom_output_args_that_never_validate_ends_output_invalid() -> None:
    # test_output_tool_retry_error_handled_with_custom_args
    model = TestModel(custom_output_args={"foo": "a", "bar": 1})
    result = sm.Agent(model, output_type=Foo, output_retries=2).run_sync("Hello")
    assert result.state is sm.TurnState.OUTPUT_INVALID
    assert model.calls == 3


def test_test_model_gives_custom_output_text() -> None:
    # test_custom_output_text (the text half; see the module docstring)
    assert sm.Agent(TestModel(custom_output_text="custom")).run_sync("x").output == "custom"


def test_native_output_retries_an_incomplete_answer() -> None:
    # test_native_output
    class CityLocation(pydantic.BaseModel):
        city: str
        country: str

    model = ScriptedModel(
        '{"city": "Mexico City"}',
        '{"city": "Mexico City", "country": "Mexico"}',
        native_output=True,
    )
    agent = sm.Agent(model, output_type=CityLocation, output_mode="native")
    result = agent.run_sync("What is the capital of Mexico?")
    assert result.output == CityLocation(city="Mexico City", country="Mexico")
    assert model.requests[0].tool_names == ()
    assert _kinds(result) == ["user", "assistant", "user", "assistant"]
    assert "country" in result.messages[2].text
