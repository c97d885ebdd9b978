"""The guard predicates the table names, as engine methods.

The table (``core/table.py``) names a guard per conditional row; the engine answers
it with ``_guard_<name>()``, looked up by name at each use (not cached or stored): a
subclass or a test may replace one, and engine attributes stay plain data that can be
copied. Guards are pure: asking one changes nothing.
"""

from __future__ import annotations

from typing import Final

from statemachine.core.batch import RUNNING, WAITING_APPROVAL, WAITING_PERMISSION
from statemachine.core.entry import EntryEffects
from statemachine.core.events import ModelResponded
from statemachine.core.messages import AssistantMessage, StopReason
from statemachine.core.table import Guard

__all__ = ["GUARD_METHOD", "Guards"]

GUARD_METHOD: Final = {guard: f"_guard_{guard.value}" for guard in Guard}


class Guards(EntryEffects):
    """The engine's guards (mixed into ``Engine``)."""

    def _response(self) -> AssistantMessage:
        event = self._event
        assert isinstance(event, ModelResponded)
        return event.message

    # Written as plain loops and attribute reads, not all()/any() over a generator:
    # several guards are asked per event, and a generator costs more than a batch of
    # one call takes to scan.

    def _guard_reports_error(self) -> bool:
        event = self._event
        assert isinstance(event, ModelResponded)
        return event.message.stop_reason is StopReason.ERROR

    def _guard_reports_abort(self) -> bool:
        event = self._event
        assert isinstance(event, ModelResponded)
        return event.message.stop_reason is StopReason.ABORTED

    def _guard_has_tool_calls(self) -> bool:
        return bool(self._batch)

    def _guard_input_queued(self) -> bool:
        return bool(self._steer or self._follow_up)

    def _guard_all_calls_resolved(self) -> bool:
        for slot in self._batch:  # noqa: SIM110 - no generator (above)
            if slot.status == WAITING_PERMISSION:
                return False
        return True

    def _guard_nothing_running(self) -> bool:
        for slot in self._batch:  # noqa: SIM110 - no generator (above)
            if slot.status == RUNNING:
                return False
        return True

    def _guard_approvals_pending(self) -> bool:
        for slot in self._batch:  # noqa: SIM110 - no generator (above)
            if slot.status == WAITING_APPROVAL:
                return True
        return False

    def _guard_boundary_ready(self) -> bool:
        return not self._continue_pending

    def _guard_denied_by_policy(self) -> bool:
        return self._denial is not None

    def _guard_stop_requested(self) -> bool:
        return self._stop_reason is not None

    def _guard_turn_limit_reached(self) -> bool:
        return self.turns >= self.max_turns

    def _guard_nothing_outstanding(self) -> bool:
        if self._model_outstanding:
            return False
        for slot in self._batch:  # noqa: SIM110 - no generator (above)
            if slot.status == RUNNING:
                return False
        return True

    def guard_holds(self, guard: Guard) -> bool:
        """Whether the table's ``guard`` holds now (guards are pure: asking changes nothing).

        For tools that hold the engine to rules of their own (the exhaustive checker)."""
        result: bool = getattr(self, GUARD_METHOD[guard])()
        return result
