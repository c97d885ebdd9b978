"""Durable runs on Temporal (the ``[temporal]`` extra): the action loop inside a
Temporal workflow.

A run is one workflow, ``statemachine.run``, whose id is the run id, on the
runner's task queue. It drives the same ``AgentRun`` as ``run_agent`` (the one
action loop); only the executor differs (``_run``): each model call, each tool
call, each batch of ``before_tool_call`` checks and each ``should_continue`` check
is an activity (``_activities``) whose result is the JSON of the engine events it
reported. When a worker dies, Temporal replays the workflow on another (or the
same, restarted) worker from its history: the activities that finished return
their recorded results without running, so the engine receives the same events in
the same order and ends with the same history and trace. The tool results of a
batch are handed to the engine in call order, whatever order the tools finish in.

Models, tools and hooks are code: the workflow's input names the model and the
tools, and every worker resolves the names in its own registry
(``TemporalRunner(models={...}, tools=[...])``), so build every worker of a task
queue with the same registry; a model client keeps no state between calls.

Activities, retries and heartbeats
----------------------------------
A tool that raises is an error result for the model and a model call that fails is
a failed call, as in ``run_agent``: neither fails its activity, so neither is
retried. An activity fails only when its worker dies (it is then retried, with the
same idempotency key, ``"{run_id}:{call_id}"``: ``idempotency_key()``), or when a
worker lacks the run's tool or model (not retried: the run fails, naming it). The
retry policy: first retry after ``retry_interval`` seconds, doubling up to 10 s,
no limit on attempts. Every activity heartbeats every ``heartbeat / 3`` seconds, so
a dead worker's activity is retried ``heartbeat`` seconds after it died (not after
``tool_timeout``), and an abort reaches a running tool with the next heartbeat.

Messages to a run
-----------------
``decide``, ``steer`` and ``follow_up`` are workflow updates, each refused by its
validator when the run cannot take it: ``NotPendingError`` for a decision on a
call that is not pending, ``RunClosedError`` for input once the run has taken its
last. Once one returns, the run has the message: a steer or follow-up reaches the
model, or the result's ``queued_input`` when the run had given its last answer. The
run takes messages between two engine events, before the next result (so a steer
sent while a tool runs reaches the model at the next turn boundary). ``abort`` is a
signal; it fires the signal of the running tools and model client (through the
activities' cancellation), which then get the grace period, as in ``run_agent``;
every started call still gets its result (I6). ``pending_approvals`` is a query.
A running tool's question to a person (an MCP server's elicitation) waits in the
run's workflow: ``pending_questions`` is a query, ``answer`` an update (``_questions``).

How it differs from the DBOS backend
------------------------------------
- A worker whose code does not fit a run holds it, as on DBOS; but an activity that
  lands on a worker without its tool fails the run, naming the tool.
- Queues are Temporal's task queues (``enqueue``); ``list_runs`` reads Temporal's own
  listing of the namespace.
- ``steer()`` returns once the run has taken the message (an update), so it reaches the
  next model call as with ``run_agent``; on DBOS it returns once the message is stored.
- Updates and queries need a live worker: they fail with ``StoreUnavailableError``
  after ``MESSAGE_TIMEOUT``; an abort (a signal) is stored even with no worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import IO, Any, Unpack

import attrs
from temporalio.client import Client, WorkflowHistory
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.worker import Replayer, Worker

from statemachine.agent.model import ModelClient, ModelSettings, check_settings
from statemachine.agent.model_call import Instructions
from statemachine.agent.options import HookOptions, resolve
from statemachine.agent.steps import Step
from statemachine.agent.sync import DEFAULT_GRACE_PERIOD
from statemachine.agent.tools import Tool
from statemachine.core.checks import positive_int
from statemachine.durable import DurableRunOptions, ExportedJournal, ListedRun, RunStatus
from statemachine.durable._inputs import check_name, check_run_id, checked_text
from statemachine.durable._registry import (
    application_version,
    declared_steps,
    run_input,
    table_digest,
    worker_manifest,
)
from statemachine.durable.temporal import _export
from statemachine.durable.temporal._activities import Activities, checkpoint, last_checkpoint
from statemachine.durable.temporal._dev import dev_server, temporal_binary
from statemachine.durable.temporal._handle import MESSAGE_TIMEOUT, TemporalRunHandle, open_handle
from statemachine.durable.temporal._store import TemporalStore, open_store
from statemachine.durable.temporal._workflow import (
    WORKFLOW,
    Registry,
    RunWorkflow,
    Settings,
    hold_unless_it_fits,
    registries,
)
from statemachine.errors import InvalidInputError, RunHeldError, UsageError

__all__ = [
    "CONTINUE_AFTER",
    "MESSAGE_TIMEOUT",
    "WORKFLOW",
    "TemporalRunHandle",
    "TemporalRunner",
    "TemporalStore",
    "checkpoint",
    "dev_server",
    "last_checkpoint",
    "open_store",
    "temporal_binary",
]

CONTINUE_AFTER = 10_000
"""History events after which a run goes on in a new execution (continue-as-new), at
its next model call; it also goes on in a new one when Temporal suggests it (by
default at 4 MB or 4,000 events of history). Each model activity's input holds the
whole conversation, so a long run's history grows with the square of its turns
(Temporal: 2 MB a payload, 50 MB a history)."""


def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidInputError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _grace(value: float) -> float:
    return float(value) if value == 0 else _seconds("grace_period", value)


def _checked_worker_options(options: Mapping[str, Any]) -> dict[str, Any]:
    taken = {"client", "task_queue", "workflows", "activities", "workflow_task_executor"}
    if taken & set(options):
        raise InvalidInputError(f"worker_options may not set {sorted(taken)}")
    return dict(options)


def _by_name(tools: Sequence[Tool]) -> dict[str, Tool]:
    """The worker's tools by name; ``InvalidInputError`` for a name given twice."""
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"tool names must be unique, got {names}")
    return {t.name: t for t in tools}


class TemporalRunner:
    """Runs agent runs as Temporal workflows in this process (a worker).

    ``client`` is a connected ``temporalio.client.Client``; ``models`` maps names to
    model clients and ``tools`` lists the tools a run may use (every worker of
    ``task_queue`` must have the same registry). ``heartbeat``: the activities'
    heartbeat timeout (a dead worker's call is retried that long after it died);
    ``model_timeout`` and ``tool_timeout``: the longest one attempt may run;
    ``grace_period``: as ``run_agent``'s, after an abort; ``message_timeout``: how
    long a handle's update waits for a worker (``_handle``);
    ``workflow_task_timeout``: how long a workflow task given to a worker that died
    waits before another worker gets it (Temporal's default, 10 s);
    ``continue_after``: history events after which a run goes on in a new execution
    (``CONTINUE_AFTER``). ``instructions`` and ``output_types`` name the
    instructions (a string, or a function of the run's context) and output types a
    run may name, as its model (every worker of the task queue needs the same).
    ``worker_options`` are
    more keywords for ``temporalio.worker.Worker`` (interceptors, plugins, limits,
    ``sticky_queue_schedule_to_start_timeout``...). ``await launch()`` starts the
    worker, ``await destroy()`` stops it; its runs stay with Temporal.
    """

    def __init__(
        self,
        client: Client,
        *,
        models: Mapping[str, ModelClient],
        tools: Sequence[Tool] = (),
        task_queue: str = "statemachine",
        grace_period: float = DEFAULT_GRACE_PERIOD,
        heartbeat: float = 10.0,
        model_timeout: float = 600.0,
        tool_timeout: float = 3600.0,
        retry_interval: float = 1.0,
        message_timeout: float = MESSAGE_TIMEOUT,
        workflow_task_timeout: float = 10.0,
        continue_after: int = CONTINUE_AFTER,
        app_version: str | None = None,
        worker_options: Mapping[str, Any] | None = None,
        instructions: Mapping[str, Instructions] | None = None,
        output_types: Mapping[str, type[Any] | Mapping[str, Any]] | None = None,
        steps: Sequence[Step] = (),
        **hooks: Unpack[HookOptions],
    ) -> None:
        if not models:
            raise InvalidInputError("models must name at least one model client")
        check_name(task_queue, "task_queue")
        self.client = client
        self.task_queue = task_queue
        self.models = dict(models)
        self.tools = _by_name(tools)
        # The hooks, the same for every run of this worker (code: not in a run's input).
        self.options = resolve("TemporalRunner", hooks, HookOptions)
        self.hooks: dict[str, Any] = dict(hooks)  # by name, as the manifest records them
        self.instructions = dict(instructions or {})
        self.output_types = dict(output_types or {})
        self.steps = tuple(steps)
        self.table, self.manifest = worker_manifest(
            list(self.models), tools, self.hooks, self.steps, self.instructions, self.output_types
        )
        if app_version is not None:
            check_name(app_version, "app_version")
        self.app_version = app_version or application_version(self.manifest)
        self.settings = Settings(
            heartbeat=_seconds("heartbeat", heartbeat),
            model_timeout=_seconds("model_timeout", model_timeout),
            tool_timeout=_seconds("tool_timeout", tool_timeout),
            retry_interval=_seconds("retry_interval", retry_interval),
            continue_after=positive_int("continue_after", continue_after),
            grace=_grace(grace_period),
        )
        self._message_timeout = _seconds("message_timeout", message_timeout)
        self._task_timeout = _seconds("workflow_task_timeout", workflow_task_timeout)
        self._worker_options = _checked_worker_options(worker_options or {})
        self._worker: Worker | None = None
        self._running: asyncio.Task[None] | None = None

    async def launch(self) -> None:
        """Start the worker: it takes the runs of its task queue, its unfinished
        ones (a restart) too."""
        if self._worker is not None:
            raise UsageError("this runner is launched already")
        if self.task_queue in registries:
            raise UsageError(f"a runner of task queue {self.task_queue!r} runs in this process")
        hooks = attrs.evolve(self.options, steps=self.steps)
        activities = Activities(
            self.models,
            self.tools,
            hooks,
            self.settings.grace,
            self.settings.heartbeat,
            self.instructions,
            self.app_version,
        )
        registries[self.task_queue] = self._registry(self.app_version)
        self._worker = Worker(
            self.client,
            task_queue=self.task_queue,
            workflows=[RunWorkflow],
            activities=activities.all(),
            # One thread: the run's loop checks it is called on the thread it runs on.
            workflow_task_executor=ThreadPoolExecutor(1, "statemachine-workflows"),
            **self._worker_options,
        )
        self._running = asyncio.ensure_future(self._worker.run())

    async def destroy(self) -> None:
        """Stop the worker (its unfinished runs stay with Temporal)."""
        worker, running = self._worker, self._running
        self._worker = self._running = None
        registries.pop(self.task_queue, None)
        if worker is not None:
            await worker.shutdown()
        if running is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running

    async def __aenter__(self) -> TemporalRunner:
        await self.launch()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()

    async def start(self, run_id: str, **options: Unpack[DurableRunOptions]) -> TemporalRunHandle:
        """Start the run ``run_id`` on this runner's task queue (or, if a run of that
        id exists, return its handle). ``instructions`` and ``output_type`` are names
        in this runner's registry; ``usage_limits`` as ``run_agent``'s."""
        spec = self._spec("start", run_id, options)
        return await self._start(run_id, spec, self.task_queue)

    async def _start(self, run_id: str, spec: dict[str, Any], queue: str) -> TemporalRunHandle:
        try:
            await self.client.start_workflow(
                WORKFLOW,
                spec,
                id=run_id,
                task_queue=queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                task_timeout=timedelta(seconds=self._task_timeout),
            )
        except WorkflowAlreadyStartedError:
            pass  # a run of that id has ended: its handle
        return TemporalRunHandle(self.client, run_id, self._message_timeout, self.output_types)

    async def enqueue(
        self, run_id: str, *, queue: str, **options: Unpack[DurableRunOptions]
    ) -> TemporalRunHandle:
        """Start the run ``run_id`` on the task queue ``queue``: a worker of that
        queue (with the same registry) runs it; the run's options as ``start``'s."""
        check_name(queue, "queue")
        spec = self._spec("enqueue", run_id, options)
        return await self._start(run_id, spec, queue)

    async def recover(self, executor_ids: Sequence[str]) -> list[str]:
        """Nothing to do on Temporal: a dead worker's runs are taken by the live
        workers of their task queue on their own (its activities after their
        heartbeat timeout). Returns no run ids."""
        for executor_id in executor_ids:
            check_name(executor_id, "executor_id")
        return []

    async def status(self, run_id: str) -> RunStatus:
        """The run's status (``TemporalRunHandle.status``)."""
        return await (await self.handle(run_id)).status()

    async def list_runs(self, status: str | None = None, limit: int = 100) -> tuple[ListedRun, ...]:
        """The runs of this namespace, newest first (``TemporalStore.list_runs``)."""
        store = TemporalStore("", self.client.namespace, client=self.client)
        return await store.list_runs(status, limit)

    async def resume_held(self, run_id: str) -> None:
        """A held run goes on by itself once a worker whose code fits it takes its
        workflow task (Temporal tries it again): this checks that this worker's code
        fits it (``RunHeldError`` naming what does not); ``UsageError`` if the run
        is not held."""
        handle = await self.handle(run_id)
        if (await handle.status()).state != "held":
            raise UsageError(f"run {run_id!r} is not held")
        spec = await _export.run_input(self.client, run_id)
        try:
            hold_unless_it_fits(spec, self._registry(self.app_version))
        except RunHeldError as exc:
            raise RunHeldError(f"this worker's code does not fit run {run_id!r}: {exc}") from None

    async def end_held(self, run_id: str, explanation: str) -> None:
        """End a run (held, or any that has not ended) as failed, with
        ``explanation``: its workflow is terminated; ``status()`` says ``failed``
        with it, ``result()`` raises ``RunFailedError``."""
        text = checked_text(explanation, "explanation")
        await self.handle(run_id)  # UnknownRunError for no such run
        await self.client.get_workflow_handle(run_id).terminate(reason=text)

    async def handle(self, run_id: str) -> TemporalRunHandle:
        """The handle of an existing run; ``UnknownRunError`` if there is none."""
        check_run_id(run_id)
        return await open_handle(self.client, run_id, self.output_types)

    async def export_journal(
        self, run_id: str, target: str | os.PathLike[str] | IO[str]
    ) -> ExportedJournal:
        """Write the run ``run_id`` as a journal, with this runner's tools and hooks."""
        return await _export.export_journal(
            self.client, run_id, target, tools=list(self.tools.values()), hooks=self.hooks
        )

    async def replay(self, histories: Iterable[WorkflowHistory]) -> None:
        """Replay recorded runs' workflow histories on this runner's code (its
        registry, this library's workflow): raises ``temporalio.workflow.
        NondeterminismError`` (or the run's own error) for the first one that does
        not replay to the same commands, so a change of code that would break the
        runs that are waiting fails a test rather than a deploy. No server needed."""
        build_id = f"statemachine-{uuid.uuid4().hex[:12]}"
        replayer = Replayer(
            workflows=[RunWorkflow],
            build_id=build_id,
            workflow_task_executor=ThreadPoolExecutor(1, "statemachine-replay"),
        )
        queue = f"replay-{build_id}"  # the task queue the replayer's workflows see
        registries[queue] = self._registry()
        try:
            for history in histories:
                await replayer.replay_workflow(history)
        finally:
            registries.pop(queue, None)

    def _registry(self, app_version: str = "") -> Registry:
        """What this worker's workflows resolve names in; ``app_version`` ``""``: runs
        of any version (the replayer checks the workflow's code only)."""
        return Registry(
            self.tools,
            frozenset(k for k, v in self.hooks.items() if v is not None),
            self.settings,
            self.manifest,
            self.instructions,
            self.output_types,
            app_version,
        )

    def _spec(self, where: str, run_id: str, options: DurableRunOptions) -> dict[str, Any]:
        """The workflow's input, checked here rather than in a worker later."""
        spec, extras = run_input(self, where, run_id, options)
        # A client that cannot send instructions is refused as run_agent refuses it.
        check_settings(self.models[spec["model"]], ModelSettings(), "instructions" in extras)
        return {
            **spec,
            "code": self.manifest,
            "table": table_digest(),
            **declared_steps(self.table),
            "app_version": self.app_version,
            **extras,
        }
