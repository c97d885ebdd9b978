"""A team's own steps, declared, as rows of the one transition table.

A *step* is code of the team's (a guardrail, a review, a check) that the loop runs at
a named *point*, and that answers with one of its named *outcomes*; each outcome is
mapped to a *destination*. ``table_for(steps)`` generates the steps' rows into the
table (``core/table.py``): the engine interprets them, the checker explores every
outcome, the diagrams draw them, exactly as for the library's own rows. An agent
without steps runs on ``BASE_TABLE``, which is ``TRANSITIONS`` itself.

Points
======

A step runs only where no tool call is outstanding: every call of the last
assistant message already has its result (or there is none). So no destination of a
step can leave a call unanswered (I1) or put a message between a call and its result
(I2), and a step never decides control flow from anything but what is in history
(I3). Two points qualify, and they are the two a team needs most:

* ``before_model``: on the way into ``AwaitingModel`` (from ``Ready`` on ``start``,
  and from ``TurnBoundary`` once ``next_turn`` found nothing to stop for). The limits
  are checked first, so a step never pushes a run past ``max_turns``. For an input
  guardrail (a tripwire on what the user asked), a context check, later compaction.
* ``after_final``: on the way into ``Done`` when the model has given its answer (a
  final answer with nothing queued, or an accepted final result at the turn
  boundary), before the run ends. For an output guardrail or a review. A stop asked
  by ``should_continue`` is the caller's own decision and does not pass through it.

Queued input gets no point of its own: it is injected at the next model call, which
``before_model`` already sees. Input queued while an ``after_final`` step runs does not
reopen the answer the step is judging: a ``GoOn`` ends the run ``Done`` and the input is
reported with the result (``Engine.queued_input``), as it is when it arrives with an
accepted final result (rule 7); a retry takes it to the model with the step's message.
A point where calls are outstanding (after a response with tool calls, between
results) is not offered: there, ending the run would leave calls unanswered and a
message would split a call from its result.

Destinations
============

* ``GoOn()``: where the run would have gone without the step (``AwaitingModel`` or
  ``Done``), or into the next step declared at the same point (steps of one point run
  in the order given).
* ``Retry(budget=2, then=...)`` (``after_final`` only): back to the model with a
  message. The run goes to ``TurnBoundary``, which appends the message after the
  final answer (I2: nothing is removed or reordered; the rejected answer stays in
  history), asks ``should_continue`` and checks the limits as after any turn (I7). An
  accepted final result is given up, so the model must give it again. Each retry
  spends one of the step's ``budget``; once it is spent the outcome leads where the
  outcome named ``then`` leads (default: the step's only ``End``).
* ``End(state, explanation)``: the run ends in a terminal state of the team's naming
  (``DeclaredState``), with the explanation a person reads. Several steps may end in
  the same state if they declare it alike.

A step that raises, times out or answers an outcome it did not declare is answered
by the driver with the step's ``on_error`` outcome (default: its only ``End``, so a
failing guardrail fails closed). Abort while a step runs ends the run ``Aborted`` at
once, as at a turn boundary: no tool call is running, and the driver cancels the step.

Rows
====

For the steps ``s1, s2`` at a point, the base row that enters the point (say
``AwaitingModel --model_responded--> Done``) is redirected to ``s1``'s state, and
each step's state gets one ``step_decided`` row per outcome (two for a retry: the
budget spent first, it is the more specific), then ``input_queued`` (stays: rule 6)
and ``abort`` (``Aborted``: rule 9). The outcome rows carry ``OutcomeIs`` guards; a
``step_decided`` with an outcome the step did not declare is refused
(``ProtocolError``, nothing changes: rule 12).

Refusals
========

``table_for`` refuses (``StepDeclarationError``, naming the step and the rule) a
declaration that is malformed (a name, an outcome, a budget out of bounds) or that
would break a rule: a retry before the model call (there is no answer to retry, and
the run is already going to the model), a retry or ``on_error`` naming no outcome, a
declared state named like one of the library's. ``check_table`` then checks the
generated rows themselves, so that a table built by hand or edited is refused the
same way: a row into a step's state from where calls may be outstanding (I1), a
retry that does not go through the turn boundary, where its message is appended
(I2, I7).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import attrs

from statemachine.core.table import (
    BASE_TABLE,
    TRANSITIONS,
    DeclaredState,
    Guard,
    OutcomeIs,
    State,
    Table,
    Transition,
    Trigger,
    TurnState,
)
from statemachine.errors import StepDeclarationError

__all__ = [
    "DEFAULT_RETRY_BUDGET",
    "MAX_OUTCOMES",
    "MAX_RETRY_BUDGET",
    "MAX_STEPS",
    "MAX_STEP_MESSAGE_CHARS",
    "Destination",
    "End",
    "GoOn",
    "Point",
    "Retry",
    "StepSpec",
    "check_table",
    "step_named",
    "table_for",
    "table_from_data",
    "table_to_data",
]

S = TurnState
T = Trigger

DEFAULT_RETRY_BUDGET: Final = 2
"""How many times a step's ``Retry`` outcome may send the run back to the model."""

MAX_RETRY_BUDGET: Final = 100
"""The largest retry budget a step may declare."""
MAX_OUTCOMES: Final = 16
"""How many outcomes one step may declare."""
MAX_STEPS: Final = 16
"""How many steps one agent may declare."""
MAX_STEP_MESSAGE_CHARS: Final = 32_000
"""The longest message a step's decision may carry back to the model."""

_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,47}")
_STATE_NAME: Final = re.compile(r"[A-Z][A-Za-z0-9]{0,47}")


class Point(enum.StrEnum):
    """Where in the loop a step runs (the module docstring says why these two)."""

    BEFORE_MODEL = "before_model"
    AFTER_FINAL = "after_final"


@attrs.frozen
class GoOn:
    """Go on as if the step were not there."""


@attrs.frozen
class Retry:
    """Back to the model with the decision's message, within ``budget`` retries; once
    they are spent, the run goes where the outcome ``then`` goes (default: the step's
    only ``End``)."""

    budget: int = DEFAULT_RETRY_BUDGET
    then: str | None = None


@attrs.frozen
class End:
    """End the run in the terminal state named ``state``, explained by ``explanation``."""

    state: str
    explanation: str


Destination: TypeAlias = GoOn | Retry | End


def _point(value: Point | str) -> Point:
    try:
        return Point(value)
    except ValueError:
        points = ", ".join(p.value for p in Point)
        raise StepDeclarationError(f"{value!r:.40} is not a point; the points: {points}") from None


def _outcomes(
    value: Mapping[str, Destination] | Sequence[tuple[str, Destination]],
) -> tuple[tuple[str, Destination], ...]:
    return tuple(value.items()) if isinstance(value, Mapping) else tuple(value)


@attrs.frozen
class StepSpec:
    """A declared step: its ``name``, its ``point``, its ``outcomes`` (name to
    destination, in the order its rows are tried) and the outcome the driver answers
    with when the step raises or times out (``on_error``; default: its only ``End``).

    Pure data: the sans-IO core never runs a step. The driver's ``Step`` adds the
    function (``statemachine.steps``)."""

    name: str
    point: Point = attrs.field(converter=_point)
    outcomes: tuple[tuple[str, Destination], ...] = attrs.field(converter=_outcomes)
    on_error: str | None = None
    # The live state in which this step runs: its name in CamelCase (one object, so
    # that every row of the step names the same state).
    state: DeclaredState = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        name = self.name if isinstance(self.name, str) else "?"
        camel = "".join(part.capitalize() for part in name.split("_"))
        state = DeclaredState(camel, False, f"the step {name} runs ({self.point})")
        object.__setattr__(self, "state", state)

    def destination(self, outcome: str) -> Destination | None:
        """What ``outcome`` leads to (``None``: the step did not declare it)."""
        for name, dest in self.outcomes:
            if name == outcome:
                return dest
        return None

    @property
    def error_outcome(self) -> str:
        """The outcome the driver answers with when the step fails (see the class)."""
        if self.on_error is not None:
            return self.on_error
        return self._only_end("on_error")

    def retry_then(self, retry: Retry) -> str:
        """The outcome a spent retry leads as."""
        return retry.then if retry.then is not None else self._only_end("Retry.then")

    def _only_end(self, what: str) -> str:
        ends = [name for name, dest in self.outcomes if isinstance(dest, End)]
        if len(ends) != 1:
            raise StepDeclarationError(
                f"step {self.name!r}: {what} is not given and the step has "
                f"{len(ends)} End outcomes, so which one it means is not clear: name it"
            )
        return ends[0]


# -- building the table ---------------------------------------------------------------

# The base rows each point sits on: (source, trigger, dest, guard) of the row redirected
# to the point's first step.
_ENTRIES: Final[Mapping[Point, tuple[tuple[State, Trigger, State, Guard | None], ...]]] = {
    Point.BEFORE_MODEL: (
        (S.READY, T.START, S.AWAITING_MODEL, None),
        (S.TURN_BOUNDARY, T.NEXT_TURN, S.AWAITING_MODEL, None),
    ),
    Point.AFTER_FINAL: (
        (S.AWAITING_MODEL, T.MODEL_RESPONDED, S.DONE, None),
        (S.TURN_BOUNDARY, T.NEXT_TURN, S.DONE, Guard.OUTPUT_ACCEPTED),
    ),
}
_BASE_DEST: Final = {Point.BEFORE_MODEL: S.AWAITING_MODEL, Point.AFTER_FINAL: S.DONE}


def table_for(steps: Sequence[StepSpec]) -> Table:
    """The table of a run with ``steps``: ``BASE_TABLE`` when there are none, else the
    base rows with the steps' rows generated in (see the module docstring).

    Raises ``StepDeclarationError`` before anything runs for a declaration that is
    malformed or would break a rule of the loop."""
    steps = tuple(steps)
    if not steps:
        return BASE_TABLE
    _check_declarations(steps)
    first: dict[Point, StepSpec] = {}
    for step in steps:
        first.setdefault(step.point, step)
    redirect = {entry: first[point].state for point in first for entry in _ENTRIES[point]}
    ends: dict[str, DeclaredState] = {}  # one object per declared end, shared by its rows
    rows: list[Transition] = []
    for row in TRANSITIONS:
        target = redirect.get((row.source, row.trigger, row.dest, row.guard))  # type: ignore[arg-type]
        if target is not None:
            row = attrs.evolve(row, dest=target, label=f"{row.label}: run {target}")
        rows.append(row)
    for point in Point:
        chain = [s for s in steps if s.point is point]
        for i, step in enumerate(chain):
            after = chain[i + 1].state if i + 1 < len(chain) else _BASE_DEST[point]
            rows.extend(_step_rows(step, after, ends))
    table = Table(tuple(rows), steps)
    check_table(table)
    return table


def _step_rows(step: StepSpec, after: State, ends: dict[str, DeclaredState]) -> list[Transition]:
    """The rows that leave ``step``'s state; ``after``: where going on leads."""
    here = step.state

    def leads(dest: Destination) -> State:
        if isinstance(dest, End):
            return ends.setdefault(dest.state, DeclaredState(dest.state, True, dest.explanation))
        return after  # GoOn (a Retry's ``then`` is never a Retry: checked)

    rows: list[Transition] = []
    for name, dest in step.outcomes:
        if isinstance(dest, Retry):
            then = step.retry_then(dest)
            then_dest = step.destination(then)
            assert then_dest is not None
            assert not isinstance(then_dest, Retry)
            rows.append(
                Transition(
                    here,
                    T.STEP_DECIDED,
                    leads(then_dest),
                    OutcomeIs(name, spent=True),
                    f"{name}, retries spent: as {then}",
                )
            )
            if dest.budget > 0:  # with none, the retry never goes back: no row for it
                rows.append(
                    Transition(
                        here,
                        T.STEP_DECIDED,
                        S.TURN_BOUNDARY,
                        OutcomeIs(name, spent=False),
                        f"{name}: back to the model with a message",
                    )
                )
        else:
            label = f"{name}: go on" if isinstance(dest, GoOn) else f"{name}: end the run"
            rows.append(Transition(here, T.STEP_DECIDED, leads(dest), OutcomeIs(name), label))
    rows.append(Transition(here, T.INPUT_QUEUED, here, None, "input queued"))
    rows.append(Transition(here, T.ABORT, S.ABORTED, None, f"abort while {step.name} runs"))
    return rows


def _check_declarations(steps: tuple[StepSpec, ...]) -> None:
    if len(steps) > MAX_STEPS:
        raise StepDeclarationError(f"{len(steps)} steps declared; at most {MAX_STEPS}")
    base_names = {s.value for s in TurnState}
    names: set[str] = set()
    ends: dict[str, str] = {}
    for step in steps:
        where = f"step {step.name!r}"
        if not isinstance(step.name, str) or not _NAME.fullmatch(step.name):
            raise StepDeclarationError(
                f"{where}: a step's name is lower_snake_case, 1 to 48 characters"
            )
        if step.name in names:
            raise StepDeclarationError(f"{where} is declared twice")
        names.add(step.name)
        if step.state.value in base_names:
            raise StepDeclarationError(
                f"{where}: its state {step.state} is one of the library's states"
            )
        _check_outcomes(step, where)
        for _, dest in step.outcomes:
            if isinstance(dest, End):
                _check_end(dest, where, base_names, ends)
    live = {s.state.value for s in steps}
    clash = live & set(ends)
    if clash:
        raise StepDeclarationError(
            f"the terminal state {sorted(clash)[0]} is also the state a step runs in"
        )


def _check_outcomes(step: StepSpec, where: str) -> None:
    if not step.outcomes or len(step.outcomes) > MAX_OUTCOMES:
        raise StepDeclarationError(f"{where}: declare 1 to {MAX_OUTCOMES} outcomes")
    seen: set[str] = set()
    for name, dest in step.outcomes:
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in seen:
            raise StepDeclarationError(
                f"{where}: outcome {name!r} is not a new lower_snake_case name"
            )
        seen.add(name)
        if not isinstance(dest, (GoOn, Retry, End)):
            raise StepDeclarationError(
                f"{where}: outcome {name!r} leads to {dest!r}; expected GoOn(), Retry() or End()"
            )
        if isinstance(dest, Retry):
            _check_retry(step, name, dest, where)
    error = step.error_outcome
    if step.destination(error) is None:
        raise StepDeclarationError(f"{where}: on_error names no outcome of it ({error!r})")


def _check_retry(step: StepSpec, name: str, retry: Retry, where: str) -> None:
    if step.point is Point.BEFORE_MODEL:
        raise StepDeclarationError(
            f"{where}: outcome {name!r} is a Retry, but before the model call there is "
            "no answer to retry and the run is already going to the model; use GoOn or End"
        )
    if isinstance(retry.budget, bool) or not isinstance(retry.budget, int):
        raise StepDeclarationError(f"{where}: outcome {name!r}: the budget is an int")
    if not 0 <= retry.budget <= MAX_RETRY_BUDGET:
        raise StepDeclarationError(
            f"{where}: outcome {name!r}: a retry budget is 0 to {MAX_RETRY_BUDGET} "
            f"(default {DEFAULT_RETRY_BUDGET}), not {retry.budget}"
        )
    then = step.retry_then(retry)
    if then == name or isinstance(step.destination(then), (Retry, type(None))):
        raise StepDeclarationError(
            f"{where}: outcome {name!r}: its retries, once spent, must lead as another "
            f"outcome that is not a Retry (then={then!r})"
        )


def _check_end(end: End, where: str, base_names: set[str], ends: dict[str, str]) -> None:
    if not isinstance(end.state, str) or not _STATE_NAME.fullmatch(end.state):
        raise StepDeclarationError(
            f"{where}: End({end.state!r}): a state's name is CamelCase, 1 to 48 characters"
        )
    if end.state in base_names:
        raise StepDeclarationError(
            f"{where}: End({end.state!r}) is one of the library's states; name your own"
        )
    if not isinstance(end.explanation, str) or not end.explanation.strip():
        raise StepDeclarationError(
            f"{where}: End({end.state!r}) needs an explanation a person can read (I4)"
        )
    if ends.setdefault(end.state, end.explanation) != end.explanation:
        raise StepDeclarationError(
            f"{where}: End({end.state!r}) is declared by two steps with different explanations"
        )


# -- the rows themselves ------------------------------------------------------------------

# Where no tool call can be outstanding when a row fires from it: the rows a step's
# state may be entered by (rule I1 of check_table).
_QUIET: Final = frozenset(
    {(S.READY, T.START), (S.TURN_BOUNDARY, T.NEXT_TURN), (S.AWAITING_MODEL, T.MODEL_RESPONDED)}
)


def check_table(table: Table) -> None:
    """Refuse a table whose step rows could break a rule (``StepDeclarationError``):

    * I1: a row enters a step's state or a declared end from a state where a tool
      call may be outstanding. ``AwaitingModel --model_responded-->`` qualifies only
      after the ``has_tool_calls`` row of its group, which takes every response with
      calls (and after the rows that answer a failed response's calls).
    * I2/I7: a retry (a ``step_decided`` row guarded by a budget left) that does not
      go to ``TurnBoundary``, where its message is appended and the limits checked.
    """
    declared = {s for s in table.declared}
    seen_calls_row = False
    for row in table.rows:
        answered = row.source is not S.AWAITING_MODEL or seen_calls_row
        if row.source is S.AWAITING_MODEL and row.trigger is T.MODEL_RESPONDED:
            seen_calls_row = seen_calls_row or row.guard is Guard.HAS_TOOL_CALLS
        if row.dest not in declared or row.source in declared:
            continue
        if not (answered and (row.source, row.trigger) in _QUIET):
            raise StepDeclarationError(
                f"I1: the row {row.source} --{row.trigger}--> {row.dest} enters a "
                "declared state where a tool call may still be outstanding; a step may "
                "run only where every call has its result"
            )
    for row in table.rows:
        guard = row.guard
        if (
            isinstance(guard, OutcomeIs)
            and guard.spent is False
            and row.dest is not S.TURN_BOUNDARY
        ):
            raise StepDeclarationError(
                f"I2: the retry row {row.source} --{row.trigger}--> {row.dest} does not go "
                "to TurnBoundary, where its message is appended and the limits are checked"
            )


def step_named(steps: Iterable[StepSpec], state: State) -> StepSpec | None:
    """The step that runs in ``state`` (``None``: not a step's state)."""
    for step in steps:
        if step.state == state:
            return step
    return None


# -- the JSON form of declarations (a journal's header holds them) --------------------------


def table_to_data(table: Table) -> list[dict[str, Any]]:
    """The declarations ``table`` was generated from, as JSON data (``table_from_data``)."""
    return [
        {
            "name": step.name,
            "point": step.point.value,
            "outcomes": [[name, _destination_to_data(dest)] for name, dest in step.outcomes],
            "onError": step.on_error,
        }
        for step in table.steps
    ]


def _destination_to_data(dest: Destination) -> dict[str, Any]:
    if isinstance(dest, Retry):
        return {"retry": {"budget": dest.budget, "then": dest.then}}
    if isinstance(dest, End):
        return {"end": {"state": dest.state, "explanation": dest.explanation}}
    return {"goOn": {}}


def table_from_data(data: object, path: str = "steps") -> Table:
    """The table of the declarations ``table_to_data`` wrote; ``StepDeclarationError``
    naming ``path`` for data of another shape, or declarations that would break a rule."""
    if not isinstance(data, list) or len(data) > MAX_STEPS:
        raise StepDeclarationError(f"{path}: expected a list of at most {MAX_STEPS} steps")
    steps = []
    for i, item in enumerate(data):
        where = f"{path}[{i}]"
        if not isinstance(item, Mapping) or set(item) != {"name", "point", "outcomes", "onError"}:
            raise StepDeclarationError(f"{where}: expected name, point, outcomes and onError")
        outcomes = item["outcomes"]
        if not isinstance(outcomes, list) or len(outcomes) > MAX_OUTCOMES:
            raise StepDeclarationError(f"{where}.outcomes: expected a list of [name, destination]")
        pairs = [_outcome_from_data(o, f"{where}.outcomes[{k}]") for k, o in enumerate(outcomes)]
        if item["point"] not in {p.value for p in Point}:
            raise StepDeclarationError(f"{where}.point: {item['point']!r:.40} is not a point")
        steps.append(StepSpec(item["name"], item["point"], pairs, item["onError"]))
    return table_for(steps)


def _outcome_from_data(value: object, path: str) -> tuple[str, Destination]:
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], Mapping):
        raise StepDeclarationError(f"{path}: expected [name, destination]")
    name, dest = value
    if len(dest) != 1:
        raise StepDeclarationError(f"{path}: expected one of goOn, retry, end")
    kind, args = next(iter(dest.items()))
    try:
        if kind == "goOn" and args == {}:
            return name, GoOn()
        if kind == "retry" and isinstance(args, Mapping) and set(args) == {"budget", "then"}:
            return name, Retry(args["budget"], args["then"])
        if kind == "end" and isinstance(args, Mapping) and set(args) == {"state", "explanation"}:
            return name, End(args["state"], args["explanation"])
    except TypeError:
        pass
    raise StepDeclarationError(f"{path}: {kind!r:.40} is not goOn, retry or end as written")
