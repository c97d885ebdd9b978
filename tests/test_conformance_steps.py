"""The conformance kit on an agent with steps: ``expected_run`` follows what the
steps answered through their declarations, and a loop that ignores an answer fails."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest

from statemachine import Message, TurnState
from statemachine.core.engine import Engine
from statemachine.core.events import Action, Event, StepDecided
from statemachine.steps import Decision, End, GoOn, Retry, Step
from statemachine.testing import (
    ModelTurn,
    Scenario,
    ScriptedCall,
    agent_loop,
    check_record,
    expected_run,
    run_conformance,
    run_scenario,
)
from statemachine.testing.scenario import AgentLoop

pytestmark = pytest.mark.timeout(30)


def _answers(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if m.role == "assistant")


def review_function(messages: Sequence[Message]) -> Decision | str:
    """Sends the first answer back, takes the second, rejects the third: every
    destination of an after_final step, chosen from the history alone."""
    answers = _answers(messages) % 3
    if answers == 1:
        return Decision("again", "say it once more")
    return "ok" if answers == 2 else "reject"


REVIEW = Step(
    "review",
    "after_final",
    {
        "ok": GoOn(),
        "again": Retry(budget=1, then="reject"),
        "reject": End("Rejected", "the review rejected the answer"),
    },
    review_function,
)


def gate_function(messages: Sequence[Message]) -> str:
    return "blocked" if len(messages) > 4 else "fine"


GATE = Step(
    "gate",
    "before_model",
    {"fine": GoOn(), "blocked": End("Blocked", "the history grew too long")},
    gate_function,
)

TOOL_TURN = ModelTurn(calls=(ScriptedCall("alpha"),))


# -- the prediction, from the scenario and the answers ------------------------------------


def test_a_retry_within_its_budget_costs_one_more_model_call() -> None:
    expected = expected_run(
        Scenario(turns=()), [REVIEW.spec], [("review", "again"), ("review", "ok")]
    )
    assert (expected.model_calls, expected.state) == (2, TurnState.DONE)


def test_a_retry_at_the_turn_limit_ends_the_run_at_the_limit() -> None:
    expected = expected_run(Scenario(turns=(), max_turns=1), [REVIEW.spec], [("review", "again")])
    assert (expected.model_calls, expected.state) == (1, TurnState.TURN_LIMIT_EXCEEDED)
    assert "back to the model at the limit max_turns=1" in expected.reason


def test_a_spent_retry_leads_as_its_then_outcome() -> None:
    answers = [("review", "again"), ("review", "again")]
    expected = expected_run(Scenario(turns=()), [REVIEW.spec], answers)
    assert expected.model_calls == 2
    assert str(expected.state) == "Rejected"
    assert expected.state.is_terminal
    assert "retries spent" in expected.reason


def test_a_before_model_end_stops_the_run_before_the_model_call() -> None:
    answers = [("gate", "fine"), ("gate", "blocked")]
    expected = expected_run(Scenario(turns=(TOOL_TURN,)), [GATE.spec], answers)
    assert (expected.model_calls, str(expected.state)) == (1, "Blocked")
    assert expected.reason.startswith("the step gate answered 'blocked' before model call 2")


def test_a_step_that_never_answered_where_the_table_runs_it_is_expected_there() -> None:
    expected = expected_run(Scenario(turns=()), [GATE.spec], [])
    assert (expected.model_calls, expected.state) == (0, GATE.spec.state)
    assert "answered nothing there" in expected.reason


def test_answers_the_table_never_asks_for_are_reported() -> None:
    expected = expected_run(Scenario(turns=()), [GATE.spec], [("gate", "fine")] * 3)
    assert expected.state is TurnState.DONE
    assert expected.unasked == (
        "the step gate answered 2 time(s) more than the table runs it "
        "(first unasked answer: 'fine')",
    )


# -- a real agent with steps, and loops that ignore what the steps answered -----------------


def test_an_agent_with_steps_that_retry_and_end_conforms() -> None:
    loop = agent_loop(steps=[GATE, REVIEW])
    report = run_conformance(loop, max_examples=60, seed=3)
    assert report.passed, report.summary()
    # The scenarios reach every destination: a retry, an end of each step, Done.
    ends = {
        str(run_scenario(loop, scenario).result.state)  # type: ignore[union-attr]
        for scenario in (
            Scenario(turns=()),
            Scenario(turns=(), max_turns=1),
            Scenario(turns=(TOOL_TURN, TOOL_TURN)),
        )
    }
    assert ends == {"Done", "TurnLimitExceeded", "Blocked"}
    retried = run_scenario(agent_loop(steps=[REVIEW]), Scenario(turns=(ModelTurn(text="a"),) * 3))
    assert str(retried.result.state) == "Done"  # type: ignore[union-attr]
    assert retried.decisions == (("review", "again"), ("review", "ok"))
    assert check_record(retried) == {}


class RetryTakenAsGoOn(Engine):
    """A broken loop: the engine goes on where the step asked for a retry."""

    def handle(self, event: Event) -> tuple[Action, ...]:
        if isinstance(event, StepDecided) and event.outcome == "again":
            event = StepDecided(event.step, "ok", "")
        return super().handle(event)


def ends_done_where_a_step_ended(inner: AgentLoop) -> AgentLoop:
    """A broken loop: it reports Done whatever end a step chose."""

    async def loop(**options: Any) -> Any:
        result = await inner(**options)
        if isinstance(result.state, TurnState):
            return result
        return attrs.evolve(result, state=TurnState.DONE, error=None, explanation="done")

    return loop


def test_a_loop_that_takes_a_retry_as_going_on_is_caught() -> None:
    loop = agent_loop(steps=[REVIEW], engine_factory=RetryTakenAsGoOn)
    record = run_scenario(loop, Scenario(turns=()))
    assert record.decisions == (("review", "again"),)
    assert check_record(record) == {
        "I3": [
            "the loop stopped after 1 model call(s); with what its steps answered, a correct "
            "loop makes 2 (the step review runs after the answer of model call 2, but it "
            "answered nothing there)"
        ],
        "I4": [
            "the run ended Done, but it should go on to its step in Review (the step review "
            "runs after the answer of model call 2, but it answered nothing there)"
        ],
    }
    report = run_conformance(loop, max_examples=30, seed=3)
    assert [f.property for f in report.failures] == ["I4", "I7"]
    assert report.failures[0].problems == (
        "the run ended Done, but it should end TurnLimitExceeded (the step review answered "
        "'again' after the answer of model call 1: back to the model at the limit max_turns=1)",
    )


def test_a_loop_that_ends_done_where_a_step_ended_the_run_is_caught() -> None:
    loop = ends_done_where_a_step_ended(agent_loop(steps=[GATE]))
    record = run_scenario(loop, Scenario(turns=(TOOL_TURN, TOOL_TURN)))
    assert record.decisions == (("gate", "fine"), ("gate", "fine"), ("gate", "blocked"))
    assert check_record(record)["I4"] == [
        "the run ended Done, but it should end Blocked (the step gate answered 'blocked' "
        "before model call 3: the history grew too long)"
    ]
    report = run_conformance(loop, max_examples=30, seed=3)
    assert [f.property for f in report.failures] == ["I4"]
