"""Conversation sessions: history kept across runs, in SQLite, in memory or in the
user's own store, each held to the same promise by one parametrized test."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import statemachine as sm
from statemachine.core.invariants import history_violations
from statemachine.errors import (
    InvalidInputError,
    SessionBusyError,
    SessionDataError,
    StoreUnavailableError,
    UsageError,
)
from statemachine.messages import message_from_dict, message_to_dict
from statemachine.sessions import (
    DEFAULT_HISTORY_LIMIT,
    InMemorySession,
    Session,
    SQLiteSession,
)
from statemachine.testing import FunctionModel, ScriptedModel

pytestmark = pytest.mark.timeout(30)


class DictStore:
    """A user's own store: every conversation in one dict of wire-form lists, as an
    application would keep them in a key-value service."""

    def __init__(self) -> None:
        self.data: dict[str, list[dict[str, object]]] = {}

    def session(self, session_id: str) -> DictSession:
        return DictSession(self, session_id)


class DictSession:
    history_limit = DEFAULT_HISTORY_LIMIT

    def __init__(self, store: DictStore, session_id: str) -> None:
        self.store = store
        self.session_id = session_id

    async def get_items(self, limit: int | None = None) -> list[sm.Message]:
        rows = self.store.data.get(self.session_id, [])
        if limit is not None:
            rows = rows[-limit:] if limit > 0 else []
        return [message_from_dict(row) for row in rows]

    async def add_items(self, items: Sequence[sm.Message]) -> None:
        rows = self.store.data.setdefault(self.session_id, [])
        rows.extend(message_to_dict(item) for item in items)

    async def pop_item(self) -> sm.Message | None:
        rows = self.store.data.get(self.session_id, [])
        return message_from_dict(rows.pop()) if rows else None

    async def clear_session(self) -> None:
        self.store.data.pop(self.session_id, None)


SessionFactory = Callable[[str], Session]


@pytest.fixture(params=["sqlite-memory", "sqlite-file", "in-memory", "users-dict-store"])
def make_session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionFactory]:
    """Sessions of one store: two ids made by one factory share the store."""
    kind = request.param
    if kind == "in-memory":
        made: dict[str, InMemorySession] = {}
        yield lambda sid: made.setdefault(sid, InMemorySession(sid))
        return
    if kind == "users-dict-store":
        yield DictStore().session
        return
    path = ":memory:" if kind == "sqlite-memory" else str(tmp_path / "sessions.db")
    opened: dict[str, SQLiteSession] = {}

    def sqlite(sid: str) -> SQLiteSession:
        # ":memory:" is one database per connection: one object per id stands for it
        if sid not in opened:
            opened[sid] = SQLiteSession(sid, path)
        return opened[sid]

    yield sqlite
    for session in opened.values():
        session.close()


def _text(message: sm.Message) -> str:
    if isinstance(message, sm.UserMessage):
        return "".join(c.text for c in message.content if isinstance(c, sm.TextContent))
    return message.text


def _texts(messages: Sequence[sm.Message]) -> list[str]:
    return [_text(m) for m in messages]


def test_every_store_keeps_the_session_promise(make_session: SessionFactory) -> None:
    """The protocol, then three runs of an agent: each run sees the earlier turns."""

    async def main() -> None:
        session, other = make_session("user-1"), make_session("user-2")
        assert isinstance(session, Session)
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items([sm.UserMessage("a"), sm.UserMessage("b")])
        await session.add_items([sm.UserMessage("c")])
        await other.add_items([sm.UserMessage("elsewhere")])
        assert _texts(await session.get_items()) == ["a", "b", "c"]
        assert _texts(await session.get_items(2)) == ["b", "c"]
        assert await session.get_items(0) == []
        popped = await session.pop_item()
        assert popped is not None
        assert _text(popped) == "c"
        assert _texts(await session.get_items()) == ["a", "b"]
        await session.clear_session()
        assert await session.get_items() == []
        assert _texts(await other.get_items()) == ["elsewhere"]

        model = ScriptedModel("Hello, Ada.", "You said your name is Ada.", "Goodbye, Ada.")
        agent = sm.Agent(model)
        for prompt in ("I am Ada.", "What is my name?", "Bye."):
            result = await agent.run(prompt, session=session)
            assert result.ok
            assert _texts(result.new_messages()) == [prompt, result.final_text]
        # the third call was sent both earlier turns, then its prompt
        assert _texts(model.contexts[2]) == [
            "I am Ada.",
            "Hello, Ada.",
            "What is my name?",
            "You said your name is Ada.",
            "Bye.",
        ]
        assert _texts(await session.get_items()) == [*_texts(model.contexts[2]), "Goodbye, Ada."]
        assert _texts(await other.get_items()) == ["elsewhere"]

    asyncio.run(main())


@sm.tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: 21 C"


def test_a_session_keeps_tool_turns_in_the_wire_form_the_journal_tools_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chat.db"
    model = ScriptedModel(sm.ToolCall("c1", "lookup", {"city": "Oslo"}), "It is 21 C.")
    with SQLiteSession("chat", path) as session:
        result = sm.Agent(model, tools=[lookup]).run_sync("Weather in Oslo?", session=session)
    assert result.ok
    assert len(result.new_messages()) == 4
    with sqlite3.connect(path) as db:
        rows = [json.loads(text) for (text,) in db.execute("SELECT message FROM session_messages")]
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert rows == [message_to_dict(m) for m in result.messages]
    # a new object on the same file reads the same conversation
    with SQLiteSession("chat", path) as again:
        assert asyncio.run(again.get_items()) == list(result.messages)


def test_a_run_streamed_with_a_session_stores_its_messages_when_the_block_ends() -> None:
    session = InMemorySession("s")
    agent = sm.Agent(ScriptedModel("one", "two"))
    agent.run_sync("first", session=session)

    async def main() -> sm.RunResult:
        async with agent.run_stream("second", session=session) as run:
            events = [event async for event in run]
        assert events  # the run was streamed
        return await run.result()

    result = asyncio.run(main())
    assert _texts(result.new_messages()) == ["second", "two"]
    assert _texts(asyncio.run(session.get_items())) == ["first", "one", "second", "two"]


def test_an_aborted_run_stores_its_partial_history_answered_and_once() -> None:
    controller = sm.AbortController()

    @sm.tool
    async def slow(topic: str) -> str:
        """Research a topic."""
        controller.abort("the user left")
        return f"notes on {topic}"

    session = InMemorySession("s")
    model = ScriptedModel(
        [sm.ToolCall("c1", "slow", {"topic": "owls"}), sm.ToolCall("c2", "slow", {"topic": "x"})]
    )
    result = sm.Agent(model, tools=[slow]).run_sync(
        "Research owls", session=session, signal=controller.signal
    )
    assert result.state is sm.TurnState.ABORTED
    stored = asyncio.run(session.get_items())
    assert stored == list(result.new_messages()) == list(result.messages)
    assert history_violations(stored) == []  # every call answered, run or not
    assert [type(m).__name__ for m in stored] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "ToolResultMessage",
    ]
    # the next run continues from it
    follow = ScriptedModel("Sorry, where were we?")
    sm.Agent(follow, tools=[slow]).run_sync("Still there?", session=session)
    assert follow.contexts[0][:4] == stored
    assert len(asyncio.run(session.get_items())) == 6


def test_a_run_waiting_for_approval_stores_its_finished_part_and_the_next_run_goes_on() -> None:
    def policy(call: sm.ToolCall) -> sm.RequireApproval | None:
        return sm.RequireApproval("a person decides") if call.name == "lookup" else None

    session = InMemorySession("s")
    agent = sm.Agent(
        ScriptedModel("Hi.", sm.ToolCall("c1", "lookup", {"city": "Rome"}), "Fine, I will not."),
        tools=[lookup],
        before_tool_call=policy,
    )
    agent.run_sync("Hello", session=session)
    waiting = agent.run_sync("Weather in Rome?", session=session)
    assert waiting.state is sm.TurnState.AWAITING_USER
    assert [c.id for c in waiting.pending_approvals] == ["c1"]
    # the unanswered call is not stored: the prompt is
    assert _texts(asyncio.run(session.get_items())) == ["Hello", "Hi.", "Weather in Rome?"]
    after = agent.run_sync("Never mind.", session=session)
    assert after.ok
    stored = asyncio.run(session.get_items())
    assert history_violations(stored) == []
    assert _texts(stored)[-2:] == ["Never mind.", "Fine, I will not."]


def test_a_run_denied_by_policy_stores_the_denied_turn_answered() -> None:
    session = InMemorySession("s")
    agent = sm.Agent(
        ScriptedModel(sm.ToolCall("c1", "lookup", {"city": "Rome"})),
        tools=[lookup],
        before_tool_call=lambda call: sm.Deny("not today"),
    )
    result = agent.run_sync("Weather in Rome?", session=session)
    assert result.state is sm.TurnState.AWAITING_USER
    assert not result.pending_approvals
    stored = asyncio.run(session.get_items())
    assert stored == list(result.messages)
    assert history_violations(stored) == []


def test_a_run_reads_back_a_bounded_window_that_starts_at_a_user_message() -> None:
    session = InMemorySession("s", history_limit=5)
    model = ScriptedModel(sm.ToolCall("c1", "lookup", {"city": "Oslo"}), "Cold.", "Warm.", "Ok.")
    agent = sm.Agent(model, tools=[lookup])
    agent.run_sync("Oslo?", session=session)  # 4 messages: user, call, result, answer
    agent.run_sync("Rome?", session=session)  # 2 more: the newest 5 begin with a call
    agent.run_sync("Thanks.", session=session)
    # the newest five [call, result, Cold., Rome?, Warm.] are read from "Rome?" on
    assert _texts(model.contexts[3]) == ["Rome?", "Warm.", "Thanks."]
    assert len(asyncio.run(session.get_items())) == 8  # older history stays stored


def test_sqlite_reads_back_at_most_max_read_bytes(tmp_path: Path) -> None:
    with SQLiteSession("s", tmp_path / "db", max_read_bytes=200) as session:
        asyncio.run(session.add_items([sm.UserMessage("x" * 60) for _ in range(10)]))
        read = asyncio.run(session.get_items())
        assert 0 < len(read) < 10
        assert read == asyncio.run(session.get_items(len(read)))  # the newest ones


def test_sqlite_refuses_a_message_over_max_message_bytes(tmp_path: Path) -> None:
    with SQLiteSession("s", tmp_path / "db", max_message_bytes=100) as session:
        with pytest.raises(InvalidInputError, match="max_message_bytes"):
            asyncio.run(session.add_items([sm.UserMessage("x" * 200)]))
        assert asyncio.run(session.get_items()) == []


# -- refusals --------------------------------------------------------------------------


def _write_row(path: Path, text: object, session_id: str = "s") -> int:
    SQLiteSession(session_id, path).close()  # creates the table
    with sqlite3.connect(path) as db:
        cursor = db.execute(
            "INSERT INTO session_messages (session_id, message) VALUES (?, ?)", (session_id, text)
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("{not json", "is not JSON"),
        (json.dumps({"role": "wizard"}), "is not a message"),
        (json.dumps([1, 2]), "is not a message"),
        (b"\x00\x01", "not JSON text"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply|is not JSON|not a message"),
    ],
    ids=["bad-json", "unknown-role", "not-an-object", "blob", "deep"],
)
def test_a_corrupted_row_is_refused_naming_the_session_and_row_before_any_model_call(
    tmp_path: Path, row: object, problem: str
) -> None:
    path = tmp_path / "db"
    row_id = _write_row(path, row, "alice")
    model = ScriptedModel("never sent")
    with SQLiteSession("alice", path) as session:
        with pytest.raises(SessionDataError, match=rf"session 'alice': row {row_id} .*({problem})"):
            sm.Agent(model).run_sync("hi", session=session)
        assert model.calls == 0
        sm.Agent(ScriptedModel("ok")).run_sync("hi", session=InMemorySession("alice"))
        # the session is released: clearing it makes it usable again
        asyncio.run(session.clear_session())
        assert sm.Agent(ScriptedModel("ok")).run_sync("hi", session=session).ok


def test_a_row_over_max_message_bytes_is_refused_by_its_size(tmp_path: Path) -> None:
    path = tmp_path / "db"
    row_id = _write_row(path, json.dumps(message_to_dict(sm.UserMessage("x" * 500))))
    with (
        SQLiteSession("s", path, max_message_bytes=100) as session,
        pytest.raises(SessionDataError, match=f"row {row_id} is .* over max_message_bytes"),
    ):
        asyncio.run(session.get_items())


def test_a_file_that_is_not_a_session_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database" * 200)
    with pytest.raises(
        SessionDataError, match=r"session 's': .*notes.db.* is not a session database"
    ):
        SQLiteSession("s", path)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE session_messages (who TEXT, said TEXT)")
    with pytest.raises(SessionDataError, match="other columns"):
        SQLiteSession("s", other)


def test_a_stored_history_that_breaks_the_call_pairing_is_refused() -> None:
    session = InMemorySession("bob")
    call = sm.ToolCall("c1", "lookup", {"city": "Oslo"})
    broken: list[sm.Message] = [
        sm.UserMessage("hi"),
        sm.AssistantMessage((call,)),
        sm.UserMessage("again"),
    ]
    asyncio.run(session.add_items(broken))
    model = ScriptedModel("never sent")
    with pytest.raises(SessionDataError, match=r"session 'bob': .*pairing"):
        sm.Agent(model, tools=[lookup]).run_sync("hi", session=session)
    assert model.calls == 0


class _Liar(DictSession):
    def __init__(self, items: object) -> None:
        super().__init__(DictStore(), "liar")
        self.items = items

    async def get_items(self, limit: int | None = None) -> list[sm.Message]:
        return self.items  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("items", "problem"),
    [
        ("a string", "not a list of messages"),
        ([sm.UserMessage("hi"), {"role": "user"}], "item 1 .* is a dict"),
        ([sm.UserMessage("x")] * (DEFAULT_HISTORY_LIMIT + 1), "returned 201 messages"),
    ],
    ids=["not-a-list", "a-dict", "over-the-limit"],
)
def test_what_a_users_store_returns_is_checked(items: object, problem: str) -> None:
    with pytest.raises(SessionDataError, match=f"session 'liar': .*{problem}"):
        sm.Agent(ScriptedModel("never")).run_sync("hi", session=_Liar(items))


@pytest.mark.parametrize("session_id", ["", " padded", "new\nline", "x" * 257, 42], ids=repr)
def test_a_bad_session_id_is_refused(session_id: object) -> None:
    with pytest.raises(InvalidInputError, match="session_id"):
        InMemorySession(session_id)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="session_id"):
        SQLiteSession(session_id)  # type: ignore[arg-type]


def test_a_session_and_a_message_history_together_are_refused() -> None:
    agent = sm.Agent(ScriptedModel("never"))
    with pytest.raises(InvalidInputError, match="message_history or session"):
        agent.run_sync("hi", message_history=[sm.UserMessage("x")], session=InMemorySession("s"))
    with pytest.raises(InvalidInputError, match="session must be a Session"):
        agent.run_sync("hi", session="s")  # type: ignore[arg-type]


# -- two runs on one session -----------------------------------------------------------


def test_a_second_run_on_a_session_in_use_is_refused_and_the_first_is_untouched(
    make_session: SessionFactory,
) -> None:
    async def main() -> None:
        session = make_session("shared")
        started, release = asyncio.Event(), asyncio.Event()

        @sm.tool
        async def wait() -> str:
            """Wait for the test."""
            started.set()
            await release.wait()
            return "done"

        agent = sm.Agent(ScriptedModel(sm.ToolCall("c1", "wait", {}), "first"), tools=[wait])
        first = asyncio.ensure_future(agent.run("one", session=session))
        await started.wait()
        second = sm.Agent(ScriptedModel("second"))
        with pytest.raises(SessionBusyError, match="'shared' is in use by another run"):
            await second.run("two", session=session)
        with pytest.raises(SessionBusyError):
            async with second.run_stream("two", session=session):
                pass
        assert second.model.calls == 0  # type: ignore[attr-defined]
        release.set()
        assert (await first).final_text == "first"
        # the first run's turn alone was stored; the session is free again
        assert _texts(await session.get_items()) == ["one", "", "done", "first"]
        third = await sm.Agent(ScriptedModel("third")).run("three", session=session)
        assert third.ok

    asyncio.run(main())


def test_a_run_refused_before_it_starts_releases_its_session() -> None:
    session = InMemorySession("s")
    with pytest.raises(InvalidInputError):
        sm.Agent(ScriptedModel("x")).run_sync("hi", session=session, signal="no")  # type: ignore[arg-type]
    assert sm.Agent(ScriptedModel("ok")).run_sync("hi", session=session).ok
    assert _texts(asyncio.run(session.get_items())) == ["hi", "ok"]


def test_a_failing_store_fails_the_call_and_releases_the_session() -> None:
    class Full(InMemorySession):
        async def add_items(self, items: Sequence[sm.Message]) -> None:
            raise OSError("disk full")

    session = Full("s")
    with pytest.raises(OSError, match="disk full"):
        sm.Agent(ScriptedModel("x")).run_sync("hi", session=session)
    with pytest.raises(OSError, match="disk full"):
        sm.Agent(ScriptedModel("y")).run_sync("hi", session=session)  # not SessionBusyError


def test_function_model_sees_the_stored_history() -> None:
    seen: list[int] = []

    def answer(messages: list[sm.Message], tools: object) -> str:
        seen.append(len(messages))
        return "ok"

    session = InMemorySession("s")
    for _ in range(3):
        sm.Agent(FunctionModel(answer)).run_sync("again", session=session)
    assert seen == [1, 3, 5]


# -- resuming a run suspended on a session ---------------------------------------------


def _approval_agent(*responses: str | sm.ToolCall) -> sm.Agent:
    def policy(call: sm.ToolCall) -> sm.RequireApproval | None:
        return sm.RequireApproval("a person decides") if call.name == "lookup" else None

    return sm.Agent(ScriptedModel(*responses), tools=[lookup], before_tool_call=policy)


def test_a_resumed_run_stores_its_suspended_turn_in_order_once(
    make_session: SessionFactory,
) -> None:
    session = make_session("s")
    agent = _approval_agent(sm.ToolCall("c1", "lookup", {"city": "Rome"}), "21 C.", "Bye.")
    waiting = agent.run_sync("Weather in Rome?", session=session)
    assert _texts(asyncio.run(session.get_items())) == ["Weather in Rome?"]
    # a snapshot that went through JSON, as it would to another process
    snapshot = json.loads(json.dumps(waiting.snapshot))
    done = agent.resume_sync(snapshot, approvals={"c1": True}, session=session)
    assert done.ok
    stored = asyncio.run(session.get_items())
    assert stored == list(done.messages)
    assert history_violations(stored) == []
    with pytest.raises(InvalidInputError, match="'s' has moved on"):
        agent.resume_sync(waiting, approvals={"c1": True}, session=session)
    assert asyncio.run(session.get_items()) == stored  # nothing twice
    after = agent.run_sync("Thanks.", session=session)
    assert _texts(after.messages) == [*_texts(stored), "Thanks.", "Bye."]


def test_a_run_on_the_session_meanwhile_makes_the_resume_refused() -> None:
    session = InMemorySession("s")
    agent = _approval_agent(sm.ToolCall("c1", "lookup", {"city": "Rome"}), "Something else.")
    waiting = agent.run_sync("Weather in Rome?", session=session)
    agent.run_sync("Other question", session=session)  # the waiting call stays unstored
    model_calls = agent.model.calls  # type: ignore[attr-defined]
    with pytest.raises(InvalidInputError, match="moved on"):
        agent.resume_sync(waiting, approvals={"c1": True}, session=session)
    assert agent.model.calls == model_calls  # type: ignore[attr-defined]
    assert history_violations(asyncio.run(session.get_items())) == []


def test_a_run_resumed_with_a_message_stores_the_calls_answered_as_not_approved() -> None:
    session = InMemorySession("s")
    agent = _approval_agent(sm.ToolCall("c1", "lookup", {"city": "Rome"}), "As you wish.")
    waiting = agent.run_sync("Weather in Rome?", session=session)
    done = agent.resume_sync(waiting, message=sm.UserMessage("No, stop."), session=session)
    assert done.ok
    stored = asyncio.run(session.get_items())
    assert stored == list(done.messages)
    assert [type(m).__name__ for m in stored] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "UserMessage",
        "AssistantMessage",
    ]


def test_a_run_denied_by_policy_resumes_with_a_message_on_its_session() -> None:
    session = InMemorySession("s")
    agent = sm.Agent(
        ScriptedModel(sm.ToolCall("c1", "lookup", {"city": "Rome"}), "Understood."),
        tools=[lookup],
        before_tool_call=lambda call: sm.Deny("not today"),
    )
    denied = agent.run_sync("Weather in Rome?", session=session)
    done = agent.resume_sync(denied, message=sm.UserMessage("Fine."), session=session)
    assert done.ok
    assert asyncio.run(session.get_items()) == list(done.messages)


def test_a_file_locked_by_another_writer_is_a_store_unavailable_error_after_the_timeout(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db"
    with SQLiteSession("s", path, timeout=0.05) as session:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(StoreUnavailableError, match=r"'s': .* stayed locked"):
                asyncio.run(session.add_items([sm.UserMessage("hi")]))
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        asyncio.run(session.add_items([sm.UserMessage("hi")]))
        assert len(asyncio.run(session.get_items())) == 1


def test_a_closed_sqlite_session_is_a_usage_error() -> None:
    session = SQLiteSession("s")
    session.close()
    with pytest.raises(UsageError, match="'s' is closed"):
        asyncio.run(session.get_items())


def test_two_sqlite_sessions_on_one_file_and_id_are_one_session_to_the_runs(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        started, release = asyncio.Event(), asyncio.Event()

        @sm.tool
        async def wait() -> str:
            """Wait for the test."""
            started.set()
            await release.wait()
            return "done"

        path = tmp_path / "chats.db"
        # made per request, as a web handler would
        a, b = SQLiteSession("ada", path), SQLiteSession("ada", str(path))
        other_id, other_file = SQLiteSession("bob", path), SQLiteSession("ada", tmp_path / "2.db")
        slow = sm.Agent(ScriptedModel(sm.ToolCall("c1", "wait", {}), "first"), tools=[wait])
        first = asyncio.ensure_future(slow.run("one", session=a))
        await started.wait()
        with pytest.raises(SessionBusyError, match="'ada' is in use"):
            await sm.Agent(ScriptedModel("never")).run("two", session=b)
        assert (await sm.Agent(ScriptedModel("ok")).run("hi", session=other_id)).ok
        assert (await sm.Agent(ScriptedModel("ok")).run("hi", session=other_file)).ok
        release.set()
        await first
        assert (await sm.Agent(ScriptedModel("after")).run("three", session=b)).ok
        assert _texts(await a.get_items()) == ["one", "", "done", "first", "three", "after"]
        for session in (a, b, other_id, other_file):
            session.close()

    asyncio.run(main())


# -- a property: any sequence of runs leaves a valid history, grown only at its end ------

STEPS = ("answer", "tool", "abort", "wait", "resume", "deny")


def _window_of(stored: list[sm.Message], limit: int) -> list[sm.Message]:
    newest = stored[-limit:]
    start = next((i for i, m in enumerate(newest) if isinstance(m, sm.UserMessage)), len(newest))
    return newest[start:]


def _check_runs(steps: Sequence[str]) -> None:
    """Run ``steps`` on one session; after each, the stored history pairs every call,
    only grew at its end, and the run's first model call was sent its window."""
    session = InMemorySession("prop", history_limit=6)
    ids = iter(range(10_000))
    holder: dict[str, sm.AbortController] = {}

    def answer(messages: list[sm.Message], tools: object) -> sm.ToolCall | str:
        last = messages[-1]
        kind = _text(last) if isinstance(last, sm.UserMessage) else ""
        name = {"tool": "note", "abort": "halt", "wait": "risky", "deny": "forbidden"}
        if kind in name:
            return sm.ToolCall(f"c{next(ids)}", name[kind], {})
        return "ok"

    @sm.tool
    def note() -> str:
        """Take a note."""
        return "noted"

    @sm.tool
    def halt() -> str:
        """Stop the run."""
        holder["controller"].abort("halted")
        return "halting"

    @sm.tool
    def risky() -> str:
        """Needs a person."""
        return "done"

    @sm.tool
    def forbidden() -> str:
        """Never allowed."""
        return "never"

    def policy(call: sm.ToolCall) -> sm.Deny | sm.RequireApproval | None:
        if call.name == "risky":
            return sm.RequireApproval("a person decides")
        return sm.Deny("no") if call.name == "forbidden" else None

    model = FunctionModel(answer)
    agent = sm.Agent(model, tools=[note, halt, risky, forbidden], before_tool_call=policy)
    waiting: sm.RunResult | None = None
    for step in steps:
        before = asyncio.run(session.get_items())
        calls = model.calls
        holder["controller"] = sm.AbortController()
        if step == "resume" and waiting is not None:
            ids_ = {c.id: True for c in waiting.pending_approvals}
            result = agent.resume_sync(waiting, approvals=ids_, session=session)
        else:
            signal = holder["controller"].signal
            result = agent.run_sync(step, session=session, signal=signal)
            expected = [*_window_of(before, 6), sm.UserMessage(step)]
            assert model.requests[calls].messages == tuple(expected)
        waiting = result if result.pending_approvals else None
        after = asyncio.run(session.get_items())
        assert history_violations(after) == [], (steps, after)
        assert after[: len(before)] == before


@pytest.mark.timeout(120)
@given(st.lists(st.sampled_from(STEPS), max_size=8))
@settings(max_examples=40)
def test_any_sequence_of_runs_leaves_a_valid_history_grown_at_its_end(steps: list[str]) -> None:
    _check_runs(steps)


@pytest.mark.timeout(120)
def test_the_sequence_property_catches_a_session_that_stores_waiting_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The property can fail: storing a waiting run's messages whole (its unanswered
    calls included) is caught."""
    import statemachine.agent.session as session_module

    monkeypatch.setattr(
        session_module, "stored_part", lambda result, start: result.messages[start:]
    )

    @given(st.lists(st.sampled_from(STEPS), max_size=8))
    @settings(max_examples=200, database=None)
    def broken(steps: list[str]) -> None:
        _check_runs(steps)

    with pytest.raises(AssertionError):
        broken()


def test_asking_a_streamed_run_for_its_result_twice_frees_the_session_once() -> None:
    """The result asked inside the block stores and frees the session; a run started
    then holds it, and the block's own last ask must not free it under that run."""
    session = InMemorySession("s")

    async def main() -> None:
        started, release = asyncio.Event(), asyncio.Event()

        @sm.tool
        async def wait() -> str:
            """Wait for the test."""
            started.set()
            await release.wait()
            return "done"

        agent = sm.Agent(ScriptedModel("one"))
        slow = sm.Agent(ScriptedModel(sm.ToolCall("c1", "wait", {}), "two"), tools=[wait])
        async with agent.run_stream("first", session=session) as run:
            await run.result()
            second = asyncio.ensure_future(slow.run("second", session=session))
            await started.wait()
        with pytest.raises(SessionBusyError):  # still held by the second run
            await agent.run("third", session=session)
        release.set()
        assert (await second).ok

    asyncio.run(main())
    assert _texts(asyncio.run(session.get_items())) == ["first", "one", "second", "", "done", "two"]


def test_popping_a_corrupted_row_refuses_and_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "db"
    row_id = _write_row(path, "{not json")
    with SQLiteSession("s", path) as session:
        with pytest.raises(SessionDataError, match=f"row {row_id} is not JSON"):
            asyncio.run(session.pop_item())
        with pytest.raises(SessionDataError):
            asyncio.run(session.get_items())  # still there, still refused
        with pytest.raises(InvalidInputError, match="limit must be an integer"):
            asyncio.run(session.get_items("3"))  # type: ignore[arg-type]


# -- run_agent takes a session too ----------------------------------------------------------


def test_run_agent_and_run_agent_sync_read_and_store_a_session() -> None:
    session = InMemorySession("s1")
    model = FunctionModel(lambda messages, tools: f"{len(messages)} messages so far.")
    first = sm.run_agent_sync(model=model, messages="hello", session=session)
    second = asyncio.run(sm.run_agent(model=model, messages="again", session=session))
    assert (first.final_text, second.final_text) == ("1 messages so far.", "3 messages so far.")
    stored = asyncio.run(session.get_items())
    assert [m.text for m in stored] == [
        "hello",
        "1 messages so far.",
        "again",
        "3 messages so far.",
    ]
    # what the run added: the prompt and everything after it, as with Agent.run
    assert [m.text for m in second.new_messages()] == ["again", "3 messages so far."]


def test_run_agent_with_a_session_is_refused_what_agent_run_refuses() -> None:
    with pytest.raises(InvalidInputError, match="session must be a Session"):
        sm.run_agent_sync(model=ScriptedModel("x"), messages="hi", session="s1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="AgentRun takes no session"):
        sm.AgentRun(model=ScriptedModel("x"), messages="hi", session=InMemorySession("s2"))
    session = InMemorySession("s3")

    async def overlapping() -> None:
        waiting, release = asyncio.Event(), asyncio.Event()

        async def slow(messages: object, tools: object) -> str:
            waiting.set()
            await release.wait()
            return "slow"

        first = asyncio.ensure_future(
            sm.run_agent(model=FunctionModel(slow), messages="one", session=session)
        )
        await waiting.wait()
        with pytest.raises(SessionBusyError):
            await sm.run_agent(model=ScriptedModel("x"), messages="two", session=session)
        release.set()
        assert (await first).final_text == "slow"

    asyncio.run(overlapping())
