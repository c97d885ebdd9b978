"""The workflow of a durable run on Temporal, ``statemachine.run``.

Its input (``spec``) names the run's model and tools and holds its first messages;
the worker's registry (``Registry``, found by the workflow's task queue) resolves
the names. It drives the run's course (``_course.drive``) over ``remote_run``'s parts
whose operations are activities (``_activities``). Messages come as updates, each
refused by its validator when it cannot be taken: a decision for a call that is not
pending (``NotPendingError``), a steer or follow-up once the run has taken its last
input (``RunClosedError``). An abort is a signal. ``pending_approvals`` and
``places`` are queries. A running tool's questions to a person come as ``ask``
updates and their answers as ``answer`` updates (``_questions``).

The workflow is not sandboxed: everything it runs is this library's own code, which
keeps no state between runs and reads no clock or randomness that steers the run
(the engine's course depends only on the events it is handed, in the order the
history holds them), and the sandbox would pass all of it through anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import attrs
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

from statemachine.agent.options import NewRunOptions, Options, resolve
from statemachine.agent.run import AgentRun, continue_run
from statemachine.agent.tools import Tool
from statemachine.core.events import Event, ModelCancelled, ToolCancelled
from statemachine.core.messages import ToolCall
from statemachine.core.wire import messages_from_dicts
from statemachine.durable._course import LaneRun, drive
from statemachine.durable._journal import MODEL_STEP, NOT_RECORDED, NoModel, Recorded, stand_in_hook
from statemachine.durable._registry import (
    differences,
    replay_options,
    run_options,
    table_change,
    unknown_extras,
)
from statemachine.durable._wire import (
    call_to_dict,
    encode_step_events,
    output_json,
    result_to_dict,
)
from statemachine.durable.temporal._activities import CODE_MISMATCH
from statemachine.durable.temporal._export import carried_steps
from statemachine.durable.temporal._questions import WorkflowQuestions
from statemachine.durable.temporal._run import Lane, remote_run
from statemachine.errors import RunHeldError

__all__ = ["WORKFLOW", "Registry", "RunWorkflow", "Settings", "hold_unless_it_fits", "registries"]

WORKFLOW = "statemachine.run"
NOT_PENDING = "NotPendingError"  # the type of a refused decision
CLOSED = "RunClosedError"  # the type of a refused steer or follow-up


@attrs.frozen
class Settings:
    """How a run's activities are scheduled (``TemporalRunner``)."""

    heartbeat: float
    model_timeout: float
    tool_timeout: float
    retry_interval: float
    grace: float
    continue_after: int


@attrs.frozen
class Registry:
    """What a worker's workflows resolve names in: the tools, which hooks are set,
    the instructions and output types."""

    tools: Mapping[str, Tool]
    hooks: frozenset[str]
    settings: Settings
    manifest: Mapping[str, Any]
    instructions: Mapping[str, Any]
    output_types: Mapping[str, Any]
    app_version: str = ""  # "": any (the replayer checks the workflow's code only)


registries: dict[str, Registry] = {}  # by task queue, one per worker of this process


class _HeldError(Exception):
    """An activity met a worker whose code does not fit the run."""


class WorkflowOperations:
    """A run's operations as activities (``_run.Operations``)."""

    def __init__(self) -> None:
        self.model = ""
        self.instructions: str | None = None  # their name in the registry
        self.app_version = ""  # the run's: only a worker of it performs an activity
        self.settings: Settings | None = None
        self.handles: dict[str, workflow.ActivityHandle[Any]] = {}
        self.misfit: asyncio.Future[str] | None = None  # set by ``run``
        self.rolling: asyncio.Future[None] | None = None  # set by ``run``
        self.carried = Recorded([])  # what an earlier execution recorded
        self.saved: list[list[Any]] = []  # every operation's [name, output], in order
        self.questions = WorkflowQuestions()  # what the running tools ask a person

    def take(self, spec: Mapping[str, Any], settings: Settings) -> None:
        """Take the run's model, instructions and version, and what an earlier
        execution of it recorded; ``settings``: the worker's."""
        self.model = str(spec["model"])
        self.instructions = spec.get("instructions")
        version = spec.get("app_version")
        self.app_version = version if isinstance(version, str) else ""
        self.settings = settings
        self.carry(spec.get("carried", {}))

    def carry(self, carried: Mapping[str, Any]) -> None:
        """Take what an earlier execution of the run recorded (continue-as-new)."""
        self.carried = Recorded(carried_steps(carried))

    def roll_over(self) -> bool:
        settings, rolling = self.settings, self.rolling
        if settings is None or rolling is None or rolling.done():
            return False
        if self.carried.has(MODEL_STEP):
            return False  # still going again over what was carried
        info = workflow.info()
        if not (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= settings.continue_after
        ):
            return False
        rolling.set_result(None)
        return True

    def mismatch(self, text: str) -> None:
        if self.misfit is not None and not self.misfit.done():
            self.misfit.set_result(text)

    async def run(self, name: str, key: str, payload: dict[str, Any]) -> Any:
        settings = self.settings
        assert settings is not None
        carried = self.carried.take(name, key)
        if carried is not NOT_RECORDED:
            self.saved.append([name, carried])
            return carried
        output = await self._activity(settings, name, key, payload)
        self.saved.append([name, output])
        return output

    async def _activity(
        self, settings: Settings, name: str, key: str, payload: dict[str, Any]
    ) -> Any:
        if name == MODEL_STEP:
            payload = {**payload, "model": self.model}
            if self.instructions is not None:
                payload["instructions"] = self.instructions
        if self.app_version:
            payload = {**payload, "app_version": self.app_version}
        timeout = settings.model_timeout if key == "model" else settings.tool_timeout
        handle = workflow.start_activity(
            name,
            payload,
            start_to_close_timeout=timedelta(seconds=timeout),
            heartbeat_timeout=timedelta(seconds=settings.heartbeat),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=settings.retry_interval),
                maximum_interval=timedelta(seconds=max(settings.retry_interval, 10.0)),
                non_retryable_error_types=[CODE_MISMATCH],
            ),
            # An operation asked to stop answers (a tool's cancellation is its result);
            # a hook check is simply dropped (the engine answers its calls).
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
            if key
            else workflow.ActivityCancellationType.TRY_CANCEL,
        )
        if key:
            self.handles[key] = handle
        try:
            return await handle
        except ActivityError as exc:
            if isinstance(exc.cause, CancelledError) and key:
                cancelled = ModelCancelled() if key == "model" else ToolCancelled(key)
                return encode_step_events([cancelled])
            raise _HeldError(str(exc.cause or exc)) from None
        finally:
            self.handles.pop(key, None)
            self.questions.call_ended(key)

    def cancel(self, key: str) -> None:
        handle = self.handles.get(key)
        if handle is not None:
            handle.cancel()

    async def sleep(self, seconds: float) -> None:
        await workflow.sleep(seconds)

    async def wait(self, ready: Callable[[], bool]) -> None:
        await workflow.wait_condition(ready)


@workflow.defn(name=WORKFLOW, sandboxed=False)
class RunWorkflow:
    """One durable run (module docstring)."""

    def __init__(self) -> None:
        self._ops = WorkflowOperations()
        self._lane = Lane(self._ops)
        self._pending: list[dict[str, Any]] = []
        self._decided: set[str] = set()
        self._notes: list[str] = []

    @workflow.run
    async def run(self, spec: dict[str, Any]) -> dict[str, Any]:
        registry = registries[workflow.info().task_queue]
        # The notes are this worker's, answered by a query (no command: a worker of
        # other code replays the same history).
        self._notes = hold_unless_it_fits(spec, registry)
        self._ops.take(spec, registry.settings)
        carried = spec.get("carried", {})
        self._lane.schedule(carried.get("places", ()), carried.get("incoming", ()))
        options = _run_options(spec, registry)
        parts: dict[str, Any] = {"model": NoModel(), "options": options}
        first = AgentRun(messages=messages_from_dicts(spec["messages"]), **parts)
        runs = [remote_run(first, self._lane)]

        def resume(done: LaneRun, decisions: list[Event]) -> LaneRun:
            runs.append(remote_run(continue_run(done.engine, decisions, **parts), self._lane))
            return runs[-1]

        loop = asyncio.get_running_loop()
        misfit = self._ops.misfit = loop.create_future()
        rolling = self._ops.rolling = loop.create_future()
        course = asyncio.ensure_future(drive(runs[0], resume, self._publish))
        await asyncio.wait({course, misfit, rolling}, return_when=asyncio.FIRST_COMPLETED)
        if rolling.done() and not misfit.done():
            # Past ``continue_after`` history events: go on in a new execution, which
            # goes again over what this one recorded (without running it) and makes
            # the model call this one was about to make.
            carry = {
                "steps": self._ops.saved,
                "places": self._lane.places,
                "incoming": list(self._lane.incoming),
            }
            workflow.continue_as_new({**spec, "carried": carry})
        if misfit.done():
            # Not this run's code: fail this workflow task (Temporal tries it again,
            # on this worker or another) rather than the run.
            raise RunHeldError(f"the run's history does not fit this code: {misfit.result()}")
        try:
            result, stats = course.result()
        except _HeldError as exc:
            raise ApplicationError(
                f"the run's operations do not fit this worker's code: {exc}",
                type="RunHeldError",
                non_retryable=True,
            ) from None
        output = output_json(result, runs[-1].engine, spec.get("output_types"))
        output_dict = result_to_dict(result, stats, output, runs[-1].engine.table)
        return {**output_dict, "places": self._lane.places}

    async def _publish(self, calls: Sequence[ToolCall]) -> None:
        self._pending = [call_to_dict(c) for c in calls]

    # -- messages --------------------------------------------------------------------------

    @workflow.update(name="decide")
    def decide(self, message: dict[str, Any]) -> None:
        self._decided.add(message["call_id"])
        self._lane.incoming.append(message)

    @decide.validator
    def _check_decision(self, message: dict[str, Any]) -> None:
        call_id = message.get("call_id")
        pending = {c["id"] for c in self._pending}
        if call_id not in pending or call_id in self._decided:
            raise ApplicationError(f"the call {call_id!r} is not pending", type=NOT_PENDING)

    @workflow.update(name="queue_input")
    def queue_input(self, message: dict[str, Any]) -> None:
        self._lane.incoming.append(message)

    @queue_input.validator
    def _check_input(self, message: dict[str, Any]) -> None:
        if not self._lane.open:
            raise ApplicationError("the run has taken its last input", type=CLOSED)

    @workflow.signal(name="abort")
    def abort(self, reason: str) -> None:
        self._lane.incoming.append({"kind": "abort", "reason": reason})

    @workflow.query(name="pending_approvals")
    def pending_approvals(self) -> list[dict[str, Any]]:
        return self._pending

    @workflow.update(name="ask")
    def ask(self, question: dict[str, Any]) -> dict[str, Any] | None:
        """A running tool's question (``_questions``): its recorded answer, or
        ``None`` (pending)."""
        return self._ops.questions.ask(question)

    @ask.validator
    def _check_question(self, question: dict[str, Any]) -> None:
        call_id = question.get("call_id") if isinstance(question, dict) else None
        self._ops.questions.check_ask(question, call_id in self._ops.handles)

    @workflow.update(name="answer")
    def answer(self, message: dict[str, Any]) -> None:
        self._ops.questions.answer(message["question_id"], message["answer"])

    @answer.validator
    def _check_answer(self, message: dict[str, Any]) -> None:
        self._ops.questions.check_answer(message.get("question_id"), message.get("answer"))

    @workflow.signal(name="question_ended")
    def question_ended(self, question_id: str) -> None:
        self._ops.questions.ended(question_id)

    @workflow.query(name="pending_questions")
    def pending_questions(self) -> list[dict[str, Any]]:
        return list(self._ops.questions.pending.values())

    @workflow.query(name="answer_of")
    def answer_of(self, question_id: str) -> dict[str, Any] | None:
        return self._ops.questions.answer_of(question_id)

    @workflow.query(name="notes")
    def notes(self) -> list[str]:
        """The changes of code this worker runs the run through (``differences``)."""
        return self._notes

    @workflow.query(name="places")
    def places(self) -> list[list[Any]]:
        return self._lane.places


def hold_unless_it_fits(spec: Mapping[str, Any], registry: Registry) -> list[str]:
    """Hold the run (fail this workflow task, which Temporal tries again until a
    worker whose code fits takes it) when this worker's application version,
    registry or transition table does not fit what the run recorded
    (``_registry.differences``): nothing of the run is replayed on such code.
    Otherwise the notes: what changed that the run goes on through."""
    recorded = spec.get("code")
    blocking, notes = differences(
        recorded if isinstance(recorded, Mapping) else {"tools": {}, "hooks": {}},
        registry.manifest,
        str(spec["model"]),
        list(spec["tools"]),
        spec.get("instructions"),
    )
    blocking += unknown_extras(spec, registry.instructions, registry.output_types)
    blocking += table_change(spec)
    version = spec.get("app_version")
    if registry.app_version and isinstance(version, str) and version != registry.app_version:
        # Temporal tries the task again, on any worker of the queue: a worker of the
        # run's version takes it (as DBOS's do), one of another version holds it.
        blocking.insert(
            0,
            f"waits for a worker of application version {version!r} "
            f"(this worker runs {registry.app_version!r})",
        )
    if blocking:
        raise RunHeldError("; ".join(blocking))
    return notes


def _run_options(spec: Mapping[str, Any], registry: Registry) -> Options:
    """The run's record: its options from ``spec`` and the worker's ``registry``."""
    # The run's output type and usage limits; its instructions are the model
    # activity's to send (the model call is made there).
    extras = run_options(spec, registry.instructions, registry.output_types)
    extras.pop("instructions", None)
    given = {
        "tools": [registry.tools[n] for n in spec["tools"]],
        "max_turns": spec["max_turns"],
        "run_id": workflow.info().workflow_id,
        "grace_period": registry.settings.grace,
        **{h: stand_in_hook for h in registry.hooks},
        # The run's steps as it recorded them (their decisions are activities).
        "steps": replay_options(spec).get("steps", ()),
        **extras,
    }
    return resolve("TemporalRunner", given, NewRunOptions)
