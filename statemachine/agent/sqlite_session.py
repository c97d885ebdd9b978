"""``SQLiteSession``: a conversation session in an SQLite database (stdlib ``sqlite3``).

One table, ``session_messages`` (``id`` in insertion order, ``session_id``,
``message``: the message's wire form, ``message_to_dict`` as JSON text, the form the
journal tools read), shared by every session of the file; the file is in WAL mode, so
readers do not wait for a writer. Each call runs in a worker thread
(``asyncio.to_thread``) so the event loop never waits for the disk; one connection per
``SQLiteSession``, used by one thread at a time. ``":memory:"`` is a database of this
object alone.

Reading back is bounded: a row longer than ``max_message_bytes`` (default 8 MiB) is
refused, and ``get_items`` stops at ``max_read_bytes`` (default 32 MiB) of rows, newest
first, so a run never loads more than that of old history. A call waits at most
``timeout`` (default 10 s) for a file another connection holds locked, then raises
``StoreUnavailableError``; a closed session raises ``UsageError``. Every row read is checked:
JSON, then the wire form (``message_from_dict``); a row that fails is a
``SessionDataError`` naming the session and the row's id, as is a file that is not an
SQLite database or holds another ``session_messages`` table.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from statemachine.agent.session import (
    DEFAULT_HISTORY_LIMIT,
    check_history_limit,
    check_session_id,
)
from statemachine.core.messages import AssistantMessage, Message, ToolResultMessage, UserMessage
from statemachine.core.wire import message_from_dict, message_to_dict
from statemachine.errors import (
    BadDataError,
    InvalidInputError,
    SessionDataError,
    StoreUnavailableError,
    UsageError,
)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_READ_BYTES",
    "SQLiteSession",
]

DEFAULT_LOCK_TIMEOUT = 10.0
"""How long a call waits, in seconds, for a file another connection holds locked."""

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""The longest message row stored or read back (UTF-8 bytes of its JSON)."""

DEFAULT_MAX_READ_BYTES = 32 * 1024 * 1024
"""How many bytes of rows one ``get_items`` reads back at most."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS session_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    message TEXT NOT NULL
)
"""
_INDEX = """
CREATE INDEX IF NOT EXISTS session_messages_by_session ON session_messages (session_id, id);
"""
_T = TypeVar("_T")


class SQLiteSession:
    """One conversation in an SQLite file (module docstring); ``close()`` it, or use it
    as a context manager, when done."""

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        *,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        self.session_id = check_session_id(session_id)
        if not isinstance(db_path, (str, Path)):
            raise InvalidInputError("db_path must be a path or ':memory:'")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise InvalidInputError(f"timeout must be a non-negative number, got {timeout!r}")
        self.timeout = float(timeout)
        self._closed = False
        for name, value in (
            ("max_message_bytes", max_message_bytes),
            ("max_read_bytes", max_read_bytes),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
        self.db_path = str(db_path)
        self.history_limit = check_history_limit(history_limit)
        self.max_message_bytes = max_message_bytes
        self.max_read_bytes = max_read_bytes
        self._lock = threading.Lock()  # one statement at a time on the connection
        self._connection = self._connect()

    def __repr__(self) -> str:
        return f"SQLiteSession({self.session_id!r}, {self.db_path!r})"

    @property
    def claim_key(self) -> tuple[str, str] | None:
        """The file and the id: every object for them is one session to a run in this
        process (``None`` for ``":memory:"``, a database of this object alone)."""
        if self.db_path == ":memory:":
            return None
        return (os.path.realpath(self.db_path), self.session_id)

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.db_path,
            timeout=self.timeout,
            check_same_thread=False,  # used from worker threads, under self._lock
            isolation_level=None,  # transactions are explicit (BEGIN IMMEDIATE)
        )
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute(_SCHEMA)
            columns = [row[1] for row in connection.execute("PRAGMA table_info(session_messages)")]
            if columns == ["id", "session_id", "message"]:
                connection.execute(_INDEX)
        except sqlite3.DatabaseError as exc:
            connection.close()
            raise SessionDataError(
                f"session {self.session_id!r}: {self.db_path!r} is not a session database ({exc})"
            ) from None
        if columns != ["id", "session_id", "message"]:
            connection.close()
            raise SessionDataError(
                f"session {self.session_id!r}: {self.db_path!r} has a session_messages "
                f"table of other columns {columns}"
            )
        return connection

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._connection.close()

    def __enter__(self) -> SQLiteSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        def locked() -> _T:
            with self._lock:
                if self._closed:
                    raise UsageError(f"session {self.session_id!r} is closed")
                try:
                    return fn(self._connection)
                except sqlite3.OperationalError as exc:
                    if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                        raise StoreUnavailableError(
                            f"session {self.session_id!r}: {self.db_path!r} stayed locked "
                            f"by another writer for {self.timeout} s"
                        ) from None
                    raise self._bad(exc) from None
                except sqlite3.DatabaseError as exc:
                    raise self._bad(exc) from None

        return await asyncio.to_thread(locked)

    def _bad(self, exc: sqlite3.DatabaseError) -> SessionDataError:
        return SessionDataError(f"session {self.session_id!r} in {self.db_path!r}: {exc}")

    # -- the Session protocol -----------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Message]:
        """The newest ``limit`` messages (all with ``None``, within ``max_read_bytes``),
        oldest first."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidInputError(f"limit must be an integer or None, got {limit!r}")
        if limit is not None and limit <= 0:
            return []
        rows = await self._call(lambda c: self._read(c, limit))
        return [self._decode(row_id, text) for row_id, text in reversed(rows)]

    def _read(self, connection: sqlite3.Connection, limit: int | None) -> list[tuple[int, str]]:
        cursor = connection.execute(
            "SELECT id, length(CAST(message AS BLOB)), message FROM session_messages "
            "WHERE session_id = ? ORDER BY id DESC LIMIT ?",
            (self.session_id, -1 if limit is None else limit),
        )
        rows: list[tuple[int, str]] = []
        total = 0
        # Lengths are checked before a row's text is kept: a huge row is refused by its
        # size, and the budget stops the read at the oldest rows that fit.
        for row_id, size, text in cursor:
            if not isinstance(size, int) or size > self.max_message_bytes:
                raise SessionDataError(
                    f"session {self.session_id!r}: row {row_id} is {size} bytes, over "
                    f"max_message_bytes ({self.max_message_bytes})"
                )
            total += size
            if total > self.max_read_bytes:
                break
            rows.append((row_id, text))
        return rows

    def _decode(self, row_id: int, text: object) -> Message:
        where = f"session {self.session_id!r}: row {row_id}"
        if not isinstance(text, str):
            raise SessionDataError(f"{where} holds a {type(text).__name__}, not JSON text")
        try:
            return message_from_dict(json.loads(text), path=f"row {row_id}")
        except json.JSONDecodeError as exc:
            raise SessionDataError(f"{where} is not JSON ({exc})") from None
        except BadDataError as exc:
            raise SessionDataError(f"{where} is not a message: {exc}") from None
        except RecursionError:
            raise SessionDataError(f"{where} is nested too deeply") from None

    async def add_items(self, items: Sequence[Message]) -> None:
        """Append ``items`` in order, in one transaction."""
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise InvalidInputError("items must be a sequence of messages")
        rows = [(self.session_id, self._encode(i, item)) for i, item in enumerate(items)]
        if rows:
            await self._call(lambda c: self._insert(c, rows))

    def _encode(self, index: int, item: object) -> str:
        if not isinstance(item, (UserMessage, AssistantMessage, ToolResultMessage)):
            raise InvalidInputError(f"items[{index}] is a {type(item).__name__}, not a message")
        text = json.dumps(message_to_dict(item), ensure_ascii=False, separators=(",", ":"))
        if len(text.encode()) > self.max_message_bytes:
            raise InvalidInputError(
                f"items[{index}] is over max_message_bytes ({self.max_message_bytes}) as JSON"
            )
        return text

    @staticmethod
    def _insert(connection: sqlite3.Connection, rows: list[tuple[str, str]]) -> None:
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.executemany(
                "INSERT INTO session_messages (session_id, message) VALUES (?, ?)", rows
            )
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    async def pop_item(self) -> Message | None:
        """Remove the newest message and return it (``None`` when empty). A row that
        does not read back is refused and stays (``clear_session`` removes it)."""

        def pop(connection: sqlite3.Connection) -> tuple[int, str] | None:
            rows = self._read(connection, 1)
            if rows:
                self._decode(*rows[0])
                connection.execute("DELETE FROM session_messages WHERE id = ?", (rows[0][0],))
                return rows[0]
            return None

        row = await self._call(pop)
        return None if row is None else self._decode(*row)

    async def clear_session(self) -> None:
        """Remove every message of this session (the file's other sessions stay)."""
        await self._call(
            lambda c: c.execute(
                "DELETE FROM session_messages WHERE session_id = ?", (self.session_id,)
            )
        )
