"""What every durable backend shares, asserted the same way on each engine.

Each test runs once per backend of ``statemachine.durable.BACKENDS``: "dbos" on a
fresh SQLite file, "temporal" on the session's dev server (temporal_support). The
``Engine`` adapter hides how each one starts a worker; the tests speak only of the
backend-neutral contract (``DurableRunner``, ``RunHandle``). Without a backend's
extra its tests skip, except under CI=true, where they fail. The backends' own
tests (kills, versions, queues, PostgreSQL) are in test_durable_*.py and
test_temporal*.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from durable_worker import (
    TOOLS,
    TURNS,
    alpha,
    answer,
    beta_needs_approval,
    compacting_steps,
    reference_run,
    replays_to,
    result_json,
    tells_its_view,
)

import statemachine as sm
from statemachine.core.abort import AbortSignal
from statemachine.core.tools import ToolDefinition
from statemachine.durable import (
    BACKENDS,
    DurableRunner,
    RunHandle,
    idempotency_key,
)
from statemachine.errors import (
    InvalidInputError,
    NotPendingError,
    RunClosedError,
    RunHeldError,
    UnknownRunError,
    UsageError,
)
from statemachine.steps import Step, input_guardrail, output_guardrail
from statemachine.testing import FunctionModel

if importlib.util.find_spec("temporalio") is not None or os.environ.get("CI") == "true":
    from temporal_support import temporal_server  # noqa: F401 - the session's server

T = TypeVar("T")
EXTRAS = {"dbos": "dbos", "temporal": "temporalio"}


class Engine:
    """One backend, as the shared tests see it: ``runner(**options)`` is a launched
    worker (a ``DurableRunner``) for the duration of an ``async with``. The runners of
    one test share a store (a SQLite file, a task queue), so a second one, with other
    code, plays a deploy."""

    def __init__(self, name: str, tmp_path: Path, address: str = "") -> None:
        self.name = name
        self._address = address
        self._url = f"sqlite:///{tmp_path}/runs-{uuid.uuid4().hex[:8]}.sqlite"
        self._queue = f"q-{uuid.uuid4().hex[:8]}"
        # Temporal's steer() returns once the run has taken the message (an update);
        # DBOS's once it is stored, and the run takes it when its worker notices it
        # (docs/guides/temporal.md, "How it compares with DBOS").
        self.takes_messages_on_return = name == "temporal"

    @contextlib.asynccontextmanager
    async def runner(self, **options: Any) -> AsyncIterator[DurableRunner]:
        options.setdefault("models", {"scripted": FunctionModel(answer)})
        options.setdefault("tools", TOOLS)
        if self.name == "dbos":
            from statemachine.durable.dbos import DBOSRunner

            dbos_runner = DBOSRunner(database_url=self._url, **options)
            dbos_runner.launch()
            try:
                yield dbos_runner
            finally:
                dbos_runner.destroy()
            return
        from temporalio.client import Client

        from statemachine.durable.temporal import TemporalRunner

        client = await Client.connect(self._address)
        async with TemporalRunner(
            client, task_queue=self._queue, heartbeat=1.0, **options
        ) as runner:
            yield runner

    def deploy_options(self) -> dict[str, Any]:
        """Options of a worker that a deploy replaces: on Temporal a workflow task of a
        stopped worker goes to the next one within a second or so (rather than 10 s)."""
        if self.name != "temporal":
            return {}
        return {
            "workflow_task_timeout": 1.0,
            "worker_options": {"sticky_queue_schedule_to_start_timeout": timedelta(seconds=0.5)},
        }

    async def wake(self, run_id: str) -> None:
        """Hand a waiting run to the live worker, as any message would. DBOS's worker
        looks at the run at launch; Temporal's when the run has a task: here a signal
        that no handler takes."""
        if self.name == "temporal":
            from temporalio.client import Client

            client = await Client.connect(self._address)
            await client.get_workflow_handle(run_id).signal("nothing-to-see")

    def run(self, body: Callable[[DurableRunner], Awaitable[T]], **options: Any) -> T:
        """Run ``body`` with a launched runner of this backend."""

        async def go() -> T:
            async with self.runner(**options) as runner:
                return await body(runner)

        return asyncio.run(go())


def engine_of(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    """The ``Engine`` of the backend ``request.param`` (an ``engine`` fixture's value)."""
    name = str(request.param)
    if os.environ.get("CI") != "true":
        pytest.importorskip(EXTRAS[name])
    address = str(request.getfixturevalue("temporal_address")) if name == "temporal" else ""
    return Engine(name, tmp_path, address)


@pytest.fixture(params=sorted(BACKENDS))
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    """Each backend in turn (module docstring)."""
    return engine_of(request, tmp_path)


async def _pending(handle: RunHandle, call_id: str, timeout: float = 30) -> list[str]:
    """The pending calls, once ``call_id`` is among them."""
    async with asyncio.timeout(timeout):
        while True:
            calls = [c.id for c in await handle.pending_approvals()]
            if call_id in calls:
                return calls
            await asyncio.sleep(0.05)


@pytest.mark.timeout(90)
def test_a_run_has_run_agents_history_and_exports_a_journal_that_replays(
    engine: Engine, tmp_path: Path
) -> None:
    async def body(runner: DurableRunner) -> sm.RunResult:
        assert isinstance(runner, DurableRunner)  # mypy checks it too (Engine.runner)
        handle = await runner.start("plain", model="scripted", messages="go")
        assert isinstance(handle, RunHandle)
        result = await handle.result(timeout=60)
        assert result.run_id == "plain"
        again = await runner.start("plain", model="scripted", messages="go")
        assert result_json(await again.result(timeout=30)) == result_json(result)
        status = await runner.status("plain")
        assert (status.run_id, status.state, status.pending_approvals) == ("plain", "finished", ())
        assert (await handle.status()).state == "finished"
        exported = await runner.export_journal("plain", tmp_path / "plain.jsonl")
        assert (exported.finished, exported.state) == (True, "Done")
        return result

    result = engine.run(body)
    reference = reference_run()
    assert result_json(result) == result_json(reference)
    assert result.stats is not None
    assert reference.stats is not None
    assert result.stats.model_calls == reference.stats.model_calls == 4
    assert result.stats.tool_calls == reference.stats.tool_calls
    replays_to(tmp_path / "plain.jsonl", result)


@pytest.mark.timeout(90)
def test_approvals_are_taken_once_and_a_call_that_is_not_pending_is_refused(
    engine: Engine, tmp_path: Path
) -> None:
    async def body(runner: DurableRunner) -> sm.RunResult:
        handle = await runner.start("appr", model="scripted", messages="go")
        assert await _pending(handle, "t1b") == ["t1b"]
        status = await handle.status()
        assert status.state == "waiting"
        assert [c.id for c in status.pending_approvals] == ["t1b"]
        with pytest.raises(NotPendingError):
            await handle.decide("t1a", True)  # permitted by the hook, never pending
        with pytest.raises(NotPendingError):
            await handle.decide("nobody", True)
        with pytest.raises(UsageError):
            await handle.decide(["t1b"], True)  # type: ignore[arg-type]
        await handle.decide("t1b", True)
        assert await _pending(handle, "t2b") == ["t2b"]
        with pytest.raises(NotPendingError):
            await handle.decide("t1b", False)  # decided already
        await handle.decide("t2b", False, "not today")
        assert await _pending(handle, "t3b") == ["t3b"]
        await handle.decide("t3b", True)
        result = await handle.result(timeout=60)
        with pytest.raises(NotPendingError):
            await handle.decide("t3b", True)  # the run has ended
        assert await handle.pending_approvals() == ()
        await runner.export_journal("appr", tmp_path / "appr.jsonl")
        return result

    result = engine.run(body, before_tool_call=beta_needs_approval)
    assert result.ok
    texts = {m.tool_call_id: m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)}
    assert texts["t1b"] == "beta(1)=1001"
    assert "not today" in texts["t2b"]
    assert texts["t3b"] == "beta(3)=1003"
    assert texts["t3a"] == "alpha(3)=9"
    replays_to(tmp_path / "appr.jsonl", result)


@pytest.mark.timeout(90)
def test_an_abort_during_an_approval_wait_ends_the_run_and_leaves_nothing_pending(
    engine: Engine, tmp_path: Path
) -> None:
    async def body(runner: DurableRunner) -> sm.RunResult:
        handle = await runner.start("left", model="scripted", messages="go")
        assert await _pending(handle, "t1b") == ["t1b"]
        await handle.abort("nobody came")
        result = await handle.result(timeout=60)
        with pytest.raises(NotPendingError, match="the run has ended"):
            await handle.decide("t1b", True)
        assert await handle.pending_approvals() == ()
        status = await handle.status()
        assert (status.state, status.pending_approvals) == ("finished", ())
        await handle.abort("again")  # nothing to do once it has ended
        await runner.export_journal("left", tmp_path / "left.jsonl")
        return result

    result = engine.run(body, before_tool_call=beta_needs_approval)
    assert result.state is sm.TurnState.ABORTED
    texts = {m.tool_call_id: m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)}
    assert texts["t1a"] == "alpha(1)=1"
    assert sorted(texts) == ["t1a", "t1b"]  # the call waiting for a person has a result (I6)
    replays_to(tmp_path / "left.jsonl", result)


def _said(messages: Sequence[sm.Message]) -> str:
    return " | ".join(
        b.text
        for m in messages
        if isinstance(m, sm.UserMessage)
        for b in m.content
        if isinstance(b, sm.TextContent)
    )


class Gate:
    """A tool that waits until the test opens its gate or the run is aborted, and
    records the idempotency key it saw."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.opened = asyncio.Event()
        self.keys: list[str | None] = []
        self.tool = sm.Tool(
            ToolDefinition("wait_at_gate", "Wait for the gate.", {"type": "object"}), self._run
        )

    async def _run(self, arguments: Any, signal: AbortSignal) -> str:
        self.keys.append(idempotency_key())
        self.started.set()
        aborted = asyncio.get_running_loop().create_future()

        def on_abort(reason: object) -> None:
            if not aborted.done():
                aborted.set_result(reason)

        signal.add_listener(on_abort)
        opened = asyncio.ensure_future(self.opened.wait())
        await asyncio.wait({opened, aborted}, return_when=asyncio.FIRST_COMPLETED)
        opened.cancel()
        return "stopped by the abort" if aborted.done() else "opened"

    async def entered(self) -> None:
        await asyncio.wait_for(self.started.wait(), 30)


def _echo(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    """Call the gate once, then repeat what the person said."""
    if not any(isinstance(m, sm.ToolResultMessage) for m in messages):
        return sm.AssistantMessage([sm.ToolCall("g1", "wait_at_gate", {})])
    return sm.AssistantMessage(f"heard: {_said(messages)}")


@pytest.mark.timeout(90)
def test_a_steer_and_a_follow_up_reach_the_model_and_late_input_is_refused(
    engine: Engine, tmp_path: Path
) -> None:
    gate = Gate()

    async def body(runner: DurableRunner) -> sm.RunResult:
        handle = await runner.start("told", model="echo", messages="go")
        await gate.entered()
        assert (await handle.status()).state == "running"
        await handle.steer("also this")
        await handle.follow_up("and then that")
        gate.opened.set()
        result = await handle.result(timeout=60)
        with pytest.raises(RunClosedError):
            await handle.follow_up("too late")
        with pytest.raises(RunClosedError):
            await handle.steer("too late")
        await runner.export_journal("told", tmp_path / "told.jsonl")
        return result

    result = engine.run(body, models={"echo": FunctionModel(_echo)}, tools=[gate.tool])
    assert result.ok
    answers = [m.text for m in result.messages if isinstance(m, sm.AssistantMessage) and m.text]
    assert answers[-1] == "heard: go | also this | and then that"
    assert _said(result.messages) == "go | also this | and then that"
    if engine.takes_messages_on_return:
        # Taken by the run when steer() returned, while the tool ran: the next model
        # call hears the steer, and the follow-up comes when it would finish.
        assert answers == ["heard: go | also this", "heard: go | also this | and then that"]
    assert result.queued_input == ()
    assert gate.keys == ["told:g1"]  # idempotency_key() inside the tool: run_id:call_id
    replays_to(tmp_path / "told.jsonl", result)


FLOOD = 300  # steers sent while one tool runs, one after another or all at once


@pytest.mark.timeout(240)
@pytest.mark.parametrize("together", [False, True], ids=["one_after_another", "all_at_once"])
def test_every_steer_acknowledged_while_a_tool_runs_reaches_the_next_model_call(
    engine: Engine, together: bool
) -> None:
    """As with ``AgentRun``: a steer is handed to the model at the next turn boundary,
    however many came during the turn and however close to its end. The gate opens as
    soon as the last steer is acknowledged."""
    gate = Gate()
    heard: list[int] = []  # how many steers each model call saw
    sent = FLOOD

    def model(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> Any:
        heard.append(sum(isinstance(m, sm.UserMessage) for m in messages) - 1)
        if not any(isinstance(m, sm.ToolResultMessage) for m in messages):
            return sm.AssistantMessage([sm.ToolCall("g1", "wait_at_gate", {})])
        return sm.AssistantMessage(f"heard {heard[-1]}")

    async def body(runner: DurableRunner) -> sm.RunResult:
        handle = await runner.start(f"flood-{uuid.uuid4().hex[:8]}", model="flood", messages="go")
        await gate.entered()
        steers = [f"steer {i}" for i in range(sent)]
        if together:
            await asyncio.gather(*(handle.steer(s) for s in steers))
        else:
            for steer in steers:
                await handle.steer(steer)
        gate.opened.set()
        return await handle.result(timeout=180)

    result = engine.run(body, models={"flood": FunctionModel(model)}, tools=[gate.tool])
    assert result.ok, result
    assert heard == [0, sent]  # the call after the tool heard them all, and was the last
    assert result.queued_input == ()
    said = _said(result.messages).split(" | ")
    expected = ["go", *(f"steer {i}" for i in range(sent))]
    if together or not engine.takes_messages_on_return:
        # DBOS hands a run its messages in the order of the millisecond they were
        # stored in: two steers stored within one may come either way round.
        said, expected = sorted(said), sorted(expected)
    assert said == expected, [(a, b) for a, b in zip(said, expected, strict=False) if a != b][:5]


@pytest.mark.timeout(90)
def test_an_abort_reaches_a_running_tool_and_the_run_ends_aborted(
    engine: Engine, tmp_path: Path
) -> None:
    gate = Gate()

    async def body(runner: DurableRunner) -> sm.RunResult:
        handle = await runner.start("stop", model="echo", messages="go")
        await gate.entered()
        await handle.abort("enough")
        result = await handle.result(timeout=60)
        assert (await handle.status()).state == "finished"
        await runner.export_journal("stop", tmp_path / "stop.jsonl")
        return result

    result = engine.run(body, models={"echo": FunctionModel(_echo)}, tools=[gate.tool])
    assert result.state is sm.TurnState.ABORTED
    texts = [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert texts == ["stopped by the abort"]  # the tool's own answer, within the grace
    assert not gate.opened.is_set()
    replays_to(tmp_path / "stop.jsonl", result)


@pytest.mark.timeout(90)
def test_input_from_outside_is_refused_with_the_librarys_errors(engine: Engine) -> None:
    async def body(runner: DurableRunner) -> sm.RunResult:
        for run_id in ("x" * 201, "", "bad\x00id", "a\udc80b"):
            with pytest.raises(InvalidInputError, match="run id"):
                await runner.start(run_id, model="scripted", messages="go")
        with pytest.raises(InvalidInputError):
            await runner.handle("bad\x00id")
        with pytest.raises(UnknownRunError):
            await runner.handle("never-started")
        with pytest.raises(InvalidInputError, match="unknown model"):
            await runner.start("r", model="nobody", messages="go")
        with pytest.raises(InvalidInputError, match="unknown tools"):
            await runner.start("r", model="scripted", messages="go", tools=["gamma"])
        with pytest.raises(InvalidInputError):
            await runner.start("r", model="scripted", messages="x" * 100_001)
        handle = await runner.start("bounded", model="scripted", messages="go")
        with pytest.raises(InvalidInputError):
            await handle.steer("x" * 100_001)
        with pytest.raises(InvalidInputError):
            await handle.follow_up(42)  # type: ignore[arg-type]
        with pytest.raises(UsageError):
            await handle.decide(["t1a"], True)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            await handle.decide("t1a", "yes")  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            await handle.abort("x" * 100_001)
        return await handle.result(timeout=60)

    result = engine.run(body)
    assert result_json(result) == result_json(reference_run())


@pytest.mark.timeout(120)
def test_result_on_a_run_held_by_a_deploy_raises_run_held_error_rather_than_waiting(
    engine: Engine,
) -> None:
    """The run waits for a person; a deploy drops the tool it waits on. ``result()``
    asked before the hold is noticed (Temporal: before a worker takes the run) raises
    ``RunHeldError`` once it is, as ``status()`` says ``held``."""

    hook = {"before_tool_call": beta_needs_approval, **engine.deploy_options()}
    run_id = f"deployed-{uuid.uuid4().hex[:8]}"  # the Temporal server is the session's

    async def before(runner: DurableRunner) -> None:
        await _pending(await runner.start(run_id, model="scripted", messages="go"), "t1b")

    async def after(runner: DurableRunner) -> None:
        handle = await runner.handle(run_id)
        waiting = asyncio.ensure_future(handle.result())
        await asyncio.sleep(0.2)  # result() is waiting
        await engine.wake(run_id)
        with pytest.raises(RunHeldError, match=run_id):
            await asyncio.wait_for(waiting, 60)
        assert (await handle.status()).state == "held"
        assert (await runner.status(run_id)).state == "held"

    engine.run(before, **hook)
    engine.run(after, tools=[alpha], **hook)  # each worker in a process of its own


@pytest.mark.timeout(150)
def test_a_run_waits_for_a_worker_of_its_application_version(engine: Engine) -> None:
    """The same code under another ``app_version`` does not take the run: it is
    ``held``, naming the version it waits for (``status().app_version``), and a worker
    of that version finishes it."""
    hook = {"before_tool_call": beta_needs_approval, **engine.deploy_options()}
    run_id = f"versioned-{uuid.uuid4().hex[:8]}"  # the Temporal server is the session's

    async def before(runner: DurableRunner) -> None:
        handle = await runner.start(run_id, model="scripted", messages="go")
        await _pending(handle, "t1b")
        assert (await handle.status()).app_version == "billing-1"

    async def other(runner: DurableRunner) -> None:
        await engine.wake(run_id)
        async with asyncio.timeout(60):
            while (status := await runner.status(run_id)).state != "held":
                await asyncio.sleep(0.2)
        assert status.app_version == "billing-1"
        assert "waits for a worker of application version 'billing-1'" in status.held
        handle = await runner.handle(run_id)
        with pytest.raises(RunHeldError, match="billing-1"):
            await handle.result(timeout=30)

    async def again(runner: DurableRunner) -> sm.RunResult:
        handle = await runner.handle(run_id)
        for call_id in ("t1b", "t2b", "t3b"):
            await _pending(handle, call_id, timeout=60)
            await handle.decide(call_id, True)
        return await handle.result(timeout=60)

    engine.run(before, app_version="billing-1", **hook)
    engine.run(other, app_version="billing-2", **hook)
    result = engine.run(again, app_version="billing-1", **hook)
    assert result.ok


# -- declared steps ------------------------------------------------------------------------


def screen(text: str) -> str | None:
    """An input guardrail's check: lets every request through."""
    return "no secrets here" if "password" in text else None


def screen_v2(text: str) -> str | None:
    """The same check, new code: stricter."""
    return "no secrets here" if "password" in text.lower() else None


def review(text: str) -> str | None:
    """An output guardrail's check keyed on the answer (so the same after a restart):
    the first answer is sent back once."""
    return f"count again: {text}" if text == f"done after {TURNS} turns" else None


def guarded_steps() -> list[Step]:
    return [input_guardrail("screen", screen), output_guardrail("review", review)]


@pytest.mark.timeout(90)
def test_a_run_with_steps_records_each_decision_and_exports_a_journal_that_replays(
    engine: Engine, tmp_path: Path
) -> None:
    async def body(runner: DurableRunner) -> sm.RunResult:
        handle = await runner.start("guarded", model="scripted", messages="go")
        result = await handle.result(timeout=60)
        exported = await runner.export_journal("guarded", tmp_path / "guarded.jsonl")
        assert (exported.finished, exported.state) == (True, "Done")
        return result

    result = engine.run(body, steps=guarded_steps())
    reference = asyncio.run(
        sm.run_agent(model=FunctionModel(answer), tools=TOOLS, messages="go", steps=guarded_steps())
    )
    assert result_json(result) == result_json(reference)
    decided = [r for r in result.trace if r.trigger.value == "step_decided"]
    assert len(decided) == 5 + 2  # screen before each of five model calls, review twice
    assert result.messages[-1].text == f"done after {TURNS + 1} turns"
    replays_to(tmp_path / "guarded.jsonl", result)


@pytest.mark.timeout(90)
def test_a_compacted_run_sends_the_model_the_views_an_in_memory_run_sends(
    engine: Engine, tmp_path: Path
) -> None:
    async def body(runner: DurableRunner) -> sm.RunResult:
        handle = await runner.start("compacted", model="viewer", messages="go", tools=["alpha"])
        result = await handle.result(timeout=60)
        await runner.export_journal("compacted", tmp_path / "compacted.jsonl")
        return result

    models = {"viewer": FunctionModel(tells_its_view)}
    result = engine.run(body, models=models, steps=compacting_steps())
    reference = asyncio.run(
        sm.run_agent(
            model=FunctionModel(tells_its_view),
            tools=[alpha],
            messages="go",
            steps=compacting_steps(),
        )
    )
    assert result_json(result) == result_json(reference)
    final = result.messages[-1].text
    assert final.startswith("sent 5 messages, the first: Summary of the conversation")
    replays_to(tmp_path / "compacted.jsonl", result)


# -- the deploy table ----------------------------------------------------------------------
# docs/guides/durable.md, "One version kept, without patches": each case a deploy under a
# kept application version while the run (with an input guardrail, a declared step) waits
# for a person on t1b; the same outcome on every backend: held, naming what changed, or
# goes on, noted.


@sm.tool(name="beta")
async def beta_new_code(x: int) -> str:
    """Add a thousand.

    Args:
        x: the number
    """
    return f"beta v2({x})={x + 1000}"


@sm.tool(name="beta")
async def beta_new_parameters(x: int, y: int = 0) -> str:
    """Add a thousand.

    Args:
        x: the number
        y: added too
    """
    return f"beta({x})={x + y + 1000}"


@sm.tool(name="beta", sequential=True)
async def beta_sequential(x: int) -> str:
    """Add a thousand.

    Args:
        x: the number
    """
    return f"beta({x})={x + 1000}"


def _table_changed(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from statemachine.durable import _registry

    monkeypatch.setattr(_registry, "table_digest", lambda: "0123456789ab")
    return {}


# case: (what the new worker changes, "held" or "noted", what the status names)
DEPLOYS: dict[str, tuple[Callable[[pytest.MonkeyPatch], dict[str, Any]], str, str]] = {
    "a tool removed": (lambda _: {"tools": [alpha]}, "held", "tool 'beta' is not in this"),
    "before_tool_call removed": (
        lambda _: {"before_tool_call": None},
        "held",
        "hook 'before_tool_call' was removed",
    ),
    "a tool scheduled differently": (
        lambda _: {"tools": [alpha, beta_sequential]},
        "held",
        "tool 'beta' is scheduled differently",
    ),
    "a tool's parameters changed": (
        lambda _: {"tools": [alpha, beta_new_parameters]},
        "held",
        "tool 'beta' takes other parameters",
    ),
    "the transition table changed": (_table_changed, "held", "the transition table changed"),
    "a tool's code changed": (
        lambda _: {"tools": [alpha, beta_new_code]},
        "noted",
        "tool 'beta' changed since the run started",
    ),
    "the instructions changed": (
        lambda _: {"instructions": {"billing": "Be briefer."}},
        "noted",
        "instructions 'billing' changed since the run started",
    ),
    "a step removed": (lambda _: {"steps": []}, "held", "step 'screen' is not in this"),
    "a step's outcomes changed": (
        lambda _: {"steps": [input_guardrail("screen", screen, state="Refused")]},
        "held",
        "step 'screen' is declared otherwise",
    ),
    "a step's point changed": (
        lambda _: {"steps": [output_guardrail("screen", screen)]},
        "held",
        "step 'screen' is declared otherwise",
    ),
    "a step added": (
        lambda _: {
            "steps": [input_guardrail("screen", screen), output_guardrail("review", review)]
        },
        "held",
        "step 'review' was added",
    ),
    "a step's code changed": (
        lambda _: {"steps": [input_guardrail("screen", screen_v2)]},
        "noted",
        "step 'screen' changed since the run started",
    ),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", list(DEPLOYS))
def test_each_deploy_under_a_kept_version_holds_or_goes_on_noted(
    engine: Engine, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    change, outcome, named = DEPLOYS[case]
    kept = {
        "app_version": "billing-3",
        "before_tool_call": beta_needs_approval,
        "instructions": {"billing": "Be brief."},
        "steps": [input_guardrail("screen", screen)],
        **engine.deploy_options(),
    }
    run_id = f"deployed-{uuid.uuid4().hex[:8]}"  # the Temporal server is the session's

    async def before(runner: DurableRunner) -> None:
        starting: Any = runner  # each backend's start takes instructions (the protocol's not)
        handle = await starting.start(
            run_id, model="scripted", messages="go", instructions="billing"
        )
        await _pending(handle, "t1b")

    async def held(runner: DurableRunner) -> None:
        await engine.wake(run_id)
        async with asyncio.timeout(60):
            while (status := await runner.status(run_id)).state != "held":
                await asyncio.sleep(0.2)
        assert named in status.held
        assert not status.notes  # a held run gets no notes
        assert "DBOS" not in status.held  # the library's words, not the engine's
        assert "TMPRL" not in status.held
        with pytest.raises(RunHeldError, match="held"):
            await (await runner.handle(run_id)).result(timeout=30)

    async def noted(runner: DurableRunner) -> sm.RunResult:
        handle = await runner.handle(run_id)
        await _pending(handle, "t1b", timeout=60)
        await handle.decide("t1b", True)
        await _pending(handle, "t2b", timeout=60)
        status = await handle.status()
        assert [n for n in status.notes if named in n], status.notes
        for call_id in ("t2b", "t3b"):
            await _pending(handle, call_id, timeout=60)
            await handle.decide(call_id, True)
        return await handle.result(timeout=60)

    engine.run(before, **kept)
    changed = {**kept, **change(monkeypatch)}
    if outcome == "held":
        engine.run(held, **changed)
    else:
        assert engine.run(noted, **changed).ok
