"""The exhaustive bounded checker: every event sequence the real engine accepts, checked.

This module owns the exploration of the sans-IO ``Engine``'s state space within
bounds (turns, tool calls per response, the engine configurations to try), the
checks made at every reachable state and on every refused event, and the
``python -m statemachine check`` command.

How it works
------------
Breadth-first search over engine configurations. From each reachable engine the
checker offers every candidate engine event that ``EVENT_SOURCES`` produces for the
triggers the table accepts in that state: all model responses within the bounds
(0..M tool calls, each call valid, to an unknown tool or with invalid arguments,
every stop reason, plus one response whose ids need normalising), every permission
answer, every tool finishing (with a result or an error) in any order, cancellation,
abort at every point. The engine decides what it accepts; an event it refuses must
raise ``ProtocolError`` and change nothing, which is checked too. For each state the
checker also offers one event of every trigger the table does *not* accept there, and
checks that it is refused (or, in a terminal state, absorbed) without any change.

Nothing here restates the table: the triggers come from ``INPUT_TRIGGERS``, coverage
is measured against ``TRANSITIONS``. A new input trigger needs one entry in
``EVENT_SOURCES`` (the checker reports a trigger without one); a new engine option
needs one entry in ``DEFAULT_CONFIGS``.

Held to the rules. The invariants say what a run must never do, not where each event
must lead; a table row with the wrong destination or guard can keep every invariant.
So each engine the search makes is watched: its ``transition_hook`` (the one
``_coverage.observing`` makes, run after any hook the engine already had) records
every trigger it fires with the guard values of that moment, compared with the rules
oracle (``_oracle``), the table's prose rules written a second time without reading
a row. The check reports, with the events that lead there, a destination the rules
do not give (``rule 7: in TurnBoundary on next_turn with stop_requested=True, ...,
expected Done, actual TurnLimitExceeded``), a trigger accepted by one and not the
other, an internal trigger left unfired though due, and actions that are not what
the transitions announce (a model call per ``AwaitingModel`` entered, a cancel per
``Aborting``, a check per turn boundary with the hook, a ``ReturnToCaller`` per return to
the caller). Row coverage counts the row the dispatch applied, by position, so two
rows of a group with one destination are told apart.

Deduplication. Two engines are merged when their ``Engine.control_key()`` values are
equal: the state, the turn counter and every other field that decides what the engine
does next, but not the history or the transition log (``Engine`` declares which
field is which, and a test fails for a field it does not declare). The history
is left out on purpose: the engine never reads it back to decide anything, and the
only part of it the future can pair with (the calls of the current batch) is in the
batch bookkeeping, which is in the key. Every new state is checked on the history of
the path that reached it first, and every transition checks what it appended, so
merging loses no violation. Call ids are made unique per turn by the checker, which
is why the set of ids seen (used only to normalise repeats) can stay out of the key
as well.

Copying engines. The checker uses only the engine's public API. With the default
strategy (``snapshot``) each state still to expand keeps an engine in that state, and
expanding it hands each candidate event to a fresh ``Engine.fork()`` of it; the
alternative (``replay``) rebuilds an engine from the configuration and re-handles the
event prefix. Both give the same report; ``--strategy`` picks one.

Modules: this one holds the public API and the report; ``_space`` the scenario, the
bounds and the candidate events; ``_explore`` the search; ``_coverage`` row coverage
and the rules oracle's view of each transition; the command is
``statemachine/cli/check.py``.
"""

from __future__ import annotations

import os
import time
from typing import IO, Literal

import attrs

from statemachine.core import table as _table
from statemachine.core.engine import Engine
from statemachine.core.events import Event
from statemachine.core.table import Transition
from statemachine.testing._explore import _Search
from statemachine.testing._space import (
    DEFAULT_CONFIGS,
    ERROR_OUTPUT,
    EVENT_SOURCES,
    FIRST_MESSAGE,
    INVALID_ARGUMENTS,
    OK_OUTPUT,
    TOOL,
    UNKNOWN_CALL,
    UNKNOWN_TOOL,
    VALID_ARGUMENTS,
    Bounds,
    CallKind,
    CheckViolation,
    Config,
    EventSource,
    _SilentLogger,
)

__all__ = [
    "DEFAULT_CONFIGS",
    "ERROR_OUTPUT",
    "EVENT_SOURCES",
    "FIRST_MESSAGE",
    "INVALID_ARGUMENTS",
    "OK_OUTPUT",
    "TOOL",
    "UNKNOWN_CALL",
    "UNKNOWN_TOOL",
    "VALID_ARGUMENTS",
    "Bounds",
    "CallKind",
    "CheckReport",
    "CheckViolation",
    "Config",
    "EventSource",
    "check_engine",
    "write_counterexample",
]


@attrs.frozen
class CheckReport:
    """What one exhaustive check explored and found."""

    bounds: Bounds
    states: int
    transitions: int
    refusals: int
    rows_taken: frozenset[int]
    dead_ends: tuple[CheckViolation, ...]
    violations: tuple[CheckViolation, ...]
    seconds: float
    strategy: str
    table: tuple[Transition, ...] = attrs.field(factory=lambda: _table.TRANSITIONS)
    """The rows ``rows_taken`` indexes: the table as it was when the check ran."""

    @property
    def rows_missed(self) -> tuple[Transition, ...]:
        """Rows no transition took, each row itself (two rows of one group may share a
        destination, so rows are told apart by position, not by where they lead)."""
        return tuple(row for i, row in enumerate(self.table) if i not in self.rows_taken)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.dead_ends and not self.rows_missed

    def summary(self) -> str:
        lines = [
            f"explored {self.states} states and {self.transitions} transitions "
            f"({self.refusals} refused events checked) in {self.seconds:.1f} s "
            f"[turns={self.bounds.turns}, calls={self.bounds.calls}, "
            f"strategy={self.strategy}]",
            "configurations: " + "; ".join(c.describe() for c in self.bounds.configs),
            f"table rows taken: {len(self.rows_taken)}/{len(self.table)}",
        ]
        for row in self.rows_missed:
            lines.append(
                f"  NOT TAKEN: {row.source.value} --{row.trigger.value}"
                f"{'[' + row.guard.value + ']' if row.guard else ''}--> {row.dest.value}"
            )
        lines.append(f"dead ends (non-terminal states accepting nothing): {len(self.dead_ends)}")
        lines.append(f"violations: {len(self.violations)}")
        for v in (*self.dead_ends, *self.violations)[:10]:
            lines.append(f"  {v}")
            lines.append(f"    config {dict(v.config)}, path from the start:")
            lines.extend(f"      {_describe(e)}" for e in v.path)
        return "\n".join(lines)


def _describe(event: Event) -> str:
    from statemachine.journal import describe_event  # the journal owns the readable form

    return describe_event(event)


def write_counterexample(
    violation: CheckViolation,
    target: str | os.PathLike[str] | IO[str],
    *,
    bounds: Bounds | None = None,
    engine_class: type[Engine] = Engine,
) -> int:
    """Write the path that led to ``violation`` as a journal; return the events written.

    The journal is made by ``engine_class`` (the engine that was checked) in the
    configuration of the violation, so ``replay(target, engine_class=engine_class)``
    reproduces the run, and replaying it into another engine (the real ``Engine``, for
    a deliberately broken one) names the first line where the two part ways. An event
    the engine refused ends the journal: it is not part of the run.
    """
    from statemachine.journal import Journal, JournalingEngine

    bounds = bounds or Bounds()
    recording = type(f"Journaling{engine_class.__name__}", (JournalingEngine, engine_class), {})
    with Journal(target) as journal:
        engine = recording(
            journal=journal,
            tools=[TOOL],
            messages=[FIRST_MESSAGE],
            max_turns=bounds.turns,
            run_id="counterexample",
            logger=_SilentLogger(),
            **violation.config,
        )
        for event in violation.path:
            try:
                engine.handle(event)
            except Exception:  # noqa: BLE001 - the refused or crashing event ends the run
                break
        return journal.events_written


def check_engine(
    bounds: Bounds | None = None,
    *,
    engine_class: type[Engine] = Engine,
    strategy: Literal["snapshot", "replay"] = "snapshot",
) -> CheckReport:
    """Explore ``engine_class`` exhaustively within ``bounds``; see the module docstring."""
    bounds = bounds or Bounds()
    if strategy not in ("snapshot", "replay"):
        raise ValueError(f"strategy must be 'snapshot' or 'replay', got {strategy!r}")
    started = time.perf_counter()
    states = transitions = refusals = 0
    rows: set[int] = set()
    violations: list[CheckViolation] = []
    dead_ends: list[CheckViolation] = []
    for config in bounds.configs:
        search = _Search(bounds, config, engine_class, strategy)
        search.run()
        states += search.states
        transitions += search.transitions
        refusals += search.refusals
        rows |= search.rows
        violations += search.violations
        dead_ends += search.dead_ends
    return CheckReport(
        bounds=bounds,
        states=states,
        transitions=transitions,
        refusals=refusals,
        rows_taken=frozenset(rows),
        dead_ends=tuple(dead_ends),
        violations=tuple(violations),
        seconds=time.perf_counter() - started,
        strategy=strategy,
        table=_checked_rows(bounds),
    )


def _checked_rows(bounds: Bounds) -> tuple[Transition, ...]:
    """The rows the check ran on: the table its configurations give (``table``, one
    for all of them: a team's with its steps), else the library's as it stands."""
    tables = {id(t): t for c in bounds.configs if (t := c.options.get("table")) is not None}
    if len(tables) > 1:
        raise ValueError("the configurations of one check give different tables")
    table = next(iter(tables.values()), None)
    return _table.TRANSITIONS if table is None else table.rows
