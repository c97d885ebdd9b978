"""``AgentEngineMachine`` over our engine, and over an engine that breaks I1/I2."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from statemachine import Message, ToolResultMessage
from statemachine.core.engine import Engine
from statemachine.core.steps import End, GoOn, Point, Retry, StepSpec, table_for
from statemachine.core.table import Guard, Table, TurnState
from statemachine.testing.rules import AgentEngineMachine

# Finding the failure is what these tests show; shrinking it would only cost time.
FIND_ONLY = settings(
    max_examples=200, stateful_step_count=30, derandomize=True, phases=[Phase.generate]
)


class EngineMachine(AgentEngineMachine):
    """The default hooks: ``statemachine.Engine``."""


TestEngine = EngineMachine.TestCase
TestEngine.settings = settings(stateful_step_count=30)


class ResultDroppingEngine(AgentEngineMachine):
    """A broken engine as its history shows it: the last tool result goes missing
    whenever two or more are in (a lost update)."""

    def history(self) -> Sequence[Message]:
        history = list(super().history())
        results = [i for i, m in enumerate(history) if isinstance(m, ToolResultMessage)]
        if len(results) >= 2:
            del history[results[-1]]
        return history


def test_the_machine_catches_a_history_that_loses_a_result() -> None:
    with pytest.raises(AssertionError, match=r"rewritten|no result"):
        run_state_machine_as_test(
            ResultDroppingEngine,
            settings=FIND_ONLY,
        )


class OverLimitMachine(AgentEngineMachine):
    """Claims a limit of 1 while the engine it drives allows 3 model calls."""

    def new_engine(self, tools, messages, max_turns):  # type: ignore[no-untyped-def]
        super().new_engine(tools, messages, 3)

    max_turns = 1


def test_the_machine_catches_too_many_model_calls() -> None:
    with pytest.raises(AssertionError, match="model responses with max_turns=1"):
        run_state_machine_as_test(
            OverLimitMachine,
            settings=FIND_ONLY,
        )


REVIEW = StepSpec(
    "review",
    Point.AFTER_FINAL,
    {"ok": GoOn(), "again": Retry(budget=1), "blocked": End("Blocked", "the review blocked it")},
)
TRIPWIRE = StepSpec(
    "tripwire", Point.BEFORE_MODEL, {"ok": GoOn(), "tripped": End("Tripped", "tripped")}
)


class StepsMachine(AgentEngineMachine):
    """The default engine with two declared steps: every outcome of each, in any order."""

    steps = (TRIPWIRE, REVIEW)


TestEngineWithSteps = StepsMachine.TestCase
TestEngineWithSteps.settings = settings(stateful_step_count=30)


class TrippingOverCallsMachine(AgentEngineMachine):
    """A team's broken table: the review also runs on responses with tool calls, so
    its ``blocked`` end leaves their calls unanswered."""

    steps = (REVIEW,)

    def new_engine(self, tools, messages, max_turns):  # type: ignore[no-untyped-def]
        table = table_for(self.steps)
        rows = tuple(
            attrs.evolve(r, dest=REVIEW.state)
            if r.source is TurnState.AWAITING_MODEL and r.guard is Guard.HAS_TOOL_CALLS
            else r
            for r in table.rows
        )
        broken = Table(rows, table.steps)  # built as it is, past check_table
        self.engine = Engine(tools=tools, messages=messages, max_turns=max_turns, table=broken)


def test_the_machine_catches_a_step_end_that_leaves_a_call_unanswered() -> None:
    with pytest.raises(AssertionError, match="no result"):
        run_state_machine_as_test(TrippingOverCallsMachine, settings=FIND_ONLY)
