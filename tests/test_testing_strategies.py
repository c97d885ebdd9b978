"""The public strategies generate every behaviour their docstring promises, and
shrink towards the plain case.

The strategies draw a scenario as one byte string (cheap to generate), and rare
behaviours (a real sleep, a hang) are rare on purpose; each test here searches for
one behaviour with ``hypothesis.find``, so a behaviour the encoding could no longer
produce fails the search.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from statemachine import AbortSignal, Message, Tool, ToolResultMessage
from statemachine.engine import validate_arguments
from statemachine.messages import StopReason
from statemachine.testing import (
    AbortAt,
    AbortKind,
    ModelTurn,
    OnAbort,
    Outcome,
    Scenario,
    ScriptedCall,
    ToolBehaviour,
    run_conformance,
)
from statemachine.testing.scenario import DEFAULT_HISTORY
from statemachine.testing.strategies import (
    PRIOR_EXCHANGE,
    model_turns,
    scenarios,
    scripted_calls,
    tool_behaviours,
)

SEARCH = settings(
    max_examples=50_000,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate],  # finding one is the point; shrinking is tested apart
)
SHRINK = settings(SEARCH, phases=[Phase.generate, Phase.shrink])


def _calls(s: Scenario) -> Iterator[ScriptedCall]:
    for turn in s.turns:
        yield from turn.calls


def _any_call(test: Callable[[ScriptedCall], bool]) -> Callable[[Scenario], bool]:
    return lambda s: any(test(c) for c in _calls(s))


def _any_turn(test: Callable[[ModelTurn], bool]) -> Callable[[Scenario], bool]:
    return lambda s: any(test(t) for t in s.turns)


BEHAVIOURS: dict[str, Callable[[Scenario], bool]] = {
    "a tool raises": _any_call(lambda c: c.behaviour.outcome is Outcome.RAISE),
    "a tool takes ticks": _any_call(lambda c: c.behaviour.ticks == 4),
    "a tool sleeps for real": _any_call(lambda c: c.behaviour.sleep > 0),
    "a tool ignores the abort": _any_call(lambda c: c.behaviour.on_abort is OnAbort.IGNORE),
    "a tool cleans up in ticks": _any_call(lambda c: c.behaviour.cleanup_ticks == 2),
    "a tool hangs": _any_call(lambda c: c.behaviour.on_abort is OnAbort.HANG),
    "two calls of a batch hang": _any_turn(
        lambda t: sum(c.behaviour.on_abort is OnAbort.HANG for c in t.calls) >= 2
    ),
    "an unknown tool": _any_call(lambda c: c.tool == "ghost"),
    "the other known tool": _any_call(lambda c: c.tool == "beta"),
    "invalid arguments": _any_call(lambda c: not c.valid_arguments),
    "an empty id": _any_call(lambda c: c.call_id == ""),
    "a duplicate id": lambda s: any([c.call_id for c in t.calls].count("dup") > 1 for t in s.turns),
    "an id of the input history": lambda s: (
        s.history == PRIOR_EXCHANGE and any(c.call_id == "prev_1" for c in _calls(s))
    ),
    "three calls in one response": _any_turn(lambda t: len(t.calls) == 3),
    "calls finishing out of call order": _any_turn(
        lambda t: [c.behaviour.ticks for c in t.calls] != sorted(c.behaviour.ticks for c in t.calls)
    ),
    "stop with tool calls": _any_turn(lambda t: t.stop_reason is StopReason.STOP and bool(t.calls)),
    "length": _any_turn(lambda t: t.stop_reason is StopReason.LENGTH),
    "error": _any_turn(lambda t: t.stop_reason is StopReason.ERROR),
    "aborted": _any_turn(lambda t: t.stop_reason is StopReason.ABORTED),
    "a text-only answer": _any_turn(lambda t: not t.calls and bool(t.text)),
    "the model raises": _any_turn(lambda t: t.raises),
    "the model takes ticks": _any_turn(lambda t: t.ticks == 2),
    "the model ignores the abort": _any_turn(lambda t: t.on_abort is OnAbort.IGNORE),
    "the model hangs": _any_turn(lambda t: t.on_abort is OnAbort.HANG),
    "four responses": lambda s: len(s.turns) == 4,
    "no response": lambda s: not s.turns,
    "an abort before the start": lambda s: s.abort.kind is AbortKind.BEFORE_START,
    "an abort during a model call": lambda s: s.abort.kind is AbortKind.MODEL_CALL,
    "an abort past the script": lambda s: (
        s.abort.kind is AbortKind.MODEL_CALL and s.abort.turn == len(s.turns) + 1
    ),
    "an abort at a tool start": lambda s: s.abort.kind is AbortKind.TOOL_START,
    "an abort at a later call's start": lambda s: (
        s.abort.kind is AbortKind.TOOL_START and s.abort.call > 0
    ),
    "max_turns 1": lambda s: s.max_turns == 1,
    "max_turns 6": lambda s: s.max_turns == 6,
    "a prior exchange": lambda s: s.history == PRIOR_EXCHANGE,
}


@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
def test_scenarios_generate(name: str) -> None:
    found = find(scenarios(), BEHAVIOURS[name], settings=SEARCH)
    assert BEHAVIOURS[name](found)


def test_shrinking_goes_to_the_plain_case() -> None:
    assert find(scenarios(), lambda s: True, settings=SHRINK) == Scenario(turns=(), max_turns=1)
    # Seeded: a greedy shrinker can stop in a local minimum on some searches.
    raising = find(
        scenarios(), BEHAVIOURS["a tool raises"], settings=SHRINK, random=random.Random(0)
    )
    assert raising == Scenario(
        turns=(
            ModelTurn(
                calls=(ScriptedCall(behaviour=ToolBehaviour(outcome=Outcome.RAISE)),),
                stop_reason=StopReason.TOOL_USE,
            ),
        ),
        max_turns=1,
    )


def test_unique_ids_on_request() -> None:
    def odd(s: Scenario) -> bool:
        return any(c.call_id is not None for c in _calls(s))

    assert find(scenarios(), odd, settings=SEARCH)  # they are there by default
    with pytest.raises(NoSuchExample):
        find(scenarios(odd_ids=False), odd, settings=settings(SEARCH, max_examples=1000))


def test_no_hangs_on_request() -> None:
    def hangs(s: Scenario) -> bool:
        return BEHAVIOURS["a tool hangs"](s) or BEHAVIOURS["the model hangs"](s)

    assert find(scenarios(), hangs, settings=SEARCH)
    with pytest.raises(NoSuchExample):
        find(scenarios(hangs=False), hangs, settings=settings(SEARCH, max_examples=1000))


@pytest.mark.parametrize(
    ("strategy", "check"),
    [
        (tool_behaviours(), lambda b: b.on_abort is OnAbort.IGNORE and b.sleep > 0),
        (tool_behaviours(allow_hang=True), lambda b: b.on_abort is OnAbort.HANG),
        (tool_behaviours(max_ticks=9), lambda b: b.ticks == 9),
        (scripted_calls(), lambda c: c.tool == "ghost" and c.call_id == "dup"),
        (model_turns(max_calls=5), lambda t: len(t.calls) == 5),
    ],
)
def test_part_strategies_generate(
    strategy: st.SearchStrategy[object], check: Callable[[object], bool]
) -> None:
    assert check(find(strategy, check, settings=SEARCH))


def test_the_default_history_and_no_abort_are_the_plain_case() -> None:
    plain = find(scenarios(), lambda s: True, settings=SHRINK)
    assert plain.history == DEFAULT_HISTORY
    assert plain.abort == AbortAt()


# -- the oddness level: a defect shows alone as well as among others -------------------------


def test_the_masks_cover_each_record_byte_for_byte() -> None:
    from statemachine.testing import strategies as s

    assert len(s._HEAD_MASK) == s._HEAD_OF_SCENARIO
    assert len(s._TURN_MASK) == s._HEAD_BYTES
    assert len(s._CALL_MASK) == s._CALL_BYTES


async def _crashes_on_odd_input_and_trusts_ids(
    *,
    model: Any,
    tools: Sequence[Tool],
    messages: Sequence[Message],
    max_turns: int,
    signal: AbortSignal,
) -> list[Message]:
    """Raises on anything odd (an unknown tool, an empty id, invalid arguments, a
    failing tool, a response that is not a plain answer), so I8 fails on those and I1
    sees no history; and passes a repeated id through, which only I1 can see."""
    history = list(messages)
    by_name = {t.definition.name: t for t in tools}
    for _turn in range(max_turns):
        assistant = await model.complete(history, [t.definition for t in tools], signal)
        if assistant.stop_reason not in (StopReason.STOP, StopReason.TOOL_USE):
            raise ValueError(f"cannot continue after a {assistant.stop_reason} response")
        history.append(assistant)
        if not assistant.tool_calls:
            return history
        for call in assistant.tool_calls:
            tool = by_name.get(call.name)
            if tool is None or not call.id or validate_arguments(tool.definition, call.arguments):
                raise ValueError(f"cannot run call {call.id!r} to {call.name}")
            text = await tool.execute(call.arguments_dict(), signal)
            history.append(ToolResultMessage(call.id, call.name, str(text)))
    return history


def test_a_defect_hidden_by_crashes_on_other_odd_input_is_still_found() -> None:
    # Found after 61 scenarios with this seed; with every choice drawn uniformly (no
    # oddness level) the same search went 300 scenarios without finding it.
    report = run_conformance(
        _crashes_on_odd_input_and_trusts_ids, properties=["I1"], max_examples=300, seed=1
    )
    assert report.failed_properties == ("I1",)
    assert "repeats the id" in report.failures[0].sentence


def test_the_oddness_level_makes_choices_plain_by_their_gates() -> None:
    from statemachine.testing.strategies import _with_oddness

    plainable = (True, False, True, True)
    code, gates = bytes([9, 8, 7, 6]), bytes([0, 0, 200, 255])
    assert _with_oddness(code + gates + bytes([0]), plainable) == bytes([0, 8, 0, 0])
    assert _with_oddness(code + gates + bytes([201]), plainable) == bytes([9, 8, 7, 0])
    assert _with_oddness(code + gates + bytes([255]), plainable) == bytes([9, 8, 7, 0])
