"""No acknowledged message to a durable run is lost: a property over interleavings of
steers, follow-ups, decisions and aborts sent to a run while a tool runs or while it
waits for a person. Every steer or follow-up whose ``steer()``/``follow_up()`` returned
is in the run's history or in its ``queued_input``, exactly once; one refused with
``RunClosedError`` is in neither. The kill variant runs each script against worker
processes (tests/durable_worker.py) and kills them -9 at its "kill" steps, a new
worker taking the run back; it runs a few examples by default, many more under
``HYPOTHESIS_PROFILE=thorough``. PostgreSQL runs under `bash .ci/postgres.sh`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
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

from durable_worker import database_urls, guarded, guarded_needs_a_person, kill, start_worker

import statemachine as sm
from statemachine.core.tools import ToolDefinition
from statemachine.durable import NotPendingError, RunClosedError, idempotency_key
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner, connect
from statemachine.testing import FunctionModel

_gates: dict[str, asyncio.Event] = {}  # run id -> opens its tool
_entered: set[str] = set()  # the runs whose tool waits at its gate


@sm.tool
async def slow() -> str:
    """Wait until the test opens the gate (or the run is aborted)."""
    key = idempotency_key()
    assert key is not None
    run_id = key.rsplit(":", 1)[0]
    _entered.add(run_id)
    await _gates[run_id].wait()
    return "opened"


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


async def _steps(
    handle: DBOSRunHandle, run_id: str, steps: list[Any], others: dict[str, Callable[[], Any]]
) -> tuple[list[str], list[str]]:
    """Play a script's steps on the run (``others``: what "open", "kill" do); the
    messages acknowledged and those refused."""
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
            others[what]()
    return acknowledged, refused


async def _approve_all(calls: Sequence[sm.ToolCall], handle: DBOSRunHandle) -> None:
    for call in calls:
        try:
            await handle.decide(call.id, True)
        except NotPendingError:
            pass  # decided or ended meanwhile


async def _play(runner: DBOSRunner, run_id: str, script: tuple[str, list[Any]]) -> None:
    start, steps = script
    gate = _gates[run_id] = asyncio.Event()
    handle = await runner.start(run_id, model="m", messages=start)
    for _ in range(600):  # until the tool runs or the run waits for a person
        if (await handle.status()).state == "waiting" or start == "tool":
            break
        await asyncio.sleep(0.05)
    acknowledged, refused = await _steps(handle, run_id, steps, {"open": gate.set})
    gate.set()
    await _approve_all(await handle.pending_approvals(), handle)
    _nothing_lost(await handle.result(timeout=60), acknowledged, refused)


def _nothing_lost(result: sm.RunResult, acknowledged: list[str], refused: list[str]) -> None:
    """Every acknowledged message reached the run exactly once, no refused one did,
    and every call is answered (I6)."""
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
        before_tool_call=guarded_needs_a_person,
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


FLOOD = 300  # steers sent while the tool runs, the gate opened right after the last


def _flood_model(heard: list[int]) -> FunctionModel:
    def model(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> Any:
        heard.append(sum(isinstance(m, sm.UserMessage) for m in messages) - 1)
        if not any(isinstance(m, sm.AssistantMessage) for m in messages):
            return sm.AssistantMessage([sm.ToolCall("c1", "slow", {})])
        return sm.AssistantMessage(f"heard {heard[-1]}")

    return FunctionModel(model)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("together", [False, True], ids=["one_after_another", "all_at_once"])
def test_a_flood_of_steers_during_a_tool_all_reaches_the_next_model_call(
    database: Callable[[str], str], together: bool
) -> None:
    heard: list[int] = []  # how many steers each model call saw

    async def body() -> sm.RunResult:
        runner = DBOSRunner(
            models={"m": _flood_model(heard)}, tools=[slow], database_url=database("flood")
        )
        runner.launch()
        try:
            gate = _gates["flood"] = asyncio.Event()
            _entered.discard("flood")
            handle = await runner.start("flood", model="m", messages="tool")
            while "flood" not in _entered:  # the tool runs
                await asyncio.sleep(0.05)
            steers = [handle.steer(f"steer {i}") for i in range(FLOOD)]
            if together:
                await asyncio.gather(*steers)
            else:
                for steer in steers:
                    await steer
            gate.set()
            return await handle.result(timeout=240)
        finally:
            runner.destroy()

    result = asyncio.run(body())
    assert result.ok, result
    assert heard == [0, FLOOD]  # the call after the tool heard every steer, and was the last
    said = [t for m in result.messages if isinstance(m, sm.UserMessage) for t in _texts(m)]
    assert sorted(said) == sorted(["tool", *(f"steer {i}" for i in range(FLOOD))])


# -- with kills: worker processes killed -9 between the messages ------------------------------

# A few examples by default (each starts worker processes); many under "thorough".
KILL_EXAMPLES = 40 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 3

_kill_step = st.one_of(_step, st.just(("kill", None)))
# Every script sends messages and then kills the worker at least once: the messages
# taken before a kill must be taken again, at the same place, after it.
_kill_scripts = st.tuples(
    st.sampled_from(["tool", "approval"]),
    st.tuples(st.lists(_step, max_size=2), _messages, st.lists(_kill_step, max_size=3)).map(
        lambda parts: [*parts[0], ("send", parts[1]), ("kill", None), *parts[2]]
    ),
)


class _Workers:
    """The worker processes of one run: one alive at a time, killed -9 at will."""

    def __init__(self, db: str, run_id: str, tmp: Path, start: str) -> None:
        self.db, self.run_id, self.tmp, self.start = db, run_id, tmp, start
        self.gate = tmp / f"{run_id}.gate"
        self.alive = self._new()

    def _new(self) -> subprocess.Popen[bytes]:
        out, log = self.tmp / f"{self.run_id}.json", self.tmp / f"{self.run_id}.log"
        gate, start = str(self.gate), self.start
        return start_worker(
            self.db, self.run_id, out, log, "listening", DURABLE_GATE=gate, DURABLE_START=start
        )

    def kill_and_restart(self) -> None:
        kill(self.alive)
        self.alive = self._new()

    def finish(self) -> None:
        try:
            assert self.alive.wait(timeout=120) == 0, "the last worker failed"
        finally:
            kill(self.alive)


async def _started(handle: DBOSRunHandle, start: str) -> None:
    """Wait until the worker has started the run and its tool runs or it waits."""
    deadline = time.monotonic() + 60
    while True:
        try:
            status = await handle.status()
        except Exception:
            status = None
        if status is not None and (start == "tool" or status.state == "waiting"):
            return
        assert time.monotonic() < deadline, "the worker never started the run"
        await asyncio.sleep(0.05)


async def _play_with_kills(db: str, tmp: Path, run_id: str, script: tuple[str, list[Any]]) -> None:
    start, steps = script
    workers = _Workers(db, run_id, tmp, start)
    client = connect(db)
    try:
        handle = DBOSRunHandle(client, run_id)
        await _started(handle, start)
        others = {"kill": workers.kill_and_restart, "open": workers.gate.touch}
        acknowledged, refused = await _steps(handle, run_id, steps, others)
        workers.gate.touch()
        await _approve_all(await _pending_when_up(handle), handle)
        result = await handle.result(timeout=120)
        await asyncio.to_thread(workers.finish)
        _nothing_lost(result, acknowledged, refused)
    finally:
        kill(workers.alive)
        client.destroy()


async def _pending_when_up(handle: DBOSRunHandle) -> tuple[sm.ToolCall, ...]:
    """The calls waiting for a person once the run has settled after the gate opened:
    it waits, or has ended."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = await handle.status()
        if status.state != "running":
            return status.pending_approvals
        await asyncio.sleep(0.1)
    return ()


@pytest.mark.timeout(600)
def test_no_acknowledged_message_is_lost_when_workers_are_killed(
    database: Callable[[str], str], tmp_path: Path
) -> None:
    runs = iter(range(1_000_000))

    @settings(
        max_examples=KILL_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(script=_kill_scripts)
    def check(script: tuple[str, list[Any]]) -> None:
        run_id = f"k{next(runs)}"
        play = _play_with_kills(database(run_id), tmp_path, run_id, script)
        asyncio.run(asyncio.wait_for(play, 300))

    check()
