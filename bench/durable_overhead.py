"""Durable overhead, measured one way on every backend, in one run.

    python bench/durable_overhead.py [--turns 30] [--reps 5] [--postgres URL]
                                     [--address HOST:PORT] [--json FILE] [--smoke]

Each backend runs the same N-turn run (each turn one model call and one tool call;
then the answer) as a durable run and as a bare workflow of the backend making the
same steps with nothing of the library's in it, interleaved, in one process:

- **DBOS, SQLite**: ``bench/durable.py``'s durable run and bare DBOS workflow, both
  on the runner's own file, which ``DBOSRunner`` puts in WAL mode: the same store
  settings for both (the report names the file's mode);
- **DBOS, PostgreSQL**: the same, on a fresh database, when ``--postgres URL`` is
  given or ``STATEMACHINE_TEST_POSTGRES`` names a server (``bash .ci/postgres.sh``);
- **Temporal**: ``bench/temporal.py``'s durable run and bare workflow calling the
  runner's own activities, on the server at ``--address`` or on a dev server started
  for the run.

One way: the time of a run is its wall time from ``start`` to its result, as a caller
sees it, on every backend; the ratio is durable / bare of the same repetition, and
the median is reported against the target (1.3). Where the time goes, for DBOS: the
saved operations per turn of both, and the durable run's operations, ms each, as DBOS
stamps them. ``--json FILE`` writes the figures too. ``--smoke``: 3 turns, one
repetition, every backend that is reachable (a shape check, not a measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import durable as dbos_bench
import temporal as temporal_bench

from statemachine.durable.temporal import dev_server

TARGET = 1.3  # durable / bare, the most the library aims at


def _row(
    backend: str, store: str, durable: Sequence[float], bare: Sequence[float]
) -> dict[str, Any]:
    """Times in ms per turn, one per repetition, paired."""
    ratio = statistics.median(d / b for d, b in zip(durable, bare, strict=True))
    return {
        "backend": backend,
        "store": store,
        "durable_ms_per_turn": statistics.median(durable),
        "bare_ms_per_turn": statistics.median(bare),
        "ratio": ratio,
        "within_target": ratio <= TARGET,
    }


def _dbos(url: str, label: str, store: str, turns: int, reps: int) -> tuple[dict[str, Any], str]:
    sample = asyncio.run(dbos_bench._measure(url, label, turns, reps))
    durable = [1000 * t / turns for t in sample.wall["durable"]]
    bare = [1000 * t / turns for t in sample.wall["bare DBOS"]]
    row = _row("DBOS", store, durable, bare)
    ops = {n: statistics.median(sample.operations[n]) / turns for n in ("durable", "bare DBOS")}
    runs = max(1, len(sample.seconds["durable"]))
    kinds = ", ".join(
        f"{kind} {statistics.median(took):.1f} ms (×{len(took) // runs})"
        for kind, took in sorted(sample.kinds.items())
    )
    row["saved_ops_per_turn"] = {"durable": ops["durable"], "bare": ops["bare DBOS"]}
    where = (
        f"- DBOS, {store}: saved operations per turn {ops['durable']:.2f} durable, "
        f"{ops['bare DBOS']:.2f} bare; the durable run's operations: {kinds}"
    )
    return row, where


def _temporal(address: str | None, turns: int, reps: int) -> dict[str, Any]:
    temporal_bench.TURNS = turns
    with contextlib.ExitStack() as stack:
        if address is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-temporal-"))
            address = stack.enter_context(dev_server(folder))
        times = asyncio.run(temporal_bench.measure(address, reps))
    return _row("Temporal", "dev server", times["durable"], times["bare Temporal"])


def render(rows: Sequence[dict[str, Any]], where: Sequence[str], turns: int, reps: int) -> str:
    lines = [
        f"{turns} turns per run (a model call and a tool call per turn, then the answer), "
        f"{reps} repetitions interleaved; wall time from start to result, ms/turn "
        f"(median); durable / bare is the median of per-repetition ratios; target "
        f"≤ {TARGET}.",
        "",
        "| backend | store | durable ms/turn | bare ms/turn | durable / bare | ≤ target |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['store']} | {r['durable_ms_per_turn']:.2f} | "
            f"{r['bare_ms_per_turn']:.2f} | {r['ratio']:.2f} | "
            f"{'yes' if r['within_target'] else 'no'} |"
        )
    lines += ["", "Where the time goes:", "", *where]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30, help="turns per run (30)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (5)")
    parser.add_argument("--postgres", help="a PostgreSQL database URL (postgresql+psycopg://)")
    parser.add_argument("--address", help="a Temporal server (else a dev server is started)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--smoke", action="store_true", help="3 turns, 1 repetition")
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
    print(render(rows, where, turns, reps))
    if args.json is not None:
        args.json.write_text(json.dumps({"turns": turns, "reps": reps, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
