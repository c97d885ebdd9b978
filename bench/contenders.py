"""The contenders: one adapter per agent loop, all running the workload of ``workload``.

Each adapter builds its agent once (``__init__``, untimed), runs one whole agent run
per ``execute`` call (timed), and reads its own framework's result object in
``outcome`` (untimed) so that the harness can check the run. Every framework runs
its own loop: its own dispatch, argument validation and history; the adapters only
supply a scripted model in the framework's native model interface and an ``echo``
tool declared the framework's usual way.

Fairness rules, the same for all:

- the scripted model does O(1) work per call (a counter, not a scan of the history)
  and returns usage where the framework would otherwise estimate it by walking the
  history (PydanticAI's ``FunctionModel`` does that when usage is missing);
- tracing, callbacks and logging are off or filtered below WARNING;
- tools are async, so no framework pays for a thread hop.

The peers are imported inside their adapters: the harness (and the smoke test) still
runs the bare loop and ours when a peer is not installed, and says so.

A peer's agent is built once and shared by every run, as a service shares it; the
script of the run at hand is in a context variable that ``execute`` sets, so that
runs driven concurrently (``bench/scale.py``, each run in its own task) each find
their own. A ``PacedScript`` makes every model call wait, as a real model's does.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from workload import FINAL_TEXT, TOOL_NAME, Outcome, Script, argument, call_id

import statemachine as sm
import statemachine.messages
from statemachine import testing as sm_testing

__all__ = ["CONTENDERS", "Contender", "PacedScript", "quiet_logger"]


class Contender(Protocol):
    """What the harness needs from an adapter."""

    name: str

    async def execute(self, script: Script) -> object: ...

    def outcome(self, raw: object) -> Outcome: ...


def quiet_logger() -> Any:
    """A structlog logger that drops everything below WARNING before rendering."""
    return structlog.wrap_logger(
        structlog.PrintLogger(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )


ECHO_DESCRIPTION = "Return the text it is given."


@dataclass
class PacedScript(Script):
    """A script whose model calls each wait ``latency`` seconds (``asyncio.sleep``, as a
    real model call waits on the network); the first call runs ``on_first_call``."""

    latency: float = 0.0
    on_first_call: Callable[[], None] | None = None

    async def wait(self, turn: int) -> None:
        if turn == 0 and self.on_first_call is not None:
            self.on_first_call()
        await asyncio.sleep(self.latency)


_SCRIPT: ContextVar[Script] = ContextVar("bench_script")
"""The script of the run being driven in this task (set by a peer's ``execute``)."""


async def _next_turn() -> tuple[Script, int]:
    """A peer's scripted model starts a call: its run's script, the turn, the wait."""
    script = _SCRIPT.get()
    turn = script.next_turn()
    if isinstance(script, PacedScript):
        await script.wait(turn)
    return script, turn


# -- the bare loop --------------------------------------------------------------------

BareMessage = dict[str, Any]
BareTool = Callable[[Mapping[str, Any]], Awaitable[str]]


async def _bare_echo(arguments: Mapping[str, Any]) -> str:
    return str(arguments["text"])


class Bare:
    """The physical limit: the classic teaching loop, transcribed to Python.

    Plain dicts in the wire shape (no classes, no validation, no tasks, no queue): the
    model is awaited, its message appended, each tool call looked up by name, awaited
    in place and its result appended. It still does what every contender must do to
    be correct: keep the history, dispatch by name, answer an unknown tool.
    """

    name = "bare async loop (dicts)"

    async def execute(self, script: Script) -> object:
        tools: dict[str, BareTool] = {TOOL_NAME: _bare_echo}
        messages: list[BareMessage] = [
            {"role": "user", "content": [{"type": "text", "text": "go"}]}
        ]
        for _ in range(script.n):
            assistant = await _bare_complete(script, messages)
            messages.append(assistant)
            calls = [b for b in assistant["content"] if b["type"] == "toolCall"]
            if not calls:
                return messages
            for block in calls:
                tool = tools.get(block["name"])
                if tool is None:
                    text, is_error = f"Unknown tool: {block['name']}", True
                else:
                    text, is_error = await tool(block["arguments"]), False
                messages.append(
                    {
                        "role": "toolResult",
                        "toolCallId": block["id"],
                        "toolName": block["name"],
                        "isError": is_error,
                        "content": [{"type": "text", "text": text}],
                    }
                )
        raise RuntimeError(f"the bare loop exceeded {script.n} turns")

    def outcome(self, raw: object) -> Outcome:
        assert isinstance(raw, list)
        assistants = [m for m in raw if m["role"] == "assistant"]
        results = tuple(m["content"][0]["text"] for m in raw if m["role"] == "toolResult")
        final = "".join(b["text"] for b in assistants[-1]["content"] if b["type"] == "text")
        return Outcome(len(assistants), results, final)


async def _bare_complete(script: Script, messages: Sequence[BareMessage]) -> BareMessage:
    turn = script.next_turn()
    if script.wants_tool(turn):
        block = {
            "type": "toolCall",
            "id": call_id(turn),
            "name": TOOL_NAME,
            "arguments": {"text": argument(turn)},
        }
        return {"role": "assistant", "stopReason": "toolUse", "content": [block]}
    return {
        "role": "assistant",
        "stopReason": "stop",
        "content": [{"type": "text", "text": "done"}],
    }


# -- ours ---------------------------------------------------------------------------------


@sm.tool(name=TOOL_NAME, description=ECHO_DESCRIPTION)
async def _sm_echo(text: str) -> str:
    return text


def _scripted_client(script: Script) -> sm_testing.FunctionModel:
    """The library's own fake ``ModelClient`` (``statemachine.testing.FunctionModel``),
    answering as the script says: one per run, so its record of requests is that run's."""

    def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> sm.AssistantMessage:
        turn = script.next_turn()
        if script.wants_tool(turn):
            call = sm.ToolCall(call_id(turn), TOOL_NAME, {"text": argument(turn)})
            return sm.AssistantMessage((call,), stop_reason=sm.messages.StopReason.TOOL_USE)
        return sm.AssistantMessage(FINAL_TEXT)

    return sm_testing.FunctionModel(answer, record=False)  # a 10,000-turn run: no copies


class Ours:
    """``statemachine.run_agent``: engine, transition table, invariants, asyncio driver."""

    def __init__(self, *, logger: Any = None, default_logger: bool = False) -> None:
        # None means run_agent's own default logger (silent stdlib logging), measured in a note.
        self.logger = None if default_logger else (logger or quiet_logger())
        self.name = "statemachine run_agent" + (" (default logger)" if default_logger else "")

    async def execute(self, script: Script) -> object:
        client = _scripted_client(script)
        return await sm.run_agent(
            model=client,
            messages=[sm.UserMessage("go")],
            tools=[_sm_echo],
            max_turns=script.n,
            logger=self.logger,
        )

    def outcome(self, raw: object) -> Outcome:
        assert isinstance(raw, sm.RunResult)
        if raw.state is not sm.TurnState.DONE:
            return Outcome(raw.turns, (), f"<run ended {raw.state.value}: {raw.explanation}>")
        results = tuple(
            m.text for m in raw.messages if isinstance(m, sm.ToolResultMessage) and not m.is_error
        )
        calls = sum(isinstance(m, sm.AssistantMessage) for m in raw.messages)
        return Outcome(calls, results, raw.final_text)


class OursTraced(Ours):
    """``run_agent`` through ``statemachine.otel.AgentTracer`` (spans made, none exported)."""

    def __init__(self, provider: Any) -> None:
        super().__init__()
        from statemachine.otel import AgentTracer

        self.tracer = AgentTracer(provider)
        self.name = "statemachine run_agent (traced)"

    async def execute(self, script: Script) -> object:
        client = _scripted_client(script)
        return await self.tracer.run_agent(
            model=client,
            messages=[sm.UserMessage("go")],
            tools=[_sm_echo],
            max_turns=script.n,
            logger=self.logger,
        )


class OursAgent(Ours):
    """``statemachine.Agent.run``: the same run through an ``Agent``. The scripted
    client is one per run, so the agent is made in each run's timing too (once per
    run, not per turn: negligible per turn at N = 1,000)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "statemachine Agent.run"

    async def execute(self, script: Script) -> object:
        agent = sm.Agent(
            _scripted_client(script), tools=[_sm_echo], max_turns=script.n, logger=self.logger
        )
        return await agent.run("go")


class BareTyped:
    """The same teaching loop on our own types: the scripted ``ModelClient``, the
    ``@tool``-built ``Tool`` and frozen attrs messages, with none of the engine.

    The difference between this and ``run_agent`` is what the explicit states, the
    transition log, argument validation, the invariants and the asyncio driver cost;
    the difference between this and the dict loop is what the message classes cost.
    """

    name = "bare async loop (our types)"

    async def execute(self, script: Script) -> object:
        client = _scripted_client(script)
        tools = {_sm_echo.name: _sm_echo}
        definitions = [_sm_echo.definition]
        signal = sm.AbortSignal()
        messages: list[sm.Message] = [sm.UserMessage("go")]
        for _ in range(script.n):
            assistant = await client.complete(messages, definitions, signal)
            messages.append(assistant)
            calls = assistant.tool_calls
            if not calls:
                return messages
            for call in calls:
                tool = tools.get(call.name)
                if tool is None:
                    text = f"Unknown tool: {call.name}"
                    messages.append(sm.ToolResultMessage(call.id, call.name, text, is_error=True))
                    continue
                value = await tool.execute(call.arguments_dict(), signal)
                output = value if isinstance(value, sm.ToolOutput) else sm.ToolOutput(value)
                messages.append(
                    sm.ToolResultMessage(call.id, call.name, output.content, output.is_error)
                )
        raise RuntimeError(f"the bare loop exceeded {script.n} turns")

    def outcome(self, raw: object) -> Outcome:
        assert isinstance(raw, list)
        assistants = [m for m in raw if isinstance(m, sm.AssistantMessage)]
        results = tuple(m.text for m in raw if isinstance(m, sm.ToolResultMessage))
        return Outcome(len(assistants), results, assistants[-1].text)


class BareTypedTasked(BareTyped):
    """The typed loop with what a loop needs to abort a run within a grace period
    whatever its tools do (as ``bench/scale.py``'s floor, on our types): each operation
    (the model call, each tool call) an asyncio task of its own, reporting into the
    run's inbox, read one report at a time. What ``run_agent`` costs over this is the
    engine, the record and the driver's bookkeeping; what this costs over
    ``BareTyped`` is the tasks themselves."""

    name = "bare loop, a task per operation (our types)"

    async def execute(self, script: Script) -> object:
        client = _scripted_client(script)
        definitions = [_sm_echo.definition]
        signal = sm.AbortSignal()
        messages: list[sm.Message] = [sm.UserMessage("go")]
        inbox: asyncio.Queue[sm.Message] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()  # referenced until done, as asyncio asks

        def start(operation: Coroutine[Any, Any, None]) -> None:
            task = asyncio.ensure_future(operation)
            running.add(task)
            task.add_done_callback(running.discard)

        async def call_model() -> None:
            inbox.put_nowait(await client.complete(messages, definitions, signal))

        async def call_tool(call: sm.ToolCall) -> None:
            value = await _sm_echo.execute(call.arguments_dict(), signal)
            output = value if isinstance(value, sm.ToolOutput) else sm.ToolOutput(value)
            inbox.put_nowait(
                sm.ToolResultMessage(call.id, call.name, output.content, output.is_error)
            )

        start(call_model())
        for _ in range(script.n):
            assistant = await inbox.get()
            assert isinstance(assistant, sm.AssistantMessage)
            messages.append(assistant)
            calls = assistant.tool_calls
            if not calls:
                return messages
            for call in calls:
                start(call_tool(call))
            results = {}
            while len(results) < len(calls):
                result = await inbox.get()
                assert isinstance(result, sm.ToolResultMessage)
                results[result.tool_call_id] = result
            messages.extend(results[call.id] for call in calls)
            start(call_model())
        raise RuntimeError(f"the tasked loop exceeded {script.n} turns")


# -- PydanticAI ---------------------------------------------------------------------------


class PydanticAI:
    """PydanticAI's ``Agent`` with a ``FunctionModel`` (its own test model)."""

    name = "PydanticAI (FunctionModel)"

    def __init__(self) -> None:
        from pydantic_ai import Agent, Tool
        from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import AgentInfo, FunctionModel
        from pydantic_ai.usage import RequestUsage, UsageLimits

        async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            script, turn = await _next_turn()
            # Usage given, as a real model gives it: without it FunctionModel estimates
            # tokens by walking the whole history, a cost of the test model, not the loop.
            usage = RequestUsage(input_tokens=1, output_tokens=1)
            if script.wants_tool(turn):
                part = ToolCallPart(TOOL_NAME, {"text": argument(turn)}, tool_call_id=call_id(turn))
                return ModelResponse(parts=[part], usage=usage)
            return ModelResponse(parts=[TextPart(FINAL_TEXT)], usage=usage)

        async def echo(text: str) -> str:
            return text

        self.agent = Agent(
            FunctionModel(model),
            tools=[Tool(echo, name=TOOL_NAME, description=ECHO_DESCRIPTION, takes_ctx=False)],
        )
        # The default request_limit is 50: lift it, the workload sets the length.
        self.limits = UsageLimits(request_limit=None)

    async def execute(self, script: Script) -> object:
        _SCRIPT.set(script)
        return await self.agent.run("go", usage_limits=self.limits)

    def outcome(self, raw: object) -> Outcome:
        from pydantic_ai.messages import ModelResponse, ToolReturnPart

        messages = raw.all_messages()  # type: ignore[attr-defined]
        calls = sum(isinstance(m, ModelResponse) for m in messages)
        results = tuple(
            str(part.content)
            for m in messages
            for part in m.parts
            if isinstance(part, ToolReturnPart)
        )
        return Outcome(calls, results, str(raw.output))  # type: ignore[attr-defined]


# -- OpenAI Agents SDK ---------------------------------------------------------------------


class OpenAIAgents:
    """The OpenAI Agents SDK's ``Runner`` with a custom ``Model``; tracing disabled."""

    name = "OpenAI Agents SDK (custom Model)"

    def __init__(self) -> None:
        from agents import Agent, Model, ModelResponse, Usage, function_tool, set_tracing_disabled
        from openai.types.responses import (
            ResponseFunctionToolCall,
            ResponseOutputMessage,
            ResponseOutputText,
        )

        set_tracing_disabled(True)

        class ScriptedModel(Model):
            async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
                script, turn = await _next_turn()
                usage = Usage(requests=1, input_tokens=1, output_tokens=1, total_tokens=2)
                output: list[Any]
                if script.wants_tool(turn):
                    output = [
                        ResponseFunctionToolCall(
                            type="function_call",
                            call_id=call_id(turn),
                            name=TOOL_NAME,
                            arguments='{"text": "' + argument(turn) + '"}',
                        )
                    ]
                else:
                    text = ResponseOutputText(type="output_text", text=FINAL_TEXT, annotations=[])
                    output = [
                        ResponseOutputMessage(
                            type="message",
                            id=f"msg_{turn}",
                            role="assistant",
                            status="completed",
                            content=[text],
                        )
                    ]
                return ModelResponse(output=output, usage=usage, response_id=None)

            def stream_response(self, *args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError("the benchmark runs the non-streaming loop")

        @function_tool(name_override=TOOL_NAME, description_override=ECHO_DESCRIPTION)
        async def echo(text: str) -> str:
            return text

        self.agent = Agent(name="bench", model=ScriptedModel(), tools=[echo])

    async def execute(self, script: Script) -> object:
        from agents import Runner

        _SCRIPT.set(script)
        return await Runner.run(self.agent, "go", max_turns=script.n)

    def outcome(self, raw: object) -> Outcome:
        from agents import ToolCallOutputItem

        items = raw.new_items  # type: ignore[attr-defined]
        results = tuple(str(i.output) for i in items if isinstance(i, ToolCallOutputItem))
        calls = len(raw.raw_responses)  # type: ignore[attr-defined]
        return Outcome(calls, results, str(raw.final_output))  # type: ignore[attr-defined]


# -- LangGraph ------------------------------------------------------------------------------


class LangGraph:
    """LangGraph's prebuilt ReAct agent (``create_react_agent``) with a fake chat model."""

    name = "LangGraph (create_react_agent)"

    def __init__(self) -> None:
        from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
        from langchain_core.language_models import BaseChatModel
        from langchain_core.messages import AIMessage, BaseMessage
        from langchain_core.outputs import ChatGeneration, ChatResult
        from langchain_core.tools import tool as lc_tool
        from langgraph.prebuilt import create_react_agent

        class ScriptedChatModel(BaseChatModel):
            @property
            def _llm_type(self) -> str:
                return "bench-scripted"

            def _reply(self, script: Script, turn: int) -> ChatResult:
                if script.wants_tool(turn):
                    message = AIMessage(
                        content="",
                        tool_calls=[
                            {
                                "name": TOOL_NAME,
                                "args": {"text": argument(turn)},
                                "id": call_id(turn),
                                "type": "tool_call",
                            }
                        ],
                    )
                else:
                    message = AIMessage(content=FINAL_TEXT)
                return ChatResult(generations=[ChatGeneration(message=message)])

            def _generate(
                self,
                messages: list[BaseMessage],
                stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any,
            ) -> ChatResult:
                script = _SCRIPT.get()
                return self._reply(script, script.next_turn())

            async def _agenerate(
                self,
                messages: list[BaseMessage],
                stop: list[str] | None = None,
                run_manager: AsyncCallbackManagerForLLMRun | None = None,
                **kwargs: Any,
            ) -> ChatResult:
                return self._reply(*await _next_turn())

            def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
                # The script already knows its tool; a real model would send the schemas.
                return self

        @lc_tool(TOOL_NAME, description=ECHO_DESCRIPTION)
        async def echo(text: str) -> str:
            return text

        with warnings.catch_warnings():
            # Deprecated in LangGraph 1.0 in favour of langchain.agents.create_agent, which
            # needs the full langchain package; the prebuilt agent is still LangGraph's own.
            warnings.simplefilter("ignore")
            self.graph = create_react_agent(ScriptedChatModel(), [echo])

    async def execute(self, script: Script) -> object:
        _SCRIPT.set(script)
        # Each turn is two supersteps (agent, tools): allow the whole run.
        config: Any = {"recursion_limit": 2 * script.n + 10}
        return await self.graph.ainvoke({"messages": [("user", "go")]}, config=config)

    def outcome(self, raw: object) -> Outcome:
        from langchain_core.messages import AIMessage, ToolMessage

        assert isinstance(raw, dict)
        messages = raw["messages"]
        ais = [m for m in messages if isinstance(m, AIMessage)]
        results = tuple(str(m.content) for m in messages if isinstance(m, ToolMessage))
        final = str(ais[-1].content) if ais else ""
        return Outcome(len(ais), results, final)


CONTENDERS: tuple[tuple[str, Callable[[], Contender]], ...] = (
    (BareTyped.name, BareTyped),
    (Bare.name, Bare),
    (BareTypedTasked.name, BareTypedTasked),
    ("statemachine run_agent", Ours),
    ("statemachine Agent.run", OursAgent),
    (PydanticAI.name, PydanticAI),
    (OpenAIAgents.name, OpenAIAgents),
    (LangGraph.name, LangGraph),
)
"""In table order; the first is the baseline of the ``× bare`` ratio."""
