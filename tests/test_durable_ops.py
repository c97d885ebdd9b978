"""Exporting durable runs as journals and listing them (statemachine.durable._dbos_ops),
and the ``statemachine durable`` command's export and list.

An exported journal must replay (``statemachine.journal.replay``) to the run's own
result: the same state, history and trace, for a plain run, a run that took a steer
or an abort, and a run that waited for approvals; a run that is not finished exports
what it has. The same-history test runs on SQLite and PostgreSQL (see
tests/test_durable_dbos.py for the PostgreSQL setup).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import TOOLS, answer, beta_needs_approval

import statemachine as sm
from statemachine.cli import main
from statemachine.core.tools import ToolDefinition
from statemachine.core.wire import messages_to_dicts
from statemachine.durable import UnknownRunError
from statemachine.durable._dbos_ops import (
    MAX_LIST_LIMIT,
    ExportError,
    ListedRun,
    export_journal,
)
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner, connect
from statemachine.errors import InvalidInputError
from statemachine.journal import replay
from statemachine.testing import FunctionModel, check_transcript

POSTGRES = os.environ.get("STATEMACHINE_TEST_POSTGRES")
T = TypeVar("T")


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database URL on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/runs.sqlite"
    if not POSTGRES:
        if os.environ.get("CI") == "true":
            pytest.fail("under CI the PostgreSQL tests must run: use bash .ci/postgres.sh")
        # A developer machine without a server: the SQLite case of the same test still
        # runs; CI (above) never skips, since .ci/run starts PostgreSQL for it.
        pytest.skip("no PostgreSQL: run under bash .ci/postgres.sh to include it")
    import psycopg

    name = f"sm_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES.replace("+psycopg", "") + "/postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return f"{POSTGRES}/{name}"


def _with_runner(runner: DBOSRunner, body: Callable[[DBOSRunner], Awaitable[T]]) -> T:
    async def go() -> T:
        runner.launch()
        try:
            return await body(runner)
        finally:
            runner.destroy()

    return asyncio.run(go())


def _replays_to(path: Path, result: sm.RunResult) -> None:
    replayed = replay(path)
    assert replayed.ok
    assert replayed.checkpoints >= 1
    assert replayed.state is result.state
    assert replayed.messages == result.messages
    assert replayed.trace == result.trace
    assert check_transcript(list(replayed.messages)) == []  # the transcript checker reads it


@pytest.mark.timeout(120)
def test_an_exported_run_replays_to_its_result(database: str, tmp_path: Path) -> None:
    model = FunctionModel(answer)
    runner = DBOSRunner(models={"scripted": model}, tools=TOOLS, database_url=database)

    async def body(runner: DBOSRunner) -> sm.RunResult:
        handle = await runner.start("plain", model="scripted", messages="go")
        result = await handle.result(timeout=60)
        done = await runner.export_journal("plain", tmp_path / "runner.jsonl")
        assert (done.run_id, done.state, done.finished) == ("plain", "Done", True)
        # From a process that is not a worker: no registry, the tools by name only.
        client = connect(database)
        try:
            await export_journal(client, "plain", tmp_path / "client.jsonl")
        finally:
            client.destroy()
        return result

    result = _with_runner(runner, body)
    assert result.ok
    for name in ("runner", "client"):
        _replays_to(tmp_path / f"{name}.jsonl", result)
    header = json.loads((tmp_path / "runner.jsonl").read_text().splitlines()[0])
    assert header["tools"] == [json.loads(json.dumps(_tool_dict(t.definition))) for t in TOOLS]


def _tool_dict(definition: ToolDefinition) -> dict[str, Any]:
    from statemachine.core.wire import tool_definition_to_dict

    return tool_definition_to_dict(definition)


@pytest.mark.timeout(120)
def test_a_run_with_a_continue_hook_exports_to_its_result(tmp_path: Path) -> None:
    """should_continue stops the run after its second turn: its checks are steps too."""

    def stop_after_two(messages: Sequence[sm.Message], turn: int) -> sm.Stop | None:
        return sm.Stop("two turns are enough") if turn >= 2 else None

    runner = DBOSRunner(
        models={"scripted": FunctionModel(answer)},
        tools=TOOLS,
        database_url=f"sqlite:///{tmp_path}/runs.sqlite",
        should_continue=stop_after_two,
    )

    async def body(runner: DBOSRunner) -> sm.RunResult:
        handle = await runner.start("stops", model="scripted", messages="go")
        result = await handle.result(timeout=60)
        client = connect(f"sqlite:///{tmp_path}/runs.sqlite")
        try:  # without the runner: the hook is known from the recorded checks
            await export_journal(client, "stops", tmp_path / "stops.jsonl")
        finally:
            client.destroy()
        return result

    result = _with_runner(runner, body)
    assert result.turns == 2
    _replays_to(tmp_path / "stops.jsonl", result)


# -- a run that took messages, or is not finished ----------------------------------------------


def _gated_runner(db: str, gate: list[asyncio.Event], **hooks: Any) -> DBOSRunner:
    """A run whose one tool waits until the test opens ``gate[0]`` or the run is
    aborted, then answers."""

    @sm.tool
    async def wait_here(x: int, signal: sm.AbortSignal) -> str:
        """Wait for the test.

        Args:
            x: a number
        """
        while not gate[0].is_set() and not signal.aborted:
            await asyncio.sleep(0.005)
        return f"stopped: {signal.reason}" if signal.aborted else f"waited {x}"

    def model(messages: Sequence[sm.Message], _: Sequence[ToolDefinition]) -> sm.AssistantMessage:
        if any(isinstance(m, sm.ToolResultMessage) for m in messages):
            return sm.AssistantMessage(f"done after {len(messages)} messages")
        return sm.AssistantMessage([sm.ToolCall("w1", "wait_here", {"x": 1})])

    return DBOSRunner(
        models={"gated": FunctionModel(model)}, tools=[wait_here], database_url=db, **hooks
    )


async def _until(db: str, run_id: str, step: str) -> list[dict[str, Any]]:
    """Wait until the run has recorded a step ``step``; its steps so far."""
    client = connect(db)
    try:
        for _ in range(600):
            steps = await client.list_workflow_steps_async(run_id)
            if any(s["function_name"] == step for s in steps):
                return [dict(s) for s in steps]
            await asyncio.sleep(0.05)
    finally:
        client.destroy()
    raise AssertionError(f"the run never recorded a step {step}")


async def _when_tool_runs(handle: DBOSRunHandle, db: str) -> None:
    await _until(db, handle.run_id, "statemachine.model")
    await asyncio.sleep(0.05)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("message", ["steer", "follow_up", "abort"])
def test_a_message_taken_in_the_middle_of_a_tool_exports_to_its_result(
    message: str, database: str, tmp_path: Path
) -> None:
    """The message takes effect while the tool runs (its place recorded: after two
    engine events, the start and the model's answer); the export applies it there."""
    gate: list[asyncio.Event] = []

    async def body(runner: DBOSRunner) -> tuple[sm.RunResult, list[dict[str, Any]]]:
        gate.append(asyncio.Event())
        handle = await runner.start("told", model="gated", messages="go")
        await _when_tool_runs(handle, database)
        if message == "steer":
            await handle.steer("and be quick")
        elif message == "follow_up":
            await handle.follow_up("and then stop")
        else:
            await handle.abort("changed my mind")
        steps = await _until(database, "told", "statemachine.control")
        gate[0].set()
        result = await handle.result(timeout=60)
        await handle.export_journal(tmp_path / "told.jsonl")  # checked against the result
        return result, steps

    result, steps = _with_runner(_gated_runner(database, gate), body)
    taken = [s["output"] for s in steps if s["function_name"] == "statemachine.control"]
    markers = [t for t in taken if (t["message"] or {}).get("kind") == "sync"]  # the end's own
    assert [t["at"] for t in taken if t not in markers] == [2]
    if message != "abort":  # the tool was still running (an abort ends it: see its result)
        assert not any(s["function_name"] == "statemachine.tool" for s in steps)
    roles = [m.role for m in result.messages]
    if message == "steer":
        assert result.state is sm.TurnState.DONE
        assert roles == ["user", "assistant", "toolResult", "user", "assistant"]
        assert result.messages[3] == sm.UserMessage("and be quick")
    elif message == "follow_up":
        assert result.state is sm.TurnState.DONE
        assert roles == ["user", "assistant", "toolResult", "assistant", "user", "assistant"]
        assert result.messages[4] == sm.UserMessage("and then stop")
    else:
        assert result.state is sm.TurnState.ABORTED
        assert roles == ["user", "assistant", "toolResult"]
        assert "stopped: changed my mind" in str(result.messages[2])
    _replays_to(tmp_path / "told.jsonl", result)


@pytest.mark.timeout(120)
def test_an_abort_that_cancels_a_deaf_tool_exports_to_its_result(tmp_path: Path) -> None:
    """The tool ignores the abort signal and is cancelled after half the grace period:
    its step saved no output, and the export answers it as the run did (cancelled)."""
    db = f"sqlite:///{tmp_path}/runs.sqlite"
    never = asyncio.Event()

    @sm.tool
    async def deaf(x: int) -> str:
        """Wait for what never comes.

        Args:
            x: a number
        """
        await never.wait()
        return "unreachable"

    def model(messages: Sequence[sm.Message], _: Sequence[ToolDefinition]) -> sm.AssistantMessage:
        return sm.AssistantMessage([sm.ToolCall("d1", "deaf", {"x": 1})])

    runner = DBOSRunner(models={"deaf": FunctionModel(model)}, tools=[deaf], database_url=db)

    async def body(runner: DBOSRunner) -> tuple[sm.RunResult, list[str]]:
        handle = await runner.start("deaf", model="deaf", messages="go")
        await _when_tool_runs(handle, db)
        await handle.abort("enough")
        result = await handle.result(timeout=60)
        await handle.export_journal(tmp_path / "deaf.jsonl")  # checked against the result
        steps = await _until(db, "deaf", "statemachine.control")
        return result, [s["function_name"] for s in steps if s.get("error") is None]

    result, saved = _with_runner(runner, body)
    assert result.state is sm.TurnState.ABORTED
    assert "statemachine.tool" not in saved  # cancelled: nothing saved
    _replays_to(tmp_path / "deaf.jsonl", result)


@pytest.mark.timeout(120)
def test_an_unfinished_run_exports_what_it_has(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/runs.sqlite"
    gate: list[asyncio.Event] = []
    stream = io.StringIO()

    async def body(runner: DBOSRunner) -> tuple[Any, sm.RunResult]:
        gate.append(asyncio.Event())
        handle = await runner.start("midway", model="gated", messages="go")
        await _when_tool_runs(handle, db)
        done = await runner.export_journal("midway", stream)
        gate[0].set()
        return done, await handle.result(timeout=60)

    done, result = _with_runner(_gated_runner(db, gate), body)
    assert (done.finished, done.state, done.events) == (False, "CollectingResults", 2)
    replayed = replay(stream.getvalue().splitlines())
    assert replayed.ok
    assert replayed.checkpoints == 0
    assert replayed.state is sm.TurnState.COLLECTING_RESULTS
    assert replayed.messages == result.messages[:2]  # the prompt and the tool call
    assert replayed.trace == result.trace[: len(replayed.trace)]


@pytest.mark.timeout(180)
def test_a_run_whose_worker_was_killed_exports_what_it_has_then_all(tmp_path: Path) -> None:
    """kill -9 in the middle of a tool call: the export ends where the saved steps end;
    once another worker has finished the run, it replays to the run's result."""
    db, log, out = f"sqlite:///{tmp_path}/runs.sqlite", tmp_path / "log", tmp_path / "out.json"
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, DURABLE_SIDE_EFFECTS=str(log), PYTHONPATH=str(root))
    worker = [sys.executable, str(root / "tests" / "durable_worker.py"), db, "killed", str(out)]
    first = subprocess.Popen(worker, env=env, stderr=subprocess.DEVNULL)
    try:
        for _ in range(1200):  # until the second turn's first tool call has started
            if log.exists() and "start t2a" in log.read_text():
                break
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait()

    async def export(path: Path) -> Any:
        client = connect(db)
        try:
            return await export_journal(client, "killed", path, tools=TOOLS)
        finally:
            client.destroy()

    partial = asyncio.run(export(tmp_path / "partial.jsonl"))
    assert not partial.finished
    replayed = replay(tmp_path / "partial.jsonl")
    assert replayed.ok
    assert replayed.state is sm.TurnState.COLLECTING_RESULTS
    assert [m.role for m in replayed.messages] == [
        "user",
        "assistant",
        "toolResult",
        "toolResult",
        "assistant",
    ]
    assert subprocess.run(worker, env=env, timeout=120, check=False).returncode == 0
    whole = asyncio.run(export(tmp_path / "whole.jsonl"))
    assert whole.finished
    rebuilt = replay(tmp_path / "whole.jsonl")
    assert json.loads(out.read_text()) == {  # the worker's result (durable_worker.result_json)
        "state": rebuilt.state.value,
        "messages": messages_to_dicts(rebuilt.messages),
        "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in rebuilt.trace],
    }


@pytest.mark.timeout(120)
def test_a_run_waiting_for_approvals_exports_up_to_each_wait(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/runs.sqlite"
    runner = DBOSRunner(
        models={"scripted": FunctionModel(answer)},
        tools=TOOLS,
        database_url=db,
        before_tool_call=beta_needs_approval,
    )

    async def body(runner: DBOSRunner) -> tuple[list[Any], sm.RunResult]:
        handle = await runner.start("asks", model="scripted", messages="go")
        waits = []
        for turn in (1, 2, 3):
            while [c.id for c in await handle.pending_approvals()] != [f"t{turn}b"]:
                await asyncio.sleep(0.05)
            lines = io.StringIO()
            await runner.export_journal("asks", lines)
            waits.append(replay(lines.getvalue().splitlines()))
            await handle.decide(f"t{turn}b", approve=turn != 2, reason="a person said so")
        result = await handle.result(timeout=60)
        await runner.export_journal("asks", tmp_path / "asks.jsonl")
        return waits, result

    waits, result = _with_runner(runner, body)
    for turn, waiting in enumerate(waits, start=1):
        assert waiting.ok
        assert waiting.state is sm.TurnState.AWAITING_USER
        assert [c.id for c, _ in waiting.engine.pending_approvals()] == [f"t{turn}b"]
    _replays_to(tmp_path / "asks.jsonl", result)


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_export_refuses_what_it_cannot_do_faithfully(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/runs.sqlite"
    runner = DBOSRunner(models={"scripted": FunctionModel(answer)}, tools=TOOLS, database_url=db)

    @sm.tool
    async def alpha(x: str) -> str:
        """A tool of the same name whose schema refuses the run's arguments.

        Args:
            x: a text
        """
        return x

    async def body(runner: DBOSRunner) -> None:
        handle = await runner.start("r", model="scripted", messages="go")
        await handle.result(timeout=60)
        with pytest.raises(UnknownRunError, match="no durable run has the id 'nope'"):
            await runner.export_journal("nope", io.StringIO())
        with pytest.raises(InvalidInputError, match="run id"):
            await runner.export_journal("", io.StringIO())
        (tmp_path / "taken.jsonl").write_text("")
        with pytest.raises(InvalidInputError, match="already exists"):
            await runner.export_journal("r", tmp_path / "taken.jsonl")
        assert (tmp_path / "taken.jsonl").read_text() == ""
        unwritten = io.StringIO()
        with pytest.raises(ExportError, match="different"):
            await handle.export_journal(unwritten, tools=[alpha, TOOLS[1]])
        assert unwritten.getvalue() == ""  # nothing written when it is not right

    _with_runner(runner, body)


# -- listing --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_list_runs_newest_first_with_their_state_and_approvals(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/runs.sqlite"
    runner = DBOSRunner(
        models={"scripted": FunctionModel(answer)},
        tools=TOOLS,
        database_url=db,
        before_tool_call=beta_needs_approval,
    )

    async def body(runner: DBOSRunner) -> dict[str, tuple[ListedRun, ...]]:
        first = await runner.start("first", model="scripted", messages="go")
        await first.abort("not needed")  # taken at its first model call
        await first.result(timeout=60)
        await asyncio.sleep(1.1)  # SQLite keeps the creation time to the second
        second = await runner.start("second", model="scripted", messages="go")
        while not await second.pending_approvals():
            await asyncio.sleep(0.05)
        seen = {
            "all": await runner.list_runs(),
            "one": await runner.list_runs(limit=1),
            "finished": await runner.list_runs("finished"),
            "waiting": await runner.list_runs("waiting"),
            "running": await runner.list_runs("running"),
        }
        for bad in (0, True, MAX_LIST_LIMIT + 1, "9"):
            with pytest.raises(InvalidInputError, match="limit"):
                await runner.list_runs(limit=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="unknown status 'done'"):
            await runner.list_runs("done")
        await second.abort("done looking")
        await second.result(timeout=60)
        return seen

    seen = _with_runner(runner, body)
    assert [r.run_id for r in seen["all"]] == ["second", "first"]
    assert [r.run_id for r in seen["one"]] == ["second"]
    assert [r.run_id for r in seen["finished"]] == ["first"]
    assert [(r.run_id, r.state) for r in seen["waiting"]] == [("second", "waiting")]
    assert [c.id for c in seen["waiting"][0].pending_approvals] == ["t1b"]
    assert seen["running"] == ()
    newest = seen["all"][0]
    assert newest.created <= newest.updated
    assert newest.created > 1_600_000_000
    assert newest.app_version == sm.__version__ + "+" + newest.app_version.split("+")[1]


# -- the command line ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_durable_command_exports_and_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path}/runs.sqlite"
    runner = DBOSRunner(models={"scripted": FunctionModel(answer)}, tools=TOOLS, database_url=db)

    async def body(runner: DBOSRunner) -> None:
        await (await runner.start("cli-run", model="scripted", messages="go")).result(timeout=60)

    _with_runner(runner, body)
    out = tmp_path / "cli.jsonl"
    assert main(["durable", "export", "cli-run", "--db", db, "--out", str(out)]) == 0
    assert "run cli-run: 11 event(s), state Done (finished)" in capsys.readouterr().out
    assert main(["replay", str(out), "--quiet"]) == 0
    assert "OK: the replay matches the journal" in capsys.readouterr().out
    assert main(["durable", "list", "--db", db]) == 0
    listed = capsys.readouterr().out
    assert "cli-run" in listed
    assert "finished" in listed
    assert "1 run(s)" in listed
    # Expected failures: one line on stderr, exit 2.
    for argv, error in [
        (["export", "nope", "--db", db, "--out", str(tmp_path / "x")], "no durable run"),
        (["export", "cli-run", "--db", db, "--out", str(out)], "already exists"),
        (["list", "--db", db, "--limit", "0"], "limit must be"),
        (["list", "--db", f"sqlite:///{tmp_path}/missing/dir/x.sqlite"], "durable: "),
        (["list"], "--db"),
        (["frobnicate"], "invalid choice"),
    ]:
        assert main(["durable", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("durable: ")
        assert error in err
        assert err.count("\n") == 1


def test_a_database_password_never_shows_in_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql+psycopg://someone:s3cret-word@127.0.0.1:1/nowhere"
    assert main(["durable", "list", "--db", url]) == 2
    err = capsys.readouterr().err
    assert "s3cret-word" not in err
    assert err.startswith("durable: ")


# -- the benchmark still runs ---------------------------------------------------------------


@pytest.mark.timeout(180)
def test_the_durable_benchmark_runs_at_smoke_size() -> None:
    """No timing is asserted: the figures live in bench/results.md."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.run(
        [sys.executable, str(root / "bench" / "durable.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    default = "| SQLite (default: wal) |"  # the runner's own store, in the mode it sets
    rows = [line for line in proc.stdout.splitlines() if line.startswith(default)]
    names = [row.split("|")[2].strip() for row in rows]
    assert names == ["in memory", "durable", "bare DBOS", "bare DBOS + listener"]
    bare_ops = rows[2].split("|")[6].strip()
    assert bare_ops == "1.67"  # 3 turns: a model and a tool step twice, then a model step
