"""Conversation sessions: a history kept across runs.

A ``Session`` is a store of one conversation's messages (the protocol of the OpenAI
Agents SDK's sessions): ``get_items(limit)`` the newest ``limit`` messages in order,
``add_items`` appends, ``pop_item`` removes the newest, ``clear_session`` empties it.
``InMemorySession`` keeps them in a list (tests, one process); ``SQLiteSession``
(``statemachine.agent.sqlite_session``) in a database file; any object with these
methods, a ``session_id`` and a ``history_limit`` is a session (your own store).

A run given a session (``Agent.run(prompt, session=s)``, and ``run_sync``,
``run_stream``, ``run_stream_sync``, ``run_agent``, ``run_agent_sync``) is a
``SessionTurn``:

1. It claims the session: a second run on the same session while one runs in this
   process is refused with ``SessionBusyError`` before it reads anything, so two runs
   never interleave their turns. The same session is the same object, or objects with
   the same ``claim_key`` (``SharedSession``: ``SQLiteSession`` names its file and id).
   Runs in other processes are not coordinated.
2. It reads back at most ``session.history_limit`` of the newest messages
   (``DEFAULT_HISTORY_LIMIT``); older history stays stored, unread. The window starts at
   its first ``UserMessage``, so it never begins with a result whose call was cut off.
   What is read is checked (messages, at most the limit, tool calls paired with their
   results): ``SessionDataError`` naming the session otherwise, before any model call.
3. The run starts from that history followed by its own messages (the prompt).
4. When the run returns, in whatever state, its new messages (``RunResult.new_messages()``:
   the prompt and everything after it) are appended, in order, once. A returned run's
   messages answer every tool call (the engine guarantees it of ``Done``, ``Aborted``,
   ``Failed`` and the limits), so the stored history stays valid. A run that returns
   ``AwaitingUser`` with calls waiting for a person's approval stores what comes before
   the assistant message holding them (the prompt and the finished turns): that turn is
   not over, and storing it unanswered would leave the session a history no run can
   continue (one stopped by a denial has no call waiting, and stores everything). A run
   that raises instead of returning (``KeyboardInterrupt``, a refused argument) stores
   nothing; a store that fails to append raises its error from the run call.

Resuming such a run with its session (``Agent.resume(result, approvals=...,
session=s)``, ``resume_in_session``) stores the suspended turn and what follows it once
the resumed run returns, by the same rules. It is refused (``InvalidInputError``) when
the session has moved on since the run stopped (another run, or the same resume twice):
its newest message must be the one before the suspended turn, so a turn is never stored
out of order or twice.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import attrs

from statemachine.agent.events import RunResult
from statemachine.core.invariants import history_violations
from statemachine.core.messages import AssistantMessage, Message, ToolResultMessage, UserMessage
from statemachine.core.table import TurnState
from statemachine.core.wire import messages_from_dicts
from statemachine.errors import (
    BadDataError,
    InvalidInputError,
    SessionBusyError,
    SessionDataError,
)

__all__ = [
    "DEFAULT_HISTORY_LIMIT",
    "MAX_SESSION_ID_LENGTH",
    "InMemorySession",
    "Session",
    "SessionTurn",
    "SharedSession",
    "check_history_limit",
    "check_session",
    "check_session_id",
    "resume_in_session",
    "run_in_session",
    "session_history_only",
]

DEFAULT_HISTORY_LIMIT = 200
"""How many of a session's newest messages a run reads back, unless the session says."""

MAX_SESSION_ID_LENGTH = 256
"""The longest session id (in characters)."""

_MESSAGE_TYPES = (UserMessage, AssistantMessage, ToolResultMessage)
_R = TypeVar("_R", bound=RunResult)


@runtime_checkable
class Session(Protocol):
    """One conversation's stored messages (module docstring). Every method is async;
    ``get_items(limit)`` returns the newest ``limit`` messages (all with ``None``),
    oldest first."""

    @property
    def session_id(self) -> str: ...

    @property
    def history_limit(self) -> int: ...

    async def get_items(self, limit: int | None = None) -> list[Message]: ...

    async def add_items(self, items: Sequence[Message]) -> None: ...

    async def pop_item(self) -> Message | None: ...

    async def clear_session(self) -> None: ...


def check_session_id(session_id: object) -> str:
    """``session_id`` if it is a usable id: a string of 1 to ``MAX_SESSION_ID_LENGTH``
    printable characters, not starting or ending with a space."""
    if not isinstance(session_id, str):
        raise InvalidInputError(f"session_id must be a string, got {type(session_id).__name__}")
    if not 0 < len(session_id) <= MAX_SESSION_ID_LENGTH:
        raise InvalidInputError(
            f"session_id must have 1 to {MAX_SESSION_ID_LENGTH} characters, got {len(session_id)}"
        )
    if not session_id.isprintable() or session_id.strip() != session_id:
        raise InvalidInputError(
            "session_id must be printable characters without leading or trailing spaces"
        )
    return session_id


def check_session(session: object) -> Session:
    if not isinstance(session, Session):
        raise InvalidInputError(
            "session must be a Session (session_id, history_limit, get_items, add_items, "
            f"pop_item, clear_session), got {type(session).__name__}"
        )
    check_session_id(session.session_id)
    return session


def check_history_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidInputError(f"history_limit must be a positive integer, got {limit!r}")
    return limit


def _check_items(items: object) -> list[Message]:
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise InvalidInputError("items must be a sequence of messages")
    for i, item in enumerate(items):
        if not isinstance(item, _MESSAGE_TYPES):
            raise InvalidInputError(f"items[{i}] is a {type(item).__name__}, not a message")
    return list(items)


class InMemorySession:
    """A session kept in a list, for tests and one process (lost when it exits)."""

    def __init__(self, session_id: str, *, history_limit: int = DEFAULT_HISTORY_LIMIT) -> None:
        self.session_id = check_session_id(session_id)
        self.history_limit = check_history_limit(history_limit)
        self._items: list[Message] = []

    def __repr__(self) -> str:
        return f"InMemorySession({self.session_id!r}, {len(self._items)} messages)"

    async def get_items(self, limit: int | None = None) -> list[Message]:
        if limit is None:
            return list(self._items)
        return self._items[-limit:] if limit > 0 else []

    async def add_items(self, items: Sequence[Message]) -> None:
        self._items.extend(_check_items(items))

    async def pop_item(self) -> Message | None:
        return self._items.pop() if self._items else None

    async def clear_session(self) -> None:
        self._items.clear()


@runtime_checkable
class SharedSession(Protocol):
    """A session that names the conversation it stores (``claim_key``), so that two
    objects for one conversation (two ``SQLiteSession`` on one file and id, made per
    request) are one session to the runs of this process. Optional: other sessions
    are one conversation per object."""

    @property
    def claim_key(self) -> Hashable: ...


# The conversations runs are using in this process. The value keeps the session alive,
# so the ``id`` of an object claimed by identity is not reused while it is claimed.
_claimed: dict[Hashable, Session] = {}
_claimed_lock = threading.Lock()  # runs on different event loops (run_sync) share it


def _claim_key(session: Session) -> Hashable:
    if isinstance(session, SharedSession) and session.claim_key is not None:
        return ("shared", session.claim_key)
    return ("object", id(session))


def _claim(session: Session) -> None:
    key = _claim_key(session)
    with _claimed_lock:
        if key in _claimed:
            raise SessionBusyError(
                f"session {session.session_id!r} is in use by another run: one run at a "
                "time per session (await the first, or give this run its own session)"
            )
        _claimed[key] = session


def _release(session: Session) -> None:
    key = _claim_key(session)
    with _claimed_lock:
        if _claimed.get(key) is session:
            del _claimed[key]


def _window(session_id: str, items: object, limit: int) -> list[Message]:
    """The history a run starts from: ``items`` checked, from its first user message."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise SessionDataError(
            f"session {session_id!r}: get_items returned a {type(items).__name__}, "
            "not a list of messages"
        )
    if len(items) > limit:
        raise SessionDataError(
            f"session {session_id!r}: get_items({limit}) returned {len(items)} messages"
        )
    for i, item in enumerate(items):
        if not isinstance(item, _MESSAGE_TYPES):
            raise SessionDataError(
                f"session {session_id!r}: item {i} of the history read back is a "
                f"{type(item).__name__}, not a message"
            )
    start = next((i for i, m in enumerate(items) if isinstance(m, UserMessage)), len(items))
    history = list(items[start:])
    violations = history_violations(history)
    if violations:
        problems = "; ".join(str(v) for v in violations[:3])
        raise SessionDataError(
            f"session {session_id!r}: the stored history breaks the pairing of tool "
            f"calls and results: {problems}"
        )
    return history


def stored_part(result: RunResult, start: int) -> tuple[Message, ...]:
    """What a session keeps of ``result``, a run given ``start`` messages of history
    (module docstring, 4)."""
    new = result.messages[start:]
    waiting = {call.id for call in result.pending_approvals}
    if result.state is TurnState.AWAITING_USER and waiting:
        for index, message in enumerate(new):
            calls = message.tool_calls if isinstance(message, AssistantMessage) else ()
            if waiting & {call.id for call in calls}:
                return new[:index]
    return new


@attrs.define
class SessionTurn:
    """One run on a session: ``open`` claims it and reads the history back, ``keep``
    stores the run's new messages once and releases it (module docstring)."""

    session: Session
    history: list[Message]
    messages: list[Message]  # what the run starts from: the history, then its own
    _done: bool = False  # stored, or given up: nothing more is stored
    _released: bool = False

    @classmethod
    async def open(cls, session: object, messages: Sequence[Message] | str) -> SessionTurn:
        session = check_session(session)
        session_id, limit = session.session_id, check_history_limit(session.history_limit)
        own = [UserMessage(messages)] if isinstance(messages, str) else list(messages)
        _claim(session)
        try:
            history = _window(session_id, await session.get_items(limit), limit)
        except BaseException:
            _release(session)
            raise
        return cls(session, history, [*history, *own])

    @property
    def given(self) -> int:
        return len(self.history)

    def release(self) -> None:
        """Give the session up (once: another run may have claimed it since)."""
        self._done = True
        if not self._released:
            self._released = True
            _release(self.session)

    async def keep(self, result: _R) -> _R:
        """Append ``result``'s new messages to the session (once) and release it;
        ``result`` with ``given`` set to the history read back."""
        try:
            if not self._done:
                self._done = True
                stored = stored_part(result, len(self.history))
                if stored:
                    await self.session.add_items(list(stored))
        finally:
            self.release()
        return attrs.evolve(result, given=len(self.history))


async def run_in_session(
    session: object,
    messages: Sequence[Message] | str,
    start: Callable[[list[Message]], Awaitable[_R]],
) -> _R:
    """``start(history + messages)`` as one turn of ``session``."""
    turn = await SessionTurn.open(session, messages)
    try:
        result = await start(turn.messages)
    except BaseException:
        turn.release()
        raise
    return await turn.keep(result)


def _suspended_at(messages: Sequence[Message]) -> int:
    """Where the part of a suspended run its session did not store begins: at its last
    assistant message when that one's calls wait (``stored_part``), else at the end."""
    if not history_violations(messages):
        return len(messages)
    return max(i for i, m in enumerate(messages) if isinstance(m, AssistantMessage))


def _state_messages(state: RunResult | Mapping[str, Any]) -> list[Message] | None:
    """The history of the run being resumed (``None`` when the snapshot's is malformed:
    the resume refuses it, naming the problem)."""
    if isinstance(state, RunResult):
        return list(state.messages)
    try:
        return messages_from_dicts(state["messages"])
    except (BadDataError, KeyError, TypeError):
        return None


async def resume_in_session(
    session: object,
    state: RunResult | Mapping[str, Any],
    resume: Callable[[], Awaitable[_R]],
) -> _R:
    """``resume()``, the resumption of ``state`` (a run suspended on ``session``), with
    the suspended turn and what follows stored in ``session`` (module docstring)."""
    checked = check_session(session)
    messages = _state_messages(state)
    if messages is None:
        return await resume()
    start = _suspended_at(messages)
    _claim(checked)
    try:
        newest = await checked.get_items(1)
        if start and list(newest) != [messages[start - 1]]:
            raise InvalidInputError(
                f"session {checked.session_id!r} has moved on since this run stopped (another run "
                "on it, or this run resumed already): its turn cannot be stored in order"
            )
        result = await resume()
        stored = stored_part(result, start)
        if stored:
            await checked.add_items(list(stored))
    finally:
        _release(checked)
    return result


def session_history_only(message_history: Sequence[Message]) -> None:
    """Refuse a ``message_history`` beside a session (``InvalidInputError``)."""
    if message_history:
        raise InvalidInputError(
            "give message_history or session, not both: a session run starts from the "
            "session's history"
        )
