"""An ``Agent`` with structured output and usage limits: its runs are typed by its
``output_type`` (mypy checks this file: ``assert_type`` below fails the type check when
the type is lost), its limits end its runs, and as a sub-agent it answers with JSON."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, assert_type

import pytest

import statemachine as sm
from statemachine.agent.agent import StreamedRun
from statemachine.testing import ScriptedModel

pytestmark = pytest.mark.timeout(30)


@dataclasses.dataclass
class Book:
    title: str
    copies: int


def final(call_id: str = "f1", **arguments: Any) -> sm.ToolCall:
    return sm.ToolCall(call_id, "final_result", arguments)


def test_an_agents_output_type_types_its_runs_without_an_annotation() -> None:
    agent = sm.Agent(ScriptedModel(final(title="Dune", copies=3)), output_type=Book)
    assert_type(agent, sm.Agent[Any, Book])
    result = agent.run_sync("Dune?")
    assert_type(result, sm.RunResult[Book])
    book: Book | None = result.output
    assert book == Book("Dune", 3)
    assert result.state is sm.TurnState.DONE


def test_an_agent_without_an_output_type_is_an_agent_of_any_whose_output_is_its_text() -> None:
    agent = sm.Agent(ScriptedModel("hi"))
    assert_type(agent, sm.Agent[Any])
    result = agent.run_sync("hello")
    assert result.output == "hi"
    assert result.final_text == "hi"


def test_run_stream_and_resume_keep_the_output_type() -> None:
    model = ScriptedModel(
        sm.ToolCall("c1", "lookup", {}),
        final(title="Emma", copies=0),
        final("f2", title="Emma", copies=1),
        stream=True,
    )

    @sm.tool
    def lookup() -> str:
        """Look the book up."""
        return "Emma"

    agent = sm.Agent(
        model,
        tools=[lookup],
        output_type=Book,
        before_tool_call=lambda call: (
            sm.RequireApproval("a person checks") if call.name == "lookup" else None
        ),
    )

    async def main() -> tuple[sm.RunResult[Book], sm.RunResult[Book]]:
        async with agent.run_stream("Emma?") as run:
            assert_type(run, StreamedRun[Book])
            suspended = await run.result()
        resumed = await agent.resume(suspended, approvals={"c1": True})
        return suspended, resumed

    suspended, resumed = asyncio.run(main())
    assert suspended.state is sm.TurnState.AWAITING_USER
    assert_type(resumed, sm.RunResult[Book])
    # resumed with the agent's output type: the output is a Book, not the validated dict
    assert resumed.output == Book("Emma", 0)
    again = agent.run_sync("And now?", message_history=resumed.messages)
    assert again.output == Book("Emma", 1)


def test_a_wrong_final_result_spends_the_agents_output_retries() -> None:
    model = ScriptedModel(final(title="Dune", copies="three"), final("f2", title="Dune"))
    result = sm.Agent(model, output_type=Book, output_retries=1).run_sync("Dune?")
    assert result.state is sm.TurnState.OUTPUT_INVALID
    assert result.output is None
    assert model.calls == 2


def test_an_agents_usage_limits_end_each_of_its_runs() -> None:
    model = ScriptedModel(sm.ToolCall("c1", "lookup", {}), "never asked")

    @sm.tool
    def lookup() -> str:
        """Look the book up."""
        return "Dune"

    agent = sm.Agent(model, tools=[lookup], usage_limits=sm.UsageLimits(requests=1))
    result = agent.run_sync("Dune?")
    assert result.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    assert "requests=1" in result.explanation
    assert model.calls == 1


def test_a_typed_sub_agent_answers_with_its_output_as_json() -> None:
    child = sm.Agent(
        ScriptedModel("Let me see.", final(title="Dune", copies=3)),
        name="stock",
        output_type=Book,
    )
    parent_model = ScriptedModel(sm.ToolCall("p1", "stock", {"prompt": "Dune?"}), "Three.")
    parent = sm.Agent(parent_model, tools=[child.as_tool()])
    result = parent.run_sync("Is Dune in stock?")
    assert result.final_text == "Three."
    answers = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert [(a.tool_name, a.is_error) for a in answers] == [("stock", False)]
    assert json.loads(answers[0].text) == {"title": "Dune", "copies": 3}


def test_a_typed_sub_agent_that_never_gives_valid_output_ends_its_call_with_an_error() -> None:
    child = sm.Agent(
        ScriptedModel("no", "still no"), name="stock", output_type=Book, output_retries=1
    )
    parent = sm.Agent(
        ScriptedModel(sm.ToolCall("p1", "stock", {"prompt": "Dune?"}), "Unknown."),
        tools=[child.as_tool()],
    )
    result = parent.run_sync("Is Dune in stock?")
    [answer] = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.is_error
    assert "OutputInvalid" in answer.text
