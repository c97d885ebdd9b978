"""Durable throughput: many durable runs at once over two worker processes.

    python bench/durable_scale.py [--runs 50 100 200] [--workers 2] [--postgres URL]
    bash bench/run.sh durable-scale          (writes bench/durable_scale.md)

Each run is 5 model calls of a fake model that answers after 50 ms (``asyncio.sleep``),
with one ``echo`` tool call per turn but the last. N runs are put on the queue ``jobs``
at once (by the first worker, through ``DBOSRunner.enqueue``); the workers are
``DBOSRunner`` processes launched with ``queues={"jobs": k}``, k = N / workers, so
that all N run together, spread over the workers. The same N runs are then done by a
**bare DBOS workflow** with the same steps (a model step that waits 50 ms and a tool
step per turn, then a model step), on the same queue, with nothing of ours in it.

Each (backend, contender, N) is a fresh database and fresh worker processes.
Reported per cell:

- wall time from the enqueueing to the last run's end (DBOS's own stamp), and
  durable turns per second (N * 5 / wall);
- step latency p50 / p99, model steps and tool steps apart: each step's duration as
  DBOS stamps it (start to end, ms; a model step includes its 50 ms wait, a tool step
  does nothing but echo);
- turn latency p99: from one model call to the next in a run (the workers' clocks;
  the ideal is 50 ms, the model's wait);
- database statements per turn: every statement the workers sent through SQLAlchemy
  (DBOS's engine and the runner's client: reads, writes, queue and notification
  polls) from the enqueueing to the last run's end, divided by the turns;
- the most runs seen running at once in one worker: by the fake model (a run counts
  from its first model call to its last answer) and by DBOS (runs PENDING on that
  executor, polled every 0.2 s), against the queue's limit k;
- how the runs were split between the workers.

A queue check follows on each backend: the largest N with a limit k well below N /
workers; the most runs seen at once in a worker must not exceed k, or the benchmark
fails. Every run is checked: the durable runs' results must be ``Done`` after 5 turns
with every tool result in place (the fake model checks the history it is given), the
bare workflows must return their turn count; anything else fails the benchmark.

PostgreSQL runs when ``--postgres URL`` is given or ``STATEMACHINE_TEST_POSTGRES``
names a server (``bash .ci/postgres.sh bash bench/run.sh durable-scale``); a fresh
database is made on it per cell. SQLite is the runner's default store, a file in WAL
mode shared by the worker processes.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TURNS = 5
LATENCY_S = 0.05
QUEUE = "jobs"
BARE = "bench.scale.bare"
APP_VERSION = "bench-durable-scale"
SIZES = (50, 100, 200)
QUEUE_LIMIT = 10
BUDGET_S = 300.0
POLL_S = 0.2

# -- in a worker process ---------------------------------------------------------------------


@dataclass
class Tracker:
    """What a worker sees: model calls per run, runs in progress, statements sent."""

    calls: dict[str, list[float]] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    most_running: int = 0
    statements: list[tuple[float, str]] = field(default_factory=list)

    def model_call(self, run: str, turn: int) -> None:
        self.calls.setdefault(run, []).append(time.time())
        if turn == 0:
            self.running.add(run)
            self.most_running = max(self.most_running, len(self.running))

    def finished(self, run: str) -> None:
        self.running.discard(run)

    def statement(self, *args: Any) -> None:
        """SQLAlchemy's ``before_cursor_execute(conn, cursor, statement, ...)``: the
        statement's kind and the first table it names ("SELECT operation_outputs")."""
        text = str(args[2]).lstrip()
        kind = text.split(None, 1)[0].upper() if text else "?"
        table = _TABLE.search(text)
        shape = f"{kind} {table.group(1).split('.')[-1]}" if table else kind
        self.statements.append((time.time(), shape))


_TABLE = re.compile(r'\b(?:FROM|INTO|UPDATE)\s+"?([\w.]+)"?', re.IGNORECASE)


TRACKER = Tracker()


def _expected(run: str, turn: int) -> str:
    return f"{run}:{turn}"


async def _answer(messages: Sequence[Any], _: Sequence[Any]) -> Any:
    """The fake model of the durable runs: waits 50 ms; checks the history it is given."""
    import statemachine as sm

    run = messages[0].content[0].text
    turn = sum(isinstance(m, sm.AssistantMessage) for m in messages)
    TRACKER.model_call(run, turn)
    await asyncio.sleep(LATENCY_S)
    if turn < TURNS - 1:
        return sm.AssistantMessage(
            [sm.ToolCall(f"c{turn}", "echo", {"text": _expected(run, turn)})]
        )
    echoed = [m.text for m in messages if isinstance(m, sm.ToolResultMessage)]
    if echoed != [_expected(run, t) for t in range(TURNS - 1)]:
        raise RuntimeError(f"run {run}: the history holds {echoed}")
    TRACKER.finished(run)
    return sm.AssistantMessage("done")


async def _bare_model(run: str, turn: int) -> dict[str, Any]:
    TRACKER.model_call(run, turn)
    await asyncio.sleep(LATENCY_S)
    if turn == TURNS - 1:
        TRACKER.finished(run)
        return {"text": "done"}
    return {"call": _expected(run, turn)}


async def _bare_tool(text: str) -> str:
    return text


async def _bare(run: str, turns: int) -> int:
    """The same steps as a durable run, in a DBOS workflow of its own."""
    from dbos import DBOS, StepOptions

    for turn in range(turns):
        answer = await DBOS.run_step_async(StepOptions(name="model"), _bare_model, run, turn)
        if turn < turns - 1:
            await DBOS.run_step_async(StepOptions(name="tool"), _bare_tool, answer["call"])
    return turns


async def _enqueue_all(runner: Any, url: str, contender: str, n: int) -> None:
    from dbos import DBOSClient, EnqueueOptions

    if contender == "durable":
        await asyncio.gather(
            *(
                runner.enqueue(
                    f"r{i}", queue=QUEUE, model="fake", messages=f"r{i}", max_turns=TURNS
                )
                for i in range(n)
            )
        )
        return
    client = DBOSClient(system_database_url=url)
    try:

        def options(i: int) -> EnqueueOptions:
            return {"workflow_name": BARE, "queue_name": QUEUE, "workflow_id": f"b{i}",
                    "app_version": APP_VERSION}  # fmt: skip

        await asyncio.gather(*(client.enqueue_async(options(i), f"b{i}", TURNS) for i in range(n)))
    finally:
        client.destroy()


async def _wait_for(path: Path) -> None:
    while not path.exists():
        await asyncio.sleep(0.01)


async def worker(url: str, contender: str, n: int, limit: int, index: int, where: Path) -> None:
    """One worker process: serve the queue; the first one enqueues the N runs at ``go``."""
    from dbos import DBOS
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    import statemachine as sm
    from statemachine.durable.dbos import DBOSRunner
    from statemachine.testing import FunctionModel

    @sm.tool(name="echo", description="Return the text it is given.")
    async def echo(text: str) -> str:
        return text

    event.listen(Engine, "before_cursor_execute", TRACKER.statement)
    DBOS.workflow(name=BARE)(_bare)
    runner = DBOSRunner(
        models={"fake": FunctionModel(_answer, record=False)},
        tools=[echo],
        database_url=url,
        executor_id=f"worker-{index}",
        queues={QUEUE: limit},
        app_version=APP_VERSION,
    )
    runner.launch()
    try:
        (where / f"ready-{index}").touch()
        await _wait_for(where / "go")
        if index == 0:
            await _enqueue_all(runner, url, contender, n)
        await _wait_for(where / "stop")
    finally:
        runner.destroy()
    report = {
        "calls": TRACKER.calls,
        "most_running": TRACKER.most_running,
        "statements": TRACKER.statements,
    }
    (where / f"worker-{index}.json").write_text(json.dumps(report), encoding="utf-8")


# -- in the parent process ---------------------------------------------------------------------


@dataclass
class Cell:
    backend: str
    contender: str
    n: int
    workers: int
    limit: int
    wall_s: float
    model_step_p50_ms: float
    model_step_p99_ms: float
    tool_step_p50_ms: float
    tool_step_p99_ms: float
    turn_p99_ms: float
    statements_per_turn: float
    statement_kinds: dict[str, float]  # per turn, by kind (SELECT, INSERT, ...)
    statement_tables: dict[str, float]  # per turn, by kind and first table named
    most_running_model: int
    most_running_dbos: int
    split: list[int]
    load_1m: float

    @property
    def turns_per_s(self) -> float:
        return self.n * TURNS / self.wall_s


def _percentile(values: Sequence[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _start_workers(
    url: str, contender: str, n: int, limit: int, workers: int, where: Path
) -> list[subprocess.Popen[bytes]]:
    procs = []
    for index in range(workers):
        command = [sys.executable, __file__, "--worker", url, contender, str(n), str(limit)]
        procs.append(
            subprocess.Popen(
                [*command, str(index), str(where)],
                stdout=subprocess.DEVNULL,
                stderr=(where / f"worker-{index}.err").open("wb"),
            )
        )
    deadline = time.monotonic() + 120
    while not all((where / f"ready-{i}").exists() for i in range(workers)):
        failed = [p for p in procs if p.poll() is not None]
        if failed or time.monotonic() > deadline:
            _stop(procs, where)
            raise RuntimeError(f"a worker did not start:\n{_errors(where, workers)}")
        time.sleep(0.05)
    return procs


def _errors(where: Path, workers: int) -> str:
    return "\n".join(
        (where / f"worker-{i}.err").read_text(encoding="utf-8", errors="replace")[-2000:]
        for i in range(workers)
    )


def _stop(procs: Sequence[subprocess.Popen[bytes]], where: Path) -> None:
    (where / "stop").touch()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _watch(
    client: Any, prefix: str, n: int, budget: float, procs: Sequence[subprocess.Popen[bytes]]
) -> dict[str, int]:
    """Poll until the N runs have ended; the most runs PENDING at once per executor."""
    most: dict[str, int] = {}
    deadline = time.monotonic() + budget
    while True:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a worker exited before the runs ended")
        found = await client.list_workflows_async(
            workflow_id_prefix=prefix, load_input=False, load_output=False
        )
        pending = Counter(w.executor_id for w in found if w.status == "PENDING")
        for executor, count in pending.items():
            most[executor] = max(most.get(executor, 0), count)
        if len(found) == n and all(w.status in ("SUCCESS", "ERROR") for w in found):
            return most
        if time.monotonic() > deadline:
            raise RuntimeError(f"the runs did not end within the {budget:.0f} s budget")
        await asyncio.sleep(POLL_S)


def _check(contender: str, found: Sequence[Any]) -> None:
    for w in found:
        if w.status != "SUCCESS":
            raise RuntimeError(f"{w.workflow_id} ended {w.status}: {w.error}")
        output = w.output
        done = (
            output == TURNS
            if contender == "bare"
            else output["state"] == "Done" and output["turns"] == TURNS
        )
        if not done:
            raise RuntimeError(f"{w.workflow_id} did not do the workload: {str(output)[:300]}")


async def _steps_ms(client: Any, found: Sequence[Any]) -> dict[str, list[float]]:
    """The model steps' and the tool steps' durations, ms, as DBOS stamped them."""
    durations: dict[str, list[float]] = {"model": [], "tool": []}
    for w in found:
        for step in await client.list_workflow_steps_async(w.workflow_id, load_output=False):
            kind = step["function_name"].rsplit(".", 1)[-1]  # statemachine.model, model, ...
            began, ended = step["started_at_epoch_ms"], step["completed_at_epoch_ms"]
            if kind in durations and began is not None and ended is not None:
                durations[kind].append(float(ended - began))
    return durations


async def _observe(
    url: str,
    contender: str,
    n: int,
    where: Path,
    budget: float,
    procs: Sequence[subprocess.Popen[bytes]],
) -> dict[str, Any]:
    """Start the runs (``go``), wait for their end, read back what DBOS recorded."""
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=url)
    try:
        began = time.time()
        (where / "go").touch()
        prefix = "r" if contender == "durable" else "b"
        most = await _watch(client, prefix, n, budget, procs)
        found = await client.list_workflows_async(workflow_id_prefix=prefix)
        _check(contender, found)
        ended = max(w.updated_at or 0 for w in found) / 1000
        steps = await _steps_ms(client, found)
    finally:
        client.destroy()
    split = Counter(w.executor_id for w in found)
    return {"began": began, "ended": ended, "most": most, "steps": steps, "split": split}


def _per_turn(counts: Counter[str], turns: int) -> dict[str, float]:
    return {k: v / turns for k, v in counts.most_common()}


def _from_workers(where: Path, workers: int, began: float, ended: float) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    intervals: list[float] = []
    most = 0
    for index in range(workers):
        seen = json.loads((where / f"worker-{index}.json").read_text(encoding="utf-8"))
        kinds.update(kind for at, kind in seen["statements"] if began <= at <= ended)
        for calls in seen["calls"].values():
            intervals += [1000 * (b - a) for a, b in itertools.pairwise(calls)]
        most = max(most, seen["most_running"])
    return {"kinds": kinds, "intervals": intervals, "most": most}


def measure(
    backend: str, url: str, contender: str, n: int, workers: int, limit: int, budget: float
) -> Cell:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="statemachine-durable-scale-") as directory:
        where = Path(directory)
        procs = _start_workers(url, contender, n, limit, workers, where)
        try:
            seen = asyncio.run(_observe(url, contender, n, where, budget, procs))
        except Exception as exc:
            _stop(procs, where)
            raise RuntimeError(f"{exc}\n{_errors(where, workers)}") from exc
        except BaseException:
            _stop(procs, where)
            raise
        _stop(procs, where)
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError(f"a worker failed:\n{_errors(where, workers)}")
        inside = _from_workers(where, workers, seen["began"], seen["ended"])
    turns = n * TURNS
    kinds: Counter[str] = inside["kinds"]
    return Cell(
        backend=backend,
        contender=contender,
        n=n,
        workers=workers,
        limit=limit,
        wall_s=seen["ended"] - seen["began"],
        model_step_p50_ms=_percentile(seen["steps"]["model"], 50),
        model_step_p99_ms=_percentile(seen["steps"]["model"], 99),
        tool_step_p50_ms=_percentile(seen["steps"]["tool"], 50),
        tool_step_p99_ms=_percentile(seen["steps"]["tool"], 99),
        turn_p99_ms=_percentile(inside["intervals"], 99),
        statements_per_turn=sum(kinds.values()) / turns,
        statement_kinds=_per_turn(Counter(shape.split()[0] for shape in kinds.elements()), turns),
        statement_tables=_per_turn(kinds, turns),
        most_running_model=inside["most"],
        most_running_dbos=max(seen["most"].values(), default=0),
        split=sorted(seen["split"].values(), reverse=True),
        load_1m=load,
    )


# -- databases, the report, the command ----------------------------------------------------------


def _fresh_database(backend: str, server: str | None, directory: Path) -> str:
    """A new empty database: a SQLite file in ``directory``, or a database on ``server``."""
    name = f"sm_scale_{uuid.uuid4().hex[:8]}"
    if backend == "sqlite":
        return f"sqlite:///{directory / name}.sqlite"
    import psycopg

    assert server is not None
    with psycopg.connect(server.replace("+psycopg", "") + "/postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "n/a"


def _row(c: Cell, bare: Cell | None) -> str:
    kinds = ", ".join(f"{k} {v:.1f}" for k, v in list(c.statement_kinds.items())[:4])
    versus = (
        f"{_ratio(c.turns_per_s, bare.turns_per_s)} | "
        f"{_ratio(c.statements_per_turn, bare.statements_per_turn)}"
        if bare
        else "— | —"
    )
    return (
        f"| {c.backend} | {c.contender} | {c.n} | {c.workers} × {c.limit} | {c.wall_s:.2f} "
        f"| {c.turns_per_s:,.0f} | {c.model_step_p50_ms:.0f} / {c.model_step_p99_ms:.0f} "
        f"| {c.tool_step_p50_ms:.0f} / {c.tool_step_p99_ms:.0f} "
        f"| {c.turn_p99_ms:.0f} | {c.statements_per_turn:.1f} ({kinds}) | {versus} "
        f"| {c.most_running_model} / {c.most_running_dbos} | {'/'.join(map(str, c.split))} "
        f"| {c.load_1m:.1f} |"
    )


def _growth(cells: Sequence[Cell]) -> list[str]:
    rows = []
    keys = dict.fromkeys((c.backend, c.contender) for c in cells if c.limit * c.workers >= c.n)
    for backend, contender in keys:
        own = sorted(
            (
                c
                for c in cells
                if (c.backend, c.contender) == (backend, contender) and c.limit * c.workers >= c.n
            ),
            key=lambda c: c.n,
        )
        for a, b in itertools.pairwise(own):
            rows.append(
                f"| {backend} | {contender} | {a.n} → {b.n} "
                f"| {_ratio(b.wall_s, a.wall_s)} | {_ratio(b.turns_per_s, a.turns_per_s)} "
                f"| {_ratio(b.model_step_p99_ms, a.model_step_p99_ms)} "
                f"| {_ratio(b.tool_step_p99_ms, a.tool_step_p99_ms)} "
                f"| {_ratio(b.turn_p99_ms, a.turn_p99_ms)} "
                f"| {_ratio(b.statements_per_turn, a.statements_per_turn)} |"
            )
    return rows


def _by_table(cells: Sequence[Cell]) -> list[str]:
    """Statements per turn by kind and table, durable against bare, at each backend's
    largest N with every run at once."""
    lines = []
    for backend in dict.fromkeys(c.backend for c in cells):
        at_once = [c for c in cells if c.backend == backend and c.limit * c.workers >= c.n]
        if not at_once:
            continue
        n = max(c.n for c in at_once)
        pair = {c.contender: c.statement_tables for c in at_once if c.n == n}
        durable, bare = pair.get("durable", {}), pair.get("bare", {})
        lines += [
            "",
            f"Statements per turn by kind and table, {backend}, N = {n}:",
            "",
            "| statement | durable | bare DBOS |",
            "| --- | ---: | ---: |",
        ]
        for shape in sorted(set(durable) | set(bare), key=lambda k: -durable.get(k, 0)):
            lines.append(f"| {shape} | {durable.get(shape, 0):.2f} | {bare.get(shape, 0):.2f} |")
    return lines


def render(cells: Sequence[Cell], notes: Sequence[str], when: str) -> str:
    bare = {(c.backend, c.n, c.limit): c for c in cells if c.contender == "bare"}
    lines = [
        "# Durable runs at once over worker processes (bench/durable_scale.py)",
        "",
        f"Measured {when} on {platform.machine()} ({os.cpu_count()} cores), Python "
        f"{platform.python_version()}, DBOS {_version('dbos')}. Each run: {TURNS} model calls "
        f"of {LATENCY_S * 1000:.0f} ms and one tool call per turn but the last; the N runs "
        "are enqueued at once on a queue served by the workers, each taking at most k at "
        "once; each cell a fresh database and fresh workers. Ratios are durable / bare DBOS "
        "at the same backend, N and k; load is the 1-minute load average at the cell's start.",
        "",
        *(f"{note}\n" for note in notes),
        "| backend | contender | N | workers × k | wall s | turns/s | model step p50 / p99 ms "
        "| tool step p50 / p99 ms | turn p99 ms | statements/turn (by kind) | turns/s vs bare "
        "| statements vs bare | most at once in a worker (model / DBOS) | runs per worker "
        "| load |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: "
        "| --- | --- | ---: |",
    ]
    for c in cells:
        lines.append(
            _row(c, bare.get((c.backend, c.n, c.limit)) if c.contender != "bare" else None)
        )
    lines += _by_table(cells)
    growth = _growth(cells)
    if growth:
        lines += [
            "",
            "Growth from one N to the next (value at the larger N / at the smaller), all runs "
            "at once: with the model's latency fixed, wall time would stay flat and turns/s "
            "double with N if the database kept up.",
            "",
            "| backend | contender | N | wall | turns/s | model step p99 | tool step p99 "
            "| turn p99 | statements/turn |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            *growth,
        ]
    return "\n".join(lines) + "\n"


def _version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _plan(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """(contender, N, k) in the order measured: each size, durable then bare; then the
    queue check (the largest N, k = --queue-limit)."""
    plan = []
    for n in args.runs:
        limit = -(-n // args.workers)
        plan += [("durable", n, limit), ("bare", n, limit)]
    plan.append(("durable", max(args.runs), args.queue_limit))
    return plan


def _backend(args: argparse.Namespace, backend: str, workers: int, directory: Path) -> list[Cell]:
    cells = []
    for contender, n, limit in _plan(args):
        url = _fresh_database(backend, args.postgres, directory)
        cell = measure(backend, url, contender, n, workers, limit, args.budget)
        print(
            f"{backend:10} {contender:8} N={n:4} k={limit:4}: {cell.wall_s:6.2f} s, "
            f"{cell.turns_per_s:6.0f} turns/s, {cell.statements_per_turn:5.1f} statements/turn, "
            f"most at once {cell.most_running_model}/{cell.most_running_dbos}",
            file=sys.stderr,
        )
        if limit < n / workers and max(cell.most_running_model, cell.most_running_dbos) > limit:
            raise RuntimeError(f"the queue's limit {limit} was exceeded: {cell}")
        cells.append(cell)
    return cells


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/durable_scale.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sqlite-workers", type=int, help="workers on SQLite (--workers)")
    parser.add_argument("--queue-limit", type=int, default=QUEUE_LIMIT)
    parser.add_argument("--postgres", help="a PostgreSQL server URL (postgresql+psycopg://...)")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds a cell may take")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        url, contender, n, limit, index, where = args.worker
        asyncio.run(worker(url, contender, int(n), int(limit), int(index), Path(where)))
        return 0
    if not args.no_postgres:
        args.postgres = args.postgres or os.environ.get("STATEMACHINE_TEST_POSTGRES")
    notes: list[str] = []
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="statemachine-durable-scale-db-") as directory:
        if not args.no_sqlite:
            workers = args.sqlite_workers or args.workers
            cells += _backend(args, "sqlite", workers, Path(directory))
        if args.postgres:
            cells += _backend(args, "postgres", args.workers, Path(directory))
        else:
            notes.append(
                "PostgreSQL: not measured (no server given: run under bash .ci/postgres.sh)."
            )
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    from scale import write_outputs

    write_outputs(render(cells, notes, when), [asdict(c) for c in cells], args.out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
