"""``Agent``: one object for model, tools, instructions, hooks and settings; its runs are
``run_agent``'s; sub-agents as tools; model strings."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine.agent import agent as agent_module
from statemachine.messages import Usage
from statemachine.providers import (
    AnthropicModel,
    OpenAIChatModel,
    known_providers,
    model_from_string,
    register_provider,
)
from statemachine.testing import FunctionModel, ScriptedModel

pytestmark = pytest.mark.timeout(30)


@attrs.frozen
class Library:
    books: tuple[str, ...]


@sm.tool
def count_books(ctx: sm.RunContext[Library]) -> int:
    """How many books the library has."""
    return len(ctx.deps.books)


def ask(call_id: str = "c1") -> sm.ToolCall:
    return sm.ToolCall(call_id, "count_books", {})


def test_an_agent_keeps_what_every_run_repeats() -> None:
    model = ScriptedModel(ask(), "Two books.", ask("c2"), "Three books.")
    agent = sm.Agent(
        model,
        tools=[count_books],
        instructions=lambda ctx: f"You run a library of {len(ctx.deps.books)} books.",
        model_settings=sm.ModelSettings(temperature=0.2),
    )
    first = agent.run_sync("How many?", deps=Library(("a", "b")))
    second = agent.run_sync(
        "And now?",
        message_history=first.messages,
        deps=Library(("a", "b", "c")),
        model_settings=sm.ModelSettings(max_tokens=50),
    )
    assert (first.final_text, second.final_text) == ("Two books.", "Three books.")
    assert [r.instructions for r in model.requests] == [
        "You run a library of 2 books.",
        "You run a library of 2 books.",
        "You run a library of 3 books.",
        "You run a library of 3 books.",
    ]
    assert model.requests[2].settings == sm.ModelSettings(temperature=0.2, max_tokens=50)
    # the prompt counts as new: it followed the history given
    assert [m.role for m in second.new_messages()] == [
        "user",
        "assistant",
        "toolResult",
        "assistant",
    ]


def _spy_runs(monkeypatch: pytest.MonkeyPatch) -> list[sm.AgentRun]:
    """The runs an ``Agent`` builds from now on (each holds its resolved options)."""
    runs: list[sm.AgentRun] = []

    class Spy(sm.AgentRun):
        def __init__(self, **keywords: Any) -> None:
            super().__init__(**keywords)
            runs.append(self)

    monkeypatch.setattr(agent_module, "AgentRun", Spy)
    return runs


def test_agent_run_hands_its_options_to_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _spy_runs(monkeypatch)
    agent = sm.Agent(ScriptedModel("hi"), max_turns=3, instructions="x")
    assert agent.run_sync("hello").final_text == "hi"
    options = runs[0].options
    assert options.max_turns == 3
    assert options.instructions == "x"
    assert list(runs[0].engine.messages[:1]) == [sm.UserMessage("hello")]
    # without them, the structured-output and limit options are run_agent's defaults
    assert (options.output_type, options.output_retries, options.usage_limits) == (None, 2, None)


def test_output_and_limit_options_are_handed_to_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = _spy_runs(monkeypatch)
    limits = sm.UsageLimits(requests=3)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    agent = sm.Agent(ScriptedModel(), output_type=schema, output_retries=5, usage_limits=limits)
    agent.run_sync("x")
    options = runs[0].options
    assert (options.output_type, options.output_retries, options.usage_limits) == (
        schema,
        5,
        limits,
    )


def test_run_stream_yields_events_and_text_and_the_result() -> None:
    async def main() -> tuple[list[str], list[str], sm.RunResult]:
        agent = sm.Agent(ScriptedModel("Once upon a time.", stream=True))
        async with agent.run_stream("Tell a story") as run:
            text = [piece async for piece in run.stream_text()]
        result = await run.result()
        async with agent.run_stream("Again") as again:
            kinds = [type(event).__name__ async for event in again]
        return text, kinds, result

    agent_text, kinds, result = asyncio.run(main())
    assert agent_text == ["Once ", "upon ", "a ", "time."]
    assert result.final_text == "Once upon a time."
    assert kinds[0] == "RunStarted"
    assert kinds[-1] == "RunReturned"


def test_leaving_run_stream_early_aborts_the_run() -> None:
    async def slow(messages: Any, tools: Any, signal: sm.AbortSignal) -> sm.AssistantMessage:
        aborted = asyncio.Event()
        signal.add_listener(lambda reason: aborted.set())
        await aborted.wait()
        return sm.AssistantMessage("", stop_reason="aborted")

    async def main() -> sm.RunResult:
        agent = sm.Agent(FunctionModel(slow, with_signal=True), grace_period=0.2)
        async with agent.run_stream("hi") as run:
            pass
        return await run.result()

    assert asyncio.run(main()).state is sm.TurnState.ABORTED


def test_resume_and_resume_sync_use_the_agents_tools_and_hooks() -> None:
    agent = sm.Agent(
        ScriptedModel(ask(), "Two.", ask("c2"), "Two again."),
        tools=[count_books],
        before_tool_call=lambda call: sm.RequireApproval("a person checks"),
    )
    deps = Library(("a", "b"))
    suspended = agent.run_sync("How many?", deps=deps)
    assert suspended.state is sm.TurnState.AWAITING_USER
    done = agent.resume_sync(suspended, approvals={"c1": True}, deps=deps)
    assert done.final_text == "Two."
    assert done.stats is not None
    assert done.stats.model_calls == 2

    async def later() -> sm.RunResult:
        again = await agent.run("Again?", message_history=done.messages, deps=deps)
        return await agent.resume(again, approvals={"c2": True}, deps=deps)

    assert asyncio.run(later()).final_text == "Two again."


def test_the_sync_forms_refuse_a_running_loop() -> None:
    agent = sm.Agent(ScriptedModel("x"))

    async def inside() -> None:
        with pytest.raises(sm.UsageError, match="await run"):
            agent.run_sync("x")

    asyncio.run(inside())


def test_bad_agent_options_are_refused_at_construction() -> None:
    with pytest.raises(sm.InvalidInputError, match="tools"):
        sm.Agent(ScriptedModel(), tools=["nope"])  # type: ignore[list-item]
    with pytest.raises(sm.InvalidInputError, match="instructions"):
        sm.Agent(ScriptedModel(), instructions=3)  # type: ignore[arg-type]
    with pytest.raises(sm.InvalidInputError, match="model_settings"):
        sm.Agent(ScriptedModel(), model_settings={"temperature": 1})  # type: ignore[arg-type]
    with pytest.raises(sm.InvalidInputError, match="usage_limits"):
        sm.Agent(ScriptedModel(), usage_limits={"requests": 3})  # type: ignore[arg-type]
    with pytest.raises(sm.InvalidInputError, match="output_type"):
        sm.Agent(ScriptedModel(), output_type=complex)
    with pytest.raises(sm.InvalidInputError, match="output_retries"):
        sm.Agent(ScriptedModel(), output_type=Library, output_retries=-1)
    with pytest.raises(sm.InvalidInputError, match="message_history"):
        sm.Agent(ScriptedModel()).run_sync("x", message_history="not a list")  # type: ignore[arg-type]


# -- sub-agents ---------------------------------------------------------------------------------


def test_a_sub_agent_is_a_tool_whose_stats_and_usage_join_the_parents() -> None:
    usage = Usage(input=7, output=3)
    child = sm.Agent(
        ScriptedModel(ask(), sm.AssistantMessage("The library has 2 books.", usage=usage)),
        name="librarian",
        tools=[count_books],
    )
    parent_model = ScriptedModel(
        sm.ToolCall("p1", "librarian", {"prompt": "count the books"}), "Two, says the librarian."
    )
    parent = sm.Agent(parent_model, tools=[child.as_tool(description="Asks the librarian.")])
    result = parent.run_sync("How many books?", deps=Library(("a", "b")))
    assert result.final_text == "Two, says the librarian."
    [answer] = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.text == "The library has 2 books."
    assert parent_model.requests[0].tools[0].description == "Asks the librarian."
    assert result.stats is not None
    assert result.stats.model_calls == 4  # 2 of the parent, 2 of the child
    assert result.stats.usage.input == 7
    assert result.stats.tool_calls == {"librarian": {"ok": 1}, "count_books": {"ok": 1}}


def test_the_parents_abort_reaches_the_sub_agent() -> None:
    child_saw: list[bool] = []

    async def child_waits(messages: Any, tools: Any, signal: sm.AbortSignal) -> Any:
        while not signal.aborted:
            await asyncio.sleep(0.01)
        child_saw.append(True)
        return sm.AssistantMessage("", stop_reason="aborted")

    child = sm.Agent(FunctionModel(child_waits, with_signal=True), name="slow", grace_period=1)
    parent = sm.Agent(
        ScriptedModel(sm.ToolCall("p1", "slow", {"prompt": "wait"})),
        tools=[child.as_tool()],
        grace_period=1,
    )

    async def main() -> sm.RunResult:
        controller = sm.AbortController()
        running = asyncio.create_task(parent.run("go", signal=controller.signal))
        await asyncio.sleep(0.05)
        controller.abort("the user left")
        return await running

    result = asyncio.run(main())
    assert result.state is sm.TurnState.ABORTED
    assert child_saw == [True]
    [answer] = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.is_error


def test_a_sub_agent_that_asks_for_approval_ends_its_call_with_an_error_naming_it() -> None:
    child = sm.Agent(
        ScriptedModel(ask()),
        name="librarian",
        tools=[count_books],
        before_tool_call=lambda call: sm.RequireApproval("check"),
    )
    parent = sm.Agent(
        ScriptedModel(sm.ToolCall("p1", "librarian", {"prompt": "count"}), "Could not."),
        tools=[child.as_tool()],
    )
    result = parent.run_sync("How many?", deps=Library(()))
    [answer] = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert answer.is_error
    assert "approval for count_books (c1)" in answer.text
    assert "a person cannot be asked inside a sub-agent" in answer.text


def test_an_agents_deps_type_is_checked_before_any_model_call() -> None:
    model = ScriptedModel("never")
    agent = sm.Agent(model, name="shelf", deps_type=Library)
    with pytest.raises(sm.UsageError, match=r"deps: Agent shelf takes RunContext\[Library\]"):
        agent.run_sync("x", deps="not a library")  # type: ignore[arg-type]
    assert model.calls == 0


def test_as_tool_needs_a_name() -> None:
    with pytest.raises(sm.InvalidInputError, match="as_tool needs a name"):
        sm.Agent(ScriptedModel()).as_tool()


# -- model strings ------------------------------------------------------------------------------


def test_model_strings_build_the_bundled_adapters() -> None:
    openai = model_from_string("openai:gpt-4.1", api_key="sk-test")
    anthropic = model_from_string("anthropic:claude-sonnet-4-5", api_key="sk-ant-test")
    assert isinstance(openai, OpenAIChatModel)
    assert openai.model == "gpt-4.1"
    assert isinstance(anthropic, AnthropicModel)
    assert anthropic.model == "claude-sonnet-4-5"
    assert {"openai", "anthropic"} <= set(known_providers())


def test_model_strings_build_the_responses_gemini_and_bedrock_adapters() -> None:
    from statemachine.providers import BedrockModel, GeminiModel, OpenAIResponsesModel

    responses = model_from_string("openai-responses:gpt-5-mini", api_key="sk-test")
    assert isinstance(responses, OpenAIResponsesModel)
    assert responses.model == "gpt-5-mini"
    for prefix in ("gemini", "google-gla"):
        gemini = model_from_string(f"{prefix}:gemini-2.5-flash", api_key="AIza-test")
        assert isinstance(gemini, GeminiModel)
        assert gemini.model == "gemini-2.5-flash"
    bedrock = model_from_string(
        "bedrock:us.anthropic.claude-sonnet-4-20250514-v1:0",
        region="eu-central-1",
        aws_access_key_id="AKIAFAKEFAKEFAKE",
        aws_secret_access_key="fake-secret-0123456789",
    )
    assert isinstance(bedrock, BedrockModel)
    assert bedrock.model == "us.anthropic.claude-sonnet-4-20250514-v1:0"


def test_an_agent_takes_a_model_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    agent = sm.Agent("openai:gpt-4.1-mini")
    assert isinstance(agent.model, OpenAIChatModel)


def test_unknown_or_malformed_model_strings_are_usage_errors_listing_the_known() -> None:
    listed = ", ".join(sorted(known_providers()))
    assert {"groq", "mistral", "ollama", "vertex"} <= set(known_providers())
    with pytest.raises(sm.UsageError, match="unknown model provider 'nonesuch'") as raised:
        model_from_string("nonesuch:large")
    assert listed in str(raised.value)
    with pytest.raises(sm.UsageError, match="not 'provider:model'"):
        sm.Agent("gpt-4.1")
    with pytest.raises(sm.UsageError, match="unknown model provider"):
        sm.run_agent_sync(model="nope:x", messages="hi")


def test_a_provider_can_be_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    from statemachine.providers import registry

    monkeypatch.setattr(registry, "_providers", dict(registry._providers))  # undone after
    register_provider("fake-test", lambda name, **options: ScriptedModel(f"I am {name}"))
    assert sm.Agent("fake-test:m1").run_sync("who?").final_text == "I am m1"
    assert "fake-test" in known_providers()
    with pytest.raises(sm.UsageError, match="prefix"):
        register_provider("Bad Prefix", lambda name: ScriptedModel())


# -- instructions for one run -------------------------------------------------------------


def test_a_runs_instructions_follow_the_agents_for_that_run_only() -> None:
    model = ScriptedModel("Bonjour.", "Hello.")
    agent = sm.Agent(model, instructions="Be brief.")
    agent.run_sync("hi", instructions="Answer in French.")
    agent.run_sync("hi")
    assert [r.instructions for r in model.requests] == [
        "Be brief.\n\nAnswer in French.",
        "Be brief.",
    ]


def test_a_runs_instructions_function_is_asked_beside_the_agents_at_every_call() -> None:
    model = ScriptedModel(ask(), "Two books.", "Streamed.", "Synced.")
    agent = sm.Agent(
        model,
        tools=[count_books],
        instructions=lambda ctx: f"You run a library of {len(ctx.deps.books)} books.",
    )

    def turn(ctx: sm.RunContext[Library]) -> str:
        return f"This is turn {ctx.turn}."

    deps = Library(("a", "b"))
    agent.run_sync("How many?", deps=deps, instructions=turn)

    async def streamed() -> None:
        async with agent.run_stream("again", deps=deps, instructions="Stream it.") as run:
            await run.result()

    asyncio.run(streamed())
    with agent.run_stream_sync("once more", deps=deps, instructions=turn) as run:
        run.result()
    assert [r.instructions for r in model.requests] == [
        "You run a library of 2 books.\n\nThis is turn 1.",
        "You run a library of 2 books.\n\nThis is turn 2.",
        "You run a library of 2 books.\n\nStream it.",
        "You run a library of 2 books.\n\nThis is turn 1.",
    ]


def test_a_runs_instructions_alone_and_a_part_without_text() -> None:
    model = ScriptedModel("a", "b")
    sm.Agent(model).run_sync("hi", instructions="Only this run.")
    sm.Agent(model, instructions=lambda: None).run_sync("hi", instructions="Still said.")
    assert [r.instructions for r in model.requests] == ["Only this run.", "Still said."]


def test_a_runs_instructions_are_checked_like_the_agents() -> None:
    agent = sm.Agent(ScriptedModel("x"), instructions="Be brief.")
    with pytest.raises(sm.InvalidInputError, match="instructions"):
        agent.run_sync("hi", instructions=3)  # type: ignore[arg-type]

    def wants_library(ctx: sm.RunContext[Library]) -> str:
        return "x"

    with pytest.raises(sm.UsageError, match=r"instructions function takes RunContext\[Library\]"):
        agent.run_sync("hi", deps="not a library", instructions=wants_library)

    def fails() -> str:
        raise RuntimeError("no catalogue")

    result = agent.run_sync("hi", instructions=fails)
    assert result.state is sm.TurnState.FAILED
    assert "'fails' raised RuntimeError: no catalogue" in result.explanation
    assert result.explanation.count("InstructionsError") == 1  # named once, not wrapped again


def test_a_resumed_run_takes_instructions_for_what_is_left_of_it() -> None:
    model = ScriptedModel(ask(), "Two.")
    agent = sm.Agent(
        model,
        tools=[count_books],
        instructions="Count.",
        before_tool_call=lambda call: sm.RequireApproval("a person checks"),
    )
    deps = Library(("a", "b"))
    suspended = agent.run_sync("How many?", deps=deps, instructions="Be exact.")
    agent.resume_sync(suspended, approvals={"c1": True}, deps=deps, instructions="Be quick.")
    assert [r.instructions for r in model.requests] == [
        "Count.\n\nBe exact.",
        "Count.\n\nBe quick.",
    ]
