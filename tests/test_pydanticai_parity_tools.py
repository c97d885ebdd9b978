"""PydanticAI's own agent-loop tests of tools, deps, instructions, history, usage
limits and streaming, ported to this library's API.

Each test keeps the meaning of a test of PydanticAI's suite (``tests/test_agent.py``,
``tests/test_tools.py``, ``tests/test_usage_limits.py``, ``tests/test_streaming.py``,
``tests/models/test_model_test.py``, ``tests/models/test_model_function.py``): the
same model answers, the same messages sent back, the same outcome; a comment names the
source test. Where PydanticAI raises (``UnexpectedModelBehavior``,
``UsageLimitExceeded``), a run here returns in a named terminal state
(``ToolRetriesExceeded``, ``UsageLimitExceeded``) and ``raise_for_state`` raises. A
tool's ordinary exception is its error result (PydanticAI's ``ToolFailed``), and a
retry prompt is an error result too, counted when the tool raised ``ModelRetry``.

Not expressible here, by design:

- A history that ends with unanswered tool calls, or with the model's answer and no
  new prompt (``test_run_with_history_ending_on_model_response_*_no_user_prompt``,
  ``test_message_history_ending_on_model_response_with_instructions``): a run's
  history must pair every call with its result and end with something to answer; a
  run that stopped with calls waiting is resumed (``Agent.resume``) instead.
- An unknown tool counted against a retry budget (``test_unknown_tool``,
  ``test_unknown_tool_multiple_retries``): its error result is not a retry request,
  so ``max_turns`` (or a usage limit) bounds a model that keeps calling it.
- ``TestModel`` calling again a tool that asked for a retry (``test_tool_retry`` of
  ``test_model_test.py``, ``test_retry_tool_until_last_attempt`` with ``TestModel``):
  it calls each tool once, then gives the output; the ports script the model instead.
- The tool-call limit refusing a whole batch (``test_parallel_tool_calls_limit_enforced``
  runs none of a batch that would pass the limit) and not counting a call that asked for
  a retry (``test_failed_tool_calls_not_counted``): here each call started counts, and
  the calls of a batch run up to the limit, the rest answered "not run".
- A token limit passed by the run's last answer (``test_request_token_limit`` and the
  like raise on it): limits are checked before each model call, so a run that has its
  answer ends ``Done``; the ports make the answer that passes the limit ask for a tool.
- ``UsageLimits(tool_calls=0)``, ``usage=`` given to a run (``test_usage_so_far``),
  instructions given as a sequence, ``override(instructions=)``, system prompts
  (``test_instructions_with_message_history``'s ``SystemPromptPart``) and ``ctx.prompt``:
  limits are positive, usage starts at the run, instructions are one string or function.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
import pytest

import statemachine as sm
from statemachine.messages import Message, Usage
from statemachine.testing import FunctionModel, ScriptedModel, TestModel


def _results(result: sm.RunResult[Any]) -> list[tuple[str, str, bool]]:
    return [
        (m.tool_name, m.text, m.is_error)
        for m in result.messages
        if isinstance(m, sm.ToolResultMessage)
    ]


def _call(name: str, **arguments: Any) -> Any:
    """A model function that calls ``name`` at every turn (a fresh id each time)."""

    def model(messages: Any, tools: Any) -> sm.ToolCall:
        return sm.ToolCall(f"c{len(messages)}", name, arguments)

    return model


# -- retry requests and their budgets ----------------------------------------------------------


def test_a_tool_retry_budget_survives_calls_of_another_tool_between_its_failures() -> None:
    # test_tool_retry_budget_survives_interleaved_tool_calls
    seen: list[int] = []

    def model(messages: Any, tools: Any) -> sm.ToolCall:
        step = sum(isinstance(m, sm.AssistantMessage) for m in messages)
        return sm.ToolCall(f"c{step}", "flaky_tool" if step % 2 == 0 else "other_tool", {})

    agent = sm.Agent(FunctionModel(model), max_turns=20)

    @agent.tool(retries=2)
    def flaky_tool(ctx: sm.RunContext[object]) -> str:
        seen.append(ctx.retry)
        raise sm.ModelRetry("always fails")

    @agent.tool_plain
    def other_tool() -> str:
        return "ok"

    result = agent.run_sync("go")
    assert result.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    assert "flaky_tool" in result.explanation
    assert seen == [0, 1, 2]
    with pytest.raises(sm.errors.ToolRetriesExceededError):
        result.raise_for_state()


def test_a_tool_retry_count_starts_again_after_a_success() -> None:
    # test_tool_retry_count_resets_after_successful_call
    seen: list[int] = []

    def model(messages: Any, tools: Any) -> Any:
        step = sum(isinstance(m, sm.AssistantMessage) for m in messages)
        return sm.ToolCall(f"c{step}", "sometimes_tool", {}) if step < 4 else "done"

    agent = sm.Agent(FunctionModel(model))

    @agent.tool(retries=2)
    def sometimes_tool(ctx: sm.RunContext[object]) -> str:
        seen.append(ctx.retry)
        if len(seen) % 2 == 1:
            raise sm.ModelRetry("fails on odd calls")
        return "ok"

    result = agent.run_sync("go")
    assert result.final_text == "done"
    assert seen == [0, 1, 0, 1]


def test_a_tool_reads_its_attempt_budget_and_last_attempt() -> None:
    # test_tool_retries
    seen: list[tuple[int, int, bool]] = []
    agent = sm.Agent(FunctionModel(_call("infinite_retry_tool")), max_turns=20)

    @agent.tool(retries=5)
    def infinite_retry_tool(ctx: sm.RunContext[None]) -> int:
        seen.append((ctx.retry, ctx.max_retries, ctx.last_attempt))
        raise sm.ModelRetry("Please try again.")

    result = agent.run_sync("Begin infinite retry loop!")
    assert result.state is sm.TurnState.TOOL_RETRIES_EXCEEDED
    assert "retries=5" in result.explanation
    assert [r for r, _, _ in seen] == [0, 1, 2, 3, 4, 5]
    assert {m for _, m, _ in seen} == {5}
    assert [last for _, _, last in seen] == [False] * 5 + [True]


def test_a_tool_answers_plainly_on_its_last_attempt() -> None:
    # test_retry_tool_until_last_attempt (the model scripted; see the module docstring)
    def model(messages: Any, tools: Any) -> Any:
        last = messages[-1]
        if isinstance(last, sm.ToolResultMessage) and not last.is_error:
            return f'{{"always_fail": "{last.text}"}}'
        return sm.ToolCall(f"c{len(messages)}", "always_fail", {})

    agent = sm.Agent(FunctionModel(model))

    @agent.tool(retries=2)
    def always_fail(ctx: sm.RunContext[None]) -> str:
        if ctx.last_attempt:
            return "I guess you never learn"
        raise sm.ModelRetry("Please try again.")

    result = agent.run_sync("Always fail!")
    assert result.final_text == '{"always_fail": "I guess you never learn"}'
    assert _results(result) == [
        ("always_fail", "Please try again.", True),
        ("always_fail", "Please try again.", True),
        ("always_fail", "I guess you never learn", False),
    ]


@sm.tool
def failing_tool() -> str:
    """Fails."""
    raise RuntimeError("Disk full")


@sm.tool
def ok_tool() -> str:
    """Succeeds."""
    return "ok"


def test_a_failing_tool_is_an_error_result_and_the_run_goes_on() -> None:
    # test_tool_failed
    model = ScriptedModel(sm.ToolCall("call1", "failing_tool", {}), "Acknowledged.")
    result = sm.Agent(model, tools=[failing_tool]).run_sync("Hello")
    assert result.final_text == "Acknowledged."
    ((name, text, is_error),) = _results(result)
    assert name == "failing_tool"
    assert is_error
    assert "Disk full" in text


def test_one_failing_call_of_a_batch_leaves_the_others_results() -> None:
    # test_tool_failed_parallel
    model = ScriptedModel(
        [sm.ToolCall("call_ok", "ok_tool", {}), sm.ToolCall("call_fail", "failing_tool", {})],
        "Done.",
    )
    result = sm.Agent(model, tools=[ok_tool, failing_tool]).run_sync("Hello")
    assert result.final_text == "Done."
    by_id = {m.tool_call_id: m for m in result.messages if isinstance(m, sm.ToolResultMessage)}
    assert (by_id["call_ok"].text, by_id["call_ok"].is_error) == ("ok", False)
    assert by_id["call_fail"].is_error
    assert "Disk full" in by_id["call_fail"].text


def test_a_failing_tool_spends_no_retry_budget() -> None:
    # test_tool_failed_does_not_consume_retry_budget
    model = ScriptedModel(
        *[sm.ToolCall(f"call{i}", "failing_tool", {}) for i in range(5)], "Giving up."
    )
    result = sm.Agent(model, tools=[failing_tool]).run_sync("Hello")
    assert result.final_text == "Giving up."
    assert [is_error for _, _, is_error in _results(result)] == [True] * 5


def test_an_unknown_tool_is_an_error_result_the_model_can_recover_from() -> None:
    # test_unknown_tool_fix
    model = ScriptedModel(sm.ToolCall("c1", "foobar", {}), "success")
    result = sm.Agent(model).run_sync("Hello")
    assert result.final_text == "success"
    ((name, text, is_error),) = _results(result)
    assert (name, is_error) == ("foobar", True)
    assert text == "Unknown tool: foobar. No tools are available in this run."


@pytest.mark.timeout(30)
def test_concurrent_runs_keep_their_own_retry_counts() -> None:
    # test_multiple_concurrent_tool_retries
    seen: dict[int, list[int]] = {}

    class Output(pydantic.BaseModel):
        x: int
        y: str

    def model(messages: Any, tools: Any) -> Any:
        last = messages[-1]
        if isinstance(last, sm.ToolResultMessage) and not last.is_error:
            return sm.ToolCall("out", "final_result", {"x": 0, "y": "a"})
        return sm.ToolCall(f"c{len(messages)}", "tool_that_must_be_retried", {})

    agent = sm.Agent(FunctionModel(model), deps_type=int, output_type=Output)

    @agent.tool(retries=2)
    async def tool_that_must_be_retried(ctx: sm.RunContext[int]) -> None:
        seen.setdefault(ctx.deps, []).append(ctx.retry)
        await asyncio.sleep(0)  # let the other runs interleave
        if len(seen[ctx.deps]) == 1:
            raise sm.ModelRetry("Fail")

    async def all_runs() -> list[sm.RunResult[Output]]:
        return await asyncio.gather(*[agent.run("Hello", deps=i) for i in range(5)])

    results = asyncio.run(all_runs())
    assert [r.output for r in results] == [Output(x=0, y="a")] * 5
    assert seen == {i: [0, 1] for i in range(5)}


# -- deps, instructions, settings, override ---------------------------------------------------


def test_a_tool_reads_none_deps_when_a_run_gives_none() -> None:
    # test_deps_none (test_model_function.py)
    seen: list[object] = []
    agent = sm.Agent(ScriptedModel(sm.ToolCall("c1", "get_none", {}), "ok"))

    @agent.tool
    async def get_none(ctx: sm.RunContext[Any]) -> str:
        seen.append(ctx.deps)
        return ""

    agent.run_sync("Hello")
    assert seen == [None]


def test_a_tool_reads_the_run_deps_of_the_agent_deps_type() -> None:
    # test_deps_init (test_model_function.py)
    seen: list[object] = []

    def get_check_foobar(ctx: sm.RunContext[tuple[str, str]]) -> str:
        seen.append(ctx.deps)
        return ""

    agent = sm.Agent(
        ScriptedModel(sm.ToolCall("c1", "get_check_foobar", {}), "ok"), deps_type=tuple[str, str]
    )
    agent.tool(get_check_foobar)
    agent.run_sync("Hello", deps=("foo", "bar"))
    assert seen == [("foo", "bar")]


def test_an_instructions_function_is_asked_for_the_instructions() -> None:
    # test_instructions_decorator_without_parenthesis
    def instructions() -> str:
        return "You are a helpful assistant."

    model = TestModel()
    sm.Agent(model, instructions=instructions).run_sync("Hello")
    assert model.requests[0].instructions == "You are a helpful assistant."


def test_instructions_for_one_run_follow_the_agent_own_for_that_run_only() -> None:
    # test_instructions_during_run
    model = TestModel()
    agent = sm.Agent(model, instructions="You are a helpful assistant.")
    agent.run_sync("Hello", instructions="Your task is to greet people.")
    assert model.requests[-1].instructions == (
        "You are a helpful assistant.\n\nYour task is to greet people."
    )
    agent.run_sync("Hello again!")
    assert model.requests[-1].instructions == "You are a helpful assistant."


def test_instructions_are_sent_beside_a_given_history() -> None:
    # test_instructions_with_message_history (a user message in place of the system prompt)
    model = TestModel()
    agent = sm.Agent(model, instructions="You are a helpful assistant.")
    result = agent.run_sync(
        "Hello", message_history=[sm.UserMessage("Earlier"), sm.AssistantMessage("Hi")]
    )
    assert model.requests[0].instructions == "You are a helpful assistant."
    assert result.new_messages() == result.messages[-2:]
    assert result.final_text == "success (no tool calls)"


def test_run_settings_override_the_agent_settings_field_by_field() -> None:
    # test_model_settings_override
    model = TestModel()
    sm.Agent(model).run_sync("Hello")
    sm.Agent(model).run_sync("Hello", model_settings=sm.ModelSettings(temperature=0.5))
    agent = sm.Agent(model, model_settings=sm.ModelSettings(temperature=0.1))
    agent.run_sync("Hello")
    agent.run_sync("Hello", model_settings=sm.ModelSettings(temperature=0.5))
    assert [r.settings.set_fields() for r in model.requests] == [
        {},
        {"temperature": 0.5},
        {"temperature": 0.1},
        {"temperature": 0.5},
    ]


def test_override_swaps_the_model_for_the_block() -> None:
    # test_override_model
    agent = sm.Agent(ScriptedModel(), output_type=None)
    with agent.override(model=TestModel()):
        assert agent.run_sync("Hello").final_text == "success (no tool calls)"
    assert agent.run_sync("Hello").state is sm.TurnState.FAILED  # the script is empty


def test_test_model_calls_only_the_tools_named() -> None:
    # test_call_one (test_model_test.py)
    called: list[str] = []
    agent = sm.Agent(TestModel(call_tools=["ret_a"]))

    @agent.tool_plain
    async def ret_a(x: str) -> str:
        called.append("a")
        return f"{x}-a"

    @agent.tool_plain
    async def ret_b(x: str) -> str:
        called.append("b")
        return f"{x}-b"

    assert agent.run_sync("x").final_text == '{"ret_a": "a-a"}'
    assert called == ["a"]


# -- message history ----------------------------------------------------------------------------


@sm.tool
async def ret_a(x: str) -> str:
    """Appends apple."""
    return f"{x}-apple"


def test_a_run_continues_the_history_of_the_last() -> None:
    # test_run_with_history_new
    model = TestModel()
    agent = sm.Agent(model, tools=[ret_a], instructions="Foobar")
    first = agent.run_sync("Hello")
    assert [m.role for m in first.new_messages()] == [
        "user",
        "assistant",
        "toolResult",
        "assistant",
    ]
    assert first.final_text == '{"ret_a": "a-apple"}'
    second = agent.run_sync("Hello again", message_history=first.messages)
    assert second.new_messages() == second.messages[4:]
    assert second.messages[:4] == first.messages
    assert [m.role for m in second.new_messages()] == [
        "user",
        "assistant",
        "toolResult",
        "assistant",
    ]
    assert model.requests[-1].instructions == "Foobar"


def test_a_conversation_that_ended_in_a_final_result_goes_on() -> None:
    # test_continue_conversation_that_ended_in_output_tool_call
    class Result(pydantic.BaseModel):
        dice_roll: int

    def model(messages: Any, tools: Any) -> sm.ToolCall:
        last = messages[-1]
        if isinstance(last, sm.ToolResultMessage) and last.tool_name == "roll_dice":
            return sm.ToolCall(f"f{len(messages)}", "final_result", {"dice_roll": 4})
        return sm.ToolCall(f"r{len(messages)}", "roll_dice", {})

    agent = sm.Agent(FunctionModel(model), output_type=Result)

    @agent.tool_plain
    def roll_dice() -> int:
        return 4

    first = agent.run_sync("Roll me a dice.")
    assert first.output == Result(dice_roll=4)
    again = agent.run_sync("Roll me a dice again.", message_history=first.messages)
    assert again.output == Result(dice_roll=4)
    assert [m.role for m in again.new_messages()] == [
        "user", "assistant", "toolResult", "assistant", "toolResult",
    ]  # fmt: skip


def test_a_history_with_an_unanswered_call_is_refused_before_any_model_call() -> None:
    # test_run_with_history_ending_on_model_response_with_tool_calls_and_user_prompt
    model = ScriptedModel()
    unanswered = sm.AssistantMessage([sm.ToolCall("call_123", "t", {})], "toolUse")
    history: list[Message] = [sm.UserMessage("Hello"), unanswered]
    with pytest.raises(sm.InvalidInputError, match="call_123"):
        sm.Agent(model).run_sync("New question", message_history=history)
    assert model.calls == 0


# -- usage limits ---------------------------------------------------------------------------------


def test_the_request_limit_stops_the_run_before_the_next_model_call() -> None:
    # test_retry_limit
    model = TestModel()
    agent = sm.Agent(model, tools=[ret_a], usage_limits=sm.UsageLimits(requests=1))
    result = agent.run_sync("Hello")
    assert result.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    assert "requests=1" in result.explanation
    assert model.calls == 1
    with pytest.raises(sm.errors.UsageLimitExceededError):
        result.raise_for_state()


@pytest.mark.parametrize(
    ("limits", "usage", "named"),
    [
        (
            sm.UsageLimits(input_tokens=5),
            Usage(input=59, output=4, total_tokens=63),
            "input_tokens=5",
        ),
        (
            sm.UsageLimits(output_tokens=5),
            Usage(input=51, output=11, total_tokens=62),
            "output_tokens=5",
        ),
        (
            sm.UsageLimits(total_tokens=50),
            Usage(input=51, output=4, total_tokens=55),
            "total_tokens=50",
        ),
    ],
)
def test_a_token_limit_passed_by_an_answer_stops_the_run(
    limits: sm.UsageLimits, usage: Usage, named: str
) -> None:
    # test_request_token_limit, test_response_token_limit, test_total_token_limit
    spends = sm.AssistantMessage([sm.ToolCall("c1", "ret_a", {"x": "a"})], "toolUse", usage=usage)
    model = ScriptedModel(spends, "never sent")
    result = sm.Agent(model, tools=[ret_a], usage_limits=limits).run_sync("Hello")
    assert result.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    assert named in result.explanation
    assert model.calls == 1
    assert result.usage == usage


def test_a_run_may_make_as_many_tool_calls_as_its_limit() -> None:
    # test_tool_call_limit
    model = TestModel()
    result = sm.Agent(model, tools=[ret_a], usage_limits=sm.UsageLimits(tool_calls=1)).run_sync(
        "Hello"
    )
    assert result.state is sm.TurnState.DONE
    assert result.final_text == '{"ret_a": "a-apple"}'
    assert _results(result) == [("ret_a", "a-apple", False)]
    assert model.calls == 2


def test_the_final_result_call_is_not_a_tool_call_of_the_limit() -> None:
    # test_output_tool_not_counted, test_output_tool_allowed_at_limit
    class Out(pydantic.BaseModel):
        value: str

    model = ScriptedModel(
        sm.ToolCall("c1", "ret_a", {"x": "a"}), sm.ToolCall("c2", "final_result", {"value": "v"})
    )
    agent = sm.Agent(
        model, tools=[ret_a], output_type=Out, usage_limits=sm.UsageLimits(tool_calls=1)
    )
    result = agent.run_sync("Hello")
    assert result.output == Out(value="v")


def test_the_tool_call_limit_holds_across_parallel_batches() -> None:
    # test_parallel_tool_calls_limit_enforced (the batch runs up to the limit; docstring)
    ran: list[str] = []

    @sm.tool
    async def tool_a() -> str:
        """A."""
        ran.append("a")
        return "result a"

    batch = [sm.ToolCall(f"call_{i}", "tool_a", {}) for i in range(1, 6)]
    more = [sm.ToolCall(f"call_{i}", "tool_a", {}) for i in range(6, 9)]
    model = ScriptedModel(batch, more, "never sent")
    agent = sm.Agent(model, tools=[tool_a], usage_limits=sm.UsageLimits(tool_calls=6))
    result = agent.run_sync("Use tools")
    assert result.state is sm.TurnState.USAGE_LIMIT_EXCEEDED
    assert "tool_calls=6" in result.explanation
    assert len(ran) == 6
    assert [e for _, _, e in _results(result)] == [False] * 6 + [True] * 2
    assert model.calls == 2


def test_a_tool_adds_the_usage_it_spent_to_the_run() -> None:
    # test_multi_agent_usage_sync
    spent = Usage(input=2, output=3, total_tokens=5)
    agent = sm.Agent(TestModel())

    @agent.tool
    def delegate_to_other_agent(ctx: sm.RunContext[None], sentence: str) -> int:
        ctx.add_usage(spent, requests=5)
        return 0

    result = agent.run_sync("foobar")
    assert result.final_text == '{"delegate_to_other_agent": "0"}'
    assert result.usage == spent
    assert (result.turns, result.stats.model_calls if result.stats else None) == (2, 2)


# -- streaming -------------------------------------------------------------------------------------


def test_run_stream_gives_the_text_as_it_arrives() -> None:
    # test_stream_text (test_model_function.py)
    agent = sm.Agent(ScriptedModel("hello world", stream=True))

    async def stream() -> tuple[list[str], sm.RunResult[Any]]:
        async with agent.run_stream("") as run:
            pieces = [piece async for piece in run.stream_text()]
        return pieces, await run.result()

    pieces, result = asyncio.run(stream())
    assert pieces == ["hello ", "world"]
    assert result.final_text == "hello world"
    assert [m.role for m in result.messages] == ["user", "assistant"]


def test_a_streamed_run_calls_tools_before_its_text() -> None:
    # test_streamed_text_response
    agent = sm.Agent(TestModel(stream=True), tools=[ret_a])

    async def stream() -> tuple[str, sm.RunResult[Any]]:
        async with agent.run_stream("Hello") as run:
            text = "".join([piece async for piece in run.stream_text()])
        return text, await run.result()

    text, result = asyncio.run(stream())
    assert text == '{"ret_a": "a-apple"}'
    assert [m.role for m in result.messages] == ["user", "assistant", "toolResult", "assistant"]


def test_run_stream_sync_streams_without_an_event_loop() -> None:
    # test_streamed_text_sync_response
    agent = sm.Agent(TestModel(stream=True), tools=[ret_a])
    with agent.run_stream_sync("Hello") as run:
        text = "".join(run.stream_text())
        result = run.result()
    assert text == '{"ret_a": "a-apple"}'
    assert result.state is sm.TurnState.DONE
    assert len(result.messages) == 4


def test_run_stream_sync_is_refused_inside_a_running_event_loop() -> None:
    # test_run_stream_sync_rejects_running_event_loop
    agent = sm.Agent(TestModel())

    async def inside() -> None:
        with pytest.raises(sm.UsageError, match="run_stream"):
            agent.run_stream_sync("Hello")

    asyncio.run(inside())
