"""Durable runs on DBOS (the ``[dbos]`` extra): the action loop inside a DBOS workflow.

A run is one DBOS workflow, named ``statemachine.run``, whose id is the run id. It
drives the same ``AgentRun`` as ``run_agent`` (the one action loop of
``statemachine.agent.loop``); only the executor differs (``_DurableRun``): each model
call, each tool call, each batch of ``before_tool_call`` checks and each
``should_continue`` check runs as a DBOS step whose recorded output is the JSON of the
engine events it reported (``statemachine.core.wire``; our messages do not pickle).
After a crash DBOS runs the workflow again from the top: the steps already recorded
return their saved events without running, so the engine receives the same events in
the same order and ends up with the same history and trace. The tool results of a
batch are handed to the engine in call order, whatever order the tools finish in, so
that this order does not depend on timing.

Models, tools and hooks are code, not data: the workflow's input names the model and
the tools, and every worker process resolves the names in its own registry
(``DBOSRunner(models={...}, tools=[...])``). So every worker must be built with the
same registry, and a model client must keep no state between calls (after a restart
it is a fresh object; a model keyed on a call counter would answer turn 1 again).

Messages to a run (``steer``, ``follow_up``, ``abort``, approval decisions) are DBOS
messages on one topic, stored in the database, so they may be sent from any process,
with or without a live worker. The run takes them at deterministic points: before
each model call (a recorded ``recv`` that does not wait) and while it waits for
approvals. So an abort reaches a run at its next model call or while it waits for a
person, not in the middle of a tool call.

Approvals: when ``before_tool_call`` asks for approval, the run publishes the
pending calls (a DBOS event, ``pending``) and waits for decisions for as long as it
takes (a durable ``recv``; the worker may die and restart meanwhile). A decision is
sent with the idempotency key ``"{run_id}:{call_id}"``, so a second decision sent
before the run took the first is dropped by DBOS; one sent after is refused by
``decide`` with ``NotPendingError``, as is a decision for a call that is not pending.

The database: SQLite by default (``sqlite:///statemachine.sqlite``); one runner per
process (DBOS is a process-wide singleton). At ``launch()`` DBOS recovers the
unfinished runs of this executor id and this application version
(``statemachine.durable.application_version()``).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import partial
from typing import Any

from dbos import DBOS, DBOSClient, DBOSConfig, SetWorkflowID, StepOptions, WorkflowHandleAsync

from statemachine.agent.events import _ERRORS, RunResult
from statemachine.agent.hooks import AfterToolCall, BeforeToolCall, ShouldContinue
from statemachine.agent.model import ModelClient
from statemachine.agent.run import (
    AgentRun,
)
from statemachine.agent.tools import Tool
from statemachine.core.errors import InvalidInputError, UsageError
from statemachine.core.events import (
    ApprovalDecided,
    CallModel,
    Event,
    InputQueued,
    ModelCancelled,
)
from statemachine.core.inputs import check_history
from statemachine.core.messages import Message, ToolCall, UserMessage
from statemachine.core.table import Trigger, TurnState
from statemachine.core.trace import TransitionRecord
from statemachine.core.wire import (
    block_from_dict,
    block_to_dict,
    event_from_dict,
    event_to_dict,
    message_from_dict,
    message_to_dict,
    messages_from_dicts,
    messages_to_dicts,
)
from statemachine.durable import (
    NotPendingError,
    RunStatus,
    UnknownRunError,
    _durable_run_id,
    application_version,
)

__all__ = ["DBOSRunHandle", "DBOSRunner", "connect"]

WORKFLOW = "statemachine.run"
_CONTROL = "statemachine.control"  # the topic of every message to a run
_PENDING = "pending"  # the event holding the calls waiting for a decision
_WAIT_SECONDS = 7 * 24 * 3600.0  # one recv's wait for a person; the wait then goes on
_POLL = 0.05  # how often a handle's result() looks (DBOS's default is a second)
MAX_MESSAGE_CHARS = 100_000  # a steer or follow-up message, a reason

_capture: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar(
    "statemachine_durable_capture", default=None
)


class _Capture:
    """Stands in for the loop's inbox inside a step: keeps what the operation reports,
    so that the step's recorded output is exactly those events."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def put_nowait(self, event: Event) -> None:
        self.events.append(event)


class _DurableRun(AgentRun):
    """``AgentRun`` with each operation a DBOS step (module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        self._order: list[str] = []  # call ids of started tools, in call order
        self._ready: dict[str, list[Event]] = {}  # their recorded events, until posted
        super().__init__(**kwargs)

    # Inside a step the inbox is the step's capture (the permission and continue
    # checks post to the inbox directly).
    @property
    def _inbox(self) -> Any:
        capture = _capture.get()
        return capture if capture is not None else self.__dict__.get("_real_inbox")

    @_inbox.setter
    def _inbox(self, value: Any) -> None:
        self.__dict__["_real_inbox"] = value

    def _post(self, key: str, event: Event) -> None:
        capture = _capture.get()
        if capture is not None:
            capture.put_nowait(event)
            return
        super()._post(key, event)
        self._flush()

    # -- the seam --------------------------------------------------------------------------

    def _start_model(self, action: CallModel, alone: bool) -> None:
        self._spawn("model", self._model_turn(action), alone)

    def _start_tool(self, call: ToolCall, alone: bool) -> None:
        self._order.append(call.id)
        step = self._step(call.id, "statemachine.tool", partial(self._run_tool, call))
        self._spawn(call.id, step, alone)

    def _start_permission_checks(self, calls: list[ToolCall]) -> None:
        self._helper(
            self._step("", "statemachine.permissions", partial(self._check_permissions, calls))
        )

    def _start_continue_check(self, turn: int) -> None:
        self._helper(self._step("", "statemachine.continue", partial(self._check_continue, turn)))

    # -- steps -----------------------------------------------------------------------------

    async def _model_turn(self, action: CallModel) -> None:
        if await self._take_messages():
            self._not_started("model", ModelCancelled("not started: the run was aborted"))
            return
        await self._step("model", "statemachine.model", partial(self._call_model, action))

    async def _step(
        self, key: str, name: str, operation: Callable[[], Coroutine[Any, Any, None]]
    ) -> None:
        """Run ``operation`` as the DBOS step ``name``; hand its events to the loop."""
        capture = _Capture()

        async def step() -> list[dict[str, Any]]:
            capture.events.clear()  # a retried attempt starts afresh
            token = _capture.set(capture)
            run_token = _durable_run_id.set(self.run_id)
            try:
                await operation()
            finally:
                _durable_run_id.reset(run_token)
                _capture.reset(token)
            return [event_to_dict(e) for e in capture.events]

        try:
            saved = await DBOS.run_step_async(StepOptions(name=name), step)
        except asyncio.CancelledError:
            # Cancelled after an abort: what it reported (its cancellation) still
            # answers it; not recorded, so a recovery runs the call again. If it
            # reported nothing, the grace period's end answers for it.
            if capture.events:
                self._deliver(key, capture.events)
            raise
        self._deliver(key, [event_from_dict(d) for d in saved])

    def _deliver(self, key: str, events: list[Event]) -> None:
        inbox = self.__dict__["_real_inbox"]
        if key in self._order:
            if key not in self._reported:
                self._ready[key] = events
            self._flush()
            return
        if key:
            if key in self._reported:
                return
            self._reported.add(key)
        for event in events:
            inbox.put_nowait(event)

    def _flush(self) -> None:
        """Post the tool results that are next in call order."""
        inbox = self.__dict__["_real_inbox"]
        while self._order:
            head = self._order[0]
            if head in self._ready:
                self._reported.add(head)
                for event in self._ready.pop(head):
                    inbox.put_nowait(event)
            elif head not in self._reported:
                return  # still running
            self._order.pop(0)

    async def _take_messages(self) -> bool:
        """Take the messages sent to the run so far (recorded; never waits); True
        if the run is aborting."""
        while True:
            message = await DBOS.recv_async(_CONTROL, timeout_seconds=0)
            if message is None:
                return self._aborting
            _apply(self, message)


def _apply(run: AgentRun, message: Mapping[str, Any]) -> None:
    """A steer, follow-up or abort message, applied to ``run`` (decisions are taken
    only while the run waits for them; a late one is dropped)."""
    kind = message.get("kind")
    if kind == "abort":
        run.abort(message.get("reason") or "aborted by the caller")
    elif kind == "steer":
        run.steer(_user_message(message))
    elif kind == "follow_up":
        run.follow_up(_user_message(message))


def _user_message(message: Mapping[str, Any]) -> UserMessage:
    user = message_from_dict(message["message"])
    if not isinstance(user, UserMessage):
        raise InvalidInputError("a queued message must be a user message")
    return user


# -- the workflow ---------------------------------------------------------------------------

_active: DBOSRunner | None = None


async def _workflow(run_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    if _active is None:
        raise UsageError("no DBOSRunner is launched in this process")
    return await _active._execute(run_id, spec)


def _call_to_dict(call: ToolCall) -> dict[str, Any]:
    return block_to_dict(call)


def _call_from_dict(d: Any) -> ToolCall:
    call = block_from_dict(d, ("toolCall",), "call")
    assert isinstance(call, ToolCall)
    return call


def _result_to_dict(result: RunResult) -> dict[str, Any]:
    return {
        "state": result.state.value,
        "messages": messages_to_dicts(result.messages),
        "turns": result.turns,
        "explanation": result.explanation,
        "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in result.trace],
        "pending": [_call_to_dict(c) for c in result.pending_approvals],
        "queued": [event_to_dict(e) for e in result.queued_input],
        "snapshot": None if result.snapshot is None else dict(result.snapshot),
    }


def _result_from_dict(run_id: str, d: Mapping[str, Any]) -> RunResult:
    state = TurnState(d["state"])
    error_type = _ERRORS.get(state)
    queued = [event_from_dict(e) for e in d["queued"]]
    return RunResult(
        state=state,
        messages=tuple(messages_from_dicts(d["messages"])),
        error=None if error_type is None else error_type(d["explanation"]),
        turns=d["turns"],
        explanation=d["explanation"],
        trace=tuple(
            TransitionRecord(TurnState(s), Trigger(t), TurnState(e), n) for s, t, e, n in d["trace"]
        ),
        run_id=run_id,
        stats=None,
        pending_approvals=tuple(_call_from_dict(c) for c in d["pending"]),
        queued_input=tuple(e for e in queued if isinstance(e, InputQueued)),
        snapshot=d["snapshot"],
    )


class DBOSRunner:
    """Runs agent runs as DBOS workflows in this process (a worker).

    ``models`` maps names to model clients and ``tools`` lists the tools a run may
    use; a run names its model and tools, and every worker resolves the names here, so
    build every worker with the same registry (module docstring). The hooks are the
    same for every run of this runner. ``executor_id`` tells workers apart: a worker
    restarted with the same id (and the same application version) takes its
    unfinished runs back at ``launch()``.
    """

    def __init__(
        self,
        *,
        models: Mapping[str, ModelClient],
        tools: Sequence[Tool] = (),
        database_url: str = "sqlite:///statemachine.sqlite",
        before_tool_call: BeforeToolCall | None = None,
        after_tool_call: AfterToolCall | None = None,
        should_continue: ShouldContinue | None = None,
        executor_id: str = "local",
        name: str = "statemachine",
        notification_interval: float = 0.1,
    ) -> None:
        if not models:
            raise InvalidInputError("models must name at least one model client")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"tool names must be unique, got {names}")
        self.models = dict(models)
        self.tools = {t.name: t for t in tools}
        self.database_url = database_url
        self.hooks: dict[str, Any] = {
            "before_tool_call": before_tool_call,
            "after_tool_call": after_tool_call,
            "should_continue": should_continue,
        }
        self.config: DBOSConfig = {
            "name": name,
            "system_database_url": database_url,
            "application_version": application_version(),
            "executor_id": executor_id,
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": notification_interval,
        }
        self._client: DBOSClient | None = None

    def launch(self) -> None:
        """Start DBOS in this process; recovers this worker's unfinished runs."""
        global _active
        if _active is not None:
            raise UsageError("a DBOSRunner is already launched in this process")
        DBOS.workflow(name=WORKFLOW)(_workflow)
        DBOS(config=self.config)
        _active = self
        DBOS.launch()
        self._client = DBOSClient(system_database_url=self.database_url)

    def destroy(self) -> None:
        """Stop DBOS in this process (unfinished runs stay in the database)."""
        global _active
        if self._client is not None:
            self._client.destroy()
            self._client = None
        _active = None
        DBOS.destroy(destroy_registry=True)

    async def start(
        self,
        run_id: str,
        *,
        model: str,
        messages: str | Sequence[Message],
        tools: Sequence[str] | None = None,
        max_turns: int = 8,
    ) -> DBOSRunHandle:
        """Start the run ``run_id`` (or, if it exists, return its handle)."""
        _check_run_id(run_id)
        if model not in self.models:
            raise InvalidInputError(f"unknown model {model!r}; known: {sorted(self.models)}")
        names = list(self.tools) if tools is None else list(tools)
        unknown = [n for n in names if n not in self.tools]
        if unknown:
            raise InvalidInputError(f"unknown tools {unknown}; known: {sorted(self.tools)}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise InvalidInputError(f"max_turns must be a positive integer, got {max_turns!r}")
        if isinstance(messages, str):
            messages = [UserMessage(_text(messages, "a message"))]
        messages = check_history(messages)  # refused here, not in the worker later
        spec = {
            "model": model,
            "tools": names,
            "messages": messages_to_dicts(messages),
            "max_turns": max_turns,
        }
        with SetWorkflowID(run_id):
            await DBOS.start_workflow_async(_workflow, run_id, spec)
        return DBOSRunHandle(self._require_client(), run_id)

    async def handle(self, run_id: str) -> DBOSRunHandle:
        """The handle of an existing run; ``UnknownRunError`` if there is none."""
        return await _handle(self._require_client(), run_id)

    def _require_client(self) -> DBOSClient:
        if self._client is None:
            raise UsageError("launch() the runner first")
        return self._client

    # -- inside the workflow -------------------------------------------------------------

    def _new_run(self, run_id: str, spec: Mapping[str, Any], **kwargs: Any) -> _DurableRun:
        return _DurableRun(
            model=self.models[spec["model"]],
            tools=[self.tools[n] for n in spec["tools"]],
            max_turns=spec["max_turns"],
            run_id=run_id,
            **self.hooks,
            **kwargs,
        )

    async def _execute(self, run_id: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        run = self._new_run(run_id, spec, messages=messages_from_dicts(spec["messages"]))
        result = await run.run()
        while result.state is TurnState.AwaitingUser and result.pending_approvals:
            decisions, messages = await _wait_for_decisions(result.pending_approvals)
            run = self._new_run(run_id, spec, _engine=run.engine, _resume_events=decisions)
            for message in messages:
                _apply(run, message)
            result = await run.run()
        return _result_to_dict(result)

    # -- looking at runs (statemachine.durable._dbos_ops) --------------------------------

    async def export_journal(self, run_id: str, target: Any) -> Any:
        """Write the run ``run_id`` as a journal (``_dbos_ops.export_journal``), with
        this runner's tools and hooks."""
        from statemachine.durable._dbos_ops import export_journal

        tools = list(self.tools.values())
        return await export_journal(
            self._require_client(), run_id, target, tools=tools, hooks=self.hooks
        )

    async def list_runs(self, status: str | None = None, limit: int = 100) -> Any:
        """The runs of this database, newest first (``_dbos_ops.list_runs``)."""
        from statemachine.durable._dbos_ops import list_runs

        return await list_runs(self._require_client(), status, limit)


async def _wait_for_decisions(
    calls: Sequence[ToolCall],
) -> tuple[list[Event], list[Mapping[str, Any]]]:
    """Publish ``calls`` and wait (durably) until each is decided or the run is
    aborted; the decisions in call order, and the other messages received."""
    waiting = {c.id: c for c in calls}
    decided: dict[str, Event] = {}
    others: list[Mapping[str, Any]] = []
    await DBOS.set_event_async(_PENDING, [_call_to_dict(c) for c in calls])
    while len(decided) < len(waiting):
        message = await DBOS.recv_async(_CONTROL, timeout_seconds=_WAIT_SECONDS)
        if message is None:
            continue  # a week without a word: wait on
        if message.get("kind") != "decision":
            others.append(message)
            if message.get("kind") == "abort":
                break
            continue
        call_id = message.get("call_id")
        if call_id not in waiting or call_id in decided:
            continue  # raced with another decision; decide() refuses it when it can
        decided[call_id] = ApprovalDecided(call_id, message["approve"], message["reason"])
        left = [_call_to_dict(c) for c in calls if c.id not in decided]
        await DBOS.set_event_async(_PENDING, left)
    return [decided[c.id] for c in calls if c.id in decided], others


# -- handles --------------------------------------------------------------------------------


def connect(database_url: str = "sqlite:///statemachine.sqlite") -> DBOSClient:
    """A client of the runs' database, for processes that are not workers: pass it to
    ``DBOSRunHandle.open``. ``destroy()`` it when done."""
    return DBOSClient(system_database_url=database_url)


def _check_run_id(run_id: object) -> None:
    if not isinstance(run_id, str) or not run_id or len(run_id) > 200:
        raise InvalidInputError(f"a run id is a non-empty str of at most 200 chars, got {run_id!r}")


async def _handle(client: DBOSClient, run_id: str) -> DBOSRunHandle:
    _check_run_id(run_id)
    found = await client.list_workflows_async(
        workflow_ids=[run_id], load_input=False, load_output=False
    )
    if not found:
        raise UnknownRunError(f"no durable run has the id {run_id!r}")
    return DBOSRunHandle(client, run_id)


_STATES = {
    "PENDING": "running",
    "ENQUEUED": "queued",
    "DELAYED": "queued",
    "SUCCESS": "finished",
    "ERROR": "failed",
    "MAX_RECOVERY_ATTEMPTS_EXCEEDED": "failed",
    "CANCELLED": "cancelled",
}


class DBOSRunHandle:
    """A durable run seen from any process (``statemachine.durable.RunHandle``)."""

    def __init__(self, client: DBOSClient, run_id: str) -> None:
        self._client = client
        self.run_id = run_id

    @classmethod
    async def open(cls, client: DBOSClient, run_id: str) -> DBOSRunHandle:
        """The handle of an existing run; ``UnknownRunError`` if there is none."""
        return await _handle(client, run_id)

    async def result(self, timeout: float | None = None) -> RunResult:
        handle: WorkflowHandleAsync[dict[str, Any]]
        handle = await self._client.retrieve_workflow_async(self.run_id)
        output = await asyncio.wait_for(handle.get_result(polling_interval_sec=_POLL), timeout)
        return _result_from_dict(self.run_id, output)

    async def pending_approvals(self) -> tuple[ToolCall, ...]:
        published = await self._client.get_event_async(self.run_id, _PENDING, timeout_seconds=0)
        return tuple(_call_from_dict(c) for c in published or ())

    async def decide(self, call_id: str, approve: bool, reason: str | None = None) -> None:
        if not isinstance(approve, bool):
            raise InvalidInputError("approve must be True or False")
        text = _text(reason or "", "reason")
        if call_id not in {c.id for c in await self.pending_approvals()}:
            raise NotPendingError(
                f"call {call_id!r} of run {self.run_id!r} is not waiting for a decision "
                "(unknown, or decided already)"
            )
        message = {"kind": "decision", "call_id": call_id, "approve": approve, "reason": text}
        await self._send(message, f"{self.run_id}:{call_id}")

    async def steer(self, message: str | UserMessage) -> None:
        await self._send({"kind": "steer", "message": _user_dict(message)})

    async def follow_up(self, message: str | UserMessage) -> None:
        await self._send({"kind": "follow_up", "message": _user_dict(message)})

    async def abort(self, reason: str | None = None) -> None:
        await self._send({"kind": "abort", "reason": _text(reason or "", "reason")})

    async def status(self) -> RunStatus:
        found = await self._client.list_workflows_async(
            workflow_ids=[self.run_id], load_input=False, load_output=False
        )
        if not found:
            raise UnknownRunError(f"no durable run has the id {self.run_id!r}")
        pending = await self.pending_approvals()
        state = _STATES.get(found[0].status, found[0].status.lower())
        if state == "running" and pending:
            state = "waiting"
        return RunStatus(self.run_id, state, pending, found[0].app_version or "")

    async def _send(self, message: dict[str, Any], key: str | None = None) -> None:
        await self._client.send_async(self.run_id, message, _CONTROL, idempotency_key=key)

    async def export_journal(self, target: Any, tools: Sequence[Tool] | None = None) -> Any:
        """Write this run as a journal (``_dbos_ops.export_journal``)."""
        from statemachine.durable._dbos_ops import export_journal

        return await export_journal(self._client, self.run_id, target, tools=tools)


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_MESSAGE_CHARS:
        raise InvalidInputError(f"{what} must be a str of at most {MAX_MESSAGE_CHARS} chars")
    return value


def _user_dict(message: str | UserMessage) -> dict[str, Any]:
    if isinstance(message, str):
        message = UserMessage(_text(message, "a message"))
    if not isinstance(message, UserMessage):
        raise InvalidInputError("queued input must be a str or a UserMessage")
    return message_to_dict(message)
