"""Running a scenario: ``run_scenario`` drives any loop with a scenario's scripted
world (``world.py``) and records what happened in a ``RunRecord``.

``agent_loop()`` adapts ``run_agent`` (through ``AgentRun``, whose handle lets the
scenario's typed input reach the run) to the loop shape the kit drives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from statemachine.agent.events import (
    RunResult,
)
from statemachine.agent.run import (
    AgentRun,
)
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.engine import Engine
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.wire import (
    message_from_dict,
)
from statemachine.testing._step_decisions import recording_decisions, recording_engines
from statemachine.testing.clock import runner_for
from statemachine.testing.scenario import AgentLoop, RunRecord, Scenario
from statemachine.testing.world import ScenarioHooks, Scripted

__all__ = ["ScenarioRunner", "agent_loop", "run_scenario", "run_scenario_async"]


def _as_messages(value: Any) -> tuple[tuple[Message, ...] | None, RunResult | None, str | None]:
    """Read what a loop returned: a RunResult, or a sequence of messages or wire dicts."""
    if isinstance(value, RunResult):
        return tuple(value.messages), value, None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        return None, None, f"the loop returned a {type(value).__name__}, not a message sequence"
    out: list[Message] = []
    for i, item in enumerate(value):
        if isinstance(item, (UserMessage, AssistantMessage, ToolResultMessage)):
            out.append(item)
        elif isinstance(item, Mapping):
            try:
                out.append(message_from_dict(item, path=f"messages[{i}]"))
            except ValueError as exc:
                return None, None, f"the loop returned an unreadable message: {exc}"
        else:
            return None, None, f"the loop returned messages[{i}] of type {type(item).__name__}"
    return tuple(out), None, None


async def run_scenario_async(
    loop: AgentLoop,
    scenario: Scenario,
    *,
    timeout: float = 10.0,
    hang_limit: float = 1.0,
) -> RunRecord:
    """Run ``scenario`` through ``loop`` and record what happened.

    ``timeout`` bounds the whole run (a loop still running then is recorded as not
    returning); ``hang_limit`` is how long a hanging model call or tool waits to be
    cancelled before it gives up and finishes on its own (which I6 reports: a loop must
    cancel a call that ignores the abort, so raise it for a loop whose grace period is
    longer; on the idle-skipping loop a longer wait costs no real time). A scenario
    with hooks hands them to the loop as ``hooks=`` (``agent_loop`` takes them).
    """
    world = Scripted(scenario, hang_limit=hang_limit)
    extra = {"hooks": world.hooks} if world.hooks is not None else {}
    with recording_decisions() as log:
        call = loop(
            model=world.model,
            tools=world.tools,
            messages=list(scenario.history),
            max_turns=scenario.max_turns,
            signal=world.signal,
            **extra,
        )
        value, error, timed_out = await _returned(call, timeout)
    transcript, result = None, None
    if error is None:
        transcript, result, error = _as_messages(value)
    obs = world.observer
    running = tuple(ex.key for ex in obs.executions if not ex.finished)
    # Let stragglers the loop abandoned finish, so they cannot leak into the next run.
    for _ in range(5):
        if all(ex.finished for ex in obs.executions):
            break
        await asyncio.sleep(0)
    return RunRecord(
        scenario=scenario,
        transcript=transcript,
        result=result,
        error=error,
        timed_out=timed_out,
        model_calls=obs.model_calls,
        produced=tuple(obs.produced),
        raised_at=tuple(obs.raised_at),
        executions=tuple(attrs.evolve(ex) for ex in obs.executions),
        running_at_return=running,
        abort_fired=obs.abort_fired,
        abort_fired_after_model_calls=obs.abort_fired_after,
        model_calls_after_abort=obs.model_calls_after_abort,
        model_hang_expired=obs.model_hang_expired,
        requests=tuple(obs.requests),
        steps=log.steps,
        decisions=tuple(log.decisions),
        finish_order=tuple(obs.finish_order),
    )


async def _returned(call: Awaitable[Any], timeout: float) -> tuple[Any, str | None, bool]:
    """What the loop returned, or the error that escaped it; and whether it timed out."""
    try:
        return await asyncio.wait_for(call, timeout), None, False
    except TimeoutError:
        return None, f"the loop did not return within {timeout:g} s", True
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the runner itself is being cancelled: not the loop's doing
        return None, "CancelledError escaped the loop", False
    except Exception as exc:  # noqa: BLE001 - an escaping exception is what I8 judges
        return None, f"{type(exc).__name__}: {exc}", False


ScenarioRunner: TypeAlias = Callable[[AgentLoop, Scenario], RunRecord]


def run_scenario(
    loop: AgentLoop,
    scenario: Scenario,
    *,
    timeout: float = 10.0,
    hang_limit: float = 1.0,
    virtual_time: bool | None = None,
) -> RunRecord:
    """``run_scenario_async`` for code without an event loop (one fresh loop per call).

    ``virtual_time`` as in ``run_conformance``: by default the run goes on an event
    loop whose clock skips idle waits, unless ``loop.needs_real_time`` is set.
    """
    with runner_for(loop, virtual_time) as runner:
        return runner.run(
            run_scenario_async(loop, scenario, timeout=timeout, hang_limit=hang_limit)
        )


def agent_loop(*, grace_period: float = 0.02, **run_agent_kwargs: Any) -> AgentLoop:
    """``statemachine.run_agent`` in the loop shape the kit runs.

    The grace period is short (scripted tools that honour the abort stop within a
    few ticks) so conformance runs stay fast; a scenario's hooks (``hooks=``, given
    by ``run_scenario`` to a scenario that has them) are installed on the run; the
    driver's logs are discarded unless ``logger=`` is given, because thousands of runs
    would otherwise flood the output.
    """
    if "logger" not in run_agent_kwargs:
        run_agent_kwargs["logger"] = _quiet_logger()

    async def loop(
        *,
        model: Any,
        tools: Sequence[Tool],
        messages: Sequence[Message],
        max_turns: int,
        signal: AbortSignal,
        hooks: ScenarioHooks | None = None,
    ) -> RunResult:
        options = dict(run_agent_kwargs)
        # The kit reads what the team's steps answered (``expected_run``).
        options["engine_factory"] = recording_engines(options.get("engine_factory", Engine))
        if hooks is not None:
            if hooks.hooks.permissions:
                options["before_tool_call"] = hooks.before_tool_call
            if hooks.hooks.stop_at_turn is not None:
                options["should_continue"] = hooks.should_continue
        # AgentRun is what run_agent runs; its handle lets typed input reach the run.
        run = AgentRun(
            model=model,
            tools=tools,
            messages=messages,
            max_turns=max_turns,
            signal=signal,
            grace_period=grace_period,
            **options,
        )
        if hooks is not None:
            await hooks.attach(run)
        return await run.run()

    return loop


def _quiet_logger() -> Any:
    import logging

    import structlog

    return structlog.wrap_logger(
        structlog.ReturnLogger(),
        processors=[],
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
    )
