"""Through the asyncio driver: parallel tools, steering, hooks, approvals with resume
in a fresh run, the event stream and run statistics.

No test asserts a duration: concurrency is shown by what overlapped (a barrier that
only releases when every call has started), not by how long it took.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from driver_support import on_virtual_time

import statemachine as sm
import statemachine.messages
from statemachine.core.invariants import history_violations
from statemachine.testing import FunctionModel
from statemachine.testing import ScriptedModel as Scripted


def asks(*calls: sm.ToolCall) -> sm.AssistantMessage:
    return sm.AssistantMessage(calls, stop_reason="toolUse")


def results(messages: Sequence[sm.Message]) -> list[sm.ToolResultMessage]:
    return [m for m in messages if isinstance(m, sm.ToolResultMessage)]


def test_concurrent_calls_all_start_before_any_finishes() -> None:
    n = 10
    gate = asyncio.Event()
    started: list[int] = []

    @sm.tool
    async def work(i: int) -> str:
        """Wait until every call of the batch has started."""
        started.append(i)
        if len(started) == n:
            gate.set()
        await gate.wait()  # deadlocks unless all ten run at once
        return f"done {i}"

    model = Scripted(
        asks(*(sm.ToolCall(f"c{i}", "work", {"i": i}) for i in range(n))), sm.AssistantMessage("ok")
    )

    async def main() -> sm.RunResult:
        return await asyncio.wait_for(
            sm.run_agent(model=model, tools=[work], messages=[sm.UserMessage("go")]), 10
        )

    result = asyncio.run(main())
    assert result.state is sm.TurnState.DONE
    assert [r.text for r in results(result.messages)] == [f"done {i}" for i in range(n)]


def test_calls_on_one_resource_never_overlap_and_keep_call_order() -> None:
    active: set[str] = set()
    overlaps: list[str] = []
    order: list[str] = []

    @sm.tool(resources=lambda args: [args["path"]])
    async def edit(path: str, text: str) -> str:
        """Append to a file."""
        if path in active:
            overlaps.append(path)
        active.add(path)
        await asyncio.sleep(0.001 if text == "slow" else 0)
        order.append(f"{path}:{text}")
        active.discard(path)
        return f"wrote {text}"

    calls = [
        sm.ToolCall("a", "edit", {"path": "f", "text": "slow"}),
        sm.ToolCall("b", "edit", {"path": "g", "text": "1"}),
        sm.ToolCall("c", "edit", {"path": "f", "text": "2"}),
    ]
    result = sm.run_agent_sync(
        model=Scripted(asks(*calls), sm.AssistantMessage("ok")),
        tools=[edit],
        messages=[sm.UserMessage("go")],
    )
    assert overlaps == []
    assert order.index("f:slow") < order.index("f:2")
    assert [r.tool_call_id for r in results(result.messages)] == ["a", "b", "c"]


def test_a_failing_call_never_throws_away_its_siblings_results() -> None:
    @sm.tool
    async def flaky(ok: bool) -> str:
        """Fails when asked to."""
        if not ok:
            raise RuntimeError("broken")
        await asyncio.sleep(0)
        return "fine"

    calls = [sm.ToolCall("a", "flaky", {"ok": False}), sm.ToolCall("b", "flaky", {"ok": True})]
    result = sm.run_agent_sync(
        model=Scripted(asks(*calls), sm.AssistantMessage("ok")),
        tools=[flaky],
        messages=[sm.UserMessage("go")],
    )
    assert [(r.is_error, r.text) for r in results(result.messages)] == [
        (True, "RuntimeError: broken"),
        (False, "fine"),
    ]


def test_a_tool_timeout_gives_a_timed_out_result_after_cleanup() -> None:
    cleaned: list[bool] = []

    @sm.tool(timeout=0.01)
    async def hang(signal: sm.AbortSignal) -> str:
        """Never finishes on its own."""
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(signal.aborted)
        return "unreachable"

    result = sm.run_agent_sync(
        model=Scripted(asks(sm.ToolCall("a", "hang", {})), sm.AssistantMessage("ok")),
        tools=[hang],
        messages=[sm.UserMessage("go")],
        grace_period=0.01,
    )
    (only,) = results(result.messages)
    assert only.is_error
    assert only.text == "Tool hang timed out after 0.01 s"
    assert cleaned == [True]  # its signal fired and its cleanup ran before the result
    assert result.state is sm.TurnState.DONE


def test_steering_mid_run_is_injected_after_the_batch() -> None:
    release = asyncio.Event()

    @sm.tool
    async def wait() -> str:
        """Wait for the test."""
        await release.wait()
        return "waited"

    model = Scripted(asks(sm.ToolCall("a", "wait", {})), sm.AssistantMessage("saw it"))

    async def main() -> sm.RunResult:
        run = sm.AgentRun(model=model, tools=[wait], messages=[sm.UserMessage("go")])
        task = asyncio.create_task(run.run())
        while not any(isinstance(m, sm.AssistantMessage) for m in run.engine.messages):
            await asyncio.sleep(0)
        run.steer("also check the tests")
        await asyncio.sleep(0)
        release.set()
        return await task

    result = asyncio.run(main())
    kinds = [
        (type(m).__name__, m == sm.UserMessage("also check the tests")) for m in result.messages
    ]
    assert kinds == [
        ("UserMessage", False),
        ("AssistantMessage", False),
        ("ToolResultMessage", False),
        ("UserMessage", True),
        ("AssistantMessage", False),
    ]
    assert model.contexts[1][-1] == sm.UserMessage("also check the tests")


def test_a_follow_up_continues_a_run_that_would_finish() -> None:
    model = Scripted(sm.AssistantMessage("first"), sm.AssistantMessage("second"))
    run = sm.AgentRun(model=model, messages=[sm.UserMessage("go")])
    run.follow_up("one more thing")
    result = asyncio.run(run.run())
    assert result.state is sm.TurnState.DONE
    assert [type(m).__name__ for m in result.messages] == [
        "UserMessage",
        "AssistantMessage",
        "UserMessage",
        "AssistantMessage",
    ]
    with pytest.raises(sm.UsageError):
        run.steer("too late")


def test_after_tool_call_may_replace_the_result_and_a_raising_one_keeps_the_text() -> None:
    @sm.tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    def after(call: sm.ToolCall, output: sm.ToolOutput) -> sm.ToolOutput | None:
        if call.id == "a":
            return sm.ToolOutput("replaced")
        if call.id == "b":
            raise ValueError("hook broke")
        return None

    calls = [sm.ToolCall(i, "echo", {"text": f"orig {i}"}) for i in ("a", "b", "c")]
    result = sm.run_agent_sync(
        model=Scripted(asks(*calls), sm.AssistantMessage("ok")),
        tools=[echo],
        messages=[sm.UserMessage("go")],
        after_tool_call=after,
    )
    a, b, c = results(result.messages)
    assert (a.is_error, a.text) == (False, "replaced")
    assert b.is_error
    assert "ValueError: hook broke" in b.text
    assert "orig b" in b.text  # nothing is lost
    assert (c.is_error, c.text) == (False, "orig c")


def test_should_continue_stop_ends_done_with_the_reason() -> None:
    @sm.tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    seen: list[int] = []

    def should_continue(messages: Sequence[sm.Message], turn: int) -> sm.Stop | None:
        seen.append(turn)
        return sm.Stop("budget reached") if turn >= 2 else None

    model = Scripted(*(asks(sm.ToolCall(f"c{i}", "echo", {"text": "x"})) for i in range(5)))
    result = sm.run_agent_sync(
        model=model, tools=[echo], messages=[sm.UserMessage("go")], should_continue=should_continue
    )
    assert result.state is sm.TurnState.DONE
    assert seen == [1, 2]
    assert "budget reached" in result.explanation
    assert history_violations(result.messages) == []


def test_a_raising_should_continue_stops_the_run_with_an_explanation() -> None:
    def should_continue(messages: Sequence[sm.Message], turn: int) -> None:
        raise RuntimeError("oops")

    @sm.tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    model = Scripted(asks(sm.ToolCall("c", "echo", {"text": "x"})))
    result = sm.run_agent_sync(
        model=model, tools=[echo], messages=[sm.UserMessage("go")], should_continue=should_continue
    )
    assert result.state is sm.TurnState.DONE
    assert "should_continue hook raised RuntimeError: oops" in result.explanation


def test_transform_context_changes_what_the_model_sees_not_the_history() -> None:
    def compact(messages: Sequence[sm.Message]) -> Sequence[sm.Message]:
        return [sm.UserMessage("summary"), *list(messages)[-1:]]

    model = Scripted(sm.AssistantMessage("ok"))
    history: list[sm.Message] = [
        sm.UserMessage("a"),
        sm.AssistantMessage("b"),
        sm.UserMessage("c"),
    ]
    result = sm.run_agent_sync(model=model, messages=history, transform_context=compact)
    assert model.contexts[0] == [sm.UserMessage("summary"), sm.UserMessage("c")]
    assert list(result.messages[:3]) == history


def test_a_raising_transform_context_fails_the_run_with_the_hooks_error() -> None:
    def compact(messages: Sequence[sm.Message]) -> Sequence[sm.Message]:
        raise KeyError("summary")

    result = sm.run_agent_sync(
        model=Scripted(), messages=[sm.UserMessage("go")], transform_context=compact
    )
    assert result.state is sm.TurnState.FAILED
    assert "transform_context hook raised KeyError" in result.explanation


def test_approval_suspends_and_resumes_in_a_fresh_run_from_json() -> None:
    ran: list[str] = []

    @sm.tool
    def act(name: str) -> str:
        """Act."""
        ran.append(name)
        return f"did {name}"

    def before(call: sm.ToolCall) -> sm.RequireApproval | None:
        return sm.RequireApproval("deletes data") if call.arguments["name"] == "rm" else None

    calls = [
        sm.ToolCall(i, "act", {"name": n}) for i, n in (("a", "ls"), ("b", "rm"), ("c", "cat"))
    ]
    first = sm.run_agent_sync(
        model=Scripted(asks(*calls)),
        tools=[act],
        messages=[sm.UserMessage("go")],
        before_tool_call=before,
    )
    assert first.state is sm.TurnState.AWAITING_USER
    assert [c.id for c in first.pending_approvals] == ["b"]
    assert sorted(ran) == ["cat", "ls"]
    assert "deletes data" in first.explanation
    assert first.snapshot is not None

    snapshot = json.loads(json.dumps(first.snapshot))  # as if stored and reloaded elsewhere
    model = Scripted(sm.AssistantMessage("all done"))
    second = asyncio.run(
        sm.resume_agent(
            snapshot, model=model, tools=[act], approvals={"b": True}, before_tool_call=before
        )
    )
    assert second.state is sm.TurnState.DONE
    assert ran[-1] == "rm"
    assert [r.tool_call_id for r in results(second.messages)] == ["a", "b", "c"]
    assert history_violations(second.messages) == []


def test_resume_refuses_missing_decisions_and_unknown_calls() -> None:
    @sm.tool
    def act(name: str) -> str:
        """Act."""
        return name

    first = sm.run_agent_sync(
        model=Scripted(asks(sm.ToolCall("b", "act", {"name": "rm"}))),
        tools=[act],
        messages=[sm.UserMessage("go")],
        before_tool_call=lambda call: sm.RequireApproval(),
    )
    with pytest.raises(sm.InvalidInputError, match="missing: b"):
        sm.resume_run(first, model=Scripted(), tools=[act])
    with pytest.raises(sm.InvalidInputError, match="'zz' is not waiting"):
        sm.resume_run(first, model=Scripted(), tools=[act], approvals={"zz": True})
    done = sm.run_agent_sync(
        model=Scripted(sm.AssistantMessage("x")), messages=[sm.UserMessage("go")]
    )
    with pytest.raises(sm.UsageError):
        sm.resume_run(done, model=Scripted())


def test_the_event_stream_is_derived_from_the_run() -> None:
    progress_seen: list[object] = []

    @sm.tool
    async def step() -> str:
        """Reports progress."""
        assert sm.report_progress({"pct": 50})
        return "ok"

    @sm.tool
    def sync_step() -> str:
        """Reports progress from a worker thread."""
        assert threading.current_thread() is not threading.main_thread()
        sm.report_progress("half")
        return "ok"

    usage = sm.messages.Usage(input=10, output=5, total_tokens=15, cost=0.01)
    model = Scripted(
        sm.AssistantMessage(
            (sm.ToolCall("a", "step", {}), sm.ToolCall("b", "sync_step", {})), usage=usage
        ),
        sm.AssistantMessage("done", usage=usage),
    )

    async def main() -> tuple[sm.RunResult, list[Any]]:
        run = sm.AgentRun(model=model, tools=[step, sync_step], messages=[sm.UserMessage("go")])
        events: list[Any] = []
        stream = run.events()  # subscribe before the run starts, to see every event

        async def watch() -> None:
            async for event in stream:
                events.append(event)
                if isinstance(event, sm.ToolProgress):
                    progress_seen.append(event.data)

        watcher = asyncio.create_task(watch())
        result = await run.run()
        await asyncio.wait_for(watcher, 5)
        return result, events

    result, events = asyncio.run(main())
    names = [type(e).__name__ for e in events]
    assert names[0] == "RunStarted"
    assert names[-1] == "RunReturned"
    assert names.count("TurnStarted") == 2
    assert names.count("TurnEnded") == 2
    assert names.count("ToolStarted") == 2
    assert names.count("ToolEnded") == 2
    added = [e.message for e in events if isinstance(e, sm.MessageAdded)]
    assert added == list(result.messages[1:])
    changes = [e.record for e in events if isinstance(e, sm.StateChanged)]
    assert changes == list(result.trace)
    assert sorted(map(str, progress_seen)) == ["half", "{'pct': 50}"]
    assert not sm.report_progress("outside a tool")
    finished = events[-1]
    assert isinstance(finished, sm.RunReturned)
    stats = finished.stats
    assert stats.model_calls == 2
    assert stats.tool_calls == {"step": {"ok": 1}, "sync_step": {"ok": 1}}
    assert stats.usage == sm.messages.Usage(input=20, output=10, total_tokens=30, cost=0.02)
    assert len(stats.turn_seconds) == 2
    assert set(stats.tool_seconds) == {"a", "b"}


def test_abort_through_the_handle_while_tools_run() -> None:
    @sm.tool
    async def hang(signal: sm.AbortSignal) -> str:
        """Waits for abort."""
        while not signal.aborted:
            await asyncio.sleep(0.001)
        return "stopped cleanly"

    model = Scripted(asks(sm.ToolCall("a", "hang", {}), sm.ToolCall("b", "hang", {})))

    async def main() -> sm.RunResult:
        run = sm.AgentRun(
            model=model, tools=[hang], messages=[sm.UserMessage("go")], grace_period=1
        )
        task = asyncio.create_task(run.run())
        while len(run.engine.trace) < 3:
            await asyncio.sleep(0.001)
        run.abort("user pressed stop")
        return await task

    result = asyncio.run(main())
    assert result.state is sm.TurnState.ABORTED
    assert [r.text for r in results(result.messages)] == ["stopped cleanly", "stopped cleanly"]
    assert "user pressed stop" in result.explanation


def test_a_failed_runs_error_keeps_the_providers_exception_as_its_cause() -> None:
    class ContextTooLongError(Exception):
        pass

    model = Scripted(ContextTooLongError("context too long"))
    result = sm.run_agent_sync(model=model, messages=[sm.UserMessage("go")])
    assert result.state is sm.TurnState.FAILED
    assert isinstance(result.error, sm.ModelFailedError)
    assert isinstance(result.error.__cause__, ContextTooLongError)
    assert "ContextTooLongError: context too long" in result.explanation


def test_a_tool_knows_which_call_it_is_executing() -> None:
    seen: list[str | None] = []

    @sm.tool
    def whoami() -> str:
        """Report the call id (runs in a worker thread)."""
        call = sm.current_tool_call()
        seen.append(None if call is None else call.id)
        return "ok"

    calls = [sm.ToolCall("first", "whoami", {}), sm.ToolCall("second", "whoami", {})]
    sm.run_agent_sync(
        model=Scripted(asks(*calls), sm.AssistantMessage("ok")),
        tools=[whoami],
        messages=[sm.UserMessage("go")],
    )
    assert sorted(s or "" for s in seen) == ["first", "second"]
    assert sm.current_tool_call() is None


def test_input_queued_by_a_model_client_is_ahead_of_its_own_response() -> None:
    def queues(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> sm.AssistantMessage:
        if model.calls == 1:
            run.follow_up("and one more")  # then answer at once
        return sm.AssistantMessage(f"answer {model.calls}")

    model = FunctionModel(queues)
    run = sm.AgentRun(model=model, messages=[sm.UserMessage("go")])
    result = asyncio.run(run.run())
    assert model.calls == 2  # the follow-up was not lost behind the first answer
    assert result.messages[2] == sm.UserMessage("and one more")
    assert result.queued_input == ()


def test_input_that_arrives_as_the_run_ends_is_reported_not_dropped() -> None:
    def queues_from_a_thread(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> sm.AssistantMessage:
        thread = threading.Thread(target=lambda: run.steer("too late to inject"))
        thread.start()
        thread.join()
        return sm.AssistantMessage("final answer")

    run = sm.AgentRun(model=FunctionModel(queues_from_a_thread), messages=[sm.UserMessage("go")])
    result = asyncio.run(run.run())
    assert result.state is sm.TurnState.DONE
    assert [q.message for q in result.queued_input] == [sm.UserMessage("too late to inject")]


def test_abort_through_the_handle_after_the_run_is_a_no_op() -> None:
    run = sm.AgentRun(model=Scripted(sm.AssistantMessage("done")), messages=[sm.UserMessage("go")])
    result = asyncio.run(run.run())
    run.abort("too late")  # the loop is closed; nothing to do, nothing raised
    assert result.state is sm.TurnState.DONE


def test_abort_before_the_run_starts_makes_no_model_call() -> None:
    model = Scripted(sm.AssistantMessage("never"))
    run = sm.AgentRun(model=model, messages=[sm.UserMessage("go")])
    run.abort("changed my mind")
    result = asyncio.run(run.run())
    assert result.state is sm.TurnState.ABORTED
    assert model.contexts == []
    assert "changed my mind" in result.explanation


def test_a_run_results_repr_stays_short_however_long_the_run() -> None:
    model = Scripted(sm.AssistantMessage("x" * 10_000))
    result = sm.run_agent_sync(model=model, messages=[sm.UserMessage("go")])
    assert len(result.messages) == 2
    assert "x" * 100 not in repr(result)
    assert "Done" in repr(result)


@pytest.mark.timeout(30)
def test_a_tool_timing_out_fires_only_its_own_signal() -> None:
    # A tool's timeout fires a signal of its own call: the run's signal, which the
    # other tools of the batch and the next model call hold, is not aborted by it.
    seen: list[bool] = []

    @sm.tool(timeout=0.05)
    async def slow(signal: sm.AbortSignal) -> str:
        """Longer than its timeout."""
        await asyncio.sleep(10)
        return "unreachable"

    @sm.tool
    async def patient(signal: sm.AbortSignal) -> str:
        """Outlives the other's timeout, then says whether its signal fired."""
        await asyncio.sleep(0.3)
        seen.append(signal.aborted)
        return "aborted" if signal.aborted else "fine"

    def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition], signal: sm.AbortSignal
    ) -> sm.AssistantMessage:
        if len(messages) == 1:
            return asks(sm.ToolCall("a", "slow", {}), sm.ToolCall("b", "patient", {}))
        seen.append(signal.aborted)
        return sm.AssistantMessage("ok")

    result = on_virtual_time(
        lambda: sm.run_agent(
            model=FunctionModel(answer, with_signal=True),
            tools=[slow, patient],
            messages=[sm.UserMessage("go")],
        )
    )
    assert result.state is sm.TurnState.DONE
    assert [(r.is_error, r.text) for r in results(result.messages)] == [
        (True, "Tool slow timed out after 0.05 s"),
        (False, "fine"),
    ]
    assert seen == [False, False]  # the other tool's signal, then the model's


@pytest.mark.timeout(30)
def test_a_lone_tool_call_is_announced_to_subscribers_before_it_ends() -> None:
    @sm.tool
    async def echo(text: str) -> str:
        """Echo."""
        return text

    run = sm.AgentRun(
        model=Scripted(asks(sm.ToolCall("a", "echo", {"text": "x"})), sm.AssistantMessage("ok")),
        tools=[echo],
        messages=[sm.UserMessage("go")],
    )
    stream = run.events()

    async def main() -> list[sm.RunEvent]:
        await run.run()
        return [event async for event in stream]

    events = asyncio.run(main())
    tool_events = [
        (type(e).__name__, e.call.id)
        for e in events
        if isinstance(e, (sm.ToolStarted, sm.ToolEnded))
    ]
    assert tool_events == [("ToolStarted", "a"), ("ToolEnded", "a")]


@pytest.mark.timeout(30)
def test_a_timed_out_tool_that_ignores_its_signal_finishes_its_cleanup_before_its_result() -> None:
    # After the timeout, the signal, then the grace period, the tool is cancelled; its
    # cleanup (which awaits) ends before the timed-out result goes to the model.
    cleaned: list[str] = []
    seen_by_model: list[list[str]] = []

    @sm.tool(timeout=0.05)
    async def deaf(signal: sm.AbortSignal) -> str:
        """Ignores its signal; cleans up slowly when cancelled."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            cleaned.append("cleaned")
            raise
        return "unreachable"

    def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> sm.AssistantMessage:
        if len(messages) == 1:
            return asks(sm.ToolCall("a", "deaf", {}))
        seen_by_model.append(list(cleaned))
        return sm.AssistantMessage("ok")

    result = on_virtual_time(
        lambda: sm.run_agent(
            model=FunctionModel(answer),
            tools=[deaf],
            messages=[sm.UserMessage("go")],
            grace_period=0.5,
        )
    )
    assert result.state is sm.TurnState.DONE
    assert [r.text for r in results(result.messages)] == ["Tool deaf timed out after 0.05 s"]
    assert seen_by_model == [["cleaned"]]
