"""Durable runs on DBOS (the ``[dbos]`` extra): the action loop inside a DBOS workflow.

A run is one DBOS workflow, named ``statemachine.run``, whose id is the run id. It
drives the same ``AgentRun`` as ``run_agent`` (the one action loop of
``statemachine.agent.loop``); only the backend differs (``_dbos_run``): each model
call, each tool call, each batch of ``before_tool_call`` checks, each
``should_continue`` check and each decision of a declared step (``steps=``,
``statemachine.steps``) runs as a DBOS step whose recorded output is the JSON of the
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
the model; what comes after the run's last answer is its ``queued_input``. Once a
message came during a turn, the run also looks for the others before its next
event, so every steer stored by then reaches the next model call (``_lane``).

What it costs: one saved operation per model call and per tool call (one more per
``before_tool_call`` batch and per ``should_continue`` check when those hooks are
set, and per decision of a declared step); listening costs one saved operation per
run (the wait's deadline) and three per message taken; taking every message before a
final answer costs five (and on SQLite up to one notification interval); the look
before the next event once a message came during a turn, three (and three per message
it finds); a wait for approvals costs one per published change of the pending calls.

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

This module holds the worker (``DBOSRunner``) and the workflow it registers; the
rest lives in private modules: the handle of a run (``_dbos_handle``), the store
seen from other processes (``_dbos_store``), held runs (``_dbos_held``), reading a
run's DBOS status (``_dbos_status``), the bounds on callers' input (``_inputs``),
the backend and control lane inside the workflow (``_dbos_run``, ``_dbos_control``),
exports and listings (``_dbos_ops``) and the database's failures (``_dbos_errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import IO, Any, NoReturn, Unpack

import sqlalchemy.exc
from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions, SetWorkflowID

from statemachine.agent.model import ModelClient
from statemachine.agent.model_call import Instructions
from statemachine.agent.options import HookOptions, NewRunOptions, resolve
from statemachine.agent.run import AgentRun, continue_run
from statemachine.agent.steps import Step
from statemachine.agent.tools import Tool
from statemachine.core.engine import Engine
from statemachine.core.events import Event
from statemachine.core.messages import ToolCall
from statemachine.core.wire import messages_from_dicts
from statemachine.durable import (
    DurableRunOptions,
    ExportedJournal,
    ListedRun,
    RunStatus,
    _dbos_held,
    _dbos_ops,
    _dbos_patches,
)
from statemachine.durable._course import LaneRun, drive
from statemachine.durable._dbos_control import Control
from statemachine.durable._dbos_errors import (
    DBOSUnexpectedStepError,
    listening_client,
    notifies,
    reachable,
    store_errors,
    write_ahead,
)
from statemachine.durable._dbos_handle import ENDING_WAIT as ENDING_WAIT  # documented
from statemachine.durable._dbos_handle import DBOSRunHandle, open_handle
from statemachine.durable._dbos_run import durable_run, forget_questions, question_publisher
from statemachine.durable._dbos_status import DONE, NOTES, PENDING, WORKFLOW
from statemachine.durable._dbos_store import DBOSStore, connect, open_store
from statemachine.durable._inputs import MAX_MESSAGE_CHARS as MAX_MESSAGE_CHARS
from statemachine.durable._inputs import MAX_QUEUE_CONCURRENCY as MAX_QUEUE_CONCURRENCY
from statemachine.durable._inputs import MAX_URL_CHARS as MAX_URL_CHARS
from statemachine.durable._inputs import (
    check_name,
    check_queues,
    check_url,
    checked_text,
    storable,
)
from statemachine.durable._registry import (
    application_version,
    check_patches,
    declared_steps,
    differences,
    patched,
    patches_applied,
    run_input,
    run_options,
    table_change,
    table_digest,
    unknown_extras,
    worker_manifest,
)
from statemachine.durable._wire import call_to_dict, output_json, result_to_dict
from statemachine.errors import InvalidInputError, UsageError

__all__ = ["DBOSRunHandle", "DBOSRunner", "DBOSStore", "connect", "open_store", "patched"]

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
    ``instructions`` and ``output_types`` name the instructions (a string, or a
    function of the run's context) and output types a run may name, as its model.
    ``patches`` (oldest first) are the names tools and hooks branch on with
    ``patched(name)``, DBOS's patching; ``deprecated_patches`` those of them whose old
    code is gone (``_dbos_patches``; the guide's "Changing code while runs wait").
    """

    def __init__(
        self,
        *,
        models: Mapping[str, ModelClient],
        tools: Sequence[Tool] = (),
        database_url: str = "sqlite:///statemachine.sqlite",
        executor_id: str = "local",
        queues: Mapping[str, int] | None = None,
        name: str = "statemachine",
        notification_interval: float = 0.1,
        app_version: str | None = None,
        patches: Sequence[str] = (),
        deprecated_patches: Collection[str] = (),
        instructions: Mapping[str, Instructions] | None = None,
        output_types: Mapping[str, type[Any] | Mapping[str, Any]] | None = None,
        steps: Sequence[Step] = (),
        **hooks: Unpack[HookOptions],
    ) -> None:
        if not models:
            raise InvalidInputError("models must name at least one model client")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"tool names must be unique, got {names}")
        check_name(executor_id, "executor_id")
        self.queues = check_queues(queues or {})
        self.models = dict(models)
        self.tools = {t.name: t for t in tools}
        self.database_url = check_url(database_url)
        # The hooks, the same for every run of this worker (code: not in a run's input).
        self.options = resolve("DBOSRunner", hooks, HookOptions)
        self.hooks: dict[str, Any] = dict(hooks)  # by name, as the manifest records them
        self.patches, self.deprecated_patches = check_patches(patches, deprecated_patches)
        self.instructions = dict(instructions or {})
        self.output_types = dict(output_types or {})
        self.steps = tuple(steps)
        self.table, self.manifest = worker_manifest(
            list(self.models), tools, self.hooks, self.steps, self.instructions, self.output_types
        )
        if app_version is not None:
            check_name(app_version, "app_version")
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
            self._client = listening_client(self.database_url)
            known = _known_versions(self._client)
            DBOS.workflow(name=WORKFLOW)(_workflow)
            DBOS(config=self.config)
            DBOS.listen_queues(list(self.queues))
            _active = self
            try:
                DBOS.launch()
                if self.app_version not in known:
                    # A version new to the database is its newest (DBOS keeps the time
                    # of a version's registration to the second on SQLite): the one
                    # a process that is not a worker sees runs as (``DBOSStore``).
                    self._client.set_latest_application_version(
                        self.app_version, application_name=self.config["name"]
                    )
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

    async def start(self, run_id: str, **options: Unpack[DurableRunOptions]) -> DBOSRunHandle:
        """Start the run ``run_id`` in this worker (or, if it exists, return its handle).
        ``instructions`` and ``output_type`` are names in this runner's registry;
        ``usage_limits`` as ``run_agent``'s."""
        spec = self._spec("start", run_id, options)
        with store_errors(self.database_url), SetWorkflowID(run_id):
            local = await DBOS.start_workflow_async(_workflow, run_id, spec)
        handle = DBOSRunHandle(self._require_client(), run_id, self.app_version, self)
        handle._local = local  # result() awaits it rather than polling the database
        return handle

    async def enqueue(
        self, run_id: str, *, queue: str, **options: Unpack[DurableRunOptions]
    ) -> DBOSRunHandle:
        """Put the run ``run_id`` on ``queue``: a worker launched with that queue in
        its ``queues`` runs it (or, if the run exists, return its handle); the run's
        options as ``start``'s."""
        check_name(queue, "queue")
        spec = self._spec("enqueue", run_id, options)
        enqueued: EnqueueOptions = {
            "workflow_name": WORKFLOW,
            "queue_name": queue,
            "workflow_id": run_id,
            "app_version": self.app_version,
        }
        client = self._require_client()
        with store_errors(self.database_url):
            await client.enqueue_async(enqueued, run_id, spec)
        return DBOSRunHandle(client, run_id, self.app_version, self)

    async def recover(self, executor_ids: Sequence[str]) -> list[str]:
        """Take over the unfinished runs of the workers ``executor_ids``, which must
        be dead (a live worker would run them too): they are put back on DBOS's
        internal queue, from which this worker (or another live one) finishes them.
        Only runs of this application version are taken. Returns their run ids."""
        ids = list(executor_ids)
        for executor_id in ids:
            check_name(executor_id, "executor_id")
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

    def _spec(self, where: str, run_id: str, options: DurableRunOptions) -> dict[str, Any]:
        """The workflow's input, checked here rather than in a worker later."""
        spec, extras = run_input(self, where, run_id, options)
        table = {"table": table_digest(), **declared_steps(self.table)}
        return {**spec, "code": self.manifest, **table, **extras}

    async def handle(self, run_id: str) -> DBOSRunHandle:
        """The handle of an existing run; ``UnknownRunError`` if there is none."""
        return await open_handle(self._require_client(), run_id, self.app_version, self)

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
        control: Control,
        resumed: tuple[Engine, list[Event]] | None = None,
    ) -> LaneRun:
        """The run of ``spec`` (a part of it, its messages through ``control``);
        ``resumed``: the engine it goes on with after a wait, and the decisions it
        goes on with."""
        given = {
            "tools": [self.tools[n] for n in spec["tools"]],
            "max_turns": spec["max_turns"],
            "run_id": run_id,
            **run_options(spec, self.instructions, self.output_types),
            "steps": self.steps,
        }
        # The run's record: the runner's (its hooks) with the run's own options.
        options = resolve("DBOSRunner", given, NewRunOptions, self.options)
        model = self.models[spec["model"]]
        if resumed is None:
            messages = messages_from_dicts(spec["messages"])
            part = AgentRun(model=model, messages=messages, options=options)
        else:
            part = continue_run(*resumed, model=model, options=options)
        return durable_run(part, control)

    async def _execute(self, run_id: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        await self._check_code(run_id, spec)
        # What an earlier execution recorded (a read, not an operation): the patches
        # the run took, where the messages took effect (``_dbos_control``).
        recorded = [dict(s) for s in await self._require_client().list_workflow_steps_async(run_id)]
        unknown = _dbos_patches.markers_unknown(recorded, self.patches)
        if unknown:
            await self._hold(
                run_id,
                [
                    f"the run took patch {name!r}, which this worker does not have (rolled "
                    "back, or dropped while the run waited): keep it, deprecated"
                    for name in unknown
                ],
            )
        taken = await _dbos_patches.apply(self.patches, self.deprecated_patches, recorded)
        client = self._require_client()
        await forget_questions(client, run_id)
        control = Control(recorded, question_publisher(client, run_id))
        with patches_applied(self.patches, taken):
            return await self._drive(run_id, spec, control)

    async def _drive(
        self, run_id: str, spec: Mapping[str, Any], control: Control
    ) -> dict[str, Any]:
        """The run's course under its control lane; hold it if a step does not fit."""
        control.mismatch = asyncio.get_running_loop().create_future()
        control.start()
        try:
            runs = [self._new_run(run_id, spec, control)]

            def resume(done: LaneRun, decisions: list[Event]) -> LaneRun:
                runs.append(self._new_run(run_id, spec, control, (done.engine, decisions)))
                return runs[-1]

            course = asyncio.ensure_future(drive(runs[0], resume, _publish))
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
            await control.questions.settle()
        if mismatch is not None:
            await self._hold(
                run_id, [f"the run's recorded steps do not fit this worker's code: {mismatch}"]
            )
        output = output_json(result, runs[-1].engine, spec.get("output_types"))
        if notifies(self.database_url):
            # Wakes the handles waiting for the result (``DBOSRunHandle.result``);
            # the run's last operation. SQLite has no notification: its waiters poll.
            await DBOS.set_event_async(DONE, True)
        return result_to_dict(result, stats, output, runs[-1].engine.table)

    def _fit(self, spec: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """How this worker's code differs from what the run ``spec`` recorded: the
        blocking changes and the notes (``_registry.differences``)."""
        recorded = spec.get("code")
        if not isinstance(recorded, Mapping):  # a run recorded without its manifest
            recorded = {"tools": {}, "hooks": {}}
        blocking, notes = differences(
            recorded,
            self.manifest,
            str(spec["model"]),
            list(spec["tools"]),
            spec.get("instructions"),
        )
        blocking += unknown_extras(spec, self.instructions, self.output_types)
        return blocking + table_change(spec), notes

    async def _check_code(self, run_id: str, spec: Mapping[str, Any]) -> None:
        """Before the run is rebuilt: hold it if this worker's code does not fit it
        (nothing of it runs: no operation is recorded), note what changed otherwise."""
        blocking, notes = self._fit(spec)
        if blocking:
            await self._hold(run_id, blocking)  # notes come with a worker that fits
        if notes:
            await self._require_client().update_workflow_attributes_async(
                run_id, {NOTES: notes}, merge=True
            )

    async def _hold(self, run_id: str, reasons: list[str]) -> NoReturn:
        """Hold the run and stop this execution of it (``_dbos_held.hold``)."""
        worker = str(self.config["executor_id"])  # a str, checked in __init__
        await _dbos_held.hold(self._require_client(), run_id, worker, reasons)

    # -- the operator's hand on held runs ---------------------------------------------------

    async def resume_held(self, run_id: str) -> None:
        """Let a held run go on: on this worker's code, which must fit it
        (``RunHeldError`` naming what does not), taken by a worker of its application
        version (this one if they are the same). ``UsageError`` if it is not held."""
        await _dbos_held.resume_held(self._require_client(), run_id, self._fit)

    async def end_held(self, run_id: str, explanation: str) -> None:
        """End a held run (or one waiting for a worker of another version) as failed,
        with ``explanation``: ``status()`` says ``failed`` with it, ``result()`` raises
        ``RunFailedError`` with it."""
        text = checked_text(explanation, "explanation")
        storable(text, "explanation")  # kept with the run's attributes, as JSON
        await _dbos_held.end_held(self._require_client(), run_id, text, self.app_version)

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
        tools = list(self.tools.values())
        return await _dbos_ops.export_journal(
            self._require_client(), run_id, target, tools=tools, hooks=self.hooks
        )

    async def list_runs(self, status: str | None = None, limit: int = 100) -> tuple[ListedRun, ...]:
        """The runs of this database, newest first (``_dbos_ops.list_runs``)."""
        return await _dbos_ops.list_runs(self._require_client(), status, limit, self.app_version)


async def _publish(calls: Sequence[ToolCall]) -> None:
    """Publish the calls waiting for a decision (``DBOSRunHandle.pending_approvals``)."""
    await DBOS.set_event_async(PENDING, [call_to_dict(c) for c in calls])


def _known_versions(client: DBOSClient) -> set[str]:
    """The application versions registered in the database (none in a database
    DBOS has not set up yet)."""
    try:
        return {v["version_name"] for v in client.list_application_versions()}
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.ProgrammingError):
        return set()  # no table of versions yet


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
