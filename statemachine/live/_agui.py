"""A run's events as AG-UI events: what one watcher of a live run receives.

``AguiStream`` turns the ``RunEvent``s of one subscriber (``AgentRun.events()``) into
the events of the AG-UI protocol (the ``ag-ui-protocol`` package's models), so that an
AG-UI client can watch a run of this library as it would any agent:

======================  ==================================================================
run event               AG-UI events
======================  ==================================================================
(on subscribing)        ``RUN_STARTED``; ``MESSAGES_SNAPSHOT`` of the history so far;
                        ``STATE_SNAPSHOT`` of the table's state
``TextDelta``           ``TEXT_MESSAGE_START`` (first of a message), ``TEXT_MESSAGE_CONTENT``
``ToolCallDelta``       ``TOOL_CALL_START`` (once its id and name are known)
``MessageAdded``        user: ``TEXT_MESSAGE_START/CONTENT/END`` (role user); assistant:
                        ``TEXT_MESSAGE_END`` (or the whole text when none was streamed),
                        then ``TOOL_CALL_START`` (if not streamed), ``TOOL_CALL_ARGS``
                        and ``TOOL_CALL_END`` for each call; tool result:
                        ``TOOL_CALL_RESULT``
``StateChanged``        ``STATE_DELTA`` (``/state``, ``/turn``, ``/last``: replace only)
``TurnStarted/Ended``   ``STEP_STARTED/FINISHED`` named ``turn N``
``ToolStarted/Ended``,  ``CUSTOM`` named ``statemachine.toolStarted``, ``.toolEnded``,
``ToolProgress/Log``    ``.toolProgress``, ``.toolLog``
``EventsDropped``       ``CUSTOM`` ``statemachine.eventsDropped`` (``{"count": n}``)
``RunReturned``         ``STATE_DELTA``, then ``RUN_FINISHED`` (``Done``: success;
                        ``AwaitingUser``: an interrupt; ``Aborted``: cancelled) or
                        ``RUN_ERROR`` (the other ends; ``code`` is the state's name)
======================  ==================================================================

Why a tool call's arguments go out whole, at the end of the model's response, and not
fragment by fragment: AG-UI requires the ``TOOL_CALL_ARGS`` of one call to concatenate
into valid JSON, under the call's final id. A watcher that lags loses fragments
(``EventsDropped``), and the engine may give a call a new id (empty or repeated ids are
normalised), so streamed fragments could break both. The call's start still shows live.

A text whose fragments were dropped, or that the model's final message does not
continue, is repaired with a ``MESSAGES_SNAPSHOT`` of the history up to that message:
the protocol's own way to resynchronise a client.

Every state change is sent as ``replace`` operations of a fixed document
(``{"state", "turn", "last"}``), so a lost ``STATE_DELTA`` never leaves a client with a
wrong state: the next one carries the whole of it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from ag_ui.core import (
    AssistantMessage as AguiAssistantMessage,
)
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    FunctionCall,
    Interrupt,
    MessagesSnapshotEvent,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
)
from ag_ui.core import (
    ToolCall as AguiToolCall,
)
from ag_ui.core import (
    UserMessage as AguiUserMessage,
)

from statemachine.agent.events import (
    EventsDropped,
    MessageAdded,
    RunEvent,
    RunReturned,
    StateChanged,
    TextDelta,
    ToolAnswered,
    ToolAsked,
    ToolCallDelta,
    ToolEnded,
    ToolLog,
    ToolProgress,
    ToolQuestion,
    ToolStarted,
    TurnEnded,
    TurnStarted,
)
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    thaw_json,
)
from statemachine.core.table import State, TurnState
from statemachine.errors import InvalidInputError

__all__ = ["CUSTOM_PREFIX", "AguiStream", "agui_messages", "library_messages", "table_state"]

CUSTOM_PREFIX: Final = "statemachine."
"""The namespace of the ``CUSTOM`` events a live run sends."""

_MAX_CUSTOM_TEXT: Final = 2000  # a tool's progress or log data, as text, at most


def table_state(state: State, turn: int, last: Sequence[str] | None = None) -> dict[str, Any]:
    """The AG-UI state of a run: where it is in the transition table."""
    return {"state": state.value, "turn": turn, "last": list(last) if last else None}


def _message_id(run_id: str, index: int) -> str:
    return f"{run_id}:{index}"


def _arguments(arguments: Any) -> str:
    return json.dumps(thaw_json(arguments), ensure_ascii=False, separators=(",", ":"))


def agui_messages(run_id: str, history: Sequence[Message]) -> list[Any]:
    """The history as AG-UI messages, each with the id its live events carry."""
    out: list[Any] = []
    for index, message in enumerate(history):
        mid = _message_id(run_id, index)
        if isinstance(message, UserMessage):
            text = "\n".join(getattr(b, "text", "") for b in message.content)
            out.append(AguiUserMessage(id=mid, content=text))
        elif isinstance(message, AssistantMessage):
            calls = [
                AguiToolCall(
                    id=c.id,
                    function=FunctionCall(name=c.name, arguments=_arguments(c.arguments)),
                )
                for c in message.tool_calls
            ]
            out.append(
                AguiAssistantMessage(id=mid, content=message.text or None, tool_calls=calls or None)
            )
        elif isinstance(message, ToolResultMessage):
            out.append(ToolMessage(id=mid, content=message.text, tool_call_id=message.tool_call_id))
    return out


class AguiStream:
    """The AG-UI events of one watcher of one run, built event by event.

    ``opening`` is what a watcher gets first, whenever it joins: the run's start, its
    history so far and its state; ``convert`` maps each later ``RunEvent``.
    """

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self._seen = 0  # messages of the history this watcher has been told of
        self._text: str | None = None  # the id of the open text message
        self._streamed = ""  # its text, as streamed
        self._broken = False  # fragments were dropped since the text opened
        self._calls: dict[int, str] = {}  # the open streamed calls: index -> call id
        self._step: str | None = None  # the open step's name
        self.ended = False

    def opening(
        self,
        history: Sequence[Message],
        state: State,
        turn: int,
        questions: Sequence[ToolQuestion] = (),
    ) -> list[BaseEvent]:
        """What a watcher is told first: the run, its history, its state, and the
        questions its running tools wait on (asked before the watcher came)."""
        self._seen = len(history)
        events: list[BaseEvent] = [
            RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id, protocol_version="1.0")
        ]
        if history:
            events.append(MessagesSnapshotEvent(messages=agui_messages(self.run_id, history)))
        events.append(StateSnapshotEvent(snapshot=table_state(state, turn)))
        return events + [_question("toolAsked", q) for q in questions]

    def convert(
        self,
        event: RunEvent,
        history: Sequence[Message],
        waiting: Sequence[tuple[ToolCall, str]] = (),
    ) -> list[BaseEvent]:
        """The AG-UI events of ``event``; ``history`` is the run's (read for a repair),
        ``waiting`` the calls that wait for approval (read at its end)."""
        if isinstance(event, TextDelta):
            return self._text_delta(event)
        if isinstance(event, ToolCallDelta):
            return self._tool_call_delta(event)
        if isinstance(event, MessageAdded):
            return self._message(event, history)
        if isinstance(event, StateChanged):
            r = event.record
            last = (r.source.value, r.trigger.value, r.dest.value)
            return [_state_delta(table_state(r.dest, r.turn, last))]
        if isinstance(event, TurnStarted):
            return [*self._close_step(), self._open_step(f"turn {event.turn}")]
        if isinstance(event, TurnEnded):
            return self._close_step()
        if isinstance(event, EventsDropped):
            self._broken = self._text is not None
            return [_custom("eventsDropped", {"count": event.count})]
        if isinstance(event, RunReturned):
            return self._returned(event, waiting)
        return self._custom(event)

    # -- text and tool calls ------------------------------------------------------------

    def _text_delta(self, event: TextDelta) -> list[BaseEvent]:
        events: list[BaseEvent] = []
        if self._text is None:
            self._text = _message_id(self.run_id, self._seen)
            self._streamed = ""
            events.append(TextMessageStartEvent(message_id=self._text, role="assistant"))
        self._streamed += event.text
        events.append(TextMessageContentEvent(message_id=self._text, delta=event.text))
        return events

    def _tool_call_delta(self, event: ToolCallDelta) -> list[BaseEvent]:
        if event.index in self._calls or not event.call_id or not event.name:
            return []
        if event.call_id in self._calls.values():
            return []  # a repeated id: the engine renames it; the message starts it
        self._calls[event.index] = event.call_id
        parent = _message_id(self.run_id, self._seen)
        return [
            ToolCallStartEvent(
                tool_call_id=event.call_id, tool_call_name=event.name, parent_message_id=parent
            )
        ]

    def _message(self, event: MessageAdded, history: Sequence[Message]) -> list[BaseEvent]:
        message, index = event.message, event.index
        self._seen = index + 1
        mid = _message_id(self.run_id, index)
        if isinstance(message, UserMessage):
            text = "\n".join(getattr(b, "text", "") for b in message.content)
            return [
                TextMessageStartEvent(message_id=mid, role="user"),
                *([TextMessageContentEvent(message_id=mid, delta=text)] if text else []),
                TextMessageEndEvent(message_id=mid),
            ]
        if isinstance(message, ToolResultMessage):
            return [
                ToolCallResultEvent(
                    message_id=mid,
                    tool_call_id=message.tool_call_id,
                    content=message.text,
                    role="tool",
                    metadata={"statemachine": {"isError": message.is_error}},
                )
            ]
        if isinstance(message, AssistantMessage):
            return self._assistant(message, mid, history[: index + 1])
        return []

    def _assistant(
        self, message: AssistantMessage, mid: str, history: Sequence[Message]
    ) -> list[BaseEvent]:
        events: list[BaseEvent] = []
        text = message.text
        repair = False
        if self._text is not None:
            rest = text[len(self._streamed) :] if text.startswith(self._streamed) else None
            if rest:
                events.append(TextMessageContentEvent(message_id=self._text, delta=rest))
            events.append(TextMessageEndEvent(message_id=self._text))
            # Lost fragments, a text the message does not continue, or another id.
            repair = self._broken or rest is None or self._text != mid
        elif text:
            events += [
                TextMessageStartEvent(message_id=mid, role="assistant"),
                TextMessageContentEvent(message_id=mid, delta=text),
                TextMessageEndEvent(message_id=mid),
            ]
        self._text, self._streamed, self._broken = None, "", False
        # Matched by id: a call's place in the stream is the client's to number.
        streamed = set(self._calls.values())
        self._calls.clear()
        for call in message.tool_calls:
            if call.id in streamed:
                streamed.discard(call.id)
            else:
                events.append(
                    ToolCallStartEvent(
                        tool_call_id=call.id, tool_call_name=call.name, parent_message_id=mid
                    )
                )
            events += [
                ToolCallArgsEvent(tool_call_id=call.id, delta=_arguments(call.arguments)),
                ToolCallEndEvent(tool_call_id=call.id),
            ]
        # Calls that were streamed but are not in the message (cut off by an abort, or
        # renamed): closed without arguments, and the snapshot below says what holds.
        for call_id in sorted(streamed):
            events.append(ToolCallEndEvent(tool_call_id=call_id))
            repair = True
        if repair:
            events.append(MessagesSnapshotEvent(messages=agui_messages(self.run_id, history)))
        return events

    # -- steps, custom events, the end --------------------------------------------------

    def _open_step(self, name: str) -> BaseEvent:
        self._step = name
        return StepStartedEvent(step_name=name)

    def _close_step(self) -> list[BaseEvent]:
        if self._step is None:
            return []
        name, self._step = self._step, None
        return [StepFinishedEvent(step_name=name)]

    def _custom(self, event: RunEvent) -> list[BaseEvent]:
        if isinstance(event, ToolStarted):
            call = event.call
            return [_custom("toolStarted", {"callId": call.id, "name": call.name})]
        if isinstance(event, ToolEnded):
            value = {
                "callId": event.call.id,
                "name": event.call.name,
                "seconds": round(event.seconds, 3),
                "isError": event.output.is_error,
                "cancelled": event.cancelled,
                "abandoned": event.abandoned,
            }
            return [_custom("toolEnded", value)]
        if isinstance(event, ToolProgress):
            return [_custom("toolProgress", {"callId": event.call_id, "data": _data(event.data)})]
        if isinstance(event, ToolLog):
            value = {"callId": event.call_id, "level": event.level, "data": _data(event.data)}
            return [_custom("toolLog", value)]
        if isinstance(event, ToolAsked):  # answered by POST /runs/ID/answer
            return [_question("toolAsked", event.question)]
        if isinstance(event, ToolAnswered):
            return [_question("toolAnswered", event.question, event.outcome)]
        return []  # RunStarted: the opening said it

    def _returned(
        self, event: RunReturned, waiting: Sequence[tuple[ToolCall, str]]
    ) -> list[BaseEvent]:
        events: list[BaseEvent] = []
        if self._text is not None:
            events.append(TextMessageEndEvent(message_id=self._text))
            self._text = None
        events += [ToolCallEndEvent(tool_call_id=c) for c in self._calls.values()]
        self._calls.clear()
        events += self._close_step()
        self.ended = True
        end = run_end(self.thread_id, self.run_id, event.state, event.explanation, waiting)
        events.append(end)
        return events


def run_end(
    thread_id: str,
    run_id: str,
    state: State,
    explanation: str,
    waiting: Sequence[tuple[ToolCall, str]] = (),
) -> BaseEvent:
    """``RUN_FINISHED`` or ``RUN_ERROR`` for a run that returned in ``state``; a run
    ``AwaitingUser`` has one interrupt per call ``waiting`` for approval (its id is the
    call's id; ``POST /runs/ID/approve``, or a ``RunAgentInput`` whose ``resume``
    answers it, goes on), or one for the person's next message. Any other end, a state
    a team's steps declared included, is ``RUN_ERROR`` with the state's name as code."""
    outcome: RunFinishedOutcome
    if state is TurnState.DONE:
        outcome = RunFinishedSuccessOutcome()
    elif state is TurnState.ABORTED:
        outcome = RunFinishedCancelledOutcome()
    elif state is TurnState.AWAITING_USER:
        interrupts = [
            Interrupt(
                id=call.id,
                reason="tool_approval",
                tool_call_id=call.id,
                message=f"approve {call.name}({_arguments(call.arguments)})? {reason}".strip(),
            )
            for call, reason in waiting
        ] or [Interrupt(id=f"{run_id}:input", reason="awaiting_user", message=explanation)]
        outcome = RunFinishedInterruptOutcome(interrupts=interrupts)
    else:
        return RunErrorEvent(message=explanation or state.value, code=state.value)
    return RunFinishedEvent(thread_id=thread_id, run_id=run_id, outcome=outcome)


def _state_delta(state: dict[str, Any]) -> StateDeltaEvent:
    # The patch operations are not exported by name: validated from their JSON shape.
    patch = [{"op": "replace", "path": f"/{key}", "value": value} for key, value in state.items()]
    return StateDeltaEvent.model_validate({"type": "STATE_DELTA", "delta": patch})


def _custom(name: str, value: Any) -> CustomEvent:
    return CustomEvent(name=CUSTOM_PREFIX + name, value=value)


def _question(name: str, q: ToolQuestion, outcome: str | None = None) -> CustomEvent:
    """A question a running tool asks (``toolAsked``), or how it ended (``toolAnswered``)."""
    value = {"id": q.id, "callId": q.call_id, "name": q.tool_name, "source": q.source}
    if outcome is not None:
        return _custom(name, {**value, "outcome": outcome})
    return _custom(name, {**value, "message": q.message, "schema": _data(q.schema), "url": q.url})


def _data(data: object) -> Any:
    """A tool's progress or log data as JSON (its text, cut, when it is not JSON)."""
    try:
        text = json.dumps(data)
    except (TypeError, ValueError):
        text = json.dumps(str(data))
    if len(text) > _MAX_CUSTOM_TEXT:
        return str(data)[:_MAX_CUSTOM_TEXT] + "…"
    return json.loads(text)


# -- AG-UI messages to the library's ----------------------------------------------------------


def library_messages(messages: list[Any]) -> list[Message]:
    """A ``RunAgentInput``'s conversation as the library's messages (user, assistant and
    tool messages; a system or developer message is refused: the agent's instructions
    are its own)."""
    out: list[Message] = []
    names: dict[str, str] = {}  # tool call id -> tool name
    for index, message in enumerate(messages):
        role = message.role
        if role == "user":
            content = message.content
            if not isinstance(content, str):
                texts = [getattr(p, "text", None) for p in content]
                if any(t is None for t in texts):
                    raise InvalidInputError(f"messages[{index}]: only text parts are taken")
                content = "\n".join(t for t in texts if t is not None)
            out.append(UserMessage(content))
        elif role == "assistant":
            blocks: list[Any] = [message.content] if message.content else []
            for call in message.tool_calls or ():
                try:
                    arguments = json.loads(call.function.arguments or "{}")
                except ValueError:
                    raise InvalidInputError(
                        f"messages[{index}]: tool call arguments are not JSON"
                    ) from None
                if not isinstance(arguments, dict):
                    raise InvalidInputError(f"messages[{index}]: arguments must be an object")
                names[call.id] = call.function.name
                blocks.append(ToolCall(call.id, call.function.name, arguments))
            out.append(AssistantMessage(blocks, stop_reason=StopReason.STOP))
        elif role == "tool":
            name = names.get(message.tool_call_id, "")
            content = message.content if isinstance(message.content, str) else ""
            out.append(ToolResultMessage(message.tool_call_id, name, content))
        else:
            raise InvalidInputError(
                f"messages[{index}]: role {role!r} is not taken (the agent's instructions "
                "are its own; send user, assistant and tool messages)",
            )
    if not out:
        raise InvalidInputError("messages: at least one message is needed")
    return out
