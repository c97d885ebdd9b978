"""Public Hypothesis strategies for scenarios of the agent loop.

Each function returns a strategy; compose them or take whole ``scenarios()``. What
they generate, and why it shrinks well:

* ``tool_behaviours()``: return or raise; a few event-loop ticks or a tiny sleep;
  honour the abort signal (with a cleanup of some ticks) or ignore it; with
  ``allow_hang``, hang until cancelled.
* ``scripted_calls()``: a call to a known tool, to an unknown one, or with arguments
  that fail the tool's JSON Schema; a unique, empty or duplicate id.
* ``completion_orders(n)``: a permutation of ``range(n)``, the order in which a
  batch of calls finishes; ``completion_order(calls, order)`` sets the calls'
  ticks so they finish in it.
* ``model_turns()`` / ``model_scripts()``: one response or a whole script: text,
  calls, any stop reason (``stop`` with tool calls included), or a raise.
* ``abort_instants(turns)``: never, before the start, during any model call the
  script reaches, or as any runnable tool call starts.
* ``limits()``: ``max_turns`` values; ``histories()``: valid input histories.
* ``scenarios()``: all of the above together, with hangs placed only where an abort
  reaches them (a hang with no abort to end it would only measure patience).

How they draw: a record (a tool's behaviour, a scripted call, the head of a model
response) is a fixed number of bytes, one byte per field, each byte picking one of
the field's options (byte 0 the first, the plain one; an option listed twice is
twice as likely). ``scenarios()`` draws a whole scenario as ONE byte string and
decodes it, because Hypothesis's cost is per draw (a scenario drawn field by field
took about seventy draws, more time than running it twice). The string also holds an
"oddness level" and a gate byte per choice: a choice is kept as drawn only where its
gate is below the level, and is plain elsewhere, so scenarios range from plain to odd
in every field, and a loop's defect shows alone as well as among others. Bytes are drawn
uniformly and shrink one by one towards zero, so every field shrinks on its own
towards its plain option; ``run_conformance`` then drops responses and calls
outright (``_shrink.simplify``).

The strategy functions are cached: building a strategy costs more than drawing
from it.

Everything shrinks towards the plain case: no abort, known tools, valid arguments,
unique ids, calls finishing in call order, nothing raising.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs
from hypothesis import strategies as st

from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.testing.scenario import (
    DEFAULT_HISTORY,
    KNOWN_TOOLS,
    UNKNOWN_TOOL,
    AbortAt,
    AbortKind,
    ModelTurn,
    OnAbort,
    Outcome,
    Scenario,
    ScriptedCall,
    ToolBehaviour,
)

__all__ = [
    "PRIOR_EXCHANGE",
    "abort_instants",
    "completion_order",
    "completion_orders",
    "histories",
    "limits",
    "model_scripts",
    "model_turns",
    "scenarios",
    "scripted_calls",
    "tool_behaviours",
]

PRIOR_EXCHANGE: tuple[Message, ...] = (
    UserMessage("Start with the first part."),
    AssistantMessage((ToolCall("prev_1", "alpha", {"key": "prev"}),), stop_reason="toolUse"),
    ToolResultMessage("prev_1", "alpha", "alpha output for prev"),
    AssistantMessage("The first part is done."),
    UserMessage("Now do the task."),
)
"""A finished earlier exchange; its call id ``prev_1`` may be repeated by the model."""


# -- the byte encoding --------------------------------------------------------------------


def _pick(options: Sequence[object], byte: int) -> object:
    """The option a byte picks: 0 picks the first, and each option takes an equal
    share of the 256 values (a repeated option, a bigger share)."""
    return options[byte * len(options) >> 8]


_OUTCOMES = (Outcome.RETURN, Outcome.RETURN, Outcome.RAISE)
# Sleeps (timers) interleave with ticks differently from ticks alone. They cost no real
# time where nothing else can happen on ``run_conformance``'s idle-skipping loop
# (testing/clock.py); on a plain loop each costs a millisecond or more.
_SLEEPS: tuple[float, ...] = (0.0,) * 4 + (0.0005, 0.001, 0.002)
_CLEANUP_TICKS = (0, 1, 2)
_TOOLS = (*KNOWN_TOOLS, *KNOWN_TOOLS, UNKNOWN_TOOL)
_VALID = (True, True, True, False)
_CALL_IDS: tuple[str | None, ...] = (None, None, None, None, "", "dup", "prev_1")
_STOP_REASONS = (
    StopReason.TOOL_USE,
    StopReason.STOP,
    StopReason.TOOL_USE,
    StopReason.LENGTH,
    StopReason.ERROR,
    StopReason.ABORTED,
)
_TEXTS = ("", "Working on it.")
_RAISES = (False,) * 9 + (True,)
_MODEL_TICKS = (0, 1, 2)
_MODEL_ON_ABORT = (OnAbort.HONOUR, OnAbort.IGNORE)
_HISTORIES = (DEFAULT_HISTORY, PRIOR_EXCHANGE)
_LIMITS = (1, 2, 3, 4, 5, 6)

_BEHAVIOUR_BYTES = 5  # outcome, ticks, sleep, on_abort, cleanup ticks
_CALL_BYTES = 3 + _BEHAVIOUR_BYTES  # tool, valid arguments, id; the behaviour
_HEAD_BYTES = 6  # number of calls, raises, stop reason, text, ticks, on abort


@functools.cache
def _on_abort_options(allow_hang: bool) -> tuple[OnAbort, ...]:
    return (OnAbort.HONOUR, OnAbort.IGNORE) + ((OnAbort.HANG,) if allow_hang else ())


@functools.cache
def _behaviour(code: bytes, allow_hang: bool, max_ticks: int) -> ToolBehaviour:
    """The behaviour these bytes encode (cached: there are few distinct ones)."""
    outcome, ticks, sleep, on_abort, cleanup = code
    return ToolBehaviour(
        outcome=_pick(_OUTCOMES, outcome),  # type: ignore[arg-type]
        ticks=ticks * (max_ticks + 1) >> 8,
        sleep=_pick(_SLEEPS, sleep),  # type: ignore[arg-type]
        on_abort=_pick(_on_abort_options(allow_hang), on_abort),  # type: ignore[arg-type]
        cleanup_ticks=_pick(_CLEANUP_TICKS, cleanup),  # type: ignore[arg-type]
    )


def _call(code: bytes, allow_hang: bool = False, odd_ids: bool = True) -> ScriptedCall:
    return ScriptedCall(
        tool=_pick(_TOOLS, code[0]),  # type: ignore[arg-type]
        valid_arguments=_pick(_VALID, code[1]),  # type: ignore[arg-type]
        call_id=_pick(_CALL_IDS, code[2]) if odd_ids else None,  # type: ignore[arg-type]
        behaviour=_behaviour(code[3:_CALL_BYTES], allow_hang, 4),
    )


def _turn(code: bytes, max_calls: int, odd_ids: bool = True) -> ModelTurn:
    """A response from ``_HEAD_BYTES + max_calls * _CALL_BYTES`` bytes; the first byte
    says how many of the calls are there."""
    n_calls = code[0] * (max_calls + 1) >> 8
    calls = tuple(
        _call(code[start : start + _CALL_BYTES], odd_ids=odd_ids)
        for start in range(_HEAD_BYTES, _HEAD_BYTES + n_calls * _CALL_BYTES, _CALL_BYTES)
    )
    return ModelTurn(
        text=_pick(_TEXTS, code[3]),  # type: ignore[arg-type]
        calls=calls,
        stop_reason=_pick(_STOP_REASONS, code[2]),  # type: ignore[arg-type]
        raises=_pick(_RAISES, code[1]),  # type: ignore[arg-type]
        ticks=_pick(_MODEL_TICKS, code[4]),  # type: ignore[arg-type]
        on_abort=_pick(_MODEL_ON_ABORT, code[5]),  # type: ignore[arg-type]
    )


@functools.cache
def _fixed_bytes(size: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=size, max_size=size)


# -- the public strategies -----------------------------------------------------------------


@functools.cache
def tool_behaviours(
    *, allow_hang: bool = False, max_ticks: int = 4
) -> st.SearchStrategy[ToolBehaviour]:
    """How one tool call behaves once started."""
    return _fixed_bytes(_BEHAVIOUR_BYTES).map(lambda code: _behaviour(code, allow_hang, max_ticks))


@functools.cache
def scripted_calls(*, allow_hang: bool = False) -> st.SearchStrategy[ScriptedCall]:
    """One tool call of a scripted response: known/unknown tool, valid/invalid
    arguments, unique/empty/duplicate id, and its behaviour."""
    return _fixed_bytes(_CALL_BYTES).map(lambda code: _call(code, allow_hang))


def completion_orders(n: int) -> st.SearchStrategy[list[int]]:
    """The order in which ``n`` calls of one batch finish (a permutation of range(n))."""
    return st.permutations(list(range(n)))


def completion_order(
    calls: Sequence[ScriptedCall], order: Sequence[int]
) -> tuple[ScriptedCall, ...]:
    """The calls with ticks set so that they finish in ``order`` (a permutation of
    their indexes: ``order[0]`` finishes first)."""
    if sorted(order) != list(range(len(calls))):
        raise ValueError(f"order must be a permutation of range({len(calls)}), got {order!r}")
    return tuple(
        attrs.evolve(call, behaviour=attrs.evolve(call.behaviour, ticks=2 * list(order).index(i)))
        for i, call in enumerate(calls)
    )


@functools.cache
def model_turns(*, max_calls: int = 3) -> st.SearchStrategy[ModelTurn]:
    """One scripted model response (or raise). Each call draws its own ticks, so a
    batch finishes in any order; shrinking goes to call order. (Each call drawing
    its own ticks, rather than one permutation per batch, lets the shrinker zero a
    call's bytes without disturbing the others.)"""
    return _fixed_bytes(_HEAD_BYTES + max_calls * _CALL_BYTES).map(
        lambda code: _turn(code, max_calls)
    )


@functools.cache
def model_scripts(
    *, max_responses: int = 4, max_calls: int = 3
) -> st.SearchStrategy[list[ModelTurn]]:
    """A script: the model's answers to its first calls, in order."""
    return st.lists(model_turns(max_calls=max_calls), max_size=max_responses)


def _abort_candidates(turns: Sequence[ModelTurn]) -> list[AbortAt]:
    candidates: list[AbortAt] = [AbortAt(AbortKind.BEFORE_START)]
    for t in range(1, len(turns) + 2):
        candidates.append(AbortAt(AbortKind.MODEL_CALL, t))
    for t, turn in enumerate(turns, 1):
        candidates.extend(
            AbortAt(AbortKind.TOOL_START, t, c)
            for c, call in enumerate(turn.calls)
            if call.executable
        )
    return candidates


def abort_instants(turns: Sequence[ModelTurn]) -> st.SearchStrategy[AbortAt]:
    """Every instant at which an abort can hit a run of this script."""
    return st.one_of(st.just(AbortAt()), st.sampled_from(_abort_candidates(turns)))


@functools.cache
def limits(*, low: int = 1, high: int = 6) -> st.SearchStrategy[int]:
    """``max_turns`` values."""
    return st.integers(low, high)


@functools.cache
def histories() -> st.SearchStrategy[tuple[Message, ...]]:
    """Valid input histories: one user message, or a finished exchange and a new ask."""
    return st.sampled_from(_HISTORIES)


# One abort in four that hits a model call of the script, or a tool start, finds the
# call(s) it reaches hanging. A hang lasts until the loop cancels it (its grace period)
# which costs no real time on run_conformance's idle-skipping loop (testing/clock.py).
_HANG_ODDS = 4
# The bytes before the responses: abort instant (two: there can be many candidates),
# whether and which calls hang (two), max_turns, history, number of responses. They
# come first because the shrinker goes through the bytes in order: an abort is moved
# to an earlier instant while the responses are still as generated (an abort during a
# model call that ignores it and returns calls is simpler than one at the start of a
# second call).
_HEAD_OF_SCENARIO = 7


# Which bytes of a scenario an "oddness level" may turn plain (True): every choice
# with a plain option. Counts (responses, calls per response), the limit, ticks, and
# whether and which of the calls an abort reaches hang (no abort, no hang) stay as
# drawn: they shape a run without being odd on their own.
_HEAD_MASK = (True, True, False, False, False, True, False)  # abort (2), hang, which, ...
_TURN_MASK = (False, True, True, True, False, True)  # calls, raises, stop, text, ticks, abort
_CALL_MASK = (True, True, True, True, False, True, True, False)  # tool, args, id, behaviour


@functools.cache
def _plainable(max_responses: int, max_calls: int) -> tuple[bool, ...]:
    turn = _TURN_MASK + _CALL_MASK * max_calls
    return _HEAD_MASK + turn * max_responses


@functools.cache
def _scenario_bytes(max_responses: int, max_calls: int) -> st.SearchStrategy[bytes]:
    # The scenario's bytes, as many gate bytes, and the level: see ``_with_oddness``.
    return _fixed_bytes(2 * len(_plainable(max_responses, max_calls)) + 1)


def _with_oddness(raw: bytes, plainable: Sequence[bool]) -> bytes:
    """The scenario's bytes with each plainable choice kept only when its gate byte is
    below the scenario's level byte, and made plain (0) otherwise.

    Uniform bytes alone make almost every scenario odd in many ways at once (an unknown
    tool here, an empty id there, a raise...), and a loop's first defect then hides the
    others: a loop that crashes on an unknown tool is never seen mishandling a repeated
    id. The level spreads scenarios from plain (level 0) to odd everywhere (255).
    """
    n = len(plainable)
    level = raw[2 * n]
    return bytes(
        byte if not plain or gate < level else 0
        for byte, gate, plain in zip(raw[:n], raw[n : 2 * n], plainable, strict=True)
    )


@functools.cache
@st.composite
def scenarios(
    draw: st.DrawFn,
    *,
    max_responses: int = 4,
    max_calls: int = 3,
    aborts: bool = True,
    hangs: bool = True,
    max_turns: st.SearchStrategy[int] | None = None,
    odd_ids: bool = True,
) -> Scenario:
    """Whole scenarios. A hang is placed only where the abort reaches it: in the model
    call the abort hits, or in calls at or after the one whose start fires it.
    ``odd_ids=False`` gives every call a unique id (no empty or repeated ones), to
    look at a loop's other behaviour when it is known to mishandle those.

    One draw of bytes: abort, hangs, limit, history, the number of responses,
    then each response (head and calls); see the module docstring."""
    code = _with_oddness(
        draw(_scenario_bytes(max_responses, max_calls)), _plainable(max_responses, max_calls)
    )
    abort_hi, abort_lo, hang, which, limit, history, count = code[:_HEAD_OF_SCENARIO]
    turn_bytes = _HEAD_BYTES + max_calls * _CALL_BYTES
    # No response at all gets half the share of one to max_responses responses.
    n_turns = ((count * (2 * max_responses + 1) >> 8) + 1) // 2
    turns = [
        _turn(code[start : start + turn_bytes], max_calls, odd_ids)
        for start in range(_HEAD_OF_SCENARIO, _HEAD_OF_SCENARIO + n_turns * turn_bytes, turn_bytes)
    ]
    abort = AbortAt()
    if aborts:
        # The lower half of the values means no abort (where shrinking goes); the
        # upper half names one candidate instant.
        candidates = _abort_candidates(turns)
        pick = ((abort_hi << 8) | abort_lo) * 2 * len(candidates) >> 16
        if pick >= len(candidates):
            abort = candidates[pick - len(candidates)]
    # Bytes in the top 1/_HANG_ODDS of the range place a hang, the others none.
    hang_at = hang - (256 - 256 // _HANG_ODDS)
    if hangs and hang_at >= 0:
        if abort.kind is AbortKind.MODEL_CALL and abort.turn <= len(turns):
            turns[abort.turn - 1] = attrs.evolve(turns[abort.turn - 1], on_abort=OnAbort.HANG)
        elif abort.kind is AbortKind.TOOL_START:
            turn = turns[abort.turn - 1]
            reached = len(turn.calls) - abort.call
            # Which of the reached calls hang: a non-empty subset, one in the bits.
            mask = 1 + (which * ((1 << reached) - 1) >> 8)
            calls = list(turn.calls)
            for i in range(reached):
                if mask >> i & 1:
                    c = abort.call + i
                    calls[c] = attrs.evolve(
                        calls[c], behaviour=attrs.evolve(calls[c].behaviour, on_abort=OnAbort.HANG)
                    )
            turns[abort.turn - 1] = attrs.evolve(turn, calls=tuple(calls))
    return Scenario(
        turns=tuple(turns),
        abort=abort,
        max_turns=draw(max_turns) if max_turns is not None else _pick(_LIMITS, limit),  # type: ignore[arg-type]
        history=_pick(_HISTORIES, history),  # type: ignore[arg-type]
    )
