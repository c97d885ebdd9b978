"""The opt-in pytest plugin, exercised on a small inline project with pytester."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

CONFTEST = 'pytest_plugins = ["statemachine.testing.plugin"]\n'

PROJECT = """
from statemachine.testing import ModelTurn, Scenario, ScriptedCall, agent_loop, check_record
from statemachine.testing.plugin import AgentLoopConformance


async def text_only(*, model, tools, messages, max_turns, signal):
    history = list(messages)
    history.append(await model.complete(history, [t.definition for t in tools], signal))
    return history


class TestOurLoop(AgentLoopConformance):
    loop = staticmethod(agent_loop())
    max_examples = 15
    seed = 3


class TestTextOnly(AgentLoopConformance):
    loop = staticmethod(text_only)
    max_examples = 15
    seed = 3


def test_fixtures(scripted_model, scenario_runner):
    scripted = scripted_model(ModelTurn(calls=(ScriptedCall(),), stop_reason="toolUse"))
    assert [t.name for t in scripted.tools] == ["alpha", "beta"]
    assert not scripted.signal.aborted
    record = scenario_runner(agent_loop(), Scenario(turns=(ModelTurn(calls=(ScriptedCall(),)),)))
    assert check_record(record) == {}
    assert record.result.state == "Done"
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_agent=PROJECT)
    return pytester


def test_our_loop_passes_and_a_broken_loop_fails_with_a_report(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    # TestOurLoop: 6 pass; TestTextOnly: 6 fail; test_fixtures passes.
    assert outcomes.get("passed") == 7
    assert outcomes.get("failed") == 6
    result.stdout.fnmatch_lines(
        [
            "*TestTextOnly.test_conformance*",
            "*FAILED: * generated scenario(s)*",
            "*I1 pairing is violated*has no result*",
        ]
    )
    result.stdout.fnmatch_lines(["*the checkpoint script:*", "*I3 control:*stopped after 1*"])


def test_the_plugin_is_not_loaded_without_opting_in(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="def test_no_fixture(scripted_model):\n    pass\n",
    )
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*fixture 'scripted_model' not found*"])


def test_the_examples_option_is_registered(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--agent-loop-examples*"])
