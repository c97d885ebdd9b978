"""What the exhaustive checker explores: the scenario, the bounds, the candidate events.

The checker drives one scenario (a user message, one tool ``echo``) through every
engine configuration of ``Bounds.configs``; ``EVENT_SOURCES`` gives, for each input
trigger, the candidate events to offer an engine as it stands. ``CheckViolation`` is
what the search reports. The public names are re-exported by ``testing/checker.py``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs

from statemachine.core.engine import Engine
from statemachine.core.events import (
    AbortRequested,
    ApprovalDecided,
    ApprovalRequired,
    ContinueDecided,
    Event,
    InputKind,
    InputQueued,
    ModelCancelled,
    ModelFailed,
    ModelResponded,
    Start,
    StepDecided,
    ToolCancelled,
    ToolDenied,
    ToolFinished,
    ToolPermitted,
)
from statemachine.core.limits import UsageLimits
from statemachine.core.messages import (
    AssistantMessage,
    StopReason,
    TextContent,
    ToolCall,
    Usage,
    UserMessage,
)
from statemachine.core.output import OutputSpec
from statemachine.core.table import Table, Trigger, TurnState
from statemachine.core.tools import ToolDefinition, ToolOutput

S = TurnState
T = Trigger

# -- the scenario the checker drives -----------------------------------------------------

TOOL = ToolDefinition(
    "echo",
    "Repeat the text back.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)
VALID_ARGUMENTS: Mapping[str, Any] = {"text": "hi"}
INVALID_ARGUMENTS: Mapping[str, Any] = {"text": 42}
UNKNOWN_TOOL = "no_such_tool"
UNKNOWN_CALL = "no-such-call"
FIRST_MESSAGE = UserMessage("use the tools")
OK_OUTPUT = ToolOutput("done")
ERROR_OUTPUT = ToolOutput("Error: it broke", is_error=True)
# A retry request (the tool raised ModelRetry), offered where the tool has a retry
# budget: with a budget of one, the second in a row ends the run ToolRetriesExceeded.
RETRY_OUTPUT = ToolOutput("Try again with a shorter text", is_error=True, retry=True)
TOOL_RETRIES: Mapping[str, int] = {TOOL.name: 1}

CallKind = Literal["ok", "unknown", "invalid", "final_ok", "final_bad"]


@attrs.frozen
class Config:
    """One engine configuration to explore: the ``Engine`` options, and where the state
    space needs it, a tighter cap on tool calls per response than ``Bounds.calls``,
    and the usages a response may report (``Bounds.usages`` when ``None``)."""

    options: Mapping[str, Any] = attrs.field(factory=dict)
    max_calls: int | None = None
    usages: tuple[Usage | None, ...] | None = None
    call_kinds: tuple[CallKind, ...] | None = None
    texts: tuple[str, ...] | None = None

    def describe(self) -> str:
        """One short line (the progress display shows it on one terminal line)."""
        flags = ", ".join(f"{k}={_short(v)}" for k, v in sorted(self.options.items()))
        return (flags or "no hooks") + (
            f" (at most {self.max_calls} calls)" if self.max_calls is not None else ""
        )


def _short(value: object) -> str:
    """An option as the checker's report shows it (usage limits: only those set)."""
    if isinstance(value, UsageLimits):
        fields = attrs.asdict(value, filter=lambda _, v: v is not None)
        return ",".join(f"{k}:{v}" for k, v in fields.items())
    if isinstance(value, Table):
        return ", ".join(f"{s.name}({s.point})" for s in value.steps) or "the base table"
    if isinstance(value, Mapping):  # tool retry budgets: short, for a terminal line
        return ",".join(f"{k}:{v}" for k, v in value.items())
    if isinstance(value, OutputSpec):
        mode = ", native" if value.native else ""
        early = ", early" if value.end_strategy == "early" else ""
        return f"{value.name}(retries:{value.retries}{mode}{early})"
    return str(value)


# The usage limits the checker explores: a response reports either no usage or
# RESPONSE_USAGE, so the limit is reached after one, two or three model calls, or never;
# at the third call it is reached together with the turn limit (which wins, rule 7), and
# with should_continue's stop (which wins too).
RESPONSE_USAGE = Usage(input=60, output=40, total_tokens=100)
USAGE_LIMITS = UsageLimits(total_tokens=100)

# The structured output the checker explores: responses may call the final-result tool
# with valid or invalid arguments, beside ordinary calls, or answer with text; with one
# retry, the second failed attempt ends the run OutputInvalid.
OUTPUT = OutputSpec.of(
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
    retries=1,
)
# The same output in native mode: no final-result tool is offered; a final answer's text
# is the output, valid JSON of the schema, JSON that breaks it, or no JSON at all.
NATIVE_OUTPUT = attrs.evolve(OUTPUT, native=True)
# The same output ending early: a response's other calls are answered as not run once
# its final result is accepted (the checker's OUTPUT runs them: exhaustive).
EARLY_OUTPUT = attrs.evolve(OUTPUT, end_strategy="early")
NATIVE_TEXTS = ('{"answer": "42"}', '{"answer": 42}', "finished")


# A permission hook gives every call four answers, in any order, then approvals: at three
# calls per response that alone is ~70,000 states (about a minute), so the hooked
# configuration is explored with two calls per response by default (``--uncapped``
# lifts it). The configurations without hooks take the full bound.
DEFAULT_CONFIGS: tuple[Config, ...] = (
    Config({}),
    Config({"check_continue": True}),
    Config({"check_permissions": True, "check_continue": True}, max_calls=2),
    Config({"usage_limits": USAGE_LIMITS, "check_continue": True}, usages=(None, RESPONSE_USAGE)),
    Config({"output": OUTPUT, "check_continue": True}, call_kinds=("ok", "final_ok", "final_bad")),
    Config(
        {"output": EARLY_OUTPUT, "check_continue": True}, call_kinds=("ok", "final_ok", "final_bad")
    ),
    Config(
        {"output": NATIVE_OUTPUT, "check_continue": True}, call_kinds=("ok",), texts=NATIVE_TEXTS
    ),
    Config({"tool_retries": TOOL_RETRIES, "check_continue": True}, max_calls=2),
)


@attrs.frozen(eq=False)  # hashed by identity: it keys the cache of model responses
class Bounds:
    """What the checker explores.

    ``turns`` is the engine's ``max_turns``; ``calls`` the most tool calls in one
    response; ``configs`` the engine configurations to explore (each a separate
    search; see ``Config``);
    ``usages`` are the usages a model response may report (each response is offered
    with each); ``queued`` is the most inputs waiting in the queue at once; ``limits`` caps how
    often a trigger may occur on one path (for an input that could otherwise repeat
    forever and has no state of its own to bound it).

    Every refused event must raise ``ProtocolError``. That it also left the engine
    exactly as it was is verified (a full comparison, the costliest check) for the
    first ``refusals_per_pair`` refusals of each (state, trigger) pair and for every
    ``refusal_stride``-th refusal after that; ``refusal_stride=1`` verifies them all.
    Every ``determinism_stride``-th run that reaches a terminal state is replayed on a
    fresh engine, which must give the identical run (I5).

    ``rules`` compares every transition with the rules oracle (``testing/_oracle.py``); turning
    it off shows what the checker finds from the invariants alone.
    """

    turns: int = 3
    calls: int = 3
    call_kinds: tuple[CallKind, ...] = ("ok", "unknown", "invalid")
    texts: tuple[str, ...] = ("finished",)
    stop_reasons: tuple[StopReason, ...] = tuple(StopReason)
    usages: tuple[Usage | None, ...] = (None,)
    configs: tuple[Config, ...] = DEFAULT_CONFIGS
    queued: int = 1
    limits: Mapping[Trigger, int] = attrs.field(factory=dict)
    max_violations: int = 20
    refusals_per_pair: int = 50
    refusal_stride: int = 4
    determinism_stride: int = 25
    rules: bool = True

    def __attrs_post_init__(self) -> None:
        if self.turns < 1 or self.calls < 0:
            raise ValueError("bounds: turns must be >= 1 and calls >= 0")
        if self.refusal_stride < 1 or self.refusals_per_pair < 0 or self.determinism_stride < 1:
            raise ValueError(
                "bounds: refusal_stride and determinism_stride must be >= 1, refusals_per_pair >= 0"
            )


# -- event sources: one entry per input trigger ---------------------------------------------

EventSource = Callable[[Engine, Bounds], Sequence[Event]]


def _responses(turn: int, bounds: Bounds) -> list[Event]:
    """Every model response within the bounds: ids unique per turn, as a model gives."""
    out: list[Event] = []
    for count in range(bounds.calls + 1):
        for kinds in itertools.product(bounds.call_kinds, repeat=count):
            calls = [_call(f"t{turn}c{i}", kind) for i, kind in enumerate(kinds)]
            texts = [[]] if calls else [[TextContent(t)] for t in bounds.texts]
            for text in texts:
                for stop in bounds.stop_reasons:
                    for usage in bounds.usages:
                        message = AssistantMessage([*text, *calls], stop_reason=stop, usage=usage)
                        out.append(ModelResponded(message))
    if bounds.calls >= 2:
        # Ids the engine must normalise (empty and repeated).
        calls = [_call("", "ok") for _ in range(bounds.calls)]
        out.append(ModelResponded(AssistantMessage(calls, stop_reason=StopReason.TOOL_USE)))
    return out


def _call(call_id: str, kind: CallKind) -> ToolCall:
    if kind in ("final_ok", "final_bad"):
        return ToolCall(call_id, OUTPUT.name, {"answer": "42" if kind == "final_ok" else 42})
    if kind == "unknown":
        return ToolCall(call_id, UNKNOWN_TOOL, VALID_ARGUMENTS)
    return ToolCall(call_id, TOOL.name, VALID_ARGUMENTS if kind == "ok" else INVALID_ARGUMENTS)


def _call_ids(engine: Engine) -> list[str]:
    """Ids of the current batch's calls, answered or not, plus one that does not exist:
    the engine must accept the right ones and refuse the others unchanged."""
    ids: list[str] = []
    for message in reversed(engine.messages):
        if isinstance(message, AssistantMessage):
            ids = [c.id for c in message.tool_calls]
            break
    pending = [c.id for c in engine.pending_calls()]
    return [*dict.fromkeys([*pending, *ids]), UNKNOWN_CALL]


STEP_MESSAGE = "the step says: not like this"
UNDECLARED_OUTCOME = "no_such_outcome"


def _step_decisions(engine: Engine) -> list[Event]:
    """Every outcome of the step the run waits for, each with a message, and one it did
    not declare (refused); none for an engine without steps, where nothing could
    accept them (so the base table is explored exactly as before)."""
    steps = engine.table.steps
    if not steps:
        return []
    step = engine.pending_step()
    if step is None:
        return [StepDecided(steps[0].name, steps[0].outcomes[0][0])]  # a refusal sample
    return [
        *(StepDecided(step.name, name, STEP_MESSAGE) for name, _ in step.outcomes),
        StepDecided(step.name, UNDECLARED_OUTCOME),
    ]


@functools.lru_cache(maxsize=64)
def _responses_for(turn: int, bounds: Bounds) -> tuple[Event, ...]:
    return tuple(_responses(turn, bounds))


EVENT_SOURCES: dict[Trigger, EventSource] = {
    T.START: lambda e, b: [Start()],
    T.MODEL_RESPONDED: lambda e, b: _responses_for(e.turns, b),
    T.MODEL_FAILED: lambda e, b: [ModelFailed("HTTP 500 from the provider")],
    T.MODEL_CANCELLED: lambda e, b: [ModelCancelled()],
    T.TOOL_PERMITTED: lambda e, b: [ToolPermitted(i) for i in _call_ids(e)],
    T.TOOL_DENIED: lambda e, b: [
        d
        for i in _call_ids(e)
        for d in (ToolDenied(i, "policy forbids it"), ToolDenied(i, "try another", True))
    ],
    T.TOOL_FINISHED: lambda e, b: [
        ToolFinished(i, out)
        for i in _call_ids(e)
        for out in (OK_OUTPUT, ERROR_OUTPUT, *((RETRY_OUTPUT,) if e.tool_retries else ()))
    ],
    T.TOOL_CANCELLED: lambda e, b: [ToolCancelled(i) for i in _call_ids(e)],
    T.ABORT: lambda e, b: [AbortRequested("the user pressed stop")],
    # Bounded by the queue's length, not by a count per path: once the queue is
    # injected the run is where it would have been without it, and merges with it.
    T.INPUT_QUEUED: lambda e, b: (
        [
            InputQueued(UserMessage("also run the tests"), InputKind.STEER),
            InputQueued(UserMessage("then summarise"), InputKind.FOLLOW_UP),
        ]
        if len(e.queued_input()) < b.queued
        else []
    ),
    T.APPROVAL_REQUIRED: lambda e, b: [ApprovalRequired(i, "needs sign-off") for i in _call_ids(e)],
    T.APPROVAL_DECIDED: lambda e, b: [
        d for i in _call_ids(e) for d in (ApprovalDecided(i, True), ApprovalDecided(i, False, "no"))
    ],
    T.CONTINUE_DECIDED: lambda e, b: [ContinueDecided(False), ContinueDecided(True, "enough")],
    T.STEP_DECIDED: lambda e, b: _step_decisions(e),
}
"""Candidate events per input trigger, given the engine as it stands."""

# Triggers whose acceptance does not depend on the payload: one refusal stands for all
# candidates (it saves offering 200 model responses where no model call is out).
_UNIFORM: frozenset[Trigger] = frozenset({T.MODEL_RESPONDED, T.MODEL_FAILED, T.MODEL_CANCELLED})


@attrs.frozen
class CheckViolation:
    """A property that failed, where, and the event sequence that leads there."""

    invariant: str
    message: str
    config: Mapping[str, Any]
    path: tuple[Event, ...]

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


class _SilentLogger:
    """A structlog-shaped logger that drops everything (no global configuration)."""

    def bind(self, **_: Any) -> _SilentLogger:
        return self

    def _drop(self, *_: Any, **__: Any) -> None:
        return None

    debug = info = warning = error = exception = msg = _drop
