"""The transition log (statemachine.core.trace): a ``Trace`` reads as the list of its
``TransitionRecord``; the records the engine adds are shared by traces, within a bound."""

from __future__ import annotations

from unittest import mock

import pytest

from statemachine.core import trace as trace_module
from statemachine.core.table import Trigger, TurnState
from statemachine.core.trace import Trace, TransitionRecord

S = TurnState
T = Trigger
RECORDS = [
    TransitionRecord(S.READY, T.START, S.AWAITING_MODEL, 0),
    TransitionRecord(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.DISPATCHING_TOOLS, 1),
    TransitionRecord(S.DISPATCHING_TOOLS, T.DISPATCHED, S.COLLECTING_RESULTS, 1),
    TransitionRecord(S.COLLECTING_RESULTS, T.RESULTS_COMPLETE, S.TURN_BOUNDARY, 12_345_678),
]


def test_a_trace_reads_as_the_list_of_its_records() -> None:
    trace = Trace(RECORDS)
    assert len(trace) == len(RECORDS)
    assert list(trace) == RECORDS
    assert tuple(trace) == tuple(RECORDS)
    assert trace == RECORDS
    assert RECORDS == trace  # noqa: SIM300 - the list's side of the comparison
    assert trace == tuple(RECORDS)
    assert trace != RECORDS[:-1]
    assert trace != [*RECORDS[:-1], RECORDS[0]]
    assert trace != "not a trace"
    for i in range(-len(RECORDS), len(RECORDS)):
        assert trace[i] == RECORDS[i]
        assert type(trace[i]) is TransitionRecord
    for cut in (slice(1, None), slice(None, -1), slice(None, None, 2), slice(3, 1)):
        assert trace[cut] == RECORDS[cut]
    with pytest.raises(IndexError):
        trace[len(RECORDS)]
    assert repr(trace) == repr(RECORDS)
    assert RECORDS[2] in trace
    assert trace.index(RECORDS[3]) == 3
    assert Trace() == []
    assert not Trace()


def test_a_copy_is_independent_and_equal() -> None:
    trace = Trace(RECORDS[:2])
    copy = trace.copy()
    assert copy == trace
    copy.append(RECORDS[2])
    assert len(trace) == 2
    assert len(copy) == 3
    assert copy != trace


def test_dests_reads_the_destinations_from_an_index_on() -> None:
    trace = Trace(RECORDS)
    assert trace.dests() == [r.dest for r in RECORDS]
    assert trace.dests(2) == [r.dest for r in RECORDS[2:]]
    assert trace.dests(len(RECORDS)) == []


def test_a_trace_built_from_plain_values_holds_records_of_states_and_triggers() -> None:
    trace = Trace([("Ready", "start", "AwaitingModel", 0)])  # type: ignore[list-item]
    assert trace == [RECORDS[0]]
    assert type(trace[0]) is TransitionRecord
    assert trace[0].source is S.READY
    assert trace[0].trigger is T.START


def test_a_trace_is_not_hashable() -> None:
    with pytest.raises(TypeError):
        hash(Trace())


def test_reads_stay_right_as_the_log_grows() -> None:
    trace = Trace(RECORDS[:2])
    first = trace[:]
    assert first == RECORDS[:2]
    iterator = iter(trace)
    for record in RECORDS[2:]:
        trace.append(record)
    assert list(iterator) == RECORDS[:2]  # an iteration sees the log as it was
    assert first == RECORDS[:2]  # a slice is a list of its own
    assert trace[:] == RECORDS
    assert trace[1] is first[1]
    assert trace[-1] == RECORDS[-1]
    assert list(trace) == RECORDS
    copy = trace.copy()
    copy.append(RECORDS[0])
    assert list(trace) == RECORDS
    assert list(copy) == [*RECORDS, RECORDS[0]]
    assert copy[:-1] == RECORDS


def test_comparing_with_something_else_lets_the_other_side_answer() -> None:
    # Trace.__eq__ answers NotImplemented for what it does not know, as list does, so
    # Python asks the other operand: a matcher such as mock.ANY then decides.
    trace = Trace(RECORDS)
    assert trace == mock.ANY
    assert trace != object()
    assert trace != "not a trace"
    assert trace.__eq__(object()) is NotImplemented


def test_add_records_the_transition_as_a_record_of_its_fields() -> None:
    trace = Trace()
    for record in RECORDS:
        trace.add(record.source, record.trigger, record.dest, record.turn)
    assert list(trace) == RECORDS
    assert all(type(record) is TransitionRecord for record in trace)
    assert trace[3].turn == 12_345_678


def test_traces_that_take_the_same_transitions_share_their_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace_module, "_SHARED", {})  # not full of other tests' records
    first, second = Trace(), Trace()
    for record in RECORDS:
        first.add(*record)
        second.add(*record)
    assert first == second == RECORDS
    assert all(a is b for a, b in zip(first, second, strict=True))
    assert type(first[0]) is TransitionRecord


def test_the_shared_records_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_module, "_SHARED", {})
    monkeypatch.setattr(trace_module, "SHARED_RECORDS_MAX", 3)
    first, second = Trace(), Trace()
    for turn in range(10):
        first.add(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.DONE, turn)
        second.add(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.DONE, turn)
    assert len(trace_module._SHARED) == 3
    expected = [TransitionRecord(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.DONE, n) for n in range(10)]
    assert first == second == expected
    assert [a is b for a, b in zip(first, second, strict=True)] == [True] * 3 + [False] * 7


def test_only_records_of_states_triggers_and_int_turns_are_shared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "Ready" equals S.READY and True equals 1, but they would be written out otherwise:
    # such a record is not given to the traces that come after it.
    monkeypatch.setattr(trace_module, "_SHARED", {})
    odd = Trace()
    odd.add("Ready", "start", "AwaitingModel", True)  # type: ignore[arg-type]
    odd.add(S.READY, T.START, S.AWAITING_MODEL, 1.0)  # type: ignore[arg-type]
    assert trace_module._SHARED == {}
    trace = Trace()
    trace.add(S.READY, T.START, S.AWAITING_MODEL, 1)
    record = trace[0]
    assert record.source is S.READY
    assert record.trigger is T.START
    assert type(record.turn) is int
    assert list(trace_module._SHARED) == [record]
