"""The sans-IO engine: examples per state, refusals, logging, the cap on internal
transitions, and a stateful fuzz.

The examples drive ``Engine.handle`` by hand and assert on the actions it returns and
on the history it keeps. ``EngineMachine`` is a Hypothesis
``RuleBasedStateMachine`` that fires valid and invalid events at a real engine and
checks the invariants after every step.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs
import pytest
import structlog
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from structlog.testing import capture_logs

import statemachine as sm
import statemachine.engine
import statemachine.errors
import statemachine.messages
from statemachine.core import table as table_module
from statemachine.core.engine import GUARDS, MAX_INTERNAL_TRANSITIONS, Engine, GuardFunction
from statemachine.core.events import AbortRequested, Start
from statemachine.core.invariants import history_violations
from statemachine.core.messages import UserMessage
from statemachine.core.table import Guard, State, Transition, Trigger
from statemachine.errors import ProtocolError
from statemachine.testing._reference import verify_transition

S = sm.TurnState

ECHO = sm.ToolDefinition(
    "echo",
    "echo a text",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)
NOOP = sm.ToolDefinition("noop", "does nothing")
TOOLS = (ECHO, NOOP)
USER = sm.UserMessage("go")


def engine(**kwargs: Any) -> sm.engine.Engine:
    """An engine whose every transition is checked against the reference machine."""
    kwargs.setdefault("tools", TOOLS)
    kwargs.setdefault("messages", [USER])
    kwargs.setdefault("transition_hook", verify_transition)
    return sm.engine.Engine(**kwargs)


def call(call_id: str, tool_name: str = "noop", /, **arguments: Any) -> sm.ToolCall:
    return sm.ToolCall(call_id, tool_name, arguments)


def asks(*calls: sm.ToolCall) -> sm.AssistantMessage:
    return sm.AssistantMessage(calls, stop_reason=sm.messages.StopReason.TOOL_USE)


def ok(text: str = "ok") -> sm.ToolOutput:
    return sm.ToolOutput(text)


def observe(e: sm.engine.Engine) -> tuple[Any, ...]:
    """Everything a caller can observe of an engine."""
    return (
        e.state,
        tuple(e.messages),
        tuple(e.trace),
        e.turns,
        e.explanation,
        e.pending_calls(),
        e.pending_approvals(),
        e.queued_input(),
        e.returns_to_caller,
        e.abort_reason,
    )


def state(e: sm.engine.Engine) -> State:
    # a call, not the property: mypy would otherwise narrow e.state after one assert
    return e.state


def feed(e: sm.engine.Engine, *events: sm.engine.Event) -> list[sm.engine.Action]:
    actions: list[sm.engine.Action] = []
    for event in events:
        actions.extend(e.handle(event))
    return actions


def of_type(actions: Sequence[sm.engine.Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def debug_logger() -> Any:
    # The test configuration filters below WARNING; transition events are DEBUG, so
    # hand the engine its own logger (the supported way) that lets them through.
    return structlog.wrap_logger(None, wrapper_class=structlog.make_filtering_bound_logger(0))


# -- construction ---------------------------------------------------------------------------


@pytest.mark.parametrize("max_turns", [0, -1, True, 1.5, "3"])
def test_max_turns_must_be_a_positive_integer(max_turns: Any) -> None:
    with pytest.raises(sm.InvalidInputError, match="max_turns must be a positive integer"):
        engine(max_turns=max_turns)


def test_an_invalid_history_is_refused_at_construction() -> None:
    with pytest.raises(sm.InvalidInputError, match="has no result"):
        engine(messages=[USER, asks(call("c1")), sm.UserMessage("?")])


def test_a_new_engine_is_ready_and_untouched() -> None:
    e = engine()
    assert state(e) is S.READY
    assert e.turns == 0
    assert e.trace == []
    assert e.explanation is None
    assert list(e.messages) == [USER]
    assert e.tools == TOOLS
    assert not e.returns_to_caller


# -- the happy paths ------------------------------------------------------------------------


def test_start_asks_for_the_first_model_call() -> None:
    e = engine()
    actions = e.handle(sm.engine.Start())
    assert actions == (sm.engine.CallModel([USER], TOOLS, 1),)
    assert state(e) is S.AWAITING_MODEL
    assert e.turns == 1
    assert [(r.source, r.trigger, r.dest, r.turn) for r in e.trace] == [
        (S.READY, sm.engine.Start.trigger, S.AWAITING_MODEL, 0)
    ]


def test_an_answer_without_tool_calls_ends_done() -> None:
    e = engine()
    answer = sm.AssistantMessage("hello", stop_reason=sm.messages.StopReason.TOOL_USE)
    actions = feed(e, sm.engine.Start(), sm.engine.ModelResponded(answer))
    assert state(e) is S.DONE
    assert list(e.messages) == [USER, answer]
    (ended,) = of_type(actions, sm.engine.ReturnToCaller)
    assert ended.state is S.DONE
    assert ended.explanation == e.explanation
    assert e.explanation
    assert e.returns_to_caller


def test_tool_calls_start_and_their_results_go_back_to_the_model() -> None:
    e = engine()
    response = asks(call("c1", "echo", text="a"), call("c2"))
    actions = feed(e, sm.engine.Start(), sm.engine.ModelResponded(response))
    assert state(e) is S.COLLECTING_RESULTS
    assert of_type(actions, sm.engine.StartTool) == [
        sm.engine.StartTool(call("c1", "echo", text="a"), 1),
        sm.engine.StartTool(call("c2"), 1),
    ]
    assert e.pending_calls() == response.tool_calls
    # c2 finishes first: its result waits for c1's (I2)
    assert feed(e, sm.engine.ToolFinished("c2", ok("two"))) == []
    assert list(e.messages) == [USER, response]
    actions = feed(e, sm.engine.ToolFinished("c1", ok("one")))
    assert list(e.messages) == [
        USER,
        response,
        sm.ToolResultMessage("c1", "echo", "one"),
        sm.ToolResultMessage("c2", "noop", "two"),
    ]
    (request,) = of_type(actions, sm.engine.CallModel)
    assert request.turn == 2
    assert list(request.messages) == list(e.messages)
    assert state(e) is S.AWAITING_MODEL
    assert e.turns == 2


def test_unknown_and_invalid_calls_are_answered_without_starting() -> None:
    e = engine()
    response = asks(call("c1", "nope"), call("c2", "echo", text=3), call("c3", "echo", text="x"))
    actions = feed(e, sm.engine.Start(), sm.engine.ModelResponded(response))
    assert of_type(actions, sm.engine.StartTool) == [
        sm.engine.StartTool(call("c3", "echo", text="x"), 1)
    ]
    unknown, invalid = e.messages[2], e.messages[3]
    assert isinstance(unknown, sm.ToolResultMessage)
    assert isinstance(invalid, sm.ToolResultMessage)
    assert unknown.is_error
    assert unknown.text == "Unknown tool: nope. Available tools: echo, noop."
    assert invalid.is_error
    assert "arguments.text: 3 is not of type 'string'" in invalid.text


def test_a_call_whose_arguments_could_not_be_read_never_starts() -> None:
    # NOOP's schema accepts {}: only parse_error keeps the call from running.
    e = engine()
    unreadable = sm.ToolCall("c1", "noop", parse_error="the arguments are not valid JSON: {x")
    actions = feed(e, sm.engine.Start(), sm.engine.ModelResponded(asks(unreadable, call("c2"))))
    assert of_type(actions, sm.engine.StartTool) == [sm.engine.StartTool(call("c2"), 1)]
    result = e.messages[2]
    assert isinstance(result, sm.ToolResultMessage)
    assert result.tool_call_id == "c1"
    assert result.is_error
    assert result.text.startswith(
        "Invalid arguments for tool noop: the arguments are not valid JSON: {x. The tool "
        "was not run. Call it again with a JSON object matching this JSON Schema: "
    )


def test_a_batch_with_only_unknown_calls_goes_straight_back_to_the_model() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    actions = e.handle(sm.engine.ModelResponded(asks(call("c1", "nope"))))
    assert of_type(actions, sm.engine.StartTool) == []
    assert [a.turn for a in of_type(actions, sm.engine.CallModel)] == [2]
    assert state(e) is S.AWAITING_MODEL


def test_the_call_model_snapshot_does_not_grow_with_the_history() -> None:
    e = engine()
    (first,) = e.handle(sm.engine.Start())
    assert isinstance(first, sm.engine.CallModel)
    feed(e, sm.engine.ModelResponded(asks(call("c1"))), sm.engine.ToolFinished("c1", ok()))
    assert len(e.messages) == 3
    assert list(first.messages) == [USER]


def test_the_turn_limit_stops_before_another_model_call() -> None:
    e = engine(max_turns=1)
    actions = feed(
        e,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("c1"))),
        sm.engine.ToolFinished("c1", ok()),
    )
    assert state(e) is S.TURN_LIMIT_EXCEEDED
    assert len(of_type(actions, sm.engine.CallModel)) == 1
    assert e.turns == 1
    assert e.explanation is not None
    assert "max_turns=1" in e.explanation
    assert "tool noop (call c1) returned: ok" in e.explanation
    assert history_violations(e.messages) == []


def test_a_model_failure_ends_failed_with_an_error_message() -> None:
    e = engine()
    feed(e, sm.engine.Start(), sm.engine.ModelFailed("TimeoutError: read timed out"))
    assert state(e) is S.FAILED
    last = e.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.stop_reason is sm.messages.StopReason.ERROR
    assert last.error_message == "The model call failed: TimeoutError: read timed out"
    assert e.explanation is not None
    assert "read timed out" in e.explanation


def test_repeated_and_empty_ids_are_replaced_deterministically() -> None:
    e = engine()
    response = asks(call(""), call("x"), call("x"))
    actions = feed(e, sm.engine.Start(), sm.engine.ModelResponded(response))
    ids = [a.call.id for a in of_type(actions, sm.engine.StartTool)]
    assert ids[1] == "x"
    assert len(set(ids)) == 3
    assert all(ids)
    stored = e.messages[-1]
    assert isinstance(stored, sm.AssistantMessage)
    assert [c.id for c in stored.tool_calls] == ids
    other = engine()
    assert feed(other, sm.engine.Start(), sm.engine.ModelResponded(response)) == actions


def test_a_replacement_id_never_collides_with_one_already_in_the_history() -> None:
    # A resumed session holds ids that an earlier run assigned; the new run starts
    # counting turns again, so its first replacement would collide without a check.
    history: list[sm.Message] = [
        USER,
        asks(call("call_t1_0")),
        sm.ToolResultMessage("call_t1_0", "noop", "ok"),
        sm.AssistantMessage("ok"),
        sm.UserMessage("again"),
    ]
    e = engine(messages=history)
    e.handle(sm.engine.Start())
    actions = e.handle(sm.engine.ModelResponded(asks(call(""), call("call_t1_0"))))
    ids = [a.call.id for a in of_type(actions, sm.engine.StartTool)]
    assert len(set(ids)) == 2
    assert "call_t1_0" not in ids
    assert "" not in ids


@pytest.mark.parametrize(
    ("taken", "assigned"),
    [
        (["call_t1_0"], "call_t1_0_1"),
        (["call_t1_0", "call_t1_0_1"], "call_t1_0_2"),
        (["call_t1_0", "call_t1_0_1", "call_t1_0_2"], "call_t1_0_3"),
    ],
)
def test_a_replacement_id_that_is_taken_gets_the_next_free_suffix(
    taken: list[str], assigned: str
) -> None:
    # The replacement is deterministic: call_t<turn>_<index>, then _1, _2, ... in
    # order until one is free (the same run replays to the same ids).
    history: list[sm.Message] = [USER]
    for taken_id in taken:
        history += [asks(call(taken_id)), sm.ToolResultMessage(taken_id, "noop", "ok")]
    history += [sm.AssistantMessage("ok"), sm.UserMessage("again")]
    e = engine(messages=history)
    e.handle(sm.engine.Start())
    actions = e.handle(sm.engine.ModelResponded(asks(call(""))))
    assert [a.call.id for a in of_type(actions, sm.engine.StartTool)] == [assigned]


def test_the_history_view_is_a_fixed_read_only_snapshot() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    view = e.messages
    e.handle(sm.engine.ModelResponded(asks(call("c1"))))
    assert len(view) == 1
    assert len(e.messages) == 2
    assert view[0] == USER
    assert view[-1] == USER
    assert view[:5] == (USER,)
    assert view == [USER]
    assert view == (USER,)
    assert view != [USER, USER]
    with pytest.raises(IndexError):
        view[1]
    with pytest.raises(IndexError):
        view[-2]
    with pytest.raises(TypeError):
        hash(view)
    assert not hasattr(view, "append")


def test_iterating_a_history_view_gives_its_prefix_even_as_the_history_grows() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    view = e.messages
    started = iter(view)  # made before the history grows, read after
    e.handle(sm.engine.ModelResponded(asks(call("c1"))))
    assert list(started) == [USER]
    assert list(view) == [USER]
    assert tuple(e.messages) == tuple(e.messages[:]) == (USER, e.messages[1])
    assert list(reversed(list(e.messages))) == [e.messages[1], USER]


# -- permissions ----------------------------------------------------------------------------------


def test_permission_flow_with_a_policy_denial() -> None:
    e = engine(check_permissions=True)
    response = asks(call("c1"), call("c2"), call("c3", "nope"))
    actions = feed(e, sm.engine.Start(), sm.engine.ModelResponded(response))
    assert of_type(actions, sm.engine.CheckPermission) == [
        sm.engine.CheckPermission(call("c1"), 1),
        sm.engine.CheckPermission(call("c2"), 1),
    ]
    assert of_type(actions, sm.engine.StartTool) == []
    assert state(e) is S.DISPATCHING_TOOLS
    assert feed(e, sm.engine.ToolPermitted("c1")) == []  # nothing starts until all are resolved
    assert state(e) is S.DISPATCHING_TOOLS
    actions = feed(e, sm.engine.ToolDenied("c2", "writes are off"))
    assert of_type(actions, sm.engine.StartTool) == [sm.engine.StartTool(call("c1"), 1)]
    assert state(e) is S.COLLECTING_RESULTS
    assert len(e.messages) == 2  # c2's result waits for c1's
    actions = feed(e, sm.engine.ToolFinished("c1", ok()))
    assert state(e) is S.AWAITING_USER
    assert of_type(actions, sm.engine.CallModel) == []
    assert [m.text for m in e.messages[2:]] == [
        "ok",
        "Tool call denied: writes are off",
        "Unknown tool: nope. Available tools: echo, noop.",
    ]
    assert e.explanation is not None
    assert "writes are off" in e.explanation
    assert e.returns_to_caller
    assert history_violations(e.messages) == []


def test_an_advisory_denial_goes_back_to_the_model() -> None:
    e = engine(check_permissions=True)
    actions = feed(
        e,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("c1"))),
        sm.engine.ToolDenied("c1", "try echo", advisory=True),
    )
    assert state(e) is S.AWAITING_MODEL
    assert [a.turn for a in of_type(actions, sm.engine.CallModel)] == [1, 2]


def test_without_permission_checks_a_permission_event_is_refused() -> None:
    e = engine()
    feed(e, sm.engine.Start(), sm.engine.ModelResponded(asks(call("c1"))))
    before = observe(e)
    with pytest.raises(sm.errors.ProtocolError):
        e.handle(sm.engine.ToolPermitted("c1"))
    assert observe(e) == before


# -- abort in each live state -------------------------------------------------------------------


def test_abort_when_ready() -> None:
    e = engine()
    actions = e.handle(sm.engine.AbortRequested("never mind"))
    assert state(e) is S.ABORTED
    assert of_type(actions, sm.engine.CallModel) == []
    assert e.explanation is not None
    assert "before the first model call: never mind" in e.explanation


def test_abort_while_awaiting_the_model() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    actions = e.handle(sm.engine.AbortRequested("stop"))
    assert actions == (sm.engine.CancelOperations(True, (), "stop"),)
    assert state(e) is S.ABORTING
    e.handle(sm.engine.ModelCancelled())
    assert state(e) is S.ABORTED
    last = e.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.stop_reason is sm.messages.StopReason.ABORTED
    assert e.explanation is not None
    assert "during the model call of turn 1: stop" in e.explanation


def test_a_late_response_while_aborting_is_kept_and_its_calls_answered() -> None:
    e = engine()
    feed(e, sm.engine.Start(), sm.engine.AbortRequested())
    late = asks(call("c1"))
    e.handle(sm.engine.ModelResponded(late))
    assert state(e) is S.ABORTED
    assert e.messages[1] == late
    result = e.messages[2]
    assert isinstance(result, sm.ToolResultMessage)
    assert result.is_error
    assert result.text.startswith("Tool call not started")
    assert history_violations(e.messages) == []


def test_abort_while_dispatching() -> None:
    e = engine(check_permissions=True)
    feed(
        e,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("c1"), call("c2"))),
        sm.engine.ToolPermitted("c1"),
    )
    actions = e.handle(sm.engine.AbortRequested("stop"))
    assert sm.engine.CancelOperations(False, (), "stop") in actions
    assert state(e) is S.ABORTED  # nothing was running, so nothing to wait for
    texts = [m.text for m in e.messages[2:]]
    assert texts == ["Tool call not started: the run was aborted (stop)"] * 2
    assert history_violations(e.messages) == []


def test_abort_while_collecting_keeps_arrived_results() -> None:
    e = engine()
    feed(e, sm.engine.Start(), sm.engine.ModelResponded(asks(call("c1"), call("c2"), call("c3"))))
    e.handle(sm.engine.ToolFinished("c1", ok("first")))
    actions = e.handle(sm.engine.AbortRequested("stop"))
    assert actions == (sm.engine.CancelOperations(False, ("c2", "c3"), "stop"),)
    assert state(e) is S.ABORTING
    with pytest.raises(sm.errors.ProtocolError):
        e.handle(sm.engine.Start())
    e.handle(sm.engine.ToolFinished("c3", ok("cleaned up")))
    assert state(e) is S.ABORTING
    e.handle(sm.engine.ToolCancelled("c2"))
    assert state(e) is S.ABORTED
    assert [(m.text, m.is_error) for m in e.messages[2:]] == [  # type: ignore[union-attr]
        ("first", False),
        ("Operation aborted: cancelled after the abort grace period", True),
        ("cleaned up", False),
    ]
    assert e.explanation is not None
    assert "while the tool calls of turn 1 were running: stop" in e.explanation


def test_abort_while_awaiting_user() -> None:
    e = engine(check_permissions=True)
    feed(
        e,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("c1"))),
        sm.engine.ToolDenied("c1", "no"),
    )
    assert state(e) is S.AWAITING_USER
    e.handle(sm.engine.AbortRequested("bye"))
    assert state(e) is S.ABORTED
    assert e.explanation is not None
    assert "bye" in e.explanation


def test_a_second_abort_keeps_the_first_reason() -> None:
    e = engine()
    feed(
        e, sm.engine.Start(), sm.engine.AbortRequested("first"), sm.engine.AbortRequested("second")
    )
    assert e.abort_reason == "first"
    e.handle(sm.engine.ModelCancelled())
    assert e.explanation is not None
    assert "first" in e.explanation
    assert "second" not in e.explanation


# -- refusals and absorption --------------------------------------------------------------------


def _collecting() -> sm.engine.Engine:
    e = engine()
    feed(e, sm.engine.Start(), sm.engine.ModelResponded(asks(call("c1"), call("c2"))))
    e.handle(sm.engine.ToolFinished("c1", ok()))
    return e


@pytest.mark.parametrize(
    ("event", "needle"),
    [
        (sm.engine.Start(), "'start' is not accepted in state CollectingResults"),
        (
            sm.engine.ModelResponded(sm.AssistantMessage("x")),
            "not accepted in state CollectingResults",
        ),
        (sm.engine.ToolFinished("c1", ok()), "call 'c1' is not running"),
        (sm.engine.ToolFinished("zz", ok()), "call 'zz' is not running"),
        (sm.engine.ToolCancelled("c2"), "not accepted in state CollectingResults"),
        (sm.engine.ToolPermitted("c2"), "not accepted in state CollectingResults"),
        (sm.engine.ModelCancelled(), "not accepted in state CollectingResults"),
    ],
)
def test_a_refused_event_changes_nothing(event: sm.engine.Event, needle: str) -> None:
    e = _collecting()
    before = observe(e)
    with pytest.raises(sm.errors.ProtocolError) as caught:
        e.handle(event)
    assert needle in str(caught.value)
    assert observe(e) == before
    # and the engine goes on exactly like one that never saw the refused event
    twin = _collecting()
    assert e.handle(sm.engine.ToolFinished("c2", ok())) == twin.handle(
        sm.engine.ToolFinished("c2", ok())
    )
    assert observe(e) == observe(twin)


def test_refusal_names_what_is_accepted() -> None:
    e = engine()
    with pytest.raises(sm.errors.ProtocolError, match=r"accepted here: .*start"):
        e.handle(sm.engine.ToolFinished("c1", ok()))


def test_model_events_without_an_outstanding_call_are_refused() -> None:
    e = engine()
    feed(e, sm.engine.Start(), sm.engine.AbortRequested())
    e.handle(sm.engine.ModelCancelled())
    assert state(e) is S.ABORTED  # terminal: later reports are absorbed, not refused
    e2 = engine()
    feed(
        e2,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("c1"))),
        sm.engine.AbortRequested(),
    )
    before = observe(e2)
    with pytest.raises(sm.errors.ProtocolError, match="no model call is outstanding"):
        e2.handle(sm.engine.ModelResponded(sm.AssistantMessage("late")))
    assert observe(e2) == before


def test_model_cancelled_outside_aborting_is_refused() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    before = observe(e)
    with pytest.raises(sm.errors.ProtocolError, match="not accepted in state AwaitingModel"):
        e.handle(sm.engine.ModelCancelled())
    assert observe(e) == before


@pytest.mark.parametrize("bogus", [object(), "start", sm.engine.CallModel((), (), 1)])
def test_something_that_is_not_an_input_event_is_refused(bogus: Any) -> None:
    e = engine()
    before = observe(e)
    with pytest.raises(sm.errors.ProtocolError, match="not an engine event"):
        e.handle(bogus)
    assert observe(e) == before


def _finished(kind: str) -> sm.engine.Engine:
    e = engine(max_turns=1)
    if kind == "Done":
        feed(e, sm.engine.Start(), sm.engine.ModelResponded(sm.AssistantMessage("bye")))
    elif kind == "Aborted":
        e.handle(sm.engine.AbortRequested())
    elif kind == "Failed":
        feed(e, sm.engine.Start(), sm.engine.ModelFailed("boom"))
    else:
        feed(
            e,
            sm.engine.Start(),
            sm.engine.ModelResponded(asks(call("c1"))),
            sm.engine.ToolFinished("c1", ok()),
        )
    assert e.state.value == kind
    return e


EVERY_EVENT: list[sm.engine.Event] = [
    sm.engine.Start(),
    sm.engine.ModelResponded(asks(call("c9"))),
    sm.engine.ModelFailed("x"),
    sm.engine.ModelCancelled(),
    sm.engine.ToolPermitted("c1"),
    sm.engine.ToolDenied("c1", "no"),
    sm.engine.ToolFinished("c1", ok()),
    sm.engine.ToolCancelled("c1"),
    sm.engine.AbortRequested(),
]


@pytest.mark.parametrize("kind", ["Done", "Aborted", "Failed", "TurnLimitExceeded"])
def test_terminal_states_absorb_every_event(kind: str) -> None:
    e = _finished(kind)
    before = observe(e)
    assert e.explanation
    for event in EVERY_EVENT:
        assert e.handle(event) == ()
        assert observe(e) == before


# -- the turn boundary, approvals and restore: behaviours pinned one by one ---------------------


def test_the_turn_limit_explanation_names_the_last_call_of_the_batch() -> None:
    e = engine(max_turns=1)
    feed(
        e,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("c1"), call("c2"))),
        sm.engine.ToolFinished("c1", ok("first")),
        sm.engine.ToolFinished("c2", ok("second")),
    )
    assert state(e) is S.TURN_LIMIT_EXCEEDED
    assert "Last operation: tool noop (call c2) returned: second." in (e.explanation or "")
    assert "c1" not in (e.explanation or "")


def test_a_policy_denial_wins_over_a_stop_at_the_same_turn_boundary() -> None:
    # The table tries "denied by policy" before "stop requested": a person must see
    # the denial, which a stop would otherwise hide behind a Done.
    e = engine(check_permissions=True, check_continue=True)
    feed(
        e,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("c1"), call("c2"))),
        sm.engine.ToolDenied("c1", "not on this branch"),
        sm.engine.ToolPermitted("c2"),
        sm.engine.ToolFinished("c2", ok()),
    )
    assert state(e) is S.TURN_BOUNDARY
    e.handle(sm.engine.ContinueDecided(True, "budget spent"))
    assert state(e) is S.AWAITING_USER
    assert "denied by policy: not on this branch" in (e.explanation or "")


def test_input_queued_while_should_continue_is_pending_waits_for_the_decision() -> None:
    e = engine(check_continue=True)
    feed(
        e,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("c1"))),
        sm.engine.ToolFinished("c1", ok()),
    )
    assert state(e) is S.TURN_BOUNDARY
    actions = e.handle(sm.engine.InputQueued(sm.UserMessage("also check the tests")))
    assert of_type(actions, sm.engine.CallModel) == []  # the decision is still pending
    assert state(e) is S.TURN_BOUNDARY
    assert [q.message for q in e.queued_input()] == [sm.UserMessage("also check the tests")]
    (request,) = of_type(e.handle(sm.engine.ContinueDecided(False)), sm.engine.CallModel)
    assert request.messages[-1] == sm.UserMessage("also check the tests")
    assert e.queued_input() == ()


def test_input_queued_while_should_continue_is_pending_is_reported_on_a_stop() -> None:
    e = engine(check_continue=True)
    feed(
        e,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("c1"))),
        sm.engine.ToolFinished("c1", ok()),
    )
    e.handle(sm.engine.InputQueued(sm.UserMessage("one more thing")))
    e.handle(sm.engine.ContinueDecided(True, "enough"))
    assert state(e) is S.DONE
    assert [q.message for q in e.queued_input()] == [sm.UserMessage("one more thing")]
    assert sm.UserMessage("one more thing") not in list(e.messages)


def _awaiting_two_approvals() -> sm.engine.Engine:
    e = engine(check_permissions=True)
    feed(
        e,
        sm.engine.Start(),
        sm.engine.ModelResponded(asks(call("a"), call("b"), call("c"))),
        sm.engine.ApprovalRequired("a", "writes"),
        sm.engine.ToolPermitted("b"),
        sm.engine.ApprovalRequired("c", "deletes"),
        sm.engine.ToolFinished("b", ok("b done")),
    )
    assert state(e) is S.AWAITING_USER
    return e


def test_more_than_one_pending_approval_waits_for_every_decision() -> None:
    e = _awaiting_two_approvals()
    assert [(c.id, note) for c, note in e.pending_approvals()] == [
        ("a", "writes"),
        ("c", "deletes"),
    ]
    assert "approve 2 tool call(s): noop (call a): writes; noop (call c): deletes" in (
        e.explanation or ""
    )
    actions = e.handle(sm.engine.ApprovalDecided("c", False, "no"))
    assert state(e) is S.AWAITING_USER  # "a" still waits
    assert of_type(actions, sm.engine.StartTool) == []
    assert [c.id for c, _ in e.pending_approvals()] == ["a"]
    (start,) = of_type(e.handle(sm.engine.ApprovalDecided("a", True)), sm.engine.StartTool)
    assert start.call.id == "a"
    assert state(e) is S.COLLECTING_RESULTS
    e.handle(sm.engine.ToolFinished("a", ok("a done")))
    texts = [m.text for m in e.messages if isinstance(m, sm.ToolResultMessage)]
    assert texts == ["a done", "b done", "Tool call denied by a person: no"]
    assert state(e) is S.AWAITING_MODEL


def test_restore_refuses_assistant_messages_in_queued_input() -> None:
    e = _awaiting_two_approvals()
    good = json.loads(json.dumps(e.snapshot()))
    assert sm.engine.Engine.restore(good).state is S.AWAITING_USER
    for key in ("steer", "followUp"):
        bad = json.loads(json.dumps(good))
        bad[key] = [sm.messages.message_to_dict(sm.AssistantMessage("I queued this myself"))]
        with pytest.raises(
            sm.errors.WireFormatError,
            match=rf"snapshot\.{key}\[0\]: queued input must be a user message",
        ):
            sm.engine.Engine.restore(bad)


# -- determinism and logging ---------------------------------------------------------------------

SCRIPT: list[sm.engine.Event] = [
    sm.engine.Start(),
    sm.engine.ModelResponded(asks(call("a", "echo", text="1"), call("b"), call("", "nope"))),
    sm.engine.ToolFinished("b", ok("B")),
    sm.engine.ToolFinished("a", sm.ToolOutput("A", is_error=True)),
    sm.engine.ModelResponded(asks(call("a"))),
    sm.engine.ToolFinished(
        "call_t2_0", ok()
    ),  # the repeated id "a" was replaced by a deterministic one
    sm.engine.ModelResponded(sm.AssistantMessage("done")),
]


def test_a_lone_call_that_reuses_an_earlier_lone_calls_id_gets_a_fresh_one() -> None:
    e = engine()
    feed(e, sm.engine.Start(), sm.engine.ModelResponded(asks(call("a"))))
    feed(e, sm.engine.ToolFinished("a", ok()))
    started = of_type(feed(e, sm.engine.ModelResponded(asks(call("a")))), sm.engine.StartTool)
    assert [action.call.id for action in started] == ["call_t2_0"]


def test_a_batch_that_reuses_an_earlier_batchs_id_gets_a_fresh_one_for_it() -> None:
    e = engine()
    feed(e, sm.engine.Start(), sm.engine.ModelResponded(asks(call("a"), call("b"))))
    feed(e, sm.engine.ToolFinished("a", ok()), sm.engine.ToolFinished("b", ok()))
    response = sm.engine.ModelResponded(asks(call("c"), call("a")))
    started = of_type(feed(e, response), sm.engine.StartTool)
    assert [action.call.id for action in started] == ["c", "call_t2_1"]


def test_the_same_events_give_the_same_trace_history_and_actions() -> None:
    runs = []
    for _ in range(2):
        e = engine()
        actions = feed(e, *SCRIPT)
        runs.append((actions, observe(e)))
    assert runs[0] == runs[1]
    assert runs[0][1][0] is S.DONE
    assert history_violations(runs[0][1][1]) == []


def test_one_transition_log_event_per_transition() -> None:
    with capture_logs() as logs:
        e = engine(logger=debug_logger(), run_id="r42")
        feed(e, *SCRIPT)
    transitions = [entry for entry in logs if entry["event"] == "transition"]
    assert len(transitions) == len(e.trace)
    for entry, record in zip(transitions, e.trace, strict=True):
        assert entry["run_id"] == "r42"
        assert entry["turn"] == record.turn
        assert entry["from_state"] == record.source.value
        assert entry["to_state"] == record.dest.value
        assert entry["trigger"] == record.trigger.value
    assert [e2["event"] for e2 in logs if e2["event"] == "run_ended"] == ["run_ended"]


def test_the_trace_is_a_connected_path() -> None:
    e = engine()
    feed(e, *SCRIPT)
    assert e.trace[0].source is S.READY
    for before, after in zip(e.trace, e.trace[1:], strict=False):
        assert before.dest is after.source
    assert e.trace[-1].dest is e.state


# -- the stateful fuzz -----------------------------------------------------------------------------

BOGUS_IDS = st.sampled_from(["bogus", "", "no-such-call"])
TEXT = st.text(alphabet="abc ", max_size=6)


STOP_REASONS = st.sampled_from(
    # weighted towards responses that keep the run going; the rest end it
    [sm.messages.StopReason.TOOL_USE] * 4
    + [sm.messages.StopReason.STOP] * 3
    + list(sm.messages.StopReason)
)


@st.composite
def tool_calls(draw: st.DrawFn) -> sm.ToolCall:
    """Mostly valid calls; some to unknown tools, with invalid arguments, or with an
    empty or repeated id."""
    name, arguments = draw(
        st.sampled_from(
            [("echo", {"text": "hi"}), ("noop", {})] * 3
            + [("echo", {"text": 7}), ("echo", {}), ("missing", {})]
        )
    )
    call_id = draw(st.sampled_from(["", "c1", "c2"]) | st.uuids().map(str))
    return sm.ToolCall(call_id, name, arguments)


@st.composite
def responses(draw: st.DrawFn) -> sm.AssistantMessage:
    """Model responses: any stop reason, with or without text, zero to three calls."""
    calls = draw(st.lists(tool_calls(), max_size=3))
    text = draw(st.lists(st.builds(sm.TextContent, TEXT), max_size=1))
    return sm.AssistantMessage((*text, *calls), stop_reason=draw(STOP_REASONS))


outputs = st.builds(sm.ToolOutput, TEXT, is_error=st.booleans())


class EngineMachine(RuleBasedStateMachine):
    """Fires valid and invalid events at a real engine; a twin engine receives only
    the accepted ones, so a refused event that left any trace would show up as a
    difference between the two. The twin is now and then replaced by a copy restored
    from the engine's JSON snapshot, which must then behave exactly the same."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = engine()
        self.twin = engine()
        self.previous: tuple[sm.Message, ...] = ()
        self.running: list[str] = []
        self.asking: list[str] = []
        self.approving: list[str] = []
        self.continue_pending = False
        self.stop_asked = False
        self.model_out = False
        self.model_calls = 0
        self.terminal_view: tuple[Any, ...] | None = None

    @initialize(max_turns=st.integers(1, 4), permissions=st.booleans(), ask=st.booleans())
    def setup(self, max_turns: int, permissions: bool, ask: bool) -> None:
        options = {"max_turns": max_turns, "check_permissions": permissions, "check_continue": ask}
        self.engine = engine(**options)
        self.twin = engine(**options)
        self.previous = tuple(self.engine.messages)

    # -- firing one event, accepted or refused ------------------------------------------------

    def internals(self) -> dict[str, Any] | None:
        # The engine's whole state, private bookkeeping included, where it can be
        # written down (not while an operation is outstanding).
        try:
            return self.engine.snapshot()
        except sm.errors.ProtocolError:
            return None

    def fire(self, event: sm.engine.Event, *, must_refuse: bool = False) -> None:
        before = observe(self.engine)
        before_internals = self.internals()
        try:
            actions = self.engine.handle(event)
        except sm.errors.ProtocolError:
            assert not before[0].is_terminal, "a terminal state must absorb, not refuse"
            assert observe(self.engine) == before, "a refused event changed the engine"
            assert self.internals() == before_internals, "a refused event changed internals"
            return
        assert not (must_refuse and not before[0].is_terminal), f"{event!r} was accepted"
        assert self.twin.handle(event) == actions
        if before[0].is_terminal:
            assert actions == ()
        else:
            self.track(event, actions)

    def track(self, event: sm.engine.Event, actions: Sequence[sm.engine.Action]) -> None:
        if isinstance(
            event, (sm.engine.ModelResponded, sm.engine.ModelFailed, sm.engine.ModelCancelled)
        ):
            self.model_out = False
        if isinstance(event, (sm.engine.ToolFinished, sm.engine.ToolCancelled)):
            self.running.remove(event.call_id)
        if isinstance(
            event, (sm.engine.ToolPermitted, sm.engine.ToolDenied, sm.engine.ApprovalRequired)
        ):
            self.asking.remove(event.call_id)
        if isinstance(event, sm.engine.ApprovalRequired):
            self.approving.append(event.call_id)
        if isinstance(event, sm.engine.ApprovalDecided):
            self.approving.remove(event.call_id)
        if isinstance(event, sm.engine.ContinueDecided):
            self.continue_pending = False
            self.stop_asked = self.stop_asked or event.stop
        for action in actions:
            if isinstance(action, sm.engine.CallModel):
                self.model_out = True
                self.model_calls += 1
                assert action.turn == self.model_calls
                assert list(action.messages) == list(self.engine.messages)
            elif isinstance(action, sm.engine.StartTool):
                self.running.append(action.call.id)
            elif isinstance(action, sm.engine.CheckPermission):
                self.asking.append(action.call.id)
            elif isinstance(action, sm.engine.CheckContinue):
                self.continue_pending = True
            elif isinstance(action, sm.engine.CancelOperations):
                assert set(action.tool_call_ids) == set(self.running)
                assert action.model == self.model_out
            elif isinstance(action, sm.engine.ReturnToCaller):
                assert action.state is self.engine.state
                assert action.explanation == self.engine.explanation
        if self.engine.state.is_terminal:
            self.continue_pending = False
        # calls answered without a report of their own (abort, a response reporting
        # its failure, a person's message instead of a decision) wait for nothing more
        pending = {c.id for c in self.engine.pending_calls()}
        self.asking = [c for c in self.asking if c in pending]
        self.approving = [c for c in self.approving if c in pending]
        self.running = [c for c in self.running if c in pending]

    # -- rules ----------------------------------------------------------------------------------
    # Moving a run forward is one rule that fires an event the current state expects;
    # everything else (abort, a failing model, queued input, late or bogus reports) is
    # another. Hypothesis picks among rules evenly and, per example, may switch some
    # off: with one rule per event kind, switching off ``start`` alone would leave a
    # whole example stuck in Ready.

    def progress_options(self) -> list[str]:
        options = []
        if self.engine.state is S.READY:
            options.append("start")
        if self.model_out:
            options.append("respond")
        if self.asking:
            options.append("permission")
        if self.approving:
            options.append("approval")
        if self.running:
            options.append("finish")
        if self.continue_pending:
            options.append("continue")
        if self.engine.returns_to_caller and not self.engine.pending_calls():
            options.append("resume")
        return options

    @precondition(lambda self: bool(self.progress_options()))
    @rule(data=st.data())
    def progress(self, data: st.DataObject) -> None:
        step = data.draw(st.sampled_from(self.progress_options()))
        if step == "start":
            self.fire(sm.engine.Start())
        elif step == "respond":
            self.fire(sm.engine.ModelResponded(data.draw(responses())))
        elif step == "permission":
            call_id = data.draw(st.sampled_from(self.asking))
            answer = data.draw(st.sampled_from(["permit", "permit", "deny", "advise", "ask"]))
            if answer == "permit":
                self.fire(sm.engine.ToolPermitted(call_id))
            elif answer == "ask":
                self.fire(sm.engine.ApprovalRequired(call_id, "writes a file"))
            else:
                self.fire(sm.engine.ToolDenied(call_id, "policy", advisory=answer == "advise"))
        elif step == "approval":
            call_id = data.draw(st.sampled_from(self.approving))
            approved = data.draw(st.booleans())
            self.fire(sm.engine.ApprovalDecided(call_id, approved, "" if approved else "not now"))
        elif step == "finish":
            call_id = data.draw(st.sampled_from(self.running))
            self.fire(sm.engine.ToolFinished(call_id, data.draw(outputs)))
        elif step == "continue":
            self.fire(sm.engine.ContinueDecided(data.draw(st.booleans()), data.draw(TEXT)))
        else:
            self.resume(data.draw(TEXT))

    def resume(self, text: str) -> None:
        # A finished run's history, with a new user message, must be valid input for
        # the next run: what a session that goes on after Done, a denial or an abort does.
        history = [*self.engine.messages, sm.UserMessage(text)]
        options = {
            "max_turns": self.engine.max_turns,
            "check_permissions": self.engine.check_permissions,
            "check_continue": self.engine.check_continue,
        }
        self.engine = engine(messages=history, **options)
        self.twin = engine(messages=history, **options)
        self.model_calls = 0
        self.running, self.asking, self.approving = [], [], []
        self.model_out = self.continue_pending = self.stop_asked = False
        self.terminal_view = None

    @precondition(lambda self: not self.model_out and not self.running)
    @rule()
    def restore_the_twin_from_a_snapshot(self) -> None:
        data = self.engine.snapshot()
        restored = sm.engine.Engine.restore(json.loads(json.dumps(data)))
        assert observe(restored) == observe(self.engine)
        assert restored.snapshot() == data
        self.twin = restored

    @rule(
        kind=st.sampled_from(
            [
                "abort",
                "start",
                "model_responded",
                "model_failed",
                "model_cancelled",
                "tool_cancelled",
                "continue_decided",
                "input",
                "bogus",
            ]
        ),
        data=st.data(),
        text=TEXT,
    )
    def disturb(self, kind: str, data: st.DataObject, text: str) -> None:
        # Valid in some states and refused in others (the engine must get both right),
        # or, for "bogus", about a call that does not exist: always refused.
        if kind == "abort":
            self.fire(sm.engine.AbortRequested(text))
        elif kind == "start":
            self.fire(sm.engine.Start())
        elif kind == "model_responded":
            self.fire(sm.engine.ModelResponded(data.draw(responses())))
        elif kind == "model_failed":
            self.fire(sm.engine.ModelFailed(text))
        elif kind == "model_cancelled":
            self.fire(sm.engine.ModelCancelled(text))
        elif kind == "tool_cancelled":
            ids = [*self.running, "c1", "bogus"]
            self.fire(sm.engine.ToolCancelled(data.draw(st.sampled_from(ids)), text))
        elif kind == "continue_decided":
            self.fire(sm.engine.ContinueDecided(data.draw(st.booleans()), text))
        elif kind == "input":
            self.fire(
                sm.engine.InputQueued(
                    sm.UserMessage(text), data.draw(st.sampled_from(sm.engine.InputKind))
                )
            )
        else:
            call_id = data.draw(BOGUS_IDS)
            bogus: list[sm.engine.Event] = [
                sm.engine.ToolFinished(call_id, data.draw(outputs)),
                sm.engine.ToolCancelled(call_id),
                sm.engine.ToolPermitted(call_id),
                sm.engine.ToolDenied(call_id, "no"),
                sm.engine.ApprovalRequired(call_id),
                sm.engine.ApprovalDecided(call_id, data.draw(st.booleans())),
            ]
            self.fire(data.draw(st.sampled_from(bogus)), must_refuse=True)

    # -- invariants after every step -------------------------------------------------------------

    @invariant()
    def history_pairs_and_orders(self) -> None:
        e = self.engine
        open_tail = bool(e.pending_calls()) and not e.state.is_terminal
        violations = history_violations(e.messages, allow_open_tail=open_tail)
        assert violations == [], "; ".join(map(str, violations))

    @invariant()
    def history_is_append_only(self) -> None:
        now = tuple(self.engine.messages)
        assert now[: len(self.previous)] == self.previous
        self.previous = now

    @invariant()
    def twin_agrees(self) -> None:
        assert observe(self.engine) == observe(self.twin)

    @invariant()
    def turns_within_limit(self) -> None:
        assert self.engine.turns <= self.engine.max_turns, "I7: more model calls than max_turns"
        assert self.engine.turns == self.model_calls

    @invariant()
    def trace_is_connected(self) -> None:
        trace = self.engine.trace
        if trace:
            assert trace[0].source is S.READY
            assert trace[-1].dest is self.engine.state
        for before, after in itertools.pairwise(trace):
            assert before.dest is after.source

    @invariant()
    def terminal_states_absorb_and_explain(self) -> None:
        e = self.engine
        if not e.state.is_terminal:
            assert self.terminal_view is None
            return
        assert e.explanation
        now = observe(e)
        if self.terminal_view is None:
            self.terminal_view = now
        assert now == self.terminal_view
        violations = history_violations(e.messages)  # nothing may be left open at the end
        assert violations == [], "; ".join(map(str, violations))
        assert e.pending_calls() == ()

    @invariant()
    def endings_match_the_history(self) -> None:
        e = self.engine
        last = next(
            (m for m in reversed(tuple(e.messages)) if isinstance(m, sm.AssistantMessage)), None
        )
        if e.state is S.DONE and not self.stop_asked:
            assert isinstance(last, sm.AssistantMessage)
            assert last.tool_calls == (), "I3: Done, yet the last response asks for tools"
            assert e.messages[-1] is last
            assert e.queued_input() == (), "I3: Done with input still queued"
        if e.state is S.FAILED:
            assert isinstance(last, sm.AssistantMessage)
            assert last.stop_reason is sm.messages.StopReason.ERROR
        if e.state is S.TURN_LIMIT_EXCEEDED:
            assert e.turns == e.max_turns


TestEngineMachine = EngineMachine.TestCase


_check_payload = sm.engine.Engine._check_payload


def _marking_check(self: sm.engine.Engine, event: sm.engine.Event) -> None:
    try:
        _check_payload(self, event)
    except sm.errors.ProtocolError:
        self._run.abort_reason = "left behind by a refused event"
        raise


def _broken(guard: Guard, value: bool) -> Mapping[Guard, GuardFunction]:
    """The engine's guards, with ``guard`` always ``value``."""
    return {**GUARDS, guard: lambda run: value}


BROKEN_ENGINES = [
    # the classic "text only" loop: tool calls never decide anything
    ("statemachine.core.engine.Engine.guards", _broken(Guard.HAS_TOOL_CALLS, False), "I3"),
    # no safety valve: the turn limit never holds
    ("statemachine.core.engine.Engine.guards", _broken(Guard.TURN_LIMIT_REACHED, False), "I7"),
    # finished runs that still react to late events
    ("statemachine.core.engine.ABSORBING", frozenset(), "absorb"),
    # a refusal that leaves a mark behind (I8)
    ("statemachine.core.engine.Engine._check_payload", _marking_check, "a refused event changed"),
]


@pytest.mark.parametrize(
    ("target", "value", "caught_by"),
    BROKEN_ENGINES,
    ids=["ignores-tool-calls", "no-turn-limit", "not-absorbing", "refusal-leaves-a-mark"],
)
def test_the_fuzz_can_catch_a_broken_engine(
    monkeypatch: pytest.MonkeyPatch, target: str, value: object, caught_by: str
) -> None:
    # The stateful check must be able to fail: each deliberately broken engine is
    # caught, and by the invariant meant to catch it.
    monkeypatch.setattr(target, value)
    # Only detection matters here: no shrinking, no example database, and a fixed
    # seed with room to search, so that the check does not depend on luck.
    quick = settings(phases=[Phase.generate], database=None, derandomize=True, max_examples=500)
    with pytest.raises(AssertionError, match=caught_by):
        run_state_machine_as_test(EngineMachine, settings=quick)


def test_the_engine_leaves_the_logging_configuration_alone() -> None:
    # A library never configures structlog or stdlib logging: the application does.
    before = dict(structlog.get_config())
    processors = list(before["processors"])
    handlers = list(logging.getLogger("statemachine").handlers)
    with capture_logs() as logs:
        e = engine()
        feed(e, *SCRIPT)
    assert dict(structlog.get_config()) == before
    assert list(structlog.get_config()["processors"]) == processors
    assert logging.getLogger("statemachine").handlers == handlers
    # a normal run warns only about what deserves it: here, the replaced id
    assert [x["event"] for x in logs if x.get("log_level") == "warning"] == [
        "tool_call_id_normalised",
        "tool_call_id_normalised",
    ]


# -- the cap on internal transitions ------------------------------------------------------------


def _install_row(monkeypatch: pytest.MonkeyPatch, row: Transition) -> None:
    """Make ``row`` the only row of its (source, trigger) in the table the engine reads."""
    group = (row.source, row.trigger)
    kept = tuple(r for r in table_module.TRANSITIONS if (r.source, r.trigger) != group)
    monkeypatch.setattr(table_module, "_BY_SOURCE", table_module.index((*kept, row)))


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "dest",
    [
        S.TURN_BOUNDARY,  # next_turn loops on itself: a broken table row
        S.DISPATCHING_TOOLS,  # next_turn re-enters dispatching: a cycle of three
    ],
)
def test_internal_transitions_that_never_settle_raise_with_the_trace(
    monkeypatch: pytest.MonkeyPatch, dest: sm.TurnState
) -> None:
    _install_row(monkeypatch, Transition(S.TURN_BOUNDARY, Trigger.NEXT_TURN, dest, None, "broken"))
    e = engine(transition_hook=None)  # the table is broken: no reference to agree with
    feed(e, sm.engine.Start(), sm.engine.ModelResponded(asks(call("p"))))
    with pytest.raises(sm.errors.EngineInvariantError, match="do not settle") as info:
        e.handle(sm.engine.ToolFinished("p", ok()))
    trace = info.value.trace
    assert len(trace) == MAX_INTERNAL_TRANSITIONS + 1
    # the message shows the last six transitions, the whole loop is in .trace
    assert str(info.value).count("->") == 6
    assert trace[0].trigger is Trigger.TOOL_FINISHED
    assert all(
        r.trigger in (Trigger.NEXT_TURN, Trigger.DISPATCHED, Trigger.RESULTS_COMPLETE)
        for r in trace[1:]
    )
    assert isinstance(info.value, sm.StateMachineError)


class _AlwaysSettling(sm.engine.Engine):
    guards = _broken(Guard.NOTHING_OUTSTANDING, True)


@pytest.mark.timeout(10)
def test_a_guard_that_always_holds_is_caught_by_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # settled moves Aborting to Aborted; patched to stay, with its guard always true
    _install_row(
        monkeypatch,
        Transition(S.ABORTING, Trigger.SETTLED, S.ABORTING, Guard.NOTHING_OUTSTANDING, "stay"),
    )
    e = _AlwaysSettling(tools=TOOLS, messages=[USER])
    e.handle(sm.engine.Start())
    with pytest.raises(sm.errors.EngineInvariantError) as info:
        e.handle(sm.engine.AbortRequested("stop"))
    assert {r.trigger for r in info.value.trace[1:]} == {Trigger.SETTLED}


def test_a_normal_run_stays_far_below_the_cap() -> None:
    e = engine()
    feed(e, sm.engine.Start(), sm.engine.ModelResponded(asks(call("p"), call("q"))))
    e.handle(sm.engine.ToolFinished("p", ok()))
    before = len(e.trace)
    e.handle(sm.engine.ToolFinished("q", ok()))
    assert len(e.trace) - before == 3  # the input, results_complete, next_turn


class _LateAbort(AbortRequested):
    """A subclass of an engine event: not in the engine's table of event classes."""


@attrs.frozen
class _InternalTrigger:
    trigger: ClassVar[Trigger] = Trigger.DISPATCHED


@pytest.mark.timeout(30)
def test_events_outside_the_event_classes_are_judged_by_their_trigger() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    with pytest.raises(ProtocolError, match="not an engine event"):
        engine.handle(_InternalTrigger())  # type: ignore[arg-type]
    before = engine.state
    engine.handle(_LateAbort("stop"))
    assert (before, engine.state) == (S.AWAITING_MODEL, S.ABORTING)


def test_returns_to_caller_holds_where_a_driver_returns_and_is_finished_is_its_alias() -> None:
    e = engine(check_permissions=True)
    feed(e, sm.engine.Start(), sm.engine.ModelResponded(asks(call("c1"))))
    assert not e.returns_to_caller
    e.handle(sm.engine.ApprovalRequired("c1", "a person decides"))
    assert e.state is S.AWAITING_USER
    assert e.returns_to_caller  # a run resumes from here: not finished
    assert not e.state.is_terminal
    with pytest.warns(DeprecationWarning, match="use Engine.returns_to_caller"):
        assert e.is_finished is e.returns_to_caller
