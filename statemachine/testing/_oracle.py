"""The loop's rules, stated a second time: the oracle the exhaustive checker holds the
table to.

``core/table.py`` opens with numbered rules in prose and then encodes them as rows. This
module encodes the same prose again, rule by rule, without reading a single row:

* ``destination(source, trigger, holds)``: where the rules send the run when
  ``trigger`` fires in ``source``, given the guard values ``holds`` reports (``None``:
  the rules do not accept the trigger there, rule 12);
* ``accepts(state, trigger)``: whether an input trigger is accepted at all;
* ``due(state, holds)``: the internal trigger that must fire now, if any;
* ``entry_actions(source, dest, ...)``: the actions that entering a state announces.

The checker (``checker.py``; the search is ``_explore.py``) compares every transition
the engine makes, at every reachable state and with the guard values of that moment,
against these. A row written
wrong (a wrong destination, two rows in the wrong order, a guard dropped or inverted, a
row deleted, an abort into the wrong terminal state) is then reported where the table
and the rules part ways, with the rule the row contradicts. Only the vocabulary (the
state, trigger and guard names) is shared with the table: a mistake would have to be
made twice, in two different shapes, to pass.

A run with declared steps (``core/steps.py``) is held to its *declarations*, not to
the rows generated from them: ``steps`` given to ``destination`` says where each point
sits and where each outcome leads, in the words of the steps module's docstring.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

import attrs

from statemachine.core.events import (
    CallModel,
    CancelOperations,
    CheckContinue,
    ReturnToCaller,
    RunStep,
)
from statemachine.core.steps import End, GoOn, Point, Retry, StepSpec
from statemachine.core.table import DeclaredState, Guard, OutcomeIs, State, Trigger, TurnState

__all__ = [
    "ENDS",
    "Expected",
    "Holds",
    "accepts",
    "destination",
    "due",
    "entry_actions",
]

S = TurnState
T = Trigger
G = Guard

Holds = Callable[[Guard | OutcomeIs], bool]
"""The value of a named guard at the moment a trigger fires."""

ENDS: frozenset[TurnState] = frozenset(
    {
        S.DONE,
        S.ABORTED,
        S.TURN_LIMIT_EXCEEDED,
        S.USAGE_LIMIT_EXCEEDED,
        S.OUTPUT_INVALID,
        S.TOOL_RETRIES_EXCEEDED,
        S.FAILED,
    }
)
"""Rule 11: the states that end a run and absorb every further event."""

# Rule 9: where an abort finds nothing running, the run ends at once; where work is
# out, it waits in Aborting for every started operation to report.
_IDLE = frozenset({S.READY, S.TURN_BOUNDARY, S.AWAITING_USER})
_WORKING = frozenset({S.AWAITING_MODEL, S.DISPATCHING_TOOLS, S.COLLECTING_RESULTS})


@attrs.frozen
class Expected:
    """Where the rules send the run, and which rule says so (for the report)."""

    dest: State
    rule: str


def _starting(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.READY:
        return Expected(S.AWAITING_MODEL, "the run starts with a model call")
    return None


def _model_responded(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.ABORTING:
        return Expected(S.ABORTING, "rule 9: while aborting, a report keeps the run waiting")
    if source is not S.AWAITING_MODEL:
        return None
    # Rule 2: a response that reports its own failure ends the run, tool calls or not.
    if holds(G.REPORTS_ERROR):
        return Expected(S.FAILED, "rule 2: a response reporting an error ends the run Failed")
    if holds(G.REPORTS_ABORT):
        return Expected(S.ABORTED, "rule 2: a response reporting an abort ends the run Aborted")
    # Rule 2: tool calls, never the stop reason, decide.
    if holds(G.HAS_TOOL_CALLS):
        return Expected(S.DISPATCHING_TOOLS, "rule 2: a response with tool calls runs them")
    # Rule 6 and I3: a final answer ends the run only with nothing queued.
    if holds(G.INPUT_QUEUED):
        return Expected(S.TURN_BOUNDARY, "rule 6: a final answer with input queued goes on")
    # Rule 13: where a final result is required, text is one failed attempt at it.
    if holds(G.OUTPUT_MISSING):
        return Expected(S.TURN_BOUNDARY, "rule 13: final text where a final result is required")
    return Expected(S.DONE, "rule 6: a final answer with nothing queued ends the run Done")


def _model_failed(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.AWAITING_MODEL:
        return Expected(S.FAILED, "rule 10: a model call that raises ends the run Failed")
    if source is S.ABORTING:
        return Expected(S.ABORTING, "rule 9: while aborting, a report keeps the run waiting")
    return None


def _only_while_aborting(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.ABORTING:
        return Expected(S.ABORTING, "rule 9: while aborting, a report keeps the run waiting")
    return None


def _input_queued(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.AWAITING_USER:
        return Expected(S.TURN_BOUNDARY, "rule 8: a person's message goes to the turn boundary")
    if source in ENDS:
        return None
    return Expected(source, "rule 6: input queued in a live state waits for a turn boundary")


def _resolving(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.DISPATCHING_TOOLS:
        return Expected(S.DISPATCHING_TOOLS, "rule 3: a permission answer resolves one call")
    return None


def _approval_decided(source: TurnState, holds: Holds) -> Expected | None:
    if source is not S.AWAITING_USER:
        return None
    if holds(G.APPROVALS_PENDING):
        return Expected(S.AWAITING_USER, "rule 8: approvals are decided one by one")
    return Expected(S.COLLECTING_RESULTS, "rule 8: once all are decided the approved ones run")


def _tool_finished(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.COLLECTING_RESULTS:
        return Expected(S.COLLECTING_RESULTS, "rule 3: a started call's result arrives")
    return _only_while_aborting(source, holds)


def _continue_decided(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.TURN_BOUNDARY:
        return Expected(S.TURN_BOUNDARY, "rule 7: should_continue is asked first")
    return None


def _abort(source: TurnState, holds: Holds) -> Expected | None:
    if source in _IDLE:
        return Expected(S.ABORTED, "rule 9: with nothing running an abort ends the run at once")
    if source in _WORKING or source is S.ABORTING:
        return Expected(S.ABORTING, "rule 9: with work out, an abort waits for it to report")
    return None


def _dispatched(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.DISPATCHING_TOOLS:
        return Expected(S.COLLECTING_RESULTS, "rule 3: once every call is resolved, they run")
    return None


def _results_complete(source: TurnState, holds: Holds) -> Expected | None:
    if source is not S.COLLECTING_RESULTS:
        return None
    if holds(G.APPROVALS_PENDING):
        return Expected(S.AWAITING_USER, "rule 8: calls waiting for approval suspend the run")
    return Expected(S.TURN_BOUNDARY, "rule 7: a fully answered batch reaches the turn boundary")


def _next_turn(source: TurnState, holds: Holds) -> Expected | None:
    if source is not S.TURN_BOUNDARY:
        return None
    # Rule 7, in its stated order: a denial, a stop, a final result, a tool's retries,
    # the output retries, the turn limit, the usage limits, else the next call.
    if holds(G.DENIED_BY_POLICY):
        return Expected(S.AWAITING_USER, "rule 7: a policy denial wins; a person must hear of it")
    if holds(G.STOP_REQUESTED):
        return Expected(S.DONE, "rule 7: should_continue asked to stop")
    if holds(G.OUTPUT_ACCEPTED):
        return Expected(S.DONE, "rule 7: a valid final result ends the run; no call is needed")
    if holds(G.TOOL_RETRIES_EXHAUSTED):
        return Expected(
            S.TOOL_RETRIES_EXCEEDED, "rule 7: a tool asked for retries past its budget (rule 14)"
        )
    if holds(G.OUTPUT_RETRIES_EXHAUSTED):
        return Expected(S.OUTPUT_INVALID, "rule 7: the output retries are spent (rule 13)")
    if holds(G.TURN_LIMIT_REACHED):
        return Expected(S.TURN_LIMIT_EXCEEDED, "rule 7: the turn limit forbids another call (I7)")
    if holds(G.USAGE_LIMIT_REACHED):
        return Expected(
            S.USAGE_LIMIT_EXCEEDED, "rule 7: a reached usage limit forbids another call (I7)"
        )
    return Expected(S.AWAITING_MODEL, "rule 7: otherwise the model is called again")


def _settled(source: TurnState, holds: Holds) -> Expected | None:
    if source is S.ABORTING:
        return Expected(S.ABORTED, "rule 9: with nothing outstanding the run is Aborted")
    return None


_BY_TRIGGER: dict[Trigger, Callable[[TurnState, Holds], Expected | None]] = {
    T.START: _starting,
    T.MODEL_RESPONDED: _model_responded,
    T.MODEL_FAILED: _model_failed,
    T.MODEL_CANCELLED: _only_while_aborting,
    T.INPUT_QUEUED: _input_queued,
    T.TOOL_PERMITTED: _resolving,
    T.TOOL_DENIED: _resolving,
    T.APPROVAL_REQUIRED: _resolving,
    T.APPROVAL_DECIDED: _approval_decided,
    T.TOOL_FINISHED: _tool_finished,
    T.TOOL_CANCELLED: _only_while_aborting,
    T.CONTINUE_DECIDED: _continue_decided,
    T.ABORT: _abort,
    T.DISPATCHED: _dispatched,
    T.RESULTS_COMPLETE: _results_complete,
    T.NEXT_TURN: _next_turn,
    T.SETTLED: _settled,
}


def destination(
    source: State, trigger: Trigger, holds: Holds, steps: tuple[StepSpec, ...] = ()
) -> Expected | None:
    """Where the rules send a run in ``source`` when ``trigger`` fires (``None``: the
    trigger is not accepted there, rule 12). Terminal states absorb events without a
    transition (rule 11), so nothing is accepted from them either. ``steps``: the
    run's declared steps."""
    if isinstance(source, DeclaredState):
        return None if source.terminal else _in_step(source, trigger, holds, steps)
    if source in ENDS:
        return None
    if trigger is T.STEP_DECIDED:
        return None  # only a step's own state awaits its answer
    expected = _BY_TRIGGER[trigger](source, holds)
    if expected is None or not steps:
        return expected
    return _through_points(source, expected, holds, steps)


# -- declared steps: the points, then each outcome's destination ---------------------------


def _first_at(point: Point, steps: tuple[StepSpec, ...]) -> StepSpec | None:
    return next((s for s in steps if s.point is point), None)


def _through_points(
    source: TurnState, expected: Expected, holds: Holds, steps: tuple[StepSpec, ...]
) -> Expected:
    """A base destination that passes a point with a step goes to the step first."""
    if expected.dest is S.AWAITING_MODEL and source is not S.AWAITING_MODEL:
        step = _first_at(Point.BEFORE_MODEL, steps)
        if step is not None:
            return Expected(step.state, "steps: before_model runs before each model call")
    final = source is S.AWAITING_MODEL or not holds(G.STOP_REQUESTED)
    if expected.dest is S.DONE and final:
        step = _first_at(Point.AFTER_FINAL, steps)
        if step is not None:
            return Expected(
                step.state, "steps: after_final runs before the model's answer ends the run"
            )
    return expected


def _in_step(
    source: DeclaredState, trigger: Trigger, holds: Holds, steps: tuple[StepSpec, ...]
) -> Expected | None:
    chain = [s for s in steps if s.state == source]
    if not chain:
        return None
    step = chain[0]
    if trigger is T.INPUT_QUEUED:
        return Expected(source, "rule 6: input queued while a step runs waits")
    if trigger is T.ABORT:
        return Expected(S.ABORTED, "rule 9: no tool call runs during a step: Aborted at once")
    if trigger is not T.STEP_DECIDED:
        return None
    for name, dest in step.outcomes:
        if holds(OutcomeIs(name)):
            return _outcome(step, name, dest, holds, steps)
    # No outcome holds: only when asking whether the trigger is accepted at all.
    return Expected(source, "steps: a step answers with one of its declared outcomes")


def _outcome(
    step: StepSpec, name: str, dest: GoOn | Retry | End, holds: Holds, steps: tuple[StepSpec, ...]
) -> Expected:
    if isinstance(dest, Retry):
        if not holds(OutcomeIs(name, spent=True)):
            return Expected(S.TURN_BOUNDARY, f"steps: {name} retries through the turn boundary")
        then = step.retry_then(dest)
        then_dest = step.destination(then)
        assert then_dest is not None
        assert not isinstance(then_dest, Retry)
        return _outcome(step, then, then_dest, holds, steps)
    if isinstance(dest, End):
        return Expected(DeclaredState(dest.state, True, dest.explanation), f"steps: {name} ends")
    chain = [s for s in steps if s.point is step.point]
    after = chain.index(step) + 1
    if after < len(chain):
        return Expected(chain[after].state, f"steps: {name} goes on to the next step")
    base = S.AWAITING_MODEL if step.point is Point.BEFORE_MODEL else S.DONE
    return Expected(base, f"steps: {name} goes on where the run was going")


def _never(guard: Guard | OutcomeIs) -> bool:
    return False


def accepts(state: State, trigger: Trigger, steps: tuple[StepSpec, ...] = ()) -> bool:
    """Whether the rules accept ``trigger`` in ``state`` at all; guards only choose
    among destinations, never whether a trigger is accepted."""
    return destination(state, trigger, _never, steps) is not None


# The theory of operation: each internal trigger fires as soon as its guard holds, so
# that a state means exactly what it says.
_DUE: dict[State, tuple[Trigger, Guard]] = {
    S.DISPATCHING_TOOLS: (T.DISPATCHED, G.ALL_CALLS_RESOLVED),
    S.COLLECTING_RESULTS: (T.RESULTS_COMPLETE, G.NOTHING_RUNNING),
    S.TURN_BOUNDARY: (T.NEXT_TURN, G.BOUNDARY_READY),
    S.ABORTING: (T.SETTLED, G.NOTHING_OUTSTANDING),
}


def due(state: State, holds: Holds) -> Trigger | None:
    """The internal trigger that must fire now in ``state``, or ``None``."""
    entry = _DUE.get(state)
    if entry is None or not holds(entry[1]):
        return None
    return entry[0]


def entry_actions(source: State, dest: State, *, check_continue: bool) -> collections.Counter[type]:
    """The actions entering ``dest`` from ``source`` announces, one of each.

    A model call is one turn; an abort with work out tells the driver to cancel it;
    the turn boundary asks should_continue when there is a hook; a state in which the
    driver returns (an end, or waiting for a person) says why.
    """
    out: collections.Counter[type] = collections.Counter()
    if dest == source:
        return out
    if dest is S.AWAITING_MODEL:
        out[CallModel] += 1
    elif dest is S.ABORTING:
        out[CancelOperations] += 1
    elif dest is S.TURN_BOUNDARY and check_continue:
        out[CheckContinue] += 1
    if isinstance(dest, DeclaredState):  # a step's state asks for it; an end returns
        out[ReturnToCaller if dest.terminal else RunStep] += 1
    if dest in ENDS or dest is S.AWAITING_USER:
        out[ReturnToCaller] += 1
    return out
