"""The transition table: its internal consistency and its agreement with the engine."""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import groupby
from typing import Any

import pytest
from transitions import Machine, MachineError

from statemachine.core.engine import GUARDS, Engine
from statemachine.core.table import (
    ABSORBING,
    INPUT_TRIGGERS,
    INTERNAL_TRIGGERS,
    RETURNS_TO_CALLER,
    STATE_DOCS,
    TERMINAL,
    TRANSITIONS,
    TRIGGER_DOCS,
    Guard,
    OutcomeIs,
    State,
    Transition,
    Trigger,
    TurnState,
    rows_from,
)
from statemachine.testing._reference import MachineModel, build_machine

S = TurnState
T = Trigger


def _groups() -> dict[tuple[TurnState, Trigger], list[Transition]]:
    out: dict[tuple[TurnState, Trigger], list[Transition]] = {}
    for row in TRANSITIONS:
        assert isinstance(row.source, TurnState)  # the base table: the library's states
        out.setdefault((row.source, row.trigger), []).append(row)
    return out


def test_enum_members_are_upper_case_spellings_of_their_values() -> None:
    for state in TurnState:
        assert state.name == re.sub(r"(?<=[a-z])(?=[A-Z])", "_", state.value).upper()
        assert str(state) == state.value
    for member in [*Trigger, *Guard]:
        assert member.name == member.value.upper()
        assert str(member) == member.value


def test_design_card_states_exist() -> None:
    card = {
        "AwaitingModel",
        "DispatchingTools",
        "CollectingResults",
        "Done",
        "Aborted",
        "TurnLimitExceeded",
        "Failed",
        "AwaitingUser",
    }
    assert card <= {s.value for s in TurnState}


def test_every_guard_has_an_engine_function_and_vice_versa() -> None:
    assert set(GUARDS) == set(Guard)
    assert Engine.guards is GUARDS


def test_every_guard_is_used_by_a_row_or_fires_an_internal_trigger() -> None:
    in_rows = {r.guard for r in TRANSITIONS if r.guard is not None}
    assert in_rows | set(INTERNAL_TRIGGERS.values()) == set(Guard)


def test_every_destination_has_an_entry_effect_and_every_entry_effect_a_state() -> None:
    entered = {r.dest for r in TRANSITIONS if r.dest is not r.source}
    assert entered == set(Engine._ENTRIES)
    # each effect is the method named after its state, so a reader finds it by name
    assert all(f.__name__ == f"_enter_{s.value}" for s, f in Engine._ENTRIES.items())


def test_input_trigger_groups_end_with_an_unguarded_row() -> None:
    for (source, trigger), rows in _groups().items():
        if trigger in INTERNAL_TRIGGERS:
            continue
        assert rows[-1].guard is None, (source, trigger)
        # an unguarded row before the last would hide the rows after it
        assert all(r.guard is not None for r in rows[:-1]), (source, trigger)


def test_internal_trigger_groups_always_have_a_row_once_fired() -> None:
    # The engine fires an internal trigger only when its INTERNAL_TRIGGERS guard holds;
    # then some row must apply: either the lone row carries that very guard, or the
    # group picks a destination and ends with an unguarded row.
    for (source, trigger), rows in _groups().items():
        if trigger not in INTERNAL_TRIGGERS:
            continue
        if len(rows) == 1 and rows[0].guard is not None:
            assert rows[0].guard is INTERNAL_TRIGGERS[trigger], (source, trigger)
        else:
            assert rows[-1].guard is None, (source, trigger)
            assert all(r.guard is not None for r in rows[:-1]), (source, trigger)


def test_rows_of_one_group_are_contiguous_in_the_table() -> None:
    # The prose says rows sharing source and trigger are tried in table order; keeping
    # them adjacent is what makes that order readable in the file.
    keys = [k for k, _ in groupby(TRANSITIONS, key=lambda r: (r.source, r.trigger))]
    assert len(keys) == len(set(keys))


def test_rows_from_returns_the_group_in_table_order() -> None:
    for key, rows in _groups().items():
        assert list(rows_from(*key)) == rows
    assert rows_from(S.DONE, T.START) == ()
    assert rows_from(S.READY, T.TOOL_FINISHED) == ()


def test_docs_cover_every_member_with_text() -> None:
    assert set(STATE_DOCS) == set(TurnState)
    assert set(TRIGGER_DOCS) == set(Trigger)
    assert all(text.strip() for text in (*STATE_DOCS.values(), *TRIGGER_DOCS.values()))


def test_trigger_partition() -> None:
    assert set(INPUT_TRIGGERS) | set(INTERNAL_TRIGGERS) == set(Trigger)
    assert not set(INPUT_TRIGGERS) & set(INTERNAL_TRIGGERS)
    # Every trigger has a row in the base table but step_decided, which only the rows
    # a team's declared steps generate use (core/steps.py).
    assert {r.trigger for r in TRANSITIONS} == set(Trigger) - {Trigger.STEP_DECIDED}


def test_terminal_states_have_no_rows_and_absorb() -> None:
    terminal = {S.DONE, S.ABORTED, S.TURN_LIMIT_EXCEEDED, S.USAGE_LIMIT_EXCEEDED, S.FAILED}
    assert terminal | {S.OUTPUT_INVALID, S.TOOL_RETRIES_EXCEEDED} == TERMINAL
    assert ABSORBING == TERMINAL
    assert TERMINAL | {S.AWAITING_USER} == RETURNS_TO_CALLER
    assert not [r for r in TRANSITIONS if r.source in TERMINAL]
    for state in TurnState:
        assert state.is_terminal == (state in TERMINAL)


def test_tool_calls_are_tested_before_any_row_that_can_end_the_run_done() -> None:
    # Rule: the presence of tool calls decides, so in the group that reads a model
    # response no row that ends the run Done may come before the has_tool_calls row.
    rows = list(rows_from(S.AWAITING_MODEL, T.MODEL_RESPONDED))
    guards = [r.guard for r in rows]
    assert Guard.HAS_TOOL_CALLS in guards
    tool_row = guards.index(Guard.HAS_TOOL_CALLS)
    assert all(r.dest is not S.DONE for r in rows[:tool_row])
    assert rows[tool_row].dest is S.DISPATCHING_TOOLS


def test_a_response_reporting_its_own_failure_wins_over_its_tool_calls() -> None:
    guards = [r.guard for r in rows_from(S.AWAITING_MODEL, T.MODEL_RESPONDED)]
    assert guards.index(Guard.REPORTS_ERROR) < guards.index(Guard.HAS_TOOL_CALLS)
    assert guards.index(Guard.REPORTS_ABORT) < guards.index(Guard.HAS_TOOL_CALLS)


def test_abort_is_accepted_in_every_live_state() -> None:
    live = set(TurnState) - TERMINAL
    assert {r.source for r in TRANSITIONS if r.trigger is T.ABORT} == live


def test_every_state_is_reachable_from_ready() -> None:
    reached: set[State] = {S.READY}
    frontier: list[State] = [S.READY]
    while frontier:
        state = frontier.pop()
        for row in TRANSITIONS:
            if row.source is state and row.dest not in reached:
                reached.add(row.dest)
                frontier.append(row.dest)
    assert reached == set(TurnState)


def test_every_non_terminal_state_can_reach_a_terminal_state() -> None:
    for state in set(TurnState) - TERMINAL:
        seen: set[State] = {state}
        frontier: list[State] = [state]
        while frontier:
            current = frontier.pop()
            for row in TRANSITIONS:
                if row.source is current and row.dest not in seen:
                    seen.add(row.dest)
                    frontier.append(row.dest)
        assert seen & TERMINAL, state


def _machine(holding: set[Guard], initial: TurnState = S.READY) -> tuple[Any, Machine]:
    # Any: transitions binds trigger methods on the model at run time.
    model: Any = MachineModel()
    guards: dict[Guard, Callable[[], bool]] = {
        g: (lambda g=g: g in holding)  # type: ignore[misc]
        for g in Guard
    }
    return model, build_machine(model, guards, initial)


def _group_order(key: tuple[TurnState, Trigger]) -> tuple[str, str]:
    return (key[0].value, key[1].value)


GROUP_KEYS = sorted(_groups(), key=_group_order)


def test_machine_has_no_auto_transitions() -> None:
    model, _ = _machine(set())
    for state in TurnState:
        assert not hasattr(model, f"to_{state.value}")
    assert model.state is S.READY


def test_machine_raises_on_a_trigger_without_a_row() -> None:
    model, _ = _machine(set())
    with pytest.raises(MachineError):
        model.trigger("tool_finished")
    assert model.state is S.READY
    with pytest.raises(AttributeError):
        model.trigger("no_such_trigger")


@pytest.mark.parametrize("key", GROUP_KEYS, ids="-".join)
def test_machine_follows_the_table_row_by_row(key: tuple[TurnState, Trigger]) -> None:
    # For each row, make only its guard hold: the machine must land on that row's
    # destination (an unguarded last row is reached when no guard holds).
    source, trigger = key
    for row in _groups()[key]:
        assert not isinstance(row.guard, OutcomeIs)  # the base table: the library's guards
        model, _ = _machine({row.guard} if row.guard is not None else set(), initial=source)
        assert model.trigger(trigger.value) is True
        assert model.state is row.dest, row


@pytest.mark.parametrize("key", GROUP_KEYS, ids="-".join)
def test_machine_takes_the_first_row_whose_guard_holds(key: tuple[TurnState, Trigger]) -> None:
    source, trigger = key
    rows = _groups()[key]
    model, _ = _machine(set(Guard), initial=source)
    assert model.trigger(trigger.value) is True
    assert model.state is rows[0].dest


def test_machine_does_not_move_when_no_row_applies() -> None:
    for trigger, guard in INTERNAL_TRIGGERS.items():
        for row in TRANSITIONS:
            if row.trigger is trigger and row.guard is guard:
                assert isinstance(row.source, TurnState)
                model, _ = _machine(set(Guard) - {guard}, initial=row.source)
                assert model.trigger(trigger.value) is False
                assert model.state is row.source


def test_every_run_starts_from_the_first_rows_source() -> None:
    # The diagrams read a table's start from its first row.
    from statemachine.core.table import INITIAL, TRANSITIONS

    assert TRANSITIONS[0].source is INITIAL
    from statemachine import UserMessage

    engine = Engine(tools=[], messages=[UserMessage("go")])
    assert engine.state is INITIAL


@pytest.mark.timeout(30)
def test_the_lone_internal_rows_carry_their_firing_guard() -> None:
    # The table's docstring: the lone rows of dispatched and settled carry the guard
    # that fires them, so the diagrams can show it. (Without it the engine behaves the
    # same, because it fires them only when the guard holds; the drawing does not.)
    for trigger in (Trigger.DISPATCHED, Trigger.SETTLED):
        rows = [r for r in TRANSITIONS if r.trigger is trigger]
        assert len(rows) == 1, trigger
        assert rows[0].guard is INTERNAL_TRIGGERS[trigger], trigger
