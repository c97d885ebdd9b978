"""The exhaustive checker on a team's table: every outcome of every step explored, the
table held to the steps' declarations, and three broken tables caught."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from statemachine.cli.check import cli_check
from statemachine.cli.diagram import cli_diagram
from statemachine.core.steps import check_table
from statemachine.core.table import Guard, OutcomeIs, Table, Transition, Trigger, TurnState
from statemachine.errors import StepDeclarationError
from statemachine.steps import Step, input_guardrail, output_guardrail, table_of
from statemachine.testing.checker import DEFAULT_CONFIGS, Bounds, CheckReport, check_engine

S = TurnState
T = Trigger

GUARD = output_guardrail("refund_limit", lambda text: None)
TRIPWIRE = input_guardrail("no_other_customers", lambda text: None)
STEPS: list[Step] = [TRIPWIRE, GUARD]
TABLE = table_of(STEPS)


def _check(table: Table, *, rules: bool = True) -> CheckReport:
    configs = tuple(attrs.evolve(c, options={**c.options, "table": table}) for c in DEFAULT_CONFIGS)
    return check_engine(Bounds(turns=3, calls=2, configs=configs, rules=rules))


@pytest.mark.timeout(600)
def test_the_checker_explores_every_outcome_of_every_step_and_finds_nothing() -> None:
    report = _check(TABLE)
    assert report.violations == ()
    assert report.dead_ends == ()
    assert report.rows_missed == ()  # every step's every outcome row was taken
    assert report.table == TABLE.rows
    assert report.ok


# -- three broken tables of a team ------------------------------------------------------------


def _edit(table: Table, change: Callable[[Transition], Transition]) -> Table:
    """``table`` with each row passed through ``change``: built as it is, without the
    declaration check (the checker must find what is wrong on its own)."""
    return Table(tuple(change(row) for row in table.rows), table.steps)


def _skips_results(row: Transition) -> Transition:
    # The input guardrail runs as soon as one tool finishes, while the others still
    # run: its "passed" outcome then calls the model over the results not yet in.
    if (row.source, row.trigger) == (S.COLLECTING_RESULTS, T.TOOL_FINISHED):
        return attrs.evolve(row, dest=TRIPWIRE.spec.state)
    return row


def _drops_the_message(row: Transition) -> Transition:
    # The guardrail's retry goes straight to the model, past the turn boundary that
    # appends its message.
    if row.guard == OutcomeIs("retry", spent=False):
        return attrs.evolve(row, dest=S.AWAITING_MODEL)
    return row


def _trips_over_calls(row: Transition) -> Transition:
    # The output guardrail runs on every response, tool calls or not: its "tripped"
    # end leaves the response's calls without results.
    if row.source is S.AWAITING_MODEL and row.guard is Guard.HAS_TOOL_CALLS:
        return attrs.evolve(row, dest=GUARD.spec.state)
    return row


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("change", "refused", "found"),
    [
        (_skips_results, "I1", "I1"),
        (_drops_the_message, "I2", "I2"),
        (_trips_over_calls, "I1", "I1"),
    ],
    ids=[
        "a step outcome that skips started calls' results",
        "a retry that drops its message",
        "a guardrail end that leaves a call unanswered",
    ],
)
def test_a_broken_team_table_is_refused_and_the_checker_catches_it(
    change: Callable[[Transition], Transition], refused: str, found: str
) -> None:
    broken = _edit(TABLE, change)
    assert broken.rows != TABLE.rows
    with pytest.raises(StepDeclarationError, match=f"^{refused}: "):
        check_table(broken)
    # Held to the steps' declarations, the rows part ways with them at once.
    report = _check(broken)
    assert "rules" in {v.invariant for v in report.violations}
    assert not report.ok
    # From the invariants alone (no rules), the broken run itself is caught.
    alone = _check(broken, rules=False)
    assert found in {v.invariant for v in alone.violations}, alone.summary()


@pytest.mark.timeout(60)
def test_the_check_and_diagram_commands_take_an_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "refunds_agent.py").write_text(
        "from statemachine import Agent\n"
        "from statemachine.steps import output_guardrail\n"
        "from statemachine.testing import ScriptedModel\n"
        "agent = Agent(ScriptedModel(), steps=[output_guardrail('refund_limit', "
        "lambda text: None, retries=0)])\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli_diagram(["--agent", "refunds_agent:agent"]) == 0
    drawn = capsys.readouterr().out
    assert "RefundLimit" in drawn
    assert "OutputBlocked" in drawn
    assert cli_check(["--agent", "refunds_agent:agent", "--calls", "2", "--turns", "2"]) == 0
    out = capsys.readouterr().out
    assert "table=refund_limit(after_final)" in out
    assert out.rstrip().endswith("OK")
    assert cli_check(["--agent", "refunds_agent:nothing_here"]) == 2
    assert "refunds_agent has no nothing_here" in capsys.readouterr().err
