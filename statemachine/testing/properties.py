"""The invariants I1–I8 as checks over one recorded run of a scenario.

Each property is a function from a ``RunRecord`` (``I5``: two records of the same
scenario) to a list of sentences, one per violation; an empty list means it holds.
They judge any loop: what a correct loop must do follows from the scenario alone,
because the scripted model answers call *n* the same way whatever it is sent
(``expected_run``), and the scripted tools report which calls really ran.

Properties that only make sense for a loop that returns a ``RunResult`` (the state
and its explanation, I4 and parts of I6 and I7) hold vacuously for loops that
return a bare message sequence. When the loop crashed (I8), the properties that
need a transcript have nothing to judge and hold vacuously too: I8 reports it.

One fault, one finding: a sentence names the message index (I1, I2) or call where a
fault shows and what was expected there, and nothing that follows only from it is
reported again. Results are paired with calls by position (``_pair_results``), so a
repeated id, a wrong id or a late result is one I1 finding, and I2 and I3/I6 judge the
pairs that remain; the model's responses are matched with resynchronisation, so one
rewritten, dropped or invented response is one I2 finding. Findings are listed in
message order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from statemachine.core.messages import AssistantMessage, Message, StopReason, ToolResultMessage
from statemachine.core.steps import Point, StepSpec
from statemachine.core.table import State, TurnState
from statemachine.testing._history import (
    calls_and_results,
    findings,
    key_argument,
    pair_results,
    pairing_findings,
    response_findings,
    result_order_findings,
)
from statemachine.testing._step_decisions import StepPlan
from statemachine.testing._transcript_rules import Level
from statemachine.testing.scenario import AbortKind, RunRecord, Scenario, call_key

__all__ = [
    "PROPERTIES",
    "PROPERTY_TITLES",
    "Expectation",
    "PropertyCheck",
    "check_abort",
    "check_control",
    "check_determinism",
    "check_limits",
    "check_no_crash",
    "check_order",
    "check_pairing",
    "check_record",
    "check_terminal",
    "expected_run",
]

PropertyCheck = Callable[[RunRecord], list[str]]

PROPERTY_TITLES: Mapping[str, str] = {
    "I1": "pairing",
    "I2": "order",
    "I3": "control",
    "I4": "terminal",
    "I5": "determinism",
    "I6": "abort",
    "I7": "limits",
    "I8": "no crash",
}


@attrs.frozen
class Expectation:
    """What a correct loop does with a scenario (and its steps' answers)."""

    model_calls: int
    state: State
    abort_fires: bool
    reason: str  # why the run ends there, in words
    # Answers of the steps that the table never asks for (a step run too often).
    unasked: tuple[str, ...] = ()


def expected_run(
    scenario: Scenario,
    steps: Sequence[StepSpec] = (),
    decisions: Sequence[tuple[str, str]] = (),
) -> Expectation:
    """How many model calls a correct loop makes, and the state it ends in.

    ``steps`` are the team's steps of the run's table and ``decisions`` what they
    answered, ``(step, outcome)`` in order (a ``RunRecord``'s): each point runs its
    steps as the table does, and the answers lead where the declarations say (an
    end, a retry within its budget: one more model call through the turn boundary,
    whose limits hold)."""
    plan = StepPlan(steps, decisions)
    found = _expected(scenario, plan)
    return attrs.evolve(found, unasked=tuple(plan.unused()))


def _expected(scenario: Scenario, plan: StepPlan) -> Expectation:
    abort = scenario.abort
    if abort.kind is AbortKind.BEFORE_START:
        return Expectation(0, TurnState.ABORTED, True, "the signal was aborted before the start")
    n = 0
    verdict = plan.at(Point.BEFORE_MODEL, "before model call 1")
    while verdict is None:
        n += 1
        turn = scenario.turn(n)
        if abort.kind is AbortKind.MODEL_CALL and abort.turn == n:
            return Expectation(n, TurnState.ABORTED, True, f"the abort fired during model call {n}")
        if turn is not None and turn.raises:
            return Expectation(n, TurnState.FAILED, False, f"model call {n} raised")
        if turn is not None and turn.stop_reason is StopReason.ERROR:
            return Expectation(n, TurnState.FAILED, False, f"model call {n} reported an error")
        if turn is not None and turn.stop_reason is StopReason.ABORTED:
            return Expectation(n, TurnState.ABORTED, False, f"model call {n} reported an abort")
        if turn is None or not turn.calls:
            verdict = plan.at(Point.AFTER_FINAL, f"after the answer of model call {n}")
            if verdict is None:
                final = f"model call {n} answered without tools"
                return Expectation(n, TurnState.DONE, False, final)
            if verdict.state is not None:
                break
        elif (
            abort.kind is AbortKind.TOOL_START
            and abort.turn == n
            and 0 <= abort.call < len(turn.calls)
            and turn.calls[abort.call].executable
        ):
            return Expectation(
                n,
                TurnState.ABORTED,
                True,
                f"the abort fired when tool call {call_key(n, abort.call)} started",
            )
        if n >= scenario.max_turns:
            asked = verdict.reason if verdict is not None else f"model call {n} asked for work"
            return Expectation(
                n,
                TurnState.TURN_LIMIT_EXCEEDED,
                False,
                f"{asked} at the limit max_turns={scenario.max_turns}",
            )
        verdict = plan.at(Point.BEFORE_MODEL, f"before model call {n + 1}")
    assert verdict.state is not None  # before_model steps never retry (core/steps.py)
    return Expectation(n, verdict.state, False, verdict.reason)


def _expectation(record: RunRecord) -> Expectation:
    return expected_run(record.scenario, record.steps, record.decisions)


# -- the properties ---------------------------------------------------------------------


def check_no_crash(record: RunRecord) -> list[str]:
    """I8: the loop returns, nothing escapes it, and what it returns is a history."""
    if record.timed_out:
        return [f"{record.error} (a model or tool misbehaved and the loop hung)"]
    if record.error is not None:
        return [f"the loop did not return a history: {record.error}"]
    return []


def check_pairing(record: RunRecord, *, id_reuse: Level = "error") -> list[str]:
    """I1: every call has exactly one result, between its message and the next; ids
    are unique; a result carries the output of its own call. ``id_reuse="warning"``
    leaves out a call id that repeats the id of a call in an earlier message (the
    transcript checker's level for the providers' formats; see ``run_conformance``)."""
    if record.transcript is None:
        return []
    pairs, strays = pair_results(record.transcript)
    found = pairing_findings(record.transcript, pairs, strays, across_turns=id_reuse == "error")
    executions = {ex.key: ex for ex in record.executions}
    for p in pairs:
        key = key_argument(p.call)
        ex = executions.get(key) if key is not None else None
        if (
            p.index < len(record.scenario.history)
            or p.result is None
            or p.how == "wrong id"
            or ex is None
            or ex.how != "returned"
            or ex.key in record.running_at_return
        ):
            continue
        result = p.result
        if result.is_error or result.text != ex.output:
            found.append(
                (
                    p.result_index,
                    f"the result of tool call {p.call.id!r} ({key}) is {result.text[:80]!r}"
                    f"{' (an error)' if result.is_error else ''}, but its tool returned "
                    f"{ex.output!r}: a result that arrived must be kept as it is",
                )
            )
    return findings("I1", found)


def check_order(record: RunRecord) -> list[str]:
    """I2: append-only over the input; results in call order; the model's messages in
    the order it produced them, none lost, none invented (except the loop's own
    error/aborted record of a failed or cut-off model call)."""
    if record.transcript is None:
        return []
    transcript = record.transcript
    history = record.scenario.history
    found: list[tuple[int, str]] = []
    if tuple(transcript[: len(history)]) != tuple(history):
        changed = next(
            (i for i, (a, b) in enumerate(zip(transcript, history, strict=False)) if a != b),
            min(len(transcript), len(history)),
        )
        found.append(
            (
                changed,
                f"the input history of {len(history)} messages was changed: the transcript "
                "does not start with it unchanged (the history is append-only)",
            )
        )
    pairs, _ = pair_results(transcript)
    found += result_order_findings(pairs)
    found += response_findings(transcript, len(history), record.produced)
    return findings("I2", found)


def _execution_findings(record: RunRecord, runs: Mapping[str, int]) -> list[str]:
    """What the tools saw: a call run twice, or run with arguments the schema refuses
    (judged even when the loop crashed afterwards)."""
    out: list[str] = []
    scripted = {
        call_key(t, c): call
        for t, turn in enumerate(record.scenario.turns, 1)
        for c, call in enumerate(turn.calls)
    }
    for key, count in sorted(runs.items()):
        if count > 1:
            out.append(f"tool call {key} was executed {count} times")
        spec = scripted.get(key)
        if spec is not None and not spec.valid_arguments:
            out.append(
                f"tool call {key} was executed although its arguments fail the tool's "
                "JSON Schema (it must get an error result instead)"
            )
    return out


def _history_findings(
    record: RunRecord, transcript: Sequence[Message], runs: Mapping[str, int]
) -> list[str]:
    """A successful result for a call that never ran; a run call the history lacks."""
    out: list[str] = []
    seen_keys: set[str] = set()
    for call, answer in calls_and_results(transcript, len(record.scenario.history)):
        call_ref = key_argument(call)
        if call_ref is not None:
            seen_keys.add(call_ref)
        ran = call_ref is not None and call_ref in runs
        if answer is not None and not ran and not answer.is_error:
            out.append(
                f"tool call {call.id!r} ({call.name}) has a successful result but its tool "
                "never ran"
            )
    out += [
        f"tool call {key} was executed but is not in the history"
        for key in sorted(runs)
        if key not in seen_keys
    ]
    return out


def _stopping_findings(record: RunRecord, transcript: Sequence[Message]) -> list[str]:
    """The loop stopped too early or too late, or ended Done with calls unanswered."""
    out: list[str] = []
    expected = _expectation(record)
    if record.model_calls < expected.model_calls and not record.abort_fired and record.decisions:
        out.append(
            f"the loop stopped after {record.model_calls} model call(s); with what its steps "
            f"answered, a correct loop makes {expected.model_calls} ({expected.reason})"
        )
    elif record.model_calls < expected.model_calls and not record.abort_fired:
        what = (
            f"response {record.model_calls} asked for tools"
            if record.model_calls
            else "nothing was asked yet"
        )
        out.append(
            f"the loop stopped after {record.model_calls} model call(s) though {what}: "
            f"a correct loop sends the results back and makes {expected.model_calls} "
            f"call(s) ({expected.reason})"
        )
    elif (
        record.model_calls > expected.model_calls
        and not record.abort_fired
        and expected.state is not TurnState.TURN_LIMIT_EXCEEDED
    ):
        out.append(
            f"the loop called the model {record.model_calls} times; it should have stopped "
            f"after {expected.model_calls} ({expected.reason})"
        )
    out += list(expected.unasked)
    result = record.result
    if result is not None and result.state is TurnState.DONE:
        last_assistant = next(
            (m for m in reversed(transcript) if isinstance(m, AssistantMessage)), None
        )
        if last_assistant is not None and last_assistant.tool_calls:
            out.append("the run ended Done although the last assistant message has tool calls")
    return out


def check_control(record: RunRecord) -> list[str]:
    """I3: every call is executed or answered with an error, whatever the stop reason;
    only calls a correct loop may run are run, once; the loop stops only when the
    model stops asking for work (or a limit, error or abort ends the run)."""
    runs: dict[str, int] = {}
    for ex in record.executions:
        runs[ex.key] = runs.get(ex.key, 0) + 1
    out = _execution_findings(record, runs)
    if record.transcript is None:
        return out
    return (
        out
        + _history_findings(record, record.transcript, runs)
        + _stopping_findings(record, record.transcript)
    )


def check_terminal(record: RunRecord) -> list[str]:
    """I4 (RunResult loops): the run ends in a terminal state that a person can read,
    and in the state the scenario calls for."""
    result = record.result
    if result is None:
        return []
    out: list[str] = []
    if not result.state.is_terminal:
        out.append(f"the run returned in {result.state}, which is not terminal")
    if not isinstance(result.explanation, str) or not result.explanation.strip():
        out.append(f"the run ended {result.state} without an explanation")
    if (result.error is None) != (result.state is TurnState.DONE):
        out.append(
            f"the run ended {result.state} with error={result.error!r}: only Done has no error"
        )
    expected = _expectation(record)
    if result.state != expected.state:
        should = "end" if expected.state.is_terminal else "go on to its step in"
        out.append(
            f"the run ended {result.state}, but it should {should} {expected.state} "
            f"({expected.reason})"
        )
    return out


def check_abort(record: RunRecord) -> list[str]:
    """I6: after an abort, every started call has a result and finished its cleanup
    before the loop returned; never-started calls have an error result; the model is
    not called again; a RunResult loop ends Aborted."""
    if not record.abort_fired:
        return []
    out = [
        f"tool call {key} was still running when the loop returned: its cleanup had not finished"
        for key in record.running_at_return
    ]
    if record.model_calls_after_abort:
        out.append(
            f"the loop called the model {record.model_calls_after_abort} time(s) after the abort"
        )
    # A call that ignores the abort and hangs must be cancelled: one that gave up by
    # itself after the kit's hang limit means the loop would have waited forever.
    never_cancelled = "ignored the abort and hung, and the loop never cancelled it"
    real_hang = "after the kit's hang limit (a real hang would have held the run forever)"
    if record.model_hang_expired:
        out.append(f"the model call {never_cancelled}: it only ended by giving up {real_hang}")
    out += [
        f"tool call {ex.key} {never_cancelled}: it only ended by giving up {real_hang}"
        for ex in record.executions
        if ex.how == "hang expired"
    ]
    if record.transcript is None:
        return out
    answered: dict[str, ToolResultMessage | None] = {}
    for call, result in calls_and_results(record.transcript, len(record.scenario.history)):
        key = key_argument(call)
        if key is not None:
            answered[key] = result
    executed = {ex.key for ex in record.executions}
    for ex in record.executions:
        if answered.get(ex.key) is None:
            out.append(f"tool call {ex.key} had started but has no result after the abort")
    for key, result in answered.items():
        if key not in executed and result is not None and not result.is_error:
            out.append(f"tool call {key} never started but its result is not an error")
    if record.result is not None and record.result.state is not TurnState.ABORTED:
        out.append(f"the run was aborted but ended {record.result.state}")
    return out


def check_limits(record: RunRecord) -> list[str]:
    """I7: at most ``max_turns`` model calls; reaching the limit with work asked for
    ends a RunResult loop in TurnLimitExceeded with an explanation naming the limit."""
    limit = record.scenario.max_turns
    out: list[str] = []
    if record.model_calls > limit:
        out.append(f"the loop made {record.model_calls} model calls with max_turns={limit}")
    expected = _expectation(record)
    result = record.result
    if result is not None and expected.state is TurnState.TURN_LIMIT_EXCEEDED:
        if result.state is not TurnState.TURN_LIMIT_EXCEEDED:
            out.append(
                f"the limit max_turns={limit} was reached with work asked for, but the run "
                f"ended {result.state}"
            )
        elif str(limit) not in result.explanation:
            out.append(
                f"the TurnLimitExceeded explanation does not name the limit {limit}: "
                f"{result.explanation!r}"
            )
    return out


def check_determinism(first: RunRecord, second: RunRecord) -> list[str]:
    """I5: the same scenario run twice gives the same history (and state, turns and
    transition trace for RunResult loops)."""
    out: list[str] = []
    if first.error != second.error:
        out.append(f"run 1 ended with {first.error!r}, run 2 with {second.error!r}")
    if first.transcript != second.transcript:
        a, b = first.transcript or (), second.transcript or ()
        where = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        out.append(
            f"the two runs' histories differ from message {where} on "
            f"({len(a)} vs {len(b)} messages)"
        )
    r1, r2 = first.result, second.result
    if r1 is not None and r2 is not None:
        for name in ("state", "turns", "explanation", "trace"):
            if getattr(r1, name) != getattr(r2, name):
                out.append(f"the two runs' {name} differ")
    return out


PROPERTIES: Mapping[str, PropertyCheck] = {
    "I1": check_pairing,
    "I2": check_order,
    "I3": check_control,
    "I4": check_terminal,
    "I6": check_abort,
    "I7": check_limits,
    "I8": check_no_crash,
}
"""The single-run properties by invariant name (I5 needs two runs: ``check_determinism``)."""


def check_record(
    record: RunRecord,
    rerun: RunRecord | None = None,
    *,
    properties: Sequence[str] = tuple(PROPERTY_TITLES),
    id_reuse: Level = "error",
) -> dict[str, list[str]]:
    """Run the selected properties; return the violated ones with their sentences.
    ``id_reuse`` is ``check_pairing``'s."""
    unknown = sorted(set(properties) - set(PROPERTY_TITLES))
    if unknown:
        raise ValueError(
            f"unknown property name(s) {', '.join(unknown)}; known: {', '.join(PROPERTY_TITLES)}"
        )
    out: dict[str, list[str]] = {}
    for name in sorted(properties):
        if name == "I5":
            problems = check_determinism(record, rerun) if rerun is not None else []
        elif name == "I1":
            problems = check_pairing(record, id_reuse=id_reuse)
        else:
            problems = PROPERTIES[name](record)
        if problems:
            out[name] = problems
    return out
