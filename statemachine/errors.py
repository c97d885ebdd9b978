"""Every exception the library raises on purpose, in one module.

The hierarchy separates trouble by who must act on it, because each calls for a
different reaction (h11 splits its protocol errors the same way)::

    StateMachineError
    ├── UsageError                  the calling code misused the library: fix the code
    │   ├── ProtocolError           an event the engine does not accept in its state
    │   ├── InvalidInputError       an argument refused before anything ran (ValueError)
    │   │   └── StepDeclarationError  a declared step refused: it would break a rule
    │   ├── DiagramError            a diagram that cannot be drawn as asked
    │   ├── UnknownRunError         no durable run has this id
    │   ├── NotPendingError         a decision or an answer nothing waits for
    │   ├── RunClosedError          a message to a durable run that has ended
    │   ├── SessionBusyError        a second run on a session that has one running
    │   ├── InstructionsError       an instructions function raised or gave no text
    │   ├── DelegationDepthError    agents nested as tools deeper than ``max_depth``
    │   └── OutputTypeChangedError  resumed with an output type the run never showed
    ├── BadDataError                data from outside cannot be used (ValueError)
    │   ├── WireFormatError         a message, event or document without the wire shape
    │   │   └── SnapshotError       a snapshot refused by ``Engine.restore``
    │   │       └── SnapshotSignatureError
    │   ├── JournalError            a journal that cannot be read or does not replay
    │   ├── SessionDataError        a stored conversation session that cannot be read
    │   ├── ExportError             saved durable steps that do not rebuild their run
    │   ├── SpecError               a scenario file that is not a scenario
    │   ├── ModelOutputError        a model client returned no ``AssistantMessage``
    │   ├── ToolOutputError         a tool returned a value that is no tool result
    │   └── CompactionError         a compacted view refused: it splits a call from its result
    ├── ServiceError                a service the run depends on failed
    │   ├── ProviderError           a model provider (the adapters' errors)
    │   │   ├── ProviderAuthError
    │   │   ├── ProviderUnavailableError
    │   │   ├── ContextOverflowError
    │   │   ├── ProviderRequestError
    │   │   ├── ProviderResponseError
    │   │   └── ProviderLimitError
    │   ├── MCPError                an MCP server
    │   ├── StoreUnavailableError   the durable runs' or a session's database
    │   ├── RunHeldError            a durable run held: the worker's code does not fit it
    │   ├── RunFailedError          a durable run the backend or an operator gave up on
    │   └── BridgeError             a bridged peer process (also a RuntimeError)
    │       ├── BridgeProtocolError
    │       └── BridgeTimeoutError
    ├── RunNotDoneError             why a run returned in a state other than ``Done``
    │   ├── AbortedError
    │   ├── TurnLimitExceededError
    │   ├── ModelFailedError
    │   ├── AwaitingUserError
    │   ├── UsageLimitExceededError
    │   ├── OutputInvalidError
    │   ├── ToolRetriesExceededError
    │   └── StepEndedError          a declared step ended the run in its own state
    ├── EngineInvariantError        the library broke a guarantee of its own: a bug
    └── ModelRetry                  not trouble: a tool or an output validator asks the
                                    model to try again, with a message (it never
                                    escapes a run: it becomes a failed attempt)

Three exceptions are raised *for* code outside the library, so they are deliberately
not ``StateMachineError``: the code that meets them treats them as it treats any
exception of that code::

    NotExpressibleError             an adapter: its peer cannot express a scenario
    ScriptedToolError               the kit's scripted tool failing, as a real tool would
    StrayCancelledError             user code raised ``CancelledError``, uncancelled

How each family reaches you:

* ``UsageError`` is raised at once, before anything runs or changes.
* ``BadDataError`` is raised by the readers of stored or received data (a snapshot, a
  journal, a wire document, a spec). A model's or a tool's bad output never crashes a
  run: the driver turns it into an error tool result or a ``Failed`` run, and the
  exception reaches you only as that run's explanation.
* ``ServiceError`` is raised by the clients of other people's services when they give
  up. Inside a run, a provider's failure ends the run ``Failed`` and an MCP server's
  failure becomes the call's error result.
* ``RunNotDoneError`` is never raised by ``run_agent``: it is put in
  ``RunResult.error``, and ``RunResult.raise_for_state()`` raises it for callers who
  prefer exceptions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from statemachine.core.trace import TransitionRecord

__all__ = [
    "AbortedError",
    "AwaitingUserError",
    "BadDataError",
    "BridgeError",
    "BridgeProtocolError",
    "BridgeTimeoutError",
    "CompactionError",
    "ContextOverflowError",
    "DelegationDepthError",
    "DiagramError",
    "EngineInvariantError",
    "ExportError",
    "InstructionsError",
    "InvalidInputError",
    "JournalError",
    "MCPError",
    "ModelFailedError",
    "ModelOutputError",
    "ModelRetry",
    "NotExpressibleError",
    "NotPendingError",
    "OutputInvalidError",
    "OutputTypeChangedError",
    "ProtocolError",
    "ProviderAuthError",
    "ProviderError",
    "ProviderLimitError",
    "ProviderRequestError",
    "ProviderResponseError",
    "ProviderUnavailableError",
    "RunClosedError",
    "RunFailedError",
    "RunHeldError",
    "RunNotDoneError",
    "ScriptedToolError",
    "ServiceError",
    "SessionBusyError",
    "SessionDataError",
    "SnapshotError",
    "SnapshotSignatureError",
    "SpecError",
    "StateMachineError",
    "StepDeclarationError",
    "StepEndedError",
    "StoreUnavailableError",
    "StrayCancelledError",
    "ToolOutputError",
    "ToolRetriesExceededError",
    "TurnLimitExceededError",
    "UnknownRunError",
    "UsageError",
    "UsageLimitExceededError",
    "WireFormatError",
]


class StateMachineError(Exception):
    """Base class of every error this library raises on purpose."""


# -- the caller's misuse ------------------------------------------------------------


class UsageError(StateMachineError):
    """The calling code used the library in a way it does not support."""


class ProtocolError(UsageError):
    """An event that the engine does not accept in its current state.

    The engine's state, history and transition log are exactly as they were before
    the refused event (invariant I8). Not a ``ValueError``: catching ``ValueError``
    around a running engine must not hide it.
    """


class InvalidInputError(UsageError, ValueError):
    """An argument refused before anything ran: an invalid history, a tool list with
    duplicate names, a schema that is not a JSON Schema object, a limit that is not a
    positive integer."""


class StepDeclarationError(InvalidInputError):
    """A declared step (``statemachine.core.steps``) refused before anything runs: its
    message names the step and the rule of the loop its declaration would break."""


class DiagramError(UsageError):
    """A diagram cannot be drawn as asked (unknown format, missing renderer, bad table)."""


class UnknownRunError(UsageError):
    """No durable run has this run id."""


class NotPendingError(UsageError):
    """A decision for a call that is not waiting for one (unknown or already decided),
    or an answer to a question that is not pending (``AgentRun.answer``)."""


class RunClosedError(UsageError):
    """A message to a durable run that has ended, or that ended before it took the
    message: it reaches no model (start a new run with it)."""


class SessionBusyError(UsageError):
    """A run was asked to use a session (``statemachine.sessions``) that another run
    in this process is using: the second run is refused before it reads anything, so
    two runs never interleave their turns in one history."""


class InstructionsError(UsageError):
    """The run's instructions function raised, or returned something that is not a
    string: the model call it was for is not made, and the run ends ``Failed`` with an
    explanation naming this error and what the function raised."""


class DelegationDepthError(UsageError):
    """An agent run as a tool (``Agent.as_tool``) would nest deeper than its
    ``max_depth`` (an agent that is its own sub-agent, or a long delegation chain):
    the sub-agent is not run, and the call's error result names this error."""


class OutputTypeChangedError(UsageError):
    """A run is resumed with an ``output_type`` whose JSON Schema is not the one the
    suspended run showed the model (the application's type changed in between):
    refused before anything runs, since the model's answers were given to the other
    schema. Resume with the type the run started with, or without one (the output is
    then the validated JSON)."""


# -- bad data from outside ----------------------------------------------------------


class BadDataError(StateMachineError, ValueError):
    """Data from outside the calling code cannot be used as it is: a stored or received
    document (snapshot, journal, wire message, scenario file), or a model's or a
    tool's output. The message names where the problem is."""


class WireFormatError(BadDataError):
    """A message, event or engine document that does not have the wire shape; the
    message starts with the path of the bad field."""


class SnapshotError(WireFormatError):
    """A snapshot refused by ``Engine.restore`` before anything ran: malformed, too
    large or too deep, inconsistent with itself (its pending calls are not the
    unanswered calls of its last assistant message...), or refused by the policy when
    asked again on resume. The message starts with the path of the bad field
    (``snapshot.batch[1].call``)."""


class SnapshotSignatureError(SnapshotError):
    """A key was given to restore, and the snapshot's signature is missing or does
    not match it: the snapshot was not written by a holder of the key, or was changed
    since."""


class JournalError(BadDataError):
    """A journal that cannot be read or does not replay to what it records.

    ``line`` is the 1-based line number where the problem shows (0 if the journal
    could not be opened at all).
    """

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"journal line {line}: {message}" if line else message)
        self.line = line


class SessionDataError(BadDataError):
    """A conversation session's stored history cannot be used: a row that is not a
    message in the wire form, too large, a history that breaks the pairing of calls and
    results, or a file that is not the session database. The message names the session
    and the row."""


class ExportError(BadDataError):
    """A durable run whose saved steps do not rebuild its recorded result."""


class SpecError(BadDataError):
    """A scenario file that is not a valid scenario; the message names file and key."""


class ModelOutputError(BadDataError):
    """The model client returned something that is not an ``AssistantMessage``, or a
    hook that shapes its request failed."""


class ToolOutputError(BadDataError):
    """A tool returned a value of a type that cannot become a tool result."""


# -- a service the run depends on failed ----------------------------------------------


class CompactionError(BadDataError):
    """A compaction of the model's view refused (``statemachine.agent.compaction``): the
    view would split a tool call from its result, or the summary is empty or longer
    than its bound. Inside a run it is the compaction step's failure, a named outcome."""


class ServiceError(StateMachineError):
    """A service outside the process failed: a model provider, an MCP server, the
    durable runs' database or backend, a bridged peer. The message says what to do
    about it."""


class ProviderError(ServiceError):
    """A model provider failed; the text says how and what to do."""


class ProviderAuthError(ProviderError):
    """401/403: the key is missing, wrong, or lacks permission. Never retried."""


class ProviderUnavailableError(ProviderError):
    """Rate limits, overload or server errors outlasted the retry budget."""


class ContextOverflowError(ProviderError):
    """The request is longer than the model's context window: compact and retry."""


class ProviderRequestError(ProviderError):
    """The provider refused the request as invalid (a 4xx other than auth and limits)."""


class ProviderResponseError(ProviderError):
    """The provider sent something the SDK could not validate or we could not use."""


class ProviderLimitError(ProviderError):
    """A response outgrew a limit of the adapter (total time, idle time, size).

    Never retried, by the adapter or the loop: a retry would meet the same limit. The
    text names the URL, the model and the limit.
    """


class MCPError(ServiceError):
    """An MCP server could not be reached, listed, or answered a call with an error."""


class StoreUnavailableError(ServiceError):
    """The runs' database cannot be reached or opened (the message names it, with
    any password hidden); nothing was changed in it. Also a session's SQLite file held
    locked by another writer for longer than the session's ``timeout``."""


class RunHeldError(ServiceError):
    """A durable run is held: the code of the worker that took it does not fit what the
    run recorded (the message names the model, tool or hook), or it waits for a worker
    of its application version. An operator resumes it on a compatible worker or ends
    it (``DBOSRunner.resume_held``, ``DBOSRunner.end_held``)."""


class RunFailedError(ServiceError):
    """A durable run did not end with a result: the backend gave up on it (the message
    says why) or an operator ended it (with the explanation given)."""


class BridgeError(ServiceError, RuntimeError):
    """The peer process did not hold up its side of the bridge protocol."""


class BridgeProtocolError(BridgeError):
    """The peer sent a line that is not a valid protocol message."""


class BridgeTimeoutError(BridgeError):
    """The peer stayed silent longer than the silence timeout.

    Deliberately not a ``TimeoutError``: ``run_scenario`` reads a ``TimeoutError`` as
    its own whole-run timeout and would hide this more precise message.
    """


# -- how a run that is not Done explains itself -----------------------------------------


class RunNotDoneError(StateMachineError):
    """A run returned in a state other than ``Done``: a terminal state, or
    ``AwaitingUser``, from which it resumes; the message says why."""


class AbortedError(RunNotDoneError):
    """The run was aborted (by the caller's signal or by the model's own report)."""


class TurnLimitExceededError(RunNotDoneError):
    """The turn limit was reached while the model still had work to do."""


class ModelFailedError(RunNotDoneError):
    """The model provider failed in a way that retrying in the loop will not fix."""


class AwaitingUserError(RunNotDoneError):
    """The run stopped to wait for a person (a call was denied by policy)."""


class UsageLimitExceededError(RunNotDoneError):
    """A usage limit (requests or tokens) was reached while the model still had work
    to do; the message names the limit, the usage so far and the last operation."""


class OutputInvalidError(RunNotDoneError):
    """The model did not give a valid final result within the retry budget; the
    message names the last validation error."""


class ToolRetriesExceededError(RunNotDoneError):
    """A tool asked the model to try again (``ModelRetry``) more often in a row than
    its ``retries`` allow; the message names the tool and its last message."""


# -- the library's own bug -----------------------------------------------------------


class StepEndedError(RunNotDoneError):
    """A declared step ended the run in one of its own terminal states."""


class EngineInvariantError(StateMachineError):
    """The engine broke one of its own guarantees: a bug in the library or in a
    patched table, never something a caller's input can cause. For example, internal
    transitions that do not settle after one event. ``trace`` holds the transitions
    that led there, oldest first.
    """

    def __init__(self, message: str, trace: Sequence[TransitionRecord] = ()) -> None:
        super().__init__(message)
        self.trace: tuple[TransitionRecord, ...] = tuple(trace)


# -- raised for code outside the library (not StateMachineError) -------------------------


class NotExpressibleError(Exception):
    """Raised by a conformance adapter when a scenario asks for something its peer
    cannot express (a stop reason its model interface has no value for, an abort it
    has no way to receive). The run is set aside, not judged: the report counts such
    scenarios with the reason, and the search goes on. Raise this class itself (not a
    subclass), from the adapter's model or loop, with a sentence that says what the
    peer lacks."""


class ScriptedToolError(RuntimeError):
    """What a scripted tool of the kit with outcome ``raise`` raises: an exception of
    the tool's own, as a real tool's would be, which the loop under test must turn
    into an error result."""


class StrayCancelledError(Exception):
    """User code (a hook, a tool) raised ``CancelledError`` although nothing cancelled
    its task; the driver reports it as that code's failure instead of letting it
    cancel the run."""


# -- a request, not trouble ------------------------------------------------------------


class ModelRetry(StateMachineError):  # noqa: N818 - the name PydanticAI users know
    """Raised by a tool or an output validator to ask the model to try again: the
    message is what the model reads (the call's error result, or the answer to its
    final result). A tool's retries are counted against its own budget
    (``Tool(retries=...)``, ``@tool(retries=...)``) and an output's against
    ``output_retries``; past the budget the run ends in a named state
    (``ToolRetriesExceeded``, ``OutputInvalid``). Not an error of the library: it
    never escapes a run."""
