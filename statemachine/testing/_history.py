"""The history a run left, read the way the properties judge it.

Tool results are paired with the calls they answer by position (``pair_results``),
so a repeated id, a wrong id or a late result is one fault, and the model's
responses are matched with resynchronisation (``response_findings``), so one
rewritten, dropped or invented response is one fault. Each finding is a message
index and a sentence; ``properties.py`` prefixes the invariant.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResultMessage,
)


def key_argument(call: ToolCall) -> str | None:
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


def pair_results(transcript: Sequence[Message]) -> tuple[list[_Pair], list[_Stray]]:
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


def _id_finding(p: _Pair, first_use: dict[str, int], across_turns: bool) -> list[tuple[int, str]]:
    """An empty id, or one that repeats an earlier call's (``first_use`` grows); a
    repeat of a call in an earlier message only when ``across_turns``."""
    call = p.call
    if not call.id:
        return [(p.index, f"tool call {call.name} has an empty id")]
    if call.id in first_use:
        if first_use[call.id] != p.index and not across_turns:
            return []
        text = f"tool call id {call.id!r} repeats the id of a call in message {first_use[call.id]}"
        return [(p.index, text)]
    first_use[call.id] = p.index
    return []


def _answer_findings(transcript: Sequence[Message], p: _Pair) -> list[tuple[int, str]]:
    """How the call's result is wrong: missing, late, under a wrong id, wrong tool."""
    call = p.call
    out: list[tuple[int, str]] = []
    following = _next_assistant(transcript, p.index)
    before_next = (
        f" before the next assistant message (message {following})" if following is not None else ""
    )
    if p.how == "missing":
        out.append((p.index, f"tool call {call.id!r} ({call.name}) has no result{before_next}"))
    elif p.how == "late":
        text = (
            f"tool call {call.id!r} ({call.name}) has no result{before_next}: its "
            f"result comes later, at message {p.result_index}"
        )
        out.append((p.index, text))
    elif p.how == "wrong id":
        assert p.result is not None
        text = (
            f"the result has id {p.result.tool_call_id!r}, which no call of message "
            f"{p.index} has: the result expected there is that of tool call "
            f"{call.id!r} ({call.name})"
        )
        out.append((p.result_index, text))
    if p.result is not None and p.how != "wrong id" and p.result.tool_name != call.name:
        text = (
            f"result for tool call {call.id!r} names tool {p.result.tool_name!r}, "
            f"but the call was to {call.name!r}"
        )
        out.append((p.result_index, text))
    return out


def pairing_findings(
    transcript: Sequence[Message],
    pairs: list[_Pair],
    strays: list[_Stray],
    *,
    across_turns: bool = True,
) -> list[tuple[int, str]]:
    """I1 over the history: each fault once, at the message where it shows. Without
    ``across_turns``, a call id that repeats the id of a call in an earlier message is
    not a fault (two calls with one id in one message still are)."""
    out: list[tuple[int, str]] = []
    first_use: dict[str, int] = {}
    for p in pairs:
        out += _id_finding(p, first_use, across_turns)
        out += _answer_findings(transcript, p)
    for stray in strays:
        call_id = stray.result.tool_call_id
        text = (
            f"a second result for tool call {call_id!r}"
            if stray.second
            else f"result for tool call {call_id!r} has no matching call"
        )
        out.append((stray.index, text))
    return out


def result_order_findings(pairs: list[_Pair]) -> list[tuple[int, str]]:
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


def calls_and_results(
    transcript: Sequence[Message], start: int = 0
) -> list[tuple[ToolCall, ToolResultMessage | None]]:
    """Each tool call from message ``start`` on with the result that answers it."""
    return [(p.call, p.result) for p in pair_results(transcript)[0] if p.index >= start]


def _summary(message: AssistantMessage) -> str:
    """A response in a few words, to say what was expected where another stands."""
    bits = [f"[{message.stop_reason.value}]"]
    if message.text:
        text = message.text if len(message.text) <= 40 else message.text[:37] + "..."
        bits.append(repr(text))
    if message.tool_calls:
        bits.append(
            "calls " + ", ".join(f"{c.name}({key_argument(c) or '?'})" for c in message.tool_calls)
        )
    return " ".join(bits)


def _responses(numbers: Iterable[int], total: int) -> str:
    """``model response 2 of 3 is`` or ``model responses 2, 3 of 3 are``."""
    listed = list(numbers)
    if len(listed) == 1:
        return f"model response {listed[0]} of {total} is"
    return f"model responses {', '.join(map(str, listed))} of {total} are"


def findings(invariant: str, found: list[tuple[int, str]]) -> list[str]:
    """Sentences in message order."""
    return [f"{invariant} at message {i}: {text}" for i, text in sorted(found, key=lambda f: f[0])]


def _shape(message: AssistantMessage) -> tuple[object, ...]:
    """A message modulo tool-call ids (a loop may rename empty or repeated ids)."""
    return (
        message.text,
        message.stop_reason,
        tuple((c.name, dict(c.arguments)) for c in message.tool_calls),
    )


def _misplaced(
    index: int,
    position: int,
    later: int | None,
    awaited: bool,
    produced: Sequence[AssistantMessage],
) -> tuple[str, range]:
    """What assistant message ``index`` is, when it is not response ``position``: a
    later response (moved, or with the ones before it dropped), or no response at all
    (the one expected comes after it, or never). Also the responses now placed."""
    total = len(produced)
    if later is not None and awaited:
        text = (
            f"assistant message {index} is model response {later + 1} of {total}, but "
            f"response {position + 1} comes after it: messages must appear in the "
            "order they arrived"
        )
        return text, range(later, later + 1)
    if later is not None:
        text = (
            f"{_responses(range(position + 1, later + 1), total)} missing from the "
            f"history: assistant message {index} is response {later + 1}"
        )
        return text, range(position, later + 1)
    if awaited:
        text = (
            f"assistant message {index} is not a response of the model: response "
            f"{position + 1} of {total} ({_summary(produced[position])}) was expected "
            "there, and comes after it"
        )
        return text, range(0)
    if position < total:
        text = (
            f"assistant message {index} is not the model's next response: response "
            f"{position + 1} of {total} ({_summary(produced[position])}) was expected "
            "there (messages must appear as they arrived)"
        )
        return text, range(position, position + 1)
    text = (
        f"assistant message {index} is not a response of the model: all {total} "
        "of its responses come before it"
    )
    return text, range(0)


def response_findings(
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
        text, now_placed = _misplaced(index, position, later, awaited, produced)
        placed.update(now_placed)
        out.append((index, text))
    missing = [q + 1 for q in range(total) if q not in placed]
    if missing:
        out.append((len(transcript), f"{_responses(missing, total)} missing from the history"))
    return out
