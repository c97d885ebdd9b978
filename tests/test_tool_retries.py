"""Retry requests: a tool or an output validator raises ``ModelRetry`` to ask the model
to try again; a tool's requests in a row are counted against its ``retries``, and the
run ends ``ToolRetriesExceeded`` past them (rule 14 of the table)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine.core.output import OutputSpec
from statemachine.core.tools import DEFAULT_TOOL_RETRIES
from statemachine.engine import ContinueDecided, Engine, ModelResponded, Start, ToolFinished
from statemachine.testing import ScriptedModel

pytestmark = pytest.mark.timeout(30)


def asks(call_id: str, tool: str = "lookup", **arguments: Any) -> sm.AssistantMessage:
    return sm.AssistantMessage([sm.ToolCall(call_id, tool, arguments)], "toolUse")


def results(result: sm.RunResult) -> list[sm.ToolResultMessage]:
    return [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]


def test_a_tool_asks_for_a_retry_and_sees_the_attempt_number() -> None:
    seen: list[int] = []

    @sm.tool
    def lookup(ctx: sm.RunContext[None], name: str) -> str:
        """Look a customer up by full name."""
        seen.append(ctx.retry)
        if " " not in name:
            raise sm.ModelRetry(f"No customer {name!r}: give the full name.")
        return f"{name}: found"

    model = ScriptedModel(asks("c1", name="Ada"), asks("c2", name="Ada Lovelace"), "Found.")
    result = sm.Agent(model, tools=[lookup]).run_sync("find Ada")
    assert result.ok
    assert seen == [0, 1]
    first = results(result)[0]
    assert first.is_error
    assert first.text == "No customer 'Ada': give the full name."


def test_a_tool_knows_its_budget_and_answers_plainly_on_its_last_attempt() -> None:
    seen: list[tuple[int, int, bool]] = []

    @sm.tool(retries=2)
    def lookup(ctx: sm.RunContext[None], name: str) -> str:
        """Look a customer up by full name."""
        seen.append((ctx.retry, ctx.max_retries, ctx.last_attempt))
        if ctx.last_attempt:  # one more request would end the run: answer with what there is
            return f"No exact match for {name!r}; closest: Ada Lovelace."
        raise sm.ModelRetry("Give the full name.")

    model = ScriptedModel(*[asks(f"c{i}", name="Ada") for i in range(3)], "Found.")
    result = sm.Agent(model, tools=[lookup]).run_sync("find Ada")
    assert result.ok, result.explanation
    assert seen == [(0, 2, False), (1, 2, False), (2, 2, True)]
    assert not results(result)[-1].is_error


def test_outside_a_tool_the_context_has_no_attempt() -> None:
    seen: list[tuple[int, int, bool]] = []

    def instructions(ctx: sm.RunContext[None]) -> str:
        seen.append((ctx.retry, ctx.max_retries, ctx.last_attempt))
        return "Be brief."

    sm.Agent(ScriptedModel("Hi."), instructions=instructions).run_sync("hello")
    assert seen == [(0, 0, False)]


def test_a_tool_that_keeps_asking_ends_the_run_past_its_budget() -> None:
    @sm.tool
    def lookup(name: str) -> str:
        """Look a customer up."""
        raise sm.ModelRetry("Not found, try another spelling.")

    model = ScriptedModel(*[asks(f"c{i}", name="x") for i in range(10)])
    result = sm.Agent(model, tools=[lookup], max_turns=10).run_sync("find")
    assert result.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    assert model.calls == DEFAULT_TOOL_RETRIES + 1
    assert "lookup" in result.explanation
    assert "Not found, try another spelling." in result.explanation
    with pytest.raises(sm.errors.ToolRetriesExceededError, match="lookup"):
        result.raise_for_state()


@pytest.mark.parametrize("retries", [0, 2])
def test_the_budget_is_the_tools_own(retries: int) -> None:
    @sm.tool(retries=retries)
    def lookup(name: str) -> str:
        """Look a customer up."""
        raise sm.ModelRetry("again")

    model = ScriptedModel(*[asks(f"c{i}", name="x") for i in range(10)])
    result = sm.Agent(model, tools=[lookup], max_turns=10).run_sync("find")
    assert result.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    assert model.calls == retries + 1


def test_a_result_that_is_not_a_retry_request_starts_the_count_again() -> None:
    answers = iter(["retry", "ok", "retry", "ok", "retry"])

    @sm.tool(retries=1)
    def lookup(name: str) -> str:
        """Look a customer up."""
        if next(answers) == "retry":
            raise sm.ModelRetry("again")
        return "found"

    model = ScriptedModel(*[asks(f"c{i}", name="x") for i in range(5)], "done")
    result = sm.Agent(model, tools=[lookup], max_turns=10).run_sync("find")
    assert result.ok, result.explanation
    assert [r.is_error for r in results(result)] == [True, False, True, False, True]


def test_an_ordinary_exception_is_not_a_retry_request() -> None:
    @sm.tool(retries=0)
    def lookup(name: str) -> str:
        """Look a customer up."""
        raise ValueError("broken")

    model = ScriptedModel(asks("c1", name="x"), asks("c2", name="x"), "gave up")
    result = sm.Agent(model, tools=[lookup]).run_sync("find")
    assert result.ok


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_a_budget_must_be_an_integer_of_at_least_zero(bad: object) -> None:
    with pytest.raises(sm.InvalidInputError, match="retries"):

        @sm.tool(retries=bad)  # type: ignore[call-overload, untyped-decorator]
        def lookup() -> str:
            """Look."""
            return ""


def test_the_retry_count_survives_a_snapshot() -> None:
    definition = sm.ToolDefinition("lookup", "", {"type": "object"})
    engine = Engine(tools=[definition], messages=[sm.UserMessage("go")], tool_retries={"lookup": 1})
    engine.handle(Start())
    engine.handle(ModelResponded(asks("c1", name="x")))
    engine.handle(ToolFinished("c1", sm.ToolOutput("again", is_error=True, retry=True)))
    assert engine.tool_failures("lookup") == 1
    # the boundary asks nothing; the engine calls the model: answer, then restore
    engine.handle(ModelResponded(asks("c2", name="x")))
    engine.handle(ToolFinished("c2", sm.ToolOutput("again", is_error=True, retry=True)))
    assert engine.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    restored = Engine.restore(engine.snapshot())
    assert restored.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    assert restored.tool_failures("lookup") == 2
    assert restored.tool_retries == {"lookup": 1}


@dataclasses.dataclass
class Query:
    sql: str


def test_an_output_validator_asks_for_a_retry_within_the_output_retries() -> None:
    model = ScriptedModel(
        asks("f1", "final_result", sql="DELETE FROM users"),
        asks("f2", "final_result", sql="SELECT * FROM users"),
    )
    agent = sm.Agent(model, output_type=Query)
    checked: list[str] = []

    @agent.output_validator
    def read_only(ctx: sm.RunContext[None], output: Query) -> Query:
        checked.append(output.sql)
        if not output.sql.startswith("SELECT"):
            raise sm.ModelRetry("Only SELECT queries are allowed.")
        return output

    result = agent.run_sync("users?")
    assert result.output == Query("SELECT * FROM users")
    assert checked == ["DELETE FROM users", "SELECT * FROM users"]  # once each
    assert "Only SELECT queries are allowed." in results(result)[0].text


def test_an_output_validator_that_keeps_refusing_ends_output_invalid() -> None:
    model = ScriptedModel(*[asks(f"f{i}", "final_result", sql="DROP") for i in range(3)])

    def never(output: Query) -> Query:
        raise sm.ModelRetry("No.")

    agent = sm.Agent(model, output_type=Query, output_retries=1, output_validators=[never])
    result = agent.run_sync("q")
    assert result.state is sm.TurnState.OUTPUT_INVALID
    assert model.calls == 2


def test_an_async_output_validator_is_awaited_and_may_ask_for_a_retry() -> None:
    seen: list[str] = []
    model = ScriptedModel(
        asks("f1", "final_result", sql="DROP"), asks("f2", "final_result", sql="SELECT 1")
    )
    agent = sm.Agent(model, output_type=Query)

    @agent.output_validator
    async def safe(ctx: sm.RunContext[None], output: Query) -> Query:
        await asyncio.sleep(0)  # really awaited: a coroutine never awaited would pass it
        seen.append(output.sql)
        if not output.sql.startswith("SELECT"):
            raise sm.ModelRetry("Only SELECT queries.")
        return Query(output.sql + ";")

    result = agent.run_sync("q")
    assert result.ok
    assert result.output == Query("SELECT 1;")  # the value the validator returned
    assert seen == ["DROP", "SELECT 1"]  # once per value
    refusal = results(result)[0]
    assert refusal.is_error
    assert "Only SELECT queries." in refusal.text


def test_an_async_output_validator_judges_a_native_output_too() -> None:
    async def never(output: Query) -> Query:
        raise sm.ModelRetry("Never.")

    model = ScriptedModel('{"sql": "SELECT 1"}', '{"sql": "SELECT 2"}', native_output=True)
    agent = sm.Agent(model, output_type=Query, output_retries=1, output_validators=[never])
    result = agent.run_sync("q")
    assert result.state is sm.TurnState.OUTPUT_INVALID
    assert "Never." in (result.explanation or "")


# -- calls of a tool the run does not offer (rule 14) -----------------------------------------


def _unknown(call_id: str) -> sm.AssistantMessage:
    return asks(call_id, "no_such_tool")


def test_a_model_that_keeps_calling_an_unknown_tool_ends_tool_retries_exceeded() -> None:
    model = ScriptedModel(*[_unknown(f"c{i}") for i in range(6)], "never reached")
    result = sm.Agent(model, output_retries=1, max_turns=8).run_sync("go")
    assert result.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    assert model.calls == 2  # the second unknown call passes the budget of 1
    assert "no_such_tool" in (result.explanation or "")
    assert "Unknown tool: no_such_tool" in (result.explanation or "")
    # each call still got exactly one result (I1)
    assert [m.tool_name for m in results(result)] == ["no_such_tool"] * 2


@pytest.mark.parametrize("budget", [0, 2, 3])
def test_the_budget_of_unknown_tool_calls_is_the_output_retries(budget: int) -> None:
    model = ScriptedModel(*[_unknown(f"c{i}") for i in range(6)], "never reached")
    result = sm.Agent(model, output_retries=budget, max_turns=8).run_sync("go")
    assert result.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    assert model.calls == budget + 1


def test_an_unknown_tool_within_its_budget_lets_the_model_recover() -> None:
    model = ScriptedModel(_unknown("c1"), _unknown("c2"), "Done without it.")
    result = sm.Agent(model).run_sync("go")  # output_retries: 2 by default
    assert result.ok
    assert result.final_text == "Done without it."


def test_an_engine_not_given_a_budget_answers_unknown_tools_without_counting() -> None:
    # what a run recorded before unknown calls were counted did: replayed, it ends alike
    engine = Engine(tools=[], messages=[sm.UserMessage("go")], max_turns=5)
    engine.handle(Start())
    for i in range(4):
        engine.handle(ModelResponded(_unknown(f"c{i}")))
    assert engine.state is sm.TurnState.AWAITING_MODEL
    assert engine.tool_failures("no_such_tool") == 0


def test_the_unknown_tool_count_and_its_budget_survive_a_snapshot() -> None:
    engine = Engine(
        tools=[], messages=[sm.UserMessage("go")], unknown_tool_retries=1, check_continue=True
    )
    engine.handle(Start())
    engine.handle(ModelResponded(_unknown("c1")))
    assert engine.state is sm.TurnState.TURN_BOUNDARY  # waits for should_continue
    restored = Engine.restore(engine.snapshot())
    assert restored.unknown_tool_retries == 1
    assert restored.tool_failures("no_such_tool") == 1
    restored.handle(ContinueDecided(stop=False))
    restored.handle(ModelResponded(_unknown("c2")))
    restored.handle(ContinueDecided(stop=False))
    assert restored.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    old = Engine(tools=[], messages=[sm.UserMessage("go")])
    assert "unknownToolRetries" not in old.snapshot()  # written only where counted


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1"])
def test_the_unknown_tool_budget_must_be_an_integer_of_at_least_zero(bad: object) -> None:
    with pytest.raises(sm.InvalidInputError, match="unknown_tool_retries"):
        Engine(tools=[], messages=[sm.UserMessage("go")], unknown_tool_retries=bad)  # type: ignore[arg-type]


# -- output validators of a plain-text agent (rule 13) ----------------------------------------


def _please(text: str) -> str:
    if "please" not in text:
        raise sm.ModelRetry("Say please.")
    return text.upper()


@pytest.mark.parametrize("output_type", [None, str], ids=["no output type", "str"])
def test_an_output_validator_judges_a_plain_text_answer(output_type: type[str] | None) -> None:
    model = ScriptedModel("hi", "hi please")
    agent = sm.Agent(model, output_type=output_type, output_validators=[_please])
    result = agent.run_sync("go")
    assert result.ok
    assert result.output == "HI PLEASE"  # the validator's correction is the output
    assert result.messages[2].text == "Your answer was not accepted: Say please. Answer again."


def test_a_plain_text_output_offers_no_tool_and_keeps_the_tool_names_free() -> None:
    @sm.tool
    def final_result(x: int) -> str:
        """A tool that happens to have the name a structured output's tool has."""
        return str(x)

    model = ScriptedModel(asks("c1", "final_result", x=1), "done please")
    result = sm.Agent(model, tools=[final_result], output_validators=[_please]).run_sync("go")
    assert result.ok
    assert results(result)[0].text == "1"  # the user's tool ran
    assert [t.name for t in model.requests[0].tools] == ["final_result"]


def test_a_plain_text_output_and_its_failures_survive_a_snapshot() -> None:
    spec = OutputSpec.plain_text(retries=1)
    assert OutputSpec.from_dict(spec.to_dict(), "output") == spec
    engine = Engine(tools=[], messages=[sm.UserMessage("go")], output=spec, check_continue=True)
    engine.handle(Start())
    engine.handle(ModelResponded(sm.AssistantMessage("no")))  # no check: text is accepted
    assert engine.state is sm.TurnState.DONE
    refusing = attrs.evolve(spec, check=lambda value, tool: "refused")
    engine = Engine(tools=[], messages=[sm.UserMessage("go")], output=refusing, check_continue=True)
    engine.handle(Start())
    engine.handle(ModelResponded(sm.AssistantMessage("no")))
    assert engine.state is sm.TurnState.TURN_BOUNDARY
    restored = Engine.restore(engine.snapshot())
    assert restored.output == spec
    assert restored.output_failures == 1


def test_a_plain_text_run_suspended_for_approval_is_judged_again_when_resumed() -> None:
    @sm.tool
    def act() -> str:
        """Act."""
        return "did"

    model = ScriptedModel(asks("a", "act"), "hi", "hi please")
    agent = sm.Agent(
        model,
        tools=[act],
        output_validators=[_please],
        before_tool_call=lambda call: sm.RequireApproval("a person decides"),
    )
    first = agent.run_sync("go")
    assert first.state is sm.TurnState.AWAITING_USER
    second = agent.resume_sync(first, approvals={"a": True})
    assert second.ok
    assert second.output == "HI PLEASE"
    assert second.messages[-2].text == "Your answer was not accepted: Say please. Answer again."


def test_run_agent_answers_unknown_tools_until_max_turns_unless_a_budget_is_given() -> None:
    # The minimal loop answers a call of a tool it does not offer with an error result
    # and goes on (max_turns bounds it); counting them is the Agent's default, or asked.

    def script() -> ScriptedModel:
        calls = [
            sm.AssistantMessage([sm.ToolCall(f"c{i}", "ghost", {})], "toolUse") for i in range(4)
        ]
        return ScriptedModel(*calls, "done")

    plain = asyncio.run(sm.run_agent(model=script(), messages=[sm.UserMessage("go")]))
    assert plain.state is sm.TurnState.DONE
    counted = asyncio.run(
        sm.run_agent(model=script(), messages=[sm.UserMessage("go")], unknown_tool_retries=2)
    )
    assert counted.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    assert "ghost" in counted.explanation
