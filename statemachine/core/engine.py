"""The sans-IO engine: input events in, actions out.

The engine owns the history, the turn counter, the input queues and the bookkeeping
of the current batch of tool calls. It performs no I/O, reads no clock and draws no
random number: the same events give the same states, history and transition log
(I5). Which state follows which is decided by the ``transitions`` machine built from
``_table.py``; this module supplies the guard predicates the table names and the
effects of entering each state.

How an input event is handled:

1. In an absorbing (terminal) state, the event is logged and dropped (I4).
2. If the table has no row for (state, trigger), or the payload does not fit the
   bookkeeping (a result for a call that is not running...), ``ProtocolError`` is
   raised *before anything changes* (I8).
3. The event's data is recorded (a message appended, a result stored), the trigger
   is fired on the machine (which picks the first row whose guard holds), and the
   destination's entry effects run (e.g. entering ``AwaitingModel`` asks for a model
   call).
4. Internal triggers are fired while their guards hold (``dispatched``,
   ``results_complete``, ``next_turn``, ``settled``).

Every transition is logged as one structlog event ``transition`` and recorded in
``Engine.trace``.
"""

from __future__ import annotations

import functools
import json
import logging
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Final, NamedTuple

import attrs
from transitions import Machine

from statemachine._log import library_logger
from statemachine.core import snapshot as _snapshots
from statemachine.core.errors import (
    EngineInvariantError,
    InvalidInputError,
    ProtocolError,
    SnapshotError,
)
from statemachine.core.events import (
    AbortRequested,
    Action,
    ApprovalDecided,
    ApprovalRequired,
    CallModel,
    CancelOperations,
    CheckContinue,
    CheckPermission,
    ContinueDecided,
    Event,
    HistoryView,
    InputKind,
    InputQueued,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    RunEnded,
    StartTool,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.invariants import history_violations
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    _block_from_dict,
    message_from_dict,
    message_to_dict,
    thaw_json,
)
from statemachine.core.snapshot import DEFAULT_MAX_SNAPSHOT_BYTES, DEFAULT_MAX_SNAPSHOT_DEPTH
from statemachine.core.table import (
    ABSORBING,
    INITIAL,
    INTERNAL_TRIGGERS,
    RETURNS_TO_CALLER,
    TRANSITIONS,
    Guard,
    Trigger,
    TurnState,
    rows_from,
)
from statemachine.core.tools import Scheduling, ToolDefinition, ToolOutput, validate_arguments

__all__ = [
    "ABANDONED",
    "DEFAULT_MAX_SNAPSHOT_BYTES",
    "DEFAULT_MAX_SNAPSHOT_DEPTH",
    "MAX_INTERNAL_TRANSITIONS",
    "SNAPSHOT_VERSION",
    "Engine",
    "TransitionRecord",
    "build_machine",
    "check_history",
    "check_tool_definitions",
    "reference_machine",
]

S = TurnState

# Status of one tool call of the current batch.
_WAITING_PERMISSION: Final = "waiting-permission"
_WAITING_APPROVAL: Final = "waiting-approval"
_READY: Final = "ready"  # permitted; starts when every earlier unfinished call allows it
_RUNNING: Final = "running"
_DONE: Final = "done"
_STATUSES: Final = (_WAITING_PERMISSION, _WAITING_APPROVAL, _READY, _RUNNING, _DONE)

SNAPSHOT_VERSION: Final = 1

MAX_INTERNAL_TRANSITIONS: Final = 32
"""How many internal transitions one input event may cause. The table needs at most
three (DispatchingTools -> CollectingResults -> TurnBoundary -> AwaitingModel); a
guard that still holds after this many means a broken table or guard, and the engine
raises ``EngineInvariantError`` instead of looping forever."""

ABANDONED: Final = "abandoned"
"""How a ``ModelCancelled``/``ToolCancelled`` reason starts when the driver stopped
waiting for an operation that ignored cancellation and may still be running: the
explanation then says so instead of claiming that its cleanup finished."""
_NO_SCHEDULING: Final = Scheduling()


class TransitionRecord(NamedTuple):
    """One step of the transition log (immutable).

    A named tuple rather than an attrs class: the engine makes one per transition,
    several per event, and a tuple is made at under half the cost (bench/, replay).
    """

    source: TurnState
    trigger: Trigger
    dest: TurnState
    turn: int


class _Slot:
    """The bookkeeping of one tool call of the current batch."""

    __slots__ = ("call", "note", "resources", "result", "sequential", "status")

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self.status: str = _READY
        self.result: ToolResultMessage | None = None
        self.sequential = False
        self.resources: frozenset[str] = frozenset()
        self.note = ""  # why it waits for approval


class _MachineModel:
    """What holds the state: the shape of a ``transitions`` model, so the reference
    machine can move a copy of it."""

    state: TurnState


# Guards are looked up by name at each use (not cached or stored): a subclass or a
# test may replace one, and engine attributes stay plain data that can be copied.
_GUARD_METHOD: Final = {guard: f"_guard_{guard.value}" for guard in Guard}

# The table, pre-digested for dispatch (derived here once, never written by hand):
# for each (state, trigger) its rows in table order as (guard method or None, dest);
# for each state the internal triggers that have a row from it, with the method of
# the guard that fires them; and each state's entry method.
_ROWS: Final[dict[tuple[TurnState, Trigger], tuple[tuple[str | None, TurnState], ...]]] = {
    (state, trigger): tuple(
        (None if row.guard is None else _GUARD_METHOD[row.guard], row.dest)
        for row in rows_from(state, trigger)
    )
    for state in TurnState
    for trigger in Trigger
    if rows_from(state, trigger)
}
_INTERNAL_FROM: Final[dict[TurnState, tuple[tuple[Trigger, str], ...]]] = {
    state: tuple(
        (trigger, _GUARD_METHOD[guard])
        for trigger, guard in INTERNAL_TRIGGERS.items()
        if rows_from(state, trigger)
    )
    for state in TurnState
}
_ENTER: Final = {state: f"_enter_{state.value}" for state in TurnState}
# The trigger of each input event class (the classes name it as a ClassVar).
_INPUT_TRIGGER: Final[dict[type, Trigger]] = {
    cls: cls.trigger for cls in typing.get_args(Event) if cls.trigger not in INTERNAL_TRIGGERS
}


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


def _machine_guard(guard: Guard, engine: Engine) -> bool:
    result: bool = getattr(engine, _GUARD_METHOD[guard])()
    return result


@functools.cache
def reference_machine() -> Machine:
    """The plain ``transitions.Machine`` built from the table, with no model of its own.

    Its guards take the engine as their argument, so one machine serves every engine.
    ``Engine.verify_against_machine`` makes each transition also run through it.
    """
    guards = {guard: functools.partial(_machine_guard, guard) for guard in Guard}
    return build_machine(None, guards)


def _verify_with_machine(
    engine: Engine, source: TurnState, trigger: Trigger, dest: TurnState
) -> None:
    mirror = _MachineModel()
    mirror.state = source
    moved = reference_machine().events[trigger.value].trigger(mirror, engine)
    if not moved or mirror.state is not dest:
        raise AssertionError(
            f"the transitions machine took {trigger} from {source} to "
            f"{mirror.state if moved else 'nowhere'}; the engine chose {dest}"
        )


def build_machine(
    model: object, guards: Mapping[Guard, Any], initial: TurnState = INITIAL
) -> Machine:
    """A plain ``transitions.Machine`` for ``model``, derived row by row from the table.

    ``auto_transitions=False`` because the ``to_<state>`` helpers would skip every
    guard; invalid triggers keep raising; dispatch goes through ``trigger(name)``
    because a trigger whose name collides with a model attribute is silently not
    bound as a method.
    """
    machine = Machine(
        model=model,
        states=list(TurnState),
        initial=initial,
        auto_transitions=False,
        ignore_invalid_triggers=False,
        send_event=False,
        model_override=False,
    )
    for row in TRANSITIONS:
        conditions = [guards[row.guard]] if row.guard is not None else None
        machine.add_transition(row.trigger.value, row.source, row.dest, conditions=conditions)
    return machine


def check_tool_definitions(tools: Sequence[ToolDefinition]) -> tuple[ToolDefinition, ...]:
    """Refuse a tool list that is not a list of unique definitions."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidInputError("tools must be a sequence of tool definitions")
    seen: set[str] = set()
    for i, definition in enumerate(tools):
        if not isinstance(definition, ToolDefinition):
            raise InvalidInputError(
                f"tools[{i}] is a {type(definition).__name__}, not a ToolDefinition"
            )
        if definition.name in seen:
            raise InvalidInputError(
                f"duplicate tool name {definition.name!r}: tool names must be unique"
            )
        seen.add(definition.name)
    return tuple(tools)


def check_history(messages: Sequence[Message]) -> list[Message]:
    """Refuse a history the engine cannot continue; return it as a new list."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidInputError("messages must be a sequence of messages")
    history = list(messages)
    for i, message in enumerate(history):
        if not isinstance(message, (UserMessage, AssistantMessage, ToolResultMessage)):
            raise InvalidInputError(
                f"messages[{i}] is a {type(message).__name__}, not a message "
                "(use message_from_dict for wire dicts)"
            )
    if not history:
        raise InvalidInputError("the history is empty: give at least one user message")
    violations = history_violations(history)
    if violations:
        raise InvalidInputError("the history is invalid: " + "; ".join(str(v) for v in violations))
    last = history[-1]
    if isinstance(last, AssistantMessage):
        raise InvalidInputError(
            "the history ends with an assistant message, so there is nothing for the "
            "model to answer: append a user message to continue"
        )
    return history


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class Engine:
    """The agent loop as a sans-IO state machine.

    ``handle(event)`` returns the actions to perform next; ``state``, ``messages``,
    ``turns``, ``trace`` and ``explanation`` describe where the run stands.

    ``scheduling`` maps tool names to how their calls may run concurrently (a tool
    absent from it runs concurrently with everything). ``check_permissions`` makes
    every valid call wait for ``ToolPermitted``/``ToolDenied``/``ApprovalRequired``;
    ``check_continue`` makes every turn boundary wait for ``ContinueDecided``.

    Dispatch applies the table directly (the first row whose guard holds), which is
    all ``transitions.Machine.trigger`` would do for us at a fifth of the cost (see
    bench/). With ``verify_against_machine`` set (the test suite sets it for every
    engine), each transition is also run through ``reference_machine()``, the plain
    ``transitions.Machine`` built from the same table, and any disagreement raises.
    """

    verify_against_machine: ClassVar[bool] = False

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
        self._tools = tools
        self._tools_by_name = {d.name: d for d in tools}
        self._scheduling = dict(scheduling or {})
        self._history = history
        self._seen_ids: set[str] = {
            c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls
        }
        self.max_turns = max_turns
        self.check_permissions = check_permissions
        self.check_continue = check_continue
        self.run_id = run_id
        self._log = (logger if logger is not None else library_logger()).bind(run_id=run_id)
        self._debug = _debug_enabled(self._log)
        self.turns = 0
        self.trace: list[TransitionRecord] = []
        self.explanation: str | None = None
        self.abort_reason: str | None = None
        self._abort_context = ""
        self._abandoned: list[str] = []  # operations the driver gave up on, still running
        self._model_outstanding = False
        self._batch: list[_Slot] = []
        self._slots: dict[str, _Slot] = {}
        self._flushed = 0
        self._denial: tuple[ToolCall, str] | None = None
        self._steer: list[UserMessage] = []
        self._follow_up: list[UserMessage] = []
        self._continue_pending = False
        self._stop_reason: str | None = None
        self._event: Event | None = None
        self._actions: list[Action] = []
        self._fsm = _MachineModel()
        self._fsm.state = initial

    # -- what the caller reads -----------------------------------------------------

    @property
    def state(self) -> TurnState:
        return self._fsm.state

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
        return self._fsm.state in RETURNS_TO_CALLER

    def pending_calls(self) -> tuple[ToolCall, ...]:
        """Calls of the current batch that have no result yet, in call order."""
        return tuple(s.call for s in self._batch if s.status != _DONE)

    def pending_approvals(self) -> tuple[tuple[ToolCall, str], ...]:
        """Calls waiting for a person's approval, with the hook's reason."""
        return tuple((s.call, s.note) for s in self._batch if s.status == _WAITING_APPROVAL)

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
        state = self._fsm.state
        if state in ABSORBING:
            self._log.debug(
                "event_absorbed", turn=self.turns, state=state.value, trigger=trigger.value
            )
            return ()
        if (state, trigger) not in _ROWS:
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
            self._fire(trigger)
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
            self._expect_slot(event.call_id, _RUNNING, event.trigger)
        elif isinstance(event, (ModelResponded, ModelFailed, ModelCancelled)):
            if not self._model_outstanding:
                raise ProtocolError(f"{event.trigger.value}: no model call is outstanding")
            if isinstance(event, ModelCancelled) and state is not S.Aborting:
                raise ProtocolError("model_cancelled is accepted only while aborting")
        elif isinstance(event, (ToolPermitted, ToolDenied, ApprovalRequired)):
            self._expect_slot(event.call_id, _WAITING_PERMISSION, event.trigger)
        elif isinstance(event, ApprovalDecided):
            self._expect_slot(event.call_id, _WAITING_APPROVAL, event.trigger)
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
        """Record the event's data; destination-specific effects come on entry."""
        if isinstance(event, ToolFinished):  # the most frequent event first
            self._resolve_output(self._slots[event.call_id], event.output)
            if state is S.CollectingResults:
                self._start_runnable()
        elif isinstance(event, ModelResponded):
            self._model_outstanding = False
            message = self._normalise_ids(event.message)
            self._history.append(message)
            self._new_batch(message.tool_calls)
            if state is S.Aborting:
                self._answer_unresolved("Tool call not started: the run was aborted")
        elif isinstance(event, (ModelFailed, ModelCancelled)):
            self._model_outstanding = False
            detail = event.error if isinstance(event, ModelFailed) else event.reason
            if isinstance(event, ModelCancelled) and detail.startswith(ABANDONED):
                self._abandoned.append("the model call")
            if state is S.Aborting:
                stop, text = StopReason.ABORTED, f"The model call was aborted: {detail}"
            else:
                stop, text = StopReason.ERROR, f"The model call failed: {detail}"
            self._history.append(AssistantMessage((), stop_reason=stop, error_message=text))
        elif isinstance(event, InputQueued):
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
        elif isinstance(event, ToolPermitted):
            self._slots[event.call_id].status = _READY
        elif isinstance(event, ToolDenied):
            slot = self._slots[event.call_id]
            self._resolve(slot, f"Tool call denied: {event.reason}", is_error=True)
            if not event.advisory and self._denial is None:
                self._denial = (slot.call, event.reason)
        elif isinstance(event, ApprovalRequired):
            slot = self._slots[event.call_id]
            slot.status = _WAITING_APPROVAL
            slot.note = event.reason
        elif isinstance(event, ApprovalDecided):
            slot = self._slots[event.call_id]
            if event.approved:
                slot.status = _READY
            else:
                reason = f": {event.reason}" if event.reason else ""
                self._resolve(slot, f"Tool call denied by a person{reason}", is_error=True)
        elif isinstance(event, ToolCancelled):
            slot = self._slots[event.call_id]
            if event.reason.startswith(ABANDONED):
                self._abandoned.append(f"tool {slot.call.name} (call {slot.call.id})")
            self._resolve(slot, f"Operation aborted: {event.reason}", is_error=True)
        elif isinstance(event, ContinueDecided):
            self._continue_pending = False
            if event.stop:
                self._stop_reason = event.reason or "should_continue asked to stop"
        elif isinstance(event, AbortRequested) and self.abort_reason is None:
            self.abort_reason = event.reason
        self._flush()

    def _fire(self, trigger: Trigger) -> None:
        source = self._fsm.state
        # The table's own rule: the first row for (state, trigger) whose guard holds.
        for guard, dest in _ROWS.get((source, trigger), ()):  # noqa: B007 - used after
            if guard is None or getattr(self, guard)():
                break
        else:
            # Unreachable when the table is complete (the checker proves it); kept so
            # that a broken table fails loudly instead of silently stalling.
            raise ProtocolError(f"no row of the table applies to {trigger.value!r} in {source}")
        if self.verify_against_machine:
            _verify_with_machine(self, source, trigger, dest)
        self._fsm.state = dest
        self.trace.append(TransitionRecord(source, trigger, dest, self.turns))
        if self._debug:
            self._log.debug(
                "transition",
                turn=self.turns,
                from_state=source.value,
                to_state=dest.value,
                trigger=trigger.value,
            )
        if dest is not source:
            getattr(self, _ENTER[dest])(source)

    def _run_internal(self) -> None:
        # Fire internal triggers to a fixed point. Each firing leaves its source state
        # and the internal triggers form no cycle without an input in between
        # (Dispatching -> Collecting -> TurnBoundary -> AwaitingModel waits for the
        # model), so this terminates; the cap turns a broken table or guard into an
        # error that shows the loop instead of a hang.
        fired = 0
        while True:
            for trigger, guard in _INTERNAL_FROM[self._fsm.state]:
                if getattr(self, guard)():
                    if fired == MAX_INTERNAL_TRANSITIONS:
                        self._runaway(trigger, fired)
                    self._fire(trigger)
                    fired += 1
                    break
            else:
                return

    def _runaway(self, trigger: Trigger, fired: int) -> typing.NoReturn:
        recent = self.trace[-(fired + 1) :]  # the input's own transition, then the rest
        shown = ", ".join(f"{r.source}-{r.trigger}->{r.dest}" for r in recent[-6:])
        raise EngineInvariantError(
            f"internal transitions do not settle: {fired} fired after one input event and "
            f"{trigger} would fire again in {self._fsm.state} (a broken table or guard; "
            f"this engine cannot go on). Last transitions: {shown}",
            recent,
        )

    # -- guards (named in the table) -----------------------------------------------------

    def _response(self) -> AssistantMessage:
        event = self._event
        assert isinstance(event, ModelResponded)
        return event.message

    def _guard_reports_error(self) -> bool:
        return self._response().stop_reason is StopReason.ERROR

    def _guard_reports_abort(self) -> bool:
        return self._response().stop_reason is StopReason.ABORTED

    def _guard_has_tool_calls(self) -> bool:
        return bool(self._batch)

    def _guard_input_queued(self) -> bool:
        return bool(self._steer or self._follow_up)

    def _guard_all_calls_resolved(self) -> bool:
        return all(s.status != _WAITING_PERMISSION for s in self._batch)

    def _guard_nothing_running(self) -> bool:
        return all(s.status != _RUNNING for s in self._batch)

    def _guard_approvals_pending(self) -> bool:
        return any(s.status == _WAITING_APPROVAL for s in self._batch)

    def _guard_boundary_ready(self) -> bool:
        return not self._continue_pending

    def _guard_denied_by_policy(self) -> bool:
        return self._denial is not None

    def _guard_stop_requested(self) -> bool:
        return self._stop_reason is not None

    def _guard_turn_limit_reached(self) -> bool:
        return self.turns >= self.max_turns

    def _guard_nothing_outstanding(self) -> bool:
        return not self._model_outstanding and all(s.status != _RUNNING for s in self._batch)

    # -- entry effects -------------------------------------------------------------------

    def _enter_AwaitingModel(self, source: TurnState) -> None:
        self._inject_queued()
        self.turns += 1
        self._model_outstanding = True
        self._new_batch(())
        self._actions.append(CallModel(self.messages, self._tools, self.turns))

    def _enter_DispatchingTools(self, source: TurnState) -> None:
        for slot in self._batch:
            definition = self._tools_by_name.get(slot.call.name)
            if definition is None:
                self._resolve(slot, self._unknown_tool_text(slot.call.name), is_error=True)
                continue
            if slot.call.parse_error is not None:
                # Checked before the schema: empty arguments may satisfy it, and the
                # model asked for something else that nobody could read.
                text = (
                    f"Invalid arguments for tool {slot.call.name}: "
                    f"{slot.call.parse_error.rstrip('.')}. The tool was not run. Call it "
                    "again with a JSON object matching this JSON Schema: "
                    + json.dumps(definition.schema_dict(), sort_keys=True)
                )
                self._resolve(slot, text, is_error=True)
                continue
            problems = validate_arguments(definition, slot.call.arguments)
            if problems:
                text = (
                    f"Invalid arguments for tool {slot.call.name}:\n"
                    + "\n".join(f"- {p}" for p in problems)
                    + "\nExpected arguments matching this JSON Schema: "
                    + json.dumps(definition.schema_dict(), sort_keys=True)
                )
                self._resolve(slot, text, is_error=True)
                continue
            self._classify(slot)
            if self.check_permissions:
                slot.status = _WAITING_PERMISSION
                self._actions.append(CheckPermission(slot.call, self.turns))
        self._flush()

    def _enter_CollectingResults(self, source: TurnState) -> None:
        self._start_runnable()

    def _enter_TurnBoundary(self, source: TurnState) -> None:
        if self.check_continue:
            self._continue_pending = True
            self._actions.append(CheckContinue(self.turns))

    def _enter_Aborting(self, source: TurnState) -> None:
        reason = self.abort_reason or "aborted"
        self._answer_unresolved(f"Tool call not started: the run was aborted ({reason})")
        running = tuple(s.call.id for s in self._batch if s.status == _RUNNING)
        self._actions.append(CancelOperations(self._model_outstanding, running, reason))
        self._abort_context = (
            f"during the model call of turn {self.turns}"
            if self._model_outstanding
            else f"while the tool calls of turn {self.turns} were "
            + ("running" if source is S.CollectingResults else "being dispatched")
        )

    def _enter_Done(self, source: TurnState) -> None:
        if source is S.TurnBoundary:
            self._finish(f"Stopped at a turn boundary by should_continue: {self._stop_reason}.")
        else:
            self._finish("The model answered without tool calls: the task is complete.")

    def _enter_Failed(self, source: TurnState) -> None:
        last = self._history[-1]
        detail = last.error_message if isinstance(last, AssistantMessage) else None
        if isinstance(self._event, ModelResponded):
            self._answer_unresolved(
                "Tool call not run: the model's response reported an error, so its "
                "arguments may be incomplete"
            )
            text = f"The model reported an error: {detail or 'no details given'}"
        else:
            text = detail or "The model call failed."
        self._finish(
            f"{text.rstrip('.')}. The run stopped without retrying (turn {self.turns}); fix "
            "the cause, then run again on this history."
        )

    def _enter_Aborted(self, source: TurnState) -> None:
        if source is S.AwaitingModel:
            last = self._history[-1]  # the aborted response, before its calls' results
            detail = last.error_message if isinstance(last, AssistantMessage) else None
            self._answer_unresolved(
                "Tool call not run: the model's response was aborted, so its arguments "
                "may be incomplete"
            )
            self._finish(
                f"The model's response reports that it was aborted"
                f"{': ' + detail if detail else ''} (turn {self.turns})."
            )
            return
        reason = self.abort_reason or "aborted"
        self._answer_unresolved(f"Tool call not started: the run was aborted ({reason})")
        contexts = {
            S.Aborting: self._abort_context,
            S.Ready: "before the first model call",
            S.TurnBoundary: f"at the turn boundary after turn {self.turns}",
            S.AwaitingUser: "while waiting for a person",
        }
        if self._abandoned:
            cleanup = (
                f" (the driver abandoned {', '.join(self._abandoned)}: it ignored "
                "cancellation and was still running at the end of the grace period, so its "
                "cleanup may not have finished)."
            )
        else:
            cleanup = " and finished its cleanup."
        self._finish(
            f"Aborted {contexts[source]}: {reason}. Every tool call that had started has "
            f"a result{cleanup}"
        )

    def _enter_TurnLimitExceeded(self, source: TurnState) -> None:
        last = self._batch[-1].result if self._batch else None
        if last is not None:
            outcome = "failed" if last.is_error else "returned"
            operation = (
                f"tool {last.tool_name} (call {last.tool_call_id}) {outcome}: "
                f"{_short(last.text) or '(no text)'}"
            )
        else:
            operation = "the model's last response"
        queued = len(self._steer) + len(self._follow_up)
        waiting = f" and {queued} queued input message(s) wait" if queued else ""
        self._finish(
            f"Stopped at the turn limit: max_turns={self.max_turns} model calls were made "
            f"and the model still had work to do{waiting}. Last operation: {operation}. To "
            "continue, run again on this history with a higher max_turns, or add a user "
            "message that narrows the task."
        )

    def _enter_AwaitingUser(self, source: TurnState) -> None:
        pending = self.pending_approvals()
        if pending:
            listed = "; ".join(
                f"{call.name} (call {call.id}){': ' + note if note else ''}"
                for call, note in pending
            )
            self._finish(
                f"Waiting for a person to approve {len(pending)} tool call(s): {listed}. "
                "Resume with a decision for each call, or with a new user message."
            )
            return
        assert self._denial is not None
        call, reason = self._denial
        self._denial = None
        self._finish(
            f"Waiting for a person: tool call {call.name} (call {call.id}) was denied by "
            f"policy: {reason}. Resume with a new user message on this history."
        )

    # -- helpers ----------------------------------------------------------------------------

    def _finish(self, explanation: str) -> None:
        self.explanation = explanation
        self._actions.append(RunEnded(self._fsm.state, explanation))
        self._log.info(
            "run_ended", turn=self.turns, state=self._fsm.state.value, explanation=explanation
        )

    def _inject_queued(self) -> None:
        """Queued input enters history at the start of a model call (rule 6)."""
        if self._steer:
            self._history.extend(self._steer)
            self._steer = []
        elif self._follow_up and self._model_would_finish():
            self._history.extend(self._follow_up)
            self._follow_up = []

    def _model_would_finish(self) -> bool:
        for message in reversed(self._history):
            if isinstance(message, AssistantMessage):
                return not message.tool_calls
            if isinstance(message, ToolResultMessage):
                return False
        return False

    def _new_batch(self, calls: Sequence[ToolCall]) -> None:
        self._batch = [_Slot(c) for c in calls]
        self._slots = {s.call.id: s for s in self._batch}
        self._flushed = 0

    def _classify(self, slot: _Slot) -> None:
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
        unfinished: list[_Slot] = []
        for slot in self._batch:
            if slot.status == _DONE:
                continue
            if slot.status == _READY and all(
                not (slot.sequential or other.sequential or slot.resources & other.resources)
                for other in unfinished
            ):
                slot.status = _RUNNING
                self._actions.append(StartTool(slot.call, self.turns))
            unfinished.append(slot)

    def _normalise_ids(self, message: AssistantMessage) -> AssistantMessage:
        """Give empty or repeated tool-call ids a unique, deterministic replacement."""
        calls = message.tool_calls
        if not calls:
            return message
        seen = self._seen_ids
        ids = [c.id for c in calls]
        if all(ids) and not seen.intersection(ids) and len(set(ids)) == len(ids):
            seen.update(ids)
            return message
        content = []
        index = 0
        for block in message.content:
            if isinstance(block, ToolCall):
                if not block.id or block.id in seen:
                    new_id = f"call_t{self.turns}_{index}"
                    suffix = 1
                    while new_id in seen:
                        new_id = f"call_t{self.turns}_{index}_{suffix}"
                        suffix += 1
                    self._log.warning(
                        "tool_call_id_normalised",
                        turn=self.turns,
                        original=block.id,
                        assigned=new_id,
                        reason="empty" if not block.id else "repeated",
                    )
                    block = ToolCall(new_id, block.name, block.arguments)
                seen.add(block.id)
                index += 1
            content.append(block)
        return attrs.evolve(message, content=tuple(content))

    def _unknown_tool_text(self, name: str) -> str:
        if not self._tools:
            return f"Unknown tool: {name}. No tools are available in this run."
        names = ", ".join(d.name for d in self._tools)
        return f"Unknown tool: {name}. Available tools: {names}."

    def _resolve(self, slot: _Slot, text: str, *, is_error: bool) -> None:
        slot.result = ToolResultMessage(
            slot.call.id, slot.call.name, (TextContent(text),), is_error=is_error
        )
        slot.status = _DONE

    def _resolve_output(self, slot: _Slot, output: ToolOutput) -> None:
        slot.result = ToolResultMessage(
            slot.call.id, slot.call.name, output.content, is_error=output.is_error
        )
        slot.status = _DONE

    def _answer_unresolved(self, text: str) -> None:
        """Give every call that never started a result saying why (I1, I6)."""
        for slot in self._batch:
            if slot.status in (_WAITING_PERMISSION, _WAITING_APPROVAL, _READY):
                self._resolve(slot, text, is_error=True)
        self._flush()

    def _flush(self) -> None:
        """Append the contiguous prefix of arrived results, in call order (I2)."""
        batch = self._batch
        i = self._flushed
        while i < len(batch) and batch[i].status == _DONE:
            result = batch[i].result
            assert result is not None
            self._history.append(result)
            i += 1
        self._flushed = i

    # -- snapshot and restore (suspension across processes) ------------------------------

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
        if self._model_outstanding or any(s.status == _RUNNING for s in self._batch):
            raise ProtocolError(
                f"cannot snapshot in {self.state} while an operation is outstanding"
            )
        data = {
            "version": SNAPSHOT_VERSION,
            "runId": self.run_id,
            "state": self.state.value,
            "maxTurns": self.max_turns,
            "checkPermissions": self.check_permissions,
            "checkContinue": self.check_continue,
            "turns": self.turns,
            "tools": [
                {"name": d.name, "description": d.description, "parameters": d.schema_dict()}
                for d in self._tools
            ],
            "messages": [message_to_dict(m) for m in self._history],
            "batch": [
                {
                    "call": message_to_dict(AssistantMessage((s.call,)))["content"][0],
                    "status": s.status,
                    "sequential": s.sequential,
                    "resources": sorted(s.resources),
                    "note": s.note,
                    "result": None if s.result is None else message_to_dict(s.result),
                }
                for s in self._batch
            ],
            "flushed": self._flushed,
            "denial": None
            if self._denial is None
            else {"callId": self._denial[0].id, "reason": self._denial[1]},
            "steer": [message_to_dict(m) for m in self._steer],
            "followUp": [message_to_dict(m) for m in self._follow_up],
            "continuePending": self._continue_pending,
            "stopReason": self._stop_reason,
            "abortReason": self.abort_reason,
            "explanation": self.explanation,
            "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in self.trace],
        }
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
            engine._load(snapshot, scheduling, logger)
        except SnapshotError:
            raise
        except InvalidInputError as exc:  # a message's own parser names its path
            raise SnapshotError(str(exc)) from None
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
            # Not expected: every field is read by a typed reader. Kept so that a gap
            # still gives the documented error, never a crash.
            raise SnapshotError(f"snapshot: malformed ({type(exc).__name__})") from None
        engine._check_restored()
        return engine

    # -- reading a snapshot's fields --------------------------------------------------------

    def _load(
        self, data: Mapping[str, Any], scheduling: Mapping[str, Scheduling] | None, logger: Any
    ) -> None:
        p = "snapshot"
        _snapshots.only_keys(data, _SNAPSHOT_KEYS, p)
        version = _snapshots.field(data, "version", p)
        if type(version) is not int or version != SNAPSHOT_VERSION:
            raise SnapshotError(f"snapshot.version: {version!r:.40} is not {SNAPSHOT_VERSION}")
        tools = tuple(
            _tool_from(t, f"snapshot.tools[{i}]")
            for i, t in enumerate(_snapshots.array(data, "tools", p))
        )
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise SnapshotError("snapshot.tools: tool names repeat")
        history = [
            message_from_dict(_snapshots.obj(d, f"{p}.messages[{i}]"), path=f"{p}.messages[{i}]")
            for i, d in enumerate(_snapshots.array(data, "messages", p))
        ]
        if not history:
            raise SnapshotError("snapshot.messages: empty")
        state_name = _snapshots.string(data, "state", p)
        if state_name not in _STATES:
            raise SnapshotError(f"snapshot.state: {state_name!r:.40} is not a state")
        self._setup(
            tools=tools,
            history=history,
            max_turns=_snapshots.integer(data, "maxTurns", p, minimum=1),
            check_permissions=_snapshots.boolean(data, "checkPermissions", p),
            check_continue=_snapshots.boolean(data, "checkContinue", p),
            scheduling=scheduling,
            run_id=_snapshots.string(data, "runId", p),
            logger=logger,
            initial=_STATES[state_name],
        )
        self.turns = _snapshots.integer(data, "turns", p, minimum=0)
        self._batch = [
            _slot_from(item, f"snapshot.batch[{i}]")
            for i, item in enumerate(_snapshots.array(data, "batch", p))
        ]
        self._slots = {s.call.id: s for s in self._batch}
        if len(self._slots) != len(self._batch):
            raise SnapshotError("snapshot.batch: call ids repeat")
        self._seen_ids.update(self._slots)
        self._flushed = _snapshots.integer(data, "flushed", p, minimum=0)
        self._denial = self._denial_from(_snapshots.field(data, "denial", p))
        self._steer = [
            _user(d, f"snapshot.steer[{i}]")
            for i, d in enumerate(_snapshots.array(data, "steer", p))
        ]
        self._follow_up = [
            _user(d, f"snapshot.followUp[{i}]")
            for i, d in enumerate(_snapshots.array(data, "followUp", p))
        ]
        self._continue_pending = _snapshots.boolean(data, "continuePending", p)
        self._stop_reason = _snapshots.string(data, "stopReason", p, optional=True)
        self.abort_reason = _snapshots.string(data, "abortReason", p, optional=True)
        self.explanation = _snapshots.string(data, "explanation", p, optional=True)
        self.trace = [
            _record_from(r, f"snapshot.trace[{i}]")
            for i, r in enumerate(_snapshots.array(data, "trace", p))
        ]

    def _denial_from(self, value: object) -> tuple[ToolCall, str] | None:
        if value is None:
            return None
        d = _snapshots.obj(value, "snapshot.denial")
        _snapshots.only_keys(d, frozenset({"callId", "reason"}), "snapshot.denial")
        call_id = _snapshots.string(d, "callId", "snapshot.denial")
        reason = _snapshots.string(d, "reason", "snapshot.denial")
        slot = self._slots.get(call_id)
        if slot is None:
            raise SnapshotError(
                f"snapshot.denial.callId: {call_id!r:.40} is not a call of snapshot.batch"
            )
        return slot.call, reason

    # -- checking a restored snapshot against itself ------------------------------------------

    def _check_restored(self) -> None:
        """Refuse a restored snapshot that no run could have written (see ``restore``)."""
        state = self._fsm.state
        if state in _NEVER_AT_REST:
            raise SnapshotError(
                f"snapshot.state: {state} always has an operation outstanding, and no "
                "snapshot is taken while one is"
            )
        self._check_trace()
        self._check_batch_is_last_calls()
        self._check_slots()
        self._check_flags()
        open_tail = bool(self._batch) and self._flushed < len(self._batch)
        violations = history_violations(self._history, allow_open_tail=open_tail)
        if violations:
            raise SnapshotError(
                "snapshot.messages: invalid history: " + "; ".join(map(str, violations[:3]))
            )

    def _check_trace(self) -> None:
        # The log is replayed: each record a row of the table, each starting where the
        # one before ended, each stamped with the model calls made before it.
        at, turns = INITIAL, 0
        for i, r in enumerate(self.trace):
            if (r.source, r.trigger, r.dest) not in _ROW_SET:
                raise SnapshotError(
                    f"snapshot.trace[{i}]: {r.source} --{r.trigger}--> {r.dest} is not a "
                    "row of the transition table"
                )
            if r.source is not at:
                raise SnapshotError(
                    f"snapshot.trace[{i}]: starts in {r.source}, but the run was in {at}"
                )
            if r.turn != turns:
                raise SnapshotError(
                    f"snapshot.trace[{i}]: turn {r.turn}, but {turns} model call(s) came before"
                )
            if r.dest is S.AwaitingModel and r.source is not S.AwaitingModel:
                turns += 1
            at = r.dest
        if at is not self._fsm.state:
            raise SnapshotError(f"snapshot.state: {self._fsm.state}, but the trace ends in {at}")
        if turns != self.turns:
            raise SnapshotError(
                f"snapshot.turns: {self.turns}, but the trace shows {turns} model call(s)"
            )

    def _check_batch_is_last_calls(self) -> None:
        batch, history, flushed = self._batch, self._history, self._flushed
        if not batch:
            if flushed:
                raise SnapshotError(f"snapshot.flushed: {flushed}, but the batch is empty")
            return
        k = next(
            (
                i
                for i in range(len(history) - 1, -1, -1)
                if isinstance(history[i], AssistantMessage)
            ),
            None,
        )
        if k is None:
            raise SnapshotError("snapshot.batch: not empty, but no assistant message made calls")
        last = history[k]
        assert isinstance(last, AssistantMessage)
        calls = last.tool_calls
        if len(calls) != len(batch):
            raise SnapshotError(
                f"snapshot.batch: holds {len(batch)} call(s), but the last assistant message "
                f"(snapshot.messages[{k}]) made {len(calls)}"
            )
        for i, (slot, call) in enumerate(zip(batch, calls, strict=True)):
            if _call_key(slot.call) != _call_key(call):
                raise SnapshotError(
                    f"snapshot.batch[{i}].call: differs from call {i} of the last assistant "
                    f"message (snapshot.messages[{k}]) in its id, name or arguments"
                )
            # One object from here on: what runs is exactly what the history shows.
            slot.call = call
        self._slots = {s.call.id: s for s in batch}
        if self._denial is not None:
            self._denial = (self._slots[self._denial[0].id].call, self._denial[1])
        tail = history[k + 1 :]
        if flushed > len(batch) or len(tail) != flushed:
            raise SnapshotError(
                f"snapshot.flushed: {flushed}, but {len(tail)} message(s) follow the last "
                f"assistant message and the batch holds {len(batch)} call(s)"
            )
        for i, message in enumerate(tail):
            if message != batch[i].result:
                raise SnapshotError(
                    f"snapshot.batch[{i}].result: differs from snapshot.messages[{k + 1 + i}], "
                    "its place in the history"
                )

    def _check_slots(self) -> None:
        state = self._fsm.state
        allowed = _OPEN_STATUSES.get(state, frozenset())
        for i, slot in enumerate(self._batch):
            p = f"snapshot.batch[{i}]"
            done = slot.status == _DONE
            if done != (slot.result is not None):
                raise SnapshotError(
                    f"{p}.result: "
                    + ("missing for a call with status done" if done else "present, but not done")
                )
            if slot.result is not None and (
                slot.result.tool_call_id != slot.call.id or slot.result.tool_name != slot.call.name
            ):
                raise SnapshotError(f"{p}.result: answers another call than {p}.call")
            if done:
                if i == self._flushed:
                    raise SnapshotError(
                        f"{p}.status: done, but its result is held back although every "
                        "result before it is in the history (snapshot.flushed)"
                    )
                continue
            if slot.status not in allowed:
                raise SnapshotError(f"{p}.status: {slot.status!r} is impossible in {state}")
            self._check_dispatchable(slot, p)
            # A ready call in AwaitingUser may be held back by an earlier one, or
            # approved by a person while others still wait: both are fine, so what
            # made it ready cannot be read from here. resume_run asks the policy again.
        statuses = {s.status for s in self._batch}
        if state is S.DispatchingTools and _WAITING_PERMISSION not in statuses:
            raise SnapshotError(
                "snapshot.state: DispatchingTools, but no call waits for permission"
            )
        if state is S.AwaitingUser and statuses - {_DONE} and _WAITING_APPROVAL not in statuses:
            raise SnapshotError(
                "snapshot.batch: calls are open in AwaitingUser, but none waits for approval"
            )

    def _check_dispatchable(self, slot: _Slot, p: str) -> None:
        """A call still open named a known tool and had readable arguments: dispatch
        answers any other at once. (Its arguments are not matched against the
        snapshot's own schema here: a hostile pattern could make that take forever.
        ``resume_run`` matches them against the caller's tools.)"""
        call = slot.call
        if call.name not in self._tools_by_name:
            raise SnapshotError(f"{p}.call: tool {call.name!r} is not in snapshot.tools")
        if call.parse_error is not None:
            raise SnapshotError(f"{p}.call: arguments that could not be parsed cannot be open")

    def _check_flags(self) -> None:
        state = self._fsm.state
        # At rest, TurnBoundary always waits for should_continue; an abort there leaves
        # the (now moot) question pending in Aborted.
        if self._continue_pending != (state is S.TurnBoundary) and not (
            self._continue_pending and state is S.Aborted
        ):
            raise SnapshotError(
                f"snapshot.continuePending: {str(self._continue_pending).lower()} in {state}"
            )
        if state is S.Ready and self._batch:
            raise SnapshotError("snapshot.batch: not empty, but no model call was made")
        if state is S.Ready and isinstance(self._history[-1], AssistantMessage):
            raise SnapshotError("snapshot.messages: a run in Ready cannot end with the model")
        if state in RETURNS_TO_CALLER and self.explanation is None:
            raise SnapshotError(f"snapshot.explanation: missing in {state}")
        if self.abort_reason is not None and state is not S.Aborted:
            raise SnapshotError(f"snapshot.abortReason: set, but the run is {state}")
        if self._denial is not None:
            slot = self._slots[self._denial[0].id]
            result = slot.result
            if (
                result is None
                or not result.is_error
                or (result.text != f"Tool call denied: {self._denial[1]}")
            ):
                raise SnapshotError(
                    "snapshot.denial: the call it names was not answered with that denial"
                )


# -- snapshot fields (module level: no engine needed) ---------------------------------------

_SNAPSHOT_KEYS: Final = frozenset(
    {
        "version",
        "runId",
        "state",
        "maxTurns",
        "checkPermissions",
        "checkContinue",
        "turns",
        "tools",
        "messages",
        "batch",
        "flushed",
        "denial",
        "steer",
        "followUp",
        "continuePending",
        "stopReason",
        "abortReason",
        "explanation",
        "trace",
        _snapshots.SIGNATURE_FIELD,
    }
)
_SLOT_KEYS: Final = frozenset({"call", "status", "sequential", "resources", "note", "result"})
_STATES: Final = {s.value: s for s in TurnState}
_TRIGGERS: Final = {t.value: t for t in Trigger}
_ROW_SET: Final = frozenset((r.source, r.trigger, r.dest) for r in TRANSITIONS)
# States a run only passes through while an operation is outstanding.
_NEVER_AT_REST: Final = frozenset({S.AwaitingModel, S.CollectingResults, S.Aborting})
# The statuses a call without a result may have when the run rests in a state.
_OPEN_STATUSES: Final = {
    S.DispatchingTools: frozenset({_WAITING_PERMISSION, _WAITING_APPROVAL, _READY}),
    S.AwaitingUser: frozenset({_WAITING_APPROVAL, _READY}),
}


def _call_key(call: ToolCall) -> str:
    # Exact JSON, not ==: in Python 1 == 1.0 == True, and a tool would see the difference.
    return json.dumps(
        [call.id, call.name, thaw_json(call.arguments), call.parse_error], sort_keys=True
    )


def _tool_from(value: object, path: str) -> ToolDefinition:
    d = _snapshots.obj(value, path)
    _snapshots.only_keys(d, frozenset({"name", "description", "parameters"}), path)
    name = _snapshots.string(d, "name", path)
    description = _snapshots.string(d, "description", path)
    parameters = _snapshots.obj(_snapshots.field(d, "parameters", path), f"{path}.parameters")
    try:
        return ToolDefinition(name, description, parameters)
    except InvalidInputError as exc:
        raise SnapshotError(f"{path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the schema library on a hostile schema
        raise SnapshotError(
            f"{path}.parameters: not a usable JSON Schema ({type(exc).__name__})"
        ) from None


def _slot_from(value: object, path: str) -> _Slot:
    item = _snapshots.obj(value, path)
    _snapshots.only_keys(item, _SLOT_KEYS, path)
    call = _block_from_dict(_snapshots.field(item, "call", path), ("toolCall",), f"{path}.call")
    assert isinstance(call, ToolCall)
    slot = _Slot(call)
    status = _snapshots.string(item, "status", path)
    if status not in _STATUSES or status == _RUNNING:
        raise SnapshotError(f"{path}.status: {status!r:.40} is not a status a snapshot holds")
    slot.status = status
    slot.sequential = _snapshots.boolean(item, "sequential", path)
    resources = _snapshots.array(item, "resources", path)
    if not all(isinstance(r, str) for r in resources):
        raise SnapshotError(f"{path}.resources: expected an array of strings")
    slot.resources = frozenset(resources)
    slot.note = _snapshots.string(item, "note", path)
    result = _snapshots.field(item, "result", path)
    if result is not None:
        message = message_from_dict(_snapshots.obj(result, f"{path}.result"), path=f"{path}.result")
        if not isinstance(message, ToolResultMessage):
            raise SnapshotError(f"{path}.result: expected a tool result message")
        slot.result = message
    return slot


def _record_from(value: object, path: str) -> TransitionRecord:
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise SnapshotError(f"{path}: expected [source, trigger, dest, turn]")
    source, trigger, dest, turn = value
    if not (
        isinstance(source, str)
        and source in _STATES
        and isinstance(trigger, str)
        and trigger in _TRIGGERS
        and isinstance(dest, str)
        and dest in _STATES
    ):
        raise SnapshotError(f"{path}: names an unknown state or trigger")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise SnapshotError(f"{path}[3]: expected an integer >= 0")
    return TransitionRecord(_STATES[source], _TRIGGERS[trigger], _STATES[dest], turn)


def _user(value: object, path: str) -> UserMessage:
    message = message_from_dict(_snapshots.obj(value, path), path=path)
    if not isinstance(message, UserMessage):
        raise SnapshotError(f"{path}: queued input must be a user message")
    return message
