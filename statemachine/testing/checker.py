"""The exhaustive bounded checker: every event sequence the real engine accepts, checked.

This module owns the exploration of the sans-IO ``Engine``'s state space within
bounds (turns, tool calls per response, the engine configurations to try), the
checks made at every reachable state and on every refused event, and the
``python -m statemachine check`` command.

How it works
------------
Breadth-first search over engine configurations. From each reachable engine the
checker offers every candidate input event that ``EVENT_SOURCES`` produces for the
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
So the engine's dispatch is watched (``_observing``): every trigger it fires is
recorded with the guard values of that moment and compared with ``_rules``, the
table's prose rules written a second time without reading a row. The check reports,
with the events that lead there, a destination the rules do not give (``rule 7: in
TurnBoundary on next_turn with stop_requested=True, ..., expected Done, actual
TurnLimitExceeded``), a trigger accepted by one and not the other, an internal trigger
left unfired though due, and actions that are not what the transitions announce (a
model call per ``AwaitingModel`` entered, a cancel per ``Aborting``, a check per turn
boundary with the hook, a ``RunEnded`` per return to the caller). Row coverage counts
the row the dispatch applied, by position, so two rows of a group with one destination
are told apart.

Deduplication. Two engines are merged when their *control data* are equal: the
state, the turn counter and every other attribute of the engine except the history,
the transition log and the plumbing (``_canonical_key``, which walks the engine's
attributes generically, so a field the engine grows is part of the key without a
change here). The history is left out on purpose: the engine never reads it back to
decide anything, and the only part of it the future can pair with (the calls of
the current batch) is in the batch bookkeeping, which is in the key. Every new state
is checked on the history of the path that reached it first, and every transition
checks what it appended, so merging loses no violation. Call ids are made unique
per turn by the checker, which is why the set of ids seen (used only to normalise
repeats) can stay out of the key as well.

Copying engines. An engine carries a ``transitions`` machine whose construction is
the slow part, so the default strategy keeps one engine per configuration and
restores snapshots of its attributes into it (``snapshot``); the alternative
(``replay``) rebuilds an engine from the configuration and re-handles the event
prefix. Both give the same report; ``--strategy`` picks one, and the README has
their timings.
"""

from __future__ import annotations

import collections
import enum
import functools
import itertools
import os
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any, Literal

import attrs

from statemachine.cli.common import CommandParser, fail, parse
from statemachine.core import table as _table
from statemachine.core.engine import Engine
from statemachine.core.errors import ProtocolError
from statemachine.core.events import (
    AbortRequested,
    ApprovalDecided,
    ApprovalRequired,
    CallModel,
    CancelOperations,
    CheckContinue,
    CheckPermission,
    ContinueDecided,
    Event,
    InputKind,
    InputQueued,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    RunEnded,
    Start,
    StartTool,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.invariants import history_violations
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import (
    ABSORBING,
    INPUT_TRIGGERS,
    INTERNAL_TRIGGERS,
    RETURNS_TO_CALLER,
    TERMINAL,
    Guard,
    Transition,
    Trigger,
    TurnState,
    rows_from,
)
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.testing import _oracle as _rules

__all__ = [
    "DEFAULT_CONFIGS",
    "EVENT_SOURCES",
    "Bounds",
    "CheckReport",
    "CheckViolation",
    "Config",
    "check_engine",
    "cli_check",
    "write_counterexample",
]

S = TurnState
T = Trigger

# -- the scenario the checker drives -----------------------------------------------------

TOOL = ToolDefinition(
    "echo",
    "Repeat the text back.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)
VALID_ARGUMENTS: Mapping[str, Any] = {"text": "hi"}
INVALID_ARGUMENTS: Mapping[str, Any] = {"text": 42}
UNKNOWN_TOOL = "no_such_tool"
UNKNOWN_CALL = "no-such-call"
FIRST_MESSAGE = UserMessage("use the tools")
OK_OUTPUT = ToolOutput("done")
ERROR_OUTPUT = ToolOutput("Error: it broke", is_error=True)

CallKind = Literal["ok", "unknown", "invalid"]


@attrs.frozen
class Config:
    """One engine configuration to explore: the ``Engine`` options, and where the state
    space needs it, a tighter cap on tool calls per response than ``Bounds.calls``."""

    options: Mapping[str, Any] = attrs.field(factory=dict)
    max_calls: int | None = None

    def describe(self) -> str:
        flags = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items())) or "no hooks"
        return flags + (f" (at most {self.max_calls} calls)" if self.max_calls is not None else "")


# A permission hook gives every call four answers, in any order, then approvals: at three
# calls per response that alone is ~70,000 states (about a minute), so the hooked
# configuration is explored with two calls per response by default (``--uncapped``
# lifts it). The configurations without hooks take the full bound.
DEFAULT_CONFIGS: tuple[Config, ...] = (
    Config({}),
    Config({"check_continue": True}),
    Config({"check_permissions": True, "check_continue": True}, max_calls=2),
)


@attrs.frozen(eq=False)  # hashed by identity: it keys the cache of model responses
class Bounds:
    """What the checker explores.

    ``turns`` is the engine's ``max_turns``; ``calls`` the most tool calls in one
    response; ``configs`` the engine configurations to explore (each a separate
    search; see ``Config``);
    ``queued`` is the most inputs waiting in the queue at once; ``limits`` caps how
    often a trigger may occur on one path (for an input that could otherwise repeat
    forever and has no state of its own to bound it).

    Every refused event must raise ``ProtocolError``. That it also left the engine
    exactly as it was is verified (a full comparison, the costliest check) for the
    first ``refusals_per_pair`` refusals of each (state, trigger) pair and for every
    ``refusal_stride``-th refusal after that; ``refusal_stride=1`` verifies them all.
    Every ``determinism_stride``-th run that reaches a terminal state is replayed on a
    fresh engine, which must give the identical run (I5).

    ``rules`` compares every transition with the rules oracle (``_rules``); turning
    it off shows what the checker finds from the invariants alone.
    """

    turns: int = 3
    calls: int = 3
    call_kinds: tuple[CallKind, ...] = ("ok", "unknown", "invalid")
    stop_reasons: tuple[StopReason, ...] = tuple(StopReason)
    configs: tuple[Config, ...] = DEFAULT_CONFIGS
    queued: int = 1
    limits: Mapping[Trigger, int] = attrs.field(factory=dict)
    max_violations: int = 20
    refusals_per_pair: int = 50
    refusal_stride: int = 4
    determinism_stride: int = 25
    rules: bool = True

    def __attrs_post_init__(self) -> None:
        if self.turns < 1 or self.calls < 0:
            raise ValueError("bounds: turns must be >= 1 and calls >= 0")
        if self.refusal_stride < 1 or self.refusals_per_pair < 0 or self.determinism_stride < 1:
            raise ValueError(
                "bounds: refusal_stride and determinism_stride must be >= 1, refusals_per_pair >= 0"
            )


# -- event sources: one entry per input trigger ---------------------------------------------

EventSource = Callable[[Engine, Bounds], Sequence[Event]]


def _responses(turn: int, bounds: Bounds) -> list[Event]:
    """Every model response within the bounds: ids unique per turn, as a model gives."""
    out: list[Event] = []
    for count in range(bounds.calls + 1):
        for kinds in itertools.product(bounds.call_kinds, repeat=count):
            calls = [_call(f"t{turn}c{i}", kind) for i, kind in enumerate(kinds)]
            text = [] if calls else [TextContent("finished")]
            for stop in bounds.stop_reasons:
                out.append(ModelResponded(AssistantMessage([*text, *calls], stop_reason=stop)))
    if bounds.calls >= 2:
        # Ids the engine must normalise (empty and repeated).
        calls = [_call("", "ok") for _ in range(bounds.calls)]
        out.append(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    return out


def _call(call_id: str, kind: CallKind) -> ToolCall:
    if kind == "unknown":
        return ToolCall(call_id, UNKNOWN_TOOL, VALID_ARGUMENTS)
    return ToolCall(call_id, TOOL.name, VALID_ARGUMENTS if kind == "ok" else INVALID_ARGUMENTS)


def _call_ids(engine: Engine) -> list[str]:
    """Ids of the current batch's calls, answered or not, plus one that does not exist:
    the engine must accept the right ones and refuse the others unchanged."""
    ids: list[str] = []
    for message in reversed(engine.messages):
        if isinstance(message, AssistantMessage):
            ids = [c.id for c in message.tool_calls]
            break
    pending = [c.id for c in engine.pending_calls()]
    return [*dict.fromkeys([*pending, *ids]), UNKNOWN_CALL]


@functools.lru_cache(maxsize=64)
def _responses_for(turn: int, bounds: Bounds) -> tuple[Event, ...]:
    return tuple(_responses(turn, bounds))


EVENT_SOURCES: dict[Trigger, EventSource] = {
    T.start: lambda e, b: [Start()],
    T.model_responded: lambda e, b: _responses_for(e.turns, b),
    T.model_failed: lambda e, b: [ModelFailed("HTTP 500 from the provider")],
    T.model_cancelled: lambda e, b: [ModelCancelled()],
    T.tool_permitted: lambda e, b: [ToolPermitted(i) for i in _call_ids(e)],
    T.tool_denied: lambda e, b: [
        d
        for i in _call_ids(e)
        for d in (ToolDenied(i, "policy forbids it"), ToolDenied(i, "try another", True))
    ],
    T.tool_finished: lambda e, b: [
        ToolFinished(i, out) for i in _call_ids(e) for out in (OK_OUTPUT, ERROR_OUTPUT)
    ],
    T.tool_cancelled: lambda e, b: [ToolCancelled(i) for i in _call_ids(e)],
    T.abort: lambda e, b: [AbortRequested("the user pressed stop")],
    # Bounded by the queue's length, not by a count per path: once the queue is
    # injected the run is where it would have been without it, and merges with it.
    T.input_queued: lambda e, b: (
        [
            InputQueued(UserMessage("also run the tests"), InputKind.STEER),
            InputQueued(UserMessage("then summarise"), InputKind.FOLLOW_UP),
        ]
        if len(e.queued_input()) < b.queued
        else []
    ),
    T.approval_required: lambda e, b: [ApprovalRequired(i, "needs sign-off") for i in _call_ids(e)],
    T.approval_decided: lambda e, b: [
        d for i in _call_ids(e) for d in (ApprovalDecided(i, True), ApprovalDecided(i, False, "no"))
    ],
    T.continue_decided: lambda e, b: [ContinueDecided(False), ContinueDecided(True, "enough")],
}
"""Candidate events per input trigger, given the engine as it stands."""

# Triggers whose acceptance does not depend on the payload: one refusal stands for all
# candidates (it saves offering 200 model responses where no model call is out).
_UNIFORM: frozenset[Trigger] = frozenset({T.model_responded, T.model_failed, T.model_cancelled})


# -- canonical keys and snapshots ---------------------------------------------------------

# Engine attributes that are not control data: the history and the log (see the module
# docstring), the plumbing, and what only explains a finished run.
_NOT_KEY = frozenset(
    {
        "_history",
        "trace",
        "_log",
        "_machine",
        "_state",
        "_event",
        "_actions",
        "_tools",
        "_tools_by_name",
        "_seen_ids",
        "explanation",
        "journal",
    }
)
# Attributes shared by every copy of an engine: immutable, or plumbing.
_SHARED = frozenset({"_log", "_machine", "_state", "_tools", "_tools_by_name", "journal"})


_ATOMIC = (type(None), str, int, float, bool)

# repr of immutable attrs values, by identity. The object is kept with its repr so its
# id cannot be reused while the entry exists; ``check_engine`` clears it per search.
_REPRS: dict[int, tuple[Any, str]] = {}
_IS_ATTRS: dict[type, bool] = {}


def _canon(value: Any, memo: dict[int, Any]) -> Any:
    """A hashable, order-stable rendering of an engine attribute.

    Immutable attrs values (messages, calls, outputs) are rendered by their repr,
    which attrs generates from every field: cheaper than walking them, and as exact.
    ``memo`` renders an object reachable twice (a call's bookkeeping is both in the
    batch and in the index by id) only once.
    """
    cls = type(value)
    if cls in _ATOMIC or isinstance(value, enum.Enum):
        return value
    key = id(value)
    is_attrs = _IS_ATTRS.get(cls)
    if is_attrs is None:
        is_attrs = _IS_ATTRS[cls] = attrs.has(cls)
    if is_attrs:
        known = _REPRS.get(key)
        if known is None:
            known = _REPRS[key] = (value, repr(value))
        return known[1]
    if key in memo:
        return memo[key]
    out: Any
    if cls is list or cls is tuple:
        out = tuple([_canon(v, memo) for v in value])
    elif cls is dict or isinstance(value, Mapping):
        out = tuple(sorted([(str(k), _canon(v, memo)) for k, v in value.items()]))
    elif cls is set or cls is frozenset:
        out = tuple(sorted([repr(_canon(v, memo)) for v in value]))
    elif getattr(cls, "__slots__", None) is not None:
        out = (cls.__name__, *[_canon(getattr(value, s, None), memo) for s in cls.__slots__])
    elif hasattr(value, "__dict__"):
        out = (cls.__name__, _canon(vars(value), memo))
    else:
        out = repr(value)
    memo[key] = out
    return out


def _canonical_key(engine: Engine) -> tuple[Any, ...]:
    memo: dict[int, Any] = {}
    parts = []
    for name, value in sorted(vars(engine).items()):
        if name not in _NOT_KEY:
            parts.append((name, value if type(value) in _ATOMIC else _canon(value, memo)))
    return (engine.state, tuple(parts))


_SHARE, _LIST, _DICT, _SET, _SLOTS, _OBJECT = range(6)
_KINDS: dict[type, int] = {}


def _kind(cls: type) -> int:
    """How ``_copy`` treats instances of ``cls`` (cached: it is asked millions of times)."""
    kind = _KINDS.get(cls)
    if kind is None:
        if cls in _ATOMIC or issubclass(cls, (enum.Enum, tuple, frozenset)) or attrs.has(cls):
            kind = _SHARE
        elif cls is list:
            kind = _LIST
        elif cls is dict:
            kind = _DICT
        elif cls is set:
            kind = _SET
        elif issubclass(cls, (types.FunctionType, types.MethodType, type)):
            kind = _SHARE  # code and classes are not state
        elif getattr(cls, "__slots__", None) is not None:
            kind = _SLOTS
        else:
            kind = _OBJECT
        _KINDS[cls] = kind
    return kind


def _copy(value: Any, memo: dict[int, Any]) -> Any:
    """Copy the mutable parts of an engine attribute; keep immutable ones shared.

    attrs classes here are frozen by convention (messages, events, outputs), so they
    are shared; plain mutable objects (the per-call bookkeeping) are copied, once each,
    so that two containers that shared an object still share its copy.
    """
    kind = _kind(type(value))
    if kind == _SHARE:
        return value
    known = memo.get(id(value))
    if known is not None:
        return known
    out: Any
    if kind == _LIST:
        out = [v if _kind(type(v)) == _SHARE else _copy(v, memo) for v in value]
    elif kind == _DICT:
        out = {k: v if _kind(type(v)) == _SHARE else _copy(v, memo) for k, v in value.items()}
    elif kind == _SET:
        out = set(value)
    elif kind == _SLOTS:
        out = object.__new__(type(value))
        for slot in type(value).__slots__:
            if hasattr(value, slot):
                setattr(out, slot, _copy(getattr(value, slot), memo))
    else:
        out = object.__new__(type(value))
        out.__dict__.update({k: _copy(v, memo) for k, v in vars(value).items()})
    memo[id(value)] = out
    return out


@attrs.frozen
class _Snapshot:
    state: TurnState
    attributes: Mapping[str, Any]


def _snapshot(engine: Engine) -> _Snapshot:
    memo: dict[int, Any] = {}
    attributes = {k: _copy(v, memo) for k, v in vars(engine).items() if k not in _SHARED}
    return _Snapshot(engine.state, attributes)


def _restore(engine: Engine, snap: _Snapshot) -> None:
    memo: dict[int, Any] = {}
    for name, value in snap.attributes.items():
        setattr(engine, name, _copy(value, memo))
    engine._state = snap.state


def _fingerprint(engine: Engine, key: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
    """Everything a refused event must leave as it was (I8); ``key``: if known."""
    return (
        key if key is not None else _canonical_key(engine),
        tuple(engine.messages),
        tuple(engine.trace),
        engine.turns,
        engine.explanation,
    )


# -- the report ------------------------------------------------------------------------------


@attrs.frozen
class CheckViolation:
    """A property that failed, where, and the event sequence that leads there."""

    invariant: str
    message: str
    config: Mapping[str, Any]
    path: tuple[Event, ...]

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


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
    from statemachine.journal._journal import describe_event  # the journal owns the readable form

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
    from statemachine.journal._journal import Journal, JournalingEngine

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


# -- holding the engine to the rules -------------------------------------------------------

_ANNOUNCED = (CallModel, CancelOperations, CheckContinue, RunEnded)


def _count(counter: collections.Counter[type]) -> str:
    return (
        ", ".join(
            f"{n} {cls.__name__}"
            for cls, n in sorted(counter.items(), key=lambda item: item[0].__name__)
            if n
        )
        or "nothing"
    )


def _rules_never(guard: Guard) -> bool:
    return False


def _guard_value(engine: Engine, guard: Guard) -> bool:
    return bool(getattr(engine, _GUARD_METHOD[guard])())


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
    if firing.actual is not firing.expected.dest:
        return (
            f"{firing.expected.rule}: in {source} on {trigger} with "
            f"{firing.describe_guards()}, expected {firing.expected.dest.value}, "
            f"actual {went}"
        )
    return None


# -- the search ------------------------------------------------------------------------------


@attrs.frozen
class _Node:
    key: Any
    snap: _Snapshot
    path: tuple[Event, ...]
    counts: tuple[tuple[Trigger, int], ...]  # occurrences of limited triggers
    model_calls: int
    started: frozenset[str]


@attrs.frozen
class _Firing:
    """One trigger the engine fired, as seen from inside its dispatch."""

    source: TurnState
    trigger: Trigger
    guards: tuple[tuple[Guard, bool], ...]  # every guard consulted, in the order asked
    expected: _rules.Expected | None  # where the rules send the run (None: not accepted)
    due: Trigger | None  # for an internal trigger: the one the rules fire here now
    row: int | None  # the table row the engine's own dispatch applies
    actual: TurnState | None  # where the engine went (None: it raised, no row applied)

    def describe_guards(self) -> str:
        return ", ".join(f"{g.value}={v}" for g, v in self.guards) or "no guard consulted"


_GUARD_METHOD = {guard: f"_guard_{guard.value}" for guard in Guard}

# Rows by (source, trigger): (index in the table, guard), in table order.
_RowGroups = Mapping[tuple[TurnState, Trigger], tuple[tuple[int, Guard | None], ...]]


def _row_groups(table: Sequence[Transition]) -> _RowGroups:
    groups: dict[tuple[TurnState, Trigger], tuple[tuple[int, Guard | None], ...]] = {}
    for i, row in enumerate(table):
        key = (row.source, row.trigger)
        groups[key] = (*groups.get(key, ()), (i, row.guard))
    return groups


def _observing(
    engine_class: type[Engine], firings: list[_Firing], groups: _RowGroups
) -> type[Engine]:
    """``engine_class`` with its dispatch watched: each firing is recorded with the
    guard values of that moment, the rules' verdict and the table row that applies.

    Guards are pure predicates, so asking them here, just before the engine asks
    them itself, gives the values the engine decides on. The records go to a list the
    search owns (not an engine attribute, so snapshots and keys ignore them).
    """
    fire = engine_class._fire

    def _fire(self: Engine, trigger: Trigger) -> None:
        source = self.state
        memo: dict[Guard, bool] = {}

        def holds(guard: Guard) -> bool:
            if guard not in memo:
                memo[guard] = bool(getattr(self, _GUARD_METHOD[guard])())
            return memo[guard]

        expected = _rules.destination(source, trigger, holds)
        due = _rules.due(source, holds) if trigger in INTERNAL_TRIGGERS else None
        row = next((i for i, g in groups.get((source, trigger), ()) if g is None or holds(g)), None)
        taken = len(self.trace)
        try:
            fire(self, trigger)
        finally:
            # Where it went even if an entry effect then raised (the state is set first).
            actual = self.trace[-1].dest if len(self.trace) > taken else None
            firings.append(
                _Firing(source, trigger, tuple(memo.items()), expected, due, row, actual)
            )

    observed: type[Engine] = type(
        f"Observed{engine_class.__name__}", (engine_class,), {"_fire": _fire}
    )
    return observed


class _SilentLogger:
    """A structlog-shaped logger that drops everything (no global configuration)."""

    def bind(self, **_: Any) -> _SilentLogger:
        return self

    def _drop(self, *_: Any, **__: Any) -> None:
        return None

    debug = info = warning = error = exception = msg = _drop


class _Search:
    def __init__(
        self,
        bounds: Bounds,
        config: Config,
        engine_class: type[Engine],
        strategy: str,
    ) -> None:
        if config.max_calls is not None and config.max_calls < bounds.calls:
            bounds = attrs.evolve(bounds, calls=config.max_calls)
        self.bounds = bounds
        self.config = config.options
        self.check_continue = bool(config.options.get("check_continue"))
        self.engine_class = engine_class
        # The table as it stands now (read through the module, so that a test may
        # install another table and check it).
        self.table = _table.TRANSITIONS
        self.row_set = frozenset((r.source, r.trigger, r.dest) for r in self.table)
        self.firings: list[_Firing] = []
        self.observed_class = _observing(engine_class, self.firings, _row_groups(self.table))
        self.strategy = strategy
        # The checker runs hundreds of thousands of transitions: their debug events would
        # cost more than the engine, so the engines it makes log nowhere.
        self.logger = _SilentLogger()
        self.engine = self._fresh()
        self.current = self.engine  # the engine in the state of the latest child
        self.leaves = 0
        self.states = 0
        self.transitions = 0
        self.refusals = 0
        self.rows: set[int] = set()
        self.violations: list[CheckViolation] = []
        self.dead_ends: list[CheckViolation] = []
        self.missing_sources = [t for t in INPUT_TRIGGERS if t not in EVENT_SOURCES]
        self.acceptance_checked: set[tuple[TurnState, Trigger]] = set()
        self.seen: set[Any] = set()
        self.verified: collections.Counter[tuple[TurnState, Trigger]] = collections.Counter()

    def _fresh(self) -> Engine:
        return self.observed_class(
            tools=[TOOL],
            messages=[FIRST_MESSAGE],
            max_turns=self.bounds.turns,
            run_id="check",
            logger=self.logger,
            **self.config,
        )

    def _load(self, node: _Node) -> Engine:
        if self.strategy == "snapshot":
            _restore(self.engine, node.snap)
            return self.engine
        engine = self._fresh()
        for event in node.path:
            engine.handle(event)
        self.firings.clear()  # checked when the path was first taken
        return engine

    def _violate(self, invariant: str, message: str, path: tuple[Event, ...]) -> None:
        self.violations.append(CheckViolation(invariant, message, dict(self.config), path))

    def run(self) -> None:
        for trigger in self.missing_sources:
            self._violate(
                "checker",
                f"no event source for input trigger {trigger.value!r}: add one to "
                "statemachine.testing.checker.EVENT_SOURCES",
                (),
            )
        if self.bounds.rules and TERMINAL != _rules.ENDS:
            self._violate(
                "rules",
                "rule 11: the terminal states are "
                f"{sorted(s.value for s in _rules.ENDS)}, the table says "
                f"{sorted(s.value for s in TERMINAL)}",
                (),
            )
        root = _Node(
            (_canonical_key(self.engine), ()), _snapshot(self.engine), (), (), 0, frozenset()
        )
        self.seen.add(root.key)
        self._check_state(self.engine, root.path, None)
        queue = collections.deque([root])
        self.states = 1
        while queue and len(self.violations) < self.bounds.max_violations:
            node = queue.popleft()
            # Children are checked and keyed as they are made, one at a time, so a child
            # already seen is recognised before it is snapshotted.
            for child in self._expand(node):
                if child.key in self.seen:
                    continue
                self.seen.add(child.key)
                self.states += 1
                if child.key[0][0] in ABSORBING:
                    # A leaf: checked now, while the engine that just reached it is at
                    # hand, instead of being snapshotted, queued and restored.
                    self._absorb(self.current, child)
                else:
                    queue.append(child)

    def _expand(self, node: _Node) -> Iterable[_Node]:
        """Offer every candidate event to a live state; yield each accepted child."""
        engine = self._load(node)
        state = engine.state
        base = _fingerprint(engine, node.key[0])
        dirty = False
        accepted_any = False
        limits = dict(node.counts)
        for trigger in INPUT_TRIGGERS:
            source = EVENT_SOURCES.get(trigger)
            if source is None:
                continue
            if dirty:
                engine = self._load(node)
                dirty = False
            candidates = source(engine, self.bounds)
            if not candidates:
                continue
            accepted = self._accepted(state, trigger, node.path)
            if not accepted:
                # Not accepted here: one sample must be refused, changing nothing.
                dirty = self._check_refused(engine, candidates[0], base, node, absorbed=False)
                continue
            limit = self.bounds.limits.get(trigger)
            if limit is not None and limits.get(trigger, 0) >= limit:
                continue
            for event in candidates:
                if dirty:
                    engine = self._load(node)
                    dirty = False
                child = self._step(engine, event, node, base)
                if child is None:
                    if trigger in _UNIFORM:
                        break
                    continue
                accepted_any = True
                dirty = True
                yield child
        if not accepted_any:
            self.dead_ends.append(
                CheckViolation(
                    "dead end",
                    f"{state.value} is not terminal but accepts no event",
                    dict(self.config),
                    node.path,
                )
            )

    def _accepted(self, state: TurnState, trigger: Trigger, path: tuple[Event, ...]) -> bool:
        """Whether ``trigger`` is accepted in ``state`` (by the rules, unless they are
        off); a table that disagrees is reported once per (state, trigger)."""
        by_table = bool(rows_from(state, trigger))
        if not self.bounds.rules:
            return by_table
        by_rules = _rules.accepts(state, trigger)
        if by_rules != by_table and (state, trigger) not in self.acceptance_checked:
            self.acceptance_checked.add((state, trigger))
            expected = _rules.destination(state, trigger, _rules_never)
            self._violate(
                "rules",
                f"{expected.rule}: {trigger.value} is accepted in {state.value}, but the table "
                "has no row for it"
                if expected is not None
                else f"rule 12: no rule accepts {trigger.value} in {state.value}, but the table "
                "has a row for it",
                path,
            )
        return by_rules

    def _absorb(self, engine: Engine, node: _Node) -> None:
        """In a terminal state (``engine`` is in it): every event is absorbed (I4), and
        on a sample of runs, the same events give the same run again (I5)."""
        self.leaves += 1
        if self.leaves % self.bounds.determinism_stride == 1:
            self._check_determinism(engine, node.path)
        base = _fingerprint(engine, node.key[0])
        for trigger in INPUT_TRIGGERS:
            source = EVENT_SOURCES.get(trigger)
            candidates = source(engine, self.bounds) if source is not None else ()
            if candidates and self._check_refused(engine, candidates[0], base, node, absorbed=True):
                return  # the engine changed: the violation is recorded, stop here

    def _check_determinism(self, engine: Engine, path: tuple[Event, ...]) -> None:
        # A fresh engine, the same events: the same states, history, log and explanation.
        again = self._fresh()
        try:
            for event in path:
                again.handle(event)
        except Exception as exc:  # noqa: BLE001 - a crash on a replay is the finding
            self._violate("I5", f"replaying the run raised {type(exc).__name__}: {exc}", path)
            return
        finally:
            self.firings.clear()  # checked when the path was first taken
        same = (
            again.state is engine.state
            and tuple(again.messages) == tuple(engine.messages)
            and again.trace == engine.trace
            and again.explanation == engine.explanation
        )
        if not same:
            self._violate(
                "I5", "the same events, replayed on a fresh engine, gave another run", path
            )

    def _check_refused(
        self, engine: Engine, event: Event, base: tuple[Any, ...], node: _Node, *, absorbed: bool
    ) -> bool:
        self.refusals += 1
        path = (*node.path, event)
        try:
            actions = engine.handle(event)
        except ProtocolError:
            if absorbed:
                self._violate("I4", f"{engine.state.value} refused instead of absorbing", path)
        except Exception as exc:  # noqa: BLE001 - an engine crash is the I8 violation sought
            self._violate("I8", f"handling the event raised {type(exc).__name__}: {exc}", path)
            return True
        else:
            if not absorbed:
                self._violate(
                    "I8",
                    f"{event.trigger.value} is not accepted in {node.snap.state.value} "
                    "(rule 12) but the engine took it",
                    path,
                )
            elif actions:
                self._violate("I4", f"a terminal state answered with actions {actions}", path)
        finally:
            self.firings.clear()  # an event that should not be taken: reported above
        if self._verify(node.snap.state, event) and _fingerprint(engine) != base:
            self._violate(
                "I8" if not absorbed else "I4", "a refused event changed the engine", path
            )
            return True
        return False

    def _verify(self, state: TurnState, event: Event) -> bool:
        """Whether to verify that this refusal changed nothing (see ``Bounds``)."""
        pair = (state, event.trigger)
        self.verified[pair] += 1
        stride = self.bounds.refusal_stride
        return self.verified[pair] <= self.bounds.refusals_per_pair or self.refusals % stride == 0

    def _step(
        self, engine: Engine, event: Event, node: _Node, base: tuple[Any, ...]
    ) -> _Node | None:
        path = (*node.path, event)
        before_history = list(engine.messages)
        before_trace = len(engine.trace)
        before_state = engine.state
        before_turns = engine.turns
        self.firings.clear()
        try:
            actions = engine.handle(event)
        except ProtocolError:
            self.refusals += 1
            # A refusal from inside the dispatch (no row applied) is a transition the
            # rules may have expected.
            self._check_firings(path)
            if self._verify(before_state, event) and _fingerprint(engine) != base:
                self._violate("I8", "a refused event changed the engine", path)
            return None
        except Exception as exc:  # noqa: BLE001 - an engine crash is the I8 violation sought
            # A crash after a wrong step is the step's fault: name the step first.
            self._check_firings(path)
            self._violate("I8", f"handling the event raised {type(exc).__name__}: {exc}", path)
            return None
        self.transitions += 1
        for record in engine.trace[before_trace:]:
            if (record.source, record.trigger, record.dest) not in self.row_set:
                self._violate(
                    "table",
                    f"the engine took {record.source.value} --{record.trigger.value}--> "
                    f"{record.dest.value}, which is not a row of the table",
                    path,
                )
        entered = self._check_firings(path)
        if entered is not None and self.bounds.rules:
            self._check_effects(engine, actions, entered, before_turns, path)
        model_calls = node.model_calls + sum(isinstance(a, CallModel) for a in actions)
        started = set(node.started)
        for action in actions:
            if isinstance(action, StartTool):
                if action.call.id in started:
                    self._violate("I1", f"call {action.call.id!r} was started twice", path)
                started.add(action.call.id)
        counts = dict(node.counts)
        if event.trigger in self.bounds.limits:
            counts[event.trigger] = counts.get(event.trigger, 0) + 1
        frozen_counts = tuple(sorted(counts.items()))
        key = (_canonical_key(engine), frozen_counts)
        child = _Node(
            key,
            node.snap
            if self.strategy != "snapshot" or key in self.seen or engine.state in ABSORBING
            else _snapshot(engine),
            path,
            frozen_counts,
            model_calls,
            frozenset(started),
        )
        self._check_transition(engine, event, actions, before_history, before_state, path)
        self._check_state(engine, path, child)
        self.current = engine
        return child

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
        into = {f.actual for f in firings if f.actual is not f.source}
        stays = {f.actual for f in firings}
        if any(isinstance(a, StartTool) for a in actions) and S.CollectingResults not in stays:
            self._violate(
                "rules", f"effects: {steps} started a tool outside CollectingResults", path
            )
        if any(isinstance(a, CheckPermission) for a in actions) and (
            S.DispatchingTools not in into
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

    def _check_transition(
        self,
        engine: Engine,
        event: Event,
        actions: Sequence[Any],
        before: list[Message],
        before_state: TurnState,
        path: tuple[Event, ...],
    ) -> None:
        history = engine.messages
        if len(history) < len(before) or any(
            a is not b and a != b for a, b in zip(before, history, strict=False)
        ):
            self._violate("I2", "the history was not only appended to", path)
            return
        state = engine.state
        ended = [a for a in actions if isinstance(a, RunEnded)]
        entered = state is not before_state and state in RETURNS_TO_CALLER
        if entered and (len(ended) != 1 or ended[0].state is not state):
            self._violate("I4", f"entering {state.value} did not announce RunEnded", path)
        # I6: a tool's own result, once delivered, is kept as it is.
        if isinstance(event, ToolFinished):
            for message in history[len(before) :]:
                if (
                    isinstance(message, ToolResultMessage)
                    and message.tool_call_id == event.call_id
                    and (
                        message.content != event.output.content
                        or message.is_error != event.output.is_error
                    )
                ):
                    self._violate("I6", f"the result of {event.call_id!r} was rewritten", path)

    def _check_state(self, engine: Engine, path: tuple[Event, ...], node: _Node | None) -> None:
        state = engine.state
        history = list(engine.messages)
        pending = engine.pending_calls()
        for v in history_violations(history, allow_open_tail=bool(pending)):
            self._violate(v.invariant, str(v), path)
        if state in TERMINAL and pending:
            self._violate(
                "I6" if state is S.Aborted else "I1",
                f"{state.value} with calls still unanswered: {[c.id for c in pending]}",
                path,
            )
        if engine.turns > engine.max_turns:
            self._violate(
                "I7", f"{engine.turns} model calls with max_turns={engine.max_turns}", path
            )
        if node is not None and node.model_calls != engine.turns:
            self._violate(
                "I7", f"{node.model_calls} model calls asked but turns={engine.turns}", path
            )
        if state in RETURNS_TO_CALLER and not (engine.explanation or "").strip():
            self._violate("I4", f"{state.value} carries no explanation", path)
        # I3: the model's own final answer ends the run only with nothing queued and no
        # tool call (a should_continue stop may also end it Done, after tool results).
        if state is S.Done and engine.trace and engine.trace[-1].trigger is T.model_responded:
            last = next((m for m in reversed(history) if isinstance(m, AssistantMessage)), None)
            if last is None or last.tool_calls:
                self._violate("I3", "Done, but the last assistant message has tool calls", path)
            if engine.queued_input():
                self._violate("I3", "Done with input still queued", path)
        if state is S.TurnLimitExceeded and str(engine.max_turns) not in (engine.explanation or ""):
            self._violate("I7", "the turn-limit explanation does not name the limit", path)


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
    _REPRS.clear()
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
    _REPRS.clear()
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
        table=_table.TRANSITIONS,
    )


def cli_check(argv: list[str]) -> int:
    """``python -m statemachine check [--turns N] [--calls M]``."""
    parser = CommandParser(
        "check",
        description="Exhaustively check the engine: every accepted event sequence within "
        "the bounds, every invariant at every reachable state, every destination against "
        "the rules, every table row taken.",
        failed="a finding (an invariant broken, a destination against the rules, a row "
        "never taken, a dead end)",
    )
    parser.add_argument("--turns", type=int, default=3, help="max_turns (default 3)")
    parser.add_argument("--calls", type=int, default=3, help="tool calls per response (3)")
    parser.add_argument(
        "--counterexample",
        metavar="FILE",
        help="write the first violation's event path as a journal (replay it to see it)",
    )
    parser.add_argument(
        "--uncapped",
        action="store_true",
        help="explore every configuration with --calls (the hooked one is capped at 2)",
    )
    parser.add_argument(
        "--strategy",
        choices=("snapshot", "replay"),
        default="snapshot",
        help="how engines are copied (default snapshot)",
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    if args.turns < 1 or args.calls < 0:
        return fail("check", "--turns must be >= 1 and --calls >= 0 (see --help)")
    configs = DEFAULT_CONFIGS
    if args.uncapped:
        configs = tuple(attrs.evolve(c, max_calls=None) for c in configs)
    bounds = Bounds(turns=args.turns, calls=args.calls, configs=configs)
    report = check_engine(bounds, strategy=args.strategy)
    print(report.summary())
    findings = (*report.violations, *report.dead_ends)
    if args.counterexample and findings:
        try:
            count = write_counterexample(findings[0], args.counterexample, bounds=bounds)
        except OSError as exc:
            return fail("check", f"cannot write {args.counterexample}: {exc.strerror or exc}")
        print(f"wrote {count} event(s) to {args.counterexample}: python -m statemachine replay")
    print("OK" if report.ok else "FAILED")
    return 0 if report.ok else 1
