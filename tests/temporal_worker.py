"""A Temporal worker process for tests/test_temporal_kill.py (killed -9 at will).

    python tests/temporal_worker.py ADDRESS QUEUE RUN_ID OUT MODE

MODE is "tools" (TEMPORAL_TURNS turns of two parallel tools, then the answer),
"approvals" (the same, beta needing a person), "reviewed" (the same as "tools" with
an output guardrail whose check is slow and logged, ``reviewed_steps``), "compacted"
(``durable_worker``'s, with its summariser and model logged: ``compacting_steps``), "typed"
(the same as "tools" with instructions, an output type and usage limits: ``typed``)
"echo" (one slow tool call, then the model repeats what the person said) or "asking"
(one call of ``ask_row``, which asks a person a question through the run, logs
``got`` with the answer and holds ``TOOL_HOLD`` seconds, then the model repeats its
result). The
worker starts RUN_ID (or finds it, after a restart), waits for its result and writes
it as JSON to OUT. With TEMPORAL_GO set it first imports everything and waits for
that file to exist (a test starts the next worker while the current one runs, to
save the imports). Every model call's, tool call's and guardrail check's start and
end is appended to the file named by TEMPORAL_SIDE_EFFECTS with the process id and
the idempotency key's run id, and synced, so a line survives a kill.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from durable_worker import TYPED_LIMITS, Tally, billing_instructions, result_json, tells_its_view

import statemachine as sm
from statemachine.agent.model import CallOptions
from statemachine.core.tools import ToolDefinition
from statemachine.durable import idempotency_key
from statemachine.steps import Step, compaction, output_guardrail

TOOL_DELAY = 0.25  # long enough for a test to kill the worker in the middle of a tool
MODEL_DELAY = 0.25
CHECK_DELAY = 0.25  # a guardrail's check, likewise
WORKER = str(Path(__file__).resolve())
ROOT = str(Path(__file__).resolve().parent.parent)


def _log(line: str) -> None:
    path = os.environ.get("TEMPORAL_SIDE_EFFECTS")
    if not path:
        return
    key = idempotency_key() or "-:"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} {os.getpid()} {key.rsplit(':', 1)[0]} {time.time():.3f}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def _side_effect(name: str, x: int) -> str:
    call = sm.current_tool_call()
    assert call is not None
    _log(f"start {call.id}")
    await asyncio.sleep(TOOL_DELAY if os.environ.get("TEMPORAL_SIDE_EFFECTS") else 0)
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


def turns() -> int:
    return int(os.environ.get("TEMPORAL_TURNS", "4"))


async def answer(
    messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]
) -> sm.AssistantMessage:
    """Keyed by the history, not by a call counter: the same after a restart."""
    turn = 1 + sum(isinstance(m, sm.AssistantMessage) for m in messages)
    _log(f"model m{turn}")
    await asyncio.sleep(MODEL_DELAY if os.environ.get("TEMPORAL_SIDE_EFFECTS") else 0)
    _log(f"answered m{turn}")
    if turn >= turns():
        return sm.AssistantMessage(f"done after {turn} turns")
    return sm.AssistantMessage(
        [
            sm.TextContent(f"turn {turn}: two tools"),
            sm.ToolCall(f"t{turn}a", "alpha", {"x": turn}),
            sm.ToolCall(f"t{turn}b", "beta", {"x": turn}),
        ]
    )


async def typed(
    messages: Sequence[sm.Message], tools: Sequence[ToolDefinition], options: CallOptions
) -> sm.AssistantMessage:
    """``answer``, saying the instructions it was given at each turn, then ending with
    the final result: a run that lost them after a kill has another history."""
    heard = options.instructions or "no instructions"
    reply = await answer(messages, tools)
    turn = 1 + sum(isinstance(m, sm.AssistantMessage) for m in messages)
    if turn >= turns():
        arguments = {"turns": turn, "heard": heard}
        return sm.AssistantMessage([sm.ToolCall(f"f{turn}", "final_result", arguments)])
    return sm.AssistantMessage([sm.TextContent(f"turn {turn} heard: {heard}"), *reply.tool_calls])


@sm.tool
async def slow() -> str:
    """Take a while."""
    _log("start s1")
    if os.environ.get("TEMPORAL_CHECKPOINT"):
        # A long tool that resumes: what the previous attempt recorded, then a mark.
        from statemachine.durable.temporal import checkpoint, last_checkpoint

        _log(f"resumed-from {json.dumps(last_checkpoint(), separators=(',', ':'))}")
        checkpoint({"step": 1})
        _log("checkpointed s1")
        await asyncio.sleep(4.0)
    await asyncio.sleep(1.0)
    _log("end s1")
    return "slept"


def echo(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    """Call the slow tool once, then repeat what the person said."""
    if not any(isinstance(m, sm.ToolResultMessage) for m in messages):
        return sm.AssistantMessage([sm.ToolCall("s1", "slow", {})])
    said = [
        b.text
        for m in messages
        if isinstance(m, sm.UserMessage)
        for b in m.content
        if isinstance(b, sm.TextContent)
    ]
    return sm.AssistantMessage("heard: " + " | ".join(said))


async def review_answer(text: str) -> str | None:
    """The "reviewed" runs' output guardrail check, logged as ``check rN``/``checked rN``
    (N: the turn of the answer it judges): the first answer is sent back once, keyed by
    its text (the same after a restart)."""
    label = "r" + text.split()[2]
    _log(f"check {label}")
    await asyncio.sleep(CHECK_DELAY if os.environ.get("TEMPORAL_SIDE_EFFECTS") else 0)
    _log(f"checked {label}")
    return "count again" if text == f"done after {turns()} turns" else None


def reviewed_steps() -> list[Step]:
    """The declared steps of the "reviewed" runs."""
    return [output_guardrail("review", review_answer)]


async def viewer(
    messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]
) -> sm.AssistantMessage:
    """The "compacted" runs' model: ``tells_its_view``, logged and slow as ``answer``."""
    seen = [int(m.tool_call_id[1:]) for m in messages if isinstance(m, sm.ToolResultMessage)]
    turn = 1 + max(seen, default=0)
    _log(f"model m{turn}")
    await asyncio.sleep(MODEL_DELAY if os.environ.get("TEMPORAL_SIDE_EFFECTS") else 0)
    _log(f"answered m{turn}")
    return tells_its_view(messages, tools)


async def summarize(messages: Sequence[sm.Message]) -> str:
    """The "compacted" runs' summariser, logged as ``check cN``/``checked cN`` (N: how
    many messages it summarises) and slow enough to be killed in."""
    _log(f"check c{len(messages)}")
    await asyncio.sleep(CHECK_DELAY if os.environ.get("TEMPORAL_SIDE_EFFECTS") else 0)
    _log(f"checked c{len(messages)}")
    return f"summary of {len(messages)} messages"


def compacting_steps() -> list[Step]:
    """The declared steps of the "compacted" runs (as ``durable_worker``'s)."""
    return [compaction(summarize, max_messages=5, keep_last=2)]


ROW = {"type": "object", "properties": {"row": {"type": "integer"}}, "required": ["row"]}
TOOL_HOLD = 1.0  # seconds ask_row holds after its answer: a test kills the worker in it


async def _ask_row(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
    from statemachine.agent.running import ask_person
    from statemachine.hooks import ToolQuestion

    def question(question_id: str, call: sm.ToolCall) -> ToolQuestion:
        return ToolQuestion(question_id, call.id, call.name, "Which row?", ROW, None, "test")

    call = sm.current_tool_call()
    assert call is not None
    _log(f"asked {call.id}")
    answer = await ask_person(question, signal)
    _log(f"got {call.id}")
    await asyncio.sleep(TOOL_HOLD)
    _log(f"end {call.id}")
    return f"got {json.dumps(answer, sort_keys=True)}"


ask_row = sm.Tool(sm.ToolDefinition("ask_row", "Ask a person for a row."), _ask_row)


def asking(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    """Call ``ask_row`` once, then repeat what it said."""
    said = [m.text for m in messages if isinstance(m, sm.ToolResultMessage)]
    if said:
        return sm.AssistantMessage(" | ".join(said))
    return sm.AssistantMessage([sm.ToolCall("a1", "ask_row", {})])


def beta_needs_approval(call: sm.ToolCall) -> sm.RequireApproval | None:
    return sm.RequireApproval("beta needs a person") if call.name == "beta" else None


async def main(address: str, queue: str, run_id: str, out: str, mode: str) -> None:
    from temporalio.client import Client

    from statemachine.durable.temporal import TemporalRunner
    from statemachine.testing import FunctionModel

    go = os.environ.get("TEMPORAL_GO")
    while go and not os.path.exists(go):
        time.sleep(0.005)
    client = await Client.connect(address)
    models = {"echo": echo, "typed": typed, "compacted": viewer, "asking": asking}
    model: Any = models.get(mode, answer)
    # How long a task waits for this worker's sticky queue (Temporal's default is 5 s).
    sticky = float(os.environ.get("TEMPORAL_STICKY", "0.5"))
    runner = TemporalRunner(
        client,
        models={"scripted": FunctionModel(model)},
        tools={"echo": [slow], "asking": [ask_row]}.get(mode, TOOLS),
        task_queue=queue,
        before_tool_call=beta_needs_approval if mode == "approvals" else None,
        heartbeat=1.5,  # a killed worker's call is retried 1.5 s later
        retry_interval=0.1,
        workflow_task_timeout=1.0,
        worker_options={"sticky_queue_schedule_to_start_timeout": timedelta(seconds=sticky)},
        instructions={"billing": billing_instructions},
        output_types={"tally": Tally},
        app_version=os.environ.get("TEMPORAL_APP_VERSION") or None,  # None: the default
        steps={"reviewed": reviewed_steps, "compacted": compacting_steps}.get(mode, list)(),
    )
    options: dict[str, Any] = {}
    if mode == "typed":
        options = {"instructions": "billing", "output_type": "tally", "usage_limits": TYPED_LIMITS}
    async with runner:
        handle = await runner.start(run_id, model="scripted", messages="go", **options)
        result = await handle.result()
    with open(out + ".tmp", "w") as f:
        json.dump(result_json(result), f)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
    # Done (OUT written): leave without the interpreter's teardown, in which the
    # Temporal SDK's native runtime sometimes crashes (SIGSEGV) after its work.
    sys.stdout.flush()
    os._exit(0)
