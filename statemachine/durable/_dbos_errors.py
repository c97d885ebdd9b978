"""The runs' database failing: one clear error, and never a password in it."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import weakref
from collections.abc import Iterator
from typing import Any

import sqlalchemy.exc
from dbos import DBOSClient
from dbos import error as dbos_error
from sqlalchemy.engine import make_url

from statemachine.durable import StoreUnavailableError
from statemachine.errors import InvalidInputError

__all__ = [
    "LISTENING",
    "DBOSUnexpectedStepError",
    "DBOSWorkflowCancelledError",
    "listening_client",
    "notifies",
    "reachable",
    "redact",
    "still_there",
    "store_errors",
    "write_ahead",
]

# The DBOS errors the backend catches or raises. DBOS exports its errors as the
# attribute ``dbos.error`` (not an importable module path), so they are taken from
# there, here, once.
DBOSUnexpectedStepError = dbos_error.DBOSUnexpectedStepError
DBOSWorkflowCancelledError = dbos_error.DBOSWorkflowCancelledError

_MAX_DETAIL = 300  # chars of the driver's own words kept in the message


def redact(url: str) -> str:
    """``url`` with its password hidden (``***``)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (sqlalchemy.exc.ArgumentError, ValueError, TypeError):
        return "<an unreadable database URL>"


def _password(url: str) -> str | None:
    try:
        return make_url(url).password
    except (sqlalchemy.exc.ArgumentError, ValueError, TypeError):
        return None


def _detail(exc: BaseException, url: str) -> str:
    """The driver's first line, without the password, cut short."""
    inner = getattr(exc, "orig", None) or exc
    lines = str(inner).strip().splitlines() or [type(inner).__name__]
    line = lines[0]
    secret = _password(url)
    if secret:
        line = line.replace(secret, "***")
    return line[:_MAX_DETAIL]


def reachable(url: str) -> None:
    """Refuse at once what cannot work: a SQLite file in a missing directory."""
    try:
        parsed = make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        raise InvalidInputError(f"not a database URL: {redact(url)}") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = os.path.dirname(os.path.abspath(parsed.database or ""))
        if not os.path.isdir(folder):
            raise StoreUnavailableError(
                f"the runs' database {redact(url)} cannot be opened: "
                f"the directory {folder} does not exist"
            )


LISTENING: weakref.WeakSet[Any] = weakref.WeakSet()
"""The clients made here with a listener thread (on PostgreSQL): their event waits
are woken by notifications."""


def listening_client(url: str) -> DBOSClient:
    """A client of ``url``; on PostgreSQL with a listener thread, so that its waits for
    an event are woken by the database's notifications (``LISTENING``)."""
    listens = notifies(url)
    client = DBOSClient(system_database_url=url, use_listen_notify=listens)
    if listens:
        LISTENING.add(client)
    return client


def notifies(url: str) -> bool:
    """Whether the database tells waiters when something is written (PostgreSQL's
    LISTEN/NOTIFY); SQLite does not: its waiters poll."""
    try:
        return make_url(url).get_backend_name() == "postgresql"
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return False


def write_ahead(url: str) -> None:
    """Put a SQLite file in WAL mode (the file keeps it; every later connection, DBOS's
    included, uses it): a durable turn costs about a third of what it costs in SQLite's
    default mode, where each commit rewrites a rollback journal. Nothing for another
    database, or for a file already in WAL mode.

    Switching a file's mode needs it to itself: SQLite refuses at once ("database is
    locked", without waiting its busy timeout) while another connection is in a
    transaction, as when several workers start on one new file and the first is
    creating DBOS's tables. So the switch is retried for up to ``WAL_WAIT_SECONDS``;
    the file is usually in WAL mode by then, set by the worker that got there first."""
    parsed = make_url(url)
    path = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or path in ("", ":memory:"):
        return
    deadline = time.monotonic() + WAL_WAIT_SECONDS
    pause = 0.005
    while True:
        try:
            _switch_to_wal(path)
            return
        except sqlite3.OperationalError as exc:
            locked = "locked" in str(exc) or "busy" in str(exc)
            if not locked or time.monotonic() + pause > deadline:
                raise _unopenable(url, exc) from None
        except sqlite3.Error as exc:
            raise _unopenable(url, exc) from None
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


WAL_WAIT_SECONDS = 30.0
"""How long ``write_ahead`` retries a SQLite file that another connection holds."""


def _switch_to_wal(path: str) -> None:
    connection = sqlite3.connect(path, timeout=5)
    try:
        (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
        if str(mode).lower() != "wal":
            connection.execute("PRAGMA journal_mode=WAL")
    finally:
        connection.close()


def _unopenable(url: str, exc: sqlite3.Error) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"the runs' database {redact(url)} cannot be opened: {str(exc)[:_MAX_DETAIL]}"
    )


def still_there(url: str) -> None:
    """Refuse to read a SQLite file that was deleted under the runs: a connection
    that had it open would still read its old rows (a run "running" for ever)."""
    parsed = make_url(url)
    path = parsed.database or ""
    on_disk = parsed.get_backend_name() == "sqlite" and path not in ("", ":memory:")
    if on_disk and not os.path.exists(path):
        raise StoreUnavailableError(
            f"the runs' database {redact(url)} was deleted: its runs and their "
            "records are gone (their workers fail on their next write)"
        )


@contextlib.contextmanager
def store_errors(url: str) -> Iterator[None]:
    """Turn the database's failures to connect into ``StoreUnavailableError``."""
    try:
        yield
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as exc:
        raise StoreUnavailableError(
            f"the runs' database {redact(url)} cannot be reached: {_detail(exc, url)}"
        ) from None
    except sqlalchemy.exc.ArgumentError:
        raise InvalidInputError(f"not a database URL: {redact(url)}") from None
