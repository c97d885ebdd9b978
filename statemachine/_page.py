"""What the package's two pages share: the run viewer's (``statemachine view``, one
file) and the live server's (``statemachine serve``).

Each is one HTML document that holds its style and its one script, under a
Content-Security-Policy that names that script by its hash: no other script runs, so
a run's text, which both pages show, can never become code. ``document`` lays such a
page out and writes its policy; ``STYLE`` and ``SCRIPT`` are the rules and the script
helpers both pages start from, each page adding its own after them, and ``MESSAGES``
the column of the run's messages that both show.
"""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Final

__all__ = ["MESSAGES", "SCRIPT", "STYLE", "document"]


def document(*, title: str, style: str, body: str, script: str, policy: str = "") -> str:
    """A whole page: ``body`` is markup already, ``title`` text; ``style`` and ``script``
    follow ``STYLE`` and ``SCRIPT``. The policy lets nothing load but inline style,
    ``data:`` images and the page's script; ``policy`` adds directives (``connect-src``
    for a page that asks its server)."""
    script = SCRIPT + script
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    rules = [
        "default-src 'none'",
        "style-src 'unsafe-inline'",
        "img-src data:",
        f"script-src 'sha256-{digest}'",
    ]
    return _DOCUMENT.format(
        policy=html.escape("; ".join([*rules, policy] if policy else rules)),
        title=html.escape(title),
        style=STYLE + style,
        body=body,
        script=script,
    )


_DOCUMENT: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{policy}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{body}
<script>{script}</script>
</body>
</html>
"""

MESSAGES: Final = """<section id="transcript" aria-label="the messages">
    <h2>Messages</h2>
    <ol id="messages"></ol>
  </section>"""
"""The column of the run's messages, laid out by ``STYLE``; each page's script fills it."""

STYLE: Final = """
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: #1f2328; background: #fff; }
header { padding: 0.6rem 1rem; border-bottom: 1px solid #d0d7de; }
h1 { font-size: 1.2rem; margin: 0; }
h2 { font-size: 1rem; margin: 0 0 0.5rem; }
.badge { font-size: 0.85rem; padding: 0.1rem 0.5rem; border-radius: 1rem; background: #eef; }
.error { color: #b91c1c; white-space: pre-wrap; }
button { font: inherit; padding: 0.15rem 0.6rem; }
main { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 0.75rem;
       padding: 0.75rem; }
#diagram { overflow: auto; border: 1px solid #d0d7de; border-radius: 6px; }
#diagram svg { display: block; }
#transcript { grid-column: 2; grid-row: 1 / span 2; overflow: auto;
              border-left: 1px solid #d0d7de; padding-left: 0.75rem; }
#messages { list-style: none; margin: 0; padding: 0; }
#messages li { margin: 0 0 0.5rem; padding: 0.4rem 0.6rem; border-radius: 8px;
               white-space: pre-wrap; overflow-wrap: anywhere; }
#messages li .who { display: block; font-size: 0.75rem; color: #57606a; }
#messages li.user { background: #eef2ff; }
#messages li.assistant { background: #f6f8fa; }
#messages li .call { display: block; font-family: ui-monospace, monospace; font-size: 0.85rem;
                     color: #15803d; }
"""
"""The rules both pages start from: the type, the header, the grid of the diagram and
the messages, and the messages' colours."""

SCRIPT: Final = """
"use strict";
const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};
// The diagram's states by name and its edges by "from->to" (Graphviz titles each), or
// the states of the list drawn in its place without Graphviz.
const diagramParts = (root) => {
  const nodes = new Map(), edges = new Map();
  for (const g of root.querySelectorAll("g.node, li.node")) {
    const t = g.querySelector("title");
    nodes.set(t ? t.textContent : g.dataset.state, g);
  }
  for (const g of root.querySelectorAll("g.edge")) {
    const t = g.querySelector("title");
    if (!t) continue;
    if (!edges.has(t.textContent)) edges.set(t.textContent, []);
    edges.get(t.textContent).push(g);
  }
  return { nodes, edges };
};
"""
"""The helpers both pages' scripts use: ``$`` by id, ``el`` a new element with its
class and text (always ``textContent``, never markup), ``diagramParts``."""
