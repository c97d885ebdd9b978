"""A durable run's instructions, output type and usage limits: named in the worker's
registry (instructions and output types are code, like tools) or carried in the run's
input (limits), so a durable run ends as ``run_agent``'s with the same options, its
``result().output`` typed as in memory. The kill -9 trials with them are in
test_durable_kill.py. PostgreSQL runs under `bash .ci/postgres.sh` (see
test_durable_dbos.py).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import (
    TOOLS,
    TYPED_LIMITS,
    Tally,
    answer,
    beta_needs_approval,
    billing_instructions,
    database_urls,
    launched,
    reference_run,
    result_json,
    typed_answer,
)

import statemachine as sm
from statemachine.durable import RunHeldError, open_store
from statemachine.durable.dbos import DBOSRunner
from statemachine.journal import replay
from statemachine.testing import FunctionModel

TYPED: dict[str, Any] = {
    "instructions": "billing",
    "output_type": "tally",
    "usage_limits": TYPED_LIMITS,
}


def _worker(db: str, **options: Any) -> DBOSRunner:
    options.setdefault("instructions", {"billing": billing_instructions})
    options.setdefault("output_types", {"tally": Tally})
    return DBOSRunner(
        models={"typed": FunctionModel(typed_answer), "scripted": FunctionModel(answer)},
        tools=TOOLS,
        database_url=db,
        **options,
    )


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


@pytest.mark.timeout(120)
def test_a_typed_run_with_instructions_ends_as_in_memory(
    database: Callable[[str], str], tmp_path: Path
) -> None:
    db = database("runs")

    async def body(runner: DBOSRunner) -> tuple[sm.RunResult, Any]:
        handle = await runner.start("typed", model="typed", messages="go", **TYPED)
        result = await handle.result(timeout=60)
        await runner.export_journal("typed", tmp_path / "typed.jsonl")
        store = open_store("dbos", db)
        try:
            seen_elsewhere = (await (await store.handle("typed")).result(timeout=10)).output
            await store.export_journal("typed", tmp_path / "typed-cli.jsonl")
        finally:
            store.close()
        return result, seen_elsewhere

    result, seen_elsewhere = launched(_worker(db), body)
    expected = reference_run("typed")
    assert result_json(result) == result_json(expected)
    assert result.output == Tally(4, "turn 4: answer with a Tally")
    # A process without the registry gets the validated JSON object.
    assert seen_elsewhere == {"turns": 4, "heard": "turn 4: answer with a Tally"}
    for exported in ("typed.jsonl", "typed-cli.jsonl"):  # rebuilt with the output type
        replayed = replay(tmp_path / exported)
        assert replayed.ok
        assert replayed.messages == expected.messages


@pytest.mark.timeout(120)
def test_usage_limits_end_a_durable_run_as_they_end_run_agent(
    database: Callable[[str], str],
) -> None:
    db = database("runs")
    limits = sm.UsageLimits(requests=2)

    async def body(runner: DBOSRunner) -> sm.RunResult:
        handle = await runner.start("limited", model="scripted", messages="go", usage_limits=limits)
        return await handle.result(timeout=60)

    result = launched(_worker(db), body)
    expected = asyncio.run(
        sm.run_agent(model=FunctionModel(answer), tools=TOOLS, messages="go", usage_limits=limits)
    )
    assert result.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    assert result_json(result) == result_json(expected)
    assert result.explanation == expected.explanation


@pytest.mark.timeout(120)
def test_names_outside_the_registry_are_refused_and_a_run_whose_type_is_gone_is_held(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path}/runs.sqlite"

    async def refused(runner: DBOSRunner) -> None:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"instructions": "nope"}, "unknown instructions 'nope'; known: ['billing']"),
            ({"output_type": "nope"}, "unknown output type 'nope'; known: ['tally']"),
            ({"usage_limits": {"requests": 2}}, "usage_limits must be a UsageLimits"),
        ]
        for options, error in cases:
            with pytest.raises(sm.InvalidInputError, match=re.escape(error)):
                await runner.start("x", model="typed", messages="go", **options)
        # Started; this worker stops while the run waits for a person.
        handle = await runner.start("gone", model="typed", messages="go", **TYPED)
        while not await handle.pending_approvals():
            await asyncio.sleep(0.05)

    launched(_worker(db, app_version="v1", before_tool_call=beta_needs_approval), refused)
    with pytest.raises(sm.InvalidInputError, match="instructions must be a str or a function"):
        _worker(db, instructions={"bad": 3})
    with pytest.raises(sm.InvalidInputError, match="output_type"):
        _worker(db, output_types={"bad": complex})

    async def held(runner: DBOSRunner) -> str:
        handle = await runner.handle("gone")
        for _ in range(600):
            status = await handle.status()
            if status.state == "held":
                break
            await asyncio.sleep(0.05)
        with pytest.raises(RunHeldError, match="output type 'tally' is not in this worker's"):
            await handle.result(timeout=10)
        return status.held

    gone = _worker(db, app_version="v1", before_tool_call=beta_needs_approval, output_types={})
    assert "output type 'tally' is not in this worker's registry" in launched(gone, held)
