"""Holding the engine to the rules, and counting the table rows it takes.

The invariants say what a run must never do, not where each event must lead; a table
row with the wrong destination or guard can keep every invariant. So the search
watches the engine through the hook that ``observing`` makes, set as each engine's
``transition_hook``: every trigger fired is recorded as a ``_Firing`` with the guard
values of that moment (asked through ``Engine.guard_holds``), the rules' verdict
(``_oracle``, the table's prose rules written a second time without reading a row)
and the table row that applies, counted by position so that two rows of a group with
one destination are told apart. ``RuleChecks`` is the part of the search that reads
the firings of one event: row coverage, disagreements with the rules, and the
actions each transition's entry must announce.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from statemachine.core.engine import Engine, TransitionHook
from statemachine.core.events import (
    CallModel,
    CancelOperations,
    CheckContinue,
    CheckPermission,
    Event,
    ReturnToCaller,
    RunStep,
    StartTool,
)
from statemachine.core.steps import StepSpec
from statemachine.core.table import (
    INTERNAL_TRIGGERS,
    RowGuard,
    State,
    Transition,
    Trigger,
    TurnState,
)
from statemachine.testing import _oracle as _rules
from statemachine.testing._space import Bounds

S = TurnState


@attrs.frozen
class _Firing:
    """One trigger the engine fired, as seen from inside its dispatch."""

    source: State
    trigger: Trigger
    guards: tuple[tuple[RowGuard, bool], ...]  # every guard consulted, in the order asked
    expected: _rules.Expected | None  # where the rules send the run (None: not accepted)
    due: Trigger | None  # for an internal trigger: the one the rules fire here now
    row: int | None  # the table row the engine's own dispatch applies
    actual: State | None  # where the engine went (None: it raised, no row applied)

    def describe_guards(self) -> str:
        return ", ".join(f"{g.value}={v}" for g, v in self.guards) or "no guard consulted"


_ANNOUNCED = (CallModel, CancelOperations, CheckContinue, RunStep, ReturnToCaller)


def _count(counter: collections.Counter[type]) -> str:
    return (
        ", ".join(
            f"{n} {cls.__name__}"
            for cls, n in sorted(counter.items(), key=lambda item: item[0].__name__)
            if n
        )
        or "nothing"
    )


def _rules_never(guard: RowGuard) -> bool:
    return False


def _guard_value(engine: Engine, guard: RowGuard) -> bool:
    return engine.guard_holds(guard)


def _disagreement(firing: _Firing) -> str | None:
    """Why ``firing`` contradicts the rules, in words; ``None`` if it does not."""
    source, trigger = firing.source.value, firing.trigger.value
    went = firing.actual.value if firing.actual is not None else "nowhere (no row applied)"
    if firing.trigger in INTERNAL_TRIGGERS and firing.due is not firing.trigger:
        due = firing.due.value if firing.due is not None else "nothing"
        return (
            f"the theory of operation: the engine fired {trigger} in {source} "
            f"({firing.describe_guards()}), but the rules fire {due} there"
        )
    if firing.expected is None:
        return f"rule 12: no rule accepts {trigger} in {source}, yet the engine went to {went}"
    if firing.actual != firing.expected.dest:  # a declared state is equal by its name
        return (
            f"{firing.expected.rule}: in {source} on {trigger} with "
            f"{firing.describe_guards()}, expected {firing.expected.dest.value}, "
            f"actual {went}"
        )
    return None


# Rows by (source, trigger): (index in the table, guard), in table order.
_RowGroups = Mapping[tuple[State, Trigger], tuple[tuple[int, RowGuard | None], ...]]


def _row_groups(table: Sequence[Transition]) -> _RowGroups:
    groups: dict[tuple[State, Trigger], tuple[tuple[int, RowGuard | None], ...]] = {}
    for i, row in enumerate(table):
        key = (row.source, row.trigger)
        groups[key] = (*groups.get(key, ()), (i, row.guard))
    return groups


def observing(
    firings: list[_Firing], groups: _RowGroups, steps: tuple[StepSpec, ...] = ()
) -> TransitionHook:
    """A transition hook that records each firing with the guard values of that moment,
    the rules' verdict and the table row that applies.

    The hook runs before the state changes, so the guards asked here give the values
    the engine decided on (guards are pure). The records go to a list the search owns,
    not to the engine, so forks and keys ignore them.
    """

    def hook(engine: Engine, source: State, trigger: Trigger, dest: State | None) -> None:
        memo: dict[RowGuard, bool] = {}

        def holds(guard: RowGuard) -> bool:
            if guard not in memo:
                memo[guard] = engine.guard_holds(guard)
            return memo[guard]

        expected = _rules.destination(source, trigger, holds, steps)
        due = _rules.due(source, holds) if trigger in INTERNAL_TRIGGERS else None
        row = next((i for i, g in groups.get((source, trigger), ()) if g is None or holds(g)), None)
        firings.append(_Firing(source, trigger, tuple(memo.items()), expected, due, row, dest))

    return hook


def both(first: TransitionHook | None, then: TransitionHook) -> TransitionHook:
    """A hook that runs ``first`` (when there is one), then ``then``."""
    if first is None:
        return then

    def hook(engine: Engine, source: State, trigger: Trigger, dest: State | None) -> None:
        first(engine, source, trigger, dest)
        then(engine, source, trigger, dest)

    return hook


class RuleChecks:
    """The search's checks on the firings of one event (mixed into the search)."""

    bounds: Bounds
    check_continue: bool
    firings: list[_Firing]
    rows: set[int]

    def _violate(self, invariant: str, message: str, path: tuple[Event, ...]) -> None:
        raise NotImplementedError

    def _check_firings(self, path: tuple[Event, ...]) -> list[_Firing] | None:
        """Count the rows the engine took, and hold each firing to the rules.

        Returns the firings, or ``None`` once a disagreement is reported (what follows
        from a wrong step would only repeat it)."""
        firings = list(self.firings)
        self.firings.clear()
        for firing in firings:
            if firing.row is not None and firing.actual is not None:
                self.rows.add(firing.row)
        if not self.bounds.rules:
            return firings
        for firing in firings:
            problem = _disagreement(firing)
            if problem is not None:
                self._violate("rules", problem, path)
                return None
        return firings

    def _check_effects(
        self,
        engine: Engine,
        actions: Sequence[Any],
        firings: list[_Firing],
        before_turns: int,
        path: tuple[Event, ...],
    ) -> None:
        """The actions of one event are those its transitions' entries announce, and
        the engine rests only where no internal trigger is due."""
        expected: collections.Counter[type] = collections.Counter()
        for f in firings:
            if f.actual is not None:
                expected += _rules.entry_actions(
                    f.source, f.actual, check_continue=self.check_continue
                )
        actual = collections.Counter(type(a) for a in actions if type(a) in _ANNOUNCED)
        steps = " then ".join(
            f"{f.source.value} --{f.trigger.value}--> {f.actual.value if f.actual else '?'}"
            for f in firings
        )
        if actual != expected:
            self._violate(
                "rules",
                f"effects: {steps} announces {_count(expected)}; the engine emitted "
                f"{_count(actual)}",
                path,
            )
        elif engine.turns - before_turns != expected[CallModel]:
            self._violate(
                "rules",
                f"effects: {steps} makes {expected[CallModel]} model call(s), but the turn "
                f"counter went from {before_turns} to {engine.turns}",
                path,
            )
        into = {f.actual for f in firings if f.actual != f.source}
        stays = {f.actual for f in firings}
        if any(isinstance(a, StartTool) for a in actions) and S.COLLECTING_RESULTS not in stays:
            self._violate(
                "rules", f"effects: {steps} started a tool outside CollectingResults", path
            )
        if any(isinstance(a, CheckPermission) for a in actions) and (
            S.DISPATCHING_TOOLS not in into
        ):
            self._violate(
                "rules",
                f"effects: {steps} asked for permission without entering DispatchingTools",
                path,
            )
        state = engine.state
        pending = _rules.due(state, functools.partial(_guard_value, engine))
        if pending is not None:
            self._violate(
                "rules",
                f"the theory of operation: the engine rests in {state.value}, but "
                f"{pending.value} is due there (its guard holds)",
                path,
            )
