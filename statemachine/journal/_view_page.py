"""The viewer page's markup, style and script (``view_html`` fills the page in), after
what it shares with the live page (``statemachine._page``): kept apart from the code
that turns a journal into the page's data, and read whole."""

from __future__ import annotations

from typing import Final

__all__ = ["BODY", "SCRIPT", "STYLE"]

BODY: Final = """<header>
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
  {messages}
</main>
<script type="application/json" id="run-data">{data}</script>"""

STYLE: Final = """
main { grid-template-rows: auto minmax(0, 1fr); height: calc(100vh - 5rem); min-height: 36rem; }
#diagram { grid-column: 1; grid-row: 1; max-height: 55vh; }
#timeline { grid-column: 1; grid-row: 2; display: flex; flex-direction: column; min-height: 0; }
#transcript { min-height: 0; }
.controls { display: flex; gap: 0.4rem; align-items: center; }
.controls input { flex: 1; }
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
#events li.step { border-left-color: #0e7490; }
#events li.vw-active { background: #fde68a; }
#messages li { max-width: 95%; }
#messages li.user { margin-left: auto; }
#messages li.toolResult { background: #f0fdf4; font-family: ui-monospace, monospace;
                          font-size: 0.85rem; }
#messages li.toolResult.failed { background: #fef2f2; }
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

SCRIPT: Final = """
(() => {
  const data = JSON.parse($("run-data").textContent);
  const steps = data.steps, messages = data.messages, run = data.run;
  $("run-id").textContent = run.id;
  $("run-state").textContent = run.state;
  $("run-summary").textContent = run.state + " after " + steps.length + " event(s), " +
    run.turns + " turn(s), " + messages.length + " message(s); tools: " +
    (run.tools.join(", ") || "none") + "; max_turns " + run.maxTurns +
    (run.declared ? "; a declared end, the table's own" : "") +
    (run.explanation ? "; " + run.explanation : "");
  if (run.error) {
    $("run-error").hidden = false;
    $("run-error").textContent = "The journal stops replaying here: " + run.error +
      " (everything before that line is shown).";
  }
  const { nodes, edges } = diagramParts($("diagram"));
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
    li.append(el("span", "who", m.who));
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
