"""The state machine drawn from its transition table, alone or with a run's path on it.

The machine as mermaid ``stateDiagram-v2``, DOT, SVG and PNG (``render``), and the
same machine with the steps a finished run took highlighted and counted
(``overlay_from_trace``). Every drawing is a function of a table (default:
``core.table.TRANSITIONS``), so a new state or trigger shows up by regenerating;
nothing here restates the table, and nothing here writes a file.

The graphs go through ``transitions``' own diagram support (``GraphMachine``) with the
engine always named, because ``transitions`` otherwise falls back silently from
pygraphviz to graphviz to mermaid and hands back mermaid text whatever format was
asked. Its output is then corrected where it falls short (see ``_mermaid_source``
and ``_style_agraph``). Nothing on the runtime path imports this module, and this
module imports ``transitions.extensions.diagrams`` only when it draws.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias

import attrs

from statemachine.core.engine import TransitionRecord
from statemachine.core.table import (
    INTERNAL_TRIGGERS,
    RETURNS_TO_CALLER,
    STATE_DOCS,
    TERMINAL,
    TRANSITIONS,
    Trigger,
)
from statemachine.errors import DiagramError

__all__ = [
    "FORMATS",
    "Chart",
    "DiagramError",
    "Edge",
    "Line",
    "Overlay",
    "Row",
    "chart_from_table",
    "mermaid_ids",
    "mermaid_text",
    "normalize_svg",
    "overlay_from_trace",
    "render",
    "svg_inline",
]

Format: TypeAlias = Literal["mermaid", "dot", "svg", "png"]
FORMATS: Final[tuple[Format, ...]] = ("mermaid", "dot", "svg", "png")

TITLE: Final = "The agent loop"
LEGEND: Final = (
    "guards in [brackets] are tried in table order; dashed: fired by the engine itself; "
    "double border: the run ends; yellow: the run returns to wait for a person"
)


class Row(Protocol):
    """What a diagram needs of a table row; ``_table.Transition`` is one."""

    @property
    def source(self) -> str: ...
    @property
    def trigger(self) -> str: ...
    @property
    def dest(self) -> str: ...
    @property
    def guard(self) -> str | None: ...
    @property
    def label(self) -> str: ...


# -- the chart: what every format draws, derived from a table ---------------------------


@attrs.frozen
class Line:
    """One trigger on an edge, with the guards under which it takes that edge."""

    trigger: str
    guards: tuple[str, ...]  # readable; "else" for the unguarded last row of a group
    notes: tuple[str, ...]  # the rows' own labels, how a person would say them

    @property
    def text(self) -> str:
        words = _words(self.trigger)
        return f"{words} [{' or '.join(self.guards)}]" if self.guards else words


@attrs.frozen
class Edge:
    """All the lines from one state to another of one kind (input or internal)."""

    source: str
    dest: str
    internal: bool
    lines: tuple[Line, ...]


@attrs.frozen
class Chart:
    """A table, grouped for drawing. Build it with ``chart_from_table``."""

    states: tuple[str, ...]
    initial: str
    terminal: frozenset[str]
    waiting: frozenset[str]
    edges: tuple[Edge, ...]
    docs: Mapping[str, str]


def _words(name: str) -> str:
    """``has_tool_calls`` as a person says it; a name of underscores stays as it is."""
    # Labels lose outer whitespace when drawn, so the fallback is stripped too.
    return " ".join(name.replace("_", " ").split()) or name.strip() or name


def _states(rows: Sequence[Row], start: str) -> dict[str, None]:
    """The states ``rows`` name, ``start`` first, then in table order; refuse a blank name."""
    states: dict[str, None] = {start: None}
    for i, row in enumerate(rows):
        for what, name in (("source", row.source), ("trigger", row.trigger), ("dest", row.dest)):
            if not isinstance(name, str) or not name.strip():
                raise DiagramError(f"row {i}: {what} must be a non-blank string, got {name!r}")
        states.setdefault(str(row.source), None)
        states.setdefault(str(row.dest), None)
    return states


def chart_from_table(
    rows: Sequence[Row] = TRANSITIONS,
    *,
    initial: str | None = None,
    terminal: Iterable[str] = TERMINAL,
    waiting: Iterable[str] = RETURNS_TO_CALLER - TERMINAL,
    internal: Iterable[str] = INTERNAL_TRIGGERS,
    docs: Mapping[str, str] | None = None,
) -> Chart:
    """Group ``rows`` into edges, keeping table order everywhere (stable output).

    The initial state is the first row's source unless named: a table starts where
    the run starts. ``waiting`` are the live states a run returns from.
    """
    rows = tuple(rows)
    if not rows:
        raise DiagramError("the table is empty: there is nothing to draw")
    start = str(initial) if initial is not None else str(rows[0].source)
    states = _states(rows, start)
    internal_set = {str(t) for t in internal}
    # A group's rows are tried in order, so an unguarded row is an "else" only after a
    # guarded one.
    guarded_before: set[tuple[str, str]] = set()
    edges: dict[tuple[str, str, bool], dict[str, tuple[list[str], list[str]]]] = {}
    for row in rows:
        src, dst, trig = str(row.source), str(row.dest), str(row.trigger)
        if row.guard is not None:
            guard = _words(str(row.guard))
            guarded_before.add((src, trig))
        elif (src, trig) in guarded_before:
            guard = "else"
        else:
            guard = ""
        lines = edges.setdefault((src, dst, trig in internal_set), {})
        guards, notes = lines.setdefault(trig, ([], []))
        if guard not in guards:
            guards.append(guard)
        notes.append(row.label)
    return Chart(
        states=tuple(states),
        initial=start,
        terminal=frozenset(str(s) for s in terminal) & set(states),
        waiting=frozenset(str(s) for s in waiting) & set(states),
        edges=tuple(
            Edge(
                src,
                dst,
                is_internal,
                # A row without a guard takes the edge whatever the others say.
                tuple(Line(t, () if "" in g else tuple(g), tuple(n)) for t, (g, n) in ls.items()),
            )
            for (src, dst, is_internal), ls in edges.items()
        ),
        docs={str(k): v for k, v in (STATE_DOCS if docs is None else docs).items()},
    )


# -- overlays: the path a run took -----------------------------------------------------------


@attrs.frozen
class Overlay:
    """How often a run entered each state and took each (source, trigger, dest) step."""

    states: Mapping[str, int]
    steps: Mapping[tuple[str, str, str], int]
    final: str


def overlay_from_trace(
    chart: Chart, trace: Sequence[TransitionRecord], final: str | None = None
) -> Overlay:
    """Count the states and steps of ``trace``; refuse a step the chart does not have."""
    known = {(e.source, line.trigger, e.dest) for e in chart.edges for line in e.lines}
    states: Counter[str] = Counter({chart.initial: 1})
    steps: Counter[tuple[str, str, str]] = Counter()
    for i, record in enumerate(trace):
        step = (str(record.source), str(record.trigger), str(record.dest))
        if step not in known:
            raise DiagramError(
                f"trace[{i}]: {step[0]} --{step[1]}--> {step[2]} is not a row of the table; "
                "was the run recorded with another version of the library?"
            )
        steps[step] += 1
        if step[0] != step[2]:
            states[step[2]] += 1
    last = final if final is not None else (str(trace[-1].dest) if trace else chart.initial)
    return Overlay(states=dict(states), steps=dict(steps), final=last)


# -- through transitions' GraphMachine ----------------------------------------------------------


class _Model:
    """The object a drawing machine moves; it is never triggered."""


_MERMAID_STYLES: Final[dict[str, dict[str, str]]] = {
    "default": {"fill": "#ffffff", "stroke": "#333333"},
    "terminal": {"fill": "#eeeeee", "stroke": "#333333", "stroke-width": "3px"},
    "waiting": {"fill": "#fff4c2", "stroke": "#9a6700"},
    "visited": {"fill": "#dbeafe", "stroke": "#1d4ed8", "stroke-width": "2px"},
    "current": {"fill": "#bfdbfe", "stroke": "#b91c1c", "stroke-width": "4px"},
    "unvisited": {"stroke": "#bbbbbb", "color": "#999999"},
}
_DOT_STYLES: Final[dict[str, dict[str, str]]] = {
    "default": {
        "shape": "rectangle",
        "style": "rounded,filled",
        "fillcolor": "white",
        "color": "black",
        "fontname": "Helvetica",
        "fontsize": "12",
        "peripheries": "1",
    },
    "terminal": {"fillcolor": "#eeeeee", "peripheries": "2"},
    "waiting": {"fillcolor": "#fff4c2", "color": "#9a6700"},
    "visited": {"fillcolor": "#dbeafe", "color": "#1d4ed8", "penwidth": "2"},
    "current": {"fillcolor": "#bfdbfe", "color": "#b91c1c", "penwidth": "3"},
    "unvisited": {"color": "#bbbbbb", "fontcolor": "#999999"},
}
_MERMAID_RESERVED: Final = frozenset(
    {"state", "note", "class", "classdef", "direction", "end", "as", "style", "default"}
)


def mermaid_ids(states: Sequence[str]) -> dict[str, str]:
    """Ids mermaid accepts (letters, digits, ``_``), unique, stable in table order.

    transitions writes state names as mermaid ids unchanged, so ``Waiting for input``
    or ``half-done`` break the diagram; the name stays visible as the state's label.
    """
    ids: dict[str, str] = {}
    used: set[str] = set()
    for name in states:
        base = re.sub(r"[^A-Za-z0-9_]", "_", name) or "state"
        if base[0].isdigit() or base.lower() in _MERMAID_RESERVED:
            base = "s_" + base
        candidate, n = base, 2
        while candidate in used:
            candidate, n = f"{base}_{n}", n + 1
        used.add(candidate)
        ids[name] = candidate
    return ids


_MERMAID_CODES: Final = {
    "#": "#35;",
    ";": "#59;",
    '"': "#quot;",
    "<": "#lt;",
    ">": "#gt;",
    "{": "#123;",
    "}": "#125;",
    "|": "#124;",
}
_MERMAID_SPECIAL: Final = re.compile('[#;"<>{}|]')


def mermaid_text(text: str) -> str:
    """Escape text for a mermaid label with its entity codes (``#35;`` and so on).

    Quotes end a state label, ``;`` ends a statement, ``<``/``>`` read as HTML, a
    line ending in ``{`` opens a composite state, and ``|`` is what transitions joins
    an edge's labels with.
    """
    # One pass: replacing one character at a time would escape the "#" and ";" of
    # the codes already written.
    return _MERMAID_SPECIAL.sub(lambda m: _MERMAID_CODES[m.group()], " ".join(text.split()))


def _engine(engine: Literal["mermaid", "pygraphviz"]) -> tuple[type, Any, Any]:
    """The graph class ``engine`` draws with, its node styles and its machine attributes."""
    from transitions.extensions import diagrams_mermaid

    if engine == "mermaid":
        return diagrams_mermaid.Graph, _MERMAID_STYLES, {"direction": "TB"}
    from transitions.extensions import diagrams_pygraphviz

    if getattr(diagrams_pygraphviz, "pgv", None) is None:
        raise DiagramError(
            "dot, svg and png need pygraphviz, which is not installed: "
            "pip install 'agent-statemachine[diagrams]' (its wheels bundle Graphviz), "
            "or use --format mermaid"
        )
    return (
        diagrams_pygraphviz.Graph,
        _DOT_STYLES,
        {"directed": True, "strict": False, "rankdir": "TB"},
    )


def _graph_machine(
    chart: Chart,
    engine: Literal["mermaid", "pygraphviz"],
    ids: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
) -> Any:
    """A ``GraphMachine`` drawing ``chart`` with ``engine`` named, never a fallback.

    ``ids`` are the node names the engine gets; ``labels`` what a node shows (default:
    the state's name).
    """
    from transitions.extensions import diagrams

    expected, styles, attributes = _engine(engine)

    class _Machine(diagrams.GraphMachine):
        # Class attributes in transitions; per-engine here because the two backends
        # read the same keys differently (``color`` is the border in Graphviz and the
        # text in mermaid), and because its "strict": "false" is a truthy string that
        # makes pygraphviz build a strict graph.
        machine_attributes = attributes
        style_attributes = {"node": styles, "edge": {"default": {}}, "graph": {}}  # noqa: RUF012

    model = _Model()
    machine = _Machine(
        model=model,
        states=[ids[s] for s in chart.states],
        initial=ids[chart.initial],
        auto_transitions=False,
        graph_engine=engine,
        show_conditions=True,
        title=TITLE,
    )
    if machine.graph_cls is not expected:
        # transitions logs a warning and draws with another engine; a diagram in the
        # wrong format is worse than a clear error.
        raise DiagramError(
            f"transitions drew with {machine.graph_cls.__module__} instead of {engine}"
        )
    for name in chart.states:
        label = labels.get(name, name) if labels is not None else name
        if label != ids[name]:
            # transitions' State takes no label, but its markup reads one if present.
            state: Any = machine.get_state(ids[name])
            state.label = mermaid_text(label)
    for edge in chart.edges:
        for line in edge.lines:
            label = mermaid_text(("(auto) " if edge.internal else "") + _words(line.trigger))
            machine.add_transition(
                f"{edge.source}->{edge.dest}:{line.trigger}",  # unique, never fired
                ids[edge.source],
                ids[edge.dest],
                conditions=[mermaid_text(" or ".join(line.guards))] if line.guards else None,
                label=label,
            )
    return machine, model


def _style_nodes(
    machine: Any, model: Any, chart: Chart, ids: Mapping[str, str], o: Overlay | None
) -> None:
    graph = machine.model_graphs[id(model)]
    # transitions marks the model's current state (the initial one) as "active"; a
    # diagram of the machine has no current state, so start from a clean slate.
    graph.reset_styling()
    for name in chart.states:
        if name in chart.terminal:
            graph.set_node_style(ids[name], "terminal")
        elif name in chart.waiting:
            graph.set_node_style(ids[name], "waiting")
        else:
            graph.set_node_style(ids[name], "default")
        if o is not None:
            # On top of the kind, so an overlay still shows which states end a run.
            style = "current" if name == o.final else "visited" if name in o.states else "unvisited"
            graph.set_node_style(ids[name], style)


def _count(o: Overlay | None, edge: Edge, line: Line) -> int:
    return 0 if o is None else o.steps.get((edge.source, line.trigger, edge.dest), 0)


# -- mermaid ----------------------------------------------------------------------------------


def _mermaid_source(chart: Chart, overlay: Overlay | None) -> str:
    ids = mermaid_ids(chart.states)
    if overlay is not None:
        chart = _with_counts(chart, overlay)
    labels = None
    if overlay is not None:
        labels = {s: f"{s} ×{n}" for s, n in overlay.states.items()}
    machine, model = _graph_machine(chart, "mermaid", ids, labels)
    _style_nodes(machine, model, chart, ids, overlay)
    source: str = model.get_graph().source
    lines = source.split("\n")
    # transitions writes the title as a bare YAML scalar between the front-matter
    # fences; mermaid wants a ``title:`` key there.
    if lines[:1] == ["---"] and lines[2:3] == ["---"]:
        lines[1] = f"title: {mermaid_text(TITLE)}"
    lines = [line.rstrip() for line in lines if line.strip() != "classDef s_inactive"]
    # The flat backend draws no final states; a terminal state ends in [*].
    ends = [f"  {ids[s]} --> [*]" for s in chart.states if s in chart.terminal]
    return "\n".join([*lines, *ends]) + "\n"


def _with_counts(chart: Chart, overlay: Overlay) -> Chart:
    """The chart with visited lines' triggers suffixed by how often they fired."""

    def line(edge: Edge, ln: Line) -> Line:
        n = _count(overlay, edge, ln)
        return attrs.evolve(ln, trigger=f"{ln.trigger} ×{n}") if n else ln

    edges = tuple(attrs.evolve(e, lines=tuple(line(e, ln) for ln in e.lines)) for e in chart.edges)
    return attrs.evolve(chart, edges=edges)


# -- graphviz ------------------------------------------------------------------------------


def _agraph(chart: Chart, overlay: Overlay | None) -> Any:
    ids = {s: s for s in chart.states}
    machine, model = _graph_machine(chart, "pygraphviz", ids)
    _style_nodes(machine, model, chart, ids, overlay)
    graph = model.get_graph()
    _style_agraph(graph, chart, overlay)
    return graph


def _edge_attributes(edge: Edge, o: Overlay | None) -> dict[str, str]:
    """The Graphviz attributes of one chart edge: its lines, tooltip, style and colours."""
    counts = [_count(o, edge, line) for line in edge.lines]
    label = "\n".join(
        line.text + (f" ×{n}" if n else "") for line, n in zip(edge.lines, counts, strict=True)
    )
    attr: dict[str, str] = {
        "label": label,
        "tooltip": "; ".join(note for line in edge.lines for note in line.notes),
        "style": "dashed" if edge.internal else "solid",
    }
    if o is None and all(line.trigger in _QUIET_TRIGGERS for line in edge.lines):
        # Abort edges leave every live state; drawn quieter so the loop stands out.
        attr.update(color="#999999", fontcolor="#777777")
    if o is not None:
        visited = any(counts)
        attr.update(
            color="#1d4ed8" if visited else "#bbbbbb",
            fontcolor="#1d4ed8" if visited else "#999999",
            penwidth="2.5" if visited else "1",
        )
    return attr


def _style_agraph(graph: Any, chart: Chart, o: Overlay | None) -> None:
    """Labels and edge styles transitions cannot express, set on its AGraph.

    transitions joins every trigger between two states on one line (too wide to
    read), ends each node label with a left-justify escape, and draws internal and
    input triggers between the same two states as one edge; each chart edge is drawn
    here instead, reusing transitions' edge for the first of a pair.
    """
    graph.graph_attr.update(
        label=LEGEND if o is None else f"{LEGEND}; blue: the path this run took, ×N: how often",
        labelloc="b",
        fontname="Helvetica",
        fontsize="10",
        nodesep="0.5",
        ranksep="0.55",
    )
    graph.edge_attr.update(fontname="Helvetica", fontsize="10", color="#333333")
    drawn = {(str(a), str(b)) for a, b in graph.edges()}
    wanted = {(e.source, e.dest) for e in chart.edges}
    if drawn != wanted:
        raise DiagramError(
            f"transitions drew edges {sorted(drawn)} but the table has {sorted(wanted)}"
        )
    for state in chart.states:
        node = graph.get_node(state)
        text = state
        if o is not None and o.states.get(state):
            text = f"{state}\n×{o.states[state]}"
        node.attr.update(label=text, tooltip=chart.docs.get(state, state))
    reused: set[tuple[str, str]] = set()
    for edge in chart.edges:
        attr = _edge_attributes(edge, o)
        pair = (edge.source, edge.dest)
        if pair in reused:
            graph.add_edge(
                edge.source, edge.dest, key=f"{'internal' if edge.internal else 'input'}"
            )
            graph.get_edge(
                edge.source, edge.dest, key=f"{'internal' if edge.internal else 'input'}"
            ).attr.update(attr)
        else:
            reused.add(pair)
            graph.get_edge(edge.source, edge.dest).attr.update(attr)
    start = "__start__"
    while start in chart.states:  # a table may use any name, this one included
        start += "_"
    graph.add_node(start, shape="point", width="0.15", label="", tooltip="the run starts")
    graph.add_edge(start, chart.initial, label="", style="solid", tooltip="start")


_QUIET_TRIGGERS: Final = frozenset({Trigger.ABORT.value})
_VERSION_COMMENT: Final = re.compile(r"<!-- Generated by graphviz version [^>]*-->\n")


def _draw(graph: Any, fmt: Literal["svg", "png"]) -> bytes:
    if not hasattr(graph, "draw") or type(graph).__name__ != "AGraph":
        # transitions' mermaid "graph" also has draw(), and writes mermaid text for
        # any format it is asked for.
        raise DiagramError(f"{fmt} needs a pygraphviz graph, got {type(graph).__name__}")
    data: bytes = graph.draw(format=fmt, prog="dot")
    if fmt == "svg":
        # The version comment is the one line that changes with the Graphviz build.
        data = _VERSION_COMMENT.sub("", data.decode("utf-8")).encode("utf-8")
    return data


def render(fmt: str, chart: Chart | None = None, overlay: Overlay | None = None) -> str | bytes:
    """The machine in ``fmt`` (text for mermaid, dot and svg; bytes for png)."""
    if fmt not in FORMATS:
        raise DiagramError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    chart = chart if chart is not None else chart_from_table()
    if fmt == "mermaid":
        return _mermaid_source(chart, overlay)
    graph = _agraph(chart, overlay)
    if fmt == "dot":
        return str(graph.string())
    data = _draw(graph, "svg" if fmt == "svg" else "png")
    return data.decode("utf-8") if fmt == "svg" else data


_SVG_NUMBERS: Final = re.compile(
    r'(points|x|y|d|width|height|viewBox|transform|cx|cy|rx|ry)="[^"]*"'
)


def normalize_svg(svg: str) -> str:
    """An SVG without coordinates: what it draws and says, not where.

    Another Graphviz build may place things a point apart; a drifted table changes the
    nodes, edges, labels or styles, which this keeps.
    """
    return _SVG_NUMBERS.sub(r'\1=""', _VERSION_COMMENT.sub("", svg))


_SVG_PROLOG: Final = re.compile(r"\A.*?(?=<svg\b)", re.S)
_SVG_SIZE: Final = re.compile(r'<svg width="[^"]*" height="[^"]*"')


def svg_inline(svg: str, fit: bool = True) -> str:
    """``svg`` as an element of an HTML page: nothing before ``<svg``, and as wide as
    the page (its ``viewBox`` keeps the proportions), or with ``fit=False`` at the size
    Graphviz drew it (its points: text of 10 points is 13 px high)."""
    inline = _SVG_PROLOG.sub("", svg, count=1)
    if fit:
        return _SVG_SIZE.sub('<svg width="100%"', inline, count=1)
    # A theme's "svg { max-width: 100% }" would shrink it back to the column's width.
    return inline.replace("<svg ", '<svg style="max-width: none; height: auto" ', 1)
