"""``statemachine view`` of runs with steps: the run's own table is drawn (the steps'
states and declared ends), each decision is on the timeline with the message a retry
added, a declared end shows its explanation, and a team's run (``Handoffs``) names the
agent that speaks. Looked at in headless Chromium from ``file://``, as tests/test_view.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from headless import Browser, offline_browser
from test_view import current, load, page_data, step_through, view_without_graphviz

from statemachine import Agent, RunResult, ToolCall, run_agent_sync
from statemachine.cli import main
from statemachine.journal import Journal, JournalError, JournalingEngine, replay, view_html
from statemachine.steps import Handoffs
from statemachine.testing import ScriptedModel

# The guide's examples are written as a reader would (untyped): imported, not checked.
team = importlib.import_module("examples.language_team").team
refund_agent = importlib.import_module("examples.refund_agent").refund_agent

RETRY = "Refunds above 100 EUR need a person: offer 100 EUR and say a person will call."


def journaled(agent: Agent[Any], path: Path, text: str) -> RunResult:
    with Journal(path) as journal:
        return run_agent_sync(
            model=agent.model,
            tools=agent.tools,
            steps=agent.options.steps,
            messages=text,
            engine_factory=partial(JournalingEngine, journal=journal),
        )


def refund_journal(path: Path) -> RunResult:
    """The guardrail asks again twice, then ends the run in its declared state."""
    agent = refund_agent(
        ToolCall("c1", "lookup_order", {"order": "A17"}),
        "We refund 240 EUR.",
        "240 EUR, as said.",
        "Still 240 EUR.",
    )
    return journaled(agent, path, "Refund order A17")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with offline_browser(width=1400, height=1000) as b:
        yield b


def texts(browser: Browser, selector: str) -> list[str]:
    found: list[str] = browser.evaluate(
        f"[...document.querySelectorAll({selector!r})].map(e => e.textContent)"
    )
    return found


@pytest.mark.timeout(120)
def test_a_guardrail_run_is_shown_with_its_states_decisions_and_declared_end(
    tmp_path: Path, browser: Browser
) -> None:
    result = refund_journal(tmp_path / "run.jsonl")
    assert result.state.value == "NeedsHumanReview"
    steps = replay(tmp_path / "run.jsonl").steps
    assert main(["view", str(tmp_path / "run.jsonl")]) == 0
    load(browser, tmp_path / "run.html")
    # The drawing is the agent's table: the step's state and its declared end are in it.
    nodes = texts(browser, "#diagram g.node title")
    assert {"RefundLimit", "NeedsHumanReview", "AwaitingModel", "Done"} <= set(nodes)
    seen = step_through(browser, steps)
    assert seen.count("RefundLimit") == 3
    assert seen[-1] == "NeedsHumanReview"
    rows = texts(browser, "#events li")
    assert rows[-1].endswith("step refund_limit: retry → NeedsHumanReview")
    assert sum("step refund_limit: retry → AwaitingModel" in r for r in rows) == 2
    assert texts(browser, "#events li.step") == [r for r in rows if "step refund_limit" in r]
    # The run ended in a state of its table, and says why.
    assert texts(browser, "#run-state") == ["NeedsHumanReview"]
    summary = texts(browser, "#run-summary")[0]
    assert "a declared end" in summary
    assert "the answer promised a refund above 100 EUR" in summary
    # Each message the guardrail added is the step's, and a click on it goes there.
    asked = [m for m in texts(browser, "#messages li") if RETRY in m]
    assert len(asked) == 2
    assert all(m.startswith("user · the step refund_limit asks again") for m in asked)
    data = page_data((tmp_path / "run.html").read_text(encoding="utf-8"))
    retried = [m["step"] for m in data["messages"] if RETRY in m["text"]]
    assert [data["steps"][s - 1]["title"] for s in retried] == ["step refund_limit: retry"] * 2


@pytest.mark.timeout(120)
def test_a_teams_run_names_the_agent_that_speaks(tmp_path: Path, browser: Browser) -> None:
    result = journaled(team.agent, tmp_path / "run.jsonl", "Bonjour, où est mon colis ?")
    assert result.state.value == "Done"
    out = tmp_path / "team.html"
    argv = ["view", str(tmp_path / "run.jsonl"), "--out", str(out)]
    assert main([*argv, "--agent", "examples.language_team:agent"]) == 0
    load(browser, out)
    assert "HandoffLimit" in texts(browser, "#diagram g.node title")
    who = texts(browser, "#messages li .who")
    assert who == [
        "user",
        "assistant · triage",
        "result of transfer_to_french (h1): the run is now with french",
        "assistant · french",
    ]
    browser.evaluate("document.getElementById('last').click()")
    assert current(browser)["node"] == ["Done"]
    # Without the agent the journal does not name who spoke first, and says so.
    data = page_data(view_html(tmp_path / "run.jsonl"))
    assert [m["who"] for m in data["messages"]][1:4:2] == [
        "assistant · the first agent",
        "assistant · french",
    ]


def test_a_transfer_that_failed_hands_nothing_on(tmp_path: Path) -> None:
    # French may not hand the run to Spanish: the transfer's result is an error.
    members = {
        "triage": Agent(ScriptedModel(ToolCall("h1", "transfer_to_french", {}))),
        "french": Agent(ScriptedModel(ToolCall("h2", "transfer_to_spanish", {}), "Bonjour.")),
        "spanish": Agent(ScriptedModel("Hola.")),
    }
    failing = Handoffs(members, routes={"triage": ["french", "spanish"]}, start="triage")
    journaled(failing.agent, tmp_path / "run.jsonl", "Bonjour")
    data = page_data(view_html(tmp_path / "run.jsonl", agent=failing.agent))
    assert [m["who"] for m in data["messages"]] == [
        "user",
        "assistant · triage",
        "result of transfer_to_french (h1): the run is now with french",
        "assistant · french",
        "result of transfer_to_spanish (h2), an error",
        "assistant · french",
    ]


def test_the_view_refuses_an_agent_whose_steps_the_journal_does_not_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refund_journal(tmp_path / "run.jsonl")
    argv = ["view", str(tmp_path / "run.jsonl"), "--agent", "examples.language_team:agent"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "recorded with other steps (refund_limit)" in err
    assert "declares (handoff_limit)" in err
    assert not (tmp_path / "run.html").exists()
    with pytest.raises(JournalError, match="other steps"):
        view_html(tmp_path / "run.jsonl", agent=[])
    page_data(view_html(tmp_path / "run.jsonl", agent=refund_agent()))


def test_trace_draws_a_run_with_steps_with_its_own_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refund_journal(tmp_path / "run.jsonl")
    assert main(["trace", str(tmp_path / "run.jsonl")]) == 0
    drawn = capsys.readouterr().out
    assert 'state "RefundLimit ×3" as RefundLimit' in drawn
    assert 'state "NeedsHumanReview ×1" as NeedsHumanReview' in drawn
    journaled(team.agent, tmp_path / "team.jsonl", "Hola")
    assert main(["trace", str(tmp_path / "team.jsonl")]) == 0
    assert 'state "HandoffLimit ×2" as HandoffLimit' in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_a_run_with_steps_without_graphviz_says_what_it_needs(tmp_path: Path) -> None:
    refund_journal(tmp_path / "run.jsonl")
    done = view_without_graphviz(tmp_path / "run.jsonl")
    assert done.returncode == 2, done.stderr
    assert "declared steps (refund_limit), which only Graphviz draws" in done.stderr
    assert "pip install 'agent-statemachine[diagrams]'" in done.stderr
    assert "'statemachine trace JOURNAL' draws the run's path as mermaid" in done.stderr
    assert not (tmp_path / "run.html").exists()
