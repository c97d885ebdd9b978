"""Durable overhead, measured one way on every backend, in one run.

    python bench/durable_overhead.py [--turns 30] [--reps 9] [--postgres URL]
                                     [--address HOST:PORT] [--json FILE] [--smoke]

Each backend runs the same N-turn run (each turn one model call and one tool call;
then the answer) as a durable run and as a bare workflow of the backend making the
same steps with nothing of the library's in it, in one process:

- **DBOS, SQLite**: the durable run of ``bench/durable.py`` and its bare DBOS
  workflow, both on the runner's own file, which ``DBOSRunner`` puts in WAL mode: the
  same store settings for both (the report names the file's mode);
- **DBOS, PostgreSQL**: the same, on a fresh database, when ``--postgres URL`` is
  given or ``STATEMACHINE_TEST_POSTGRES`` names a server (``bash .ci/postgres.sh``);
- **Temporal**: ``bench/temporal.py``'s durable run and bare workflow calling the
  runner's own activities, on the server at ``--address`` or on a dev server started
  for the run.

Interleaved: after one warm-up run of each side, ``--reps`` pairs, one durable run and
one bare run a pair, the order alternating from one pair to the next (durable first,
then bare first), so a slow spell of the shared machine, or a slow drift, falls on
both sides alike. One store per backend, shared by both sides: DBOS is one instance
a process, so a fresh database a repetition would mean relaunching it (cold caches,
new connections) between pairs; with the store shared, each run of a pair meets the
same file, the same connections and a table grown alike by both sides.

One way: the time of a run is its wall time from ``start`` to its result, as a caller
sees it, on every backend; the ratio is durable / bare of the same pair. Reported per
backend: the median of the per-pair ratios against the target (1.3), their
quartiles and min–max, the number of pairs, and this process's CPU time per turn
beside the wall time (all of the work on SQLite; on PostgreSQL and Temporal the
server's share runs in another process and is not in it). Where the time goes, for
DBOS: the saved operations per turn of both, and the durable run's operations, ms
each, as DBOS stamps them. ``--json FILE`` writes the figures too. ``--smoke``: 3
turns, one pair, every backend that is reachable (a shape check, not a measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import durable as dbos_bench
import temporal as temporal_bench
from dbos import DBOS, SetWorkflowID

from statemachine.durable.dbos import DBOSRunner
from statemachine.durable.temporal import dev_server

TARGET = 1.3  # durable / bare, the most the library aims at
SIDES = ("durable", "bare")


def _spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles and extremes of ``values`` (one value is its own quartiles)."""
    if len(values) > 1:
        low, _, high = statistics.quantiles(values, n=4)
    else:
        low = high = values[0]
    return {
        "median": statistics.median(values),
        "q1": low,
        "q3": high,
        "min": min(values),
        "max": max(values),
    }


def _row(
    backend: str, store: str, wall: dict[str, list[float]], cpu: dict[str, list[float]]
) -> dict[str, Any]:
    """``wall`` and ``cpu``: ms per turn of each side, one per pair, in pair order."""
    ratios = [d / b for d, b in zip(wall["durable"], wall["bare"], strict=True)]
    cpu_ratios = [d / b for d, b in zip(cpu["durable"], cpu["bare"], strict=True)]
    spread = _spread(ratios)
    return {
        "backend": backend,
        "store": store,
        "reps": len(ratios),
        "durable_ms_per_turn": statistics.median(wall["durable"]),
        "bare_ms_per_turn": statistics.median(wall["bare"]),
        "ratio": spread["median"],
        "ratio_spread": spread,
        "ratios": ratios,
        "durable_cpu_ms_per_turn": statistics.median(cpu["durable"]),
        "bare_cpu_ms_per_turn": statistics.median(cpu["bare"]),
        "cpu_ratio": statistics.median(cpu_ratios),
        "cpu_ratio_spread": _spread(cpu_ratios),
        "within_target": spread["median"] <= TARGET,
    }


class _Pairs:
    """Wall and CPU time of each side's runs, ms per turn, one per pair."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.wall: dict[str, list[float]] = {side: [] for side in SIDES}
        self.cpu: dict[str, list[float]] = {side: [] for side in SIDES}

    async def time(self, side: str, run: Awaitable[None]) -> None:
        began, cpu = time.perf_counter(), time.process_time()
        await run
        self.wall[side].append((time.perf_counter() - began) * 1000 / self.turns)
        self.cpu[side].append((time.process_time() - cpu) * 1000 / self.turns)


async def _durable_run(runner: DBOSRunner, run_id: str, turns: int) -> None:
    handle = await runner.start(run_id, model="bench", messages="go", max_turns=turns)
    result = await handle.result(timeout=600)
    assert result.ok, result
    assert result.turns == turns, result


async def _bare_run(run_id: str, turns: int) -> None:
    with SetWorkflowID(run_id):
        handle = await DBOS.start_workflow_async(dbos_bench._bare, turns, False)
    assert await handle.get_result() == turns


async def _dbos_pairs(url: str, label: str, turns: int, reps: int) -> tuple[_Pairs, dict[str, Any]]:
    """``reps`` interleaved pairs on one store (module docstring); the saved operations
    of each run are counted after it is timed."""
    DBOS.workflow(name=dbos_bench.BARE)(dbos_bench._bare)
    runner = DBOSRunner(
        models={"bench": dbos_bench._model(turns)}, tools=[dbos_bench.echo], database_url=url
    )
    runner.launch()
    pairs = _Pairs(turns)
    operations: dict[str, list[int]] = {side: [] for side in SIDES}
    kinds: dict[str, list[float]] = {}  # the durable runs' operations, ms each
    try:
        await _durable_run(runner, f"warm-{label}", turns)  # first-use costs out of the way
        await _bare_run(f"warm-bare-{label}", turns)
        for rep in range(reps):
            for side in SIDES[:: 1 if rep % 2 == 0 else -1]:
                run_id = f"{label}-{side}-{rep}"
                run = _durable_run(runner, run_id, turns) if side == "durable" else None
                await pairs.time(side, run or _bare_run(run_id, turns))
                dbos_bench._kinds.clear()  # _span fills it with this run's operations
                _, saved = await dbos_bench._span(runner._require_client(), run_id)
                operations[side].append(saved)
                for kind, took in dbos_bench._kinds.items() if side == "durable" else ():
                    kinds.setdefault(kind, []).extend(took)
    finally:
        runner.destroy()
    return pairs, {"operations": operations, "kinds": kinds}


def _dbos(url: str, label: str, store: str, turns: int, reps: int) -> tuple[dict[str, Any], str]:
    pairs, saved = asyncio.run(_dbos_pairs(url, label, turns, reps))
    row = _row("DBOS", store, pairs.wall, pairs.cpu)
    ops = {side: statistics.median(saved["operations"][side]) / turns for side in SIDES}
    kinds = ", ".join(
        f"{kind} {statistics.median(took):.1f} ms (×{len(took) // reps})"
        for kind, took in sorted(saved["kinds"].items())
    )
    row["saved_ops_per_turn"] = ops
    where = (
        f"- DBOS, {store}: saved operations per turn {ops['durable']:.2f} durable, "
        f"{ops['bare']:.2f} bare; the durable run's operations: {kinds}"
    )
    return row, where


def _temporal(address: str | None, turns: int, reps: int) -> dict[str, Any]:
    temporal_bench.TURNS = turns
    with contextlib.ExitStack() as stack:
        if address is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-temporal-"))
            address = stack.enter_context(dev_server(folder))
        timings = asyncio.run(temporal_bench.measure(address, reps))
    sides = dict(zip(temporal_bench.CONTENDERS, SIDES, strict=True))
    wall = {sides[name]: values for name, values in timings.wall.items()}
    cpu = {sides[name]: values for name, values in timings.cpu.items()}
    return _row("Temporal", "dev server", wall, cpu)


def render(rows: Sequence[dict[str, Any]], where: Sequence[str], turns: int) -> str:
    lines = [
        f"{turns} turns per run (a model call and a tool call per turn, then the answer); "
        "pairs of one durable and one bare run, interleaved. Wall time from start to "
        "result and this process's CPU time, ms/turn (median over the pairs); durable / "
        "bare: the median of the per-pair ratios, their quartiles and min–max; "
        f"target ≤ {TARGET}.",
        "",
        "| backend | store | pairs | durable ms/turn | bare ms/turn | durable / bare "
        "| quartiles | min–max | ≤ target | durable CPU ms/turn | bare CPU ms/turn "
        "| CPU durable / bare (quartiles) |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        s, c = r["ratio_spread"], r["cpu_ratio_spread"]
        lines.append(
            f"| {r['backend']} | {r['store']} | {r['reps']} | {r['durable_ms_per_turn']:.2f} | "
            f"{r['bare_ms_per_turn']:.2f} | {r['ratio']:.2f} | {s['q1']:.2f}–{s['q3']:.2f} | "
            f"{s['min']:.2f}–{s['max']:.2f} | {'yes' if r['within_target'] else 'no'} | "
            f"{r['durable_cpu_ms_per_turn']:.2f} | {r['bare_cpu_ms_per_turn']:.2f} | "
            f"{r['cpu_ratio']:.2f} ({c['q1']:.2f}–{c['q3']:.2f}) |"
        )
    lines += ["", "Where the time goes:", "", *where]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30, help="turns per run (30)")
    parser.add_argument("--reps", type=int, default=9, help="pairs of runs, durable and bare (9)")
    parser.add_argument("--postgres", help="a PostgreSQL database URL (postgresql+psycopg://)")
    parser.add_argument("--address", help="a Temporal server (else a dev server is started)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--smoke", action="store_true", help="3 turns, 1 pair")
    args = parser.parse_args(argv)
    turns, reps = (3, 1) if args.smoke else (args.turns, args.reps)
    if turns < 2 or reps < 1:
        parser.error("--turns must be at least 2 and --reps at least 1")
    rows: list[dict[str, Any]] = []
    where: list[str] = []
    with tempfile.TemporaryDirectory(prefix="statemachine-bench-") as directory:
        url = f"sqlite:///{Path(directory, 'bench.sqlite')}"
        row, note = _dbos(url, "sqlite", "SQLite", turns, reps)
        row["store"] = f"SQLite ({dbos_bench._journal_mode(url)}, both)"
        rows.append(row)
        where.append(note)
    postgres = dbos_bench._postgres_url(args.postgres)
    if postgres:
        row, note = _dbos(postgres, "pg", "PostgreSQL", turns, reps)
        rows.append(row)
        where.append(note)
    rows.append(_temporal(args.address, turns, reps))
    print(render(rows, where, turns))
    if args.json is not None:
        args.json.write_text(json.dumps({"turns": turns, "reps": reps, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
