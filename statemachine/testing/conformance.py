"""``run_conformance``: generated scenarios through any loop, with shrunk failures.

``hypothesis.find`` generates scenarios until one violates a property; this module
then shrinks it to a minimal counterexample (``_shrink.simplify``: drop the abort, a
response, a call; lower the limit; move the abort earlier; put each field back to
its plain value), so a failure reads as the smallest script that breaks the loop
(one model call, one tool call...) rather than the random one that first did. Each
scenario runs twice when I5 (determinism) is among the properties checked.

The whole search runs on one private event loop (``asyncio.Runner``), so it must be
called from synchronous code; every example gets a fresh scripted model and fresh
tools.
"""

from __future__ import annotations

import asyncio
import builtins
import random
import re
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeAlias

import attrs
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky, InvalidArgument, NoSuchExample, Unsatisfiable

from statemachine.core.checks import positive_int
from statemachine.core.messages import Message
from statemachine.errors import NotExpressibleError
from statemachine.testing._shrink import simplify
from statemachine.testing._transcript_rules import Level
from statemachine.testing.clock import runner_for
from statemachine.testing.properties import PROPERTY_TITLES, check_pairing, check_record
from statemachine.testing.runner import run_scenario_async
from statemachine.testing.scenario import (
    KNOWN_TOOLS,
    UNKNOWN_TOOL,
    AgentLoop,
    RunRecord,
    Scenario,
)
from statemachine.testing.strategies import scenarios as default_scenarios
from statemachine.testing.transcript import render_transcript

__all__ = ["ConformanceReport", "Failure", "NotExpressibleError", "run_conformance"]


_NOT_EXPRESSIBLE = f"{NotExpressibleError.__name__}: "


@attrs.frozen
class Failure:
    """One property a loop broke, on the shrunk scenario that shows it."""

    property: str  # "I1" ... "I8"
    title: str  # "pairing", "order", ...
    scenario: Scenario
    transcript: tuple[Message, ...] | None
    problems: tuple[str, ...]
    # Each problem with its ids and numbers blanked, and the abort that fired: what
    # tells one defect from another (``per_property`` reports one failure per new shape).
    shapes: tuple[str, ...] = ()

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
    # (property, why) for each property declared not expressible by this peer, and
    # ("scenarios", "N set aside: why") for the runs the adapter set aside
    not_expressible: tuple[tuple[str, str], ...] = ()
    # With id_reuse="warning": (a call id repeated from an earlier turn, as the first
    # run that showed it says it, how many runs showed it alike): reported, not failed
    warnings: tuple[tuple[str, int], ...] = ()

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
        if self.not_expressible:
            head += "\nnot expressible by this peer: " + "; ".join(
                f"{what} ({why})" for what, why in self.not_expressible
            )
        if self.warnings:
            head += "\nwarnings (id_reuse='warning': not failures): " + "; ".join(
                f"{shape} ({runs} run(s))" for shape, runs in self.warnings
            )
        if self.passed:
            return head
        body = "\n".join(f.describe() for f in self.failures)
        return f"{head}; shrunk in {self.shrink_runs} run(s)\n{body}"

    def __str__(self) -> str:
        return self.summary()


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


_TOOL_NAMES = re.compile(rf"\b({'|'.join(map(re.escape, (*KNOWN_TOOLS, UNKNOWN_TOOL)))})\b")


def _shape_in(record: RunRecord, sentence: str) -> str:
    """The shape of a problem in a run: the abort that fired (none, before the start,
    during a model call, ...) tells apart defects whose sentences read alike, such as a
    response replaced after an abort and one changed without any."""
    fired = record.scenario.abort.kind.value if record.abort_fired else "never"
    return f"abort {fired}: {failure_shape(sentence)}"


def failure_shape(sentence: str) -> str:
    """A problem sentence with its quoted values (ids, texts), tool names and numbers
    blanked, and without its parentheses (which say in which circumstance it showed,
    or render a message), so that the same defect on other calls, or after another
    stop, reads the same."""
    shape = re.sub(r"(?<!\w)'[^']*'(?!\w)", "'…'", sentence)  # not the one in "model's"
    shape = _TOOL_NAMES.sub("…", shape)
    shape = re.sub(r"\d+", "N", shape)

    def tags(group: re.Match[str]) -> str:  # "([toolUse] calls …)" -> " [toolUse]"
        return "".join(f" {tag}" for tag in re.findall(r"\[\w+\]", group.group(1)))

    while True:
        bare = re.sub(r"\s*\(([^()]*)\)", tags, shape)
        if bare == shape:
            return shape
        shape = bare


_BATCH = 8
"""Scenarios per Hypothesis test case in ``run_conformance``."""


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
    virtual_time: bool | None = None,
    per_property: bool = False,
    not_expressible: Mapping[str, str] | None = None,
    max_failures_per_property: int = 5,
    id_reuse: Level = "error",
) -> ConformanceReport:
    """Run up to ``max_examples`` generated scenarios through ``loop``.

    ``loop`` is called as ``await loop(model=..., tools=..., messages=...,
    max_turns=..., signal=...)`` and returns a message sequence (objects or wire
    dicts) or a ``RunResult``; ``statemachine.testing.agent_loop()`` adapts
    ``run_agent``. The first scenario that violates one of ``properties`` is shrunk
    (at most ``max_shrink_runs`` more runs) and reported with every property it
    violates. ``seed`` makes the search repeatable (the report carries it); ``timeout``
    bounds one run; ``hang_limit`` is how long a hanging call waits to be cancelled.

    The runs go on an event loop whose clock skips idle waits (``IdleSkippingLoop``),
    so hangs, sleeps, grace periods and timeouts cost no real time. ``virtual_time=False``
    runs them on a plain event loop, as a loop woken by threads of its own or waiting
    for a subprocess needs; by default (``None``) only a loop object with
    ``needs_real_time = True`` (``bridge_loop``) gets one.

    With ``per_property`` each property gets searches of its own (same seed), so the
    report holds every distinct failure: each property the loop breaks, and within one
    property each new shape of failure (``Failure.shapes``: the sentence with its ids
    and numbers blanked), up to ``max_failures_per_property``, each with the smallest
    scenario that shows *it*. By default the search stops at the first scenario that
    breaks any property.

    ``not_expressible`` maps a property to why the peer cannot express what it checks
    (``{"I6": "the peer has no way to receive an abort"}``): it is not searched, and the
    report names it instead of failing it. A run whose adapter raises
    ``NotExpressibleError`` is set aside the same way, counted with its reason.
    ``id_reuse`` as the transcript checker's: an id repeating an earlier turn's fails I1
    (``"error"``, our engine's rule) or goes to ``report.warnings`` (``"warning"``, for a
    loop whose provider accepts it); one id twice in one response fails either way.
    """
    declared = dict(not_expressible or {})
    props = _checked_arguments(
        loop, properties, max_examples, declared, id_reuse, max_failures_per_property
    )
    strategy = scenarios if scenarios is not None else default_scenarios()
    seed = random.randrange(2**32) if seed is None else seed
    budgets = _Budgets(max_examples, max_shrink_runs, timeout, hang_limit, id_reuse)
    groups = [(p,) for p in props] if per_property else [props]
    rounds = max_failures_per_property if per_property else 1
    with runner_for(loop, virtual_time) as runner:
        searches = [_Search(runner, loop, names, budgets) for names in groups]
        failures = [f for search in searches for f in search.failures(strategy, seed, rounds)]
    return _report(failures, searches, seed, props, declared)


def _checked_arguments(
    loop: AgentLoop,
    properties: Sequence[str],
    max_examples: int,
    declared: Mapping[str, str],
    id_reuse: str,
    max_failures_per_property: int,
) -> tuple[str, ...]:
    """The property names to search (sorted, without those ``declared`` not
    expressible); ``ValueError``/``TypeError`` for a bad argument."""
    if max_failures_per_property < 1:
        raise ValueError("max_failures_per_property must be at least 1")
    if id_reuse not in ("error", "warning"):
        raise ValueError(f"id_reuse must be 'error' or 'warning', got {id_reuse!r}")
    unknown = sorted(set(declared) - set(PROPERTY_TITLES))
    if unknown:
        raise ValueError(f"not_expressible names unknown property name(s) {', '.join(unknown)}")
    props = tuple(sorted(properties))
    unknown = sorted(set(props) - set(PROPERTY_TITLES))
    if unknown:
        raise ValueError(
            f"unknown property name(s) {', '.join(unknown)}; known: {', '.join(PROPERTY_TITLES)}"
        )
    positive_int("max_examples", max_examples)
    if not callable(loop):
        raise TypeError(f"loop must be an async callable, got {type(loop).__name__}")
    return tuple(p for p in props if p not in declared)


def _report(
    failures: list[Failure],
    searches: list[_Search],
    seed: int,
    props: tuple[str, ...],
    declared: Mapping[str, str],
) -> ConformanceReport:
    """The report of the searches: their failures and runs, and as notes each property
    declared not expressible and each reason runs were set aside."""
    set_aside: Counter[str] = Counter()
    warned: Counter[str] = Counter()
    first: dict[str, str] = {}
    for search in searches:
        set_aside.update(search.set_aside)
        warned.update(search.warned)
        first = {**search.warned_first, **first}
    notes = tuple(sorted(declared.items())) + tuple(
        ("scenarios", f"{n} set aside: {why}") for why, n in sorted(set_aside.items())
    )
    return ConformanceReport(
        tuple(failures),
        sum(s.generated_total for s in searches),
        sum(s.shrink_total for s in searches),
        seed,
        props,
        notes,
        tuple(sorted((first[shape], runs) for shape, runs in warned.items())),
    )


Verdict: TypeAlias = tuple[RunRecord, dict[str, list[str]]]


@attrs.frozen
class _Budgets:
    """What one search may spend: scenarios generated, runs while shrinking, the time
    one run may take and how long a hanging call waits to be cancelled."""

    max_examples: int
    max_shrink_runs: int
    timeout: float
    hang_limit: float
    id_reuse: Level = "error"


class _Search:
    """One search: the scenarios run so far (cached by content), the budgets, and the
    first failing scenario.

    The cache also makes the search consistent for a loop whose result varies between
    runs (Hypothesis replays examples and would call it flaky): such a loop is
    reported through I5 instead.
    """

    def __init__(
        self, runner: asyncio.Runner, loop: AgentLoop, props: tuple[str, ...], budgets: _Budgets
    ) -> None:
        self._runner, self._loop, self.props, self.budgets = runner, loop, props, budgets
        self.generated = 0
        self.shrink = 0
        self.found = False
        self.cache: dict[Hashable, Verdict] = {}
        # A scenario's history holds read-only mappings, so it does not hash: it is
        # keyed by its repr, computed once per history object (the strategies reuse a
        # few); the rest of a scenario hashes, and is cheaper to hash than to repr.
        self.histories: dict[int, tuple[tuple[Message, ...], str]] = {}
        self.first_failure: list[Scenario] = []
        self.failing_batch: list[Hashable] = []
        self.known: set[str] = set()  # failure shapes already reported (per_property)
        self.target: set[str] = set()  # while shrinking: the shapes being shrunk
        self.set_aside: Counter[str] = Counter()  # NotExpressibleError reasons
        # id_reuse="warning": runs per warning shape, and the first sentence of each
        self.warned: Counter[str] = Counter()
        self.warned_first: dict[str, str] = {}
        self.generated_total = 0
        self.shrink_total = 0

    def failures(
        self, strategy: st.SearchStrategy[Scenario], seed: int, rounds: int
    ) -> list[Failure]:
        """Up to ``rounds`` failures, each of a shape the ones before did not show,
        each shrunk (the scenarios already run are not run again)."""
        out: list[Failure] = []
        for _ in range(rounds):
            self.generated = self.shrink = 0
            self.found, self.first_failure, self.failing_batch = False, [], []
            self.target = set()
            found = self.find(strategy, seed)
            self.generated_total += self.generated
            if found is None:
                break
            # After the first failure, shrink keeping a shape not reported yet (the
            # first may shrink to any failure, the smallest the loop has).
            if self.known:
                self.target = set(self.new_shapes(*self.evaluate(found)))
            shrunk = simplify(found, self.violates)
            self.shrink_total += self.shrink
            record, problems = self.evaluate(shrunk)
            for name, sentences in sorted(problems.items()):
                shapes = tuple(sorted({_shape_in(record, p) for p in sentences}))
                failure = Failure(
                    name, PROPERTY_TITLES[name], shrunk, record.transcript, tuple(sentences), shapes
                )
                if set(shapes) - self.known or not out:
                    out.append(failure)
            self.known |= set(self.new_shapes(record, problems))
        return out

    def new_shapes(self, record: RunRecord, problems: Mapping[str, list[str]]) -> list[str]:
        shapes = [_shape_in(record, p) for ps in problems.values() for p in ps]
        return [shape for shape in shapes if shape not in self.known]

    def fails(self, verdict: Verdict) -> bool:
        """Whether a verdict counts: a problem of a shape not reported yet, and while
        shrinking, one of the shapes being shrunk."""
        shapes = set(self.new_shapes(*verdict))
        return bool(shapes & self.target) if self.target else bool(shapes)

    def key(self, scenario: Scenario) -> Hashable:
        history = scenario.history
        known = self.histories.get(id(history))
        if known is None or known[0] is not history:
            known = self.histories[id(history)] = (history, repr(history))
        return (scenario.turns, scenario.abort, scenario.max_turns, known[1])

    def evaluate(self, scenario: Scenario) -> Verdict:
        k = self.key(scenario)
        if k not in self.cache:
            first, second = self._runner.run(self.runs(scenario))
            if first.error is not None and first.error.startswith(_NOT_EXPRESSIBLE):
                self.set_aside[first.error.removeprefix(_NOT_EXPRESSIBLE)] += 1
                self.cache[k] = (first, {})
            else:
                problems = check_record(
                    first, second, properties=self.props, id_reuse=self.budgets.id_reuse
                )
                self.cache[k] = (first, problems)
                if self.budgets.id_reuse == "warning" and "I1" in self.props:
                    failed = set(problems.get("I1", ()))
                    for sentence in check_pairing(first):
                        if sentence not in failed:
                            shape = failure_shape(sentence)
                            self.warned[shape] += 1
                            self.warned_first.setdefault(shape, sentence)
        return self.cache[k]

    async def runs(self, scenario: Scenario) -> tuple[RunRecord, RunRecord | None]:
        # Both runs in one Runner.run: entering and leaving the event loop costs
        # about as much as a scripted run (more on the main thread, where it also
        # installs and restores a SIGINT handler).
        options = {"timeout": self.budgets.timeout, "hang_limit": self.budgets.hang_limit}
        first = await run_scenario_async(self._loop, scenario, **options)
        if "I5" not in self.props:
            return first, None
        return first, await run_scenario_async(self._loop, scenario, **options)

    def violates(self, scenario: Scenario) -> bool:
        if self.found:
            k = self.key(scenario)
            if k in self.cache:
                return self.fails(self.cache[k])
            if self.shrink >= self.budgets.max_shrink_runs:
                return False  # budget spent: keep the smallest failure so far
            self.shrink += 1
        else:
            self.generated += 1
        verdict = self.evaluate(scenario)
        if self.fails(verdict):
            self.found = True
        return self.fails(verdict)

    def batch_violates(self, batch: list[Scenario]) -> bool:
        """Run a batch in order until one scenario fails.

        Hypothesis's own cost is mostly per test case (a few hundred microseconds,
        more than drawing a scenario), so each test case is a batch of distinct
        scenarios. (A unique collection also keeps Hypothesis from "mutating" a batch
        by copying one scenario over another, which would make most of the next
        batch repeats.)
        """
        if self.first_failure:
            # Hypothesis replays the failing test case once more before it returns:
            # answer from the record, not from the budget (spent when the failure was
            # the last scenario allowed) nor from a new run.
            return [self.key(s) for s in batch] == self.failing_batch
        for scenario in batch:
            if self.generated >= self.budgets.max_examples:
                return False
            if self.violates(scenario):
                self.first_failure.append(scenario)
                self.failing_batch.extend(self.key(s) for s in batch)
                return True
        return False

    def _search(self, strategy: st.SearchStrategy[Scenario], seed: int, size: int) -> None:
        find(
            st.lists(strategy, min_size=size, max_size=size, unique_by=self.key),
            self.batch_violates,
            settings=settings(
                max_examples=-(-self.budgets.max_examples // size),
                database=None,
                deadline=None,
                phases=[Phase.generate],  # _shrink.simplify shrinks (see its candidates)
                report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck),
            ),
            random=random.Random(seed),
        )

    def find(self, strategy: st.SearchStrategy[Scenario], seed: int) -> Scenario | None:
        """The first scenario that breaks a property, or None."""
        try:
            try:
                self._search(strategy, seed, min(_BATCH, self.budgets.max_examples))
            except (InvalidArgument, Unsatisfiable):
                # A strategy with fewer distinct scenarios than a batch holds (such
                # as st.just(scenario)): one scenario per test case, as it comes.
                self.generated = 0
                self._search(strategy, seed, 1)
        except NoSuchExample:
            return None
        except Flaky:
            # Hypothesis replays the failing test case and calls the search flaky when
            # the replay differs (a strategy that draws other scenarios from the same
            # bytes). The failure the loop showed is kept: the report is built from it.
            if not self.first_failure:
                raise
        return self.first_failure[0]
