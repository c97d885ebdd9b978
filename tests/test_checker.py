"""The exhaustive checker: the real engine passes at the default bound, and the checker
catches deliberately broken engines (each kept here as proof that it can fail)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from statemachine.cli.check import cli_check
from statemachine.core.engine import GUARDS, Engine, GuardFunction
from statemachine.core.events import Action, CancelOperations, Event, ModelResponded, Start
from statemachine.core.invariants import history_violations
from statemachine.core.messages import AssistantMessage, ToolCall, UserMessage
from statemachine.core.table import (
    TERMINAL,
    TRANSITIONS,
    Guard,
    State,
    Transition,
    Trigger,
    TurnState,
)
from statemachine.errors import ProtocolError
from statemachine.journal import replay
from statemachine.testing._reference import verify_transition
from statemachine.testing.checker import (
    EVENT_SOURCES,
    Bounds,
    CheckReport,
    Config,
    check_engine,
    write_counterexample,
)

SMALL = Bounds(turns=2, calls=2, max_violations=3)


def _invariants(report: CheckReport) -> set[str]:
    return {v.invariant for v in report.violations}


def test_default_bound_passes_and_takes_every_row() -> None:
    report = check_engine()
    assert report.violations == ()
    assert report.dead_ends == ()
    assert report.rows_missed == ()
    assert report.rows_taken == frozenset(range(len(TRANSITIONS)))
    assert report.ok
    # Every configuration, turn and batch shape: far more than a handful of states.
    assert report.states > 1000
    assert report.transitions > report.states
    assert report.refusals > 0


class ReferenceCheckedEngine(Engine):
    """An engine whose every transition also runs through the reference machine."""

    verified: ClassVar[list[Trigger]] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(transition_hook=self._verified, **kwargs)

    @staticmethod
    def _verified(engine: Engine, source: State, trigger: Trigger, dest: Any) -> None:
        verify_transition(engine, source, trigger, dest)
        ReferenceCheckedEngine.verified.append(trigger)


def test_every_transition_of_the_explored_space_agrees_with_the_reference_machine() -> None:
    # The engine's hook runs first, then the checker's: both see every transition.
    ReferenceCheckedEngine.verified.clear()
    report = check_engine(SMALL, engine_class=ReferenceCheckedEngine)
    assert report.violations == ()
    assert report.dead_ends == ()
    assert len(ReferenceCheckedEngine.verified) >= report.transitions > report.states > 100
    ReferenceCheckedEngine.verified.clear()


def test_snapshot_and_replay_strategies_explore_the_same_space() -> None:
    bounds = Bounds(turns=2, calls=1)
    snap = check_engine(bounds, strategy="snapshot")
    replayed = check_engine(bounds, strategy="replay")
    assert (snap.states, snap.transitions, snap.refusals, snap.rows_taken) == (
        replayed.states,
        replayed.transitions,
        replayed.refusals,
        replayed.rows_taken,
    )
    assert snap.violations == ()
    assert replayed.violations == ()


def test_small_bounds_miss_rows_and_say_which() -> None:
    # With one turn the model never sees results: no row back into AwaitingModel,
    # other than the first call, can be taken.
    report = check_engine(Bounds(turns=1, calls=1))
    back = {
        r
        for r in TRANSITIONS
        if r.dest is TurnState.AWAITING_MODEL
        and r.source not in (TurnState.READY, TurnState.AWAITING_MODEL)
    }
    assert back
    assert back <= set(report.rows_missed)
    assert report.violations == ()
    assert not report.ok
    assert "NOT TAKEN" in report.summary()


def test_a_fork_keeps_the_state_the_original_leaves() -> None:
    engine = Engine(tools=[], messages=[UserMessage("hi")], max_turns=2, logger=_quiet())
    engine.handle(Start())
    kept = engine.fork()
    key = engine.control_key()
    history = tuple(engine.messages)
    engine.handle(ModelResponded(AssistantMessage([ToolCall("c1", "nope", {})])))
    assert engine.control_key() != key
    assert kept.control_key() == key
    assert tuple(kept.messages) == history
    assert kept.state is TurnState.AWAITING_MODEL


# -- the checker can fail: broken engines ---------------------------------------------------


class CompletionOrderEngine(Engine):
    """Writes each result as soon as it arrives (the order tools finish in)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._written: set[str] = set()

    def _flush(self) -> None:
        # One result arrives per event, so appending whatever is new appends in the
        # order the tools finished.
        batch = self._run.batch
        for slot in batch:
            if slot.result is not None and slot.call.id not in self._written:
                self._written.add(slot.call.id)
                self._run.history.append(slot.result)
        batch.flushed = sum(1 for s in batch if s.result is not None)


class DropsSecondResultEngine(Engine):
    """Loses the result of the second call of every batch."""

    def _flush(self) -> None:
        batch = self._run.batch.slots
        i = self._run.batch.flushed
        while i < len(batch) and batch[i].result is not None:
            if i != 1:
                result = batch[i].result
                assert result is not None
                self._run.history.append(result)
            i += 1
        self._run.batch.flushed = i


class StopReasonEngine(Engine):
    """Decides by the stop reason: tool calls under ``stop`` are silently dropped."""

    guards: ClassVar[Mapping[Guard, GuardFunction]] = {
        **GUARDS,
        # the response is the history's last message when the rows ask (rule 1)
        Guard.HAS_TOOL_CALLS: lambda run: (
            bool(run.batch) and run.history[-1].stop_reason.value == "toolUse"  # type: ignore[union-attr]
        ),
    }


class OffByOneLimitEngine(Engine):
    """Allows one model call too many."""

    guards: ClassVar[Mapping[Guard, GuardFunction]] = {
        **GUARDS,
        Guard.TURN_LIMIT_REACHED: lambda run: run.turns > run.max_turns,
    }


class LeakyRefusalEngine(Engine):
    """Counts a turn even for an event it refuses."""

    def handle(self, event: Event) -> tuple[Action, ...]:
        try:
            return super().handle(event)
        except ProtocolError:
            self._run.turns += 1
            raise


class NonAbsorbingEngine(Engine):
    """Refuses events once the run is over, instead of absorbing them."""

    def handle(self, event: Event) -> tuple[Action, ...]:
        if self.state in TERMINAL:
            raise ProtocolError("the run is over")
        return super().handle(event)


class ForgetsUnstartedCallsEngine(Engine):
    """On abort, leaves the calls that never started without a result."""

    def _answer_unresolved(self, text: str) -> None:
        return None


class NondeterministicEngine(Engine):
    """Numbers its explanations with a counter kept outside the engine."""

    finished = itertools.count()

    def _finish(self, explanation: str) -> None:
        super()._finish(f"{explanation} (#{next(self.finished)})")


class NoCancelEngine(Engine):
    """Enters Aborting without telling the driver to cancel anything."""

    def _enter_Aborting(self, row: Transition) -> None:
        super()._enter_Aborting(row)
        self._actions = tuple(a for a in self._actions if not isinstance(a, CancelOperations))

    _ENTRIES: ClassVar[Mapping[State, Callable[[Engine, Transition], None]]] = {
        **Engine._ENTRIES,
        TurnState.ABORTING: _enter_Aborting,  # type: ignore[dict-item]
    }


class NeverSettlesEngine(Engine):
    """Once aborting, never fires ``settled``: the run would wait forever."""

    def _settle(self) -> None:
        if self.state is not TurnState.ABORTING:
            super()._settle()


class StallsEngine(Engine):
    """Refuses everything while tools run: the run can never finish from there."""

    def handle(self, event: Event) -> tuple[Action, ...]:
        if self.state is TurnState.COLLECTING_RESULTS:
            raise ProtocolError("busy")
        return super().handle(event)


@pytest.mark.parametrize(
    ("engine_class", "invariant"),
    [
        (CompletionOrderEngine, "I2"),
        (DropsSecondResultEngine, "I1"),
        (StopReasonEngine, "I3"),
        (OffByOneLimitEngine, "I7"),
        (LeakyRefusalEngine, "I8"),
        (NonAbsorbingEngine, "I4"),
        (ForgetsUnstartedCallsEngine, "I6"),
        (NondeterministicEngine, "I5"),
        (NoCancelEngine, "rules"),
        (NeverSettlesEngine, "rules"),
    ],
)
def test_checker_catches_a_broken_engine(engine_class: type[Engine], invariant: str) -> None:
    report = check_engine(SMALL, engine_class=engine_class)
    assert not report.ok
    assert invariant in _invariants(report), report.summary()
    failing = next(v for v in report.violations if v.invariant == invariant)
    # The counterexample is the event sequence that leads there, not just a verdict.
    assert failing.path
    assert str(failing) in report.summary()


def test_checker_reports_a_dead_end() -> None:
    report = check_engine(
        Bounds(turns=1, calls=1, configs=(Config({}),)), engine_class=StallsEngine
    )
    assert report.dead_ends
    assert all("CollectingResults" in v.message for v in report.dead_ends)
    assert not report.ok


def test_checker_reports_a_trigger_without_event_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(EVENT_SOURCES, Trigger.TOOL_CANCELLED)
    report = check_engine(Bounds(turns=1, calls=1, configs=(Config({}),)))
    assert any("tool_cancelled" in v.message for v in report.violations)
    cancelled = {r for r in TRANSITIONS if r.trigger is Trigger.TOOL_CANCELLED}
    assert cancelled
    assert cancelled <= set(report.rows_missed)


def test_every_input_trigger_has_an_event_source() -> None:
    from statemachine.core.table import INPUT_TRIGGERS

    assert set(INPUT_TRIGGERS) <= set(EVENT_SOURCES)


def test_cli_check_passes_and_fails_by_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_check(["--turns", "2", "--calls", "2"]) == 0
    out = capsys.readouterr().out
    assert f"table rows taken: {len(TRANSITIONS)}/{len(TRANSITIONS)}" in out
    assert out.rstrip().endswith("OK")
    assert cli_check(["--turns", "1", "--calls", "0"]) == 1
    assert "NOT TAKEN" in capsys.readouterr().out


def test_cli_check_refuses_bad_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_check(["--turns", "0"]) == 2
    assert "--turns" in capsys.readouterr().err


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="turns"):
        Bounds(turns=0)
    with pytest.raises(ValueError, match="strategy"):
        check_engine(strategy="deepcopy")  # type: ignore[arg-type]


def _quiet() -> Any:
    import logging

    import structlog

    return structlog.wrap_logger(
        None, wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL)
    )


def test_a_counterexample_replays_as_a_journal(tmp_path: Path) -> None:
    report = check_engine(SMALL, engine_class=CompletionOrderEngine)
    violation = next(v for v in report.violations if v.invariant == "I2")
    path = tmp_path / "counterexample.jsonl"
    written = write_counterexample(
        violation, path, bounds=SMALL, engine_class=CompletionOrderEngine
    )
    assert written == len(violation.path)
    broken = replay(path, engine_class=CompletionOrderEngine, logger=_quiet())
    assert "I2" in {v.invariant for v in history_violations(broken.messages, allow_open_tail=True)}
    # The real engine accepts the same events and keeps the call order.
    real = replay(path, logger=_quiet())
    assert history_violations(real.messages, allow_open_tail=True) == []
