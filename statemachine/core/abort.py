"""``AbortController`` and ``AbortSignal``, after the web platform's pair.

A signal is a one-way latch: once aborted it stays aborted with its reason. It does
no I/O and knows nothing of asyncio, so the sans-IO core and any driver can share
it. ``abort()`` may be called from any thread (a UI thread, a signal handler);
listeners run synchronously in the aborting thread, which is why the asyncio driver's
listener only hands the news to its loop with ``call_soon_threadsafe``.

A listener is someone else's code (a tool's, a client's): whatever it raises, every
other listener still hears the news and the signal is left aborted. Only
``KeyboardInterrupt`` and ``SystemExit``, which mean "stop the process", are raised
again, once all listeners have run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from statemachine._log import library_logger
from statemachine.errors import AbortedError

__all__ = ["AbortController", "AbortSignal"]

Listener = Callable[[object], None]


class AbortSignal:
    """Tells tools and model clients that their work is no longer wanted."""

    __slots__ = ("_aborted", "_listeners", "_lock", "_reason")

    def __init__(self) -> None:
        self._aborted = False
        self._reason: object = None
        self._listeners: list[Listener] | None = None  # made at the first: most runs add none
        self._lock = threading.Lock()

    @property
    def aborted(self) -> bool:
        """True once the controller has aborted."""
        return self._aborted

    @property
    def reason(self) -> object:
        """What ``abort(reason)`` was given; a default text when it was given nothing."""
        return self._reason

    def throw_if_aborted(self) -> None:
        """Raise ``AbortedError`` if aborted: a cheap check for loops inside tools."""
        if self._aborted:
            raise AbortedError(f"Operation aborted: {self._reason}")

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(reason)`` on abort (at once if already aborted).

        Returns a function that removes the listener, so a tool can stop listening
        when it finishes and the signal keeps no reference to it.
        """
        with self._lock:
            if not self._aborted:
                if self._listeners is None:
                    self._listeners = []
                self._listeners.append(listener)
                return lambda: self._remove(listener)
        listener(self._reason)
        return lambda: None

    def _remove(self, listener: Listener) -> None:
        with self._lock:
            # Removal is idempotent: the listener may be removed already, or fired.
            if self._listeners is not None and listener in self._listeners:
                self._listeners.remove(listener)

    def _fire(self, reason: object) -> None:
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            self._reason = reason
            listeners, self._listeners = self._listeners, None
        fatal: BaseException | None = None
        for listener in listeners or ():
            # A listener that raises must not keep the others from hearing the news.
            try:
                listener(reason)
            except (KeyboardInterrupt, SystemExit) as exc:
                fatal = fatal or exc
            except BaseException:  # noqa: BLE001 - isolation is the point
                library_logger().exception("abort_listener_failed")
        if fatal is not None:
            raise fatal

    def __repr__(self) -> str:
        return f"AbortSignal(aborted={self._aborted!r}, reason={self._reason!r})"


class AbortController:
    """Owns a signal and aborts it."""

    __slots__ = ("_signal",)

    def __init__(self) -> None:
        self._signal = AbortSignal()

    @property
    def signal(self) -> AbortSignal:
        """The signal to hand to ``run_agent``, tools and model clients."""
        return self._signal

    def abort(self, reason: object = None) -> None:
        """Abort the signal; later calls do nothing (the first reason is kept)."""
        self._signal._fire("aborted by the caller" if reason is None else reason)
