"""The built-in table's drawings as the package ships them, the overview that a page's
width can show, and the HTML figure the docs put them in.

``statemachine._render`` draws; this module picks what a reader sees: the overview (one
edge per pair of states, state names large enough to read at a page's width) with the
full drawing a click away at its own size. The built-in table's two drawings ship in the
package (``PACKAGED``; ``tools/figures.py`` writes them and ``tests/test_diagrams.py``
fails when they drift from the table), so the docs and ``statemachine view`` show them
without Graphviz; any other table is drawn by Graphviz when asked.
"""

from __future__ import annotations

import html
from typing import Any, Final, Literal, TypeAlias

import attrs

from statemachine._render import (
    Chart,
    DiagramError,
    Edge,
    Line,
    _agraph,
    _draw,
    _words,
    chart_from_table,
    render,
    svg_inline,
)

__all__ = [
    "PACKAGED",
    "figure_html",
    "overview_chart",
    "packaged_svg",
    "render_overview",
    "svg_fence",
]

View: TypeAlias = Literal["full", "overview"]
PACKAGED: Final[dict[View, str]] = {"full": "loop.svg", "overview": "loop-overview.svg"}
"""The file each drawing of the built-in table ships as, next to this module."""


def overview_chart(chart: Chart) -> Chart:
    """``chart`` with its edges grouped, small enough to read at a page's width.

    One edge per pair of states, whatever the triggers and guards (the full drawing
    has those); a state's edges to itself are left out (its tooltip names them). An
    edge is internal when every trigger on it is.
    """
    pairs: dict[tuple[str, str], list[Edge]] = {}
    for edge in chart.edges:
        if edge.source != edge.dest:
            pairs.setdefault((edge.source, edge.dest), []).append(edge)
    edges = []
    for (src, dst), group in pairs.items():
        lines: dict[str, Line] = {}
        for edge in group:
            for line in edge.lines:
                lines.setdefault(line.trigger, Line(line.trigger, (), line.notes))
        internal = all(edge.internal for edge in group)
        edges.append(Edge(src, dst, internal, tuple(lines.values())))
    return attrs.evolve(chart, edges=tuple(edges))


def _stays(chart: Chart, state: str) -> str:
    """What a state keeps to itself, for its tooltip in the overview."""
    triggers = [
        _words(line.trigger)
        for edge in chart.edges
        if edge.source == edge.dest == state
        for line in edge.lines
    ]
    return f" Stays here on: {', '.join(dict.fromkeys(triggers))}." if triggers else ""


_OVERVIEW_NOTE: Final = "the states and the steps between them; the full drawing names each trigger"


def _style_overview(graph: Any, chart: Chart) -> None:
    """The overview's changes to the full drawing's style."""
    graph.graph_attr.update(label="", nodesep="0.25", ranksep="0.5", tooltip=_OVERVIEW_NOTE)
    graph.node_attr.update(fontsize="14")
    for state in chart.states:
        node = graph.get_node(state)
        node.attr.update(
            fontsize="14",
            margin="0.1,0.04",
            tooltip=chart.docs.get(state, state) + _stays(chart, state),
        )
    for edge in graph.edges():
        label = str(edge.attr.get("label") or "")
        if label:
            edge.attr.update(label="", tooltip=label.replace("\n", "; "))
        if edge.attr.get("color") == "#999999":  # the quiet abort edges
            edge.attr.update(arrowsize="0.6")


def render_overview(chart: Chart | None = None, fmt: Literal["svg", "dot"] = "svg") -> str:
    """``overview_chart(chart)`` drawn by Graphviz: larger state names, no edge labels
    (an edge's triggers are its tooltip), no legend (the page says it in text)."""
    chart = chart if chart is not None else chart_from_table()
    graph = _agraph(overview_chart(chart), None)
    _style_overview(graph, chart)
    if fmt == "dot":
        return str(graph.string())
    return _draw(graph, "svg").decode("utf-8")


def packaged_svg(view: View = "full") -> str:
    """The built-in table's drawing as shipped in the package (no Graphviz needed)."""
    from importlib.resources import files

    if view not in PACKAGED:
        raise DiagramError(f"unknown view {view!r}: choose one of {', '.join(PACKAGED)}")
    try:
        return files("statemachine").joinpath(PACKAGED[view]).read_text(encoding="utf-8")
    except OSError as exc:  # an install that lost its data files
        raise DiagramError(f"the package's drawing {PACKAGED[view]} cannot be read: {exc}") from exc


def _svgs(chart: Chart | None) -> tuple[str, str]:
    """The overview and the full drawing of ``chart``: the shipped ones for the built-in
    table, else drawn now (which needs Graphviz)."""
    if chart is None or chart == chart_from_table():
        return packaged_svg("overview"), packaged_svg("full")
    return render_overview(chart), str(render("svg", chart))


_FIGURE_NOTE: Final = (
    "Dashed: steps the engine takes by itself; grey: abort; double border: the run "
    "ends; yellow: the run waits for a person. Hover a state or a step for what it means."
)


def figure_html(chart: Chart | None = None, caption: str = "") -> str:
    """The machine as an HTML figure a person can read at a page's width.

    The overview (``overview_chart``) fills the width; below it, one click opens the
    full drawing (every trigger and guard) at its own size, scrolling sideways when it
    is wider than the page. ``chart`` is the built-in table by default, whose drawings
    ship with the package; any other table is drawn by Graphviz (``DiagramError``
    without it). No script, no network: the page stays readable offline.
    """
    overview, full = _svgs(chart)
    text = html.escape(" ".join(caption.split()))
    return (
        '<figure class="statemachine-diagram" style="width: 100%; margin: 1em 0">'
        # A theme underlines links, and each state is one (for its tooltip).
        "<style>.statemachine-diagram svg a { text-decoration: none; }</style>"
        f'<div class="sm-overview">{svg_inline(overview)}</div>'
        f"<figcaption>{text + ' ' if text else ''}{html.escape(_FIGURE_NOTE)}</figcaption>"
        '<details class="sm-full"><summary>Every trigger and guard, full size</summary>'
        f'<div class="sm-scroll" style="overflow-x: auto">{svg_inline(full, fit=False)}</div>'
        "</details></figure>"
    )


def svg_fence(source: str, language: str, css_class: str, options: Any, md: Any, **_: Any) -> str:
    """A ``pymdownx.superfences`` fence (the docs site's ```` ```statemachine-diagram ````):
    the machine as inline SVG when the page is built (``figure_html``), the block's text
    as its caption.

    A diagram that cannot be drawn stops the build: superfences would otherwise show
    the block as plain code and the build would pass.
    """
    try:
        return figure_html(caption=source)
    except DiagramError as exc:
        from pymdownx.superfences import (  # type: ignore[import-untyped]  # no py.typed
            SuperFencesException,
        )

        raise SuperFencesException(f"statemachine-diagram: {exc}") from exc
