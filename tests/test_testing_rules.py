"""``AgentEngineMachine`` over our engine, and over an engine that breaks I1/I2."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from statemachine import Message, ToolResultMessage
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
