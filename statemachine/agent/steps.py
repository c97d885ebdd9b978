"""A team's own steps, run by the driver: a declaration (``core/steps.py``) and its
function, and the library's guardrails built on them.

A ``Step`` is what a team writes: a name, a point, the outcomes and where each leads
(``GoOn``, ``Retry``, ``End``), and a function. The function takes the history (and,
when its first parameter is annotated ``RunContext``, the run's context first), sync or
async, and returns an outcome's name, or a ``Decision`` (an outcome with a message:
the text sent back to the model on a retry, or added to the explanation when the run
ends). The engine asks for the step in the step's state (``RunStep``); the driver
calls the function and answers with one ``StepDecided``.

When the step fails, the driver answers for it with the step's ``on_error`` outcome
(default: its only ``End``, so a broken guardrail fails closed), the message saying
what happened: the function raised, ran past its ``timeout`` (default
``DEFAULT_STEP_TIMEOUT``), returned something that is not an outcome it declared, or a
message longer than ``MAX_STEP_MESSAGE_CHARS``. Abort while a step runs ends the run
at once and cancels the step's task. A sync function runs on the event loop, as hooks
do: keep it short, or make it async.

The guardrails (``output_guardrail``, ``input_guardrail``) are steps with the outcomes
already named, so that every team's guardrail has the same states in its diagram.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import attrs

from statemachine.agent.calls import call_hook, describe
from statemachine.core.events import StepDecided
from statemachine.core.messages import AssistantMessage, Message, TextContent, UserMessage
from statemachine.core.steps import (
    DEFAULT_RETRY_BUDGET,
    MAX_STEP_MESSAGE_CHARS,
    Destination,
    End,
    GoOn,
    Point,
    Retry,
    StepSpec,
    table_for,
)
from statemachine.core.table import Table
from statemachine.errors import InvalidInputError

__all__ = [
    "DEFAULT_STEP_TIMEOUT",
    "Decision",
    "Step",
    "StepFunction",
    "check_steps",
    "decide",
    "input_guardrail",
    "output_guardrail",
]

DEFAULT_STEP_TIMEOUT: Final = 30.0
"""Seconds a step's function may run before the driver answers with ``on_error``."""


@attrs.frozen
class Decision:
    """What a step's function returns when it has something to say: the ``outcome``
    and a ``message`` (to the model on a retry; into the explanation on an end)."""

    outcome: str
    message: str | None = None


StepFunction: TypeAlias = Callable[..., "str | Decision | Awaitable[str | Decision]"]
"""``(messages)`` or ``(ctx: RunContext, messages)``, sync or async: an outcome's name
or a ``Decision``."""


def _positive_seconds(instance: object, attribute: Any, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidInputError(f"{attribute.name} must be a positive number of seconds")


@attrs.frozen(init=False)
class Step:
    """A declared step and the function the driver calls for it.

    ``Step(name, point, outcomes, function)``: ``point`` is ``"before_model"`` or
    ``"after_final"``; ``outcomes`` maps each outcome's name to ``GoOn()``,
    ``Retry(budget=2, then=...)`` or ``End(state, explanation)``, in the order the
    rows are tried; ``on_error`` is the outcome a failing step answers with;
    ``timeout`` bounds one call of ``function`` (module docstring).
    """

    spec: StepSpec
    function: StepFunction
    timeout: float = attrs.field(default=DEFAULT_STEP_TIMEOUT, validator=_positive_seconds)

    def __init__(
        self,
        name: str,
        point: Point | str,
        outcomes: Mapping[str, Destination],
        function: StepFunction,
        *,
        on_error: str | None = None,
        timeout: float = DEFAULT_STEP_TIMEOUT,
    ) -> None:
        if not callable(function):
            raise InvalidInputError(f"step {name!r}: function must be callable")
        spec = StepSpec(name, point, outcomes, on_error)
        self.__attrs_init__(spec, function, timeout)

    @property
    def name(self) -> str:
        return self.spec.name


def check_steps(steps: Sequence[Step]) -> Table:
    """The table of a run with ``steps`` (``BASE_TABLE`` for none), or
    ``InvalidInputError`` (a ``StepDeclarationError`` for a declaration that would
    break a rule) before anything runs."""
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
        raise InvalidInputError("steps must be a sequence of Step")
    for i, item in enumerate(steps):
        if not isinstance(item, Step):
            raise InvalidInputError(f"steps[{i}] is a {type(item).__name__}, not a Step")
    return table_for([s.spec for s in steps])


async def decide(
    step: Step,
    messages: Sequence[Message],
    note_failure: Callable[[BaseException, str], None] | None = None,
) -> tuple[StepDecided, str | None]:
    """Call ``step``'s function and make its answer the engine's ``StepDecided``; the
    second value says why the step failed (``None``: it answered). ``CancelledError``
    (an abort) is let through; ``note_failure`` is told of what the function raised
    (the action loop's: a ``KeyboardInterrupt`` then aborts the run)."""
    spec = step.spec
    try:
        value: object = await asyncio.wait_for(call_hook(step.function, messages), step.timeout)
    except TimeoutError:
        return _failed(spec, f"the step {spec.name} ran past its timeout of {step.timeout:g} s")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken step ends in its on_error outcome
        if note_failure is not None:
            note_failure(exc, f"the step {spec.name}")
        return _failed(spec, f"the step {spec.name} raised {describe(exc)}")
    decision = Decision(value) if isinstance(value, str) else value
    if not isinstance(decision, Decision) or not isinstance(decision.outcome, str):
        return _failed(
            spec, f"the step {spec.name} returned {type(value).__name__}, not an outcome"
        )
    if spec.destination(decision.outcome) is None:
        return _failed(
            spec, f"the step {spec.name} answered {decision.outcome!r:.60}, not one of its outcomes"
        )
    message = decision.message
    if message is not None and (
        not isinstance(message, str) or len(message) > MAX_STEP_MESSAGE_CHARS
    ):
        return _failed(
            spec,
            f"the step {spec.name} gave a message that is not a string of at most "
            f"{MAX_STEP_MESSAGE_CHARS} characters",
        )
    return StepDecided(spec.name, decision.outcome, message or ""), None


def _failed(spec: StepSpec, why: str) -> tuple[StepDecided, str]:
    return StepDecided(spec.name, spec.error_outcome, why), why


# -- the library's guardrails ----------------------------------------------------------------

Check: TypeAlias = Callable[..., "str | Awaitable[str | None] | None"]
"""A guardrail's check: ``(text)`` or ``(ctx: RunContext, text)``, sync or async;
``None`` lets the text pass, a string is the reason it does not."""


def output_guardrail(
    name: str,
    check: Check,
    *,
    state: str = "OutputBlocked",
    explanation: str = "an output guardrail blocked the answer",
    retries: int = DEFAULT_RETRY_BUDGET,
    timeout: float = DEFAULT_STEP_TIMEOUT,
) -> Step:
    """A step after the final answer: ``check(text)`` of the answer returns ``None``
    (``passed``: the run ends ``Done``) or a reason (``retry``: the reason goes back to
    the model, up to ``retries`` times; then ``tripped``: the run ends in ``state``).
    With ``retries=0`` a failed check trips at once. A check that raises or times out
    trips (fails closed)."""

    async def run(messages: Sequence[Message]) -> Decision:
        reason = await call_hook(check, _last_answer(messages))
        if reason is None:
            return Decision("passed")
        return Decision("retry", str(reason))

    return Step(
        name,
        Point.AFTER_FINAL,
        {
            "passed": GoOn(),
            "retry": Retry(retries, then="tripped"),
            "tripped": End(state, explanation),
        },
        run,
        on_error="tripped",
        timeout=timeout,
    )


def input_guardrail(
    name: str,
    check: Check,
    *,
    state: str = "InputBlocked",
    explanation: str = "an input guardrail refused the request",
    timeout: float = DEFAULT_STEP_TIMEOUT,
) -> Step:
    """A tripwire before each model call: ``check(text)`` of the user's messages not
    yet seen by the model (those after its last answer; none: it passes without a
    call) returns ``None`` (``passed``) or a reason (``tripped``: the run ends in
    ``state`` before the model sees them; every tool call already made has its
    result). A check that raises or times out trips (fails closed)."""

    async def run(messages: Sequence[Message]) -> Decision:
        text = _new_user_text(messages)
        if not text:
            return Decision("passed")
        reason = await call_hook(check, text)
        return Decision("passed") if reason is None else Decision("tripped", str(reason))

    return Step(
        name,
        Point.BEFORE_MODEL,
        {"passed": GoOn(), "tripped": End(state, explanation)},
        run,
        on_error="tripped",
        timeout=timeout,
    )


def _last_answer(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            return message.text
    return ""


def _new_user_text(messages: Sequence[Message]) -> str:
    texts: list[str] = []
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            break
        if isinstance(message, UserMessage):
            texts.append("".join(b.text for b in message.content if isinstance(b, TextContent)))
    return "\n".join(reversed(texts))
