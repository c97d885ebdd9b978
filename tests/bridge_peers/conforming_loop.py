"""A tiny agent loop in plain Python that speaks the bridge protocol (version 1).

It runs as its own process (``python conforming_loop.py``) and knows nothing of
statemachine: the test suite drives it through ``statemachine.testing.bridge`` to
show that the bridge judges a foreign loop. It is sequential on purpose: one model
request or tool execution at a time, each line read in order, so every abort is seen
at the same point of every run. ``broken_loop.py`` reuses it with one defect.
"""

from __future__ import annotations

import json
import sys
from typing import Any

PROTOCOL = 1


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Peer:
    def __init__(self) -> None:
        self.aborted = False
        self.next_id = 0

    def read(self) -> dict[str, Any]:
        line = sys.stdin.readline()
        if not line:
            raise SystemExit(0)  # the kit has gone: nothing left to do
        message: dict[str, Any] = json.loads(line)
        if message["type"] == "abort":
            self.aborted = True
        return message

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send a request and wait for its answer; forward an abort that arrives meanwhile."""
        self.next_id += 1
        op = f"op{self.next_id}"
        send({**message, "id": op})
        cancelled = self.aborted
        while True:
            reply = self.read()
            if reply["type"] == "abort" and not cancelled:
                send({"type": "cancel", "id": op})
                cancelled = True
            elif reply.get("id") == op:
                return reply


def invalid(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """The subset of JSON Schema the kit's tools use: property types, required, extras."""
    kinds: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
    }
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in arguments:
            return f"missing required argument {name!r}"
    for name, value in arguments.items():
        spec = properties.get(name)
        if spec is None:
            if schema.get("additionalProperties") is False:
                return f"unexpected argument {name!r}"
            continue
        kind = kinds.get(spec.get("type"))
        if kind is not None and (
            not isinstance(value, kind) or (isinstance(value, bool) and kind is int)
        ):
            return f"argument {name!r} must be a {spec['type']}"
    return None


def error_result(call: dict[str, Any], text: str) -> dict[str, Any]:
    return {
        "role": "toolResult",
        "toolCallId": call["id"],
        "toolName": call["name"],
        "content": [{"type": "text", "text": text}],
        "isError": True,
    }


def stops(message: dict[str, Any], calls: list[dict[str, Any]]) -> bool:
    """Whether the run is over after this response: decided by the calls, not the stop reason."""
    return not calls


def run(peer: Peer, start: dict[str, Any]) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = list(start["messages"])
    tools = {tool["name"]: tool for tool in start["tools"]}
    seen = {
        block["id"]
        for m in history
        if m["role"] == "assistant"
        for block in m["content"]
        if block["type"] == "toolCall"
    }
    turns = 0
    while True:
        if peer.aborted:
            return history
        turns += 1
        reply = peer.request({"type": "modelRequest", "messages": history})
        if reply["type"] == "modelError":
            history.append(
                {
                    "role": "assistant",
                    "content": [],
                    "stopReason": "error",
                    "errorMessage": reply["error"],
                }
            )
            return history
        message = reply["message"]
        calls = [b for b in message["content"] if b["type"] == "toolCall"]
        for call in calls:  # empty or repeated ids would break pairing by id
            if not call["id"] or call["id"] in seen:
                n = len(seen)
                while f"call_r{n}" in seen:
                    n += 1
                call["id"] = f"call_r{n}"
            seen.add(call["id"])
        history.append(message)
        if message["stopReason"] in ("error", "aborted") or peer.aborted:
            # A response that arrived after the abort is kept as it is, but not acted on.
            why = (
                "the run was aborted"
                if peer.aborted
                else f"the response ended with {message['stopReason']}"
            )
            history += [error_result(c, f"Not run: {why}") for c in calls]
            return history
        if stops(message, calls):
            return history
        for call in calls:
            tool = tools.get(call["name"])
            if peer.aborted:
                history.append(error_result(call, "Not run: the run was aborted"))
            elif tool is None:
                history.append(error_result(call, f"Tool {call['name']} not found"))
            elif (problem := invalid(tool["parameters"], call["arguments"])) is not None:
                history.append(
                    error_result(call, f"Invalid arguments for {call['name']}: {problem}")
                )
            else:
                answer = peer.request(
                    {"type": "toolExecute", "name": call["name"], "arguments": call["arguments"]}
                )
                history.append(
                    {
                        "role": "toolResult",
                        "toolCallId": call["id"],
                        "toolName": call["name"],
                        "content": answer["content"],
                        "isError": answer["isError"],
                    }
                )
        if turns >= start["maxTurns"]:
            return history


def main() -> None:
    send({"type": "hello", "protocol": PROTOCOL, "peer": "tests/bridge_peers/conforming_loop.py"})
    peer = Peer()
    start = peer.read()
    peer.aborted = bool(start.get("aborted"))
    send({"type": "result", "messages": run(peer, start)})


if __name__ == "__main__":
    main()
