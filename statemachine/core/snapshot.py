"""Engine snapshots: writing, reading and checking ``Engine.snapshot`` data.

``write`` turns an engine at rest into the snapshot dict (JSON-ready; messages in
the wire format of ``core/wire.py``). ``read`` rebuilds an engine from one that came
from outside the process, through four gates in this order, before the engine is
used:

1. the shape gate (``check_shape``): only JSON values, at most ``max_depth`` levels
   deep and about ``max_bytes`` of JSON text; an iterative walk, so no input can
   exhaust the stack;
2. the signature gate (``verify``), when a key is given;
3. the field readers (``field``, ``string``, ``integer``...), which refuse wrong
   types, missing and unknown keys with a ``SnapshotError`` whose message starts with
   the field's path;
4. the self-check (``check_restored``): a snapshot that no run could have written is
   refused (its batch, history, transition log and flags must agree with each other;
   ``Engine.restore`` lists the rules).

Signatures are HMAC-SHA256 over the snapshot's canonical JSON (sorted keys, no
spaces, ASCII only, the ``signature`` field left out), stored as
``"hmac-sha256:<hex>"`` in the ``signature`` field. They prove that a holder of the
key wrote the snapshot and that nobody changed it since; they do not hide anything.

This module writes and reads the engine's state record (``EngineState``,
``core/state.py``) field by field; it knows nothing else of the engine, which calls
it (``Engine.snapshot``, ``Engine.restore``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from typing import Any, Final

from statemachine.core.batch import (
    DONE,
    READY,
    RUNNING,
    STATUSES,
    WAITING_APPROVAL,
    WAITING_PERMISSION,
    Batch,
    CallSlot,
)
from statemachine.core.checks import positive_int
from statemachine.core.invariants import history_violations
from statemachine.core.limits import UsageLimits
from statemachine.core.messages import (
    AssistantMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    thaw_json,
)
from statemachine.core.output import OUTPUT_ACCEPTED, TEXT_OUTPUT, OutputSpec
from statemachine.core.queue import NO_INPUT, InputQueue
from statemachine.core.state import EngineState
from statemachine.core.table import (
    BASE_TABLE,
    INITIAL,
    TRANSITIONS,
    State,
    Table,
    Trigger,
    TurnState,
)
from statemachine.core.tools import Scheduling, ToolDefinition, check_tool_retries
from statemachine.core.trace import Trace, TransitionRecord
from statemachine.core.wire import (
    block_from_dict,
    message_from_dict,
    message_to_dict,
    usage_from_dict,
    usage_to_dict,
)
from statemachine.errors import (
    InvalidInputError,
    ProtocolError,
    SnapshotError,
    SnapshotSignatureError,
    UsageError,
    WireFormatError,
)

__all__ = [
    "DEFAULT_MAX_SNAPSHOT_BYTES",
    "DEFAULT_MAX_SNAPSHOT_DEPTH",
    "SIGNATURE_FIELD",
    "SNAPSHOT_VERSION",
    "check_restored",
    "check_shape",
    "read",
    "sign",
    "verify",
    "write",
]

S = TurnState

SNAPSHOT_VERSION: Final = 1

DEFAULT_MAX_SNAPSHOT_BYTES: Final = 32 * 1024 * 1024
"""About how much JSON text a snapshot may hold (strings counted by length)."""

DEFAULT_MAX_SNAPSHOT_DEPTH: Final = 64
"""How deeply a snapshot may nest. The snapshot's own structure uses six levels; the
rest is for tool-call arguments and schemas. Far below Python's recursion limit, so
the recursive parsers that run after the shape gate cannot exhaust the stack."""

SIGNATURE_FIELD: Final = "signature"
_MAX_INT_BITS: Final = 1024
_SCHEME: Final = "hmac-sha256:"


# -- writing --------------------------------------------------------------------------------


def write(run: EngineState) -> dict[str, Any]:
    """The snapshot of the state ``run`` (unsigned); see ``Engine.snapshot``."""
    batch, queue = run.batch, run.queue
    if run.outstanding():
        raise ProtocolError(f"cannot snapshot in {run.state} while an operation is outstanding")
    data = {
        "version": SNAPSHOT_VERSION,
        "runId": run.run_id,
        "state": run.state.value,
        "maxTurns": run.max_turns,
        "usageLimits": None if run.usage_limits is None else run.usage_limits.to_dict(),
        "output": None if run.output is None else run.output.to_dict(),
        "outputCall": run.output_call,
        "outputFailures": run.output_failures,
        "outputError": run.output_error,
        "outputRemind": run.output_remind,
        "checkPermissions": run.check_permissions,
        "checkContinue": run.check_continue,
        "turns": run.turns,
        "usage": usage_to_dict(run.usage),
        **({"delegatedRequests": run.delegated_requests} if run.delegated_requests else {}),
        **({"toolCalls": run.tool_calls} if run.tool_calls else {}),
        **_retries_to_dict(run),
        # written only where counted: a snapshot of a run that did not count them (one
        # restored from before they were) restores as it ran (rule 14)
        **(
            {"unknownToolRetries": run.unknown_tool_retries}
            if run.unknown_tool_retries is not None
            else {}
        ),
        "tools": [
            {"name": d.name, "description": d.description, "parameters": d.schema_dict()}
            for d in run.tools
        ],
        "messages": [message_to_dict(m) for m in run.history],
        "batch": [_slot_to_dict(s) for s in batch],
        "flushed": batch.flushed,
        "denial": None
        if run.denial is None
        else {"callId": run.denial[0].id, "reason": run.denial[1]},
        "steer": [message_to_dict(m) for m in queue.steer],
        "followUp": [message_to_dict(m) for m in queue.follow_up],
        "continuePending": run.continue_pending,
        "stopReason": run.stop_reason,
        "abortReason": run.abort_reason,
        "explanation": run.explanation,
        "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in run.trace],
    }
    if run.table.steps:  # only a run with steps: others write what they always wrote
        data["stepRetries"] = dict(run.step_retries)
        decision = run.step_decision
        data["stepDecision"] = None if decision is None else list(decision)
    return data


def _slot_to_dict(slot: CallSlot) -> dict[str, Any]:
    return {
        "call": message_to_dict(AssistantMessage((slot.call,)))["content"][0],
        "status": slot.status,
        "sequential": slot.sequential,
        "resources": sorted(slot.resources),
        "note": slot.note,
        "result": None if slot.result is None else message_to_dict(slot.result),
    }


# -- reading ---------------------------------------------------------------------------------


def read(
    data: Mapping[str, Any],
    *,
    scheduling: Mapping[str, Scheduling] | None,
    key: bytes | str | None,
    max_bytes: int,
    max_depth: int,
    table: Table = BASE_TABLE,
) -> EngineState:
    """The state the snapshot ``data`` holds, through the gates of the module
    docstring; see ``Engine.restore``. ``table``: the table of the run's declared
    steps (a snapshot of a run with steps needs it)."""
    for name, limit in (("max_bytes", max_bytes), ("max_depth", max_depth)):
        positive_int(name, limit)
    check_shape(data, max_bytes=max_bytes, max_depth=max_depth)
    if key is not None:
        verify(data, key)
    try:
        run = _load(data, scheduling, table)
    except SnapshotError:
        raise
    except (InvalidInputError, WireFormatError) as exc:  # a parser names the path
        raise SnapshotError(str(exc)) from None
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
        # Not expected: every field is read by a typed reader. Kept so that a gap
        # still gives the documented error, never a crash.
        raise SnapshotError(f"snapshot: malformed ({type(exc).__name__})") from None
    check_restored(run)
    return run


def _load(
    data: Mapping[str, Any], scheduling: Mapping[str, Scheduling] | None, table: Table
) -> EngineState:
    p = "snapshot"
    only_keys(data, _SNAPSHOT_KEYS, p)
    if ("stepRetries" in data) != bool(table.steps):
        raise SnapshotError(
            "snapshot.stepRetries: the snapshot was written by a run with declared steps; "
            "restore it with that run's table"
            if "stepRetries" in data
            else "snapshot.stepRetries: missing, but a table with declared steps was given"
        )
    version = field(data, "version", p)
    if type(version) is not int or version != SNAPSHOT_VERSION:
        raise SnapshotError(f"snapshot.version: {version!r:.40} is not {SNAPSHOT_VERSION}")
    tools = tuple(
        _tool_from(t, f"snapshot.tools[{i}]") for i, t in enumerate(array(data, "tools", p))
    )
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise SnapshotError("snapshot.tools: tool names repeat")
    history = [
        message_from_dict(obj(d, f"{p}.messages[{i}]"), path=f"{p}.messages[{i}]")
        for i, d in enumerate(array(data, "messages", p))
    ]
    if not history:
        raise SnapshotError("snapshot.messages: empty")
    state_name = string(data, "state", p)
    initial = table.state_named(state_name) if table.steps else _STATES.get(state_name)
    if initial is None:
        raise SnapshotError(f"snapshot.state: {state_name!r:.40} is not a state")
    run = EngineState.start(
        tools=tools,
        history=history,
        max_turns=integer(data, "maxTurns", p, minimum=1),
        usage_limits=_limits_from(data.get("usageLimits")),
        output=None
        if data.get("output") is None
        else OutputSpec.from_dict(data["output"], "snapshot.output"),
        check_permissions=boolean(data, "checkPermissions", p),
        check_continue=boolean(data, "checkContinue", p),
        scheduling=scheduling,
        run_id=string(data, "runId", p),
        state=initial,
        table=table,
    )
    _load_progress(run, data)
    return run


def _retries_to_dict(run: EngineState) -> dict[str, Any]:
    """The retry budgets and counts (rule 14), only where a tool has a budget."""
    if not run.tool_retries and not run.tool_failures:
        return {}
    spent = run.retries_spent
    return {
        "toolRetries": dict(run.tool_retries),
        "toolFailures": dict(run.tool_failures),
        "retriesSpent": None if spent is None else list(spent),
    }


def _retries_from(run: EngineState, data: Mapping[str, Any]) -> None:
    p = "snapshot"
    if "toolRetries" not in data:  # no tool had a budget (or written before budgets)
        return
    budgets, failures = (
        obj(data["toolRetries"], f"{p}.toolRetries"),
        obj(data.get("toolFailures", {}), f"{p}.toolFailures"),
    )
    try:
        run.tool_retries = check_tool_retries(budgets)
        run.tool_failures = check_tool_retries(failures)
    except InvalidInputError as exc:
        raise SnapshotError(f"{p}: {exc}") from None
    spent = data.get("retriesSpent")
    if spent is None:
        return
    if not isinstance(spent, list) or [type(s) for s in spent] != [str, str]:
        raise SnapshotError(f"{p}.retriesSpent: expected [tool, message] or null")
    run.retries_spent = (spent[0], spent[1])


def _load_progress(run: EngineState, data: Mapping[str, Any]) -> None:
    """The fields a run changes as it goes: counters, batch, queues, flags, the log."""
    p = "snapshot"
    run.turns = integer(data, "turns", p, minimum=0)
    if "outputFailures" in data:  # absent from snapshots written before output types
        run.output_call = string(data, "outputCall", p, optional=True)
        run.output_failures = integer(data, "outputFailures", p, minimum=0)
        run.output_error = string(data, "outputError", p, optional=True)
        run.output_remind = boolean(data, "outputRemind", p)
    if "usage" in data:  # absent from snapshots written before usage was counted
        run.usage = usage_from_dict(obj(data["usage"], f"{p}.usage"), f"{p}.usage")
    if "delegatedRequests" in data:  # written only once a sub-agent's usage joined
        run.delegated_requests = integer(data, "delegatedRequests", p, minimum=0)
    if "toolCalls" in data:  # written only once a tool-call limit counted one
        run.tool_calls = integer(data, "toolCalls", p, minimum=0)
    _retries_from(run, data)
    if "unknownToolRetries" in data:
        run.unknown_tool_retries = integer(data, "unknownToolRetries", p, minimum=0)
    slots = [
        _slot_from(item, f"snapshot.batch[{i}]") for i, item in enumerate(array(data, "batch", p))
    ]
    run.batch = Batch.of(slots, integer(data, "flushed", p, minimum=0))
    if len(run.batch.by_id) != len(slots):
        raise SnapshotError("snapshot.batch: call ids repeat")
    run.seen_ids.update(run.batch.by_id)
    run.denial = _denial_from(run.batch, field(data, "denial", p))
    steer = [_user(d, f"snapshot.steer[{i}]") for i, d in enumerate(array(data, "steer", p))]
    follow_up = [
        _user(d, f"snapshot.followUp[{i}]") for i, d in enumerate(array(data, "followUp", p))
    ]
    run.queue = InputQueue(steer, follow_up) if steer or follow_up else NO_INPUT
    run.continue_pending = boolean(data, "continuePending", p)
    run.stop_reason = string(data, "stopReason", p, optional=True)
    run.abort_reason = string(data, "abortReason", p, optional=True)
    run.explanation = string(data, "explanation", p, optional=True)
    states = {s.value: s for s in run.table.states} if run.table.steps else _STATES
    run.trace = Trace(
        _record_from(r, f"snapshot.trace[{i}]", states)
        for i, r in enumerate(array(data, "trace", p))
    )
    if run.table.steps:
        _load_steps(run, data)


def _load_steps(run: EngineState, data: Mapping[str, Any]) -> None:
    retries = obj(data["stepRetries"], "snapshot.stepRetries")
    names = {step.name for step in run.table.steps}
    for name in retries:
        if name not in names:
            raise SnapshotError(f"snapshot.stepRetries: {name!r:.40} is not a declared step")
        integer(retries, name, "snapshot.stepRetries", minimum=0)
    run.step_retries = tuple(sorted(retries.items()))
    decision = data.get("stepDecision")
    if decision is not None:
        if (
            not isinstance(decision, (list, tuple))
            or len(decision) != 2
            or not isinstance(decision[0], str)
            or not isinstance(decision[1], str)
        ):
            raise SnapshotError("snapshot.stepDecision: expected [outcome, message]")
        run.step_decision = (decision[0], decision[1])


def _limits_from(value: object) -> UsageLimits | None:
    if value is None:  # null, or absent from snapshots written before usage limits
        return None
    return UsageLimits.from_dict(value, "snapshot.usageLimits")


def _denial_from(batch: Batch, value: object) -> tuple[ToolCall, str] | None:
    if value is None:
        return None
    d = obj(value, "snapshot.denial")
    only_keys(d, frozenset({"callId", "reason"}), "snapshot.denial")
    call_id = string(d, "callId", "snapshot.denial")
    reason = string(d, "reason", "snapshot.denial")
    slot = batch.slot(call_id)
    if slot is None:
        raise SnapshotError(
            f"snapshot.denial.callId: {call_id!r:.40} is not a call of snapshot.batch"
        )
    return slot.call, reason


# -- checking a restored snapshot against itself ------------------------------------------


def check_restored(run: EngineState) -> None:
    """Refuse a restored snapshot that no run could have written (see ``restore``)."""
    state = run.state
    if state in _NEVER_AT_REST or run.pending_step() is not None:
        raise SnapshotError(
            f"snapshot.state: {state} always has an operation outstanding, and no "
            "snapshot is taken while one is"
        )
    _check_trace(run)
    _check_batch_is_last_calls(run)
    _check_slots(run)
    _check_flags(run)
    batch = run.batch
    open_tail = bool(batch) and batch.flushed < len(batch)
    violations = history_violations(list(run.history), allow_open_tail=open_tail)
    if violations:
        raise SnapshotError(
            "snapshot.messages: invalid history: " + "; ".join(map(str, violations[:3]))
        )


def _check_trace(run: EngineState) -> None:
    # The log is replayed: each record a row of the table, each starting where the
    # one before ended, each stamped with the model calls made before it.
    at: State = INITIAL
    turns = 0
    rows = (
        _ROW_SET
        if not run.table.steps
        else frozenset((r.source, r.trigger, r.dest) for r in run.table.rows)
    )
    for i, r in enumerate(run.trace):
        if (r.source, r.trigger, r.dest) not in rows:
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
        if r.dest is S.AWAITING_MODEL and r.source is not S.AWAITING_MODEL:
            turns += 1
        at = r.dest
    if at is not run.state:
        raise SnapshotError(f"snapshot.state: {run.state}, but the trace ends in {at}")
    if turns != run.turns:
        raise SnapshotError(
            f"snapshot.turns: {run.turns}, but the trace shows {turns} model call(s)"
        )


def _check_batch_is_last_calls(run: EngineState) -> None:
    batch, history, flushed = run.batch, run.history, run.batch.flushed
    if not batch:
        if flushed:
            raise SnapshotError(f"snapshot.flushed: {flushed}, but the batch is empty")
        return
    k = next(
        (i for i in range(len(history) - 1, -1, -1) if isinstance(history[i], AssistantMessage)),
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
    if run.denial is not None:
        run.denial = (batch.by_id[run.denial[0].id].call, run.denial[1])
    tail = history[k + 1 :]
    if flushed > len(batch) or len(tail) != flushed:
        raise SnapshotError(
            f"snapshot.flushed: {flushed}, but {len(tail)} message(s) follow the last "
            f"assistant message and the batch holds {len(batch)} call(s)"
        )
    for i, message in enumerate(tail):
        if message != batch.slots[i].result:
            raise SnapshotError(
                f"snapshot.batch[{i}].result: differs from snapshot.messages[{k + 1 + i}], "
                "its place in the history"
            )


def _check_slots(run: EngineState) -> None:
    state = run.state
    allowed = _OPEN_STATUSES.get(state, frozenset())
    for i, slot in enumerate(run.batch):
        p = f"snapshot.batch[{i}]"
        done = slot.status == DONE
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
            if i == run.batch.flushed:
                raise SnapshotError(
                    f"{p}.status: done, but its result is held back although every "
                    "result before it is in the history (snapshot.flushed)"
                )
            continue
        if slot.status not in allowed:
            raise SnapshotError(f"{p}.status: {slot.status!r} is impossible in {state}")
        _check_dispatchable(run, slot, p)
        # A ready call in AwaitingUser may be held back by an earlier one, or
        # approved by a person while others still wait: both are fine, so what
        # made it ready cannot be read from here. resume_run asks the policy again.
    statuses = {s.status for s in run.batch}
    if state is S.DISPATCHING_TOOLS and WAITING_PERMISSION not in statuses:
        raise SnapshotError("snapshot.state: DispatchingTools, but no call waits for permission")
    if state is S.AWAITING_USER and statuses - {DONE} and WAITING_APPROVAL not in statuses:
        raise SnapshotError(
            "snapshot.batch: calls are open in AwaitingUser, but none waits for approval"
        )


def _check_dispatchable(run: EngineState, slot: CallSlot, p: str) -> None:
    """A call still open named a known tool and had readable arguments: dispatch
    answers any other at once. (Its arguments are not matched against the
    snapshot's own schema here: a hostile pattern could make that take forever.
    ``resume_run`` matches them against the caller's tools.)"""
    call = slot.call
    if call.name not in run.tools_by_name:
        raise SnapshotError(f"{p}.call: tool {call.name!r} is not in snapshot.tools")
    if call.parse_error is not None:
        raise SnapshotError(f"{p}.call: arguments that could not be parsed cannot be open")


def _check_flags(run: EngineState) -> None:
    state = run.state
    # At rest, TurnBoundary always waits for should_continue; an abort there leaves
    # the (now moot) question pending in Aborted.
    if run.continue_pending != (state is S.TURN_BOUNDARY) and not (
        run.continue_pending and state is S.ABORTED
    ):
        raise SnapshotError(
            f"snapshot.continuePending: {str(run.continue_pending).lower()} in {state}"
        )
    if state is S.READY and run.batch:
        raise SnapshotError("snapshot.batch: not empty, but no model call was made")
    if state is S.READY and isinstance(run.history[-1], AssistantMessage):
        raise SnapshotError("snapshot.messages: a run in Ready cannot end with the model")
    if state in run.table.returns_to_caller and run.explanation is None:
        raise SnapshotError(f"snapshot.explanation: missing in {state}")
    # The accepting result is in the history, or held back in the batch (I2).
    held = [slot.result for slot in run.batch if slot.result is not None]
    native = run.output is not None and (run.output.native or run.output.plain)
    if native and run.output_call not in (None, TEXT_OUTPUT):
        raise SnapshotError("snapshot.outputCall: a native-mode output is the final text")
    if (
        run.output_call is not None
        and not native
        and not any(
            isinstance(m, ToolResultMessage)
            and m.tool_call_id == run.output_call
            and run.output is not None
            and run.output.owns(m.tool_name)
            and m.text == OUTPUT_ACCEPTED
            for m in [*run.history, *held]
        )
    ):
        raise SnapshotError("snapshot.outputCall: no final-result call of that id was accepted")
    if run.abort_reason is not None and state is not S.ABORTED:
        raise SnapshotError(f"snapshot.abortReason: set, but the run is {state}")
    if run.denial is not None:
        slot = run.batch.by_id[run.denial[0].id]
        result = slot.result
        if (
            result is None
            or not result.is_error
            or (result.text != f"Tool call denied: {run.denial[1]}")
        ):
            raise SnapshotError(
                "snapshot.denial: the call it names was not answered with that denial"
            )


_SNAPSHOT_KEYS: Final = frozenset(
    {
        "version",
        "runId",
        "stepRetries",
        "stepDecision",
        "state",
        "maxTurns",
        "usageLimits",
        "output",
        "outputCall",
        "outputFailures",
        "outputError",
        "unknownToolRetries",
        "outputRemind",
        "checkPermissions",
        "checkContinue",
        "turns",
        "usage",
        "delegatedRequests",
        "toolCalls",
        "toolRetries",
        "toolFailures",
        "retriesSpent",
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
        SIGNATURE_FIELD,
    }
)
_SLOT_KEYS: Final = frozenset({"call", "status", "sequential", "resources", "note", "result"})
_STATES: Final[dict[str, State]] = {s.value: s for s in TurnState}
_TRIGGERS: Final = {t.value: t for t in Trigger}
_ROW_SET: Final = frozenset((r.source, r.trigger, r.dest) for r in TRANSITIONS)
# States a run only passes through while an operation is outstanding.
_NEVER_AT_REST: Final = frozenset({S.AWAITING_MODEL, S.COLLECTING_RESULTS, S.ABORTING})
# The statuses a call without a result may have when the run rests in a state.
_OPEN_STATUSES: Final[dict[State, frozenset[str]]] = {
    S.DISPATCHING_TOOLS: frozenset({WAITING_PERMISSION, WAITING_APPROVAL, READY}),
    S.AWAITING_USER: frozenset({WAITING_APPROVAL, READY}),
}


def _call_key(call: ToolCall) -> str:
    # Exact JSON, not ==: in Python 1 == 1.0 == True, and a tool would see the difference.
    return json.dumps(
        [call.id, call.name, thaw_json(call.arguments), call.parse_error], sort_keys=True
    )


def _tool_from(value: object, path: str) -> ToolDefinition:
    d = obj(value, path)
    only_keys(d, frozenset({"name", "description", "parameters"}), path)
    name = string(d, "name", path)
    description = string(d, "description", path)
    parameters = obj(field(d, "parameters", path), f"{path}.parameters")
    try:
        return ToolDefinition(name, description, parameters)
    except InvalidInputError as exc:
        raise SnapshotError(f"{path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the schema library on a hostile schema
        raise SnapshotError(
            f"{path}.parameters: not a usable JSON Schema ({type(exc).__name__})"
        ) from None


def _slot_from(value: object, path: str) -> CallSlot:
    item = obj(value, path)
    only_keys(item, _SLOT_KEYS, path)
    call = block_from_dict(field(item, "call", path), ("toolCall",), f"{path}.call")
    assert isinstance(call, ToolCall)
    slot = CallSlot(call)
    status = string(item, "status", path)
    if status not in STATUSES or status == RUNNING:
        raise SnapshotError(f"{path}.status: {status!r:.40} is not a status a snapshot holds")
    slot.status = status
    slot.sequential = boolean(item, "sequential", path)
    resources = array(item, "resources", path)
    if not all(isinstance(r, str) for r in resources):
        raise SnapshotError(f"{path}.resources: expected an array of strings")
    slot.resources = frozenset(resources)
    slot.note = string(item, "note", path)
    result = field(item, "result", path)
    if result is not None:
        message = message_from_dict(obj(result, f"{path}.result"), path=f"{path}.result")
        if not isinstance(message, ToolResultMessage):
            raise SnapshotError(f"{path}.result: expected a tool result message")
        slot.result = message
    return slot


def _record_from(value: object, path: str, states: Mapping[str, State]) -> TransitionRecord:
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise SnapshotError(f"{path}: expected [source, trigger, dest, turn]")
    source, trigger, dest, turn = value
    if not (
        isinstance(source, str)
        and source in states
        and isinstance(trigger, str)
        and trigger in _TRIGGERS
        and isinstance(dest, str)
        and dest in states
    ):
        raise SnapshotError(f"{path}: names an unknown state or trigger")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise SnapshotError(f"{path}[3]: expected an integer >= 0")
    return TransitionRecord(states[source], _TRIGGERS[trigger], states[dest], turn)


def _user(value: object, path: str) -> UserMessage:
    message = message_from_dict(obj(value, path), path=path)
    if not isinstance(message, UserMessage):
        raise SnapshotError(f"{path}: queued input must be a user message")
    return message


# -- the shape gate ---------------------------------------------------------------------


def _path(node: tuple[Any, ...] | None) -> str:
    # Paths are kept as (parent, key) links and spelled out only for an error: building
    # a string for every node would cost more than the walk itself.
    parts: list[str] = []
    while node is not None:
        node, key = node
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "snapshot" + "".join(reversed(parts))


def check_shape(data: object, *, max_bytes: int, max_depth: int) -> None:
    """Refuse anything but a JSON object within the size and depth limits.

    Walks iteratively; the size is the length of the JSON text, give or take the
    escapes of strings and the digits of numbers.
    """
    if not isinstance(data, Mapping):
        raise SnapshotError(f"snapshot: expected a JSON object, got {type(data).__name__}")
    size = 0
    stack: list[tuple[object, int, tuple[Any, ...] | None]] = [(data, 1, None)]
    while stack:
        value, depth, link = stack.pop()
        if isinstance(value, str):
            size += len(value) + 2
        elif value is None or isinstance(value, bool):
            size += 8
        elif isinstance(value, int):
            # Python reads any length of digits; json and repr refuse past 4300 of them.
            if value.bit_length() > _MAX_INT_BITS:
                raise SnapshotError(f"{_path(link)}: an integer of over {_MAX_INT_BITS} bits")
            size += 8
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise SnapshotError(f"{_path(link)}: {value!r} is not a JSON number")
            size += 8
        elif isinstance(value, (list, tuple)):
            if depth > max_depth:
                raise SnapshotError(f"{_path(link)}: nested deeper than {max_depth} levels")
            size += 2 + len(value)
            stack.extend((item, depth + 1, (link, i)) for i, item in enumerate(value))
        elif isinstance(value, Mapping):
            if depth > max_depth:
                raise SnapshotError(f"{_path(link)}: nested deeper than {max_depth} levels")
            size += 2
            for key, item in value.items():
                if not isinstance(key, str):
                    raise SnapshotError(f"{_path(link)}: object key {key!r} is not a string")
                size += len(key) + 4
                stack.append((item, depth + 1, (link, key)))
        else:
            raise SnapshotError(f"{_path(link)}: a {type(value).__name__} is not a JSON value")
        if size > max_bytes:
            raise SnapshotError(
                f"snapshot: larger than max_bytes={max_bytes} (about {size} bytes read so far)"
            )


# -- signatures -----------------------------------------------------------------------------


def _key_bytes(key: object) -> bytes:
    usage = "a snapshot key must be non-empty bytes or a str that UTF-8 can encode"
    if isinstance(key, str):
        try:
            key = key.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: unusable, like an empty key
            raise UsageError(usage) from None
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise UsageError(usage)
    return bytes(key)


def _plain(value: object) -> object:
    # json.dumps knows dict and list; a snapshot may hold other mappings and tuples.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _digest(data: Mapping[str, Any], key: bytes) -> str:
    body = {k: v for k, v in data.items() if k != SIGNATURE_FIELD}
    text = json.dumps(
        body,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
        default=_plain,
    )
    return _SCHEME + hmac.new(key, text.encode("ascii"), hashlib.sha256).hexdigest()


def sign(data: Mapping[str, Any], key: bytes | str) -> dict[str, Any]:
    """A copy of ``data`` with a ``signature`` field over the rest of it."""
    signed = {k: v for k, v in data.items() if k != SIGNATURE_FIELD}
    signed[SIGNATURE_FIELD] = _digest(signed, _key_bytes(key))
    return signed


def verify(data: Mapping[str, Any], key: bytes | str) -> None:
    """Refuse ``data`` unless its signature is the one ``key`` gives (shape-checked data)."""
    raw = _key_bytes(key)
    given = data.get(SIGNATURE_FIELD)
    if given is None:
        raise SnapshotSignatureError(
            "snapshot.signature: missing, but a key was given (sign snapshots with "
            "snapshot(key=...) or Engine.sign_snapshot before they leave the process)"
        )
    if not isinstance(given, str):
        raise SnapshotSignatureError(
            f"snapshot.signature: expected a string, got {type(given).__name__}"
        )
    expected = _digest(data, raw)
    if not hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "replace")):
        raise SnapshotSignatureError(
            "snapshot.signature: does not match the key: the snapshot was changed after it "
            "was signed, or signed with another key"
        )


# -- typed field access ------------------------------------------------------------------------


def field(d: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in d:
        raise SnapshotError(f"{path}.{key}: missing")
    return d[key]


def obj(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SnapshotError(f"{path}: expected an object, got {type(value).__name__}")
    return value


def array(d: Mapping[str, Any], key: str, path: str) -> list[Any] | tuple[Any, ...]:
    value = field(d, key, path)
    if not isinstance(value, (list, tuple)):
        raise SnapshotError(f"{path}.{key}: expected an array, got {type(value).__name__}")
    return value


def string(d: Mapping[str, Any], key: str, path: str, *, optional: bool = False) -> Any:
    value = field(d, key, path)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        want = "a string or null" if optional else "a string"
        raise SnapshotError(f"{path}.{key}: expected {want}, got {type(value).__name__}")
    return value


def boolean(d: Mapping[str, Any], key: str, path: str) -> bool:
    value = field(d, key, path)
    if not isinstance(value, bool):
        raise SnapshotError(f"{path}.{key}: expected true or false, got {type(value).__name__}")
    return value


def integer(d: Mapping[str, Any], key: str, path: str, *, minimum: int) -> int:
    value = field(d, key, path)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SnapshotError(f"{path}.{key}: expected an integer >= {minimum}, got {value!r:.40}")
    return value


def only_keys(d: Mapping[str, Any], allowed: frozenset[str], path: str) -> None:
    extra = d.keys() - allowed
    if extra:
        raise SnapshotError(f"{path}: unknown key(s) {', '.join(sorted(map(repr, extra)))}")
