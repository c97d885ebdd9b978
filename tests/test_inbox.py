"""RunInbox: the run's own inbox, a FIFO queue with one reader (the action loop)."""

from __future__ import annotations

import asyncio

import pytest

from statemachine.agent.loop import RunInbox
from statemachine.core.events import InputKind, InputQueued, ModelCancelled, Start
from statemachine.core.messages import UserMessage
from statemachine.errors import UsageError

pytestmark = pytest.mark.timeout(10)


def _input(text: str) -> InputQueued:
    return InputQueued(UserMessage(text), InputKind.STEER)


def test_events_come_out_in_the_order_they_were_put() -> None:
    async def scenario() -> None:
        inbox = RunInbox()
        assert inbox.empty()
        first, second, third = _input("a"), _input("b"), _input("c")
        inbox.put_nowait(first)
        inbox.put_nowait(second)
        assert not inbox.empty()
        assert await inbox.get() is first
        assert inbox.get_nowait() is second
        assert inbox.empty()
        waiting = inbox.get()
        inbox.put_nowait(third)
        inbox.put_nowait(first)  # put before the reader woke: queued behind the third
        assert await waiting is third
        assert inbox.get_nowait() is first
        assert inbox.empty()

    asyncio.run(scenario())


def test_a_waiting_reader_is_woken_by_the_next_put() -> None:
    async def scenario() -> None:
        inbox = RunInbox()
        reader = asyncio.create_task(_read(inbox))
        await asyncio.sleep(0)
        assert not reader.done()
        event = ModelCancelled("stopped")
        inbox.put_nowait(event)
        assert await reader is event

    asyncio.run(scenario())


async def _read(inbox: RunInbox) -> object:
    return await inbox.get()


def test_an_event_put_after_the_reader_was_cancelled_is_kept() -> None:
    async def scenario() -> None:
        inbox = RunInbox()
        reader = asyncio.create_task(_read(inbox))
        await asyncio.sleep(0)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        event = Start()
        inbox.put_nowait(event)
        assert not inbox.empty()
        assert await inbox.get() is event

    asyncio.run(scenario())


def test_get_nowait_on_an_empty_inbox_raises_queue_empty() -> None:
    async def scenario() -> None:
        with pytest.raises(asyncio.QueueEmpty):
            RunInbox().get_nowait()

    asyncio.run(scenario())


def test_a_second_reader_is_refused() -> None:
    async def scenario() -> None:
        inbox = RunInbox()
        waiting = asyncio.create_task(_read(inbox))
        await asyncio.sleep(0)  # the first reader waits
        with pytest.raises(UsageError, match="one reader"):
            await inbox.get()
        inbox.put_nowait(Start())
        assert isinstance(await waiting, Start)

    asyncio.run(scenario())


def test_an_event_handed_to_a_reader_cancelled_before_it_ran_is_kept() -> None:
    # The event arrives, then the reader is cancelled before it resumes (a caller
    # cancelling the run at that moment): the event must still be read next.
    async def scenario() -> None:
        inbox = RunInbox()
        reader = asyncio.create_task(_read(inbox))
        await asyncio.sleep(0)  # the reader waits
        event = Start()
        inbox.put_nowait(event)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert not inbox.empty()
        assert await asyncio.wait_for(_read(inbox), 1) is event

    asyncio.run(scenario())
