"""The event stream and the stats of a run (statemachine.agent.stream): what is
timed, counted and told to subscribers."""

from __future__ import annotations

import asyncio
import itertools
import time
import tracemalloc

import pytest
from driver_support import (
    aborted_at_half_a_second,
    asking_run,
    asks,
    forever,
    ignores_one_cancellation,
    make_tool,
    on_virtual_time,
    watched,
)

import statemachine as sm
from statemachine.agent.events import RunReturned, ToolEnded, TurnEnded
from statemachine.agent.model import CallOptions
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    ToolCall,
    UserMessage,
)
from statemachine.core.table import TurnState
from statemachine.testing import ScriptedModel

S = TurnState


@pytest.mark.timeout(30)
def test_the_run_returned_event_carries_the_explanation() -> None:
    run = asking_run({"wait": forever}, grace_period=0.5)
    result, finished = aborted_at_half_a_second(run, "enough", RunReturned)
    assert "enough" in result.explanation
    assert [(e.state, e.explanation) for e in finished] == [(S.ABORTED, result.explanation)]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("listening", [False, True], ids=["quiet", "watched"])
def test_a_turn_stopped_at_its_boundary_is_timed_once(listening: bool) -> None:
    async def echo(text: str) -> str:
        return text

    def stop(messages: object, turn: int) -> sm.Stop:
        return sm.Stop("one turn is enough")

    ask = AssistantMessage(
        [ToolCall("c1", "echo", {"text": "hi"})], stop_reason=StopReason.TOOL_USE
    )
    run = sm.AgentRun(
        model=ScriptedModel(ask),
        messages=[UserMessage("go")],
        tools=[make_tool("echo", echo)],
        should_continue=stop,
    )
    result, ended = watched(run, TurnEnded) if listening else (on_virtual_time(run.run), [])
    assert result.state is S.DONE
    assert result.turns == 1
    assert result.stats is not None
    assert len(result.stats.turn_seconds) == 1
    assert 0.0 <= result.stats.turn_seconds[0] <= result.stats.wall_seconds
    if listening:
        assert [(e.turn, e.seconds) for e in ended] == [(1, result.stats.turn_seconds[0])]


@pytest.mark.timeout(30)
def test_the_turn_times_are_durations_within_the_run() -> None:
    async def echo(text: str) -> str:
        await asyncio.sleep(0.25)
        return text

    call = ToolCall("c1", "echo", {"text": "hi"})
    run = sm.AgentRun(
        model=ScriptedModel(
            AssistantMessage([call], stop_reason=StopReason.TOOL_USE), AssistantMessage("done")
        ),
        messages=[UserMessage("go")],
        tools=[make_tool("echo", echo)],
    )
    result = asyncio.run(run.run())
    assert result.state is S.DONE
    assert result.stats is not None
    assert len(result.stats.turn_seconds) == 2
    assert 0.25 <= sum(result.stats.turn_seconds) <= result.stats.wall_seconds


@pytest.mark.timeout(30)
def test_only_the_abandoned_call_is_reported_abandoned_in_the_events() -> None:
    run = asking_run({"wait": forever, "stubborn": ignores_one_cancellation}, grace_period=1.0)
    ended: dict[str, tuple[bool, bool]] = {}

    async def main() -> sm.RunResult:
        async def watch() -> None:
            async for event in run.events():
                if isinstance(event, ToolEnded):
                    ended[event.call.id] = (event.cancelled, event.abandoned)

        watcher = asyncio.ensure_future(watch())
        asyncio.get_running_loop().call_later(0.5, run.abort, "stop")
        result = await run.run()
        await watcher
        return result

    assert on_virtual_time(main).state is S.ABORTED
    assert ended == {"c1": (True, False), "c2": (True, True)}


@pytest.mark.timeout(30)
def test_a_tools_time_is_the_time_it_ran() -> None:
    async def nap() -> str:
        await asyncio.sleep(0.01)
        return "rested"

    async def quick() -> str:
        return "done"

    call = ToolCall("c1", "nap", {})
    lone = ToolCall("c2", "quick", {})
    model = ScriptedModel(
        AssistantMessage((call,), stop_reason=StopReason.TOOL_USE),
        AssistantMessage((lone,), stop_reason=StopReason.TOOL_USE),
        AssistantMessage("ok"),
    )
    result = asyncio.run(
        sm.run_agent(
            model=model,
            tools=[make_tool("nap", nap), make_tool("quick", quick)],
            messages=[UserMessage("go")],
        )
    )
    assert result.state is S.DONE
    assert result.stats is not None
    seconds = result.stats.tool_seconds
    assert 0.005 <= seconds["c1"] < 30  # a clock difference, not a sum of clock readings
    assert 0 <= seconds["c2"] < 30


@pytest.mark.timeout(30)
def test_progress_reported_on_the_event_loop_reaches_subscribers_before_the_calls_end() -> None:
    # A report made on the loop's thread is handed to the subscribers at once. Two
    # calls of one batch run as tasks: the first ends at once and wakes the run, the
    # second reports progress and ends in the same pass of the loop; a report held
    # back to a later pass would reach the subscribers after the second call's end.
    async def quick() -> str:
        return "quick"

    async def reports() -> str:
        assert sm.report_progress("half way")
        return "reported"

    run = sm.AgentRun(
        model=ScriptedModel(asks("quick", "reports"), AssistantMessage("done")),
        messages=[UserMessage("go")],
        tools=[make_tool("quick", quick), make_tool("reports", reports)],
    )
    seen: list[str] = []

    async def main() -> sm.RunResult:
        async def watch() -> None:
            async for event in run.events():
                if isinstance(event, sm.ToolProgress):
                    seen.append(f"progress {event.call_id}")
                elif isinstance(event, ToolEnded):
                    seen.append(f"ended {event.call.id}")

        watcher = asyncio.ensure_future(watch())
        result = await run.run()
        await watcher
        return result

    assert on_virtual_time(main).state is S.DONE
    assert seen.index("progress c2") < seen.index("ended c2")
    assert seen.count("progress c2") == 1


@pytest.mark.timeout(30)
def test_the_wall_time_of_a_run_is_the_time_it_took() -> None:
    async def nap() -> str:
        await asyncio.sleep(0.01)
        return "rested"

    model = ScriptedModel(asks("nap"), AssistantMessage("done"))

    async def main() -> tuple[sm.RunResult, float]:
        started = time.perf_counter()
        result = await sm.run_agent(
            model=model, tools=[make_tool("nap", nap)], messages=[UserMessage("go")]
        )
        return result, time.perf_counter() - started

    result, took = asyncio.run(main())
    assert result.state is S.DONE
    assert result.stats is not None
    assert 0.005 <= result.stats.wall_seconds <= took  # a clock difference, not a sum


# -- a subscriber that lags holds the run's memory bounded -------------------------------------

REPORTS = 200_000


def _reporting_run(reports: int) -> sm.AgentRun:
    async def busy() -> str:
        for i in range(reports):
            sm.report_progress(i)
        return "busy done"

    async def quiet() -> str:
        return "quiet done"

    return sm.AgentRun(
        model=ScriptedModel(asks("busy", "quiet"), AssistantMessage("done")),
        messages=[UserMessage("go")],
        tools=[make_tool("busy", busy), make_tool("quiet", quiet)],
    )


@pytest.mark.timeout(120)
def test_a_subscription_never_read_holds_memory_bounded_whatever_the_progress() -> None:
    # 200,000 progress reports held 53 MiB in a subscription nobody read; a lagging
    # subscriber now gets the newest report of each call, in the first one's place.
    run = _reporting_run(REPORTS)

    async def main() -> tuple[sm.RunResult, int, list[sm.RunEvent]]:
        stream = run.events()
        tracemalloc.start()
        try:
            result = await run.run()
            held, _peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return result, held, [event async for event in stream]

    result, held, events = asyncio.run(main())
    assert result.state is S.DONE
    assert held < 1024 * 1024, f"{held / 2**20:.1f} MiB held"
    progress = [(e.call_id, e.data) for e in events if isinstance(e, sm.ToolProgress)]
    assert progress == [("c1", REPORTS - 1)]
    kinds = [type(e).__name__ for e in events]
    started, ended = kinds.index("ToolStarted"), kinds.index("ToolEnded")
    assert started < kinds.index("ToolProgress") < ended
    added = [e.message for e in events if isinstance(e, sm.MessageAdded)]
    assert added == list(result.messages[1:])
    assert kinds[-1] == "RunReturned"
    assert not any(isinstance(e, sm.EventsDropped) for e in events)


# Never dropped, whatever a subscriber's lag: the events of what the run holds anyway.
_KEPT = (sm.RunStarted, sm.MessageAdded, sm.ToolStarted, sm.ToolEnded, sm.RunReturned)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("max_buffered", [1, 4, 9])
def test_past_its_buffer_a_slow_subscriber_is_told_how_many_events_were_dropped(
    max_buffered: int,
) -> None:
    run = _reporting_run(1)  # one report: nothing to coalesce

    async def main() -> tuple[list[sm.RunEvent], list[sm.RunEvent]]:
        everything, slow = run.events(), run.events(max_buffered=max_buffered)
        await run.run()
        return [e async for e in everything], [e async for e in slow]

    everything, slow = asyncio.run(main())
    kept = [e for e in everything if isinstance(e, _KEPT)]
    droppable = [e for e in everything if not isinstance(e, _KEPT)]
    assert len(droppable) > 9
    assert [e for e in slow if isinstance(e, _KEPT)] == kept
    seen = [e for e in slow if not isinstance(e, (*_KEPT, sm.EventsDropped))]
    dropped = [e.count for e in slow if isinstance(e, sm.EventsDropped)]
    assert seen == droppable[: len(seen)]  # the first ones, until the buffer was full
    assert len(seen) == max_buffered
    assert sum(dropped) == len(droppable) - len(seen)
    # one EventsDropped for each stretch of drops between two kept events, never two
    # in a row
    kinds = [type(e) for e in slow]
    assert all(not (a is b is sm.EventsDropped) for a, b in itertools.pairwise(kinds)), kinds


@pytest.mark.timeout(30)
def test_a_buffer_limit_must_be_a_positive_integer() -> None:
    run = _reporting_run(1)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(sm.InvalidInputError, match="max_buffered"):
            run.events(max_buffered=bad)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_the_text_stream_keeps_every_fragment_however_far_it_lags() -> None:
    class Streaming:
        async def complete(
            self,
            messages: object,
            tools: object,
            signal: object,
            *,
            options: CallOptions | None = None,
        ) -> AssistantMessage:
            assert options is not None
            assert options.on_text is not None
            for i in range(20):
                options.on_text(str(i % 10))
            return AssistantMessage("".join(str(i % 10) for i in range(20)))

    run = sm.AgentRun(model=Streaming(), messages=[UserMessage("go")])

    async def main() -> tuple[sm.RunResult, list[sm.RunEvent]]:
        # what stream_text() subscribes with, past a buffer of 2
        lagging = run._stream.subscribe(max_buffered=2, keep=(sm.TextDelta,))
        result = await run.run()
        return result, [event async for event in lagging]

    result, events = asyncio.run(main())
    text = "".join(e.text for e in events if isinstance(e, sm.TextDelta))
    assert text == result.final_text
    assert len(text) == 20
    assert any(isinstance(e, sm.EventsDropped) for e in events)  # StateChanged and such


@pytest.mark.timeout(30)
def test_a_subscriber_that_stops_reading_and_closes_its_iterator_is_let_go() -> None:
    # A watcher that leaves (a live page closed) closes its iterator: the run stops
    # handing it events, so one that comes and goes many times holds nothing.
    run = _reporting_run(1)

    async def main() -> tuple[int, int, sm.RunResult]:
        left = run.events()
        stayed = run.events()
        subscribed = len(run._stream._subscribers)
        task = asyncio.ensure_future(run.run())
        first = await anext(left)
        assert isinstance(first, sm.RunStarted)
        await left.aclose()  # type: ignore[attr-defined]
        after_close = len(run._stream._subscribers)
        result = await task
        assert [e async for e in stayed][-1].__class__ is sm.RunReturned
        return subscribed, after_close, result

    subscribed, after_close, result = asyncio.run(main())
    assert result.state is S.DONE
    assert (subscribed, after_close) == (2, 1)
