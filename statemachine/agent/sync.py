"""Running a run from code without an event loop: ``run_agent_sync`` and its kin.

A run is asyncio code; these give it a loop of its own and close that loop without
waiting for what the run abandoned (a tool that ignores cancellation, a sync tool
blocked in its thread), which ``asyncio.run`` would wait for forever.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Coroutine, Iterator
from functools import partial
from typing import Any, Generic, TypeVar

from statemachine.core.abort import AbortController, AbortSignal
from statemachine.errors import UsageError

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "StreamedRunSync",
    "close_loop",
    "refuse_running_loop",
    "run_sync",
]

T = TypeVar("T")

DEFAULT_GRACE_PERIOD = 1.0
"""Seconds an aborted operation is given to finish its cleanup before cancellation."""


def refuse_running_loop(name: str) -> None:
    """``UsageError`` if called from a running event loop (``name`` is the sync form)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise UsageError(
        f"{name}() cannot be called from a running event loop; "
        f"use 'await {name.removesuffix('_sync')}(...)' instead"
    )


def run_sync(run: Coroutine[Any, Any, T], grace_period: object) -> T:
    """Run ``run`` on a new event loop, closed without waiting for what the run
    abandoned (``run_agent_sync``)."""
    runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
    loop = runner.get_loop()
    grace = grace_period if isinstance(grace_period, (int, float)) else DEFAULT_GRACE_PERIOD
    try:
        return runner.run(run)
    finally:
        close_loop(loop, grace)


def _quiet_about(
    abandoned: set[int], loop: asyncio.AbstractEventLoop, context: dict[str, Any]
) -> None:
    """An exception handler that says nothing of the ``abandoned`` tasks' destruction."""
    task = context.get("task")
    if task is not None and id(task) in abandoned and "exception" not in context:
        return
    loop.default_exception_handler(context)


def close_loop(loop: asyncio.AbstractEventLoop, grace: float) -> None:
    """Close ``loop`` without waiting past ``grace`` for tasks that ignore cancellation,
    nor at all for executor threads (``loop.close()`` does not join them)."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=max(float(grace), 0.0)))
        abandoned = {id(task) for task in pending if not task.done()}
        if abandoned:
            # Abandoned, and reported as such by the run: asyncio need not say again,
            # when such a task is collected, that it never finished.
            loop.set_exception_handler(partial(_quiet_about, abandoned))
        loop.run_until_complete(
            asyncio.wait(
                [loop.create_task(loop.shutdown_asyncgens())], timeout=max(float(grace), 0.0)
            )
        )
    finally:
        loop.close()


_END: Any = object()  # the last item of a streamed run's text queue

_Stream = Callable[[AbortSignal, Callable[[str], None]], Coroutine[Any, Any, T]]
"""``stream(signal, put)``: the run, aborted by ``signal``, handing each fragment to
``put``."""


class StreamedRunSync(Generic[T]):
    """A run streamed to code without an event loop (``Agent.run_stream_sync``): the
    run goes on in a thread of its own, on its own loop (``run_sync``), and hands its
    text fragments over a queue.

    ``stream_text()`` yields every fragment as it arrives, however late it is read (the
    text is the answer's: bounded by the model's response limits), until the run
    returns; ``result()`` waits for the run's result (raising what made it fail);
    ``abort(reason)`` aborts it. A run whose reader stops early goes on to its end unless
    aborted: ``with agent.run_stream_sync(...) as run:`` aborts it on leaving the block.
    """

    def __init__(self, stream: _Stream[T], grace_period: float) -> None:
        self._controller = AbortController()
        self._fragments: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._main, args=(stream, grace_period), name="statemachine-stream", daemon=True
        )
        self._thread.start()

    def _main(self, stream: _Stream[T], grace: float) -> None:
        try:
            self._result = run_sync(stream(self._controller.signal, self._fragments.put), grace)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
            self._error = exc
        finally:
            self._fragments.put(_END)

    def stream_text(self) -> Iterator[str]:
        """The answer's text fragments as they arrive, until the run returns (read once:
        a second reading yields nothing)."""
        while (item := self._fragments.get()) is not _END:
            yield item
        self._fragments.put(_END)  # a later reading ends at once too

    def result(self) -> T:
        """How the run returned (waits for it); raises what its thread raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def abort(self, reason: str = "aborted by the caller") -> None:
        """Abort the run (thread-safe)."""
        self._controller.abort(reason)

    def __enter__(self) -> StreamedRunSync[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self.abort("the run_stream_sync block ended before the run")
        self._thread.join()
