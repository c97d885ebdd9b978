"""The asyncio driver: failure paths, abort and grace, ordering, ids, input checks.

Every test runs the real ``run_agent`` on a scripted model. Abort tests assert on the
order of what happened and on the outcome, never on wall time: a small grace period
only keeps them quick.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from driver_support import on_virtual_time
from structlog.testing import capture_logs

import statemachine as sm
import statemachine.engine
import statemachine.errors
import statemachine.messages
from statemachine.core.invariants import history_violations
from statemachine.testing import ScriptedModel

GRACE = 0.05


def call(call_id: str, tool_name: str, /, **arguments: Any) -> sm.ToolCall:
    return sm.ToolCall(call_id, tool_name, arguments)


def asks(*calls: sm.ToolCall) -> sm.AssistantMessage:
    return sm.AssistantMessage(calls, stop_reason=sm.messages.StopReason.TOOL_USE)


DONE = sm.AssistantMessage("done")


def results_of(result: sm.RunResult) -> list[sm.ToolResultMessage]:
    return [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]


HANG_GUARD = 60.0
"""Not a timing assertion: a generous bound that turns a hung run into a failure."""


def run(**kwargs: Any) -> sm.RunResult:
    kwargs.setdefault("messages", [sm.UserMessage("go")])
    kwargs.setdefault("grace_period", GRACE)
    return asyncio.run(asyncio.wait_for(sm.run_agent(**kwargs), HANG_GUARD))


@sm.tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


@sm.tool
async def add(a: int, b: int) -> str:
    return str(a + b)


# -- the five failure paths: each gives exactly one error result ------------------------------


def test_unknown_tool_gives_one_error_result_listing_the_available_tools() -> None:
    model = ScriptedModel(asks(call("c1", "rm_rf")), DONE)
    result = run(model=model, tools=[echo, add])
    (only,) = results_of(result)
    assert only.is_error
    assert only.tool_call_id == "c1"
    assert only.tool_name == "rm_rf"
    assert only.text == "Unknown tool: rm_rf. Available tools: echo, add."
    assert result.state is sm.TurnState.DONE
    assert len(model.requests) == 2


def test_unknown_tool_when_no_tool_exists() -> None:
    result = run(model=ScriptedModel(asks(call("c1", "x")), DONE))
    assert results_of(result)[0].text == "Unknown tool: x. No tools are available in this run."


def test_invalid_arguments_name_each_failing_path_and_the_tool_does_not_run() -> None:
    ran: list[object] = []

    @sm.tool
    async def guarded(a: int, b: int) -> str:
        ran.append((a, b))
        return "ran"

    model = ScriptedModel(asks(call("c1", "guarded", a="one", c=3)), DONE)
    result = run(model=model, tools=[guarded])
    (only,) = results_of(result)
    assert only.is_error
    assert ran == []
    lines = only.text.splitlines()
    assert lines[0] == "Invalid arguments for tool guarded:"
    assert "- arguments: 'b' is a required property" in lines
    assert "- arguments.a: 'one' is not of type 'integer'" in lines
    assert any("('c' was unexpected)" in line for line in lines)
    assert lines[-1].startswith("Expected arguments matching this JSON Schema: {")
    assert result.state is sm.TurnState.DONE


def test_an_exception_in_a_tool_becomes_its_error_result() -> None:
    @sm.tool
    async def broken(path: str) -> str:
        raise FileNotFoundError(f"File not found: {path}")

    model = ScriptedModel(
        asks(call("c1", "broken", path="a.ts"), call("c2", "echo", text="hi")), DONE
    )
    result = run(model=model, tools=[broken, echo])
    first, second = results_of(result)
    assert (first.is_error, first.text) == (True, "FileNotFoundError: File not found: a.ts")
    assert (second.is_error, second.text) == (False, "hi")
    assert result.state is sm.TurnState.DONE


def test_an_exception_without_text_still_names_its_type() -> None:
    @sm.tool
    async def broken() -> str:
        raise KeyError

    result = run(model=ScriptedModel(asks(call("c1", "broken")), DONE), tools=[broken])
    assert results_of(result)[0].text == "KeyError"


def test_a_policy_denial_stops_in_awaiting_user_with_the_reason() -> None:
    ran: list[str] = []

    @sm.tool
    async def act(name: str) -> str:
        ran.append(name)
        return f"did {name}"

    def hook(c: sm.ToolCall) -> sm.Deny | None:
        return sm.Deny("deleting is not allowed") if c.arguments["name"] == "delete" else None

    model = ScriptedModel(asks(call("c1", "act", name="delete"), call("c2", "act", name="read")))
    result = run(model=model, tools=[act], before_tool_call=hook)

    assert result.state is sm.TurnState.AWAITING_USER
    assert ran == ["read"]  # the other calls of the batch still ran
    denied, allowed = results_of(result)
    assert denied.is_error
    assert denied.text == "Tool call denied: deleting is not allowed"
    assert (allowed.is_error, allowed.text) == (False, "did read")
    assert len(model.requests) == 1  # the denial was not fed back to the model
    assert isinstance(result.error, sm.errors.AwaitingUserError)
    assert "deleting is not allowed" in result.explanation
    assert "act (call c1)" in result.explanation
    assert history_violations(result.messages) == []


def test_an_advisory_denial_lets_the_run_go_on() -> None:
    async def hook(c: sm.ToolCall) -> sm.Deny | None:
        return sm.Deny("use read_file instead", advisory=True)

    model = ScriptedModel(asks(call("c1", "echo", text="x")), DONE)
    result = run(model=model, tools=[echo], before_tool_call=hook)
    assert result.state is sm.TurnState.DONE
    (only,) = results_of(result)
    assert (only.is_error, only.text) == (True, "Tool call denied: use read_file instead")
    assert model.requests[1].messages[-1] == only


def test_an_allowing_hook_sees_every_valid_call_in_order() -> None:
    seen: list[str] = []

    def hook(c: sm.ToolCall) -> None:
        seen.append(c.id)

    model = ScriptedModel(
        asks(call("c1", "echo", text="a"), call("c2", "nope"), call("c3", "echo", text="b")), DONE
    )
    result = run(model=model, tools=[echo], before_tool_call=hook)
    assert seen == ["c1", "c3"]  # an unknown tool is answered before the hook is asked
    assert [r.text for r in results_of(result)][::2] == ["a", "b"]
    assert result.state is sm.TurnState.DONE


def test_a_hook_that_raises_fails_closed() -> None:
    ran: list[str] = []

    @sm.tool
    async def act() -> str:
        ran.append("act")
        return "did"

    def hook(c: sm.ToolCall) -> sm.Deny | None:
        raise RuntimeError("policy service down")

    with capture_logs() as logs:
        result = run(
            model=ScriptedModel(asks(call("c1", "act"))), tools=[act], before_tool_call=hook
        )
    assert ran == []
    assert result.state is sm.TurnState.AWAITING_USER
    (only,) = results_of(result)
    assert only.is_error
    assert "RuntimeError: policy service down" in only.text
    assert "the call was not run" in only.text
    assert "before_tool_call_raised" in [e["event"] for e in logs]


def test_a_hook_returning_something_else_fails_closed() -> None:
    def hook(c: sm.ToolCall) -> Any:
        return True

    result = run(
        model=ScriptedModel(asks(call("c1", "echo", text="x"))), tools=[echo], before_tool_call=hook
    )
    assert result.state is sm.TurnState.AWAITING_USER
    assert "returned bool, expected None or Deny" in results_of(result)[0].text


def test_a_tool_raising_cancelled_error_by_itself_gives_one_error_result() -> None:
    # An SDK may leak a CancelledError that nobody asked for; it is the tool's failure,
    # not a cancellation, and must not crash the run.
    async def leaky(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
        raise asyncio.CancelledError

    tool = sm.Tool(sm.ToolDefinition("leaky", ""), leaky)
    result = run(model=ScriptedModel(asks(call("c1", "leaky")), DONE), tools=[tool])
    assert result.state is sm.TurnState.DONE
    (only,) = results_of(result)
    assert only.is_error
    assert "CancelledError" in only.text


@pytest.mark.parametrize(
    ("hook_name", "state", "where"),
    [
        ("before_tool_call", sm.TurnState.AWAITING_USER, "result"),  # fails closed
        ("after_tool_call", sm.TurnState.DONE, "result"),  # the result says so
        ("should_continue", sm.TurnState.DONE, "explanation"),  # stops, explained
    ],
)
def test_a_hook_raising_cancelled_error_by_itself_does_not_hang_the_run(
    hook_name: str, state: sm.TurnState, where: str
) -> None:
    # Before the fix, the hook's task died silently and the run waited forever.
    async def leaky(*args: object) -> Any:
        raise asyncio.CancelledError

    model = ScriptedModel(asks(call("c1", "echo", text="x")), DONE)
    result = run(model=model, tools=[echo], **{hook_name: leaky})
    assert result.state is state
    assert history_violations(result.messages) == []
    (only,) = results_of(result)
    text = only.text if where == "result" else result.explanation
    assert f"the {hook_name} hook raised StrayCancelledError".lower() in text.lower()


def test_a_context_transform_raising_cancelled_error_by_itself_fails_the_call() -> None:
    async def leaky(messages: Sequence[sm.Message]) -> Any:
        raise asyncio.CancelledError

    result = run(model=ScriptedModel(DONE), transform_context=leaky)
    assert result.state is sm.TurnState.FAILED
    assert "StrayCancelledError" in result.explanation


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_an_exception_whose_text_cannot_be_read_still_gives_one_error_result() -> None:
    @sm.tool
    async def odd() -> str:
        raise _UnprintableError

    result = run(model=ScriptedModel(asks(call("c1", "odd")), DONE), tools=[odd])
    assert result.state is sm.TurnState.DONE
    (only,) = results_of(result)
    assert only.is_error
    assert only.text == "_UnprintableError: (its text could not be read)"


def test_a_model_exception_whose_text_cannot_be_read_still_ends_failed() -> None:
    result = run(model=ScriptedModel(_UnprintableError()))
    assert result.state is sm.TurnState.FAILED
    assert "_UnprintableError: (its text could not be read)" in result.explanation


def test_output_that_breaks_when_read_gives_one_error_result() -> None:
    class BadList(list[sm.TextContent]):
        def __iter__(self) -> Any:
            raise RuntimeError("cannot iterate")

    async def execute(arguments: dict[str, Any], signal: sm.AbortSignal) -> Any:
        return BadList([sm.TextContent("x")])

    odd = sm.Tool(sm.ToolDefinition("odd", ""), execute)
    result = run(model=ScriptedModel(asks(call("c1", "odd")), DONE), tools=[odd])
    assert result.state is sm.TurnState.DONE
    (only,) = results_of(result)
    assert only.is_error
    assert (
        only.text == "tool odd returned output that could not be read: RuntimeError: cannot iterate"
    )


def test_a_hook_building_a_bad_deny_fails_closed_instead_of_hanging() -> None:
    def hook(c: sm.ToolCall) -> sm.Deny:
        return sm.Deny(123)  # type: ignore[arg-type]

    result = run(
        model=ScriptedModel(asks(call("c1", "echo", text="x"))), tools=[echo], before_tool_call=hook
    )
    assert result.state is sm.TurnState.AWAITING_USER
    (only,) = results_of(result)
    assert "the before_tool_call hook raised TypeError" in only.text


@pytest.mark.parametrize(
    ("answer", "arguments"),
    [
        (sm.Deny, {"reason": None}),
        (sm.Deny, {"reason": "x", "advisory": "yes"}),
        (sm.RequireApproval, {"reason": 3}),
        (sm.Stop, {"reason": b"bytes"}),
    ],
)
def test_hook_answers_check_their_fields(answer: Any, arguments: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="must be <class"):
        answer(**arguments)


# -- the model fails ---------------------------------------------------------------------------


def test_a_model_exception_ends_failed_once_without_retry() -> None:
    model = ScriptedModel(ConnectionError("401 invalid api key"), DONE)
    result = run(model=model, tools=[echo])
    assert result.state is sm.TurnState.FAILED
    assert len(model.requests) == 1
    assert model.remaining == 1  # nothing consumed a second reply
    last = result.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.stop_reason is sm.messages.StopReason.ERROR
    assert last.error_message == "The model call failed: ConnectionError: 401 invalid api key"
    assert isinstance(result.error, sm.ModelFailedError)
    assert "401 invalid api key" in result.explanation
    assert "the run itself does not retry" in result.explanation


def test_a_model_returning_something_else_ends_failed() -> None:
    class WrongClient:
        # The library's fake models turn an answer into a message or refuse it
        # themselves; the driver's own check of what a client returns needs a client
        # that returns something else.
        async def complete(self, messages: object, tools: object, signal: object) -> object:
            return {"role": "assistant", "content": []}

    result = run(model=WrongClient())
    assert result.state is sm.TurnState.FAILED
    last = result.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.stop_reason is sm.messages.StopReason.ERROR
    assert "ModelOutputError" in (last.error_message or "")
    assert "returned dict, expected an AssistantMessage" in result.explanation


def test_a_model_raising_cancelled_error_by_itself_ends_failed() -> None:
    async def leaky(messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]) -> Any:
        raise asyncio.CancelledError

    model = ScriptedModel(leaky, DONE)
    result = run(model=model)
    assert result.state is sm.TurnState.FAILED
    assert len(model.requests) == 1
    assert "CancelledError raised by the model client" in result.explanation


@pytest.mark.parametrize(
    ("stop", "state"),
    [
        (sm.messages.StopReason.ERROR, sm.TurnState.FAILED),
        (sm.messages.StopReason.ABORTED, sm.TurnState.ABORTED),
    ],
)
def test_a_response_reporting_its_own_failure_does_not_run_its_calls(
    stop: sm.messages.StopReason, state: sm.TurnState
) -> None:
    ran: list[str] = []

    @sm.tool
    async def act() -> str:
        ran.append("act")
        return "did"

    response = sm.AssistantMessage((call("c1", "act"),), stop_reason=stop, error_message="cut")
    result = run(model=ScriptedModel(response), tools=[act])
    assert result.state is state
    assert ran == []
    (only,) = results_of(result)
    assert only.is_error
    assert only.text.startswith("Tool call not run")
    assert history_violations(result.messages) == []
    assert "cut" in result.explanation


# -- abort ------------------------------------------------------------------------------------


def test_abort_during_a_model_call_that_ignores_the_signal() -> None:
    controller = sm.AbortController()
    events: list[str] = []

    async def deaf(messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]) -> Any:
        events.append("model started")
        controller.abort("stop pressed")
        try:
            await asyncio.Event().wait()  # never set, and the signal is never read
        except asyncio.CancelledError:
            events.append("model cancelled")
            raise

    result = run(model=ScriptedModel(deaf), signal=controller.signal)
    events.append("returned")

    assert events == ["model started", "model cancelled", "returned"]
    assert result.state is sm.TurnState.ABORTED
    assert result.turns == 1
    last = result.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.stop_reason is sm.messages.StopReason.ABORTED
    assert "stop pressed" in result.explanation
    assert "during the model call of turn 1" in result.explanation


def test_abort_during_a_model_call_keeps_what_a_polite_client_returns() -> None:
    controller = sm.AbortController()

    async def polite(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition], signal: sm.AbortSignal
    ) -> Any:
        done = asyncio.Event()
        signal.add_listener(lambda _: done.set())
        controller.abort()
        await done.wait()
        return sm.AssistantMessage("partial answ", stop_reason=sm.messages.StopReason.ABORTED)

    result = run(model=ScriptedModel(polite, with_signal=True), signal=controller.signal)
    assert result.state is sm.TurnState.ABORTED
    assert result.messages[-1] == sm.AssistantMessage(
        "partial answ", stop_reason=sm.messages.StopReason.ABORTED
    )


def test_a_model_call_that_swallows_cancellation_is_abandoned() -> None:
    controller = sm.AbortController()
    events: list[str] = []

    async def stubborn(messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]) -> Any:
        controller.abort()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            events.append("swallowed")
        # ignores cancellation once; the run must not wait for it
        await asyncio.sleep(30)
        events.append("finished anyway")

    with capture_logs() as logs:
        result = run(model=ScriptedModel(stubborn), signal=controller.signal)
    assert events == ["swallowed"]
    assert result.state is sm.TurnState.ABORTED
    last = result.messages[-1]
    assert isinstance(last, sm.AssistantMessage)
    assert last.stop_reason is sm.messages.StopReason.ABORTED
    assert "abandoned" in (last.error_message or "")
    assert "operation_abandoned" in [e["event"] for e in logs]


def test_abort_during_tools_awaits_cleanup_and_keeps_arrived_results() -> None:
    controller = sm.AbortController()
    events: list[str] = []
    started = {"polite": asyncio.Event(), "deaf": asyncio.Event()}

    @sm.tool
    async def fast() -> str:
        events.append("fast returned")
        return "fast result"

    @sm.tool
    async def polite(signal: sm.AbortSignal) -> str:
        stop = asyncio.Event()
        signal.add_listener(lambda _: stop.set())
        started["polite"].set()
        try:
            await stop.wait()
            return "stopped at 40%"
        finally:
            await asyncio.sleep(0)  # asynchronous cleanup, e.g. closing a process
            events.append("polite cleaned up")

    @sm.tool
    async def deaf() -> str:
        started["deaf"].set()
        try:
            await asyncio.Event().wait()
            return "never"
        finally:
            events.append("deaf cleaned up")

    async def main() -> sm.RunResult:
        async def aborter() -> None:
            await started["polite"].wait()
            await started["deaf"].wait()
            controller.abort("user stop")

        model = ScriptedModel(asks(call("c1", "fast"), call("c2", "polite"), call("c3", "deaf")))
        result, _ = await asyncio.gather(
            sm.run_agent(
                model=model,
                tools=[fast, polite, deaf],
                messages=[sm.UserMessage("go")],
                signal=controller.signal,
                grace_period=GRACE,
            ),
            aborter(),
        )
        events.append("returned")
        assert isinstance(result, sm.RunResult)
        return result

    result = asyncio.run(main())
    assert events[-1] == "returned"
    assert {"fast returned", "polite cleaned up", "deaf cleaned up"} == set(events[:-1])
    assert result.state is sm.TurnState.ABORTED
    assert [(r.tool_call_id, r.is_error, r.text) for r in results_of(result)] == [
        ("c1", False, "fast result"),  # arrived before the abort: kept as it is
        ("c2", False, "stopped at 40%"),  # arrived within the grace period: kept
        ("c3", True, "Operation aborted: cancelled after the abort grace period"),
    ]
    assert history_violations(result.messages) == []
    assert "while the tool calls of turn 1 were running" in result.explanation


def test_a_tool_that_raises_after_abort_reports_operation_aborted() -> None:
    controller = sm.AbortController()

    @sm.tool
    async def job(signal: sm.AbortSignal) -> str:
        heard = asyncio.Event()
        signal.add_listener(lambda _: heard.set())
        controller.abort("stop")
        await heard.wait()  # the run forwards the caller's abort to the tools' signal
        signal.throw_if_aborted()
        return "unreachable"

    result = run(
        model=ScriptedModel(asks(call("c1", "job"))), tools=[job], signal=controller.signal
    )
    (only,) = results_of(result)
    assert only.is_error
    assert only.text == "Operation aborted: AbortedError: Operation aborted: stop"
    assert result.state is sm.TurnState.ABORTED


def test_a_sync_tool_ignoring_abort_is_given_up_after_grace() -> None:
    controller = sm.AbortController()
    release = threading.Event()
    threads: list[threading.Thread] = []

    @sm.tool
    def blocking() -> str:
        threads.append(threading.current_thread())
        controller.abort("stop")
        release.wait()  # a thread cannot be interrupted
        return "too late"

    async def main() -> sm.RunResult:
        try:
            return await sm.run_agent(
                model=ScriptedModel(asks(call("c1", "blocking"))),
                tools=[blocking],
                messages=[sm.UserMessage("go")],
                signal=controller.signal,
                grace_period=GRACE,
            )
        finally:
            # run_agent returned while the thread still blocks; only now let it end,
            # or asyncio.run would wait for it when it shuts the executor down
            release.set()

    result = asyncio.run(main())
    assert threads
    assert threads[0] is not threading.main_thread()
    assert result.state is sm.TurnState.ABORTED
    (only,) = results_of(result)
    assert only.is_error
    assert only.text.startswith("Operation aborted")


def test_calls_waiting_for_permission_when_aborted_get_a_not_started_result() -> None:
    controller = sm.AbortController()

    async def hook(c: sm.ToolCall) -> None:
        controller.abort("stop during review")
        await asyncio.Event().wait()

    result = run(
        model=ScriptedModel(asks(call("c1", "echo", text="a"), call("c2", "echo", text="b"))),
        tools=[echo],
        signal=controller.signal,
        before_tool_call=hook,
    )
    assert result.state is sm.TurnState.ABORTED
    texts = [r.text for r in results_of(result)]
    assert texts == ["Tool call not started: the run was aborted (stop during review)"] * 2
    assert history_violations(result.messages) == []


def test_a_signal_aborted_before_the_start_makes_no_model_call() -> None:
    controller = sm.AbortController()
    controller.abort("changed my mind")
    model = ScriptedModel(DONE)
    result = run(model=model, signal=controller.signal)
    assert result.state is sm.TurnState.ABORTED
    assert model.requests == []
    assert result.turns == 0
    assert result.messages == (sm.UserMessage("go"),)
    assert "before the first model call" in result.explanation
    assert "changed my mind" in result.explanation


def test_abort_from_another_thread() -> None:
    controller = sm.AbortController()
    model_started = threading.Event()

    def ui() -> None:
        model_started.wait()
        controller.abort("from the ui thread")

    async def waits(messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]) -> Any:
        model_started.set()
        await asyncio.Event().wait()

    thread = threading.Thread(target=ui)
    thread.start()
    try:
        result = run(model=ScriptedModel(waits), signal=controller.signal)
    finally:
        model_started.set()
        thread.join()
    assert result.state is sm.TurnState.ABORTED
    assert "from the ui thread" in result.explanation


# -- tools: threads, outputs, ordering ------------------------------------------------------------


def test_a_sync_tool_runs_in_a_worker_thread() -> None:
    threads: list[threading.Thread] = []

    @sm.tool
    def where() -> str:
        threads.append(threading.current_thread())
        return "here"

    result = run(model=ScriptedModel(asks(call("c1", "where")), DONE), tools=[where])
    assert results_of(result)[0].text == "here"
    assert threads
    assert threads[0] is not threading.main_thread()


@pytest.mark.parametrize("value", [42, None, {"a": 1}, [sm.ToolCall("x", "y", {})]])
def test_a_tool_returning_an_unsupported_type_gives_an_error_result(value: object) -> None:
    async def execute(arguments: dict[str, Any], signal: sm.AbortSignal) -> Any:
        return value

    odd = sm.Tool(sm.ToolDefinition("odd", "returns junk"), execute)
    result = run(model=ScriptedModel(asks(call("c1", "odd")), DONE), tools=[odd])
    (only,) = results_of(result)
    assert only.is_error
    assert only.text.startswith(f"tool odd returned a {type(value).__name__}; expected a str")
    assert result.state is sm.TurnState.DONE


def test_a_tool_may_return_blocks_or_a_tool_output() -> None:
    image = sm.ImageContent("AAAA", "image/png")

    @sm.tool
    async def blocks() -> list[sm.TextContent | sm.ImageContent]:
        return [sm.TextContent("see"), image]

    @sm.tool
    async def soft_fail() -> sm.ToolOutput:
        return sm.ToolOutput("no match for 'x'", is_error=True)

    model = ScriptedModel(asks(call("c1", "blocks"), call("c2", "soft_fail")), DONE)
    result = run(model=model, tools=[blocks, soft_fail])
    first, second = results_of(result)
    assert first.content == (sm.TextContent("see"), image)
    assert not first.is_error
    assert (second.is_error, second.text) == (True, "no match for 'x'")


def test_results_enter_history_in_call_order_when_tools_finish_in_reverse() -> None:
    finished: list[int] = []
    gates = [asyncio.Event() for _ in range(4)]

    @sm.tool
    async def step(i: int) -> str:
        if i + 1 < len(gates):
            await gates[i + 1].wait()
        finished.append(i)
        gates[i].set()
        return f"step {i}"

    model = ScriptedModel(asks(*(call(f"c{i}", "step", i=i) for i in range(4))), DONE)
    result = run(model=model, tools=[step])
    assert finished == [3, 2, 1, 0]
    assert [r.tool_call_id for r in results_of(result)] == ["c0", "c1", "c2", "c3"]
    assert [r.text for r in results_of(result)] == [f"step {i}" for i in range(4)]


def test_a_tool_mutating_its_arguments_does_not_rewrite_history() -> None:
    async def execute(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
        arguments["items"].append("injected")
        arguments["new"] = True
        return "ok"

    schema = {"type": "object", "properties": {"items": {"type": "array"}}}
    mutator = sm.Tool(sm.ToolDefinition("mutator", "", schema), execute)
    response = asks(call("c1", "mutator", items=["a"]))
    result = run(model=ScriptedModel(response, DONE), tools=[mutator])
    assert result.messages[1] == response
    assert result.messages[1] == asks(call("c1", "mutator", items=["a"]))


def test_duplicate_and_empty_call_ids_are_normalised() -> None:
    def script() -> ScriptedModel:
        return ScriptedModel(
            asks(call("", "echo", text="a"), call("dup", "echo", text="b")),
            asks(call("dup", "echo", text="c"), call("dup", "echo", text="d")),
            DONE,
        )

    history = [sm.UserMessage("go")]
    with capture_logs() as logs:
        result = run(model=script(), tools=[echo], messages=history)
    assert result.state is sm.TurnState.DONE
    assert history_violations(result.messages) == []
    ids = [
        c.id for m in result.messages if isinstance(m, sm.AssistantMessage) for c in m.tool_calls
    ]
    assert len(ids) == len(set(ids)) == 4
    assert all(ids)
    assert ids[1] == "dup"  # a fresh id is kept as it is
    assert [r.tool_call_id for r in results_of(result)] == ids
    assert [r.text for r in results_of(result)] == ["a", "b", "c", "d"]
    normalised = [e for e in logs if e["event"] == "tool_call_id_normalised"]
    assert [(e["original"], e["reason"]) for e in normalised] == [
        ("", "empty"),
        ("dup", "repeated"),
        ("dup", "repeated"),
    ]
    assert [e["assigned"] for e in normalised] == [ids[0], ids[2], ids[3]]
    # deterministic: the same script gives the same ids
    again = run(model=script(), tools=[echo], messages=history)
    assert again.messages == result.messages


def test_an_id_already_in_the_given_history_is_normalised() -> None:
    history = [
        sm.UserMessage("go"),
        asks(call("c1", "echo", text="x")),
        sm.ToolResultMessage("c1", "echo", "x"),
        sm.AssistantMessage("ok"),
        sm.UserMessage("again"),
    ]
    result = run(
        model=ScriptedModel(asks(call("c1", "echo", text="y")), DONE),
        tools=[echo],
        messages=history,
    )
    assert history_violations(result.messages) == []
    new_call = result.messages[len(history)]
    assert isinstance(new_call, sm.AssistantMessage)
    assert new_call.tool_calls[0].id != "c1"


# -- invalid input is refused before any model call ---------------------------------------------

UNANSWERED = [sm.UserMessage("go"), asks(call("c1", "echo", text="x")), sm.UserMessage("hm")]
ORPHAN = [sm.UserMessage("go"), sm.ToolResultMessage("c9", "echo", "x")]
ENDS_WITH_ASSISTANT = [sm.UserMessage("go"), sm.AssistantMessage("hi")]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"messages": UNANSWERED}, "tool call 'c1' (echo) has no result"),
        ({"messages": ORPHAN}, "result for tool call 'c9' has no matching call"),
        ({"messages": ENDS_WITH_ASSISTANT}, "ends with an assistant message"),
        ({"messages": []}, "the history is empty"),
        ({"messages": [{"role": "user", "content": []}]}, "messages[0] is a dict"),
        ({"messages": b"hello"}, "messages must be a sequence"),
        ({"tools": [echo, echo]}, "duplicate tool name 'echo'"),
        ({"tools": [echo.definition]}, "tools[0] is a ToolDefinition, not a Tool"),
        ({"tools": echo}, "tools must be a sequence of Tool"),
        ({"max_turns": 0}, "max_turns must be a positive integer"),
        ({"max_turns": -3}, "max_turns must be a positive integer"),
        ({"max_turns": True}, "max_turns must be a positive integer"),
        ({"max_turns": 2.5}, "max_turns must be a positive integer"),
        ({"grace_period": -1}, "grace_period must be a non-negative number"),
        ({"grace_period": float("nan")}, "grace_period must be a non-negative number"),
        ({"signal": sm.AbortController()}, "signal must be an AbortSignal"),
    ],
)
def test_invalid_input_is_refused_before_any_model_call(
    kwargs: dict[str, Any], needle: str
) -> None:
    model = ScriptedModel(DONE)
    arguments: dict[str, Any] = {"model": model, "tools": [echo], **kwargs}
    with pytest.raises(sm.InvalidInputError) as caught:
        run(**arguments)
    assert needle in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert model.requests == []


def test_a_grace_period_of_zero_is_taken() -> None:
    # Non-negative includes zero: an abort then stops waiting at once.
    result = run(model=ScriptedModel(DONE), tools=[echo], grace_period=0)
    assert result.state is sm.TurnState.DONE
    result = run(model=ScriptedModel(DONE), tools=[echo], grace_period=0.0)
    assert result.state is sm.TurnState.DONE


def test_a_model_without_complete_is_refused() -> None:
    with pytest.raises(sm.InvalidInputError, match="async complete"):
        run(model=object())


def test_a_schema_that_is_not_an_object_is_refused_when_the_tool_is_made() -> None:
    async def execute(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
        return ""

    with pytest.raises(sm.InvalidInputError, match="whose type is 'object'"):
        sm.Tool(sm.ToolDefinition("t", "", {"type": "array"}), execute)


# -- the sync entry point and cancellation of the run itself ---------------------------------------


def test_run_agent_sync_runs_without_a_loop() -> None:
    result = sm.run_agent_sync(model=ScriptedModel(DONE), messages=[sm.UserMessage("go")])
    assert result.state is sm.TurnState.DONE
    assert result.final_text == "done"


def test_run_agent_sync_inside_a_running_loop_is_a_usage_error() -> None:
    async def inside() -> None:
        sm.run_agent_sync(model=ScriptedModel(DONE), messages=[sm.UserMessage("go")])

    with pytest.raises(sm.UsageError, match="cannot be called from a running event loop"):
        asyncio.run(inside())


def test_cancelling_run_agent_leaves_no_pending_task() -> None:
    events: list[str] = []

    @sm.tool
    async def forever() -> str:
        try:
            await asyncio.Event().wait()
            return "never"
        finally:
            events.append("tool cleaned up")

    async def main() -> set[asyncio.Task[Any]]:
        started = asyncio.Event()

        async def ready(messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]) -> Any:
            started.set()
            return asks(call("c1", "forever"), call("c2", "forever"))

        task = asyncio.ensure_future(
            sm.run_agent(
                model=ScriptedModel(ready),
                tools=[forever],
                messages=[sm.UserMessage("go")],
                grace_period=GRACE,
            )
        )
        await started.wait()
        for _ in range(5):
            await asyncio.sleep(0)  # let the tools start
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return asyncio.all_tasks() - {asyncio.current_task()}

    leftovers = asyncio.run(main())
    assert leftovers == set()
    assert events == ["tool cleaned up", "tool cleaned up"]


def test_the_result_carries_its_trace_and_run_id() -> None:
    result = run(
        model=ScriptedModel(asks(call("c1", "echo", text="x")), DONE), tools=[echo], run_id="r-1"
    )
    assert result.run_id == "r-1"
    assert result.trace
    assert result.trace[0].source is sm.TurnState.READY
    assert result.trace[-1].dest is sm.TurnState.DONE
    for before, after in zip(result.trace, result.trace[1:], strict=False):
        assert before.dest is after.source
    assert result.ok


def test_a_signal_outlives_its_run_safely() -> None:
    controller = sm.AbortController()
    first = run(model=ScriptedModel(DONE), signal=controller.signal)
    assert first.state is sm.TurnState.DONE
    controller.abort("after the run")  # the run's listener is gone: nothing to crash
    model = ScriptedModel(DONE)
    second = run(model=model, signal=controller.signal)
    assert second.state is sm.TurnState.ABORTED
    assert model.requests == []


def test_a_model_client_whose_complete_is_not_async_ends_failed_saying_so() -> None:
    class SyncClient:
        def complete(self, messages: object, tools: object, signal: object) -> object:
            return DONE

    result = run(model=SyncClient())
    assert result.state is sm.TurnState.FAILED
    assert result.explanation.startswith(
        "The model call failed: UsageError: the model client SyncClient's complete() "
        "returned an AssistantMessage instead of an awaitable: complete must be an async def"
    )
    assert "can't be used in 'await' expression" not in result.explanation
    assert result.error is not None
    assert isinstance(result.error.__cause__, sm.UsageError)


def test_a_model_client_taking_options_whose_complete_is_not_async_ends_failed_saying_so() -> None:
    class SyncClientWithOptions:
        def complete(
            self, messages: object, tools: object, signal: object, *, options: object
        ) -> object:
            return DONE

    result = run(model=SyncClientWithOptions(), instructions="Be brief.")
    assert result.state is sm.TurnState.FAILED
    assert "the model client SyncClientWithOptions's complete() returned" in result.explanation
    assert "complete must be an async def" in result.explanation


def test_a_model_client_whose_plain_complete_returns_a_coroutine_is_awaited() -> None:
    class Wrapper:
        def __init__(self) -> None:
            self.inner = ScriptedModel(DONE)

        def complete(self, messages: Any, tools: Any, signal: Any) -> Any:
            return self.inner.complete(messages, tools, signal)  # a coroutine

    result = run(model=Wrapper())
    assert result.state is sm.TurnState.DONE
    assert result.final_text == "done"


# -- behaviours pinned one by one: resume, approvals, the handle, the event stream --------------


def _denied_first() -> tuple[sm.RunResult, Callable[[sm.ToolCall], sm.Deny | None]]:
    def hook(c: sm.ToolCall) -> sm.Deny | None:
        return sm.Deny("no writes today") if c.arguments["text"] == "write" else None

    first = run(
        model=ScriptedModel(
            asks(call("c1", "echo", text="write"), call("c2", "echo", text="read"))
        ),
        tools=[echo],
        before_tool_call=hook,
    )
    assert first.state is sm.TurnState.AWAITING_USER
    return first, hook


def test_a_run_goes_on_after_a_policy_denial_once_a_person_answers() -> None:
    first, hook = _denied_first()
    model = ScriptedModel(asks(call("c3", "echo", text="again")), DONE)
    second = asyncio.run(
        sm.resume_agent(
            first,
            model=model,
            tools=[echo],
            message="fine, only read",
            before_tool_call=hook,
            grace_period=GRACE,
        )
    )
    # The denial stopped one boundary only: the next turn's boundary goes on.
    assert second.state is sm.TurnState.DONE
    assert len(model.requests) == 2
    sent = model.requests[0].messages
    assert sent[-1] == sm.UserMessage("fine, only read")
    assert [r.text for r in sent if isinstance(r, sm.ToolResultMessage)] == [
        "Tool call denied: no writes today",
        "read",
    ]
    assert [r.text for r in results_of(second)][-1] == "again"
    assert history_violations(second.messages) == []


def test_resume_run_with_a_message_answers_every_pending_approval() -> None:
    ran: list[str] = []

    @sm.tool
    async def act(name: str) -> str:
        ran.append(name)
        return f"did {name}"

    first = run(
        model=ScriptedModel(asks(call("a", "act", name="rm"), call("b", "act", name="mv"))),
        tools=[act],
        before_tool_call=lambda c: sm.RequireApproval("changes files"),
    )
    assert [c.id for c in first.pending_approvals] == ["a", "b"]
    model = ScriptedModel(DONE)
    resumed = sm.resume_run(first, model=model, tools=[act], message="never mind, stop")
    second = asyncio.run(resumed.run())
    assert second.state is sm.TurnState.DONE
    assert ran == []
    sent = model.requests[0].messages
    assert sent[-1] == sm.UserMessage("never mind, stop")
    answers = [r for r in sent if isinstance(r, sm.ToolResultMessage)]
    assert [r.tool_call_id for r in answers] == ["a", "b"]
    assert all(
        r.is_error and r.text.startswith("Tool call not run: it was not approved") for r in answers
    )


def test_more_than_one_pending_approval_is_listed_and_each_needs_a_decision() -> None:
    ran: list[str] = []

    @sm.tool
    async def act(name: str) -> str:
        ran.append(name)
        return f"did {name}"

    def hook(c: sm.ToolCall) -> sm.RequireApproval | None:
        return None if c.arguments["name"] == "ls" else sm.RequireApproval(c.arguments["name"])

    first = run(
        model=ScriptedModel(
            asks(
                call("a", "act", name="rm"),
                call("b", "act", name="ls"),
                call("c", "act", name="mv"),
            )
        ),
        tools=[act],
        before_tool_call=hook,
    )
    assert [c.id for c in first.pending_approvals] == ["a", "c"]
    assert "approve 2 tool call(s): act (call a): rm; act (call c): mv" in first.explanation
    assert ran == ["ls"]
    with pytest.raises(sm.InvalidInputError, match="missing: c"):
        sm.resume_run(first, model=ScriptedModel(DONE), tools=[act], approvals={"a": True})
    second = asyncio.run(
        sm.resume_agent(
            first,
            model=ScriptedModel(DONE),
            tools=[act],
            approvals={"a": True, "c": sm.Deny("not that one")},
            before_tool_call=hook,
        )
    )
    assert second.state is sm.TurnState.DONE
    assert ran == ["ls", "rm"]
    assert [(r.tool_call_id, r.text) for r in results_of(second)] == [
        ("a", "did rm"),
        ("b", "did ls"),
        ("c", "Tool call denied by a person: not that one"),
    ]


def test_abort_through_the_handle_from_another_thread_wakes_an_idle_loop() -> None:
    started = threading.Event()
    holder: list[sm.AgentRun] = []

    async def idle(messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]) -> Any:
        started.set()
        await asyncio.Event().wait()  # nothing on the loop will ever wake it

    def ui() -> None:
        started.wait(30)
        holder[0].abort("stop from the ui thread")

    agent = sm.AgentRun(
        model=ScriptedModel(idle), messages=[sm.UserMessage("go")], grace_period=GRACE
    )
    holder.append(agent)
    thread = threading.Thread(target=ui)
    thread.start()
    began = time.monotonic()
    try:
        # The guard is long: an abort that did not wake the loop would only be seen
        # when the guard's own timer fires, and the run would fail on the time below.
        result = asyncio.run(asyncio.wait_for(agent.run(), HANG_GUARD))
    finally:
        started.set()
        thread.join()
    assert time.monotonic() - began < HANG_GUARD / 2
    assert result.state is sm.TurnState.ABORTED
    assert "stop from the ui thread" in result.explanation


def test_abort_before_the_start_keeps_the_input_queued_before_it() -> None:
    model = ScriptedModel(DONE)
    agent = sm.AgentRun(model=model, messages=[sm.UserMessage("go")], grace_period=GRACE)
    agent.steer("look at the tests first")
    agent.follow_up("then summarise")
    agent.abort("changed my mind")
    result = asyncio.run(agent.run())
    assert result.state is sm.TurnState.ABORTED
    assert model.requests == []
    assert result.messages == (sm.UserMessage("go"),)
    assert [(q.message, q.kind) for q in result.queued_input] == [
        (sm.UserMessage("look at the tests first"), sm.engine.InputKind.STEER),
        (sm.UserMessage("then summarise"), sm.engine.InputKind.FOLLOW_UP),
    ]


def test_turn_started_and_turn_ended_number_the_turns_from_one() -> None:
    model = ScriptedModel(
        asks(call("c1", "echo", text="a")), asks(call("c2", "echo", text="b")), DONE
    )
    agent = sm.AgentRun(
        model=model, tools=[echo], messages=[sm.UserMessage("go")], grace_period=GRACE
    )
    stream = agent.events()

    async def main() -> list[sm.RunEvent]:
        result = await agent.run()
        assert result.state is sm.TurnState.DONE
        return [event async for event in stream]

    events = asyncio.run(main())
    assert [e.turn for e in events if isinstance(e, sm.TurnStarted)] == [1, 2, 3]
    assert [e.turn for e in events if isinstance(e, sm.TurnEnded)] == [1, 2, 3]


def test_progress_is_reported_by_tools_only_not_by_after_tool_call() -> None:
    # report_progress belongs to the running tool (its call id is the event's); the
    # after_tool_call hook runs once the tool is over and has its call as argument.
    seen: list[tuple[bool, sm.ToolCall | None]] = []

    @sm.tool
    async def step() -> str:
        assert sm.report_progress("from the tool")
        return "done"

    def after(c: sm.ToolCall, output: sm.ToolOutput) -> None:
        seen.append((sm.report_progress("from the hook"), sm.current_tool_call()))

    agent = sm.AgentRun(
        model=ScriptedModel(asks(call("c1", "step")), DONE),
        tools=[step],
        messages=[sm.UserMessage("go")],
        after_tool_call=after,
    )
    stream = agent.events()

    async def main() -> list[sm.RunEvent]:
        await agent.run()
        return [event async for event in stream]

    events = asyncio.run(main())
    assert seen == [(False, None)]
    assert [(e.call_id, e.data) for e in events if isinstance(e, sm.ToolProgress)] == [
        ("c1", "from the tool")
    ]


@pytest.mark.timeout(30)
def test_a_model_call_that_waits_after_one_that_answered_at_once_is_heard() -> None:
    # The first model call answers without waiting (its answer is queued where it was
    # started); the second waits, so it runs as a task whose answer comes later. That
    # answer is the second call's own and must reach the run, not be taken for the first.
    async def later(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> sm.AssistantMessage:
        await asyncio.sleep(0.01)
        return asks(call("c2", "echo", text="b"))

    model = ScriptedModel(asks(call("c1", "echo", text="a")), later, DONE)

    async def main() -> sm.RunResult:
        return await asyncio.wait_for(
            sm.run_agent(model=model, tools=[echo], messages=[sm.UserMessage("go")]), 5
        )

    result = on_virtual_time(main)
    assert result.state is sm.TurnState.DONE
    assert result.stats is not None
    assert result.stats.model_calls == 3
    results = [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert results == ["a", "b"]


@pytest.mark.timeout(30)
def test_events_asked_for_after_the_run_returned_end_at_once() -> None:
    agent = sm.AgentRun(model=ScriptedModel(DONE), tools=[echo], messages=[sm.UserMessage("go")])

    async def main() -> list[sm.RunEvent]:
        result = await agent.run()
        assert result.state is sm.TurnState.DONE
        stream = agent.events()  # subscribed once the run is over: nothing more to say
        return await asyncio.wait_for(_drain(stream), 5)

    async def _drain(stream: Any) -> list[sm.RunEvent]:
        return [event async for event in stream]

    assert asyncio.run(main()) == []


@pytest.mark.timeout(30)
def test_a_model_failing_after_the_abort_is_not_the_cause_of_the_aborted_result() -> None:
    # The model client answers the abort with an exception of its own: the run ends
    # Aborted, and only a Failed run carries the model's exception as its error's cause.
    async def hangs_up(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition], signal: sm.AbortSignal
    ) -> sm.AssistantMessage:
        while not signal.aborted:
            await asyncio.sleep(0.01)
        raise ConnectionError("connection closed by the client")

    async def main() -> sm.RunResult:
        agent = sm.AgentRun(
            model=ScriptedModel(hangs_up, with_signal=True),
            tools=[echo],
            messages=[sm.UserMessage("go")],
            grace_period=1.0,
        )
        asyncio.get_running_loop().call_later(0.05, agent.abort, "stop")
        return await asyncio.wait_for(agent.run(), HANG_GUARD)

    result = on_virtual_time(main)
    assert result.state is sm.TurnState.ABORTED
    assert isinstance(result.error, sm.AbortedError)
    assert result.error.__cause__ is None


@pytest.mark.timeout(30)
def test_an_agent_run_runs_once() -> None:
    run = sm.AgentRun(model=ScriptedModel(DONE), messages=[sm.UserMessage("go")])
    assert asyncio.run(run.run()).state is sm.TurnState.DONE
    with pytest.raises(sm.UsageError, match="an AgentRun runs once"):
        asyncio.run(run.run())
