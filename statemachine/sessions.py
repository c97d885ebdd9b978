"""Conversation sessions: a history kept across runs.

``Agent.run(prompt, session=s)`` (and ``run_sync``, ``run_stream``, ``run_agent``)
starts from the session's newest messages and appends the run's new ones when it
returns. ``SQLiteSession`` stores them in an SQLite file (or ``":memory:"``),
``InMemorySession`` in a list; your own store is any object with the ``Session``
protocol's attributes and async methods. Guide: ``docs/guides/sessions.md``.
"""

from __future__ import annotations

from statemachine.agent.session import (
    DEFAULT_HISTORY_LIMIT,
    MAX_SESSION_ID_LENGTH,
    InMemorySession,
    Session,
    SharedSession,
)
from statemachine.agent.sqlite_session import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_READ_BYTES,
    SQLiteSession,
)
from statemachine.errors import SessionBusyError, SessionDataError

__all__ = [
    "DEFAULT_HISTORY_LIMIT",
    "DEFAULT_LOCK_TIMEOUT",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_READ_BYTES",
    "MAX_SESSION_ID_LENGTH",
    "InMemorySession",
    "SQLiteSession",
    "Session",
    "SessionBusyError",
    "SessionDataError",
    "SharedSession",
]
