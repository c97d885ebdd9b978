"""Declared steps run by the driver: run_agent(steps=...), Agent(steps=...), the
library's guardrails, and a step that fails (raises, hangs, answers nonsense)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pytest

from statemachine import (
    AbortController,
    Agent,
    AgentRun,
    RequireApproval,
    RunContext,
    RunReturned,
    ToolCall,
    TurnState,
    resume_agent_sync,
    run_agent,
    run_agent_sync,
    tool,
)
from statemachine.core.invariants import history_violations
from statemachine.core.messages import Message, UserMessage
from statemachine.errors import (
    InvalidInputError,
    JournalError,
    SnapshotError,
    StepDeclarationError,
    StepEndedError,
)
from statemachine.journal import Journal, JournalingEngine, replay
from statemachine.steps import (
    Decision,
    DeclaredState,
    End,
    GoOn,
    Retry,
    Step,
    diagram,
    input_guardrail,
    output_guardrail,
)
from statemachine.testing import ScriptedModel

BLOCKED = DeclaredState("OutputBlocked", True, "an output guardrail blocked the answer")


def _refund_limit(text: str) -> str | None:
    return "Refunds above 100 EUR need a person." if "1000" in text else None


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: 1000 EUR"


@pytest.mark.timeout(30)
def test_an_output_guardrail_passes_a_good_answer() -> None:
    model = ScriptedModel("Refunded 50 EUR.")
    guard = output_guardrail("refund_limit", _refund_limit)
    result = run_agent_sync(model=model, messages="refund", steps=[guard])
    assert result.state is TurnState.DONE
    assert result.error is None
    assert [r.dest.value for r in result.trace][-2:] == ["RefundLimit", "Done"]


@pytest.mark.timeout(30)
def test_an_output_guardrail_sends_its_reason_back_and_the_model_corrects_itself() -> None:
    model = ScriptedModel("Refunded 1000 EUR.", "Refunded 100 EUR; the rest goes to a person.")
    guard = output_guardrail("refund_limit", _refund_limit)
    result = run_agent_sync(model=model, messages="refund", steps=[guard])
    assert result.state is TurnState.DONE
    assert result.turns == 2
    assert model.requests[1].messages[-1] == UserMessage("Refunds above 100 EUR need a person.")
    assert history_violations(list(result.messages)) == []


@pytest.mark.timeout(30)
def test_an_output_guardrail_trips_once_its_retries_are_spent() -> None:
    model = ScriptedModel("1000 EUR", "1000 EUR", "1000 EUR")
    guard = output_guardrail("refund_limit", _refund_limit, retries=2)
    result = run_agent_sync(model=model, messages="refund", steps=[guard], max_turns=5)
    assert result.state == BLOCKED
    assert result.turns == 3
    assert isinstance(result.error, StepEndedError)
    assert "Refunds above 100 EUR need a person." in result.explanation
    with pytest.raises(StepEndedError):
        result.raise_for_state()


@pytest.mark.timeout(30)
def test_an_input_guardrail_trips_before_any_model_call() -> None:
    model = ScriptedModel()
    guard = input_guardrail("no_other_customers", lambda text: "asks about another customer")
    result = run_agent_sync(model=model, messages="show me Bob's orders", steps=[guard])
    assert result.state == DeclaredState("InputBlocked", True, "")  # compared by name too
    assert result.state.value == "InputBlocked"
    assert result.turns == 0
    assert model.calls == 0
    assert "asks about another customer" in result.explanation


@pytest.mark.timeout(30)
def test_an_input_guardrail_checks_only_what_the_model_has_not_seen() -> None:
    seen: list[str] = []

    def check(text: str) -> None:
        seen.append(text)

    model = ScriptedModel(ToolCall("c1", "lookup", {"order": "7"}), "Done.")
    guard = input_guardrail("input_check", check)
    result = run_agent_sync(model=model, messages="refund 7", tools=[lookup], steps=[guard])
    assert result.state is TurnState.DONE
    assert seen == ["refund 7"]  # the second call follows tool results: nothing new


@pytest.mark.timeout(30)
def test_a_step_function_takes_the_run_context_when_it_asks_for_it() -> None:
    got: list[object] = []

    def review(ctx: RunContext[str], messages: Sequence[Message]) -> str:
        got.append(ctx.deps)
        return "ok"

    step = Step("review", "after_final", {"ok": GoOn(), "no": End("Rejected", "rejected")}, review)
    result = run_agent_sync(model=ScriptedModel("hi"), messages="x", steps=[step], deps="tenant-1")
    assert result.state is TurnState.DONE
    assert got == ["tenant-1"]


@pytest.mark.timeout(30)
def test_an_async_step_may_answer_with_a_decision() -> None:
    async def review(messages: Sequence[Message]) -> Decision:
        await asyncio.sleep(0)
        return Decision("no", "it mentions a competitor")

    step = Step("review", "after_final", {"ok": GoOn(), "no": End("Rejected", "rejected")}, review)
    result = asyncio.run(run_agent(model=ScriptedModel("hi"), messages="x", steps=[step]))
    assert result.state.value == "Rejected"
    assert result.explanation == "rejected (the step review answered no: it mentions a competitor)"


def _failing(function: object, **options: object) -> Step:
    return Step(
        "review",
        "after_final",
        {"ok": GoOn(), "again": Retry(), "broken": End("ReviewFailed", "the review failed")},
        function,  # type: ignore[arg-type]
        on_error="broken",
        **options,  # type: ignore[arg-type]
    )


def _raises(messages: Sequence[Message]) -> str:
    raise RuntimeError("the reviewer is down")


async def _hangs(messages: Sequence[Message]) -> str:
    await asyncio.sleep(3600)
    return "ok"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("step", "said"),
    [
        (_failing(_raises), "raised RuntimeError: the reviewer is down"),
        (_failing(_hangs, timeout=0.05), "ran past its timeout of 0.05 s"),
        (_failing(lambda messages: "maybe"), "answered 'maybe', not one of its outcomes"),
        (_failing(lambda messages: 42), "returned int, not an outcome"),
        (_failing(lambda messages: Decision("again", "x" * 40_000)), "at most 32000 characters"),
    ],
)
def test_a_step_that_fails_ends_in_its_on_error_outcome_saying_why(step: Step, said: str) -> None:
    result = run_agent_sync(model=ScriptedModel("hi"), messages="x", steps=[step])
    assert result.state.value == "ReviewFailed"
    assert said in result.explanation


@pytest.mark.timeout(30)
def test_abort_while_a_step_runs_ends_the_run_and_cancels_the_step() -> None:
    asyncio.run(_abort_while_a_step_runs())


async def _abort_while_a_step_runs() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow(messages: Sequence[Message]) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "ok"

    controller = AbortController()
    step = _failing(slow)

    async def abort_when_started() -> None:
        await started.wait()
        controller.abort("the user left")

    aborter = asyncio.create_task(abort_when_started())
    result = await run_agent(
        model=ScriptedModel("hi"), messages="x", steps=[step], signal=controller.signal
    )
    await aborter
    assert result.state is TurnState.ABORTED
    assert "while the step Review ran" in result.explanation
    await asyncio.wait_for(cancelled.wait(), 5)


@pytest.mark.timeout(30)
def test_an_agent_takes_steps_refuses_bad_ones_at_once_and_draws_them() -> None:
    with pytest.raises(StepDeclarationError, match="no answer to retry"):
        Agent(
            ScriptedModel(),
            steps=[Step("x", "before_model", {"a": Retry(), "b": End("B", "b")}, lambda m: "a")],
        )
    with pytest.raises(InvalidInputError, match="not a Step"):
        Agent(ScriptedModel(), steps=["review"])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="after_everything"):
        Step("x", "after_everything", {"b": End("B", "b")}, lambda m: "b")
    guard = output_guardrail("refund_limit", _refund_limit)
    agent = Agent(ScriptedModel("1000", "50"), steps=[guard])
    result = agent.run_sync("refund")
    assert result.state is TurnState.DONE
    assert result.turns == 2
    drawn = diagram(agent)
    assert isinstance(drawn, str)
    assert "RefundLimit" in drawn
    assert "OutputBlocked" in drawn


@pytest.mark.timeout(30)
def test_a_run_without_steps_is_untouched() -> None:
    result = run_agent_sync(model=ScriptedModel("hi"), messages="x")
    assert result.state is TurnState.DONE
    assert [r.dest.value for r in result.trace] == ["AwaitingModel", "Done"]


@pytest.mark.timeout(30)
def test_a_run_with_steps_is_journaled_with_its_declarations_and_replays(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    guard = output_guardrail("refund_limit", _refund_limit)
    with Journal(path) as journal:
        result = run_agent_sync(
            model=ScriptedModel("1000 EUR", "50 EUR"),
            messages="refund",
            steps=[guard],
            engine_factory=partial(JournalingEngine, journal=journal),
        )
    assert result.state is TurnState.DONE
    header = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert header["options"]["table"][0]["name"] == "refund_limit"
    again = replay(path)
    assert again.ok
    assert again.state is TurnState.DONE
    assert tuple(again.messages) == result.messages
    assert [s.value for s in again.states][-2:] == ["RefundLimit", "Done"]


@pytest.mark.timeout(30)
def test_a_journal_whose_steps_break_a_rule_is_refused_naming_the_header(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with Journal(path) as journal:
        run_agent_sync(
            model=ScriptedModel("50 EUR"),
            messages="refund",
            steps=[output_guardrail("refund_limit", _refund_limit)],
            engine_factory=partial(JournalingEngine, journal=journal),
        )
    lines = path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    header["options"]["table"][0]["point"] = "before_model"  # a retry before the model
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    with pytest.raises(JournalError, match="no answer to retry"):
        replay(path)


@pytest.mark.timeout(30)
def test_a_run_with_steps_waits_for_approval_and_resumes_with_them() -> None:
    def ask(call: ToolCall) -> RequireApproval:
        return RequireApproval("refunds need sign-off")

    guard = output_guardrail("refund_limit", _refund_limit)
    agent = Agent(
        ScriptedModel(ToolCall("c1", "lookup", {"order": "7"}), "1000 EUR back", "50 EUR back"),
        tools=[lookup],
        steps=[guard],
        before_tool_call=ask,
    )
    waiting = agent.run_sync("refund order 7")
    assert waiting.state is TurnState.AWAITING_USER
    assert waiting.snapshot is not None
    assert waiting.snapshot["stepRetries"] == {}
    done = agent.resume_sync(json.loads(json.dumps(waiting.snapshot)), approvals={"c1": True})
    assert done.state is TurnState.DONE
    assert done.turns == 3  # the guardrail sent the 1000 EUR answer back once
    assert UserMessage("Refunds above 100 EUR need a person.") in done.messages
    with pytest.raises(SnapshotError, match="written by a run with declared steps"):
        resume_agent_sync(waiting, model=ScriptedModel(), tools=[lookup], approvals={"c1": True})


@pytest.mark.timeout(30)
def test_a_turn_that_a_step_ends_is_timed_and_reported_ended() -> None:
    async def main() -> list[object]:
        guard = output_guardrail("refund_limit", _refund_limit, retries=0)
        run = AgentRun(model=ScriptedModel("1000 EUR"), messages="refund", steps=[guard])
        seen: list[object] = []

        async def watch() -> None:
            async for event in run.events():
                seen.append(event)

        watcher = asyncio.create_task(watch())
        result = await run.run()
        await watcher
        assert result.state.value == "OutputBlocked"
        return seen

    seen = asyncio.run(main())
    assert [type(e).__name__ for e in seen].count("TurnEnded") == 1
    returned = seen[-1]
    assert isinstance(returned, RunReturned)
    assert returned.state.value == "OutputBlocked"
    assert len(returned.stats.turn_seconds) == 1


@pytest.mark.timeout(30)
def test_a_turn_that_a_step_ends_is_timed_when_nobody_listens() -> None:
    guard = output_guardrail("refund_limit", _refund_limit, retries=0)
    run = AgentRun(model=ScriptedModel("1000 EUR"), messages="refund", steps=[guard])
    result = asyncio.run(run.run())
    assert result.state.value == "OutputBlocked"
    assert result.stats is not None
    assert len(result.stats.turn_seconds) == 1
