"""The error hierarchy: misuse, bad output and run endings stay distinguishable."""

from __future__ import annotations

import asyncio

import pytest

import statemachine as sm
import statemachine.errors
import statemachine.messages
from statemachine.testing import FunctionModel


@pytest.mark.parametrize(
    ("error", "bases"),
    [
        (sm.UsageError, (sm.StateMachineError,)),
        (sm.errors.ProtocolError, (sm.UsageError,)),
        (sm.InvalidInputError, (sm.UsageError, ValueError)),
        (sm.errors.WireFormatError, (sm.InvalidInputError, ValueError)),
        (sm.errors.BadOutputError, (sm.StateMachineError,)),
        (sm.errors.ModelOutputError, (sm.errors.BadOutputError,)),
        (sm.errors.ToolOutputError, (sm.errors.BadOutputError,)),
        (sm.errors.RunEndedError, (sm.StateMachineError,)),
        (sm.AbortedError, (sm.errors.RunEndedError,)),
        (sm.TurnLimitExceededError, (sm.errors.RunEndedError,)),
        (sm.ModelFailedError, (sm.errors.RunEndedError,)),
        (sm.errors.AwaitingUserError, (sm.errors.RunEndedError,)),
    ],
)
def test_hierarchy(error: type[Exception], bases: tuple[type[Exception], ...]) -> None:
    for base in bases:
        assert issubclass(error, base)


def test_the_three_families_do_not_overlap() -> None:
    families = (sm.UsageError, sm.errors.BadOutputError, sm.errors.RunEndedError)
    for i, a in enumerate(families):
        for b in families[i + 1 :]:
            assert not issubclass(a, b)
            assert not issubclass(b, a)


def test_a_protocol_error_is_not_a_value_error() -> None:
    # Only input refused before a run is a ValueError; a refused event is misuse of
    # a running engine, and catching ValueError must not hide it.
    assert not issubclass(sm.errors.ProtocolError, ValueError)


def _run(message: sm.AssistantMessage, max_turns: int = 1) -> sm.RunResult:
    async def noop() -> str:
        return "ok"

    return asyncio.run(
        sm.run_agent(
            model=FunctionModel(lambda messages, tools: message),
            tools=[sm.tool(noop)],
            messages=[sm.UserMessage("go")],
            max_turns=max_turns,
        )
    )


def test_raise_for_state_returns_the_result_when_done() -> None:
    result = _run(sm.AssistantMessage("done"))
    assert result.error is None
    assert result.raise_for_state() is result


@pytest.mark.parametrize(
    ("message", "state", "error"),
    [
        (
            sm.AssistantMessage((sm.ToolCall("c1", "noop", {}),)),
            sm.TurnState.TurnLimitExceeded,
            sm.TurnLimitExceededError,
        ),
        (
            sm.AssistantMessage(
                "x", stop_reason=sm.messages.StopReason.ERROR, error_message="overloaded"
            ),
            sm.TurnState.Failed,
            sm.ModelFailedError,
        ),
        (
            sm.AssistantMessage("x", stop_reason=sm.messages.StopReason.ABORTED),
            sm.TurnState.Aborted,
            sm.AbortedError,
        ),
    ],
)
def test_each_ending_carries_its_error_and_raise_for_state_raises_it(
    message: sm.AssistantMessage, state: sm.TurnState, error: type[sm.errors.RunEndedError]
) -> None:
    result = _run(message)
    assert result.state is state
    assert type(result.error) is error
    assert str(result.error) == result.explanation
    assert result.explanation
    with pytest.raises(error) as caught:
        result.raise_for_state()
    assert caught.value is result.error
