"""The page of the live server: a run shown as it runs.

One HTML page, served by ``LiveApp`` at ``/``: the state diagram (drawn from the
transition table by ``statemachine._render``, with the run's state and its last step
lit as they change), the messages as they stream (text fragment by fragment, tool
calls with their arguments, each call running and then its result), and how many
events the page missed when it fell behind (``statemachine.eventsDropped``).

The page reads the same AG-UI event stream as any client (``GET /runs/ID/events``,
or the answer of the ``POST /`` that starts a run), with ``fetch``. It is opened as
``/?token=TOKEN``, and its script sends that token from its own address as an
``Authorization`` header; the page's text holds no secret, and no cookie is set
(``statemachine.live._app`` says why). The server asks browsers to send no
``Referer``, so the address leaves with no link.
Everything from a run is written with ``textContent``, never as markup, and a
Content-Security-Policy lets only the page's own script run and only talk to its own
origin.

Without pygraphviz (the ``[diagrams]`` extra) the diagram is a list of the states,
lit the same way.
"""

from __future__ import annotations

import html
from typing import Final

from statemachine._page import MESSAGES, document
from statemachine.errors import StateMachineError

__all__ = ["page_html"]


def _diagram() -> str:
    """The table's diagram as inline SVG, or a list of its states without Graphviz."""
    from statemachine._render import chart_from_table, render, svg_inline

    chart = chart_from_table()
    try:
        svg = render("svg", chart)
    except (StateMachineError, ImportError):
        items = "".join(
            f'<li class="node" data-state="{html.escape(s)}">{html.escape(s)}</li>'
            for s in chart.states
        )
        return f'<ul id="states">{items}</ul>'
    assert isinstance(svg, str)
    return svg_inline(svg)


def page_html() -> str:
    """The live page (it holds no run: its script asks the server)."""
    return document(
        title="statemachine live",
        style=_STYLE,
        body=_BODY.format(diagram=_diagram(), messages=MESSAGES),
        script=_SCRIPT,
        policy="connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    )


_BODY: Final = """<header>
  <h1>Run <span id="run-id">(none)</span> <span id="run-state" class="badge"></span></h1>
  <p id="run-summary">Choose a run, or start one.</p>
  <p id="dropped" class="warning" hidden></p>
  <div id="waiting" hidden></div>
  <div id="questions" hidden></div>
  <p id="problem" class="error" hidden></p>
</header>
<main>
  <section id="diagram-box">
    <button type="button" id="fit" title="the whole diagram, or at its own size">fit</button>
    <div id="diagram" aria-label="the state diagram, the run's state lit">{diagram}</div>
  </section>
  <section id="controls" aria-label="runs and actions">
    <form id="start">
      <label for="prompt">Start a run</label>
      <textarea id="prompt" rows="2" placeholder="what to ask the agent"></textarea>
      <button type="submit">start</button>
    </form>
    <form id="steer">
      <label for="steer-text">Steer the run</label>
      <input id="steer-text" placeholder="a message for its next turn">
      <button type="submit">steer</button>
      <button type="button" id="abort">abort</button>
    </form>
    <h2>Runs</h2>
    <ol id="runs"></ol>
  </section>
  {messages}
</main>"""

_STYLE: Final = """
h2 { margin: 0.5rem 0; }
.badge { background: #fde68a; }
.error, .warning { margin: 0.3rem 0 0; }
.warning { color: #9a6700; }
#run-summary { margin: 0.3rem 0 0; color: #57606a; }
#waiting, #questions { margin: 0.4rem 0 0; padding: 0.4rem 0.6rem; background: #fef9c3;
                       border-radius: 6px; }
#waiting p, #questions p { margin: 0.2rem 0; }
#diagram-box { grid-column: 1; position: relative; }
#fit { position: absolute; right: 0.4rem; top: 0.4rem; z-index: 1; }
#diagram { max-height: 60vh; }
#diagram svg { height: auto; }
#diagram.fit svg { width: 100% !important; }
#controls { grid-column: 1; }
#transcript { max-height: calc(100vh - 6rem); }
form { display: flex; gap: 0.4rem; align-items: center; margin: 0 0 0.5rem; }
form textarea, form input { flex: 1; font: inherit; }
#runs li { cursor: pointer; }
#runs li.current { font-weight: 600; }
#messages li.user { margin-left: 10%; }
#messages li.streaming { outline: 2px dashed #d97706; }
#messages li.tool { font-family: ui-monospace, monospace; font-size: 0.85rem; background: #f0fdf4; }
#messages li.tool.failed { background: #fef2f2; }
#messages li .call.running::after { content: "  running…"; color: #d97706; }
#states { list-style: none; display: flex; flex-wrap: wrap; gap: 0.4rem; padding: 0.5rem; }
#states li { padding: 0.2rem 0.6rem; border: 1px solid #57606a; border-radius: 1rem; }
#states li.live-current { background: #fde68a; border-color: #d97706; }
#diagram g.live-current path, #diagram g.live-current polygon, #diagram g.live-current ellipse {
  fill: #fde68a; stroke: #d97706; stroke-width: 5px; }
#diagram g.live-taken path { stroke: #d97706; stroke-width: 4px; }
#diagram g.live-taken polygon { stroke: #d97706; fill: #d97706; }
"""

_SCRIPT: Final = """
(() => {
  const { nodes, edges } = diagramParts($("diagram"));
  const body = document.body;
  // The token this page was opened with, sent as a header (never a cookie: a browser
  // would hand a cookie to every server of this host, whatever its port).
  const token = new URLSearchParams(location.search).get("token") || "";
  const authorized = (options) =>
    ({ ...options, headers: { ...(options.headers || {}), authorization: "Bearer " + token } });
  // At its own size the diagram's words are readable; it scrolls to the lit state.
  // "fit" shows it whole in the column instead.
  const svg = document.querySelector("#diagram svg");
  if (svg && svg.viewBox.baseVal) svg.style.width = svg.viewBox.baseVal.width + "px";
  $("fit").addEventListener("click", () => {
    $("diagram").classList.toggle("fit");
    $("fit").textContent = $("diagram").classList.contains("fit") ? "full size" : "fit";
  });
  let current = null;        // the run shown
  let reading = null;        // the AbortController of the stream being read
  let state = {};
  let lit = [];
  let count = 0, dropped = 0;
  const texts = new Map();   // messageId -> the element its text goes into
  const calls = new Map();   // toolCallId -> its element
  const problem = (text) => { $("problem").hidden = !text; $("problem").textContent = text || ""; };

  const showState = () => {
    for (const g of lit) g.classList.remove("live-current", "live-taken");
    lit = [];
    const light = (g, cls) => { if (g) { g.classList.add(cls); lit.push(g); } };
    const node = nodes.get(state.state);
    light(node, "live-current");
    if (node) node.scrollIntoView({ block: "nearest", inline: "center" });
    if (state.last) {
      const all = edges.get(state.last[0] + "->" + state.last[2]) || [];
      const words = state.last[1].replace(/_/g, " ");
      const named = all.filter((g) => g.textContent.includes(words));
      for (const g of named.length ? named : all) light(g, "live-taken");
    }
    $("run-state").textContent = state.state || "";
    body.dataset.state = state.state || "";
    const last = state.last;
    $("run-summary").textContent = "turn " + (state.turn || 0) +
      (last ? "; last step: " + last[0] + " —" + last[1] + "→ " + last[2] : "");
  };
  const message = (id, role, who) => {
    const li = el("li", role);
    li.append(el("span", "who", who || role));
    const text = el("span", "text");
    li.append(text);
    $("messages").append(li);
    texts.set(id, text);
    return li;
  };
  const callElement = (id, name, parent) => {
    let holder = parent && texts.get(parent) ? texts.get(parent).parentElement : null;
    if (!holder) holder = message(parent || id, "assistant");
    const span = el("span", "call", name + "(");
    span.dataset.args = "";
    holder.append(span);
    calls.set(id, span);
    return span;
  };
  const snapshot = (messages) => {
    $("messages").replaceChildren();
    texts.clear(); calls.clear();
    for (const m of messages) {
      if (m.role === "tool") {
        const li = message(m.id, "tool", "result of " + m.toolCallId);
        texts.get(m.id).textContent = typeof m.content === "string" ? m.content : "";
        continue;
      }
      const li = message(m.id, m.role);
      texts.get(m.id).textContent = typeof m.content === "string" ? m.content : "";
      for (const c of m.toolCalls || []) {
        const span = callElement(c.id, c.function.name, m.id);
        span.textContent = c.function.name + "(" + c.function.arguments + ")";
      }
    }
  };
  const handle = (e) => {
    count += 1;
    switch (e.type) {
      case "RUN_STARTED":
        $("run-id").textContent = e.runId;
        $("messages").replaceChildren(); texts.clear(); calls.clear();
        break;
      case "MESSAGES_SNAPSHOT": snapshot(e.messages); break;
      case "STATE_SNAPSHOT": state = e.snapshot || {}; showState(); break;
      case "STATE_DELTA":
        for (const op of e.delta) {
          if (op.op === "replace" || op.op === "add") state[op.path.slice(1)] = op.value;
        }
        showState();
        break;
      case "TEXT_MESSAGE_START":
        message(e.messageId, e.role || "assistant").classList.add("streaming");
        break;
      case "TEXT_MESSAGE_CONTENT": {
        const t = texts.get(e.messageId);
        if (t) t.textContent += e.delta;
        break;
      }
      case "TEXT_MESSAGE_END": {
        const t = texts.get(e.messageId);
        if (t) t.parentElement.classList.remove("streaming");
        break;
      }
      case "TOOL_CALL_START": callElement(e.toolCallId, e.toolCallName, e.parentMessageId); break;
      case "TOOL_CALL_ARGS": {
        const s = calls.get(e.toolCallId);
        if (s) s.textContent += e.delta;
        break;
      }
      case "TOOL_CALL_END": {
        const s = calls.get(e.toolCallId);
        if (s) s.textContent += ")";
        break;
      }
      case "TOOL_CALL_RESULT": {
        const failed = e.metadata && e.metadata.statemachine && e.metadata.statemachine.isError;
        const li = message(e.messageId, "tool" + (failed ? " failed" : ""),
          "result of " + e.toolCallId + (failed ? ", an error" : ""));
        texts.get(e.messageId).textContent = typeof e.content === "string" ? e.content : "";
        break;
      }
      case "CUSTOM": {
        const v = e.value || {};
        if (e.name === "statemachine.toolStarted") {
          const s = calls.get(v.callId); if (s) s.classList.add("running");
        } else if (e.name === "statemachine.toolEnded") {
          const s = calls.get(v.callId); if (s) s.classList.remove("running");
        } else if (e.name === "statemachine.toolAsked") {
          question(v);
        } else if (e.name === "statemachine.toolAnswered") {
          for (const f of $("questions").querySelectorAll("form")) {
            if (f.dataset.question === v.id) f.remove();
          }
          $("questions").hidden = !$("questions").children.length;
        } else if (e.name === "statemachine.eventsDropped") {
          dropped += v.count;
          body.dataset.dropped = String(dropped);
          $("dropped").hidden = false;
          $("dropped").textContent = dropped + " event(s) dropped: this page fell behind the run " +
            "(the run never waits for it); messages and results are complete.";
        }
        break;
      }
      case "RUN_FINISHED":
        $("run-summary").textContent += " · returned" +
          (e.outcome && e.outcome.type !== "success" ? " (" + e.outcome.type + ")" : "");
        if (e.outcome && e.outcome.type === "interrupt") ask(e.outcome.interrupts);
        body.dataset.finished = "true";
        refresh();
        break;
      case "RUN_ERROR":
        problem("The run ended " + (e.code || "") + ": " + e.message);
        body.dataset.finished = "true";
        refresh();
        break;
    }
    body.dataset.events = String(count);
  };
  // Server-sent events read with fetch: the same stream an AG-UI client reads.
  const read = async (response) => {
    if (!response.ok) {
      let text = response.status + "";
      try { text += ": " + (await response.json()).error; } catch (e) { /* not JSON */ }
      problem("The server refused: " + text);
      return;
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\\n\\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = frame.split("\\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trimStart()).join("\\n");
        if (data) handle(JSON.parse(data));
      }
    }
  };
  const follow = (request) => {
    if (reading) reading.abort();
    reading = new AbortController();
    count = 0; dropped = 0; state = {};
    delete body.dataset.finished; delete body.dataset.dropped;
    $("dropped").hidden = true; $("waiting").hidden = true; problem("");
    $("questions").replaceChildren(); $("questions").hidden = true;
    request.signal = reading.signal;
    return fetch(request.url, authorized(request)).then(read).catch((e) => {
      if (e.name !== "AbortError") problem("The stream stopped: " + e.message);
    });
  };
  const watch = (id) => {
    current = id;
    history.replaceState(null, "", "#run=" + encodeURIComponent(id));
    follow({ url: "/runs/" + encodeURIComponent(id) + "/events", method: "GET" });
    refresh();
  };
  // A run that waits for approvals: a button for each decision; the answer resumes it
  // and its events follow here.
  const ask = (interrupts) => {
    const box = $("waiting");
    box.replaceChildren();
    const calls = interrupts.filter((i) => i.reason === "tool_approval");
    if (!calls.length) return;
    const decisions = {};
    for (const i of calls) {
      const line = el("p", "", i.message || i.id);
      for (const [label, value] of [["approve", true], ["deny", false]]) {
        const b = el("button", "decide", label);
        b.type = "button";
        b.dataset.call = i.id;
        b.addEventListener("click", () => {
          decisions[i.id] = value;
          line.textContent = (value ? "approved: " : "denied: ") + (i.message || i.id);
          if (Object.keys(decisions).length === calls.length) {
            box.hidden = true;
            follow({ url: "/runs/" + encodeURIComponent(current) + "/approve", method: "POST",
              headers: { "content-type": "application/json" },
              body: JSON.stringify({ approvals: decisions }) });
          }
        });
        line.append(" ", b);
      }
      box.append(line);
    }
    box.hidden = false;
  };
  // A question a running tool asks (its call waits): a field for each property of its
  // schema; the person's answer, "decline" or "cancel" goes to POST /runs/ID/answer.
  const question = (v) => {
    const form = el("form", "question");
    form.dataset.question = v.id;
    form.append(el("p", "", v.message + (v.url ? " " + v.url : "")));
    const fields = Object.entries((v.schema && v.schema.properties) || {}).map(([name, p]) => {
      const input = el("input");
      input.name = name;
      input.type = p.type === "boolean" ? "checkbox"
        : p.type === "integer" || p.type === "number" ? "number" : "text";
      const label = el("label", "", name + " ");
      label.append(input);
      form.append(label, " ");
      return [name, input, p.type];
    });
    const read = () => Object.fromEntries(fields.filter(([, i, t]) => t === "boolean" || i.value)
      .map(([name, i, t]) => [name, t === "boolean" ? i.checked
        : t === "integer" || t === "number" ? Number(i.value)
        : t === "array" ? i.value.split(",").map((x) => x.trim()) : i.value]));
    for (const label of ["answer", "decline", "cancel"]) {
      const b = el("button", "answer", label);
      b.type = "button";
      b.addEventListener("click", () => post("/runs/" + encodeURIComponent(current) + "/answer",
        { question: v.id, answer: label === "answer" ? read() : label }));
      form.append(b, " ");
    }
    $("questions").append(form);
    $("questions").hidden = false;
  };
  const post = (path, data) => fetch(path, authorized({
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(data),
  })).then(async (r) => { if (!r.ok) problem("The server refused: " + (await r.json()).error); });
  const refresh = () => fetch("/runs", authorized({})).then((r) => r.json()).then((data) => {
    const list = $("runs");
    list.replaceChildren();
    for (const run of data.runs) {
      const li = el("li", run.id === current ? "current" : "",
        run.id + " · " + run.state + (run.returned ? " (returned)" : ""));
      li.addEventListener("click", () => watch(run.id));
      list.append(li);
    }
    return data.runs;
  });
  const id = () => "live-" + Math.random().toString(36).slice(2, 10);
  $("start").addEventListener("submit", (e) => {
    e.preventDefault();
    const prompt = $("prompt").value.trim();
    if (!prompt) return;
    const runId = id();
    current = runId;
    history.replaceState(null, "", "#run=" + encodeURIComponent(runId));
    follow({
      url: "/", method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ threadId: runId, runId: runId,
        messages: [{ id: runId + "-prompt", role: "user", content: prompt }] }),
    });
    setTimeout(refresh, 200);
  });
  $("steer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("steer-text").value.trim();
    if (current && text) post("/runs/" + encodeURIComponent(current) + "/steer", { message: text });
    $("steer-text").value = "";
  });
  $("abort").addEventListener("click", () => {
    if (current) post("/runs/" + encodeURIComponent(current) + "/abort", {});
  });
  const wanted = /^#run=(.+)$/.exec(location.hash);
  refresh().then((runs) => {
    if (wanted) watch(decodeURIComponent(wanted[1]));
    else if (runs.length) watch(runs[runs.length - 1].id);
    body.dataset.ready = "true";
  }).catch((e) => {
    problem("The server did not answer: " + e.message);
    body.dataset.ready = "true";
  });
})();
"""
