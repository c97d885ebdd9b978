"""Helpers shared by the driver's tests: virtual time, tools made from functions, and
runs watched for one kind of event."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import statemachine as sm
from statemachine.core.messages import AssistantMessage, StopReason, ToolCall, UserMessage
from statemachine.testing import ScriptedModel
from statemachine.testing.clock import IdleSkippingLoop

_T = TypeVar("_T")
_E = TypeVar("_E")


def on_virtual_time(main: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run ``main()`` on the idle-skipping loop: waits and grace periods cost nothing."""
    with asyncio.Runner(loop_factory=IdleSkippingLoop) as runner:
        return runner.run(main())


def make_tool(name: str, fn: Callable[..., Any]) -> sm.Tool:
    """The tool ``name`` that runs ``fn``."""
    fn.__name__ = name
    fn.__doc__ = f"The {name} tool."
    return sm.tool(fn)


def asks(*names: str) -> AssistantMessage:
    """An assistant message asking for one call of each tool named, ids c1, c2, ..."""
    calls = [ToolCall(f"c{i}", name, {}) for i, name in enumerate(names, 1)]
    return AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)


async def forever() -> str:
    """A tool body that never returns by itself."""
    await asyncio.Event().wait()
    return "never"


def watched(
    run: sm.AgentRun, kind: type[_E], abort: str | None = None
) -> tuple[sm.RunResult, list[_E]]:
    """Run ``run`` on virtual time, with its events of ``kind``; aborted after 0.5 s
    for the reason ``abort`` when one is given."""
    seen: list[_E] = []

    async def main() -> sm.RunResult:
        async def watch() -> None:
            async for event in run.events():
                if isinstance(event, kind):
                    seen.append(event)

        watcher = asyncio.ensure_future(watch())
        if abort is not None:
            asyncio.get_running_loop().call_later(0.5, run.abort, abort)
        result = await run.run()
        await watcher
        return result

    return on_virtual_time(main), seen


def aborted_at_half_a_second(
    run: sm.AgentRun, reason: str, kind: type[_E]
) -> tuple[sm.RunResult, list[_E]]:
    """Run ``run`` on virtual time, aborted after 0.5 s; with its events of ``kind``."""
    return watched(run, kind, abort=reason)


async def ignores_one_cancellation() -> str:
    """A tool body that outlives a grace period after its first cancellation."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await asyncio.sleep(5.0)  # past the grace period: abandoned
    return "late"


def asking_run(tools: dict[str, Callable[..., Any]], **options: Any) -> sm.AgentRun:
    """A run on "go" whose model asks once for one call of each of ``tools`` (by name,
    in order; each made with ``make_tool``), with the run's ``options``."""
    return sm.AgentRun(
        model=ScriptedModel(asks(*tools)),
        messages=[UserMessage("go")],
        tools=[make_tool(name, fn) for name, fn in tools.items()],
        **options,
    )
