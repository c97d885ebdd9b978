"""Changing code while durable runs wait: each incompatible change is a named outcome.

An operator's week: a run waits for a person's approval on a worker, the worker is
stopped (here killed -9), a worker with changed code starts. Each case of the guide's
"Changing code while runs wait" is a test: the run is held with a status naming the
mismatch (listed by ``list_runs``), and an operator resumes it on a compatible worker
or ends it as failed with an explanation; a tool whose code changed goes on, noted.
PostgreSQL runs under `bash .ci/postgres.sh` (see test_durable_dbos.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import (
    TOOLS,
    alpha,
    answer,
    beta_needs_approval,
    database_urls,
    kill,
    start_worker,
)

import statemachine as sm
from statemachine.cli import main
from statemachine.durable import RunFailedError, RunHeldError, application_version, open_store
from statemachine.durable._registry import differences, manifest, worker_manifest
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner, connect
from statemachine.steps import input_guardrail, output_guardrail
from statemachine.testing import FunctionModel


@sm.tool
async def beta(x: int) -> str:
    """Add a thousand (a new release: it says so).

    Args:
        x: the number
    """
    return f"beta v2({x})={x + 1000}"


def _worker(db: str, tools: Sequence[sm.Tool] = TOOLS, **options: Any) -> DBOSRunner:
    """A worker of the changed code (the old one is durable_worker's "approvals")."""
    options.setdefault("before_tool_call", beta_needs_approval)
    return DBOSRunner(
        models={"scripted": FunctionModel(answer)}, tools=tools, database_url=db, **options
    )


def _old_worker_waits(db: str, tmp_path: Path, version: str = "") -> None:
    """Run "appr" on the old code until it waits for a person, then kill its worker."""
    out, log = tmp_path / "out.json", tmp_path / "log"
    # An empty DURABLE_APP_VERSION: the default version.
    proc = start_worker(db, "appr", out, log, "approvals", DURABLE_APP_VERSION=version)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "the old worker ended early"
            assert time.monotonic() < deadline, "the run never waited for a person"
            try:
                client = connect(db)
            except Exception:  # the worker has not made the database yet
                time.sleep(0.1)
                continue
            try:
                handle = DBOSRunHandle(client, "appr")
                pending = asyncio.run(handle.pending_approvals())
            except Exception:  # the run is not started yet
                pending = ()
            finally:
                client.destroy()
            if pending:
                return
            time.sleep(0.1)
    finally:
        kill(proc)


async def _until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + 60
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def _decide_all(handle: DBOSRunHandle) -> sm.RunResult:
    """Approve every call as it comes up; the result."""
    for call_id in ("t1b", "t2b", "t3b"):

        async def pending(call_id: str = call_id) -> bool:
            return call_id in [c.id for c in await handle.pending_approvals()]

        await _until(pending, f"{call_id} never waited for a decision")
        await handle.decide(call_id, True)
    return await handle.result(timeout=60)


def _launched(runner: DBOSRunner, body: Callable[[DBOSRunner], Any]) -> Any:
    async def go() -> Any:
        runner.launch()
        try:
            return await body(runner)
        finally:
            runner.destroy()

    return asyncio.run(go())


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


def test_the_default_version_changes_with_the_registry_and_only_then() -> None:
    hooks = {"before_tool_call": beta_needs_approval}
    same = application_version(manifest(["scripted"], TOOLS, hooks))
    assert same == application_version(manifest(["scripted"], TOOLS, dict(hooks)))
    assert same == _worker("sqlite:///unused.sqlite").app_version
    changed = [
        manifest(["scripted"], [alpha, beta], hooks),  # a tool's code
        manifest(["scripted"], [alpha], hooks),  # a tool removed
        manifest(["scripted"], TOOLS, {}),  # a hook removed
        manifest(["other"], TOOLS, hooks),  # a model renamed
    ]
    assert len({same, *(application_version(m) for m in changed)}) == 1 + len(changed)
    assert _worker("sqlite:///unused.sqlite", app_version="v1").app_version == "v1"
    with pytest.raises(sm.InvalidInputError, match="app_version"):
        _worker("sqlite:///unused.sqlite", app_version="")


def test_each_change_of_code_is_blocking_or_a_note() -> None:
    hooks = {"before_tool_call": beta_needs_approval}
    before = manifest(["scripted"], TOOLS, hooks)

    def compare(models: list[str], tools: Sequence[sm.Tool], hooks: Any) -> Any:
        return differences(before, manifest(models, tools, hooks), "scripted", ["alpha", "beta"])

    sequential = sm.Tool(alpha.definition, alpha.execute, sequential=True)
    assert compare(["scripted"], TOOLS, hooks) == ([], [])
    assert compare(["scripted"], [sequential, TOOLS[1]], hooks) == (
        [
            "tool 'alpha' is scheduled differently (sequential or resources changed): "
            "the run's recorded steps were started in another order"
        ],
        [],
    )
    assert compare(["other"], TOOLS, hooks)[0] == [
        "model 'scripted' is not in this worker's registry"
    ]
    assert compare(["scripted"], TOOLS, {**hooks, "should_continue": lambda *a: True})[0] == [
        "hook 'should_continue' was added: the run's recorded steps do not ask it"
    ]
    assert compare(["scripted"], TOOLS, {**hooks, "after_tool_call": lambda *a: None}) == (
        [],
        ["hook 'after_tool_call' was added since the run started"],
    )


def _passes(text: str) -> None:
    return None


def _refuses(text: str) -> str:
    return "no"


def test_each_change_of_the_declared_steps_is_blocking_or_a_note() -> None:
    screen, review = input_guardrail("screen", _passes), output_guardrail("review", _passes)

    def registry(*steps: sm.steps.Step) -> dict[str, Any]:
        return worker_manifest(["scripted"], TOOLS, {}, steps, {}, {})[1]

    before = registry(screen, review)

    def compare(*steps: sm.steps.Step) -> tuple[list[str], list[str]]:
        return differences(before, registry(*steps), "scripted", ["alpha", "beta"])

    assert compare(screen, review) == ([], [])
    assert compare(screen)[0] == [
        "step 'review' is not in this worker's steps (removed or renamed): the run's "
        "table has its rows"
    ]
    assert compare(screen, output_guardrail("review", _passes, retries=5))[0] == [
        "step 'review' is declared otherwise than when the run started (its point, "
        "outcomes or their destinations changed): the run's table has its old rows"
    ]
    assert compare(screen, review, input_guardrail("extra", _passes))[0] == [
        "step 'extra' was added: the run's table has no rows for it"
    ]
    assert compare(review, screen)[0] == [
        "the steps were reordered: the run's table runs them as ['screen', 'review']"
    ]
    assert compare(input_guardrail("screen", _refuses), review) == (
        [],
        [
            "step 'screen' changed since the run started: decisions recorded before come "
            "from its old code, steps from now on run the new"
        ],
    )
    # A worker without steps keeps the version it had before steps existed.
    assert registry() == manifest(["scripted"], TOOLS, {})
    assert application_version(registry(screen)) != application_version(registry())


@pytest.mark.timeout(180)
def test_a_changed_registry_waits_for_its_version_then_an_old_worker_drains_it(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    """Versioning (the default): a worker whose tool was removed never takes the run;
    it lists it held, naming the version it waits for; an old worker finishes it."""
    db = database("runs")
    _old_worker_waits(db, tmp_path)

    async def look(runner: DBOSRunner) -> None:
        status = await runner.status("appr")
        assert status.state == "held"
        assert "waits for a worker of application version" in status.held
        assert [c.id for c in status.pending_approvals] == ["t1b"]
        assert [r.run_id for r in await runner.list_runs(status="held")] == ["appr"]
        handle = await runner.handle("appr")
        assert (await handle.status()).state == "held"

    new = _worker(db, [alpha])
    _launched(new, look)
    _a_store_lists_it_held(db, _worker(db).app_version, new.app_version)

    async def drain(runner: DBOSRunner) -> sm.RunResult:
        return await _decide_all(await runner.handle("appr"))

    result = _launched(_worker(db), drain)
    assert result.ok
    assert "beta(1)=1001" in [
        m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)
    ]


def _a_store_lists_it_held(db: str, old: str, new: str) -> None:
    """A process that is not a worker (the store, the command line) sees the run as
    the newest version's workers do: held, naming the version it waits for."""

    async def look() -> tuple[Any, Any]:
        store = open_store("dbos", db)
        try:
            listed = await store.list_runs(status="held")
            return listed, await (await store.handle("appr")).status()
        finally:
            store.close()

    listed, status = asyncio.run(look())
    assert [(r.run_id, r.state, r.app_version) for r in listed] == [("appr", "held", old)]
    assert listed[0].held == (
        f"waits for a worker of application version {old!r} (the newest version is {new!r})"
    )
    assert (status.state, status.held) == ("held", listed[0].held)
    assert [c.id for c in status.pending_approvals] == ["t1b"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["durable", "list", "--db", db]) == 0
    (row,) = [line for line in printed.getvalue().splitlines() if line.startswith("appr ")]
    assert row.split()[1] == "held"
    assert row.endswith(old)


@pytest.mark.timeout(180)
def test_a_run_waiting_for_its_version_can_be_ended_as_failed(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    db = database("runs")
    _old_worker_waits(db, tmp_path)

    async def end(runner: DBOSRunner) -> tuple[Any, str]:
        await runner.end_held("appr", "beta was retired")
        status = await runner.status("appr")
        with pytest.raises(RunFailedError) as failed:
            await (await runner.handle("appr")).result(timeout=10)
        with pytest.raises(sm.UsageError, match="not held"):
            await runner.end_held("appr", "again")
        return status, str(failed.value)

    status, failed = _launched(_worker(db, [alpha]), end)
    assert status.state == "failed"
    assert "ended by an operator: beta was retired" in status.explanation
    assert "waits for a worker of application version" in status.explanation
    assert "beta was retired" in failed


@pytest.mark.timeout(180)
def test_a_tool_removed_under_the_same_version_holds_the_run_until_a_compatible_worker(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    """The user keeps one version across deploys: the worker without the tool holds
    the run (before: failed for good with a bare KeyError), and a worker with the tool
    resumes it."""
    db = database("runs")
    _old_worker_waits(db, tmp_path, version="v1")

    async def held(runner: DBOSRunner) -> None:
        handle = await runner.handle("appr")

        async def is_held() -> bool:
            return (await handle.status()).state == "held"

        await _until(is_held, "the run was not held")
        status = await handle.status()
        assert "tool 'beta' is not in this worker's registry (removed or renamed)" in status.held
        with pytest.raises(RunHeldError, match="tool 'beta' is not in this worker's registry"):
            await handle.result(timeout=10)
        assert [r.held for r in await runner.list_runs(status="held")] == [status.held]
        with pytest.raises(RunHeldError, match="does not fit this worker's code either"):
            await runner.resume_held("appr")

    _launched(_worker(db, [alpha], app_version="v1"), held)

    async def resume(runner: DBOSRunner) -> sm.RunResult:
        await runner.resume_held("appr")
        return await _decide_all(await runner.handle("appr"))

    result = _launched(_worker(db, app_version="v1"), resume)
    assert result.ok
    assert "beta(1)=1001" in [
        m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)
    ]


@pytest.mark.timeout(180)
def test_a_hook_removed_under_the_same_version_holds_the_run_and_it_can_be_ended(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    """Before: DBOSUnexpectedStepError, then a ProtocolError, and a run that hung."""
    db = database("runs")
    _old_worker_waits(db, tmp_path, version="v1")

    async def held(runner: DBOSRunner) -> tuple[Any, Any]:
        handle = await runner.handle("appr")

        async def is_held() -> bool:
            return (await handle.status()).state == "held"

        await _until(is_held, "the run was not held")
        status = await handle.status()
        await runner.end_held("appr", "approvals are gone for good")
        return status, await handle.status()

    status, ended = _launched(_worker(db, before_tool_call=None, app_version="v1"), held)
    assert "hook 'before_tool_call' was removed" in status.held
    assert ended.state == "failed"
    assert "approvals are gone for good" in ended.explanation
    assert "before_tool_call" in ended.explanation


@pytest.mark.timeout(180)
def test_a_tool_whose_code_changed_goes_on_and_the_change_is_noted(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    """Before: the history mixed old and new outputs silently."""
    db = database("runs")
    _old_worker_waits(db, tmp_path, version="v1")

    async def goes_on(runner: DBOSRunner) -> tuple[Any, sm.RunResult]:
        handle = await runner.handle("appr")
        result = await _decide_all(handle)
        return await handle.status(), result

    status, result = _launched(_worker(db, [alpha, beta], app_version="v1"), goes_on)
    assert result.ok
    assert status.notes == (
        "tool 'beta' changed since the run started: outputs recorded before come from "
        "its old code, calls from now on run the new",
    )
    outputs = [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert "beta v2(1)=1001" in outputs  # approved after the deploy: the new code ran


@pytest.mark.timeout(180)
def test_a_mismatch_the_manifest_misses_holds_the_run_rather_than_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: Callable[[str], str]
) -> None:
    """Whatever the comparison of registries misses, a step that does not fit what
    the run recorded holds the run, naming the step (before: DBOSUnexpectedStepError,
    a ProtocolError, and a run that hung)."""
    db = database("runs")
    _old_worker_waits(db, tmp_path, version="v1")
    monkeypatch.setattr("statemachine.durable.dbos.differences", lambda *args: ([], []))

    async def held(runner: DBOSRunner) -> Any:
        handle = await runner.handle("appr")

        async def is_held() -> bool:
            return (await handle.status()).state == "held"

        await _until(is_held, "the run was not held")
        with pytest.raises(RunHeldError, match="recorded steps do not fit"):
            await handle.result(timeout=10)
        return await handle.status()

    status = _launched(_worker(db, before_tool_call=None, app_version="v1"), held)
    assert "the run's recorded steps do not fit this worker's code" in status.held
    assert "statemachine.permissions" in status.held  # the step the run recorded there
