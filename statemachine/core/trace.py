"""The transition log: one immutable record per transition an engine takes.

``Engine.trace`` is a ``Trace`` of ``TransitionRecord``, oldest first; the journal, the
diagrams and the snapshot write them out, and ``EngineInvariantError.trace`` carries
the ones that led to a broken table. A ``Trace`` reads as a list of records (length,
indexing and slices, iteration, equality with a list or tuple of records) that only
the engine appends to. The records the engine writes are shared by the traces that
take the same transition at the same turn (records are values: nothing tells them
apart but ``is``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Final, NamedTuple, overload

from statemachine.core.table import DeclaredState, State, Trigger, TurnState

__all__ = ["Trace", "TransitionRecord"]


class TransitionRecord(NamedTuple):
    """One step of the transition log: in ``source``, ``trigger`` led to ``dest``,
    after ``turn`` model calls."""

    source: State
    trigger: Trigger
    dest: State
    turn: int


# The records the engine writes are shared by every trace of the process: a record is an
# immutable value, and runs take the same transitions at the same turns, so a run keeps
# no record of its own for them (many runs waiting at once hold far fewer objects for
# the garbage collector to scan). A record is a tuple, so the plain tuple of its fields
# finds it. Only records of states, a trigger and an int enter (a "Ready" or a 1.0 is
# equal to them, but would be written out otherwise). Bounded: once full, the records
# not in it are made for each transition.
_SHARED: dict[tuple[State, Trigger, State, int], TransitionRecord] = {}
SHARED_RECORDS_MAX: Final = 1 << 12


def _shareable(record: TransitionRecord) -> bool:
    source, trigger, dest, turn = record
    return (
        source.__class__ is TurnState
        and trigger.__class__ is Trigger
        and dest.__class__ is TurnState
        and turn.__class__ is int
    )


def _state(value: State | str) -> State:
    # A declared state stays as it is; anything else is one of the library's by name.
    return value if isinstance(value, DeclaredState) else TurnState(value)


class Trace(Sequence[TransitionRecord]):
    """An engine's transition log: the records of its transitions, oldest first."""

    __slots__ = ("_records",)

    def __init__(self, records: Iterable[TransitionRecord] = ()) -> None:
        self._records = [
            TransitionRecord(_state(source), Trigger(trigger), _state(dest), turn)
            for source, trigger, dest, turn in records
        ]

    def append(self, record: TransitionRecord) -> None:
        """Add a record at the end of the log."""
        self._records.append(record)

    def add(self, source: State, trigger: Trigger, dest: State, turn: int) -> None:
        """Record the transition just taken (the engine's one write), as the record
        other traces share when there is one (see ``_SHARED``): a record with these
        fields, or equal to them."""
        fields = (source, trigger, dest, turn)
        record = _SHARED.get(fields)
        if record is None:
            record = TransitionRecord._make(fields)  # namedtuple's own, from a tuple
            if len(_SHARED) < SHARED_RECORDS_MAX and _shareable(record):
                _SHARED[record] = record
        self._records.append(record)

    def copy(self) -> Trace:
        """An independent log with the same records (records are immutable)."""
        out = Trace()
        out._records = self._records.copy()
        return out

    def dests(self, start: int = 0) -> list[State]:
        """The destination of every transition from index ``start`` on."""
        return [record.dest for record in self._records[start:]]

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, index: int) -> TransitionRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[TransitionRecord]: ...

    def __getitem__(self, index: int | slice) -> TransitionRecord | list[TransitionRecord]:
        return self._records[index]

    def __iter__(self) -> Iterator[TransitionRecord]:
        return iter(self._records.copy())  # a reader never sees a record appended later

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Trace):
            return self._records == other._records
        if isinstance(other, list):
            return self._records == other
        if isinstance(other, tuple):
            return self._records == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._records)
