"""The explanations an engine writes when a run returns to its caller
(``core/explanations.py``): what ended it, in words a person can act on (an aborted
response's own message, the operations the driver abandoned, the last result quoted at
the turn limit)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from engine_support import ECHO

from statemachine.core import explanations
from statemachine.core.engine import ABANDONED, Engine
from statemachine.core.events import (
    AbortRequested,
    ModelCancelled,
    ModelResponded,
    Start,
    ToolCancelled,
    ToolFinished,
)
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    UserMessage,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolOutput

S = TurnState


@pytest.mark.timeout(30)
def test_a_response_reporting_an_abort_explains_itself_with_its_own_message() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    response = AssistantMessage(
        [ToolCall("c1", "echo", {"text": "hi"})],
        stop_reason=StopReason.ABORTED,
        error_message="stream cut by the user",
    )
    engine.handle(ModelResponded(response))
    assert engine.state is S.ABORTED
    assert engine.explanation is not None
    assert "reports that it was aborted: stream cut by the user" in engine.explanation


@pytest.mark.timeout(30)
def test_a_model_call_cancelled_in_time_is_not_reported_abandoned() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    engine.handle(AbortRequested("stop"))
    engine.handle(ModelCancelled())
    assert engine.state is S.ABORTED
    assert engine.explanation is not None
    assert "abandoned" not in engine.explanation
    assert engine.explanation.endswith("and finished its cleanup.")


@pytest.mark.timeout(30)
def test_an_abandoned_model_call_is_named_in_the_explanation() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    engine.handle(AbortRequested("stop"))
    engine.handle(ModelCancelled(f"{ABANDONED}: the client ignored cancellation"))
    assert engine.state is S.ABORTED
    assert engine.explanation is not None
    assert "the driver abandoned the model call" in engine.explanation


@pytest.mark.timeout(30)
def test_an_abandoned_tool_is_named_in_the_explanation() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(AbortRequested("stop"))
    engine.handle(ToolCancelled("c1", f"{ABANDONED}: the tool ignored cancellation"))
    assert engine.state is S.ABORTED
    assert engine.explanation is not None
    assert "the driver abandoned tool echo (call c1)" in engine.explanation


@pytest.mark.timeout(30)
def test_a_long_result_quoted_in_the_turn_limit_explanation_is_cut_to_160_characters() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], max_turns=1)
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c1", ToolOutput("x" * 500)))
    assert engine.state is S.TURN_LIMIT_EXCEEDED
    assert engine.explanation is not None
    assert "x" * 159 + "\u2026" in engine.explanation
    assert "x" * 160 not in engine.explanation
    # a text that fits is quoted whole
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], max_turns=1)
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c1", ToolOutput("y" * 160)))
    assert engine.explanation is not None
    assert "y" * 160 + "\u2026" not in engine.explanation
    assert "y" * 160 in engine.explanation


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It broke", "It broke."),
        ("It broke.", "It broke."),
        ("Is base_url right?", "Is base_url right?"),
        ("Try later!", "Try later!"),
        ("cut\u2026 (9 more characters)", "cut\u2026 (9 more characters)."),
        ("and so on\u2026", "and so on\u2026"),
        ("  spaced.  ", "spaced."),
    ],
)
def test_a_sentence_ends_with_one_mark(text: str, expected: str) -> None:
    assert explanations.sentence(text) == expected


@pytest.mark.parametrize(
    "explain",
    [
        lambda reason: explanations.stopped_by_hook(reason),
        lambda reason: explanations.aborted("while calling the model", reason, ()),
        lambda reason: explanations.failed(reason, reported_by_response=False, turn=1),
        lambda reason: explanations.failed(reason, reported_by_response=True, turn=1),
        lambda reason: explanations.output_invalid(1, 2, reason),
    ],
)
@pytest.mark.parametrize("reason", ["Enough?", "Enough!", "Enough."])
def test_a_reason_and_the_next_sentence_join_with_one_mark(
    explain: Callable[[str], str], reason: str
) -> None:
    text = explain(reason)
    assert reason in text
    for doubled in ("?.", "!.", ".."):
        assert doubled not in text


def test_a_failed_call_says_the_run_did_not_retry_it_and_a_reported_error_that_nothing_did() -> (
    None
):
    raised = explanations.failed(
        "ProviderUnavailableError: HTTP 500. Gave up after 4 attempt(s); try again later.",
        reported_by_response=False,
        turn=2,
    )
    assert "without retrying" not in raised
    assert "the run itself does not retry" in raised
    assert "(turn 2)" in raised
    reported = explanations.failed("content filtered", reported_by_response=True, turn=2)
    assert "The run stopped without retrying (turn 2)" in reported
