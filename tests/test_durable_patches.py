"""Patching, DBOS's other way to deploy (the guide's "Changing code while runs wait"):
one application version kept across deploys, and tools and hooks that branch on
``patched(name)``. A run that waited across the deploy keeps the old code for all its
life; a run started since runs the new. Each case runs on SQLite and on PostgreSQL
(under `bash .ci/postgres.sh`, see test_durable_dbos.py).
"""

from __future__ import annotations

import asyncio
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

from durable_worker import TOOLS, alpha, answer, beta_needs_approval, database_urls, launched

import statemachine as sm
from statemachine.durable import RunHeldError, RunStatus
from statemachine.durable._registry import patches_applied
from statemachine.durable.dbos import DBOSRunHandle, DBOSRunner, connect, patched
from statemachine.testing import FunctionModel

MARKER = "DBOS.patch-"


@sm.tool
async def beta(x: int) -> str:
    """Add a thousand (the new release says so, for runs that took the patch).

    Args:
        x: the number
    """
    if patched("beta-v2"):
        return f"beta v2({x})={x + 1000}"
    return f"beta({x})={x + 1000}"


def approvals_until_patched(call: sm.ToolCall) -> sm.RequireApproval | None:
    """The hook of the new release: runs that took the patch need no person."""
    return None if patched("no-approvals") else beta_needs_approval(call)


def _worker(db: str, tools: Sequence[sm.Tool] = TOOLS, **options: Any) -> DBOSRunner:
    options.setdefault("before_tool_call", beta_needs_approval)
    return DBOSRunner(
        models={"scripted": FunctionModel(answer)},
        tools=tools,
        database_url=db,
        app_version="billing-3",  # one version kept across deploys
        **options,
    )


async def _until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + 60
    while not (found := await check()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)
    return found


async def _pending(handle: DBOSRunHandle, call_id: str) -> None:
    async def waits() -> bool:
        return call_id in [c.id for c in await handle.pending_approvals()]

    await _until(waits, f"{call_id} never waited for a decision")


def _waits_across_a_deploy(db: str, **options: Any) -> None:
    """Start "old" on the old release until it waits for a person; the worker stops
    (its run stays in the database, taken back by the next worker at launch)."""

    async def start(runner: DBOSRunner) -> None:
        await _pending(await runner.start("old", model="scripted", messages="go"), "t1b")

    launched(_worker(db, **options), start)


async def _decide_all(handle: DBOSRunHandle) -> sm.RunResult:
    for call_id in ("t1b", "t2b", "t3b"):
        await _pending(handle, call_id)
        await handle.decide(call_id, True)
    return await handle.result(timeout=60)


def _outputs(result: sm.RunResult) -> list[str]:
    return [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)]


async def _markers(runner: DBOSRunner, run_id: str) -> list[str]:
    client = connect(runner.database_url)
    try:
        steps = await client.list_workflow_steps_async(run_id)
    finally:
        client.destroy()
    return [s["function_name"] for s in steps if s["function_name"].startswith(MARKER)]


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


def test_patched_answers_by_the_run_and_refuses_an_unknown_name() -> None:
    assert patched("anything")  # outside a durable run: today's code
    with patches_applied(["a", "b"], ["b"]):
        assert not patched("a")
        assert patched("b")
        with pytest.raises(sm.UsageError, match="patch 'c' is not one of this worker's"):
            patched("c")
    for patches, deprecated, error in [
        ("a", (), "sequence of names"),
        (["a", "a"], (), "unique"),
        (["a"], ["b"], r"deprecated patches \['b'\] are not in patches"),
        ([""], (), "non-empty str"),
    ]:
        with pytest.raises(sm.InvalidInputError, match=error):
            _worker("sqlite:///unused.sqlite", patches=patches, deprecated_patches=deprecated)


@pytest.mark.timeout(180)
def test_a_tool_changed_under_a_patch_keeps_its_old_code_for_a_run_that_waited(
    database: Callable[[str], str],
) -> None:
    """Versioning's "a tool's code changed" row goes on with old and new outputs mixed
    (noted); under a patch the waiting run keeps the old code, new runs the new."""
    db = database("runs")
    _waits_across_a_deploy(db)

    async def deployed(runner: DBOSRunner) -> tuple[sm.RunResult, sm.RunResult, list[str]]:
        old = await _decide_all(await runner.handle("old"))
        new = await _decide_all(await runner.start("new", model="scripted", messages="go"))
        return old, new, await _markers(runner, "old") + await _markers(runner, "new")

    old, new, markers = launched(_worker(db, [alpha, beta], patches=["beta-v2"]), deployed)
    assert old.ok
    assert new.ok
    betas = [o for o in _outputs(old) if "beta" in o]
    assert betas == ["beta(1)=1001", "beta(2)=1002", "beta(3)=1003"]  # all after the deploy
    assert [o for o in _outputs(new) if "beta" in o] == [
        "beta v2(1)=1001",
        "beta v2(2)=1002",
        "beta v2(3)=1003",
    ]
    assert markers == [MARKER + "beta-v2"]  # the new run's only


@pytest.mark.timeout(180)
def test_a_hook_dropped_under_a_patch_still_asks_for_a_run_that_waited(
    database: Callable[[str], str],
) -> None:
    """Versioning's "before_tool_call removed" row holds the run; under a patch the
    hook stays (its checks are steps of the run) and answers by the run."""
    db = database("runs")
    _waits_across_a_deploy(db)

    async def deployed(runner: DBOSRunner) -> tuple[sm.RunResult, sm.RunResult]:
        old = await _decide_all(await runner.handle("old"))  # still asks for t2b, t3b
        new = await (await runner.start("new", model="scripted", messages="go")).result(60)
        return old, new

    runner = _worker(db, before_tool_call=approvals_until_patched, patches=["no-approvals"])
    old, new = launched(runner, deployed)
    assert old.ok
    assert new.ok
    assert len([o for o in _outputs(new) if "beta" in o]) == 3  # no person was asked


@pytest.mark.timeout(180)
def test_a_patch_rolled_back_holds_the_run_and_deprecated_it_goes_on(
    database: Callable[[str], str],
) -> None:
    """A run that took a patch, on a worker without it (a rollback): held, naming the
    patch. On a worker that keeps it deprecated, it goes on; new runs take no marker."""
    db = database("runs")
    _waits_across_a_deploy(db, tools=[alpha, beta], patches=["beta-v2"])

    async def rolled_back(runner: DBOSRunner) -> RunStatus:
        handle = await runner.handle("old")

        async def held() -> bool:
            return (await handle.status()).state == "held"

        await _until(held, "the run was not held")
        with pytest.raises(RunHeldError, match="took patch 'beta-v2'"):
            await handle.result(timeout=10)
        return await handle.status()

    status = launched(_worker(db), rolled_back)
    assert "the run took patch 'beta-v2', which this worker does not have" in status.held

    async def deprecated(runner: DBOSRunner) -> tuple[sm.RunResult, sm.RunResult, list[str]]:
        await runner.resume_held("old")
        old = await _decide_all(await runner.handle("old"))
        new = await _decide_all(await runner.start("new", model="scripted", messages="go"))
        return old, new, await _markers(runner, "old") + await _markers(runner, "new")

    runner = _worker(db, [alpha, beta], patches=["beta-v2"], deprecated_patches=["beta-v2"])
    old, new, markers = launched(runner, deprecated)
    assert next(o for o in _outputs(old) if "beta" in o) == "beta v2(1)=1001"
    assert next(o for o in _outputs(new) if "beta" in o) == "beta v2(1)=1001"
    assert markers == [MARKER + "beta-v2"]  # the old run's only
