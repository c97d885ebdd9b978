"""The transition log: one immutable record per transition an engine takes.

``Engine.trace`` is a ``Trace`` of these, oldest first; the journal, the diagrams and
the snapshot write them out, and ``EngineInvariantError.trace`` carries the ones that
led to a broken table.

A ``Trace`` stores one int per transition and makes each ``TransitionRecord`` when it
is first read, once: an engine takes several transitions per event, and while it runs
the log costs an append of an int instead of a tuple made and kept (and walked by the
garbage collector) per transition; a reader that reads the whole log (a run's result,
a replay's steps and its digest) makes each record once. It reads as the list it
replaces: length, indexing and slices (a slice is a list of records), iteration, and
equality with a list or tuple of records.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final, NamedTuple, overload

from statemachine.core.table import Trigger, TurnState

__all__ = ["TURN", "Trace", "TransitionRecord", "transition_code", "transition_of"]


class TransitionRecord(NamedTuple):
    """One step of the transition log (immutable).

    A named tuple rather than an attrs class: it is made for every record read, and a
    tuple is made at under half the cost (bench/, replay).
    """

    source: TurnState
    trigger: Trigger
    dest: TurnState
    turn: int


# A transition is stored as turn * TURN + the number of its (source, trigger, dest):
# numbers are given out as transitions are first seen, and there are fewer possible
# triples (11 states, 17 triggers, 11 states) than TURN.
_SHIFT: Final = 12
TURN: Final = 1 << _SHIFT  # a power of two: a code splits into turn and number by bits
_TRIPLES: list[tuple[TurnState, Trigger, TurnState]] = []
_NUMBERS: dict[tuple[TurnState, Trigger, TurnState], int] = {}


def transition_code(source: TurnState, trigger: Trigger, dest: TurnState) -> int:
    """The number of ``(source, trigger, dest)`` in a trace (``turn * TURN`` is added)."""
    triple = (TurnState(source), Trigger(trigger), TurnState(dest))
    number = _NUMBERS.get(triple)
    if number is None:
        number = _NUMBERS[triple] = len(_TRIPLES)
        _TRIPLES.append(triple)
    return number


def transition_of(number: int) -> tuple[TurnState, Trigger, TurnState]:
    """The ``(source, trigger, dest)`` numbered ``number`` (a code's remainder by ``TURN``)."""
    return _TRIPLES[number]


_MASK: Final = TURN - 1
# A record from one tuple, without the named tuple's Python-level __new__ (a run's
# result reads its whole trace: several records per event).
_new_record: Final[Callable[[tuple[TurnState, Trigger, TurnState, int]], TransitionRecord]] = (
    functools.partial(tuple.__new__, TransitionRecord)
)


def _record(code: int) -> TransitionRecord:
    return _new_record(_TRIPLES[code & _MASK] + (code >> _SHIFT,))


class Trace(Sequence[TransitionRecord]):
    """An engine's transition log: a list of ``TransitionRecord`` stored compactly."""

    __slots__ = ("_built", "_codes")

    def __init__(self, records: Iterable[TransitionRecord] = ()) -> None:
        self._codes: list[int] = []
        # The records made so far, a prefix of the log: each is made once, when first
        # read (a run's result, a replay's steps and its digest read the same ones).
        self._built: list[TransitionRecord] = []
        for record in records:
            self.append(record)

    def append(self, record: TransitionRecord) -> None:
        source, trigger, dest, turn = record
        self._codes.append(turn * TURN + transition_code(source, trigger, dest))

    def copy(self) -> Trace:
        out = Trace.__new__(Trace)
        out._codes = self._codes.copy()
        out._built = self._built.copy()
        return out

    def dests(self, start: int = 0) -> list[TurnState]:
        """The destination of every transition from index ``start`` on, without making
        their records (what a driver reads after each event to time the turns)."""
        triples = _TRIPLES
        mask = _MASK
        return [triples[code & mask][2] for code in self._codes[start:]]

    def codes(self) -> list[int]:
        """The log as stored, a copy: each transition as ``turn * TURN`` plus its number
        (``transition_of``). For a reader of the whole log that needs no records (the
        journal's digest writes its text from these)."""
        return self._codes.copy()

    def _records(self) -> list[TransitionRecord]:
        """Every record, made now for the transitions not read before."""
        built = self._built
        codes = self._codes
        if len(built) < len(codes):
            triples, new, mask, shift = _TRIPLES, _new_record, _MASK, _SHIFT
            built += [new(triples[c & mask] + (c >> shift,)) for c in codes[len(built) :]]
        return built

    def __len__(self) -> int:
        return len(self._codes)

    @overload
    def __getitem__(self, index: int) -> TransitionRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[TransitionRecord]: ...

    def __getitem__(self, index: int | slice) -> TransitionRecord | list[TransitionRecord]:
        if isinstance(index, slice):
            return self._records()[index]
        built = self._built
        if 0 <= index < len(built):
            return built[index]
        return _record(self._codes[index])

    def __iter__(self) -> Iterator[TransitionRecord]:
        return iter(self._records().copy())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Trace):
            return self._codes == other._codes
        if isinstance(other, (list, tuple)):
            return len(other) == len(self._codes) and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))
