"""Delivering a durable run's results in call order, on any backend.

A batch's tools finish in any order, but a durable run hands their results to the
engine in call order, so that the engine's sequence of events (and so history and
trace) does not depend on timing: a recovery, which answers the tools from their
saved outputs at once, hands the engine the same sequence as the run that ran them.
``CallOrder`` keeps the started calls in call order and the reports of those that
finished early, and posts each report once every earlier call has reported;
``Handover`` is what a durable backend holds of it for one run's part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from statemachine.agent.executor import TOOL, AsyncioExecutor, Operation
from statemachine.core.events import Event

__all__ = ["CallOrder", "Handover"]


class CallOrder:
    """The reports of a run's tool calls, posted in call order (module docstring)."""

    def __init__(self, post: Callable[[Iterable[Event]], None], reported: set[str]) -> None:
        self._post = post  # hands events to the run's loop
        self._reported = reported  # the run's keys already reported (shared, not copied)
        self._order: list[str] = []  # call ids of started tools, in call order
        self._ready: dict[str, list[Event]] = {}  # their reports, until posted

    def started(self, call_id: str) -> None:
        """A tool call began (in call order)."""
        self._order.append(call_id)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is a started call whose report is not posted yet."""
        return key in self._order

    def deliver(self, key: str, events: list[Event]) -> None:
        """Hand the run the events of the operation ``key``: a started tool call's in
        call order, any other operation's at once; a keyed operation's once only."""
        if key in self._order:
            self.report(key, events)
            return
        if key:
            if key in self._reported:
                return
            self._reported.add(key)
        self._post(events)

    def report(self, call_id: str, events: list[Event]) -> None:
        """The call ``call_id`` reported ``events``: post what is next in call order."""
        if call_id not in self._reported:
            self._ready[call_id] = events
        self.flush()

    def flush(self) -> None:
        """Post the reports that are next in call order."""
        while self._order:
            head = self._order[0]
            if head in self._ready:
                self._reported.add(head)
                self._post(self._ready.pop(head))
            elif head not in self._reported:
                return  # still running
            self._order.pop(0)


class Handover:
    """How a durable backend hands the loop of one run's part what its operations
    reported: a started tool call's events in call order (``CallOrder``), any other
    operation's at once. Bound to the loop when the first operation starts."""

    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order: CallOrder | None = None

    def started(self, driver: AsyncioExecutor, op: Operation) -> None:
        """``op`` is starting (a tool call, in call order)."""
        if self._order is None:
            self._order = CallOrder(_poster(driver.loop.inbox.put_nowait), driver.loop.reported)
        if op.kind == TOOL:
            self._order.started(op.key)

    def deliver(self, key: str, events: list[Event]) -> None:
        """Hand the loop the events of the operation ``key``."""
        assert self._order is not None  # only a started operation reports
        self._order.deliver(key, events)

    def flush(self) -> None:
        """The driver posted a report itself: post what is now next in call order."""
        if self._order is not None:
            self._order.flush()


def _poster(put: Callable[[Event], None]) -> Callable[[Iterable[Event]], None]:
    def post(events: Iterable[Event]) -> None:
        for event in events:
            put(event)

    return post
