"""What a durable run costs per turn: against the same run in memory, and against a
bare DBOS workflow with the same steps.

    python bench/durable.py [--turns 60] [--reps 7] [--postgres URL] [--smoke]

Four contenders run the same N-turn run (each turn one model call and one tool
call; then the answer), interleaved (their order rotates from one repetition to the
next, so a slow spell of the shared machine hits them alike):

- **in memory**: ``run_agent`` with a scripted model and an echo tool;
- **durable**: the same model and tool in a ``DBOSRunner`` run;
- **bare DBOS**: a DBOS workflow of its own doing the same number of steps, each a
  no-op (a model step and a tool step per turn, then a model step): what DBOS costs
  with nothing of ours in it;
- **bare DBOS + listener**: the same workflow with one waiting ``recv`` for the whole
  run, as the durable run's control lane keeps (what listening for messages costs).

Time per run: for the in-memory run its wall time; for the two workflows the span
from the start of their first recorded operation to the end of their last one (DBOS
stamps each to the millisecond), which leaves out how a caller waits for the result
(a handle polls). The ratios are taken per repetition (durable / bare of the same
repetition) and the median reported. Saved operations are the rows DBOS keeps for the
workflow in its ``operation_outputs`` table (``list_workflow_steps``), per turn.

SQLite is the runner's default store, as a user gets it: ``DBOSRunner`` puts the
file in WAL mode before DBOS opens it (the table names the mode the file was in).
Each workflow is also timed as a caller sees it, from ``start()`` to ``result()``
through the public handle (for the bare workflow, DBOS's own handle).

PostgreSQL runs when ``--postgres URL`` (a database URL) is given,
or when ``STATEMACHINE_TEST_POSTGRES`` names a server (``bash .ci/postgres.sh``): a
fresh database is then made on it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSClient, StepOptions

import statemachine as sm
from statemachine.core.tools import ToolDefinition
from statemachine.durable._dbos_control import WAIT_SECONDS, start_now
from statemachine.durable.dbos import DBOSRunner
from statemachine.testing import FunctionModel

LISTENING = "bare DBOS + listener"
CONTENDERS = ("in memory", "durable", "bare DBOS", LISTENING)
BARE = "bench.bare"


@sm.tool
async def echo(text: str) -> str:
    """Say it back.

    Args:
        text: what to say
    """
    return text


def _model(turns: int) -> FunctionModel:
    """Keyed by the history: a tool call per turn for ``turns - 1`` turns, then text."""

    def answer(messages: Sequence[sm.Message], _: Sequence[ToolDefinition]) -> sm.AssistantMessage:
        turn = 1 + sum(isinstance(m, sm.AssistantMessage) for m in messages)
        if turn >= turns:
            return sm.AssistantMessage("done")
        return sm.AssistantMessage([sm.ToolCall(f"c{turn}", "echo", {"text": str(turn)})])

    return FunctionModel(answer)


async def _noop() -> list[Any]:
    return []


async def _bare(turns: int, listen: bool) -> int:
    """The bare workflow: the durable run's steps, each doing nothing; with ``listen``,
    also one waiting ``recv`` for the whole run, as the runner's control lane keeps
    (``_dbos_control``: started at the workflow's start, ended with it)."""
    listener = start_now(DBOS.recv_async("bench", timeout_seconds=WAIT_SECONDS)) if listen else None
    try:
        for turn in range(1, turns + 1):
            await DBOS.run_step_async(StepOptions(name="model"), _noop)
            if turn < turns:
                await DBOS.run_step_async(StepOptions(name="tool"), _noop)
    finally:
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
    return turns


@dataclass
class Sample:
    """One backend's measurements: seconds per run and saved operations per run."""

    seconds: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CONTENDERS})
    operations: dict[str, list[int]] = field(default_factory=lambda: {c: [] for c in CONTENDERS})
    kinds: dict[str, list[float]] = field(default_factory=dict)  # durable: ms per operation
    wall: dict[str, list[float]] = field(default_factory=dict)  # start() to result(), s


_kinds: dict[str, list[float]] = {}  # filled by _span for the durable run being measured


async def _span(client: DBOSClient, workflow_id: str) -> tuple[float, int]:
    """Seconds from the first recorded operation's start to the last one's end, and
    how many operations the workflow saved."""
    steps = await client.list_workflow_steps_async(workflow_id)
    stamps = [(s["started_at_epoch_ms"] or 0, s["completed_at_epoch_ms"] or 0) for s in steps]
    for step, (began, ended) in zip(steps, stamps, strict=True):
        _kinds.setdefault(step["function_name"], []).append(float(ended - began))
    start = min(began for began, _ in stamps)
    end = max(ended for _, ended in stamps)
    return (end - start) / 1000, len(steps)


async def _in_memory(turns: int) -> tuple[float, int]:
    began = time.perf_counter()
    result = await sm.run_agent(
        model=_model(turns), tools=[echo], messages=[sm.UserMessage("go")], max_turns=turns
    )
    assert result.ok, result
    assert result.turns == turns, result
    return time.perf_counter() - began, 0


_walls: list[float] = []  # start() to result() of the workflow just measured


async def _durable(runner: DBOSRunner, run_id: str, turns: int) -> tuple[float, int]:
    began = time.perf_counter()
    handle = await runner.start(run_id, model="bench", messages="go", max_turns=turns)
    result = await handle.result(timeout=600)
    _walls.append(time.perf_counter() - began)
    assert result.ok, result
    assert result.turns == turns, result
    return await _span(runner._require_client(), run_id)


async def _bare_run(
    runner: DBOSRunner, run_id: str, turns: int, listen: bool = False
) -> tuple[float, int]:
    from dbos import SetWorkflowID

    began = time.perf_counter()
    with SetWorkflowID(run_id):
        handle = await DBOS.start_workflow_async(_bare, turns, listen)
    assert await handle.get_result() == turns
    _walls.append(time.perf_counter() - began)
    return await _span(runner._require_client(), run_id)


async def _repetition(runner: DBOSRunner, label: str, rep: int, turns: int, sample: Sample) -> None:
    """One run of each contender, in an order that rotates with ``rep``."""
    runs: dict[str, Callable[[], Awaitable[tuple[float, int]]]] = {
        "in memory": partial(_in_memory, turns),
        "durable": partial(_durable, runner, f"{label}-durable-{rep}", turns),
        "bare DBOS": partial(_bare_run, runner, f"{label}-bare-{rep}", turns),
        LISTENING: partial(_bare_run, runner, f"{label}-listen-{rep}", turns, True),
    }
    turn = rep % len(CONTENDERS)
    for name in CONTENDERS[turn:] + CONTENDERS[:turn]:
        _kinds.clear()
        _walls.clear()
        seconds, operations = await runs[name]()
        sample.wall.setdefault(name, []).extend(_walls)
        sample.seconds[name].append(seconds)
        sample.operations[name].append(operations)
        for kind, took in _kinds.items() if name == "durable" else ():
            sample.kinds.setdefault(kind, []).extend(took)


async def _measure(url: str, label: str, turns: int, reps: int) -> Sample:
    DBOS.workflow(name=BARE)(_bare)
    runner = DBOSRunner(models={"bench": _model(turns)}, tools=[echo], database_url=url)
    runner.launch()
    sample = Sample()
    try:
        await _durable(runner, f"warm-{label}", turns)  # first-use costs out of the way
        await _bare_run(runner, f"warm-bare-{label}", turns)
        for rep in range(reps):
            await _repetition(runner, label, rep, turns, sample)
    finally:
        runner.destroy()
    return sample


def _journal_mode(url: str) -> str:
    """The journal mode the SQLite file at ``url`` is in."""
    connection = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return str(connection.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        connection.close()


def _postgres_url(given: str | None) -> str | None:
    import os

    if given:
        return given
    server = os.environ.get("STATEMACHINE_TEST_POSTGRES")
    if not server:
        return None
    import psycopg

    name = f"sm_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server.replace("+psycopg", "") + "/postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


def _rows(label: str, sample: Sample, turns: int) -> list[str]:
    memory = statistics.median(sample.seconds["in memory"])
    bare = statistics.median(sample.seconds["bare DBOS"])
    rows = []
    for name in CONTENDERS:
        times = sample.seconds[name]
        ms = [1000 * t / turns for t in times]
        ops = statistics.median(sample.operations[name]) / turns if name != "in memory" else 0
        vs_bare = (
            _paired(sample, "bare DBOS") if name == "durable" else statistics.median(times) / bare
        )
        per_op = statistics.median(ms) / ops if ops else 0.0
        rows.append(
            f"| {label} | {name} | {statistics.median(ms):.2f} ({min(ms):.2f}–{max(ms):.2f}) | "
            f"{statistics.median(times) / memory:.1f} | {vs_bare:.2f} | "
            + ("— | — |" if name == "in memory" else f"{ops:.2f} | {per_op:.2f} |")
        )
    return rows


def _paired(sample: Sample, over: str) -> float:
    """The median of the durable run's per-repetition ratios to ``over``."""
    pairs = zip(sample.seconds["durable"], sample.seconds[over], strict=True)
    return statistics.median(d / o for d, o in pairs)


def _table(results: dict[str, Sample], turns: int, reps: int) -> str:
    lines = [
        f"{turns} turns per run (a model call and a tool call per turn, then the answer), "
        f"{reps} repetitions interleaved; ms/turn median (min–max); × bare DBOS for the "
        "durable run is the median of per-repetition ratios.",
        "",
        "| backend | contender | ms/turn | × in memory | × bare DBOS | saved ops/turn "
        "| ms/saved op |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, sample in results.items():
        lines += _rows(label, sample, turns)
    lines += ["", "Durable against a bare workflow listening as the runner does, per backend:", ""]
    for label, sample in results.items():
        lines.append(f"- {label}: durable / ({LISTENING}) = {_paired(sample, LISTENING):.2f}")
    lines += ["", "Saved operations of a durable run beyond one per model call and tool call:", ""]
    calls = 2 * turns - 1
    for label, sample in results.items():
        extra = statistics.median(sample.operations["durable"]) - calls
        lines.append(f"- {label}: {calls} calls, {extra:g} more")
    lines += ["", "From start() to result() through the public handle, ms/turn (median):", ""]
    for label, sample in results.items():
        durable, bare = sample.wall.get("durable", []), sample.wall.get("bare DBOS", [])
        ratio = statistics.median(d / b for d, b in zip(durable, bare, strict=True))
        lines.append(
            f"- {label}: durable {1000 * statistics.median(durable) / turns:.2f}, bare DBOS "
            f"{1000 * statistics.median(bare) / turns:.2f}; durable / bare = {ratio:.2f}"
        )
    lines += ["", "The durable run's operations, ms each (median, as DBOS stamps them):", ""]
    for label, sample in results.items():
        runs = max(1, len(sample.seconds["durable"]))
        kinds = ", ".join(
            f"{kind} {statistics.median(took):.1f} (×{len(took) // runs} a run)"
            for kind, took in sorted(sample.kinds.items())
        )
        lines.append(f"- {label}: {kinds}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=60, help="turns per run (60)")
    parser.add_argument("--reps", type=int, default=7, help="repetitions (7)")
    parser.add_argument("--postgres", help="a PostgreSQL database URL (postgresql+psycopg://)")
    parser.add_argument("--smoke", action="store_true", help="3 turns, 1 repetition, SQLite")
    args = parser.parse_args(argv)
    turns, reps = (3, 1) if args.smoke else (args.turns, args.reps)
    if turns < 2 or reps < 1:
        parser.error("--turns must be at least 2 and --reps at least 1")
    results: dict[str, Sample] = {}
    with tempfile.TemporaryDirectory(prefix="statemachine-bench-") as directory:
        url = f"sqlite:///{Path(directory, 'bench.sqlite')}"  # the runner's default store
        sample = asyncio.run(_measure(url, "sqlite", turns, reps))
        results[f"SQLite (default: {_journal_mode(url)})"] = sample
    postgres = None if args.smoke else _postgres_url(args.postgres)
    if postgres:
        results["PostgreSQL"] = asyncio.run(_measure(postgres, "pg", turns, reps))
    print(_table(results, turns, reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
