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

import contextlib
import enum
import functools
import hashlib
import inspect
import io
import json
import logging
import math
import operator
import os
import sys
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import IO, Any, Final, Literal

import attrs
import orjson
import structlog

from statemachine.agent.run import RunResult, run_agent
from statemachine.cli.common import EXIT_FAILED, EXIT_USAGE, CommandParser, fail, parse
from statemachine.core import events as _events
from statemachine.core.engine import Engine, TransitionRecord
from statemachine.core.errors import InvalidInputError, ProtocolError, WireFormatError
from statemachine.core.events import Action, Event
from statemachine.core.messages import (
    _STOP_REASONS,
    AssistantMessage,
    ImageContent,
    Message,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    _block_from_dict,
    _block_to_dict,
    freeze_json,
    message_from_dict,
    message_to_dict,
    thaw_json,
)
from statemachine.core.table import RETURNS_TO_CALLER, Trigger, TurnState
from statemachine.core.tools import Scheduling, ToolDefinition, ToolOutput

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "FORMAT",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
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
        if (
            not isinstance(entry, Mapping)
            or set(entry) != {"sequential", "resources"}
            or type(entry["sequential"]) is not bool
            or type(entry["resources"]) is not bool
        ):
            raise WireFormatError(
                f"{path}.{_short(str(name))}: expected {{'sequential': bool, 'resources': bool}}"
            )
        out[str(name)] = Scheduling(sequential=entry["sequential"])
    return out


def _decode_flag(value: Any, path: str) -> bool:
    if type(value) is not bool:
        raise _fail(path, "a boolean", value)
    return value


def _needs_functions(options: Mapping[str, Any]) -> list[str]:
    """Tools whose scheduling used a resources function (replay needs it back)."""
    raw = options.get("scheduling", {})
    if not isinstance(raw, Mapping):
        return []
    return sorted(
        str(n) for n, e in raw.items() if isinstance(e, Mapping) and e.get("resources") is True
    )


_OPTION_CODECS: dict[str, tuple[_Encode, _Decode]] = {
    "scheduling": (_encode_scheduling, _decode_scheduling),
    "check_continue": (lambda v: v, _decode_flag),
}
_HEADER_KEYS: Final = frozenset(
    {"format", "version", "runId", "maxTurns", "checkPermissions", "tools", "messages", "options"}
)


def _check_options(options: Any) -> None:
    """A header's options: each once (the header decoder refuses a repeated key), none
    that the header holds itself, each of its codec's type or a JSON scalar."""
    if not isinstance(options, dict):
        raise _fail("header.options", "an object", options)
    for name, value in options.items():
        if name in _HEADER_FIELDS or name in _NOT_RECORDED:
            raise WireFormatError(f"header.options.{name}: not an option the header records")
        if name in _OPTION_CODECS:
            _OPTION_CODECS[name][1](value, f"header.options.{name}")
        elif not (value is None or type(value) in (bool, int, float, str)):
            raise _fail(f"header.options.{_short(name)}", "a JSON scalar", value)


def _engine_keywords(engine_class: type) -> set[str]:
    """The keyword arguments the constructors of ``engine_class`` name."""
    names: set[str] = set()
    for cls in engine_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None or cls is object:
            continue
        for parameter in inspect.signature(init).parameters.values():
            if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD):
                names.add(parameter.name)
    return names


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
        if type(d.get("version")) is not int or d.get("version") != VERSION:
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
        unknown = set(d) - _HEADER_KEYS
        if unknown:
            raise WireFormatError(f"header: unknown key(s) {_short(', '.join(sorted(unknown)))}")
        options = d.get("options", {})
        _check_options(options)
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
        unknown = sorted(set(self.options) - _engine_keywords(engine_class))
        if unknown:
            raise InvalidInputError(
                f"header.options: {engine_class.__name__} has no option(s) "
                f"{_short(', '.join(unknown))}"
            )
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
# orjson writes strings, integers, booleans and null byte for byte as ``_DIGEST_JSON``
# does (and sorts keys in the same order: UTF-8 preserves code point order) at a
# fraction of the cost; it writes some floats differently ("1e-5", not "1e-05"), and
# refuses integers beyond 64 bits and lone surrogates. Values of only these types go
# through it; anything else, and whatever it refuses, through the stdlib.
_ORJSON_EXACT: Final = frozenset({str, int, bool, type(None), MappingProxyType, tuple})


def _orjson_exact(arguments: Mapping[str, Any]) -> bool:
    """Whether orjson writes this frozen JSON value exactly as ``_DIGEST_JSON`` does."""
    stack: list[Any] = [arguments]
    while stack:
        value = stack.pop()
        items = value.values() if type(value) is MappingProxyType else value
        kinds = set(map(type, items))
        if not kinds <= _ORJSON_EXACT:
            return False
        if MappingProxyType in kinds or tuple in kinds:
            stack.extend(v for v in items if type(v) is MappingProxyType or type(v) is tuple)
    return True


def _digest_text(messages: Sequence[Message]) -> bytes:
    """The messages' digest text, joined by commas (the payload's array, unbracketed)."""
    dicts = [message_to_dict(m) for m in messages]
    # Only an assistant message can hold a float: in a tool call's arguments, or the cost.
    exact = all(
        not isinstance(m, AssistantMessage)
        or (
            (m.usage is None or m.usage.cost is None)
            and all(_orjson_exact(b.arguments) for b in m.content if type(b) is ToolCall)
        )
        for m in messages
    )
    if exact:
        try:
            return orjson.dumps(dicts, option=orjson.OPT_SORT_KEYS)[1:-1]
        except orjson.JSONEncodeError:
            pass  # an integer beyond 64 bits or a lone surrogate: the stdlib writes both
    return _DIGEST_JSON.encode(dicts)[1:-1].encode("utf-8", "surrogatepass")


def _trace_text(records: Sequence[TransitionRecord]) -> bytes:
    try:
        # Enum members are written as their values; a record is a tuple of three and a turn.
        return orjson.dumps(list(map(tuple, records)))[1:-1]
    except orjson.JSONEncodeError:  # not the engine's records: write them as they are
        return ",".join(
            [_RECORD_HEAD[a, b, c] + _DIGEST_JSON.encode(n) + "]" for a, b, c, n in records]
        ).encode("utf-8")


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
        self._trace_text: list[bytes] = []

    def digest(self, messages: Sequence[Message], trace: Sequence[TransitionRecord]) -> str:
        if not (_extends(messages, self._messages) and _extends(trace, self._trace)):
            self._start_over()
        new = list(messages[len(self._messages) :])
        if new:
            # One encoder call for all of them: the list's text without its brackets
            # is the messages' texts joined by commas, exactly as in the whole payload.
            self._hash.update((b"," if self._messages else b"") + _digest_text(new))
            self._messages += new
        new_trace = list(trace[len(self._trace) :])
        if new_trace:
            self._trace_text.append(_trace_text(new_trace))
            self._trace += new_trace
        whole = self._hash.copy()
        whole.update(b'],"trace":[' + b",".join(self._trace_text) + b"]}")
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


# -- reading lines -----------------------------------------------------------------------------

DEFAULT_MAX_LINE_BYTES: Final = 16 * 1024 * 1024
"""The longest journal line ``replay`` reads (bytes of UTF-8; characters for lines given as
``str``): a longer line is a ``JournalError``, found before the line is read whole."""

MAX_DEPTH: Final = 320
"""How deeply a journal line may nest arrays and objects (the record itself takes six
levels around a tool call's arguments). Deeper lines are a ``JournalError``: the run that
wrote them could not have gone much deeper (the interpreter's recursion limit bounds the
history's own encoding), and replay's decoding and digest recurse as deeply."""

MAX_INT_DIGITS: Final = 1000
"""The longest integer (in digits) a journal may hold: converting a longer one costs
time quadratic in its length, and no count or argument a run records needs it."""

_CHUNK_BYTES: Final = 256 * 1024


class _Lines:
    """The lines of a journal, each with its number; raises ``JournalError`` for a line
    over the cap before it is whole in memory. ``unterminated`` says whether the last
    line given out was the journal's last and had no newline (it was cut off)."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.number = 0
        self.unterminated = False

    def __iter__(self) -> Iterator[bytes | str]:
        raise NotImplementedError

    def too_long(self) -> JournalError:
        return JournalError(
            self.number,
            f"the line is longer than {self.max_line_bytes:,} bytes (replay's "
            "max_line_bytes): a journal line is one event or the header",
        )


class _FileLines(_Lines):
    """A file read in chunks: memory holds at most one line of up to the cap and one
    chunk, however long a line is."""

    def __init__(self, stream: IO[bytes], max_line_bytes: int) -> None:
        super().__init__(max_line_bytes)
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        cap = self.max_line_bytes
        head: list[bytes] = []  # the start of a line that goes on in the next chunk
        held = 0
        while chunk := self._stream.read(_CHUNK_BYTES):
            *lines, rest = chunk.split(b"\n")
            for line in lines:
                self.number += 1
                if head:
                    line = b"".join([*head, line])
                    head.clear()
                    held = 0
                if len(line) > cap:
                    raise self.too_long()
                yield line
            if rest:
                held += len(rest)
                if held > cap:
                    self.number += 1
                    raise self.too_long()
                head.append(rest)
        if head:
            self.number += 1
            self.unterminated = True
            yield b"".join(head)


class _TextLines(_Lines):
    """Lines given as strings (each ending with its newline, as a file gives them)."""

    def __init__(self, lines: Iterable[str], max_line_bytes: int) -> None:
        super().__init__(max_line_bytes)
        self._lines = lines

    def __iter__(self) -> Iterator[bytes | str]:
        lines = iter(self._lines)
        line = next(lines, None)
        while line is not None:
            following = next(lines, None)
            self.number += 1
            if not isinstance(line, str):
                raise JournalError(
                    self.number, f"expected a line of text, got {type(line).__name__}"
                )
            if len(line) > self.max_line_bytes:
                raise self.too_long()
            self.unterminated = following is None and not line.endswith("\n")
            raw: bytes | str
            try:
                raw = line.encode()
            except UnicodeEncodeError:
                raw = line  # a lone surrogate: the exact decoder reads the text itself
            yield raw
            line = following


# -- decoding a line ------------------------------------------------------------------------


class _RefusedValueError(ValueError):
    """A JSON value the journal does not accept (raised by the exact decoder's hooks)."""


def _refuse_constant(name: str) -> Any:
    raise _RefusedValueError(f"{name} is not a JSON number")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _RefusedValueError(
            f"an integer of {len(text.lstrip('-')):,} digits (a journal holds at most "
            f"{MAX_INT_DIGITS:,})"
        )
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _RefusedValueError(f"{_short(text, 30)} is out of the range of a number")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _RefusedValueError(f"the key {twice!r} appears twice in one object")
    return out


_EXACT_DECODER: Final = json.JSONDecoder(
    parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_refuse_constant
)
_HEADER_DECODER: Final = json.JSONDecoder(
    parse_int=_bounded_int,
    parse_float=_finite_float,
    parse_constant=_refuse_constant,
    object_pairs_hook=_unique_keys,
)


def _brackets(raw: bytes | str) -> int:
    """An upper bound of how deeply ``raw`` nests (a bracket in a string counts too)."""
    if isinstance(raw, bytes):
        return raw.count(b"[") + raw.count(b"{")
    return raw.count("[") + raw.count("{")


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests deeper than ``limit`` (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if type(item) is dict:
            stack.extend((v, depth + 1) for v in item.values() if type(v) in (dict, list))
        elif type(item) is list:
            stack.extend((v, depth + 1) for v in item if type(v) in (dict, list))
    return False


def _too_deep(number: int) -> JournalError:
    return JournalError(
        number, f"the line nests arrays and objects more than {MAX_DEPTH} levels deep"
    )


def _decode_exact(raw: bytes | str, lines: _Lines, decoder: json.JSONDecoder) -> Any:
    """The stdlib's reading of one line, with the journal's limits; every failure is a
    ``JournalError`` naming the line and saying what is wrong."""
    number = lines.number
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JournalError(
                number, f"not UTF-8 text (byte {exc.start + 1} of the line: {exc.reason})"
            ) from None
    else:
        text = raw
    if not text.strip():
        raise JournalError(number, "blank line: a journal has no empty lines")
    try:
        value = decoder.decode(text)
    except json.JSONDecodeError as exc:
        hint = (
            " (the line has no newline at its end: the journal was cut off while it "
            "was being written)"
            if lines.unterminated
            else ""
        )
        raise JournalError(
            number, f"not valid JSON: {exc.msg} at column {exc.colno}{hint}"
        ) from None
    except _RefusedValueError as exc:
        raise JournalError(number, str(exc)) from None
    except RecursionError:
        raise _too_deep(number) from None
    if _brackets(raw) > MAX_DEPTH and _depth_exceeds(value, MAX_DEPTH):
        raise _too_deep(number)
    return value


# -- the fast decoder: replay's common case -------------------------------------------------
#
# Replay reads each line with orjson and builds its event with the functions below. They
# check exactly what ``event_from_dict`` checks (and the classes' validators would), but
# name no path and build no error text: the first thing that is not as expected raises,
# whatever it is, and the line is then read again by the exact decoder (the stdlib's json
# and ``event_from_dict``), which accepts what they refused if it is valid after all (an
# integer beyond 64 bits, which orjson reads as a float; a lone surrogate) or says
# precisely what is wrong. tests/test_journal_hostile.py checks that both build equal
# events.


class _NotFastError(Exception):
    """Raised by the fast decoder for anything but the common case."""


_new = object.__new__
# orjson reads an integer outside the 64-bit range as a float; the exact decoder reads
# it as the integer it was written as. A float this large may be one, so it goes there.
_FLOAT_BOUND: Final = float(2**63)


def _fast_str(value: Any) -> str:
    if type(value) is str:
        return value
    raise _NotFastError


def _fast_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    raise _NotFastError


def _fast_count(value: Any) -> int:
    if type(value) is int:
        return value
    raise _NotFastError


# The depth of a tool call's arguments in an event line: record, event, message,
# content, block, arguments.
_ARGUMENTS_DEPTH: Final = 6


def _fast_freeze(value: Any, depth: int) -> Any:
    """``freeze_json`` of what orjson returned (only JSON types, string keys) at ``depth``
    in its line, in place: the parsed value belongs to replay alone, so its dicts are
    wrapped, not copied. The depth limit is counted here, where the only deep values
    of an event line can be (every other field has a fixed shape)."""
    if depth > MAX_DEPTH:
        raise _NotFastError
    if type(value) is dict:
        if _NESTED.isdisjoint(map(type, value.values())):  # flat: the common case
            return MappingProxyType(value)
        for key, item in value.items():
            if type(item) in _NESTED:
                value[key] = _fast_item(item, depth)  # a new value, not a new key
        return MappingProxyType(value)
    if _NESTED.isdisjoint(map(type, value)):
        return tuple(value)
    return tuple([_fast_item(item, depth) if type(item) in _NESTED else item for item in value])


def _fast_item(item: Any, depth: int) -> Any:
    if type(item) is float:
        if -_FLOAT_BOUND < item < _FLOAT_BOUND:
            return item
        raise _NotFastError
    return _fast_freeze(item, depth + 1)


# Types that need more than a look: containers, and floats (which may be big integers).
_NESTED: Final = frozenset({dict, list, float})


def _setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot setters of a frozen class's fields: a fast, direct write into an
    instance being built (its frozen ``__setattr__`` stands in the way of plain ones)."""
    out = []
    for name in names:
        slot = cls.__dict__.get(name)
        if isinstance(slot, types.MemberDescriptorType):
            out.append(slot.__set__)
        else:
            out.append(functools.partial(_set_named, name))
    return tuple(out)


def _set_named(name: str, instance: Any, value: Any) -> None:
    object.__setattr__(instance, name, value)


(_SET_TEXT,) = _setters(TextContent, "text")
_SET_THINKING = _setters(ThinkingContent, "thinking", "signature", "redacted")
_SET_IMAGE = _setters(ImageContent, "data", "mime_type")
_SET_CALL = _setters(ToolCall, "id", "name", "arguments", "parse_error")
_SET_USAGE = _setters(Usage, "input", "output", "cache_read", "cache_write", "total_tokens", "cost")
_SET_ASSISTANT = _setters(AssistantMessage, "content", "stop_reason", "error_message", "usage")
(_SET_USER,) = _setters(UserMessage, "content")
_SET_OUTPUT = _setters(ToolOutput, "content", "is_error")


def _fast_text(block: dict[str, Any]) -> TextContent:
    text = block["text"]
    if len(block) != 2 or type(text) is not str:  # "type" and "text"
        raise _NotFastError
    out = _new(TextContent)
    _SET_TEXT(out, text)
    return out


def _fast_thinking(block: dict[str, Any]) -> ThinkingContent:
    thinking = block["thinking"]
    signature = block.get("signature")
    redacted = block.get("redacted")
    if (
        len(block) != 2 + ("signature" in block) + ("redacted" in block)
        or type(thinking) is not str
        or (signature is not None and type(signature) is not str)
        or (redacted is not None and type(redacted) is not bool)
    ):
        raise _NotFastError
    out = _new(ThinkingContent)
    set_thinking, set_signature, set_redacted = _SET_THINKING
    set_thinking(out, thinking)
    set_signature(out, signature)
    set_redacted(out, bool(redacted))
    return out


def _fast_image(block: dict[str, Any]) -> ImageContent:
    data = block["data"]
    mime_type = block["mimeType"]
    if len(block) != 3 or type(data) is not str or type(mime_type) is not str:
        raise _NotFastError
    out = _new(ImageContent)
    set_data, set_mime_type = _SET_IMAGE
    set_data(out, data)
    set_mime_type(out, mime_type)
    return out


def _fast_call(block: dict[str, Any]) -> ToolCall:
    call_id = block["id"]
    name = block["name"]
    arguments = block["arguments"]
    parse_error = block.get("parseError")
    if (
        len(block) != 4 + ("parseError" in block)
        or type(call_id) is not str
        or type(name) is not str
        or type(arguments) is not dict
        or (parse_error is not None and type(parse_error) is not str)
    ):
        raise _NotFastError
    out = _new(ToolCall)
    set_id, set_name, set_arguments, set_parse_error = _SET_CALL
    set_id(out, call_id)
    set_name(out, name)
    set_arguments(out, _fast_freeze(arguments, _ARGUMENTS_DEPTH))
    set_parse_error(out, parse_error)
    return out


_Blocks = dict[str, Callable[[dict[str, Any]], Any]]
_ASSISTANT_BLOCKS: Final[_Blocks] = {
    "text": _fast_text,
    "thinking": _fast_thinking,
    "toolCall": _fast_call,
}
_RESULT_BLOCKS: Final[_Blocks] = {"text": _fast_text, "image": _fast_image}


def _fast_blocks(content: Any, allowed: _Blocks) -> tuple[Any, ...]:
    if type(content) is not list:
        raise _NotFastError
    # A block that is not an object, or of a type not allowed, raises here (TypeError,
    # KeyError): any exception sends the line to the exact decoder.
    return tuple([allowed[block["type"]](block) for block in content])


def _fast_usage(value: Any) -> Usage:
    if type(value) is not dict or len(value) != 5 + ("cost" in value):
        raise _NotFastError
    counts = (
        value["input"],
        value["output"],
        value["cacheRead"],
        value["cacheWrite"],
        value["totalTokens"],
    )
    if any(type(count) is not int for count in counts):
        raise _NotFastError
    cost = value.get("cost")
    if cost is not None:
        kind = type(cost)
        if (kind is not float and kind is not int) or not -_FLOAT_BOUND < cost < _FLOAT_BOUND:
            raise _NotFastError
        cost = float(cost)
    out = _new(Usage)
    for setter, count in zip(_SET_USAGE, (*counts, cost), strict=True):
        setter(out, count)
    return out


def _fast_assistant(value: Any) -> AssistantMessage:
    if type(value) is not dict:
        raise _NotFastError
    error = value.get("errorMessage")
    usage = value.get("usage")
    if (
        len(value) != 3 + ("errorMessage" in value) + ("usage" in value)
        or value["role"] != "assistant"
        or (error is not None and type(error) is not str)
    ):
        raise _NotFastError
    out = _new(AssistantMessage)
    set_content, set_stop_reason, set_error, set_usage = _SET_ASSISTANT
    set_content(out, _fast_blocks(value["content"], _ASSISTANT_BLOCKS))
    set_stop_reason(out, _STOP_REASONS[value["stopReason"]])
    set_error(out, error)
    set_usage(out, None if usage is None else _fast_usage(usage))
    return out


def _fast_user(value: Any) -> UserMessage:
    if type(value) is not dict or len(value) != 2 or value["role"] != "user":
        raise _NotFastError
    out = _new(UserMessage)
    _SET_USER(out, _fast_blocks(value["content"], _RESULT_BLOCKS))
    return out


def _fast_output(value: Any) -> ToolOutput:
    if type(value) is not dict or len(value) != 2:  # "content" and "isError"
        raise _NotFastError
    is_error = value["isError"]
    if type(is_error) is not bool:
        raise _NotFastError
    out = _new(ToolOutput)
    set_content, set_is_error = _SET_OUTPUT
    set_content(out, _fast_blocks(value["content"], _RESULT_BLOCKS))
    set_is_error(out, is_error)
    return out


def _fast_field(field: attrs.Attribute[Any], hint: Any) -> Callable[[Any], Any]:
    """The fast decoder of one event field (a field with no entry here leaves its
    class to the exact decoder, which is always right, only slower)."""
    # The fast decoders check types; a field that checks or converts more must be
    # built by the class itself.
    if field.converter is not None and not (
        isinstance(hint, type) and issubclass(hint, enum.Enum) and field.converter is hint
    ):
        raise LookupError(field.name)
    if field.validator is not None and not isinstance(field.validator, _INSTANCE_OF):
        raise LookupError(field.name)
    if hint is str:
        return _fast_str
    if hint is bool:
        return _fast_bool
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {m.value: m for m in hint}.__getitem__
    fast: dict[Any, Callable[[Any], Any]] = {
        AssistantMessage: _fast_assistant,
        UserMessage: _fast_user,
        ToolOutput: _fast_output,
    }
    if hint in fast:
        return fast[hint]
    raise LookupError(field.name)


_INSTANCE_OF: Final = type(attrs.validators.instance_of(str))
_REQUIRED: Final = object()


def _fast_event_builder(codec: _EventCodec) -> Callable[[dict[str, Any]], Event]:
    cls = codec.cls
    hints = typing.get_type_hints(cls, vars(_events))
    specs = []
    for field, (_, key, _, _, _) in zip(attrs.fields(cls), codec.fields, strict=True):
        if isinstance(field.default, attrs.Factory):  # type: ignore[arg-type]
            raise LookupError(field.name)
        default = _REQUIRED if field.default is attrs.NOTHING else field.default
        (setter,) = _setters(cls, field.name)
        specs.append((setter, key, _fast_field(field, hints[field.name]), default))

    def build(data: dict[str, Any]) -> Event:
        event: Event = _new(cls)
        known = 1  # "type"
        for setter, key, decode, default in specs:
            if key in data:
                setter(event, decode(data[key]))
                known += 1
            elif default is _REQUIRED:
                raise _NotFastError
            else:
                setter(event, default)
        if known != len(data):  # a key that is not a field
            raise _NotFastError
        return event

    return build


def _fast_event_builders() -> dict[str, Callable[[dict[str, Any]], Event]]:
    builders = {}
    for name, codec in _CODECS.items():
        try:
            builders[name] = _fast_event_builder(codec)
        except LookupError:
            continue
    return builders


_FAST_EVENTS: Final = _fast_event_builders()


# -- replaying --------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_lines(
    source: str | os.PathLike[str] | Iterable[str], max_line_bytes: int
) -> Iterator[_Lines]:
    if not isinstance(source, (str, os.PathLike)):
        yield _TextLines(source, max_line_bytes)
        return
    try:
        stream = open(source, "rb")  # noqa: SIM115 - closed below, after the replay
    except OSError as exc:
        raise JournalError(0, f"cannot read journal {os.fspath(source)!r}: {exc}") from None
    with stream:
        yield _FileLines(stream, max_line_bytes)


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
    with _open_lines(source, max_line_bytes) as lines:
        return _replay_lines(lines, strict, engine_class, logger, engine_options)


def _replay_lines(
    lines: _Lines,
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
        for raw in each:
            replayer.replay_line(raw, lines)
    except JournalError as exc:
        error = exc
    if error is not None and strict:
        raise error
    return ReplayResult(header, engine, tuple(replayer.steps), replayer.checkpoints, error)


def _start(
    raw: bytes | str, lines: _Lines, engine_class: type[Engine], options: dict[str, Any]
) -> tuple[JournalHeader, Engine]:
    """The header, and the engine it describes (or a ``JournalError`` for line 1)."""
    value = _decode_exact(raw, lines, _HEADER_DECODER)
    try:
        header = JournalHeader.from_dict(value)
        engine = header.engine(engine_class, **options)
    except InvalidInputError as exc:
        raise JournalError(1, f"bad header: {exc}") from None
    except Exception as exc:  # whatever a header holds, its failure is the header's
        raise JournalError(1, f"bad header: {type(exc).__name__}: {exc}") from exc
    return header, engine


_EVENT_RECORD_KEYS: Final = frozenset({"seq", "event", "after"})
_SET_STEP: Final = _setters(ReplayStep, "line", "event", "transitions", "state")
_STATE_NAMES: Final = {state.value: state for state in TurnState}


class _Replayer:
    """Replays event lines into an engine, checking each against what it records."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.digest = _RunningDigest()
        self.steps: list[ReplayStep] = []
        self.checkpoints = 0
        self.expected_seq = 1

    def replay_line(self, raw: bytes | str, lines: _Lines) -> None:
        """Replay one line; anything that goes wrong is a ``JournalError`` naming it."""
        try:
            self._replay_line(raw, lines)
        except JournalError:
            raise
        except Exception as exc:  # the journal's fault or the engine's: either way, named
            raise JournalError(
                lines.number, f"cannot replay this line: {type(exc).__name__}: {exc}"
            ) from exc

    def _replay_line(self, raw: bytes | str, lines: _Lines) -> None:
        try:
            read = self._read_fast(orjson.loads(raw), raw)
        except Exception:  # noqa: BLE001 - anything unusual: the exact reading says what
            read = self._read_exact(_decode_exact(raw, lines, _EXACT_DECODER), lines.number)
        if read is None:
            self.checkpoints += 1
            return
        event, after = read
        engine = self.engine
        trace = engine.trace
        mark = len(trace)
        try:
            engine.handle(event)
        except ProtocolError as exc:
            raise JournalError(
                lines.number, f"the engine refuses {type(event).__name__} here: {exc}"
            ) from None
        state = engine.state
        if state is not after:
            raise JournalError(
                lines.number,
                f"replay diverged: the journal says the run went to {after.value}, the "
                f"engine went to {state.value}",
            )
        step = _new(ReplayStep)  # as ReplayStep(...) would, at a third of the cost
        set_line, set_event, set_transitions, set_state = _SET_STEP
        set_line(step, lines.number)
        set_event(step, event)
        set_transitions(step, tuple(trace[mark:]))
        set_state(step, state)
        self.steps.append(step)
        self.expected_seq += 1

    def _read_fast(self, record: Any, raw: bytes | str) -> tuple[Event, TurnState] | None:
        """The common case, or an exception (of any kind) for anything else."""
        if type(record) is not dict:
            raise _NotFastError
        if "checkpoint" in record:
            self._verify_checkpoint(record["checkpoint"], 0)
            return None
        if record.keys() != _EVENT_RECORD_KEYS:
            raise _NotFastError
        seq = record["seq"]
        if type(seq) is not int or seq != self.expected_seq:
            raise _NotFastError
        data = record["event"]
        event = _FAST_EVENTS[data["type"]](data)
        return event, _STATE_NAMES[record["after"]]

    def _read_exact(self, record: Any, number: int) -> tuple[Event, TurnState] | None:
        """Read a line as ``event_from_dict`` does, or say what is wrong with it."""
        if type(record) is not dict:
            raise JournalError(number, f"expected a JSON object, got {type(record).__name__}")
        if "checkpoint" in record:
            self._verify_checkpoint(record["checkpoint"], number)
            return None
        if record.keys() != _EVENT_RECORD_KEYS:
            raise JournalError(
                number,
                "expected an event record with keys 'seq', 'event', 'after' or a checkpoint; "
                f"got keys {', '.join(map(repr, sorted(record)))}",
            )
        seq = record["seq"]
        if type(seq) is not int or seq != self.expected_seq:  # a JSON true equals 1
            raise JournalError(
                number,
                f"event number {_short(repr(seq))} where {self.expected_seq} was expected "
                "(a line is missing, repeated or out of order)",
            )
        try:
            event = event_from_dict(record["event"])
        except WireFormatError as exc:
            raise JournalError(number, str(exc)) from None
        raw_after = record["after"]
        after = _STATE_NAMES.get(raw_after) if type(raw_after) is str else None
        if after is None:
            raise JournalError(number, f"'after': {_short(repr(raw_after))} is not a state")
        return event, after

    def _verify_checkpoint(self, recorded: Any, number: int) -> None:
        actual = _checkpoint_of(self.engine, self.digest)
        if type(recorded) is not dict:
            raise JournalError(number, "a checkpoint must be an object")
        # Types count: a count written as 3.0 or true is not what the writer wrote.
        differences = [
            f"{key}: journal {_short(repr(recorded.get(key)))}, replay {value!r}"
            for key, value in actual.items()
            if type(recorded.get(key)) is not type(value) or recorded.get(key) != value
        ]
        if recorded.keys() != actual.keys():
            differences.append(f"keys: journal {sorted(recorded)!r}, replay {sorted(actual)!r}")
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
    parser = CommandParser(
        "replay",
        description="Replay a run journal, print it as a readable trace and verify it.",
        failed="the journal does not replay as recorded (a bad or cut-off line, or a step "
        "that comes out differently)",
    )
    parser.add_argument("file", help="the journal (JSON Lines)")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict")
    parser.add_argument(
        "--max-line-bytes",
        type=int,
        default=DEFAULT_MAX_LINE_BYTES,
        help="refuse a line longer than this (default: 16 MiB)",
    )
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    if args.max_line_bytes < 1:
        return fail("replay", f"--max-line-bytes must be at least 1, got {args.max_line_bytes}")
    out = io.StringIO()
    try:
        # The command prints its own trace; the engine's per-transition log lines would
        # only repeat it (warnings, such as normalised ids, still show).
        quiet = structlog.wrap_logger(
            None, wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
        )
        result = replay(args.file, strict=False, logger=quiet, max_line_bytes=args.max_line_bytes)
    except JournalError as exc:
        if exc.line == 0:  # line 0: the file itself cannot be opened
            return fail("replay", str(exc), EXIT_USAGE)
        return fail("replay", f"FAILED: {exc}", EXIT_FAILED)
    except InvalidInputError as exc:
        return fail("replay", str(exc), EXIT_USAGE)
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
        return fail(
            "replay",
            f"FAILED: {result.error} (everything before line {result.error.line} replayed "
            "and verified)",
            EXIT_FAILED,
        )
    if result.checkpoints == 0:
        print(
            "OK (no checkpoint: the run had not returned when the journal ends)",
        )
        return 0
    print("OK: the replay matches the journal")
    return 0
