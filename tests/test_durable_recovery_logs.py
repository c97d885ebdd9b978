"""Recovery leaves nothing behind: after a worker is killed -9 or stopped, the worker
that takes its runs back logs no "Future exception was never retrieved" (asyncio's
word for a future's error nobody read) and no "Exception ignored in ..." (an error
raised where nobody could catch it: in a finalizer, a coroutine closed by the garbage
collector), from DBOS or from the library. PostgreSQL runs under `bash .ci/postgres.sh`
(see test_durable_dbos.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import (
    TOOLS,
    answer,
    beta_needs_approval,
    database_urls,
    kill,
    start_worker,
    wait_for_log,
)

import statemachine as sm
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner
from statemachine.testing import FunctionModel

STRAY = ("Future exception was never retrieved", "Exception ignored in", "Task was destroyed")


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


class Stray:
    """What asyncio logged, and what was raised where nobody could catch it."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog
        self._unraisable: list[str] = []

    def hook(self, raised: Any) -> None:
        self._unraisable.append(f"Exception ignored in {raised.object!r}: {raised.exc_value!r}")

    def found(self) -> list[str]:
        """All of it so far, after a garbage collection."""
        gc.collect()
        records = self._caplog.records
        logged = [r.getMessage() for r in records if r.name == "asyncio" and r.levelno >= 30]
        return self._unraisable + logged


@pytest.fixture
def stray(caplog: pytest.LogCaptureFixture) -> Iterator[Stray]:
    caplog.set_level(logging.WARNING, logger="asyncio")
    watch = Stray(caplog)
    previous, sys.unraisablehook = sys.unraisablehook, watch.hook
    try:
        yield watch
    finally:
        sys.unraisablehook = previous


@pytest.mark.timeout(180)
def test_a_worker_killed_mid_run_is_followed_by_one_that_logs_no_stray_error(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    db, out, log, errors = (
        database("runs"),
        tmp_path / "out.json",
        tmp_path / "log",
        tmp_path / "stderr",
    )
    first = start_worker(db, "r1", out, log)
    wait_for_log(log, 5, first)  # in the middle of the second turn's tools
    kill(first)
    second = start_worker(db, "r1", out, log, errors=errors)
    assert second.wait(timeout=120) == 0
    logged = errors.read_text()
    assert [s for s in STRAY if s in logged] == [], logged
    assert out.read_text()  # the run ended in the second worker


def _runner(db: str) -> DBOSRunner:
    return DBOSRunner(
        models={"scripted": FunctionModel(answer)},
        tools=TOOLS,
        database_url=db,
        before_tool_call=beta_needs_approval,
    )


@pytest.mark.timeout(180)
def test_runs_taken_back_at_launch_with_messages_log_no_stray_error(
    database: Callable[[str], str], stray: Stray
) -> None:
    """Runs waiting for a person, steered, left by a stopped worker and taken back by
    the next one at launch: decided, steered again, finished; nothing stray."""
    db = database("runs")
    run_ids = [f"r{i}" for i in range(4)]

    async def leave(runner: DBOSRunner) -> None:
        handles = [await runner.start(r, model="scripted", messages="go") for r in run_ids]
        for handle in handles:
            while not await handle.pending_approvals():
                await asyncio.sleep(0.05)
            await handle.steer("a word before the restart")

    async def take_back(runner: DBOSRunner) -> list[sm.RunResult]:
        handles = [await runner.handle(r) for r in run_ids]

        async def finish(handle: DBOSRunHandle) -> sm.RunResult:
            for call_id in ("t1b", "t2b", "t3b"):
                while call_id not in [c.id for c in await handle.pending_approvals()]:
                    await asyncio.sleep(0.05)
                await handle.steer(f"a word before {call_id} is decided")
                await handle.decide(call_id, True)
            return await handle.result(timeout=60)

        return list(await asyncio.gather(*(finish(h) for h in handles)))

    for body in (leave, take_back):
        runner = _runner(db)

        async def go(runner: DBOSRunner = runner, body: Any = body) -> Any:
            runner.launch()
            try:
                return await body(runner)
            finally:
                runner.destroy()

        results = asyncio.run(go())
        gc.collect()
    assert all(r.ok for r in results)
    assert len(results) == len(run_ids)
    assert stray.found() == []


def test_the_stray_check_sees_what_it_looks_for(stray: Stray) -> None:
    """It catches both kinds: a future whose error nobody read, and an error raised in
    a finalizer."""
    assert stray.found() == []

    async def lost() -> None:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(RuntimeError("nobody reads this"))

    asyncio.run(lost())

    class Finalizer:
        def __del__(self) -> None:
            raise RuntimeError("raised where nobody can catch it")

    Finalizer()
    found = stray.found()
    assert any(s.startswith("Future exception was never retrieved") for s in found), found
    assert any(s.startswith("Exception ignored in") for s in found), found
