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

import base64
import hashlib
import html
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

import structlog

from statemachine.core import events as _events
from statemachine.core.messages import thaw_json
from statemachine.core.wire import event_to_dict, message_to_dict
from statemachine.journal._format import JournalError
from statemachine.journal._reader import DEFAULT_MAX_LINE_BYTES
from statemachine.journal._replay import ReplayResult, ReplayStep, describe_event, replay

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


def _messages(result: ReplayResult, limit: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in result.messages:
        data = message_to_dict(message)
        role = str(data["role"])
        item: dict[str, Any] = {
            "role": role,
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
}


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
    if isinstance(event, _events.ToolPermitted):
        return f"{name} permitted"
    if isinstance(event, _events.ToolDenied):
        return f"{name} denied"
    if isinstance(event, _events.ToolCancelled):
        return f"{name} cancelled"
    if isinstance(event, _events.ApprovalRequired):
        return f"{name} needs approval"
    if isinstance(event, _events.ApprovalDecided):
        return f"{name} {'approved' if event.approved else 'rejected'}"
    if isinstance(event, _events.InputQueued):
        return f"{event.kind.value.replace('_', ' ')} from the user"
    if isinstance(event, _events.AbortRequested):
        return "abort requested"
    if isinstance(event, _events.ContinueDecided):
        return "stop decided" if event.stop else "continue decided"
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
    if "message" in data:
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
    inputs = iter(i for i, e in enumerate(events) if isinstance(e, _events.InputQueued))
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
            found = next(inputs, None)
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


def _page_data(result: ReplayResult, limit: int) -> dict[str, Any]:
    messages = _messages(result, limit)
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


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def view_html(
    source: str | os.PathLike[str] | Iterable[str],
    *,
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
    messages as a chat transcript.

    Limits: a journal over ``max_bytes`` (64 MiB by default) or with a line over
    ``max_line_bytes`` is a ``JournalError`` before it is read whole; each text shown is
    cut to ``max_text`` characters. A journal that stops replaying at some line is shown
    up to there, with the reason. The diagram is the one the package ships
    (``statemachine._figures.packaged_svg``): no Graphviz needed.
    """
    from statemachine._figures import packaged_svg
    from statemachine._render import chart_from_table, overlay_from_trace, svg_inline

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
    overlay_from_trace(chart_from_table(), result.trace, result.state.value)
    svg = packaged_svg("full")
    script = _SCRIPT
    policy = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{_sha256(script)}'"
    )
    title = html.escape(f"run {_cut(str(result.header.run_id), 80)} · statemachine view")
    return _PAGE.format(
        policy=html.escape(policy),
        title=title,
        style=_STYLE,
        svg=svg_inline(svg, fit=False),
        data=_embed(_page_data(result, max_text)),
        script=script,
    )


_PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<header>
  <h1>Run <span id="run-id"></span> <span id="run-state" class="badge"></span></h1>
  <p id="run-summary"></p>
  <p id="run-error" class="error" hidden></p>
</header>
<main>
  <section id="diagram" aria-label="the state diagram with the run's path">{svg}</section>
  <section id="timeline" aria-label="the events of the run">
    <div class="controls">
      <button id="first" title="the start (Home)">start</button>
      <button id="prev" title="the event before (←)">◀</button>
      <input id="slider" type="range" min="0" value="0" aria-label="event">
      <button id="next" title="the next event (→)">▶</button>
      <button id="last" title="the end (End)">end</button>
    </div>
    <p id="position"></p>
    <pre id="detail"></pre>
    <ol id="events"></ol>
  </section>
  <section id="transcript" aria-label="the messages">
    <h2>Messages</h2>
    <ol id="messages"></ol>
  </section>
</main>
<script type="application/json" id="run-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""

_STYLE: Final = """
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: #1f2328; background: #fff; }
header { padding: 0.6rem 1rem; border-bottom: 1px solid #d0d7de; }
h1 { font-size: 1.2rem; margin: 0; }
h2 { font-size: 1rem; margin: 0 0 0.5rem; }
.badge { font-size: 0.85rem; padding: 0.1rem 0.5rem; border-radius: 1rem; background: #eef; }
.error { color: #b91c1c; white-space: pre-wrap; }
main { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr);
       grid-template-rows: auto minmax(0, 1fr); gap: 0.75rem; padding: 0.75rem;
       height: calc(100vh - 5rem); min-height: 36rem; }
#diagram { grid-column: 1; grid-row: 1; overflow: auto; max-height: 55vh;
           border: 1px solid #d0d7de; border-radius: 6px; }
#diagram svg { display: block; }
#timeline { grid-column: 1; grid-row: 2; display: flex; flex-direction: column; min-height: 0; }
#transcript { grid-column: 2; grid-row: 1 / span 2; overflow: auto; min-height: 0;
              border-left: 1px solid #d0d7de; padding-left: 0.75rem; }
.controls { display: flex; gap: 0.4rem; align-items: center; }
.controls input { flex: 1; }
button { font: inherit; padding: 0.15rem 0.6rem; }
#position { margin: 0.3rem 0; font-weight: 600; }
#detail { margin: 0 0 0.4rem; padding: 0.4rem 0.6rem; background: #f6f8fa; border-radius: 6px;
          white-space: pre-wrap; overflow-wrap: anywhere; max-height: 9rem; overflow: auto; }
#events { list-style: none; margin: 0; padding: 0; overflow: auto; flex: 1; min-height: 6rem;
          border: 1px solid #d0d7de; border-radius: 6px; }
#events li { padding: 0.1rem 0.5rem; cursor: pointer; white-space: nowrap; overflow: hidden;
             text-overflow: ellipsis; border-left: 4px solid transparent; }
#events li .n { color: #57606a; display: inline-block; min-width: 4.5em; }
#events li.model { border-left-color: #1d4ed8; }
#events li.tool { border-left-color: #15803d; }
#events li.approval { border-left-color: #9a6700; }
#events li.steer { border-left-color: #7c3aed; }
#events li.abort { border-left-color: #b91c1c; }
#events li.vw-active { background: #fde68a; }
#messages { list-style: none; margin: 0; padding: 0; }
#messages li { margin: 0 0 0.5rem; padding: 0.4rem 0.6rem; border-radius: 8px;
               white-space: pre-wrap; overflow-wrap: anywhere; max-width: 95%; }
#messages li .who { display: block; font-size: 0.75rem; color: #57606a; }
#messages li.user { background: #eef2ff; margin-left: auto; }
#messages li.assistant { background: #f6f8fa; }
#messages li.toolResult { background: #f0fdf4; font-family: ui-monospace, monospace;
                          font-size: 0.85rem; }
#messages li.toolResult.failed { background: #fef2f2; }
#messages li .call { display: block; font-family: ui-monospace, monospace; font-size: 0.85rem;
                     color: #15803d; }
#messages li.vw-active { outline: 3px solid #f59e0b; }
#diagram g.node.vw-path path, #diagram g.node.vw-path polygon { fill: #dbeafe; stroke: #1d4ed8;
  stroke-width: 2px; }
#diagram g.edge.vw-path path { stroke: #1d4ed8; stroke-width: 2.5px; }
#diagram g.edge.vw-path polygon { stroke: #1d4ed8; fill: #1d4ed8; }
#diagram g.edge.vw-path text { fill: #1d4ed8; } #diagram g.vw-off { opacity: 0.45; }
#diagram g.node.vw-current path, #diagram g.node.vw-current polygon {
  fill: #fde68a; stroke: #d97706; stroke-width: 5px; }
#diagram g.edge.vw-taken path { stroke: #d97706; stroke-width: 4px; }
#diagram g.edge.vw-taken polygon { stroke: #d97706; fill: #d97706; }
"""

_SCRIPT: Final = """
"use strict";
(() => {
  const data = JSON.parse(document.getElementById("run-data").textContent);
  const steps = data.steps, messages = data.messages, run = data.run;
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };
  $("run-id").textContent = run.id;
  $("run-state").textContent = run.state;
  $("run-summary").textContent = run.state + " after " + steps.length + " event(s), " +
    run.turns + " turn(s), " + messages.length + " message(s); tools: " +
    (run.tools.join(", ") || "none") + "; max_turns " + run.maxTurns +
    (run.explanation ? "; " + run.explanation : "");
  if (run.error) {
    $("run-error").hidden = false;
    $("run-error").textContent = "The journal stops replaying here: " + run.error +
      " (everything before that line is shown).";
  }
  const svg = document.querySelector("#diagram svg");
  const nodes = new Map(), edges = new Map();
  for (const g of svg.querySelectorAll("g.node")) {
    const t = g.querySelector("title");
    if (t) nodes.set(t.textContent, g);
  }
  for (const g of svg.querySelectorAll("g.edge")) {
    const t = g.querySelector("title");
    if (!t) continue;
    if (!edges.has(t.textContent)) edges.set(t.textContent, []);
    edges.get(t.textContent).push(g);
  }
  const edgesOf = (move) => {
    const all = edges.get(move[0] + "->" + move[2]) || [];
    const named = all.filter((g) => g.textContent.includes(move[1]));
    return named.length ? named : all;
  };
  // The run's path, drawn once: the states it entered (how often, in the tooltip) and
  // the steps it took in blue, the rest faded.
  const entered = new Map([["Ready", 1]]), taken = new Set();
  for (const s of steps) {
    for (const move of s.moves) {
      for (const g of edgesOf(move)) taken.add(g);
      if (move[0] !== move[2]) entered.set(move[2], (entered.get(move[2]) || 0) + 1);
    }
  }
  for (const [name, g] of nodes) {
    const n = entered.get(name);
    g.classList.add(n ? "vw-path" : "vw-off");
    const link = g.querySelector("a");
    if (n && link) {
      const tip = link.getAttribute("xlink:title") || name;
      link.setAttribute("xlink:title", tip + " (entered " + n + " time" + (n > 1 ? "s" : "") + ")");
    }
  }
  for (const g of [...edges.values()].flat()) g.classList.add(taken.has(g) ? "vw-path" : "vw-off");
  const rows = [];
  const list = $("events"), fragment = document.createDocumentFragment();
  const start = el("li", "run");
  start.append(el("span", "n", "start"), document.createTextNode("the run before its first event"));
  rows.push(start);
  fragment.append(start);
  steps.forEach((s, i) => {
    const li = el("li", s.kind);
    li.title = s.summary;
    li.append(el("span", "n", "#" + (i + 1)), document.createTextNode(s.title + " → " + s.state));
    rows.push(li);
    fragment.append(li);
  });
  list.append(fragment);
  list.addEventListener("click", (e) => {
    const li = e.target.closest("li");
    if (li) go(rows.indexOf(li));
  });
  const items = [];
  const chat = $("messages"), chatFragment = document.createDocumentFragment();
  messages.forEach((m) => {
    const li = el("li", m.role + (m.error ? " failed" : ""));
    const who = m.role === "toolResult" ? "result of " + m.tool + " (" + m.callId + ")" +
      (m.error ? ", an error" : "") : m.role;
    li.append(el("span", "who", who));
    if (m.text) li.append(document.createTextNode(m.text));
    for (const c of m.calls || []) {
      li.append(el("span", "call", c.name + "(" + c.args + ")  #" + c.id));
    }
    if (m.step >= 0) {
      li.style.cursor = "pointer";
      li.addEventListener("click", () => go(m.step));
    }
    items.push(li);
    chatFragment.append(li);
  });
  chat.append(chatFragment);
  const slider = $("slider");
  slider.max = String(steps.length);
  let current = -1, lit = [], follow = null;
  const go = (i) => {
    i = Math.max(0, Math.min(steps.length, i | 0));
    if (i === current) return;
    for (const g of lit) g.classList.remove("vw-current", "vw-taken", "vw-active");
    lit = [];
    const light = (g, cls) => { if (g) { g.classList.add(cls); lit.push(g); } };
    const step = i > 0 ? steps[i - 1] : null;
    const here = nodes.get(step ? step.state : "Ready");
    light(here, "vw-current");
    if (step) for (const move of step.moves) for (const g of edgesOf(move)) light(g, "vw-taken");
    light(rows[i], "vw-active");
    const item = step && step.message >= 0 ? items[step.message] : null;
    light(item, "vw-active");
    // The state (the drawing is wider than its pane), the event and the message are
    // scrolled into view once a frame: a held arrow key steps many times in one.
    if (follow === null) requestAnimationFrame(() => {
      for (const e of follow) if (e) e.scrollIntoView({ block: "nearest", inline: "nearest" });
      follow = null;
    });
    follow = [here, rows[i], item];
    $("position").textContent = step
      ? "event " + i + " of " + steps.length + " (journal line " + step.line + "): " + step.title +
        "; now " + step.state
      : "the start: Ready, before the first of " + steps.length + " event(s)";
    $("detail").textContent = step
      ? (step.moves.map((m) => m[0] + " —" + m[1] + "→ " + m[2]).join("\\n") ||
         "(no transition: the run is over in " + step.state + ")") + "\\n" + step.detail
      : "";
    slider.value = String(i);
    current = i;
    document.body.dataset.step = String(i);
    try { history.replaceState(null, "", "#step=" + i); } catch (e) { /* file:// may refuse */ }
  };
  $("first").onclick = () => go(0);
  $("prev").onclick = () => go(current - 1);
  $("next").onclick = () => go(current + 1);
  $("last").onclick = () => go(steps.length);
  slider.oninput = () => go(Number(slider.value));
  document.addEventListener("keydown", (e) => {
    if (e.target === slider) return;
    const keys = { ArrowRight: current + 1, ArrowLeft: current - 1, Home: 0, End: steps.length };
    const to = keys[e.key];
    if (to !== undefined) { e.preventDefault(); go(to); }
  });
  const wanted = /^#step=(\\d+)$/.exec(location.hash);
  go(wanted ? Number(wanted[1]) : 0);
  document.body.dataset.ready = "true";
})();
"""
