"""What callers hand a durable backend, bounded before anything is stored: names (an
executor id, a queue, an application version), run ids, database URLs, queues'
concurrency limits, and the texts of messages, reasons and explanations. Each refusal
is an ``InvalidInputError``."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from statemachine.core.checks import positive_int
from statemachine.core.inputs import check_history
from statemachine.core.messages import Message, TextContent, UserMessage
from statemachine.core.wire import block_to_dict, message_to_dict, messages_to_dicts
from statemachine.errors import InvalidInputError

__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_QUEUE_CONCURRENCY",
    "MAX_URL_CHARS",
    "check_name",
    "check_queues",
    "check_run_id",
    "check_url",
    "checked_text",
    "run_spec",
    "storable",
    "user_dict",
]

MAX_MESSAGE_CHARS = 100_000  # a steer or follow-up message, a reason
MAX_QUEUE_CONCURRENCY = 1000
MAX_URL_CHARS = 2000


def check_url(url: object) -> str:
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise InvalidInputError(
            f"a database URL is a non-empty str of at most {MAX_URL_CHARS} chars"
        )
    return url


def check_queues(queues: object) -> dict[str, int]:
    if not isinstance(queues, Mapping):
        raise InvalidInputError("queues must map queue names to concurrency limits")
    for queue, limit in queues.items():
        check_name(queue, "a queue name")
        if isinstance(limit, bool) or not isinstance(limit, int):
            limit = -1
        if not 1 <= limit <= MAX_QUEUE_CONCURRENCY:
            raise InvalidInputError(
                f"queue {queue!r}: the concurrency limit must be an integer from 1 to "
                f"{MAX_QUEUE_CONCURRENCY}, got {queues[queue]!r}"
            )
    return dict(queues)


def check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise InvalidInputError(
            f"{what} must be a non-empty str of at most 200 chars, got {name!r}"
        )
    storable(name, what)


def check_run_id(run_id: object) -> None:
    if not isinstance(run_id, str) or not run_id or len(run_id) > 200:
        raise InvalidInputError(f"a run id is a non-empty str of at most 200 chars, got {run_id!r}")
    storable(run_id, "a run id")


def storable(text: str, what: str) -> None:
    """Refuse what a database cannot hold as text: NUL (PostgreSQL), a lone surrogate
    (no UTF-8 form), before anything is stored."""
    if "\x00" in text:
        raise InvalidInputError(f"{what} must not contain NUL, got {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(
            f"{what} must be valid Unicode text (no lone surrogate), got {text!r}"
        ) from None


def checked_text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_MESSAGE_CHARS:
        raise InvalidInputError(f"{what} must be a str of at most {MAX_MESSAGE_CHARS} chars")
    return value


def user_dict(message: str | UserMessage) -> dict[str, Any]:
    if isinstance(message, str):
        message = UserMessage(checked_text(message, "a message"))
    if not isinstance(message, UserMessage):
        raise InvalidInputError("queued input must be a str or a UserMessage")
    encoded = message_to_dict(message)
    size = sum(
        len(block.text) if isinstance(block, TextContent) else len(json.dumps(block_to_dict(block)))
        for block in message.content
    )
    if size > MAX_MESSAGE_CHARS:
        raise InvalidInputError(
            f"a message must be at most {MAX_MESSAGE_CHARS} chars, got {size} in a UserMessage"
        )
    return encoded


def run_spec(
    run_id: str,
    model: str,
    messages: str | Sequence[Message],
    tools: Sequence[str] | None,
    max_turns: int,
    *,
    models: Collection[str],
    registry_tools: Collection[str],
) -> dict[str, Any]:
    """A run's input as a backend stores it (the model's and tools' names, the
    messages as wire dicts, ``max_turns``), checked when the run is started rather
    than in a worker later: ``models`` and ``registry_tools`` are the names the
    runner's registry knows; ``tools=None`` means all of them."""
    check_run_id(run_id)
    if model not in models:
        raise InvalidInputError(f"unknown model {model!r}; known: {sorted(models)}")
    names = list(registry_tools) if tools is None else list(tools)
    unknown = [n for n in names if n not in registry_tools]
    if unknown:
        raise InvalidInputError(f"unknown tools {unknown}; known: {sorted(registry_tools)}")
    positive_int("max_turns", max_turns)
    if isinstance(messages, str):
        messages = [UserMessage(checked_text(messages, "a message"))]
    return {
        "model": model,
        "tools": names,
        "messages": messages_to_dicts(check_history(messages)),
        "max_turns": max_turns,
    }
