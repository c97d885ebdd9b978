"""The model that answered each call is in the journal when the client reports it: a
line each time it changes, written while that turn's call is answered; replay reads
them back (``ReplayResult.models``) and checks each against the turn the run is at; a
client that reports nothing (a fake model) writes none, and old journals still read."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Sequence
from typing import Any

import pytest

import statemachine as sm
from statemachine.agent.model import CallOptions
from statemachine.errors import ProviderUnavailableError
from statemachine.journal import Journal, JournalError, replay, run_agent_journaled
from statemachine.providers import FallbackModel


@sm.tool
def look(topic: str) -> str:
    """Look something up."""
    return f"notes on {topic}"


class Reporting:
    """A client that names the model that answered, as the adapters do: the answers
    come from ``models`` in turn (``""`` reports none), the first asks for a tool."""

    def __init__(self, name: str, models: Sequence[str]) -> None:
        self.model = name
        self._models = iter(models)
        self._calls = 0

    async def complete(
        self, messages: Any, tools: Any, signal: Any, *, options: CallOptions | None = None
    ) -> sm.AssistantMessage:
        self._calls += 1
        answered = next(self._models)
        if answered and options is not None and options.on_response is not None:
            options.on_response(f"resp-{self._calls}", answered)
        if self._calls == 1:
            call = sm.ToolCall("c1", "look", {"topic": "x"})
            return sm.AssistantMessage((call,), stop_reason="toolUse")
        return sm.AssistantMessage("done")


class Down:
    model = "down-1"

    async def complete(self, *args: Any, **kw: Any) -> sm.AssistantMessage:
        raise ProviderUnavailableError("down-1 is overloaded")


def _journaled(model: Any) -> str:
    stream = io.StringIO()
    result = asyncio.run(
        run_agent_journaled(journal=Journal(stream), model=model, messages="go", tools=[look])
    )
    assert result.state is sm.TurnState.DONE, result.explanation
    return stream.getvalue()


@pytest.mark.timeout(30)
def test_the_model_that_answered_is_written_when_it_changes_and_replayed() -> None:
    text = _journaled(Reporting("gpt", ["gpt-4.1-2025", "gpt-4.1-2025", "gpt-4.1-mini"]))
    models = [json.loads(line) for line in text.splitlines() if '"model"' in line]
    assert models == [{"model": "gpt-4.1-2025", "turn": 1}]  # the run had two calls
    text = _journaled(Reporting("gpt", ["gpt-4.1-2025", "gpt-4.1-mini"]))
    replayed = replay(io.StringIO(text))
    assert replayed.ok
    assert replayed.models == ((1, "gpt-4.1-2025"), (2, "gpt-4.1-mini"))


@pytest.mark.timeout(30)
def test_a_fallback_that_moved_on_shows_the_model_that_answered() -> None:
    text = _journaled(FallbackModel([Down(), Reporting("backup", ["", ""])]))
    # The backup reported nothing itself: the fallback names it by its model attribute.
    assert replay(io.StringIO(text)).models == ((1, "backup"),)


@pytest.mark.timeout(30)
def test_a_client_that_reports_nothing_writes_no_model_line() -> None:
    text = _journaled(Reporting("quiet", ["", ""]))
    assert '"model"' not in text
    assert replay(io.StringIO(text)).models == ()


@pytest.mark.timeout(30)
def test_a_name_past_the_limit_is_cut_when_written() -> None:
    text = _journaled(Reporting("long", ["m" * 1000, "m" * 1000]))
    assert replay(io.StringIO(text)).models == ((1, "m" * 256),)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({"model": "x", "turn": 2}, "the model of turn 2, but the replayed run is at turn 1"),
        ({"model": 3, "turn": 1}, "expected a name of 1 to 256 characters"),
        ({"model": "", "turn": 1}, "expected a name of 1 to 256 characters"),
        ({"model": "m" * 257, "turn": 1}, "expected a name of 1 to 256 characters"),
        ({"model": "x", "turn": 1, "more": 1}, "a model record has keys"),
    ],
)
def test_a_bad_model_line_is_a_journal_error_naming_it(record: Any, error: str) -> None:
    lines = _journaled(Reporting("gpt", ["gpt-4.1", "gpt-4.1"])).splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines) if '"model"' in line)
    lines[number] = json.dumps(record) + "\n"
    with pytest.raises(JournalError, match=error) as caught:
        replay(lines)
    assert caught.value.line == number + 1
