"""Rebuilding a durable run's journal from its saved steps, on any backend.

An export writes a durable run as the journal ``run_agent_journaled`` would have
written for it, by running the run's course again (``_course.drive``) over a
journaling engine, every model call, tool call and hook check answered by the
events its saved step holds (``Recorded``), never by running it. This module holds
what that needs besides the backend's replay of its own run: the saved steps by
kind, stand-ins for the model, the tools and the hooks (an export calls none), the
check of a finished run's rebuilt result against its saved one, and the writing of
the journal, encoded as a journal file is (a lone surrogate escaped) and whole or
not at all.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections import deque
from collections.abc import Mapping, Sequence
from typing import IO, Any, Final

import attrs

from statemachine.agent.events import RunResult
from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.events import ToolCancelled, ToolFinished
from statemachine.core.messages import AssistantMessage, Message
from statemachine.core.tools import ToolDefinition
from statemachine.durable import ExportError
from statemachine.durable._wire import decode_step_events, result_from_dict
from statemachine.errors import InvalidInputError

__all__ = [
    "CONTINUE_STEP",
    "DECISION_STEP",
    "MAX_EXPORT_STEPS",
    "MODEL_STEP",
    "NOT_RECORDED",
    "PERMISSION_STEP",
    "TOOL_STEP",
    "NoModel",
    "RecordEndedError",
    "Recorded",
    "SavedStep",
    "check_against",
    "journal_buffer",
    "options",
    "stand_in",
    "write_journal",
]

MAX_EXPORT_STEPS: Final = 200_000  # saved operations of one run an export reads
MODEL_STEP = "statemachine.model"
TOOL_STEP = "statemachine.tool"
PERMISSION_STEP = "statemachine.permissions"
CONTINUE_STEP = "statemachine.continue"
DECISION_STEP = "statemachine.step"  # a declared step's decision (``statemachine.steps``)
STEPS = (MODEL_STEP, TOOL_STEP, PERMISSION_STEP, CONTINUE_STEP, DECISION_STEP)
NOT_RECORDED: Any = object()  # a step an export finds no record of


@attrs.frozen
class SavedStep:
    """One operation a backend saved for a run: its place in the run's order, its
    name (``MODEL_STEP`` and the others), its output; ``failed``: it raised or was
    cancelled, and saved nothing the engine saw."""

    order: int
    name: str
    output: Any
    failed: bool = False


class Recorded:
    """A run's saved operations, by kind, each taken once, in saved order."""

    def __init__(self, steps: Sequence[SavedStep]) -> None:
        self.outputs: dict[str, deque[Any]] = {name: deque() for name in STEPS}
        self.tools: dict[str, Any] = {}
        for step in sorted(steps, key=lambda s: s.order):
            name, output = step.name, step.output
            if step.failed or name not in STEPS:
                continue  # a step that raised or was cancelled saved nothing the engine saw
            if name == TOOL_STEP:
                # Its answer names the call (a tool may also have queued input first).
                events = decode_step_events(output)
                ends = [e.call_id for e in events if isinstance(e, (ToolFinished, ToolCancelled))]
                self.tools[ends[0] if ends else ""] = output
            else:
                self.outputs[name].append(output)

    def has(self, name: str) -> bool:
        """Whether the run recorded any step ``name``."""
        return bool(self.outputs[name])

    def take(self, name: str, key: str) -> Any:
        """The saved output of the next step ``name`` (``key``: a tool's call id)."""
        if name == TOOL_STEP:
            return self.tools.pop(key, NOT_RECORDED)
        found = self.outputs[name]
        return found.popleft() if found else NOT_RECORDED


class RecordEndedError(Exception):
    """The recorded steps end here: the run had gone no further."""


class NoModel:
    """Stands in for the run's model: an export never calls it."""

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> AssistantMessage:
        raise AssertionError("an export answers model calls from the recorded steps")


async def _never(arguments: Mapping[str, Any], signal: AbortSignal) -> str:
    raise AssertionError("an export answers tool calls from the recorded steps")


def stand_in(name: str) -> Tool:
    definition = ToolDefinition(
        name, "(schema not recorded with the durable run)", {"type": "object"}
    )
    return Tool(definition, _never)


def stand_in_hook(*args: Any) -> None:
    """Stands in for a hook the run had: an export never calls it."""


def options(
    spec: Mapping[str, Any],
    recorded: Recorded,
    tools: Sequence[Tool] | None,
    hooks: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The run's tools and which hooks it had (from the runner when known, else from
    what its steps show)."""
    names = [str(n) for n in spec["tools"]]
    known = {t.name: t for t in tools or ()}
    chosen = [known.get(n) or stand_in(n) for n in names]
    if hooks is None:
        asked_permission = recorded.has(PERMISSION_STEP)
        asked_continue = recorded.has(CONTINUE_STEP)
    else:
        asked_permission = hooks.get("before_tool_call") is not None
        asked_continue = hooks.get("should_continue") is not None
    return {
        "tools": chosen,
        "before_tool_call": stand_in_hook if asked_permission else None,
        "should_continue": stand_in_hook if asked_continue else None,
    }


def check_against(result: RunResult | None, recorded: Mapping[str, Any], run_id: str) -> None:
    expected = result_from_dict(run_id, recorded)
    if result is None:
        raise ExportError(
            f"run {run_id!r} finished, but its recorded steps rebuild a different, unfinished "
            "course (the run's tools or hooks differ from the exporter's?)"
        )
    for what in ("state", "messages", "trace"):
        if getattr(result, what) != getattr(expected, what):
            raise ExportError(
                f"run {run_id!r}: its recorded steps rebuild a different {what} than its "
                "recorded result (the run's tools or hooks differ from the exporter's?)"
            )


def journal_buffer() -> tuple[io.TextIOWrapper, io.BytesIO]:
    """Where an export writes its journal before it is known right: a text stream
    encoded as a journal file is (so a line with a lone surrogate is escaped, as the
    writer does for a file: ``Journal``), and the bytes under it (flush first)."""
    data = io.BytesIO()
    return io.TextIOWrapper(data, encoding="utf-8", newline="\n"), data


def write_journal(target: str | os.PathLike[str] | IO[str], data: bytes) -> None:
    """Write the journal at once: a new file appears whole or not at all."""
    if not isinstance(target, (str, os.PathLike)):
        target.write(data.decode("utf-8"))
        return
    path = os.fspath(target)
    if os.path.lexists(path):
        raise _exists(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=".export-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {path!r}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.link(temporary, path)  # fails if the path was taken meanwhile
    except FileExistsError:
        raise _exists(path) from None
    finally:
        os.unlink(temporary)


def _exists(path: str) -> InvalidInputError:
    return InvalidInputError(f"{path!r} already exists: a journal holds one run; choose a new path")
