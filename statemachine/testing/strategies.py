"""Public Hypothesis strategies for scenarios of the agent loop.

Each function returns a strategy; compose them or take whole ``scenarios()``. What
they generate, and why it shrinks well:

* ``tool_behaviours()``: return or raise; a few event-loop ticks or a tiny real
  sleep; honour the abort signal (with a cleanup of some ticks) or ignore it; with
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

The strategy functions are cached: building a strategy costs more than drawing
from it, and a composite strategy would otherwise rebuild its parts on every draw.

Everything shrinks towards the plain case: no abort, known tools, valid arguments,
unique ids, calls finishing in call order, nothing raising.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs
from hypothesis import strategies as st

from .._messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from .scenario import (
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


@functools.cache
def tool_behaviours(
    *, allow_hang: bool = False, max_ticks: int = 4
) -> st.SearchStrategy[ToolBehaviour]:
    """How one tool call behaves once started."""
    on_abort = [OnAbort.HONOUR, OnAbort.IGNORE] + ([OnAbort.HANG] if allow_hang else [])
    return st.builds(
        ToolBehaviour,
        outcome=st.sampled_from([Outcome.RETURN, Outcome.RETURN, Outcome.RAISE]),
        ticks=st.integers(0, max_ticks),
        sleep=st.sampled_from([0.0, 0.0, 0.0, 0.0005, 0.001]),
        on_abort=st.sampled_from(on_abort),
        cleanup_ticks=st.integers(0, 2),
    )


@functools.cache
def scripted_calls(*, allow_hang: bool = False) -> st.SearchStrategy[ScriptedCall]:
    """One tool call of a scripted response: known/unknown tool, valid/invalid
    arguments, unique/empty/duplicate id, and its behaviour."""
    return st.builds(
        ScriptedCall,
        tool=st.sampled_from([*KNOWN_TOOLS, *KNOWN_TOOLS, UNKNOWN_TOOL]),
        valid_arguments=st.sampled_from([True, True, True, False]),
        call_id=st.sampled_from([None, None, None, None, "", "dup", "prev_1"]),
        behaviour=tool_behaviours(allow_hang=allow_hang),
    )


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
@st.composite
def model_turns(draw: st.DrawFn, *, max_calls: int = 3) -> ModelTurn:
    """One scripted model response (or raise). Each call draws its own ticks, so a
    batch finishes in any order; shrinking goes to call order. (Each call drawing
    its own ticks, rather than one permutation per batch, lets the shrinker delete
    a call without disturbing the others.)"""
    calls = draw(st.lists(scripted_calls(), max_size=max_calls))
    return ModelTurn(
        text=draw(st.sampled_from(["", "Working on it."])),
        calls=tuple(calls),
        stop_reason=draw(
            st.sampled_from(
                [
                    StopReason.TOOL_USE,
                    StopReason.STOP,
                    StopReason.TOOL_USE,
                    StopReason.LENGTH,
                    StopReason.ERROR,
                    StopReason.ABORTED,
                ]
            )
        ),
        raises=draw(st.sampled_from([False] * 9 + [True])),
        ticks=draw(st.integers(0, 2)),
        on_abort=draw(st.sampled_from([OnAbort.HONOUR, OnAbort.IGNORE])),
    )


@functools.cache
def model_scripts(
    *, max_responses: int = 4, max_calls: int = 3
) -> st.SearchStrategy[list[ModelTurn]]:
    """A script: the model's answers to its first calls, in order."""
    return st.lists(model_turns(max_calls=max_calls), max_size=max_responses)


def abort_instants(turns: Sequence[ModelTurn]) -> st.SearchStrategy[AbortAt]:
    """Every instant at which an abort can hit a run of this script."""
    candidates: list[AbortAt] = [AbortAt(AbortKind.BEFORE_START)]
    for t in range(1, len(turns) + 2):
        candidates.append(AbortAt(AbortKind.MODEL_CALL, t))
    for t, turn in enumerate(turns, 1):
        candidates.extend(
            AbortAt(AbortKind.TOOL_START, t, c)
            for c, call in enumerate(turn.calls)
            if call.executable
        )
    return st.one_of(st.just(AbortAt()), st.sampled_from(candidates))


@functools.cache
def limits(*, low: int = 1, high: int = 6) -> st.SearchStrategy[int]:
    """``max_turns`` values."""
    return st.integers(low, high)


@functools.cache
def histories() -> st.SearchStrategy[tuple[Message, ...]]:
    """Valid input histories: one user message, or a finished exchange and a new ask."""
    return st.sampled_from([DEFAULT_HISTORY, PRIOR_EXCHANGE])


# Hangs cost a grace period of real time each, so they are drawn sparingly.
_rarely = st.sampled_from([False, False, False, True])


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
) -> Scenario:
    """Whole scenarios. A hang is placed only where the abort reaches it: in the model
    call the abort hits, or in a call at or after the one whose start fires it."""
    turns = list(draw(model_scripts(max_responses=max_responses, max_calls=max_calls)))
    abort = draw(abort_instants(turns)) if aborts else AbortAt()
    if hangs and abort.kind is AbortKind.MODEL_CALL and abort.turn <= len(turns) and draw(_rarely):
        turns[abort.turn - 1] = attrs.evolve(turns[abort.turn - 1], on_abort=OnAbort.HANG)
    if hangs and abort.kind is AbortKind.TOOL_START:
        turn = turns[abort.turn - 1]
        calls = list(turn.calls)
        for c in range(abort.call, len(calls)):
            if draw(_rarely):
                calls[c] = attrs.evolve(
                    calls[c], behaviour=attrs.evolve(calls[c].behaviour, on_abort=OnAbort.HANG)
                )
        turns[abort.turn - 1] = attrs.evolve(turn, calls=tuple(calls))
    return Scenario(
        turns=tuple(turns),
        abort=abort,
        max_turns=draw(max_turns if max_turns is not None else limits()),
        history=draw(histories()),
    )
