"""The fake models of statemachine.testing: ScriptedModel and FunctionModel."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

import statemachine as sm
import statemachine.messages
from statemachine.testing import FunctionModel, Request, ScriptedModel
from statemachine.testing.models import Response


@sm.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _run(model: sm.ModelClient, max_turns: int = 8) -> sm.RunResult:
    return sm.run_agent_sync(
        model=model, tools=[add], messages=[sm.UserMessage("40 + 2?")], max_turns=max_turns
    )


def test_a_script_is_answered_in_order_and_every_request_is_recorded() -> None:
    model = ScriptedModel(sm.ToolCall("c1", "add", {"a": 40, "b": 2}), "It is 42.")
    result = _run(model)
    assert result.state is sm.TurnState.DONE
    assert result.final_text == "It is 42."
    assert model.calls == 2
    assert model.remaining == 0
    first, second = model.requests
    assert first == Request((sm.UserMessage("40 + 2?"),), (add.definition,))
    assert isinstance(second.messages[-1], sm.ToolResultMessage)
    assert second.messages[-1].text == "42"


def test_short_responses_stand_for_messages() -> None:
    call = sm.ToolCall("c1", "add", {"a": 1, "b": 2})
    model = ScriptedModel([sm.TextContent("adding"), call], sm.AssistantMessage("done"))
    result = _run(model)
    assistant = result.messages[1]
    assert isinstance(assistant, sm.AssistantMessage)
    assert assistant.stop_reason is sm.messages.StopReason.TOOL_USE
    assert assistant.text == "adding"
    assert assistant.tool_calls == (call,)


def test_a_call_past_the_script_fails_the_run_saying_so() -> None:
    result = _run(ScriptedModel(sm.ToolCall("c1", "add", {"a": 1, "b": 2})))
    assert result.state is sm.TurnState.FAILED
    assert "ScriptedModel: model call 2, but the script has 1 response(s)" in result.explanation


def test_an_exception_in_the_script_is_a_failing_provider() -> None:
    result = _run(ScriptedModel(ConnectionError("down")))
    assert result.state is sm.TurnState.FAILED
    assert isinstance(result.error, sm.ModelFailedError)
    assert isinstance(result.error.__cause__, ConnectionError)


def test_a_function_decides_from_the_context_sync_or_async() -> None:
    def answer(messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]) -> object:
        last = messages[-1]
        if isinstance(last, sm.ToolResultMessage):
            return f"It is {last.text}."
        return sm.ToolCall("c1", tools[0].name, {"a": 40, "b": 2})

    async def answer_later(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> object:
        return answer(messages, tools)

    for fn in (answer, answer_later):
        model = FunctionModel(fn)  # type: ignore[arg-type]
        result = _run(model)
        assert result.final_text == "It is 42."
        assert model.calls == 2


def test_bad_responses_and_functions_are_refused_clearly() -> None:
    result = _run(ScriptedModel([1, 2]))  # type: ignore[list-item]
    assert result.state is sm.TurnState.FAILED
    assert "a fake model's response is an AssistantMessage" in result.explanation
    with pytest.raises(sm.UsageError, match="FunctionModel needs a function"):
        FunctionModel("not a function")  # type: ignore[arg-type]


def test_a_script_step_may_be_a_function_of_the_context() -> None:
    def answer(messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]) -> str:
        last = messages[-1]
        assert isinstance(last, sm.ToolResultMessage)
        return f"It is {last.text}."

    model = ScriptedModel(sm.ToolCall("c1", "add", {"a": 40, "b": 2}), answer)
    result = _run(model)
    assert result.final_text == "It is 42."
    assert [r.tool_names for r in model.requests] == [("add",), ("add",)]
    assert model.contexts[0] == [sm.UserMessage("40 + 2?")]
    assert len(model.contexts[1]) == 3


def test_a_function_model_may_be_given_the_abort_signal() -> None:
    seen: list[bool] = []

    async def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition], signal: sm.AbortSignal
    ) -> str:
        seen.append(signal.aborted)
        return "done"

    assert _run(FunctionModel(answer, with_signal=True)).final_text == "done"
    assert seen == [False]


def test_without_recording_a_model_counts_its_calls_and_keeps_no_context() -> None:
    scripted = ScriptedModel(sm.ToolCall("c1", "add", {"a": 40, "b": 2}), "42", record=False)
    assert _run(scripted).final_text == "42"
    assert (scripted.calls, scripted.remaining, scripted.requests) == (2, 0, [])
    function = FunctionModel(lambda messages, tools: "done", record=False)
    assert _run(function).final_text == "done"
    assert (function.calls, function.requests) == (1, [])
    # the count still ends the script: a call past it fails the run
    result = _run(ScriptedModel(sm.ToolCall("c1", "add", {"a": 1, "b": 1}), record=False))
    assert result.state is sm.TurnState.FAILED
    assert "model call 2, but the script has 1" in result.explanation


class _Answer(sm.AssistantMessage):
    pass


def test_a_function_model_answers_as_the_script_step_would() -> None:
    # The model's own path for a function (an AssistantMessage taken as it is, anything
    # else read as a short response) gives what a script step gives.
    message = sm.AssistantMessage("same")
    model = FunctionModel(lambda messages, tools: message)
    assert _run(model).messages[-1] is message
    subclassed = _Answer("sub")
    assert _run(FunctionModel(lambda messages, tools: subclassed)).messages[-1] is subclassed
    call = sm.ToolCall("c1", "add", {"a": 1, "b": 2})
    answers: Iterator[Response] = iter([[call], "3"])
    result = _run(FunctionModel(lambda messages, tools: next(answers)))
    assert result.messages[1] == sm.AssistantMessage((call,), stop_reason="toolUse")
    assert result.final_text == "3"
    # A class is a response, as in a script: an exception class is raised, not called
    # with the context.
    failing = _run(FunctionModel(ConnectionError))
    assert failing.state is sm.TurnState.FAILED
    assert isinstance(failing.error, sm.ModelFailedError)
    assert failing.error.__cause__ is not None
    assert failing.error.__cause__.args == ()


def test_a_function_model_given_the_signal_may_answer_a_message_as_it_is() -> None:
    seen: list[bool] = []

    def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition], signal: sm.AbortSignal
    ) -> sm.AssistantMessage:
        seen.append(signal.aborted)
        return sm.AssistantMessage("done")

    assert _run(FunctionModel(answer, with_signal=True)).final_text == "done"
    assert seen == [False]


def test_a_script_step_may_be_given_the_abort_signal() -> None:
    seen: list[tuple[int, bool]] = []

    async def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition], signal: sm.AbortSignal
    ) -> str:
        seen.append((len(messages), signal.aborted))
        return "done"

    model = ScriptedModel(sm.ToolCall("c1", "add", {"a": 40, "b": 2}), answer, with_signal=True)
    assert _run(model).final_text == "done"
    assert seen == [(3, False)]
    assert model.remaining == 0
    # without it, a step is called with the context and the tools only
    plain = ScriptedModel(lambda messages, tools: f"{len(messages)} messages")
    assert _run(plain).final_text == "1 messages"
