"""The backend-neutral contract of ``statemachine.durable``: what a second backend
reuses imports no DBOS, the DBOS backend keeps the protocols, and the command line
takes a backend.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import TOOLS, answer

import statemachine as sm
from statemachine.cli import main
from statemachine.durable import (
    BACKENDS,
    DurableRunner,
    RunHandle,
    RunStore,
    open_store,
)
from statemachine.durable.dbos import DBOSRunner, DBOSStore
from statemachine.testing import FunctionModel

ROOT = Path(__file__).resolve().parent.parent
NEUTRAL = [
    "statemachine.durable",
    "statemachine.durable._course",
    "statemachine.durable._inputs",
    "statemachine.durable._journal",
    "statemachine.durable._lane",
    "statemachine.durable._order",
    "statemachine.durable._registry",
    "statemachine.durable._wire",
]


@pytest.mark.timeout(60)
def test_the_reusable_modules_import_without_dbos() -> None:
    """A second backend reuses these without DBOS installed: each imports with
    ``dbos`` made unimportable, and none names it."""
    program = (
        "import sys, importlib\n"
        "sys.modules['dbos'] = None  # any import of dbos now fails\n"
        f"for name in {NEUTRAL!r}:\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in NEUTRAL:
        path = ROOT / (name.replace(".", "/") + ("/__init__.py" if name.count(".") == 1 else ".py"))
        source = path.read_text()
        assert "import dbos" not in source, path
        assert "from dbos" not in source, path


@pytest.mark.timeout(120)
def test_the_dbos_backend_keeps_the_protocols_and_the_command_takes_a_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path}/runs.sqlite"
    runner = DBOSRunner(models={"scripted": FunctionModel(answer)}, tools=TOOLS, database_url=db)
    assert isinstance(runner, DurableRunner)

    async def run() -> None:
        runner.launch()
        try:
            handle = await runner.start("r", model="scripted", messages="go")
            assert isinstance(handle, RunHandle)
            assert (await handle.result(timeout=60)).ok
        finally:
            runner.destroy()

    async def look() -> None:  # a process that is not a worker (a loop DBOS never ran in)
        store = open_store("dbos", db)
        try:
            assert isinstance(store, DBOSStore)
            assert isinstance(store, RunStore)
            assert [r.run_id for r in await store.list_runs()] == ["r"]
            assert isinstance(await store.handle("r"), RunHandle)
            done = await store.export_journal("r", tmp_path / "r.jsonl")
            assert done.finished
        finally:
            store.close()

    # DBOS binds its log handler to the stderr of the process's first launch: not
    # capsys's, which closes with this test.
    with capsys.disabled():
        asyncio.run(run())
    asyncio.run(look())
    assert sorted(BACKENDS) == ["dbos", "temporal"]
    with pytest.raises(sm.InvalidInputError, match="unknown backend 'nope'; known: dbos, temporal"):
        open_store("nope", db)
    assert main(["durable", "list", "--backend", "dbos", "--db", db]) == 0
    assert "1 run(s)" in capsys.readouterr().out
    out = tmp_path / "cli.jsonl"
    assert main(["durable", "export", "r", "--backend", "dbos", "--db", db, "--out", str(out)]) == 0
    assert out.read_bytes() == (tmp_path / "r.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["durable", "list", "--backend", "nope", "--db", db]) == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    assert main(["durable", "list", "--backend", "temporal", "--db", db]) == 2
    assert "not a Temporal address: 'sqlite:" in capsys.readouterr().err
