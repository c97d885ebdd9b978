"""A durable-run worker process for tests/test_durable_dbos.py (killed -9 at will).

    python tests/durable_worker.py DB_URL RUN_ID OUT [approvals]

Starts the run RUN_ID (or takes it back after a restart), waits for its result and
writes it as JSON to OUT. Every tool start and end is appended to the file named by
DURABLE_SIDE_EFFECTS, with the process id, and synced, so a line survives a kill.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import statemachine as sm
from statemachine.core.tools import ToolDefinition
from statemachine.core.wire import messages_to_dicts
from statemachine.testing import FunctionModel

TURNS = 4  # three turns of two parallel tool calls, then the answer
TOOL_DELAY = 0.04


def _log(line: str) -> None:
    path = os.environ.get("DURABLE_SIDE_EFFECTS")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} {os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def _side_effect(name: str, x: int) -> str:
    call = sm.current_tool_call()
    assert call is not None
    _log(f"start {call.id}")
    # Different durations: the tools finish in another order than they were called.
    await asyncio.sleep(TOOL_DELAY * (1 + (x + (name == "beta")) % 3))
    _log(f"end {call.id}")
    return f"{name}({x})={x * x if name == 'alpha' else x + 1000}"


@sm.tool
async def alpha(x: int) -> str:
    """Square a number.

    Args:
        x: the number
    """
    return await _side_effect("alpha", x)


@sm.tool
async def beta(x: int) -> str:
    """Add a thousand.

    Args:
        x: the number
    """
    return await _side_effect("beta", x)


TOOLS = [alpha, beta]


def answer(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    """Keyed by the history, not by a call counter: the same after a restart."""
    turn = 1 + sum(isinstance(m, sm.AssistantMessage) for m in messages)
    if turn >= TURNS:
        return sm.AssistantMessage(f"done after {turn} turns")
    return sm.AssistantMessage(
        [
            sm.TextContent(f"turn {turn}: two tools"),
            sm.ToolCall(f"t{turn}a", "alpha", {"x": turn}),
            sm.ToolCall(f"t{turn}b", "beta", {"x": turn}),
        ]
    )


def beta_needs_approval(call: sm.ToolCall) -> sm.RequireApproval | None:
    return sm.RequireApproval("beta needs a person") if call.name == "beta" else None


def _run_tools_outside_their_steps() -> None:
    """A broken backend, for showing that the kill trials' check can fail: every tool
    call also runs outside its step, so a recovery runs finished calls again."""
    from dbos import DBOS

    recorded = DBOS.run_step_async

    async def run_step(options: Any, func: Any) -> Any:
        if options.get("name") == "statemachine.tool":
            await func()
        return await recorded(options, func)

    dbos: Any = DBOS  # typed as DBOS's own; replaced here on purpose
    dbos.run_step_async = run_step


def result_json(result: sm.RunResult) -> dict[str, Any]:
    return {
        "state": result.state.value,
        "messages": messages_to_dicts(result.messages),
        "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in result.trace],
    }


async def main(db_url: str, run_id: str, out: str, mode: str) -> None:
    from statemachine.durable.dbos import DBOSRunner

    if mode == "broken":
        _run_tools_outside_their_steps()
    hook = beta_needs_approval if mode == "approvals" else None
    runner = DBOSRunner(
        models={"scripted": FunctionModel(answer)},
        tools=TOOLS,
        database_url=db_url,
        before_tool_call=hook,
    )
    runner.launch()
    try:
        handle = await runner.start(run_id, model="scripted", messages="go")
        result = await handle.result()
    finally:
        runner.destroy()
    with open(out + ".tmp", "w") as f:
        json.dump(result_json(result), f)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    mode = sys.argv[4] if len(sys.argv) > 4 else ""
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], mode))
