"""The idle-skipping event loop that run_conformance runs scenarios on."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from statemachine.testing import (
    AbortAt,
    AbortKind,
    ModelTurn,
    OnAbort,
    Scenario,
    ScriptedCall,
    ToolBehaviour,
    agent_loop,
    bridge_loop,
    run_scenario_async,
)
from statemachine.testing.clock import IdleSkippingLoop, needs_real_time

_T = TypeVar("_T")


def _on_skipping_loop(main: Callable[[IdleSkippingLoop], Coroutine[Any, Any, _T]]) -> _T:
    with asyncio.Runner(loop_factory=IdleSkippingLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, IdleSkippingLoop)
        return runner.run(main(loop))


def test_idle_waits_for_timers_are_skipped() -> None:
    async def main(loop: IdleSkippingLoop) -> tuple[float, int]:
        start = loop.time()
        await asyncio.sleep(5)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 30)
        return loop.time() - start, loop.skipped_waits

    real = time.monotonic()
    elapsed, skipped = _on_skipping_loop(main)
    assert elapsed >= 35  # the loop's clock went through both waits...
    assert skipped == 2
    # ...without sleeping through them (35 s of waiting; any machine is far faster).
    assert time.monotonic() - real < 30


def test_a_busy_loop_still_meets_a_timeout_in_real_time() -> None:
    # Time never runs slower than real time: a coroutine that never waits is stopped
    # by a timeout all the same (it would spin forever if the clock only skipped).
    async def spin() -> None:
        while True:
            await asyncio.sleep(0)

    async def main(loop: IdleSkippingLoop) -> int:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(spin(), 0.05)
        return loop.skipped_waits

    assert _on_skipping_loop(main) == 0


def test_a_thread_job_is_waited_for_not_skipped() -> None:
    # While an executor job runs, a timer must not be made due early: the job would
    # finish after a timeout that never really elapsed.
    async def main(loop: IdleSkippingLoop) -> str:
        return await asyncio.wait_for(asyncio.to_thread(_slow, "done"), 10)

    assert _on_skipping_loop(main) == "done"


def _slow(value: str) -> str:
    time.sleep(0.05)
    return value


def test_a_registered_descriptor_is_waited_for_not_skipped() -> None:
    # Data arriving on a socket wakes the loop: with a reader registered, waits are real.
    async def main(loop: IdleSkippingLoop) -> bytes:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        sender = threading.Timer(0.05, theirs.send, args=(b"ping",))
        sender.start()
        try:
            return await asyncio.wait_for(loop.sock_recv(ours, 4), 10)
        finally:
            sender.join()
            ours.close()
            theirs.close()

    assert _on_skipping_loop(main) == b"ping"


def test_a_hanging_tool_costs_the_loop_grace_period_in_skipped_time_only() -> None:
    # The abort fires as the call starts; the tool ignores it and hangs, so run_agent
    # waits its grace period (here 30 s), then its second one, then gives the call a
    # cancelled result. On the skipping loop that is a clock jump, not a wait.
    hanging = ScriptedCall(behaviour=ToolBehaviour(on_abort=OnAbort.HANG))
    scenario = Scenario(
        turns=(ModelTurn(calls=(hanging,), stop_reason="toolUse"), ModelTurn(text="done")),
        abort=AbortAt(AbortKind.TOOL_START, turn=1, call=0),
    )

    async def main(loop: IdleSkippingLoop) -> tuple[Any, int]:
        record = await run_scenario_async(
            agent_loop(grace_period=30.0), scenario, timeout=600, hang_limit=300
        )
        return record, loop.skipped_waits

    real = time.monotonic()
    record, skipped = _on_skipping_loop(main)
    assert skipped >= 1
    assert time.monotonic() - real < 30
    assert record.error is None
    assert record.result is not None
    assert record.result.state.value == "Aborted"
    [execution] = record.executions
    assert execution.how == "cancelled"


def test_bridge_loops_ask_for_real_time() -> None:
    assert needs_real_time(bridge_loop(["true"]))
    assert not needs_real_time(agent_loop())
