"""The journal: the event codec, the writer and its flush policy, replay and its errors."""

from __future__ import annotations

import asyncio
import enum
import io
import json
import logging
import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from statemachine.agent.tools import Tool
from statemachine.cli.replay import cli_replay
from statemachine.core import events as _events
from statemachine.core.abort import AbortSignal
from statemachine.core.engine import GUARDS, Engine, GuardFunction
from statemachine.core.events import (
    AbortRequested,
    ContinueDecided,
    Event,
    ModelResponded,
    Start,
    ToolFinished,
)
from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from statemachine.core.table import INPUT_TRIGGERS, Guard, Trigger, TurnState, rows_from
from statemachine.core.tools import Scheduling, ToolOutput
from statemachine.core.wire import event_from_dict, event_to_dict
from statemachine.errors import InvalidInputError, ProtocolError, WireFormatError
from statemachine.journal import (
    Journal,
    JournalError,
    JournalingEngine,
    replay,
    run_agent_journaled,
)
from statemachine.journal._format import JournalHeader
from statemachine.journal._replay import ReplayStep
from statemachine.testing.checker import EVENT_SOURCES, FIRST_MESSAGE, TOOL, Bounds
from statemachine.testing.models import ScriptedModel


def _quiet() -> Any:
    return structlog.wrap_logger(
        None, wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL)
    )


# -- strategies: derived from field types, as the codec is -------------------------------

_text = st.text(max_size=12)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_call = st.builds(
    ToolCall,
    _text,
    st.sampled_from(["echo", "x"]),
    st.dictionaries(_text, _json, max_size=2),
    parse_error=st.none() | _text,
)
_result_blocks = st.lists(
    st.builds(TextContent, _text) | st.builds(ImageContent, _text, st.just("image/png")), max_size=2
)
_assistant = st.builds(
    AssistantMessage,
    st.lists(
        st.builds(TextContent, _text)
        | st.builds(ThinkingContent, _text, st.none() | _text)
        | _call,
        max_size=3,
    ),
    stop_reason=st.sampled_from(list(StopReason)),
    error_message=st.none() | _text,
)
_user = st.builds(UserMessage, st.lists(st.builds(TextContent, _text), min_size=1, max_size=2))
_output = st.builds(ToolOutput, _result_blocks, is_error=st.booleans())

_BY_TYPE: dict[Any, st.SearchStrategy[Any]] = {
    str: _text,
    str | None: st.none() | _text,
    bool: st.booleans(),
    int: st.integers(0, 10),
    AssistantMessage: _assistant,
    UserMessage: _user,
    ToolOutput: _output,
    ToolCall: _call,
}


def _for_type(hint: Any) -> st.SearchStrategy[Any]:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    return _BY_TYPE[hint]


def _event_strategy(cls: type) -> st.SearchStrategy[Any]:
    import attrs

    hints = typing.get_type_hints(cls, vars(_events))
    return st.builds(cls, **{f.name: _for_type(hints[f.name]) for f in attrs.fields(cls)})


EVENT_CLASSES = typing.get_args(Event)
any_event = st.one_of([_event_strategy(cls) for cls in EVENT_CLASSES])


@given(any_event)
def test_every_event_round_trips_through_json(event: Event) -> None:
    wire = json.loads(json.dumps(event_to_dict(event)))
    assert wire["type"] == type(event).__name__
    assert event_from_dict(wire) == event


def test_every_event_class_has_a_codec() -> None:
    # One per input trigger: the journal can record whatever the engine can be told.
    assert {cls.trigger for cls in EVENT_CLASSES} == set(INPUT_TRIGGERS)


@pytest.mark.parametrize(
    ("wire", "where"),
    [
        ({"type": "Nope"}, "event.type"),
        ({"type": "ToolFinished", "callId": "c1"}, "missing key 'output'"),
        (
            {"type": "ToolFinished", "callId": 3, "output": {"content": [], "isError": False}},
            "event.callId",
        ),
        ({"type": "ToolFinished", "callId": "c", "output": {"content": []}}, "event.output"),
        ({"type": "Start", "extra": 1}, "unknown key"),
        ({"type": "ModelResponded", "message": {"role": "user", "content": []}}, "event.message"),
        ([], "expected an object"),
    ],
)
def test_bad_event_dicts_name_the_path(wire: Any, where: str) -> None:
    with pytest.raises(WireFormatError, match=where.replace(".", r"\.")):
        event_from_dict(wire)


# -- a run, journaled --------------------------------------------------------------------


def _engine_with(journal: Journal, **kwargs: Any) -> JournalingEngine:
    options: dict[str, Any] = {
        "tools": [TOOL],
        "messages": [FIRST_MESSAGE],
        "max_turns": 3,
        "logger": _quiet(),
        **kwargs,
    }
    return JournalingEngine(journal=journal, **options)


TWO_CALLS = AssistantMessage(
    [ToolCall("a", "echo", {"text": "1"}), ToolCall("b", "echo", {"text": "2"})],
    stop_reason=StopReason.STOP,
)
SCRIPT: tuple[Event, ...] = (
    Start(),
    ModelResponded(TWO_CALLS),
    ToolFinished("b", ToolOutput("two")),
    ToolFinished("a", ToolOutput("one", is_error=True)),
    ModelResponded(AssistantMessage("all done")),
    AbortRequested("late"),  # absorbed: journaled, changes nothing
)


def _journal_text(events: Sequence[Event] = SCRIPT, **kwargs: Any) -> tuple[str, Engine]:
    stream = io.StringIO()
    engine = _engine_with(Journal(stream), **kwargs)
    for event in events:
        engine.handle(event)
    return stream.getvalue(), engine


def test_replay_rebuilds_the_identical_run() -> None:
    text, engine = _journal_text()
    result = replay(text.splitlines(keepends=True), logger=_quiet())
    assert result.ok
    assert result.state is TurnState.DONE
    assert result.messages == tuple(engine.messages)
    assert result.trace == tuple(engine.trace)
    assert result.checkpoints == 1
    assert [s.event for s in result.steps] == list(SCRIPT)
    assert result.states == (
        TurnState.READY,
        TurnState.AWAITING_MODEL,
        TurnState.COLLECTING_RESULTS,
        TurnState.COLLECTING_RESULTS,
        TurnState.AWAITING_MODEL,
        TurnState.DONE,
        TurnState.DONE,
    )


def test_replay_makes_its_steps_once_and_only_when_they_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import statemachine.journal._replay as replay_module

    made: list[type] = []
    real_new = replay_module.new  # type: ignore[attr-defined]

    def counting_new(cls: type) -> Any:
        made.append(cls)
        return real_new(cls)

    monkeypatch.setattr(replay_module, "new", counting_new)
    text, engine = _journal_text()
    result = replay(text.splitlines(keepends=True), logger=_quiet())
    assert result.ok
    assert result.state is TurnState.DONE
    assert len(result.states) == 7
    assert made == []  # verified, and nothing read the steps: none made
    steps = result.steps
    assert made == [ReplayStep] * len(SCRIPT)
    assert result.steps is steps  # made once
    assert made == [ReplayStep] * len(SCRIPT)
    # Each step holds the transitions its own event caused, and together they are the trace.
    assert [r for step in steps for r in step.transitions] == list(engine.trace)
    assert all(step.transitions[-1].dest is step.state for step in steps if step.transitions)


def test_refused_events_are_not_journaled() -> None:
    stream = io.StringIO()
    engine = _engine_with(Journal(stream))
    engine.handle(Start())
    with pytest.raises(ProtocolError):
        engine.handle(ToolFinished("ghost", ToolOutput("x")))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["event"] == {"type": "Start"}


def test_header_records_the_configuration() -> None:
    text, _ = _journal_text(check_permissions=True, run_id="r-42", events=(Start(),))
    header = json.loads(text.splitlines()[0])
    assert header["format"] == "statemachine-journal"
    assert header["version"] == 1
    assert header["runId"] == "r-42"
    assert header["checkPermissions"] is True
    assert header["maxTurns"] == 3
    assert header["tools"][0]["name"] == "echo"
    assert header["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "use the tools"}]}
    ]


def test_an_option_that_cannot_be_replayed_is_refused() -> None:
    engine = Engine(tools=[], messages=[UserMessage("x")], logger=_quiet())
    with pytest.raises(InvalidInputError, match="cannot record engine option hook"):
        JournalHeader.of(engine, tuple(engine.messages), hook=print)


# -- damaged journals ------------------------------------------------------------------------


def _lines() -> list[str]:
    text, _ = _journal_text()
    return text.splitlines(keepends=True)


def test_a_truncated_journal_names_the_line_and_keeps_what_came_before() -> None:
    lines = _lines()
    cut = [*lines[:4], lines[4][: len(lines[4]) // 2]]  # line 5 cut mid-write
    with pytest.raises(JournalError, match=r"journal line 5: not valid JSON.*cut off") as info:
        replay(cut, logger=_quiet())
    assert info.value.line == 5
    partial = replay(cut, strict=False, logger=_quiet())
    assert partial.error is not None
    assert partial.error.line == 5
    assert [s.event for s in partial.steps] == list(SCRIPT[:3])
    full = replay(lines, logger=_quiet())
    assert partial.messages == tuple(full.engine.messages)[: len(partial.messages)]
    assert partial.state is TurnState.COLLECTING_RESULTS


@pytest.mark.parametrize(
    ("damage", "line", "text"),
    [
        (lambda r: {**r, "seq": 9}, 3, "event number 9 where 2 was expected"),
        (lambda r: {**r, "after": "Done"}, 3, "replay diverged"),
        (lambda r: {**r, "after": "Sleeping"}, 3, "'Sleeping' is not a state"),
        (lambda r: {**r, "event": {"type": "Bogus"}}, 3, "is not an event type"),
        (lambda r: {"seq": 2}, 3, "expected an event record"),
        (
            lambda r: {
                **r,
                "event": {
                    "type": "ToolFinished",
                    "callId": "zz",
                    "output": {"content": [], "isError": False},
                },
            },
            3,
            "the engine refuses ToolFinished here",
        ),
    ],
)
def test_a_corrupted_line_is_named(damage: Any, line: int, text: str) -> None:
    lines = _lines()
    lines[line - 1] = json.dumps(damage(json.loads(lines[line - 1]))) + "\n"
    with pytest.raises(JournalError, match=text) as info:
        replay(lines, logger=_quiet())
    assert info.value.line == line
    partial = replay(lines, strict=False, logger=_quiet())
    assert len(partial.steps) == line - 2  # every event before the bad line replayed


def test_a_checkpoint_that_does_not_match_is_reported() -> None:
    lines = _lines()
    index = next(i for i, ln in enumerate(lines) if '"checkpoint"' in ln)
    record = json.loads(lines[index])
    record["checkpoint"]["digest"] = "0" * 64
    lines[index] = json.dumps(record) + "\n"
    with pytest.raises(JournalError, match="does not match the checkpoint: digest") as info:
        replay(lines, logger=_quiet())
    assert info.value.line == index + 1


@pytest.mark.parametrize(
    ("lines", "text"),
    [
        ([], "empty"),
        (['{"hello": 1}\n'], "not a statemachine journal"),
        (['{"format": "statemachine-journal", "version": 7}\n'], "version 7 is not supported"),
        (["{not json\n"], "journal line 1: not valid JSON"),
    ],
)
def test_a_bad_header_always_raises(lines: list[str], text: str) -> None:
    with pytest.raises(JournalError, match=text):
        replay(lines, strict=False)


def test_a_blank_line_is_an_error() -> None:
    lines = _lines()
    lines.insert(2, "\n")
    with pytest.raises(JournalError, match="journal line 3: blank line"):
        replay(lines, logger=_quiet())


# -- the writer ------------------------------------------------------------------------------


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


@pytest.mark.parametrize(("policy", "expected"), [("event", 8), ("checkpoint", 2), ("close", 0)])
def test_flush_policy(policy: Any, expected: int) -> None:
    stream = CountingStream()
    engine = _engine_with(Journal(stream, flush=policy))
    for event in SCRIPT:
        engine.handle(event)
    # header + 6 events + 1 checkpoint = 8 records
    assert len(stream.getvalue().splitlines()) == 8
    assert stream.flushes == expected
    engine.journal.close()
    assert stream.flushes == expected + 1
    assert not stream.closed  # a stream we were given is not ours to close


def test_every_event_is_on_disk_as_soon_as_it_is_handled(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with Journal(path) as journal:
        engine = _engine_with(journal)
        for i, event in enumerate(SCRIPT[:4], start=2):
            engine.handle(event)
            assert len(path.read_text(encoding="utf-8").splitlines()) == i
    assert replay(path, logger=_quiet()).state is TurnState.AWAITING_MODEL


def test_fsync_syncs_every_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    with Journal(tmp_path / "run.jsonl", fsync=True) as journal:
        engine = _engine_with(journal)
        engine.handle(Start())
        assert len(synced) == 2  # header, event
    assert len(synced) == 3  # and on close


def test_journal_refuses_to_overwrite_and_misuse(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("x")
    with pytest.raises(InvalidInputError, match="already exists"):
        Journal(path)
    with pytest.raises(InvalidInputError, match="flush must be"):
        Journal(io.StringIO(), flush="sometimes")  # type: ignore[arg-type]
    journal = Journal(io.StringIO())
    with pytest.raises(InvalidInputError, match="header"):
        journal.record(Start(), TurnState.AWAITING_MODEL)
    journal.close()
    with pytest.raises(InvalidInputError, match="closed"):
        journal.begin(JournalHeader("r", (), (UserMessage("x"),), 1, False))


def test_replay_of_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="cannot read journal"):
        replay(tmp_path / "nope.jsonl")


# -- the property: any accepted run, journaled and replayed, is identical ------------------------


def _checker_engine(options: dict[str, bool]) -> Engine:
    """An engine like the checker's, with the run's permission and continue options."""
    return Engine(
        tools=[TOOL],
        messages=[FIRST_MESSAGE],
        max_turns=3,
        logger=_quiet(),
        check_permissions=options["check_permissions"],
        check_continue=options["check_continue"],
    )


@st.composite
def accepted_runs(draw: st.DrawFn) -> tuple[dict[str, bool], list[Event]]:
    """An event sequence the engine accepts, built from the checker's event sources."""
    options = {"check_permissions": draw(st.booleans()), "check_continue": draw(st.booleans())}
    engine = _checker_engine(options)
    bounds = Bounds(turns=3, calls=3)
    events: list[Event] = []
    for _ in range(draw(st.integers(1, 30))):
        candidates = [
            event
            for trigger in INPUT_TRIGGERS
            if rows_from(engine.state, trigger) and trigger in EVENT_SOURCES
            for event in EVENT_SOURCES[trigger](engine, bounds)
        ]
        if not candidates:
            break
        event = draw(st.sampled_from(candidates))
        try:
            engine.handle(event)
        except ProtocolError:
            continue
        events.append(event)
    return options, events


@given(accepted_runs())
def test_journaled_and_replayed_runs_are_identical(
    run: tuple[dict[str, bool], list[Event]],
) -> None:
    options, events = run
    text, engine = _journal_text(events, **options)
    result = replay(io.StringIO(text), logger=_quiet())
    assert result.ok
    assert result.state is engine.state
    assert result.messages == tuple(engine.messages)
    assert result.trace == tuple(engine.trace)
    assert result.engine.turns == engine.turns
    assert result.engine.explanation == engine.explanation
    assert [s.event for s in result.steps] == events


# -- the driver shim and the command ------------------------------------------------------


async def _echo(arguments: dict[str, Any], signal: AbortSignal) -> str:
    return f"echo {arguments['text']}"


def test_run_agent_journaled_replays_to_the_same_result(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    model = ScriptedModel(
        AssistantMessage([ToolCall("c1", "echo", {"text": "x"}), ToolCall("c2", "nope", {})]),
        AssistantMessage("finished"),
    )
    with Journal(path) as journal:
        result = asyncio.run(
            run_agent_journaled(
                journal=journal,
                model=model,
                messages=[UserMessage("go")],
                tools=[Tool(TOOL, _echo)],
                logger=_quiet(),
            )
        )
    assert result.state is TurnState.DONE
    replayed = replay(path, logger=_quiet())
    assert replayed.messages == result.messages
    assert replayed.trace == result.trace
    assert replayed.header.run_id == result.run_id
    assert isinstance(replayed.messages[2], ToolResultMessage)
    assert replayed.messages[3].is_error  # type: ignore[union-attr]


def test_cli_replay_prints_the_trace_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.jsonl"
    text, _ = _journal_text()
    path.write_text(text, encoding="utf-8")
    assert cli_replay([str(path)]) == 0
    out = capsys.readouterr().out
    assert "ModelResponded [stop] echo#a" in out
    assert "tool_finished: CollectingResults -> CollectingResults" in out
    assert "absorbed" in out
    assert "state Done after 6 event(s)" in out
    assert out.rstrip().endswith("OK: the replay matches the journal")

    path.write_text(text[: len(text) - 40], encoding="utf-8")
    assert cli_replay([str(path)]) == 1
    captured = capsys.readouterr()
    assert "FAILED: journal line 8" in captured.err
    assert "everything before line 8 replayed" in captured.err
    assert "state Done after 5 event(s)" in captured.out


def test_cli_replay_of_garbage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"\xff\xfe")
    assert cli_replay([str(path)]) == 2  # no journal at all: unreadable input
    assert "journal line 1" in capsys.readouterr().err


# -- engine options: scheduling -------------------------------------------------------------


def test_sequential_scheduling_is_journaled_and_replayed() -> None:
    scheduling = {"echo": Scheduling(sequential=True)}
    # Sequential: b starts only after a finished.
    events = (*SCRIPT[:2], ToolFinished("a", ToolOutput("1")), ToolFinished("b", ToolOutput("2")))
    text, engine = _journal_text(events, scheduling=scheduling, check_continue=True)
    header = json.loads(text.splitlines()[0])
    assert header["options"]["scheduling"] == {"echo": {"sequential": True, "resources": False}}
    assert header["options"]["check_continue"] is True
    result = replay(io.StringIO(text), logger=_quiet())
    assert result.messages == tuple(engine.messages)
    assert result.trace == tuple(engine.trace)
    # The rebuilt engine really is sequential: right after the response, b is held back.
    upto_response = text.splitlines(keepends=True)[:3]
    partial = replay(upto_response, logger=_quiet())
    with pytest.raises(ProtocolError, match="'b' is not running"):
        partial.engine.handle(ToolFinished("b", ToolOutput("2")))


def _by_text(arguments: Mapping[str, Any]) -> list[str]:
    return [str(arguments.get("text"))]


def test_a_resources_function_must_be_given_back_to_replay() -> None:
    scheduling = {"echo": Scheduling(resources=_by_text)}
    text, engine = _journal_text(SCRIPT[:3], scheduling=scheduling)
    with pytest.raises(JournalError, match=r"journal line 1: .*echo.*pass the tools' scheduling"):
        replay(io.StringIO(text), logger=_quiet())
    result = replay(io.StringIO(text), logger=_quiet(), scheduling=scheduling)
    assert result.messages == tuple(engine.messages)


def test_run_agent_journaled_records_hooks_and_steering(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    model = ScriptedModel(
        AssistantMessage([ToolCall("c1", "echo", {"text": "x"})]), AssistantMessage("done")
    )

    async def keep_going(messages: Sequence[Message], turn: int) -> None:
        return None

    with Journal(path) as journal:
        result = asyncio.run(
            run_agent_journaled(
                journal=journal,
                model=model,
                messages=[UserMessage("go")],
                tools=[Tool(TOOL, _echo)],
                should_continue=keep_going,
                logger=_quiet(),
            )
        )
    assert result.state is TurnState.DONE
    replayed = replay(path, logger=_quiet())
    assert replayed.header.options["check_continue"] is True
    assert any(isinstance(s.event, ContinueDecided) for s in replayed.steps)
    assert replayed.messages == result.messages
    assert replayed.trace == result.trace


class StopReasonEngine(Engine):
    """Decides by the stop reason (the classic bug): tool calls under "stop" are dropped."""

    guards: ClassVar[Mapping[Guard, GuardFunction]] = {
        **GUARDS,
        # the response is the history's last message when the rows ask (rule 1)
        Guard.HAS_TOOL_CALLS: lambda run: (
            bool(run.batch) and run.history[-1].stop_reason is StopReason.TOOL_USE  # type: ignore[union-attr]
        ),
    }


def test_replay_into_another_engine_names_where_it_diverges() -> None:
    # The journal is a regression test: an engine that behaves differently is caught at
    # the first event where it does (SCRIPT's response has stop reason "stop").
    text, _ = _journal_text()
    with pytest.raises(JournalError, match="journal line 3: replay diverged") as info:
        replay(io.StringIO(text), engine_class=StopReasonEngine, logger=_quiet())
    assert "went to CollectingResults" in str(info.value)
    assert "engine went to Done" in str(info.value)


# -- the checkpoint digest ----------------------------------------------------------------


def _digest_by_definition(messages: Sequence[Message], trace: Sequence[Any]) -> str:
    """``history_digest`` as its docstring defines it, written the slow, obvious way."""
    import hashlib

    from statemachine.core.wire import message_to_dict

    payload = {
        "messages": [message_to_dict(m) for m in messages],
        "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in trace],
    }
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@given(accepted_runs())
def test_the_running_digest_is_the_digest_at_every_step(
    run: tuple[dict[str, bool], list[Event]],
) -> None:
    from statemachine.journal._digest import RunningDigest as _RunningDigest
    from statemachine.journal._digest import history_digest

    options, events = run
    engine = _checker_engine(options)
    running = _RunningDigest()
    for event in events:
        engine.handle(event)
        expected = _digest_by_definition(engine.messages, engine.trace)
        assert history_digest(engine.messages, engine.trace) == expected
        assert running.digest(engine.messages, engine.trace) == expected


def test_the_running_digest_starts_over_when_the_past_changes() -> None:
    from statemachine.journal._digest import RunningDigest as _RunningDigest

    first: list[Message] = [UserMessage("go"), AssistantMessage("one")]
    running = _RunningDigest()
    assert running.digest(first, []) == _digest_by_definition(first, [])
    rewritten: list[Message] = [UserMessage("go"), AssistantMessage("two"), UserMessage("more")]
    assert running.digest(rewritten, []) == _digest_by_definition(rewritten, [])
    assert running.digest(rewritten[:1], []) == _digest_by_definition(rewritten[:1], [])


def test_the_running_digest_reads_a_trace_and_a_list_of_records_alike() -> None:
    # An engine's Trace is hashed from its stored codes (no record made), a list of
    # records from the records: the same text either way, whichever comes first, and a
    # log whose past changed is hashed again from the start.
    from statemachine.core.trace import Trace, TransitionRecord
    from statemachine.journal._digest import RunningDigest as _RunningDigest

    records = [
        TransitionRecord(TurnState.READY, Trigger.START, TurnState.AWAITING_MODEL, 0),
        TransitionRecord(
            TurnState.AWAITING_MODEL, Trigger.MODEL_RESPONDED, TurnState.DISPATCHING_TOOLS, 1
        ),
        TransitionRecord(
            TurnState.DISPATCHING_TOOLS, Trigger.DISPATCHED, TurnState.COLLECTING_RESULTS, 1_000_000
        ),
    ]
    messages: list[Message] = [UserMessage("go")]
    running = _RunningDigest()
    for end in range(len(records) + 1):
        expected = _digest_by_definition(messages, records[:end])
        assert running.digest(messages, Trace(records[:end])) == expected
    assert running.digest(messages, records) == _digest_by_definition(messages, records)
    assert running.digest(messages, Trace(records)) == _digest_by_definition(messages, records)
    changed = [
        records[0],
        TransitionRecord(TurnState.AWAITING_MODEL, Trigger.ABORT, TurnState.ABORTING, 1),
    ]
    assert running.digest(messages, Trace(changed)) == _digest_by_definition(messages, changed)
    assert running.digest(messages, changed[:1]) == _digest_by_definition(messages, changed[:1])


def test_a_lone_surrogate_is_journaled_and_replays(tmp_path: Path) -> None:
    # A cut-off model stream can end a string inside a surrogate pair: such a string
    # has no UTF-8 form, yet the run must journal, checkpoint and replay like any other.
    path = tmp_path / "run.jsonl"
    broken = AssistantMessage("half an emoji: \ud83d")
    with Journal(path) as journal:
        engine = JournalingEngine(
            journal=journal, tools=[], messages=[UserMessage("go")], logger=_quiet()
        )
        engine.handle(Start())
        engine.handle(ModelResponded(broken))
    assert engine.state is TurnState.DONE
    assert "\\ud83d" in path.read_text(encoding="utf-8")
    result = replay(path, logger=_quiet())
    assert result.ok
    assert result.checkpoints == 1
    assert result.messages == (UserMessage("go"), broken)
