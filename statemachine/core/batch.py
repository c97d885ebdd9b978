"""The current batch of tool calls: who waits, who runs, which results are in history.

A model response with tool calls opens a ``Batch``: one ``CallSlot`` per call, in
call order. A slot moves from waiting (for permission, for a person's approval) to
ready, running and done (rule 3 of the table). ``start_runnable`` applies rule 4
(which ready calls may start now), ``flush`` rule 5: results leave the batch for the
history only as a contiguous prefix, so they are always in call order (I2) whatever
order the tools finish in. The engine holds one ``Batch`` and asks it; the batch
knows nothing of states or events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

from statemachine.core.messages import (
    TextContent,
    ToolCall,
    ToolResultMessage,
    checked_result,
)
from statemachine.core.tools import Scheduling

__all__ = [
    "DONE",
    "READY",
    "RUNNING",
    "STATUSES",
    "WAITING_APPROVAL",
    "WAITING_PERMISSION",
    "Batch",
    "CallSlot",
]

# Status of one tool call of the current batch.
WAITING_PERMISSION: Final = "waiting-permission"
WAITING_APPROVAL: Final = "waiting-approval"
READY: Final = "ready"  # permitted; starts when every earlier unfinished call allows it
RUNNING: Final = "running"
DONE: Final = "done"
STATUSES: Final = (WAITING_PERMISSION, WAITING_APPROVAL, READY, RUNNING, DONE)
UNSTARTED: Final = frozenset({WAITING_PERMISSION, WAITING_APPROVAL, READY})


class CallSlot:
    """The bookkeeping of one tool call of the current batch."""

    __slots__ = ("call", "note", "resources", "result", "sequential", "status")

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self.status: str = READY
        self.result: ToolResultMessage | None = None
        self.sequential = False
        self.resources: frozenset[str] = frozenset()
        self.note = ""  # why it waits for approval

    def copy(self) -> CallSlot:
        """An independent slot with the same values (every field is immutable)."""
        out = CallSlot(self.call)
        out.status, out.result = self.status, self.result
        out.sequential, out.resources, out.note = self.sequential, self.resources, self.note
        return out

    def answer(self, text: str, *, is_error: bool) -> None:
        """Give the call a result written by the engine (it never ran, or was refused)."""
        call = self.call
        self.result = checked_result(call.id, call.name, (TextContent(text),), is_error)
        self.status = DONE

    def classify(self, scheduling: Scheduling, log: Callable[[], Any]) -> None:
        """Read the tool's scheduling for this call (rule 4). ``scheduling.resources``
        is user code: if it raises, the call runs alone (slower, never racy), and
        ``log()`` (the engine's logger) warns."""
        self.sequential = scheduling.sequential
        if scheduling.resources is None:
            return
        try:
            keys: Iterable[str] = scheduling.resources(self.call.arguments)
            self.resources = frozenset(str(k) for k in keys)
        except Exception as exc:  # noqa: BLE001 - user code; fail safe, not open
            self.sequential = True
            log().warning(
                "resources_failed", call_id=self.call.id, tool=self.call.name, error=repr(exc)
            )

    def may_run_beside(self, earlier: Sequence[CallSlot]) -> bool:
        """Whether this call may run beside every call of ``earlier`` (the unfinished
        calls before it): neither is sequential, and they touch no common resource."""
        for other in earlier:
            if self.sequential or other.sequential or self.resources & other.resources:
                return False
        return True


class Batch:
    """The tool calls of the last model response, with the results not yet flushed.

    ``slots`` is in call order; ``flushed`` counts the results already appended to the
    history (always a prefix of the batch). The slots are a tuple, replaced when the
    batch is refilled: an empty batch (a run waiting for its model) then holds no
    container the garbage collector tracks.
    """

    __slots__ = ("by_id", "flushed", "slots")

    def __init__(self, calls: Sequence[ToolCall] = ()) -> None:
        self.slots: tuple[CallSlot, ...] = ()
        self.by_id: dict[str, CallSlot] = {}
        self.flushed = 0
        self.reset(calls)

    def reset(self, calls: Sequence[ToolCall] = ()) -> None:
        """Hold ``calls`` instead (none: empty), none of them flushed. An engine keeps
        one batch for its run and refills it each turn rather than making new ones."""
        self.slots = tuple([CallSlot(call) for call in calls]) if calls else ()
        self.by_id.clear()
        self.flushed = 0
        for slot in self.slots:
            self.by_id[slot.call.id] = slot

    @classmethod
    def of(cls, slots: Sequence[CallSlot], flushed: int) -> Batch:
        """A batch holding these slots, ``flushed`` results already in history."""
        batch = cls()
        batch.slots = tuple(slots)
        batch.by_id = {slot.call.id: slot for slot in slots}
        batch.flushed = flushed
        return batch

    def copy(self) -> Batch:
        """An independent batch: each slot copied (calls and results are immutable)."""
        return Batch.of(tuple(slot.copy() for slot in self.slots), self.flushed)

    def __len__(self) -> int:
        return len(self.slots)

    def __iter__(self) -> Iterator[CallSlot]:
        return iter(self.slots)

    def slot(self, call_id: str) -> CallSlot | None:
        return self.by_id.get(call_id)

    # -- what the engine's guards ask ---------------------------------------------------

    def any_with(self, status: str) -> bool:
        for slot in self.slots:  # noqa: SIM110 - asked several times an event: no generator
            if slot.status == status:
                return True
        return False

    def running_ids(self) -> tuple[str, ...]:
        return tuple(slot.call.id for slot in self.slots if slot.status == RUNNING)

    def pending_calls(self) -> tuple[ToolCall, ...]:
        """Calls that have no result yet, in call order."""
        return tuple(slot.call for slot in self.slots if slot.status != DONE)

    def pending_approvals(self) -> tuple[tuple[ToolCall, str], ...]:
        """Calls waiting for a person's approval, with the hook's reason."""
        return tuple((s.call, s.note) for s in self.slots if s.status == WAITING_APPROVAL)

    # -- what the engine does to it ---------------------------------------------------------

    def start_runnable(self) -> list[ToolCall]:
        """Mark running, and return, every ready call whose earlier unfinished calls
        all allow it (rule 4)."""
        started: list[ToolCall] = []
        unfinished: list[CallSlot] = []
        for slot in self.slots:
            if slot.status == DONE:
                continue
            if slot.status == READY and (not unfinished or slot.may_run_beside(unfinished)):
                slot.status = RUNNING
                started.append(slot.call)
            unfinished.append(slot)
        return started

    def answer_unstarted(self, text: str) -> None:
        """Give every call that never started a result saying why (I1, I6)."""
        for slot in self.slots:
            if slot.status in UNSTARTED:
                slot.answer(text, is_error=True)

    def flush(self) -> list[ToolResultMessage]:
        """The results that may now enter the history: the contiguous prefix of arrived
        results after those flushed before (I2)."""
        out: list[ToolResultMessage] = []
        slots = self.slots
        while self.flushed < len(slots) and slots[self.flushed].status == DONE:
            result = slots[self.flushed].result
            assert result is not None
            out.append(result)
            self.flushed += 1
        return out
