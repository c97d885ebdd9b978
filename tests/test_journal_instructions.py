"""The instructions a run sends are in its journal: a line each time they change,
before the model call of that turn; replay reads them back (``ReplayResult.instructions``),
checks each against the turn the run is at, and puts them in the transcript the
transcript checker reads; journals written before them still read."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest

import statemachine as sm
from statemachine.journal import Journal, JournalError, replay, run_agent_journaled
from statemachine.testing import check_transcript
from statemachine.testing.models import ScriptedModel


@sm.tool
def look(topic: str) -> str:
    """Look something up."""
    return f"notes on {topic}"


def _call(n: int) -> sm.AssistantMessage:
    return sm.AssistantMessage(
        [sm.ToolCall(f"c{n}", "look", {"topic": str(n)})], stop_reason="toolUse"
    )


def _journaled(instructions: Any, *responses: Any) -> tuple[sm.RunResult[Any], str, ScriptedModel]:
    stream = io.StringIO()
    model = ScriptedModel(*responses)
    result = asyncio.run(
        run_agent_journaled(
            journal=Journal(stream),
            model=model,
            messages="go",
            tools=[look],
            instructions=instructions,
        )
    )
    return result, stream.getvalue(), model


def _records(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.timeout(30)
def test_static_instructions_are_written_once_before_the_first_model_call() -> None:
    _, text, model = _journaled("Be brief.", _call(1), "done")
    records = _records(text)
    kinds = [next(iter(r)) for r in records[1:]]
    assert kinds[:2] == ["seq", "instructions"]  # Start, then what its call was sent
    assert [r for r in records if "instructions" in r] == [{"instructions": "Be brief.", "turn": 1}]
    replayed = replay(text.splitlines(keepends=True))
    assert replayed.state is sm.TurnState.DONE
    assert replayed.instructions == ((1, "Be brief."),)
    assert [r.instructions for r in model.requests] == ["Be brief.", "Be brief."]


@pytest.mark.timeout(30)
def test_instructions_from_a_function_are_written_each_time_they_change() -> None:
    told = iter(["First.", "First.", "Second.", None])

    def instructions() -> str | None:
        return next(told)

    result, text, model = _journaled(instructions, _call(1), _call(2), _call(3), "done")
    assert result.state is sm.TurnState.DONE
    replayed = replay(text.splitlines(keepends=True))
    assert replayed.instructions == ((1, "First."), (3, "Second."), (4, None))
    assert [r.instructions for r in model.requests] == ["First.", "First.", "Second.", None]
    transcript = replayed.transcript()
    systems = [i for i, item in enumerate(transcript) if item["role"] == "system"]
    assert [transcript[i]["content"] for i in systems] == ["First.", "Second.", ""]
    # Each stands just before the response of the turn it was sent with.
    assert all(transcript[i + 1]["role"] == "assistant" for i in systems)
    assert check_transcript(transcript, format="statemachine") == []


@pytest.mark.timeout(30)
def test_a_run_without_instructions_writes_none_and_old_journals_still_read() -> None:
    _, text, _ = _journaled(None, _call(1), "done")
    assert not any("instructions" in r for r in _records(text))
    replayed = replay(text.splitlines(keepends=True))
    assert replayed.ok
    assert replayed.instructions == ()
    assert check_transcript(replayed.transcript(), format="statemachine") == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("record", "error"),
    [
        (
            {"instructions": "x", "turn": 2},
            "instructions for turn 2, but the replayed run is at turn 1",
        ),
        ({"instructions": 3, "turn": 1}, "expected a string or null, got int"),
        ({"instructions": "x", "turn": True}, "instructions for turn True"),
        ({"instructions": "x", "turn": 1, "more": 1}, "an instructions record has keys"),
    ],
)
def test_a_bad_instructions_line_is_a_journal_error_naming_it(record: Any, error: str) -> None:
    _, text, _ = _journaled("Be brief.", "done")
    lines = text.splitlines(keepends=True)
    number = next(i for i, line in enumerate(lines) if '"instructions"' in line)
    lines[number] = json.dumps(record) + "\n"
    with pytest.raises(JournalError, match=error) as caught:
        replay(lines)
    assert caught.value.line == number + 1


def test_the_transcript_checker_names_a_malformed_system_item() -> None:
    findings = check_transcript(
        [
            {"role": "user", "content": [{"type": "text", "text": "go"}]},
            {"role": "system", "content": 3},
        ],
        format="statemachine",
    )
    assert [(f.invariant, f.index) for f in findings] == [("format", 1)]
