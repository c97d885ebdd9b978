"""What an engine holds, declared once, and the one public way to copy and compare it.

Every attribute an ``Engine`` sets is declared here, in ``EngineFields``, with its
role. ``Engine.fork()`` copies an engine and ``Engine.control_key()`` says which
engines will behave alike; both are written next to the declarations so that a new
field is added, copied and keyed in one place, and ``tests/test_engine_state.py``
fails when an engine holds an attribute that is not declared here or when a fork
shares a mutable object with its original.

Why a fork and a key rather than a frozen value of the whole state: messages hold
JSON arguments as mapping proxies (not hashable), and the exhaustive checker copies
engines hundreds of thousands of times. A fork copies only the containers (the
messages themselves are immutable and shared), which costs about what one step of
the engine costs (measured with a batch of two calls: 17 us for a fork, 22 us for
handling one tool result, on a loaded 2-core machine); a key renders only what
decides the future (no history, no log), each message of it by its ``repr`` (which
attrs writes from every field) kept in a small cache by identity. Building a frozen
value of everything on every step would copy the history each time and still need a
separate rendering for hashing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Self

from statemachine.core.events import Action, Event
from statemachine.core.messages import Message, ToolCall, UserMessage
from statemachine.core.table import TurnState
from statemachine.core.tools import Scheduling, ToolDefinition
from statemachine.core.trace import Trace

if TYPE_CHECKING:
    from statemachine.core.batch import CallSlot

__all__ = ["CONFIGURATION", "CONTROL", "RECORD", "TRANSIENT", "EngineFields"]


class EngineFields:
    """The fields of an engine (set by ``Engine._setup``), with ``fork`` and ``control_key``.

    Configuration (fixed for the run, shared by forks):
    ``_tools``, ``_tools_by_name``, ``_scheduling``, ``max_turns``,
    ``check_permissions``, ``check_continue``, ``run_id``, ``_log``, ``_debug``.
    Record (what happened; copied by forks, left out of the key because the engine
    never reads it back to decide anything): ``_history``, ``trace``, ``explanation``,
    ``_seen_ids`` (only used to rename repeated call ids).
    Control (decides what happens next; copied and keyed): ``_state``, ``turns`` and
    the rest of ``CONTROL``. Transient (set only while ``handle`` runs): ``_event``,
    ``_actions``.
    """

    # configuration
    _tools: tuple[ToolDefinition, ...]
    _tools_by_name: dict[str, ToolDefinition]
    _scheduling: dict[str, Scheduling]
    max_turns: int
    check_permissions: bool
    check_continue: bool
    run_id: str
    _log: Any
    _debug: bool
    # record
    _history: list[Message]
    trace: Trace
    explanation: str | None
    _seen_ids: set[str]
    # control
    _state: TurnState
    turns: int
    abort_reason: str | None
    _abort_context: str
    _abandoned: list[str]  # operations the driver gave up on, still running
    _model_outstanding: bool
    _batch: list[CallSlot]
    _slots: dict[str, CallSlot]  # the batch by call id (derived from _batch)
    _flushed: int
    _denial: tuple[ToolCall, str] | None
    _steer: list[UserMessage]
    _follow_up: list[UserMessage]
    _continue_pending: bool
    _stop_reason: str | None
    # transient
    _event: Event | None
    _actions: list[Action]

    def fork(self) -> Self:
        """An independent engine in exactly this state: what one does never shows in
        the other.

        Messages, calls and records are immutable and shared; every container is
        copied, and so is each call's bookkeeping. The fork is of the same class; the
        lists, dicts and sets a subclass adds are copied (shallowly) and its other
        attributes shared: a subclass with deeper state of its own overrides ``fork``.
        About as cheap as one engine step, so a search can keep a fork of every state
        it still has to expand.
        """
        new = object.__new__(type(self))
        fields = new.__dict__
        fields.update(self.__dict__)
        batch = [slot.copy() for slot in self._batch]
        fields["_batch"] = batch
        fields["_slots"] = {slot.call.id: slot for slot in batch}
        fields["_history"] = list(self._history)
        fields["trace"] = self.trace.copy()
        fields["_seen_ids"] = set(self._seen_ids)
        fields["_abandoned"] = list(self._abandoned)
        fields["_steer"] = list(self._steer)
        fields["_follow_up"] = list(self._follow_up)
        fields["_actions"] = list(self._actions)
        for name in fields.keys() - _DECLARED:  # a subclass's own attributes
            value = fields[name]
            if type(value) in (list, dict, set):
                fields[name] = value.copy()
        return new

    def control_key(self) -> tuple[Any, ...]:
        """A hashable value equal for two engines of one configuration exactly when
        they will accept the same events and answer them alike.

        It holds the state and every control field (see the class docstring), not the
        history or the transition log: the engine never reads those back to decide.
        Attributes a subclass adds are part of it, by ``repr``. Compare keys only
        between engines made with the same tools and scheduling.
        """
        return (
            self._state,
            self.turns,
            self.max_turns,
            self.check_permissions,
            self.check_continue,
            self.abort_reason,
            self._abort_context,
            tuple(self._abandoned),
            self._model_outstanding,
            tuple(_slot_key(slot) for slot in self._batch),
            self._flushed,
            None if self._denial is None else (self._denial[0].id, self._denial[1]),
            tuple(_rendered(m) for m in self._steer),
            tuple(_rendered(m) for m in self._follow_up),
            self._continue_pending,
            self._stop_reason,
            _extra_key(self.__dict__),
        )


CONFIGURATION: Final = frozenset(
    {
        "_tools",
        "_tools_by_name",
        "_scheduling",
        "max_turns",
        "check_permissions",
        "check_continue",
        "run_id",
        "_log",
        "_debug",
    }
)
RECORD: Final = frozenset({"_history", "trace", "explanation", "_seen_ids"})
TRANSIENT: Final = frozenset({"_event", "_actions"})
CONTROL: Final = frozenset(EngineFields.__annotations__) - CONFIGURATION - RECORD - TRANSIENT

# repr of immutable values by identity; the value is kept with it so that its id cannot
# be reused while the entry exists. Bounded: cleared when full (a cache, not a store).
_REPRS: dict[int, tuple[object, str]] = {}
_REPRS_MAX: Final = 1 << 16


_DECLARED: Final = frozenset(EngineFields.__annotations__)


def _extra_key(fields: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """A subclass's own attributes, by ``repr`` (none for ``Engine`` itself)."""
    extra = fields.keys() - _DECLARED
    return tuple(sorted((name, repr(fields[name])) for name in extra)) if extra else ()


def _slot_key(slot: CallSlot) -> tuple[Any, ...]:
    result = None if slot.result is None else _rendered(slot.result)
    resources = tuple(sorted(slot.resources))
    return (_rendered(slot.call), slot.status, slot.sequential, resources, slot.note, result)


def _rendered(value: object) -> str:
    known = _REPRS.get(id(value))
    if known is None:
        if len(_REPRS) >= _REPRS_MAX:
            _REPRS.clear()
        known = _REPRS[id(value)] = (value, repr(value))
    return known[1]
