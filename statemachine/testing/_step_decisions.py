"""The decisions a team's steps made in one run, and what the table makes of them.

A run with steps (``agent_loop(steps=[...])``) does not follow from its scenario
alone: a guardrail may end the run in its own state, or send an answer back for one
more model call. What the steps *answered* is recorded as the driver hands each
``StepDecided`` to the engine (``recording_engines``), before the engine interprets
it, so a loop that ignores an answer (takes a retry as going on, ends ``Done`` where
the step ended the run) is still judged by the answer. ``StepPlan`` then replays the
answers through the steps' declarations and the table's rules (``core/steps.py``,
rule 15 of ``core/table.py``): which steps run at a point and in which order, where
each outcome leads, a retry's budget, a spent retry leading as its ``then``. It never
reads where the run went: ``expected_run`` derives the end and the model-call count
from the scenario and these answers.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import attrs

from statemachine.core.engine import Engine
from statemachine.core.events import StepDecided
from statemachine.core.steps import End, Point, Retry, StepSpec
from statemachine.core.table import DeclaredState, State

__all__ = ["DecisionLog", "StepPlan", "Verdict", "recording_decisions", "recording_engines"]


@attrs.define
class DecisionLog:
    """What one run's engine was told: the steps of its table, and each ``StepDecided``
    as ``(step name, outcome)``, in the order handed over."""

    steps: tuple[StepSpec, ...] = ()
    decisions: list[tuple[str, str]] = attrs.Factory(list)


# The log of the scenario being run. The run's tasks inherit it from the runner's
# context, so two scenarios run at once never share a log.
_LOG: ContextVar[DecisionLog | None] = ContextVar("statemachine_kit_decisions", default=None)


@contextlib.contextmanager
def recording_decisions() -> Iterator[DecisionLog]:
    """Collect the decisions of the engines built inside (``recording_engines``)."""
    log = DecisionLog()
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def recording_engines(factory: Callable[..., Engine]) -> Callable[..., Engine]:
    """``factory`` (an ``engine_factory``) whose engines note each ``StepDecided`` they
    are handed in the log of the scenario being run, before they apply it."""

    def build(**options: Any) -> Engine:
        engine = factory(**options)
        log = _LOG.get()
        if log is None:
            return engine
        table = options.get("table")
        log.steps = tuple(table.steps) if table is not None else ()
        handle = engine.handle

        def noted(event: Any) -> Any:
            if isinstance(event, StepDecided):
                log.decisions.append((event.step, event.outcome))
            return handle(event)

        # The driver calls ``engine.handle``: the one place every decision passes.
        setattr(engine, "handle", noted)  # noqa: B010 - mypy refuses assigning a method
        return engine

    return build


@attrs.frozen
class Verdict:
    """What the steps at a point made of the run: ``state`` ends it there (a declared
    end, or the live state of a step that never answered); ``None`` is a retry."""

    state: State | None
    reason: str


class StepPlan:
    """The recorded answers, consumed in order as the table runs the steps."""

    def __init__(self, steps: Sequence[StepSpec], decisions: Sequence[tuple[str, str]]) -> None:
        self._steps = tuple(steps)
        self._answers: dict[str, deque[str]] = {}
        for step, outcome in decisions:
            self._answers.setdefault(step, deque()).append(outcome)
        self._spent: Counter[str] = Counter()

    def at(self, point: Point, where: str) -> Verdict | None:
        """Run the steps of ``point`` (``where``: in words); ``None``: the run goes on."""
        for step in (s for s in self._steps if s.point is point):
            answers = self._answers.get(step.name)
            if not answers:
                return Verdict(
                    step.state,
                    f"the step {step.name} runs {where}, but it answered nothing there",
                )
            outcome = answers.popleft()
            dest = step.destination(outcome)
            said = f"the step {step.name} answered {outcome!r} {where}"
            if isinstance(dest, Retry):
                if self._spent[step.name] < dest.budget:
                    self._spent[step.name] += 1
                    return Verdict(None, f"{said}: back to the model")
                outcome = step.retry_then(dest)
                said += f" with its {dest.budget} retries spent, so as {outcome!r}"
                dest = step.destination(outcome)
            if isinstance(dest, End):
                return Verdict(_end_state(dest), f"{said}: {dest.explanation}")
            if dest is None:
                return Verdict(step.state, f"{said}, an outcome it did not declare")
        return None

    def unused(self) -> list[str]:
        """Answers the table never asked for: a step run more often than it runs."""
        return [
            f"the step {name} answered {len(left)} time(s) more than the table runs it "
            f"(first unasked answer: {left[0]!r})"
            for name, left in sorted(self._answers.items())
            if left
        ]


def _end_state(end: End) -> State:
    return DeclaredState(end.state, True, end.explanation)
