"""An event loop whose clock skips idle waits, for running scenarios fast and alike.

A scenario's hangs, tiny sleeps, the loop's grace periods and the run's timeout are
all timers. On a normal event loop each costs its duration in real time although
nothing happens meanwhile, so a search of hundreds of scenarios spends most of its
time asleep, and real durations make the order in which timers and ticks interleave
depend on the machine's load.

``IdleSkippingLoop`` keeps time as ``time.monotonic()`` plus an offset. Whenever it
would block until its next timer and nothing else can wake it in the meantime, it
adds the wait to the offset instead of waiting: the timer is due at once. Time never
runs slower than real time, so a loop that keeps itself busy without ever waiting
still meets real-time timeouts.

Only a file descriptor (a socket, a subprocess's pipes) or another thread can wake a
waiting event loop. The loop therefore skips only when no file descriptor but its own
wake-up pipe is registered and no ``run_in_executor`` job (``asyncio.to_thread``
included) is running. A loop under test that is woken by threads it starts itself,
or that waits for a subprocess to exit (its exit is reported by a watcher thread),
must run on a plain event loop: ``run_conformance(..., virtual_time=False)``, or mark
the loop object with ``needs_real_time = True`` as ``bridge_loop`` does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, TypeVarTuple, Unpack

__all__ = ["IdleSkippingLoop", "needs_real_time", "runner_for"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")


class _SkippingSelector(selectors.BaseSelector):
    """The loop's selector, wrapped: an idle wait for a timer is skipped, not slept."""

    def __init__(self) -> None:
        self._inner = selectors.DefaultSelector()
        self.offset = 0.0
        self.own_fds: frozenset[int] = frozenset()  # the loop's wake-up pipe
        self.executor_jobs = 0
        self.skipped = 0  # how many waits were skipped (tests read it)

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout <= 0 or not self._idle():
            return self._inner.select(timeout)
        ready = self._inner.select(0)  # the wake-up pipe may hold a late callback
        if not ready:
            self.offset += timeout
            self.skipped += 1
        return ready

    def _idle(self) -> bool:
        """Nothing but a timer can wake the loop: no foreign descriptor, no thread."""
        if self.executor_jobs:
            return False
        return all(key.fd in self.own_fds for key in self._inner.get_map().values())


class IdleSkippingLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` jumps over idle waits (module docstring)."""

    def __init__(self) -> None:
        self._skipping = _SkippingSelector()
        super().__init__(self._skipping)
        self._skipping.own_fds = frozenset(key.fd for key in self._skipping.get_map().values())

    def time(self) -> float:
        return time.monotonic() + self._skipping.offset

    @property
    def skipped_waits(self) -> int:
        """How many idle waits this loop skipped so far."""
        return self._skipping.skipped

    def run_in_executor(
        self,
        executor: concurrent.futures.Executor | None,
        func: Callable[[Unpack[_Ts]], _T],
        *args: *_Ts,
    ) -> asyncio.Future[_T]:
        # A job in a thread can finish at any moment and wake the loop: while one
        # runs, waits are real.
        future = super().run_in_executor(executor, func, *args)
        self._skipping.executor_jobs += 1

        def done(_: asyncio.Future[_T]) -> None:
            self._skipping.executor_jobs -= 1

        future.add_done_callback(done)
        return future


def needs_real_time(loop: object) -> bool:
    """True when a loop under test says it must run on a plain event loop."""
    return bool(getattr(loop, "needs_real_time", False))


def runner_for(loop: object, virtual_time: bool | None) -> asyncio.Runner:
    """The runner for scenarios of ``loop``: on an ``IdleSkippingLoop`` unless
    ``virtual_time`` is False, or is None and the loop says it needs real time."""
    if virtual_time is None:
        virtual_time = not needs_real_time(loop)
    return asyncio.Runner(loop_factory=IdleSkippingLoop if virtual_time else None)
