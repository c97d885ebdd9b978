"""Your agent in your docs: its tools, its limits and its loop, drawn when the site is built.

Name an agent by ``package.module:attr`` (an ``Agent``, importable where the docs are
built: installed, on ``PYTHONPATH``, or beside the directory the build runs in) and the
site shows it as HTML: a table of its tools, a table of its limits, and its transition
table, the states and rows of the steps it declares included, drawn as the library's
own diagram is (the overview at the page's width, every trigger and guard a click away
at full size; no script, nothing fetched).

- MkDocs, Zensical or any Python-Markdown site: the extension
  ``statemachine.docs.markdown`` (``markdown_extensions: [statemachine.docs.markdown]``),
  then a line of its own ``.. statemachine-agent:: package.module:attr``.
- Sphinx: ``extensions = ["statemachine.docs.sphinx"]``, then the directive
  ``.. statemachine-agent:: package.module:attr``.

An agent that runs the built-in table is drawn from the drawings the package ships (no
Graphviz needed); a table of its own needs the ``[diagrams]`` extra. An agent that
cannot be imported or drawn stops the build with a ``DiagramError`` naming it, never a
page that shows less than it says.
"""

from __future__ import annotations

import html
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from statemachine.errors import DiagramError

if TYPE_CHECKING:  # the drawing is imported when a page is built, not with this module
    from statemachine._render import Chart

__all__ = ["agent_html", "load_agent"]

MAX_TARGET_CHARS: Final = 300
"""The longest ``package.module:attr`` accepted (a name, not a program)."""
_TARGET: Final = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def load_agent(target: str) -> Any:
    """The ``Agent`` that ``target`` (``package.module:attr``) names; ``DiagramError``
    saying what is wrong when it names none."""
    from statemachine.agent.agent import Agent

    if len(target) > MAX_TARGET_CHARS or not _TARGET.fullmatch(target):
        shown = target[:MAX_TARGET_CHARS]
        raise DiagramError(f"statemachine-agent: {shown!r} is not package.module:attr")
    module_name, _, path = target.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        # As ``python -m`` and ``statemachine diagram --agent`` do: a module beside the
        # directory the build runs in (a docs tool's script puts only its own on the path).
        sys.path.insert(0, os.getcwd())
    try:
        value: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise DiagramError(
            f"statemachine-agent {target}: cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in path.split("."):
        if not hasattr(value, part):
            raise DiagramError(f"statemachine-agent {target}: {module_name} has no {path}")
        value = getattr(value, part)
    if not isinstance(value, Agent):
        raise DiagramError(
            f"statemachine-agent {target}: expected an Agent, got {type(value).__name__}"
        )
    return value


def _chart_of(agent: Any) -> Chart:
    """The chart of the table ``agent`` runs, its declared steps' states and rows
    included: ``statemachine.steps.chart``, as ``statemachine diagram --agent`` draws it.
    An agent without steps runs the built-in table, whose drawings ship."""
    from statemachine.steps import chart

    return chart(agent)


def _first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0] if text.strip() else ""


def _rows(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _tools(agent: Any) -> str:
    rows = []
    for tool in agent.tools:
        notes = []
        if tool.timeout is not None:
            notes.append(f"timeout {tool.timeout:g} s")
        if tool.sequential:
            notes.append("runs alone")
        rows.append((tool.name, _first_line(tool.definition.description), ", ".join(notes)))
    if not rows:
        return "<p>No tools.</p>"
    return _rows(("tool", "what the model is told", "limits"), rows)


def _limits(agent: Any) -> str:
    options = agent.options
    rows = [
        ("max_turns", f"{options.max_turns}", "model responses in one run"),
        ("grace_period", f"{options.grace_period:g} s", "how long an abort waits for calls"),
    ]
    if options.output_type is not None:
        rows.append(("output_retries", f"{options.output_retries}", "invalid answers retried"))
    limits = options.usage_limits
    for name in ("requests", "input_tokens", "output_tokens", "total_tokens"):
        value = getattr(limits, name, None) if limits is not None else None
        if value is not None:
            rows.append((f"usage_limits.{name}", f"{value:,}", "in one run"))
    return _rows(("limit", "value", "what it bounds"), rows)


def agent_html(target: str) -> str:
    """The agent that ``target`` names as HTML: its tools, its limits, its loop."""
    from statemachine._figures import figure_html

    agent = load_agent(target)
    name = agent.name or target
    # The model's class only: its settings may hold a key or an address.
    model = type(agent.model).__name__
    chart = _chart_of(agent)
    return (
        f'<div class="statemachine-agent" data-agent="{html.escape(target)}">'
        f"<p><strong>{html.escape(name)}</strong> (model client: {html.escape(model)})</p>"
        f"{_tools(agent)}{_limits(agent)}"
        f"{figure_html(chart, caption=f'The loop {name} runs.')}</div>"
    )
