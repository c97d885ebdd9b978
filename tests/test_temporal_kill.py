"""Kill -9 trials of durable runs on Temporal: a worker process is killed in the middle
of a tool call, of a model call, of an output guardrail's check and while its run
waits for a person, again and again, and another worker takes the run over. Every
run ends with the history and trace of the same run made in memory, with no finished
call run again: a call runs once per attempt Temporal recorded for it, each attempt
after the first caused by a kill, under the same idempotency key
(tests/temporal_worker.py is the worker)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporal_support import temporal_server  # noqa: F401 - the session's server
from temporal_worker import (
    ROOT,
    TOOLS,
    WORKER,
    answer,
    beta_needs_approval,
    compacting_steps,
    reviewed_steps,
    viewer,
)

import statemachine as sm
from statemachine.core.wire import messages_to_dicts
from statemachine.testing import FunctionModel

MIN_KILLS = 20  # per run of this file


class Trials:
    """Worker processes of one run, each killed at a point, the next one already
    started (imports done) and waiting for its go file."""

    def __init__(self, address: str, tmp: Path, mode: str, turns: int) -> None:
        self.run_id = f"kill-{mode}-{uuid.uuid4().hex[:6]}"
        self.queue = f"q-{uuid.uuid4().hex[:8]}"
        self.address, self.tmp, self.mode, self.turns = address, tmp, mode, turns
        self.log = tmp / f"{mode}.log"
        self.out = tmp / f"{mode}.json"
        self.killed: list[int] = []
        self._started = 0
        self._spare = self._spawn()
        self.current = self._go()

    def _spawn(self) -> subprocess.Popen[bytes]:
        self._started += 1
        env = dict(
            os.environ,
            TEMPORAL_SIDE_EFFECTS=str(self.log),
            TEMPORAL_TURNS=str(self.turns),
            TEMPORAL_GO=str(self.tmp / f"go-{self.mode}-{self._started}"),
            PYTHONPATH=ROOT,
        )
        args = [self.address, self.queue, self.run_id, str(self.out), self.mode]
        return subprocess.Popen(
            [sys.executable, WORKER, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _go(self) -> subprocess.Popen[bytes]:
        proc = self._spare
        (self.tmp / f"go-{self.mode}-{self._started}").touch()
        self._spare = self._spawn()
        return proc

    def lines(self) -> list[list[str]]:
        """The side-effect log: [what, label, pid, run id] per line."""
        if not self.log.exists():
            return []
        return [line.split() for line in self.log.read_text().splitlines()]

    async def kill_when(self, point: Callable[[list[list[str]], int], bool]) -> None:
        """Kill the current worker once ``point(lines, pid)`` holds; start the next."""
        async with asyncio.timeout(60):
            while not point(self.lines(), self.current.pid):
                assert self.current.poll() is None, "the worker ended before the kill point"
                await asyncio.sleep(0.003)
        self.current.send_signal(signal.SIGKILL)
        self.current.wait()
        self.killed.append(self.current.pid)
        self.current = self._go()

    async def finished(self) -> None:
        """Wait until the current worker has written the run's result and exited."""
        async with asyncio.timeout(90):
            while self.current.poll() is None:
                await asyncio.sleep(0.05)
        assert self.current.returncode == 0

    def close(self) -> None:
        for proc in (self.current, self._spare):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def mid(what: str, done: str) -> Callable[[list[list[str]], int], bool]:
    """A kill point: the worker is in the middle of a call (``what``: "start" for a
    tool, "model" for a model call) that no worker had begun before."""

    def point(lines: list[list[str]], pid: int) -> bool:
        begun_before = {line[1] for line in lines if line[0] == what and line[2] != str(pid)}
        mine = [line for line in lines if line[2] == str(pid)]
        ended = {line[1] for line in mine if line[0] == done}
        return any(
            line[0] == what and line[1] not in begun_before and line[1] not in ended
            for line in mine
        )

    return point


MID_TOOL = mid("start", "end")
MID_MODEL = mid("model", "answered")
MID_CHECK = mid("check", "checked")
BEGINS = ("start", "model", "check")  # what a tool call, a model call, a check logs first


def _reference(mode: str, turns: int) -> dict[str, Any]:
    """The same run in memory, every approval granted."""
    os.environ["TEMPORAL_TURNS"] = str(turns)
    hook = beta_needs_approval if mode == "approvals" else None
    steps = {"reviewed": reviewed_steps, "compacted": compacting_steps}.get(mode, list)()

    async def go() -> sm.RunResult:
        model = FunctionModel(viewer if mode == "compacted" else answer)
        result = await sm.run_agent(
            model=model, tools=TOOLS, messages="go", before_tool_call=hook, steps=steps
        )
        while result.pending_approvals:
            result = await sm.resume_agent(
                result,
                model=model,
                tools=TOOLS,
                approvals={c.id: True for c in result.pending_approvals},
                before_tool_call=hook,
            )
        return result

    try:
        result = asyncio.run(go())
    finally:
        del os.environ["TEMPORAL_TURNS"]
    return {
        "state": result.state.value,
        "messages": messages_to_dicts(result.messages),
        "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in result.trace],
    }


async def _attempts(address: str, run_id: str) -> Counter[str]:
    """The attempt Temporal recorded for each finished call ("t1a", "m2"...)."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    client = await Client.connect(address)
    history = await client.get_workflow_handle(run_id).fetch_history()
    labels: dict[int, str] = {}
    started: dict[int, int] = {}  # the attempt that finished each activity
    compactions: set[int] = set()
    models = 0
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            [payload] = await client.data_converter.decode(list(attributes.input.payloads))
            if attributes.activity_type.name == "statemachine.model":
                models += 1
                labels[event.event_id] = f"m{models}"
            elif attributes.activity_type.name == "statemachine.tool":
                labels[event.event_id] = payload["call"]["id"]
            elif payload.get("step") == "review":
                # The check of the answer of turn N: "rN" (N assistant messages so far).
                answers = [m for m in payload["messages"] if m["role"] == "assistant"]
                labels[event.event_id] = f"r{len(answers)}"
            elif payload.get("step") == "compaction":
                compactions.add(event.event_id)  # labelled by its decision, if it summarised
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            began = event.activity_task_started_event_attributes
            started[began.scheduled_event_id] = began.attempt
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in compactions:
                [result] = await client.data_converter.decode(list(done.result.payloads))
                if result[0]["outcome"] == "compacted":  # "...summary of N messages": "cN"
                    labels[done.scheduled_event_id] = f"c{result[0]['message'].split()[-2]}"
    attempts: Counter[str] = Counter()
    for scheduled, attempt in started.items():
        if scheduled in labels:
            attempts[labels[scheduled]] += attempt
    return attempts


def _check(trials: Trials, attempts: Counter[str], reference: dict[str, Any]) -> None:
    assert json.loads(trials.out.read_text()) == reference
    lines = trials.lines()
    began = Counter(line[1] for line in lines if line[0] in BEGINS)
    assert set(began) == set(attempts)
    killed = {str(pid) for pid in trials.killed}
    for label, runs in began.items():
        # At most once per attempt Temporal recorded (the last one finished it: no
        # finished call ran again); an attempt may have died before the call began.
        assert 1 <= runs <= attempts[label] <= 1 + len(killed)
        pids = [line[2] for line in lines if line[0] in BEGINS and line[1] == label]
        # Each run but the last was in a worker that was then killed: one per kill.
        assert len(set(pids)) == runs
        assert set(pids[:-1]) <= killed
    keys = {line[3] for line in lines if line[0] == "start"}
    assert keys == {trials.run_id}  # the idempotency key's run id, every attempt


def _trial(address: str, tmp: Path, mode: str, turns: int, plan: list[str]) -> int:
    reference = _reference(mode, turns)

    async def body() -> Counter[str]:
        from temporalio.client import Client

        trials = Trials(address, tmp, mode, turns)
        client = await Client.connect(address)
        handle = client.get_workflow_handle(trials.run_id)
        decided: set[str] = set()
        asks = turns - 1 if mode == "approvals" else 0  # each turn but the last asks once

        async def pending() -> list[str]:
            try:
                calls = await handle.query("pending_approvals")
            except Exception:  # not started yet, or no live worker
                return []
            return [c["id"] for c in calls if c["id"] not in decided]

        async def decide_all() -> None:
            for call_id in await pending():
                await handle.execute_update(
                    "decide",
                    {"kind": "decision", "call_id": call_id, "approve": True, "reason": ""},
                )
                decided.add(call_id)

        try:
            for point in plan:
                if point == "approval":
                    async with asyncio.timeout(60):
                        while not await pending():
                            await asyncio.sleep(0.02)
                    await trials.kill_when(lambda lines, pid: True)
                    await decide_all()
                else:
                    mids = {"tool": MID_TOOL, "model": MID_MODEL, "check": MID_CHECK}
                    await trials.kill_when(mids[point])
                    if len(decided) < asks:
                        await decide_all()
            async with asyncio.timeout(90):
                while trials.current.poll() is None:
                    if len(decided) < asks:
                        await decide_all()
                    await asyncio.sleep(0.05)
            assert trials.current.returncode == 0
        finally:
            trials.close()
        attempts = await _attempts(address, trials.run_id)
        _check(trials, attempts, reference)
        return Counter(killed=len(trials.killed))

    return asyncio.run(body())["killed"]


KILLS: list[int] = []


@pytest.mark.timeout(240)
def test_workers_killed_mid_tool_and_mid_model_leave_the_in_memory_history(
    temporal_address: str, tmp_path: Path
) -> None:
    plan = ["model", "tool"] * 7 + ["model"]
    KILLS.append(_trial(temporal_address, tmp_path, "tools", 8, plan))
    assert KILLS[-1] == len(plan)


@pytest.mark.timeout(180)
def test_workers_killed_while_the_run_waits_for_a_person_leave_the_in_memory_history(
    temporal_address: str, tmp_path: Path
) -> None:
    plan = ["approval", "tool"] * 3
    KILLS.append(_trial(temporal_address, tmp_path, "approvals", 4, plan))
    assert KILLS[-1] == len(plan)
    assert sum(KILLS) >= MIN_KILLS or len(KILLS) < 2


@pytest.mark.timeout(180)
def test_workers_killed_mid_guardrail_check_leave_the_in_memory_history(
    temporal_address: str, tmp_path: Path
) -> None:
    """The output guardrail sends turn 4's answer back once: the worker is killed in the
    middle of that check, of the model call that follows and of the check of turn 5's
    answer; each check runs once per attempt, none again once decided."""
    plan = ["tool", "check", "model", "check"]
    KILLS.append(_trial(temporal_address, tmp_path, "reviewed", 4, plan))
    assert KILLS[-1] == len(plan)


@pytest.mark.timeout(180)
def test_workers_killed_mid_summary_and_after_it_leave_the_in_memory_history(
    temporal_address: str, tmp_path: Path
) -> None:
    """The compaction summarises at turn 4: the worker is killed in the middle of that
    summarising call, then in the middle of the two model calls after it, which must be
    sent the compacted view (the last answer tells the view it was sent)."""
    plan = ["tool", "check", "model", "model"]
    KILLS.append(_trial(temporal_address, tmp_path, "compacted", 4, plan))
    assert KILLS[-1] == len(plan)


@pytest.mark.timeout(120)
def test_a_steer_acknowledged_before_a_kill_reaches_the_model(
    temporal_address: str, tmp_path: Path
) -> None:
    async def body() -> dict[str, Any]:
        from temporalio.client import Client

        trials = Trials(temporal_address, tmp_path, "echo", 2)
        client = await Client.connect(temporal_address)
        handle = client.get_workflow_handle(trials.run_id)
        message = {
            "kind": "steer",
            "message": {"role": "user", "content": [{"type": "text", "text": "also this"}]},
        }
        try:
            async with asyncio.timeout(60):
                while not MID_TOOL(trials.lines(), trials.current.pid):
                    await asyncio.sleep(0.005)
            await handle.execute_update("queue_input", message)  # acknowledged: in the history
            await trials.kill_when(lambda lines, pid: True)
            await trials.finished()
        finally:
            trials.close()
        KILLS.append(len(trials.killed))
        return dict(json.loads(trials.out.read_text()))

    out = asyncio.run(body())
    assert out["state"] == "Done"
    assert out["messages"][-1]["content"][0]["text"] == "heard: go | also this"
