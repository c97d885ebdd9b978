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

from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResultMessage,
)
from statemachine.core.table import TERMINAL, TurnState
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
    """What a correct loop does with a scenario."""

    model_calls: int
    state: TurnState
    abort_fires: bool
    reason: str  # why the run ends there, in words


def expected_run(scenario: Scenario) -> Expectation:
    """How many model calls a correct loop makes, and the state it ends in."""
    abort = scenario.abort
    if abort.kind is AbortKind.BEFORE_START:
        return Expectation(0, TurnState.Aborted, True, "the signal was aborted before the start")
    n = 0
    while True:
        n += 1
        turn = scenario.turn(n)
        if abort.kind is AbortKind.MODEL_CALL and abort.turn == n:
            return Expectation(n, TurnState.Aborted, True, f"the abort fired during model call {n}")
        if turn is None:
            return Expectation(n, TurnState.Done, False, f"model call {n} answered without tools")
        if turn.raises:
            return Expectation(n, TurnState.Failed, False, f"model call {n} raised")
        if turn.stop_reason is StopReason.ERROR:
            return Expectation(n, TurnState.Failed, False, f"model call {n} reported an error")
        if turn.stop_reason is StopReason.ABORTED:
            return Expectation(n, TurnState.Aborted, False, f"model call {n} reported an abort")
        if not turn.calls:
            return Expectation(n, TurnState.Done, False, f"model call {n} answered without tools")
        if (
            abort.kind is AbortKind.TOOL_START
            and abort.turn == n
            and 0 <= abort.call < len(turn.calls)
            and turn.calls[abort.call].executable
        ):
            return Expectation(
                n,
                TurnState.Aborted,
                True,
                f"the abort fired when tool call {call_key(n, abort.call)} started",
            )
        if n >= scenario.max_turns:
            return Expectation(
                n,
                TurnState.TurnLimitExceeded,
                False,
                f"model call {n} asked for work at the limit max_turns={scenario.max_turns}",
            )


# -- helpers over a transcript ----------------------------------------------------------


def _key(call: ToolCall) -> str | None:
    key = call.arguments.get("key")
    return key if isinstance(key, str) else None


@attrs.frozen
class _Pair:
    """A tool call and the result that answers it.

    A result answers the first call of the assistant message before it that has the
    result's id and no result yet (and, among calls that share the id, the result's
    tool name), so repeated ids pair by position. A result whose id
    matches no call of that message answers the first call left without one (a wrong
    id, one fault, not "a call without a result" plus "a result without a call");
    ``how`` says which: ``"answered"``, ``"wrong id"``, ``"late"`` (after the next
    assistant message) or ``"missing"``.
    """

    call: ToolCall
    index: int  # the message index of the call's assistant message
    position: int  # the call's position in that message
    result: ToolResultMessage | None = None
    result_index: int = -1
    how: str = "missing"


@attrs.frozen
class _Stray:
    """A result that answers no call: a second result, or one before any call."""

    result: ToolResultMessage
    index: int
    second: bool


def _pair_results(transcript: Sequence[Message]) -> tuple[list[_Pair], list[_Stray]]:
    """Every tool call with its result (in history order), and the stray results."""
    pairs: list[_Pair] = []
    strays: list[_Stray] = []
    owners = [i for i, m in enumerate(transcript) if isinstance(m, AssistantMessage)]
    strays += [
        _Stray(m, j, False)
        for j, m in enumerate(transcript[: owners[0] if owners else len(transcript)])
        if isinstance(m, ToolResultMessage)
    ]
    for n, owner in enumerate(owners):
        message = transcript[owner]
        assert isinstance(message, AssistantMessage)
        block = [_Pair(c, owner, k) for k, c in enumerate(message.tool_calls)]
        leftovers: list[tuple[int, ToolResultMessage]] = []
        end = owners[n + 1] if n + 1 < len(owners) else len(transcript)
        for j in range(owner + 1, end):
            result = transcript[j]
            if not isinstance(result, ToolResultMessage):
                continue
            waiting = [p for p in block if p.how == "missing" and p.call.id == result.tool_call_id]
            # Among calls that share the id, the one to the tool the result names.
            slot = next((p for p in waiting if p.call.name == result.tool_name), None) or next(
                iter(waiting), None
            )
            if slot is None:
                leftovers.append((j, result))
            else:
                block[slot.position] = attrs.evolve(
                    slot, result=result, result_index=j, how="answered"
                )
        for j, result in leftovers:
            late = next(
                (
                    q
                    for q, p in enumerate(pairs)
                    if p.how == "missing" and p.call.id == result.tool_call_id
                ),
                None,
            )
            if late is not None:
                pairs[late] = attrs.evolve(pairs[late], result=result, result_index=j, how="late")
            elif any(
                p.result is not None and p.call.id == result.tool_call_id for p in pairs + block
            ):
                strays.append(_Stray(result, j, True))
            elif (slot := next((p for p in block if p.how == "missing"), None)) is not None:
                block[slot.position] = attrs.evolve(
                    slot, result=result, result_index=j, how="wrong id"
                )
            else:
                strays.append(_Stray(result, j, False))
        pairs += block
    return pairs, strays


def _next_assistant(transcript: Sequence[Message], index: int) -> int | None:
    return next(
        (
            i
            for i in range(index + 1, len(transcript))
            if isinstance(transcript[i], AssistantMessage)
        ),
        None,
    )


def _pairing_findings(
    transcript: Sequence[Message], pairs: list[_Pair], strays: list[_Stray]
) -> list[tuple[int, str]]:
    """I1 over the history: each fault once, at the message where it shows."""
    out: list[tuple[int, str]] = []
    first_use: dict[str, int] = {}
    for p in pairs:
        call = p.call
        if not call.id:
            out.append((p.index, f"tool call {call.name} has an empty id"))
        elif call.id in first_use:
            out.append(
                (
                    p.index,
                    f"tool call id {call.id!r} repeats the id of a call in message "
                    f"{first_use[call.id]}",
                )
            )
        else:
            first_use[call.id] = p.index
        following = _next_assistant(transcript, p.index)
        before_next = (
            f" before the next assistant message (message {following})"
            if following is not None
            else ""
        )
        if p.how == "missing":
            out.append((p.index, f"tool call {call.id!r} ({call.name}) has no result{before_next}"))
        elif p.how == "late":
            out.append(
                (
                    p.index,
                    f"tool call {call.id!r} ({call.name}) has no result{before_next}: its "
                    f"result comes later, at message {p.result_index}",
                )
            )
        elif p.how == "wrong id":
            assert p.result is not None
            out.append(
                (
                    p.result_index,
                    f"the result has id {p.result.tool_call_id!r}, which no call of message "
                    f"{p.index} has: the result expected there is that of tool call "
                    f"{call.id!r} ({call.name})",
                )
            )
        if p.result is not None and p.how != "wrong id" and p.result.tool_name != call.name:
            out.append(
                (
                    p.result_index,
                    f"result for tool call {call.id!r} names tool {p.result.tool_name!r}, "
                    f"but the call was to {call.name!r}",
                )
            )
    for stray in strays:
        call_id = stray.result.tool_call_id
        out.append(
            (
                stray.index,
                f"a second result for tool call {call_id!r}"
                if stray.second
                else f"result for tool call {call_id!r} has no matching call",
            )
        )
    return out


def _result_order_findings(pairs: list[_Pair]) -> list[tuple[int, str]]:
    """I2 over the results of each assistant message: in call order. A call whose
    result is missing, late or under a wrong id is an I1 fault, left out here; a call
    reported as skipped is not reported again for the results that follow it."""
    out: list[tuple[int, str]] = []
    by_owner: dict[int, list[_Pair]] = {}
    for p in pairs:
        if p.how == "answered":
            by_owner.setdefault(p.index, []).append(p)
    for answered in by_owner.values():
        waiting = list(answered)  # in call order
        known_late: set[int] = set()
        for p in sorted(answered, key=lambda p: p.result_index):
            skipped = waiting[: waiting.index(p)]
            waiting.remove(p)
            if any(s.position not in known_late for s in skipped):
                ids = ", ".join(repr(s.call.id) for s in skipped)
                out.append(
                    (
                        p.result_index,
                        f"result for tool call {p.call.id!r} comes before the result(s) of "
                        f"earlier call(s) {ids} of the same assistant message",
                    )
                )
                known_late.update(s.position for s in skipped)
    return out


def _calls_and_results(
    transcript: Sequence[Message], start: int = 0
) -> list[tuple[ToolCall, ToolResultMessage | None]]:
    """Each tool call from message ``start`` on with the result that answers it."""
    return [(p.call, p.result) for p in _pair_results(transcript)[0] if p.index >= start]


def _summary(message: AssistantMessage) -> str:
    """A response in a few words, to say what was expected where another stands."""
    bits = [f"[{message.stop_reason.value}]"]
    if message.text:
        text = message.text if len(message.text) <= 40 else message.text[:37] + "..."
        bits.append(repr(text))
    if message.tool_calls:
        bits.append("calls " + ", ".join(f"{c.name}({_key(c) or '?'})" for c in message.tool_calls))
    return " ".join(bits)


def _responses(numbers: Iterable[int], total: int) -> str:
    """``model response 2 of 3 is`` or ``model responses 2, 3 of 3 are``."""
    listed = list(numbers)
    if len(listed) == 1:
        return f"model response {listed[0]} of {total} is"
    return f"model responses {', '.join(map(str, listed))} of {total} are"


def _findings(invariant: str, found: list[tuple[int, str]]) -> list[str]:
    """Sentences in message order."""
    return [f"{invariant} at message {i}: {text}" for i, text in sorted(found, key=lambda f: f[0])]


def _shape(message: AssistantMessage) -> tuple[object, ...]:
    """A message modulo tool-call ids (a loop may rename empty or repeated ids)."""
    return (
        message.text,
        message.stop_reason,
        tuple((c.name, dict(c.arguments)) for c in message.tool_calls),
    )


# -- the properties ---------------------------------------------------------------------


def check_no_crash(record: RunRecord) -> list[str]:
    """I8: the loop returns, nothing escapes it, and what it returns is a history."""
    if record.timed_out:
        return [f"{record.error} (a model or tool misbehaved and the loop hung)"]
    if record.error is not None:
        return [f"the loop did not return a history: {record.error}"]
    return []


def check_pairing(record: RunRecord) -> list[str]:
    """I1: every call has exactly one result, between its message and the next; ids
    are unique; a result carries the output of its own call."""
    if record.transcript is None:
        return []
    pairs, strays = _pair_results(record.transcript)
    found = _pairing_findings(record.transcript, pairs, strays)
    executions = {ex.key: ex for ex in record.executions}
    for p in pairs:
        key = _key(p.call)
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
    return _findings("I1", found)


def _response_findings(
    transcript: Sequence[Message], start: int, produced: Sequence[AssistantMessage]
) -> list[tuple[int, str]]:
    """The model's responses in the history, in the order it produced them.

    Each assistant message after the input is matched to a response (modulo ids); the
    loop's own record of a failed or cut-off call (error or aborted, no calls) is
    allowed anywhere. A fault is reported once where it shows, and the matching goes
    on from there: after a response rewritten, dropped, invented or moved, the
    responses that follow in order are not reported again.
    """
    shapes = [_shape(m) for m in produced]
    total = len(shapes)
    messages = [
        (i, m) for i, m in enumerate(transcript[start:], start) if isinstance(m, AssistantMessage)
    ]
    out: list[tuple[int, str]] = []
    placed: set[int] = set()  # responses matched, or already reported
    position = 0  # the first response not placed yet
    for n, (index, message) in enumerate(messages):
        while position in placed:
            position += 1
        shape = _shape(message)
        if position < total and shape == shapes[position]:
            placed.add(position)
            continue
        if message.stop_reason in (StopReason.ERROR, StopReason.ABORTED) and not (
            message.tool_calls
        ):
            continue  # the loop's record of a model call that failed or was cut off
        later = next(
            (q for q in range(position + 1, total) if q not in placed and shapes[q] == shape),
            None,
        )
        awaited = position < total and any(
            _shape(m) == shapes[position] for _, m in messages[n + 1 :]
        )
        if later is not None and awaited:
            text = (
                f"assistant message {index} is model response {later + 1} of {total}, but "
                f"response {position + 1} comes after it: messages must appear in the "
                "order they arrived"
            )
            placed.add(later)
        elif later is not None:
            text = (
                f"{_responses(range(position + 1, later + 1), total)} missing from the "
                f"history: assistant message {index} is response {later + 1}"
            )
            placed.update(range(position, later + 1))
        elif awaited:
            text = (
                f"assistant message {index} is not a response of the model: response "
                f"{position + 1} of {total} ({_summary(produced[position])}) was expected "
                "there, and comes after it"
            )
        elif position < total:
            text = (
                f"assistant message {index} is not the model's next response: response "
                f"{position + 1} of {total} ({_summary(produced[position])}) was expected "
                "there (messages must appear as they arrived)"
            )
            placed.add(position)
        else:
            text = (
                f"assistant message {index} is not a response of the model: all {total} "
                "of its responses come before it"
            )
        out.append((index, text))
    missing = [q + 1 for q in range(total) if q not in placed]
    if missing:
        out.append((len(transcript), f"{_responses(missing, total)} missing from the history"))
    return out


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
    pairs, _ = _pair_results(transcript)
    found += _result_order_findings(pairs)
    found += _response_findings(transcript, len(history), record.produced)
    return _findings("I2", found)


def check_control(record: RunRecord) -> list[str]:
    """I3: every call is executed or answered with an error, whatever the stop reason;
    only calls a correct loop may run are run, once; the loop stops only when the
    model stops asking for work (or a limit, error or abort ends the run)."""
    out: list[str] = []
    runs: dict[str, int] = {}
    for ex in record.executions:
        runs[ex.key] = runs.get(ex.key, 0) + 1
    scripted = {
        call_key(t, c): call
        for t, turn in enumerate(record.scenario.turns, 1)
        for c, call in enumerate(turn.calls)
    }
    # What the tools saw is judged even when the loop crashed afterwards.
    for key, count in sorted(runs.items()):
        if count > 1:
            out.append(f"tool call {key} was executed {count} times")
        spec = scripted.get(key)
        if spec is not None and not spec.valid_arguments:
            out.append(
                f"tool call {key} was executed although its arguments fail the tool's "
                "JSON Schema (it must get an error result instead)"
            )
    if record.transcript is None:
        return out
    seen_keys: set[str] = set()
    for call, answer in _calls_and_results(record.transcript, len(record.scenario.history)):
        call_ref = _key(call)
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
    expected = expected_run(record.scenario)
    if record.model_calls < expected.model_calls and not record.abort_fired:
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
        and expected.state is not TurnState.TurnLimitExceeded
    ):
        out.append(
            f"the loop called the model {record.model_calls} times; it should have stopped "
            f"after {expected.model_calls} ({expected.reason})"
        )
    result = record.result
    if result is not None and result.state is TurnState.Done:
        last_assistant = next(
            (m for m in reversed(record.transcript) if isinstance(m, AssistantMessage)), None
        )
        if last_assistant is not None and last_assistant.tool_calls:
            out.append("the run ended Done although the last assistant message has tool calls")
    return out


def check_terminal(record: RunRecord) -> list[str]:
    """I4 (RunResult loops): the run ends in a terminal state that a person can read,
    and in the state the scenario calls for."""
    result = record.result
    if result is None:
        return []
    out: list[str] = []
    if result.state not in TERMINAL:
        out.append(f"the run returned in {result.state}, which is not terminal")
    if not isinstance(result.explanation, str) or not result.explanation.strip():
        out.append(f"the run ended {result.state} without an explanation")
    if (result.error is None) != (result.state is TurnState.Done):
        out.append(
            f"the run ended {result.state} with error={result.error!r}: only Done has no error"
        )
    expected = expected_run(record.scenario)
    if result.state is not expected.state:
        out.append(
            f"the run ended {result.state}, but it should end {expected.state} ({expected.reason})"
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
    for call, result in _calls_and_results(record.transcript, len(record.scenario.history)):
        key = _key(call)
        if key is not None:
            answered[key] = result
    executed = {ex.key for ex in record.executions}
    for ex in record.executions:
        if answered.get(ex.key) is None:
            out.append(f"tool call {ex.key} had started but has no result after the abort")
    for key, result in answered.items():
        if key not in executed and result is not None and not result.is_error:
            out.append(f"tool call {key} never started but its result is not an error")
    if record.result is not None and record.result.state is not TurnState.Aborted:
        out.append(f"the run was aborted but ended {record.result.state}")
    return out


def check_limits(record: RunRecord) -> list[str]:
    """I7: at most ``max_turns`` model calls; reaching the limit with work asked for
    ends a RunResult loop in TurnLimitExceeded with an explanation naming the limit."""
    limit = record.scenario.max_turns
    out: list[str] = []
    if record.model_calls > limit:
        out.append(f"the loop made {record.model_calls} model calls with max_turns={limit}")
    expected = expected_run(record.scenario)
    result = record.result
    if result is not None and expected.state is TurnState.TurnLimitExceeded:
        if result.state is not TurnState.TurnLimitExceeded:
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
) -> dict[str, list[str]]:
    """Run the selected properties; return the violated ones with their sentences."""
    unknown = sorted(set(properties) - set(PROPERTY_TITLES))
    if unknown:
        raise ValueError(
            f"unknown property name(s) {', '.join(unknown)}; known: {', '.join(PROPERTY_TITLES)}"
        )
    out: dict[str, list[str]] = {}
    for name in sorted(properties):
        if name == "I5":
            problems = check_determinism(record, rerun) if rerun is not None else []
        else:
            problems = PROPERTIES[name](record)
        if problems:
            out[name] = problems
    return out
