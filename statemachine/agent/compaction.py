"""Compaction: when the context outgrows a budget, the model is sent a summary of its
older part instead of the whole history.

Why a ``before_model`` step
===========================

Compaction decides what the *next* model call is sent, so it belongs just before that
call, and ``before_model`` is the one point of the loop (``core/steps.py``) where no
tool call is outstanding: every call of the last assistant message has its result.
There, cutting the history at a message boundary can never take away the result of a
call still running, and the step's outcomes are rows of the table like any team's
step: ``statemachine check`` explores them, the diagram draws the state
``Compaction`` and its outcomes, the journal records each decision. A hook
(``transform_context``) would do the same work out of the table's sight, with no
named outcome when it fails.

The history is never touched (I2): the engine keeps appending every message, the
journal keeps every one, and a replay rebuilds the same history whether or not a run
was compacted. What changes is the model's *view*: the summary, as one user message,
followed by the history from a cut on (``CompactionView``). The view of a call is
written in the run's events, so what the journal shows is what the model was sent
(``statemachine.steps.views_sent`` reads it back with a ``ViewReader``):

* ``kept`` (``GoOn``): the view is the whole history (within budget, or nothing can be
  cut without splitting a pair);
* ``compacted`` (``GoOn``): a new summary; the decision's message is ``"<cut>\\n<summary>"``
  (``CompactionView.to_message``), so the journal holds the summary and where it cuts;
* ``reused`` (``GoOn``): the view of this step's last ``compacted`` decision still holds
  (the model is sent the same summary and the history from the same cut on);
* ``failed`` (``End("CompactionFailed")`` by default): the summariser raised, ran past
  the step's ``timeout`` or gave a summary out of bounds (``CompactionError``). The run
  ends in a named state rather than sending the model a context known to be too long.

A call and its result are never split
=====================================

The cut is the largest index at or below the one the budget asks for at which every
tool call before the cut has its result before it (``safe_cut``): the cut moves back
towards the start, keeping more, never forward. A view given whole (a resumed journal,
a hand-made one) is checked by ``CompactionView.apply``, which refuses
(``CompactionError``) a cut that splits a pair or leaves a call without its result.

Budgets (documented defaults)
=============================

The step compacts when the view it would send holds more than ``max_messages``
messages (``DEFAULT_MAX_MESSAGES``) or more than ``max_tokens`` tokens
(``DEFAULT_MAX_TOKENS``). Tokens are counted by ``count_tokens(messages)`` when given,
else by ``reported_tokens``: the usage the last response of the view reported (what the
provider counted of the call that produced it) plus an estimate of four characters a
token for the messages after it. The newest ``keep_last`` messages
(``DEFAULT_KEEP_LAST``) are always sent as they are.

The summary comes from ``summarize``: a ``ModelClient`` (called without tools on the
messages being cut away and ``SUMMARY_PROMPT``) or a function of those messages, sync
or async, returning the text. Either way it is bounded like any model output: at most
``max_summary_chars`` characters (``DEFAULT_MAX_SUMMARY_CHARS``), never empty; a longer
one is refused (the ``failed`` outcome), not cut. A previous summary is part of what
the next summary summarises, so the view never holds two.

Each run keeps the last view of its compaction steps in the driver (``RunViews``); a
run resumed from a snapshot starts without it, sends the whole history (``kept``) and
compacts again when over budget. The summariser's own model calls are not part of the
run's usage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import attrs

from statemachine.agent.calls import call_hook
from statemachine.agent.model import ModelClient
from statemachine.agent.model_call import answer_of
from statemachine.agent.steps import Decision, Step
from statemachine.core.abort import AbortSignal
from statemachine.core.engine import Engine
from statemachine.core.events import Action, Event, ModelResponded, StepDecided
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    StopReason,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.steps import MAX_STEP_MESSAGE_CHARS, End, GoOn, Point
from statemachine.errors import CompactionError, InvalidInputError

__all__ = [
    "COMPACTION_OUTCOMES",
    "DEFAULT_COMPACTION_TIMEOUT",
    "DEFAULT_KEEP_LAST",
    "DEFAULT_MAX_MESSAGES",
    "DEFAULT_MAX_SUMMARY_CHARS",
    "DEFAULT_MAX_TOKENS",
    "SUMMARY_PREFIX",
    "SUMMARY_PROMPT",
    "CompactionView",
    "RunViews",
    "ViewReader",
    "compaction",
    "reported_tokens",
    "safe_cut",
    "splits_pair",
]

DEFAULT_MAX_TOKENS: Final = 100_000
"""Tokens of the view above which the step compacts."""
DEFAULT_MAX_MESSAGES: Final = 200
"""Messages of the view above which the step compacts."""
DEFAULT_KEEP_LAST: Final = 20
"""The newest messages always sent as they are (the cut may keep more, never fewer)."""
DEFAULT_MAX_SUMMARY_CHARS: Final = 8_000
"""The longest summary accepted; a longer one is the ``failed`` outcome."""
DEFAULT_COMPACTION_TIMEOUT: Final = 120.0
"""Seconds one compaction (the summarising call included) may take."""
SUMMARY_PREFIX: Final = "Summary of the conversation so far:\n"
"""What the summary's user message starts with, so the model reads it as such."""
SUMMARY_PROMPT: Final = (
    "Summarise the conversation above for your own later use: the user's goal, what "
    "was decided, what the tools returned that still matters, and what is left to do. "
    "Answer with the summary only, in at most {max_chars} characters."
)
"""The instruction appended to the messages a ``ModelClient`` summariser is sent."""

_CHARS_PER_TOKEN: Final = 4
# The summary and its cut share one step message: room for the cut's digits and a newline.
_MAX_SUMMARY_BOUND: Final = MAX_STEP_MESSAGE_CHARS - 32

Summarize: TypeAlias = ModelClient | Callable[..., Any]
"""A ``ModelClient``, or ``(messages) -> str`` (sync or async) over the messages cut away."""
CountTokens: TypeAlias = Callable[[Sequence[Message]], int]


# -- cutting without splitting -------------------------------------------------------------


def splits_pair(history: Sequence[Message], cut: int) -> bool:
    """True if cutting ``history`` at ``cut`` (dropping ``history[:cut]``) would split a
    tool call from its result, or drop a call whose result has not come yet."""
    opened: set[str] = set()
    for message in history[:cut]:
        if isinstance(message, AssistantMessage):
            opened.update(call.id for call in message.tool_calls)
        elif isinstance(message, ToolResultMessage):
            opened.discard(message.tool_call_id)
    return bool(opened)


def safe_cut(history: Sequence[Message], want: int) -> int:
    """The largest cut at or below ``want`` that splits no pair (0: none does)."""
    best, opened = 0, set[str]()
    for index, message in enumerate(history[: max(want, 0)], start=1):
        if isinstance(message, AssistantMessage):
            opened.update(call.id for call in message.tool_calls)
        elif isinstance(message, ToolResultMessage):
            opened.discard(message.tool_call_id)
        if not opened:
            best = index
    return best


@attrs.frozen
class CompactionView:
    """What the model is sent instead of the whole history: ``summary`` (as one user
    message) and the history from ``cut`` on."""

    cut: int
    summary: str

    def apply(self, history: Sequence[Message]) -> list[Message]:
        """The view of ``history``; ``CompactionError`` if the cut lies past the history
        or splits a call from its result."""
        if not 0 < self.cut <= len(history):
            raise CompactionError(
                f"a compaction cuts at message {self.cut}, but the history has {len(history)}"
            )
        if splits_pair(history, self.cut):
            raise CompactionError(
                f"a compaction cutting at message {self.cut} would split a tool call from "
                "its result; refused"
            )
        return [UserMessage(SUMMARY_PREFIX + self.summary), *history[self.cut :]]

    def to_message(self) -> str:
        """The step decision's message: ``"<cut>\\n<summary>"``."""
        return f"{self.cut}\n{self.summary}"

    @classmethod
    def from_message(cls, message: str) -> CompactionView:
        """Read a ``compacted`` decision's message back (``CompactionError`` if it is not one)."""
        head, sep, summary = message.partition("\n")
        if not sep or not head.isdigit() or not summary:
            raise CompactionError("a compacted decision's message is not '<cut>\\n<summary>'")
        return cls(int(head), summary)


def reported_tokens(messages: Sequence[Message]) -> int:
    """The tokens of ``messages`` as the provider last reported them: the usage of the
    last assistant message that has one, plus four characters a token for what follows
    it (everything, when no response reported usage)."""
    start, tokens = 0, 0
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage) and message.usage is not None:
            usage = message.usage
            tokens = usage.total_tokens or (
                usage.input + usage.output + usage.cache_read + usage.cache_write
            )
            start = index + 1
            break
    chars = sum(len(_text(m)) for m in messages[start:])
    return tokens + chars // _CHARS_PER_TOKEN


def _text(message: Message) -> str:
    text = "".join(getattr(block, "text", "") for block in message.content)
    if isinstance(message, AssistantMessage):  # a call's arguments are sent too
        text += "".join(str(call.arguments) for call in message.tool_calls)
    return text


# -- the step ------------------------------------------------------------------------------


@attrs.frozen
class _Compactor:
    """The compaction step's function, bound to a run's last view by ``RunViews``."""

    summarize: Summarize
    max_tokens: int
    max_messages: int
    keep_last: int
    max_summary_chars: int
    count_tokens: CountTokens | None

    def over_budget(self, view: Sequence[Message]) -> bool:
        if len(view) > self.max_messages:
            return True
        count = self.count_tokens or reported_tokens
        return count(view) > self.max_tokens

    async def __call__(self, history: Sequence[Message]) -> Decision:
        """The step's function when run outside a run's ``RunViews``: no previous view."""
        return await self.decide(None, history)

    async def decide(self, previous: CompactionView | None, history: Sequence[Message]) -> Decision:
        view = previous.apply(history) if previous is not None else list(history)
        unchanged = Decision("reused") if previous is not None else Decision("kept")
        if not self.over_budget(view):
            return unchanged
        start = previous.cut if previous is not None else 0
        cut = safe_cut(history, len(history) - self.keep_last)
        if cut <= start:  # nothing more can be cut without splitting a pair
            return unchanged
        dropped: list[Message] = [] if previous is None else [view[0]]
        dropped.extend(history[start:cut])
        summary = await self.summary_of(dropped)
        return Decision("compacted", CompactionView(cut, summary).to_message())

    async def summary_of(self, messages: Sequence[Message]) -> str:
        if _is_client(self.summarize):
            text = await self._ask_model(messages)
        else:
            function: Callable[..., Any] = self.summarize  # type: ignore[assignment]
            text = await call_hook(function, messages)
        if not isinstance(text, str) or not text.strip():
            raise CompactionError("the summariser gave no summary")
        if len(text) > self.max_summary_chars:
            raise CompactionError(
                f"the summary has {len(text)} characters; at most {self.max_summary_chars}"
            )
        return text

    async def _ask_model(self, messages: Sequence[Message]) -> str:
        prompt = SUMMARY_PROMPT.format(max_chars=self.max_summary_chars)
        client: Any = self.summarize
        # The step's task is cancelled on abort; this signal is the client's own.
        answer = await answer_of(
            client, client.complete([*messages, UserMessage(prompt)], (), AbortSignal())
        )
        if not isinstance(answer, AssistantMessage) or answer.stop_reason in (
            StopReason.ERROR,
            StopReason.ABORTED,
        ):
            raise CompactionError("the summarising model call failed")
        return answer.text


def _is_client(summarize: object) -> bool:
    """A model client is told apart from a function by its ``complete`` method."""
    return callable(getattr(summarize, "complete", None))


def _count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidInputError(f"compaction: {name} must be an int of at least {low}")
    return value


def compaction(
    summarize: Summarize,
    *,
    name: str = "compaction",
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_messages: int = DEFAULT_MAX_MESSAGES,
    keep_last: int = DEFAULT_KEEP_LAST,
    max_summary_chars: int = DEFAULT_MAX_SUMMARY_CHARS,
    count_tokens: CountTokens | None = None,
    state: str = "CompactionFailed",
    explanation: str = "the history could not be compacted",
    timeout: float = DEFAULT_COMPACTION_TIMEOUT,
) -> Step:
    """A ``before_model`` step that compacts the model's view of the history (module
    docstring): outcomes ``kept``, ``compacted``, ``reused`` (go on) and ``failed``
    (the run ends in ``state``)."""
    if not callable(summarize) and not _is_client(summarize):
        raise InvalidInputError("compaction: summarize must be a ModelClient or a function")
    _count("max_summary_chars", max_summary_chars, 1)
    if max_summary_chars > _MAX_SUMMARY_BOUND:
        raise InvalidInputError(
            f"compaction: max_summary_chars is at most {_MAX_SUMMARY_BOUND} "
            "(a step's message carries it)"
        )
    if count_tokens is not None and not callable(count_tokens):
        raise InvalidInputError("compaction: count_tokens must be a function of the messages")
    compactor = _Compactor(
        summarize,
        _count("max_tokens", max_tokens, 1),
        _count("max_messages", max_messages, 2),
        _count("keep_last", keep_last, 0),
        max_summary_chars,
        count_tokens,
    )
    if keep_last >= max_messages:
        raise InvalidInputError(
            f"compaction: keep_last ({keep_last}) must be below max_messages ({max_messages}), "
            "or the view could never be made short enough"
        )

    return Step(
        name,
        Point.BEFORE_MODEL,
        _outcomes(state, explanation),
        compactor,
        on_error="failed",
        timeout=timeout,
    )


def _outcomes(state: str, explanation: str) -> Mapping[str, GoOn | End]:
    return {
        "kept": GoOn(),
        "compacted": GoOn(),
        "reused": GoOn(),
        "failed": End(state, explanation),
    }


# -- one run's views -----------------------------------------------------------------------


class RunViews:
    """The views of one run's compaction steps: binds each step to its last view before
    it is called, learns the new view from its decision, and gives the view the model
    is sent (``view``)."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self._compactors = {s.name: s.function for s in steps if isinstance(s.function, _Compactor)}
        self._views: dict[str, CompactionView] = {}

    @property
    def active(self) -> bool:
        """True if the run has a compaction step (its model calls go through ``view``)."""
        return bool(self._compactors)

    def bind(self, step: Step) -> Step:
        """``step``, called with this run's last view when it is a compaction step."""
        compactor = self._compactors.get(step.name)
        if compactor is None:
            return step
        previous = self._views.get(step.name)

        async def bound(messages: Sequence[Message]) -> Decision:
            return await compactor.decide(previous, messages)

        spec = step.spec
        return Step(
            spec.name,
            spec.point,
            dict(spec.outcomes),
            bound,
            on_error=spec.on_error,
            timeout=step.timeout,
        )

    def note(self, event: StepDecided) -> None:
        """Learn the view a compaction step's decision makes."""
        if event.step not in self._compactors:
            return
        if event.outcome == "compacted":
            self._views[event.step] = CompactionView.from_message(event.message)
        elif event.outcome == "kept":
            self._views.pop(event.step, None)

    def view(self, history: Sequence[Message]) -> Sequence[Message]:
        """What the model is sent of ``history`` (the history itself when nothing is
        compacted)."""
        for compacted in self._views.values():  # one compaction step is the rule
            history = compacted.apply(history)
        return history


COMPACTION_OUTCOMES: Final = frozenset(_outcomes("CompactionFailed", "").keys())
"""The outcomes of a compaction step, by which a journal's reader knows one."""


class ViewReader(Engine):
    """An engine that notes, as a journal's events replay into it, the view each model
    call was sent (``views``): the history at the call, under the last ``compacted``
    decision of a compaction step (a step declared with ``COMPACTION_OUTCOMES``; none
    after a ``kept``)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.views: list[list[Message]] = []
        self._current: CompactionView | None = None
        self._compaction = {
            s.name for s in self.table.steps if {n for n, _ in s.outcomes} == COMPACTION_OUTCOMES
        }

    def handle(self, event: Event) -> tuple[Action, ...]:
        if isinstance(event, StepDecided) and event.step in self._compaction:
            if event.outcome == "compacted":
                self._current = CompactionView.from_message(event.message)
            elif event.outcome == "kept":
                self._current = None
        elif isinstance(event, ModelResponded):
            history = list(self.messages)
            current = self._current
            self.views.append(current.apply(history) if current is not None else history)
        return super().handle(event)
