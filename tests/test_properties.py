"""Hypothesis property tests of the invariants I1–I8 over ``run_agent``.

Scenarios come from the public strategies of ``statemachine.testing``: model scripts
with tool calls to known and unknown tools and with invalid arguments, every stop
reason (``stop`` with tool calls included), text-only answers and raises; tools
that return, raise, take ticks or tiny sleeps (so batches finish in any order),
honour or ignore the abort signal, or hang until cancelled; every abort instant;
turn limits. Each property is shown able to fail in ``test_broken_loops.py``, where
the same checks catch the seed's broken loops.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from statemachine import StopReason, TurnState
from statemachine.testing import (
    AbortAt,
    AbortKind,
    ModelTurn,
    OnAbort,
    Scenario,
    ScriptedCall,
    ToolBehaviour,
    agent_loop,
    check_abort,
    check_control,
    check_determinism,
    check_limits,
    check_no_crash,
    check_order,
    check_pairing,
    check_terminal,
    expected_run,
    run_scenario,
)
from statemachine.testing.scenario import RunRecord
from statemachine.testing.strategies import scenarios

LOOP = agent_loop()


def _run(scenario: Scenario) -> RunRecord:
    record = run_scenario(LOOP, scenario)
    assert record.result is not None, record.error
    return record


@given(scenarios())
def test_i1_every_call_has_exactly_one_result(scenario: Scenario) -> None:
    assert check_pairing(_run(scenario)) == []


@given(scenarios())
def test_i2_history_is_append_only_and_ordered(scenario: Scenario) -> None:
    assert check_order(_run(scenario)) == []


@given(scenarios(aborts=False))
def test_i3_calls_run_or_get_errors_whatever_the_stop_reason(scenario: Scenario) -> None:
    assert check_control(_run(scenario)) == []


@given(scenarios())
def test_i3_under_abort_too(scenario: Scenario) -> None:
    assert check_control(_run(scenario)) == []


@given(scenarios())
def test_i4_runs_end_in_the_expected_terminal_state_with_an_explanation(
    scenario: Scenario,
) -> None:
    record = _run(scenario)
    assert check_terminal(record) == []
    assert record.result is not None
    assert record.result.state is expected_run(scenario).state


@given(scenarios())
def test_i5_same_scenario_same_history_state_and_trace(scenario: Scenario) -> None:
    assert check_determinism(_run(scenario), _run(scenario)) == []


@given(scenarios().filter(lambda s: s.abort.kind is not AbortKind.NEVER))
def test_i6_abort_leaves_every_started_call_answered_and_cleaned_up(
    scenario: Scenario,
) -> None:
    record = _run(scenario)
    assert check_abort(record) == []
    if record.abort_fired:
        assert record.result is not None
        assert record.result.state is TurnState.Aborted


@given(scenarios(aborts=False, max_turns=st.integers(1, 3)))
def test_i7_model_calls_never_exceed_the_limit(scenario: Scenario) -> None:
    record = _run(scenario)
    assert check_limits(record) == []
    assert record.model_calls <= scenario.max_turns


@given(scenarios())
def test_i8_nothing_escapes_and_the_loop_returns(scenario: Scenario) -> None:
    assert check_no_crash(_run(scenario)) == []


# -- examples that pin the generated space's corners ------------------------------------------


def test_stop_reason_stop_with_tool_calls_still_runs_them() -> None:
    scenario = Scenario(
        turns=(ModelTurn(calls=(ScriptedCall(),), stop_reason=StopReason.STOP),), max_turns=3
    )
    record = _run(scenario)
    assert [ex.key for ex in record.executions] == ["t1c0"]
    assert record.model_calls == 2
    assert record.result is not None
    assert record.result.state is TurnState.Done


def test_turn_limit_names_the_limit() -> None:
    asks = ModelTurn(calls=(ScriptedCall(),), stop_reason=StopReason.TOOL_USE)
    record = _run(Scenario(turns=(asks, asks, asks), max_turns=2))
    assert record.result is not None
    assert record.result.state is TurnState.TurnLimitExceeded
    assert "max_turns=2" in record.result.explanation
    assert check_limits(record) == []


def test_hanging_tool_is_cancelled_and_cleaned_up_before_return() -> None:
    hang = ToolBehaviour(on_abort=OnAbort.HANG, cleanup_ticks=2)
    scenario = Scenario(
        turns=(ModelTurn(calls=(ScriptedCall(), ScriptedCall("beta", behaviour=hang))),),
        abort=AbortAt(AbortKind.TOOL_START, 1, 0),
    )
    record = _run(scenario)
    assert record.running_at_return == ()
    beta = next(ex for ex in record.executions if ex.key == "t1c1")
    assert beta.how == "cancelled"
    assert beta.cleanup_done
    assert check_abort(record) == []


def test_expected_run_follows_the_script() -> None:
    asks = ModelTurn(calls=(ScriptedCall(),), stop_reason=StopReason.TOOL_USE)
    assert expected_run(Scenario(turns=(asks,))).model_calls == 2
    assert expected_run(Scenario(turns=(asks,), max_turns=1)).state is TurnState.TurnLimitExceeded
    failing = ModelTurn(calls=(ScriptedCall(),), stop_reason=StopReason.ERROR)
    assert expected_run(Scenario(turns=(failing,))).state is TurnState.Failed
    unknown = ModelTurn(calls=(ScriptedCall("ghost"),))
    # An abort aimed at a call that never runs never fires.
    never = expected_run(Scenario(turns=(unknown,), abort=AbortAt(AbortKind.TOOL_START, 1, 0)))
    assert never.abort_fires is False
    assert never.state is TurnState.Done
