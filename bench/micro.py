"""Micro-benchmarks of our own pieces: the sans-IO engine alone, concurrent tools,
and the modules that other issues add (journal, conformance kit, model checker)
when they exist.

Each function returns a ``Figure``: a value, its unit, and how it was measured; a
piece that has not landed yet is reported as such, never guessed.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contenders import quiet_logger

import statemachine as sm
import statemachine.engine

__all__ = [
    "Figure",
    "engine_transitions",
    "micro_figures",
    "parallel_tools",
    "steer_flood",
    "tool_shapes",
]


@dataclass(frozen=True)
class Figure:
    name: str
    value: str
    detail: str


def _engine_events(turns: int) -> list[sm.engine.Event]:
    """The engine events of a ``turns``-long run, built before the clock starts."""
    events: list[sm.engine.Event] = [sm.engine.Start()]
    for turn in range(turns - 1):
        call = sm.ToolCall(f"call_{turn}", "echo", {"text": f"ping {turn}"})
        events.append(sm.engine.ModelResponded(sm.AssistantMessage((call,), stop_reason="toolUse")))
        events.append(sm.engine.ToolFinished(call.id, sm.ToolOutput(f"ping {turn}")))
    events.append(sm.engine.ModelResponded(sm.AssistantMessage("done")))
    return events


def engine_transitions(turns: int, repetitions: int) -> tuple[Figure, int]:
    """Drive ``statemachine.Engine`` directly; transitions per second (median run)."""
    rates: list[float] = []
    transitions = 0
    for _ in range(repetitions):
        events = _engine_events(turns)
        engine = _echo_engine(turns)
        start = time.perf_counter_ns()
        for event in events:
            engine.handle(event)
        elapsed = time.perf_counter_ns() - start
        if engine.state is not sm.TurnState.DONE:
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
            f"{len(events)} engine events, {per_turn_us:.0f} µs per turn), median of "
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
        f"{max(batches):.1f}, {repetitions} runs; target < 150 ms)",
    )


def _echo_engine(
    turns: int, cls: type[sm.engine.Engine] = sm.engine.Engine, **kwargs: Any
) -> sm.engine.Engine:
    """An engine for ``_engine_events(turns)``: the echo tool, a quiet logger."""
    return cls(
        tools=[_echo_definition()],
        messages=[sm.UserMessage("go")],
        max_turns=turns,
        logger=quiet_logger(),
        **kwargs,
    )


def _echo_definition() -> sm.ToolDefinition:
    return sm.ToolDefinition(
        "echo",
        "Return the text it is given.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    )


def journal_figures(turns: int, repetitions: int) -> list[Figure]:
    """Journal append (``Journal.record`` alone, default flush per event, to a file in a
    temporary directory) and ``replay`` (parse, rebuild the engine, re-handle every
    event, verify every state and the checkpoint) of a ``turns``-long run."""
    from statemachine.journal import Journal, replay
    from statemachine.journal._format import JournalHeader

    events = _engine_events(turns)
    plain = _echo_engine(turns)
    states = []
    for event in events:  # the states the journal records, computed before the clock
        plain.handle(event)
        states.append(plain.state)
    header = JournalHeader.of(plain, (sm.UserMessage("go"),))
    append_rates: list[float] = []
    replay_rates: list[float] = []
    stepped_rates: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repetitions):
            with Journal(Path(tmp) / f"append-{rep}.jsonl") as journal:
                journal.begin(header)
                start = time.perf_counter_ns()
                for event, state in zip(events, states, strict=True):
                    journal.record(event, state)
                append_rates.append(len(events) / ((time.perf_counter_ns() - start) / 1e9))
            path = Path(tmp) / f"run-{rep}.jsonl"
            _write_journal(path, turns, events)
            # Each replay starts from a collected heap that holds no earlier replay: a
            # process replaying one journal does not keep the last five runs alive, and
            # every full collection inside the replay would walk them too.
            gc.collect()
            start = time.perf_counter_ns()
            result = replay(path, logger=quiet_logger())
            elapsed = (time.perf_counter_ns() - start) / 1e9
            if not result.ok or result.state is not sm.TurnState.DONE:
                raise RuntimeError(f"replay failed: {result.error}")
            replay_rates.append(len(result.steps) / elapsed)
            del result
            # The same with every step read (its record per event made on first read).
            gc.collect()
            start = time.perf_counter_ns()
            stepped = replay(path, logger=quiet_logger())
            count = sum(len(step.transitions) > 0 for step in stepped.steps)
            stepped_rates.append(len(events) / ((time.perf_counter_ns() - start) / 1e9))
            del stepped
            if count != len(events):
                raise RuntimeError("a replayed event without its transitions")
        floor = _replay_floor(path, events, turns, repetitions)
    how = f"{len(events)} events of a {turns}-turn run, median of {repetitions}"
    replay_rate = statistics.median(replay_rates)
    return [
        Figure(
            "journal append events/s",
            f"{statistics.median(append_rates):,.0f}",
            f"Journal.record to a file, flushed per event (the default); {how}",
        ),
        Figure(
            "journal replay events/s",
            f"{replay_rate:,.0f}",
            f"replay(path): read, re-handle and verify each event and the checkpoint "
            f"digest; {how} (target ≥ 50,000)",
        ),
        Figure(
            "journal replay, every step read, events/s",
            f"{statistics.median(stepped_rates):,.0f}",
            f"replay(path), then each step of ReplayResult.steps (made when first read); {how}",
        ),
        _replay_own_figure(replay_rate, floor[-1][1], how),  # the ceiling: the engine alone
        *(
            Figure(
                name,
                f"{rate:,.0f}",
                f"{what}; replay runs at {replay_rate / rate:.2f}x this rate (same run)",
            )
            for name, rate, what in floor
        ),
    ]


def _write_journal(path: Path, turns: int, events: list[Any]) -> None:
    """The journal of a ``turns``-long run handed ``events``; its engine is dropped."""
    from statemachine.journal import Journal, JournalingEngine

    with Journal(path) as journal:
        engine = _echo_engine(turns, JournalingEngine, journal=journal)
        for event in events:
            engine.handle(event)


def _replay_own_figure(replay_rate: float, ceiling: float, how: str) -> Figure:
    return Figure(
        "replay's own µs/event",
        f"{1e6 / replay_rate - 1e6 / ceiling:.1f}",
        f"replay's time an event minus Engine.handle's on the same events; {how} (target ≤ 4)",
    )


def _replay_floor(
    path: Path, events: list[sm.engine.Event], turns: int, repetitions: int
) -> list[tuple[str, float, str]]:
    """What replay cannot avoid, measured alone on the same journal: reading each line
    with orjson (as replay does), building each event from its parsed dict on replay's
    fast path, and the engine's step on the built events (the ceiling: replay re-handles
    every event). Replay's rate against these says how much is overhead and how much
    is the floor."""
    import orjson

    from statemachine.journal._fast import FAST_EVENTS

    lines = path.read_bytes().splitlines()[1:]
    event_lines = [line for line in lines if b'"checkpoint"' not in line[:16]]
    parse, build, step = [], [], []
    for _ in range(repetitions):
        start = time.perf_counter_ns()
        parsed = [orjson.loads(line) for line in lines]
        parse.append(len(event_lines) / ((time.perf_counter_ns() - start) / 1e9))
        del parsed
        # The fast builders wrap the parsed arguments in place: parse afresh each time.
        event_dicts = [orjson.loads(line)["event"] for line in event_lines]
        start = time.perf_counter_ns()
        built = [FAST_EVENTS[d["type"]](d) for d in event_dicts]
        build.append(len(built) / ((time.perf_counter_ns() - start) / 1e9))
        if built != events:
            raise RuntimeError("the fast decoder built other events than the run's")
        engine = _echo_engine(turns)
        start = time.perf_counter_ns()
        for event in events:
            engine.handle(event)
        step.append(len(events) / ((time.perf_counter_ns() - start) / 1e9))
    return [
        (
            "replay floor: orjson.loads lines/s",
            statistics.median(parse),
            "orjson.loads of every line",
        ),
        (
            "replay floor: fast event build events/s",
            statistics.median(build),
            "building each validated event from its parsed dict (replay's fast path)",
        ),
        (
            "replay ceiling: Engine.handle events/s",
            statistics.median(step),
            "Engine.handle on the same events, already built (the engine alone)",
        ),
    ]


def checker_figure(smoke: bool) -> Figure:
    """The exhaustive check with its default bounds (the CLI's ``check``)."""
    from statemachine.testing.checker import Bounds, check_engine

    bounds = Bounds(turns=1, calls=1) if smoke else Bounds()
    report = check_engine(bounds)
    # The time is the figure; a failing check is the checker's news, reported as such.
    verdict = (
        "ok"
        if report.ok
        else f"NOT ok: {len(report.violations)} violations, {len(report.dead_ends)} dead "
        f"ends, {len(report.rows_missed)} table rows not taken"
    )
    return Figure(
        "exhaustive check" + (" (smoke bounds)" if smoke else ", default bounds"),
        f"{report.seconds:.1f} s",
        f"check_engine(): {report.states:,} states, {report.transitions:,} transitions, "
        f"{report.refusals:,} refusals [turns={bounds.turns}, calls={bounds.calls}], "
        f"{verdict} (target < 60 s)",
    )


def _landed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _guarded(what: str, module: str, measure: Callable[[], list[Figure]]) -> list[Figure]:
    """Measure a module that another issue adds, or say why it cannot be measured."""
    if not _landed(module):
        return [Figure(what, "not landed", f"{module} does not exist yet in this tree")]
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - one figure must not cost the whole run
        # The tree is shared and edited live: a half-landed change is reported, not fatal.
        return [Figure(what, "failed", f"{module}: {type(exc).__name__}: {exc}")]


def conformance_figure(smoke: bool) -> list[Figure]:
    """``run_conformance`` on our loop over the default scenario set: generated runs/s.

    Called in a worker thread: every scenario runs in its own event loop.
    """
    testing = importlib.import_module("statemachine.testing")
    examples = 5 if smoke else 300
    loop = testing.agent_loop(logger=quiet_logger())
    # Warm up (the strategies are built and cached on first use): the rate asked for is
    # the search's, not the first call's set-up.
    testing.run_conformance(loop, max_examples=16, seed=1)
    start = time.perf_counter()
    report = testing.run_conformance(loop, max_examples=examples, seed=0)
    elapsed = time.perf_counter() - start
    runs = report.examples_run + report.shrink_runs
    verdict = "passed" if report.passed else "FAILED " + ", ".join(report.failed_properties)
    return [
        Figure(
            "run_conformance runs/s",
            f"{runs / elapsed:,.0f}",
            f"{runs} generated scenarios on run_agent (agent_loop()), default scenario "
            f"set, seed 0, {verdict}, {elapsed:.2f} s after a 16-scenario warm-up; each "
            "scenario runs the loop twice (I5) (target ≥ 500/s)",
        )
    ]


async def _flood(count: int) -> float:
    """Seconds from the first of ``count`` steers, queued while the model waits, to the
    end of the run that takes them all (checked: every one, in order)."""
    release = asyncio.Event()

    class Waits:
        async def complete(
            self, messages: Sequence[sm.Message], tools: object, signal: object
        ) -> sm.AssistantMessage:
            if len(messages) == 1:
                await release.wait()
                return sm.AssistantMessage("first")
            return sm.AssistantMessage("done")

    run = sm.AgentRun(model=Waits(), messages="go", max_turns=3, logger=quiet_logger())
    task = asyncio.ensure_future(run.run())
    await asyncio.sleep(0)
    started = time.perf_counter()
    for i in range(count):
        run.steer(f"steer {i}")
    release.set()
    result = await task
    seconds = time.perf_counter() - started
    texts = [sm.UserMessage(f"steer {i}") for i in range(count)]
    taken = [m for m in result.messages if isinstance(m, sm.UserMessage)][1:]
    if not result.ok or taken != texts:
        raise RuntimeError(f"the steer flood run lost or reordered input: {result.state.value}")
    return seconds


async def steer_flood(small: int, large: int) -> Figure:
    """A flood of steers into one run: the cost per steer at two sizes and its growth
    (1.0 is linear; a cost quadratic in the number queued shows as large / small)."""
    per_small = await _flood(small) / small
    per_large = await _flood(large) / large
    return Figure(
        f"steer flood, {small:,} → {large:,} steers queued while the model waits",
        f"{per_large * 1e6:.1f} µs a steer",
        f"{per_small * 1e6:.1f} µs a steer at {small:,}; growth {per_large / per_small:.2f} "
        f"(target ≤ 1.5: linear; quadratic would be about {large / small:.0f})",
    )


async def _per_turn(tool: sm.Tool, turns: int) -> float:
    """Seconds a turn of a ``turns``-turn run whose every turn calls ``tool`` once, by a
    scripted model that answers at once (checked: ``Done``, every call answered with its
    text)."""
    asked = 0

    class Calls:
        async def complete(
            self, messages: Sequence[sm.Message], tools: object, signal: object
        ) -> sm.AssistantMessage:
            nonlocal asked
            asked += 1
            if asked <= turns:
                call = sm.ToolCall(f"call_{asked}", "echo", {"text": f"ping {asked}"})
                return sm.AssistantMessage((call,), stop_reason="toolUse")
            return sm.AssistantMessage("done")

    started = time.perf_counter()
    result = await sm.run_agent(
        model=Calls(), tools=[tool], messages="go", max_turns=turns + 1, logger=quiet_logger()
    )
    seconds = time.perf_counter() - started
    answers = [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    if result.state is not sm.TurnState.DONE or answers != [f"ping {i + 1}" for i in range(turns)]:
        raise RuntimeError(f"tool-shape run ended {result.state.value}: {result.explanation}")
    return seconds / turns


def _tool_shapes() -> dict[str, sm.Tool]:
    """The shapes of tool users write, each the same echo."""

    @sm.tool(name="echo")
    async def echo_async(text: str) -> str:
        """Return the text it is given."""
        return text

    @sm.tool(name="echo")
    def echo_sync(text: str) -> str:
        """Return the text it is given."""
        return text

    async def execute(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
        return str(arguments["text"])

    return {
        "async @tool": echo_async,
        "Tool(definition, execute(arguments, signal))": sm.Tool(_echo_definition(), execute),
        "sync @tool (a worker thread a call)": echo_sync,
    }


async def tool_shapes(turns: int, repetitions: int) -> list[Figure]:
    """Wall time per turn (one call a turn) for each shape of tool, against the async
    ``@tool`` in the same run; and ``asyncio.to_thread`` alone, the price a sync tool
    pays on top of an async one (the library runs a sync tool in a worker thread, since
    it cannot know that the function will not block the loop)."""
    shapes = _tool_shapes()
    times: dict[str, list[float]] = {name: [] for name in shapes}
    threads: list[float] = []
    for _ in range(repetitions):  # interleaved, so drift on a noisy machine hits all alike
        for name, tool in shapes.items():
            times[name].append(await _per_turn(tool, turns))
        started = time.perf_counter()
        for _ in range(turns):
            await asyncio.to_thread(str, "ping")
        threads.append((time.perf_counter() - started) / turns)
    base = statistics.median(times["async @tool"])
    figures = [
        Figure(
            f"tool shape: {name}",
            f"{statistics.median(values) * 1e6:.0f} µs a turn",
            f"{statistics.median(values) / base:.2f}x the async @tool; {turns:,} turns of one "
            f"call, median of {repetitions}",
        )
        for name, values in times.items()
    ]
    figures.append(
        Figure(
            "asyncio.to_thread alone",
            f"{statistics.median(threads) * 1e6:.0f} µs a call",
            "a sync tool's extra cost is about this: the hand-off to a worker thread and back",
        )
    )
    return figures


async def micro_figures(smoke: bool) -> list[Figure]:
    turns, reps = (10, 1) if smoke else (10_000, 5)
    figures = [engine_transitions(turns, reps)[0]]
    figures.append(await parallel_tools(10, 0.01 if smoke else 0.1, 1 if smoke else 5))
    figures.append(await (steer_flood(100, 1_000) if smoke else steer_flood(10_000, 100_000)))
    figures += await (tool_shapes(10, 1) if smoke else tool_shapes(1_000, 5))
    figures += _guarded(
        "journal append / replay events/s",
        "statemachine.journal._replay",
        lambda: journal_figures(turns, reps),
    )
    figures += await asyncio.to_thread(
        _guarded,
        "run_conformance runs/s",
        "statemachine.testing",
        lambda: conformance_figure(smoke),
    )
    figures += _guarded(
        "exhaustive check", "statemachine.testing.checker", lambda: [checker_figure(smoke)]
    )
    return figures


def main() -> None:
    """``micro.py OUT.json [--smoke]``: write the micro figures as JSON to OUT.json (the
    harness runs this in a fresh interpreter; stdout carries the logs of the runs)."""
    import json
    import sys
    from dataclasses import asdict

    out, *flags = sys.argv[1:]
    figures = asyncio.run(micro_figures("--smoke" in flags))
    Path(out).write_text(json.dumps([asdict(f) for f in figures]), encoding="utf-8")


if __name__ == "__main__":
    main()
