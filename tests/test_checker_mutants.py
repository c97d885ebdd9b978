"""The checker holds the table to the rules: mutants of the table are caught.

Each mutant below is the real table with one row written wrong, the way a person
editing it could: a wrong destination, two rows of a group in the wrong order, a guard
dropped or inverted, a row deleted, an abort sent to the wrong terminal state. The
mutant is installed everywhere the engine reads the table, and the checker must fail
it with a ``rules`` finding whose counterexample reads: the events from the start, the
state, the trigger, expected versus actual. A mutant no run can tell from the real
table is listed as equivalent, and the checker must pass it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import attrs
import pytest

from statemachine.core import table as _table
from statemachine.core.steps import GoOn, StepSpec
from statemachine.core.table import Guard, State, Transition, Trigger, TurnState
from statemachine.testing import _oracle as _rules
from statemachine.testing import _reference
from statemachine.testing._space import NATIVE_OUTPUT, NATIVE_TEXTS, RESPONSE_USAGE, USAGE_LIMITS
from statemachine.testing._space import OUTPUT as OUTPUT_SPEC
from statemachine.testing.checker import Bounds, CheckReport, Config, check_engine

S = TurnState
T = Trigger
G = Guard

# Each mutant is checked in the one engine configuration that reaches its row (the
# default check explores all three and fails every mutant too; bench/mutation.md has the
# figures): two turns, one call per response, and one finding stops the search.
PLAIN = Bounds(turns=2, calls=1, configs=(Config({}),), max_violations=1)
CONTINUE = attrs.evolve(PLAIN, configs=(Config({"check_continue": True}),))
HOOKED = attrs.evolve(PLAIN, configs=(Config({"check_permissions": True, "check_continue": True}),))
# Responses that report no usage or enough to reach the limit: at the second turn
# boundary the usage limit may hold alone, or together with the turn limit.
USAGE = attrs.evolve(
    PLAIN, configs=(Config({"usage_limits": USAGE_LIMITS}, usages=(None, RESPONSE_USAGE)),)
)
# Two calls per response: a valid and an invalid final result may come together, so a
# valid result meets spent retries at one boundary.
OUTPUT = attrs.evolve(
    PLAIN,
    calls=2,
    configs=(
        Config(
            {"output": OUTPUT_SPEC, "check_continue": True},
            call_kinds=("ok", "final_ok", "final_bad"),
        ),
    ),
)
HOOKED_OUTPUT = attrs.evolve(
    OUTPUT,
    configs=(
        Config(
            {"output": OUTPUT_SPEC, "check_permissions": True},
            call_kinds=("ok", "final_ok", "final_bad"),
        ),
    ),
)
# Native output: no final-result tool; a final answer's text is valid JSON of the schema,
# JSON that breaks it, or no JSON.
NATIVE = attrs.evolve(
    PLAIN,
    configs=(
        Config(
            {"output": NATIVE_OUTPUT, "check_continue": True},
            call_kinds=("ok",),
            texts=NATIVE_TEXTS,
        ),
    ),
)
HOOKED_USAGE = attrs.evolve(
    PLAIN,
    configs=(
        Config(
            {"usage_limits": USAGE_LIMITS, "check_permissions": True},
            usages=(None, RESPONSE_USAGE),
        ),
    ),
)

Rows = tuple[Transition, ...]
Edit = Callable[[Rows], Rows]


def _find(rows: Rows, source: TurnState, trigger: Trigger, guard: Guard | None) -> int:
    matches = [
        i for i, r in enumerate(rows) if (r.source, r.trigger, r.guard) == (source, trigger, guard)
    ]
    assert len(matches) == 1, f"no single row {source} --{trigger}[{guard}]-->"
    return matches[0]


def redirect(source: TurnState, trigger: Trigger, guard: Guard | None, dest: TurnState) -> Edit:
    """The row goes to ``dest`` instead."""

    def edit(rows: Rows) -> Rows:
        i = _find(rows, source, trigger, guard)
        return (*rows[:i], attrs.evolve(rows[i], dest=dest), *rows[i + 1 :])

    return edit


def swap(source: TurnState, trigger: Trigger, first: Guard, second: Guard) -> Edit:
    """The two rows of a group are tried in the other order."""

    def edit(rows: Rows) -> Rows:
        i, j = _find(rows, source, trigger, first), _find(rows, source, trigger, second)
        out = list(rows)
        out[i], out[j] = rows[j], rows[i]
        return tuple(out)

    return edit


def drop_guard(source: TurnState, trigger: Trigger, guard: Guard) -> Edit:
    """The row applies whether its guard holds or not."""

    def edit(rows: Rows) -> Rows:
        i = _find(rows, source, trigger, guard)
        return (*rows[:i], attrs.evolve(rows[i], guard=None), *rows[i + 1 :])

    return edit


def invert_guard(source: TurnState, trigger: Trigger, guard: Guard) -> Edit:
    """The guarded row applies exactly when its guard does not hold: the guarded row
    and the group's last (unguarded) row exchange their destinations."""

    def edit(rows: Rows) -> Rows:
        i = _find(rows, source, trigger, guard)
        j = _find(rows, source, trigger, None)
        out = list(rows)
        out[i] = attrs.evolve(rows[i], dest=rows[j].dest)
        out[j] = attrs.evolve(rows[j], dest=rows[i].dest)
        return tuple(out)

    return edit


def delete(source: TurnState, trigger: Trigger, guard: Guard | None) -> Edit:
    """The row is gone."""

    def edit(rows: Rows) -> Rows:
        i = _find(rows, source, trigger, guard)
        return (*rows[:i], *rows[i + 1 :])

    return edit


MUTANTS: dict[str, tuple[Edit, Bounds]] = {
    # a wrong destination
    "final answer with input queued ends Done": (
        redirect(S.AWAITING_MODEL, T.MODEL_RESPONDED, G.INPUT_QUEUED, S.DONE),
        PLAIN,
    ),
    "turn limit ends Done": (
        redirect(S.TURN_BOUNDARY, T.NEXT_TURN, G.TURN_LIMIT_REACHED, S.DONE),
        PLAIN,
    ),
    "a failed model call ends Aborted": (
        redirect(S.AWAITING_MODEL, T.MODEL_FAILED, None, S.ABORTED),
        PLAIN,
    ),
    "approvals pending go to the turn boundary": (
        redirect(S.COLLECTING_RESULTS, T.RESULTS_COMPLETE, G.APPROVALS_PENDING, S.TURN_BOUNDARY),
        HOOKED,
    ),
    # rows of a group in the wrong order
    "stop asked wins over a policy denial": (
        swap(S.TURN_BOUNDARY, T.NEXT_TURN, G.DENIED_BY_POLICY, G.STOP_REQUESTED),
        HOOKED,
    ),
    "turn limit wins over a stop asked": (
        swap(S.TURN_BOUNDARY, T.NEXT_TURN, G.STOP_REQUESTED, G.TURN_LIMIT_REACHED),
        CONTINUE,
    ),
    "usage limit wins over the turn limit": (
        swap(S.TURN_BOUNDARY, T.NEXT_TURN, G.TURN_LIMIT_REACHED, G.USAGE_LIMIT_REACHED),
        USAGE,
    ),
    "usage limit wins over a policy denial": (
        swap(S.TURN_BOUNDARY, T.NEXT_TURN, G.DENIED_BY_POLICY, G.USAGE_LIMIT_REACHED),
        HOOKED_USAGE,
    ),
    "output retries win over a valid final result": (
        swap(S.TURN_BOUNDARY, T.NEXT_TURN, G.OUTPUT_ACCEPTED, G.OUTPUT_RETRIES_EXHAUSTED),
        OUTPUT,
    ),
    "the turn limit wins over a valid final result": (
        swap(S.TURN_BOUNDARY, T.NEXT_TURN, G.OUTPUT_ACCEPTED, G.TURN_LIMIT_REACHED),
        OUTPUT,
    ),
    "final text where a final result is required ends Done": (
        redirect(S.AWAITING_MODEL, T.MODEL_RESPONDED, G.OUTPUT_MISSING, S.DONE),
        OUTPUT,
    ),
    "spent output retries end Failed": (
        redirect(S.TURN_BOUNDARY, T.NEXT_TURN, G.OUTPUT_RETRIES_EXHAUSTED, S.FAILED),
        OUTPUT,
    ),
    "native: final text that is not the output ends Done": (
        redirect(S.AWAITING_MODEL, T.MODEL_RESPONDED, G.OUTPUT_MISSING, S.DONE),
        NATIVE,
    ),
    "native: spent output retries end Failed": (
        redirect(S.TURN_BOUNDARY, T.NEXT_TURN, G.OUTPUT_RETRIES_EXHAUSTED, S.FAILED),
        NATIVE,
    ),
    "a valid final result wins over a policy denial": (
        swap(S.TURN_BOUNDARY, T.NEXT_TURN, G.DENIED_BY_POLICY, G.OUTPUT_ACCEPTED),
        HOOKED_OUTPUT,
    ),
    "usage limit ends Done": (
        redirect(S.TURN_BOUNDARY, T.NEXT_TURN, G.USAGE_LIMIT_REACHED, S.DONE),
        USAGE,
    ),
    "usage limit guard dropped": (
        drop_guard(S.TURN_BOUNDARY, T.NEXT_TURN, G.USAGE_LIMIT_REACHED),
        USAGE,
    ),
    "queued input wins over tool calls": (
        swap(S.AWAITING_MODEL, T.MODEL_RESPONDED, G.HAS_TOOL_CALLS, G.INPUT_QUEUED),
        PLAIN,
    ),
    "tool calls win over a reported abort": (
        swap(S.AWAITING_MODEL, T.MODEL_RESPONDED, G.REPORTS_ABORT, G.HAS_TOOL_CALLS),
        PLAIN,
    ),
    # a guard dropped
    "every response reports an abort": (
        drop_guard(S.AWAITING_MODEL, T.MODEL_RESPONDED, G.REPORTS_ABORT),
        PLAIN,
    ),
    "every turn boundary is the limit": (
        drop_guard(S.TURN_BOUNDARY, T.NEXT_TURN, G.TURN_LIMIT_REACHED),
        PLAIN,
    ),
    "every batch waits for approval": (
        drop_guard(S.COLLECTING_RESULTS, T.RESULTS_COMPLETE, G.APPROVALS_PENDING),
        PLAIN,
    ),
    # a guard inverted
    "the last approval keeps waiting": (
        invert_guard(S.AWAITING_USER, T.APPROVAL_DECIDED, G.APPROVALS_PENDING),
        HOOKED,
    ),
    "calls run while approvals are pending": (
        invert_guard(S.COLLECTING_RESULTS, T.RESULTS_COMPLETE, G.APPROVALS_PENDING),
        PLAIN,
    ),
    "the turn limit is inverted": (
        invert_guard(S.TURN_BOUNDARY, T.NEXT_TURN, G.TURN_LIMIT_REACHED),
        PLAIN,
    ),
    # a row deleted
    "no final answer with input queued": (
        delete(S.AWAITING_MODEL, T.MODEL_RESPONDED, G.INPUT_QUEUED),
        PLAIN,
    ),
    "a reported error is not an end": (
        delete(S.AWAITING_MODEL, T.MODEL_RESPONDED, G.REPORTS_ERROR),
        PLAIN,
    ),
    "no cancelled tool while aborting": (delete(S.ABORTING, T.TOOL_CANCELLED, None), PLAIN),
    "no abort at the turn boundary": (delete(S.TURN_BOUNDARY, T.ABORT, None), CONTINUE),
    "aborting never settles": (delete(S.ABORTING, T.SETTLED, G.NOTHING_OUTSTANDING), PLAIN),
    # an abort into the wrong terminal state
    "abort before the first call ends Done": (redirect(S.READY, T.ABORT, None, S.DONE), PLAIN),
    "abort while waiting for a person ends Failed": (
        redirect(S.AWAITING_USER, T.ABORT, None, S.FAILED),
        HOOKED,
    ),
    "settling an abort ends Done": (
        redirect(S.ABORTING, T.SETTLED, G.NOTHING_OUTSTANDING, S.DONE),
        PLAIN,
    ),
    "abort at the turn boundary hits the turn limit": (
        redirect(S.TURN_BOUNDARY, T.ABORT, None, S.TURN_LIMIT_EXCEEDED),
        CONTINUE,
    ),
}

EQUIVALENT: dict[str, Edit] = {
    # A response has one stop reason: it cannot report an error and an abort at once,
    # so the order of these two rows is invisible.
    "reported abort tried before reported error": swap(
        S.AWAITING_MODEL, T.MODEL_RESPONDED, G.REPORTS_ERROR, G.REPORTS_ABORT
    ),
}


def _groups(rows: Sequence[Transition]) -> dict[tuple[State, Trigger], Rows]:
    groups: dict[tuple[State, Trigger], Rows] = {}
    for row in rows:
        groups[(row.source, row.trigger)] = (*groups.get((row.source, row.trigger), ()), row)
    return groups


@contextlib.contextmanager
def installed(rows: Rows) -> Iterator[None]:
    """Make ``rows`` the table everywhere it is read: the table module (which the engine
    interprets through ``rows_from``) and the reference ``transitions`` machine;
    restore the real one after."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_table, "TRANSITIONS", rows)
        patch.setattr(_table, "_BY_SOURCE", _table.index(rows))
        _reference.reference_machine.cache_clear()
        try:
            yield
        finally:
            _reference.reference_machine.cache_clear()


def check_mutant(edit: Edit, bounds: Bounds) -> CheckReport:
    rows = edit(_table.TRANSITIONS)
    assert rows != _table.TRANSITIONS
    with installed(rows):
        return check_engine(bounds)


def test_the_harness_installs_the_edited_rows_where_the_engine_reads_them() -> None:
    # If the table module changes how the engine reads its rows, the mutants below would
    # be installed wrongly: this fails first.
    rows = redirect(S.READY, T.START, None, S.DONE)(_table.TRANSITIONS)
    with installed(rows):
        assert _table.rows_from(S.READY, T.START)[0].dest is S.DONE
        assert _groups(rows) == {
            (source, trigger): group
            for source, leaving in _table._BY_SOURCE.items()
            for trigger, group in leaving.by_trigger.items()
        }
    assert _table.rows_from(S.READY, T.START)[0].dest is S.AWAITING_MODEL


def test_there_are_mutants_of_every_kind() -> None:
    assert len(MUTANTS) >= 13
    # Each mutant really changes the table, and no two are the same check (one edit may
    # be checked in two configurations: the native-output mutants repeat the tool's).
    checks = {(edit(_table.TRANSITIONS), id(bounds)) for edit, bounds in MUTANTS.values()}
    assert len(checks) == len(MUTANTS)
    assert _table.TRANSITIONS not in {table for table, _ in checks}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_checker_fails_a_table_mutant(name: str) -> None:
    report = check_mutant(*MUTANTS[name])
    assert not report.ok
    findings = [v for v in report.violations if v.invariant == "rules"]
    assert findings, report.summary()
    finding = findings[0]
    assert finding.path, "a counterexample starts from the first event"
    text = report.summary()
    assert str(finding) in text
    assert "path from the start:" in text


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "bounds",
    [PLAIN, CONTINUE, HOOKED, USAGE, HOOKED_USAGE, OUTPUT, HOOKED_OUTPUT, NATIVE],
    ids=[
        "plain",
        "continue",
        "hooked",
        "usage",
        "hooked-usage",
        "output",
        "hooked-output",
        "native",
    ],
)
def test_the_real_table_passes_the_mutants_bounds(bounds: Bounds) -> None:
    # So every finding above is the mutant's, not the bounds'.
    report = check_engine(attrs.evolve(bounds, max_violations=20))
    assert report.violations == (), report.summary()
    assert report.dead_ends == ()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(EQUIVALENT))
def test_an_equivalent_mutant_passes(name: str) -> None:
    # Every default configuration, at two turns and one call per response.
    report = check_mutant(EQUIVALENT[name], Bounds(turns=2, calls=1))
    assert report.violations == (), report.summary()
    assert report.dead_ends == ()


@pytest.mark.timeout(60)
def test_a_counterexample_names_state_trigger_expected_and_actual() -> None:
    report = check_mutant(*MUTANTS["turn limit wins over a stop asked"])
    finding = next(v for v in report.violations if v.invariant == "rules")
    assert finding.message.startswith("rule 7")
    assert "in TurnBoundary on next_turn" in finding.message
    assert "stop_requested=True" in finding.message
    assert "expected Done, actual TurnLimitExceeded" in finding.message
    # The path ends where the run was sent the wrong way: should_continue said stop.
    assert finding.path[-1].trigger is T.CONTINUE_DECIDED


@pytest.mark.timeout(60)
def test_without_the_rules_the_invariants_alone_miss_these_mutants() -> None:
    # Why the rules oracle exists: each of these breaks a stated rule without breaking
    # any invariant, so only the comparison with the rules sees it.
    missed = [
        "turn limit wins over a stop asked",
        "usage limit wins over the turn limit",
        "abort at the turn boundary hits the turn limit",
        "the last approval keeps waiting",
    ]
    for name in missed:
        edit, bounds = MUTANTS[name]
        report = check_mutant(edit, attrs.evolve(bounds, rules=False))
        assert report.violations == (), (name, report.summary())
        assert not check_mutant(edit, bounds).ok


def test_rows_are_counted_by_position_not_by_destination() -> None:
    # An equivalent refinement of the table: queued input at the boundary gets a row of
    # its own, with the same destination as the group's last row. Both rows are taken,
    # and the coverage says so (keyed by destination, the second would look unused).
    last = _find(_table.TRANSITIONS, S.TURN_BOUNDARY, T.NEXT_TURN, None)
    extra = attrs.evolve(_table.TRANSITIONS[last], guard=G.INPUT_QUEUED, label="queued input")
    rows = (*_table.TRANSITIONS[:last], extra, *_table.TRANSITIONS[last:])
    with installed(rows):
        report = check_engine(Bounds(turns=2, calls=1))
    assert report.violations == (), report.summary()
    assert last in report.rows_taken
    assert last + 1 in report.rows_taken
    assert report.table == rows


def test_the_rules_have_an_answer_for_every_trigger() -> None:
    for trigger in Trigger:
        if trigger is Trigger.STEP_DECIDED:  # only a declared step's state awaits it
            step = StepSpec("review", "after_final", {"ok": GoOn()}, on_error="ok")
            assert _rules.accepts(step.state, trigger, (step,))
            assert not any(_rules.accepts(state, trigger, (step,)) for state in TurnState)
            continue
        assert any(_rules.accepts(state, trigger) for state in TurnState), trigger
    for state in _rules.ENDS:
        assert not any(_rules.accepts(state, trigger) for trigger in Trigger)
