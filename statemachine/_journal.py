"""The run journal: an append-only JSON Lines record of a run's input events, and replay.

The engine is deterministic (I5), so a run is fully described by its configuration
and the sequence of input events it accepted. This module owns that record: the
event <-> dict codec, the ``Journal`` writer, ``JournalingEngine`` (an ``Engine`` that
writes every event it accepts), ``replay`` (which rebuilds the engine from a journal
and checks that it goes exactly where the journal says it went), and the
``python -m statemachine replay FILE`` command.

Format (one JSON object per line, UTF-8)::

    {"format": "statemachine-journal", "version": 1, "runId": ..., "maxTurns": ...,
     "checkPermissions": ..., "tools": [{"name", "description", "parameters"}],
     "messages": [<wire messages>], "options": {...}}               # line 1: header
    {"seq": 1, "event": {"type": "Start"}, "after": "AwaitingModel"}  # one per event
    {"checkpoint": {"state": "Done", "turns": 2, "messages": 4,
                    "transitions": 6, "digest": "<sha256>"}}         # at each return

Each event line carries the state the engine was in *after* handling it, and a
checkpoint line is written whenever the engine reaches a state in which a driver
returns (terminal or ``AwaitingUser``), with a digest of the whole history and
transition log. Replay checks both, so a journal is not only rebuilt but verified,
and a divergence names the line where it shows. Only *accepted* events are written:
a refused event changes nothing (I8), so it is not part of the run.

Flush policy
------------
Every record is one ``write`` of one whole line. By default (``flush="event"``) the
file is flushed after every record, so after a crash of the process the journal
holds every event the engine had accepted, except at most a partially written last
line, which replay reports as the truncation it is. ``flush="checkpoint"`` flushes
only at checkpoints and on close (cheaper; a crash may lose the events since the last
checkpoint). ``fsync=True`` also asks the OS to put every flushed record on disk,
which survives a power loss at the cost of a disk sync per flush.

``options`` holds the engine's other keyword arguments (``check_continue``, the tools'
``scheduling``...): JSON scalars as they are, the rest through ``_OPTION_CODECS``. A
tool whose scheduling names its resources with a function cannot be written down;
``replay`` then asks for the scheduling back.

The codec is derived from the event classes: every class in the ``Event`` union is
encoded field by field from its type hints (a new event class needs no code here as
long as its fields have types listed in ``_value_codec``), under its class name.
"""

from __future__ import annotations

import argparse
import enum
import functools
import hashlib
import io
import json
import logging
import operator
import os
import sys
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, Any, Final, Literal

import attrs
import structlog

from . import _events
from ._driver import RunResult, run_agent
from ._engine import Engine, TransitionRecord
from ._errors import InvalidInputError, ProtocolError, WireFormatError
from ._events import Action, Event
from ._messages import (
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    _block_from_dict,
    _block_to_dict,
    freeze_json,
    message_from_dict,
    message_to_dict,
    thaw_json,
)
from ._table import RETURNS_TO_CALLER, Trigger, TurnState
from ._tools import Scheduling, ToolDefinition, ToolOutput

__all__ = [
    "FORMAT",
    "VERSION",
    "Journal",
    "JournalError",
    "JournalHeader",
    "JournalingEngine",
    "ReplayResult",
    "ReplayStep",
    "cli_replay",
    "describe_event",
    "event_from_dict",
    "event_to_dict",
    "format_step",
    "history_digest",
    "replay",
    "run_agent_journaled",
]

FORMAT: Final = "statemachine-journal"
VERSION: Final = 1

_MESSAGE_TYPES: tuple[type, ...] = (UserMessage, AssistantMessage, ToolResultMessage)


class JournalError(InvalidInputError):
    """A journal that cannot be read or does not replay to what it records.

    ``line`` is the 1-based line number where the problem shows (0 if the journal
    could not be opened at all).
    """

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"journal line {line}: {message}" if line else message)
        self.line = line
        self.detail = message


# -- the value codec: one entry per field type -------------------------------------------

_Encode = Callable[[Any], Any]
_Decode = Callable[[Any, str], Any]


def _fail(path: str, expected: str, value: Any) -> WireFormatError:
    return WireFormatError(f"{path}: expected {expected}, got {type(value).__name__}")


def _scalar(kind: type) -> tuple[_Encode, _Decode]:
    def encode(value: Any) -> Any:
        return value

    def decode(value: Any, path: str) -> Any:
        # bool is an int in Python, but a JSON true is never a count.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _fail(path, kind.__name__, value)
        return value

    return encode, decode


def _enum_codec(kind: type[enum.Enum]) -> tuple[_Encode, _Decode]:
    def decode(value: Any, path: str) -> Any:
        try:
            return kind(value)
        except ValueError:
            valid = ", ".join(repr(m.value) for m in kind)
            raise WireFormatError(f"{path}: {value!r} is not one of {valid}") from None

    return (lambda v: v.value), decode


def _message_codec(kind: type) -> tuple[_Encode, _Decode]:
    def decode(value: Any, path: str) -> Any:
        message = message_from_dict(value, path=path)
        if not isinstance(message, kind):
            raise WireFormatError(f"{path}: expected a {kind.__name__} message")
        return message

    return message_to_dict, decode


def _encode_output(value: ToolOutput) -> dict[str, Any]:
    return {"content": [_block_to_dict(b) for b in value.content], "isError": value.is_error}


def _decode_output(value: Any, path: str) -> ToolOutput:
    if not isinstance(value, Mapping) or set(value) != {"content", "isError"}:
        raise WireFormatError(f"{path}: expected an object with keys 'content' and 'isError'")
    content = value["content"]
    if not isinstance(content, list):
        raise _fail(f"{path}.content", "an array", content)
    if not isinstance(value["isError"], bool):
        raise _fail(f"{path}.isError", "a boolean", value["isError"])
    blocks = [
        _block_from_dict(b, ("text", "image"), f"{path}.content[{i}]")
        for i, b in enumerate(content)
    ]
    return ToolOutput(tuple(blocks), is_error=value["isError"])


def _decode_call(value: Any, path: str) -> ToolCall:
    call: ToolCall = _block_from_dict(value, ("toolCall",), path)
    return call


def _decode_json(value: Any, path: str) -> Any:
    return freeze_json(value, path)


def _value_codec(hint: Any, where: str) -> tuple[_Encode, _Decode]:
    """The codec of one field type. Extend here when an event grows a new field type."""
    if hint in (str, bool, int, float):
        return _scalar(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_codec(hint)
    if hint in _MESSAGE_TYPES:
        return _message_codec(hint)
    if hint == Message:
        return _message_codec(object)
    if hint is ToolOutput:
        return _encode_output, _decode_output
    if hint is ToolCall:
        return _block_to_dict, _decode_call
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner_encode, inner_decode = _value_codec(rest[0], where)
            return (
                lambda v: None if v is None else inner_encode(v),
                lambda v, p: None if v is None else inner_decode(v, p),
            )
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item_encode, item_decode = _value_codec(args[0], where)

        def decode_items(value: Any, path: str) -> tuple[Any, ...]:
            if not isinstance(value, list):
                raise _fail(path, "an array", value)
            return tuple(item_decode(v, f"{path}[{i}]") for i, v in enumerate(value))

        return (lambda v: [item_encode(x) for x in v]), decode_items
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        return thaw_json, _decode_json
    raise TypeError(f"the journal has no codec for {where}: {hint!r}; add one to _value_codec")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@attrs.frozen
class _EventCodec:
    cls: type
    fields: tuple[tuple[str, str, _Encode, _Decode, bool], ...]  # attr, key, enc, dec, required
    keys: frozenset[str]  # the keys its dicts may have: "type" and the fields'


def _event_codec(cls: type) -> _EventCodec:
    hints = typing.get_type_hints(cls, vars(_events))
    fields = []
    for field in attrs.fields(cls):
        encode, decode = _value_codec(hints[field.name], f"{cls.__name__}.{field.name}")
        required = field.default is attrs.NOTHING
        fields.append((field.name, _camel(field.name), encode, decode, required))
    return _EventCodec(cls, tuple(fields), frozenset({"type", *(f[1] for f in fields)}))


# Every member of the Event union, by class name: adding an event class to the union
# is all it takes to journal it.
_CODECS: dict[str, _EventCodec] = {
    cls.__name__: _event_codec(cls) for cls in typing.get_args(Event)
}
_CODEC_BY_CLASS: dict[type, _EventCodec] = {c.cls: c for c in _CODECS.values()}


def event_to_dict(event: Event) -> dict[str, Any]:
    """The JSON shape of an input event: ``{"type": <class name>, <camelCase fields>}``."""
    codec = _CODEC_BY_CLASS.get(type(event))
    if codec is None:
        raise TypeError(f"not an input event: {event!r}")
    out: dict[str, Any] = {"type": codec.cls.__name__}
    for name, key, encode, _, _ in codec.fields:
        out[key] = encode(getattr(event, name))
    return out


def event_from_dict(d: Mapping[str, Any], *, path: str = "event") -> Event:
    """Parse ``event_to_dict``'s shape; raise ``WireFormatError`` naming the bad path."""
    if not isinstance(d, Mapping):
        raise _fail(path, "an object", d)
    kind = d.get("type")
    codec = _CODECS.get(kind) if isinstance(kind, str) else None
    if codec is None:
        raise WireFormatError(
            f"{path}.type: {kind!r} is not an event type (expected one of "
            f"{', '.join(sorted(_CODECS))})"
        )
    if not d.keys() <= codec.keys:
        extra = sorted(set(d) - codec.keys)
        raise WireFormatError(f"{path}: unknown key(s) {', '.join(map(repr, extra))}")
    kwargs: dict[str, Any] = {}
    for name, key, _, decode, required in codec.fields:
        if key not in d:
            if required:
                raise WireFormatError(f"{path}: missing key {key!r}")
            continue
        kwargs[name] = decode(d[key], f"{path}.{key}")
    try:
        event: Event = codec.cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise WireFormatError(f"{path}: {exc}") from None
    return event


# -- the engine configuration (the header) ------------------------------------------------


# Engine keyword arguments the header holds in fields of its own; other engine options
# are JSON scalars (flags, counts, names) kept as they are in ``options``, or have an
# entry in ``_OPTION_CODECS``.
_HEADER_FIELDS = frozenset({"tools", "messages", "max_turns", "check_permissions", "run_id"})
_NOT_RECORDED = frozenset({"logger"})  # no effect on what the engine decides


def _encode_scheduling(value: Mapping[str, Scheduling]) -> dict[str, Any]:
    # A resources function cannot be written down: the journal records that there was
    # one, and replay asks for it back (see ``replay``).
    return {
        name: {"sequential": s.sequential, "resources": s.resources is not None}
        for name, s in sorted(value.items())
        if s.sequential or s.resources is not None
    }


def _decode_scheduling(value: Any, path: str) -> dict[str, Scheduling]:
    if not isinstance(value, Mapping):
        raise _fail(path, "an object", value)
    out = {}
    for name, entry in value.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("sequential"), bool):
            raise WireFormatError(f"{path}.{name}: expected {{'sequential': bool, ...}}")
        out[str(name)] = Scheduling(sequential=entry["sequential"])
    return out


def _needs_functions(options: Mapping[str, Any]) -> list[str]:
    """Tools whose scheduling used a resources function (replay needs it back)."""
    raw = options.get("scheduling", {})
    return sorted(n for n, e in raw.items() if isinstance(e, Mapping) and e.get("resources"))


_OPTION_CODECS: dict[str, tuple[_Encode, _Decode]] = {
    "scheduling": (_encode_scheduling, _decode_scheduling),
}


@attrs.frozen
class JournalHeader:
    """What a journal's first line holds: everything needed to rebuild the engine."""

    run_id: str
    tools: tuple[ToolDefinition, ...]
    messages: tuple[Message, ...]
    max_turns: int
    check_permissions: bool
    options: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def of(cls, engine: Engine, messages: Sequence[Message], **options: Any) -> JournalHeader:
        """The header of ``engine`` (freshly made from ``messages`` and ``options``)."""
        recorded: dict[str, Any] = {}
        for name, value in options.items():
            if name in _OPTION_CODECS:
                recorded[name] = _OPTION_CODECS[name][0](value)
            elif value is None or isinstance(value, (bool, int, float, str)):
                recorded[name] = value
            else:
                raise InvalidInputError(
                    f"the journal cannot record engine option {name}={value!r}: only JSON "
                    "scalars (flags, numbers, names) and the options in _OPTION_CODECS "
                    "can be replayed"
                )
        return cls(
            run_id=engine.run_id,
            tools=engine.tools,
            messages=tuple(messages),
            max_turns=engine.max_turns,
            check_permissions=engine.check_permissions,
            options=recorded,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "version": VERSION,
            "runId": self.run_id,
            "maxTurns": self.max_turns,
            "checkPermissions": self.check_permissions,
            "tools": [
                {"name": d.name, "description": d.description, "parameters": d.schema_dict()}
                for d in self.tools
            ],
            "messages": [message_to_dict(m) for m in self.messages],
        }
        if self.options:
            out["options"] = dict(self.options)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> JournalHeader:
        if not isinstance(d, Mapping) or d.get("format") != FORMAT:
            raise WireFormatError(
                f"not a statemachine journal (the first line must be an object with "
                f'"format": "{FORMAT}")'
            )
        if d.get("version") != VERSION:
            raise WireFormatError(
                f"journal format version {d.get('version')!r} is not supported (this "
                f"library reads version {VERSION})"
            )
        _, decode_str = _scalar(str)
        _, decode_int = _scalar(int)
        _, decode_bool = _scalar(bool)
        raw_tools = d.get("tools")
        if not isinstance(raw_tools, list):
            raise _fail("header.tools", "an array", raw_tools)
        tools = []
        for i, t in enumerate(raw_tools):
            if not isinstance(t, Mapping):
                raise _fail(f"header.tools[{i}]", "an object", t)
            tools.append(
                ToolDefinition(
                    decode_str(t.get("name"), f"header.tools[{i}].name"),
                    decode_str(t.get("description"), f"header.tools[{i}].description"),
                    t.get("parameters"),
                )
            )
        raw_messages = d.get("messages")
        if not isinstance(raw_messages, list):
            raise _fail("header.messages", "an array", raw_messages)
        options = d.get("options", {})
        if not isinstance(options, dict):
            raise _fail("header.options", "an object", options)
        return cls(
            run_id=decode_str(d.get("runId"), "header.runId"),
            tools=tuple(tools),
            messages=tuple(
                message_from_dict(m, path=f"header.messages[{i}]")
                for i, m in enumerate(raw_messages)
            ),
            max_turns=decode_int(d.get("maxTurns"), "header.maxTurns"),
            check_permissions=decode_bool(d.get("checkPermissions"), "header.checkPermissions"),
            options=options,
        )

    def engine(self, engine_class: type[Engine] = Engine, **kwargs: Any) -> Engine:
        """A fresh engine with this configuration; ``kwargs`` (e.g. ``logger``, or the
        ``scheduling`` a journal could not hold) override what the header says."""
        missing = _needs_functions(self.options)
        if missing and "scheduling" not in kwargs:
            raise InvalidInputError(
                f"tool(s) {', '.join(missing)} chose their resources with a function, which "
                "a journal cannot hold: pass the tools' scheduling to replay "
                "(scheduling={t.name: t.scheduling for t in tools})"
            )
        options = {
            name: _OPTION_CODECS[name][1](value, f"header.options.{name}")
            if name in _OPTION_CODECS
            else value
            for name, value in self.options.items()
        }
        options.update(kwargs)
        return engine_class(
            tools=self.tools,
            messages=self.messages,
            max_turns=self.max_turns,
            check_permissions=self.check_permissions,
            run_id=self.run_id,
            **options,
        )


def history_digest(messages: Iterable[Message], trace: Iterable[TransitionRecord]) -> str:
    """A SHA-256 of the history's wire form and the transition log (I5 in one string).

    The hashed text is ``json.dumps({"messages": [<wire messages>], "trace":
    [[source, trigger, dest, turn], ...]}, sort_keys=True, ensure_ascii=False,
    separators=(",", ":"))`` in UTF-8 (lone surrogates, which a cut-off model stream
    can leave in a string, are encoded as they are rather than refused).
    """
    return _RunningDigest().digest(list(messages), list(trace))


_DIGEST_JSON: Final = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"))
# The text of a trace record up to its turn number, for every row of the table and
# every pair a broken engine in a test might produce: '["Ready","start","AwaitingModel",'.
_RECORD_HEAD: Final[dict[tuple[TurnState, Trigger, TurnState], str]] = {
    (a, t, b): _DIGEST_JSON.encode([a.value, t.value, b.value])[:-1] + ","
    for a in TurnState
    for t in Trigger
    for b in TurnState
}


def _extends(items: Sequence[Any], prefix: Sequence[Any]) -> bool:
    return len(items) >= len(prefix) and all(map(operator.is_, items, prefix))


class _RunningDigest:
    """``history_digest`` of one run, computed in steps as the run grows.

    A history and a transition log only grow, so each message and record is encoded
    once and the messages' part of the text is hashed once: a checkpoint costs the new
    messages plus a hash of the (short) trace text, instead of re-encoding the whole
    run each time. If what is asked for does not continue what was hashed (an engine
    that rewrote its past), it starts over, so the value is always the full digest's.
    """

    def __init__(self) -> None:
        self._start_over()

    def _start_over(self) -> None:
        self._hash = hashlib.sha256(b'{"messages":[')
        self._messages: list[Message] = []
        self._trace: list[TransitionRecord] = []
        self._trace_text: list[str] = []

    def digest(self, messages: Sequence[Message], trace: Sequence[TransitionRecord]) -> str:
        if not (_extends(messages, self._messages) and _extends(trace, self._trace)):
            self._start_over()
        new = list(messages[len(self._messages) :])
        if new:
            # One encoder call for all of them: the list's text without its brackets
            # is the messages' texts joined by commas, exactly as in the whole payload.
            text = _DIGEST_JSON.encode([message_to_dict(m) for m in new])[1:-1]
            self._hash.update(
                (("," if self._messages else "") + text).encode("utf-8", "surrogatepass")
            )
            self._messages += new
        new_trace = list(trace[len(self._trace) :])
        if new_trace:
            self._trace_text.append(
                ",".join([_RECORD_HEAD[a, b, c] + f"{n}]" for a, b, c, n in new_trace])
            )
            self._trace += new_trace
        whole = self._hash.copy()
        whole.update(('],"trace":[' + ",".join(self._trace_text) + "]}").encode("utf-8"))
        return whole.hexdigest()


def _checkpoint_of(engine: Engine, digest: _RunningDigest) -> dict[str, Any]:
    return {
        "state": engine.state.value,
        "turns": engine.turns,
        "messages": len(engine.messages),
        "transitions": len(engine.trace),
        "digest": digest.digest(engine.messages, engine.trace),
    }


# -- writing --------------------------------------------------------------------------------

FlushPolicy = Literal["event", "checkpoint", "close"]


class Journal:
    """Writes one run's journal; see the module docstring for the format and flushing.

    ``target`` is a path (created; an existing file is refused, so two runs never
    share a journal) or an open text stream (written to, never closed by us).
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | IO[str],
        *,
        flush: FlushPolicy = "event",
        fsync: bool = False,
    ) -> None:
        if flush not in ("event", "checkpoint", "close"):
            raise InvalidInputError(
                f"flush must be 'event', 'checkpoint' or 'close', got {flush!r}"
            )
        self._flush_policy: FlushPolicy = flush
        self._fsync = fsync
        self._owned = False
        if isinstance(target, (str, os.PathLike)):
            try:
                self._stream: IO[str] = open(  # noqa: SIM115 - closed by close()
                    target, "x", encoding="utf-8", newline="\n"
                )
            except FileExistsError:
                raise InvalidInputError(
                    f"journal {os.fspath(target)!r} already exists: a journal holds one "
                    "run; choose a new path"
                ) from None
            self._owned = True
        else:
            self._stream = target
        self._seq = 0
        self._started = False
        self._digest = _RunningDigest()
        self.closed = False

    @property
    def events_written(self) -> int:
        return self._seq

    def _write(self, record: Mapping[str, Any], *, flush: bool) -> None:
        if self.closed:
            raise InvalidInputError("the journal is closed")
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        try:
            self._stream.write(line + "\n")
        except UnicodeEncodeError:
            # A lone surrogate (a cut-off model stream can leave one) has no UTF-8
            # form; written as a \\u escape it reads back as the same string. The
            # stream encodes before it writes, so nothing of the failed line landed.
            line = json.dumps(record, ensure_ascii=True, separators=(",", ":"))
            self._stream.write(line + "\n")
        if flush:
            self._stream.flush()
            if self._fsync:
                os.fsync(self._stream.fileno())

    def begin(self, header: JournalHeader) -> None:
        """Write the header line; must come first, exactly once."""
        if self._started:
            raise InvalidInputError("the journal already has its header")
        self._started = True
        self._write(header.to_dict(), flush=self._flush_policy != "close")

    def record(self, event: Event, state_after: TurnState) -> None:
        """Append one accepted event and the state it led to."""
        if not self._started:
            raise InvalidInputError("write the header (begin) before any event")
        self._seq += 1
        record = {"seq": self._seq, "event": event_to_dict(event), "after": state_after.value}
        self._write(record, flush=self._flush_policy == "event")

    def checkpoint(self, engine: Engine) -> None:
        """Append a checkpoint of where the run stands (written at each return)."""
        checkpoint = _checkpoint_of(engine, self._digest)
        self._write({"checkpoint": checkpoint}, flush=self._flush_policy != "close")

    def close(self) -> None:
        if self.closed:
            return
        self._stream.flush()
        if self._fsync and self._owned:
            os.fsync(self._stream.fileno())
        if self._owned:
            self._stream.close()
        self.closed = True

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JournalingEngine(Engine):
    """An ``Engine`` that writes its configuration and every event it accepts.

    A refused event (``ProtocolError``) is not written: it changed nothing. A
    checkpoint is written each time the engine reaches a state where a driver returns.
    """

    def __init__(self, *, journal: Journal, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.journal = journal
        options = {
            k: v for k, v in kwargs.items() if k not in _HEADER_FIELDS and k not in _NOT_RECORDED
        }
        journal.begin(JournalHeader.of(self, tuple(self.messages), **options))

    def handle(self, event: Event) -> tuple[Action, ...]:
        before = self.state
        actions = super().handle(event)
        after = self.state
        self.journal.record(event, after)
        if after is not before and after in RETURNS_TO_CALLER:
            self.journal.checkpoint(self)
        return actions


async def run_agent_journaled(*, journal: Journal, **run_agent_kwargs: Any) -> RunResult:
    """``run_agent`` that writes ``journal`` as it goes (same arguments and result).

    It runs a ``JournalingEngine`` through ``run_agent``'s ``engine_factory``; it does
    not close the journal.
    """
    return await run_agent(
        engine_factory=functools.partial(JournalingEngine, journal=journal),
        **run_agent_kwargs,
    )


# -- reading and replaying ------------------------------------------------------------------


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
    replaying at some line; everything before that line was replayed and verified."""

    header: JournalHeader
    engine: Engine
    steps: tuple[ReplayStep, ...]
    checkpoints: int
    error: JournalError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def state(self) -> TurnState:
        return self.engine.state

    @property
    def messages(self) -> tuple[Message, ...]:
        return tuple(self.engine.messages)

    @property
    def trace(self) -> tuple[TransitionRecord, ...]:
        return tuple(self.engine.trace)

    @property
    def states(self) -> tuple[TurnState, ...]:
        """The state trace: where the run started, then the state after each event."""
        return (TurnState.Ready, *(s.state for s in self.steps))


def _lines(source: str | os.PathLike[str] | Iterable[str]) -> Iterator[str]:
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(source, encoding="utf-8", newline="") as f:
                yield from f
        except OSError as exc:
            raise JournalError(0, f"cannot read journal {os.fspath(source)!r}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise JournalError(0, f"journal is not UTF-8 text: {exc}") from None
    else:
        yield from source


def _parse(text: str, number: int, is_last: bool) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if not text.strip():
            raise JournalError(number, "blank line: a journal has no empty lines") from None
        hint = (
            " (the line has no newline at its end: the journal was cut off while it "
            "was being written)"
            if is_last and not text.endswith("\n")
            else ""
        )
        raise JournalError(
            number, f"not valid JSON: {exc.msg} at column {exc.colno}{hint}"
        ) from None


def replay(
    source: str | os.PathLike[str] | Iterable[str],
    *,
    strict: bool = True,
    engine_class: type[Engine] = Engine,
    logger: Any = None,
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
    """
    lines = _lines(source)
    first = next(lines, None)
    if first is None or not first.strip():
        raise JournalError(1, "the journal is empty: the first line must be the header")
    try:
        header = JournalHeader.from_dict(_parse(first, 1, False))
        engine = header.engine(engine_class, logger=logger, **engine_options)
    except JournalError:
        raise
    except InvalidInputError as exc:
        raise JournalError(1, f"bad header: {exc}") from None

    digest = _RunningDigest()
    steps: list[ReplayStep] = []
    checkpoints = 0
    expected_seq = 1
    error: JournalError | None = None
    number = 1
    pending = next(lines, None)
    while pending is not None:
        text = pending
        pending = next(lines, None)
        number += 1
        try:
            record = _parse(text, number, pending is None)
            if type(record) is not dict:
                raise JournalError(number, f"expected a JSON object, got {type(record).__name__}")
            if "checkpoint" in record:
                _verify_checkpoint(record["checkpoint"], engine, digest, number)
                checkpoints += 1
                continue
            steps.append(_replay_event(record, engine, number, expected_seq))
            expected_seq += 1
        except JournalError as exc:
            error = exc
            break
    if error is not None and strict:
        raise error
    return ReplayResult(header, engine, tuple(steps), checkpoints, error)


_EVENT_RECORD_KEYS: Final = frozenset({"seq", "event", "after"})
_STATE_NAMES: Final = {state.value: state for state in TurnState}


def _replay_event(
    record: Mapping[str, Any], engine: Engine, number: int, expected_seq: int
) -> ReplayStep:
    if record.keys() != _EVENT_RECORD_KEYS:
        raise JournalError(
            number,
            "expected an event record with keys 'seq', 'event', 'after' or a checkpoint; "
            f"got keys {', '.join(map(repr, sorted(record)))}",
        )
    seq = record["seq"]
    if seq != expected_seq or type(seq) is not int:  # a JSON true equals 1 in Python
        raise JournalError(
            number,
            f"event number {seq!r} where {expected_seq} was expected "
            "(a line is missing, repeated or out of order)",
        )
    try:
        event = event_from_dict(record["event"])
    except WireFormatError as exc:
        raise JournalError(number, str(exc)) from None
    raw_after = record["after"]
    after = _STATE_NAMES.get(raw_after) if type(raw_after) is str else None
    if after is None:
        raise JournalError(number, f"'after': {raw_after!r} is not a state")
    mark = len(engine.trace)
    try:
        engine.handle(event)
    except ProtocolError as exc:
        raise JournalError(
            number, f"the engine refuses {record['event'].get('type')} here: {exc}"
        ) from None
    if engine.state is not after:
        raise JournalError(
            number,
            f"replay diverged: the journal says the run went to {after.value}, the "
            f"engine went to {engine.state.value}",
        )
    return ReplayStep(number, event, tuple(engine.trace[mark:]), engine.state)


def _verify_checkpoint(recorded: Any, engine: Engine, digest: _RunningDigest, number: int) -> None:
    actual = _checkpoint_of(engine, digest)
    if not isinstance(recorded, Mapping):
        raise JournalError(number, "a checkpoint must be an object")
    differences = [
        f"{key}: journal {recorded.get(key)!r}, replay {value!r}"
        for key, value in actual.items()
        if recorded.get(key) != value
    ]
    if differences:
        raise JournalError(
            number, "replay does not match the checkpoint: " + "; ".join(differences)
        )


# -- the command ---------------------------------------------------------------------------


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def describe_event(event: Event) -> str:
    """A one-line, human-readable account of an input event."""
    data = event_to_dict(event)
    kind = data.pop("type")
    if "message" in data and isinstance(event, _events.ModelResponded):
        message = event.message
        parts = [f"[{message.stop_reason.value}]"]
        if message.text:
            parts.append(repr(_short(message.text, 40)))
        parts += [
            f"{c.name}#{c.id}({_short(json.dumps(thaw_json(c.arguments)), 30)})"
            for c in message.tool_calls
        ]
        return f"{kind} " + " ".join(parts)
    if isinstance(event, _events.ToolFinished):
        text = "".join(b.text for b in event.output.content if hasattr(b, "text"))
        flag = "error" if event.output.is_error else "ok"
        return f"{kind} {event.call_id} {flag} {_short(text, 40)!r}"
    args = " ".join(f"{k}={_short(str(v), 40)!r}" for k, v in data.items())
    return f"{kind} {args}".rstrip()


def format_step(step: ReplayStep) -> str:
    """Two lines: the journal line number and the event, then the transitions it caused."""
    moves = ", ".join(
        f"{r.trigger.value}: {r.source.value} -> {r.dest.value}" for r in step.transitions
    )
    if not moves:
        moves = f"(absorbed: the run is over in {step.state.value})"
    return f"{step.line:>5}  {describe_event(step.event)}\n       {moves}"


def cli_replay(argv: list[str]) -> int:
    """``python -m statemachine replay FILE``: print the run and verify it."""
    parser = argparse.ArgumentParser(
        prog="python -m statemachine replay",
        description="Replay a run journal, print it as a readable trace and verify it.",
    )
    parser.add_argument("file", help="the journal (JSON Lines)")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict")
    args = parser.parse_args(argv)
    out = io.StringIO()
    try:
        # The command prints its own trace; the engine's per-transition log lines would
        # only repeat it (warnings, such as normalised ids, still show).
        quiet = structlog.wrap_logger(
            None, wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
        )
        result = replay(args.file, strict=False, logger=quiet)
    except JournalError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    header = result.header
    out.write(
        f"run {header.run_id}: {len(header.messages)} initial message(s), "
        f"{len(header.tools)} tool(s) ({', '.join(t.name for t in header.tools) or 'none'}), "
        f"max_turns={header.max_turns}, permissions "
        f"{'checked' if header.check_permissions else 'not checked'}\n"
    )
    if not args.quiet:
        for step in result.steps:
            out.write(format_step(step) + "\n")
    engine = result.engine
    out.write(
        f"state {engine.state.value} after {len(result.steps)} event(s), {engine.turns} "
        f"turn(s), {len(engine.messages)} message(s), {result.checkpoints} checkpoint(s) "
        "verified\n"
    )
    if engine.explanation:
        out.write(f"explanation: {engine.explanation}\n")
    sys.stdout.write(out.getvalue())
    if result.error is not None:
        print(
            f"FAILED: {result.error}\n(everything before line {result.error.line} replayed "
            "and verified)",
            file=sys.stderr,
        )
        return 1
    if result.checkpoints == 0:
        print(
            "OK (no checkpoint: the run had not returned when the journal ends)",
        )
        return 0
    print("OK: the replay matches the journal")
    return 0
