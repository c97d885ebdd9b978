"""Tests written for mutants of the engine, the table and the driver that outlived the suite
(``bench/mutate.py``; each gap is listed in ``bench/mutation.md``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import ClassVar, TypeVar

import attrs
import pytest
from structlog.testing import capture_logs

from statemachine.core import state
from statemachine.core.engine import ABANDONED, Engine
from statemachine.core.errors import (
    InvalidInputError,
    ProtocolError,
    SnapshotError,
    WireFormatError,
)
from statemachine.core.events import (
    AbortRequested,
    ApprovalRequired,
    CallModel,
    CheckPermission,
    InputKind,
    InputQueued,
    ModelCancelled,
    ModelResponded,
    RunEnded,
    Start,
    StartTool,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import INTERNAL_TRIGGERS, TRANSITIONS, Trigger, TurnState
from statemachine.core.tools import Scheduling, ToolDefinition, ToolOutput

_T = TypeVar("_T")

S = TurnState
ECHO = ToolDefinition(
    "echo",
    "Repeat the text back.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


def _denied_engine() -> Engine:
    """An engine stopped in AwaitingUser by a policy denial."""
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    actions = engine.handle(ToolDenied("c1", "not on weekends"))
    assert engine.state is S.AwaitingUser
    assert any(isinstance(a, RunEnded) for a in actions)
    return engine


@pytest.mark.timeout(30)
def test_a_message_after_a_policy_denial_resumes_the_run() -> None:
    # Gap: the denial was never forgotten, so a person's answer led straight back to
    # AwaitingUser and the run could never go on.
    engine = _denied_engine()
    actions = engine.handle(InputQueued(UserMessage("fine, use another tool")))
    assert engine.state is S.AwaitingModel
    assert [type(a) for a in actions] == [CallModel]
    assert engine.messages[-1] == UserMessage("fine, use another tool")
    assert engine.turns == 2


@pytest.mark.timeout(30)
def test_the_lone_internal_rows_carry_their_firing_guard() -> None:
    # The table's docstring: the lone rows of dispatched and settled carry the guard
    # that fires them, so the diagrams can show it. (Without it the engine behaves the
    # same, because it fires them only when the guard holds; the drawing does not.)
    for trigger in (Trigger.dispatched, Trigger.settled):
        rows = [r for r in TRANSITIONS if r.trigger is trigger]
        assert len(rows) == 1, trigger
        assert rows[0].guard is INTERNAL_TRIGGERS[trigger], trigger


@pytest.mark.timeout(30)
def test_calls_after_one_with_unreadable_arguments_are_still_checked() -> None:
    # Gap: resolving a call whose arguments could not be parsed stopped the checks of
    # the batch, so a later call to an unknown tool was started as if it were valid.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [
        ToolCall("c1", "echo", {}, parse_error="Expecting value: line 1 column 9"),
        ToolCall("c2", "no_such_tool", {"text": "hi"}),
        ToolCall("c3", "echo", {"text": "hi"}),
    ]
    actions = engine.handle(
        ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE))
    )
    # Only the valid call is asked about; the other two are answered with errors.
    assert [a.call.id for a in actions if isinstance(a, CheckPermission)] == ["c3"]
    assert [c.id for c in engine.pending_calls()] == ["c3"]
    results = [m for m in engine.messages if isinstance(m, ToolResultMessage)]
    assert [(r.tool_call_id, r.is_error) for r in results] == [("c1", True), ("c2", True)]
    assert "Unknown tool: no_such_tool" in results[1].text


@pytest.mark.timeout(30)
def test_a_response_reporting_an_abort_explains_itself_with_its_own_message() -> None:
    # Gap: the aborted response's own error message could be dropped from the
    # explanation without any test noticing.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    response = AssistantMessage(
        [ToolCall("c1", "echo", {"text": "hi"})],
        stop_reason=StopReason.ABORTED,
        error_message="stream cut by the user",
    )
    engine.handle(ModelResponded(response))
    assert engine.state is S.Aborted
    assert engine.explanation is not None
    assert "reports that it was aborted: stream cut by the user" in engine.explanation


class _LateAbort(AbortRequested):
    """A subclass of an input event: not in the engine's table of event classes."""


@attrs.frozen
class _InternalTrigger:
    trigger: ClassVar[Trigger] = Trigger.dispatched


@pytest.mark.timeout(30)
def test_events_outside_the_event_classes_are_judged_by_their_trigger() -> None:
    # Gap: which duck-typed events are accepted was untested. An input trigger is
    # accepted from any class that names it; an internal one never is.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    with pytest.raises(ProtocolError, match="not an input event"):
        engine.handle(_InternalTrigger())  # type: ignore[arg-type]
    before = engine.state
    engine.handle(_LateAbort("stop"))
    assert (before, engine.state) == (S.AwaitingModel, S.Aborting)


@pytest.mark.timeout(30)
def test_a_steering_message_enters_the_history_once() -> None:
    # Gap: the steering queue was not emptied once injected, so the message would be
    # sent again at every later model call; nothing checked it entered only once.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], max_turns=4)
    engine.handle(Start())
    engine.handle(InputQueued(UserMessage("also run the tests")))
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c1", ToolOutput("hi")))
    assert engine.state is S.AwaitingModel
    call2 = ToolCall("c2", "echo", {"text": "again"})
    engine.handle(ModelResponded(AssistantMessage([call2], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c2", ToolOutput("again")))
    steering = [m for m in engine.messages if m == UserMessage("also run the tests")]
    assert len(steering) == 1
    assert engine.queued_input() == ()


@pytest.mark.timeout(30)
def test_a_snapshot_missing_a_delivered_result_is_refused() -> None:
    # Gap: with every result of the batch delivered, the history may not end with an
    # unanswered call; a snapshot that drops a result must not be restored.
    snapshot = _denied_engine().snapshot()
    messages = snapshot["messages"]
    assert messages[-1]["role"] == "toolResult"
    broken = {**snapshot, "messages": messages[:-1]}
    with pytest.raises(WireFormatError, match=r"snapshot\.flushed: 1, but 0 message\(s\) follow"):
        Engine.restore(broken)
    assert Engine.restore(snapshot).state is S.AwaitingUser


class _UnaskableLogger:
    """A logger whose level cannot be asked: it must be given every event."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def bind(self, **_: object) -> _UnaskableLogger:
        return self

    def is_enabled_for(self, level: int) -> bool:
        raise RuntimeError("no level here")

    def debug(self, event: str, **_: object) -> None:
        self.events.append(event)

    info = warning = debug


@pytest.mark.timeout(30)
def test_a_logger_that_cannot_be_asked_its_level_gets_the_transitions() -> None:
    # Gap: a logger whose level check raises could silently lose the transition log.
    logger = _UnaskableLogger()
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], logger=logger)
    engine.handle(Start())
    assert "transition" in logger.events


# -- the engine's state (statemachine/core/state.py) ------------------------------------------


def _holding(text: str) -> Engine:
    """An engine whose second call finished first: its result is held for call order."""
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "a"}), ToolCall("c2", "echo", {"text": "b"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c2", ToolOutput(text)))
    return engine


@pytest.mark.timeout(30)
def test_a_result_held_for_call_order_is_part_of_the_control_key() -> None:
    # Gap: the held result could drop out of the key, although it is what the next
    # model call will be sent.
    assert _holding("one").control_key() == _holding("one").control_key()
    assert _holding("one").control_key() != _holding("two").control_key()


@pytest.mark.timeout(60)
def test_the_repr_cache_of_the_control_key_is_bounded_and_kept() -> None:
    # Gap: neither the bound of the cache nor that it keeps anything was checked.
    state._REPRS.clear()
    values = [UserMessage(str(i)) for i in range(state._REPRS_MAX)]
    for value in values:
        state._rendered(value)
    assert len(state._REPRS) == state._REPRS_MAX  # kept, up to the bound
    state._rendered(values[0])
    assert len(state._REPRS) == state._REPRS_MAX  # a value seen before is not added
    state._rendered(UserMessage("one more"))
    assert len(state._REPRS) == 1  # full: cleared, then the new value
    state._REPRS.clear()


# -- the engine's inputs, entry actions and snapshots -----------------------------------------


@pytest.mark.timeout(30)
def test_the_engine_refuses_tools_and_histories_that_are_not_sequences_of_them() -> None:
    # Gap: the engine's own checks were only reached through the driver's, which
    # refuse the same inputs first.
    for tools in ("echo", b"echo", 42, (d for d in [ECHO])):
        with pytest.raises(InvalidInputError, match="tools must be a sequence"):
            Engine(tools=tools, messages=[UserMessage("go")])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="duplicate tool name 'echo'"):
        Engine(tools=[ECHO, ECHO], messages=[UserMessage("go")])
    for messages in ("go", b"go", 42):
        with pytest.raises(InvalidInputError, match="messages must be a sequence"):
            Engine(tools=[ECHO], messages=messages)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_calls_waiting_their_turn_are_answered_when_the_abort_begins() -> None:
    # Gap: the calls that never started were answered only once the run had settled;
    # they are answered at the abort, while the running call finishes.
    slow = ToolDefinition("slow", "Wait.", {"type": "object", "properties": {}})
    engine = Engine(
        tools=[ECHO, slow],
        messages=[UserMessage("go")],
        scheduling={"slow": Scheduling(sequential=True)},
    )
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "hi"}), ToolCall("c2", "slow", {})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    assert [c.id for c in engine.pending_calls()] == ["c1", "c2"]
    engine.handle(AbortRequested("stop"))
    assert engine.state is S.Aborting
    assert [c.id for c in engine.pending_calls()] == ["c1"]


@pytest.mark.timeout(30)
def test_a_snapshot_with_an_unknown_key_is_refused() -> None:
    # Gap: the check of the snapshot's keys could be dropped unnoticed.
    snapshot = _denied_engine().snapshot()
    with pytest.raises(WireFormatError, match="surprise"):
        Engine.restore({**snapshot, "surprise": 1})


@pytest.mark.timeout(30)
def test_a_snapshot_whose_denial_was_not_answered_with_it_is_refused() -> None:
    # Gap: the denial's own check was only met by valid snapshots.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "hi"}), ToolCall("c2", "echo", {"text": "ho"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolDenied("c1", "not on weekends"))
    engine.handle(ApprovalRequired("c2", "a person decides"))
    snapshot = engine.snapshot()
    assert snapshot["denial"] == {"callId": "c1", "reason": "not on weekends"}
    assert Engine.restore(snapshot).state is S.AwaitingUser
    result = snapshot["batch"][0]["result"]
    edits = [
        {**result, "content": [{"type": "text", "text": "Tool call denied: some other reason"}]},
        {**result, "isError": False},
    ]
    for edited in edits:
        batch = [{**snapshot["batch"][0], "result": edited}, snapshot["batch"][1]]
        messages = [*snapshot["messages"][:-1], edited]
        with pytest.raises(SnapshotError, match=r"snapshot\.denial"):
            Engine.restore({**snapshot, "batch": batch, "messages": messages})


@pytest.mark.timeout(30)
def test_calls_after_one_with_arguments_off_the_schema_are_still_checked() -> None:
    # Gap: resolving a call whose arguments do not fit its schema stopped the checks
    # of the rest of the batch.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {}), ToolCall("c2", "echo", {"text": "hi"})]
    actions = engine.handle(
        ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE))
    )
    assert [a.call.id for a in actions if isinstance(a, CheckPermission)] == ["c2"]
    (result,) = [m for m in engine.messages if isinstance(m, ToolResultMessage)]
    assert result.tool_call_id == "c1"
    assert result.is_error


@pytest.mark.timeout(30)
def test_a_model_call_cancelled_in_time_is_not_reported_abandoned() -> None:
    # Gap: only a cancellation that says it gave up (ABANDONED) marks the model call
    # abandoned; an ordinary one did not reach the explanation's check.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    engine.handle(AbortRequested("stop"))
    engine.handle(ModelCancelled())
    assert engine.state is S.Aborted
    assert engine.explanation is not None
    assert "abandoned" not in engine.explanation
    assert engine.explanation.endswith("and finished its cleanup.")


@pytest.mark.timeout(30)
def test_an_abandoned_model_call_is_named_in_the_explanation() -> None:
    # Gap: no engine test gave up on a model call, so it could drop out of the
    # explanation unnoticed (the driver's tests, which do, run outside the engine's).
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    engine.handle(AbortRequested("stop"))
    engine.handle(ModelCancelled(f"{ABANDONED}: the client ignored cancellation"))
    assert engine.state is S.Aborted
    assert engine.explanation is not None
    assert "the driver abandoned the model call" in engine.explanation


@pytest.mark.timeout(30)
def test_an_abandoned_tool_is_named_in_the_explanation() -> None:
    # Gap: the abandoned tool could drop out of the explanation unnoticed.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(AbortRequested("stop"))
    engine.handle(ToolCancelled("c1", f"{ABANDONED}: the tool ignored cancellation"))
    assert engine.state is S.Aborted
    assert engine.explanation is not None
    assert "the driver abandoned tool echo (call c1)" in engine.explanation


class _PlainLogger:
    """A logger that cannot be asked its level at all: it gets every event."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def bind(self, **_: object) -> _PlainLogger:
        return self

    def debug(self, event: str, **_: object) -> None:
        self.events.append(event)

    info = warning = debug


@pytest.mark.timeout(30)
def test_a_logger_without_a_level_check_gets_the_transitions() -> None:
    # Gap: only a logger whose level check raises was tried, not one without it.
    logger = _PlainLogger()
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], logger=logger)
    engine.handle(Start())
    assert "transition" in logger.events


@pytest.mark.timeout(30)
def test_a_snapshot_taken_while_a_call_waits_for_approval_in_dispatch_restores() -> None:
    # Gap: only snapshots of runs at rest in AwaitingUser were restored with a call
    # waiting for a person; one is also possible while the other checks go on.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "hi"}), ToolCall("c2", "echo", {"text": "ho"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ApprovalRequired("c1", "a person decides"))
    assert engine.state is S.DispatchingTools
    restored = Engine.restore(engine.snapshot())
    assert restored.state is S.DispatchingTools
    assert restored.control_key() == engine.control_key()


@pytest.mark.timeout(30)
def test_a_follow_up_queued_before_the_start_waits_for_the_model_to_finish() -> None:
    # Gap: with no model message yet, the model is not finishing: a follow-up queued
    # before the first call stays queued.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(InputQueued(UserMessage("and then this"), InputKind.FOLLOW_UP))
    engine.handle(Start())
    assert engine.messages == (UserMessage("go"),)
    assert [q.message for q in engine.queued_input()] == [UserMessage("and then this")]


@pytest.mark.timeout(30)
def test_a_restored_call_keeps_the_resources_it_touches() -> None:
    # Gap: the resources of a restored call were not compared with the original's.
    scheduling = {"echo": Scheduling(resources=lambda arguments: [str(arguments["text"])])}
    engine = Engine(
        tools=[ECHO], messages=[UserMessage("go")], check_permissions=True, scheduling=scheduling
    )
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "a"}), ToolCall("c2", "echo", {"text": "a"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ApprovalRequired("c1", "a person decides"))
    engine.handle(ToolPermitted("c2"))
    assert engine.state is S.AwaitingUser
    restored = Engine.restore(engine.snapshot(), scheduling=scheduling)
    assert restored.control_key() == engine.control_key()


class _DroppingLogger:
    """A logger that says once and for all that it drops debug; it records what it gets."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def bind(self, **_: object) -> _DroppingLogger:
        return self

    def debug(self, event: str, **_: object) -> None:
        self.events.append(event)

    info = warning = debug


class _StructlogStyle(_DroppingLogger):
    def is_enabled_for(self, level: int) -> bool:
        return level > logging.DEBUG


class _StdlibStyle(_DroppingLogger):
    def isEnabledFor(self, level: int) -> bool:  # the stdlib spelling
        return level > logging.DEBUG


@pytest.mark.timeout(30)
@pytest.mark.parametrize("logger_class", [_StructlogStyle, _StdlibStyle])
def test_a_logger_that_drops_debug_is_not_given_the_transitions(
    logger_class: type[_DroppingLogger],
) -> None:
    # Gap: a logger with either spelling of the level check was never shown to be
    # spared the transition log (it was only asked to get it).
    logger = logger_class()
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], logger=logger)
    engine.handle(Start())
    assert engine.trace
    assert "transition" not in logger.events


def _invalid_argument_text(schema: Mapping[str, object], call: ToolCall) -> str:
    engine = Engine(tools=[ToolDefinition("echo", "Repeat.", schema)], messages=[UserMessage("go")])
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    result = engine.messages[-1]
    assert isinstance(result, ToolResultMessage)
    assert result.is_error
    return result.text


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "call",
    [
        ToolCall("c1", "echo", {"text": 7}),  # off the schema
        ToolCall("c1", "echo", {}, parse_error="not JSON: '{tex'"),  # unreadable
    ],
)
def test_the_schema_quoted_to_the_model_does_not_depend_on_its_key_order(call: ToolCall) -> None:
    # Gap: the schema in an invalid-arguments result was not shown to be canonical:
    # the same schema written in another key order must give the model the same text.
    properties = {"text": {"type": "string"}, "a": {"type": "integer"}}
    written = {"type": "object", "properties": properties, "required": ["text"]}
    reordered = {
        "required": ["text"],
        "properties": {"a": {"type": "integer"}, "text": {"type": "string"}},
        "type": "object",
    }
    text = _invalid_argument_text(written, call)
    assert text == _invalid_argument_text(reordered, call)
    assert json.dumps(written, sort_keys=True) in text


@pytest.mark.timeout(30)
def test_a_long_result_quoted_in_the_turn_limit_explanation_is_cut_to_160_characters() -> None:
    # Gap: the cut of the last result in the turn-limit explanation was never measured.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], max_turns=1)
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "hi"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c1", ToolOutput("x" * 500)))
    assert engine.state is S.TurnLimitExceeded
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


@pytest.mark.timeout(30)
def test_a_call_answered_before_it_is_scheduled_is_written_as_not_sequential() -> None:
    # Gap: a call resolved at dispatch (an unknown tool) never reads its scheduling;
    # the snapshot must still say what the engine holds for it: not sequential.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "nope", {}), ToolCall("c2", "echo", {"text": "a"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ApprovalRequired("c2", "a person decides"))
    assert engine.state is S.AwaitingUser
    batch = engine.snapshot()["batch"]
    assert [(slot["status"], slot["sequential"]) for slot in batch] == [
        ("done", False),
        ("waiting-approval", False),
    ]


def test_a_tool_cancelled_during_the_abort_is_answered_at_once_beside_one_still_running() -> None:
    # I2 holds at every step, not only at the end: the first call's result enters the
    # history when its cancellation arrives, while the second call is still running.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    first, second = ToolCall("a", "echo", {"text": "1"}), ToolCall("b", "echo", {"text": "2"})
    message = AssistantMessage((first, second), stop_reason=StopReason.TOOL_USE)
    started = engine.handle(ModelResponded(message))
    assert [a.call.id for a in started if isinstance(a, StartTool)] == ["a", "b"]
    states = []
    engine.handle(AbortRequested("stop"))
    states.append(engine.state)
    engine.handle(ToolCancelled("a"))
    states.append(engine.state)  # the second call still runs
    last = engine.messages[-1]
    assert isinstance(last, ToolResultMessage)
    assert (last.tool_call_id, last.is_error) == ("a", True)
    assert last.text == "Operation aborted: cancelled after the abort grace period"
    engine.handle(ToolCancelled("b"))
    states.append(engine.state)
    assert states == [S.Aborting, S.Aborting, S.Aborted]
    assert [m.tool_call_id for m in engine.messages if isinstance(m, ToolResultMessage)] == [
        "a",
        "b",
    ]


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
def test_a_replaced_call_id_is_logged_with_why_it_was_replaced() -> None:
    # Gap: the warning's reason (an empty id, or one already used) was read only by a
    # driver test, outside the engine's own tests.
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    calls = [ToolCall("", "echo", {"text": "a"}), ToolCall("c1", "echo", {"text": "b"})]
    calls.append(ToolCall("c1", "echo", {"text": "c"}))
    with capture_logs() as logs:
        engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    replaced = [e for e in logs if e["event"] == "tool_call_id_normalised"]
    assert [(e["original"], e["reason"]) for e in replaced] == [("", "empty"), ("c1", "repeated")]
