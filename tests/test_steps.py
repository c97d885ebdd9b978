"""Declared steps in the sans-IO core: the rows they generate, the engine on them, the
declarations refused, and snapshots of runs with steps."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from statemachine.core.engine import Engine
from statemachine.core.events import (
    AbortRequested,
    CallModel,
    InputKind,
    InputQueued,
    ModelResponded,
    ReturnToCaller,
    RunStep,
    Start,
    StepDecided,
    ToolFinished,
)
from statemachine.core.invariants import history_violations
from statemachine.core.messages import AssistantMessage, TextContent, ToolCall, UserMessage
from statemachine.core.output import OutputSpec
from statemachine.core.steps import (
    DEFAULT_RETRY_BUDGET,
    MAX_OUTCOMES,
    MAX_STEP_MESSAGE_CHARS,
    End,
    GoOn,
    Point,
    Retry,
    StepSpec,
    check_table,
    table_for,
)
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
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.errors import ProtocolError, SnapshotError, StepDeclarationError

S = TurnState
T = Trigger

ECHO = ToolDefinition("echo", "Repeat.", {"type": "object", "properties": {}})
BLOCKED = End("Blocked", "the answer broke the refund policy")
REFUND = StepSpec(
    "refund_policy",
    Point.AFTER_FINAL,
    {"ok": GoOn(), "fix": Retry(), "blocked": BLOCKED},
)
TRIPWIRE = StepSpec(
    "input_check",
    Point.BEFORE_MODEL,
    {"ok": GoOn(), "tripped": End("InputRejected", "the request was refused")},
)
STATE = REFUND.state
BLOCKED_STATE = DeclaredState("Blocked", True, BLOCKED.explanation)


def _engine(*steps: StepSpec, **options: Any) -> Engine:
    return Engine(
        tools=[ECHO], messages=[UserMessage("refund me")], table=table_for(steps), **options
    )


def _final(text: str = "refunded") -> ModelResponded:
    return ModelResponded(AssistantMessage((TextContent(text),)))


def _calls(*ids: str) -> ModelResponded:
    return ModelResponded(AssistantMessage(tuple(ToolCall(i, "echo", {}) for i in ids)))


def _state(engine: Engine) -> State:
    # A call, not the property: mypy would otherwise narrow the state across events.
    return engine.state


def _fingerprint(engine: Engine) -> tuple[Any, ...]:
    return (engine.control_key(), tuple(engine.messages), tuple(engine.trace), engine.explanation)


# -- the table ---------------------------------------------------------------------------


def test_an_agent_without_steps_runs_on_the_base_table_itself() -> None:
    assert table_for([]) is BASE_TABLE
    assert BASE_TABLE.rows is TRANSITIONS
    assert Engine(tools=[], messages=[UserMessage("hi")]).table is BASE_TABLE


def test_an_after_final_step_redirects_the_final_answer_rows_and_adds_its_own() -> None:
    table = table_for([REFUND])
    redirected = [r for r in table.rows if r.dest == STATE and r.source != STATE]
    assert [(r.source, r.trigger, r.guard) for r in redirected] == [
        (S.AWAITING_MODEL, T.MODEL_RESPONDED, None),
        (S.TURN_BOUNDARY, T.NEXT_TURN, Guard.OUTPUT_ACCEPTED),
    ]
    own = [(r.trigger, r.dest, r.guard) for r in table.rows if r.source == STATE]
    assert own == [
        (T.STEP_DECIDED, S.DONE, OutcomeIs("ok")),
        (T.STEP_DECIDED, BLOCKED_STATE, OutcomeIs("fix", spent=True)),
        (T.STEP_DECIDED, S.TURN_BOUNDARY, OutcomeIs("fix", spent=False)),
        (T.STEP_DECIDED, BLOCKED_STATE, OutcomeIs("blocked")),
        (T.INPUT_QUEUED, STATE, None),
        (T.ABORT, S.ABORTED, None),
    ]
    # Every other row is the base table's, in its order.
    base = [r for r in table.rows if r.source != STATE and r.dest != STATE]
    assert base == [
        r for r in TRANSITIONS if r.dest is not S.DONE or r.guard is Guard.STOP_REQUESTED
    ]
    assert table.terminal == BASE_TABLE.terminal | {BLOCKED_STATE}
    assert table.declared == (STATE, BLOCKED_STATE)


def test_steps_at_one_point_run_in_the_order_given() -> None:
    second = StepSpec("tone_check", Point.AFTER_FINAL, {"ok": GoOn(), "rude": BLOCKED})
    table = table_for([REFUND, second])
    ok_first = [r for r in table.rows if r.source == STATE and r.guard == OutcomeIs("ok")]
    assert [r.dest for r in ok_first] == [second.state]
    engine = Engine(tools=[], messages=[UserMessage("hi")], table=table)
    engine.handle(Start())
    assert engine.handle(_final()) == (RunStep("refund_policy", 1),)
    assert engine.handle(StepDecided("refund_policy", "ok")) == (RunStep("tone_check", 1),)
    engine.handle(StepDecided("tone_check", "ok"))
    assert engine.state is S.DONE


# -- the engine on a step's rows -----------------------------------------------------------


def test_a_passing_output_step_ends_the_run_done_as_before() -> None:
    engine = _engine(REFUND)
    engine.handle(Start())
    assert engine.handle(_final()) == (RunStep("refund_policy", 1),)
    assert engine.state == STATE
    assert engine.pending_step() is REFUND
    actions = engine.handle(StepDecided("refund_policy", "ok"))
    assert _state(engine) is S.DONE
    assert actions == (ReturnToCaller(S.DONE, engine.explanation or ""),)
    plain = Engine(tools=[], messages=[UserMessage("hi")])
    plain.handle(Start())
    plain.handle(_final())
    assert engine.explanation == plain.explanation


def test_a_retry_sends_its_message_after_the_rejected_answer_and_calls_the_model() -> None:
    engine = _engine(REFUND)
    engine.handle(Start())
    engine.handle(_final("refund 1000"))
    actions = engine.handle(StepDecided("refund_policy", "fix", "At most 100, please."))
    assert engine.state is S.AWAITING_MODEL
    assert [type(a) for a in actions] == [CallModel]
    history = list(engine.messages)
    assert history[-2] == AssistantMessage((TextContent("refund 1000"),))  # kept (I2)
    assert history[-1] == UserMessage("At most 100, please.")
    assert engine.step_retries("refund_policy") == 1
    assert [r.dest for r in engine.trace][-2:] == [S.TURN_BOUNDARY, S.AWAITING_MODEL]


def test_a_retry_without_a_message_says_why_in_its_place() -> None:
    engine = _engine(REFUND)
    engine.handle(Start())
    engine.handle(_final())
    engine.handle(StepDecided("refund_policy", "fix"))
    last = list(engine.messages)[-1]
    assert isinstance(last, UserMessage)
    assert "refund_policy: fix" in last.content[0].text  # type: ignore[union-attr]


def test_once_the_retries_are_spent_a_retry_leads_as_its_then_outcome() -> None:
    engine = _engine(REFUND, max_turns=10)
    engine.handle(Start())
    for _ in range(DEFAULT_RETRY_BUDGET):
        engine.handle(_final())
        engine.handle(StepDecided("refund_policy", "fix", "again"))
        assert engine.state is S.AWAITING_MODEL
    engine.handle(_final())
    actions = engine.handle(StepDecided("refund_policy", "fix", "still wrong"))
    assert engine.state == BLOCKED_STATE
    assert engine.state.is_terminal
    assert actions == (ReturnToCaller(BLOCKED_STATE, engine.explanation or ""),)
    assert engine.explanation == (
        "the answer broke the refund policy (the step refund_policy answered fix: still wrong)"
    )


def test_a_retry_at_the_last_turn_ends_at_the_turn_limit_with_its_message_in_history() -> None:
    engine = _engine(REFUND, max_turns=1)
    engine.handle(Start())
    engine.handle(_final())
    engine.handle(StepDecided("refund_policy", "fix", "again"))
    assert engine.state is S.TURN_LIMIT_EXCEEDED
    assert engine.turns == 1
    assert list(engine.messages)[-1] == UserMessage("again")


def test_a_tripped_output_step_ends_in_its_own_state_and_absorbs_everything() -> None:
    engine = _engine(REFUND)
    engine.handle(Start())
    engine.handle(_final())
    engine.handle(StepDecided("refund_policy", "blocked", "refund over the limit"))
    assert engine.state == BLOCKED_STATE
    assert engine.returns_to_caller
    before = _fingerprint(engine)
    assert engine.handle(StepDecided("refund_policy", "ok")) == ()
    assert engine.handle(AbortRequested()) == ()
    assert _fingerprint(engine) == before


@pytest.mark.parametrize(
    ("event", "match"),
    [
        (StepDecided("refund_policy", "maybe"), "no outcome 'maybe'"),
        (StepDecided("other_step", "ok"), "waits for 'refund_policy'"),
        (StepDecided("refund_policy", "fix", "x" * (MAX_STEP_MESSAGE_CHARS + 1)), "at most"),
    ],
)
def test_a_decision_that_does_not_fit_is_refused_and_changes_nothing(
    event: StepDecided, match: str
) -> None:
    engine = _engine(REFUND)
    engine.handle(Start())
    engine.handle(_final())
    before = _fingerprint(engine)
    with pytest.raises(ProtocolError, match=match):
        engine.handle(event)
    assert _fingerprint(engine) == before


def test_a_decision_where_no_step_runs_is_refused() -> None:
    engine = _engine(REFUND)
    engine.handle(Start())
    with pytest.raises(ProtocolError, match="not accepted in state AwaitingModel"):
        engine.handle(StepDecided("refund_policy", "ok"))


def test_an_input_tripwire_before_the_first_call_ends_the_run_without_calling_the_model() -> None:
    engine = _engine(TRIPWIRE)
    assert engine.handle(Start()) == (RunStep("input_check", 0),)
    engine.handle(StepDecided("input_check", "tripped", "asks for another customer's data"))
    assert engine.state == DeclaredState("InputRejected", True, "the request was refused")
    assert engine.turns == 0
    assert list(engine.messages) == [UserMessage("refund me")]


def test_a_before_model_step_runs_after_every_batch_is_answered() -> None:
    engine = _engine(TRIPWIRE)
    engine.handle(Start())
    engine.handle(StepDecided("input_check", "ok"))
    engine.handle(_calls("c1", "c2"))
    engine.handle(ToolFinished("c2", ToolOutput("two")))
    assert engine.state is S.COLLECTING_RESULTS  # no step while c1 runs
    assert engine.handle(ToolFinished("c1", ToolOutput("one"))) == (RunStep("input_check", 1),)
    engine.handle(StepDecided("input_check", "tripped"))
    assert engine.state.is_terminal
    assert engine.pending_calls() == ()
    assert history_violations(list(engine.messages)) == []


def test_input_queued_while_a_step_runs_waits_for_the_next_model_call() -> None:
    engine = _engine(TRIPWIRE)
    engine.handle(Start())
    engine.handle(InputQueued(UserMessage("and be quick"), InputKind.STEER))
    assert engine.pending_step() is TRIPWIRE
    actions = engine.handle(StepDecided("input_check", "ok"))
    call = actions[0]
    assert isinstance(call, CallModel)
    assert list(call.messages)[-1] == UserMessage("and be quick")


def test_an_abort_while_a_step_runs_ends_the_run_aborted_at_once() -> None:
    engine = _engine(REFUND)
    engine.handle(Start())
    engine.handle(_final())
    engine.handle(AbortRequested("the user left"))
    assert engine.state is S.ABORTED
    assert "while the step RefundPolicy ran" in (engine.explanation or "")


def test_an_accepted_final_result_passes_the_output_step_and_a_retry_asks_for_it_again() -> None:
    output = OutputSpec.of({"type": "object", "properties": {"n": {"type": "integer"}}})
    engine = _engine(REFUND, output=output, max_turns=5)
    engine.handle(Start())
    result = ToolCall("r1", output.name, {"n": 1})
    actions = engine.handle(ModelResponded(AssistantMessage((result,))))
    assert actions == (RunStep("refund_policy", 1),)
    engine.handle(StepDecided("refund_policy", "fix", "n must be 2"))
    assert engine.state is S.AWAITING_MODEL
    assert engine.output_call is None  # given up: the model must give it again
    again = ToolCall("r2", output.name, {"n": 2})
    engine.handle(ModelResponded(AssistantMessage((again,))))
    engine.handle(StepDecided("refund_policy", "ok"))
    assert _state(engine) is S.DONE
    assert engine.output_call == "r2"


# -- declarations refused -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "match"),
    [
        (
            [StepSpec("x", "before_model", {"again": Retry(), "stop": BLOCKED})],
            "no answer to retry",
        ),
        (
            [StepSpec("x", "after_final", {"a": Retry(), "b": BLOCKED, "c": End("C", "c")})],
            "2 End outcomes",
        ),
        ([StepSpec("x", "after_final", {"ok": GoOn()})], "0 End outcomes"),
        ([StepSpec("x", "after_final", {"ok": GoOn()}, on_error="nope")], "on_error names no"),
        ([StepSpec("x", "after_final", {"a": Retry(then="a"), "b": BLOCKED})], "not a Retry"),
        ([StepSpec("x", "after_final", {"a": Retry(budget=-1), "b": BLOCKED})], "0 to 100"),
        ([StepSpec("x", "after_final", {"a": GoOn(), "b": End("Done", "d")})], "library's states"),
        ([StepSpec("x", "after_final", {"a": GoOn(), "b": End("Bad", " ")})], "explanation"),
        ([StepSpec("x", "after_final", {"a": GoOn(), "b": End("not camel", "e")})], "CamelCase"),
        ([StepSpec("Bad Name", "after_final", {"b": BLOCKED})], "lower_snake_case"),
        ([StepSpec("turn_boundary", "after_final", {"b": BLOCKED})], "library's states"),
        ([REFUND, REFUND], "declared twice"),
        ([StepSpec("x", "after_final", {})], f"1 to {MAX_OUTCOMES} outcomes"),
        (
            [REFUND, StepSpec("y", "after_final", {"b": End("Blocked", "other words")})],
            "different explanations",
        ),
        ([StepSpec("x", "after_final", {"b": End("RefundPolicy", "e")}), REFUND], "a step runs in"),
        ([StepSpec("x", "after_final", {"b": "Done"})], "expected GoOn"),  # type: ignore[dict-item]
    ],
)
def test_a_declaration_that_would_break_a_rule_is_refused_naming_it(
    steps: list[StepSpec], match: str
) -> None:
    with pytest.raises(StepDeclarationError, match=match):
        table_for(steps)


def test_an_unknown_point_is_refused_when_declared() -> None:
    with pytest.raises(StepDeclarationError, match="'after_everything' is not a point"):
        StepSpec("x", "after_everything", {"b": BLOCKED})


def _redirected(table: Table, source: TurnState, guard: Guard | None, dest: Any) -> Table:
    rows = tuple(
        attrs.evolve(r, dest=dest)
        if (r.source, r.trigger, r.guard) == (source, T.MODEL_RESPONDED, guard)
        else r
        for r in table.rows
    )
    return Table(rows, table.steps)


def test_a_table_that_enters_a_step_where_calls_are_outstanding_is_refused_by_rule_i1() -> None:
    table = table_for([REFUND])
    check_table(table)
    with pytest.raises(StepDeclarationError, match=r"^I1: .*AwaitingModel --model_responded--> "):
        check_table(_redirected(table, S.AWAITING_MODEL, Guard.HAS_TOOL_CALLS, STATE))
    from_collecting = Transition(S.COLLECTING_RESULTS, T.TOOL_FINISHED, STATE, None, "early")
    with pytest.raises(StepDeclarationError, match=r"^I1: .*CollectingResults"):
        check_table(Table((from_collecting, *table.rows), table.steps))


def test_a_retry_that_does_not_go_through_the_turn_boundary_is_refused_by_rule_i2() -> None:
    table = table_for([REFUND])
    rows = tuple(
        attrs.evolve(r, dest=S.AWAITING_MODEL) if r.guard == OutcomeIs("fix", spent=False) else r
        for r in table.rows
    )
    with pytest.raises(StepDeclarationError, match=r"^I2: the retry row RefundPolicy"):
        check_table(Table(rows, table.steps))


# -- snapshots ---------------------------------------------------------------------------------


def _blocked() -> Engine:
    engine = _engine(REFUND)
    engine.handle(Start())
    engine.handle(_final())
    engine.handle(StepDecided("refund_policy", "fix", "again"))
    engine.handle(_final())
    engine.handle(StepDecided("refund_policy", "blocked", "no"))
    return engine


def test_a_snapshot_of_a_run_with_steps_round_trips_with_its_table() -> None:
    engine = _blocked()
    snapshot = engine.snapshot()
    assert snapshot["stepRetries"] == {"refund_policy": 1}
    again = Engine.restore(snapshot, table=engine.table)
    assert again.state == BLOCKED_STATE
    assert again.control_key() == engine.control_key()
    assert tuple(again.messages) == tuple(engine.messages)
    assert again.trace == engine.trace
    assert again.snapshot() == snapshot


def test_a_snapshot_of_a_run_with_steps_needs_its_table_and_only_it() -> None:
    snapshot = _blocked().snapshot()
    with pytest.raises(SnapshotError, match="written by a run with declared steps"):
        Engine.restore(snapshot)
    plain = Engine(tools=[], messages=[UserMessage("hi")])
    plain.handle(Start())
    plain.handle(_final())
    with pytest.raises(SnapshotError, match="missing, but a table with declared steps"):
        Engine.restore(plain.snapshot(), table=table_for([REFUND]))
    assert "stepRetries" not in plain.snapshot()  # a run without steps writes what it did


def test_no_snapshot_is_taken_while_a_step_runs() -> None:
    engine = _engine(REFUND)
    engine.handle(Start())
    engine.handle(_final())
    with pytest.raises(ProtocolError, match="operation is outstanding"):
        engine.snapshot()


def test_input_queued_while_an_output_step_runs_is_reported_with_the_result() -> None:
    engine = _engine(REFUND)
    engine.handle(Start())
    engine.handle(_final())
    queued = InputQueued(UserMessage("one more thing"), InputKind.FOLLOW_UP)
    engine.handle(queued)
    engine.handle(StepDecided("refund_policy", "ok"))
    assert engine.state is S.DONE
    assert engine.queued_input() == (queued,)  # not lost: the caller re-queues it
