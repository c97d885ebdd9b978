"""How the engine applies the table (``Engine._fire``): the rows ``rows_from`` gives for
(state, trigger), in table order, the first whose guard holds; guards are the
engine's ``guards`` (``GUARDS``: a function of the state record per guard), so a
subclass's guard is obeyed; a table changed
at run time is obeyed by the next event; no row that applies is refused loudly."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

import statemachine as sm
from statemachine.core import table as table_module
from statemachine.core.engine import GUARDS, Engine, EngineState, GuardFunction
from statemachine.core.events import ModelResponded, Start, ToolFinished
from statemachine.core.table import Guard, State, Transition, Trigger, TurnState, rows_from
from statemachine.errors import ProtocolError

S = TurnState
T = Trigger
ECHO = sm.ToolDefinition("echo", "Echo.", {"type": "object"})


def _engine(cls: type[Engine] = Engine, **options: Any) -> Engine:
    e = cls(tools=[ECHO], messages=[sm.UserMessage("go")], **options)
    e.handle(Start())
    return e


def _call(call_id: str = "c1") -> ModelResponded:
    return ModelResponded(sm.AssistantMessage((sm.ToolCall(call_id, "echo", {}),)))


def _install(
    monkeypatch: pytest.MonkeyPatch, *rows: Transition, group: tuple[State, Trigger] | None = None
) -> None:
    """Make ``rows`` the rows of their (source, trigger), or of ``group`` (none: the
    group is removed), in the table the engine reads."""
    key = group or (rows[0].source, rows[0].trigger)
    kept = tuple(r for r in table_module.TRANSITIONS if (r.source, r.trigger) != key)
    monkeypatch.setattr(table_module, "_BY_SOURCE", table_module.index(kept + rows))


def test_a_subclass_guard_is_obeyed_and_only_by_the_subclass() -> None:
    class NeverCalls(Engine):
        guards: ClassVar[Mapping[Guard, GuardFunction]] = {
            **GUARDS,
            Guard.HAS_TOOL_CALLS: lambda run: False,
        }

    e = _engine(NeverCalls)
    e.handle(_call())
    assert e.state is S.DONE  # the subclass's guard decided
    e = _engine()
    e.handle(_call())
    assert e.state is S.COLLECTING_RESULTS


def test_guard_holds_asks_the_guard_function_of_the_guard() -> None:
    asked: list[EngineState] = []

    def reached(run: EngineState) -> bool:
        asked.append(run)
        return True

    class Watched(Engine):
        guards: ClassVar[Mapping[Guard, GuardFunction]] = {
            **GUARDS,
            Guard.TURN_LIMIT_REACHED: reached,
        }

    e = _engine(Watched)
    assert e.guard_holds(Guard.TURN_LIMIT_REACHED) is True
    assert e.guard_holds(Guard.INPUT_QUEUED) is False
    assert asked == [e._run]  # asked once, of the engine's own state record


def test_the_rows_are_tried_in_table_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # has_tool_calls holds and input_queued does not: the first row that holds wins,
    # whatever comes after it.
    rows = (
        Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.FAILED, Guard.INPUT_QUEUED, "a"),
        Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.ABORTED, Guard.HAS_TOOL_CALLS, "b"),
        Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.DONE, None, "c"),
    )
    _install(monkeypatch, *rows)
    e = _engine()
    e.handle(_call())
    assert e.state is S.ABORTED
    assert e.trace[-1] == (S.AWAITING_MODEL, T.MODEL_RESPONDED, S.ABORTED, 1)


def test_a_row_changed_at_run_time_is_obeyed_by_the_next_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _engine()
    _install(monkeypatch, Transition(S.READY, T.START, S.DONE, None, "straight to the end"))
    e = Engine(tools=[ECHO], messages=[sm.UserMessage("go")])
    e.handle(Start())
    assert e.state is S.DONE
    assert rows_from(S.READY, T.START)[0].dest is S.DONE


def test_an_internal_trigger_without_a_row_never_fires(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, group=(S.DISPATCHING_TOOLS, T.DISPATCHED))
    e = _engine()
    e.handle(_call())
    assert e.state is S.DISPATCHING_TOOLS  # every call is resolved, but no row to take


def test_no_row_that_applies_is_refused_after_the_hook_hears_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    heard: list[Any] = []
    _install(
        monkeypatch,
        Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.FAILED, Guard.REPORTS_ERROR, "only"),
    )
    e = _engine(transition_hook=lambda *args: heard.append(args[1:]))
    with pytest.raises(ProtocolError, match="no row of the table applies"):
        e.handle(_call())
    assert heard[-1] == (S.AWAITING_MODEL, T.MODEL_RESPONDED, None)


def test_the_hook_sees_every_transition_the_trace_records() -> None:
    heard: list[Any] = []
    e = _engine(transition_hook=lambda *args: heard.append(args[1:]))
    e.handle(_call())
    e.handle(ToolFinished("c1", sm.ToolOutput("ok")))
    assert heard == [(r.source, r.trigger, r.dest) for r in e.trace]
    assert len(heard) == 6


def test_a_hook_set_after_construction_is_used() -> None:
    heard: list[Any] = []
    e = _engine()
    e.transition_hook = lambda *args: heard.append(args[1:])
    e.handle(_call())
    assert heard[0] == (S.AWAITING_MODEL, T.MODEL_RESPONDED, S.DISPATCHING_TOOLS)
