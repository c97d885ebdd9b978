"""The input queue (``core/queue.py``) as the engine uses it: steering enters the
history once, at the next model call; follow-ups wait until the model would finish;
a person's message after a policy denial goes on with the run (rule 6 of the table)."""

from __future__ import annotations

import pytest
from engine_support import ECHO, denied_engine

from statemachine.core.engine import Engine
from statemachine.core.events import (
    CallModel,
    InputKind,
    InputQueued,
    ModelResponded,
    Start,
    ToolFinished,
)
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    UserMessage,
)
from statemachine.core.table import TurnState
from statemachine.core.tools import ToolOutput

S = TurnState


@pytest.mark.timeout(30)
def test_a_message_after_a_policy_denial_resumes_the_run() -> None:
    engine = denied_engine()
    actions = engine.handle(InputQueued(UserMessage("fine, use another tool")))
    assert engine.state is S.AWAITING_MODEL
    assert [type(a) for a in actions] == [CallModel]
    assert engine.messages[-1] == UserMessage("fine, use another tool")
    assert engine.turns == 2


@pytest.mark.timeout(30)
def test_a_steering_message_enters_the_history_once() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], max_turns=4)
    engine.handle(Start())
    engine.handle(InputQueued(UserMessage("also run the tests")))
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c1", ToolOutput("hi")))
    assert engine.state is S.AWAITING_MODEL
    call2 = ToolCall("c2", "echo", {"text": "again"})
    engine.handle(ModelResponded(AssistantMessage([call2], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c2", ToolOutput("again")))
    steering = [m for m in engine.messages if m == UserMessage("also run the tests")]
    assert len(steering) == 1
    assert engine.queued_input() == ()


@pytest.mark.timeout(30)
def test_a_follow_up_queued_before_the_start_waits_for_the_model_to_finish() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(InputQueued(UserMessage("and then this"), InputKind.FOLLOW_UP))
    engine.handle(Start())
    assert engine.messages == (UserMessage("go"),)
    assert [q.message for q in engine.queued_input()] == [UserMessage("and then this")]


def test_a_follow_up_waits_for_the_answer_to_a_continued_conversation() -> None:
    # A run that continues a conversation starts on a user message after the model's
    # last answer: the model has not answered it yet, so a follow-up queued before the
    # start waits for that answer, as on a run's first message.
    history: list[Message] = [UserMessage("hi"), AssistantMessage("hello"), UserMessage("next")]
    engine = Engine(tools=[ECHO], messages=history)
    engine.handle(InputQueued(UserMessage("and then this"), InputKind.FOLLOW_UP))
    engine.handle(Start())
    assert engine.messages == tuple(history)
    assert [q.message for q in engine.queued_input()] == [UserMessage("and then this")]
    # The model answers without a tool call: it would finish, so the follow-up goes in.
    actions = engine.handle(ModelResponded(AssistantMessage("answered")))
    assert any(isinstance(a, CallModel) for a in actions)
    assert engine.messages[-2:] == (AssistantMessage("answered"), UserMessage("and then this"))
    assert engine.queued_input() == ()


@pytest.mark.timeout(30)
def test_input_queued_in_one_run_never_shows_in_a_run_that_queued_none() -> None:
    # Runs that queued nothing share one empty queue; a run queues into its own.
    quiet = Engine(tools=[ECHO], messages=[UserMessage("go")])
    steered = Engine(tools=[ECHO], messages=[UserMessage("go")])
    steered.handle(Start())
    fork = steered.fork()
    steered.handle(InputQueued(UserMessage("steer")))
    steered.handle(InputQueued(UserMessage("later"), InputKind.FOLLOW_UP))
    assert [q.message for q in steered.queued_input()] == [
        UserMessage("steer"),
        UserMessage("later"),
    ]
    assert (
        quiet.queued_input(),
        fork.queued_input(),
        Engine(tools=[ECHO], messages=[UserMessage("go")]).queued_input(),
    ) == ((), (), ())
    fork.handle(InputQueued(UserMessage("fork's own")))
    assert [q.message for q in steered.queued_input()] == [
        UserMessage("steer"),
        UserMessage("later"),
    ]
    assert quiet.queued_input() == ()
