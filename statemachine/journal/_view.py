"""A run journal as one self-contained HTML page: the state diagram with the run's path
drawn over it, a timeline of the events that steps a highlight along the diagram, and
the messages as a chat transcript.

The page needs no network and no server (it works from ``file://``): the diagram is
inline SVG drawn from the transition table, the run is JSON inside the page, and a
small script draws the timeline and the transcript. Everything that comes from the
journal is untrusted: it reaches the page only as JSON in a ``<script
type="application/json">`` element (with ``<``, ``>`` and ``&`` escaped, so it cannot
close the element), and the script writes it with ``textContent``, never as markup. A
Content-Security-Policy lets only the page's own script run.

The journal is read with ``replay`` (not strictly: a journal that stops replaying at
some line shows the run up to there, and says where and why).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

import structlog

from statemachine._page import MESSAGES, document
from statemachine.agent.handoff import handed_to
from statemachine.core import events as _events
from statemachine.core.messages import thaw_json
from statemachine.core.table import Table
from statemachine.core.wire import event_to_dict, message_to_dict
from statemachine.errors import DiagramError
from statemachine.journal._format import JournalError
from statemachine.journal._reader import DEFAULT_MAX_LINE_BYTES
from statemachine.journal._replay import ReplayResult, ReplayStep, describe_event, replay
from statemachine.journal._view_page import BODY, SCRIPT, STYLE

__all__ = ["DEFAULT_MAX_VIEW_BYTES", "DEFAULT_MAX_VIEW_TEXT", "view_html"]

DEFAULT_MAX_VIEW_BYTES: Final = 64 * 1024 * 1024
"""The largest journal ``view_html`` reads (bytes of the file; characters of lines
given as strings): a larger one is a ``JournalError`` before anything is replayed."""

DEFAULT_MAX_VIEW_TEXT: Final = 4000
"""The most characters the page shows of one text (a message, a tool's arguments or
result, a reason); the rest is cut, and the page says how much."""


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters not shown)"


def _json_text(value: Any, limit: int) -> str:
    return _cut(json.dumps(value, ensure_ascii=False, sort_keys=True), limit)


def _content_text(content: Iterable[Mapping[str, Any]]) -> str:
    parts = []
    for block in content:
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "image":
            parts.append(f"[image {block.get('mimeType', '')}]")
    return "\n".join(parts)


def _messages(result: ReplayResult, limit: int, speaker: str | None) -> list[dict[str, Any]]:
    """The history, each message with who it is from. ``speaker``: in a team's run (a
    ``Handoffs`` agent), the agent speaking first; a transfer that succeeded hands the
    run on, as ``speaking_agent`` reads it."""
    out: list[dict[str, Any]] = []
    for message in result.messages:
        data = message_to_dict(message)
        role = str(data["role"])
        item: dict[str, Any] = {
            "role": role,
            "who": role if speaker is None or role != "assistant" else f"assistant · {speaker}",
            "text": _cut(_content_text(data.get("content", ())), limit),
            "step": -1,
        }
        if role == "assistant":
            item["calls"] = [
                {"id": b["id"], "name": b["name"], "args": _json_text(b["arguments"], limit)}
                for b in data["content"]
                if b.get("type") == "toolCall"
            ]
            item["stop"] = str(data.get("stopReason", ""))
        elif role == "toolResult":
            item["callId"] = str(data["toolCallId"])
            item["tool"] = str(data["toolName"])
            item["error"] = bool(data.get("isError"))
            item["who"] = f"result of {item['tool']} ({item['callId']})" + (
                ", an error" if item["error"] else ""
            )
            target = handed_to(message)
            if speaker is not None and target is not None:
                speaker = _cut(target, 200)
                item["who"] += f": the run is now with {speaker}"
        out.append(item)
    return out


_KINDS: Final[Mapping[type, str]] = {
    _events.Start: "run",
    _events.ModelResponded: "model",
    _events.ModelFailed: "model",
    _events.ModelCancelled: "model",
    _events.ToolPermitted: "tool",
    _events.ToolDenied: "approval",
    _events.ToolFinished: "tool",
    _events.ToolCancelled: "tool",
    _events.AbortRequested: "abort",
    _events.InputQueued: "steer",
    _events.ApprovalRequired: "approval",
    _events.ApprovalDecided: "approval",
    _events.ContinueDecided: "run",
    _events.StepDecided: "step",
}

_CALL_WORDS: Final[Mapping[type, str]] = {
    _events.ToolPermitted: "permitted",
    _events.ToolDenied: "denied",
    _events.ToolCancelled: "cancelled",
    _events.ApprovalRequired: "needs approval",
}
"""What an event about one call says after the tool's name, where that is fixed."""


def _title(event: _events.Event, calls: Mapping[str, tuple[str, str]]) -> str:
    """One line that says what happened, in words."""
    if isinstance(event, _events.ModelResponded):
        names = [c.name for c in event.message.tool_calls]
        if names:
            return f"model asks for {', '.join(names)}"
        return "model answers"
    if isinstance(event, _events.ModelFailed):
        return "model call failed"
    if isinstance(event, _events.ToolFinished):
        name = calls.get(event.call_id, ("?", ""))[0]
        return f"{name} {'failed' if event.output.is_error else 'returned'}"
    call_id = getattr(event, "call_id", None)
    name = calls.get(call_id, ("?", ""))[0] if isinstance(call_id, str) else ""
    if type(event) in _CALL_WORDS:
        return f"{name} {_CALL_WORDS[type(event)]}"
    if isinstance(event, _events.ApprovalDecided):
        return f"{name} {'approved' if event.approved else 'rejected'}"
    if isinstance(event, _events.InputQueued):
        return f"{event.kind.value.replace('_', ' ')} from the user"
    if isinstance(event, _events.AbortRequested):
        return "abort requested"
    if isinstance(event, _events.ContinueDecided):
        return "stop decided" if event.stop else "continue decided"
    if isinstance(event, _events.StepDecided):
        return f"step {event.step}: {event.outcome}"
    if isinstance(event, _events.Start):
        return "run starts"
    return type(event).__name__


def _detail(event: _events.Event, calls: Mapping[str, tuple[str, str]], limit: int) -> str:
    """What a reader wants to see of the event: text, calls with arguments, results."""
    if isinstance(event, _events.ModelResponded):
        message = event.message
        lines = [f"stop reason: {message.stop_reason.value}"]
        if message.text:
            lines.append(_cut(message.text, limit))
        lines += [
            f"call {c.id}: {c.name}({_json_text(thaw_json(c.arguments), limit)})"
            for c in message.tool_calls
        ]
        return "\n".join(lines)
    if isinstance(event, _events.ToolFinished):
        name, arguments = calls.get(event.call_id, ("?", ""))
        text = _content_text(event_to_dict(event)["output"]["content"])
        return "\n".join(
            [
                f"call {event.call_id}: {name}({arguments})",
                f"{'error' if event.output.is_error else 'result'}: {_cut(text, limit)}",
            ]
        )
    data = event_to_dict(event)
    data.pop("type")
    call_id = data.get("callId")
    head = []
    if isinstance(call_id, str) and call_id in calls:
        name, arguments = calls[call_id]
        head.append(f"call {call_id}: {name}({arguments})")
    if isinstance(data.get("message"), dict):  # a step's message is text already
        data["message"] = _content_text(data["message"].get("content", ()))
    rest = [f"{key}: {_cut(str(value), limit)}" for key, value in data.items() if key != "callId"]
    return "\n".join(head + rest)


def _steps(result: ReplayResult, limit: int) -> list[dict[str, Any]]:
    calls: dict[str, tuple[str, str]] = {}
    steps: list[dict[str, Any]] = []
    step: ReplayStep
    for step in result.steps:
        event = step.event
        if isinstance(event, _events.ModelResponded):
            for c in event.message.tool_calls:
                calls[c.id] = (c.name, _json_text(thaw_json(c.arguments), limit))
        steps.append(
            {
                "line": step.line,
                "kind": _KINDS.get(type(event), "run"),
                "title": _cut(_title(event, calls), 200),
                "summary": _cut(describe_event(event), 300),
                "detail": _detail(event, calls, limit),
                "moves": [
                    [r.source.value, r.trigger.value.replace("_", " "), r.dest.value]
                    for r in step.transitions
                ],
                "state": step.state.value,
                "message": -1,
            }
        )
    return steps


def _link(
    steps: list[dict[str, Any]], messages: list[dict[str, Any]], result: ReplayResult
) -> None:
    """Pair each message with the step that put it in the history, both ways."""
    events = [s.event for s in result.steps]
    responses = iter(i for i, e in enumerate(events) if isinstance(e, _events.ModelResponded))
    # A user message is the user's input, or the message a step's retry added (a
    # guardrail's reason): the next of those events with its text.
    inputs = [
        (i, _content_text(message_to_dict(e.message)["content"]), "")
        if isinstance(e, _events.InputQueued)
        else (i, e.message, e.step)
        for i, e in enumerate(events)
        if isinstance(e, _events.InputQueued) or (isinstance(e, _events.StepDecided) and e.message)
    ]
    next_input = 0
    ends: dict[str, int] = {}
    for i, e in enumerate(events):
        if isinstance(e, (_events.ToolFinished, _events.ToolCancelled, _events.ToolDenied)):
            ends.setdefault(e.call_id, i)
    initial = len(result.header.messages)
    for index, message in enumerate(messages):
        if index < initial:
            continue
        found: int | None = None
        if message["role"] == "assistant":
            found = next(responses, None)
        elif message["role"] == "user":
            text = _content_text(message_to_dict(result.messages[index])["content"])
            at = next((k for k in range(next_input, len(inputs)) if inputs[k][1] == text), None)
            if at is not None:
                found, _, step_name = inputs[at]
                next_input = at + 1
                if step_name:
                    message["who"] = f"user · the step {_cut(step_name, 200)} asks again"
        elif message["role"] == "toolResult":
            found = ends.get(message["callId"])
        if found is not None:
            message["step"] = found + 1  # position 0 is the run before its first event
            if steps[found]["message"] < 0:
                steps[found]["message"] = index


def _bounded(lines: Iterable[str], max_bytes: int) -> Iterator[str]:
    total = 0
    for line in lines:
        total += len(line)
        if total > max_bytes:
            raise JournalError(
                0, f"the journal is longer than {max_bytes:,} characters (max_bytes of the view)"
            )
        yield line


def _within(
    source: str | os.PathLike[str] | Iterable[str], max_bytes: int
) -> str | os.PathLike[str] | Iterable[str]:
    """``source``, refused if a file is larger than ``max_bytes`` (before it is read),
    or cut off with an error once lines given as text go past it."""
    if not isinstance(source, (str, os.PathLike)):
        return _bounded(source, max_bytes)
    try:
        size = os.stat(source).st_size
    except OSError as exc:
        raise JournalError(0, f"cannot read journal {os.fspath(source)!r}: {exc}") from None
    if size > max_bytes:
        raise JournalError(
            0,
            f"the journal is {size:,} bytes, more than the view reads ({max_bytes:,}, "
            "its max_bytes)",
        )
    return source


def _page_data(result: ReplayResult, limit: int, speaker: str | None) -> dict[str, Any]:
    messages = _messages(result, limit, speaker)
    steps = _steps(result, limit)
    _link(steps, messages, result)
    header = result.header
    engine = result.engine
    return {
        "run": {
            "id": _cut(str(header.run_id), 200),
            "tools": [_cut(t.name, 200) for t in header.tools],
            "maxTurns": header.max_turns,
            "state": engine.state.value,
            "turns": engine.turns,
            "explanation": _cut(engine.explanation or "", limit),
            "declared": engine.state in engine.table.declared,
            "checkpoints": result.checkpoints,
            "error": _cut(str(result.error), limit) if result.error is not None else "",
        },
        "steps": steps,
        "messages": messages,
    }


def _embed(data: Any) -> str:
    """JSON that can sit inside a ``<script>`` element: no ``<``, ``>`` or ``&`` in it."""
    text = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _speaker(agent: Any, table: Table) -> str | None:
    """Who speaks first in a team's run: the start of ``agent``'s team, else (a journal
    of a team alone does not name it) the first agent; ``None`` for one agent's run."""
    from statemachine.steps import Handoffs

    model = getattr(agent, "model", None)
    if isinstance(model, Handoffs):
        return model.start
    if any(spec.name == "handoff_limit" for spec in table.steps):
        return "the first agent"
    return None


def _drawing(result: ReplayResult, agent: Any) -> str:
    """The full drawing of the table the run was recorded with (its header declares the
    steps), the run's path checked against it: the shipped one for the library's table,
    else drawn now by Graphviz. With ``agent``, its table must be the journal's."""
    from statemachine._figures import packaged_svg
    from statemachine._render import chart_from_table, overlay_from_trace, render
    from statemachine.steps import chart, table_of

    table = result.engine.table
    if agent is not None and table_of(agent).steps != table.steps:

        def names(t: Table) -> str:
            return ", ".join(s.name for s in t.steps) or "no steps"

        raise JournalError(
            0,
            f"the run was recorded with other steps ({names(table)}) than the agent "
            f"given declares ({names(table_of(agent))})",
        )
    if not table.steps:
        overlay_from_trace(chart_from_table(), result.trace, result.state.value)
        return packaged_svg("full")
    drawn = chart(table)
    overlay_from_trace(drawn, result.trace, result.state.value)
    try:
        return str(render("svg", drawn))
    except DiagramError as exc:
        raise DiagramError(
            f"the run's table has declared steps ({', '.join(s.name for s in table.steps)}), "
            f"which only Graphviz draws: {exc}. Without it, 'statemachine trace JOURNAL' "
            "draws the run's path as mermaid"
        ) from exc


def view_html(
    source: str | os.PathLike[str] | Iterable[str],
    *,
    agent: Any = None,
    max_bytes: int = DEFAULT_MAX_VIEW_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    max_text: int = DEFAULT_MAX_VIEW_TEXT,
) -> str:
    """A journal as one self-contained HTML page (returned as text; write it to a file).

    ``source`` is a journal's path or its lines, as for ``replay``; both
    ``run_agent_journaled`` and the durable runs' ``export_journal`` write journals it
    reads. The page shows the state diagram at its full size with the run's path drawn
    over it (blue; a state's tooltip says how often the run entered it), a timeline of
    the events that moves a highlight along the diagram (buttons, the slider, the arrow
    keys, or a click on an event; ``#step=N`` in the address opens step N), and the
    messages as a chat transcript. A run with steps shows its table: the steps' states
    and each decision (a guardrail's retry with the message it added, a declared end
    with its explanation); a team's run (``Handoffs``) names the agent that speaks.

    ``agent`` (an ``Agent``, a list of ``Step`` or a ``Table``, as ``chart`` takes) is
    checked to have the steps the journal recorded (a ``JournalError`` if not); for a
    team's agent, it names the agent that speaks first, which the journal does not.

    Limits: a journal over ``max_bytes`` (64 MiB by default) or with a line over
    ``max_line_bytes`` is a ``JournalError`` before it is read whole; each text shown is
    cut to ``max_text`` characters. A journal that stops replaying at some line is shown
    up to there, with the reason. The diagram of the library's table is the one the
    package ships (``statemachine._figures.packaged_svg``): no Graphviz needed; a table
    with steps is drawn by Graphviz (a ``DiagramError`` without it).
    """
    from statemachine._render import svg_inline

    for name, value in (("max_bytes", max_bytes), ("max_text", max_text)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JournalError(0, f"{name} must be a positive int, got {value!r}")
    quiet = structlog.wrap_logger(
        None, wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
    )
    lines = _within(source, max_bytes)
    result = replay(lines, strict=False, logger=quiet, max_line_bytes=max_line_bytes)
    # Every step is checked against the table the drawing shows, as the diagram
    # command's overlay does; the page draws the path over the drawing itself.
    svg = _drawing(result, agent)
    body = BODY.format(
        svg=svg_inline(svg, fit=False),
        messages=MESSAGES,
        data=_embed(_page_data(result, max_text, _speaker(agent, result.engine.table))),
    )
    title = f"run {_cut(str(result.header.run_id), 80)} · statemachine view"
    return document(title=title, style=STYLE, body=body, script=SCRIPT)
