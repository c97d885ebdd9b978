"""The checkpoint: where a run stands, with a digest of its whole history and
transition log, written at each return and checked by replay.

The digest is incremental (``RunningDigest``): a history and a transition log only
grow, so each message is encoded once, straight into the text the digest defines.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import orjson

from statemachine.core.engine import Engine, TransitionRecord
from statemachine.core.messages import (
    AssistantMessage,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from statemachine.core.wire import message_to_dict

__all__ = ["RunningDigest", "canonical_message", "checkpoint_of", "history_digest"]


def history_digest(messages: Iterable[Message], trace: Iterable[TransitionRecord]) -> str:
    """A SHA-256 of the history's wire form and the transition log (I5 in one string).

    The hashed text is ``json.dumps({"messages": [<wire messages>], "trace":
    [[source, trigger, dest, turn], ...]}, sort_keys=True, ensure_ascii=False,
    separators=(",", ":"))`` in UTF-8 (lone surrogates, which a cut-off model stream
    can leave in a string, are encoded as they are rather than refused).
    """
    return RunningDigest().digest(list(messages), list(trace))


_DIGEST_JSON: Final = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"))
# orjson writes strings, integers, booleans and null byte for byte as ``_DIGEST_JSON``
# does (and sorts keys in the same order: UTF-8 preserves code point order) at a
# fraction of the cost; it writes some floats differently ("1e-5", not "1e-05"), and
# refuses integers beyond 64 bits and lone surrogates. Values of only these types go
# through it; anything else, and whatever it refuses, through the stdlib.
_ORJSON_EXACT: Final = frozenset({str, int, bool, type(None), MappingProxyType, tuple})
_dumps: Final = orjson.dumps
_SORTED: Final = orjson.OPT_SORT_KEYS


class _NotExactError(Exception):
    """A value orjson would write otherwise than the stdlib (see ``_ORJSON_EXACT``)."""


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


# Each encoder below writes its value's wire form (``statemachine.core.wire``) with the
# keys in sorted order, straight from the object: building the wire dicts first and
# sorting them cost more than the rest of replay's verification together (bench/).
# tests/test_journal.py checks them against the stdlib's text of the wire dicts.


def _text(block: TextContent) -> bytes:
    return b'{"text":' + _dumps(block.text) + b',"type":"text"}'


def _thinking(block: ThinkingContent) -> bytes:
    head = b'{"redacted":true,' if block.redacted else b"{"
    if block.signature is not None:
        head += b'"signature":' + _dumps(block.signature) + b","
    return head + b'"thinking":' + _dumps(block.thinking) + b',"type":"thinking"}'


def _image(block: ImageContent) -> bytes:
    return (
        b'{"data":'
        + _dumps(block.data)
        + b',"mimeType":'
        + _dumps(block.mime_type)
        + b',"type":"image"}'
    )


# The values of flat arguments (the usual kind), which orjson writes as the stdlib does
# once the mapping is a plain dict (a copy made in C, not a ``default`` call back).
_FLAT: Final = frozenset({str, int, bool, type(None)})


def _call(block: ToolCall) -> bytes:
    arguments: Any = block.arguments
    if set(map(type, arguments.values())) <= _FLAT:
        arguments = dict(arguments)
    elif not _orjson_exact(arguments):
        raise _NotExactError
    # One dict written by orjson with sorted keys: fewer calls than the parts joined.
    wire = {"arguments": arguments, "id": block.id, "name": block.name, "type": "toolCall"}
    if block.parse_error is not None:
        wire["parseError"] = block.parse_error
    return _dumps(wire, default=dict, option=_SORTED)


_BLOCKS: Final[dict[type, Callable[[Any], bytes]]] = {
    TextContent: _text,
    ThinkingContent: _thinking,
    ImageContent: _image,
    ToolCall: _call,
}


def _content(blocks: Sequence[Any]) -> bytes:
    return b'{"content":[' + b",".join([_BLOCKS[type(b)](b) for b in blocks]) + b"]"


def _usage(usage: Usage) -> bytes:
    if usage.cost is not None:  # a float: the stdlib writes it
        raise _NotExactError
    return b',"usage":{"cacheRead":%d,"cacheWrite":%d,"input":%d,"output":%d,"totalTokens":%d}' % (
        usage.cache_read,
        usage.cache_write,
        usage.input,
        usage.output,
        usage.total_tokens,
    )


# The text of each stop reason (an enum's ``value`` is a Python-level property).
_STOP_REASON: Final = {
    reason: b',"role":"assistant","stopReason":' + _dumps(reason.value) for reason in StopReason
}


def _assistant(message: AssistantMessage) -> bytes:
    text = _content(message.content)
    if message.error_message is not None:
        text += b',"errorMessage":' + _dumps(message.error_message)
    text += _STOP_REASON[message.stop_reason]
    if message.usage is not None:
        text += _usage(message.usage)
    return text + b"}"


def _user(message: UserMessage) -> bytes:
    return _content(message.content) + b',"role":"user"}'


def _result(message: ToolResultMessage) -> bytes:
    return _result_after(_content(message.content), message)


def _result_after(content: bytes, message: ToolResultMessage) -> bytes:
    """A tool result's text, from the text of its content (``{"content":[...]``)."""
    return (
        content
        + (b',"isError":true' if message.is_error else b',"isError":false')
        + b',"role":"toolResult","toolCallId":'
        + _dumps(message.tool_call_id)
        + b',"toolName":'
        + _dumps(message.tool_name)
        + b"}"
    )


_MESSAGES: Final[dict[type, Callable[[Any], bytes]]] = {
    UserMessage: _user,
    AssistantMessage: _assistant,
    ToolResultMessage: _result,
}


def canonical_message(message: Message) -> bytes:
    """The message's wire form as the digest hashes it: sorted keys, no spaces, UTF-8
    (``ensure_ascii=False``; a lone surrogate is written as it is)."""
    try:
        return _MESSAGES[type(message)](message)
    except (_NotExactError, orjson.JSONEncodeError, KeyError):
        # A float, an integer beyond 64 bits, a lone surrogate, or a subclass: the
        # stdlib writes the wire dict.
        text = _DIGEST_JSON.encode(message_to_dict(message))
        return text.encode("utf-8", "surrogatepass")


def _trace_text(records: Sequence[TransitionRecord]) -> bytes:
    """The records' text, ``["Ready","start","AwaitingModel",0]`` each, joined by commas.

    orjson writes a state or a trigger (a string enum) as its value, and a turn as the
    stdlib does; it takes no named tuple, so it asks ``default`` for each record, which
    gives it as a plain tuple (one at a time: a list of them all made at a checkpoint
    kept the collector busy)."""
    try:
        return orjson.dumps(records, default=tuple)[1:-1]
    except orjson.JSONEncodeError:  # a declared state, a turn beyond 64 bits: the stdlib
        return ",".join(
            [
                _DIGEST_JSON.encode([a.value, b.value, c.value])[:-1]
                + ","
                + _DIGEST_JSON.encode(n)
                + "]"
                for a, b, c, n in records
            ]
        ).encode("utf-8")


def _extends(items: Sequence[Any], prefix: Sequence[Any]) -> bool:
    return len(items) >= len(prefix) and all(map(operator.is_, items, prefix))


class RunningDigest:
    """``history_digest`` of one run, computed in steps as the run grows.

    A history and a transition log only grow, so each message and record is encoded
    once and the messages' part of the text is hashed once: a checkpoint costs the new
    messages plus a hash of the (short) trace text, instead of re-encoding the whole
    run each time. If what is asked for does not continue what was hashed (an engine
    that rewrote its past), it starts over, so the value is always the full digest's.
    """

    def __init__(self) -> None:
        # Texts given by ``know``, by the id of their object (a message, or a tool
        # output's content), each with its object: held, no other object takes its id.
        self._known: dict[int, tuple[object, bytes]] = {}
        self._start_over()

    def know(self, value: object, wire: Any) -> None:
        """Take the text of ``value`` (a message, or the content tuple of a tool's
        output) from ``wire``, its wire form as orjson parsed it from a journal line.

        ``wire`` must hold exactly what ``value``'s wire form holds, or at the places
        where it may not (a key at its default value, a float) something orjson cannot
        write (replay's fast decoder puts ``INEXACT`` there): then ``value`` is simply
        written from the object when the digest reaches it. orjson writes these types
        as ``_DIGEST_JSON`` does (see ``_ORJSON_EXACT``)."""
        try:
            text = _dumps(wire, option=_SORTED)
        except Exception:  # noqa: BLE001 - whatever orjson refuses is written from the object
            return
        self._known[id(value)] = (value, text)

    def _text(self, message: Message) -> bytes:
        known = self._known
        if known:
            entry = known.pop(id(message), None)
            if entry is not None:
                return entry[1]
            if type(message) is ToolResultMessage:
                entry = known.pop(id(message.content), None)
                if entry is not None:
                    return _result_after(b'{"content":' + entry[1], message)
        return canonical_message(message)

    def follow(self, messages: Sequence[Message]) -> None:
        """Hash the messages appended to ``messages`` since the digest last saw it; the
        ones before are taken as unchanged (``digest`` checks them, and starts over if
        they are not). Replay calls it after each event, so a text that ``know`` took
        is hashed and dropped at once: held until a checkpoint, each of orjson's texts
        cost about 2 µs of the allocator's time (bench/results.md)."""
        hashed = self._messages
        for index in range(len(hashed), len(messages)):
            message = messages[index]
            self._hash.update(b"," + self._text(message) if hashed else self._text(message))
            hashed.append(message)

    def _start_over(self) -> None:
        self._hash = hashlib.sha256(b'{"messages":[')
        self._messages: list[Message] = []
        self._trace: list[TransitionRecord] = []  # the log hashed so far
        self._trace_text: list[bytes] = []

    def digest(self, messages: Sequence[Message], trace: Sequence[TransitionRecord]) -> str:
        if not (_extends(messages, self._messages) and _extends(trace, self._trace)):
            self._start_over()
        self.follow(messages)  # the payload's array: the messages' texts joined by commas
        new_trace = list(trace[len(self._trace) :])
        if new_trace:
            self._trace_text.append(_trace_text(new_trace))
            self._trace += new_trace
        whole = self._hash.copy()
        whole.update(b'],"trace":[' + b",".join(self._trace_text) + b"]}")
        return whole.hexdigest()


def checkpoint_of(engine: Engine, digest: RunningDigest) -> dict[str, Any]:
    return {
        "state": engine.state.value,
        "turns": engine.turns,
        "messages": len(engine.messages),
        "transitions": len(engine.trace),
        "digest": digest.digest(engine.messages, engine.trace),
    }
