"""No acknowledged message to a durable run is lost: a property over interleavings of
steers, follow-ups, decisions and aborts sent to a run while a tool runs or while it
waits for a person. Every steer or follow-up whose ``steer()``/``follow_up()`` returned
is in the run's history or in its ``queued_input``, exactly once; one refused with
``RunClosedError`` is in neither. PostgreSQL runs under `bash .ci/postgres.sh`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import database_urls

import statemachine as sm
from statemachine.core.tools import ToolDefinition
from statemachine.durable import NotPendingError, RunClosedError, idempotency_key
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner
from statemachine.testing import FunctionModel

_gates: dict[str, asyncio.Event] = {}  # run id -> opens its tool


@sm.tool
async def slow() -> str:
    """Wait until the test opens the gate (or the run is aborted)."""
    key = idempotency_key()
    assert key is not None
    await _gates[key.rsplit(":", 1)[0]].wait()
    return "opened"


@sm.tool
async def guarded() -> str:
    """A tool a person must approve."""
    return "guarded ran"


def _needs_a_person(call: sm.ToolCall) -> sm.RequireApproval | None:
    return sm.RequireApproval("a person decides") if call.name == "guarded" else None


def _texts(message: sm.Message) -> list[str]:
    return [b.text for b in getattr(message, "content", ()) if isinstance(b, sm.TextContent)]


def _model(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    """First a tool (the gate, or one a person must approve), then a final answer."""
    if not any(isinstance(m, sm.AssistantMessage) for m in messages):
        first = _texts(messages[0])[0]
        name = "guarded" if first == "approval" else "slow"
        return sm.AssistantMessage([sm.ToolCall("c1", name, {})])
    return sm.AssistantMessage(f"heard {len(messages)} messages")


# A step of a script: messages sent at once, an abort, a decision, the gate opened.
_messages = st.lists(st.sampled_from(["steer", "follow_up"]), min_size=1, max_size=6)
_step = st.one_of(
    _messages.map(lambda kinds: ("send", kinds)),
    st.just(("abort", None)),
    st.booleans().map(lambda approve: ("decide", approve)),
    st.just(("open", None)),
)
_scripts = st.tuples(st.sampled_from(["tool", "approval"]), st.lists(_step, max_size=6))


async def _send(handle: DBOSRunHandle, kind: str, text: str) -> bool:
    """Whether the message was acknowledged (else the run had ended: refused)."""
    try:
        if kind == "steer":
            await handle.steer(text)
        else:
            await handle.follow_up(text)
    except RunClosedError:
        return False
    return True


async def _play(runner: DBOSRunner, run_id: str, script: tuple[str, list[Any]]) -> None:
    start, steps = script
    gate = _gates[run_id] = asyncio.Event()
    handle = await runner.start(run_id, model="m", messages=start)
    for _ in range(600):  # until the tool runs or the run waits for a person
        if (await handle.status()).state == "waiting" or start == "tool":
            break
        await asyncio.sleep(0.05)
    acknowledged: list[str] = []
    refused: list[str] = []
    count = 0
    for what, arg in steps:
        if what == "send":
            texts = [f"{run_id}-m{count + i}" for i in range(len(arg))]
            count += len(arg)
            sent = await asyncio.gather(
                *(_send(handle, k, t) for k, t in zip(arg, texts, strict=True))
            )
            for text, ok in zip(texts, sent, strict=True):
                (acknowledged if ok else refused).append(text)
        elif what == "abort":
            await handle.abort("the test aborts")
        elif what == "decide":
            try:
                await handle.decide("c1", arg)
            except NotPendingError:
                pass  # not waiting (a tool run, or decided or aborted already)
        else:
            gate.set()
    gate.set()
    for call in await handle.pending_approvals():
        try:
            await handle.decide(call.id, True)
        except NotPendingError:
            pass
    result = await handle.result(timeout=60)
    history = [t for m in result.messages if isinstance(m, sm.UserMessage) for t in _texts(m)]
    queued = [t for e in result.queued_input for t in _texts(e.message)]
    seen = history + queued
    lost = [t for t in acknowledged if seen.count(t) != 1]
    assert not lost, f"acknowledged but lost or doubled: {lost} ({result.state})"
    assert not [t for t in refused if t in seen], "a refused message reached the run"
    calls = {
        b.id for m in result.messages if isinstance(m, sm.AssistantMessage) for b in m.tool_calls
    }
    answered = {m.tool_call_id for m in result.messages if isinstance(m, sm.ToolResultMessage)}
    assert calls == answered  # I6


def _property(database_url: str, examples: int) -> None:
    runner = DBOSRunner(
        models={"m": FunctionModel(_model)},
        tools=[slow, guarded],
        before_tool_call=_needs_a_person,
        database_url=database_url,
        notification_interval=0.05,
    )
    runs = iter(range(1_000_000))

    async def launch() -> None:
        runner.launch()

    with asyncio.Runner() as aio:
        aio.run(launch())
        try:

            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(script=_scripts)
            def check(script: tuple[str, list[Any]]) -> None:
                aio.run(asyncio.wait_for(_play(runner, f"r{next(runs)}", script), 120))

            check()
        finally:
            runner.destroy()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


@pytest.mark.timeout(400)
def test_no_acknowledged_message_is_lost(database: Callable[[str], str]) -> None:
    _property(database("runs"), examples=15)
