"""``AgentEngineMachine``: a Hypothesis stateful test to subclass for your own engine.

The machine fires valid and invalid engine events at an engine, in every order
Hypothesis can think of, and asserts the history invariants after each step:

* the history stays valid (I1 pairing, I2 order; the calls of the message being
  worked on may still be open) and append-only;
* an event the engine refuses leaves its history and state exactly as they were,
  and the refusal is one of ``refusal_errors``, never another exception (I8);
* a finished run absorbs every further event (I4), has an explanation, and has a
  result for every call (I1);
* at most ``max_turns`` model calls are made (I7).

The events are ``statemachine``'s own (``Start``, ``ModelResponded``,
``ToolFinished``, ``AbortRequested``...). The default hooks drive
``statemachine.Engine``; to check your engine, subclass and override the hooks,
translating each event into your engine's vocabulary::

    class MyEngineMachine(AgentEngineMachine):
        def new_engine(self, tools, messages, max_turns):
            self.engine = MyEngine(tools, messages, max_turns)
        def send(self, event): ...          # raise one of refusal_errors to refuse
        def history(self): return self.engine.messages
        def state(self): return self.engine.state
        def is_finished(self): return self.engine.done
        def explanation(self): return self.engine.why

    TestMyEngine = MyEngineMachine.TestCase

``awaiting_model()`` and ``running_call_ids()`` have defaults that follow the
actions your ``send`` reports through ``note_*``; override them if your engine can
answer directly.

With ``steps`` (``statemachine.core.steps.StepSpec``), the default engine runs on their
table, and while a step runs (``pending_step()``) the machine answers it with any of
its outcomes, or with one it did not declare (which must be refused).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from statemachine.core.engine import Engine
from statemachine.core.events import (
    AbortRequested,
    CallModel,
    Event,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    Start,
    StartTool,
    StepDecided,
    ToolCancelled,
    ToolFinished,
)
from statemachine.core.invariants import history_violations
from statemachine.core.messages import AssistantMessage, Message, StopReason, TextContent, ToolCall
from statemachine.core.steps import StepSpec, table_for
from statemachine.core.tools import ToolDefinition, ToolOutput
from statemachine.errors import ProtocolError
from statemachine.testing.scenario import _DEFINITIONS, DEFAULT_HISTORY, KNOWN_TOOLS, UNKNOWN_TOOL

__all__ = ["AgentEngineMachine", "assistant_messages"]


@st.composite
def assistant_messages(draw: st.DrawFn, *, max_calls: int = 3) -> AssistantMessage:
    """Model responses: text and tool calls (known, unknown, invalid arguments; unique,
    empty or repeated ids) with any stop reason."""
    calls = []
    for i in range(draw(st.integers(0, max_calls))):
        name = draw(st.sampled_from([*KNOWN_TOOLS, UNKNOWN_TOOL]))
        arguments: dict[str, Any] = {"key": f"k{i}"}
        if draw(st.booleans()):
            arguments["count"] = draw(st.sampled_from([1, "many"]))
        call_id = draw(st.sampled_from(["", "dup", f"c{i}", f"c{i}"]))
        calls.append(ToolCall(call_id, name, arguments))
    text = draw(st.sampled_from(["", "thinking aloud"]))
    content = ((TextContent(text),) if text else ()) + tuple(calls)
    return AssistantMessage(content, stop_reason=draw(st.sampled_from(list(StopReason))))


class AgentEngineMachine(RuleBasedStateMachine):
    """Fires events at an engine and checks the invariants after every step."""

    max_turns: int = 3
    """The turn limit the engine is built with."""

    refusal_errors: tuple[type[BaseException], ...] = (ProtocolError,)
    """What the engine raises to refuse an event it does not accept."""

    steps: tuple[StepSpec, ...] = ()
    """Declared steps the default engine runs with (``core/steps.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self._model_outstanding = False
        self._running: list[str] = []
        self.engine: Any = None
        self.new_engine(tuple(_DEFINITIONS.values()), DEFAULT_HISTORY, self.max_turns)
        self._input_length = len(self.history())
        self._previous: list[Message] = list(self.history())

    # -- hooks: override these to drive another engine ------------------------------------

    def new_engine(
        self, tools: Sequence[ToolDefinition], messages: Sequence[Message], max_turns: int
    ) -> None:
        """Build the engine under test."""
        table = table_for(self.steps)
        self.engine = Engine(tools=tools, messages=messages, max_turns=max_turns, table=table)

    def send(self, event: Event) -> None:
        """Hand one event to the engine; raise one of ``refusal_errors`` to refuse it.

        The default also reports the engine's actions through ``note_*``."""
        for action in self.engine.handle(event):
            if isinstance(action, CallModel):
                self.note_model_call()
            elif isinstance(action, StartTool):
                self.note_tool_started(action.call.id)

    def history(self) -> Sequence[Message]:
        """The engine's history as our messages."""
        messages: Sequence[Message] = self.engine.messages
        return messages

    def state(self) -> Hashable:
        """Anything that identifies the engine's state (compared before and after a
        refused event)."""
        return (self.engine.state, self.engine.turns)

    def is_finished(self) -> bool:
        """True once the run has ended (a terminal state)."""
        return bool(self.engine.state.is_terminal)

    def explanation(self) -> str | None:
        """Why the run ended, for a finished run."""
        text: str | None = self.engine.explanation
        return text

    def awaiting_model(self) -> bool:
        """True while a model call is outstanding."""
        return self._model_outstanding

    def running_call_ids(self) -> Sequence[str]:
        """Ids of started tool calls that have not reported."""
        return tuple(self._running)

    def pending_step(self) -> StepSpec | None:
        """The declared step the engine waits for now, if any."""
        ask = getattr(self.engine, "pending_step", None)
        step: StepSpec | None = ask() if ask is not None else None
        return step

    # -- bookkeeping for the default hooks ---------------------------------------------------

    def note_model_call(self) -> None:
        """Record that the engine asked for a model call."""
        self._model_outstanding = True

    def note_tool_started(self, call_id: str) -> None:
        """Record that the engine started a tool call."""
        self._running.append(call_id)

    def _deliver(self, event: Event, *, may_refuse: bool) -> None:
        before_history = list(self.history())
        before_state = self.state()
        try:
            self.send(event)
        except self.refusal_errors:
            assert may_refuse, f"the engine refused an event it must accept: {event!r}"
            assert list(self.history()) == before_history, "a refused event changed the history"
            assert self.state() == before_state, "a refused event changed the state"
            return
        if isinstance(event, (ModelResponded, ModelFailed, ModelCancelled)):
            self._model_outstanding = False
        if isinstance(event, (ToolFinished, ToolCancelled)) and event.call_id in self._running:
            self._running.remove(event.call_id)

    # -- rules -------------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self._deliver(Start(), may_refuse=False)

    @precondition(lambda self: self.awaiting_model() and not self.is_finished())
    @rule(message=assistant_messages())
    def model_responds(self, message: AssistantMessage) -> None:
        self._deliver(ModelResponded(message), may_refuse=False)

    @precondition(lambda self: self.awaiting_model() and not self.is_finished())
    @rule()
    def model_fails(self) -> None:
        self._deliver(ModelFailed("RuntimeError: provider unavailable"), may_refuse=False)

    @precondition(lambda self: bool(self.running_call_ids()) and not self.is_finished())
    @rule(data=st.data(), is_error=st.booleans())
    def tool_finishes(self, data: st.DataObject, is_error: bool) -> None:
        call_id = data.draw(st.sampled_from(list(self.running_call_ids())))
        output = ToolOutput(f"output of {call_id}", is_error=is_error)
        self._deliver(ToolFinished(call_id, output), may_refuse=False)

    @precondition(lambda self: self.pending_step() is not None and not self.is_finished())
    @rule(data=st.data(), message=st.sampled_from(["", "not like this"]))
    def step_decides(self, data: st.DataObject, message: str) -> None:
        step = self.pending_step()
        assert step is not None
        names = [name for name, _ in step.outcomes]
        outcome = data.draw(st.sampled_from([*names, "undeclared_outcome"]))
        event = StepDecided(step.name, outcome, message)
        self._deliver(event, may_refuse=outcome not in names)

    @rule(reason=st.sampled_from(["user pressed stop", "shutdown"]))
    def abort(self, reason: str) -> None:
        self._deliver(AbortRequested(reason), may_refuse=True)

    @rule(data=st.data())
    def cancel_outstanding(self, data: st.DataObject) -> None:
        """Valid only while aborting; otherwise it must be refused cleanly."""
        ids = list(self.running_call_ids())
        use_tool: bool = data.draw(st.booleans()) if ids else False
        if use_tool:
            self._deliver(ToolCancelled(data.draw(st.sampled_from(ids))), may_refuse=True)
        else:
            self._deliver(ModelCancelled(), may_refuse=True)

    @rule(
        event=st.one_of(
            st.builds(ModelResponded, assistant_messages(max_calls=1)),
            st.just(ModelFailed("late failure")),
            st.just(Start()),
            st.builds(
                ToolFinished,
                st.sampled_from(["nope", "", "c0"]),
                st.just(ToolOutput("stray")),
            ),
        )
    )
    def stray_event(self, event: Event) -> None:
        """An event that may not fit the current state: accepted or refused, never a crash."""
        was_finished = self.is_finished()
        before = list(self.history())
        self._deliver(event, may_refuse=True)
        if was_finished:
            assert list(self.history()) == before, "a finished run changed after an event"

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def history_is_valid_and_append_only(self) -> None:
        history = list(self.history())
        assert history[: len(self._previous)] == self._previous, "the history was rewritten"
        self._previous = history
        problems = history_violations(history, allow_open_tail=not self.is_finished())
        assert not problems, "; ".join(str(p) for p in problems)

    @invariant()
    def model_calls_within_the_limit(self) -> None:
        answers = sum(
            1 for m in list(self.history())[self._input_length :] if isinstance(m, AssistantMessage)
        )
        assert answers <= self.max_turns, (
            f"{answers} model responses with max_turns={self.max_turns}"
        )

    @invariant()
    def finished_runs_explain_themselves(self) -> None:
        if self.is_finished():
            text = self.explanation()
            assert isinstance(text, str), "a finished run has no explanation"
            assert text.strip(), "a finished run has an empty explanation"
