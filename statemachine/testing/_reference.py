"""The reference model: the table as a plain ``transitions.Machine``, built independently.

The engine interprets the table with its own loop (``Engine._fire``). This module
builds the same table, row by row, into a machine of the ``transitions`` package,
which has its own implementation of "the first row whose guard holds";
``verify_transition`` runs each transition the engine takes through that machine as
well and raises on any disagreement. A test asks for it explicitly, per engine:
``Engine(..., transition_hook=verify_transition)``, or ``verified_engine(...)``. The
core never imports this module: the ``transitions`` package is needed only here and
by the diagram command.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from transitions import Machine

from statemachine.core import table as _table
from statemachine.core.engine import Engine
from statemachine.core.table import INITIAL, Guard, OutcomeIs, State, Trigger, TurnState

__all__ = [
    "MachineModel",
    "build_machine",
    "reference_machine",
    "verified_engine",
    "verify_transition",
]


class MachineModel:
    """What holds the state: the shape of a ``transitions`` model."""

    state: TurnState


def _machine_guard(guard: Guard, engine: Engine) -> bool:
    return engine.guard_holds(guard)


@functools.cache
def reference_machine() -> Machine:
    """The plain ``transitions.Machine`` built from the table, with no model of its own.

    Its guards take the engine as their argument, so one machine serves every engine.
    Cached: a test that installs another table clears it (``cache_clear``).
    """
    guards = {guard: functools.partial(_machine_guard, guard) for guard in Guard}
    return build_machine(None, guards)


def build_machine(
    model: object, guards: Mapping[Guard, Any], initial: TurnState = INITIAL
) -> Machine:
    """A plain ``transitions.Machine`` for ``model``, derived row by row from the table.

    ``auto_transitions=False`` because the ``to_<state>`` helpers would skip every
    guard; invalid triggers keep raising; dispatch goes through ``trigger(name)``
    because a trigger whose name collides with a model attribute is silently not
    bound as a method. The table is read through its module, so that a test may
    install another one.
    """
    machine = Machine(
        model=model,
        states=list(TurnState),
        initial=initial,
        auto_transitions=False,
        ignore_invalid_triggers=False,
        send_event=False,
        model_override=False,
    )
    for row in _table.TRANSITIONS:
        # The base table: its rows have the library's states and guards only.
        assert isinstance(row.source, TurnState)
        assert isinstance(row.dest, TurnState)
        assert not isinstance(row.guard, OutcomeIs)
        conditions = [guards[row.guard]] if row.guard is not None else None
        machine.add_transition(row.trigger.value, row.source, row.dest, conditions=conditions)
    return machine


def verify_transition(engine: Engine, source: State, trigger: Trigger, dest: State | None) -> None:
    """A transition hook (``TransitionHook``): the reference machine must go where the
    engine goes.

    A trigger for which the engine's dispatch found no row is left alone: the engine
    raises ``ProtocolError`` for it anyway.
    """
    if dest is None:
        return
    # The reference machine is built from the base table: a run with declared steps is
    # held to its declarations by the checker's rules instead (testing/_oracle.py).
    if not isinstance(source, TurnState):
        return
    mirror = MachineModel()
    mirror.state = source
    moved = reference_machine().events[trigger.value].trigger(mirror, engine)
    if not moved or mirror.state is not dest:
        raise AssertionError(
            f"the transitions machine took {trigger} from {source} to "
            f"{mirror.state if moved else 'nowhere'}; the engine chose {dest}"
        )


def verified_engine(**options: Any) -> Engine:
    """``Engine(**options)`` whose every transition is checked by ``verify_transition``."""
    return Engine(transition_hook=verify_transition, **options)
