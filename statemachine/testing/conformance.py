"""``run_conformance``: generated scenarios through any loop, with shrunk failures.

The search is Hypothesis's own: ``hypothesis.find`` generates scenarios until one
violates a property, then shrinks it to a minimal counterexample, so a failure
reads as the smallest script that breaks the loop (one model call, one tool call...)
rather than the random one that first did. Each scenario runs twice when I5
(determinism) is among the properties checked.

The whole search runs on one private event loop (``asyncio.Runner``), so it must be
called from synchronous code; every example gets a fresh scripted model and fresh
tools.
"""

from __future__ import annotations

import asyncio
import builtins
import random
from collections.abc import Callable, Iterator, Sequence

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from .._messages import Message, StopReason
from .properties import PROPERTY_TITLES, check_record
from .scenario import (
    DEFAULT_HISTORY,
    AbortAt,
    AbortKind,
    AgentLoop,
    ModelTurn,
    RunRecord,
    Scenario,
    ToolBehaviour,
    run_scenario_async,
)
from .strategies import scenarios as default_scenarios
from .transcript import render_transcript

__all__ = ["ConformanceReport", "Failure", "run_conformance"]


@attrs.frozen
class Failure:
    """One property a loop broke, on the shrunk scenario that shows it."""

    property: str  # "I1" ... "I8"
    title: str  # "pairing", "order", ...
    scenario: Scenario
    transcript: tuple[Message, ...] | None
    problems: tuple[str, ...]

    @builtins.property  # the field ``property`` shadows the builtin in this body
    def sentence(self) -> str:
        """What went wrong, in one sentence a person can read."""
        return f"{self.property} {self.title} is violated: " + "; ".join(self.problems)

    def describe(self) -> str:
        """The sentence, the shrunk scenario and the transcript, for a report."""
        transcript = (
            render_transcript(self.transcript)
            if self.transcript is not None
            else "  (the loop gave no history)"
        )
        return (
            f"{self.sentence}\n  scenario:\n"
            + _indent(self.scenario.describe(), 4)
            + "\n  transcript:\n"
            + _indent(transcript, 4)
        )


@attrs.frozen
class ConformanceReport:
    """What ``run_conformance`` found."""

    failures: tuple[Failure, ...]
    examples_run: int  # scenarios generated and run before a failure (or in all)
    shrink_runs: int  # scenarios run while shrinking a failure
    seed: int  # pass it back to ``run_conformance`` to repeat the search
    properties: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """True when no property was violated."""
        return not self.failures

    @property
    def failed_properties(self) -> tuple[str, ...]:
        """The names of the violated properties, sorted."""
        return tuple(f.property for f in self.failures)

    def summary(self) -> str:
        """A readable report: the verdict, then each failure in full."""
        head = (
            f"{'passed' if self.passed else 'FAILED'}: {self.examples_run} generated "
            f"scenario(s), properties {', '.join(self.properties)}, seed {self.seed}"
        )
        if self.passed:
            return head
        body = "\n".join(f.describe() for f in self.failures)
        return f"{head}; shrunk in {self.shrink_runs} run(s)\n{body}"

    def __str__(self) -> str:
        return self.summary()


def _candidates(s: Scenario) -> Iterator[Scenario]:
    """Smaller or plainer variants of ``s``, most drastic first.

    Hypothesis shrinks the choices behind a scenario; this pass shrinks the scenario
    itself (drop a response, drop a call, restore a default), which removes the
    leftovers the generic shrinker cannot see are irrelevant, such as responses
    past the turn limit.
    """
    abort = s.abort
    if abort.kind is not AbortKind.NEVER:
        yield attrs.evolve(s, abort=AbortAt())
    for t in range(len(s.turns), 0, -1):
        if abort.kind in (AbortKind.MODEL_CALL, AbortKind.TOOL_START) and abort.turn == t:
            continue
        new_abort = abort
        if abort.kind in (AbortKind.MODEL_CALL, AbortKind.TOOL_START) and abort.turn > t:
            new_abort = attrs.evolve(abort, turn=abort.turn - 1)
        yield attrs.evolve(s, turns=s.turns[: t - 1] + s.turns[t:], abort=new_abort)
    for t, turn in enumerate(s.turns, 1):
        for c in range(len(turn.calls) - 1, -1, -1):
            targeted = abort.kind is AbortKind.TOOL_START and abort.turn == t
            if targeted and abort.call == c:
                continue
            new_abort = abort
            if targeted and abort.call > c:
                new_abort = attrs.evolve(abort, call=abort.call - 1)
            calls = turn.calls[:c] + turn.calls[c + 1 :]
            turns = (*s.turns[: t - 1], attrs.evolve(turn, calls=calls), *s.turns[t:])
            yield attrs.evolve(s, turns=turns, abort=new_abort)
    if s.history != DEFAULT_HISTORY:
        yield attrs.evolve(s, history=DEFAULT_HISTORY)
    for limit in range(1, s.max_turns):
        yield attrs.evolve(s, max_turns=limit)
    for t, turn in enumerate(s.turns, 1):
        plain = ModelTurn(calls=turn.calls, stop_reason=turn.stop_reason, raises=turn.raises)
        for variant in (plain, attrs.evolve(turn, stop_reason=StopReason.TOOL_USE)):
            if variant != turn:
                yield attrs.evolve(s, turns=(*s.turns[: t - 1], variant, *s.turns[t:]))
        for c, call in enumerate(turn.calls):
            for variant_call in (
                attrs.evolve(call, behaviour=ToolBehaviour()),
                attrs.evolve(call, call_id=None),
            ):
                if variant_call != call:
                    calls = (*turn.calls[:c], variant_call, *turn.calls[c + 1 :])
                    turns = (*s.turns[: t - 1], attrs.evolve(turn, calls=calls), *s.turns[t:])
                    yield attrs.evolve(s, turns=turns)


def _simplify(scenario: Scenario, still_fails: Callable[[Scenario], bool]) -> Scenario:
    """Greedily apply the first variant that still fails, until none does."""
    changed = True
    while changed:
        changed = False
        for candidate in _candidates(scenario):
            if still_fails(candidate):
                scenario = candidate
                changed = True
                break
    return scenario


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def run_conformance(
    loop: AgentLoop,
    *,
    max_examples: int = 100,
    seed: int | None = None,
    properties: Sequence[str] = tuple(PROPERTY_TITLES),
    scenarios: st.SearchStrategy[Scenario] | None = None,
    max_shrink_runs: int = 300,
    timeout: float = 10.0,
    hang_limit: float = 1.0,
) -> ConformanceReport:
    """Run up to ``max_examples`` generated scenarios through ``loop``.

    ``loop`` is called as ``await loop(model=..., tools=..., messages=...,
    max_turns=..., signal=...)`` and returns a message sequence (objects or wire
    dicts) or a ``RunResult``; ``statemachine.testing.agent_loop()`` adapts
    ``run_agent``. The first scenario that violates one of ``properties`` is shrunk
    (at most ``max_shrink_runs`` more runs) and reported with every property it
    violates. ``seed`` makes the search repeatable; the report carries the one used.
    ``timeout`` bounds one run; ``hang_limit`` is how long a hanging scripted call
    waits to be cancelled.
    """
    props = tuple(sorted(properties))
    unknown = sorted(set(props) - set(PROPERTY_TITLES))
    if unknown:
        raise ValueError(
            f"unknown property name(s) {', '.join(unknown)}; known: {', '.join(PROPERTY_TITLES)}"
        )
    if not isinstance(max_examples, int) or max_examples < 1:
        raise ValueError(f"max_examples must be a positive integer, got {max_examples!r}")
    if not callable(loop):
        raise TypeError(f"loop must be an async callable, got {type(loop).__name__}")
    strategy = scenarios if scenarios is not None else default_scenarios()
    seed = random.randrange(2**32) if seed is None else seed
    counts = {"generated": 0, "shrink": 0}
    found = False

    with asyncio.Runner() as runner:
        # Keyed by repr: scenarios hold read-only mappings, so they do not hash. The
        # cache also makes the search consistent for a loop whose result varies
        # between runs (Hypothesis replays examples and would call it flaky): such a
        # loop is reported through I5 instead.
        cache: dict[str, tuple[RunRecord, dict[str, list[str]]]] = {}

        def evaluate(
            scenario: Scenario,
        ) -> tuple[RunRecord, dict[str, list[str]]]:
            key = repr(scenario)
            if key in cache:
                return cache[key]
            first = runner.run(
                run_scenario_async(loop, scenario, timeout=timeout, hang_limit=hang_limit)
            )
            second = None
            if "I5" in props:
                second = runner.run(
                    run_scenario_async(loop, scenario, timeout=timeout, hang_limit=hang_limit)
                )
            cache[key] = (first, check_record(first, second, properties=props))
            return cache[key]

        def violates(scenario: Scenario) -> bool:
            nonlocal found
            if found:
                if repr(scenario) in cache:
                    return bool(cache[repr(scenario)][1])
                if counts["shrink"] >= max_shrink_runs:
                    return False  # budget spent: keep the smallest failure so far
                counts["shrink"] += 1
            else:
                counts["generated"] += 1
            _, problems = evaluate(scenario)
            if problems:
                found = True
            return bool(problems)

        try:
            shrunk = find(
                strategy,
                violates,
                settings=settings(
                    max_examples=max_examples,
                    database=None,
                    deadline=None,
                    phases=[Phase.generate, Phase.shrink],
                    suppress_health_check=list(HealthCheck),
                ),
                random=random.Random(seed),
            )
        except NoSuchExample:
            return ConformanceReport((), counts["generated"], 0, seed, props)
        shrunk = _simplify(shrunk, violates)
        record, problems = evaluate(shrunk)
    failures = tuple(
        Failure(name, PROPERTY_TITLES[name], shrunk, record.transcript, tuple(sentences))
        for name, sentences in sorted(problems.items())
    )
    return ConformanceReport(failures, counts["generated"], counts["shrink"], seed, props)
