"""Durable runs on Temporal through a deploy: every operation answers.

During a deploy a run can have no live worker (the old ones stopped, the new ones
not up), a worker that does not fit it, or a worker that just restarted. Listing the
runs still lists them all (a run no worker answers for is marked, not an error of
the whole listing), ``status()`` answers right after a restart, and a message to a
held run is the library's ``RunHeldError``, never an SDK error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from durable_worker import TOOLS, alpha, answer, beta_needs_approval
from temporal_support import temporal_server  # noqa: F401 - the session's server
from temporal_worker import ROOT, WORKER

from statemachine.cli import main
from statemachine.durable import RunStatus
from statemachine.durable.temporal import TemporalRunHandle, TemporalRunner, open_store
from statemachine.durable.temporal._handle import open_handle
from statemachine.errors import RunHeldError, StoreUnavailableError, UsageError
from statemachine.testing import FunctionModel


def _runner(client: Any, queue: str, **options: Any) -> TemporalRunner:
    options.setdefault("tools", TOOLS)
    return TemporalRunner(
        client,
        models={"scripted": FunctionModel(answer)},
        task_queue=queue,
        before_tool_call=beta_needs_approval,
        heartbeat=1.0,
        **options,
    )


async def _until(handle: TemporalRunHandle, state: str) -> RunStatus:
    async with asyncio.timeout(40):
        while (status := await handle.status()).state != state:
            await asyncio.sleep(0.5)
    return status


async def _waiting_run(address: str, run_id: str, queue: str) -> None:
    """Start ``run_id`` and stop its worker once it waits for a person."""
    from temporalio.client import Client

    client = await Client.connect(address)
    async with _runner(client, queue) as first:
        await _until(await first.start(run_id, model="scripted", messages="go"), "waiting")


@pytest.mark.timeout(90)
def test_the_runs_are_listed_while_one_has_no_live_worker_which_is_marked(
    temporal_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"orphan-{uuid.uuid4().hex[:8]}"

    async def body() -> tuple[RunStatus, ...]:
        await _waiting_run(temporal_address, run_id, f"q-{uuid.uuid4().hex[:8]}")
        store = open_store(f"temporal://{temporal_address}/default")
        try:
            return await store.list_runs(limit=50)
        finally:
            store.close()

    listed = {r.run_id: r for r in asyncio.run(body())}
    assert listed[run_id].state == "running"
    assert "no worker" in listed[run_id].explanation
    db = f"temporal://{temporal_address}/default"
    assert main(["durable", "list", "--backend", "temporal", "--db", db]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(run_id))
    assert "no worker" in line


@pytest.mark.timeout(90)
def test_status_answers_right_after_a_killed_worker_restarts(
    temporal_address: str, tmp_path: Path
) -> None:
    """A worker process killed -9 while its run waits for a person, with Temporal's
    default sticky queue timeout (5 s): the new worker's first ``status()`` answers."""
    from temporalio.client import Client

    run_id = f"restart-{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    # The same application version as the worker below (its registry is another).
    env = dict(os.environ, TEMPORAL_STICKY="5", TEMPORAL_APP_VERSION="restart-1", PYTHONPATH=ROOT)
    args = [temporal_address, queue, run_id, str(tmp_path / "out.json"), "approvals"]
    worker = subprocess.Popen(
        [sys.executable, WORKER, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def body() -> RunStatus:
        client = await Client.connect(temporal_address)
        try:
            async with asyncio.timeout(40):
                while True:
                    assert worker.poll() is None, "the worker ended early"
                    with contextlib.suppress(UsageError, StoreUnavailableError):
                        handle = await open_handle(client, run_id)
                        if await handle.pending_approvals():
                            break
                    await asyncio.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        async with _runner(client, queue, app_version="restart-1") as again:
            return await again.status(run_id)  # the first look, at once

    status = asyncio.run(body())
    assert (status.state, [c.id for c in status.pending_approvals]) == ("waiting", ["t1b"])


@pytest.mark.timeout(90)
def test_a_decision_for_a_held_run_is_refused_with_run_held_error(temporal_address: str) -> None:
    """The run is woken by the decision itself (no other message came first): the
    worker that takes it does not fit, and the update is refused as held."""
    from temporalio.client import Client

    run_id = f"decide-{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    fast = {
        "workflow_task_timeout": 1.0,
        "worker_options": {"sticky_queue_schedule_to_start_timeout": timedelta(seconds=0.5)},
    }

    async def body() -> None:
        client = await Client.connect(temporal_address)
        async with _runner(client, queue, **fast) as first:
            await _until(await first.start(run_id, model="scripted", messages="go"), "waiting")
        async with _runner(client, queue, tools=[alpha], **fast) as lacking:
            handle = await lacking.handle(run_id)
            with pytest.raises(RunHeldError, match="held"):
                await handle.decide("t1b", True)
            assert (await _until(handle, "held")).held

    asyncio.run(body())


@pytest.mark.timeout(60)
def test_a_decision_no_worker_takes_in_time_is_the_librarys_error(temporal_address: str) -> None:
    from temporalio.client import Client

    run_id = f"unheard-{uuid.uuid4().hex[:8]}"

    async def body() -> None:
        await _waiting_run(temporal_address, run_id, f"q-{uuid.uuid4().hex[:8]}")
        client = await Client.connect(temporal_address)
        handle = TemporalRunHandle(client, run_id, message_timeout=2.0)
        with pytest.raises(StoreUnavailableError, match="within 2 s"):
            await handle.decide("t1b", True)

    asyncio.run(body())


@pytest.mark.timeout(120)
def test_a_tool_interrupted_by_a_kill_runs_again_only_on_a_worker_of_its_version(
    temporal_address: str, tmp_path: Path
) -> None:
    """A worker of version 1 is killed in the middle of a tool call; a worker of
    version 2 is given the retried call and refuses it (the call does not run there);
    a worker of version 1 runs it and the run ends."""
    from temporal_worker import echo, slow
    from temporalio.client import Client

    run_id = f"inflight-{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "effects.log"
    env = dict(
        os.environ, TEMPORAL_SIDE_EFFECTS=str(log), TEMPORAL_APP_VERSION="v1", PYTHONPATH=ROOT
    )
    args = [temporal_address, queue, run_id, str(tmp_path / "out.json"), "echo"]
    worker = subprocess.Popen(
        [sys.executable, WORKER, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def starts() -> int:
        lines = log.read_text().splitlines() if log.exists() else []
        return sum(1 for line in lines if line.startswith("start s1"))

    def runner(client: Any, version: str) -> TemporalRunner:
        return TemporalRunner(
            client,
            models={"scripted": FunctionModel(echo)},
            tools=[slow],
            task_queue=queue,
            heartbeat=1.0,
            retry_interval=0.1,
            app_version=version,
        )

    async def body() -> str:
        try:
            async with asyncio.timeout(40):
                while starts() == 0:
                    assert worker.poll() is None, "the worker ended early"
                    await asyncio.sleep(0.02)
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        client = await Client.connect(temporal_address)
        async with runner(client, "v2"):
            # Wait until this worker was given the retried call and refused it.
            async with asyncio.timeout(60):
                while True:
                    described = await client.get_workflow_handle(run_id).describe()
                    pending = described.raw_description.pending_activities
                    failure = pending[0].last_failure.message if pending else ""
                    if "waits for a worker of application version 'v1'" in failure:
                        break
                    await asyncio.sleep(0.2)
            assert starts() == 1  # the call did not run on version 2
        async with runner(client, "v1") as fitting:
            result = await (await fitting.handle(run_id)).result(timeout=60)
        return result.final_text

    os.environ["TEMPORAL_SIDE_EFFECTS"] = str(log)  # the in-process tool logs too
    try:
        final = asyncio.run(body())
    finally:
        del os.environ["TEMPORAL_SIDE_EFFECTS"]
    assert final.startswith("heard")
    assert starts() == 2  # once on the killed worker, once on the one of its version


@pytest.mark.timeout(120)
def test_a_long_tool_resumes_from_the_checkpoint_its_killed_attempt_recorded(
    temporal_address: str, tmp_path: Path
) -> None:
    from temporal_worker import echo, slow
    from temporalio.client import Client

    run_id = f"checkpoint-{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "effects.log"
    env = dict(
        os.environ,
        TEMPORAL_SIDE_EFFECTS=str(log),
        TEMPORAL_CHECKPOINT="1",
        TEMPORAL_APP_VERSION="cp",
        PYTHONPATH=ROOT,
    )
    args = [temporal_address, queue, run_id, str(tmp_path / "out.json"), "echo"]
    worker = subprocess.Popen(
        [sys.executable, WORKER, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def lines(kind: str) -> list[str]:
        found = log.read_text().splitlines() if log.exists() else []
        return [line.split()[1] for line in found if line.startswith(kind + " ")]

    async def body() -> None:
        try:
            async with asyncio.timeout(40):
                while not lines("checkpointed"):
                    assert worker.poll() is None, "the worker ended early"
                    await asyncio.sleep(0.02)
            # The SDK sends heartbeats at most every 0.8 heartbeat timeouts (1.5 s).
            await asyncio.sleep(2.0)
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        client = await Client.connect(temporal_address)
        again = TemporalRunner(
            client,
            models={"scripted": FunctionModel(echo)},
            tools=[slow],
            task_queue=queue,
            heartbeat=1.5,
            retry_interval=0.1,
            app_version="cp",
        )
        async with again:
            await (await again.handle(run_id)).result(timeout=60)

    saved = {k: os.environ.get(k) for k in ("TEMPORAL_SIDE_EFFECTS", "TEMPORAL_CHECKPOINT")}
    os.environ.update(TEMPORAL_SIDE_EFFECTS=str(log), TEMPORAL_CHECKPOINT="1")
    try:
        asyncio.run(body())
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert lines("resumed-from") == ["null", '{"step":1}']  # first attempt, then resumed


def test_a_checkpoint_outside_a_temporal_tool_is_refused() -> None:
    from statemachine.durable.temporal import checkpoint, last_checkpoint

    with pytest.raises(UsageError, match="Temporal worker"):
        checkpoint({"step": 1})
    assert last_checkpoint() is None


def test_a_checkpoint_is_json_of_bounded_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from temporalio import activity

    from statemachine.durable.temporal import _activities
    from statemachine.errors import InvalidInputError

    sent: list[object] = []
    monkeypatch.setattr(activity, "in_activity", lambda: True)
    monkeypatch.setattr(activity, "heartbeat", sent.append)
    token = _activities._checkpoint.set([])  # as a tool's activity sets it
    try:
        with pytest.raises(InvalidInputError, match="JSON"):
            _activities.checkpoint({"when": object()})
        with pytest.raises(InvalidInputError, match="at most 65536"):
            _activities.checkpoint("x" * _activities.MAX_CHECKPOINT_CHARS)
        _activities.checkpoint({"step": 2})
    finally:
        _activities._checkpoint.reset(token)
    assert sent == [{"step": 2}]
