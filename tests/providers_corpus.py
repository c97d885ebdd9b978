"""The recorded corpus: real provider traffic, taken from public test suites.

Each file under ``tests/fixtures/providers/<provider>/recorded/`` is one recorded
conversation (see ``SOURCES.md`` there): a list of interactions, each the request
body the recording client sent and the response the provider gave (status, content
type and body: JSON, event-stream text, or base64 for a binary stream). Headers are
not kept, so no key, cookie or account id is in the corpus.

``Recording.replies()`` turns the responses into replies of the loopback server, so
that an adapter reads exactly the bytes the provider sent.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from providers_server import FIXTURES, TEXT_PIECES, LoopbackServer, Reply, complete

import statemachine as sm
from statemachine.errors import ProviderError


@attrs.frozen
class Interaction:
    request: dict[str, Any]
    response: dict[str, Any]

    @property
    def body(self) -> Any:
        """The request's JSON body."""
        return self.request.get("json")

    @property
    def status(self) -> int:
        return int(self.response["status"])

    def reply(self) -> Reply:
        response = self.response
        if "json" in response:
            data = json.dumps(response["json"]).encode("utf-8")
        elif "base64" in response:
            data = base64.b64decode(response["base64"])
        else:
            data = str(response.get("text", "")).encode("utf-8")
        return Reply(self.status, (("Content-Type", response["content_type"]),), data)


@attrs.frozen
class Recording:
    name: str
    source: dict[str, str]
    interactions: tuple[Interaction, ...]

    def replies(self) -> list[Reply]:
        return [i.reply() for i in self.interactions]


def recordings(provider: str) -> Iterator[Recording]:
    """Every recording of ``provider``, by name."""
    for path in sorted((FIXTURES / provider / "recorded").glob("*.json")):
        yield recording(provider, path.stem)


def recording(provider: str, name: str, folder: str = "recorded") -> Recording:
    """One recording, by provider and name (``folder``: a subfolder other than
    ``recorded``, for recordings the shared replay test does not take)."""
    path: Path = FIXTURES / provider / folder / f"{name}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    return Recording(
        name,
        data["source"],
        tuple(Interaction(i["request"], i["response"]) for i in data["interactions"]),
    )


def sse_events(text: str) -> list[dict[str, Any]]:
    """The JSON ``data`` of each event in an event-stream text."""
    events = []
    for line in text.splitlines():
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            if data and data != "[DONE]":
                events.append(json.loads(data))
    return events


def event_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One message of the AWS event-stream framing (the binary stream of Bedrock's
    ``ConverseStream``): a prelude with both lengths and its CRC32, string headers,
    the payload, and the CRC32 of the whole message. The recorded streams use the
    same framing; this builds the hand-made ones."""
    encoded = b"".join(
        struct.pack("!B", len(name))
        + name.encode()
        + struct.pack("!BH", 7, len(value))
        + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    head = prelude + struct.pack("!I", binascii.crc32(prelude)) + encoded + payload
    return head + struct.pack("!I", binascii.crc32(head))


def bedrock_event(kind: str, body: dict[str, Any]) -> bytes:
    """A ``ConverseStream`` event of type ``kind``."""
    headers = {":event-type": kind, ":content-type": "application/json", ":message-type": "event"}
    return event_message(headers, json.dumps(body).encode())


def bedrock_exception(kind: str, message: str) -> bytes:
    """An exception inside a ``ConverseStream`` (``throttlingException``...)."""
    headers = {
        ":exception-type": kind,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return event_message(headers, json.dumps({"message": message}).encode())


def bedrock_text_stream() -> bytes:
    """The text stream every adapter's shared tests use, as Bedrock frames it."""
    events = [bedrock_event("messageStart", {"role": "assistant"})]
    events += [
        bedrock_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": p}})
        for p in TEXT_PIECES
    ]
    events.append(bedrock_event("contentBlockStop", {"contentBlockIndex": 0}))
    events.append(bedrock_event("messageStop", {"stopReason": "end_turn"}))
    usage = {"inputTokens": 412, "outputTokens": 19, "totalTokens": 431}
    events.append(bedrock_event("metadata", {"usage": usage, "metrics": {"latencyMs": 5}}))
    return b"".join(events)


Outcome = sm.AssistantMessage | ProviderError


def replay(
    rec: Recording,
    server: LoopbackServer,
    model_for: Callable[[Interaction, LoopbackServer, Callable[[str], None]], sm.ModelClient],
    new_messages: Callable[[Mapping[str, Any], Sequence[sm.Message]], list[sm.Message]],
    tools_of: Callable[[Mapping[str, Any]], tuple[sm.ToolDefinition, ...]],
) -> tuple[list[Outcome], list[list[str]]]:
    """Every turn of ``rec`` until the first error: the outcomes and the text pieces
    each turn streamed.

    The loopback server sends the recorded responses; each turn's history is the one
    before, our reply, and ``new_messages`` of the recorded request. ``model_for``
    makes the model of one interaction, on the server, streaming its text to the
    callback given."""
    server.add(*rec.replies())
    history: list[sm.Message] = []
    outcomes: list[Outcome] = []
    pieces: list[list[str]] = []
    for interaction in rec.interactions:
        body = interaction.body
        history.extend(new_messages(body, history))
        streamed: list[str] = []
        pieces.append(streamed)
        model = model_for(interaction, server, streamed.append)
        try:
            reply = complete(model, history, tools_of(body))
        except ProviderError as exc:
            outcomes.append(exc)
            break
        outcomes.append(reply)
        history.append(reply)
    return outcomes, pieces


def trailing(items: Sequence[Mapping[str, Any]], roles: Collection[str]) -> list[Mapping[str, Any]]:
    """The items at the end of a recorded request whose role is one of ``roles``."""
    tail: list[Mapping[str, Any]] = []
    for item in reversed(items):
        if item["role"] not in roles:
            break
        tail.insert(0, item)
    return tail


def last_calls(history: Sequence[sm.Message]) -> list[sm.ToolCall]:
    """The calls of the last assistant message of ``history`` (none before the first)."""
    for message in reversed(history):
        if isinstance(message, sm.AssistantMessage):
            return list(message.tool_calls)
    return []
