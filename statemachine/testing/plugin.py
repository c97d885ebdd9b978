"""An opt-in pytest plugin for testing an agent loop.

Not auto-loaded (the distribution declares no ``pytest11`` entry point): enable it
in your root ``conftest.py`` with::

    pytest_plugins = ["statemachine.testing.plugin"]

It provides:

* ``scripted_model``: a factory; ``scripted_model(ModelTurn(...), ...)`` (or a
  ``Scenario``) returns a ``Scripted`` holding the scripted ``model``, ``tools`` and
  ``signal`` to hand to your loop, and the ``executions`` the tools saw;
* ``scenario_runner``: ``scenario_runner(loop, scenario)`` runs a scenario and
  returns the ``RunRecord``; ``check_record(record)`` judges it;
* ``AgentLoopConformance``: a test class to subclass with your loop::

      class TestMyLoop(AgentLoopConformance):
          loop = staticmethod(my_loop)   # async (*, model, tools, messages, max_turns, signal)

  It runs the generated conformance search and a few fixed scenarios (the
  checkpoint script, tool calls under ``stopReason: "stop"``, failing tools, an
  abort while tools run, the turn limit), each failing with a readable report.

``--agent-loop-examples N`` sets the number of generated scenarios (default 100).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import pytest

from statemachine.core.messages import StopReason
from statemachine.testing.conformance import run_conformance
from statemachine.testing.properties import PROPERTY_TITLES, check_record
from statemachine.testing.runner import (
    run_scenario,
)
from statemachine.testing.scenario import (
    AbortAt,
    AbortKind,
    AgentLoop,
    ModelTurn,
    OnAbort,
    Outcome,
    RunRecord,
    Scenario,
    ScriptedCall,
    ToolBehaviour,
)
from statemachine.testing.transcript import render_transcript
from statemachine.testing.world import (
    Scripted,
)

__all__ = [
    "AgentLoopConformance",
    "pytest_addoption",
    "scenario_runner",
    "scripted_model",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("statemachine", "agent loop conformance (statemachine.testing)")
    group.addoption(
        "--agent-loop-examples",
        type=int,
        default=100,
        help="generated scenarios per conformance search (default 100)",
    )


@pytest.fixture
def scripted_model() -> Callable[..., Scripted]:
    """Factory: ``scripted_model(*turns)`` or ``scripted_model(scenario)``."""

    def make(*turns: ModelTurn | Scenario, max_turns: int = 8) -> Scripted:
        if len(turns) == 1 and isinstance(turns[0], Scenario):
            return Scripted(turns[0])
        if not all(isinstance(t, ModelTurn) for t in turns):
            raise TypeError("scripted_model takes ModelTurn objects or one Scenario")
        script = tuple(t for t in turns if isinstance(t, ModelTurn))
        return Scripted(Scenario(turns=script, max_turns=max_turns))

    return make


@pytest.fixture
def scenario_runner() -> Callable[[AgentLoop, Scenario], RunRecord]:
    """``scenario_runner(loop, scenario)`` -> ``RunRecord``."""
    return run_scenario


def _fail_unless_clean(record: RunRecord, what: str) -> None:
    problems = check_record(record)
    if problems:
        lines = [f"{what}:"]
        for name, sentences in problems.items():
            lines += [f"  {name} {PROPERTY_TITLES[name]}: {s}" for s in sentences]
        lines.append("  scenario:")
        lines += ["    " + line for line in record.scenario.describe().splitlines()]
        if record.transcript is not None:
            lines.append("  transcript:")
            lines += ["    " + line for line in render_transcript(record.transcript).splitlines()]
        pytest.fail("\n".join(lines), pytrace=False)


_ASK = ModelTurn(text="Let me look.", calls=(ScriptedCall(),), stop_reason=StopReason.TOOL_USE)


class AgentLoopConformance:
    """Subclass with ``loop = staticmethod(your_loop)``; the tests below run it."""

    loop: ClassVar[Any] = None
    """The loop under test: ``async (*, model, tools, messages, max_turns, signal)``."""

    max_examples: ClassVar[int | None] = None  # None: the --agent-loop-examples option
    seed: ClassVar[int | None] = None
    properties: ClassVar[Sequence[str]] = tuple(PROPERTY_TITLES)

    def _loop(self) -> AgentLoop:
        # Read through the class: a plain function stored there is not bound to self.
        loop = getattr(type(self), "loop", None)
        if loop is None:
            pytest.fail(
                f"{type(self).__name__} must set loop = staticmethod(your_loop)", pytrace=False
            )
        resolved: AgentLoop = loop
        return resolved

    def _run(self, scenario: Scenario, what: str) -> None:
        _fail_unless_clean(run_scenario(self._loop(), scenario), what)

    def test_conformance(self, request: pytest.FixtureRequest) -> None:
        examples = self.max_examples or int(request.config.getoption("--agent-loop-examples"))
        report = run_conformance(
            self._loop(), max_examples=examples, seed=self.seed, properties=self.properties
        )
        if not report.passed:
            pytest.fail(report.summary(), pytrace=False)

    def test_checkpoint_script(self) -> None:
        """The checkpoint script: a tool call, its result back, a final answer."""
        self._run(Scenario(turns=(_ASK,)), "the checkpoint script")

    def test_tool_calls_under_stop_reason_stop_still_run(self) -> None:
        turn = ModelTurn(calls=(ScriptedCall(),), stop_reason=StopReason.STOP)
        self._run(Scenario(turns=(turn,)), 'tool calls with stopReason "stop"')

    def test_failing_tools_become_error_results(self) -> None:
        calls = (
            ScriptedCall("ghost"),
            ScriptedCall(valid_arguments=False),
            ScriptedCall("beta", behaviour=ToolBehaviour(outcome=Outcome.RAISE)),
        )
        turn = ModelTurn(calls=calls, stop_reason=StopReason.TOOL_USE)
        self._run(Scenario(turns=(turn,)), "unknown tool, invalid arguments, a raising tool")

    def test_abort_while_tools_run(self) -> None:
        calls = (
            ScriptedCall(behaviour=ToolBehaviour(ticks=3, cleanup_ticks=2)),
            ScriptedCall("beta", behaviour=ToolBehaviour(on_abort=OnAbort.IGNORE, ticks=2)),
            ScriptedCall(behaviour=ToolBehaviour(ticks=1)),
        )
        turn = ModelTurn(calls=calls, stop_reason=StopReason.TOOL_USE)
        abort = AbortAt(AbortKind.TOOL_START, 1, 0)
        self._run(Scenario(turns=(turn,), abort=abort), "an abort while tools run")

    def test_turn_limit(self) -> None:
        self._run(Scenario(turns=(_ASK, _ASK, _ASK), max_turns=2), "the turn limit")
