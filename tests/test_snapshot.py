"""Engine snapshots (``core/snapshot.py``): what restore refuses (a snapshot no run could
have written: a bad key, a denial or a held result that does not fit, an outstanding
operation, a trace that does not chain) and what it keeps (every field that decides
what the engine does next)."""

from __future__ import annotations

import pytest
from engine_support import ECHO, denied_engine

from statemachine.core.engine import Engine
from statemachine.core.events import (
    AbortRequested,
    ApprovalDecided,
    ApprovalRequired,
    ContinueDecided,
    InputQueued,
    ModelResponded,
    Start,
    StartTool,
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
from statemachine.core.table import Trigger, TurnState
from statemachine.core.tools import Scheduling, ToolOutput
from statemachine.errors import SnapshotError, WireFormatError

S = TurnState


@pytest.mark.timeout(30)
def test_a_should_continue_question_left_by_an_abort_restores_and_one_elsewhere_is_not() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_continue=True)
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "a"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c1", ToolOutput("ok")))
    assert engine.state is S.TURN_BOUNDARY
    engine.handle(AbortRequested("stop"))
    snapshot = engine.snapshot()
    assert (snapshot["state"], snapshot["continuePending"]) == ("Aborted", True)
    assert Engine.restore(snapshot).state is S.ABORTED
    resting = Engine(tools=[ECHO], messages=[UserMessage("go")])
    resting.handle(Start())
    resting.handle(ModelResponded(AssistantMessage("done", stop_reason=StopReason.STOP)))
    assert Engine.restore(resting.snapshot()).state is S.DONE
    forged = {**resting.snapshot(), "continuePending": True}
    with pytest.raises(SnapshotError, match=r"snapshot\.continuePending: true in Done"):
        Engine.restore(forged)


def _outstanding(state: TurnState) -> Engine:
    """An engine in ``state`` with its operation outstanding, as if it had ended without
    its answer (no run can write that: snapshot() refuses while one is outstanding)."""
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    if state is S.COLLECTING_RESULTS:
        call = ToolCall("c1", "echo", {"text": "a"})
        engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    if state is S.ABORTING:
        engine.handle(AbortRequested("stop"))
    assert engine.state is state
    engine._run.model_outstanding = False
    for slot in engine._run.batch:  # its result arrived, but the batch never completed
        slot.answer("ok", is_error=False)
    engine._flush()
    return engine


@pytest.mark.timeout(30)
@pytest.mark.parametrize("state", [S.AWAITING_MODEL, S.COLLECTING_RESULTS, S.ABORTING])
def test_a_snapshot_that_rests_while_an_operation_is_outstanding_is_refused(
    state: TurnState,
) -> None:
    forged = _outstanding(state).snapshot()
    forged["abortReason"] = None  # which only Aborted may have: the state alone refuses it
    with pytest.raises(SnapshotError, match=rf"snapshot\.state: {state} always has"):
        Engine.restore(forged)


@pytest.mark.timeout(30)
def test_a_snapshot_whose_denial_has_an_unknown_key_is_refused() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "a"}), ToolCall("c2", "echo", {"text": "b"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolDenied("c1", "not on weekends"))
    snapshot = engine.snapshot()  # c2 still waits for the policy
    assert Engine.restore(snapshot).state is S.DISPATCHING_TOOLS
    snapshot["denial"] = {**snapshot["denial"], "advisory": False}
    with pytest.raises(SnapshotError, match=r"snapshot\.denial"):
        Engine.restore(snapshot)


def _waiting_for_approval() -> Engine:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "a"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ApprovalRequired("c1", "a person decides"))
    assert engine.state is S.AWAITING_USER
    return engine


@pytest.mark.timeout(30)
def test_a_restored_call_that_runs_is_the_call_its_history_shows() -> None:
    restored = Engine.restore(_waiting_for_approval().snapshot())
    [start] = restored.handle(ApprovalDecided("c1", approved=True))
    assert isinstance(start, StartTool)
    shown = restored.messages[1]
    assert isinstance(shown, AssistantMessage)
    assert start.call is shown.tool_calls[0]


@pytest.mark.timeout(30)
def test_a_snapshot_whose_open_call_names_a_tool_it_lacks_is_refused() -> None:
    snapshot = _waiting_for_approval().snapshot()
    snapshot["tools"] = []
    with pytest.raises(SnapshotError, match=r"snapshot\.batch\[0\]\.call: tool 'echo' is not in"):
        Engine.restore(snapshot)


@pytest.mark.timeout(30)
def test_a_snapshot_with_many_faults_in_its_history_names_the_first_three() -> None:
    # The refusal quotes at most three of the faults.
    call = ToolCall("c1", "echo", {"text": "a"})
    answered: list[Message] = [
        UserMessage("go"),
        AssistantMessage([call], stop_reason=StopReason.TOOL_USE),
        ToolResultMessage("c1", "echo", "ok"),
    ]
    snapshot = Engine(tools=[ECHO], messages=answered).snapshot()
    result = snapshot["messages"][2]
    assert result["toolCallId"] == "c1"
    # five results whose calls were never made
    snapshot["messages"] += [{**result, "toolCallId": f"x{i}"} for i in range(5)]
    with pytest.raises(SnapshotError, match="invalid history") as info:
        Engine.restore(snapshot)
    assert str(info.value).count("; ") == 2


@pytest.mark.timeout(30)
@pytest.mark.parametrize("turn", [-1, True, "1", 1.0])
def test_a_snapshot_whose_trace_has_a_turn_that_is_not_a_count_is_refused(turn: object) -> None:
    snapshot = _waiting_for_approval().snapshot()
    snapshot["trace"][0] = [*snapshot["trace"][0][:3], turn]
    with pytest.raises(SnapshotError, match=r"snapshot\.trace\[0\]\[3\]: expected an integer"):
        Engine.restore(snapshot)


@pytest.mark.timeout(30)
def test_a_snapshot_whose_tool_has_an_unknown_key_is_refused() -> None:
    snapshot = _waiting_for_approval().snapshot()
    snapshot["tools"][0] = {**snapshot["tools"][0], "strict": True}
    with pytest.raises(SnapshotError, match=r"snapshot\.tools\[0\]"):
        Engine.restore(snapshot)


@pytest.mark.timeout(30)
def test_a_held_result_that_answers_another_call_of_the_same_tool_is_refused() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "a"}), ToolCall("c2", "echo", {"text": "b"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ApprovalRequired("c1", "a person decides"))
    engine.handle(ToolPermitted("c2"))
    engine.handle(ToolFinished("c2", ToolOutput("done")))
    snapshot = engine.snapshot()
    assert snapshot["state"] == "AwaitingUser"
    held = snapshot["batch"][1]["result"]
    assert (held["toolCallId"], snapshot["flushed"]) == ("c2", 0)
    assert Engine.restore(snapshot).state is S.AWAITING_USER
    snapshot["batch"][1]["result"] = {**held, "toolCallId": "c9"}
    with pytest.raises(SnapshotError, match=r"snapshot\.batch\[1\]\.result: answers another"):
        Engine.restore(snapshot)


@pytest.mark.timeout(30)
def test_a_batch_call_whose_arguments_are_stored_in_another_key_order_restores() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "a", "n": 1})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ApprovalRequired("c1", "a person decides"))
    snapshot = engine.snapshot()
    stored = snapshot["batch"][0]["call"]
    assert list(stored["arguments"]) == ["text", "n"]
    stored["arguments"] = {"n": 1, "text": "a"}
    restored = Engine.restore(snapshot)
    assert restored.control_key() == engine.control_key()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("field", [0, 1, 2])
@pytest.mark.parametrize("name", ["Nowhere", 7])
def test_a_snapshot_whose_trace_names_an_unknown_state_or_trigger_says_where(
    field: int, name: object
) -> None:
    # Each of source, trigger and dest is checked: a name that is no state or trigger
    # (or not a string) is refused naming the record, not as a malformed snapshot.
    snapshot = _waiting_for_approval().snapshot()
    record = list(snapshot["trace"][0])
    record[field] = name
    snapshot["trace"][0] = record
    with pytest.raises(
        SnapshotError, match=r"snapshot\.trace\[0\]: names an unknown state or trigger"
    ):
        Engine.restore(snapshot)


@pytest.mark.timeout(30)
def test_a_snapshot_whose_batch_slot_has_an_unknown_key_is_refused() -> None:
    # Every object of a snapshot is read with its keys checked, a call of the batch too.
    snapshot = _waiting_for_approval().snapshot()
    snapshot["batch"][0] = {**snapshot["batch"][0], "priority": 1}
    with pytest.raises(SnapshotError, match=r"snapshot\.batch\[0\]"):
        Engine.restore(snapshot)


@pytest.mark.timeout(30)
def test_an_engine_stopped_by_should_continue_restores_with_its_stop_reason() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_continue=True)
    engine.handle(Start())
    call = ToolCall("c1", "echo", {"text": "a"})
    engine.handle(ModelResponded(AssistantMessage([call], stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c1", ToolOutput("a")))
    engine.handle(ContinueDecided(stop=True, reason="budget spent"))
    assert engine.state is S.DONE
    restored = Engine.restore(engine.snapshot())
    assert restored.control_key() == engine.control_key()
    assert restored.snapshot() == engine.snapshot()


@pytest.mark.timeout(30)
def test_a_snapshot_missing_a_delivered_result_is_refused() -> None:
    snapshot = denied_engine().snapshot()
    messages = snapshot["messages"]
    assert messages[-1]["role"] == "toolResult"
    broken = {**snapshot, "messages": messages[:-1]}
    with pytest.raises(WireFormatError, match=r"snapshot\.flushed: 1, but 0 message\(s\) follow"):
        Engine.restore(broken)
    assert Engine.restore(snapshot).state is S.AWAITING_USER


@pytest.mark.timeout(30)
def test_a_snapshot_with_an_unknown_key_is_refused() -> None:
    snapshot = denied_engine().snapshot()
    with pytest.raises(WireFormatError, match="surprise"):
        Engine.restore({**snapshot, "surprise": 1})


@pytest.mark.timeout(30)
def test_a_snapshot_whose_denial_was_not_answered_with_it_is_refused() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "hi"}), ToolCall("c2", "echo", {"text": "ho"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolDenied("c1", "not on weekends"))
    engine.handle(ApprovalRequired("c2", "a person decides"))
    snapshot = engine.snapshot()
    assert snapshot["denial"] == {"callId": "c1", "reason": "not on weekends"}
    assert Engine.restore(snapshot).state is S.AWAITING_USER
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
def test_a_snapshot_taken_while_a_call_waits_for_approval_in_dispatch_restores() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "hi"}), ToolCall("c2", "echo", {"text": "ho"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ApprovalRequired("c1", "a person decides"))
    assert engine.state is S.DISPATCHING_TOOLS
    restored = Engine.restore(engine.snapshot())
    assert restored.state is S.DISPATCHING_TOOLS
    assert restored.control_key() == engine.control_key()


@pytest.mark.timeout(30)
def test_a_restored_call_keeps_the_resources_it_touches() -> None:
    scheduling = {"echo": Scheduling(resources=lambda arguments: [str(arguments["text"])])}
    engine = Engine(
        tools=[ECHO], messages=[UserMessage("go")], check_permissions=True, scheduling=scheduling
    )
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "a"}), ToolCall("c2", "echo", {"text": "a"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ApprovalRequired("c1", "a person decides"))
    engine.handle(ToolPermitted("c2"))
    assert engine.state is S.AWAITING_USER
    restored = Engine.restore(engine.snapshot(), scheduling=scheduling)
    assert restored.control_key() == engine.control_key()


@pytest.mark.timeout(30)
def test_a_call_answered_before_it_is_scheduled_is_written_as_not_sequential() -> None:
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")], check_permissions=True)
    engine.handle(Start())
    calls = [ToolCall("c1", "nope", {}), ToolCall("c2", "echo", {"text": "a"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ApprovalRequired("c2", "a person decides"))
    assert engine.state is S.AWAITING_USER
    batch = engine.snapshot()["batch"]
    assert [(slot["status"], slot["sequential"]) for slot in batch] == [
        ("done", False),
        ("waiting-approval", False),
    ]


def test_a_restored_engine_takes_a_transition_hook_and_a_snapshot_does_not_keep_it() -> None:
    heard: list[Trigger] = []
    snapshot = denied_engine().snapshot()
    assert Engine.restore(snapshot).transition_hook is None
    restored = Engine.restore(snapshot, transition_hook=lambda *a: heard.append(a[2]))
    restored.handle(InputQueued(UserMessage("use another tool")))
    assert heard == [Trigger.INPUT_QUEUED, Trigger.NEXT_TURN]
