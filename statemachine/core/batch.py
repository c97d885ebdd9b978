"""The bookkeeping of the current batch of tool calls (rules 4 and 5 of the table).

A model response with tool calls opens a batch: one ``CallSlot`` per call, in call
order. A slot moves from waiting (for permission, for a person's approval) to ready,
running and done; results enter the history only as a contiguous prefix of the batch
(``flushed``), so they are always in call order (I2) whatever order tools finish in.
``BatchBookkeeping`` is the part of the engine that keeps these slots; it reads and
writes the engine's own fields (declared once in ``core/state.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from statemachine.core.events import StartTool
from statemachine.core.messages import (
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    checked_result,
)
from statemachine.core.state import EngineFields
from statemachine.core.tools import Scheduling

__all__ = ["STATUSES", "BatchBookkeeping", "CallSlot"]

# Status of one tool call of the current batch.
WAITING_PERMISSION: Final = "waiting-permission"
WAITING_APPROVAL: Final = "waiting-approval"
READY: Final = "ready"  # permitted; starts when every earlier unfinished call allows it
RUNNING: Final = "running"
DONE: Final = "done"
STATUSES: Final = (WAITING_PERMISSION, WAITING_APPROVAL, READY, RUNNING, DONE)

_NO_SCHEDULING: Final = Scheduling()


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
        out = CallSlot.__new__(CallSlot)
        out.call, out.status, out.result = self.call, self.status, self.result
        out.sequential, out.resources, out.note = self.sequential, self.resources, self.note
        return out


def _compatible(slot: CallSlot, unfinished: list[CallSlot]) -> bool:
    """Whether ``slot`` may run beside every earlier unfinished call (rule 4)."""
    for other in unfinished:
        if slot.sequential or other.sequential or slot.resources & other.resources:
            return False
    return True


class BatchBookkeeping(EngineFields):
    """The engine's methods on the current batch (mixed into ``Engine``)."""

    def pending_calls(self) -> tuple[ToolCall, ...]:
        """Calls of the current batch that have no result yet, in call order."""
        return tuple(s.call for s in self._batch if s.status != DONE)

    def pending_approvals(self) -> tuple[tuple[ToolCall, str], ...]:
        """Calls waiting for a person's approval, with the hook's reason."""
        return tuple((s.call, s.note) for s in self._batch if s.status == WAITING_APPROVAL)

    def _new_batch(self, calls: Sequence[ToolCall]) -> None:
        batch: list[CallSlot] = []
        slots: dict[str, CallSlot] = {}
        for call in calls:
            slot = CallSlot(call)
            batch.append(slot)
            slots[call.id] = slot
        self._batch = batch
        self._slots = slots
        self._flushed = 0

    def _classify(self, slot: CallSlot) -> None:
        """Read the tool's scheduling for this call (rule 4)."""
        scheduling = self._scheduling.get(slot.call.name, _NO_SCHEDULING)
        slot.sequential = scheduling.sequential
        if scheduling.resources is None:
            return
        try:
            keys: Iterable[str] = scheduling.resources(slot.call.arguments)
            slot.resources = frozenset(str(k) for k in keys)
        except Exception as exc:  # noqa: BLE001 - user code; fail safe, not open
            # Not knowing what a call touches, run it alone: slower, never racy.
            slot.sequential = True
            self._log.warning(
                "resources_failed", call_id=slot.call.id, tool=slot.call.name, error=repr(exc)
            )

    def _start_runnable(self) -> None:
        """Start every ready call whose earlier unfinished calls all allow it (rule 4)."""
        unfinished: list[CallSlot] = []
        for slot in self._batch:
            status = slot.status
            if status == DONE:
                continue
            if status == READY and (not unfinished or _compatible(slot, unfinished)):
                slot.status = RUNNING
                self._actions.append(StartTool(slot.call, self.turns))
            unfinished.append(slot)

    def _normalise_ids(
        self, message: AssistantMessage, calls: tuple[ToolCall, ...]
    ) -> AssistantMessage:
        """Give empty or repeated tool-call ids a unique, deterministic replacement
        (``calls`` are the message's tool calls)."""
        if not calls:
            return message
        seen = self._seen_ids
        if len(calls) == 1:
            only = calls[0].id
            if only and only not in seen:
                seen.add(only)
                return message
        ids = [c.id for c in calls]
        if all(ids) and not seen.intersection(ids) and len(set(ids)) == len(ids):
            seen.update(ids)
            return message
        content = []
        index = 0
        for block in message.content:
            if isinstance(block, ToolCall):
                if not block.id or block.id in seen:
                    block = ToolCall(self._fresh_id(block, index), block.name, block.arguments)
                seen.add(block.id)
                index += 1
            content.append(block)
        return attrs.evolve(message, content=tuple(content))

    def _fresh_id(self, call: ToolCall, index: int) -> str:
        """An id for the ``index``-th call of this turn that no call has had yet."""
        new_id = f"call_t{self.turns}_{index}"
        suffix = 1
        while new_id in self._seen_ids:
            new_id = f"call_t{self.turns}_{index}_{suffix}"
            suffix += 1
        self._log.warning(
            "tool_call_id_normalised",
            turn=self.turns,
            original=call.id,
            assigned=new_id,
            reason="empty" if not call.id else "repeated",
        )
        return new_id

    def _unknown_tool_text(self, name: str) -> str:
        if not self._tools:
            return f"Unknown tool: {name}. No tools are available in this run."
        names = ", ".join(d.name for d in self._tools)
        return f"Unknown tool: {name}. Available tools: {names}."

    # Results are built from checked values (the call's id and name, the engine's own
    # text or a ToolOutput's content and flag): see messages.checked_result.

    def _resolve(self, slot: CallSlot, text: str, *, is_error: bool) -> None:
        call = slot.call
        slot.result = checked_result(call.id, call.name, (TextContent(text),), is_error)
        slot.status = DONE

    def _answer_unresolved(self, text: str) -> None:
        """Give every call that never started a result saying why (I1, I6)."""
        for slot in self._batch:
            if slot.status in (WAITING_PERMISSION, WAITING_APPROVAL, READY):
                self._resolve(slot, text, is_error=True)
        self._flush()

    def _flush(self) -> None:
        """Append the contiguous prefix of arrived results, in call order (I2)."""
        batch = self._batch
        i = self._flushed
        end = len(batch)
        if i == end:
            return
        while i < end and batch[i].status == DONE:
            result = batch[i].result
            assert result is not None
            self._history.append(result)
            i += 1
        self._flushed = i
