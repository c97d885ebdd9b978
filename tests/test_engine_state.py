"""The engine's state: every field declared once, ``fork()`` and ``control_key()``.

``Engine.fork()`` and ``Engine.control_key()`` are the one public way to copy and
compare an engine (the exhaustive checker uses nothing else); both read the fields of
the state record (``core/state.py``) as it declares them. These tests fail when an
engine holds an attribute that the ``Engine`` class does not declare, when a field of
the record has no role or a keyed field does not show in the key, when a fork shares a
mutable object with its original, or when a fork behaves or snapshots differently
from the engine it was made from, over random runs in every checker configuration.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from engine_support import ECHO

from statemachine.core import state as engine_state
from statemachine.core.batch import Batch
from statemachine.core.engine import Engine, EngineState
from statemachine.core.events import Action, CallModel, Event, ModelResponded, Start, ToolFinished
from statemachine.core.messages import AssistantMessage, StopReason, ToolCall, UserMessage
from statemachine.core.queue import NO_INPUT, InputQueue
from statemachine.core.table import INPUT_TRIGGERS
from statemachine.core.tools import ToolOutput
from statemachine.core.trace import Trace
from statemachine.errors import ProtocolError
from statemachine.testing._space import (
    DEFAULT_CONFIGS,
    EVENT_SOURCES,
    FIRST_MESSAGE,
    TOOL,
    Bounds,
    _SilentLogger,
)

BOUNDS = Bounds(turns=3, calls=2)
SEEDS = range(12)
OPTIONS = [config.options for config in DEFAULT_CONFIGS]


def _engine(options: Any) -> Engine:
    return Engine(
        tools=[TOOL], messages=[FIRST_MESSAGE], max_turns=3, logger=_SilentLogger(), **options
    )


def _accepted_step(engine: Engine, rng: random.Random) -> Event | None:
    """Handle one random candidate event the engine accepts; ``None`` if none is."""
    candidates = [e for t in INPUT_TRIGGERS for e in EVENT_SOURCES[t](engine, BOUNDS)]
    rng.shuffle(candidates)
    for event in candidates:
        try:
            engine.handle(event)
        except ProtocolError:
            continue
        return event
    return None


def _run(options: Any, seed: int, steps: int = 30) -> list[Engine]:
    """One random run; a fork of the engine after every step (the run's states)."""
    rng = random.Random(seed)
    engine = _engine(options)
    states = [engine.fork()]
    for _ in range(steps):
        if _accepted_step(engine, rng) is None:
            break
        states.append(engine.fork())
    return states


def _outcome(engine: Engine, event: Event) -> Any:
    """What handling ``event`` did, comparable between two engines."""
    try:
        actions = engine.handle(event)
    except ProtocolError as exc:
        return ("refused", str(exc))
    return tuple(_comparable(a) for a in actions)


def _comparable(action: Action) -> Any:
    if isinstance(action, CallModel):  # its history is a view: compare what it shows
        return ("CallModel", tuple(action.messages), action.tools, action.turn)
    return action


def _picture(engine: Engine) -> Any:
    """Everything a caller can read from an engine."""
    try:
        snapshot: Any = engine.snapshot()
    except ProtocolError:
        snapshot = "outstanding"
    return (
        engine.state,
        tuple(engine.messages),
        tuple(engine.trace),
        engine.turns,
        engine.explanation,
        engine.pending_calls(),
        engine.pending_approvals(),
        engine.queued_input(),
        engine.control_key(),
        snapshot,
    )


_MUTABLE = (list, dict, set, Batch, InputQueue, Trace, EngineState)


def _assert_no_shared_mutables(original: Engine, fork: Engine) -> None:
    for name, value in vars(original).items():
        if isinstance(value, _MUTABLE):
            assert vars(fork)[name] is not value, f"the fork shares {name}"
    configuration = engine_state.fields_of(engine_state.CONFIGURATION)
    for field in attrs.fields(EngineState):
        if field.name in configuration:
            continue  # fixed for the run: never written after the engine is made
        value = getattr(original._run, field.name)
        if isinstance(value, _MUTABLE) and value is not NO_INPUT:  # NO_INPUT never changes
            assert getattr(fork._run, field.name) is not value, f"the fork shares {field.name}"
    mine, theirs = original._run.batch, fork._run.batch
    for slot, copied_slot in zip(mine, theirs, strict=True):
        assert slot is not copied_slot, "the fork shares a call's bookkeeping"
    assert all(theirs.slot(s.call.id) is s for s in theirs), "the index is not the batch"


# -- every field is declared ------------------------------------------------------------------


@pytest.mark.parametrize("options", OPTIONS)
def test_every_field_an_engine_holds_is_declared(options: Any) -> None:
    declared = set(Engine.__annotations__)
    defaults = {name for name in declared if name in vars(Engine)}
    for seed in SEEDS:
        for engine in _run(options, seed):
            held = set(vars(engine))
            assert held <= declared, held - declared
            # A field that is not held yet reads its class default.
            assert declared - held <= defaults, declared - held - defaults


def test_the_roles_partition_the_fields_of_the_state_record() -> None:
    roles = [engine_state.fields_of(role) for role in engine_state.ROLES]
    names = {f.name for f in attrs.fields(EngineState)}
    assert set().union(*roles) == names
    assert sum(len(r) for r in roles) == len(names)


def _keyed_plainly() -> list[str]:
    """The keyed fields that enter the key as they are (no key function of their own)."""
    return [
        f.name for f in attrs.fields(EngineState) if f.metadata["keyed"] and not f.metadata["key"]
    ]


@pytest.mark.parametrize("name", _keyed_plainly())
def test_the_control_key_shows_a_change_of_every_keyed_field(name: str) -> None:
    engine = _holding("one")
    changed = engine.fork()
    setattr(changed._run, name, object())  # a value no run holds
    assert changed.control_key() != engine.control_key()


def test_a_control_key_that_leaves_a_field_out_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    key = EngineState.control_key
    monkeypatch.setattr(EngineState, "control_key", lambda self: key(self)[:-1])
    last = _keyed_plainly()[-1]  # the last keyed field, which the broken key leaves out
    with pytest.raises(AssertionError):
        test_the_control_key_shows_a_change_of_every_keyed_field(last)


def test_every_control_field_is_keyed() -> None:
    control = engine_state.fields_of(engine_state.CONTROL)
    assert all(f.metadata["keyed"] for f in attrs.fields(EngineState) if f.name in control)


# -- a fork is independent and behaves like its original -------------------------------------


def _check_no_sharing_over_runs(options: Any) -> None:
    for seed in SEEDS:
        for engine in _run(options, seed):
            _assert_no_shared_mutables(engine, engine.fork())


def _check_fork_behaves_alike_over_runs(options: Any) -> None:
    for seed in SEEDS:
        _check_fork_behaves_alike(options, seed)


@pytest.mark.parametrize("options", OPTIONS)
def test_a_fork_shares_no_mutable_object_with_its_original(options: Any) -> None:
    _check_no_sharing_over_runs(options)


def _check_fork_behaves_alike(options: Any, seed: int) -> None:
    rng = random.Random(seed)
    engine = _engine(options)
    for _ in range(rng.randrange(0, 12)):
        if _accepted_step(engine, rng) is None:
            break
    fork = engine.fork()
    assert _picture(fork) == _picture(engine)
    # The original goes on alone first: nothing it does may show in the fork.
    events: list[Event] = []
    outcomes = []
    for _ in range(15):
        before = engine.fork()
        event = _accepted_step(engine, rng)
        if event is None:
            break
        events.append(event)
        outcomes.append(_outcome(before, event))
    for event, outcome in zip(events, outcomes, strict=True):
        assert _outcome(fork, event) == outcome
    assert _picture(fork) == _picture(engine)


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_fork_behaves_and_snapshots_like_its_original(options: Any, seed: int) -> None:
    _check_fork_behaves_alike(options, seed)


def test_a_subclass_list_is_copied_by_the_fork() -> None:
    class Noting(Engine):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.notes: list[str] = []

    engine = Noting(tools=[TOOL], messages=[FIRST_MESSAGE], logger=_SilentLogger())
    fork = engine.fork()
    engine.notes.append("x")
    assert fork.notes == []
    assert engine.control_key() != fork.control_key()  # its own fields are keyed too


# -- the control key ------------------------------------------------------------------------


def _holding(text: str) -> Engine:
    """An engine whose second call finished first: its result is held for call order."""
    engine = Engine(tools=[ECHO], messages=[UserMessage("go")])
    engine.handle(Start())
    calls = [ToolCall("c1", "echo", {"text": "a"}), ToolCall("c2", "echo", {"text": "b"})]
    engine.handle(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    engine.handle(ToolFinished("c2", ToolOutput(text)))
    return engine


@pytest.mark.timeout(30)
def test_a_result_held_for_call_order_is_part_of_the_control_key() -> None:
    assert _holding("one").control_key() == _holding("one").control_key()
    assert _holding("one").control_key() != _holding("two").control_key()


@pytest.mark.timeout(60)
def test_the_repr_cache_of_the_control_key_is_bounded_and_kept() -> None:
    engine_state._REPRS.clear()
    values = [UserMessage(str(i)) for i in range(engine_state._REPRS_MAX)]
    for value in values:
        engine_state.rendered(value)
    assert len(engine_state._REPRS) == engine_state._REPRS_MAX  # kept, up to the bound
    engine_state.rendered(values[0])
    assert len(engine_state._REPRS) == engine_state._REPRS_MAX  # a value seen before is not added
    engine_state.rendered(UserMessage("one more"))
    assert len(engine_state._REPRS) == 1  # full: cleared, then the new value
    engine_state._REPRS.clear()


# -- the checks can fail ---------------------------------------------------------------------


def _sharing(name: str) -> Callable[[Engine], Any]:
    fork = Engine.fork

    def broken(self: Engine) -> Any:
        out = fork(self)
        setattr(out._run, name, getattr(self._run, name))  # as if its copy were forgotten
        return out

    return broken


@pytest.mark.parametrize("name", ["queue", "batch", "history"])
def test_a_fork_that_forgets_a_field_is_caught(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(Engine, "fork", _sharing(name))
    with pytest.raises(AssertionError, match=f"shares {name}"):
        _check_no_sharing_over_runs({"check_continue": True})


def test_a_shared_field_shows_in_behaviour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Engine, "fork", _sharing("history"))
    with pytest.raises(AssertionError):
        _check_fork_behaves_alike_over_runs({})


def test_an_undeclared_field_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    attach = Engine._attach

    def with_a_new_field(self: Engine, run: EngineState, **kwargs: Any) -> None:
        attach(self, run, **kwargs)
        self._new_field = 0  # type: ignore[attr-defined]

    monkeypatch.setattr(Engine, "_attach", with_a_new_field)
    with pytest.raises(AssertionError):
        test_every_field_an_engine_holds_is_declared({})


def test_the_engine_does_not_import_transitions() -> None:
    import subprocess
    import sys

    code = (
        "import sys, statemachine, statemachine.engine\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'transitions'], 'imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
