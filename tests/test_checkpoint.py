"""The checkpoint of the minimal agent loop (检查点): its script, and one test per
acceptance line (验收标准).

Each test drives the real asyncio driver with a scripted model client that records
every request it receives, so the assertions are about what the model actually saw.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import statemachine as sm
import statemachine.messages
from statemachine.core.invariants import history_violations
from statemachine.testing import ScriptedModel


def call(call_id: str, tool_name: str, /, **arguments: Any) -> sm.ToolCall:
    return sm.ToolCall(call_id, tool_name, arguments)


def asks(
    *calls: sm.ToolCall, stop: sm.messages.StopReason = sm.messages.StopReason.TOOL_USE
) -> sm.AssistantMessage:
    return sm.AssistantMessage(calls, stop_reason=stop)


def run(**kwargs: Any) -> sm.RunResult:
    return asyncio.run(sm.run_agent(**kwargs))


WORKSPACE = ("README.md", "src/index.ts")


@sm.tool
async def list_files() -> str:
    """List the files of the workspace."""
    return "\n".join(WORKSPACE)


def test_the_checkpoint_script() -> None:
    """user: 列出工作区文件 → toolCall list_files {} → toolResult → the answer."""

    def answer_from_result(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> sm.AssistantMessage:
        last = messages[-1]
        assert isinstance(last, sm.ToolResultMessage)
        files = last.text.splitlines()
        return sm.AssistantMessage(f"工作区包含 {' 和 '.join(files)}。")

    model = ScriptedModel(asks(call("c1", "list_files")), answer_from_result)
    result = run(model=model, tools=[list_files], messages=[sm.UserMessage("列出工作区文件")])

    assert result.state is sm.TurnState.DONE
    assert result.error is None
    assert result.turns == 2
    assert list(result.messages) == [
        sm.UserMessage("列出工作区文件"),
        asks(call("c1", "list_files")),
        sm.ToolResultMessage("c1", "list_files", "README.md\nsrc/index.ts"),
        sm.AssistantMessage("工作区包含 README.md 和 src/index.ts。"),
    ]
    assert result.final_text == "工作区包含 README.md 和 src/index.ts。"
    assert [r.tool_names for r in model.requests] == [("list_files",), ("list_files",)]


def test_tool_calls_run_even_when_stop_reason_is_not_tool_use() -> None:
    """assistant 的 tool call 会被执行，即使 stopReason 不是 toolUse。"""
    runs: list[str] = []

    @sm.tool
    async def touch(name: str) -> str:
        runs.append(name)
        return f"touched {name}"

    model = ScriptedModel(
        asks(call("a", "touch", name="stop"), stop=sm.messages.StopReason.STOP),
        asks(call("b", "touch", name="length"), stop=sm.messages.StopReason.LENGTH),
        sm.AssistantMessage("finished"),
    )
    result = run(model=model, tools=[touch], messages=[sm.UserMessage("go")])

    assert runs == ["stop", "length"]
    assert result.state is sm.TurnState.DONE
    results = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert [(r.tool_call_id, r.text, r.is_error) for r in results] == [
        ("a", "touched stop", False),
        ("b", "touched length", False),
    ]


def test_tool_results_reach_the_next_model_request() -> None:
    """tool result 会进入下一次模型请求。"""
    model = ScriptedModel(asks(call("c1", "list_files")), sm.AssistantMessage("ok"))
    result = run(model=model, tools=[list_files], messages=[sm.UserMessage("ls")])

    assert len(model.requests) == 2
    first, second = (r.messages for r in model.requests)
    assert first == (sm.UserMessage("ls"),)
    assert second == (
        sm.UserMessage("ls"),
        asks(call("c1", "list_files")),
        sm.ToolResultMessage("c1", "list_files", "README.md\nsrc/index.ts"),
    )
    assert result.messages[: len(second)] == second


def test_unknown_tool_invalid_arguments_and_exceptions_become_error_results() -> None:
    """未知工具、参数校验失败和工具异常都形成错误 tool result，进程不崩溃。"""

    @sm.tool
    def read_file(path: str) -> str:
        raise FileNotFoundError(f"File not found: {path}. Did you mean src/math.ts?")

    model = ScriptedModel(
        asks(
            call("u", "delete_everything"),
            call("v", "read_file", path=42),
            call("x", "read_file", path="src/maths.ts"),
        ),
        sm.AssistantMessage("I will use src/math.ts instead."),
    )
    result = run(model=model, tools=[list_files, read_file], messages=[sm.UserMessage("go")])

    assert result.state is sm.TurnState.DONE  # the run went on: the model read the errors
    results = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert [r.tool_call_id for r in results] == ["u", "v", "x"]
    assert all(r.is_error for r in results)
    unknown, invalid, raised = (r.text for r in results)
    assert unknown.startswith("Unknown tool: delete_everything.")
    assert "list_files" in unknown
    assert "read_file" in unknown
    assert "arguments.path: 42 is not of type 'string'" in invalid
    assert raised == ("FileNotFoundError: File not found: src/maths.ts. Did you mean src/math.ts?")
    # the second request carried all three errors back to the model
    assert model.requests[1].messages[-3:] == tuple(results)


def test_after_abort_every_started_call_has_a_result_and_the_state_is_explainable() -> None:
    """abort 后，每个已开始的 tool call 都有结果消息，会话状态可解释。"""
    controller = sm.AbortController()
    started: list[str] = []
    cleaned: list[str] = []

    @sm.tool
    async def long_job(name: str, signal: sm.AbortSignal) -> str:
        stopped = asyncio.Event()
        signal.add_listener(lambda _: stopped.set())
        started.append(name)
        if len(started) == 2:
            controller.abort("user pressed stop")
        try:
            await stopped.wait()  # the work, until the signal says stop
            raise RuntimeError("interrupted")
        finally:
            await asyncio.sleep(0)  # asynchronous cleanup, e.g. killing a subprocess
            cleaned.append(name)

    model = ScriptedModel(asks(call("a", "long_job", name="a"), call("b", "long_job", name="b")))
    result = run(
        model=model,
        tools=[long_job],
        messages=[sm.UserMessage("go")],
        signal=controller.signal,
        grace_period=5.0,
    )

    assert result.state is sm.TurnState.ABORTED
    assert sorted(cleaned) == ["a", "b"]
    assert history_violations(result.messages) == []
    results = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert [r.tool_call_id for r in results] == ["a", "b"]
    assert all(r.is_error and r.text.startswith("Operation aborted") for r in results)
    assert isinstance(result.error, sm.AbortedError)
    assert "user pressed stop" in result.explanation
    assert "turn 1" in result.explanation
    assert len(model.requests) == 1


def test_exceeding_the_turn_limit_gives_a_clear_error() -> None:
    """超过 turn 上限时有明确错误。"""
    model = ScriptedModel(
        asks(call("c1", "list_files")),
        asks(call("c2", "list_files")),
        asks(call("c3", "list_files")),
    )
    result = run(model=model, tools=[list_files], messages=[sm.UserMessage("go")], max_turns=2)

    assert result.state is sm.TurnState.TURN_LIMIT_EXCEEDED
    assert result.turns == 2
    assert len(model.requests) == 2  # I7: no third call
    assert isinstance(result.error, sm.TurnLimitExceededError)
    text = str(result.error)
    assert "max_turns=2" in text  # the limit
    assert "Last operation: tool list_files (call c2) returned: README.md src/index.ts" in text
    assert "To continue" in text  # how to go on
    assert history_violations(result.messages) == []  # the last results are kept


def test_all_messages_are_kept_in_the_order_they_happened() -> None:
    """所有消息按发生顺序保留。"""
    gates = {name: asyncio.Event() for name in ("first", "second", "third")}
    finished: list[str] = []

    @sm.tool
    async def step(name: str, after: str | None = None) -> str:
        # finish in reverse call order: each call waits for the one after it
        if after is not None:
            await gates[after].wait()
        finished.append(name)
        gates[name].set()
        return f"{name} done"

    history = [sm.UserMessage("first task"), sm.AssistantMessage("noted"), sm.UserMessage("go")]
    batch = asks(
        call("c1", "step", name="first", after="second"),
        call("c2", "step", name="second", after="third"),
        call("c3", "step", name="third"),
    )
    model = ScriptedModel(batch, asks(call("c4", "list_files")), sm.AssistantMessage("all done"))
    result = run(model=model, tools=[step, list_files], messages=history)

    assert finished == ["third", "second", "first"]
    assert list(result.messages) == [
        *history,
        batch,
        sm.ToolResultMessage("c1", "step", "first done"),
        sm.ToolResultMessage("c2", "step", "second done"),
        sm.ToolResultMessage("c3", "step", "third done"),
        asks(call("c4", "list_files")),
        sm.ToolResultMessage("c4", "list_files", "README.md\nsrc/index.ts"),
        sm.AssistantMessage("all done"),
    ]
    # every request was a prefix of the final history: nothing rewritten or reordered
    for request in (r.messages for r in model.requests):
        assert result.messages[: len(request)] == request
