"""A durable run's instructions, output type and usage limits on Temporal: named in
the worker's registry (instructions and output types are code, like tools) or
carried in the run's input (limits), so the run ends as ``run_agent``'s with the
same options, its ``result().output`` typed through a runner's handle and the
validated JSON object through a store's, also when its workers are killed -9 (the
harness of test_temporal_kill.py). On a real dev server
(temporal_support.temporal_address); the DBOS backend's are in
test_durable_options.py.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from durable_worker import (
    TOOLS,
    TYPED_LIMITS,
    Tally,
    answer,
    beta_needs_approval,
    billing_instructions,
    reference_run,
    result_json,
    typed_answer,
)
from temporal_support import temporal_server  # noqa: F401 - the session's server
from temporal_worker import TOOLS as WORKER_TOOLS
from temporal_worker import typed
from test_temporal_kill import MID_MODEL, MID_TOOL, Trials, _attempts, _check
from test_temporal_versions import _until

import statemachine as sm
from statemachine.durable.temporal import TemporalRunner, open_store
from statemachine.errors import InvalidInputError, RunHeldError, UsageError
from statemachine.journal import replay
from statemachine.testing import FunctionModel

TYPED: dict[str, Any] = {
    "instructions": "billing",
    "output_type": "tally",
    "usage_limits": TYPED_LIMITS,
}
IN_MEMORY: dict[str, Any] = {  # the same options, for run_agent
    "instructions": billing_instructions,
    "output_type": Tally,
    "usage_limits": TYPED_LIMITS,
}


def _runner(client: Any, queue: str, **options: Any) -> TemporalRunner:
    options.setdefault("instructions", {"billing": billing_instructions})
    options.setdefault("output_types", {"tally": Tally})
    return TemporalRunner(
        client,
        models={"typed": FunctionModel(typed_answer), "scripted": FunctionModel(answer)},
        tools=TOOLS,
        task_queue=queue,
        heartbeat=1.0,
        workflow_task_timeout=1.0,
        worker_options={"sticky_queue_schedule_to_start_timeout": timedelta(seconds=0.5)},
        **options,
    )


async def _client(address: str) -> Any:
    from temporalio.client import Client

    return await Client.connect(address)


def _queue() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.mark.timeout(90)
def test_a_typed_run_with_instructions_ends_as_in_memory_and_its_export_replays(
    temporal_address: str, tmp_path: Path
) -> None:
    async def body() -> tuple[sm.RunResult, sm.RunResult, Any]:
        runner = _runner(await _client(temporal_address), _queue())
        async with runner:
            handle = await runner.start("typed", model="typed", messages="go", **TYPED)
            result = await handle.result(timeout=30)
            queued = await runner.enqueue(
                "typed-queued", queue=runner.task_queue, model="typed", messages="go", **TYPED
            )
            enqueued = await queued.result(timeout=30)
            await runner.export_journal("typed", tmp_path / "typed.jsonl")
            store = open_store(f"temporal://{temporal_address}/default")
            try:
                seen_elsewhere = (await (await store.handle("typed")).result(timeout=10)).output
                await store.export_journal("typed", tmp_path / "typed-store.jsonl")
            finally:
                store.close()
        return result, enqueued, seen_elsewhere

    result, enqueued, seen_elsewhere = asyncio.run(body())
    expected = reference_run("typed")
    assert result_json(result) == result_json(expected)
    assert result_json(enqueued) == result_json(expected)
    assert result.output == Tally(4, "turn 4: answer with a Tally")
    # The model heard the instructions the function gave at each turn.
    texts = [m.text for m in result.messages if isinstance(m, sm.AssistantMessage)]
    assert "turn 2 heard: turn 2: answer with a Tally" in texts
    # A process without the registry gets the validated JSON object.
    assert seen_elsewhere == {"turns": 4, "heard": "turn 4: answer with a Tally"}
    for exported in ("typed.jsonl", "typed-store.jsonl"):  # rebuilt with the output type
        replayed = replay(tmp_path / exported)
        assert replayed.ok
        assert replayed.state is expected.state
        assert replayed.messages == expected.messages
        assert replayed.trace == expected.trace


@pytest.mark.timeout(60)
def test_usage_limits_end_a_run_on_temporal_as_they_end_run_agent(
    temporal_address: str, tmp_path: Path
) -> None:
    limits = sm.UsageLimits(requests=2)

    async def body() -> sm.RunResult:
        async with _runner(await _client(temporal_address), _queue()) as runner:
            handle = await runner.start(
                "limited", model="scripted", messages="go", usage_limits=limits
            )
            result = await handle.result(timeout=30)
            await runner.export_journal("limited", tmp_path / "limited.jsonl")
            return result

    result = asyncio.run(body())
    expected = asyncio.run(
        sm.run_agent(model=FunctionModel(answer), tools=TOOLS, messages="go", usage_limits=limits)
    )
    assert result.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    assert result_json(result) == result_json(expected)
    assert result.explanation == expected.explanation
    replayed = replay(tmp_path / "limited.jsonl")  # rebuilt with the limits
    assert replayed.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    assert replayed.messages == expected.messages


class _NoOptions:
    """A model client whose ``complete`` takes no ``options``: no instructions."""

    async def complete(self, messages: Any, tools: Any, signal: Any) -> sm.AssistantMessage:
        return sm.AssistantMessage("no options")


@pytest.mark.timeout(120)
def test_names_outside_the_registry_are_refused_and_a_run_whose_type_is_gone_is_held(
    temporal_address: str,
) -> None:
    with pytest.raises(InvalidInputError, match="instructions must be a str or a function"):
        _runner(None, "q", instructions={"bad": 3})
    with pytest.raises(InvalidInputError, match="output_type"):
        _runner(None, "q", output_types={"bad": complex})

    async def body() -> tuple[str, sm.RunResult]:
        client = await _client(temporal_address)
        queue = _queue()
        async with _runner(client, queue, before_tool_call=beta_needs_approval) as first:
            cases: list[tuple[dict[str, Any], str]] = [
                ({"instructions": "nope"}, "unknown instructions 'nope'; known: ['billing']"),
                ({"output_type": "nope"}, "unknown output type 'nope'; known: ['tally']"),
                ({"usage_limits": {"requests": 2}}, "usage_limits must be a UsageLimits"),
            ]
            for options, error in cases:
                with pytest.raises(InvalidInputError, match=re.escape(error)):
                    await first.start("x", model="typed", messages="go", **options)
                with pytest.raises(InvalidInputError, match=re.escape(error)):
                    await first.enqueue("x", queue=queue, model="typed", messages="go", **options)
            handle = await first.start("gone", model="typed", messages="go", **TYPED)
            await _until(handle, "waiting")
        # A deploy that dropped the output type: the run waits for a decision on beta.
        async with _runner(
            client, queue, before_tool_call=beta_needs_approval, output_types={}
        ) as lacking:
            await client.get_workflow_handle("gone").signal("nothing-to-see")  # wakes it
            status = await _until(handle, "held")
            with pytest.raises(RunHeldError, match="held"):
                await handle.result(timeout=5)
            with pytest.raises(RunHeldError, match="output type 'tally' is not in this worker's"):
                await lacking.resume_held("gone")
        # The code that fits comes back: the run goes on where it waited, typed.
        async with _runner(client, queue, before_tool_call=beta_needs_approval) as fits:
            for call in ("t1b", "t2b", "t3b"):
                async with asyncio.timeout(60):
                    while [c.id for c in await handle.pending_approvals()] != [call]:
                        await asyncio.sleep(0.05)
                await handle.decide(call, True)
            return status.held, await (await fits.handle("gone")).result(timeout=30)

    held, result = asyncio.run(body())
    assert "output type 'tally' is not in this worker's registry" in held
    assert result.output == Tally(4, "turn 4: answer with a Tally")


@pytest.mark.timeout(60)
def test_a_client_that_cannot_send_instructions_is_refused_at_start(
    temporal_address: str,
) -> None:
    async def body() -> None:
        runner = TemporalRunner(
            await _client(temporal_address),
            models={"plain": _NoOptions()},
            task_queue=_queue(),
            instructions={"billing": "be brief"},
        )
        with pytest.raises(UsageError, match="cannot receive instructions"):
            await runner.start("plain", model="plain", messages="go", instructions="billing")

    asyncio.run(body())


@pytest.mark.timeout(180)
def test_workers_killed_during_a_typed_run_leave_the_in_memory_history_and_output(
    temporal_address: str, tmp_path: Path
) -> None:
    reference = asyncio.run(
        sm.run_agent(model=FunctionModel(typed), tools=WORKER_TOOLS, messages="go", **IN_MEMORY)
    )
    plan = ["model", "tool", "model", "tool", "model"]

    async def body() -> int:
        trials = Trials(temporal_address, tmp_path, "typed", 4)
        try:
            for point in plan:
                await trials.kill_when(MID_TOOL if point == "tool" else MID_MODEL)
            async with asyncio.timeout(90):
                while trials.current.poll() is None:
                    await asyncio.sleep(0.05)
            assert trials.current.returncode == 0
        finally:
            trials.close()
        # The history, trace and typed output of the same run in memory; no finished
        # call ran again.
        _check(trials, await _attempts(temporal_address, trials.run_id), result_json(reference))
        return len(trials.killed)

    assert asyncio.run(body()) == len(plan)
    assert reference.output == Tally(4, "turn 4: answer with a Tally")
