"""Hypothesis property tests of the invariants I1–I8 over ``run_agent``.

Scenarios come from the public strategies of ``statemachine.testing``: model scripts
with tool calls to known and unknown tools and with invalid arguments, every stop
reason (``stop`` with tool calls included), text-only answers and raises; tools
that return, raise, take ticks or tiny sleeps (so batches finish in any order),
honour or ignore the abort signal, or hang until cancelled; every abort instant;
turn limits. Each property is shown able to fail in ``test_broken_loops.py``, where
the same checks catch the deliberately broken loops.
"""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from statemachine import (
    AssistantMessage,
    Message,
    TextContent,
    ToolCall,
    ToolResultMessage,
    TurnState,
    UserMessage,
)
from statemachine.messages import StopReason
from statemachine.testing import (
    AbortAt,
    AbortKind,
    Execution,
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
        assert record.result.state is TurnState.ABORTED


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
    assert record.result.state is TurnState.DONE


def test_turn_limit_names_the_limit() -> None:
    asks = ModelTurn(calls=(ScriptedCall(),), stop_reason=StopReason.TOOL_USE)
    record = _run(Scenario(turns=(asks, asks, asks), max_turns=2))
    assert record.result is not None
    assert record.result.state is TurnState.TURN_LIMIT_EXCEEDED
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
    assert expected_run(Scenario(turns=(asks,), max_turns=1)).state is TurnState.TURN_LIMIT_EXCEEDED
    failing = ModelTurn(calls=(ScriptedCall(),), stop_reason=StopReason.ERROR)
    assert expected_run(Scenario(turns=(failing,))).state is TurnState.FAILED
    unknown = ModelTurn(calls=(ScriptedCall("ghost"),))
    # An abort aimed at a call that never runs never fires.
    never = expected_run(Scenario(turns=(unknown,), abort=AbortAt(AbortKind.TOOL_START, 1, 0)))
    assert never.abort_fires is False
    assert never.state is TurnState.DONE


# -- one fault, one finding: the exact findings of hand-made records ----------------------------


def _asks(*calls: tuple[str, str, str], text: str = "") -> AssistantMessage:
    """An assistant message with calls given as (id, tool, key)."""
    content: list[TextContent | ToolCall] = [TextContent(text)] if text else []
    content += [ToolCall(call_id, tool, {"key": key}) for call_id, tool, key in calls]
    return AssistantMessage(tuple(content), stop_reason=StopReason.TOOL_USE)


def _answer(call_id: str, key: str, tool: str = "alpha", *, error: bool = False) -> Message:
    return ToolResultMessage(call_id, tool, f"{tool} output for {key}", is_error=error)


NO_ABORT = AbortAt()
_DONE = AssistantMessage("The script has ended.", stop_reason=StopReason.STOP)


def _record(
    turns: tuple[ModelTurn, ...],
    transcript: list[Message],
    *,
    ran: tuple[str, ...] = (),
    produced: tuple[AssistantMessage, ...] | None = None,
    abort: AbortAt = NO_ABORT,
) -> RunRecord:
    """A run as a loop under test might have left it: ``ran`` are the keys whose tool
    (alpha) ran and returned; ``produced`` defaults to the transcript's responses."""
    scenario = Scenario(turns=turns, abort=abort)
    if produced is None:
        produced = tuple(m for m in transcript if isinstance(m, AssistantMessage))
    executions = tuple(
        Execution(
            key, "alpha", n, False, finished=True, how="returned", output=f"alpha output for {key}"
        )
        for n, key in enumerate(ran)
    )
    return RunRecord(
        scenario=scenario,
        transcript=(UserMessage("Do the task."), *transcript),
        result=None,
        error=None,
        timed_out=False,
        model_calls=len(produced),
        produced=produced,
        raised_at=(),
        executions=executions,
        running_at_return=(),
        abort_fired=abort.kind is not AbortKind.NEVER,
        abort_fired_after_model_calls=1 if abort.kind is not AbortKind.NEVER else 0,
        model_calls_after_abort=0,
    )


THREE_CALLS = (ModelTurn(calls=(ScriptedCall(), ScriptedCall(), ScriptedCall())),)


def test_a_missing_result_is_one_i1_finding_and_no_i2_one() -> None:
    record = _record(
        THREE_CALLS,
        [
            _asks(("a", "alpha", "t1c0"), ("b", "alpha", "t1c1"), ("c", "alpha", "t1c2")),
            _answer("b", "t1c1"),
            _answer("c", "t1c2"),
        ],
        ran=("t1c0", "t1c1", "t1c2"),
    )
    assert check_pairing(record) == ["I1 at message 1: tool call 'a' (alpha) has no result"]
    assert check_order(record) == []


def test_a_wrong_id_is_one_i1_finding_at_the_result_and_no_i2_one() -> None:
    record = _record(
        THREE_CALLS[:1],
        [
            _asks(("a", "alpha", "t1c0"), ("b", "alpha", "t1c1")),
            _answer("x", "t1c0"),
            _answer("b", "t1c1"),
            _DONE,
        ],
        ran=("t1c0", "t1c1"),
    )
    assert check_pairing(record) == [
        "I1 at message 2: the result has id 'x', which no call of message 1 has: the result "
        "expected there is that of tool call 'a' (alpha)"
    ]
    assert check_order(record) == []
    assert check_control(record) == []


def test_i1_findings_are_listed_in_message_order() -> None:
    record = _record(
        THREE_CALLS,
        [
            _asks(("a", "alpha", "t1c0"), ("b", "alpha", "t1c1")),
            _answer("b", "t1c1"),
            _answer("b", "t1c1"),
            AssistantMessage("Done."),
        ],
        ran=("t1c1",),
    )
    assert check_pairing(record) == [
        "I1 at message 1: tool call 'a' (alpha) has no result before the next assistant "
        "message (message 4)",
        "I1 at message 3: a second result for tool call 'b'",
    ]


def test_results_out_of_order_are_one_finding_per_late_call() -> None:
    # c and b both come before a: one fault (a is late), one finding.
    record = _record(
        THREE_CALLS,
        [
            _asks(("a", "alpha", "t1c0"), ("b", "alpha", "t1c1"), ("c", "alpha", "t1c2")),
            _answer("b", "t1c1"),
            _answer("c", "t1c2"),
            _answer("a", "t1c0"),
        ],
        ran=("t1c0", "t1c1", "t1c2"),
    )
    assert check_pairing(record) == []
    assert check_order(record) == [
        "I2 at message 2: result for tool call 'b' comes before the result(s) of earlier "
        "call(s) 'a' of the same assistant message"
    ]


_R1 = _asks(("c1", "alpha", "t1c0"))
_R2 = _asks(("c2", "alpha", "t2c0"))
_R3 = AssistantMessage("All done.", stop_reason=StopReason.STOP)
_TWO_ROUNDS = (ModelTurn(calls=(ScriptedCall(),)), ModelTurn(calls=(ScriptedCall(),)))


def test_a_rewritten_response_is_one_finding_not_one_per_later_response() -> None:
    rewritten = _asks(("c2", "alpha", "t2c0"), text="Let me try something else.")
    record = _record(
        _TWO_ROUNDS,
        [_R1, _answer("c1", "t1c0"), rewritten, _answer("c2", "t2c0"), _R3],
        ran=("t1c0", "t2c0"),
        produced=(_R1, _R2, _R3),
    )
    assert check_order(record) == [
        "I2 at message 3: assistant message 3 is not the model's next response: response 2 "
        "of 3 ([toolUse] calls alpha(t2c0)) was expected there (messages must appear as "
        "they arrived)"
    ]


def test_a_dropped_response_is_one_finding() -> None:
    record = _record(
        _TWO_ROUNDS,
        [_R1, _answer("c1", "t1c0"), _R3],
        ran=("t1c0", "t2c0"),
        produced=(_R1, _R2, _R3),
    )
    assert check_order(record) == [
        "I2 at message 3: model response 2 of 3 is missing from the history: assistant "
        "message 3 is response 3"
    ]


def test_an_invented_response_is_one_finding() -> None:
    invented = AssistantMessage("Thinking...", stop_reason=StopReason.STOP)
    record = _record(
        _TWO_ROUNDS,
        [_R1, _answer("c1", "t1c0"), invented, _R2, _answer("c2", "t2c0"), _R3],
        ran=("t1c0", "t2c0"),
        produced=(_R1, _R2, _R3),
    )
    assert check_order(record) == [
        "I2 at message 3: assistant message 3 is not a response of the model: response 2 of "
        "3 ([toolUse] calls alpha(t2c0)) was expected there, and comes after it"
    ]


def test_a_truncated_history_names_the_missing_responses_once() -> None:
    record = _record(
        _TWO_ROUNDS, [_R1, _answer("c1", "t1c0")], ran=("t1c0",), produced=(_R1, _R2, _R3)
    )
    assert check_order(record) == [
        "I2 at message 3: model responses 2, 3 of 3 are missing from the history"
    ]


_TWICE_DUP = _asks(("dup", "alpha", "t1c0"), ("dup", "alpha", "t1c1"))
_DUP_FINDING = "I1 at message 1: tool call id 'dup' repeats the id of a call in message 1"


def test_repeated_ids_pair_results_by_position() -> None:
    record = _record(
        (ModelTurn(calls=(ScriptedCall(call_id="dup"), ScriptedCall(call_id="dup"))),),
        [_TWICE_DUP, _answer("dup", "t1c0"), _answer("dup", "t1c1"), _DONE],
        ran=("t1c0", "t1c1"),
    )
    assert check_pairing(record) == [_DUP_FINDING]
    assert check_order(record) == []
    assert check_control(record) == []


def test_repeated_ids_do_not_lend_a_success_to_a_call_that_never_ran() -> None:
    # The second call fails its schema and gets an error; I3 must not read the first
    # call's success as the second's.
    record = _record(
        (
            ModelTurn(
                calls=(
                    ScriptedCall(call_id="dup"),
                    ScriptedCall(call_id="dup", valid_arguments=False),
                )
            ),
        ),
        [_TWICE_DUP, _answer("dup", "t1c0"), _answer("dup", "t1c1", error=True), _DONE],
        ran=("t1c0",),
    )
    assert check_pairing(record) == [_DUP_FINDING]
    assert check_control(record) == []


def test_repeated_ids_after_an_abort_pair_by_position_too() -> None:
    # t1c0 started (and fired the abort), t1c1 never started and got an error result.
    record = _record(
        (ModelTurn(calls=(ScriptedCall(call_id="dup"), ScriptedCall(call_id="dup"))),),
        [_TWICE_DUP, _answer("dup", "t1c0"), _answer("dup", "t1c1", error=True)],
        ran=("t1c0",),
        abort=AbortAt(AbortKind.TOOL_START, 1, 0),
    )
    assert check_pairing(record) == [_DUP_FINDING]
    assert check_abort(record) == []


def test_repeated_ids_pair_by_tool_name_before_position() -> None:
    # The loop ran only the second call (beta) of two sharing an id: its result is
    # beta's, and the one fault is alpha's missing result.
    calls = (ScriptedCall(call_id="dup"), ScriptedCall("beta", call_id="dup"))
    record = _record(
        (ModelTurn(calls=calls),),
        [
            _asks(("dup", "alpha", "t1c0"), ("dup", "beta", "t1c1")),
            _answer("dup", "t1c1", "beta"),
            _DONE,
        ],
        ran=("t1c1",),
    )
    record = attrs.evolve(
        record,
        executions=(
            attrs.evolve(record.executions[0], tool="beta", output="beta output for t1c1"),
        ),
    )
    assert check_pairing(record) == [  # in call order within one message
        "I1 at message 1: tool call 'dup' (alpha) has no result before the next assistant "
        "message (message 3)",
        _DUP_FINDING,
    ]
    assert check_control(record) == []
