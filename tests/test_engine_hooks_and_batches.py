"""The sans-IO engine's rules for parallel tools, queued input, hooks and approvals,
driven event by event.

Scheduling (sequential barriers, per-resource queues), queued input, approvals with
snapshot/restore, the should_continue hook and abort in the new states. The
Hypothesis tests drive a real ``Engine`` in random completion orders and check the
invariants after every step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statemachine as sm
import statemachine.engine
import statemachine.errors
from statemachine.core import table as table_module
from statemachine.core.engine import Engine
from statemachine.core.invariants import history_violations
from statemachine.core.table import State
from statemachine.core.tools import Scheduling
from statemachine.testing._reference import verify_transition

ECHO = sm.ToolDefinition(
    "echo",
    "Echo",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
SEQ = sm.ToolDefinition("barrier", "Runs alone", {"type": "object", "properties": {}})
SCHEDULING = {
    "echo": Scheduling(resources=lambda args: [str(args["path"])]),
    "barrier": Scheduling(sequential=True),
}


def engine(**kwargs: Any) -> Engine:
    base: dict[str, Any] = {
        "tools": [ECHO, SEQ],
        "messages": [sm.UserMessage("go")],
        "max_turns": 5,
        "scheduling": SCHEDULING,
        "transition_hook": verify_transition,  # every transition checked by the reference
    }
    base.update(kwargs)
    return Engine(**base)


def state(e: Engine) -> State:
    # A function, not the property, so mypy does not narrow the state across events.
    return e.state


def ask(*calls: sm.ToolCall) -> sm.engine.ModelResponded:
    return sm.engine.ModelResponded(sm.AssistantMessage(calls, stop_reason="toolUse"))


def echo(call_id: str, path: str) -> sm.ToolCall:
    return sm.ToolCall(call_id, "echo", {"path": path})


def started(actions: Sequence[sm.engine.Action]) -> list[str]:
    return [a.call.id for a in actions if isinstance(a, sm.engine.StartTool)]


def finish(call_id: str, text: str = "ok") -> sm.engine.ToolFinished:
    return sm.engine.ToolFinished(call_id, sm.ToolOutput(text))


# -- scheduling -------------------------------------------------------------------------


def test_calls_on_one_resource_run_in_call_order_others_concurrently() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    actions = e.handle(ask(echo("a", "x"), echo("b", "y"), echo("c", "x")))
    assert started(actions) == ["a", "b"]  # c waits for a: same resource
    assert started(e.handle(finish("b"))) == []
    assert started(e.handle(finish("a"))) == ["c"]
    e.handle(finish("c"))
    results = [m.tool_call_id for m in e.messages if isinstance(m, sm.ToolResultMessage)]
    assert results == ["a", "b", "c"]


def test_a_sequential_tool_is_a_barrier() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    barrier = sm.ToolCall("s", "barrier", {})
    actions = e.handle(ask(echo("a", "x"), barrier, echo("b", "y")))
    assert started(actions) == ["a"]  # s waits for a; b waits for s
    assert started(e.handle(finish("a"))) == ["s"]
    assert started(e.handle(finish("s"))) == ["b"]


def test_a_resources_function_that_raises_makes_the_call_run_alone() -> None:
    def broken(args: Any) -> list[str]:
        raise KeyError("nope")

    e = engine(scheduling={"echo": Scheduling(resources=broken)})
    e.handle(sm.engine.Start())
    actions = e.handle(ask(echo("a", "x"), echo("b", "y")))
    assert started(actions) == ["a"]
    assert started(e.handle(finish("a"))) == ["b"]


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[sm.ToolCall], list[int]]:
    n = draw(st.integers(1, 6))
    calls = []
    for i in range(n):
        if draw(st.integers(0, 5)) == 0:
            calls.append(sm.ToolCall(f"c{i}", "barrier", {}))
        else:
            calls.append(echo(f"c{i}", draw(st.sampled_from(["p", "q", "r"]))))
    # the order in which the driver reports completions: indices into running calls
    picks = draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    return calls, picks


def check_scheduling(make: Any, calls: list[sm.ToolCall], picks: list[int]) -> None:
    """Drive one batch in the completion order ``picks``; assert the scheduling rules."""
    e = make()
    e.handle(sm.engine.Start())
    running: list[str] = started(e.handle(ask(*calls)))
    by_id = {c.id: c for c in calls}
    finished: list[str] = []
    for pick in picks:
        if not running:
            break
        for i, x in enumerate(running):  # no two running calls conflict
            for y in running[i + 1 :]:
                cx, cy = by_id[x], by_id[y]
                assert cx.name != "barrier", (x, y)
                assert cy.name != "barrier", (x, y)
                assert cx.arguments["path"] != cy.arguments["path"], (x, y)
        done = running.pop(pick % len(running))
        finished.append(done)
        running.extend(started(e.handle(finish(done, f"result {done}"))))
    assert sorted(finished) == sorted(c.id for c in calls)
    results = [m for m in e.messages if isinstance(m, sm.ToolResultMessage)]
    assert [r.tool_call_id for r in results] == [c.id for c in calls]
    assert [r.text for r in results] == [f"result {c.id}" for c in calls]
    assert history_violations(e.messages) == []
    assert state(e) is sm.TurnState.AWAITING_MODEL


@given(batches())
def test_no_two_calls_on_one_resource_overlap_and_results_keep_call_order(
    batch: tuple[list[sm.ToolCall], list[int]],
) -> None:
    check_scheduling(engine, *batch)


class StartsEverything(Engine):
    """Broken on purpose: ignores barriers and resources (a plain gather())."""

    def _start_runnable(self) -> None:
        for slot in self._run.batch:
            if slot.status == "ready":
                slot.status = "running"
                self._actions += (sm.engine.StartTool(slot.call, self.turns),)


def test_the_scheduling_property_catches_an_engine_that_starts_everything() -> None:
    def broken() -> Engine:
        return StartsEverything(
            tools=[ECHO, SEQ], messages=[sm.UserMessage("go")], scheduling=SCHEDULING
        )

    calls = [echo("a", "x"), echo("b", "x")]
    check_scheduling(engine, calls, [0, 0])  # the real engine passes this case
    with pytest.raises(AssertionError):
        check_scheduling(broken, calls, [0, 0])


# -- queued input -------------------------------------------------------------------------


def test_steering_waits_for_the_batch_and_never_skips_asked_calls() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    e.handle(ask(echo("a", "x")))
    before = len(e.messages)
    e.handle(sm.engine.InputQueued(sm.UserMessage("steer me")))
    assert len(e.messages) == before  # not injected mid-batch
    actions = e.handle(finish("a"))
    history = list(e.messages)
    assert isinstance(history[-2], sm.ToolResultMessage)
    assert history[-1] == sm.UserMessage("steer me")
    assert any(isinstance(a, sm.engine.CallModel) for a in actions)
    assert state(e) is sm.TurnState.AWAITING_MODEL


def test_a_final_answer_with_input_queued_is_not_done() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    e.handle(sm.engine.InputQueued(sm.UserMessage("later"), sm.engine.InputKind.FOLLOW_UP))
    e.handle(sm.engine.ModelResponded(sm.AssistantMessage("first answer")))
    assert state(e) is sm.TurnState.AWAITING_MODEL
    assert list(e.messages)[-1] == sm.UserMessage("later")
    e.handle(sm.engine.ModelResponded(sm.AssistantMessage("second answer")))
    assert state(e) is sm.TurnState.DONE


def test_follow_ups_wait_until_the_model_would_finish() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    e.handle(sm.engine.InputQueued(sm.UserMessage("after"), sm.engine.InputKind.FOLLOW_UP))
    e.handle(ask(echo("a", "x")))
    e.handle(finish("a"))
    # the model still had tool results to read: the follow-up is not injected yet
    assert sm.UserMessage("after") not in list(e.messages)
    e.handle(sm.engine.ModelResponded(sm.AssistantMessage("done?")))
    assert list(e.messages)[-1] == sm.UserMessage("after")


def test_queue_order_is_kept_and_input_left_at_the_end_is_reported() -> None:
    e = engine(max_turns=1)
    e.handle(sm.engine.Start())
    e.handle(sm.engine.InputQueued(sm.UserMessage("one")))
    e.handle(sm.engine.InputQueued(sm.UserMessage("two")))
    e.handle(sm.engine.InputQueued(sm.UserMessage("three"), sm.engine.InputKind.FOLLOW_UP))
    e.handle(sm.engine.ModelResponded(sm.AssistantMessage("answer")))
    assert state(e) is sm.TurnState.TURN_LIMIT_EXCEEDED
    assert "3 queued input message(s)" in (e.explanation or "")
    assert [(q.message, q.kind) for q in e.queued_input()] == [
        (sm.UserMessage("one"), sm.engine.InputKind.STEER),
        (sm.UserMessage("two"), sm.engine.InputKind.STEER),
        (sm.UserMessage("three"), sm.engine.InputKind.FOLLOW_UP),
    ]


# -- should_continue --------------------------------------------------------------------------


def test_should_continue_is_asked_at_each_boundary_and_can_stop() -> None:
    e = engine(check_continue=True)
    e.handle(sm.engine.Start())
    actions = e.handle(ask(echo("a", "x")))
    actions = e.handle(finish("a"))
    assert [type(a) for a in actions] == [sm.engine.CheckContinue]
    assert state(e) is sm.TurnState.TURN_BOUNDARY
    with pytest.raises(sm.errors.ProtocolError):
        e.handle(finish("a"))
    e.handle(sm.engine.ContinueDecided(True, "budget spent"))
    assert state(e) is sm.TurnState.DONE
    assert "budget spent" in (e.explanation or "")


def test_a_continue_decision_that_was_not_asked_for_is_refused() -> None:
    e = engine(check_continue=True)
    e.handle(sm.engine.Start())
    e.handle(ask(echo("a", "x")))
    e.handle(finish("a"))
    e.handle(sm.engine.ContinueDecided(False))
    assert state(e) is sm.TurnState.AWAITING_MODEL
    with pytest.raises(sm.errors.ProtocolError):
        e.handle(sm.engine.ContinueDecided(False))


# -- approvals and snapshot/restore ----------------------------------------------------------------


def suspended() -> Engine:
    e = engine(check_permissions=True)
    e.handle(sm.engine.Start())
    e.handle(ask(echo("a", "x"), echo("b", "y"), echo("c", "z")))
    e.handle(sm.engine.ToolPermitted("a"))
    e.handle(sm.engine.ApprovalRequired("b", "writes a file"))
    actions = e.handle(sm.engine.ToolPermitted("c"))
    assert sorted(started(actions)) == ["a", "c"]
    e.handle(finish("c", "c done"))
    e.handle(finish("a", "a done"))
    assert state(e) is sm.TurnState.AWAITING_USER
    return e


def test_an_approval_suspends_with_the_pending_call_and_holds_later_results() -> None:
    e = suspended()
    assert [c.id for c, _ in e.pending_approvals()] == ["b"]
    assert "writes a file" in (e.explanation or "")
    results = [m.tool_call_id for m in e.messages if isinstance(m, sm.ToolResultMessage)]
    assert results == ["a"]  # c's result waits behind b (I2)
    assert history_violations(e.messages, allow_open_tail=True) == []


def test_restore_in_a_fresh_engine_then_approve() -> None:
    snapshot = json.loads(json.dumps(suspended().snapshot()))
    e = Engine.restore(snapshot, scheduling=SCHEDULING)
    assert state(e) is sm.TurnState.AWAITING_USER
    assert started(e.handle(sm.engine.ApprovalDecided("b", True))) == ["b"]
    e.handle(finish("b", "b done"))
    results = [m for m in e.messages if isinstance(m, sm.ToolResultMessage)]
    assert [(r.tool_call_id, r.text) for r in results] == [
        ("a", "a done"),
        ("b", "b done"),
        ("c", "c done"),
    ]
    assert state(e) is sm.TurnState.AWAITING_MODEL
    assert history_violations(e.messages, allow_open_tail=False) == []


def test_a_denied_approval_gets_an_error_result_naming_the_person() -> None:
    e = Engine.restore(suspended().snapshot(), scheduling=SCHEDULING)
    e.handle(sm.engine.ApprovalDecided("b", False, "not today"))
    (b,) = [m for m in e.messages if isinstance(m, sm.ToolResultMessage) and m.tool_call_id == "b"]
    assert b.is_error
    assert b.text == "Tool call denied by a person: not today"
    assert state(e) is sm.TurnState.AWAITING_MODEL


def test_a_message_instead_of_a_decision_answers_pending_calls() -> None:
    e = suspended()
    e.handle(sm.engine.InputQueued(sm.UserMessage("do something else")))
    history = list(e.messages)
    assert state(e) is sm.TurnState.AWAITING_MODEL
    assert history[-1] == sm.UserMessage("do something else")
    assert history_violations(history) == []
    pending = [m for m in history if isinstance(m, sm.ToolResultMessage) and m.tool_call_id == "b"]
    assert pending[0].text.startswith("Tool call not run: it was not approved")


def test_abort_while_awaiting_approval_answers_every_pending_call() -> None:
    e = suspended()
    e.handle(sm.engine.AbortRequested("user left"))
    assert state(e) is sm.TurnState.ABORTED
    assert history_violations(e.messages) == []
    assert "while waiting for a person" in (e.explanation or "")


def test_a_snapshot_is_refused_while_work_is_outstanding() -> None:
    e = engine()
    e.handle(sm.engine.Start())
    with pytest.raises(sm.errors.ProtocolError, match="outstanding"):
        e.snapshot()


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s.update(version=99),
        lambda s: s.pop("batch"),
        lambda s: s.update(state="Nowhere"),
        lambda s: s["batch"][0].update(status="running"),
        lambda s: s["messages"].pop(1),
    ],
)
def test_a_damaged_snapshot_is_refused_clearly(damage: Any) -> None:
    snapshot = json.loads(json.dumps(suspended().snapshot()))
    damage(snapshot)
    with pytest.raises(sm.errors.WireFormatError):
        Engine.restore(snapshot)


# -- abort in the new states ---------------------------------------------------------------------


def test_abort_at_the_turn_boundary() -> None:
    e = engine(check_continue=True)
    e.handle(sm.engine.Start())
    e.handle(ask(echo("a", "x")))
    e.handle(finish("a"))
    assert state(e) is sm.TurnState.TURN_BOUNDARY
    e.handle(sm.engine.AbortRequested("enough"))
    assert state(e) is sm.TurnState.ABORTED
    assert "at the turn boundary" in (e.explanation or "")
    assert history_violations(e.messages) == []


EVENTS = st.sampled_from(["finish", "abort", "steer", "follow", "continue", "stop", "bogus"])


@settings(max_examples=80)
@given(st.lists(EVENTS, max_size=25), batches())
def test_random_event_streams_never_break_the_invariants(
    script: list[str], batch: tuple[list[sm.ToolCall], list[int]]
) -> None:
    calls, _ = batch
    e = engine(check_continue=True, max_turns=3)
    e.handle(sm.engine.Start())
    e.handle(ask(*calls))
    for step in script:
        before = (e.state, list(e.messages), list(e.trace), e.turns)
        running = [c.id for c in e.pending_calls()]
        event: sm.engine.Event
        if step == "finish":
            event = finish(running[0] if running else "none")
        elif step == "abort":
            event = sm.engine.AbortRequested("x")
        elif step in ("steer", "follow"):
            kind = sm.engine.InputKind.STEER if step == "steer" else sm.engine.InputKind.FOLLOW_UP
            event = sm.engine.InputQueued(sm.UserMessage(step), kind)
        elif step in ("continue", "stop"):
            event = sm.engine.ContinueDecided(step == "stop", step)
        else:
            event = sm.engine.ToolPermitted("bogus")
        try:
            e.handle(event)
        except sm.errors.ProtocolError:
            assert (e.state, list(e.messages), list(e.trace), e.turns) == before
        if e.state is sm.TurnState.AWAITING_MODEL:
            e.handle(sm.engine.ModelResponded(sm.AssistantMessage("answer")))
        history = list(e.messages)
        assert history[: len(before[1])] == before[1]  # append-only
        assert e.turns <= e.max_turns
        open_tail = bool(e.pending_calls())
        assert history_violations(history, allow_open_tail=open_tail) == []
        if e.state.is_terminal:
            assert e.explanation


# -- the engine is checked against the transitions machine when asked -------------------------


def test_an_engine_runs_no_hook_unless_given_one() -> None:
    plain = Engine(tools=[ECHO], messages=[sm.UserMessage("go")])
    assert plain.transition_hook is None
    assert engine().transition_hook is verify_transition
    assert engine().fork().transition_hook is verify_transition


def test_a_transition_hook_sees_every_trigger_fired_before_the_state_changes() -> None:
    heard: list[tuple[State, sm.engine.Trigger, State | None, State]] = []

    def hook(e: Engine, source: State, trigger: sm.engine.Trigger, dest: Any) -> None:
        heard.append((source, trigger, dest, e.state))

    e = engine(transition_hook=hook)
    e.handle(sm.engine.Start())
    e.handle(ask(echo("a", "x")))
    e.handle(sm.engine.ToolFinished("a", sm.ToolOutput("x")))
    assert [(r.source, r.trigger, r.dest, r.source) for r in e.trace] == heard


def test_an_engine_that_disagrees_with_the_machine_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The engine reads a table whose rows are in the wrong order (the last row of each
    # group first); the reference machine is built from the table's true order.
    reversed_rows = table_module.index(reversed(table_module.TRANSITIONS))
    monkeypatch.setattr(table_module, "_BY_SOURCE", reversed_rows)
    e = engine()
    e.handle(sm.engine.Start())
    with pytest.raises(AssertionError, match="the transitions machine took model_responded"):
        e.handle(ask(echo("a", "x")))  # the engine would pick 'final answer' -> Done


def test_the_reference_machine_is_a_plain_transitions_machine() -> None:
    from transitions import Machine

    from statemachine.testing._reference import reference_machine

    machine = reference_machine()
    assert type(machine) is Machine
    assert machine.auto_transitions is False
    rows = {(r.source.name, r.trigger.value, r.dest.name) for r in sm_table().TRANSITIONS}
    built = {
        (t.source, name, t.dest)
        for name, event in machine.events.items()
        for ts in event.transitions.values()
        for t in ts
    }
    assert built == rows


def sm_table() -> Any:
    import statemachine.core.table as table

    return table
