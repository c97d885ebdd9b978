"""The shrinker of ``run_conformance``: smaller or plainer variants of a failing
scenario, most drastic first, applied greedily while the scenario still fails.

The search draws a scenario as one byte string (``strategies``), whose bytes
Hypothesis's generic shrinker would sort and swap to no purpose; this pass knows what
each part of a scenario means.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs

from statemachine.core.messages import StopReason
from statemachine.testing.scenario import (
    DEFAULT_HISTORY,
    KNOWN_TOOLS,
    AbortAt,
    AbortKind,
    ModelTurn,
    OnAbort,
    Outcome,
    Scenario,
    ScriptedCall,
    ToolBehaviour,
)
from statemachine.testing.strategies import _abort_candidates

__all__ = ["candidates", "simplify"]


def _without_hangs(turns: tuple[ModelTurn, ...]) -> tuple[ModelTurn, ...]:
    """The turns with every hang made an honoured abort (a hang only an abort ends)."""
    out = []
    for turn in turns:
        if turn.on_abort is OnAbort.HANG:
            turn = attrs.evolve(turn, on_abort=OnAbort.HONOUR)
        if any(c.behaviour.on_abort is OnAbort.HANG for c in turn.calls):
            turn = attrs.evolve(
                turn,
                calls=[
                    attrs.evolve(c, behaviour=attrs.evolve(c.behaviour, on_abort=OnAbort.HONOUR))
                    if c.behaviour.on_abort is OnAbort.HANG
                    else c
                    for c in turn.calls
                ],
            )
        out.append(turn)
    return tuple(out)


def _plainer_calls(call: ScriptedCall) -> Iterator[ScriptedCall]:
    """One field of the call back to its plain value, whole behaviour first."""
    b = call.behaviour
    for variant in (
        attrs.evolve(call, behaviour=ToolBehaviour()),
        attrs.evolve(call, tool=KNOWN_TOOLS[0]),
        attrs.evolve(call, valid_arguments=True),
        attrs.evolve(call, call_id=None),
        attrs.evolve(call, behaviour=attrs.evolve(b, outcome=Outcome.RETURN)),
        attrs.evolve(call, behaviour=attrs.evolve(b, on_abort=OnAbort.HONOUR)),
        attrs.evolve(call, behaviour=attrs.evolve(b, sleep=0.0)),
        attrs.evolve(call, behaviour=attrs.evolve(b, ticks=0)),
        attrs.evolve(call, behaviour=attrs.evolve(b, cleanup_ticks=0)),
    ):
        if variant != call:
            yield variant


def _plainer_turns(turn: ModelTurn) -> Iterator[ModelTurn]:
    """The response with its extras dropped, or one field back to its plain value."""
    for variant in (
        ModelTurn(calls=turn.calls, stop_reason=turn.stop_reason, raises=turn.raises),
        attrs.evolve(turn, raises=False),
        attrs.evolve(turn, stop_reason=StopReason.TOOL_USE),
        attrs.evolve(turn, on_abort=OnAbort.HONOUR),
        attrs.evolve(turn, text=""),
        attrs.evolve(turn, ticks=0),
    ):
        if variant != turn:
            yield variant


def _earlier_aborts(s: Scenario) -> Iterator[Scenario]:
    """The abort moved to an earlier instant (never when something hangs: a hang sits
    where the abort reaches it). An abort at a tool start may also move to the model
    call of that response, with the model ignoring it so the calls still come."""
    abort = s.abort
    if abort.kind is AbortKind.NEVER or _without_hangs(s.turns) != s.turns:
        return
    for candidate in _abort_candidates(s.turns):
        if candidate == abort:
            break
        yield attrs.evolve(s, abort=candidate)
    if abort.kind is AbortKind.TOOL_START:
        turn = s.turns[abort.turn - 1]
        ignoring = attrs.evolve(turn, on_abort=OnAbort.IGNORE)
        yield attrs.evolve(
            s,
            abort=AbortAt(AbortKind.MODEL_CALL, abort.turn),
            turns=(*s.turns[: abort.turn - 1], ignoring, *s.turns[abort.turn :]),
        )


def candidates(s: Scenario) -> Iterator[Scenario]:
    """Smaller or plainer variants of ``s``, most drastic first: no abort, a response
    or a call dropped, the plain history, a lower limit, an earlier abort, then one
    field of a response or call back to its plain value.

    This is the whole shrinker: the search draws a scenario as one byte string
    (``strategies``), whose bytes Hypothesis's generic shrinker would sort and swap
    to no purpose, so it only generates; this pass knows what each part means.
    """
    abort = s.abort
    if abort.kind is not AbortKind.NEVER:
        yield attrs.evolve(s, abort=AbortAt(), turns=_without_hangs(s.turns))
    for t in range(len(s.turns), 0, -1):
        if abort.kind in (AbortKind.MODEL_CALL, AbortKind.TOOL_START) and abort.turn == t:
            continue
        new_abort = abort
        if abort.kind in (AbortKind.MODEL_CALL, AbortKind.TOOL_START) and abort.turn > t:
            new_abort = attrs.evolve(abort, turn=abort.turn - 1)
        yield attrs.evolve(s, turns=s.turns[: t - 1] + s.turns[t:], abort=new_abort)
    for t, turn in enumerate(s.turns, 1):
        for c in range(len(turn.calls) - 1, -1, -1):
            targeted = abort.kind is AbortKind.TOOL_START and abort.turn == t
            if targeted and abort.call == c:
                continue
            new_abort = abort
            if targeted and abort.call > c:
                new_abort = attrs.evolve(abort, call=abort.call - 1)
            calls = turn.calls[:c] + turn.calls[c + 1 :]
            turns = (*s.turns[: t - 1], attrs.evolve(turn, calls=calls), *s.turns[t:])
            yield attrs.evolve(s, turns=turns, abort=new_abort)
    if s.history != DEFAULT_HISTORY:
        yield attrs.evolve(s, history=DEFAULT_HISTORY)
    for limit in range(1, s.max_turns):
        yield attrs.evolve(s, max_turns=limit)
    yield from _earlier_aborts(s)
    for t, turn in enumerate(s.turns, 1):
        for variant in _plainer_turns(turn):
            yield attrs.evolve(s, turns=(*s.turns[: t - 1], variant, *s.turns[t:]))
        for c, call in enumerate(turn.calls):
            for variant_call in _plainer_calls(call):
                calls = (*turn.calls[:c], variant_call, *turn.calls[c + 1 :])
                turns = (*s.turns[: t - 1], attrs.evolve(turn, calls=calls), *s.turns[t:])
                yield attrs.evolve(s, turns=turns)


def simplify(scenario: Scenario, still_fails: Callable[[Scenario], bool]) -> Scenario:
    """Greedily apply the first variant that still fails, until none does."""
    changed = True
    while changed:
        changed = False
        for candidate in candidates(scenario):
            if still_fails(candidate):
                scenario = candidate
                changed = True
                break
    return scenario
