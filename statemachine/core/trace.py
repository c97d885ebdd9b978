"""The transition log: one immutable record per transition an engine takes.

``Engine.trace`` is a list of these, oldest first; the journal, the diagrams and the
snapshot write them out, and ``EngineInvariantError.trace`` carries the ones that
led to a broken table.
"""

from __future__ import annotations

from typing import NamedTuple

from statemachine.core.table import Trigger, TurnState

__all__ = ["TransitionRecord"]


class TransitionRecord(NamedTuple):
    """One step of the transition log (immutable).

    A named tuple rather than an attrs class: the engine makes one per transition,
    several per event, and a tuple is made at under half the cost (bench/, replay).
    """

    source: TurnState
    trigger: Trigger
    dest: TurnState
    turn: int
