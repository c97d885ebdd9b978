"""Diagrams: derived from the table, correct per format, committed copies up to date."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pygraphviz  # type: ignore[import-untyped]  # no stubs, no py.typed
import pytest
from hypothesis import given
from hypothesis import strategies as st
from transitions.extensions import diagrams_pygraphviz
from transitions.extensions.diagrams import GraphMachine

import statemachine.cli as cli
from statemachine._figures import (
    PACKAGED,
    figure_html,
    overview_chart,
    packaged_svg,
    render_overview,
    svg_fence,
)
from statemachine._render import (
    Chart,
    DiagramError,
    _draw,
    chart_from_table,
    mermaid_text,
    normalize_svg,
    render,
    svg_inline,
)
from statemachine.core.table import INTERNAL_TRIGGERS, TERMINAL, TRANSITIONS, TurnState
from tools import figures
from tools.figures import (
    DIAGRAM_PAGES,
    REGENERATE,
    readme_block,
    stale_files,
    update_readme,
    write_all,
)

REPO = Path(__file__).resolve().parent.parent


@attrs.frozen
class Row:
    """A row of a synthetic table; plain strings, as a user's own table might have."""

    source: str
    trigger: str
    dest: str
    guard: str | None = None
    label: str = ""


# States whose names break naive mermaid: spaces, dashes, a quote, a semicolon, a
# reserved word, and two names that sanitize to the same id.
AWKWARD = (
    Row("Waiting for input", "go", "half-done", None, "start"),
    Row("half-done", "finish", "all done", "is-ready", "ready"),
    Row("half-done", "finish", "half-done", None, "not yet"),
    Row("half-done", "tick", 'say "hi"; bye', None, "odd"),
    Row("half done", "poke", "end", None, "collides with half-done"),
    Row("Waiting for input", "go", "half done", "never", "other"),
)


def awkward_chart() -> Chart:
    return chart_from_table(AWKWARD, terminal={"all done", "end"}, waiting=(), internal=())


def mermaid() -> str:
    text = render("mermaid")
    assert isinstance(text, str)
    return text


def dot_graph(chart: Chart | None = None, **kwargs: Any) -> pygraphviz.AGraph:
    return pygraphviz.AGraph(string=str(render("dot", chart, **kwargs)))


# -- the chart ---------------------------------------------------------------------


def test_every_row_is_a_line_on_exactly_one_edge() -> None:
    chart = chart_from_table()
    placed = Counter((e.source, line.trigger, e.dest) for e in chart.edges for line in e.lines)
    rows = Counter((r.source.value, r.trigger.value, r.dest.value) for r in TRANSITIONS)
    assert set(placed) == set(rows)
    assert all(n == 1 for n in placed.values())
    assert set(chart.states) == {s.value for s in TurnState}
    assert chart.initial == TRANSITIONS[0].source.value
    assert chart.terminal == {s.value for s in TERMINAL}


def test_guards_are_readable_and_the_fallback_row_says_else() -> None:
    chart = chart_from_table()
    lines = {(e.source, ln.trigger, e.dest): ln for e in chart.edges for ln in e.lines}
    guarded = {(r.source, r.trigger) for r in TRANSITIONS if r.guard is not None}
    for row in TRANSITIONS:
        line = lines[(row.source.value, row.trigger.value, row.dest.value)]
        if row.guard is not None:
            # Guarded rows of one group with one destination share a line, their guards
            # joined by "or" (either leads there once the rows before them fail).
            assert row.guard.value.replace("_", " ") in line.guards
            words = row.trigger.value.replace("_", " ")
            assert line.text == f"{words} [{' or '.join(line.guards)}]"
        elif (row.source, row.trigger) in guarded:
            assert line.guards == ("else",)
        else:
            assert line.guards == ()
        assert row.label in line.notes


def test_internal_triggers_get_edges_of_their_own() -> None:
    chart = chart_from_table()
    for edge in chart.edges:
        assert all((ln.trigger in INTERNAL_TRIGGERS) is edge.internal for ln in edge.lines)


def test_an_empty_table_or_a_blank_name_is_refused() -> None:
    with pytest.raises(DiagramError, match="empty"):
        chart_from_table(())
    with pytest.raises(DiagramError, match="row 1: dest must be a non-blank string"):
        chart_from_table((Row("A", "go", "B"), Row("B", "go", "  ")))


def test_a_state_named_like_the_start_marker_keeps_its_own_node() -> None:
    chart = chart_from_table((Row("__start__", "go", "B"),), terminal={"B"}, waiting=())
    graph = dot_graph(chart)
    assert graph.get_node("__start__").attr["shape"] != "point"
    assert graph.get_node("__start___").attr["shape"] == "point"
    assert graph.has_edge("__start___", "__start__")


# -- mermaid -----------------------------------------------------------------------------

_ID = r"[A-Za-z_][A-Za-z0-9_]*"
_TEXT = r'(?:[^;"\n#]|#\w+;)+'  # "#59;" and friends are mermaid's escapes
MERMAID_LINE = re.compile(
    "^(?:"
    + "|".join(
        [
            "---",
            "title: .+",
            "stateDiagram-v2",
            "  direction (?:TB|LR)",
            "  classDef s_[a-z]+ [a-z-]+:[^ ,]+(?:,[a-z-]+:[^ ,]+)*",
            f'  state "{_TEXT}" as {_ID}',
            f"  Class {_ID} s_[a-z]+",
            rf"  (?:\[\*\]|{_ID}) --> (?:\[\*\]|{_ID})(?:: {_TEXT})?",
        ]
    )
    + ")$"
)


def assert_valid_mermaid(text: str) -> None:
    assert text.startswith("---\ntitle: ")
    for line in text.splitlines():
        assert line == "" or MERMAID_LINE.match(line), f"not a mermaid statement: {line!r}"


def test_mermaid_draws_every_state_start_and_end() -> None:
    text = mermaid()
    assert_valid_mermaid(text)
    assert "stateDiagram-v2" in text
    for state in TurnState:
        assert f'state "{state.value}" as {state.value}' in text
        ends = f"  {state.value} --> [*]" in text.splitlines()
        assert ends is (state in TERMINAL)
    assert f"  [*] --> {TRANSITIONS[0].source.value}" in text.splitlines()


def test_mermaid_puts_guards_on_edges_and_marks_internal_triggers() -> None:
    edges = [ln for ln in mermaid().splitlines() if "-->" in ln and "[*]" not in ln]
    guarded = {(r.source, r.trigger) for r in TRANSITIONS if r.guard is not None}
    for row in TRANSITIONS:
        words = row.trigger.value.replace("_", " ")
        prefix = "(auto) " if row.trigger in INTERNAL_TRIGGERS else ""
        [edge] = [e for e in edges if e.startswith(f"  {row.source} --> {row.dest}: ")]
        labels = edge.split(": ", 1)[1].split(" | ")
        if row.guard is not None:
            # Guarded rows with one destination share a label: "[a or b]".
            readable = row.guard.value.replace("_", " ")
            assert any(
                label.startswith(f"{prefix}{words} [")
                and readable in label[len(prefix + words) + 2 : -1].split(" or ")
                for label in labels
            ), (row, labels)
        else:
            guard = " [else]" if (row.source, row.trigger) in guarded else ""
            assert f"{prefix}{words}{guard}" in labels


def test_transitions_mermaid_breaks_on_awkward_names_and_ours_does_not() -> None:
    # The quirk: transitions writes names as mermaid ids unchanged.
    raw = GraphMachine(
        model=SimpleNamespace(),
        states=["Waiting for input", "half-done"],
        initial="Waiting for input",
        auto_transitions=False,
        graph_engine="mermaid",
    )
    raw.add_transition("go", "Waiting for input", "half-done")
    assert "Waiting for input --> half-done: go" in raw.get_graph().source

    text = render("mermaid", awkward_chart())
    assert isinstance(text, str)
    assert_valid_mermaid(text)
    assert 'state "Waiting for input" as Waiting_for_input' in text
    assert 'state "half-done" as half_done' in text
    assert 'state "half done" as half_done_2' in text  # the colliding name
    assert 'state "end" as s_end' in text  # a reserved word
    assert "#quot;hi#quot;#59; bye" in text
    assert "  Waiting_for_input --> half_done: go" in text.splitlines()
    assert "  half_done --> all_done: finish [is-ready]" in text.splitlines()
    assert "  half_done --> half_done: finish [else] | tick" not in text  # tick goes elsewhere
    assert {"  all_done --> [*]", "  s_end --> [*]"} <= set(text.splitlines())


def test_output_does_not_depend_on_hash_seeds() -> None:
    # Sets and dicts keyed by str iterate in a per-process order; nothing drawn may.
    code = "from statemachine._render import render\nprint(render('mermaid') + render('dot'))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    assert outs == {mermaid() + str(render("dot")) + "\n"}


_NAMES = st.text(
    alphabet=st.sampled_from("abcXYZ019 -_\"';#<>:%[]{}()|é→*&"), min_size=1, max_size=10
).filter(lambda s: s.strip() != "")


@st.composite
def tables(draw: st.DrawFn) -> tuple[Row, ...]:
    states = draw(st.lists(_NAMES, min_size=1, max_size=5, unique=True))
    row = st.builds(
        Row,
        st.sampled_from(states),
        _NAMES,
        st.sampled_from(states),
        st.none() | _NAMES,
        _NAMES,
    )
    return tuple(draw(st.lists(row, min_size=1, max_size=8)))


@given(tables())
def test_any_table_gives_well_formed_mermaid_with_every_row(rows: tuple[Row, ...]) -> None:
    chart = chart_from_table(rows, terminal={rows[-1].dest}, waiting=(), internal=())
    text = render("mermaid", chart)
    assert isinstance(text, str)
    assert_valid_mermaid(text)
    ids = re.findall(r'^  state "[^\n]*" as (\S+)$', text, re.MULTILINE)
    assert len(ids) == len(set(ids)) == len(chart.states)
    edges = [ln.split(": ", 1)[1] for ln in text.splitlines() if " --> " in ln and ": " in ln]
    for edge in chart.edges:
        for line in edge.lines:
            assert any(mermaid_text(line.text) in e.split(" | ") for e in edges)


# -- graphviz --------------------------------------------------------------------------------


def test_dot_marks_terminal_states_internal_edges_and_the_start() -> None:
    graph = dot_graph()
    for state in TurnState:
        node = graph.get_node(state.value)
        assert (node.attr["peripheries"] == "2") is (state in TERMINAL)
        assert node.attr["tooltip"]
    chart = chart_from_table()
    for edge in chart.edges:
        drawn = graph.get_edge(edge.source, edge.dest)
        assert drawn.attr["style"] == ("dashed" if edge.internal else "solid")
        assert drawn.attr["label"].split("\n") == [ln.text for ln in edge.lines]
    start = graph.get_node("__start__")
    assert start.attr["shape"] == "point"
    assert graph.has_edge("__start__", chart.initial)


def test_dot_splits_internal_and_input_triggers_between_the_same_states() -> None:
    rows = (
        Row("A", "go", "B", None, "go"),
        Row("B", "auto", "C", "ready", "auto"),
        Row("B", "push", "C", None, "push"),
    )
    chart = chart_from_table(rows, terminal={"C"}, waiting=(), internal={"auto"})
    graph = dot_graph(chart)
    styles = sorted((e.attr["style"], e.attr["label"]) for e in graph.edges() if e[0] == "B")
    assert styles == [("dashed", "auto [ready]"), ("solid", "push")]


def test_svg_and_png_are_what_they_say() -> None:
    svg = render("svg")
    assert isinstance(svg, str)
    assert svg.startswith("<?xml")
    assert "<svg" in svg
    assert "Generated by graphviz version" not in svg
    for state in TurnState:
        assert f"<title>{state.value}</title>" in svg
    png = render("png")
    assert isinstance(png, bytes)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_transitions_mermaid_graph_writes_mermaid_whatever_the_format() -> None:
    raw = GraphMachine(
        model=SimpleNamespace(), states=["A", "B"], initial="A", graph_engine="mermaid"
    )
    graph = raw.get_graph()
    # The quirk: asked for SVG, it returns mermaid text.
    assert graph.draw(None, format="svg").startswith("---")
    with pytest.raises(DiagramError, match="needs a pygraphviz graph"):
        _draw(graph, "svg")


def test_unknown_format_is_refused() -> None:
    with pytest.raises(DiagramError, match="unknown format 'jpeg'"):
        render("jpeg")


def test_no_silent_fallback_when_pygraphviz_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diagrams_pygraphviz, "pgv", None)
    # The quirk: transitions quietly draws with another engine.
    raw = GraphMachine(
        model=SimpleNamespace(), states=["A"], initial="A", graph_engine="pygraphviz"
    )
    assert raw.graph_cls is not diagrams_pygraphviz.Graph
    for fmt in ("dot", "svg", "png"):
        with pytest.raises(DiagramError, match=r"pip install 'agent-statemachine\[diagrams\]'"):
            render(fmt)
    assert isinstance(render("mermaid"), str)


# -- the committed files and the README ------------------------------------------------------


def test_committed_diagrams_match_the_code() -> None:
    stale = stale_files(REPO / "diagrams", REPO / "README.md", package=REPO / "statemachine")
    names = ", ".join(str(p.relative_to(REPO)) for p in stale)
    assert not stale, f"stale diagrams: {names}; regenerate with: {REGENERATE}"


def test_the_docs_concepts_page_draws_the_machine_when_the_site_is_built() -> None:
    # The site draws the machine itself (no copy to go stale, no script to load);
    # tests/test_site.py looks at the drawing in a browser.
    assert DIAGRAM_PAGES == ()
    concepts = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8")
    assert "```statemachine-diagram\n" in concepts
    assert "statemachine._figures.svg_fence" in (REPO / "mkdocs.yml").read_text(encoding="utf-8")


def test_the_docs_fence_inlines_the_overview_and_the_full_drawing_with_its_caption() -> None:
    out = svg_fence("The <loop>\n", "statemachine-diagram", "statemachine-diagram", {}, None)
    assert out.startswith('<figure class="statemachine-diagram"')
    assert "<?xml" not in out
    assert "<!DOCTYPE" not in out
    assert "<figcaption>The &lt;loop&gt; Dashed: " in out
    assert out.endswith("</details></figure>")
    # The overview fills the width; the full drawing keeps its own size.
    overview = normalize_svg(svg_inline(packaged_svg("overview")))
    full = normalize_svg(svg_inline(packaged_svg("full"), fit=False))
    assert overview in normalize_svg(out)
    assert full in normalize_svg(out)
    assert out.index('<div class="sm-overview">') < out.index("<details")
    assert "<figcaption>Dashed: " in svg_fence("", "x", "x", {}, None)


def test_the_docs_fence_stops_the_build_when_the_diagram_cannot_be_drawn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # superfences shows a fence whose function raises anything else as plain code, and
    # the build passes: the error must be its own exception.
    from pymdownx.superfences import (  # type: ignore[import-untyped]  # no py.typed
        SuperFencesException,
    )

    import statemachine._figures as _figures

    def lost(view: str = "full") -> str:
        raise DiagramError("the package's drawing loop.svg cannot be read")

    monkeypatch.setattr(_figures, "packaged_svg", lost)
    with pytest.raises(SuperFencesException, match="statemachine-diagram: the package's"):
        svg_fence("", "statemachine-diagram", "statemachine-diagram", {}, None)


def test_the_packaged_drawings_are_the_built_in_tables_and_need_no_graphviz(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for view, name in PACKAGED.items():
        shipped = (REPO / "statemachine" / name).read_text(encoding="utf-8")
        assert packaged_svg(view) == shipped
        drawn = render_overview() if view == "overview" else str(render("svg"))
        assert normalize_svg(shipped) == normalize_svg(drawn)
    monkeypatch.setattr(diagrams_pygraphviz, "pgv", None)
    assert "AwaitingModel" in figure_html()
    # Any other table is drawn now, which needs Graphviz.
    with pytest.raises(DiagramError, match="pygraphviz"):
        figure_html(awkward_chart())
    with pytest.raises(DiagramError, match="unknown view 'tiny'"):
        packaged_svg("tiny")  # type: ignore[arg-type]


def test_the_wheel_ships_the_packaged_drawings() -> None:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["statemachine"]
    assert all(any(Path(name).match(p) for p in patterns) for name in PACKAGED.values())


def test_the_overview_groups_the_edges_one_per_pair_of_states() -> None:
    chart = chart_from_table()
    overview = overview_chart(chart)
    pairs = [(e.source, e.dest) for e in overview.edges]
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == {(e.source, e.dest) for e in chart.edges if e.source != e.dest}
    assert all(not line.guards for e in overview.edges for line in e.lines)
    assert overview.states == chart.states
    graph = pygraphviz.AGraph(string=render_overview(chart, "dot"))
    assert all(not (graph.get_edge(a, b).attr.get("label") or "") for a, b in pairs)
    assert graph.graph_attr.get("label") in (None, "")
    # What the overview leaves out is in its tooltips: a state's own triggers.
    assert "input queued" in graph.get_node("Ready").attr["tooltip"]


def test_the_full_drawing_inlines_at_its_own_size() -> None:
    svg = str(render("svg"))
    inline = svg_inline(svg, fit=False)
    width = re.search(r'<svg width="([\d.]+)pt"', svg)
    assert width is not None
    assert inline.startswith('<svg style="max-width: none; height: auto" width="')
    assert f'width="{width.group(1)}pt"' in inline


def test_readme_shows_the_generated_mermaid() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme_block(mermaid()) in readme, f"README diagram is stale; run: {REGENERATE}"
    committed = (REPO / "diagrams" / "statemachine.mmd").read_text(encoding="utf-8")
    assert f"```mermaid\n{committed}```" in readme


def test_stale_files_notices_a_changed_diagram(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{readme_block('old')}\nrest\n", encoding="utf-8")
    want = 9  # machine x3, run file x2, overlay x2, the page, the README block
    assert len(stale_files(tmp_path, readme)) == want
    changed = write_all(tmp_path, readme)
    assert len(changed) == want
    assert stale_files(tmp_path, readme) == []
    assert readme.read_text(encoding="utf-8").startswith("intro\n")
    (tmp_path / "statemachine.dot").write_text("digraph {}\n", encoding="utf-8")
    assert stale_files(tmp_path, readme) == [tmp_path / "statemachine.dot"]


def test_a_readme_without_markers_is_refused() -> None:
    with pytest.raises(DiagramError, match="no diagram block"):
        update_readme("# title\n", "stateDiagram-v2\n")


# -- the commands --------------------------------------------------------------------------------


def test_cli_diagram_writes_the_format_asked_or_named_by_the_extension(tmp_path: Path) -> None:
    assert cli.main(["diagram", "--out", str(tmp_path / "m.dot")]) == 0
    assert (tmp_path / "m.dot").read_text(encoding="utf-8") == render("dot")
    assert cli.main(["diagram", "--format", "png", "--out", str(tmp_path / "m.bin")]) == 0
    assert (tmp_path / "m.bin").read_bytes().startswith(b"\x89PNG")


def test_cli_diagram_prints_mermaid_and_refuses_bad_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["diagram"]) == 0
    assert capsys.readouterr().out == mermaid()
    assert cli.main(["diagram", "--format", "jpeg"]) == 2
    assert "diagram: argument --format: invalid choice: 'jpeg'" in capsys.readouterr().err
    assert cli.main(["diagram", "--check"]) == 2
    assert "diagram: unrecognized arguments: --check" in capsys.readouterr().err


def test_the_figures_tool_check_reports_stale_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert figures.main(["--check", "--dir", str(tmp_path)]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert figures.main(["--dir", str(tmp_path)]) == 0
    assert figures.main(["--check", "--dir", str(tmp_path)]) == 0


def test_the_figures_tool_refuses_to_draw_another_copy_of_the_library(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(figures, "_IMPORTED", tmp_path)
    assert figures.main(["--check"]) == 2
    assert capsys.readouterr().err.startswith(f"figures: statemachine is imported from {tmp_path}")


def test_the_figures_tool_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "figures.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO / "docs",
    )
    # Graphviz's font library may warn on stderr; the tool itself writes nothing there.
    assert done.returncode == 0, done.stderr
    assert "stale" not in done.stderr


def test_importing_the_library_does_not_import_the_diagram_machinery() -> None:
    code = (
        "import sys, statemachine\n"
        "bad = [m for m in ('statemachine._render', 'statemachine.cli.diagram',"
        " 'transitions.extensions.diagrams', 'pygraphviz') if m in sys.modules]\n"
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
