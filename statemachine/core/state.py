"""The engine's state as one record: ``EngineState``.

Everything an engine decides by is a field of this record, declared once below with
its role:

- **configuration**: fixed for the run (a driver may set it before the first event),
  shared by forks; the fields that change what an engine accepts or answers are part
  of the control key (``keyed``);
- **record**: what happened (the history, the transition log): copied by forks, left
  out of the control key because the engine never reads it back to decide;
- **control**: what decides what happens next: copied by forks and keyed.

``copy`` (what ``Engine.fork`` makes) and ``control_key`` read these declarations, so a
new field is copied and compared as soon as it is declared; ``core/snapshot.py``
writes and reads the record field by field, and ``core/engine.py`` interprets the
table over it. This module imports neither of them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

from statemachine.core.batch import RUNNING, Batch, CallSlot
from statemachine.core.limits import UsageLimits
from statemachine.core.messages import AssistantMessage, Message, ToolCall, Usage
from statemachine.core.output import OutputSpec
from statemachine.core.queue import NO_INPUT, InputQueue
from statemachine.core.steps import StepSpec, step_named
from statemachine.core.table import BASE_TABLE, DeclaredState, State, Table
from statemachine.core.tools import Scheduling, ToolDefinition
from statemachine.core.trace import Trace

__all__ = [
    "CONFIGURATION",
    "CONTROL",
    "NO_RETRIES",
    "NO_USAGE",
    "RECORD",
    "ROLES",
    "EngineState",
    "fields_of",
    "rendered",
]

CONFIGURATION: Final = "configuration"
RECORD: Final = "record"
CONTROL: Final = "control"
ROLES: Final = (CONFIGURATION, RECORD, CONTROL)

NO_USAGE: Final = Usage()  # immutable: every run starts from this one zero
NO_RETRIES: Final[Mapping[str, int]] = MappingProxyType({})  # no budgets, no failures

_Key = Callable[[Any], Any]


# What each field declares besides its type: its role; for a field a fork copies, how
# (``copy``: none, the value is immutable or configuration and shared); for a keyed
# field, how it enters the control key (``key``: none, as it is).


def _configuration(*, keyed: bool = False, key: _Key | None = None) -> dict[str, Any]:
    return {"role": CONFIGURATION, "copy": None, "keyed": keyed, "key": key}


def _record(*, copy: _Key | None = None) -> dict[str, Any]:
    return {"role": RECORD, "copy": copy, "keyed": False, "key": None}


def _control(*, copy: _Key | None = None, key: _Key | None = None) -> dict[str, Any]:
    return {"role": CONTROL, "copy": copy, "keyed": True, "key": key}


# -- how a field enters the control key -------------------------------------------------------

# The checker keys hundreds of thousands of engines, most sharing their messages: each
# immutable value's ``repr`` (which attrs writes from every field) is kept by identity,
# with the value itself so that its id cannot be reused while the entry exists.
# Bounded: cleared when full (a cache, not a store).
_REPRS: dict[int, tuple[object, str]] = {}
_REPRS_MAX: Final = 1 << 16


def rendered(value: object) -> str:
    """``repr(value)``, remembered for an immutable value seen before."""
    known = _REPRS.get(id(value))
    if known is None:
        if len(_REPRS) >= _REPRS_MAX:
            _REPRS.clear()
        known = _REPRS[id(value)] = (value, repr(value))
    return known[1]


def _slot_key(slot: CallSlot) -> tuple[Any, ...]:
    result = None if slot.result is None else rendered(slot.result)
    resources = tuple(sorted(slot.resources))
    return (rendered(slot.call), slot.status, slot.sequential, resources, slot.note, result)


def _batch_key(batch: Batch) -> tuple[Any, ...]:
    return (tuple(_slot_key(slot) for slot in batch), batch.flushed)


def _queue_key(queue: InputQueue) -> tuple[Any, ...]:
    return (tuple(map(rendered, queue.steer)), tuple(map(rendered, queue.follow_up)))


def _denial_key(denial: tuple[ToolCall, str] | None) -> tuple[str, str] | None:
    return None if denial is None else (denial[0].id, denial[1])


def _output_key(output: OutputSpec | None) -> int | None:
    # The schema is compared as the tools are: only between engines of one configuration.
    return None if output is None else output.retries


def _sorted_items(mapping: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(mapping.items()))


# Runs of one agent offer the same definitions, each run in a sequence of its own: the
# tuple and the index by name are made once and shared by those runs, as forks share
# them (configuration never changes), so a waiting run holds neither. Keyed by the
# definitions' ids; each entry holds the definitions, so that no id is reused while it
# exists. Bounded: cleared when full (a cache, not a store).
_Toolset = tuple[tuple[ToolDefinition, ...], Mapping[str, ToolDefinition]]
_TOOLSETS: dict[tuple[int, ...], _Toolset] = {}
_TOOLSETS_MAX: Final = 1 << 8


def _toolset(tools: tuple[ToolDefinition, ...]) -> _Toolset:
    """``tools`` and the index by name, as the runs that offered them before hold them."""
    key = tuple(map(id, tools))
    known = _TOOLSETS.get(key)
    if known is None:
        if len(_TOOLSETS) >= _TOOLSETS_MAX:
            _TOOLSETS.clear()
        known = _TOOLSETS[key] = (tools, {d.name: d for d in tools})
    return known


@attrs.define(eq=False, repr=False, kw_only=True, weakref_slot=False)
class EngineState:
    """Everything an engine decides by, by role (see the module docstring).

    A field with a default starts there; an engine made by ``Engine(...)`` or restored
    from a snapshot sets the others.
    """

    # -- configuration ----------------------------------------------------------------------
    run_id: str = attrs.field(metadata=_configuration())
    tools: tuple[ToolDefinition, ...] = attrs.field(metadata=_configuration())
    # the tools by name, with the run's final-result tools (rule 13) when it has some
    tools_by_name: Mapping[str, ToolDefinition] = attrs.field(metadata=_configuration())
    # how each tool's calls may run concurrently (rule 4); a tool absent runs beside all
    scheduling: dict[str, Scheduling] = attrs.field(metadata=_configuration())
    max_turns: int = attrs.field(metadata=_configuration(keyed=True))
    usage_limits: UsageLimits | None = attrs.field(metadata=_configuration(keyed=True))
    # the final-result tool and its retries (rule 13)
    output: OutputSpec | None = attrs.field(metadata=_configuration(keyed=True, key=_output_key))
    check_permissions: bool = attrs.field(metadata=_configuration(keyed=True))
    check_continue: bool = attrs.field(metadata=_configuration(keyed=True))
    # the tools whose budget of retry requests in a row is not the default (rule 14)
    tool_retries: Mapping[str, int] = attrs.field(default=NO_RETRIES, metadata=_configuration())
    # the budget of calls of a tool the run does not offer, counted like retry requests
    # (rule 14); ``None``: not counted, as runs recorded before they were
    unknown_tool_retries: int | None = attrs.field(
        default=None, metadata=_configuration(keyed=True)
    )
    # the rows interpreted: BASE_TABLE, or one with a team's steps (core/steps.py)
    table: Table = attrs.field(default=BASE_TABLE, metadata=_configuration())

    # -- record -------------------------------------------------------------------------------
    history: list[Message] = attrs.field(metadata=_record(copy=list))
    trace: Trace = attrs.field(metadata=_record(copy=Trace.copy))
    # every tool-call id so far, only to rename repeats
    seen_ids: set[str] = attrs.field(metadata=_record(copy=set))
    explanation: str | None = attrs.field(default=None, metadata=_record())

    # -- control ------------------------------------------------------------------------------
    state: State = attrs.field(metadata=_control())
    # model calls made
    turns: int = attrs.field(default=0, metadata=_control())
    # what the provider reported on this run's responses, summed
    usage: Usage = attrs.field(default=NO_USAGE, metadata=_control())
    # model calls of sub-agents whose usage joined the run's
    delegated_requests: int = attrs.field(default=0, metadata=_control())
    # tool calls started, for UsageLimits.tool_calls
    tool_calls: int = attrs.field(default=0, metadata=_control())
    model_outstanding: bool = attrs.field(default=False, metadata=_control())
    batch: Batch = attrs.field(factory=Batch, metadata=_control(copy=Batch.copy, key=_batch_key))
    # input queued for a turn boundary (NO_INPUT until some is)
    queue: InputQueue = attrs.field(
        default=NO_INPUT, metadata=_control(copy=InputQueue.copy, key=_queue_key)
    )
    # retry requests in a row, per tool (rule 14)
    tool_failures: Mapping[str, int] = attrs.field(
        default=NO_RETRIES, metadata=_control(copy=dict, key=_sorted_items)
    )
    # (tool, its last message) once a tool's retries are spent
    retries_spent: tuple[str, str] | None = attrs.field(default=None, metadata=_control())
    abort_reason: str | None = attrs.field(default=None, metadata=_control())
    # where the abort found the run, for the explanation
    abort_context: str = attrs.field(default="", metadata=_control())
    # operations the driver gave up on, still running
    abandoned: tuple[str, ...] = attrs.field(default=(), metadata=_control())
    # a policy denial, until AwaitingUser tells it
    denial: tuple[ToolCall, str] | None = attrs.field(
        default=None, metadata=_control(key=_denial_key)
    )
    # a CheckContinue is out, not yet answered
    continue_pending: bool = attrs.field(default=False, metadata=_control())
    # should_continue asked to stop, with this reason
    stop_reason: str | None = attrs.field(default=None, metadata=_control())
    # the id of the final-result call that gave the output (rule 13)
    output_call: str | None = attrs.field(default=None, metadata=_control())
    # failed attempts at the final result, and why the last one failed
    output_failures: int = attrs.field(default=0, metadata=_control())
    output_error: str | None = attrs.field(default=None, metadata=_control())
    # ask for the final-result tool before the next model call
    output_remind: bool = attrs.field(default=False, metadata=_control())
    # a step's (outcome, message), and the retries each step's outcomes spent
    step_decision: tuple[str, str] | None = attrs.field(default=None, metadata=_control())
    step_retries: tuple[tuple[str, int], ...] = attrs.field(default=(), metadata=_control())

    @classmethod
    def start(
        cls,
        *,
        run_id: str,
        tools: tuple[ToolDefinition, ...],
        history: list[Message],
        max_turns: int,
        usage_limits: UsageLimits | None,
        output: OutputSpec | None,
        check_permissions: bool,
        check_continue: bool,
        scheduling: Mapping[str, Scheduling] | None,
        state: State,
        table: Table = BASE_TABLE,
    ) -> EngineState:
        """A run's state before its first event (checked values only: ``Engine``
        checks what a caller gives, ``core/snapshot.py`` what a snapshot holds)."""
        tools, by_name = _toolset(tools)
        if output is not None:  # native, plain text: no tool (core/output.py)
            by_name = {**by_name, **{d.name: d for d in output.offered(())}}
        seen = {c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls}
        return cls(
            run_id=run_id,
            tools=tools,
            tools_by_name=by_name,
            scheduling=dict(scheduling or {}),
            max_turns=max_turns,
            usage_limits=usage_limits,
            output=output,
            check_permissions=check_permissions,
            check_continue=check_continue,
            table=table,
            history=history,
            trace=Trace(),
            seen_ids=seen,
            state=state,
        )

    def __repr__(self) -> str:
        return f"<EngineState {self.run_id!r} in {self.state}, turn {self.turns}>"

    # -- what the engine and the snapshot ask -----------------------------------------------

    @property
    def steps(self) -> tuple[StepSpec, ...]:
        """The declared steps of the run's table (none for ``BASE_TABLE``)."""
        return self.table.steps

    @property
    def requests(self) -> int:
        """The model calls the usage limits count: this run's turns and the calls of
        the sub-agents whose usage joined it."""
        return self.turns + self.delegated_requests

    def pending_step(self) -> StepSpec | None:
        """The declared step the run waits for now (it is in the step's state)."""
        if type(self.state) is not DeclaredState:
            return None
        return step_named(self.table.steps, self.state)

    def outstanding(self) -> bool:
        """Whether an operation's report is awaited: a model call, a running tool or a
        step (what a snapshot cannot write down)."""
        return (
            self.model_outstanding
            or self.batch.any_with(RUNNING)
            or self.pending_step() is not None
        )

    # -- copying and comparing --------------------------------------------------------------

    def copy(self) -> EngineState:
        """An independent state: every container copied (each call's bookkeeping too);
        configuration and immutable values shared."""
        new = object.__new__(EngineState)
        for name, copied in _COPIES:
            value = getattr(self, name)
            object.__setattr__(new, name, value if copied is None else copied(value))
        return new

    def control_key(self) -> tuple[Any, ...]:
        """Every keyed field, each as its key (see ``Engine.control_key``); the state
        first."""
        values = _KEYED_VALUES(self)
        return tuple(
            value if key is None else key(value) for value, key in zip(values, _KEYS, strict=True)
        )


_FIELDS: Final = attrs.fields(EngineState)
_COPIES: Final = tuple((f.name, f.metadata.get("copy")) for f in _FIELDS)
# The state first: a search reads it from the key (testing/_explore.py).
_KEYED: Final = (
    _FIELDS.state,
    *(f for f in _FIELDS if f.metadata["keyed"] and f is not _FIELDS.state),
)
_KEYED_VALUES: Final = operator.attrgetter(*(f.name for f in _KEYED))
_KEYS: Final[tuple[_Key | None, ...]] = tuple(f.metadata["key"] for f in _KEYED)


def fields_of(role: str) -> frozenset[str]:
    """The names of the fields of ``role`` (one of ``ROLES``)."""
    return frozenset(f.name for f in _FIELDS if f.metadata["role"] == role)
