"""The activities of a durable run on Temporal: each model call, tool call and hook
check, performed in a worker as ``run_agent`` performs it.

An activity runs one operation with the in-process executor's own code
(``AsyncioExecutor.call_model``, ``run_tool``, ``check_permissions``,
``check_continue``, ``run_step``) and returns the JSON of the engine events it reported: a tool
that raises is an error result for the model, a model call that fails is a failed
call; neither is an activity failure, so Temporal never retries them. An activity
fails (and is retried) only when its worker dies, or when it meets this worker's
code not fitting the run (a tool, model or instructions it does not have: not
retried), or when it is given to a worker of another application version than its
run's (``OTHER_VERSION``: retried, so the call runs only on a worker of the run's
version). The model activity sends the run's instructions (a name in the worker's
registry, ``TemporalRunner(instructions=...)``); a function of the run's context
receives the context of the call (its run id, turn and messages; no ``deps``).

A running activity heartbeats every ``heartbeat / 3`` seconds: a dead worker's
activity is retried once its heartbeat timeout passes, and an abort reaches the
running tool or model client with the next heartbeat, as a cancellation. The
activity then fires the signal the tool holds, gives it half the grace period to
finish on its own and cancels it, as ``run_agent`` does, and answers what it
reported. Inside a tool, ``statemachine.durable.idempotency_key()`` is
``"{run_id}:{call_id}"``, the same on every attempt. While a tool holds the
worker's event loop, a thread heartbeats its call instead (``_heartbeat``), so a
blocking tool is not retried beside itself. A question a tool asks a person (an MCP
server's elicitation) goes to the run's workflow and waits there for its answer
(``_questions``), the activity heartbeating meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from statemachine._log import library_logger
from statemachine.agent.context import RunContext
from statemachine.agent.executor import IN_PROCESS, AsyncioExecutor, Operation
from statemachine.agent.model import ModelClient, ModelSettings
from statemachine.agent.model_call import Instructions, RunModel
from statemachine.agent.options import Options
from statemachine.agent.questions import Answer, MakeQuestion
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortController, AbortSignal
from statemachine.core.engine import ABANDONED
from statemachine.core.events import (
    CallModel,
    Event,
    ModelCancelled,
    RunStep,
    StepDecided,
    ToolCancelled,
)
from statemachine.core.messages import Message, ToolCall
from statemachine.core.wire import action_from_dict, messages_from_dicts
from statemachine.durable import _durable_run_id
from statemachine.durable._journal import (
    CONTINUE_STEP,
    DECISION_STEP,
    MODEL_STEP,
    PERMISSION_STEP,
    TOOL_STEP,
)
from statemachine.durable._wire import call_from_dict, encode_step_events
from statemachine.durable.temporal._heartbeat import Beating, Standby
from statemachine.durable.temporal._questions import Asker
from statemachine.errors import InvalidInputError, UsageError

__all__ = [
    "CODE_MISMATCH",
    "MAX_CHECKPOINT_CHARS",
    "OTHER_VERSION",
    "Activities",
    "checkpoint",
    "last_checkpoint",
]

CODE_MISMATCH = "statemachine.CodeMismatch"  # a non-retryable activity failure's type
# The type of the failure of an activity given to a worker of another application
# version than its run's: retried (Temporal hands it to any worker of the task queue)
# until a worker of the run's version performs it, so nothing of a held run runs on
# code that does not fit it.
OTHER_VERSION = "statemachine.OtherVersion"


MAX_CHECKPOINT_CHARS = 65_536  # the JSON of a tool's checkpoint, at most

# The checkpoint of the tool call the current activity runs (``[details]``, or empty).
_checkpoint: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "statemachine_temporal_checkpoint", default=None
)


def checkpoint(details: Any) -> None:
    """Inside a tool a Temporal worker runs: record ``details`` (a JSON value of at
    most ``MAX_CHECKPOINT_CHARS`` characters) with the call's heartbeats, so that the
    attempt after a crash can resume from them (``last_checkpoint``). Each call
    replaces the last; it is sent at once and with every heartbeat after.
    ``UsageError`` outside such a tool, ``InvalidInputError`` for details that are
    not JSON or too long."""
    holder = _checkpoint.get()
    if holder is None or not activity.in_activity():
        raise UsageError("checkpoint() is for a tool that a Temporal worker runs")
    try:
        text = json.dumps(details)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"a checkpoint must be JSON: {exc}") from None
    if len(text) > MAX_CHECKPOINT_CHARS:
        raise InvalidInputError(
            f"a checkpoint is at most {MAX_CHECKPOINT_CHARS} characters of JSON, got {len(text)}"
        )
    holder[:] = [json.loads(text)]  # a copy: the standby thread may send it (_heartbeat)
    activity.heartbeat(*holder)


def last_checkpoint() -> Any:
    """Inside a tool a Temporal worker runs: the details the call's previous attempt
    last recorded with ``checkpoint`` (``None`` on a first attempt, or outside)."""
    if _checkpoint.get() is None or not activity.in_activity():
        return None
    details = activity.info().heartbeat_details
    return details[0] if details else None


class _Silent:
    """Where a model client's streamed fragments go inside an activity: nowhere (a
    durable run has no subscribers)."""

    def text_delta(self, text: str) -> None:
        pass

    def tool_call_delta(self, index: int, call_id: str, name: str, arguments: str) -> None:
        pass

    def emit(self, event: object) -> None:
        pass


class _Engine:
    def __init__(self, run_id: str, messages: Sequence[Message]) -> None:
        self.run_id = run_id
        self.messages = list(messages)


class _InActivity:
    """The operations of an activity start as ``run_agent``'s do (``IN_PROCESS``); a
    question a tool asks goes to the run's workflow (``asker``: ``_questions``), or
    is refused at once where there is none (an activity that runs no tool)."""

    __slots__ = ("asker",)

    def __init__(self, asker: Asker | None = None) -> None:
        self.asker = asker

    def start(self, driver: AsyncioExecutor, op: Operation) -> None:
        IN_PROCESS.start(driver, op)

    def cancel(self, driver: AsyncioExecutor, keys: Sequence[str], reason: str) -> None:
        IN_PROCESS.cancel(driver, keys, reason)

    def reported(self, key: str) -> None:
        IN_PROCESS.reported(key)

    async def ask(
        self, driver: AsyncioExecutor, call: ToolCall, make: MakeQuestion, signal: AbortSignal
    ) -> Answer | None:
        if self.asker is None:
            return None
        return await self.asker.ask(call, make, signal)


class _OneOperation:
    """What ``AsyncioExecutor`` needs of its loop, for one operation: what it
    reports is kept (``events``), in order."""

    def __init__(self, run_id: str, messages: Sequence[Message] = ()) -> None:
        self.events: list[Event] = []
        self.reported: set[str] = set()
        self.abandoned: set[str] = set()
        self.controller = AbortController()
        self.log = library_logger().bind(run_id=run_id)
        self.aborting = False
        self.fatal: BaseException | None = None
        self.model_exception: BaseException | None = None
        self.engine = _Engine(run_id, messages)
        self.inbox = self
        self.stream = _Silent()

    def post(self, key: str, event: Event) -> None:
        if key not in self.reported:
            self.reported.add(key)
            self.events.append(event)

    def put_nowait(self, event: Event) -> None:
        self.events.append(event)

    def note_failure(self, exc: BaseException, where: str) -> None:
        pass  # the operation has reported its failure; a worker does not stop for it


class Activities:
    """The activities of one worker, resolving names in its registry."""

    def __init__(
        self,
        models: Mapping[str, ModelClient],
        tools: Mapping[str, Tool],
        hooks: Options,
        grace: float,
        heartbeat: float,
        instructions: Mapping[str, Instructions] | None = None,
        app_version: str = "",
    ) -> None:
        self.app_version = app_version
        self.models = models
        self.tools = tools
        self.instructions = dict(instructions or {})
        self.hooks = hooks
        self.grace = grace
        self.heartbeat = heartbeat
        self.standby = Standby(heartbeat)  # heartbeats a call whose loop is held

    def all(self) -> list[Callable[..., Any]]:
        return [self.model, self.tool, self.permissions, self.should_continue, self.step]

    def _of_my_version(self, payload: Mapping[str, Any]) -> None:
        """Refuse (retryable, ``OTHER_VERSION``) an operation of a run of another
        application version than this worker's."""
        theirs = payload.get("app_version")
        if self.app_version and isinstance(theirs, str) and theirs != self.app_version:
            raise ApplicationError(
                f"run {payload.get('run_id')!r} waits for a worker of application version "
                f"{theirs!r} (this worker runs {self.app_version!r})",
                type=OTHER_VERSION,
            )

    def _executor(
        self,
        loop: _OneOperation,
        client: Any = None,
        views: Any = None,
        asker: Asker | None = None,
    ) -> AsyncioExecutor:
        """The executor of one operation; ``views``: the run's last summary of each
        compaction step (``_run``), which its model calls and steps go on from."""
        stand_in: Any = loop  # what the executor needs of an ActionLoop (_OneOperation)
        executor = AsyncioExecutor(
            stand_in,
            model=client,
            tools=self.tools,
            hooks=self.hooks,
            grace=self.grace,
            backend=_InActivity(asker),
        )
        if isinstance(views, Mapping):
            for step, message in views.items():
                executor.hook_caller.views.note(StepDecided(str(step), "compacted", str(message)))
        return executor

    def _model(self, run_id: str, model: str, call: CallModel, instructions: str | None) -> Any:
        """The model client of the call ``call``, sending the run's instructions."""
        if model not in self.models:
            raise ApplicationError(
                f"this worker has no model {model!r}", type=CODE_MISMATCH, non_retryable=True
            )
        if instructions is not None and instructions not in self.instructions:
            raise ApplicationError(
                f"this worker has no instructions {instructions!r}",
                type=CODE_MISMATCH,
                non_retryable=True,
            )
        given = None if instructions is None else self.instructions[instructions]

        def context() -> RunContext[Any]:
            return RunContext(None, run_id, call.turn, call.messages)

        silent: Any = _Silent()  # stands in for the run's EventStream
        return RunModel(self.models[model], given, ModelSettings(), silent, context)

    @activity.defn(name=MODEL_STEP)
    async def model(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self._of_my_version(payload)
        action = action_from_dict(payload["action"])
        assert isinstance(action, CallModel)
        loop = _OneOperation(payload["run_id"])
        client = self._model(
            payload["run_id"], payload["model"], action, payload.get("instructions")
        )
        executor = self._executor(loop, client, payload.get("views"))
        await self._perform(loop, "model", executor.call_model(action))
        return encode_step_events(loop.events)

    @activity.defn(name=TOOL_STEP)
    async def tool(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self._of_my_version(payload)
        call = call_from_dict(payload["call"])
        if call.name not in self.tools:
            raise ApplicationError(
                f"this worker has no tool {call.name!r}", type=CODE_MISMATCH, non_retryable=True
            )
        loop = _OneOperation(payload["run_id"])
        executor = self._executor(loop, asker=Asker())
        token = _durable_run_id.set(payload["run_id"])
        try:
            await self._perform(loop, call.id, executor.run_tool(call))
        finally:
            _durable_run_id.reset(token)
        return encode_step_events(loop.events)

    @activity.defn(name=PERMISSION_STEP)
    async def permissions(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self._of_my_version(payload)
        calls = [call_from_dict(c) for c in payload["calls"]]
        loop = _OneOperation(payload["run_id"])
        executor = self._executor(loop)
        await self._perform(loop, "", executor.check_permissions(calls))
        return encode_step_events(loop.events)

    @activity.defn(name=CONTINUE_STEP)
    async def should_continue(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self._of_my_version(payload)
        messages = messages_from_dicts(payload["messages"])
        loop = _OneOperation(payload["run_id"], messages)
        executor = self._executor(loop)
        await self._perform(loop, "", executor.check_continue(payload["turn"]))
        return encode_step_events(loop.events)

    @activity.defn(name=DECISION_STEP)
    async def step(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        self._of_my_version(payload)
        name = payload["step"]
        if name not in {s.name for s in self.hooks.steps}:
            raise ApplicationError(
                f"this worker has no step {name!r}", type=CODE_MISMATCH, non_retryable=True
            )
        messages = messages_from_dicts(payload["messages"])
        loop = _OneOperation(payload["run_id"], messages)
        executor = self._executor(loop, views=payload.get("views"))
        await self._perform(loop, "", executor.run_step(RunStep(name, 0)))
        return encode_step_events(loop.events)

    async def _perform(
        self, loop: _OneOperation, key: str, operation: Coroutine[Any, Any, None]
    ) -> None:
        """Run ``operation`` while heartbeating; on cancellation (an abort), fire its
        signal and give it the grace period (module docstring)."""
        holder: list[Any] = []  # the tool's checkpoint, sent with every heartbeat
        token = _checkpoint.set(holder)
        try:
            task = asyncio.ensure_future(operation)  # sees the holder (its context)
        finally:
            _checkpoint.reset(token)
        watched = self.standby.enter(activity.client(), activity.info().task_token, holder)
        beating = asyncio.ensure_future(self._beat(watched))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await self._stop(loop, key, task)
        finally:
            self.standby.leave(watched)
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    async def _stop(self, loop: _OneOperation, key: str, task: asyncio.Future[None]) -> None:
        loop.aborting = True
        loop.controller.abort("aborted by the caller")
        await asyncio.wait({task}, timeout=self.grace / 2)
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=self.grace / 2)
        if not task.done() and key:
            loop.post(
                key,
                ModelCancelled(f"{ABANDONED}: it ignored cancellation")
                if key == "model"
                else ToolCancelled(key, f"{ABANDONED}: the tool ignored cancellation"),
            )

    async def _beat(self, watched: Beating) -> None:
        while True:
            activity.heartbeat(*watched.details)
            watched.beat()
            await asyncio.sleep(self.heartbeat / 3)
