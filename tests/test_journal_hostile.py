"""Replay of malformed and hostile journals: every failure is a ``JournalError`` naming
its line, memory stays bounded by the line cap, and the fast decoder agrees with the
exact one."""

from __future__ import annotations

import io
import json
import logging
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import example, find, given, settings
from hypothesis import strategies as st
from test_journal import _digest_by_definition, _event_strategy, any_event

from statemachine.core.engine import Engine
from statemachine.core.events import Event, ModelResponded, Start, ToolFinished
from statemachine.core.messages import AssistantMessage, Message, ToolCall, Usage, UserMessage
from statemachine.core.tools import ToolOutput
from statemachine.core.wire import event_from_dict, event_to_dict
from statemachine.journal import Journal, JournalError, JournalingEngine, replay
from statemachine.journal._digest import RunningDigest as _RunningDigest
from statemachine.journal._fast import FAST_EVENTS as _FAST_EVENTS
from statemachine.journal._reader import DEFAULT_MAX_LINE_BYTES, MAX_DEPTH
from statemachine.testing.checker import FIRST_MESSAGE, TOOL


def _quiet() -> Any:
    return structlog.wrap_logger(
        None, wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL)
    )


def _journal(arguments: Any = None, **options: Any) -> list[str]:
    """A small run's journal lines: one tool call with ``arguments``, then done."""
    stream = io.StringIO()
    engine = JournalingEngine(
        journal=Journal(stream),
        tools=[TOOL],
        messages=[FIRST_MESSAGE],
        max_turns=3,
        logger=_quiet(),
        **options,
    )
    call = ToolCall("c1", "echo", {"text": "x"} if arguments is None else arguments)
    engine.handle(Start())
    engine.handle(ModelResponded(AssistantMessage((call,), stop_reason="toolUse")))
    engine.handle(ToolFinished("c1", ToolOutput("x")))
    engine.handle(ModelResponded(AssistantMessage("done")))
    return stream.getvalue().splitlines(keepends=True)


def _both_modes(lines: Any, line: int, text: str, **kwargs: Any) -> None:
    """Strict replay raises; partial replay raises or reports the same error."""
    with pytest.raises(JournalError, match=text) as info:
        replay(lines, logger=_quiet(), **kwargs)
    assert info.value.line == line
    error = _partial_error(lines, **kwargs)
    assert error is not None
    assert error.line == line


def _partial_error(lines: Any, **kwargs: Any) -> JournalError | None:
    """The error of a partial replay (a header's error is raised even then)."""
    try:
        return replay(lines, strict=False, logger=_quiet(), **kwargs).error
    except JournalError as exc:
        return exc


def _set(lines: list[str], number: int, text: str) -> list[str]:
    return [*lines[: number - 1], text, *lines[number:]]


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("damage", "line", "text"),
    [
        (lambda ls: _set(ls, 3, DEEP + "\n"), 3, "expected a JSON object|levels deep"),
        (lambda ls: _set(ls, 1, DEEP + "\n"), 1, "levels deep"),
        (
            lambda ls: _set(ls, 3, ls[2].replace('"x"}', '"x", "n": ' + "9" * 5000 + "}")),
            3,
            "integer of 5,000 digits",
        ),
        (lambda ls: _set(ls, 3, ls[2].replace('"x"}', '"x", "n": NaN}')), 3, "NaN"),
        (lambda ls: _set(ls, 3, ls[2].replace('"x"}', '"x", "n": -Infinity}')), 3, "Infinity"),
        (lambda ls: _set(ls, 3, ls[2].replace('"x"}', '"x", "n": 1e999}')), 3, "range"),
        (lambda ls: _set(ls, 3, ls[2][:40]), 3, "not valid JSON"),
        (
            lambda ls: _set(ls, 2, '{"seq": 1, "event": {"type": "Start"}, "after": 7}\n'),
            2,
            "'after'",
        ),
        (
            lambda ls: _set(ls, 2, '{"seq": "1", "event": {"type": "Start"}, "after": "x"}\n'),
            2,
            "event number",
        ),
        (
            lambda ls: _set(ls, 2, '{"seq": 1, "event": [], "after": "AwaitingModel"}\n'),
            2,
            "expected an object",
        ),
        (lambda ls: _set(ls, 2, "[1, 2]\n"), 2, "expected a JSON object"),
        (lambda ls: _set(ls, 2, '"text"\n'), 2, "expected a JSON object"),
        (lambda ls: [*ls[:2], ls[1], *ls[2:]], 3, "event number 1 where 2"),
        (lambda ls: [ls[0], *ls[2:]], 2, "event number 2 where 1"),
    ],
)
def test_a_hostile_line_is_a_journal_error(damage: Any, line: int, text: str) -> None:
    _both_modes(damage(_journal()), line, text)


def _header(lines: list[str], change: Callable[[dict[str, Any]], None]) -> list[str]:
    header = json.loads(lines[0])
    change(header)
    return [json.dumps(header) + "\n", *lines[1:]]


@pytest.mark.parametrize(
    ("change", "text"),
    [
        (lambda h: h.update(options={"warp_speed": True}), "has no option"),
        (
            lambda h: h.update(options={"check_continue": "yes"}),
            "check_continue: expected a boolean",
        ),
        (lambda h: h.update(options={"scheduling": ["echo"]}), "scheduling: expected an object"),
        (
            lambda h: h.update(options={"scheduling": {"echo": {"sequential": 1}}}),
            "scheduling.echo",
        ),
        (lambda h: h.update(options={"max_turns": 9}), "not an option the header records"),
        (lambda h: h.update(options={"x": [1]}), "expected a JSON scalar"),
        (lambda h: h.update(options=[]), "header.options: expected an object"),
        (lambda h: h.update(maxTurns="3"), "maxTurns"),
        (lambda h: h.update(version=True), "version True is not supported"),
        (
            lambda h: h.update(tools=[{"name": "t", "description": "d", "parameters": 3}]),
            "parameters",
        ),
        (lambda h: h.update(tools="echo"), "header.tools"),
        (lambda h: h.update(messages=[{"role": "robot"}]), "header.messages"),
        (lambda h: h.update(surprise=1), "unknown key"),
    ],
)
def test_a_bad_header_option_is_a_journal_error(change: Any, text: str) -> None:
    _both_modes(_header(_journal(), change), 1, text)


def test_a_repeated_header_key_is_a_journal_error() -> None:
    lines = _header(_journal(), lambda h: h.update(options={"check_continue": False}))
    lines[0] = lines[0].replace('"options": {', '"options": {"check_continue": true, ')
    _both_modes(lines, 1, "'check_continue' appears twice")


def test_files_that_are_not_journals(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    _both_modes(empty, 1, "empty")
    lines = _journal()
    bad_utf8 = tmp_path / "latin1.jsonl"
    bad_utf8.write_bytes("".join(lines).encode() + b'{"seq": 5, "x": "\xe9t\xe9"}\n')
    _both_modes(bad_utf8, len(lines) + 1, "not UTF-8 text")
    one_line = tmp_path / "one.jsonl"
    one_line.write_bytes(b"x" * 5000)  # no newline
    _both_modes(one_line, 1, "longer than 4,096 bytes", max_line_bytes=4096)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines)[:-10], encoding="utf-8")
    _both_modes(cut, len(lines), "cut off")


def test_the_line_cap_is_configurable_and_checked() -> None:
    lines = _journal()
    longest = max(len(line.encode()) for line in lines)
    assert replay(lines, logger=_quiet(), max_line_bytes=longest).ok
    _both_modes(
        lines,
        1 + [len(x.encode()) for x in lines].index(longest),
        "longer than",
        max_line_bytes=longest - 2,
    )
    with pytest.raises(ValueError, match="max_line_bytes"):
        replay(lines, max_line_bytes=0)


@pytest.mark.timeout(120)
def test_a_200_mb_line_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as f:
        f.write(_journal()[0].encode())
        f.truncate(200 * 1024 * 1024)  # a sparse file: one 200 MB line of NUL bytes
    tracemalloc.start()
    try:
        with pytest.raises(JournalError, match="longer than 16,777,216 bytes") as info:
            replay(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.line == 2
    # The cap plus one read chunk, give or take: never the line.
    assert peak < DEFAULT_MAX_LINE_BYTES + 4 * 1024 * 1024, peak


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = {"a": [value]} if depth % 2 else [value]
    return value


def test_arguments_nested_hundreds_deep_replay_up_to_the_limit() -> None:
    # A line nests six levels around a tool call's arguments.
    # Several hundred levels replay (a run's own encoding recurses, so this is about
    # as deep as a run can write); a line nesting deeper than MAX_DEPTH is refused.
    ok = _journal({"text": "x", "v": _nested(300)})
    result = replay(ok, logger=_quiet())
    assert result.ok
    assert result.checkpoints == 1
    for depth, fine in ((MAX_DEPTH - 7, True), (MAX_DEPTH - 5, False)):
        value = "[" * depth + "]" * depth  # a line nests 7 levels around this value
        lines = list(ok)
        lines[2] = lines[2].replace('"text":"x"', '"text":"x","w":' + value, 1)
        if fine:  # line 3 replays; the checkpoint then sees the changed arguments
            error = replay(lines, strict=False, logger=_quiet()).error
            assert error is not None
            assert error.line > 3
        else:
            _both_modes(lines, 3, f"more than {MAX_DEPTH} levels deep")


def test_integers_beyond_64_bits_and_floats_replay_exactly() -> None:
    # orjson reads 10**30 as a float: the exact decoder reads it back as the integer the
    # run held, so the checkpoint digest matches.
    arguments = {
        "text": "x",
        "big": 10**30,
        "neg": -(2**63) - 1,
        "f": 1e-05,
        "g": 2.5e-7,
        "u": 2**64 - 1,
    }
    lines = _journal(arguments)
    result = replay(lines, logger=_quiet())
    assert result.ok
    assert result.checkpoints == 1
    calls = result.steps[1].event.message.tool_calls  # type: ignore[union-attr]
    assert dict(calls[0].arguments) == arguments
    assert type(calls[0].arguments["big"]) is int


def test_a_hostile_tool_schema_fails_as_a_journal_error() -> None:
    # A schema that refers to itself forever would make the engine's validation recurse
    # without end; the tool definition refuses it, so the header is the bad line.
    lines = _journal()
    header = json.loads(lines[0])
    header["tools"][0]["parameters"] = {"type": "object", "$ref": "#", "required": ["zz"]}
    lines[0] = json.dumps(header) + "\n"
    error = _partial_error(lines)
    assert error is not None
    assert error.line == 1
    assert "bad header: tool 'echo': parameters reference '#'" in str(error)
    assert "makes the schema recursive" in str(error)


# -- the fast decoder agrees with the exact one ------------------------------------------------


_floaty = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**70), 2**70)
_value = st.recursive(
    st.none() | st.booleans() | _floaty | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(any_event)
def test_the_fast_decoder_builds_what_event_from_dict_builds(event: Event) -> None:
    import orjson

    line = json.dumps(event_to_dict(event)).encode()
    data = orjson.loads(line)
    assert _FAST_EVENTS[data["type"]](data) == event_from_dict(json.loads(line)) == event


@given(st.dictionaries(st.text(max_size=4), _value, max_size=3), st.none() | _floaty)
def test_fast_arguments_and_usage_decode_or_defer(arguments: dict[str, Any], cost: Any) -> None:
    import orjson

    from statemachine.journal._fast import NotFastError as _NotFastError

    usage = Usage(1, 2, 0, 0, 3, cost=None if cost is None else float(cost))
    event = ModelResponded(AssistantMessage((ToolCall("c", "echo", arguments),), usage=usage))
    line = json.dumps(event_to_dict(event))
    try:
        fast = _FAST_EVENTS["ModelResponded"](orjson.loads(line))
    except _NotFastError:
        return  # an integer beyond 64 bits or a very large float: the exact decoder's
    assert fast == event


@given(
    st.lists(st.dictionaries(st.text(max_size=4), _value, max_size=3), max_size=3),
    st.text(max_size=3),
)
def test_the_digest_is_its_definition_for_any_values(
    arguments: list[dict[str, Any]], text: str
) -> None:
    messages: list[Message] = [UserMessage("go" + text + "\ud800")]
    for i, args in enumerate(arguments):
        call = ToolCall(f"c{i}", "echo", args)
        messages.append(AssistantMessage((call,), usage=Usage(1, 1, 0, 0, 2, cost=0.5 * i)))
    assert _RunningDigest().digest(messages, []) == _digest_by_definition(messages, [])


@given(
    st.lists(
        st.dictionaries(
            st.text(max_size=4),
            _value | st.integers() | st.text(alphabet=st.characters(), max_size=3),
            max_size=3,
        ),
        max_size=3,
    )
)
@example([{"a": 1e-05, "b": "x"}, {"n": 2**70}, {"s": "\ud800"}, {"k": {"z": 1, "a": [True]}}])
def test_the_digest_of_calls_without_usage_is_its_definition(
    arguments: list[dict[str, Any]],
) -> None:
    # No usage: each call's own encoder writes it (flat arguments, nested ones, and
    # what orjson refuses or writes otherwise: big integers, floats, lone surrogates).
    messages: list[Message] = [UserMessage("go")]
    for i, args in enumerate(arguments):
        parse_error = "cut off" if i == 1 else None
        messages.append(
            AssistantMessage((ToolCall(f"c{i}", "echo", args, parse_error=parse_error),))
        )
    assert _RunningDigest().digest(messages, []) == _digest_by_definition(messages, [])


# -- corruption: only JournalError (or a valid replay) comes out ------------------------------

_VALID = _journal({"text": "x", "n": [1, 2.5, {"k": None}]})


@st.composite
def corrupted(draw: st.DrawFn) -> list[str]:
    lines = list(_VALID)
    for _ in range(draw(st.integers(1, 3))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["flip", "cut", "dup", "drop", "value", "swap"]))
        line = lines[i]
        if kind == "flip" and line:
            data = bytearray(line.encode("utf-8", "surrogatepass"))
            j = draw(st.integers(0, len(data) - 1))
            data[j] ^= 1 << draw(st.integers(0, 7))
            lines[i] = data.decode("utf-8", "surrogateescape")
        elif kind == "cut":
            lines[i] = line[: draw(st.integers(0, len(line)))]
        elif kind == "dup":
            lines.insert(i, line)
        elif kind == "drop" and len(lines) > 1:
            del lines[i]
        elif kind == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "value":
            try:
                record = json.loads(line)
            except ValueError:
                continue  # already broken by an earlier change
            path = _paths(record)
            where = draw(st.sampled_from(path))
            replacement: Any = draw(
                st.none()
                | st.booleans()
                | st.integers(-(2**80), 2**80)
                | st.floats()
                | st.text(max_size=4)
                | st.lists(st.integers(), max_size=2)
                | st.just({})
                | st.just(10**2000)
            )
            _replace(record, where, replacement)
            lines[i] = json.dumps(record) + "\n"
    return lines


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for k, v in enumerate(value):
            out += _paths(v, (*prefix, k))
    return out or [("seq",)]


def _replace(record: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        record = record[key]
    record[path[-1]] = value


def _only_journal_errors(replay_fn: Callable[..., Any], lines: list[str]) -> bool:
    for strict in (True, False):
        try:
            result = replay_fn(lines, strict=strict, logger=_quiet())
        except JournalError:
            continue
        except Exception:
            return False
        if not strict and result.error is not None and not isinstance(result.error, JournalError):
            return False
    return True


@pytest.mark.timeout(240)
@settings(max_examples=200)
@given(corrupted())
def test_a_corrupted_journal_gives_only_journal_errors(lines: list[str]) -> None:
    assert _only_journal_errors(replay, lines)


def _unwrapped_replay(lines: list[str], strict: bool = True, logger: Any = None) -> Any:
    """Replay as it would be without its error wrapping: parse, build, handle."""
    header = json.loads(lines[0])
    engine = Engine(
        tools=[TOOL], messages=[FIRST_MESSAGE], max_turns=header["maxTurns"], logger=logger
    )
    for line in lines[1:]:
        record = json.loads(line)
        if "checkpoint" not in record:
            engine.handle(event_from_dict(record["event"]))
    return None


@pytest.mark.timeout(120)
def test_the_corruption_property_catches_a_replay_without_error_wrapping() -> None:
    found = find(corrupted(), lambda ls: not _only_journal_errors(_unwrapped_replay, ls))
    assert not _only_journal_errors(_unwrapped_replay, found)


def test_cli_replay_takes_a_line_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from statemachine.cli.replay import cli_replay

    path = tmp_path / "run.jsonl"
    path.write_text("".join(_journal()), encoding="utf-8")
    assert cli_replay([str(path), "--quiet"]) == 0
    assert cli_replay([str(path), "--max-line-bytes", "100"]) == 2  # its header cannot be read
    assert "journal line 1: the line is longer than 100 bytes" in capsys.readouterr().err


# -- the digest's texts taken from parsed lines ------------------------------------------


@st.composite
def _message_lines(draw: st.DrawFn) -> str:
    """A journal line of a model's message or a tool's output, some with every optional
    key written at its default (null, false), which the wire form leaves out."""
    event = draw(_event_strategy(ModelResponded) | _event_strategy(ToolFinished))
    wire = event_to_dict(event)
    if "message" in wire:
        message = wire["message"]
        for key in ("errorMessage", "usage"):
            if draw(st.booleans()):
                message.setdefault(key, None)
        if message.get("usage") is not None and draw(st.booleans()):
            message["usage"].setdefault("cost", None)
        for block in message["content"]:
            defaults = {"thinking": {"signature": None, "redacted": False}}.get(
                block["type"], {"parseError": None} if block["type"] == "toolCall" else {}
            )
            for key, value in defaults.items():
                if draw(st.booleans()):
                    block.setdefault(key, value)
    return json.dumps(wire, ensure_ascii=draw(st.booleans()))


@given(_message_lines())
@example(
    '{"type":"ModelResponded","message":{"role":"assistant","content":[],'
    '"stopReason":"stop","usage":{"input":1,"output":1,"cacheRead":0,'
    '"cacheWrite":0,"totalTokens":2,"cost":3}}}'
)
@example(
    '{"type":"ModelResponded","message":{"role":"assistant","content":[{"type":'
    '"toolCall","id":"c","name":"n","arguments":{"x":1e-05}}],"stopReason":"stop"}}'
)
@example(
    '{"type":"ModelResponded","message":{"role":"assistant","content":[{"type":"thinking",'
    '"thinking":"t","signature":null,"redacted":false}],"stopReason":"stop"}}'
)
@example(
    '{"type":"ModelResponded","message":{"role":"assistant","content":[{"type":"toolCall",'
    '"id":"c","name":"n","arguments":{},"parseError":null}],"stopReason":"stop"}}'
)
@example(
    '{"type":"ModelResponded","message":{"role":"assistant","content":[],"stopReason":"stop",'
    '"errorMessage":null}}'
)
def test_the_digest_of_parsed_messages_is_its_definition(line: str) -> None:
    import orjson

    from statemachine.core.messages import checked_result

    data = orjson.loads(line)
    try:
        event = _FAST_EVENTS[data["type"]](data)
    except Exception:  # not the fast decoder's case: replay reads it exactly
        return
    digest = _RunningDigest()
    if isinstance(event, ModelResponded):
        digest.know(event.message, data["message"])
        message: Message = event.message
    else:
        assert isinstance(event, ToolFinished)
        digest.know(event.output.content, data["output"]["content"])
        message = checked_result("c", "echo", event.output.content, event.output.is_error)
    assert digest.digest([message], []) == _digest_by_definition([message], [])
