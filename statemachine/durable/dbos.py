"""Durable runs on DBOS (the ``[dbos]`` extra): the action loop inside a DBOS workflow.

A run is one DBOS workflow, named ``statemachine.run``, whose id is the run id. It
drives the same ``AgentRun`` as ``run_agent`` (the one action loop of
``statemachine.agent.loop``); only the executor differs (``_dbos_run``): each model
call, each tool call, each batch of ``before_tool_call`` checks and each
``should_continue`` check runs as a DBOS step whose recorded output is the JSON of the
engine events it reported (``_wire.decode_step_events`` reads it back; our
messages do not pickle). After a crash DBOS runs the workflow again from the top: the
steps already recorded return their saved events without running, so the engine
receives the same events in the same order and ends up with the same history and
trace. The tool results of a batch are handed to the engine in call order, whatever
order the tools finish in, so that this order does not depend on timing.

Models, tools and hooks are code, not data: the workflow's input names the model and
the tools, and every worker process resolves the names in its own registry
(``DBOSRunner(models={...}, tools=[...])``). So every worker must be built with the
same registry, and a model client must keep no state between calls (after a restart
it is a fresh object; a model keyed on a call counter would answer turn 1 again).

Messages to a run
-----------------
``steer``, ``follow_up``, ``abort`` and approval decisions are DBOS messages on one
topic, stored in the database, so they may be sent from any process, with or without
a live worker. The run listens all the time (``_lane``): a message takes
effect within about a DBOS notification interval (0.1 s by default on SQLite; at once
on PostgreSQL), between two engine events, in the middle of a tool call too. An abort
fires the abort signal of the running tools and of the model client at once; they
then get the grace period, as in ``run_agent``, and every started call still gets its
result (I6). Where a message took effect is recorded (``{"at": n, "message": m}``: after
``n`` engine events), and the run takes a message only once that record is saved;
after a crash each message takes effect again after the same ``n`` events, so the
engine receives the same events in the same order as an uninterrupted run that got the
message at that moment. After an abort the run listens no more.

No message sent to a run is left unread: before the engine is handed a final
answer the run takes every message stored so far (it sends itself a marker and takes
messages until the marker), so a steer or follow-up sent while a tool ran reaches
the model; what comes after the run's last answer is its ``queued_input``.

What it costs: one saved operation per model call and per tool call (one more per
``before_tool_call`` batch and per ``should_continue`` check when those hooks are
set); listening costs one saved operation per run (the wait's deadline) and three per
message taken; taking every message before a final answer costs five (and on SQLite
up to one notification interval); a wait for approvals costs one per published change
of the pending calls.

Approvals: when ``before_tool_call`` asks for approval, the run publishes the
pending calls (a DBOS event, ``pending``) and waits for decisions for as long as it
takes; the worker may die and restart meanwhile. A decision is sent with the
idempotency key ``"{run_id}:{call_id}"``, so a second decision sent before the run
took the first is dropped by DBOS; one sent after is refused by ``decide`` with
``NotPendingError``, as is a decision for a call that is not pending.

Workers, queues, failover: the database is SQLite by default
(``sqlite:///statemachine.sqlite``) or PostgreSQL; one runner per process (DBOS is a
process-wide singleton). Each worker needs its own stable ``executor_id``: at
``launch()`` DBOS recovers the unfinished runs of this executor id and this
application version (``statemachine.durable.application_version()``). ``enqueue``
puts a run on a named queue; the workers launched with that queue in their ``queues``
take its runs, each at most its limit at a time, each run by one worker. A dead
worker's runs stay pending until it comes back or another worker takes them over
with ``recover(executor_ids)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, NoReturn

import attrs
from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions, SetWorkflowID, WorkflowHandleAsync
from dbos._error import (  # DBOS exports none of its errors
    DBOSUnexpectedStepError,
    DBOSWorkflowCancelledError,
)

from statemachine.agent.events import RunResult
from statemachine.agent.hooks import AfterToolCall, BeforeToolCall, ShouldContinue
from statemachine.agent.model import ModelClient
from statemachine.agent.run import continue_run
from statemachine.agent.tools import Tool
from statemachine.core.engine import Engine
from statemachine.core.events import Event
from statemachine.core.inputs import check_history
from statemachine.core.messages import Message, TextContent, ToolCall, UserMessage
from statemachine.core.wire import (
    block_to_dict,
    message_to_dict,
    messages_from_dicts,
    messages_to_dicts,
)
from statemachine.durable import (
    ExportedJournal,
    ListedRun,
    NotPendingError,
    RunClosedError,
    RunFailedError,
    RunHeldError,
    RunStatus,
    UnknownRunError,
)
from statemachine.durable._course import drive
from statemachine.durable._dbos_control import OPEN, STEP, TOPIC, Control
from statemachine.durable._dbos_errors import reachable, still_there, store_errors, write_ahead
from statemachine.durable._dbos_run import DurableRun
from statemachine.durable._registry import application_version, differences, manifest
from statemachine.durable._wire import (
    call_from_dict,
    call_to_dict,
    result_from_dict,
    result_to_dict,
)
from statemachine.errors import InvalidInputError, UsageError

__all__ = ["DBOSRunHandle", "DBOSRunner", "DBOSStore", "connect", "open_store"]

WORKFLOW = "statemachine.run"
_PENDING = "pending"  # the event holding the calls waiting for a decision
_POLL = 0.05  # how often a handle's result() looks (DBOS's default is a second)
MAX_MESSAGE_CHARS = 100_000  # a steer or follow-up message, a reason
MAX_QUEUE_CONCURRENCY = 1000
MAX_URL_CHARS = 2000
ENDING_WAIT = 30.0  # seconds a steer waits for an ending run to end or go on

# -- the workflow ---------------------------------------------------------------------------

_active: DBOSRunner | None = None


async def _workflow(run_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    if _active is None:
        raise UsageError("no DBOSRunner is launched in this process")
    return await _active._execute(run_id, spec)


class DBOSRunner:
    """Runs agent runs as DBOS workflows in this process (a worker).

    ``models`` maps names to model clients and ``tools`` lists the tools a run may
    use; a run names its model and tools, and every worker resolves the names here, so
    build every worker with the same registry (module docstring). The hooks are the
    same for every run of this runner. ``executor_id`` tells workers apart: give
    each worker its own, the same across its restarts; a worker restarted with the
    same id (and the same application version) takes its unfinished runs back at
    ``launch()``. ``queues`` names the queues this worker takes enqueued runs from,
    each with the most runs it runs from that queue at once (none by default).
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
        queues: Mapping[str, int] | None = None,
        name: str = "statemachine",
        notification_interval: float = 0.1,
        app_version: str | None = None,
    ) -> None:
        if not models:
            raise InvalidInputError("models must name at least one model client")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"tool names must be unique, got {names}")
        _check_name(executor_id, "executor_id")
        self.queues = _check_queues(queues or {})
        self.models = dict(models)
        self.tools = {t.name: t for t in tools}
        self.database_url = _check_url(database_url)
        self.hooks: dict[str, Any] = {
            "before_tool_call": before_tool_call,
            "after_tool_call": after_tool_call,
            "should_continue": should_continue,
        }
        self.manifest = manifest(list(self.models), tools, self.hooks)
        if app_version is not None:
            _check_name(app_version, "app_version")
        self.app_version = app_version or application_version(self.manifest)
        self.config: DBOSConfig = {
            "name": name,
            "system_database_url": database_url,
            "application_version": self.app_version,
            "executor_id": executor_id,
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": notification_interval,
        }
        self._client: DBOSClient | None = None

    def launch(self) -> None:
        """Start DBOS in this process; recovers this worker's unfinished runs.
        ``StoreUnavailableError`` if the database cannot be reached."""
        global _active
        if _active is not None:
            raise UsageError("a DBOSRunner is already launched in this process")
        reachable(self.database_url)
        write_ahead(self.database_url)
        with store_errors(self.database_url):
            # The client first: a recovered run reads its records through it.
            self._client = DBOSClient(system_database_url=self.database_url)
            DBOS.workflow(name=WORKFLOW)(_workflow)
            DBOS(config=self.config)
            DBOS.listen_queues(list(self.queues))
            _active = self
            try:
                DBOS.launch()
                _outside_the_loop(self._register_queues)
            except BaseException:
                self.destroy()
                raise

    def _register_queues(self) -> None:
        for queue, concurrency in self.queues.items():
            DBOS.register_queue(queue, worker_concurrency=concurrency)

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
        """Start the run ``run_id`` in this worker (or, if it exists, return its handle)."""
        spec = self._spec(run_id, model, messages, tools, max_turns)
        with store_errors(self.database_url), SetWorkflowID(run_id):
            local = await DBOS.start_workflow_async(_workflow, run_id, spec)
        handle = DBOSRunHandle(self._require_client(), run_id, self.app_version, self)
        handle._local = local  # result() awaits it rather than polling the database
        return handle

    async def enqueue(
        self,
        run_id: str,
        *,
        queue: str,
        model: str,
        messages: str | Sequence[Message],
        tools: Sequence[str] | None = None,
        max_turns: int = 8,
    ) -> DBOSRunHandle:
        """Put the run ``run_id`` on ``queue``: a worker launched with that queue in
        its ``queues`` runs it (or, if the run exists, return its handle)."""
        _check_name(queue, "queue")
        spec = self._spec(run_id, model, messages, tools, max_turns)
        options: EnqueueOptions = {
            "workflow_name": WORKFLOW,
            "queue_name": queue,
            "workflow_id": run_id,
            "app_version": self.app_version,
        }
        client = self._require_client()
        with store_errors(self.database_url):
            await client.enqueue_async(options, run_id, spec)
        return DBOSRunHandle(client, run_id, self.app_version, self)

    async def recover(self, executor_ids: Sequence[str]) -> list[str]:
        """Take over the unfinished runs of the workers ``executor_ids``, which must
        be dead (a live worker would run them too): they are put back on DBOS's
        internal queue, from which this worker (or another live one) finishes them.
        Only runs of this application version are taken. Returns their run ids."""
        ids = list(executor_ids)
        for executor_id in ids:
            _check_name(executor_id, "executor_id")
        if not ids:
            return []
        client = self._require_client()
        with store_errors(self.database_url):
            found = await client.list_workflows_async(
                status="PENDING",
                name=WORKFLOW,
                executor_id=ids,
                app_version=self.app_version,
                load_input=False,
                load_output=False,
            )
            run_ids = [w.workflow_id for w in found]
            if run_ids:
                await client.resume_workflows_async(run_ids)
        return run_ids

    def _spec(
        self,
        run_id: str,
        model: str,
        messages: str | Sequence[Message],
        tools: Sequence[str] | None,
        max_turns: int,
    ) -> dict[str, Any]:
        """The workflow's input, checked here rather than in a worker later."""
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
        messages = check_history(messages)
        return {
            "model": model,
            "tools": names,
            "messages": messages_to_dicts(messages),
            "max_turns": max_turns,
            "code": self.manifest,
        }

    async def handle(self, run_id: str) -> DBOSRunHandle:
        """The handle of an existing run; ``UnknownRunError`` if there is none."""
        return await _handle(self._require_client(), run_id, self.app_version, self)

    def _require_client(self) -> DBOSClient:
        if self._client is None:
            raise UsageError(
                "the runner is not launched: launch() it first (or again, after destroy())"
            )
        return self._client

    # -- inside the workflow -------------------------------------------------------------

    def _new_run(
        self,
        run_id: str,
        spec: Mapping[str, Any],
        resumed: tuple[Engine, list[Event]] | None = None,
        **kwargs: Any,
    ) -> DurableRun:
        """The run of ``spec``; ``resumed``: the engine it goes on with after a wait,
        and the decisions it goes on with."""
        options: dict[str, Any] = {
            "model": self.models[spec["model"]],
            "tools": [self.tools[n] for n in spec["tools"]],
            "max_turns": spec["max_turns"],
            "run_id": run_id,
            **self.hooks,
            **kwargs,
        }
        if resumed is None:
            return DurableRun(**options)
        return continue_run(DurableRun, *resumed, **options)

    async def _execute(self, run_id: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        await self._check_code(run_id, spec)
        # What an earlier execution recorded (a read, not an operation): where the
        # messages took effect (``_dbos_control``).
        recorded = await self._require_client().list_workflow_steps_async(run_id)
        control = Control([dict(s) for s in recorded])
        control.mismatch = asyncio.get_running_loop().create_future()
        control.start()
        try:
            messages = messages_from_dicts(spec["messages"])
            run = self._new_run(run_id, spec, control=control, messages=messages)

            def resume(done: DurableRun, decisions: list[Event]) -> DurableRun:
                return self._new_run(run_id, spec, (done.engine, decisions), control=control)

            course = asyncio.ensure_future(drive(run, resume, _publish))
            waits: set[asyncio.Future[Any]] = {course, control.mismatch}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not course.done():  # a step did not fit, or this execution is cancelled
                    course.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await course
            mismatch = control.mismatch.result() if control.mismatch.done() else None
            if mismatch is None:
                try:
                    result, stats = course.result()
                except DBOSUnexpectedStepError as exc:  # raised by the control lane
                    mismatch = str(exc)
        finally:
            await control.close()
        if mismatch is not None:
            await self._hold(
                run_id, [f"the run's recorded steps do not fit this worker's code: {mismatch}"]
            )
        return result_to_dict(result, stats)

    def _fit(self, spec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """How this worker's code differs from what the run ``spec`` recorded: the
        blocking changes and the notes (``_registry.differences``)."""
        recorded = spec.get("code")
        if not isinstance(recorded, Mapping):  # a run recorded without its manifest
            recorded = {"tools": {}, "hooks": {}}
        return differences(recorded, self.manifest, str(spec["model"]), list(spec["tools"]))

    async def _check_code(self, run_id: str, spec: Mapping[str, Any]) -> None:
        """Before the run is rebuilt: hold it if this worker's code does not fit it
        (nothing of it runs: no operation is recorded), note what changed otherwise."""
        blocking, notes = self._fit(spec)
        client = self._require_client()
        if notes:
            await client.update_workflow_attributes_async(run_id, {_NOTES: notes}, merge=True)
        if blocking:
            await self._hold(run_id, blocking)

    async def _hold(self, run_id: str, reasons: list[str]) -> NoReturn:
        """Hold the run (its attributes name why, its DBOS status is cancelled, which
        ``resume_held`` undoes) and stop this execution of it."""
        client = self._require_client()
        held = f"held by worker {self.config['executor_id']!r}: " + "; ".join(reasons)
        await client.update_workflow_attributes_async(run_id, {_HELD: held}, merge=True)
        await client.cancel_workflow_async(run_id)
        # DBOS's own way for a workflow to stop once it has been cancelled.
        raise DBOSWorkflowCancelledError(f"run {run_id} is held: {held}")

    # -- the operator's hand on held runs ---------------------------------------------------

    async def resume_held(self, run_id: str) -> None:
        """Let a held run go on: on this worker's code, which must fit it
        (``RunHeldError`` naming what does not), taken by a worker of its application
        version (this one if they are the same). ``UsageError`` if it is not held."""
        client = self._require_client()
        found = await _find(client, run_id, load_input=True)
        if found.status != "CANCELLED" or not _attributes(found).get(_HELD):
            raise UsageError(f"run {run_id!r} is not held by a worker")
        blocking, _ = self._fit(found.input["args"][1])
        if blocking:
            raise RunHeldError(
                f"run {run_id!r} does not fit this worker's code either: " + "; ".join(blocking)
            )
        await client.update_workflow_attributes_async(run_id, {_HELD: ""}, merge=True)
        await client.resume_workflow_async(run_id)

    async def end_held(self, run_id: str, explanation: str) -> None:
        """End a held run (or one waiting for a worker of another version) as failed,
        with ``explanation``: ``status()`` says ``failed`` with it, ``result()`` raises
        ``RunFailedError`` with it."""
        text = _text(explanation, "explanation")
        _storable(text, "explanation")  # kept with the run's attributes, as JSON
        client = self._require_client()
        found = await _find(client, run_id)
        state = _state(found, self.app_version)
        if state.state != "held":
            raise UsageError(f"run {run_id!r} is {state.state}, not held")
        ended = f"ended by an operator: {text}" + (f" ({state.held})" if state.held else "")
        await client.update_workflow_attributes_async(run_id, {_ENDED_BY: ended}, merge=True)
        await client.cancel_workflow_async(run_id)

    async def status(self, run_id: str) -> RunStatus:
        """The status of the run ``run_id`` as this worker sees it: ``held`` too when
        it waits for a worker of another application version."""
        return await DBOSRunHandle(self._require_client(), run_id, self.app_version).status()

    # -- looking at runs (statemachine.durable._dbos_ops) --------------------------------

    async def export_journal(
        self, run_id: str, target: str | os.PathLike[str] | IO[str]
    ) -> ExportedJournal:
        """Write the run ``run_id`` as a journal (``_dbos_ops.export_journal``), with
        this runner's tools and hooks."""
        from statemachine.durable._dbos_ops import export_journal

        tools = list(self.tools.values())
        return await export_journal(
            self._require_client(), run_id, target, tools=tools, hooks=self.hooks
        )

    async def list_runs(self, status: str | None = None, limit: int = 100) -> tuple[ListedRun, ...]:
        """The runs of this database, newest first (``_dbos_ops.list_runs``)."""
        from statemachine.durable._dbos_ops import list_runs

        return await list_runs(self._require_client(), status, limit, self.app_version)


async def _publish(calls: Sequence[ToolCall]) -> None:
    """Publish the calls waiting for a decision (``DBOSRunHandle.pending_approvals``)."""
    await DBOS.set_event_async(_PENDING, [call_to_dict(c) for c in calls])


# -- handles --------------------------------------------------------------------------------


class DBOSStore:
    """The runs' database seen from a process that is not a worker
    (``statemachine.durable.RunStore``, ``open_store("dbos", url)``)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._client = connect(database_url)

    async def handle(self, run_id: str) -> DBOSRunHandle:
        return await DBOSRunHandle.open(self._client, run_id)

    async def list_runs(self, status: str | None = None, limit: int = 100) -> tuple[ListedRun, ...]:
        from statemachine.durable._dbos_ops import list_runs

        return await list_runs(self._client, status, limit)

    async def export_journal(
        self, run_id: str, target: str | os.PathLike[str] | IO[str]
    ) -> ExportedJournal:
        from statemachine.durable._dbos_ops import export_journal

        return await export_journal(self._client, run_id, target)

    def close(self) -> None:
        self._client.destroy()


def open_store(database_url: str) -> DBOSStore:
    """The ``RunStore`` of the DBOS backend on ``database_url``."""
    return DBOSStore(database_url)


def connect(database_url: str = "sqlite:///statemachine.sqlite") -> DBOSClient:
    """A client of the runs' database, for processes that are not workers: pass it to
    ``DBOSRunHandle.open``. ``destroy()`` it when done. ``StoreUnavailableError`` if
    the database cannot be reached."""
    reachable(_check_url(database_url))
    write_ahead(database_url)
    with store_errors(database_url):
        return DBOSClient(system_database_url=database_url)


def _check_url(url: object) -> str:
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidInputError(
            f"a database URL is a non-empty str of at most {MAX_URL_CHARS} chars"
        )
    return url


def _check_queues(queues: object) -> dict[str, int]:
    if not isinstance(queues, Mapping):
        raise InvalidInputError("queues must map queue names to concurrency limits")
    for queue, limit in queues.items():
        _check_name(queue, "a queue name")
        if isinstance(limit, bool) or not isinstance(limit, int):
            limit = -1
        if not 1 <= limit <= MAX_QUEUE_CONCURRENCY:
            raise InvalidInputError(
                f"queue {queue!r}: the concurrency limit must be an integer from 1 to "
                f"{MAX_QUEUE_CONCURRENCY}, got {queues[queue]!r}"
            )
    return dict(queues)


def _outside_the_loop(call: Callable[[], None]) -> None:
    """Run a synchronous DBOS call, which DBOS refuses inside a running event loop,
    from a thread of its own, and wait for it."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller
            errors.append(exc)

    thread = threading.Thread(target=run, name="statemachine-dbos-setup")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidInputError(
            f"{what} must be a non-empty str of at most 200 chars, got {name!r}"
        )
    _storable(name, what)


def _check_run_id(run_id: object) -> None:
    if not isinstance(run_id, str) or not run_id or len(run_id) > 200:
        raise InvalidInputError(f"a run id is a non-empty str of at most 200 chars, got {run_id!r}")
    _storable(run_id, "a run id")


def _storable(text: str, what: str) -> None:
    """Refuse what a database cannot hold as text: NUL (PostgreSQL), a lone surrogate
    (no UTF-8 form), before anything is stored."""
    if "\x00" in text:
        raise InvalidInputError(f"{what} must not contain NUL, got {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(
            f"{what} must be valid Unicode text (no lone surrogate), got {text!r}"
        ) from None


async def _handle(
    client: DBOSClient, run_id: str, viewer: str = "", owner: DBOSRunner | None = None
) -> DBOSRunHandle:
    _check_run_id(run_id)
    await _find(client, run_id)
    return DBOSRunHandle(client, run_id, viewer, owner)


async def _find(client: DBOSClient, run_id: str, load_input: bool = False) -> Any:
    """The run's DBOS status; ``UnknownRunError`` if there is no such run."""
    found = await client.list_workflows_async(
        workflow_ids=[run_id], name=WORKFLOW, load_input=load_input, load_output=False
    )
    if not found:
        raise UnknownRunError(f"no durable run has the id {run_id!r}")
    return found[0]


# The run's attributes (kept by DBOS with its status, written outside its steps).
_HELD = "statemachine.held"  # why a worker holds the run
_ENDED_BY = "statemachine.ended"  # the explanation of an operator who ended it
_NOTES = "statemachine.notes"  # changes of code the run went on through


def _attributes(found: Any) -> Mapping[str, Any]:
    attributes = getattr(found, "attributes", None)
    return attributes if isinstance(attributes, Mapping) else {}


def _state(found: Any, viewer: str = "") -> RunStatus:
    """The state of a run from its DBOS status (approvals aside), as a worker of the
    application version ``viewer`` sees it (``""``: any)."""
    attributes = _attributes(found)
    notes = tuple(str(n) for n in attributes.get(_NOTES) or ())
    version = found.app_version or ""
    run_id = found.workflow_id
    if found.status == "CANCELLED" and attributes.get(_ENDED_BY):
        return RunStatus(
            run_id, "failed", (), version, explanation=attributes[_ENDED_BY], notes=notes
        )
    if found.status == "CANCELLED" and attributes.get(_HELD):
        return RunStatus(run_id, "held", (), version, held=attributes[_HELD], notes=notes)
    state = _STATES.get(found.status, found.status.lower())
    if state in ("running", "queued") and viewer and version and version != viewer:
        held = (
            f"waits for a worker of application version {version!r} (this worker runs {viewer!r})"
        )
        return RunStatus(run_id, "held", (), version, held=held, notes=notes)
    explanation = ""
    if state == "failed":
        explanation = f"the backend gave up on the run: {_described(found.error)}"
    return RunStatus(run_id, state, (), version, explanation=explanation, notes=notes)


def _described(error: object) -> str:
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {error}"
    else:
        text = str(error or "no error recorded")
    return text[:MAX_MESSAGE_CHARS]


_ENDED = ("finished", "failed", "cancelled")
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

    def __init__(
        self,
        client: DBOSClient,
        run_id: str,
        viewer: str = "",
        owner: DBOSRunner | None = None,
    ) -> None:
        self._own_client = client
        self.run_id = run_id
        self._viewer = viewer  # the application version of the worker that looks
        self._owner = owner  # the runner whose client this is, if a runner made it
        self._local: WorkflowHandleAsync[dict[str, Any]] | None = None  # started here

    @property
    def _client(self) -> DBOSClient:
        owner = self._owner
        if owner is not None:
            still_there(owner.database_url)
        if owner is not None and owner._client is not self._own_client:
            raise UsageError(
                f"the handle of run {self.run_id!r} was made by a runner that has been "
                "destroyed since: take a new handle (runner.handle(run_id), or "
                "DBOSRunHandle.open(connect(database_url), run_id))"
            )
        return self._own_client

    @classmethod
    async def open(cls, client: DBOSClient, run_id: str) -> DBOSRunHandle:
        """The handle of an existing run; ``UnknownRunError`` if there is none."""
        return await _handle(client, run_id)

    async def result(self, timeout: float | None = None) -> RunResult:
        """The run's result once it ends; ``RunHeldError`` if a worker holds it (its
        code does not fit the run), ``RunFailedError`` if it ended without a result
        (the backend gave up on it, or an operator ended it)."""
        self._raise_unless_going(await _find(self._client, self.run_id))
        try:
            output = await asyncio.wait_for(self._output(), timeout)
        except (TimeoutError, asyncio.CancelledError):
            raise
        except Exception as exc:
            self._raise_unless_going(await _find(self._client, self.run_id))
            raise RunFailedError(f"run {self.run_id!r}: {_described(exc)}") from exc
        return result_from_dict(self.run_id, output)

    async def _output(self) -> dict[str, Any]:
        if self._local is not None:  # started by this process: no polling
            return await self._local.get_result()
        handle: WorkflowHandleAsync[dict[str, Any]]
        handle = await self._client.retrieve_workflow_async(self.run_id)
        return await handle.get_result(polling_interval_sec=_POLL)

    def _raise_unless_going(self, found: Any) -> None:
        state = _state(found)
        if state.state == "held":
            raise RunHeldError(
                f"run {self.run_id!r} is {state.held}; resume it on a compatible worker "
                "or end it (DBOSRunner.resume_held, DBOSRunner.end_held)"
            )
        if state.state == "failed":
            raise RunFailedError(f"run {self.run_id!r} failed: {state.explanation}")
        if state.state == "cancelled":
            raise RunFailedError(f"run {self.run_id!r} was cancelled")

    async def pending_approvals(self) -> tuple[ToolCall, ...]:
        published = await self._client.get_event_async(self.run_id, _PENDING, timeout_seconds=0)
        if published is None:
            await _find(self._client, self.run_id)
        return tuple(call_from_dict(c) for c in published or ())

    async def decide(self, call_id: str, approve: bool, reason: str | None = None) -> None:
        if not isinstance(call_id, str):
            raise InvalidInputError(f"call_id must be a str (one call), got {call_id!r}")
        if not isinstance(approve, bool):
            raise InvalidInputError("approve must be True or False")
        text = _text(reason or "", "reason")
        ended = _state(await _find(self._client, self.run_id)).state in _ENDED
        if ended or call_id not in {c.id for c in await self.pending_approvals()}:
            raise NotPendingError(
                f"call {call_id!r} of run {self.run_id!r} is not waiting for a decision "
                "(unknown, decided already, or the run has ended)"
            )
        message = {"kind": "decision", "call_id": call_id, "approve": approve, "reason": text}
        await self._send(message, f"{self.run_id}:{call_id}")

    async def steer(self, message: str | UserMessage) -> None:
        """Queue a message for the model. Once this returns, the message reaches the
        model or, if the run ended first, its result's ``queued_input``;
        ``RunClosedError`` if the run had ended (module docstring)."""
        await self._queue_input("steer", message)

    async def follow_up(self, message: str | UserMessage) -> None:
        """Queue a message used when the model would otherwise finish (as ``steer``)."""
        await self._queue_input("follow_up", message)

    async def _queue_input(self, kind: str, message: str | UserMessage) -> None:
        text = _user_dict(message)
        found = await _find(self._client, self.run_id)
        if _state(found).state in _ENDED:
            raise RunClosedError(
                f"run {self.run_id!r} has ended; start a new run with this message"
            )
        message_id = uuid.uuid4().hex
        await self._send({"kind": kind, "message": text, "id": message_id})
        await self._confirm(message_id)

    async def _confirm(self, message_id: str) -> None:
        """Return once the message stored as ``message_id`` is sure to be taken by the
        run; ``RunClosedError`` if the run ended without it (``_lane``)."""
        deadline = time.monotonic() + ENDING_WAIT
        while True:
            is_open = await self._client.get_event_async(self.run_id, OPEN, timeout_seconds=0)
            if is_open is not False:
                return  # a marker follows the message: the run takes it
            found = await _find(self._client, self.run_id)
            if _state(found).state in _ENDED:
                if await self._taken(message_id):
                    return
                raise RunClosedError(
                    f"run {self.run_id!r} ended before it took this message; "
                    "start a new run with it"
                )
            if time.monotonic() > deadline:
                raise RunClosedError(
                    f"run {self.run_id!r} is ending, and its worker did not finish it "
                    f"within {ENDING_WAIT:g} s: this message may not reach it"
                )
            await asyncio.sleep(_POLL)

    async def _taken(self, message_id: str) -> bool:
        steps = await self._client.list_workflow_steps_async(self.run_id)
        for step in steps:
            output = step.get("output")
            if step["function_name"] == STEP and isinstance(output, Mapping):
                message = output.get("message")
                if isinstance(message, Mapping) and message.get("id") == message_id:
                    return True
        return False

    async def abort(self, reason: str | None = None) -> None:
        await self._send({"kind": "abort", "reason": _text(reason or "", "reason")})

    async def status(self) -> RunStatus:
        found = await _find(self._client, self.run_id)
        status = _state(found, self._viewer)
        if status.state not in ("running", "held"):
            return status
        pending = await self.pending_approvals()
        if pending and status.state == "running":
            return attrs.evolve(status, state="waiting", pending_approvals=pending)
        return attrs.evolve(status, pending_approvals=pending)

    async def _send(self, message: dict[str, Any], key: str | None = None) -> None:
        await _find(self._client, self.run_id)  # DBOS would keep a message to no run
        await self._client.send_async(self.run_id, message, TOPIC, idempotency_key=key)

    async def export_journal(
        self, target: str | os.PathLike[str] | IO[str], tools: Sequence[Tool] | None = None
    ) -> ExportedJournal:
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
    encoded = message_to_dict(message)
    size = sum(
        len(block.text) if isinstance(block, TextContent) else len(json.dumps(block_to_dict(block)))
        for block in message.content
    )
    if size > MAX_MESSAGE_CHARS:
        raise InvalidInputError(
            f"a message must be at most {MAX_MESSAGE_CHARS} chars, got {size} in a UserMessage"
        )
    return encoded
