"""How soon a handle's ``result()`` sees a durable run end, from another client.

    bash .ci/postgres.sh python bench/durable_result.py [--runs 40]

A worker runs one-turn runs one after another; for each, a handle on a client of its
own awaits ``result()``. Two such clients: one made as ``connect()`` makes it (on
PostgreSQL with a listener thread: the run's last operation, an event, wakes the
wait), one a plain ``DBOSClient`` (its handle polls every 50 ms, as every handle did
before). Latency: from the end DBOS stamps on the run (``updated_at``, to the
millisecond) to the return of ``result()``.

PostgreSQL only (SQLite has no notification: every waiter polls); the URL comes from
``--postgres`` or ``STATEMACHINE_TEST_POSTGRES`` (a fresh database is made on it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence

from dbos import DBOSClient

import statemachine as sm
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner, connect
from statemachine.testing import FunctionModel


def _answer(messages: Sequence[sm.Message], tools: Sequence[object]) -> sm.AssistantMessage:
    return sm.AssistantMessage("done")


async def _latency(runner: DBOSRunner, client: DBOSClient, run_id: str) -> float:
    await runner.start(run_id, model="m", messages="go")
    await DBOSRunHandle(client, run_id).result(timeout=30)
    seen = time.time()
    (status,) = await client.list_workflows_async(workflow_ids=[run_id])
    return seen - (status.updated_at or 0) / 1000


async def main(url: str, runs: int) -> None:
    runner = DBOSRunner(models={"m": FunctionModel(_answer)}, database_url=url)
    runner.launch()
    notified, polling = connect(url), DBOSClient(system_database_url=url)
    found: dict[str, list[float]] = {"notified (connect)": [], "polling (50 ms)": []}
    try:
        for i in range(runs):  # interleaved, so a slow spell hits both alike
            found["notified (connect)"].append(await _latency(runner, notified, f"n{i}"))
            found["polling (50 ms)"].append(await _latency(runner, polling, f"p{i}"))
    finally:
        notified.destroy()
        polling.destroy()
        runner.destroy()
    print(f"{runs} runs each; ms from the run's end to result() returning")
    print(f"{'client':<22} {'median':>7} {'p90':>7} {'max':>7}")
    for name, values in found.items():
        ms = sorted(v * 1000 for v in values)
        p90 = ms[int(0.9 * (len(ms) - 1))]
        print(f"{name:<22} {statistics.median(ms):7.1f} {p90:7.1f} {ms[-1]:7.1f}")


def _database(server: str) -> str:
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server.replace("+psycopg", "") + "/postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="runs per client (40)")
    parser.add_argument("--postgres", help="a PostgreSQL database URL (postgresql+psycopg://)")
    args = parser.parse_args()
    server = os.environ.get("STATEMACHINE_TEST_POSTGRES")
    url = args.postgres or (_database(server) if server else None)
    if url is None:
        sys.exit("durable_result: PostgreSQL only: --postgres URL, or bash .ci/postgres.sh")
    asyncio.run(main(url, args.runs))
