"""What a new user of ``Agent`` meets first: the prompt's type, instructions that take
deps, the text of a user message, the text stream of a slow reader."""

from __future__ import annotations

import asyncio
import inspect
import re
import threading

import attrs
import pytest

import statemachine as sm
from statemachine.agent.events import RunResult
from statemachine.testing import ScriptedModel

pytestmark = pytest.mark.timeout(30)


@attrs.frozen
class Shop:
    name: str


def test_a_user_message_has_its_text_as_the_other_messages_do() -> None:
    assert sm.UserMessage("hello").text == "hello"
    two = sm.UserMessage([sm.TextContent("one"), sm.TextContent("two")])
    assert two.text == "one\ntwo"


def test_the_output_of_a_result_is_documented_as_the_output() -> None:
    # the attribute docstrings are read from the source by the API reference
    source = inspect.getsource(RunResult)
    found = re.search(r'\n    output: [^\n]*\n    """([^"]*)"""', source)
    assert found is not None
    assert found.group(1).startswith("The run's output")
    assert "usage" not in found.group(1)


@pytest.mark.parametrize("prompt", [123, 4.5, b"bytes", ["a list"]])
def test_a_prompt_that_is_not_text_is_refused_naming_the_prompt(prompt: object) -> None:
    agent = sm.Agent(ScriptedModel("never"))
    with pytest.raises(sm.InvalidInputError, match=r"prompt must be a str or a UserMessage"):
        agent.run_sync(prompt)  # type: ignore[arg-type]


def test_instructions_that_take_deps_refuse_a_run_without_them_before_any_call() -> None:
    model = ScriptedModel("never")

    def instructions(ctx: sm.RunContext[Shop]) -> str:
        return f"You work at {ctx.deps.name}."

    agent = sm.Agent(model, instructions=instructions)
    with pytest.raises(sm.UsageError, match=r"the instructions function takes RunContext\[Shop\]"):
        agent.run_sync("hi")
    with pytest.raises(sm.UsageError, match=r"instructions"):
        sm.run_agent_sync(model=model, messages="hi", instructions=instructions, deps=3)
    assert model.calls == 0
    assert agent.run_sync("hi", deps=Shop("Bits")).final_text == "never"
    assert model.requests[0].instructions == "You work at Bits."


@pytest.mark.timeout(60)
def test_the_text_stream_of_a_slow_reader_is_the_whole_answer() -> None:
    words = " ".join(f"w{i}" for i in range(12_000))
    agent = sm.Agent(ScriptedModel(words, stream=True))

    async def main() -> tuple[str, str]:
        async with agent.run_stream("talk") as run:
            await asyncio.sleep(0)
            # the run goes far ahead of this reader before it reads anything
            result_task = asyncio.ensure_future(run.result())
            while not result_task.done():
                await asyncio.sleep(0.01)
            parts = [part async for part in run.stream_text()]
            result = await result_task
        return "".join(parts), result.final_text

    streamed, final = asyncio.run(main())
    assert streamed == final == words


@pytest.mark.timeout(60)
def test_run_stream_sync_gives_the_text_as_it_comes_and_the_result() -> None:
    words = " ".join(f"w{i}" for i in range(500))
    agent = sm.Agent(ScriptedModel(words, stream=True))
    with agent.run_stream_sync("talk") as run:
        parts = list(run.stream_text())
        result = run.result()
    assert "".join(parts) == words == result.final_text
    assert result.output == words
    assert list(run.stream_text()) == []  # read once


@pytest.mark.timeout(60)
def test_run_stream_sync_left_early_aborts_the_run() -> None:
    async def waits(messages: object, tools: object, signal: sm.AbortSignal) -> sm.AssistantMessage:
        while not signal.aborted:
            await asyncio.sleep(0.01)
        return sm.AssistantMessage("", stop_reason="aborted")

    from statemachine.testing import FunctionModel

    agent = sm.Agent(FunctionModel(waits, with_signal=True), grace_period=1)
    with agent.run_stream_sync("wait") as run:
        pass
    assert run.result().state is sm.TurnState.ABORTED


@pytest.mark.timeout(60)
def test_run_stream_sync_takes_the_run_keywords_and_a_signal_aborts_it() -> None:
    started = threading.Event()

    async def waits(messages: object, tools: object, signal: sm.AbortSignal) -> sm.AssistantMessage:
        started.set()
        while not signal.aborted:
            await asyncio.sleep(0.01)
        return sm.AssistantMessage("", stop_reason="aborted")

    from statemachine.testing import FunctionModel

    controller = sm.AbortController()
    agent = sm.Agent(FunctionModel(waits, with_signal=True), grace_period=1)
    run = agent.run_stream_sync("wait", signal=controller.signal, instructions="Wait.")
    assert started.wait(30)
    controller.abort("the caller gave up")
    result = run.result()
    assert result.state is sm.TurnState.ABORTED
    assert "the caller gave up" in result.explanation


def test_run_stream_sync_raises_what_the_run_raised() -> None:
    agent = sm.Agent(ScriptedModel("x"), deps_type=Shop)
    with pytest.raises(sm.UsageError, match="deps"):
        agent.run_stream_sync("q").result()
