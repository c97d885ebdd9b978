"""Temporal's Replayer over recorded histories of durable runs: a change of this
library's workflow code (the engine, the action loop, the course of a run) that
would make a waiting run replay differently fails here, in CI, not on a deploy.

The histories in tests/fixtures/temporal/ were recorded from a plain run and from a
run that waited for approvals, on the tools of tests/durable_worker.py. Record them
again (after a change that is meant to break old runs: say so in the changelog) with

    PYTHONPATH=. python tests/test_temporal_replay.py ADDRESS

against a running ``temporal server start-dev``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from durable_worker import TOOLS, answer, beta_needs_approval

import statemachine as sm
from statemachine.testing import FunctionModel

if os.environ.get("CI") == "true":
    import temporalio  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("temporalio")

from temporalio.client import Client, WorkflowHistory

from statemachine.durable.temporal import TemporalRunner

FIXTURES = Path(__file__).parent / "fixtures" / "temporal"
RECORDED = {"plain": None, "approvals": beta_needs_approval}


def _runner(client: Client | None, name: str, queue: str = "statemachine") -> TemporalRunner:
    return TemporalRunner(
        client,  # type: ignore[arg-type] # a replay needs no client
        models={"scripted": FunctionModel(answer)},
        tools=TOOLS,
        task_queue=queue,
        before_tool_call=RECORDED[name],
    )


def _history(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(f"{name}-run", (FIXTURES / f"{name}.json").read_text())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_recorded_history_replays_on_this_code(name: str) -> None:
    asyncio.run(_runner(None, name).replay([_history(name)]))


@pytest.mark.timeout(60)
def test_a_change_that_breaks_determinism_fails_the_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from statemachine.agent.executor import TOOL
    from statemachine.durable.temporal._run import TemporalBackend

    # A change of the workflow's code: a batch's tools started in reverse order.
    start = TemporalBackend.start
    batch: list[Any] = []

    def reversed_start(self: TemporalBackend, driver: Any, op: Any) -> None:
        if op.kind != TOOL:
            start(self, driver, op)
            return
        batch.append(op)
        if op.key.endswith("b"):
            for held in reversed(batch):
                start(self, driver, held)
            batch.clear()

    monkeypatch.setattr(TemporalBackend, "start", reversed_start)
    # Temporal compares only the activities' types; the run checks that each recorded
    # result answers the call started in its place, and holds the run otherwise.
    with pytest.raises(RuntimeError, match=r"does not fit this code: .* 't1b' answers \['t1a'\]"):
        asyncio.run(_runner(None, "plain").replay([_history("plain")]))


async def _record(address: str) -> None:
    client = await Client.connect(address)
    for name in RECORDED:
        async with _runner(client, name, f"record-{uuid.uuid4().hex[:6]}") as runner:
            handle = await runner.start(f"{name}-run", model="scripted", messages="go")
            while not (result := await _step(handle)):
                pass
            history = await client.get_workflow_handle(f"{name}-run").fetch_history()
            (FIXTURES / f"{name}.json").write_text(history.to_json())
            print(name, result.state, len(history.events))


async def _step(handle: object) -> sm.RunResult | None:
    from statemachine.durable.temporal import TemporalRunHandle

    assert isinstance(handle, TemporalRunHandle)
    for call in await handle.pending_approvals():
        await handle.decide(call.id, True)
    status = await handle.status()
    if status.state == "finished":
        return await handle.result()
    await asyncio.sleep(0.1)
    return None


if __name__ == "__main__":
    asyncio.run(_record(sys.argv[1]))
