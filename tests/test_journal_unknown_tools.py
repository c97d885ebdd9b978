"""A journal replays a run as it ran, whether it counted calls of unknown tools
against a budget (``unknown_tool_retries``, rule 14) or was recorded before they were."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from statemachine.core.messages import AssistantMessage, ToolCall, UserMessage
from statemachine.core.table import TurnState
from statemachine.engine import ModelResponded, Start
from statemachine.journal import Journal, JournalingEngine, replay, run_agent_journaled
from statemachine.testing.models import ScriptedModel

pytestmark = pytest.mark.timeout(30)


def _unknown(call_id: str) -> AssistantMessage:
    return AssistantMessage([ToolCall(call_id, "no_such_tool", {})], "toolUse")


def test_a_journal_written_before_unknown_tools_counted_replays_as_it_ran() -> None:
    stream = io.StringIO()
    engine = JournalingEngine(
        journal=Journal(stream), tools=[], messages=[UserMessage("go")], max_turns=5
    )
    engine.handle(Start())
    for i in range(3):
        engine.handle(ModelResponded(_unknown(f"c{i}")))
    engine.handle(ModelResponded(AssistantMessage("fine")))
    assert engine.state is TurnState.DONE
    assert '"unknown_tool_retries"' not in stream.getvalue().splitlines()[0]
    replayed = replay(stream.getvalue().splitlines())
    assert replayed.engine.state is TurnState.DONE
    assert replayed.engine.messages == engine.messages


def test_a_journal_of_a_run_that_counted_them_replays_to_tool_retries_exceeded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    model = ScriptedModel(*[_unknown(f"c{i}") for i in range(4)], "never reached")
    with Journal(path) as journal:
        result = asyncio.run(
            run_agent_journaled(
                journal=journal,
                model=model,
                messages=[UserMessage("go")],
                unknown_tool_retries=1,
            )
        )
    assert result.state is TurnState.TOOL_RETRIES_EXCEEDED
    replayed = replay(path)
    assert replayed.engine.state is TurnState.TOOL_RETRIES_EXCEEDED
    assert replayed.engine.unknown_tool_retries == 1
    assert replayed.engine.messages == result.messages
