"""Micro-benchmarks of our own pieces: the sans-IO engine alone, concurrent tools,
and the modules that other issues add (journal, conformance kit, model checker)
when they exist.

Each function returns a ``Figure``: a value, its unit, and how it was measured; a
piece that has not landed yet is reported as such, never guessed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import statistics
import time
from dataclasses import dataclass

from contenders import quiet_logger

import statemachine as sm

__all__ = ["Figure", "engine_transitions", "micro_figures", "parallel_tools"]


@dataclass(frozen=True)
class Figure:
    name: str
    value: str
    detail: str


def _engine_events(turns: int) -> list[sm.Event]:
    """The input events of a ``turns``-long run, built before the clock starts."""
    events: list[sm.Event] = [sm.Start()]
    for turn in range(turns - 1):
        call = sm.ToolCall(f"call_{turn}", "echo", {"text": f"ping {turn}"})
        events.append(sm.ModelResponded(sm.AssistantMessage((call,), stop_reason="toolUse")))
        events.append(sm.ToolFinished(call.id, sm.ToolOutput(f"ping {turn}")))
    events.append(sm.ModelResponded(sm.AssistantMessage("done")))
    return events


def engine_transitions(turns: int, repetitions: int) -> tuple[Figure, int]:
    """Drive ``statemachine.Engine`` directly; transitions per second (median run)."""
    definition = sm.ToolDefinition(
        "echo",
        "Return the text it is given.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    )
    rates: list[float] = []
    transitions = 0
    for _ in range(repetitions):
        events = _engine_events(turns)
        engine = sm.Engine(
            tools=[definition],
            messages=[sm.UserMessage("go")],
            max_turns=turns,
            logger=quiet_logger(),
        )
        start = time.perf_counter_ns()
        for event in events:
            engine.handle(event)
        elapsed = time.perf_counter_ns() - start
        if engine.state is not sm.TurnState.Done:
            raise RuntimeError(f"engine run ended {engine.state.value}: {engine.explanation}")
        transitions = len(engine.trace)
        rates.append(transitions / (elapsed / 1e9))
    rate = statistics.median(rates)
    per_turn_us = 1e6 * transitions / rate / turns
    return (
        Figure(
            "sans-IO engine transitions/s",
            f"{rate:,.0f}",
            f"Engine.handle on a {turns}-turn run ({transitions} transitions, "
            f"{len(events)} input events, {per_turn_us:.0f} µs per turn), median of "
            f"{repetitions}",
        ),
        transitions,
    )


async def parallel_tools(count: int, seconds: float, repetitions: int) -> Figure:
    """``count`` tools that each sleep ``seconds``, asked for in one turn: batch wall time."""

    @sm.tool(name="nap", description="Sleep, then say so.")
    async def nap() -> str:
        await asyncio.sleep(seconds)
        return "rested"

    stamps: list[int] = []

    class TwoTurns:
        async def complete(
            self, messages: object, tools: object, signal: object
        ) -> sm.AssistantMessage:
            stamps.append(time.perf_counter_ns())
            if len(stamps) % 2 == 1:
                calls = tuple(sm.ToolCall(f"nap_{i}", "nap", {}) for i in range(count))
                return sm.AssistantMessage(calls, stop_reason="toolUse")
            return sm.AssistantMessage("done")

    batches: list[float] = []
    for _ in range(repetitions):
        stamps.clear()
        result = await sm.run_agent(
            model=TwoTurns(),
            messages=[sm.UserMessage("nap")],
            tools=[nap],
            logger=quiet_logger(),
        )
        results = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
        if not result.ok or len(results) != count or any(r.is_error for r in results):
            raise RuntimeError(f"parallel tools run failed: {result.state.value}")
        batches.append((stamps[1] - stamps[0]) / 1e6)
    return Figure(
        f"{count} tools × {seconds * 1000:.0f} ms sleep in one turn",
        f"{statistics.median(batches):.1f} ms",
        f"batch wall time, model call to model call (min {min(batches):.1f}, max "
        f"{max(batches):.1f}, {repetitions} runs; target < 150 ms, issue 5)",
    )


def _not_landed(module: str, what: str) -> Figure | None:
    if importlib.util.find_spec(module) is None:
        return Figure(what, "not landed", f"{module} does not exist yet in this tree")
    return None


def pending_figures() -> list[Figure]:
    """The figures of modules other issues add; measured here once they exist."""
    figures: list[Figure] = []
    for module, what in (
        ("statemachine._journal", "journal append / replay events/s"),
        ("statemachine.testing", "run_conformance runs/s"),
        ("statemachine._checker", "default exhaustive check"),
    ):
        missing = _not_landed(module, what)
        if missing is not None:
            figures.append(missing)
        else:
            figures.append(
                Figure(what, "not measured", f"{module} landed after this harness was written")
            )
    return figures


async def micro_figures(smoke: bool) -> list[Figure]:
    turns, reps = (10, 1) if smoke else (10_000, 5)
    figures = [engine_transitions(turns, reps)[0]]
    figures.append(await parallel_tools(10, 0.01 if smoke else 0.1, 1 if smoke else 5))
    figures.extend(pending_figures())
    return figures
