"""Engine events (what a driver tells the engine) and actions (what it asks back).

Both are small frozen classes. An engine event names the trigger it causes; the
transition table (``core/table.py``) says what that trigger does in each state.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, overload

import attrs

from statemachine._deprecated import renamed as _renamed
from statemachine.core.messages import (
    AssistantMessage,
    Message,
    ToolCall,
    UserMessage,
    _validate,
)
from statemachine.core.table import State, Trigger
from statemachine.core.tools import ToolDefinition, ToolOutput

__all__ = [
    "EVENT_TYPES",
    "AbortRequested",
    "Action",
    "ApprovalDecided",
    "ApprovalRequired",
    "CallModel",
    "CancelOperations",
    "CheckContinue",
    "CheckPermission",
    "ContinueDecided",
    "Event",
    "HistoryView",
    "InputKind",
    "InputQueued",
    "ModelCancelled",
    "ModelFailed",
    "ModelResponded",
    "ReturnToCaller",
    "RunStep",
    "Start",
    "StartTool",
    "StepDecided",
    "ToolCancelled",
    "ToolDenied",
    "ToolFinished",
    "ToolPermitted",
]

_str = attrs.validators.instance_of(str)

# The two events of every turn write their own ``__init__``, as the messages do (see
# ``core/messages.py``): exact types pass on one test, anything else meets the field's
# own attrs validator and its error.
_set = object.__setattr__

# -- engine events --------------------------------------------------------------------


@attrs.frozen
class Start:
    """Begin the run: the first model call."""

    trigger: ClassVar[Trigger] = Trigger.START


@attrs.frozen(init=False)
class ModelResponded:
    """The model client returned this assistant message."""

    trigger: ClassVar[Trigger] = Trigger.MODEL_RESPONDED
    message: AssistantMessage = attrs.field(
        validator=attrs.validators.instance_of(AssistantMessage)
    )

    def __init__(self, message: AssistantMessage) -> None:
        _set(self, "message", message)
        if message.__class__ is not AssistantMessage:
            _validate(ModelResponded, "message", self, message)


@attrs.frozen
class ModelFailed:
    """The model client raised; ``error`` is the readable text of the exception."""

    trigger: ClassVar[Trigger] = Trigger.MODEL_FAILED
    error: str = attrs.field(validator=_str)


@attrs.frozen
class ModelCancelled:
    """After an abort, the driver stopped waiting for the model call."""

    trigger: ClassVar[Trigger] = Trigger.MODEL_CANCELLED
    reason: str = attrs.field(default="cancelled after the abort grace period", validator=_str)


@attrs.frozen
class ToolPermitted:
    """The permission hook allowed this call."""

    trigger: ClassVar[Trigger] = Trigger.TOOL_PERMITTED
    call_id: str = attrs.field(validator=_str)


@attrs.frozen
class ToolDenied:
    """The permission hook denied this call. An *advisory* denial lets the run go on
    (the model reads the reason); a policy denial stops it in ``AwaitingUser``."""

    trigger: ClassVar[Trigger] = Trigger.TOOL_DENIED
    call_id: str = attrs.field(validator=_str)
    reason: str = attrs.field(validator=_str)
    advisory: bool = False


@attrs.frozen(init=False)
class ToolFinished:
    """A started tool produced its output (a raise is converted to an error output)."""

    trigger: ClassVar[Trigger] = Trigger.TOOL_FINISHED
    call_id: str = attrs.field(validator=_str)
    output: ToolOutput = attrs.field(validator=attrs.validators.instance_of(ToolOutput))

    def __init__(self, call_id: str, output: ToolOutput) -> None:
        _set(self, "call_id", call_id)
        _set(self, "output", output)
        if call_id.__class__ is not str:
            _validate(ToolFinished, "call_id", self, call_id)
        if output.__class__ is not ToolOutput:
            _validate(ToolFinished, "output", self, output)


@attrs.frozen
class ToolCancelled:
    """After an abort, the driver stopped waiting for this tool."""

    trigger: ClassVar[Trigger] = Trigger.TOOL_CANCELLED
    call_id: str = attrs.field(validator=_str)
    reason: str = attrs.field(default="cancelled after the abort grace period", validator=_str)


@attrs.frozen
class AbortRequested:
    """The run's abort signal fired."""

    trigger: ClassVar[Trigger] = Trigger.ABORT
    reason: str = attrs.field(default="aborted by the caller", validator=_str)


class InputKind(enum.StrEnum):
    """When queued input reaches the model."""

    STEER = "steer"  # at the next turn boundary, before the next model call
    FOLLOW_UP = "follow_up"  # only when the model would otherwise finish


@attrs.frozen
class InputQueued:
    """A message for the model, queued until a turn boundary (or a person's answer
    while the run waits in ``AwaitingUser``)."""

    trigger: ClassVar[Trigger] = Trigger.INPUT_QUEUED
    message: UserMessage = attrs.field(validator=attrs.validators.instance_of(UserMessage))
    kind: InputKind = attrs.field(default=InputKind.STEER, converter=InputKind)


@attrs.frozen
class ApprovalRequired:
    """The permission hook wants a person to approve this call before it runs."""

    trigger: ClassVar[Trigger] = Trigger.APPROVAL_REQUIRED
    call_id: str = attrs.field(validator=_str)
    reason: str = attrs.field(default="", validator=_str)


@attrs.frozen
class ApprovalDecided:
    """A person approved or denied a call that was waiting for approval."""

    trigger: ClassVar[Trigger] = Trigger.APPROVAL_DECIDED
    call_id: str = attrs.field(validator=_str)
    approved: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    reason: str = attrs.field(default="", validator=_str)


@attrs.frozen
class ContinueDecided:
    """The should_continue hook answered at a turn boundary."""

    trigger: ClassVar[Trigger] = Trigger.CONTINUE_DECIDED
    stop: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    reason: str = attrs.field(default="", validator=_str)


@attrs.frozen
class StepDecided:
    """A declared step answered (``core/steps.py``): ``outcome`` is one of the step's
    outcome names; ``message`` (empty: none) goes back to the model when the outcome is
    a retry, and into the explanation when it ends the run."""

    trigger: ClassVar[Trigger] = Trigger.STEP_DECIDED
    step: str = attrs.field(validator=_str)
    outcome: str = attrs.field(validator=_str)
    message: str = attrs.field(default="", validator=_str)


Event: TypeAlias = (
    Start
    | ModelResponded
    | ModelFailed
    | ModelCancelled
    | InputQueued
    | ToolPermitted
    | ToolDenied
    | ApprovalRequired
    | ApprovalDecided
    | ToolFinished
    | ToolCancelled
    | ContinueDecided
    | StepDecided
    | AbortRequested
)

EVENT_TYPES: tuple[type, ...] = (
    Start,
    ModelResponded,
    ModelFailed,
    ModelCancelled,
    InputQueued,
    ToolPermitted,
    ToolDenied,
    ApprovalRequired,
    ApprovalDecided,
    ToolFinished,
    ToolCancelled,
    ContinueDecided,
    StepDecided,
    AbortRequested,
)
"""Every engine event class, one per input trigger."""

# -- actions --------------------------------------------------------------------------


class HistoryView(Sequence[Message]):
    """A read-only view of the first ``length`` messages of a history.

    The history is append-only (I2), so a prefix of it never changes: this view is a
    true snapshot that costs O(1) to make. That keeps the per-turn cost of a model
    call flat however long the history grows.
    """

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[Message], length: int | None = None) -> None:
        self._items = items
        self._length = len(items) if length is None else length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return tuple(self._items[: self._length][index])
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("history index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[Message]:
        # The first ``_length`` items, read by C code (no generator frame per message):
        # a run's result and its stats walk the whole history.
        return itertools.islice(self._items, self._length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == self._length and all(
                a == b for a, b in zip(self, other, strict=False)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"HistoryView({list(self)!r})"


# The two actions the engine makes every turn (CallModel, StartTool) set their slots
# through the slots' own descriptors (below each class): the engine builds them from
# values it has already checked, so there are no validators to run, and this takes
# half the time of the generated ``__init__``.


def _slot(cls: type, name: str) -> Callable[[object, object], None]:
    setter: Callable[[object, object], None] = cls.__dict__[name].__set__
    return setter


@attrs.frozen(init=False)
class CallModel:
    """Call the model with this context and these tool definitions."""

    messages: Sequence[Message]
    tools: tuple[ToolDefinition, ...]
    turn: int

    def __init__(
        self, messages: Sequence[Message], tools: tuple[ToolDefinition, ...], turn: int
    ) -> None:
        _call_model_messages(self, messages)
        _call_model_tools(self, tools)
        _call_model_turn(self, turn)


_call_model_messages = _slot(CallModel, "messages")
_call_model_tools = _slot(CallModel, "tools")
_call_model_turn = _slot(CallModel, "turn")


@attrs.frozen
class CheckPermission:
    """Ask the permission hook about this call; answer with ToolPermitted/ToolDenied."""

    call: ToolCall
    turn: int


@attrs.frozen(init=False)
class StartTool:
    """Run this (validated, permitted) call; answer with ToolFinished."""

    call: ToolCall
    turn: int

    def __init__(self, call: ToolCall, turn: int) -> None:
        _start_tool_call(self, call)
        _start_tool_turn(self, turn)


_start_tool_call = _slot(StartTool, "call")
_start_tool_turn = _slot(StartTool, "turn")


@attrs.frozen
class CancelOperations:
    """Signal these outstanding operations to stop; after the grace period, answer each
    that has not finished with ModelCancelled / ToolCancelled."""

    model: bool
    tool_call_ids: tuple[str, ...]
    reason: str


@attrs.frozen
class CheckContinue:
    """Ask the should_continue hook at this turn boundary; answer with ContinueDecided."""

    turn: int


@attrs.frozen
class RunStep:
    """Run the declared step ``step`` (the run is in its state); answer with
    ``StepDecided``."""

    step: str
    turn: int


@attrs.frozen
class ReturnToCaller:
    """Return to the caller: the run is in a terminal state (it has ended) or in
    ``AwaitingUser`` (it resumes from there with a new message).

    ``RunEnded`` is its deprecated name; wire dicts written with it still read."""

    state: State
    explanation: str


Action: TypeAlias = (
    CallModel
    | CheckPermission
    | StartTool
    | CancelOperations
    | CheckContinue
    | RunStep
    | ReturnToCaller
)


if not TYPE_CHECKING:  # a type checker reports the old name as missing

    def __getattr__(name: str) -> Any:
        return _renamed(__name__, name, {"RunEnded": "ReturnToCaller"}, globals())
