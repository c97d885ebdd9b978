"""The transition table: every state, trigger, guard and destination of the loop.

This module is the single source of truth. The engine interprets ``TRANSITIONS``
below as it stands (``core/engine.py`` reads what leaves the run's state with
``Table.leaving`` on every event); the diagrams, the docs, the exhaustive checker, the
reference ``transitions`` machine of the tests and the tests themselves are derived
from it; nothing restates it by hand. If you want to know what the loop can do, read
this file; if you want to change what it does, change this table (and the engine's
guard predicates, which are named here and defined in ``core/engine.py``'s
``GUARDS``).

Rules
=====

A *run* starts in ``Ready`` with a history that already satisfies the invariants
(every tool call answered exactly once, I1). Each *turn* is one model response plus
the tool executions it triggers::

    Ready --start--> AwaitingModel --model_responded--> DispatchingTools
        --dispatched--> CollectingResults --results_complete--> TurnBoundary
        --next_turn--> AwaitingModel ...

1. **The assistant message enters history first.** On ``model_responded`` the
   message is appended before any tool runs, so the transcript, the UI, the journal
   and a resumed session all see the request before its effects.
2. **Tool calls decide control flow; the stop reason explains it.** The guard
   ``has_tool_calls`` looks at the content, never at ``stopReason``: a response with
   ``stopReason: "stop"`` that carries tool calls still runs them (the classic bug of
   ending on the stop reason drops them and leaves an invalid history). The one
   exception: a response that reports its *own* failure (stop reason ``error`` or
   ``aborted``) ends the run; its tool calls are answered with error results saying
   they were not run, because their arguments may be cut off.
3. **Every tool call gets exactly one result (I1).** In ``DispatchingTools`` the
   engine resolves each call in order: an unknown name or arguments that fail the
   JSON Schema give an error result at once; the permission hook (when there is one)
   permits a call, denies it (an error result with the reason), or asks for a
   person's approval. In ``CollectingResults`` each started call's result arrives as
   ``tool_finished`` (a tool's exception arrives as an error output: the driver
   converts, the engine never sees a raise). A call cannot be answered twice: the
   engine refuses a second result for it.
4. **Calls run concurrently unless their tools say otherwise.** A call may start
   when every earlier unfinished call of its batch is compatible with it: neither
   tool is *sequential* (a barrier that runs alone, after the calls before it), and
   their *resources* (for example resolved file paths) do not overlap. So calls on
   one resource run one after another in call order, and two edits of one file never
   race. The engine decides what starts; the driver only runs what it is told.
5. **Results enter history in tool-call order (I2),** whatever order the tools
   finish in: a result waits until every result before it has arrived, then the
   contiguous prefix is appended. A transcript therefore does not depend on timing,
   and provider prompt caches stay valid.
6. **Queued input waits for a turn boundary.** A steering message or a follow-up
   may be queued in any live state. Tool calls already asked for are never skipped
   for it. Steering messages are injected (in queue order) when the next model call
   starts; follow-ups only when the model would otherwise finish (the last message
   is the model's, without a tool call, and no steering is queued). A final answer
   with input queued goes to ``TurnBoundary`` instead of ``Done`` (I3: a run ends
   only when there is no tool call and no queued input).
7. **The turn boundary** (``TurnBoundary``) is where the batch is fully answered.
   The ``should_continue`` hook, when there is one, is asked first; then
   ``next_turn`` tries its guards in this order, and the first that holds wins:

   - ``denied_by_policy`` -> ``AwaitingUser``. A denial fed back to the model only
     invites retries, so the run stops and waits for a person. This wins
     over everything else because the person must hear of it either way.
   - ``stop_requested`` -> ``Done``: ``should_continue`` asked to stop; its reason is
     the explanation.
   - ``output_accepted`` -> ``Done``: a final-result call of this batch validated
     (rule 13); the model has given what the run asked for, so no limit matters (they
     forbid a *further* call, and none is needed). After a denial and a stop, which
     are a person's and the hook's own decisions.
   - ``tool_retries_exhausted`` -> ``ToolRetriesExceeded``: a tool asked the model to
     try again (a retry request, rule 14) more often in a row than its budget allows.
     After a valid final result (the run has what it asked for) and before the output
     retries and the limits: it names the tool that cannot be satisfied, the more
     specific reason, and another call would only spend more.
   - ``output_retries_exhausted`` -> ``OutputInvalid``: the model failed to give a
     valid final result once more than ``retries`` allows (rule 13). Before the limits:
     it is the more specific reason, and calling again would only spend more.
   - ``turn_limit_reached`` -> ``TurnLimitExceeded``. The model asked for work (tool
     results to read, or queued input) and would need another call; I7 forbids it.
   - ``usage_limit_reached`` -> ``UsageLimitExceeded``. The run's ``UsageLimits``
     (model requests, input, output or total tokens, as the provider reported them
     on each response) are reached, so the next call would exceed them; I7 forbids
     it too. It comes after the turn limit: both stop the same call for the same
     kind of reason, and the turn limit is the bound every run has and that depends
     on nothing a provider reports, so a run that reaches both is explained by the
     exact one (and runs without usage limits end exactly as before). It comes after
     a denial and a stop for the same reasons as the turn limit does: a person must
     hear of a denial, and a stop asked by the hook is the user's own, more specific
     decision.
   - otherwise -> ``AwaitingModel``, with queued input injected.

8. **Approvals suspend the run.** When a call needs a person's approval, the other
   calls of the batch run; once nothing is running, ``results_complete`` goes to
   ``AwaitingUser`` with those calls pending (their results, and any after them, are
   held back so I2 holds). ``approval_decided`` answers them one by one; when all are
   decided the approved ones run. A message from the person instead answers every
   pending call "not approved" and goes to the turn boundary. The engine's state
   serialises to JSON, so the person may answer in another process.
9. **Abort** is accepted in every live state. From ``Ready``, ``TurnBoundary`` and
   ``AwaitingUser`` nothing is running, so the run is ``Aborted`` at once. From the
   three working states it goes to ``Aborting``: calls that never started get a result
   saying so at once; the model call and started tools are told (the driver signals
   them) and the engine waits for each to report, either a final result (kept as it
   is, I6) or ``*_cancelled`` when the driver gave up on it after the grace period.
   When nothing is outstanding, ``settled`` moves to ``Aborted``. A model call cut
   short leaves an assistant message with stop reason ``aborted`` holding whatever
   content had arrived.
10. **A model that fails** (an exception from ``complete``) ends the run ``Failed``
    with an assistant message of stop reason ``error``; the engine does not retry.
11. **Terminal states absorb every event (I4):** ``Done``, ``Aborted``,
    ``TurnLimitExceeded``, ``UsageLimitExceeded``, ``OutputInvalid``,
    ``ToolRetriesExceeded`` and ``Failed``
    accept any event and change nothing, so a late report from a straggling task can
    never corrupt a finished run. Each carries an explanation a person can read.
    Input still queued when a run ends is not dropped: it is reported with the result.
12. **Everything else is refused.** An event whose trigger has no row from the
    current state, or whose payload does not fit (a result for an unknown call, a
    second result for one call), raises ``ProtocolError`` and leaves the state,
    history and transition log exactly as they were (I8).
13. **Structured output.** A run with an output type offers one more tool,
    ``final_result``, whose parameters are the output's JSON Schema (a union may
    offer one such tool per member, ``final_result_A``, ``final_result_B``, each with
    its member's schema); the engine answers their calls itself in
    ``DispatchingTools`` (no permission hook, no driver), before the batch's other
    calls: the first call whose arguments validate is the output, answered "Final
    result accepted." (I1), and the turn boundary ends the run ``Done`` once the batch
    is answered (rule 7). What becomes of the other calls of that batch is the
    output's *end strategy*: ``exhaustive`` resolves and runs them as usual first;
    ``early`` runs none of them, each answered at once with an error result saying it
    was not run (I1), so no permission is asked and nothing starts. The rows are the
    same either way. Arguments that fail the schema are answered with an error
    result naming the problems; a final text answer (``output_missing``) goes to the
    turn boundary instead of ``Done``, and the next model call is preceded by a user
    message asking for the tool. Each such attempt spends one retry; past the budget
    the run ends ``OutputInvalid``, naming the last validation error. In native mode
    (the provider's own JSON-schema output, ``core/output.py``) no tool is offered
    and the same rows judge the final text instead: text that parses and validates
    is the output, so ``output_missing`` does not hold and the final answer ends the
    run ``Done``; any other final text is ``output_missing``, one failed attempt,
    answered with a message naming the problems. A plain-text output judged by a
    check (a text agent's output validators) offers no tool either: the final text is
    the output once the check accepts it, and a text it refuses is one failed attempt
    through the same rows.
14. **Retry requests.** A tool's result may be a *retry request* (the tool raised
    ``ModelRetry``: the model should call it again, differently): an error result like
    any other (rule 5), counted for its tool. The count is of requests in a row: a
    result of the tool that is not one starts it again. A tool whose count passes its
    budget (``tool_retries``; ``DEFAULT_TOOL_RETRIES``, 1, for a tool not named) ends the run
    ``ToolRetriesExceeded`` at the turn boundary (rule 7), naming the tool and its last
    message; a model cannot loop on a tool that keeps refusing it. A call of a tool the
    run does not offer (rule 3's "Unknown tool" result) is a retry request of that name
    too, against the run's ``unknown_tool_retries`` (an ``Agent`` gives its
    ``output_retries``, as PydanticAI counts them against its retries for output
    validation; ``run_agent`` only when asked); an engine given none does not count
    them, as runs recorded before did not, so their journals and snapshots replay as
    they ran.
15. **A team's own steps** (``core/steps.py``) are rows of a run's table too, never of
    ``TRANSITIONS``: a run with steps interprets a ``Table`` of these rows with some
    redirected into the steps' states (``DeclaredState``) and the steps' own rows
    (``step_decided``, guarded by ``OutcomeIs``). A step runs only where no tool call
    is outstanding: ``before_model`` sits on the rows into ``AwaitingModel`` from
    ``Ready`` and from the turn boundary's last row (after the limits, so a step never
    pushes a run past them); ``after_final`` on the rows into ``Done`` that carry the
    model's answer (a final answer, an accepted final result; not a stop asked by
    ``should_continue``, which is the caller's own decision). A retry goes through
    ``TurnBoundary``, which appends its message after the answer it rejects (I2) and
    checks the limits again (I7); an end is a declared terminal state, absorbing and
    explained like the library's (I4); abort in a step's state ends the run at once,
    as at a turn boundary (nothing is running but the step, which the driver cancels).

Theory of operation
===================

There are two kinds of trigger. *Input* triggers are caused by an event that a
driver hands to ``Engine.handle`` (the model answered, a tool finished, abort was
asked). *Internal* triggers are fired by the engine itself, right after an input
was handled, when their guard holds; they model the "and now, if everything is in"
steps, so that each state's meaning is exact (``DispatchingTools`` really means a
call is still waiting for permission, ``CollectingResults`` really means a started
call has no result yet, ``TurnBoundary`` really means the should_continue hook has
not answered yet). ``INTERNAL_TRIGGERS`` lists them with the guard that fires
them; the engine fires them to a fixed point after every input. Only a trigger with
a row from the run's state can fire: ``index`` derives, once per state, which ones
(``Leaving.internal``, in the order of ``INTERNAL_TRIGGERS``), and the engine asks
the guards of those alone.

Rows that share a source and a trigger are tried in table order; the first whose
guard holds wins. The last row of a group has no guard, so exactly one row always
applies; the only exceptions are the lone rows of ``dispatched`` and ``settled``,
which carry the guard that fires them so the diagrams can show it. (The firing guards
of ``results_complete`` and ``next_turn`` are in ``INTERNAL_TRIGGERS``; their rows
carry only the guards that choose among destinations.) The checker proves for every
reachable state that some row applies.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

import attrs

if TYPE_CHECKING:
    from statemachine.core.steps import StepSpec

__all__ = [
    "ABSORBING",
    "BASE_TABLE",
    "INITIAL",
    "INPUT_TRIGGERS",
    "INTERNAL_TRIGGERS",
    "RETURNS_TO_CALLER",
    "STATE_DOCS",
    "TERMINAL",
    "TRANSITIONS",
    "TRIGGER_DOCS",
    "DeclaredState",
    "Firing",
    "Guard",
    "Leaving",
    "OutcomeIs",
    "RowGuard",
    "State",
    "Table",
    "Transition",
    "Trigger",
    "TurnState",
    "index",
    "leaving",
    "rows_from",
    "triggers_from",
]


class TurnState(enum.StrEnum):
    """The states of a run. Values are exactly the names used in the docs."""

    READY = "Ready"
    AWAITING_MODEL = "AwaitingModel"
    DISPATCHING_TOOLS = "DispatchingTools"
    COLLECTING_RESULTS = "CollectingResults"
    TURN_BOUNDARY = "TurnBoundary"
    ABORTING = "Aborting"
    AWAITING_USER = "AwaitingUser"
    DONE = "Done"
    ABORTED = "Aborted"
    TURN_LIMIT_EXCEEDED = "TurnLimitExceeded"
    FAILED = "Failed"
    USAGE_LIMIT_EXCEEDED = "UsageLimitExceeded"
    OUTPUT_INVALID = "OutputInvalid"
    TOOL_RETRIES_EXCEEDED = "ToolRetriesExceeded"

    @property
    def is_terminal(self) -> bool:
        """True for the states that end a run and absorb every further event."""
        return self in TERMINAL


class Trigger(enum.StrEnum):
    """Everything that can move the machine. See ``TRIGGER_DOCS``."""

    # input triggers: caused by an event handed to Engine.handle
    START = "start"
    MODEL_RESPONDED = "model_responded"
    MODEL_FAILED = "model_failed"
    MODEL_CANCELLED = "model_cancelled"
    INPUT_QUEUED = "input_queued"
    TOOL_PERMITTED = "tool_permitted"
    TOOL_DENIED = "tool_denied"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_DECIDED = "approval_decided"
    TOOL_FINISHED = "tool_finished"
    TOOL_CANCELLED = "tool_cancelled"
    CONTINUE_DECIDED = "continue_decided"
    STEP_DECIDED = "step_decided"
    ABORT = "abort"
    # internal triggers: fired by the engine when their guard holds
    DISPATCHED = "dispatched"
    RESULTS_COMPLETE = "results_complete"
    NEXT_TURN = "next_turn"
    SETTLED = "settled"


class Guard(enum.StrEnum):
    """Named predicates over the engine's state and the event being handled.

    The engine answers each with its function of the state record in ``GUARDS``
    (``core/engine.py``, asked by ``Engine.guard_holds``); a test checks that every
    guard named here has one and that no other exists.
    """

    REPORTS_ERROR = "reports_error"
    REPORTS_ABORT = "reports_abort"
    HAS_TOOL_CALLS = "has_tool_calls"
    INPUT_QUEUED = "input_queued"
    ALL_CALLS_RESOLVED = "all_calls_resolved"
    NOTHING_RUNNING = "nothing_running"
    APPROVALS_PENDING = "approvals_pending"
    BOUNDARY_READY = "boundary_ready"
    DENIED_BY_POLICY = "denied_by_policy"
    STOP_REQUESTED = "stop_requested"
    TURN_LIMIT_REACHED = "turn_limit_reached"
    USAGE_LIMIT_REACHED = "usage_limit_reached"
    OUTPUT_MISSING = "output_missing"
    OUTPUT_ACCEPTED = "output_accepted"
    OUTPUT_RETRIES_EXHAUSTED = "output_retries_exhausted"
    TOOL_RETRIES_EXHAUSTED = "tool_retries_exhausted"
    NOTHING_OUTSTANDING = "nothing_outstanding"


S = TurnState
T = Trigger
G = Guard


@attrs.frozen
class DeclaredState:
    """A state a team declared with its steps (``core/steps.py``): the live state in
    which one step runs, or a terminal state one of its outcomes ends the run in.

    It reads like a ``TurnState`` where the engine, the trace and the drawings read
    one (``value``, ``is_terminal``, ``str()``), so a declared state is drawn, logged
    and checked like the library's own; it is not a member of ``TurnState``, which
    stays the states of every run (the base table), so an agent without steps has
    exactly the same states, snapshots and journals as before.
    """

    value: str
    terminal: bool
    # What it means (for a terminal one: the explanation a person reads); not part of
    # its identity: a state read back from the wire by its name is the same state.
    doc: str = attrs.field(eq=False)

    @property
    def is_terminal(self) -> bool:
        return self.terminal

    @property
    def name(self) -> str:
        return self.value

    def __str__(self) -> str:
        return self.value


State = TurnState | DeclaredState
"""A state of some table: the library's own, or one declared with a team's steps."""


@attrs.frozen
class OutcomeIs:
    """The guard of a row that leaves a step's state: the step answered ``outcome``;
    with ``spent``, also that its retry budget is spent (``True``) or not (``False``).

    It reads like a ``Guard`` where the drawings read one (``value``); the engine
    answers it from the step's decision (``Engine.guard_holds``)."""

    outcome: str
    spent: bool | None = None

    @property
    def value(self) -> str:
        if self.spent is None:
            return f"outcome={self.outcome}"
        return f"outcome={self.outcome}, retries {'spent' if self.spent else 'left'}"

    def __str__(self) -> str:
        return self.value


RowGuard = Guard | OutcomeIs
"""What a row may be guarded by."""


@attrs.frozen
class Transition:
    """One row: in ``source``, on ``trigger``, if ``guard`` holds, go to ``dest``."""

    source: State
    trigger: Trigger
    dest: State
    guard: RowGuard | None
    label: str  # how a person would say it; used by diagrams and docs


def _queue(state: TurnState) -> Transition:
    # Input may be queued in every live state; it waits for a turn boundary.
    return Transition(state, T.INPUT_QUEUED, state, None, "input queued")


# fmt: off
TRANSITIONS: tuple[Transition, ...] = (
    # -- starting ------------------------------------------------------------------------
    Transition(S.READY, T.START, S.AWAITING_MODEL, None, "call the model"),
    _queue(S.READY),
    Transition(S.READY, T.ABORT, S.ABORTED, None, "aborted before the first call"),
    # -- the model answered ----------------------------------------------------------------
    # Order matters: a response that reports its own failure ends the run even if it
    # carries tool calls (their arguments may be cut off); otherwise the presence of
    # tool calls, never the stop reason, decides; a final answer ends the run only
    # when no input is queued (I3) and no final result is required (rule 13).
    Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.FAILED, G.REPORTS_ERROR,
               "response reports an error"),
    Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.ABORTED, G.REPORTS_ABORT,
               "response reports an abort"),
    Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.DISPATCHING_TOOLS, G.HAS_TOOL_CALLS,
               "response has tool calls"),
    Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.TURN_BOUNDARY, G.INPUT_QUEUED,
               "final answer, but input is queued"),
    Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.TURN_BOUNDARY, G.OUTPUT_MISSING,
               "final text, but a final result is required"),
    Transition(S.AWAITING_MODEL, T.MODEL_RESPONDED, S.DONE, None, "final answer"),
    Transition(S.AWAITING_MODEL, T.MODEL_FAILED, S.FAILED, None, "model call raised"),
    _queue(S.AWAITING_MODEL),
    Transition(S.AWAITING_MODEL, T.ABORT, S.ABORTING, None, "abort during the model call"),
    # -- resolving the calls: look up, validate, ask the permission hook ---------------------
    Transition(S.DISPATCHING_TOOLS, T.TOOL_PERMITTED, S.DISPATCHING_TOOLS, None,
               "call permitted"),
    Transition(S.DISPATCHING_TOOLS, T.TOOL_DENIED, S.DISPATCHING_TOOLS, None, "call denied"),
    Transition(S.DISPATCHING_TOOLS, T.APPROVAL_REQUIRED, S.DISPATCHING_TOOLS, None,
               "call needs a person's approval"),
    _queue(S.DISPATCHING_TOOLS),
    Transition(S.DISPATCHING_TOOLS, T.DISPATCHED, S.COLLECTING_RESULTS, G.ALL_CALLS_RESOLVED,
               "every call resolved; start the permitted ones"),
    Transition(S.DISPATCHING_TOOLS, T.ABORT, S.ABORTING, None, "abort while dispatching"),
    # -- collecting results ----------------------------------------------------------------
    Transition(S.COLLECTING_RESULTS, T.TOOL_FINISHED, S.COLLECTING_RESULTS, None,
               "a tool finished; start the calls it held back"),
    _queue(S.COLLECTING_RESULTS),
    Transition(S.COLLECTING_RESULTS, T.RESULTS_COMPLETE, S.AWAITING_USER, G.APPROVALS_PENDING,
               "calls wait for approval"),
    Transition(S.COLLECTING_RESULTS, T.RESULTS_COMPLETE, S.TURN_BOUNDARY, None,
               "batch answered"),
    Transition(S.COLLECTING_RESULTS, T.ABORT, S.ABORTING, None, "abort while tools run"),
    # -- the turn boundary: queued input, the should_continue hook, limits -------------------
    # Order matters: a policy denial wins (a person must hear of it whatever else
    # holds), then a stop asked by should_continue, then a valid final result, then
    # a tool's retries, the output retries, then the turn limit, then the usage limits
    # (rule 7 says why).
    Transition(S.TURN_BOUNDARY, T.CONTINUE_DECIDED, S.TURN_BOUNDARY, None,
               "should_continue answered"),
    _queue(S.TURN_BOUNDARY),
    Transition(S.TURN_BOUNDARY, T.NEXT_TURN, S.AWAITING_USER, G.DENIED_BY_POLICY,
               "a call was denied by policy"),
    Transition(S.TURN_BOUNDARY, T.NEXT_TURN, S.DONE, G.STOP_REQUESTED,
               "should_continue said stop"),
    Transition(S.TURN_BOUNDARY, T.NEXT_TURN, S.DONE, G.OUTPUT_ACCEPTED,
               "a valid final result was given"),
    Transition(S.TURN_BOUNDARY, T.NEXT_TURN, S.TOOL_RETRIES_EXCEEDED, G.TOOL_RETRIES_EXHAUSTED,
               "a tool's retries are spent"),
    Transition(S.TURN_BOUNDARY, T.NEXT_TURN, S.OUTPUT_INVALID, G.OUTPUT_RETRIES_EXHAUSTED,
               "no valid final result within the retries"),
    Transition(S.TURN_BOUNDARY, T.NEXT_TURN, S.TURN_LIMIT_EXCEEDED, G.TURN_LIMIT_REACHED,
               "turn limit reached with work asked for"),
    Transition(S.TURN_BOUNDARY, T.NEXT_TURN, S.USAGE_LIMIT_EXCEEDED, G.USAGE_LIMIT_REACHED,
               "usage limit reached with work asked for"),
    Transition(S.TURN_BOUNDARY, T.NEXT_TURN, S.AWAITING_MODEL, None,
               "inject queued input; call the model"),
    Transition(S.TURN_BOUNDARY, T.ABORT, S.ABORTED, None, "abort at the turn boundary"),
    # -- aborting: wait for every started operation to report ---------------------------------
    Transition(S.ABORTING, T.MODEL_RESPONDED, S.ABORTING, None, "the model call ended"),
    Transition(S.ABORTING, T.MODEL_FAILED, S.ABORTING, None, "the model call raised"),
    Transition(S.ABORTING, T.MODEL_CANCELLED, S.ABORTING, None,
               "the model call was cancelled"),
    Transition(S.ABORTING, T.TOOL_FINISHED, S.ABORTING, None, "a tool finished its cleanup"),
    Transition(S.ABORTING, T.TOOL_CANCELLED, S.ABORTING, None, "a tool was cancelled"),
    _queue(S.ABORTING),
    Transition(S.ABORTING, T.ABORT, S.ABORTING, None, "abort asked again"),
    Transition(S.ABORTING, T.SETTLED, S.ABORTED, G.NOTHING_OUTSTANDING,
               "every started operation has reported"),
    # -- waiting for a person: approvals, or a new message ------------------------------------
    Transition(S.AWAITING_USER, T.APPROVAL_DECIDED, S.AWAITING_USER, G.APPROVALS_PENDING,
               "a call decided; more to decide"),
    Transition(S.AWAITING_USER, T.APPROVAL_DECIDED, S.COLLECTING_RESULTS, None,
               "every approval decided; run the approved calls"),
    Transition(S.AWAITING_USER, T.INPUT_QUEUED, S.TURN_BOUNDARY, None,
               "a person answered with a message"),
    Transition(S.AWAITING_USER, T.ABORT, S.ABORTED, None, "abandoned while waiting"),
)
# fmt: on

INITIAL: TurnState = S.READY
"""Where every run starts. The first row of ``TRANSITIONS`` starts from it, because
the diagrams read a table's start from its first row."""

TERMINAL: frozenset[TurnState] = frozenset(
    {
        S.DONE,
        S.ABORTED,
        S.TURN_LIMIT_EXCEEDED,
        S.FAILED,
        S.USAGE_LIMIT_EXCEEDED,
        S.OUTPUT_INVALID,
        S.TOOL_RETRIES_EXCEEDED,
    }
)
"""States that end a run."""

ABSORBING: frozenset[TurnState] = TERMINAL
"""States that accept every event and change nothing (I4)."""

RETURNS_TO_CALLER: frozenset[TurnState] = TERMINAL | {S.AWAITING_USER}
"""States in which a driver stops and returns its result."""

INTERNAL_TRIGGERS: Mapping[Trigger, Guard] = {
    T.DISPATCHED: G.ALL_CALLS_RESOLVED,
    T.RESULTS_COMPLETE: G.NOTHING_RUNNING,
    T.NEXT_TURN: G.BOUNDARY_READY,
    T.SETTLED: G.NOTHING_OUTSTANDING,
}
"""Triggers the engine fires itself, with the guard that must hold to fire them."""

INPUT_TRIGGERS: tuple[Trigger, ...] = tuple(t for t in Trigger if t not in INTERNAL_TRIGGERS)

STATE_DOCS: Mapping[TurnState, str] = {
    S.READY: "the history is checked; nothing has been asked yet",
    S.AWAITING_MODEL: "a request is out to the model",
    S.DISPATCHING_TOOLS: (
        "the assistant message is in history; its tool calls are being resolved "
        "(looked up, validated, permitted)"
    ),
    S.COLLECTING_RESULTS: (
        "the permitted tool calls are running (concurrently where their tools allow); "
        "results are being collected"
    ),
    S.TURN_BOUNDARY: (
        "the batch is answered: queued input is injected, should_continue, the turn "
        "limit and the usage limits are checked"
    ),
    S.ABORTING: "an abort was asked; started work is finishing its cleanup",
    S.AWAITING_USER: (
        "stopped to wait for a person: a call was denied by policy, or calls wait for approval"
    ),
    S.DONE: "the last assistant message has no tool call and no input is queued",
    S.ABORTED: "the run was aborted; every started tool call has a result",
    S.TURN_LIMIT_EXCEEDED: "the turn limit was reached with work still asked for",
    S.FAILED: "the provider failed; the history ends with an error assistant message",
    S.USAGE_LIMIT_EXCEEDED: (
        "a usage limit (requests or tokens) was reached with work still asked for"
    ),
    S.OUTPUT_INVALID: "the model gave no valid final result within the output retries",
    S.TOOL_RETRIES_EXCEEDED: "a tool asked for a retry more often in a row than its budget",
}

TRIGGER_DOCS: Mapping[Trigger, str] = {
    T.START: "the driver starts the run",
    T.MODEL_RESPONDED: "the model client returned an assistant message",
    T.MODEL_FAILED: "the model client raised",
    T.MODEL_CANCELLED: "after an abort, the driver gave up waiting for the model call",
    T.INPUT_QUEUED: "a steering or follow-up message was queued (or a person answered)",
    T.TOOL_PERMITTED: "the permission hook allowed a call",
    T.TOOL_DENIED: "the permission hook denied a call",
    T.APPROVAL_REQUIRED: "the permission hook asked for a person's approval",
    T.APPROVAL_DECIDED: "a person approved or denied a call",
    T.TOOL_FINISHED: "a started tool returned (or raised; the driver converts it)",
    T.TOOL_CANCELLED: "after an abort, the driver gave up waiting for a tool",
    T.CONTINUE_DECIDED: "the should_continue hook answered",
    T.STEP_DECIDED: "a declared step answered with one of its outcomes (core/steps.py)",
    T.ABORT: "the run's abort signal fired",
    T.DISPATCHED: "internal: every call of the batch is resolved",
    T.RESULTS_COMPLETE: "internal: no call of the batch is running any more",
    T.NEXT_TURN: "internal: the turn boundary's checks are done",
    T.SETTLED: "internal: after an abort, nothing is outstanding",
}


class Firing(NamedTuple):
    """An internal trigger that can fire from a state: the guard that fires it, and its
    rows from there (in table order)."""

    trigger: Trigger
    guard: Guard
    rows: tuple[Transition, ...]


@attrs.frozen
class Leaving:
    """What leaves one state: the rows of each trigger, in table order; and, derived
    from them once, the internal triggers that can fire from it, in the order of
    ``INTERNAL_TRIGGERS`` (the first whose guard holds fires), so that after each event
    the engine asks only the guards that can fire from where the run is."""

    by_trigger: Mapping[Trigger, tuple[Transition, ...]]
    internal: tuple[Firing, ...]

    @classmethod
    def of(cls, by_trigger: Mapping[Trigger, tuple[Transition, ...]]) -> Leaving:
        internal = tuple(
            Firing(trigger, guard, by_trigger[trigger])
            for trigger, guard in INTERNAL_TRIGGERS.items()
            if trigger in by_trigger
        )
        return cls(MappingProxyType(dict(by_trigger)), internal)


RowIndex = dict[State, Leaving]


def index(rows: Iterable[Transition]) -> RowIndex:
    """``rows`` grouped by source state (every state has an entry, empty for a state
    no row leaves), then by trigger, each group in table order."""
    grouped: dict[State, dict[Trigger, tuple[Transition, ...]]] = {s: {} for s in TurnState}
    for row in rows:
        group = grouped.setdefault(row.source, {})
        group[row.trigger] = (*group.get(row.trigger, ()), row)
        grouped.setdefault(row.dest, {})
    return {state: Leaving.of(by_trigger) for state, by_trigger in grouped.items()}


_BY_SOURCE: RowIndex = index(TRANSITIONS)
_NOTHING_LEAVES: Leaving = Leaving.of({})


def rows_from(source: State, trigger: Trigger) -> tuple[Transition, ...]:
    """The rows for ``(source, trigger)`` in table order (empty: not accepted)."""
    return _BY_SOURCE[source].by_trigger.get(trigger, ())


def triggers_from(source: State) -> Mapping[Trigger, tuple[Transition, ...]]:
    """Every trigger that has a row from ``source``, with its rows in table order."""
    return _BY_SOURCE[source].by_trigger


def leaving(source: State) -> Leaving:
    """What leaves ``source``: its rows by trigger, and the internal triggers that can
    fire from it."""
    return _BY_SOURCE[source]


@attrs.frozen(eq=False, repr=False)
class Table:
    """A run's transition table as a value: the base rows, and the rows a team's
    declared steps add (``core/steps.py`` builds one with ``table_for``).

    The engine interprets the table it is given exactly as it interprets
    ``TRANSITIONS``: the first row of a (state, trigger) group whose guard holds wins.
    ``BASE_TABLE`` is ``TRANSITIONS`` itself, the table of every agent without steps.
    ``steps`` are the declarations the rows were generated from, kept so that the
    checker can hold the rows to them (``testing/_oracle.py`` reads the declarations,
    never the rows).
    """

    rows: tuple[Transition, ...]
    steps: tuple[StepSpec, ...] = ()
    _index: RowIndex = attrs.field(init=False)
    terminal: frozenset[State] = attrs.field(init=False)
    returns_to_caller: frozenset[State] = attrs.field(init=False)  # and AwaitingUser
    declared: tuple[DeclaredState, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        by_source = index(self.rows)
        declared = tuple(s for s in by_source if isinstance(s, DeclaredState))
        object.__setattr__(self, "_index", by_source)
        object.__setattr__(self, "declared", declared)
        ends = frozenset(s for s in declared if s.terminal)
        object.__setattr__(self, "terminal", TERMINAL | ends)
        object.__setattr__(self, "returns_to_caller", self.terminal | {S.AWAITING_USER})

    def __repr__(self) -> str:
        steps = ", ".join(s.name for s in self.steps)
        return f"<Table of {len(self.rows)} rows, steps: {steps or 'none'}>"

    @property
    def states(self) -> tuple[State, ...]:
        """Every state: the library's, then the declared ones in table order."""
        return (*TurnState, *self.declared)

    def rows_from(self, source: State, trigger: Trigger) -> tuple[Transition, ...]:
        """The rows for ``(source, trigger)`` in table order (empty: not accepted)."""
        return self.leaving(source).by_trigger.get(trigger, ())

    def triggers_from(self, source: State) -> Mapping[Trigger, tuple[Transition, ...]]:
        """Every trigger that has a row from ``source``, with its rows in table order."""
        return self.leaving(source).by_trigger

    def leaving(self, source: State) -> Leaving:
        """What leaves ``source``: its rows by trigger, and the internal triggers that
        can fire from it. The base table reads the module's index as it holds it now
        (``leaving``; a test may install other rows there)."""
        by_source = _BY_SOURCE if self is BASE_TABLE else self._index
        return by_source.get(source, _NOTHING_LEAVES)

    def state_named(self, name: str) -> State | None:
        """The state whose value is ``name`` (``None``: no such state here)."""
        for state in self.states:
            if state.value == name:
                return state
        return None


BASE_TABLE: Table = Table(TRANSITIONS)
"""The table of every run without declared steps: ``TRANSITIONS``."""
