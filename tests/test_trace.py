"""The transition log (statemachine.core.trace): stored one int per transition, read
as the list of ``TransitionRecord`` it replaces."""

from __future__ import annotations

from unittest import mock

import pytest

from statemachine.core.table import Trigger, TurnState
from statemachine.core.trace import TURN, Trace, TransitionRecord, transition_code

S = TurnState
T = Trigger
RECORDS = [
    TransitionRecord(S.Ready, T.start, S.AwaitingModel, 0),
    TransitionRecord(S.AwaitingModel, T.model_responded, S.DispatchingTools, 1),
    TransitionRecord(S.DispatchingTools, T.dispatched, S.CollectingResults, 1),
    TransitionRecord(S.CollectingResults, T.results_complete, S.TurnBoundary, 12_345_678),
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


def test_every_possible_transition_has_its_own_number_below_a_turn() -> None:
    numbers = {
        transition_code(source, trigger, dest)
        for source in TurnState
        for trigger in Trigger
        for dest in TurnState
    }
    assert len(numbers) == len(TurnState) ** 2 * len(Trigger)
    assert max(numbers) < TURN


def test_a_trace_is_not_hashable() -> None:
    with pytest.raises(TypeError):
        hash(Trace())


def test_each_record_is_made_once_and_reads_stay_right_as_the_log_grows() -> None:
    trace = Trace(RECORDS[:2])
    first = trace[:]
    assert first == RECORDS[:2]
    assert trace[0] is first[0]  # made once, when first read
    for record in RECORDS[2:]:
        trace.append(record)
    # Records made before the appends are kept; the new ones are made on the next read.
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
