"""The sans-IO engine: input events in, actions out.

The engine owns the history, the turn counter, the input queues and the bookkeeping
of the current batch of tool calls. It performs no I/O, reads no clock and draws no
random number: the same events give the same states, history and transition log
(I5). Which state follows which is decided by the table (``core/table.py``), applied
directly: for (state, trigger), the first row whose guard holds. This module supplies
the guard predicates the table names and the handling of one event; the rest of the
engine lives beside it, one job per module:

* ``core/dispatch.py``: the table's rows compiled to Python (the steps ``handle`` runs);
* ``core/state.py``: the fields an engine holds, ``Engine.fork`` and ``control_key``;
* ``core/batch.py``: the bookkeeping of the current batch of tool calls;
* ``core/entry.py``: what entering each state does (the entry effects);
* ``core/engine_snapshot.py``: ``snapshot``/``restore`` and the restored self-check;
* ``core/trace.py``: ``TransitionRecord``, one entry of the transition log.

The engine does not use the ``transitions`` package at run time. That package builds
the independent reference machine of ``statemachine/testing/_reference.py``, which a
test suite may attach through ``Engine.transition_hook`` to run every transition
through it as well.

How an input event is handled:

1. In an absorbing (terminal) state, the event is logged and dropped (I4).
2. If the table has no row for (state, trigger), or the payload does not fit the
   bookkeeping (a result for a call that is not running...), ``ProtocolError`` is
   raised *before anything changes* (I8).
3. The event's data is recorded (a message appended, a result stored), the trigger
   is fired (the first row whose guard holds is taken), and the destination's entry
   effects run (e.g. entering ``AwaitingModel`` asks for a model call).
4. Internal triggers are fired while their guards hold (``dispatched``,
   ``results_complete``, ``next_turn``, ``settled``).

Every transition is logged as one structlog event ``transition`` and recorded in
``Engine.trace``.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Final

from statemachine._log import library_logger
from statemachine.core import dispatch as _compiled
from statemachine.core import engine_snapshot as _serial
from statemachine.core import snapshot as _snapshots
from statemachine.core.batch import (
    DONE,
    READY,
    RUNNING,
    WAITING_APPROVAL,
    WAITING_PERMISSION,
)
from statemachine.core.dispatch import TableData
from statemachine.core.engine_snapshot import SNAPSHOT_VERSION
from statemachine.core.errors import (
    EngineInvariantError,
    InvalidInputError,
    ProtocolError,
    SnapshotError,
    WireFormatError,
)
from statemachine.core.events import (
    AbortRequested,
    Action,
    ApprovalDecided,
    ApprovalRequired,
    ContinueDecided,
    Event,
    HistoryView,
    InputKind,
    InputQueued,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.guards import GUARD_METHOD, Guards
from statemachine.core.inputs import check_history, check_tool_definitions
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    checked_result,
)
from statemachine.core.snapshot import DEFAULT_MAX_SNAPSHOT_BYTES, DEFAULT_MAX_SNAPSHOT_DEPTH
from statemachine.core.table import (
    ABSORBING,
    INITIAL,
    INTERNAL_TRIGGERS,
    RETURNS_TO_CALLER,
    TRANSITIONS,
    Trigger,
    TurnState,
    rows_from,
)
from statemachine.core.tools import Scheduling, ToolDefinition
from statemachine.core.trace import Trace, TransitionRecord

__all__ = [
    "ABANDONED",
    "DEFAULT_MAX_SNAPSHOT_BYTES",
    "DEFAULT_MAX_SNAPSHOT_DEPTH",
    "MAX_INTERNAL_TRANSITIONS",
    "SNAPSHOT_VERSION",
    "Engine",
    "TransitionHook",
    "TransitionRecord",
    "check_history",
    "check_tool_definitions",
]

S = TurnState

MAX_INTERNAL_TRANSITIONS: Final = 32
"""How many internal transitions one input event may cause. The table needs at most
three (DispatchingTools -> CollectingResults -> TurnBoundary -> AwaitingModel); a
guard that still holds after this many means a broken table or guard, and the engine
raises ``EngineInvariantError`` instead of looping forever."""

ABANDONED: Final = "abandoned"
"""How a ``ModelCancelled``/``ToolCancelled`` reason starts when the driver stopped
waiting for an operation that ignored cancellation and may still be running: the
explanation then says so instead of claiming that its cleanup finished."""

TransitionHook = Callable[["Engine", TurnState, Trigger, "TurnState | None"], None]
"""Called by ``Engine`` for every trigger it fires: (engine, source, trigger, dest).
``dest`` is the destination of the row the dispatch chose, or ``None`` when no row
applies (the engine then raises ``ProtocolError``). It is called before the state
changes, so the engine's guards still give the values the dispatch decided on."""


# The table, pre-digested for dispatch (derived here once, never written by hand):
# for each (state, trigger) its rows in table order as (guard method or None, dest);
# for each state the internal triggers that have a row from it, with the method of
# the guard that fires them. ``core/dispatch.py`` compiles the two into the steps
# ``handle`` runs, again whenever either is replaced or written (``TableData``).
_Rows = tuple[tuple[str | None, TurnState], ...]
_ROWS: Final[dict[tuple[TurnState, Trigger], _Rows]] = TableData(
    {
        (state, trigger): tuple(
            (None if row.guard is None else GUARD_METHOD[row.guard], row.dest)
            for row in rows_from(state, trigger)
        )
        for state in TurnState
        for trigger in Trigger
        if rows_from(state, trigger)
    }
)
_INTERNAL_FROM: Final[dict[TurnState, tuple[tuple[Trigger, str], ...]]] = TableData(
    {
        state: tuple(
            (trigger, GUARD_METHOD[guard])
            for trigger, guard in INTERNAL_TRIGGERS.items()
            if rows_from(state, trigger)
        )
        for state in TurnState
    }
)
# The trigger of each input event class (the classes name it as a ClassVar).
_INPUT_TRIGGER: Final[dict[type, Trigger]] = {
    cls: cls.trigger for cls in typing.get_args(Event) if cls.trigger not in INTERNAL_TRIGGERS
}


def _dispatch() -> _compiled.Compiled:
    """The compiled dispatch of the current tables (compiled again if they changed)."""
    plan = _compiled.latest
    if plan is None or plan.rows is not _ROWS or plan.internal is not _INTERNAL_FROM:
        plan = _compiled.compile_table(_ROWS, _INTERNAL_FROM, MAX_INTERNAL_TRANSITIONS)
    return plan


_dispatch()  # compiled when the module is imported, not by the first event


def _debug_enabled(log: Any) -> bool:
    """False only when the logger has said, once and for all, that it drops debug.

    structlog's filtering bound loggers fix their level when they are made, and the
    default stdlib-backed logger (``_log.library_logger``) is asked once, when the
    engine is made, so the transition log's arguments need not even be built for
    them (measured: a third of a quiet engine step). Any other logger, structlog's
    lazy proxy included (it follows configuration made later), gets every call.
    """
    ask = getattr(type(log), "is_enabled_for", None) or getattr(type(log), "isEnabledFor", None)
    if ask is None:
        return True
    try:
        return bool(ask(log, logging.DEBUG))
    except Exception:  # noqa: BLE001 - a logger we cannot ask is given everything
        return True


class Engine(Guards):
    """The agent loop as a sans-IO state machine.

    ``handle(event)`` returns the actions to perform next; ``state``, ``messages``,
    ``turns``, ``trace`` and ``explanation`` describe where the run stands.
    ``fork()`` gives an independent copy and ``control_key()`` a value that tells
    whether two engines will behave alike (see ``core/state.py``): they are the one
    public way to copy and compare an engine's state.

    ``scheduling`` maps tool names to how their calls may run concurrently (a tool
    absent from it runs concurrently with everything). ``check_permissions`` makes
    every valid call wait for ``ToolPermitted``/``ToolDenied``/``ApprovalRequired``;
    ``check_continue`` makes every turn boundary wait for ``ContinueDecided``.

    Dispatch applies the table directly (the first row whose guard holds), which is
    all ``transitions.Machine.trigger`` would do for us at a fraction of the cost (see
    bench/): the rows are compiled to Python once (``core/dispatch.py``) and the
    guards and entry effects called by name. ``transition_hook``, when set on the
    class, sees every trigger fired (``TransitionHook``): the test suite sets it to run
    each transition through the reference ``transitions`` machine too, and the
    exhaustive checker to hold each one to the rules.
    """

    transition_hook: ClassVar[TransitionHook | None] = None

    def __init__(
        self,
        *,
        tools: Sequence[ToolDefinition],
        messages: Sequence[Message],
        max_turns: int = 8,
        check_permissions: bool = False,
        check_continue: bool = False,
        scheduling: Mapping[str, Scheduling] | None = None,
        run_id: str = "run",
        logger: Any = None,
    ) -> None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise InvalidInputError(f"max_turns must be a positive integer, got {max_turns!r}")
        self._setup(
            tools=check_tool_definitions(tools),
            history=check_history(messages),
            max_turns=max_turns,
            check_permissions=check_permissions,
            check_continue=check_continue,
            scheduling=scheduling,
            run_id=run_id,
            logger=logger,
            initial=INITIAL,
        )

    def _setup(
        self,
        *,
        tools: tuple[ToolDefinition, ...],
        history: list[Message],
        max_turns: int,
        check_permissions: bool,
        check_continue: bool,
        scheduling: Mapping[str, Scheduling] | None,
        run_id: str,
        logger: Any,
        initial: TurnState,
    ) -> None:
        """Set every field (each is declared, with its role, in ``core/state.py``)."""
        self._tools = tools
        self._tools_by_name = {d.name: d for d in tools}
        self._scheduling = dict(scheduling or {})
        self._history = history
        self._seen_ids = {
            c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls
        }
        self.max_turns = max_turns
        self.check_permissions = check_permissions
        self.check_continue = check_continue
        self.run_id = run_id
        self._log = (logger if logger is not None else library_logger()).bind(run_id=run_id)
        self._debug = _debug_enabled(self._log)
        self.turns = 0
        self.trace = Trace()
        self.explanation = None
        self.abort_reason = None
        self._abort_context = ""
        self._abandoned = []
        self._model_outstanding = False
        self._batch = []
        self._slots = {}
        self._flushed = 0
        self._denial = None
        self._steer = []
        self._follow_up = []
        self._continue_pending = False
        self._stop_reason = None
        self._event = None
        self._actions = []
        self._state = initial

    # -- what the caller reads -----------------------------------------------------

    @property
    def state(self) -> TurnState:
        return self._state

    @property
    def messages(self) -> HistoryView:
        """The history so far, as an O(1) read-only snapshot."""
        return HistoryView(self._history)

    @property
    def tools(self) -> tuple[ToolDefinition, ...]:
        return self._tools

    @property
    def is_finished(self) -> bool:
        """True in a state where a driver returns (terminal, or ``AwaitingUser``)."""
        return self._state in RETURNS_TO_CALLER

    def queued_input(self) -> tuple[InputQueued, ...]:
        """Queued input not yet injected: steering first, then follow-ups, each in order.

        Nothing queued is lost when a run ends: this is what a caller re-queues."""
        return tuple(InputQueued(m, InputKind.STEER) for m in self._steer) + tuple(
            InputQueued(m, InputKind.FOLLOW_UP) for m in self._follow_up
        )

    # -- handling an event -----------------------------------------------------------

    def handle(self, event: Event) -> tuple[Action, ...]:
        """Apply one input event; return the actions it calls for.

        Raises ``ProtocolError`` (changing nothing) if the event is not accepted now.
        """
        trigger = _INPUT_TRIGGER.get(type(event))
        if trigger is None:
            # Not one of the event classes (a subclass, or not an event at all).
            trigger = getattr(event, "trigger", None)
            if not isinstance(trigger, Trigger) or trigger in INTERNAL_TRIGGERS:
                raise ProtocolError(f"not an input event: {event!r}")
        state = self._state
        if state in ABSORBING:
            self._log.debug(
                "event_absorbed", turn=self.turns, state=state.value, trigger=trigger.value
            )
            return ()
        plan = _compiled.latest
        if plan is None or plan.rows is not _ROWS or plan.internal is not _INTERNAL_FROM:
            plan = _dispatch()
        step = plan.steps.get((state, trigger))
        if step is None:
            accepted = sorted(
                {r.trigger.value for r in TRANSITIONS if r.source is state}
                - {t.value for t in INTERNAL_TRIGGERS}
            )
            raise ProtocolError(
                f"{trigger.value!r} is not accepted in state {state.value}; "
                f"accepted here: {', '.join(accepted) or 'nothing'}"
            )
        self._check_payload(state, event)
        self._actions = []
        self._event = event
        try:
            self._record(state, event)
            step(self)  # the first row whose guard holds (core/dispatch.py)
            self._run_internal()
        finally:
            self._event = None
        actions = tuple(self._actions)
        self._actions = []
        return actions

    def _check_payload(self, state: TurnState, event: Event) -> None:
        """Refuse events whose data does not fit the bookkeeping; mutate nothing."""
        # Tool results first: the most frequent input there is.
        if isinstance(event, (ToolFinished, ToolCancelled)):
            slot = self._slots.get(event.call_id)
            if slot is None or slot.status != RUNNING:
                self._expect_slot(event.call_id, RUNNING, event.trigger)
        elif isinstance(event, (ModelResponded, ModelFailed, ModelCancelled)):
            if not self._model_outstanding:
                raise ProtocolError(f"{event.trigger.value}: no model call is outstanding")
            if isinstance(event, ModelCancelled) and state is not S.Aborting:
                raise ProtocolError("model_cancelled is accepted only while aborting")
        elif isinstance(event, (ToolPermitted, ToolDenied, ApprovalRequired)):
            self._expect_slot(event.call_id, WAITING_PERMISSION, event.trigger)
        elif isinstance(event, ApprovalDecided):
            self._expect_slot(event.call_id, WAITING_APPROVAL, event.trigger)
        elif isinstance(event, ContinueDecided) and not self._continue_pending:
            raise ProtocolError("continue_decided: no should_continue check is pending")

    def _expect_slot(self, call_id: str, status: str, trigger: Trigger) -> None:
        slot = self._slots.get(call_id)
        if slot is None or slot.status != status:
            actual = "not in the current batch" if slot is None else slot.status
            raise ProtocolError(
                f"{trigger.value}: call {call_id!r} is not {status} (it is {actual})"
            )

    def _record(self, state: TurnState, event: Event) -> None:
        """Record the event's data; destination-specific effects come on entry.

        Results enter the history (``_flush``) after the events that give one; every
        other event leaves no result waiting (each effect that answers a call flushes)."""
        if isinstance(event, ToolFinished):  # the most frequent event first
            slot = self._slots[event.call_id]
            call, output = slot.call, event.output
            slot.result = checked_result(call.id, call.name, output.content, output.is_error)
            slot.status = DONE
            if state is S.CollectingResults and len(self._batch) > 1:
                self._start_runnable()  # (a lone call held nothing back)
            self._flush()
        elif isinstance(event, ModelResponded):
            self._model_outstanding = False
            message = event.message
            calls = message.tool_calls
            normalised = self._normalise_ids(message, calls)
            if normalised is not message:
                message, calls = normalised, normalised.tool_calls
            self._history.append(message)
            self._new_batch(calls)
            if state is S.Aborting:
                self._answer_unresolved("Tool call not started: the run was aborted")
        elif isinstance(event, (ModelFailed, ModelCancelled)):
            self._record_model_error(state, event)
        elif isinstance(event, InputQueued):
            self._record_input(state, event)
        elif isinstance(event, (ToolPermitted, ToolDenied, ApprovalRequired, ApprovalDecided)):
            self._record_decision(event)
            self._flush()
        elif isinstance(event, ToolCancelled):
            slot = self._slots[event.call_id]
            if event.reason.startswith(ABANDONED):
                self._abandoned.append(f"tool {slot.call.name} (call {slot.call.id})")
            self._resolve(slot, f"Operation aborted: {event.reason}", is_error=True)
            self._flush()
        elif isinstance(event, ContinueDecided):
            self._continue_pending = False
            if event.stop:
                self._stop_reason = event.reason or "should_continue asked to stop"
        elif isinstance(event, AbortRequested) and self.abort_reason is None:
            self.abort_reason = event.reason

    def _record_model_error(self, state: TurnState, event: ModelFailed | ModelCancelled) -> None:
        self._model_outstanding = False
        detail = event.error if isinstance(event, ModelFailed) else event.reason
        if isinstance(event, ModelCancelled) and detail.startswith(ABANDONED):
            self._abandoned.append("the model call")
        if state is S.Aborting:
            stop, text = StopReason.ABORTED, f"The model call was aborted: {detail}"
        else:
            stop, text = StopReason.ERROR, f"The model call failed: {detail}"
        self._history.append(AssistantMessage((), stop_reason=stop, error_message=text))

    def _record_input(self, state: TurnState, event: InputQueued) -> None:
        if state is S.AwaitingUser:
            # A person answered with a message instead of deciding: the calls that
            # waited for approval are answered, and the message goes to the model.
            self._answer_unresolved(
                "Tool call not run: it was not approved (the user sent a message instead)"
            )
            self._steer.append(event.message)
        elif event.kind is InputKind.FOLLOW_UP:
            self._follow_up.append(event.message)
        else:
            self._steer.append(event.message)

    def _record_decision(
        self, event: ToolPermitted | ToolDenied | ApprovalRequired | ApprovalDecided
    ) -> None:
        """A permission hook's or a person's answer about one call."""
        slot = self._slots[event.call_id]
        if isinstance(event, ToolPermitted):
            slot.status = READY
        elif isinstance(event, ToolDenied):
            self._resolve(slot, f"Tool call denied: {event.reason}", is_error=True)
            if not event.advisory and self._denial is None:
                self._denial = (slot.call, event.reason)
        elif isinstance(event, ApprovalRequired):
            slot.status = WAITING_APPROVAL
            slot.note = event.reason
        elif event.approved:
            slot.status = READY
        else:
            reason = f": {event.reason}" if event.reason else ""
            self._resolve(slot, f"Tool call denied by a person{reason}", is_error=True)

    def _run_internal(self) -> None:
        # Fire internal triggers to a fixed point (each state's compiled settle fires
        # the first internal trigger whose guard holds, then settles the state it
        # reached). Each firing leaves its source state and the internal triggers form
        # no cycle without an input in between (Dispatching -> Collecting ->
        # TurnBoundary -> AwaitingModel waits for the model), so this terminates; the
        # cap (MAX_INTERNAL_TRANSITIONS) turns a broken table or guard into an error
        # that shows the loop instead of a hang.
        plan = _compiled.latest
        if plan is None or plan.rows is not _ROWS or plan.internal is not _INTERNAL_FROM:
            plan = _dispatch()
        plan.settle[self._state](self, 0)

    def _runaway(self, trigger: Trigger, fired: int) -> typing.NoReturn:
        recent = self.trace[-(fired + 1) :]  # the input's own transition, then the rest
        shown = ", ".join(f"{r.source}-{r.trigger}->{r.dest}" for r in recent[-6:])
        raise EngineInvariantError(
            f"internal transitions do not settle: {fired} fired after one input event and "
            f"{trigger} would fire again in {self._state} (a broken table or guard; "
            f"this engine cannot go on). Last transitions: {shown}",
            recent,
        )

    # -- snapshot and restore (suspension across processes; see core/engine_snapshot.py) --

    def snapshot(self, *, key: bytes | str | None = None) -> dict[str, Any]:
        """The whole engine state as JSON-ready data (for ``Engine.restore``).

        Refused while an operation is outstanding (a model call or a running tool):
        what it will report cannot be written down. ``AwaitingUser`` and the terminal
        states are always safe.

        With ``key``, the snapshot carries a ``signature`` field: HMAC-SHA256 over its
        canonical JSON (see ``Engine.sign_snapshot``). Sign a snapshot that will be
        stored or sent where someone else could change it, and give the same key to
        ``restore``/``resume_agent``, which then refuse it if it was changed.
        """
        data = _serial.write(self)
        return data if key is None else _snapshots.sign(data, key)

    @staticmethod
    def sign_snapshot(snapshot: Mapping[str, Any], key: bytes | str) -> dict[str, Any]:
        """A copy of ``snapshot`` with a ``signature`` field: ``"hmac-sha256:<hex>"``
        over its canonical JSON (sorted keys, no spaces, ASCII only, without the
        ``signature`` field). For a snapshot made without a key, such as
        ``RunResult.snapshot``, before it leaves the process."""
        return _snapshots.sign(snapshot, key)

    @classmethod
    def restore(
        cls,
        snapshot: Mapping[str, Any],
        *,
        scheduling: Mapping[str, Scheduling] | None = None,
        logger: Any = None,
        key: bytes | str | None = None,
        max_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
        max_depth: int = DEFAULT_MAX_SNAPSHOT_DEPTH,
    ) -> Engine:
        """Rebuild an engine from ``snapshot()``, refusing anything it could not have written.

        Raises ``SnapshotError`` (an ``InvalidInputError``) whose message starts with
        the bad field's path, before anything is built, when the snapshot:

        * is not JSON data within ``max_bytes`` (default 32 MiB of JSON text) and
          ``max_depth`` (default 64 levels), or has a field of the wrong type, a
          missing or an unknown key;
        * contradicts itself: its batch is not exactly the calls of the last assistant
          message (ids, names, arguments, in order), the results after that message
          are not the batch's first ``flushed`` results, a call's status does not fit
          the state (only a call to a known tool, with readable arguments, can wait or
          be ready), the counters do not agree with the transition log (``turns`` is
          the number of model calls it shows, each record is a row of the table and
          they chain up to ``state``), or queued input holds something other than
          user messages.

        With ``key``, the signature must be the one ``snapshot(key=...)`` writes, or
        ``SnapshotSignatureError`` is raised. Without a key a snapshot is trusted as
        far as it agrees with itself: whoever can edit it can also edit the history
        consistently, so store it where only you can write, or sign it.
        """
        for name, limit in (("max_bytes", max_bytes), ("max_depth", max_depth)):
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {limit!r}")
        _snapshots.check_shape(snapshot, max_bytes=max_bytes, max_depth=max_depth)
        if key is not None:
            _snapshots.verify(snapshot, key)
        engine = cls.__new__(cls)
        try:
            _serial.load(engine, snapshot, scheduling, logger)
        except SnapshotError:
            raise
        except (InvalidInputError, WireFormatError) as exc:  # a parser names the path
            raise SnapshotError(str(exc)) from None
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
            # Not expected: every field is read by a typed reader. Kept so that a gap
            # still gives the documented error, never a crash.
            raise SnapshotError(f"snapshot: malformed ({type(exc).__name__})") from None
        _serial.check_restored(engine)
        return engine

    # -- reading a snapshot's fields --------------------------------------------------------
