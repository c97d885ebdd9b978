"""The sans-IO engine: engine events in, actions out. Read it beside ``core/table.py``.

The engine performs no I/O, reads no clock and draws no random number: the same
events give the same states, history and transition log (I5). It interprets the
table, and nothing else decides where a run goes. Everything it decides by is one
record, ``EngineState`` (``core/state.py``): the configuration, the history and the
transition log, the counters, the batch of calls, the queued input, the flags.
One engine event goes through ``handle`` like this:

1. In an absorbing (terminal) state, the event is logged and dropped (I4).
2. The rows for (state, the event's trigger) are read with ``Table.leaving``. None: the
   event is not accepted here, and ``ProtocolError`` is raised before anything
   changes (I8); so it is when the payload does not fit (the trigger's check in
   ``_ON_INPUT``: a result for a call that is not running...).
3. The event's data is recorded (the trigger's record in ``_ON_INPUT``: a message
   appended, a result stored).
4. ``_fire`` takes the first row whose guard holds (``GUARDS``: one plain function
   of the state record per ``Guard``), records the transition in ``trace`` and runs
   the destination's entry effect (``_ENTRIES``: e.g. entering ``AwaitingModel`` asks
   for a model call).
5. ``_settle`` fires the internal triggers (``INTERNAL_TRIGGERS``) that can fire from
   the state (``Leaving.internal``) while their guard holds, each again through
   ``_fire``, at most ``MAX_INTERNAL_TRANSITIONS`` times.

The actions the entry effects asked for are returned. The record holds its parts by
composition: the current ``Batch`` of tool calls (``core/batch.py``), the
``InputQueue`` of steering and follow-up messages (``core/queue.py``) and the
``Trace`` (``core/trace.py``). Snapshots of the record are written, read and checked
in ``core/snapshot.py``; the explanations a person reads are worded in
``core/explanations.py``.

A ``transition_hook`` given to an engine sees every trigger it fires; the test suite
and the exhaustive checker use it to hold the engine to a reference machine and to
the table's rules (see ``TransitionHook``). The engine never imports the
``transitions`` package.
"""

from __future__ import annotations

import functools
import json
import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Final,
    Generic,
    NoReturn,
    Self,
    TypeVar,
    overload,
)

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
    CallSlot,
)
from statemachine.core.checks import positive_int
from statemachine.core.events import (
    Action,
    CallModel,
    CancelOperations,
    CheckContinue,
    CheckPermission,
    HistoryView,
    InputKind,
    ReturnToCaller,
    RunStep,
    StartTool,
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
from statemachine.core.queue import NO_INPUT, InputQueue
from statemachine.core.snapshot import (
    DEFAULT_MAX_SNAPSHOT_BYTES,
    DEFAULT_MAX_SNAPSHOT_DEPTH,
    SNAPSHOT_VERSION,
)
from statemachine.core.state import NO_USAGE, EngineState
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
)
from statemachine.core.tools import (
    DEFAULT_TOOL_RETRIES,
    Scheduling,
    ToolDefinition,
    check_retry_budget,
    check_tool_retries,
    validate_arguments,
)
from statemachine.core.trace import Trace, TransitionRecord
from statemachine.errors import EngineInvariantError, ProtocolError

if TYPE_CHECKING:  # the engine reads an event through its trigger (_ON_INPUT)
    from statemachine.core.events import (
        AbortRequested,
        ApprovalDecided,
        ApprovalRequired,
        ContinueDecided,
        Event,
        InputQueued,
        ModelCancelled,
        ModelFailed,
        ModelResponded,
        StepDecided,
        ToolCancelled,
        ToolDenied,
        ToolFinished,
        ToolPermitted,
    )

__all__ = [
    "ABANDONED",
    "DEFAULT_MAX_SNAPSHOT_BYTES",
    "DEFAULT_MAX_SNAPSHOT_DEPTH",
    "GUARDS",
    "MAX_INTERNAL_TRANSITIONS",
    "SNAPSHOT_VERSION",
    "Engine",
    "EngineState",
    "GuardFunction",
    "TransitionHook",
    "TransitionRecord",
    "check_history",
    "check_tool_definitions",
]

S = TurnState
T = Trigger
G = Guard

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


# -- the guards the table names: plain functions of the state record --------------------------

GuardFunction = Callable[[EngineState], bool]
"""A guard: whether it holds for the run in this state (pure: asking changes nothing)."""


def _response_reports(stop: StopReason, run: EngineState) -> bool:
    # The rows that ask are those of model_responded: the response is the last message
    # of the history by then, since it enters history first (rule 1).
    last = run.history[-1] if run.history else None
    return isinstance(last, AssistantMessage) and last.stop_reason is stop


def _usage_limit_reached(run: EngineState) -> bool:
    limits = run.usage_limits
    return (
        limits is not None and limits.reached(run.usage, run.requests, run.tool_calls) is not None
    )


def _output_retries_exhausted(run: EngineState) -> bool:
    return run.output is not None and run.output_failures > run.output.retries


GUARDS: Final[Mapping[Guard, GuardFunction]] = MappingProxyType(
    {
        # The stop reason is bound once: reading a member off its enum class runs
        # Python code on CPython 3.11 (EnumType.__getattr__), and every turn asks these.
        G.REPORTS_ERROR: functools.partial(_response_reports, StopReason.ERROR),
        G.REPORTS_ABORT: functools.partial(_response_reports, StopReason.ABORTED),
        G.HAS_TOOL_CALLS: lambda run: bool(run.batch.slots),
        G.INPUT_QUEUED: lambda run: bool(run.queue),
        G.ALL_CALLS_RESOLVED: lambda run: not run.batch.any_with(WAITING_PERMISSION),
        G.NOTHING_RUNNING: lambda run: not run.batch.any_with(RUNNING),
        G.APPROVALS_PENDING: lambda run: run.batch.any_with(WAITING_APPROVAL),
        G.BOUNDARY_READY: lambda run: not run.continue_pending,
        G.DENIED_BY_POLICY: lambda run: run.denial is not None,
        G.STOP_REQUESTED: lambda run: run.stop_reason is not None,
        G.TURN_LIMIT_REACHED: lambda run: run.turns >= run.max_turns,
        G.USAGE_LIMIT_REACHED: _usage_limit_reached,
        G.OUTPUT_MISSING: lambda run: run.output is not None and run.output_call is None,
        G.OUTPUT_ACCEPTED: lambda run: run.output_call is not None,
        G.TOOL_RETRIES_EXHAUSTED: lambda run: run.retries_spent is not None,
        G.OUTPUT_RETRIES_EXHAUSTED: _output_retries_exhausted,
        G.NOTHING_OUTSTANDING: lambda run: (
            not run.model_outstanding and not run.batch.any_with(RUNNING)
        ),
    }
)
"""What each ``Guard`` of the table means, as a function of the state record."""


def step_retries(run: EngineState, step: str) -> int:
    """How many times ``step``'s retries sent the run back to the model."""
    return dict(run.step_retries).get(step, 0)


def outcome_holds(run: EngineState, guard: OutcomeIs) -> bool:
    """The guard of a step's row: the step answered ``guard.outcome`` (and, with
    ``spent``, its retry budget is spent or not)."""
    decision = run.step_decision
    if decision is None or decision[0] != guard.outcome:
        return False
    if guard.spent is None:
        return True
    step = run.pending_step()
    assert step is not None  # only a step's state has rows guarded by its outcomes
    dest = step.destination(guard.outcome)
    budget = dest.budget if isinstance(dest, Retry) else 0
    return (step_retries(run, step.name) >= budget) is guard.spent


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


V = TypeVar("V")


class _Field(Generic[V]):
    """An engine attribute that is the field of the same name of its state record:
    ``engine.turns`` is ``engine._run.turns``. A ``writable`` one is configuration a
    driver may set on an engine it made or restored, before handing it the next event
    (a hook it was not made with, a resumed run's new limits)."""

    _name: str
    _read: Callable[[EngineState], V]  # the field's getter, set with its name

    def __init__(self, *, writable: bool = False) -> None:
        self._writable = writable

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name
        self._read = operator.attrgetter(name)

    @overload
    def __get__(self, engine: None, owner: type) -> _Field[V]: ...

    @overload
    def __get__(self, engine: Engine, owner: type) -> V: ...

    def __get__(self, engine: Engine | None, owner: type) -> V | _Field[V]:
        if engine is None:
            return self
        return self._read(engine._run)

    def __set__(self, engine: Engine, value: V) -> None:
        if not self._writable:
            raise AttributeError(f"Engine.{self._name} is read-only")
        setattr(engine._run, self._name, value)


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

    What the run decides by is one record, ``EngineState`` (``core/state.py``), which
    declares each field with its role; the attributes below are the engine's own: the
    record, and what watches the run without deciding anything (a test fails for one
    that is not declared here). ``guards`` and the entry effects are class data, so a
    subclass (a deliberately broken engine of the tests) replaces one by name.
    """

    _run: EngineState  # everything the run decides by (core/state.py)
    transition_hook: TransitionHook | None
    _logger: Any  # the logger given (None: the library's)
    # It, the run id bound: bound at once if it keeps debug or info events, else when a
    # warning needs it (most runs log nothing; a bound logger per waiting run adds up).
    _log: Any = None
    _debug: bool  # whether the logger keeps debug events (the transition log)
    _info: bool  # whether it keeps info events (the end of the run)
    # What the event's entry effects asked for, while it is handled: a tuple, so that an
    # engine between events holds the empty one (no container the collector tracks).
    _actions: tuple[Action, ...]

    guards: ClassVar[Mapping[Guard, GuardFunction]] = GUARDS

    # The fields of the record a caller reads (and the configuration a driver may set).
    run_id = _Field[str]()
    table = _Field[Table]()
    tools = _Field[tuple[ToolDefinition, ...]]()
    tool_retries = _Field[Mapping[str, int]]()
    unknown_tool_retries = _Field[int | None]()
    max_turns = _Field[int](writable=True)
    usage_limits = _Field[UsageLimits | None](writable=True)
    output = _Field[OutputSpec | None](writable=True)  # the final-result tool (rule 13)
    check_permissions = _Field[bool](writable=True)
    check_continue = _Field[bool](writable=True)
    trace = _Field[Trace]()
    explanation = _Field[str | None]()
    state = _Field[State]()
    turns = _Field[int]()
    usage = _Field[Usage]()  # what the provider reported on this run's responses, summed
    delegated_requests = _Field[int]()  # model calls of sub-agents whose usage joined
    tool_calls = _Field[int]()  # tool calls asked, for UsageLimits.tool_calls
    output_failures = _Field[int]()  # failed attempts at the final result (rule 13)
    abort_reason = _Field[str | None]()
    output_call = _Field[str | None]()  # the id of the final-result call that gave it

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
        unknown_tool_retries: int | None = None,
    ) -> None:
        positive_int("max_turns", max_turns)
        checked = check_tool_definitions(tools)
        run = EngineState.start(
            run_id=run_id,
            tools=checked,
            history=check_history(messages),
            max_turns=max_turns,
            usage_limits=check_usage_limits(usage_limits),
            output=check_output(output, {d.name for d in checked}),
            check_permissions=check_permissions,
            check_continue=check_continue,
            scheduling=scheduling,
            state=INITIAL,
            table=table,
        )
        if tool_retries:
            # A read-only mapping (the driver shares one among runs) is kept as it is.
            if not isinstance(tool_retries, MappingProxyType):
                tool_retries = MappingProxyType(check_tool_retries(tool_retries))
            run.tool_retries = tool_retries
        if unknown_tool_retries is not None:
            run.unknown_tool_retries = check_retry_budget(
                "unknown_tool_retries", unknown_tool_retries
            )
        self._attach(run, logger=logger, transition_hook=transition_hook)

    def _attach(
        self, run: EngineState, *, logger: Any, transition_hook: TransitionHook | None
    ) -> None:
        """Hold ``run`` and set every attribute without a default (see the class
        docstring): the engine of a new run, or of a restored snapshot."""
        self._run = run
        self.transition_hook = transition_hook
        self._logger = logger
        log = (logger if logger is not None else library_logger()).bind(run_id=run.run_id)
        self._debug = _enabled(log, logging.DEBUG)
        self._info = _enabled(log, logging.INFO)
        if self._debug or self._info:
            self._log = log  # used at every transition or at the end of the run
        self._actions = ()

    def _bound_log(self) -> Any:
        """The logger, the run id bound (for a warning: bound now if not yet)."""
        if self._log is None:
            base = self._logger if self._logger is not None else library_logger()
            self._log = base.bind(run_id=self._run.run_id)
        return self._log

    # -- what the caller reads -----------------------------------------------------

    @property
    def requests(self) -> int:
        """The model calls the usage limits count: this run's turns and the calls of
        the sub-agents whose usage joined it."""
        return self._run.requests

    @property
    def messages(self) -> HistoryView:
        """The history so far, as an O(1) read-only snapshot."""
        return HistoryView(self._run.history)

    @property
    def returns_to_caller(self) -> bool:
        """True in a state where a driver stops and returns its result: a terminal
        state, or ``AwaitingUser`` (which a run resumes from)."""
        return self._run.state in self._returns()

    def _returns(self) -> frozenset[State]:
        # The base table's through the module's own names (read now, as the rows are).
        table = self._run.table
        return RETURNS_TO_CALLER if table is BASE_TABLE else table.returns_to_caller

    def _absorbing(self) -> frozenset[State]:
        table = self._run.table
        return ABSORBING if table is BASE_TABLE else table.terminal

    def pending_step(self) -> StepSpec | None:
        """The declared step the run waits for now (it is in the step's state)."""
        return self._run.pending_step()

    def step_retries(self, step: str) -> int:
        """How many times ``step``'s retries sent the run back to the model."""
        return step_retries(self._run, step)

    @property
    @deprecated(
        "Engine.is_finished is deprecated: use Engine.returns_to_caller (true in "
        "AwaitingUser too), or Engine.state.is_terminal to ask whether the run has ended"
    )
    def is_finished(self) -> bool:
        """Deprecated alias of ``returns_to_caller`` (true in ``AwaitingUser`` too,
        which is not finished). To ask whether the run has ended, use
        ``engine.state.is_terminal``."""
        return self._run.state in self._returns()

    def queued_input(self) -> tuple[InputQueued, ...]:
        """Queued input not yet injected: steering first, then follow-ups, each in order.

        Nothing queued is lost when a run ends: this is what a caller re-queues."""
        return self._run.queue.queued()

    def pending_calls(self) -> tuple[ToolCall, ...]:
        """Calls of the current batch that have no result yet, in call order."""
        return self._run.batch.pending_calls()

    def pending_approvals(self) -> tuple[tuple[ToolCall, str], ...]:
        """Calls waiting for a person's approval, with the hook's reason."""
        return self._run.batch.pending_approvals()

    def retry_budget(self, tool: str) -> int:
        """How many retry requests in a row ``tool`` may make (rule 14); for a name the
        run does not offer, how many calls of it (``unknown_tool_retries``)."""
        run = self._run
        if self._counts_unknown(tool):
            assert run.unknown_tool_retries is not None  # _counts_unknown says so
            return run.unknown_tool_retries
        return run.tool_retries.get(tool, DEFAULT_TOOL_RETRIES)

    def _counts_unknown(self, tool: str) -> bool:
        """A call of ``tool`` is a retry request because the run does not offer it, and
        the run counts such calls (``unknown_tool_retries`` given; rule 14)."""
        run = self._run
        return run.unknown_tool_retries is not None and tool not in run.tools_by_name

    def tool_failures(self, tool: str) -> int:
        """The retry requests ``tool`` made in a row so far (rule 14)."""
        return self._run.tool_failures.get(tool, 0)

    # -- handling an event -----------------------------------------------------------

    def handle(self, event: Event) -> tuple[Action, ...]:
        """Apply one engine event; return the actions it calls for.

        Raises ``ProtocolError`` (changing nothing) if the event is not accepted now.
        """
        trigger = getattr(event, "trigger", None)
        if not isinstance(trigger, Trigger) or trigger in INTERNAL_TRIGGERS:
            raise ProtocolError(f"not an engine event: {event!r}")
        state = self._run.state
        if state in self._absorbing():
            if self._debug:
                self._log.debug(
                    "event_absorbed", turn=self._run.turns, state=state.value, trigger=trigger.value
                )
            return ()
        here = self._run.table.leaving(state).by_trigger
        rows = here.get(trigger, ())
        if not rows:
            accepted = sorted(t.value for t in here if t not in INTERNAL_TRIGGERS)
            raise ProtocolError(
                f"{trigger.value!r} is not accepted in state {state.value}; "
                f"accepted here: {', '.join(accepted) or 'nothing'}"
            )
        self._check_payload(event)
        self._actions = ()  # left by an event whose handling raised
        self._record(event)
        self._fire(rows)
        self._settle()
        actions, self._actions = self._actions, ()
        return actions

    def _check_payload(self, event: Event) -> None:
        """Refuse an event whose data does not fit the bookkeeping; change nothing.
        The check is its trigger's (``_ON_INPUT``)."""
        check = _ON_INPUT[event.trigger][0]
        if check is not None:
            check(self, event)

    def _record(self, event: Event) -> None:
        """Record the event's data, by its trigger (``_ON_INPUT``); what depends on the
        destination comes on entry. Every event that answers a call flushes the
        results now in order (I2)."""
        record = _ON_INPUT[event.trigger][1]
        if record is not None:
            record(self, event)

    # the checks of ``_ON_INPUT``: each refuses with ProtocolError and changes nothing

    def _expect_model_call(self, event: ModelResponded | ModelFailed | ModelCancelled) -> None:
        if not self._run.model_outstanding:
            raise ProtocolError(f"{event.trigger.value}: no model call is outstanding")

    def _expect_model_cancel(self, event: ModelCancelled) -> None:
        self._expect_model_call(event)
        if self._run.state is not S.ABORTING:
            raise ProtocolError("model_cancelled is accepted only while aborting")

    def _expect_running(self, event: ToolFinished | ToolCancelled) -> None:
        self._expect_slot(event.call_id, RUNNING, event.trigger)

    def _expect_waiting_permission(
        self, event: ToolPermitted | ToolDenied | ApprovalRequired
    ) -> None:
        self._expect_slot(event.call_id, WAITING_PERMISSION, event.trigger)

    def _expect_waiting_approval(self, event: ApprovalDecided) -> None:
        self._expect_slot(event.call_id, WAITING_APPROVAL, event.trigger)

    def _expect_continue_pending(self, event: ContinueDecided) -> None:
        if not self._run.continue_pending:
            raise ProtocolError("continue_decided: no should_continue check is pending")

    def _expect_slot(self, call_id: str, status: str, trigger: Trigger) -> None:
        slot = self._run.batch.by_id.get(call_id)
        if slot is None or slot.status != status:
            actual = "not in the current batch" if slot is None else slot.status
            raise ProtocolError(
                f"{trigger.value}: call {call_id!r} is not {status} (it is {actual})"
            )

    def _check_step_decision(self, event: StepDecided) -> None:
        step = self._run.pending_step()  # there: only a step's state has step_decided rows
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

    # the records of ``_ON_INPUT``: the event's data, kept

    def _record_tool_finished(self, event: ToolFinished) -> None:
        run = self._run
        slot = run.batch.by_id[event.call_id]  # there: the check made sure
        call, output = slot.call, event.output
        slot.result = checked_result(call.id, call.name, output.content, output.is_error)
        if output.usage is not None or output.requests:  # a sub-agent's, joining (limits)
            run.usage = run.usage + (output.usage or NO_USAGE)
            run.delegated_requests += output.requests
        if output.retry or call.name in run.tool_failures:
            text = "\n".join(b.text for b in output.content if isinstance(b, TextContent))
            self._count_retry(call.name, text, retry=output.retry)
        slot.status = DONE
        if len(run.batch.slots) > 1 and run.state is S.COLLECTING_RESULTS:
            self._start_runnable()  # the calls this one held back (a lone call held none)
        self._flush()

    def _record_tool_cancelled(self, event: ToolCancelled) -> None:
        slot = self._run.batch.by_id[event.call_id]  # there: the check made sure
        if event.reason.startswith(ABANDONED):
            self._run.abandoned += (f"tool {slot.call.name} (call {slot.call.id})",)
        slot.answer(f"Operation aborted: {event.reason}", is_error=True)
        self._flush()

    def _record_response(self, event: ModelResponded) -> None:
        """The assistant message enters history first (rule 1); its calls open a batch.
        The usage it reports is added to the run's (none: zero tokens)."""
        run, message = self._run, event.message
        run.model_outstanding = False
        if message.usage is not None:
            run.usage = run.usage + message.usage
        calls = message.tool_calls
        if not self._ids_are_new(calls):
            message = self._renamed_ids(message)
            calls = message.tool_calls
        run.history.append(message)
        run.batch.reset(calls)
        output = run.output
        if output is not None and run.state is S.AWAITING_MODEL and output.accepts(message):
            run.output_call = run.output_call or TEXT_OUTPUT  # native: the text (rule 13)
        if run.state is S.ABORTING:
            self._answer_unresolved("Tool call not started: the run was aborted")

    def _record_model_failed(self, event: ModelFailed) -> None:
        self._record_model_error(event.error)

    def _record_model_cancelled(self, event: ModelCancelled) -> None:
        if event.reason.startswith(ABANDONED):
            self._run.abandoned += ("the model call",)
        self._record_model_error(event.reason)

    def _record_model_error(self, detail: str) -> None:
        run = self._run
        run.model_outstanding = False
        if run.state is S.ABORTING:
            stop, text = StopReason.ABORTED, f"The model call was aborted: {detail}"
        else:
            stop, text = StopReason.ERROR, f"The model call failed: {detail}"
        run.history.append(AssistantMessage((), stop_reason=stop, error_message=text))

    def _record_input(self, event: InputQueued) -> None:
        if self._run.state is S.AWAITING_USER:
            # A person answered with a message instead of deciding: the calls that
            # waited for approval are answered, and the message goes to the model.
            self._answer_unresolved(
                "Tool call not run: it was not approved (the user sent a message instead)"
            )
            kind = InputKind.STEER
        else:
            kind = event.kind
        if self._run.queue is NO_INPUT:  # shared by the runs that queued nothing
            self._run.queue = InputQueue()
        self._run.queue.add(event.message, kind)

    def _record_permitted(self, event: ToolPermitted) -> None:
        self._run.batch.by_id[event.call_id].status = READY

    def _record_denied(self, event: ToolDenied) -> None:
        run = self._run
        slot = run.batch.by_id[event.call_id]
        slot.answer(f"Tool call denied: {event.reason}", is_error=True)
        if not event.advisory and run.denial is None:
            run.denial = (slot.call, event.reason)
        self._flush()

    def _record_approval_required(self, event: ApprovalRequired) -> None:
        slot = self._run.batch.by_id[event.call_id]
        slot.status = WAITING_APPROVAL
        slot.note = event.reason

    def _record_approval(self, event: ApprovalDecided) -> None:
        slot = self._run.batch.by_id[event.call_id]
        if event.approved:
            slot.status = READY
            return
        reason = f": {event.reason}" if event.reason else ""
        slot.answer(f"Tool call denied by a person{reason}", is_error=True)
        self._flush()

    def _record_continue(self, event: ContinueDecided) -> None:
        self._run.continue_pending = False
        if event.stop:
            self._run.stop_reason = event.reason or "should_continue asked to stop"

    def _record_step(self, event: StepDecided) -> None:
        self._run.step_decision = (event.outcome, event.message)

    def _record_abort(self, event: AbortRequested) -> None:
        if self._run.abort_reason is None:
            self._run.abort_reason = event.reason

    # -- applying the table ----------------------------------------------------------------

    def _fire(self, rows: tuple[Transition, ...], holds: RowGuard | None = None) -> None:
        """Take the first of ``rows`` (the rows of one state and trigger, in table order)
        whose guard holds: tell the transition hook, move to the row's destination,
        record the transition, and run the destination's entry effect when the state
        changes. ``holds``: a guard known to hold (the one that fired an internal
        trigger), not asked again."""
        run, guards = self._run, self.guards
        for row in rows:
            guard = row.guard
            if guard is None or guard is holds:
                break
            # What ``guard_holds`` answers, without a call to it: a turn asks ten
            # guards here (seven at the turn boundary alone).
            if type(guard) is OutcomeIs:
                if outcome_holds(run, guard):
                    break
            elif guards[guard](run):  # type: ignore[index]
                break
        else:
            self._no_row(rows[0].source, rows[0].trigger)
        source, trigger, dest = row.source, row.trigger, row.dest
        if self.transition_hook is not None:
            self.transition_hook(self, source, trigger, dest)
        run.state = dest
        run.trace.add(source, trigger, dest, run.turns)
        if self._debug:
            self._log.debug(
                "transition",
                turn=run.turns,
                from_state=source.value,
                to_state=dest.value,
                trigger=trigger.value,
            )
        if dest is not source:
            entry = self._ENTRIES.get(dest)
            if entry is None:
                self._declared_entry(row)
            else:
                entry(self, row)
            if type(source) is DeclaredState and not dest.is_terminal:
                run.step_decision = None  # the step's decision is spent

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
        run, guards = self._run, self.guards
        fired = 0
        while True:
            # The internal trigger due now: the first that can fire from this state
            # (the table says which, ``Leaving.internal``) whose firing guard holds.
            for due in run.table.leaving(run.state).internal:
                if guards[due.guard](run):  # a firing guard is a ``Guard``
                    break
            else:
                return  # none is due: settled
            if fired == MAX_INTERNAL_TRANSITIONS:
                self._runaway(due.trigger, fired)
            self._fire(due.rows, holds=due.guard)
            fired += 1

    def _runaway(self, trigger: Trigger, fired: int) -> NoReturn:
        recent = self._run.trace[-(fired + 1) :]  # the input's own transition, then the rest
        shown = ", ".join(f"{r.source}-{r.trigger}->{r.dest}" for r in recent[-6:])
        raise EngineInvariantError(
            f"internal transitions do not settle: {fired} fired after one engine event and "
            f"{trigger} would fire again in {self._run.state} (a broken table or guard; "
            f"this engine cannot go on). Last transitions: {shown}",
            recent,
        )

    def guard_holds(self, guard: RowGuard) -> bool:
        """Whether the table's ``guard`` holds now: its function in ``guards``
        (``GUARDS``), or for a step's row (``OutcomeIs``) the step's decision."""
        if type(guard) is OutcomeIs:
            return outcome_holds(self._run, guard)
        return self.guards[guard](self._run)  # type: ignore[index]

    # -- the entry effects: what entering each state does (``_ENTRIES``) --------------------

    def _enter_AwaitingModel(self, row: Transition) -> None:
        run = self._run
        if run.queue:
            run.history.extend(run.queue.take(model_would_finish=self._model_would_finish()))
        if run.output_remind and run.output is not None:
            run.history.append(UserMessage(run.output.reminder(run.output_error)))
            run.output_remind = False
        run.turns += 1
        run.model_outstanding = True
        run.batch.reset()
        offered = run.tools if run.output is None else run.output.offered(run.tools)
        self._actions += (CallModel(HistoryView(run.history), offered, run.turns),)

    def _enter_DispatchingTools(self, row: Transition) -> None:
        run = self._run
        output = run.output
        refused = False
        if output is not None:  # the final-result calls first: they decide the others' fate
            for slot in run.batch.slots:
                if output.owns(slot.call.name):
                    self._resolve_output(slot, self._refusal(slot.call))
                    refused = True
        early = output is not None and output.end_strategy == "early" and bool(run.output_call)
        for slot in run.batch.slots:
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
                if self._counts_unknown(slot.call.name):
                    # a tool that does not exist: the model must try again (rule 14)
                    self._count_retry(slot.call.name, refusal, retry=True)
                continue
            scheduling = run.scheduling.get(slot.call.name)
            if scheduling is not None:  # without one, a call runs beside everything
                slot.classify(scheduling, self._bound_log)
            if run.check_permissions:
                slot.status = WAITING_PERMISSION
                self._actions += (CheckPermission(slot.call, run.turns),)
        if refused:
            self._flush()  # the refusals that are next in call order

    def _over_tool_call_limit(self) -> str | None:
        """Why a valid call is not run: it is past the run's tool-call limit (else
        ``None``). Every call asked counts, the refused too, so the count passes the
        limit only once a call was refused: what ends the run (``UsageLimits.reached``),
        while a run that made exactly as many calls as its limit goes on to answer."""
        run = self._run
        limit = None if run.usage_limits is None else run.usage_limits.tool_calls
        if limit is None:  # counted only where a limit reads it
            return None
        run.tool_calls += 1
        if run.tool_calls > limit:
            return f"Tool call not run: the run's tool_calls limit ({limit}) is reached."
        return None

    def _count_retry(self, tool: str, message: str, *, retry: bool) -> None:
        """Count a result of ``tool`` (rule 14): a retry request (``retry``) adds one
        to its requests in a row, against its budget; any other result ends the row."""
        run = self._run
        failures = dict(run.tool_failures)
        if not retry:
            if tool not in failures:
                return
            del failures[tool]
        else:
            failures[tool] = failures.get(tool, 0) + 1
            if failures[tool] > self.retry_budget(tool) and run.retries_spent is None:
                run.retries_spent = (tool, message)
        run.tool_failures = failures

    def _resolve_output(self, slot: CallSlot, refusal: str | None) -> None:
        """A final-result call, answered by the engine itself (rule 13)."""
        run = self._run
        assert run.output is not None  # only a run with an output has the tool
        if refusal is None and run.output_call is None:
            # the type's own judgement, once the schema holds (core/output.py)
            problem = run.output.judged(thaw_json(slot.call.arguments), slot.call.name)
            if problem is not None:
                refusal = f"Invalid final result for {slot.call.name}: {problem}"
        if refusal is not None:
            run.output_failures += 1
            run.output_error = refusal
            slot.answer(refusal, is_error=True)
        elif run.output_call is None:
            run.output_call = slot.call.id
            slot.answer(OUTPUT_ACCEPTED, is_error=False)
        else:
            slot.answer("Not used: a final result was already accepted.", is_error=True)

    def _enter_CollectingResults(self, row: Transition) -> None:
        self._start_runnable()

    def _enter_TurnBoundary(self, row: Transition) -> None:
        run = self._run
        source = row.source
        if type(source) is DeclaredState:
            self._retried(source)
        if run.output is not None and source is S.AWAITING_MODEL and run.output_call is None:
            # A final text answer where a final result is required: one failed attempt.
            run.output_failures += 1
            last = run.history[-1]
            assert isinstance(last, AssistantMessage)  # the final answer just recorded
            run.output_error = run.output.missed(last)
            run.output_remind = True
        if run.check_continue:
            run.continue_pending = True
            self._actions += (CheckContinue(run.turns),)

    def _retried(self, source: DeclaredState) -> None:
        """A step's retry (the only row from a step's state to the turn boundary): its
        message goes to the model after the answer it rejects (I2), one retry is spent,
        and an accepted final result is given up: the model must give it again."""
        run = self._run
        step = step_named(run.steps, source)
        assert step is not None
        assert run.step_decision is not None
        outcome, message = run.step_decision
        if not message:
            message = f"The answer was not accepted ({step.name}: {outcome}). Try again."
        run.history.append(UserMessage(message))
        spent = dict(run.step_retries)
        spent[step.name] = spent.get(step.name, 0) + 1
        run.step_retries = tuple(sorted(spent.items()))
        run.output_call = None

    def _declared_entry(self, row: Transition) -> None:
        """Entering a state a team declared: a step's (ask for the step) or an end."""
        run, dest = self._run, row.dest
        assert isinstance(dest, DeclaredState)
        if not dest.terminal:
            step = step_named(run.steps, dest)
            assert step is not None
            self._actions += (RunStep(step.name, run.turns),)
            return
        step = step_named(run.steps, row.source)
        decision = run.step_decision
        assert step is not None
        assert decision is not None
        outcome, message = decision
        said = f": {message}" if message else ""
        self._finish(f"{dest.doc} (the step {step.name} answered {outcome}{said})")

    def _enter_Aborting(self, row: Transition) -> None:
        run = self._run
        reason = run.abort_reason or "aborted"
        self._answer_unresolved(f"Tool call not started: the run was aborted ({reason})")
        running = run.batch.running_ids()
        self._actions += (CancelOperations(run.model_outstanding, running, reason),)
        run.abort_context = (
            f"during the model call of turn {run.turns}"
            if run.model_outstanding
            else f"while the tool calls of turn {run.turns} were "
            + ("running" if row.source is S.COLLECTING_RESULTS else "being dispatched")
        )

    def _enter_Done(self, row: Transition) -> None:
        run = self._run
        if run.output_call is not None and run.stop_reason is None:
            self._finish(explain.output_accepted(run.output_call))
        elif row.source is S.TURN_BOUNDARY:  # should_continue's stop wins the row (rule 7)
            self._finish(explain.stopped_by_hook(run.stop_reason))
        else:
            self._finish(explain.final_answer())

    def _enter_Failed(self, row: Transition) -> None:
        run = self._run
        last = run.history[-1]  # the error message, made by the model or by _record
        detail = last.error_message if isinstance(last, AssistantMessage) else None
        from_response = row.trigger is T.MODEL_RESPONDED
        if from_response:
            self._answer_unresolved(
                "Tool call not run: the model's response reported an error, so its "
                "arguments may be incomplete"
            )
        self._finish(explain.failed(detail, reported_by_response=from_response, turn=run.turns))

    def _enter_Aborted(self, row: Transition) -> None:
        run, source = self._run, row.source
        if source is S.AWAITING_MODEL:
            last = run.history[-1]  # the aborted response, before its calls' results
            detail = last.error_message if isinstance(last, AssistantMessage) else None
            self._answer_unresolved(
                "Tool call not run: the model's response was aborted, so its arguments "
                "may be incomplete"
            )
            self._finish(explain.aborted_response(detail, run.turns))
            return
        reason = run.abort_reason or "aborted"
        self._answer_unresolved(f"Tool call not started: the run was aborted ({reason})")
        where_known: dict[State, str] = {
            S.ABORTING: run.abort_context,
            S.READY: "before the first model call",
            S.TURN_BOUNDARY: f"at the turn boundary after turn {run.turns}",
            S.AWAITING_USER: "while waiting for a person",
        }
        where = where_known.get(source) or f"while the step {source} ran after turn {run.turns}"
        self._finish(explain.aborted(where, reason, run.abandoned))

    def _enter_TurnLimitExceeded(self, row: Transition) -> None:
        run = self._run
        slots = run.batch.slots
        last_result = slots[-1].result if slots else None
        self._finish(explain.turn_limit(run.max_turns, last_result, len(run.queue)))

    def _enter_UsageLimitExceeded(self, row: Transition) -> None:
        run = self._run
        assert run.usage_limits is not None  # the guard that leads here says so
        reached = run.usage_limits.reached(run.usage, run.requests, run.tool_calls)
        assert reached is not None
        slots = run.batch.slots
        last_result = slots[-1].result if slots else None
        self._finish(
            explain.usage_limit(reached, run.usage, run.turns, last_result, len(run.queue))
        )

    def _enter_ToolRetriesExceeded(self, row: Transition) -> None:
        assert self._run.retries_spent is not None  # the guard that leads here says so
        tool, message = self._run.retries_spent
        self._finish(explain.tool_retries(tool, self.retry_budget(tool), message))

    def _enter_OutputInvalid(self, row: Transition) -> None:
        run = self._run
        assert run.output is not None  # the guard that leads here says so
        self._finish(
            explain.output_invalid(run.output.retries, run.output_failures, run.output_error)
        )

    def _enter_AwaitingUser(self, row: Transition) -> None:
        run = self._run
        pending = run.batch.pending_approvals()
        if pending:
            self._finish(explain.waiting_for_approval(pending))
            return
        assert run.denial is not None
        call, reason = run.denial
        run.denial = None  # told once: a person's answer goes on with the run
        self._finish(explain.denied_by_policy(call, reason))

    # Which entry effect each state has; a state a team declared has ``_declared_entry``,
    # and Ready none (no row enters it). A subclass replaces one by giving its own map.
    _ENTRIES: ClassVar[Mapping[State, Callable[[Engine, Transition], None]]] = {
        S.AWAITING_MODEL: _enter_AwaitingModel,
        S.DISPATCHING_TOOLS: _enter_DispatchingTools,
        S.COLLECTING_RESULTS: _enter_CollectingResults,
        S.TURN_BOUNDARY: _enter_TurnBoundary,
        S.ABORTING: _enter_Aborting,
        S.AWAITING_USER: _enter_AwaitingUser,
        S.DONE: _enter_Done,
        S.ABORTED: _enter_Aborted,
        S.TURN_LIMIT_EXCEEDED: _enter_TurnLimitExceeded,
        S.FAILED: _enter_Failed,
        S.USAGE_LIMIT_EXCEEDED: _enter_UsageLimitExceeded,
        S.OUTPUT_INVALID: _enter_OutputInvalid,
        S.TOOL_RETRIES_EXCEEDED: _enter_ToolRetriesExceeded,
    }

    # -- what the entry effects share -------------------------------------------------------

    def _finish(self, explanation: str) -> None:
        """Entering a state that returns to the caller: explain it, announce it."""
        run = self._run
        run.explanation = explanation
        self._actions += (ReturnToCaller(run.state, explanation),)
        if self._info:
            self._log.info(
                "run_ended", turn=run.turns, state=run.state.value, explanation=explanation
            )

    def _flush(self) -> None:
        """Append the results that are next in call order (I2)."""
        self._run.history.extend(self._run.batch.flush())

    def _answer_unresolved(self, text: str) -> None:
        """Give every call that never started a result saying why (I1, I6)."""
        self._run.batch.answer_unstarted(text)
        self._flush()

    def _start_runnable(self) -> None:
        """Start every call that may run now (rule 4)."""
        turn = self._run.turns
        for call in self._run.batch.start_runnable():
            self._actions += (StartTool(call, turn),)

    def _model_would_finish(self) -> bool:
        # Only a final answer ends a run: the last message is the model's, without a tool
        # call. A user message after it (a continued conversation, steering) or a tool
        # result still awaits the model's answer, as a run's first message does.
        history = self._run.history
        last = history[-1] if history else None
        return isinstance(last, AssistantMessage) and not last.tool_calls

    def _refusal(self, call: ToolCall) -> str | None:
        """Why a call cannot be run at all (an unknown tool, arguments that do not
        parse or do not match the schema), as the result the model reads; ``None``
        for a call that can run."""
        by_name = self._run.tools_by_name
        definition = by_name.get(call.name)
        if definition is None:
            if not by_name:
                return f"Unknown tool: {call.name}. No tools are available in this run."
            names = ", ".join(by_name)  # the run's final-result tool too
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
        seen = self._run.seen_ids
        if len(ids) == len(calls) and "" not in ids and seen.isdisjoint(ids):
            seen |= ids
            return True
        return False

    def _renamed_ids(self, message: AssistantMessage) -> AssistantMessage:
        """The message with empty or repeated tool-call ids given a unique,
        deterministic replacement."""
        seen = self._run.seen_ids
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
        turns = self._run.turns
        new_id = f"call_t{turns}_{index}"
        suffix = 1
        while new_id in self._run.seen_ids:
            new_id = f"call_t{turns}_{index}_{suffix}"
            suffix += 1
        self._bound_log().warning(
            "tool_call_id_normalised",
            turn=turns,
            original=call.id,
            assigned=new_id,
            reason="empty" if not call.id else "repeated",
        )
        return new_id

    # -- copying and comparing ---------------------------------------------------------------

    def fork(self) -> Self:
        """An independent engine in exactly this state: what one does never shows in
        the other.

        The state record is copied (``EngineState.copy``: every container, each call's
        bookkeeping; messages, calls and records are immutable and shared). The fork
        is of the same class; the lists, dicts and sets a subclass adds are copied
        (shallowly) and its other attributes shared: a subclass with deeper state of
        its own overrides ``fork``. A search keeps a fork of every state it still has
        to expand.
        """
        new = object.__new__(type(self))
        fields = new.__dict__
        fields.update(self.__dict__)
        fields["_run"] = self._run.copy()
        for name in fields.keys() - _DECLARED:  # a subclass's own attributes
            value = fields[name]
            if type(value) in (list, dict, set):
                fields[name] = value.copy()
        return new

    def control_key(self) -> tuple[Any, ...]:
        """A hashable value equal for two engines of one configuration exactly when
        they will accept the same events and answer them alike.

        It holds every control field of the state record and the configuration that
        decides (``EngineState.control_key``), not the history or the transition log:
        the engine never reads those back to decide. Attributes a subclass adds are
        part of it, by ``repr``. Compare keys only between engines made with the same
        tools and scheduling.
        """
        return (*self._run.control_key(), _extra_key(self.__dict__))

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
        data = _snapshot.write(self._run)
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
        run = _snapshot.read(
            snapshot,
            scheduling=scheduling,
            key=key,
            max_bytes=max_bytes,
            max_depth=max_depth,
            table=table,
        )
        engine = cls.__new__(cls)
        engine._attach(run, logger=logger, transition_hook=transition_hook)
        return engine


_Check = Callable[[Engine, Any], None]
_Record = Callable[[Engine, Any], None]

# What an engine event does before the rows are read, by its trigger: the check that
# refuses a payload that does not fit (nothing has changed yet, I8), then the record of
# its data. Each function takes the event class of its trigger (core/events.py).
_ON_INPUT: Final[Mapping[Trigger, tuple[_Check | None, _Record | None]]] = {
    T.START: (None, None),
    T.MODEL_RESPONDED: (Engine._expect_model_call, Engine._record_response),
    T.MODEL_FAILED: (Engine._expect_model_call, Engine._record_model_failed),
    T.MODEL_CANCELLED: (Engine._expect_model_cancel, Engine._record_model_cancelled),
    T.INPUT_QUEUED: (None, Engine._record_input),
    T.TOOL_PERMITTED: (Engine._expect_waiting_permission, Engine._record_permitted),
    T.TOOL_DENIED: (Engine._expect_waiting_permission, Engine._record_denied),
    T.APPROVAL_REQUIRED: (Engine._expect_waiting_permission, Engine._record_approval_required),
    T.APPROVAL_DECIDED: (Engine._expect_waiting_approval, Engine._record_approval),
    T.TOOL_FINISHED: (Engine._expect_running, Engine._record_tool_finished),
    T.TOOL_CANCELLED: (Engine._expect_running, Engine._record_tool_cancelled),
    T.CONTINUE_DECIDED: (Engine._expect_continue_pending, Engine._record_continue),
    T.STEP_DECIDED: (Engine._check_step_decision, Engine._record_step),
    T.ABORT: (None, Engine._record_abort),
}

_DECLARED: Final = frozenset(Engine.__annotations__)


def _schema_text(definition: ToolDefinition) -> str:
    """A tool's JSON Schema as the model reads it in a refusal."""
    return json.dumps(definition.schema_dict(), sort_keys=True)


def _extra_key(fields: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """A subclass's own attributes, by ``repr`` (none for ``Engine`` itself)."""
    extra = fields.keys() - _DECLARED
    return tuple(sorted((name, repr(fields[name])) for name in extra)) if extra else ()
