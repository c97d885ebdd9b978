"""Several workers on one database: a queue shared between two worker processes, and a
dead worker's runs finished by another (failover). PostgreSQL runs under
`bash .ci/postgres.sh` (see test_durable_dbos.py).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import (
    QUEUE,
    TOOLS,
    answer,
    database_urls,
    kill,
    log_lines,
    reference_run,
    result_json,
    start_worker,
    wait_for_log,
)

import statemachine as sm
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner, connect
from statemachine.testing import FunctionModel

RUNS = 20


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """The database URL for a name, on each backend (a fresh database per test)."""
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


def _reference() -> dict[str, Any]:
    return result_json(reference_run())


async def _results(db: str, run_ids: list[str], timeout: float) -> list[sm.RunResult]:
    client = connect(db)
    try:
        handles = [DBOSRunHandle(client, run_id) for run_id in run_ids]
        return list(await asyncio.gather(*(h.result(timeout=timeout) for h in handles)))
    finally:
        client.destroy()


async def _enqueue(db: str, run_ids: list[str]) -> None:
    """Enqueue from a process that takes no runs (a runner without queues)."""
    runner = DBOSRunner(models={"scripted": FunctionModel(answer)}, tools=TOOLS, database_url=db)
    runner.launch()
    try:
        for run_id in run_ids:
            await runner.enqueue(run_id, queue=QUEUE, model="scripted", messages="go")
    finally:
        runner.destroy()


def _wait_until_ready(stop: Path, proc: Any) -> None:
    """Wait until the worker has launched and listens to its queue."""
    deadline = time.monotonic() + 60
    while not Path(f"{stop}.ready").exists():
        assert proc.poll() is None, "the worker died"
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)


@pytest.mark.timeout(240)
def test_two_workers_share_a_queue_and_run_each_run_once(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    db, log = database("runs"), tmp_path / "log"
    run_ids = [f"q{i}" for i in range(RUNS)]
    workers = []
    try:
        for name in ("w1", "w2"):
            ready = tmp_path / name
            workers.append(start_worker(db, "-", ready, log, "serve", DURABLE_EXECUTOR=name))
            _wait_until_ready(ready, workers[-1])  # one at a time: the first makes the tables
        started = time.monotonic()
        asyncio.run(_enqueue(db, run_ids))
        results = asyncio.run(_results(db, run_ids, 180))
        print(f"{RUNS} queued runs on two workers in {time.monotonic() - started:.1f} s")
        for name in ("w1", "w2"):
            (tmp_path / name).touch()
        for proc in workers:
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in workers:
            kill(proc)
    expected = _reference()
    assert all(result_json(r) == expected for r in results)
    lines = log_lines(log)
    starts = Counter((line[3], line[1]) for line in lines if line[0] == "start")
    assert set(starts) == {(r, f"t{t}{s}") for r in run_ids for t in (1, 2, 3) for s in "ab"}
    assert set(starts.values()) == {1}  # every tool call of every run ran once
    by_worker = Counter(line[2] for line in lines if line[0] == "start")
    assert len(by_worker) == 2, by_worker  # both workers took runs


@pytest.mark.timeout(180)
def test_a_dead_workers_run_is_finished_by_another_worker(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    db, out, stop, log = database("runs"), tmp_path / "out", tmp_path / "stop", tmp_path / "log"
    first = start_worker(db, "orphan", out, log, DURABLE_EXECUTOR="w1")
    procs = [first]
    try:
        wait_for_log(log, 5, first)  # mid-run: the second turn's tools are running
        kill(first)
        recorded = _recorded_tools(db, "orphan")
        second = start_worker(
            db, "-", stop, log, "serve", DURABLE_EXECUTOR="w2", DURABLE_RECOVER="w1"
        )
        procs.append(second)
        (result,) = asyncio.run(_results(db, ["orphan"], 120))
        stop.touch()
        assert second.wait(timeout=60) == 0
    finally:
        for proc in procs:
            kill(proc)
    assert result_json(result) == _reference()
    pids = {line[2] for line in log_lines(log)}
    assert pids == {str(first.pid), str(second.pid)}
    rerun = [
        line[1]
        for line in log_lines(log)
        if line[0] == "start" and line[2] == str(second.pid) and line[1] in recorded
    ]
    assert not rerun, f"finished calls ran again: {rerun}"


def _recorded_tools(db: str, run_id: str) -> set[str]:
    client = connect(db)
    try:
        steps = client.list_workflow_steps(run_id)
    finally:
        client.destroy()
    return {
        s["output"][0]["callId"]
        for s in steps
        if s["function_name"] == "statemachine.tool" and s["output"]
    }
