"""The sans-IO engine: engine events in, actions out. Read it beside ``core/table.py``.

The engine performs no I/O, reads no clock and draws no random number: the same
events give the same states, history and transition log (I5). It interprets the
table, and nothing else decides where a run goes. One engine event goes through
``handle`` like this:

1. In an absorbing (terminal) state, the event is logged and dropped (I4).
2. The rows for (state, the event's trigger) are read with ``rows_from``. None: the
   event is not accepted here, and ``ProtocolError`` is raised before anything
   changes (I8); so it is when the payload does not fit (``_check_payload``: a
   result for a call that is not running...).
3. The event's data is recorded (``_record``: a message appended, a result stored).
4. ``_fire`` takes the first row whose guard holds (``guard_holds``; each guard is a
   method ``_guard_<name>`` named after its ``Guard``), records the transition in
   ``trace`` and runs the destination's entry effect (``_enter_<State>``: e.g.
   entering ``AwaitingModel`` asks for a model call).
5. ``_settle`` fires the internal triggers (``INTERNAL_TRIGGERS``) while their guard
   holds, each again through ``_fire``, at most ``MAX_INTERNAL_TRANSITIONS`` times.

The actions the entry effects asked for are returned. The engine holds its parts by
composition: the current ``Batch`` of tool calls (``core/batch.py``), the
``InputQueue`` of steering and follow-up messages (``core/queue.py``) and the
``Trace`` (``core/trace.py``). Snapshots are written, read and checked in
``core/snapshot.py``; the explanations a person reads are worded in
``core/explanations.py``.

A ``transition_hook`` given to an engine sees every trigger it fires; the test suite
and the exhaustive checker use it to hold the engine to a reference machine and to
the table's rules (see ``TransitionHook``). The engine never imports the
``transitions`` package.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, NoReturn, Self

import attrs
from typing_extensions import deprecated

from statemachine._log import library_logger
from statemachine.core import explanations as explain
from statemachine.core import snapshot as _snapshot
from statemachine.core.batch import (
    DONE,
    READY,
    RUNNING,
    WAITING_APPROVAL,
    WAITING_PERMISSION,
    Batch,
    CallSlot,
)
from statemachine.core.checks import positive_int
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
    ReturnToCaller,
    RunStep,
    StartTool,
    StepDecided,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.inputs import check_history, check_tool_definitions
from statemachine.core.limits import UsageLimits, check_usage_limits
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    TextContent,
    ToolCall,
    Usage,
    UserMessage,
    checked_result,
    thaw_json,
)
from statemachine.core.output import (
    NOT_RUN_EARLY,
    OUTPUT_ACCEPTED,
    TEXT_OUTPUT,
    OutputSpec,
    check_output,
)
from statemachine.core.queue import InputQueue
from statemachine.core.snapshot import (
    DEFAULT_MAX_SNAPSHOT_BYTES,
    DEFAULT_MAX_SNAPSHOT_DEPTH,
    SNAPSHOT_VERSION,
)
from statemachine.core.steps import MAX_STEP_MESSAGE_CHARS, Retry, StepSpec, step_named
from statemachine.core.table import (
    ABSORBING,
    BASE_TABLE,
    INITIAL,
    INTERNAL_TRIGGERS,
    RETURNS_TO_CALLER,
    DeclaredState,
    Guard,
    OutcomeIs,
    RowGuard,
    State,
    Table,
    Transition,
    Trigger,
    TurnState,
    rows_from,
    triggers_from,
)
from statemachine.core.tools import (
    DEFAULT_TOOL_RETRIES,
    Scheduling,
    ToolDefinition,
    ToolOutput,
    check_tool_retries,
    validate_arguments,
)
from statemachine.core.trace import Trace, TransitionRecord
from statemachine.errors import EngineInvariantError, ProtocolError

__all__ = [
    "ABANDONED",
    "CONFIGURATION",
    "CONTROL",
    "DEFAULT_MAX_SNAPSHOT_BYTES",
    "DEFAULT_MAX_SNAPSHOT_DEPTH",
    "MAX_INTERNAL_TRANSITIONS",
    "RECORD",
    "SNAPSHOT_VERSION",
    "TRANSIENT",
    "Engine",
    "TransitionHook",
    "TransitionRecord",
    "check_history",
    "check_tool_definitions",
]

S = TurnState

MAX_INTERNAL_TRANSITIONS: Final = 32
"""How many internal transitions one engine event may cause. The table needs at most
three (DispatchingTools -> CollectingResults -> TurnBoundary -> AwaitingModel); a
guard that still holds after this many means a broken table or guard, and the engine
raises ``EngineInvariantError`` instead of looping forever."""

ABANDONED: Final = "abandoned"
"""How a ``ModelCancelled``/``ToolCancelled`` reason starts when the driver stopped
waiting for an operation that ignored cancellation and may still be running: the
explanation then says so instead of claiming that its cleanup finished."""

TransitionHook = Callable[["Engine", State, Trigger, "State | None"], None]
"""Called by an engine for every trigger it fires: (engine, source, trigger, dest).
``dest`` is the destination of the row the engine chose, or ``None`` when no row
applies (the engine then raises ``ProtocolError``). It is called before the state
changes, so ``engine.guard_holds`` still gives the values the engine decided on.
Give it as ``Engine(transition_hook=...)`` or set ``engine.transition_hook``."""

_NO_USAGE: Final = Usage()  # immutable: every engine starts from this one zero
_NO_RETRIES: Final[Mapping[str, int]] = MappingProxyType({})  # no budgets, no failures

_GUARD_METHOD: Final = {guard: f"_guard_{guard.value}" for guard in Guard}
_ENTRY_METHOD: Final[dict[State, str]] = {state: f"_enter_{state.value}" for state in TurnState}


def _enabled(log: Any, level: int) -> bool:
    """False only when the logger says, when the engine is made, that it drops events
    of ``level``: those events are then not built at all (the transition log at debug,
    the end of the run at info). structlog's filtering loggers and the default
    stdlib-backed logger (``_log.library_logger``) can say so; any other logger
    (structlog's lazy proxy follows configuration made later) is given every event."""
    ask = getattr(type(log), "is_enabled_for", None) or getattr(type(log), "isEnabledFor", None)
    if ask is None:
        return True
    try:
        return bool(ask(log, level))
    except Exception:  # noqa: BLE001 - a logger we cannot ask is given everything
        return True


class Engine:
    """The agent loop as a sans-IO state machine.

    ``handle(event)`` returns the actions to perform next; ``state``, ``messages``,
    ``turns``, ``trace`` and ``explanation`` describe where the run stands.
    ``fork()`` gives an independent copy and ``control_key()`` a value that tells
    whether two engines will behave alike: they are the one public way to copy and
    compare an engine's state.

    ``scheduling`` maps tool names to how their calls may run concurrently (a tool
    absent from it runs concurrently with everything). ``check_permissions`` makes
    every valid call wait for ``ToolPermitted``/``ToolDenied``/``ApprovalRequired``;
    ``check_continue`` makes every turn boundary wait for ``ContinueDecided``.
    ``usage_limits`` (``core/limits.py``) ends the run ``UsageLimitExceeded`` at a turn
    boundary where the usage its responses reported (``usage``) has reached a limit.
    ``transition_hook`` (``TransitionHook``) sees every trigger the engine fires.
    ``table`` is the table the engine interprets: ``BASE_TABLE`` (``TRANSITIONS``)
    unless the run declared steps (``core/steps.py``: ``table_for``); in a step's state
    the engine asks for the step (``RunStep``) and is answered by ``StepDecided``.

    The fields below are every attribute an engine holds, by role (a test fails for
    one that is not declared here). Configuration is fixed for the run and shared by
    forks. The record is what happened: copied by forks, left out of
    ``control_key`` because the engine never reads it back to decide. Control decides
    what happens next: copied and keyed. Transient fields are set only while
    ``handle`` runs.

    A field with a value here is set on an engine only once it changes: most runs are
    never aborted, denied or stopped, and ask for no final result, so their engines
    hold a third fewer attributes, small enough for Python to keep each engine's
    attribute table compact (it shares its keys with the class).
    """

    # configuration
    _tools: tuple[ToolDefinition, ...]
    _tools_by_name: dict[str, ToolDefinition]
    _scheduling: dict[str, Scheduling]
    max_turns: int
    usage_limits: UsageLimits | None
    output: OutputSpec | None  # the final-result tool and its retries (rule 13)
    # the tools whose budget of retry requests in a row is not the default (rule 14)
    tool_retries: Mapping[str, int] = _NO_RETRIES
    check_permissions: bool
    check_continue: bool
    run_id: str
    transition_hook: TransitionHook | None
    # The rows interpreted: BASE_TABLE, or one with a team's steps (then set on the
    # engine, with its steps; a run without steps keeps the class's values).
    table: Table = BASE_TABLE
    _steps: tuple[StepSpec, ...] = ()
    _logger: Any  # the logger given (None: the library's)
    # It, the run id bound: bound at once if it keeps debug or info events, else when a
    # warning needs it (most runs log nothing; a bound logger per waiting run adds up).
    _log: Any = None
    _debug: bool  # whether the logger keeps debug events (the transition log)
    _info: bool  # whether it keeps info events (the end of the run)
    # record
    _history: list[Message]
    trace: Trace
    explanation: str | None = None
    _seen_ids: set[str]  # every tool-call id so far, only to rename repeats
    # control
    _state: State
    turns: int
    usage: Usage  # what the provider reported on this run's responses, summed
    delegated_requests: int = 0  # model calls of sub-agents whose usage joined the run's
    tool_calls: int = 0  # tool calls started, for UsageLimits.tool_calls
    _tool_failures: Mapping[str, int] = _NO_RETRIES  # retry requests in a row, per tool
    _retries_spent: tuple[str, str] | None = None  # (tool, its last message) past budget
    abort_reason: str | None = None
    _abort_context: str = ""  # where the abort found the run, for the explanation
    _abandoned: tuple[str, ...] = ()  # operations the driver gave up on, still running
    _model_outstanding: bool
    _batch: Batch
    _queue: InputQueue
    _denial: tuple[ToolCall, str] | None = None  # a policy denial, until AwaitingUser tells it
    _continue_pending: bool = False  # a CheckContinue is out, not yet answered
    _stop_reason: str | None = None  # should_continue asked to stop, with this reason
    output_call: str | None = None  # the id of the final-result call that gave the output
    _output_failures: int = 0  # failed attempts at the final result
    _output_error: str | None = None  # why the last attempt failed
    _output_remind: bool = False  # ask for the final-result tool before the next call
    _step_decision: tuple[str, str] | None = None  # a step's (outcome, message)
    _step_retries: tuple[tuple[str, int], ...] = ()  # retries each step's outcomes spent
    # transient
    _event: Event | None  # the engine event being handled
    _actions: list[Action]  # what the event's entry effects asked for

    def __init__(
        self,
        *,
        tools: Sequence[ToolDefinition],
        messages: Sequence[Message],
        max_turns: int = 8,
        usage_limits: UsageLimits | None = None,
        output: OutputSpec | None = None,
        check_permissions: bool = False,
        check_continue: bool = False,
        scheduling: Mapping[str, Scheduling] | None = None,
        run_id: str = "run",
        logger: Any = None,
        transition_hook: TransitionHook | None = None,
        table: Table = BASE_TABLE,
        tool_retries: Mapping[str, int] | None = None,
    ) -> None:
        positive_int("max_turns", max_turns)
        checked = check_tool_definitions(tools)
        self._setup(
            tools=checked,
            history=check_history(messages),
            max_turns=max_turns,
            usage_limits=check_usage_limits(usage_limits),
            output=check_output(output, {d.name for d in checked}),
            check_permissions=check_permissions,
            check_continue=check_continue,
            scheduling=scheduling,
            run_id=run_id,
            logger=logger,
            transition_hook=transition_hook,
            initial=INITIAL,
            table=table,
        )
        if tool_retries:
            # A read-only mapping (the driver shares one among runs) is kept as it is.
            if not isinstance(tool_retries, MappingProxyType):
                tool_retries = MappingProxyType(check_tool_retries(tool_retries))
            self.tool_retries = tool_retries

    def _setup(
        self,
        *,
        tools: tuple[ToolDefinition, ...],
        history: list[Message],
        max_turns: int,
        usage_limits: UsageLimits | None,
        output: OutputSpec | None,
        check_permissions: bool,
        check_continue: bool,
        scheduling: Mapping[str, Scheduling] | None,
        run_id: str,
        logger: Any,
        transition_hook: TransitionHook | None,
        initial: State,
        table: Table = BASE_TABLE,
    ) -> None:
        """Set every field without a default (see the class docstring); ``restore``
        then loads progress."""
        self._set_table(table)
        self._tools = tools
        self._tools_by_name = {d.name: d for d in tools}
        self.output = output
        if output is not None and not output.native:  # native: no tool (core/output.py)
            self._tools_by_name.update((d.name, d) for d in output.tools)
        self._scheduling = dict(scheduling or {})
        self.max_turns = max_turns
        self.usage_limits = usage_limits
        self.check_permissions = check_permissions
        self.check_continue = check_continue
        self.run_id = run_id
        self.transition_hook = transition_hook
        self._logger = logger
        log = (logger if logger is not None else library_logger()).bind(run_id=run_id)
        self._debug = _enabled(log, logging.DEBUG)
        self._info = _enabled(log, logging.INFO)
        if self._debug or self._info:
            self._log = log  # used at every transition or at the end of the run
        self._history = history
        self.trace = Trace()
        self._seen_ids = {
            c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls
        }
        self._state = initial
        self.turns = 0
        self.usage = _NO_USAGE
        self._model_outstanding = False
        self._batch = Batch()
        self._queue = InputQueue()
        self._event = None
        self._actions = []

    def _set_table(self, table: Table) -> None:
        if table is not BASE_TABLE:
            self.table, self._steps = table, table.steps

    def _rows_from(self, state: State, trigger: Trigger) -> tuple[Transition, ...]:
        # The base table through the module's own function: it reads the rows as the
        # module holds them now (a test may install other rows there).
        if self.table is BASE_TABLE:
            return rows_from(state, trigger)
        return self.table.rows_from(state, trigger)

    def _triggers_from(self, state: State) -> Mapping[Trigger, tuple[Transition, ...]]:
        if self.table is BASE_TABLE:
            return triggers_from(state)
        return self.table.triggers_from(state)

    def _bound_log(self) -> Any:
        """The logger, the run id bound (for a warning: bound now if not yet)."""
        if self._log is None:
            base = self._logger if self._logger is not None else library_logger()
            self._log = base.bind(run_id=self.run_id)
        return self._log

    # -- what the caller reads -----------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def requests(self) -> int:
        """The model calls the usage limits count: this run's turns and the calls of
        the sub-agents whose usage joined it."""
        return self.turns + self.delegated_requests

    @property
    def messages(self) -> HistoryView:
        """The history so far, as an O(1) read-only snapshot."""
        return HistoryView(self._history)

    @property
    def tools(self) -> tuple[ToolDefinition, ...]:
        return self._tools

    @property
    def returns_to_caller(self) -> bool:
        """True in a state where a driver stops and returns its result: a terminal
        state, or ``AwaitingUser`` (which a run resumes from)."""
        return self._state in self._returns()

    def _returns(self) -> frozenset[State]:
        # The base table's through the module's own names (read now, as the rows are).
        return RETURNS_TO_CALLER if self.table is BASE_TABLE else self.table.returns_to_caller

    def _absorbing(self) -> frozenset[State]:
        return ABSORBING if self.table is BASE_TABLE else self.table.terminal

    def pending_step(self) -> StepSpec | None:
        """The declared step the run waits for now (it is in the step's state)."""
        if type(self._state) is not DeclaredState:
            return None
        return step_named(self._steps, self._state)

    def step_retries(self, step: str) -> int:
        """How many times ``step``'s retries sent the run back to the model."""
        return dict(self._step_retries).get(step, 0)

    @property
    @deprecated(
        "Engine.is_finished is deprecated: use Engine.returns_to_caller (true in "
        "AwaitingUser too), or Engine.state.is_terminal to ask whether the run has ended"
    )
    def is_finished(self) -> bool:
        """Deprecated alias of ``returns_to_caller`` (true in ``AwaitingUser`` too,
        which is not finished). To ask whether the run has ended, use
        ``engine.state.is_terminal``."""
        return self._state in self._returns()

    def queued_input(self) -> tuple[InputQueued, ...]:
        """Queued input not yet injected: steering first, then follow-ups, each in order.

        Nothing queued is lost when a run ends: this is what a caller re-queues."""
        return self._queue.queued()

    def pending_calls(self) -> tuple[ToolCall, ...]:
        """Calls of the current batch that have no result yet, in call order."""
        return self._batch.pending_calls()

    def pending_approvals(self) -> tuple[tuple[ToolCall, str], ...]:
        """Calls waiting for a person's approval, with the hook's reason."""
        return self._batch.pending_approvals()

    # -- handling an event -----------------------------------------------------------

    def handle(self, event: Event) -> tuple[Action, ...]:
        """Apply one engine event; return the actions it calls for.

        Raises ``ProtocolError`` (changing nothing) if the event is not accepted now.
        """
        trigger = getattr(event, "trigger", None)
        if not isinstance(trigger, Trigger) or trigger in INTERNAL_TRIGGERS:
            raise ProtocolError(f"not an engine event: {event!r}")
        state = self._state
        if state in self._absorbing():
            if self._debug:
                self._log.debug(
                    "event_absorbed", turn=self.turns, state=state.value, trigger=trigger.value
                )
            return ()
        rows = self._rows_from(state, trigger)
        if not rows:
            accepted = sorted(
                t.value for t in self._triggers_from(state) if t not in INTERNAL_TRIGGERS
            )
            raise ProtocolError(
                f"{trigger.value!r} is not accepted in state {state.value}; "
                f"accepted here: {', '.join(accepted) or 'nothing'}"
            )
        self._check_payload(event)
        self._actions.clear()  # left by an event whose handling raised
        self._event = event
        try:
            self._record(event)
            self._fire(rows)
            self._settle()
        finally:
            self._event = None
        actions = tuple(self._actions)
        self._actions.clear()
        return actions

    def _check_payload(self, event: Event) -> None:
        """Refuse events whose data does not fit the bookkeeping; change nothing."""
        if isinstance(event, (ToolFinished, ToolCancelled)):
            self._expect_slot(event.call_id, RUNNING, event.trigger)
        elif isinstance(event, (ModelResponded, ModelFailed, ModelCancelled)):
            if not self._model_outstanding:
                raise ProtocolError(f"{event.trigger.value}: no model call is outstanding")
            if isinstance(event, ModelCancelled) and self._state is not S.ABORTING:
                raise ProtocolError("model_cancelled is accepted only while aborting")
        elif isinstance(event, (ToolPermitted, ToolDenied, ApprovalRequired)):
            self._expect_slot(event.call_id, WAITING_PERMISSION, event.trigger)
        elif isinstance(event, ApprovalDecided):
            self._expect_slot(event.call_id, WAITING_APPROVAL, event.trigger)
        elif isinstance(event, ContinueDecided) and not self._continue_pending:
            raise ProtocolError("continue_decided: no should_continue check is pending")
        elif isinstance(event, StepDecided):
            self._check_step_decision(event)

    def _check_step_decision(self, event: StepDecided) -> None:
        step = self.pending_step()  # there: only a step's state has step_decided rows
        assert step is not None
        if event.step != step.name:
            raise ProtocolError(
                f"step_decided: the run waits for {step.name!r}, not {event.step!r}"
            )
        if step.destination(event.outcome) is None:
            declared = ", ".join(name for name, _ in step.outcomes)
            raise ProtocolError(
                f"step_decided: {step.name!r} has no outcome {event.outcome!r} "
                f"(declared: {declared})"
            )
        if len(event.message) > MAX_STEP_MESSAGE_CHARS:
            raise ProtocolError(
                f"step_decided: the message of {step.name!r} has {len(event.message)} "
                f"characters; at most {MAX_STEP_MESSAGE_CHARS}"
            )

    def _expect_slot(self, call_id: str, status: str, trigger: Trigger) -> None:
        slot = self._batch.by_id.get(call_id)
        if slot is None or slot.status != status:
            actual = "not in the current batch" if slot is None else slot.status
            raise ProtocolError(
                f"{trigger.value}: call {call_id!r} is not {status} (it is {actual})"
            )

    def _record(self, event: Event) -> None:
        """Record the event's data; what depends on the destination comes on entry.

        Every event that answers a call flushes the results now in order (I2)."""
        state = self._state
        if isinstance(event, ToolFinished):
            slot = self._batch.by_id[event.call_id]  # there: _check_payload made sure
            call, output = slot.call, event.output
            slot.result = checked_result(call.id, call.name, output.content, output.is_error)
            if output.usage is not None or output.requests:  # a sub-agent's, joining (limits)
                self.usage = self.usage + (output.usage or _NO_USAGE)
                self.delegated_requests += output.requests
            if output.retry or call.name in self._tool_failures:
                self._count_retry(call.name, output)
            slot.status = DONE
            if state is S.COLLECTING_RESULTS and len(self._batch.slots) > 1:
                self._start_runnable()  # the calls this one held back (a lone call held none)
            self._flush()
        elif isinstance(event, ModelResponded):
            self._record_response(event.message)
        elif isinstance(event, (ModelFailed, ModelCancelled)):
            self._record_model_error(event)
        elif isinstance(event, InputQueued):
            self._record_input(event)
        elif isinstance(event, (ToolPermitted, ToolDenied, ApprovalRequired, ApprovalDecided)):
            self._record_decision(event)
            self._flush()
        elif isinstance(event, ToolCancelled):
            slot = self._batch.by_id[event.call_id]  # there: _check_payload made sure
            if event.reason.startswith(ABANDONED):
                self._abandoned += (f"tool {slot.call.name} (call {slot.call.id})",)
            slot.answer(f"Operation aborted: {event.reason}", is_error=True)
            self._flush()
        elif isinstance(event, ContinueDecided):
            self._continue_pending = False
            if event.stop:
                self._stop_reason = event.reason or "should_continue asked to stop"
        elif isinstance(event, StepDecided):
            self._step_decision = (event.outcome, event.message)
        elif isinstance(event, AbortRequested) and self.abort_reason is None:
            self.abort_reason = event.reason

    def _record_response(self, message: AssistantMessage) -> None:
        """The assistant message enters history first (rule 1); its calls open a batch.
        The usage it reports is added to the run's (none: zero tokens)."""
        self._model_outstanding = False
        if message.usage is not None:
            self.usage = self.usage + message.usage
        calls = message.tool_calls
        if not self._ids_are_new(calls):
            message = self._renamed_ids(message)
            calls = message.tool_calls
        self._history.append(message)
        self._batch.reset(calls)
        output = self.output
        if output is not None and output.accepts(message) and self._state is S.AWAITING_MODEL:
            self.output_call = self.output_call or TEXT_OUTPUT  # native: the text (rule 13)
        if self._state is S.ABORTING:
            self._answer_unresolved("Tool call not started: the run was aborted")

    def _record_model_error(self, event: ModelFailed | ModelCancelled) -> None:
        self._model_outstanding = False
        detail = event.error if isinstance(event, ModelFailed) else event.reason
        if isinstance(event, ModelCancelled) and detail.startswith(ABANDONED):
            self._abandoned += ("the model call",)
        if self._state is S.ABORTING:
            stop, text = StopReason.ABORTED, f"The model call was aborted: {detail}"
        else:
            stop, text = StopReason.ERROR, f"The model call failed: {detail}"
        self._history.append(AssistantMessage((), stop_reason=stop, error_message=text))

    def _record_input(self, event: InputQueued) -> None:
        if self._state is S.AWAITING_USER:
            # A person answered with a message instead of deciding: the calls that
            # waited for approval are answered, and the message goes to the model.
            self._answer_unresolved(
                "Tool call not run: it was not approved (the user sent a message instead)"
            )
            self._queue.add(event.message, InputKind.STEER)
        else:
            self._queue.add(event.message, event.kind)

    def _record_decision(
        self, event: ToolPermitted | ToolDenied | ApprovalRequired | ApprovalDecided
    ) -> None:
        """A permission hook's or a person's answer about one call."""
        slot = self._batch.by_id[event.call_id]  # there: _check_payload made sure
        if isinstance(event, ToolPermitted):
            slot.status = READY
        elif isinstance(event, ToolDenied):
            slot.answer(f"Tool call denied: {event.reason}", is_error=True)
            if not event.advisory and self._denial is None:
                self._denial = (slot.call, event.reason)
        elif isinstance(event, ApprovalRequired):
            slot.status = WAITING_APPROVAL
            slot.note = event.reason
        elif event.approved:
            slot.status = READY
        else:
            reason = f": {event.reason}" if event.reason else ""
            slot.answer(f"Tool call denied by a person{reason}", is_error=True)

    # -- applying the table ----------------------------------------------------------------

    def _fire(self, rows: tuple[Transition, ...], holds: RowGuard | None = None) -> None:
        """Take the first of ``rows`` (the rows of one state and trigger, in table order)
        whose guard holds: tell the transition hook, move to the row's destination,
        record the transition, and run the destination's entry effect when the state
        changes. ``holds``: a guard known to hold (the one that fired an internal
        trigger), not asked again."""
        for row in rows:
            if row.guard is None or row.guard is holds or self.guard_holds(row.guard):
                break
        else:
            self._no_row(rows[0].source, rows[0].trigger)
        source, trigger, dest = row.source, row.trigger, row.dest
        if self.transition_hook is not None:
            self.transition_hook(self, source, trigger, dest)
        self._state = dest
        self.trace.add(source, trigger, dest, self.turns)
        if self._debug:
            self._log.debug(
                "transition",
                turn=self.turns,
                from_state=source.value,
                to_state=dest.value,
                trigger=trigger.value,
            )
        if dest is not source:
            entry = _ENTRY_METHOD.get(dest)
            if entry is None:
                self._declared_entry(dest, source)
            else:
                getattr(self, entry)(source)
            if type(source) is DeclaredState and not dest.is_terminal:
                self._step_decision = None  # the step's decision is spent

    def _no_row(self, source: State, trigger: Trigger) -> NoReturn:
        # Unreachable when the table is complete (the checker proves it); kept so that a
        # broken table fails loudly instead of silently stalling.
        if self.transition_hook is not None:
            self.transition_hook(self, source, trigger, None)
        raise ProtocolError(f"no row of the table applies to {trigger.value!r} in {source}")

    def _settle(self) -> None:
        """Fire internal triggers while one is due (a fixed point).

        Each firing leaves its source state, and the internal triggers form no cycle
        without an input in between (DispatchingTools -> CollectingResults ->
        TurnBoundary -> AwaitingModel waits for the model), so this ends; the cap turns
        a broken table or guard into an error that shows the loop instead of a hang."""
        fired = 0
        while True:
            # The internal trigger due now: the first with rows from this state whose
            # firing guard holds.
            rows_here = self._triggers_from(self._state)
            for trigger, guard in INTERNAL_TRIGGERS.items():
                if trigger in rows_here and self.guard_holds(guard):
                    break
            else:
                return  # none is due: settled
            if fired == MAX_INTERNAL_TRANSITIONS:
                self._runaway(trigger, fired)
            self._fire(rows_here[trigger], holds=guard)
            fired += 1

    def _runaway(self, trigger: Trigger, fired: int) -> NoReturn:
        recent = self.trace[-(fired + 1) :]  # the input's own transition, then the rest
        shown = ", ".join(f"{r.source}-{r.trigger}->{r.dest}" for r in recent[-6:])
        raise EngineInvariantError(
            f"internal transitions do not settle: {fired} fired after one engine event and "
            f"{trigger} would fire again in {self._state} (a broken table or guard; "
            f"this engine cannot go on). Last transitions: {shown}",
            recent,
        )

    # -- the guards the table names (pure: asking one changes nothing) ----------------------

    def guard_holds(self, guard: RowGuard) -> bool:
        """Whether the table's ``guard`` holds now: its method ``_guard_<name>``, or
        for a step's row (``OutcomeIs``) the step's decision."""
        if type(guard) is OutcomeIs:
            return self._outcome_holds(guard)
        holds: bool = getattr(self, _GUARD_METHOD[guard])()  # type: ignore[index]
        return holds

    def _outcome_holds(self, guard: OutcomeIs) -> bool:
        decision = self._step_decision
        if decision is None or decision[0] != guard.outcome:
            return False
        if guard.spent is None:
            return True
        step = self.pending_step()
        dest = None if step is None else step.destination(guard.outcome)
        budget = dest.budget if isinstance(dest, Retry) else 0
        assert step is not None
        return (self.step_retries(step.name) >= budget) is guard.spent

    def _response(self) -> AssistantMessage:
        event = self._event
        assert isinstance(event, ModelResponded)
        return event.message

    def _guard_reports_error(self) -> bool:
        return self._response().stop_reason is StopReason.ERROR

    def _guard_reports_abort(self) -> bool:
        return self._response().stop_reason is StopReason.ABORTED

    def _guard_has_tool_calls(self) -> bool:
        return bool(self._batch.slots)

    def _guard_input_queued(self) -> bool:
        return bool(self._queue)

    def _guard_all_calls_resolved(self) -> bool:
        return not self._batch.any_with(WAITING_PERMISSION)

    def _guard_nothing_running(self) -> bool:
        return not self._batch.any_with(RUNNING)

    def _guard_approvals_pending(self) -> bool:
        return self._batch.any_with(WAITING_APPROVAL)

    def _guard_boundary_ready(self) -> bool:
        return not self._continue_pending

    def _guard_denied_by_policy(self) -> bool:
        return self._denial is not None

    def _guard_stop_requested(self) -> bool:
        return self._stop_reason is not None

    def _guard_turn_limit_reached(self) -> bool:
        return self.turns >= self.max_turns

    def _guard_usage_limit_reached(self) -> bool:
        limits = self.usage_limits
        return (
            limits is not None
            and limits.reached(self.usage, self.requests, self.tool_calls) is not None
        )

    def _guard_output_missing(self) -> bool:
        return self.output is not None and self.output_call is None

    def _guard_output_accepted(self) -> bool:
        return self.output_call is not None

    def _guard_tool_retries_exhausted(self) -> bool:
        return self._retries_spent is not None

    def _guard_output_retries_exhausted(self) -> bool:
        return self.output is not None and self._output_failures > self.output.retries

    def _guard_nothing_outstanding(self) -> bool:
        return not self._model_outstanding and not self._batch.any_with(RUNNING)

    # -- the entry effects: what entering each state does ----------------------------------

    def _enter_AwaitingModel(self, source: State) -> None:
        if self._queue:
            self._history.extend(self._queue.take(model_would_finish=self._model_would_finish()))
        if self._output_remind and self.output is not None:
            self._history.append(UserMessage(self.output.reminder(self._output_error)))
            self._output_remind = False
        self.turns += 1
        self._model_outstanding = True
        self._batch.reset()
        offered = self._tools if self.output is None else self.output.offered(self._tools)
        self._actions.append(CallModel(HistoryView(self._history), offered, self.turns))

    def _enter_DispatchingTools(self, source: State) -> None:
        output = self.output
        refused = False
        if output is not None:  # the final-result calls first: they decide the others' fate
            for slot in self._batch.slots:
                if output.owns(slot.call.name):
                    self._resolve_output(slot, self._refusal(slot.call))
                    refused = True
        early = output is not None and output.end_strategy == "early" and bool(self.output_call)
        for slot in self._batch.slots:
            if slot.result is not None:  # a final-result call, answered above
                continue
            if early:  # rule 13: the run has its output; nothing else runs
                slot.answer(NOT_RUN_EARLY, is_error=True)
                refused = True
                continue
            refusal = self._refusal(slot.call)
            if refusal is None:
                refusal = self._over_tool_call_limit()
            if refusal is not None:
                slot.answer(refusal, is_error=True)
                refused = True
                continue
            scheduling = self._scheduling.get(slot.call.name)
            if scheduling is not None:  # without one, a call runs beside everything
                slot.classify(scheduling, self._bound_log)
            if self.check_permissions:
                slot.status = WAITING_PERMISSION
                self._actions.append(CheckPermission(slot.call, self.turns))
        if refused:
            self._flush()  # the refusals that are next in call order

    def _over_tool_call_limit(self) -> str | None:
        """Why a valid call is not run: the run's tool-call limit is reached (else it
        counts, and ``None``)."""
        limit = None if self.usage_limits is None else self.usage_limits.tool_calls
        if limit is not None and self.tool_calls >= limit:
            return f"Tool call not run: the run's tool_calls limit ({limit}) is reached."
        if limit is not None:  # counted only where a limit reads it
            self.tool_calls += 1
        return None

    def _count_retry(self, tool: str, output: ToolOutput) -> None:
        """Count a retry request of ``tool`` (rule 14): in a row, against its budget."""
        failures = dict(self._tool_failures)
        if not output.retry:
            if tool not in failures:
                return
            del failures[tool]
        else:
            failures[tool] = failures.get(tool, 0) + 1
            if failures[tool] > self.retry_budget(tool) and self._retries_spent is None:
                text = "\n".join(b.text for b in output.content if isinstance(b, TextContent))
                self._retries_spent = (tool, text)
        self._tool_failures = failures

    def retry_budget(self, tool: str) -> int:
        """How many retry requests in a row ``tool`` may make (rule 14)."""
        return self.tool_retries.get(tool, DEFAULT_TOOL_RETRIES)

    def tool_failures(self, tool: str) -> int:
        """The retry requests ``tool`` made in a row so far (rule 14)."""
        return self._tool_failures.get(tool, 0)

    def _resolve_output(self, slot: CallSlot, refusal: str | None) -> None:
        """A final-result call, answered by the engine itself (rule 13)."""
        assert self.output is not None  # only a run with an output has the tool
        if refusal is None and self.output_call is None:
            # the type's own judgement, once the schema holds (core/output.py)
            problem = self.output.judged(thaw_json(slot.call.arguments), slot.call.name)
            if problem is not None:
                refusal = f"Invalid final result for {slot.call.name}: {problem}"
        if refusal is not None:
            self._output_failures += 1
            self._output_error = refusal
            slot.answer(refusal, is_error=True)
        elif self.output_call is None:
            self.output_call = slot.call.id
            slot.answer(OUTPUT_ACCEPTED, is_error=False)
        else:
            slot.answer("Not used: a final result was already accepted.", is_error=True)

    def _enter_CollectingResults(self, source: State) -> None:
        self._start_runnable()

    def _enter_TurnBoundary(self, source: State) -> None:
        if type(source) is DeclaredState:
            self._retried(source)
        if source is S.AWAITING_MODEL and self.output is not None and self.output_call is None:
            # A final text answer where a final result is required: one failed attempt.
            self._output_failures += 1
            last = self._history[-1]
            assert isinstance(last, AssistantMessage)  # the final answer just recorded
            self._output_error = self.output.missed(last)
            self._output_remind = True
        if self.check_continue:
            self._continue_pending = True
            self._actions.append(CheckContinue(self.turns))

    def _retried(self, source: State) -> None:
        """A step's retry (the only row from a step's state to the turn boundary): its
        message goes to the model after the answer it rejects (I2), one retry is spent,
        and an accepted final result is given up: the model must give it again."""
        step = step_named(self._steps, source)
        assert step is not None
        assert self._step_decision is not None
        outcome, message = self._step_decision
        if not message:
            message = f"The answer was not accepted ({step.name}: {outcome}). Try again."
        self._history.append(UserMessage(message))
        spent = dict(self._step_retries)
        spent[step.name] = spent.get(step.name, 0) + 1
        self._step_retries = tuple(sorted(spent.items()))
        self.output_call = None

    def _declared_entry(self, dest: State, source: State) -> None:
        """Entering a state a team declared: a step's (ask for the step) or an end."""
        assert isinstance(dest, DeclaredState)
        if not dest.terminal:
            step = step_named(self._steps, dest)
            assert step is not None
            self._actions.append(RunStep(step.name, self.turns))
            return
        step = step_named(self._steps, source)
        decision = self._step_decision
        assert step is not None
        assert decision is not None
        outcome, message = decision
        said = f": {message}" if message else ""
        self._finish(f"{dest.doc} (the step {step.name} answered {outcome}{said})")

    def _enter_Aborting(self, source: State) -> None:
        reason = self.abort_reason or "aborted"
        self._answer_unresolved(f"Tool call not started: the run was aborted ({reason})")
        running = self._batch.running_ids()
        self._actions.append(CancelOperations(self._model_outstanding, running, reason))
        self._abort_context = (
            f"during the model call of turn {self.turns}"
            if self._model_outstanding
            else f"while the tool calls of turn {self.turns} were "
            + ("running" if source is S.COLLECTING_RESULTS else "being dispatched")
        )

    def _enter_Done(self, source: State) -> None:
        if self.output_call is not None and self._stop_reason is None:
            self._finish(explain.output_accepted(self.output_call))
        elif source is S.TURN_BOUNDARY:  # should_continue's stop wins the row (rule 7)
            self._finish(explain.stopped_by_hook(self._stop_reason))
        else:
            self._finish(explain.final_answer())

    def _enter_Failed(self, source: State) -> None:
        last = self._history[-1]  # the error message, made by the model or by _record
        detail = last.error_message if isinstance(last, AssistantMessage) else None
        from_response = isinstance(self._event, ModelResponded)
        if from_response:
            self._answer_unresolved(
                "Tool call not run: the model's response reported an error, so its "
                "arguments may be incomplete"
            )
        self._finish(explain.failed(detail, reported_by_response=from_response, turn=self.turns))

    def _enter_Aborted(self, source: State) -> None:
        if source is S.AWAITING_MODEL:
            last = self._history[-1]  # the aborted response, before its calls' results
            detail = last.error_message if isinstance(last, AssistantMessage) else None
            self._answer_unresolved(
                "Tool call not run: the model's response was aborted, so its arguments "
                "may be incomplete"
            )
            self._finish(explain.aborted_response(detail, self.turns))
            return
        reason = self.abort_reason or "aborted"
        self._answer_unresolved(f"Tool call not started: the run was aborted ({reason})")
        where_known: dict[State, str] = {
            S.ABORTING: self._abort_context,
            S.READY: "before the first model call",
            S.TURN_BOUNDARY: f"at the turn boundary after turn {self.turns}",
            S.AWAITING_USER: "while waiting for a person",
        }
        where = where_known.get(source) or f"while the step {source} ran after turn {self.turns}"
        self._finish(explain.aborted(where, reason, self._abandoned))

    def _enter_TurnLimitExceeded(self, source: State) -> None:
        slots = self._batch.slots
        last_result = slots[-1].result if slots else None
        self._finish(explain.turn_limit(self.max_turns, last_result, len(self._queue)))

    def _enter_UsageLimitExceeded(self, source: State) -> None:
        assert self.usage_limits is not None  # the guard that leads here says so
        reached = self.usage_limits.reached(self.usage, self.requests, self.tool_calls)
        assert reached is not None
        slots = self._batch.slots
        last_result = slots[-1].result if slots else None
        self._finish(
            explain.usage_limit(reached, self.usage, self.turns, last_result, len(self._queue))
        )

    def _enter_ToolRetriesExceeded(self, source: State) -> None:
        assert self._retries_spent is not None  # the guard that leads here says so
        tool, message = self._retries_spent
        self._finish(explain.tool_retries(tool, self.retry_budget(tool), message))

    def _enter_OutputInvalid(self, source: State) -> None:
        assert self.output is not None  # the guard that leads here says so
        self._finish(
            explain.output_invalid(self.output.retries, self._output_failures, self._output_error)
        )

    def _enter_AwaitingUser(self, source: State) -> None:
        pending = self.pending_approvals()
        if pending:
            self._finish(explain.waiting_for_approval(pending))
            return
        assert self._denial is not None
        call, reason = self._denial
        self._denial = None  # told once: a person's answer goes on with the run
        self._finish(explain.denied_by_policy(call, reason))

    # -- what the entry effects share -------------------------------------------------------

    def _finish(self, explanation: str) -> None:
        """Entering a state that returns to the caller: explain it, announce it."""
        self.explanation = explanation
        self._actions.append(ReturnToCaller(self._state, explanation))
        if self._info:
            self._log.info(
                "run_ended", turn=self.turns, state=self._state.value, explanation=explanation
            )

    def _flush(self) -> None:
        """Append the results that are next in call order (I2)."""
        self._history.extend(self._batch.flush())

    def _answer_unresolved(self, text: str) -> None:
        """Give every call that never started a result saying why (I1, I6)."""
        self._batch.answer_unstarted(text)
        self._flush()

    def _start_runnable(self) -> None:
        """Start every call that may run now (rule 4)."""
        for call in self._batch.start_runnable():
            self._actions.append(StartTool(call, self.turns))

    def _model_would_finish(self) -> bool:
        # Only a final answer ends a run: the last message is the model's, without a tool
        # call. A user message after it (a continued conversation, steering) or a tool
        # result still awaits the model's answer, as a run's first message does.
        last = self._history[-1] if self._history else None
        return isinstance(last, AssistantMessage) and not last.tool_calls

    def _refusal(self, call: ToolCall) -> str | None:
        """Why a call cannot be run at all (an unknown tool, arguments that do not
        parse or do not match the schema), as the result the model reads; ``None``
        for a call that can run."""
        definition = self._tools_by_name.get(call.name)
        if definition is None:
            if not self._tools_by_name:
                return f"Unknown tool: {call.name}. No tools are available in this run."
            names = ", ".join(self._tools_by_name)  # the run's final-result tool too
            return f"Unknown tool: {call.name}. Available tools: {names}."
        if call.parse_error is not None:
            # Checked before the schema: empty arguments may satisfy it, and the model
            # asked for something else that nobody could read.
            return (
                f"Invalid arguments for tool {call.name}: {call.parse_error.rstrip('.')}. "
                "The tool was not run. Call it again with a JSON object matching this "
                f"JSON Schema: {_schema_text(definition)}"
            )
        problems = validate_arguments(definition, call.arguments)
        if problems:
            return (
                f"Invalid arguments for tool {call.name}:\n"
                + "\n".join(f"- {p}" for p in problems)
                + f"\nExpected arguments matching this JSON Schema: {_schema_text(definition)}"
            )
        return None

    def _ids_are_new(self, calls: tuple[ToolCall, ...]) -> bool:
        """Whether every call has an id no call had before (and records them if so)."""
        ids = {call.id for call in calls}
        if len(ids) == len(calls) and "" not in ids and self._seen_ids.isdisjoint(ids):
            self._seen_ids |= ids
            return True
        return False

    def _renamed_ids(self, message: AssistantMessage) -> AssistantMessage:
        """The message with empty or repeated tool-call ids given a unique,
        deterministic replacement."""
        seen = self._seen_ids
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
        self._bound_log().warning(
            "tool_call_id_normalised",
            turn=self.turns,
            original=call.id,
            assigned=new_id,
            reason="empty" if not call.id else "repeated",
        )
        return new_id

    # -- copying and comparing ---------------------------------------------------------------

    def fork(self) -> Self:
        """An independent engine in exactly this state: what one does never shows in
        the other.

        Messages, calls and records are immutable and shared; every container is
        copied, and so is each call's bookkeeping. The fork is of the same class; the
        lists, dicts and sets a subclass adds are copied (shallowly) and its other
        attributes shared: a subclass with deeper state of its own overrides ``fork``.
        A search keeps a fork of every state it still has to expand.
        """
        new = object.__new__(type(self))
        fields = new.__dict__
        fields.update(self.__dict__)
        fields["_history"] = list(self._history)
        fields["trace"] = self.trace.copy()
        fields["_seen_ids"] = set(self._seen_ids)
        fields["_batch"] = self._batch.copy()
        fields["_queue"] = self._queue.copy()
        fields["_actions"] = list(self._actions)
        if "_tool_failures" in fields:  # set only once a tool asked for a retry
            fields["_tool_failures"] = dict(self._tool_failures)
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
            self.usage_limits,
            self.check_permissions,
            self.check_continue,
            self.usage,
            self.delegated_requests,
            self.tool_calls,
            tuple(sorted(self._tool_failures.items())),
            self._retries_spent,
            self.abort_reason,
            self._abort_context,
            self._abandoned,
            self._model_outstanding,
            tuple(_slot_key(slot) for slot in self._batch),
            self._batch.flushed,
            None if self._denial is None else (self._denial[0].id, self._denial[1]),
            tuple(_rendered(m) for m in self._queue.steer),
            tuple(_rendered(m) for m in self._queue.follow_up),
            self._continue_pending,
            self._stop_reason,
            self._step_decision,
            self._step_retries,
            None if self.output is None else self.output.retries,  # the schema: as tools
            self.output_call,
            self._output_failures,
            self._output_error,
            self._output_remind,
            _extra_key(self.__dict__),
        )

    # -- snapshot and restore (suspension across processes; see core/snapshot.py) ----------

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
        data = _snapshot.write(self)
        return data if key is None else _snapshot.sign(data, key)

    @staticmethod
    def sign_snapshot(snapshot: Mapping[str, Any], key: bytes | str) -> dict[str, Any]:
        """A copy of ``snapshot`` with a ``signature`` field: ``"hmac-sha256:<hex>"``
        over its canonical JSON (sorted keys, no spaces, ASCII only, without the
        ``signature`` field). For a snapshot made without a key, such as
        ``RunResult.snapshot``, before it leaves the process."""
        return _snapshot.sign(snapshot, key)

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
        transition_hook: TransitionHook | None = None,
        table: Table = BASE_TABLE,
    ) -> Self:
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

        A snapshot of a run with declared steps is restored with the run's ``table``
        (``core/steps.py``: ``table_for``), and only with it.

        With ``key``, the signature must be the one ``snapshot(key=...)`` writes, or
        ``SnapshotSignatureError`` is raised. Without a key a snapshot is trusted as
        far as it agrees with itself: whoever can edit it can also edit the history
        consistently, so store it where only you can write, or sign it.
        """
        engine = cls.__new__(cls)
        _snapshot.read(
            engine,
            snapshot,
            scheduling=scheduling,
            logger=logger,
            key=key,
            max_bytes=max_bytes,
            max_depth=max_depth,
            transition_hook=transition_hook,
            table=table,
        )
        return engine


def _schema_text(definition: ToolDefinition) -> str:
    """A tool's JSON Schema as the model reads it in a refusal."""
    return json.dumps(definition.schema_dict(), sort_keys=True)


# -- the roles of the fields, and the parts of a control key ---------------------------------

_DECLARED: Final = frozenset(Engine.__annotations__)
CONFIGURATION: Final = frozenset(
    {
        "_tools",
        "_tools_by_name",
        "_scheduling",
        "max_turns",
        "usage_limits",
        "output",
        "tool_retries",
        "check_permissions",
        "check_continue",
        "run_id",
        "transition_hook",
        "table",
        "_steps",
        "_logger",
        "_log",
        "_debug",
        "_info",
    }
)
RECORD: Final = frozenset({"_history", "trace", "explanation", "_seen_ids"})
TRANSIENT: Final = frozenset({"_event", "_actions"})
CONTROL: Final = _DECLARED - CONFIGURATION - RECORD - TRANSIENT

# The checker keys hundreds of thousands of engines, most sharing their messages: each
# immutable value's ``repr`` (which attrs writes from every field) is kept by identity,
# with the value itself so that its id cannot be reused while the entry exists.
# Bounded: cleared when full (a cache, not a store).
_REPRS: dict[int, tuple[object, str]] = {}
_REPRS_MAX: Final = 1 << 16


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
