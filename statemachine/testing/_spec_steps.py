"""Declared steps in a spec file: ``[[steps]]``, each a ``Step`` whose answers are
scripted, as the model's are.

A step is declared as in Python (a name, a point, its outcomes and their
destinations) and answers, each time it runs, the next of its ``answers``: an
outcome's name, or ``"outcome: message"`` for an outcome with a message (a retry's,
sent back to the model). A step asked once more than its answers raises, so the run
takes the step's ``on_error`` outcome and the spec's expectations say so. Destinations
are written ``"go_on"``, ``{ retry = N, then = "outcome" }`` (``then`` optional) and
``{ end = "State", explanation = "..." }``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from statemachine.agent.steps import Decision, Step, check_steps
from statemachine.core.messages import Message
from statemachine.core.steps import DEFAULT_RETRY_BUDGET, Destination, End, GoOn, Retry
from statemachine.errors import InvalidInputError
from statemachine.testing._spec_reader import Reader

__all__ = ["StepScript", "read_steps"]

_STEP = {"name", "point", "outcomes", "answers", "on_error"}
_RETRY = {"retry", "then"}
_END = {"end", "explanation"}


@attrs.frozen
class StepScript:
    """One ``[[steps]]`` table: the declaration, and the answers in the order given."""

    name: str
    point: str
    outcomes: Mapping[str, Destination]
    answers: tuple[str, ...]
    on_error: str | None = None

    def step(self) -> Step:
        """A new ``Step`` that answers from the start of the script (one per run, so a
        repeated spec runs the same script each time)."""
        answers = iter(self.answers)

        def answer(messages: Sequence[Message]) -> Decision:
            try:
                given = next(answers)
            except StopIteration:
                raise RuntimeError(
                    f"the step {self.name} ran more often than its {len(self.answers)} answer(s)"
                ) from None
            outcome, _, message = given.partition(":")
            return Decision(outcome.strip(), message.strip())

        return Step(self.name, self.point, self.outcomes, answer, on_error=self.on_error)

    @property
    def ends(self) -> set[str]:
        """The states the step's ``End`` destinations name."""
        return {d.state for d in self.outcomes.values() if isinstance(d, End)}


def _destination(r: Reader, data: Any, where: str) -> Destination:
    if data == "go_on":
        return GoOn()
    if isinstance(data, Mapping) and "end" in data:
        table = r.table(data, where, _END)
        return End(r.get(table, "end", str, where), r.get(table, "explanation", str, where, ""))
    if isinstance(data, Mapping) and "retry" in data:
        table = r.table(data, where, _RETRY)
        budget = r.get(table, "retry", int, where, DEFAULT_RETRY_BUDGET)
        return Retry(budget, r.get(table, "then", str, where))
    raise r.fail(where, 'write "go_on", { retry = N, then = "outcome" } or { end = "State", ... }')


def read_steps(r: Reader, top: Mapping[str, Any]) -> tuple[StepScript, ...]:
    """The file's ``[[steps]]``, each declaration checked now (``SpecError`` naming the
    step, with the rule a refused declaration breaks)."""
    scripts = []
    for i, raw in enumerate(r.get(top, "steps", list, "(top level)", [])):
        where = f"steps[{i}]"
        table = r.table(raw, where, _STEP)
        outcomes = r.get(table, "outcomes", Mapping, where, {})
        script = StepScript(
            name=r.get(table, "name", str, where, ""),
            point=r.get(table, "point", str, where, ""),
            outcomes={
                str(k): _destination(r, v, f"{where}.outcomes.{k}") for k, v in outcomes.items()
            },
            answers=r.strings(table, "answers", where),
            on_error=r.get(table, "on_error", str, where),
        )
        try:
            check_steps([script.step()])
        except InvalidInputError as exc:
            raise r.fail(where, str(exc)) from None
        scripts.append(script)
    try:
        check_steps([script.step() for script in scripts])  # together, as a run takes them
    except InvalidInputError as exc:
        raise r.fail("steps", str(exc)) from None
    return tuple(scripts)
