"""The surface around a run: history helpers, stats across resume, subscribing from the
start, instructions, per-run model settings, typed deps, streamed deltas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine.messages import messages_from_dicts, messages_to_dicts
from statemachine.providers import CallOptions
from statemachine.testing import FunctionModel, ScriptedModel

pytestmark = pytest.mark.timeout(30)


@sm.tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


def call(name: str = "echo", call_id: str = "c1", **arguments: Any) -> sm.ToolCall:
    if name == "echo" and not arguments:
        arguments = {"text": "hi"}
    return sm.ToolCall(call_id, name, arguments)


# -- 1. history and resume helpers -------------------------------------------------------


def test_new_messages_are_what_the_run_added_after_the_history_it_was_given() -> None:
    history: list[sm.Message] = [sm.UserMessage("a"), sm.AssistantMessage("b"), sm.UserMessage("c")]
    result = sm.run_agent_sync(model=ScriptedModel(call(), "done"), messages=history, tools=[echo])
    assert result.messages[:3] == tuple(history)
    assert [m.role for m in result.new_messages()] == ["assistant", "toolResult", "assistant"]
    assert result.new_messages() == result.messages[3:]


def test_a_plain_string_is_one_user_message() -> None:
    model = ScriptedModel("hello")
    result = sm.run_agent_sync(model=model, messages="hi there")
    assert model.requests[0].messages == (sm.UserMessage("hi there"),)
    assert result.final_text == "hello"


def test_a_history_goes_to_json_and_back_and_a_run_continues_from_it() -> None:
    first = sm.run_agent_sync(model=ScriptedModel(call(), "done"), messages="go", tools=[echo])
    text = json.dumps(messages_to_dicts(first.messages))
    again = messages_from_dicts(json.loads(text))
    assert tuple(again) == first.messages
    second = sm.run_agent_sync(
        model=ScriptedModel("more"), messages=[*again, sm.UserMessage("and?")]
    )
    assert second.ok
    assert second.new_messages() == (sm.AssistantMessage("more"),)


def _approval_run() -> sm.RunResult:
    model = ScriptedModel(
        sm.AssistantMessage(
            (call(),), stop_reason="toolUse", usage=sm.messages.Usage(input=10, output=2)
        )
    )
    result = sm.run_agent_sync(
        model=model,
        messages="go",
        tools=[echo],
        before_tool_call=lambda c: sm.RequireApproval("check"),
    )
    assert result.state is sm.TurnState.AWAITING_USER
    return result


def test_stats_after_resume_count_the_whole_run_and_resume_agent_sync_works() -> None:
    suspended = _approval_run()
    assert suspended.stats is not None
    assert suspended.stats.model_calls == 1
    done = sm.resume_agent_sync(
        suspended,
        model=ScriptedModel(sm.AssistantMessage("ok", usage=sm.messages.Usage(input=5, output=1))),
        tools=[echo],
        approvals={"c1": True},
        before_tool_call=lambda c: sm.RequireApproval("check"),
    )
    assert done.ok
    assert done.turns == 2
    assert done.stats is not None
    assert done.stats.model_calls == 2  # one before the suspension, one after
    assert done.stats.usage.input == 15
    assert done.stats.usage.output == 3
    assert done.stats.tool_calls == {"echo": {"ok": 1}}
    assert len(done.stats.turn_seconds) == 2
    assert [m.role for m in done.new_messages()] == ["toolResult", "assistant"]


def test_resuming_from_a_snapshot_alone_takes_the_earlier_stats_as_a_keyword() -> None:
    suspended = _approval_run()
    assert suspended.snapshot is not None
    assert suspended.stats is not None
    kwargs: dict[str, Any] = {
        "model": ScriptedModel("ok"),
        "tools": [echo],
        "approvals": {"c1": True},
        "before_tool_call": lambda c: None,
    }
    alone = sm.resume_agent_sync(dict(suspended.snapshot), **kwargs)
    assert alone.stats is not None
    assert alone.stats.model_calls == 1
    kwargs["model"] = ScriptedModel("ok")
    carried = sm.resume_agent_sync(dict(suspended.snapshot), stats=suspended.stats, **kwargs)
    assert carried.stats is not None
    assert carried.stats.model_calls == 2


def test_resume_agent_sync_refuses_a_running_loop() -> None:
    suspended = _approval_run()

    async def inside() -> None:
        with pytest.raises(sm.UsageError, match="await resume_agent"):
            sm.resume_agent_sync(suspended, model=ScriptedModel("x"), message="no")

    asyncio.run(inside())


# -- 2. subscribing from the start ----------------------------------------------------------


def test_a_subscriber_task_made_before_run_sees_the_run_from_its_start() -> None:
    async def main() -> list[str]:
        run = sm.AgentRun(model=ScriptedModel("hi"), messages="x")
        seen: list[str] = []

        async def watch() -> None:
            async for event in run.events():
                seen.append(type(event).__name__)

        watcher = asyncio.create_task(watch())  # events() is called inside the task
        await run.run()
        await watcher
        return seen

    seen = asyncio.run(main())
    assert seen[:4] == ["RunStarted", "StateChanged", "TurnStarted", "MessageAdded"]
    assert seen[-1] == "RunReturned"


def test_what_was_ready_before_run_acts_before_the_run_starts() -> None:
    async def main() -> tuple[sm.RunResult, int]:
        model = ScriptedModel("never")
        run = sm.AgentRun(model=model, messages="x")
        asyncio.get_running_loop().call_soon(run.abort, "at once")
        return await run.run(), model.calls

    result, calls = asyncio.run(main())
    assert result.state is sm.TurnState.ABORTED
    assert calls == 0


# -- 3. instructions and model settings ---------------------------------------------------


def test_static_instructions_reach_the_model_at_every_call_and_not_the_history() -> None:
    model = ScriptedModel(call(), "done")
    result = sm.run_agent_sync(model=model, messages="go", tools=[echo], instructions="Be brief.")
    assert [r.instructions for r in model.requests] == ["Be brief.", "Be brief."]
    assert not any("Be brief." in str(m) for m in result.messages)


def test_instruction_functions_are_called_at_each_model_call_with_the_context() -> None:
    turns: list[int] = []

    def instructions(ctx: sm.RunContext[str]) -> str:
        turns.append(ctx.turn)
        return f"Help {ctx.deps}; turn {ctx.turn}."

    model = ScriptedModel(call(), "done")
    sm.run_agent_sync(
        model=model, messages="go", tools=[echo], instructions=instructions, deps="Ada"
    )
    assert turns == [1, 2]
    assert [r.instructions for r in model.requests] == ["Help Ada; turn 1.", "Help Ada; turn 2."]


def test_async_instructions_without_a_parameter_work_too() -> None:
    async def instructions() -> str:
        await asyncio.sleep(0)
        return "async"

    model = ScriptedModel("done")
    sm.run_agent_sync(model=model, messages="go", instructions=instructions)
    assert model.requests[0].instructions == "async"


def test_instructions_that_raise_fail_the_run_naming_them_and_the_model_is_not_called() -> None:
    def instructions(ctx: sm.RunContext[Any]) -> str:
        raise KeyError("profile")

    model = ScriptedModel("never")
    result = sm.run_agent_sync(model=model, messages="go", instructions=instructions)
    assert result.state is sm.TurnState.FAILED
    assert "InstructionsError" in result.explanation
    assert "instructions" in result.explanation
    assert "KeyError" in result.explanation
    assert model.calls == 0
    assert isinstance(result.error, sm.ModelFailedError)
    assert isinstance(result.error.__cause__, KeyError) or isinstance(
        result.error.__cause__.__cause__,  # type: ignore[union-attr]
        KeyError,
    )


def test_instructions_returning_no_string_fail_the_run_naming_the_type() -> None:
    result = sm.run_agent_sync(
        model=ScriptedModel("never"), messages="go", instructions=lambda ctx: 42
    )
    assert result.state is sm.TurnState.FAILED
    assert "returned a int" in result.explanation


def test_instructions_of_the_wrong_type_are_refused_before_the_run() -> None:
    with pytest.raises(sm.InvalidInputError, match="instructions must be a str"):
        sm.run_agent_sync(model=ScriptedModel("x"), messages="go", instructions=42)  # type: ignore[arg-type]


class PlainClient:
    """A client written against complete(messages, tools, signal) only."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(
        self, messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition], signal: Any
    ) -> sm.AssistantMessage:
        self.calls += 1
        return sm.AssistantMessage("plain")


def test_a_client_without_options_still_works_and_is_refused_what_it_cannot_send() -> None:
    client = PlainClient()
    assert sm.run_agent_sync(model=client, messages="go").final_text == "plain"
    with pytest.raises(sm.UsageError, match="cannot receive instructions"):
        sm.run_agent_sync(model=client, messages="go", instructions="x")
    with pytest.raises(sm.UsageError, match="temperature"):
        sm.run_agent_sync(
            model=client, messages="go", model_settings=sm.ModelSettings(temperature=0.1)
        )
    assert client.calls == 1


class PickyClient:
    supported_settings = frozenset({"temperature"})

    async def complete(
        self,
        messages: Sequence[sm.Message],
        tools: Sequence[sm.ToolDefinition],
        signal: Any,
        *,
        options: CallOptions | None = None,
    ) -> sm.AssistantMessage:
        raise AssertionError("never called")


def test_a_setting_the_client_cannot_send_is_a_usage_error_naming_it() -> None:
    with pytest.raises(sm.UsageError, match="model_settings: PickyClient cannot send top_p"):
        sm.run_agent_sync(
            model=PickyClient(),
            messages="go",
            model_settings=sm.ModelSettings(temperature=0.2, top_p=0.5),
        )


def test_model_settings_are_checked_and_reach_the_model() -> None:
    with pytest.raises(sm.InvalidInputError, match="temperature must be between 0 and 2"):
        sm.ModelSettings(temperature=3)
    with pytest.raises(sm.InvalidInputError, match="max_tokens must be a number"):
        sm.ModelSettings(max_tokens=True)
    model = ScriptedModel("x")
    settings = sm.ModelSettings(temperature=0.3, stop="END")
    sm.run_agent_sync(model=model, messages="go", model_settings=settings)
    assert model.requests[0].settings == sm.ModelSettings(temperature=0.3, stop=("END",))
    merged = sm.ModelSettings(temperature=0.1, max_tokens=9).merged(sm.ModelSettings(top_p=0.5))
    assert merged == sm.ModelSettings(temperature=0.1, max_tokens=9, top_p=0.5)


def test_a_function_model_reads_the_options_it_declares() -> None:
    def answer(messages: Any, tools: Any, options: CallOptions) -> str:
        return f"told: {options.instructions}"

    result = sm.run_agent_sync(model=FunctionModel(answer), messages="go", instructions="be kind")
    assert result.final_text == "told: be kind"


# -- 4. deps through a typed context ----------------------------------------------------------


@attrs.frozen
class Shop:
    name: str


@sm.tool
def shop_name(ctx: sm.RunContext[Shop], loud: bool = False) -> str:
    """The shop's name."""
    return ctx.deps.name.upper() if loud else ctx.deps.name


@sm.tool
async def which_call(ctx: sm.RunContext[Shop]) -> str:
    """The call being executed."""
    assert ctx.tool_call is not None
    return f"{ctx.tool_call.id} of {ctx.run_id}"


def test_the_context_parameter_is_not_advertised_and_receives_the_deps() -> None:
    assert set(shop_name.definition.schema_dict()["properties"]) == {"loud"}
    assert shop_name.deps_type is Shop
    model = ScriptedModel([call("shop_name", "a", loud=True), call("which_call", "b")], "done")
    result = sm.run_agent_sync(
        model=model,
        messages="go",
        tools=[shop_name, which_call],
        deps=Shop("corner"),
        run_id="r1",
    )
    outputs = [m.text for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert outputs == ["CORNER", "b of r1"]


def test_deps_of_the_wrong_type_are_refused_before_any_model_call() -> None:
    model = ScriptedModel("never")
    with pytest.raises(sm.UsageError, match=r"deps: tool shop_name takes RunContext\[Shop\]"):
        sm.run_agent_sync(model=model, messages="go", tools=[shop_name], deps="corner")
    with pytest.raises(sm.UsageError, match="deps is a NoneType"):
        sm.run_agent_sync(model=model, messages="go", tools=[shop_name])
    assert model.calls == 0


def test_hooks_that_take_a_run_context_receive_it() -> None:
    seen: list[object] = []

    def before(ctx: sm.RunContext[Shop], call: sm.ToolCall) -> None:
        seen.append(ctx.deps)

    sm.run_agent_sync(
        model=ScriptedModel(call(), "done"),
        messages="go",
        tools=[echo],
        deps=Shop("x"),
        before_tool_call=before,
    )
    assert seen == [Shop("x")]


# -- 6. streamed deltas -----------------------------------------------------------------------


def test_text_and_tool_call_deltas_are_run_events_and_stream_text_yields_the_text() -> None:
    async def main() -> tuple[list[sm.RunEvent], list[str]]:
        model = ScriptedModel(call(), "All done now.", stream=True)
        run = sm.AgentRun(model=model, messages="go", tools=[echo])
        events = run.events()
        text = run.stream_text()

        async def collect_text() -> list[str]:
            return [piece async for piece in text]

        texts = asyncio.create_task(collect_text())
        await run.run()
        return [e async for e in events], await texts

    events, texts = asyncio.run(main())
    assert texts == ["All ", "done ", "now."]
    deltas = [e for e in events if isinstance(e, (sm.TextDelta, sm.ToolCallDelta))]
    assert deltas[0] == sm.ToolCallDelta(1, 0, "c1", "echo", '{"text": "hi"}')
    assert [d.turn for d in deltas[1:]] == [2, 2, 2]
    # the complete message still follows as MessageAdded, after its deltas
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("TextDelta") < max(
        i for i, e in enumerate(events) if isinstance(e, sm.MessageAdded)
    )
