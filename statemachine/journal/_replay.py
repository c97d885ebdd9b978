"""Replay: rebuild a run from its journal and verify it, line by line, against what
the journal records (the state after each event, and each checkpoint); and the
readable form of a replayed step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any, Final

import attrs
import orjson

from statemachine.core import events as _events
from statemachine.core.engine import Engine, TransitionRecord
from statemachine.core.events import Event, ModelResponded, ToolFinished
from statemachine.core.messages import Message, thaw_json
from statemachine.core.table import State, TurnState
from statemachine.core.wire import event_from_dict, event_to_dict
from statemachine.errors import InvalidInputError, ProtocolError, WireFormatError
from statemachine.journal._digest import RunningDigest, checkpoint_of
from statemachine.journal._fast import FAST_EVENTS, NotFastError, new, setters
from statemachine.journal._format import (
    JournalError,
    JournalHeader,
    read_instructions,
    read_model,
    short,
    with_instructions,
)
from statemachine.journal._reader import (
    DEFAULT_MAX_LINE_BYTES,
    EXACT_DECODER,
    HEADER_DECODER,
    Lines,
    decode_exact,
    open_lines,
)

__all__ = ["ReplayResult", "ReplayStep", "describe_event", "format_step", "replay"]


@attrs.frozen
class ReplayStep:
    """One replayed event: its journal line, the event, and the transitions it caused."""

    line: int
    event: Event
    transitions: tuple[TransitionRecord, ...]
    state: TurnState


@attrs.frozen
class ReplayResult:
    """A rebuilt run. ``error`` is set (in partial mode) when the journal stopped
    replaying at some line; everything before that line was replayed and verified.

    ``steps`` are made when first read, once: a replay that only verifies a journal
    (``ok``, ``state``, ``engine``) does not pay for a record per event."""

    header: JournalHeader
    engine: Engine
    _replayed: _Replayer = attrs.field(alias="replayed", repr=False, eq=False)
    checkpoints: int
    error: JournalError | None = None

    @property
    def steps(self) -> tuple[ReplayStep, ...]:
        """Every replayed event with the transitions it caused, in journal order."""
        return self._replayed.steps()

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def state(self) -> State:
        return self.engine.state

    @property
    def messages(self) -> tuple[Message, ...]:
        return tuple(self.engine.messages)

    @property
    def trace(self) -> tuple[TransitionRecord, ...]:
        return tuple(self.engine.trace)

    @property
    def states(self) -> tuple[State, ...]:
        """The state trace: where the run started, then the state after each event."""
        return (TurnState.READY, *self._replayed.states)

    @property
    def instructions(self) -> tuple[tuple[int, str | None], ...]:
        """The instructions the run sent, as ``(turn, text)`` from the model call of
        that turn on, one per change (``None``: none from then on); empty for a run
        without instructions, or a journal written before they were recorded."""
        return tuple(self._replayed.instructions)

    @property
    def models(self) -> tuple[tuple[int, str], ...]:
        """The models that answered, as their providers named them: ``(turn, name)``
        from the model call of that turn on, one per change; empty when the client
        reported none (a fake model), or for a journal written before they were."""
        return tuple(self._replayed.models)

    def transcript(self) -> list[dict[str, Any]]:
        """The history as wire dicts, with each turn's instructions (where they changed)
        as a ``{"role": "system", "content": ...}`` item before that turn's response:
        what ``statemachine.testing.check_transcript`` reads in our format."""
        return with_instructions(self.header.messages, self.messages, self.instructions)


def replay(
    source: str | os.PathLike[str] | Iterable[str],
    *,
    strict: bool = True,
    engine_class: type[Engine] = Engine,
    logger: Any = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    **engine_options: Any,
) -> ReplayResult:
    """Rebuild a run from its journal and verify it against what the journal records.

    ``source`` is a path or an iterable of lines. With ``strict`` (the default) the
    first bad line raises ``JournalError`` naming it; with ``strict=False`` the
    replay stops there and the result holds the run up to that line plus the error.
    A journal whose header cannot be read always raises: there is nothing to replay.
    ``engine_class`` lets a test replay into an instrumented or deliberately broken
    engine; ``engine_options`` override the header's (a tool's ``scheduling`` whose
    resources function the journal could not hold must be given here).

    Whatever a journal holds, what goes wrong is a ``JournalError`` naming its line:
    a line longer than ``max_line_bytes`` (16 MiB by default; it is refused before it
    is read whole, so memory stays bounded by the cap, not by the line), text that is
    not UTF-8 or not JSON, ``NaN`` or ``Infinity``, an integer of more than
    ``MAX_INT_DIGITS`` digits, nesting deeper than ``MAX_DEPTH`` levels, a record of
    the wrong shape, an event the engine refuses or that leads elsewhere than the
    journal says, a checkpoint that does not match. If the engine itself fails on an
    event (a hostile tool schema, say), that too is a ``JournalError`` for the line,
    the engine's exception as its cause; the engine is then left where it failed.
    """
    if isinstance(max_line_bytes, bool) or not isinstance(max_line_bytes, int):
        raise InvalidInputError(f"max_line_bytes must be an int, got {max_line_bytes!r}")
    if max_line_bytes < 1:
        raise InvalidInputError(f"max_line_bytes must be positive, got {max_line_bytes}")
    with open_lines(source, max_line_bytes) as lines:
        return _replay_lines(lines, strict, engine_class, logger, engine_options)


def _replay_lines(
    lines: Lines,
    strict: bool,
    engine_class: type[Engine],
    logger: Any,
    engine_options: dict[str, Any],
) -> ReplayResult:
    each = iter(lines)
    first = next(each, None)
    if first is None:
        raise JournalError(1, "the journal is empty: the first line must be the header")
    header, engine = _start(first, lines, engine_class, dict(engine_options, logger=logger))
    replayer = _Replayer(engine)
    error: JournalError | None = None
    try:
        replayer.replay(each, lines)
    except JournalError as exc:
        error = exc
    if error is not None and strict:
        raise error
    return ReplayResult(header, engine, replayer, replayer.checkpoints, error)


def _start(
    raw: bytes | str, lines: Lines, engine_class: type[Engine], options: dict[str, Any]
) -> tuple[JournalHeader, Engine]:
    """The header, and the engine it describes (or a ``JournalError`` for line 1)."""
    value = decode_exact(raw, lines, HEADER_DECODER)
    try:
        header = JournalHeader.from_dict(value)
        engine = header.engine(engine_class, **options)
    except (InvalidInputError, WireFormatError) as exc:
        raise JournalError(1, f"bad header: {exc}") from None
    except Exception as exc:  # whatever a header holds, its failure is the header's
        raise JournalError(1, f"bad header: {type(exc).__name__}: {exc}") from exc
    return header, engine


_EVENT_RECORD_KEYS: Final = frozenset({"seq", "event", "after"})


def _engine_failure(event: Event, exc: Exception, number: int) -> JournalError:
    if isinstance(exc, ProtocolError):
        return JournalError(number, f"the engine refuses {type(event).__name__} here: {exc}")
    return _cannot_replay(number, exc)


def _diverged(after: State, state: State, number: int) -> JournalError:
    return JournalError(
        number,
        f"replay diverged: the journal says the run went to {after.value}, the "
        f"engine went to {state.value}",
    )


def _cannot_replay(number: int, exc: Exception) -> JournalError:
    return JournalError(number, f"cannot replay this line: {type(exc).__name__}: {exc}")


_SET_STEP: Final = setters(ReplayStep, "line", "event", "transitions", "state")
_STATE_NAMES: Final[dict[str, State]] = {state.value: state for state in TurnState}


class _Replayer:
    """Replays event lines into an engine, checking each against what it records."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.digest = RunningDigest()
        self.checkpoints = 0
        self.expected_seq = 1
        # Each replayed event's line, the event, the length of the trace after it and
        # the state: its ``ReplayStep`` is made at the end (``steps``).
        self._lines: list[int] = []
        self._events: list[Event] = []
        self._marks: list[int] = []
        self.states: list[State] = []
        # The states a line may name: the library's, and those of the run's steps.
        self.names: dict[str, State] = (
            _STATE_NAMES if not engine.table.steps else {s.value: s for s in engine.table.states}
        )
        self._first_mark = len(engine.trace)
        self._steps: tuple[ReplayStep, ...] | None = None
        self.instructions: list[tuple[int, str | None]] = []  # (turn, text), per change
        self.models: list[tuple[int, str]] = []  # (turn, name), per change

    def replay(self, each: Iterator[bytes | str], lines: Lines) -> None:
        """Replay the event lines; anything that goes wrong is a ``JournalError``
        naming its line. The common case is read inline (``orjson`` and the fast
        decoder); anything else, or any failure of that reading, goes to
        ``_read_other``, which reads the line exactly or says what is wrong with it."""
        engine, digest, fast_events, loads = self.engine, self.digest, FAST_EVENTS, orjson.loads
        know, follow, states, expected = digest.know, digest.follow, self.names, self.expected_seq
        handle = engine.handle
        add_line, add_event = self._lines.append, self._events.append
        add_mark, add_state = self._marks.append, self.states.append
        event: Any
        for raw in each:
            try:
                record = loads(raw)
                data = record["event"]
                seq = record["seq"]
                after = states[record["after"]]
                if len(record) != 3 or type(seq) is not int or seq != expected:
                    raise NotFastError
                event = fast_events[data["type"]](data)
            except Exception:  # noqa: BLE001 - anything unusual: the exact reading says what
                read = self._read_other(raw, lines)
                if read is None:
                    continue
                event, after = read
            else:
                # The digest takes the texts of the messages of every turn from what
                # was parsed: the model's message, the tool's output (a result's content).
                kind = type(event)
                if kind is ModelResponded:
                    know(event.message, data["message"])
                elif kind is ToolFinished:
                    know(event.output.content, data["output"]["content"])
            try:
                handle(event)
            except Exception as exc:  # noqa: BLE001 - refused, or failed: named and raised
                cause = None if isinstance(exc, ProtocolError) else exc
                raise _engine_failure(event, exc, lines.number) from cause
            if engine.state is not after:
                raise _diverged(after, engine.state, lines.number)
            follow(engine.messages)  # the digest hashes the event's messages now
            expected += 1
            self.expected_seq = expected
            add_line(lines.number)
            add_event(event)
            add_mark(len(engine.trace))
            add_state(after)

    def _read_other(self, raw: bytes | str, lines: Lines) -> tuple[Event, State] | None:
        """A checkpoint, or a line that is not the common case: read exactly."""
        try:
            try:
                record = orjson.loads(raw)
                if type(record) is dict and "checkpoint" in record:
                    self._verify_checkpoint(record["checkpoint"], 0)
                    self.checkpoints += 1
                    return None
                raise NotFastError
            except Exception:  # noqa: BLE001 - anything unusual: the exact reading says what
                return self._read_exact(decode_exact(raw, lines, EXACT_DECODER), lines.number)
        except JournalError:
            raise
        except Exception as exc:  # the journal's fault: named
            raise _cannot_replay(lines.number, exc) from exc

    def steps(self) -> tuple[ReplayStep, ...]:
        """The replayed steps, each with the transitions its event caused (made once,
        when first asked for)."""
        if self._steps is not None:
            return self._steps
        trace = self.engine.trace
        steps = []
        mark = self._first_mark
        set_line, set_event, set_transitions, set_state = _SET_STEP
        each = zip(self._lines, self._events, self._marks, self.states, strict=True)
        for line, event, end, state in each:
            step = new(ReplayStep)  # as ReplayStep(...) would, at a third of the cost
            set_line(step, line)
            set_event(step, event)
            set_transitions(step, tuple(trace[mark:end]))
            set_state(step, state)
            steps.append(step)
            mark = end
        self._steps = tuple(steps)
        return self._steps

    def _read_exact(self, record: Any, number: int) -> tuple[Event, State] | None:
        """Read a line as ``event_from_dict`` does, or say what is wrong with it."""
        if type(record) is not dict:
            raise JournalError(number, f"expected a JSON object, got {type(record).__name__}")
        if "checkpoint" in record:
            self._verify_checkpoint(record["checkpoint"], number)
            self.checkpoints += 1
            return None
        if "instructions" in record:
            self.instructions.append(read_instructions(record, self.engine.turns, number))
            return None
        if "model" in record:
            self.models.append(read_model(record, self.engine.turns, number))
            return None
        if record.keys() != _EVENT_RECORD_KEYS:
            raise JournalError(
                number,
                "expected an event record with keys 'seq', 'event', 'after', a checkpoint "
                "instructions or a model; "
                f"got keys {', '.join(map(repr, sorted(record)))}",
            )
        seq = record["seq"]
        if type(seq) is not int or seq != self.expected_seq:  # a JSON true equals 1
            raise JournalError(
                number,
                f"event number {short(repr(seq))} where {self.expected_seq} was expected "
                "(a line is missing, repeated or out of order)",
            )
        try:
            event = event_from_dict(record["event"])
        except WireFormatError as exc:
            raise JournalError(number, str(exc)) from None
        raw_after = record["after"]
        after = self.names.get(raw_after) if type(raw_after) is str else None
        if after is None:
            raise JournalError(number, f"'after': {short(repr(raw_after))} is not a state")
        return event, after

    def _verify_checkpoint(self, recorded: Any, number: int) -> None:
        actual = checkpoint_of(self.engine, self.digest)
        if type(recorded) is not dict:
            raise JournalError(number, "a checkpoint must be an object")
        # Types count: a count written as 3.0 or true is not what the writer wrote.
        differences = [
            f"{key}: journal {short(repr(recorded.get(key)))}, replay {value!r}"
            for key, value in actual.items()
            if type(recorded.get(key)) is not type(value) or recorded.get(key) != value
        ]
        if recorded.keys() != actual.keys():
            differences.append(f"keys: journal {sorted(recorded)!r}, replay {sorted(actual)!r}")
        if differences:
            raise JournalError(
                number, "replay does not match the checkpoint: " + "; ".join(differences)
            )


# -- the readable form ------------------------------------------------------------------


def describe_event(event: Event) -> str:
    """A one-line, human-readable account of an engine event."""
    data = event_to_dict(event)
    kind = data.pop("type")
    if "message" in data and isinstance(event, _events.ModelResponded):
        message = event.message
        parts = [f"[{message.stop_reason.value}]"]
        if message.text:
            parts.append(repr(short(message.text, 40)))
        parts += [
            f"{c.name}#{c.id}({short(json.dumps(thaw_json(c.arguments)), 30)})"
            for c in message.tool_calls
        ]
        return f"{kind} " + " ".join(parts)
    if isinstance(event, _events.ToolFinished):
        text = "".join(b.text for b in event.output.content if hasattr(b, "text"))
        flag = "error" if event.output.is_error else "ok"
        return f"{kind} {event.call_id} {flag} {short(text, 40)!r}"
    args = " ".join(f"{k}={short(str(v), 40)!r}" for k, v in data.items())
    return f"{kind} {args}".rstrip()


def format_step(step: ReplayStep) -> str:
    """Two lines: the journal line number and the event, then the transitions it caused."""
    moves = ", ".join(
        f"{r.trigger.value}: {r.source.value} -> {r.dest.value}" for r in step.transitions
    )
    if not moves:
        moves = f"(absorbed: the run is over in {step.state.value})"
    return f"{step.line:>5}  {describe_event(step.event)}\n       {moves}"
