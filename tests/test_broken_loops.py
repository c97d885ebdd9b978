"""Deliberately broken agent loops, each caught by the conformance kit.

These loops are the classic failure modes of a minimal agent loop, written the way
people write them. Each test runs ``run_conformance`` on one of them, asserts that
the search fails with the named property on a *shrunk* counterexample (a scenario
no bigger than the bug needs), and the last test shows ``run_agent`` passing the
same search. Together they show that every property test of the suite can fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from statemachine import AbortSignal, Message, Tool, ToolOutput, ToolResultMessage
from statemachine.engine import validate_arguments
from statemachine.messages import StopReason
from statemachine.testing import (
    AbortKind,
    ConformanceReport,
    OnAbort,
    Scenario,
    agent_loop,
    run_conformance,
)
from statemachine.testing.strategies import scenarios

# -- the broken loops ---------------------------------------------------------------------


def _result(call_id: str, name: str, value: Any, *, is_error: bool = False) -> ToolResultMessage:
    if isinstance(value, ToolOutput):
        return ToolResultMessage(call_id, name, value.content, is_error=value.is_error)
    return ToolResultMessage(call_id, name, value, is_error=is_error)


async def seed_run_agent(
    *,
    model: Any,
    tools: Sequence[Tool],
    messages: Sequence[Message],
    max_turns: int,
    signal: AbortSignal,
) -> list[Message]:
    """(a) A literal rendering of the classic teaching ``runAgent``: serial, the model
    is not given the signal, no argument validation, no abort handling, tool
    exceptions escape, and it throws at the turn limit."""
    history = list(messages)
    tools_by_name = {t.definition.name: t for t in tools}
    for _turn in range(max_turns):
        assistant = await model.complete(history, [t.definition for t in tools], AbortSignal())
        history.append(assistant)
        tool_calls = assistant.tool_calls
        if not tool_calls:
            return history
        for block in tool_calls:
            tool = tools_by_name.get(block.name)
            if tool is None:
                history.append(
                    _result(block.id, block.name, f"Unknown tool: {block.name}", is_error=True)
                )
                continue
            output = await tool.execute(block.arguments_dict(), signal)
            history.append(_result(block.id, block.name, output))
    raise RuntimeError(f"Agent exceeded {max_turns} turns")


async def _run_call(
    tools_by_name: dict[str, Tool], call: Any, signal: AbortSignal
) -> ToolResultMessage:
    """Every failure path converges on one error result (what (b)–(d) and (f) use)."""
    tool = tools_by_name.get(call.name)
    if tool is None:
        return _result(call.id, call.name, f"Unknown tool: {call.name}", is_error=True)
    problems = validate_arguments(tool.definition, call.arguments)
    if problems:
        return _result(call.id, call.name, "; ".join(problems), is_error=True)
    try:
        output = await tool.execute(call.arguments_dict(), signal)
    except Exception as exc:
        return _result(call.id, call.name, f"{type(exc).__name__}: {exc}", is_error=True)
    return _result(call.id, call.name, output)


async def text_only_loop(
    *,
    model: Any,
    tools: Sequence[Tool],
    messages: Sequence[Message],
    max_turns: int,
    signal: AbortSignal,
) -> list[Message]:
    """(b) Handles the assistant's text only: tool calls are never executed."""
    history = list(messages)
    history.append(await model.complete(history, [t.definition for t in tools], signal))
    return history


async def one_tool_round_loop(
    *,
    model: Any,
    tools: Sequence[Tool],
    messages: Sequence[Message],
    max_turns: int,
    signal: AbortSignal,
) -> list[Message]:
    """(c) Runs the tools once and stops: the results never go back to the model."""
    history = list(messages)
    by_name = {t.definition.name: t for t in tools}
    assistant = await model.complete(history, [t.definition for t in tools], signal)
    history.append(assistant)
    for call in assistant.tool_calls:
        history.append(await _run_call(by_name, call, signal))
    return history


async def stop_reason_loop(
    *,
    model: Any,
    tools: Sequence[Tool],
    messages: Sequence[Message],
    max_turns: int,
    signal: AbortSignal,
) -> list[Message]:
    """(d) Ends as soon as the stop reason is not ``toolUse``, dropping the calls of a
    ``stop`` (or ``length``) response that carries them."""
    history = list(messages)
    by_name = {t.definition.name: t for t in tools}
    for _turn in range(max_turns):
        if signal.aborted:
            break
        assistant = await model.complete(history, [t.definition for t in tools], signal)
        history.append(assistant)
        if assistant.stop_reason is not StopReason.TOOL_USE:
            break
        for call in assistant.tool_calls:
            history.append(await _run_call(by_name, call, signal))
    return history


async def escaping_exceptions_loop(
    *,
    model: Any,
    tools: Sequence[Tool],
    messages: Sequence[Message],
    max_turns: int,
    signal: AbortSignal,
) -> list[Message]:
    """(e) Validates and handles unknown tools, but lets a tool's exception escape."""
    history = list(messages)
    by_name = {t.definition.name: t for t in tools}
    for _turn in range(max_turns):
        assistant = await model.complete(history, [t.definition for t in tools], signal)
        history.append(assistant)
        if not assistant.tool_calls or assistant.stop_reason in (
            StopReason.ERROR,
            StopReason.ABORTED,
        ):
            for call in assistant.tool_calls:
                history.append(_result(call.id, call.name, "not run", is_error=True))
            return history
        for call in assistant.tool_calls:
            tool = by_name.get(call.name)
            if tool is None or validate_arguments(tool.definition, call.arguments):
                history.append(_result(call.id, call.name, "refused", is_error=True))
                continue
            history.append(
                _result(call.id, call.name, await tool.execute(call.arguments_dict(), signal))
            )
    return history


async def abort_drops_results_loop(
    *,
    model: Any,
    tools: Sequence[Tool],
    messages: Sequence[Message],
    max_turns: int,
    signal: AbortSignal,
) -> list[Message]:
    """(f) Returns the moment it sees the abort, leaving the rest of the batch
    without results."""
    history = list(messages)
    by_name = {t.definition.name: t for t in tools}
    for _turn in range(max_turns):
        if signal.aborted:
            return history
        assistant = await model.complete(history, [t.definition for t in tools], signal)
        history.append(assistant)
        if not assistant.tool_calls:
            return history
        for call in assistant.tool_calls:
            if signal.aborted:
                return history
            history.append(await _run_call(by_name, call, signal))
    return history


async def completion_order_loop(
    *,
    model: Any,
    tools: Sequence[Tool],
    messages: Sequence[Message],
    max_turns: int,
    signal: AbortSignal,
) -> list[Message]:
    """(g) Runs a batch in parallel and appends each result as it completes."""
    history = list(messages)
    by_name = {t.definition.name: t for t in tools}
    for _turn in range(max_turns):
        assistant = await model.complete(history, [t.definition for t in tools], signal)
        history.append(assistant)
        if not assistant.tool_calls:
            return history
        # Tasks started in call order, so the completion order (and this loop's
        # output) follows the tools' ticks, not the hashing of a set of coroutines.
        pending = [
            asyncio.ensure_future(_run_call(by_name, call, signal)) for call in assistant.tool_calls
        ]
        for finished in asyncio.as_completed(pending):
            history.append(await finished)
    return history


async def never_cancels_loop(
    *,
    model: Any,
    tools: Sequence[Tool],
    messages: Sequence[Message],
    max_turns: int,
    signal: AbortSignal,
) -> list[Message]:
    """(h) Runs each batch concurrently and, after an abort, waits for every started
    call to finish by itself: it never cancels one, so a tool that ignores the abort
    and hangs would hold the run forever."""
    history = list(messages)
    by_name = {t.definition.name: t for t in tools}
    for _turn in range(max_turns):
        if signal.aborted:
            return history
        assistant = await model.complete(history, [t.definition for t in tools], signal)
        history.append(assistant)
        if not assistant.tool_calls:
            return history
        batch = [_run_call(by_name, call, signal) for call in assistant.tool_calls]
        history.extend(await asyncio.gather(*batch))
    return history


# -- the tests ------------------------------------------------------------------------------


# Broken loops never cancel a hanging tool; a short safety net keeps them quick.
HANG_LIMIT = 0.03


def _calls(scenario: Scenario) -> int:
    return sum(len(turn.calls) for turn in scenario.turns)


# Most broken loops also pass the model's tool call ids through unchecked, so an empty
# or repeated id breaks I1 on them before anything else; the tests of their other
# defects use scenarios with unique ids (the id defect has its own test below).
UNIQUE_IDS = scenarios(odd_ids=False)


def _caught(
    loop: Any, prop: str, *, max_examples: int = 100, unique_ids: bool = False
) -> ConformanceReport:
    report = run_conformance(
        loop,
        properties=[prop],
        max_examples=max_examples,
        seed=20260,
        hang_limit=HANG_LIMIT,
        max_shrink_runs=150,
        scenarios=UNIQUE_IDS if unique_ids else None,
    )
    assert not report.passed, f"{prop} did not catch {loop.__name__}"
    assert report.failed_properties == (prop,)
    failure = report.failures[0]
    assert failure.problems
    assert failure.sentence.startswith(f"{prop} ")
    return report


def test_seed_teaching_loop_escapes_at_the_turn_limit() -> None:
    report = _caught(seed_run_agent, "I8")
    shrunk = report.failures[0].scenario
    # The smallest way to make it throw: one response that asks for work at the limit,
    # or one tool that raises.
    assert len(shrunk.turns) == 1
    assert _calls(shrunk) == 1
    assert "RuntimeError" in report.failures[0].sentence


def test_seed_teaching_loop_runs_calls_with_invalid_arguments() -> None:
    report = _caught(seed_run_agent, "I3")
    assert _calls(report.failures[0].scenario) == 1


def test_seed_teaching_loop_ignores_the_abort() -> None:
    report = _caught(seed_run_agent, "I6")
    shrunk = report.failures[0].scenario
    assert shrunk.abort.kind is not AbortKind.NEVER
    assert len(shrunk.turns) <= 1


def test_text_only_loop_leaves_calls_unanswered() -> None:
    report = _caught(text_only_loop, "I1")
    shrunk = report.failures[0].scenario
    assert len(shrunk.turns) == 1
    assert _calls(shrunk) == 1
    assert "has no result" in report.failures[0].sentence


def test_text_only_loop_stops_while_the_model_asks_for_work() -> None:
    report = _caught(text_only_loop, "I3")
    assert _calls(report.failures[0].scenario) == 1


def test_one_tool_round_loop_never_sends_results_back() -> None:
    report = _caught(one_tool_round_loop, "I3")
    shrunk = report.failures[0].scenario
    assert len(shrunk.turns) == 1
    assert _calls(shrunk) == 1
    assert "stopped after 1 model call" in report.failures[0].sentence


def test_stop_reason_loop_drops_calls_of_a_stop_response() -> None:
    report = _caught(stop_reason_loop, "I1", unique_ids=True)
    shrunk = report.failures[0].scenario
    assert _calls(shrunk) == 1
    assert shrunk.turns[-1].stop_reason is not StopReason.TOOL_USE


def test_escaping_exceptions_loop_crashes() -> None:
    report = _caught(escaping_exceptions_loop, "I8")
    shrunk = report.failures[0].scenario
    assert _calls(shrunk) == 1
    assert "ScriptedToolError" in report.failures[0].sentence


def test_abort_drops_results_loop_leaves_started_batches_unanswered() -> None:
    report = _caught(abort_drops_results_loop, "I1", unique_ids=True)
    shrunk = report.failures[0].scenario
    assert shrunk.abort.kind is not AbortKind.NEVER
    assert _calls(shrunk) == 1
    assert "has no result" in report.failures[0].sentence


def test_completion_order_loop_writes_results_out_of_call_order() -> None:
    report = _caught(completion_order_loop, "I2")
    shrunk = report.failures[0].scenario
    assert _calls(shrunk) == 2
    assert "comes before the result(s) of earlier call(s)" in report.failures[0].sentence


def test_never_cancels_loop_waits_for_a_hanging_tool() -> None:
    # A hang needs an abort that reaches a started call: rarer than most oddities.
    report = _caught(never_cancels_loop, "I6", unique_ids=True, max_examples=300)
    shrunk = report.failures[0].scenario
    assert "the loop never cancelled it" in report.failures[0].sentence
    # Shrunk to one hang the abort reaches: the model call it hits, or a started call.
    if shrunk.abort.kind is AbortKind.MODEL_CALL:
        assert _calls(shrunk) == 0
        assert shrunk.turns[shrunk.abort.turn - 1].on_abort is OnAbort.HANG
    else:
        assert shrunk.abort.kind is AbortKind.TOOL_START
        assert _calls(shrunk) == 1
        assert shrunk.turns[0].calls[0].behaviour.on_abort is OnAbort.HANG


@pytest.mark.parametrize("loop", [stop_reason_loop, abort_drops_results_loop])
def test_loops_that_pass_model_ids_through_fail_on_an_empty_or_repeated_id(loop: Any) -> None:
    report = _caught(loop, "I1")
    shrunk = report.failures[0].scenario
    assert shrunk.abort.kind is AbortKind.NEVER
    ids = [call.call_id for turn in shrunk.turns for call in turn.calls]
    # One call with an empty id or the input history's id, or two that share one.
    assert ids in ([""], ["prev_1"]) or (len(ids) == 2 and ids[0] == ids[1])
    assert _calls(shrunk) == len(ids)
    assert "empty id" in report.failures[0].sentence or "repeat" in report.failures[0].sentence


@pytest.mark.parametrize(
    "loop",
    [
        seed_run_agent,
        text_only_loop,
        one_tool_round_loop,
        stop_reason_loop,
        escaping_exceptions_loop,
        abort_drops_results_loop,
        completion_order_loop,
        never_cancels_loop,
    ],
)
def test_every_broken_loop_fails_the_full_suite(loop: Any) -> None:
    report = run_conformance(
        loop, max_examples=80, seed=7, hang_limit=HANG_LIMIT, max_shrink_runs=100
    )
    assert not report.passed
    assert report.shrink_runs > 0
    summary = report.summary()
    assert summary.startswith("FAILED")
    assert "scenario:" in summary


def test_run_agent_passes_the_same_search() -> None:
    report = run_conformance(agent_loop(), max_examples=150, seed=7)
    assert report.passed, report.summary()
    assert report.examples_run == 150
