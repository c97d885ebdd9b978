"""Adapters: six real Python agent loops in the kit's loop shape.

Each adapter is an ``AgentLoop`` (``async loop(*, model, tools, messages, max_turns,
signal)``) that runs the peer's OWN loop, configured with its documented defaults;
the adapter only supplies:

* the kit's scripted model in the peer's native model interface (PydanticAI's
  ``FunctionModel``, an Agents SDK ``Model``, a LangChain ``BaseChatModel``, a
  smolagents ``Model``, a strands ``Model``, an autogen ``ChatCompletionClient``, which
  honours the cancellation token the peer hands it);
* the kit's scripted tools declared the peer's usual way: typed Python functions
  ``(key: str, count: int | None = None)`` (for smolagents a ``Tool`` subclass with
  the same two inputs), the kit's one tool schema, so that the peer validates
  arguments with its own machinery;
* the input history in the peer's message types, and the peer's history back in the
  kit's wire types at the end;
* the abort: PydanticAI's and autogen's ``CancellationToken``, smolagents'
  ``agent.interrupt()`` and strands' ``cancel_signal``;
  the Agents SDK and LangGraph have no abort for a non-streamed run, so the kit's abort
  cancels the run's task, their documented way to stop a run; the history is read
  from the peer's documented place for an interrupted run (``RunCancelled``, the
  Agents SDK's session, LangGraph's checkpointer, smolagents' ``agent.memory``);
* the turn limit: the peer's own limit set to ``max_turns`` model calls; the peer's
  documented "limit reached" exception is its way of ending such a run, so the
  adapter returns the history it holds, as a ``RunResult.error`` would carry the
  explanation. Any other exception escapes the adapter, and the kit reports it (I8).

Where the peer's history has no slot for what the model said (a stop reason), the
adapter keeps the model's own value beside it, keyed by the response, so that a
lossy translation cannot pass for the peer's defect.

The peers are imported inside the adapters; run with the peers' venv
(``examples/conformance/.venv``, built by ``run.sh``).
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar

import statemachine as sm
import statemachine.messages
from statemachine.testing import KNOWN_TOOLS

__all__ = [
    "LOOPS",
    "autogen_loop",
    "langgraph_loop",
    "openai_agents_loop",
    "pydantic_ai_loop",
    "smolagents_loop",
    "strands_loop",
]

KEY_DESCRIPTION = "Scripted tool: its behaviour follows the scenario."


def _text(message: sm.AssistantMessage) -> str:
    return "".join(b.text for b in message.content if isinstance(b, sm.TextContent))


def _split_history(
    messages: Sequence[sm.Message],
) -> tuple[list[sm.Message], str]:
    """The history before the last user message, and that message's text (the prompt)."""
    last = messages[-1]
    if not isinstance(last, sm.UserMessage):
        raise ValueError("the kit's histories end with a user message")
    text = "".join(b.text for b in last.content if isinstance(b, sm.TextContent))
    return list(messages[:-1]), text


def _user_text(message: sm.UserMessage) -> str:
    return "".join(b.text for b in message.content if isinstance(b, sm.TextContent))


async def _output_text(tool: sm.Tool, arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
    """Run a kit tool; its output as the text the peers' tools return."""
    value = await tool.execute(arguments, signal)
    if isinstance(value, str):
        return value
    output = value if isinstance(value, sm.ToolOutput) else sm.ToolOutput(value)
    return "\n".join(b.text for b in output.content if isinstance(b, sm.TextContent))


def _arguments(key: str, count: int | None) -> dict[str, Any]:
    return {"key": key} if count is None else {"key": key, "count": count}


async def _run_until_aborted(
    work: Callable[[], Awaitable[Any]], signal: sm.AbortSignal
) -> tuple[Any, bool]:
    """Run ``work`` as a task that the kit's abort cancels; (its value, aborted?)."""
    task = asyncio.ensure_future(work())
    loop = asyncio.get_running_loop()

    def cancel(_: object) -> None:
        loop.call_soon_threadsafe(task.cancel)  # abort() may come from any thread

    remove = signal.add_listener(cancel)
    try:
        return await task, False
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # the kit cancelled us: not the abort
        return None, True
    finally:
        remove()


# -- PydanticAI ------------------------------------------------------------------------

_STOP_KEY = "statemachine_stop_reason"


def pydantic_ai_loop() -> Any:
    """PydanticAI's ``Agent`` with a ``FunctionModel``; ``UsageLimits(request_limit=max_turns)``."""
    from pydantic_ai import Agent, CancellationToken, Tool, capture_run_messages
    from pydantic_ai.exceptions import RunCancelled, UsageLimitExceeded
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage, UsageLimits

    finish = {
        sm.messages.StopReason.STOP: "stop",
        sm.messages.StopReason.TOOL_USE: "tool_call",
        sm.messages.StopReason.LENGTH: "length",
        sm.messages.StopReason.ERROR: "error",
    }

    def to_response(message: sm.AssistantMessage) -> ModelResponse:
        parts: list[Any] = []
        for block in message.content:
            if isinstance(block, sm.TextContent):
                parts.append(TextPart(block.text))
            elif isinstance(block, sm.ToolCall):
                parts.append(
                    ToolCallPart(block.name, block.arguments_dict(), tool_call_id=block.id)
                )
        return ModelResponse(
            parts=parts,
            usage=RequestUsage(input_tokens=1, output_tokens=1),
            finish_reason=finish.get(message.stop_reason),  # type: ignore[arg-type]
            provider_details={_STOP_KEY: message.stop_reason.value},
        )

    def to_pydantic(history: Sequence[sm.Message]) -> list[ModelMessage]:
        out: list[ModelMessage] = []
        for m in history:
            if isinstance(m, sm.UserMessage):
                text = "".join(b.text for b in m.content if isinstance(b, sm.TextContent))
                out.append(ModelRequest(parts=[UserPromptPart(text)]))
            elif isinstance(m, sm.AssistantMessage):
                out.append(to_response(m))
            else:
                part = ToolReturnPart(m.tool_name, m.text, tool_call_id=m.tool_call_id)
                last = out[-1] if out else None
                if isinstance(last, ModelRequest) and all(
                    isinstance(p, ToolReturnPart) for p in last.parts
                ):
                    last.parts = [*last.parts, part]
                else:
                    out.append(ModelRequest(parts=[part]))
        return out

    def from_pydantic(history: Sequence[ModelMessage]) -> list[sm.Message]:
        out: list[sm.Message] = []
        for m in history:
            if isinstance(m, ModelResponse):
                content: list[Any] = []
                for p in m.parts:
                    if isinstance(p, TextPart):
                        content.append(sm.TextContent(p.content))
                    elif isinstance(p, ToolCallPart):
                        content.append(sm.ToolCall(p.tool_call_id, p.tool_name, p.args_as_dict()))
                calls = any(isinstance(c, sm.ToolCall) for c in content)
                said = (m.provider_details or {}).get(_STOP_KEY)
                stop = said or ("toolUse" if calls else "stop")
                out.append(sm.AssistantMessage(tuple(content), stop_reason=stop))
                continue
            for part in m.parts:
                if isinstance(part, UserPromptPart):
                    out.append(sm.UserMessage(str(part.content)))
                elif isinstance(part, ToolReturnPart):
                    # outcome: 'success', or 'failed' / 'denied' / 'interrupted' /
                    # 'retried' (an unknown tool, arguments that fail validation): errors.
                    out.append(
                        sm.ToolResultMessage(
                            part.tool_call_id,
                            part.tool_name,
                            part.model_response_str(),
                            is_error=part.outcome != "success",
                        )
                    )
                elif isinstance(part, RetryPromptPart):
                    if part.tool_name is None:
                        out.append(sm.UserMessage(part.model_response()))
                    else:
                        out.append(
                            sm.ToolResultMessage(
                                part.tool_call_id,
                                part.tool_name,
                                part.model_response(),
                                is_error=True,
                            )
                        )
        return out

    async def loop(
        *,
        model: Any,
        tools: Sequence[sm.Tool],
        messages: Sequence[sm.Message],
        max_turns: int,
        signal: sm.AbortSignal,
    ) -> list[sm.Message]:
        definitions = [t.definition for t in tools]

        async def function(_: list[ModelMessage], __: AgentInfo) -> ModelResponse:
            return to_response(await model.complete((), definitions, signal))

        def declare(tool: sm.Tool) -> Tool[None]:
            async def run(key: str, count: int | None = None) -> str:
                return await _output_text(tool, _arguments(key, count), signal)

            return Tool(run, name=tool.definition.name, description=KEY_DESCRIPTION)

        agent = Agent(FunctionModel(function), tools=[declare(t) for t in tools])
        before, prompt = _split_history(messages)
        # PydanticAI's documented run cancellation: a CancellationToken; the run then
        # raises RunCancelled, whose all_messages() holds everything it completed.
        token = CancellationToken()
        remove = signal.add_listener(lambda _: token.cancel())
        history: Sequence[ModelMessage]
        with capture_run_messages() as captured:
            try:
                result = await agent.run(
                    prompt,
                    message_history=to_pydantic(before) or None,
                    usage_limits=UsageLimits(request_limit=max_turns),
                    cancellation_token=token,
                )
                history = result.all_messages()
            except UsageLimitExceeded:
                history = captured  # the limit's documented ending: the history says the rest
            except RunCancelled as exc:
                history = exc.all_messages()
            finally:
                remove()
        if len(history) < len(messages):
            # Cancelled before the run recorded its prompt (PydanticAI keeps the prompt
            # out of message_history until a request is built): nothing happened.
            return list(messages)
        return from_pydantic(history)

    return loop


# -- OpenAI Agents SDK -----------------------------------------------------------------

# The SDK's default failure_error_function answers every tool failure with this text
# (agents/tool.py, default_tool_error_function); the Responses item that carries it
# has no error flag, so this text is how the history says "error".
_AGENTS_TOOL_ERROR = "An error occurred while running the tool. Please try again."


def openai_agents_loop() -> Any:
    """The Agents SDK's ``Runner.run`` with a custom ``Model``; tracing off; a session."""
    from agents import (
        Agent,
        MaxTurnsExceeded,
        Model,
        ModelResponse,
        Runner,
        SQLiteSession,
        Usage,
        function_tool,
        set_tracing_disabled,
    )
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)

    def to_items(message: sm.AssistantMessage, tag: str, said: dict[str, str]) -> list[Any]:
        output: list[Any] = []
        text = _text(message)
        if text or not message.tool_calls:
            output.append(
                ResponseOutputMessage(
                    type="message",
                    id=f"msg_{tag}",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
                )
            )
        for c, call in enumerate(message.tool_calls):
            output.append(
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc_{tag}_{c}",
                    call_id=call.id,
                    name=call.name,
                    arguments=json.dumps(call.arguments_dict()),
                )
            )
        for item in output:
            said[item.id] = message.stop_reason.value
        return output

    def from_items(items: Sequence[Any], said: dict[str, str]) -> list[sm.Message]:
        out: list[sm.Message] = []
        names: dict[str, str] = {}
        pending: list[Any] = []  # the content of the assistant message being read
        stop: str | None = None

        def flush() -> None:
            nonlocal pending, stop
            if pending or stop is not None:
                calls = any(isinstance(b, sm.ToolCall) for b in pending)
                out.append(
                    sm.AssistantMessage(
                        tuple(pending), stop_reason=stop or ("toolUse" if calls else "stop")
                    )
                )
            pending, stop = [], None

        for raw in items:
            item = raw if isinstance(raw, dict) else raw.model_dump(exclude_unset=True)
            kind = item.get("type", "message")
            if kind == "message" and item.get("role") == "assistant":
                if pending and any(isinstance(b, sm.ToolCall) for b in pending):
                    flush()  # a new response begins after the previous one's calls
                stop = said.get(str(item.get("id")), stop)
                for part in item.get("content", []):
                    if part.get("text"):
                        pending.append(sm.TextContent(part["text"]))
            elif kind == "function_call":
                stop = said.get(str(item.get("id")), stop)
                names[item["call_id"]] = item["name"]
                pending.append(
                    sm.ToolCall(item["call_id"], item["name"], json.loads(item["arguments"]))
                )
            elif kind == "function_call_output":
                flush()
                text = str(item["output"])
                out.append(
                    sm.ToolResultMessage(
                        item["call_id"],
                        names.get(item["call_id"], ""),
                        text,
                        is_error=text.startswith(_AGENTS_TOOL_ERROR),
                    )
                )
            elif item.get("role") == "user":
                flush()
                content = item["content"]
                if not isinstance(content, str):
                    content = "".join(p.get("text", "") for p in content)
                out.append(sm.UserMessage(content))
        flush()
        return out

    def to_input(history: Sequence[sm.Message], said: dict[str, str]) -> list[Any]:
        items: list[Any] = []
        for i, m in enumerate(history):
            if isinstance(m, sm.UserMessage):
                text = "".join(b.text for b in m.content if isinstance(b, sm.TextContent))
                items.append({"role": "user", "content": text})
            elif isinstance(m, sm.AssistantMessage):
                items += [x.model_dump(exclude_unset=True) for x in to_items(m, f"h{i}", said)]
            else:
                items.append(
                    {"type": "function_call_output", "call_id": m.tool_call_id, "output": m.text}
                )
        return items

    async def loop(
        *,
        model: Any,
        tools: Sequence[sm.Tool],
        messages: Sequence[sm.Message],
        max_turns: int,
        signal: sm.AbortSignal,
    ) -> list[sm.Message]:
        definitions = [t.definition for t in tools]
        said: dict[str, str] = {}
        responses = 0

        class ScriptedModel(Model):
            async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
                nonlocal responses
                responses += 1
                message = await model.complete((), definitions, signal)
                usage = Usage(requests=1, input_tokens=1, output_tokens=1, total_tokens=2)
                output = to_items(message, str(responses), said)
                return ModelResponse(output=output, usage=usage, response_id=None)

            def stream_response(self, *args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError("the conformance run uses the non-streaming loop")

        def declare(tool: sm.Tool) -> Any:
            async def run(key: str, count: int | None = None) -> str:
                return await _output_text(tool, _arguments(key, count), signal)

            return function_tool(
                run, name_override=tool.definition.name, description_override=KEY_DESCRIPTION
            )

        agent = Agent(name="conformance", model=ScriptedModel(), tools=[declare(t) for t in tools])
        session = SQLiteSession("conformance")
        await session.add_items(to_input(messages[:-1], said))
        _, prompt = _split_history(messages)

        async def work() -> Any:
            try:
                return await Runner.run(agent, prompt, max_turns=max_turns, session=session)
            except MaxTurnsExceeded:
                return None  # the limit's documented ending: the session holds the history

        await _run_until_aborted(work, signal)
        items = await session.get_items()
        history = from_items(items, said)
        if len(history) < len(messages):  # aborted before the prompt was saved
            return list(messages)
        return history

    return loop


# -- LangGraph -------------------------------------------------------------------------


def langgraph_loop() -> Any:
    """LangGraph's prebuilt ``create_react_agent`` with a fake chat model and a checkpointer."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import StructuredTool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    def to_ai(message: sm.AssistantMessage) -> AIMessage:
        return AIMessage(
            content=_text(message),
            tool_calls=[
                {"name": c.name, "args": c.arguments_dict(), "id": c.id, "type": "tool_call"}
                for c in message.tool_calls
            ],
            response_metadata={_STOP_KEY: message.stop_reason.value},
        )

    def to_langchain(history: Sequence[sm.Message]) -> list[BaseMessage]:
        out: list[BaseMessage] = []
        for m in history:
            if isinstance(m, sm.UserMessage):
                text = "".join(b.text for b in m.content if isinstance(b, sm.TextContent))
                out.append(HumanMessage(text))
            elif isinstance(m, sm.AssistantMessage):
                out.append(to_ai(m))
            else:
                out.append(
                    ToolMessage(
                        m.text,
                        tool_call_id=m.tool_call_id,
                        name=m.tool_name,
                        status="error" if m.is_error else "success",
                    )
                )
        return out

    def from_langchain(history: Sequence[BaseMessage]) -> list[sm.Message]:
        out: list[sm.Message] = []
        for m in history:
            if isinstance(m, HumanMessage):
                out.append(sm.UserMessage(str(m.content)))
            elif isinstance(m, AIMessage):
                content: list[Any] = [sm.TextContent(str(m.content))] if m.content else []
                content += [sm.ToolCall(c["id"] or "", c["name"], c["args"]) for c in m.tool_calls]
                said = m.response_metadata.get(_STOP_KEY)
                stop = said or ("toolUse" if m.tool_calls else "stop")
                out.append(sm.AssistantMessage(tuple(content), stop_reason=stop))
            elif isinstance(m, ToolMessage):
                out.append(
                    sm.ToolResultMessage(
                        m.tool_call_id, m.name or "", str(m.content), is_error=m.status == "error"
                    )
                )
        return out

    async def loop(
        *,
        model: Any,
        tools: Sequence[sm.Tool],
        messages: Sequence[sm.Message],
        max_turns: int,
        signal: sm.AbortSignal,
    ) -> list[sm.Message]:
        definitions = [t.definition for t in tools]

        class ScriptedChatModel(BaseChatModel):
            @property
            def _llm_type(self) -> str:
                return "conformance-scripted"

            def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
                raise NotImplementedError("the conformance run is async")

            async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
                message = await model.complete((), definitions, signal)
                return ChatResult(generations=[ChatGeneration(message=to_ai(message))])

            def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
                return self  # the script knows its tools; a real model gets the schemas

        def declare(tool: sm.Tool) -> Any:
            async def run(key: str, count: int | None = None) -> str:
                return await _output_text(tool, _arguments(key, count), signal)

            return StructuredTool.from_function(
                coroutine=run, name=tool.definition.name, description=KEY_DESCRIPTION
            )

        with warnings.catch_warnings():
            # Deprecated in LangGraph 1.0 for langchain.agents.create_agent (the full
            # langchain package); the prebuilt agent is still LangGraph's own.
            warnings.simplefilter("ignore")
            graph = create_react_agent(
                ScriptedChatModel(),
                [declare(t) for t in tools],
                checkpointer=InMemorySaver(),
            )
        # One model call and one tool step per turn: max_turns model calls and the
        # tools of the last one fit in 2 * max_turns supersteps.
        config: Any = {
            "recursion_limit": 2 * max_turns,
            "configurable": {"thread_id": "conformance"},
        }

        async def work() -> Any:
            try:
                return await graph.ainvoke({"messages": to_langchain(messages)}, config=config)
            except GraphRecursionError:
                return None  # the limit's documented ending: the checkpoint has the history

        await _run_until_aborted(work, signal)
        state = await graph.aget_state(config)
        held = state.values.get("messages") if state.values else None
        if not held:  # aborted before the first checkpoint
            return list(messages)
        return from_langchain(held)

    return loop


# -- smolagents ------------------------------------------------------------------------


def smolagents_loop() -> Any:
    """smolagents' ``ToolCallingAgent`` with a scripted ``Model``; ``max_steps=max_turns``.

    smolagents is synchronous: the agent runs in a worker thread (``asyncio.to_thread``)
    and its model and tools reach the kit's scripted ones on the event loop
    (``run_coroutine_threadsafe``), so the run needs a real-time event loop. The abort
    is ``agent.interrupt()``, its documented way to stop a run, which ends the run with
    ``AgentError("Agent interrupted.")`` at the next step. The history is read from
    ``agent.memory.steps`` (its own record of the run, from which it writes what the
    model sees next); the input history is put there the same way, as the steps of an
    earlier run continued with ``run(task, reset=False)``.
    """
    # smolagents ships no type information (no py.typed).
    from smolagents import Tool as SmolTool  # type: ignore[import-untyped]
    from smolagents import ToolCallingAgent
    from smolagents.memory import (  # type: ignore[import-untyped]
        ActionStep,
        TaskStep,
        Timing,
    )
    from smolagents.memory import ToolCall as SmolCall
    from smolagents.models import (  # type: ignore[import-untyped]
        ChatMessage,
        ChatMessageToolCall,
        ChatMessageToolCallFunction,
        MessageRole,
        Model,
    )
    from smolagents.monitoring import LogLevel, TokenUsage  # type: ignore[import-untyped]
    from smolagents.utils import AgentError  # type: ignore[import-untyped]

    def to_chat(message: sm.AssistantMessage, said: dict[int, str]) -> ChatMessage:
        calls = [
            ChatMessageToolCall(
                function=ChatMessageToolCallFunction(name=c.name, arguments=c.arguments_dict()),
                id=c.id,
                type="function",
            )
            for c in message.tool_calls
        ]
        chat = ChatMessage(
            role=MessageRole.ASSISTANT,
            content=_text(message),
            tool_calls=calls or None,
            token_usage=TokenUsage(input_tokens=1, output_tokens=1),
        )
        said[id(chat)] = message.stop_reason.value
        return chat

    def seed_steps(history: Sequence[sm.Message], said: dict[int, str]) -> list[Any]:
        """The input history (less its last user message) as smolagents memory steps."""
        steps: list[Any] = []
        for m in history:
            if isinstance(m, sm.UserMessage):
                steps.append(TaskStep(task=_user_text(m)))
            elif isinstance(m, sm.AssistantMessage):
                chat = to_chat(m, said)
                calls = [SmolCall(c.name, c.arguments_dict(), c.id) for c in m.tool_calls]
                steps.append(
                    ActionStep(
                        step_number=len(steps),
                        timing=Timing(start_time=0.0, end_time=0.0),
                        model_output_message=chat,
                        model_output=_text(m),
                        tool_calls=calls or None,
                    )
                )
            else:
                step = steps[-1]
                observations = f"{step.observations}\n{m.text}" if step.observations else m.text
                step.observations = observations
        return steps

    def from_steps(steps: Sequence[Any], said: dict[int, str], last: list[Any]) -> list[sm.Message]:
        out: list[sm.Message] = []
        for step in steps:
            if isinstance(step, TaskStep):
                out.append(sm.UserMessage(step.task))
                continue
            if not isinstance(step, ActionStep):
                continue
            chat = step.model_output_message
            if chat is None:
                if step.action_output is not None and last:
                    # The limit's final answer: smolagents keeps only the text of the
                    # model's last response (provide_final_answer).
                    stop = said.get(id(last[-1]), "stop")
                    out.append(sm.AssistantMessage(str(step.action_output), stop_reason=stop))
                continue
            made = chat.tool_calls or []
            content: list[Any] = [sm.TextContent(chat.content)] if chat.content else []
            content += [sm.ToolCall(c.id, c.function.name, c.function.arguments) for c in made]
            stop = said.get(id(chat), "toolUse" if made else "stop")
            out.append(sm.AssistantMessage(tuple(content), stop_reason=stop))
            recorded = step.tool_calls or []
            if recorded and step.observations is not None:
                # One observation text for the step, the calls' outputs joined by
                # newlines in id order (process_tool_calls); the kit's outputs are one
                # line each.
                lines = step.observations.split("\n")
                if len(lines) != len(recorded):
                    raise RuntimeError(f"cannot split {len(recorded)} observations: {lines!r}")
                out += [
                    sm.ToolResultMessage(c.id, c.name, line)
                    for c, line in zip(recorded, lines, strict=True)
                ]
            if step.error is not None:
                # As ActionStep.to_messages writes it for the model: the step's error is
                # its tool response under the id of its first recorded call, and with
                # no recorded call (a call that raised stops the recording) a message
                # with no id, which the model gets as a user message.
                if recorded:
                    first = recorded[0]
                    out.append(
                        sm.ToolResultMessage(first.id, first.name, str(step.error), is_error=True)
                    )
                else:
                    out.append(sm.UserMessage(f"Error:\n{step.error}"))
        return out

    async def loop(
        *,
        model: Any,
        tools: Sequence[sm.Tool],
        messages: Sequence[sm.Message],
        max_turns: int,
        signal: sm.AbortSignal,
    ) -> list[sm.Message]:
        definitions = [t.definition for t in tools]
        events = asyncio.get_running_loop()
        said: dict[int, str] = {}
        generated: list[Any] = []  # every response, in order (kept alive for ``said``)

        def on_loop(work: Coroutine[Any, Any, Any]) -> Any:
            return asyncio.run_coroutine_threadsafe(work, events).result()

        class ScriptedModel(Model):  # type: ignore[misc]
            def generate(self, *args: Any, **kwargs: Any) -> ChatMessage:
                chat = to_chat(on_loop(model.complete((), definitions, signal)), said)
                generated.append(chat)
                return chat

        def declare(tool: sm.Tool) -> Any:
            class Scripted(SmolTool):  # type: ignore[misc]
                name = tool.definition.name
                description = KEY_DESCRIPTION
                inputs: ClassVar[dict[str, Any]] = {
                    "key": {"type": "string", "description": "the scripted call's key"},
                    "count": {"type": "integer", "description": "unused", "nullable": True},
                }
                output_type = "string"

                def forward(self, key: str, count: int | None = None) -> str:
                    return str(on_loop(_output_text(tool, _arguments(key, count), signal)))

            return Scripted()

        agent = ToolCallingAgent(
            tools=[declare(t) for t in tools],
            model=ScriptedModel(),
            verbosity_level=LogLevel.OFF,
        )
        before, prompt = _split_history(messages)
        agent.memory.steps = seed_steps(before, said)

        def run() -> None:
            # run() clears the interrupt switch as it starts: the abort is wired to it
            # after that, so an abort that came first still interrupts the run. The
            # streamed run is the same loop (run(stream=False) drains it).
            steps = agent.run(prompt, stream=True, reset=False, max_steps=max_turns)
            remove = signal.add_listener(lambda _: agent.interrupt())
            try:
                for _ in steps:
                    pass
            finally:
                remove()

        try:
            await asyncio.to_thread(run)
        except AgentError as exc:
            if type(exc) is not AgentError or not agent.interrupt_switch:
                raise
            # "Agent interrupted.": the abort's documented ending; memory has the rest.
        return from_steps(agent.memory.steps, said, generated)

    loop.needs_real_time = True  # type: ignore[attr-defined]  # threads wake the loop
    return loop


# -- strands-agents --------------------------------------------------------------------


def strands_loop() -> Any:
    """strands-agents' ``Agent`` with a ``Model`` subclass over the kit's model;
    ``invoke_async(limits={"turns": max_turns}, cancel_signal=...)``.

    The mapping of the kit's stop reasons onto strands' (``strands/types/event_loop.py``):
    ``stop`` is ``end_turn``, ``toolUse`` is ``tool_use``, ``length`` is ``max_tokens``
    (strands then raises its documented ``MaxTokensReachedException``, whose history the
    adapter returns). ``aborted`` is what strands documents for a provider that aborts in
    flight: the stream ends without ``messageStop`` after the abort was forwarded to the
    run's ``cancel_signal`` (``strands/event_loop/streaming.py``, ``process_stream``); an
    ``aborted`` response while the run was not aborted has no such way. strands has no
    stop reason for ``error`` and no documented exception for a failed request. Runs
    that need either are set aside (``NotExpressibleError``).
    """
    import logging
    import threading

    from strands import Agent, tool
    from strands.models.model import Model
    from strands.types.exceptions import MaxTokensReachedException

    from statemachine.testing.conformance import NotExpressibleError

    # strands logs a warning for each unknown tool and dropped block: its own business,
    # not the run's output (the history shows what it did).
    logging.getLogger("strands").addHandler(logging.NullHandler())
    stops = {
        sm.messages.StopReason.STOP: "end_turn",
        sm.messages.StopReason.TOOL_USE: "tool_use",
        sm.messages.StopReason.LENGTH: "max_tokens",
    }

    def signature(content: Sequence[Any]) -> str:
        """What an assistant message says, to find the model's own message again."""
        said: list[list[Any]] = []
        for block in content:
            if isinstance(block, sm.TextContent):
                said.append(["text", block.text])
            elif isinstance(block, sm.ToolCall):
                said.append(["call", block.id, block.name, block.arguments_dict()])
            elif isinstance(block, dict) and "text" in block:
                said.append(["text", block["text"]])
            elif isinstance(block, dict) and "toolUse" in block:
                use = block["toolUse"]
                said.append(["call", use["toolUseId"], use["name"], use["input"]])
        return json.dumps(said, sort_keys=True)

    def to_strands(history: Sequence[sm.Message]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in history:
            if isinstance(m, sm.UserMessage):
                out.append({"role": "user", "content": [{"text": _user_text(m)}]})
            elif isinstance(m, sm.AssistantMessage):
                content: list[dict[str, Any]] = []
                for block in m.content:
                    if isinstance(block, sm.TextContent) and block.text:
                        content.append({"text": block.text})
                    elif isinstance(block, sm.ToolCall):
                        use = {"toolUseId": block.id, "name": block.name}
                        content.append({"toolUse": use | {"input": block.arguments_dict()}})
                out.append({"role": "assistant", "content": content})
            else:
                result = {
                    "toolUseId": m.tool_call_id,
                    "status": "error" if m.is_error else "success",
                    "content": [{"text": m.text}],
                }
                last = out[-1] if out else None
                if (
                    last
                    and last["role"] == "user"
                    and all("toolResult" in b for b in last["content"])
                ):
                    last["content"].append({"toolResult": result})
                else:
                    out.append({"role": "user", "content": [{"toolResult": result}]})
        return out

    def from_strands(
        history: Sequence[Any], said: Sequence[sm.AssistantMessage]
    ) -> list[sm.Message]:
        """strands' history in the kit's types. ``said`` holds the assistant messages
        of the input history and the model's responses, in order: an assistant message
        that says what the next of them said is that message (with its stop reason,
        which strands keeps nowhere); one that says something else is built from what
        strands holds."""
        out: list[sm.Message] = []
        # A toolResult has no name: it is its call's, the oldest call with its id that
        # no result has answered yet.
        names: dict[str, list[str]] = {}
        next_said = 0
        for m in history:
            content = m.get("content", [])
            if m["role"] == "assistant":
                for block in content:
                    if "toolUse" in block:
                        use = block["toolUse"]
                        names.setdefault(use["toolUseId"], []).append(use["name"])
                key = signature(content)
                found = next(
                    (i for i in range(next_said, len(said)) if signature(said[i].content) == key),
                    None,
                )
                if found is not None:
                    out.append(said[found])
                    next_said = found + 1
                    continue
                blocks: list[Any] = []
                for block in content:
                    if "text" in block:
                        blocks.append(sm.TextContent(block["text"]))
                    elif "toolUse" in block:
                        use = block["toolUse"]
                        blocks.append(sm.ToolCall(use["toolUseId"], use["name"], use["input"]))
                calls = any(isinstance(b, sm.ToolCall) for b in blocks)
                out.append(
                    sm.AssistantMessage(tuple(blocks), stop_reason="toolUse" if calls else "stop")
                )
                continue
            texts = [b["text"] for b in content if "text" in b]
            results = [b["toolResult"] for b in content if "toolResult" in b]
            for result in results:
                text = "\n".join(c["text"] for c in result.get("content", []) if "text" in c)
                call_id = result["toolUseId"]
                unanswered = names.get(call_id) or [""]  # the oldest call not answered yet
                out.append(
                    sm.ToolResultMessage(
                        call_id,
                        unanswered.pop(0) if unanswered != [""] else "",
                        text,
                        is_error=result.get("status") == "error",
                    )
                )
            if texts or not results:
                out.append(sm.UserMessage("".join(texts)))
        return out

    class KitModel(Model):
        """The kit's scripted model in strands' model interface."""

        def __init__(
            self,
            model: Any,
            definitions: list[Any],
            signal: sm.AbortSignal,
            said: list[sm.AssistantMessage],
            unsaid: list[str],
        ) -> None:
            self.kit, self.definitions, self.signal = model, definitions, signal
            self.said, self.unsaid = said, unsaid

        def update_config(self, **model_config: Any) -> None:
            pass

        def get_config(self) -> Any:
            return {}

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the kit's scenarios ask for no structured output")

        async def stream(
            self,
            messages: Any,
            tool_specs: Any = None,
            system_prompt: Any = None,
            **kwargs: Any,
        ) -> Any:
            sent = tuple(from_strands(messages, self.said))
            reply = await self.kit.complete(sent, self.definitions, self.signal)
            why = None
            if reply.stop_reason is sm.messages.StopReason.ERROR:
                why = (
                    "strands has no stop reason, and no documented exception, for a failed request"
                )
            elif reply.stop_reason is sm.messages.StopReason.ABORTED and not self.signal.aborted:
                # strands hears of an aborted request only through the run's cancel_signal
                why = "strands has no way to say a request was aborted when the run was not"
            if why is not None:
                self.unsaid.append(why)
                raise NotExpressibleError(why)
            self.said.append(reply)
            yield {"messageStart": {"role": "assistant"}}
            for block in reply.content:
                if isinstance(block, sm.TextContent) and block.text:
                    yield {"contentBlockDelta": {"delta": {"text": block.text}}}
                    yield {"contentBlockStop": {}}
                elif isinstance(block, sm.ToolCall):
                    use = {"toolUseId": block.id, "name": block.name}
                    yield {"contentBlockStart": {"start": {"toolUse": use}}}
                    arguments = json.dumps(block.arguments_dict())
                    yield {"contentBlockDelta": {"delta": {"toolUse": {"input": arguments}}}}
                    yield {"contentBlockStop": {}}
            if reply.stop_reason is sm.messages.StopReason.ABORTED:
                return  # a provider that aborts in flight ends without messageStop
            yield {"messageStop": {"stopReason": stops[reply.stop_reason]}}
            usage = {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}
            yield {"metadata": {"usage": usage, "metrics": {"latencyMs": 0}}}

    def declare(kit_tool: sm.Tool, signal: sm.AbortSignal) -> Any:
        async def run(key: str, count: int | None = None) -> str:
            return await _output_text(kit_tool, _arguments(key, count), signal)

        run.__doc__ = KEY_DESCRIPTION
        return tool(name=kit_tool.definition.name, description=KEY_DESCRIPTION)(run)

    async def loop(
        *,
        model: Any,
        tools: Sequence[sm.Tool],
        messages: Sequence[sm.Message],
        max_turns: int,
        signal: sm.AbortSignal,
    ) -> list[sm.Message]:
        said = [m for m in messages if isinstance(m, sm.AssistantMessage)]
        unsaid: list[str] = []
        definitions = [t.definition for t in tools]
        before, prompt = _split_history(messages)
        agent = Agent(
            model=KitModel(model, definitions, signal, said, unsaid),
            messages=to_strands(before),  # type: ignore[arg-type]
            tools=[declare(t, signal) for t in tools],
            callback_handler=None,  # the default handler prints the stream
        )
        # strands' documented cancellation from outside the agent: a cancel_signal.
        cancel = threading.Event()
        remove = signal.add_listener(lambda _: cancel.set())
        try:
            await agent.invoke_async(prompt, limits={"turns": max_turns}, cancel_signal=cancel)
        except MaxTokensReachedException:
            pass  # documented for a max_tokens stop: the history holds the partial message
        except Exception:
            if unsaid:
                raise NotExpressibleError(unsaid[0]) from None
            raise
        finally:
            remove()
        return from_strands(agent.messages, said)

    return loop


# -- autogen-agentchat -----------------------------------------------------------------


def autogen_loop() -> Any:
    """autogen-agentchat's ``AssistantAgent`` with its own tool loop
    (``max_tool_iterations=max_turns``), the kit's model as a ``ChatCompletionClient``
    and the abort as the run's ``CancellationToken``.

    autogen hands its run's token to the model client, and its clients link the request
    to it (``cancellation_token.link_future``), so that cancelling the run cancels the
    request in flight: the adapter's client does the same with the kit's model call. A
    client that kept the token unused would let a model that ignores the abort answer,
    and autogen would run the calls of a cancelled run: a defect of the adapter. The
    tools are ``FunctionTool``s over typed functions; autogen's workbench links each
    call to the same token. A response is either text or calls in autogen
    (``CreateResult.content``), so the model's own message is kept beside it.
    """
    from autogen_agentchat.agents import AssistantAgent
    from autogen_core import CancellationToken, FunctionCall
    from autogen_core.model_context import UnboundedChatCompletionContext
    from autogen_core.models import (
        AssistantMessage,
        ChatCompletionClient,
        CreateResult,
        FunctionExecutionResult,
        FunctionExecutionResultMessage,
        LLMMessage,
        ModelFamily,
        ModelInfo,
        RequestUsage,
        UserMessage,
    )
    from autogen_core.tools import FunctionTool

    from statemachine.testing.conformance import NotExpressibleError

    stop_reason = sm.messages.StopReason
    finish = {
        stop_reason.STOP: "stop",
        stop_reason.TOOL_USE: "function_calls",
        stop_reason.LENGTH: "length",
    }
    usage = RequestUsage(prompt_tokens=0, completion_tokens=0)

    def to_autogen(history: Sequence[sm.Message]) -> tuple[list[LLMMessage], dict[int, Any]]:
        """The kit's history in autogen's model messages, and for each of them the kit
        messages it stands for (by ``id``), to read it back exactly."""
        out: list[LLMMessage] = []
        kit: dict[int, list[sm.Message]] = {}
        for m in history:
            if isinstance(m, sm.UserMessage):
                out.append(UserMessage(content=_user_text(m), source="user"))
            elif isinstance(m, sm.AssistantMessage):
                calls = [
                    FunctionCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments_dict()))
                    for c in m.tool_calls
                ]
                out.append(AssistantMessage(content=calls or _text(m), source="assistant"))
            else:
                result = FunctionExecutionResult(
                    content=m.text, name=m.tool_name, call_id=m.tool_call_id, is_error=m.is_error
                )
                last = out[-1] if out else None
                if isinstance(last, FunctionExecutionResultMessage):
                    last.content.append(result)
                    kit[id(last)].append(m)
                    continue
                out.append(FunctionExecutionResultMessage(content=[result]))
            kit[id(out[-1])] = [m]
        return out, kit

    def from_autogen(
        history: Sequence[LLMMessage], kit: dict[int, Any], said: Sequence[sm.AssistantMessage]
    ) -> list[sm.Message]:
        """autogen's model context in the kit's messages: the input as it was given, each
        response as the model gave it (autogen adds one assistant message per model
        call, in order), the rest translated."""
        out: list[sm.Message] = []
        responses = iter(said)
        for m in history:
            if id(m) in kit:
                out += kit[id(m)]
            elif isinstance(m, UserMessage):
                out.append(sm.UserMessage(str(m.content)))
            elif isinstance(m, AssistantMessage):
                out.append(next(responses))
            elif isinstance(m, FunctionExecutionResultMessage):
                out += [
                    sm.ToolResultMessage(r.call_id, r.name, r.content, is_error=bool(r.is_error))
                    for r in m.content
                ]
        return out

    class KitClient(ChatCompletionClient):
        """The kit's scripted model as an autogen model client."""

        def __init__(
            self,
            model: Any,
            definitions: Sequence[Any],
            signal: sm.AbortSignal,
            kit: dict[int, Any],
        ) -> None:
            self.model, self.definitions, self.signal, self.kit = model, definitions, signal, kit
            self.said: list[sm.AssistantMessage] = []

        async def create(
            self,
            messages: Sequence[LLMMessage],
            *,
            tools: Sequence[Any] = (),
            tool_choice: Any = "auto",
            json_output: Any = None,
            extra_create_args: Any = None,
            cancellation_token: CancellationToken | None = None,
        ) -> CreateResult:
            sent = from_autogen(messages, self.kit, self.said)
            asked = self.model.complete(sent, self.definitions, self.signal)
            request = asyncio.ensure_future(asked)
            if cancellation_token is not None:
                # As autogen's own clients do: cancelling the run cancels the request.
                cancellation_token.link_future(request)
            reply: sm.AssistantMessage = await request
            if reply.stop_reason is stop_reason.ABORTED:
                if cancellation_token is not None and cancellation_token.is_cancelled():
                    # A cancelled request, as autogen's own clients end one.
                    raise asyncio.CancelledError
                raise NotExpressibleError(
                    "autogen's model client has no way to say a request was aborted when "
                    "the run was not cancelled"
                )
            if reply.stop_reason is stop_reason.ERROR:
                raise NotExpressibleError(
                    "autogen's ChatCompletionClient documents no exception for a failed request"
                )
            self.said.append(reply)
            calls = [
                FunctionCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments_dict()))
                for c in reply.tool_calls
            ]
            return CreateResult(
                finish_reason=finish[reply.stop_reason],  # type: ignore[arg-type]
                content=calls or _text(reply),
                usage=usage,
                cached=False,
            )

        def create_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the adapter runs AssistantAgent without streaming")

        async def close(self) -> None:
            return None

        def actual_usage(self) -> RequestUsage:
            return usage

        def total_usage(self) -> RequestUsage:
            return usage

        def count_tokens(self, messages: Sequence[LLMMessage], **_: Any) -> int:
            return 0

        def remaining_tokens(self, messages: Sequence[LLMMessage], **_: Any) -> int:
            return 1_000_000

        @property
        def capabilities(self) -> Any:
            return self.model_info

        @property
        def model_info(self) -> ModelInfo:
            return ModelInfo(
                vision=False,
                function_calling=True,
                json_output=False,
                family=ModelFamily.UNKNOWN,
                structured_output=False,
                multiple_system_messages=True,
            )

    def declare(tool: sm.Tool, signal: sm.AbortSignal) -> Any:
        async def run(key: str, count: int | None = None) -> str:
            return await _output_text(tool, _arguments(key, count), signal)

        return FunctionTool(run, description=KEY_DESCRIPTION, name=tool.definition.name)

    async def loop(
        *,
        model: Any,
        tools: Sequence[sm.Tool],
        messages: Sequence[sm.Message],
        max_turns: int,
        signal: sm.AbortSignal,
    ) -> list[sm.Message]:
        before, prompt = _split_history(messages)
        context, kit = to_autogen(before)
        client = KitClient(model, [t.definition for t in tools], signal, kit)
        agent = AssistantAgent(
            "peer",
            model_client=client,
            tools=[declare(t, signal) for t in tools],
            model_context=UnboundedChatCompletionContext(initial_messages=context),
            system_message=None,
            max_tool_iterations=max_turns,
        )
        # autogen's documented cancellation: the run's CancellationToken. A cancelled
        # run ends with CancelledError; its model context holds what it completed.
        token = CancellationToken()
        running = asyncio.get_running_loop()

        def cancel(_: object) -> None:
            running.call_soon_threadsafe(token.cancel)  # abort() may come from any thread

        remove = signal.add_listener(cancel)
        try:
            await agent.run(task=prompt, cancellation_token=token)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if (current is not None and current.cancelling()) or not token.is_cancelled():
                raise  # the kit cancelled us (a run past its time): not the abort
        finally:
            remove()
        return from_autogen(await agent.model_context.get_messages(), kit, client.said)

    return loop


LOOPS: dict[str, Callable[[], Any]] = {
    "PydanticAI": pydantic_ai_loop,
    "OpenAI Agents SDK": openai_agents_loop,
    "LangGraph": langgraph_loop,
    "smolagents": smolagents_loop,
    "strands-agents": strands_loop,
    "autogen-agentchat": autogen_loop,
}

assert KNOWN_TOOLS == ("alpha", "beta")  # the adapters declare the kit's one tool schema
