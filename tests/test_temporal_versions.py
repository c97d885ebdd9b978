"""Changing code while durable runs on Temporal wait: each case has a named outcome.

- A worker whose registry lacks a tool the run uses (or adds or drops a
  ``before_tool_call`` or ``should_continue`` hook, or runs another transition
  table) does not replay the run: it fails the workflow task, the run is ``held``
  (``status().held`` names the tool or hook, ``result()`` raises ``RunHeldError``),
  and a worker whose code fits takes it over and finishes it.
- A tool whose code changed while the run waited: the run goes on with the new code
  (the recorded results stay those of the old one).
- A change of this library's workflow code that replays differently: the Replayer
  test (test_temporal_replay.py).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
from durable_worker import TOOLS, alpha, answer, beta_needs_approval
from temporal_support import temporal_server  # noqa: F401 - the session's server

import statemachine as sm
from statemachine.durable import RunStatus
from statemachine.durable.temporal import TemporalRunHandle, TemporalRunner
from statemachine.errors import RunHeldError
from statemachine.testing import FunctionModel


def _runner(client: Any, queue: str, tools: list[sm.Tool], **options: Any) -> TemporalRunner:
    return TemporalRunner(
        client,
        models={"scripted": FunctionModel(answer)},
        tools=tools,
        task_queue=queue,
        before_tool_call=beta_needs_approval,
        heartbeat=1.0,
        workflow_task_timeout=1.0,
        worker_options={"sticky_queue_schedule_to_start_timeout": timedelta(seconds=0.5)},
        **options,
    )


async def _until(handle: TemporalRunHandle, state: str) -> RunStatus:
    # Not too often: each look at a running run is a query, which the server holds
    # while the run's workflow task is being tried.
    async with asyncio.timeout(40):
        while (status := await handle.status()).state != state:
            await asyncio.sleep(0.5)
    return status


@pytest.mark.timeout(90)
def test_a_worker_without_a_tool_the_run_uses_holds_it_naming_the_tool(
    temporal_address: str, caplog: pytest.LogCaptureFixture
) -> None:
    from temporalio.client import Client

    async def body() -> sm.RunResult:
        client = await Client.connect(temporal_address)
        queue = f"q-{uuid.uuid4().hex[:8]}"
        async with _runner(client, queue, TOOLS) as first:
            handle = await first.start("versions", model="scripted", messages="go")
            await _until(handle, "waiting")
        # A deploy that dropped beta: the run waits for a decision on beta.
        async with _runner(client, queue, [alpha]) as lacking:
            # Anything that wakes the run hands it to this worker (here a signal that
            # no handler takes), which holds it.
            await client.get_workflow_handle("versions").signal("nothing-to-see")
            status = await _until(handle, "held")
            assert status.held
            with pytest.raises(RunHeldError, match="held"):
                await handle.decide("t1b", True)  # refused at once
            with pytest.raises(RunHeldError, match="held"):
                await handle.result(timeout=5)
            with pytest.raises(RunHeldError, match="tool 'beta' is not in this worker's"):
                await lacking.resume_held("versions")  # this worker's code does not fit
        # The worker said why, naming the tool (in its log: Temporal keeps only the
        # first failure of a workflow task in the run's history).
        named = "tool 'beta' is not in this worker's registry"
        assert any(named in r.getMessage() + str(r.exc_info) for r in caplog.records)
        # The code that fits comes back: the run goes on where it waited.
        async with _runner(client, queue, TOOLS):
            for call in ("t1b", "t2b", "t3b"):
                async with asyncio.timeout(60):
                    while [c.id for c in await handle.pending_approvals()] != [call]:
                        await asyncio.sleep(0.05)
                await handle.decide(call, True)
            return await handle.result(timeout=30)

    result = asyncio.run(body())
    assert result.ok
    texts = [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert "beta(1)=1001" in texts


@sm.tool(name="beta")
async def beta_v2(x: int) -> str:
    """Add a thousand.

    Args:
        x: the number
    """
    return f"beta v2({x})={x + 1000}"


@pytest.mark.timeout(90)
def test_a_tool_whose_code_changed_while_the_run_waited_runs_its_new_code(
    temporal_address: str,
) -> None:
    from temporalio.client import Client

    async def body() -> sm.RunResult:
        client = await Client.connect(temporal_address)
        queue = f"q-{uuid.uuid4().hex[:8]}"
        # One application version kept across the deploy (by default the version
        # changes with a tool's code, and the run waits for a worker of its own).
        async with _runner(client, queue, TOOLS, app_version="billing") as first:
            handle = await first.start("changed", model="scripted", messages="go")
            await _until(handle, "waiting")
        async with _runner(client, queue, [alpha, beta_v2], app_version="billing"):
            for call in ("t1b", "t2b", "t3b"):
                async with asyncio.timeout(30):
                    while [c.id for c in await handle.pending_approvals()] != [call]:
                        await asyncio.sleep(0.05)
                await handle.decide(call, True)
            return await handle.result(timeout=30)

    result = asyncio.run(body())
    assert result.ok
    texts = [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert "beta v2(1)=1001" in texts  # decided after the change: the new code ran
