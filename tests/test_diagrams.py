"""Diagrams: derived from the table, correct per format, committed copies up to date."""

from __future__ import annotations

import json
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
from statemachine import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from statemachine._render import (
    Chart,
    DiagramError,
    _draw,
    chart_from_table,
    mermaid_text,
    overlay_from_trace,
    render,
)
from statemachine._runs import run_result_from_dict, run_result_to_dict, sequence_diagram
from statemachine.agent.run import RunResult
from statemachine.core.engine import TransitionRecord
from statemachine.core.errors import InvalidInputError
from statemachine.core.table import INTERNAL_TRIGGERS, TERMINAL, TRANSITIONS, Trigger, TurnState
from statemachine.messages import StopReason
from tools import figures
from tools.figures import (
    DIAGRAM_PAGES,
    REGENERATE,
    demo_run,
    readme_block,
    recovery_run,
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
            assert line.guards == (row.guard.value.replace("_", " "),)
            assert line.text == f"{row.trigger.value.replace('_', ' ')} [{line.guards[0]}]"
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
        if row.guard is not None:
            guard = f" [{row.guard.value.replace('_', ' ')}]"
        else:
            guard = " [else]" if (row.source, row.trigger) in guarded else ""
        [edge] = [e for e in edges if e.startswith(f"  {row.source} --> {row.dest}: ")]
        assert f"{prefix}{words}{guard}" in edge.split(": ", 1)[1].split(" | ")


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
    code = "from statemachine.cli.diagram import render\nprint(render('mermaid') + render('dot'))"
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
    stale = stale_files(REPO / "diagrams", REPO / "README.md")
    names = ", ".join(str(p.relative_to(REPO)) for p in stale)
    assert not stale, f"stale diagrams: {names}; regenerate with: {REGENERATE}"


def test_the_docs_concepts_page_shows_the_generated_mermaid() -> None:
    assert DIAGRAM_PAGES
    for page in DIAGRAM_PAGES:
        text = page.read_text(encoding="utf-8")
        assert readme_block(mermaid()) in text, f"{page.name} diagram is stale; run: {REGENERATE}"
    assert stale_files(REPO / "diagrams", None, DIAGRAM_PAGES) == []


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


# -- run files ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["demo", "recovery"])
def demo(request: pytest.FixtureRequest) -> RunResult:
    return demo_run() if request.param == "demo" else recovery_run()


@pytest.fixture(scope="module")
def recovery() -> RunResult:
    return recovery_run()


def test_run_files_round_trip(demo: RunResult) -> None:
    data = json.loads(json.dumps(run_result_to_dict(demo)))
    back = run_result_from_dict(data)
    assert back.state is demo.state
    assert back.messages == demo.messages
    assert back.trace == demo.trace
    assert (back.turns, back.explanation, back.run_id) == (
        demo.turns,
        demo.explanation,
        demo.run_id,
    )
    assert type(back.error) is type(demo.error)


def test_a_run_that_did_not_end_done_gets_its_error_back() -> None:
    result = RunResult(
        state=TurnState.Failed,
        messages=(UserMessage("hi"), AssistantMessage((), stop_reason=StopReason.ERROR)),
        error=None,
        turns=1,
        explanation="The model call failed: boom",
    )
    back = run_result_from_dict(run_result_to_dict(result))
    assert back.error is not None
    assert str(back.error) == "The model call failed: boom"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "other"}, "run.format"),
        ({"version": 2}, "run.version"),
        ({"state": "Sleeping"}, "run.state: 'Sleeping' is not a TurnState"),
        ({"turns": "4"}, "run.turns: expected int"),
        ({"turns": True}, "run.turns: expected int"),
        ({"trace": [{"source": "Ready"}]}, "run.trace.0.: missing key 'trigger'"),
        ({"trace": [7]}, r"run.trace.0.: expected an object"),
        ({"messages": [{"role": "robot"}]}, r"messages.0..role"),
    ],
)
def test_bad_run_files_are_refused_with_the_path(
    demo: RunResult, change: dict[str, Any], message: str
) -> None:
    data = {**run_result_to_dict(demo), **change}
    with pytest.raises(InvalidInputError, match=message):
        run_result_from_dict(data)


# -- overlays -----------------------------------------------------------------------------------


def test_overlay_counts_the_states_and_steps_of_the_run(demo: RunResult) -> None:
    chart = chart_from_table()
    overlay = overlay_from_trace(chart, demo.trace, demo.state.value)
    steps = Counter((r.source.value, r.trigger.value, r.dest.value) for r in demo.trace)
    assert overlay.steps == steps
    model_calls = sum(isinstance(m, AssistantMessage) for m in demo.messages)
    assert overlay.states[TurnState.AwaitingModel.value] == model_calls == demo.turns
    assert overlay.states[chart.initial] == 1
    assert overlay.final == demo.state.value


def test_overlay_refuses_a_step_the_table_does_not_have() -> None:
    bogus = (TransitionRecord(TurnState.Ready, Trigger.settled, TurnState.Done, 0),)
    with pytest.raises(DiagramError, match=r"trace\[0\]: Ready --settled--> Done"):
        overlay_from_trace(chart_from_table(), bogus)


def test_dot_overlay_highlights_the_path_with_counts(demo: RunResult) -> None:
    chart = chart_from_table()
    overlay = overlay_from_trace(chart, demo.trace, demo.state.value)
    graph = dot_graph(chart, overlay=overlay)
    for edge in chart.edges:
        drawn = graph.get_edge(edge.source, edge.dest)
        counts = [overlay.steps.get((edge.source, ln.trigger, edge.dest), 0) for ln in edge.lines]
        assert (drawn.attr["color"] == "#1d4ed8") is any(counts)
        for text, n in zip(drawn.attr["label"].split("\n"), counts, strict=True):
            assert text.endswith(f" ×{n}") is bool(n)
    for state in chart.states:
        label = graph.get_node(state).attr["label"]
        assert label.endswith(f"×{overlay.states.get(state)}") is (state in overlay.states)
    assert graph.get_node(overlay.final).attr["color"] == "#b91c1c"
    text = render("mermaid", chart, overlay)
    assert isinstance(text, str)
    assert_valid_mermaid(text)
    assert f"Class {overlay.final} s_current" in text
    for state in chart.states:
        shown = f'state "{state} ×{overlay.states[state]}"' if state in overlay.states else ""
        assert (shown or f'state "{state}" as') in text


# -- sequence diagrams --------------------------------------------------------------------------


def test_sequence_diagram_has_a_lane_per_tool_and_crosses_out_errors(demo: RunResult) -> None:
    text = sequence_diagram(demo)
    lines = text.splitlines()
    assert lines[0] == "sequenceDiagram"
    calls = [c for m in demo.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    results = [m for m in demo.messages if isinstance(m, ToolResultMessage)]
    for name in {c.name for c in calls}:
        assert f"  participant tool_{name} as {name}" in lines
    assert sum(ln.startswith("  Model->>tool_") for ln in lines) == len(calls)
    errors = [r for r in results if r.is_error]
    assert sum("--xModel: ✗" in ln for ln in lines) == len(errors)
    assert sum("-->>Model:" in ln for ln in lines) == len(results) - len(errors)
    assert lines[-1].endswith(f"{demo.state.value}: {demo.explanation}")


def test_the_recovery_run_shows_an_error_result(recovery: RunResult) -> None:
    errors = [m for m in recovery.messages if isinstance(m, ToolResultMessage) and m.is_error]
    assert [e.text for e in errors] == ["File not found: src/maths.ts. Did you mean src/math.ts?"]
    assert f"--xModel: ✗ {errors[0].text}" in sequence_diagram(recovery)
    assert recovery.state is TurnState.Done


def test_sequence_diagram_marks_failures_and_aborts_and_escapes_text() -> None:
    messages = (
        UserMessage('say "hi"; then #stop <now>'),
        AssistantMessage((ToolCall("c1", "do-it now", {"x": 1}),), stop_reason=StopReason.ABORTED),
        ToolResultMessage("c1", "do-it now", "Tool call not started", is_error=True),
    )
    result = RunResult(
        state=TurnState.Aborted, messages=messages, error=None, turns=1, explanation="aborted"
    )
    lines = sequence_diagram(result).splitlines()
    assert "  participant tool_do_it_now as do-it now" in lines
    assert "  User->>Model: say #quot;hi#quot;#59; then #35;stop #lt;now#gt;" in lines
    assert any(ln.startswith("  Model--xUser: ✗ aborted") for ln in lines)
    assert "  tool_do_it_now--xModel: ✗ Tool call not started" in lines
    assert lines[-1].endswith("✗ Aborted: aborted")


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


def test_cli_trace_draws_a_run_file(demo: RunResult, tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    run.write_text(json.dumps(run_result_to_dict(demo)), encoding="utf-8")
    assert cli.main(["trace", str(run), "--format", "sequence", "--out", str(tmp_path / "s")]) == 0
    assert (tmp_path / "s").read_text(encoding="utf-8") == sequence_diagram(demo)
    assert cli.main(["trace", str(run), "--out", str(tmp_path / "page.md")]) == 0
    page = (tmp_path / "page.md").read_text(encoding="utf-8")
    assert page.count("```mermaid") == 2
    assert "(page.svg)" in page
    assert (tmp_path / "page.svg").read_text(encoding="utf-8").startswith("<?xml")
    assert cli.main(["trace", str(run), "--out", str(tmp_path / "t.svg")]) == 0
    assert "×" in (tmp_path / "t.svg").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "is not JSON"),
        ('{"format": "x"}', "run.format"),
    ],
)
def test_cli_trace_explains_a_bad_run_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    run = tmp_path / "run.json"
    if content is not None:
        run.write_text(content, encoding="utf-8")
    assert cli.main(["trace", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trace: ")
    assert message in err


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


# -- journals ------------------------------------------------------------------------------------


@pytest.fixture
def journaled(tmp_path: Path) -> tuple[Path, RunResult]:
    """A journal of the demo model's run on a one-file workspace, and the run."""
    import asyncio

    from statemachine.cli.demo import PROMPT, demo_model
    from statemachine.journal import _journal
    from statemachine.workspace import workspace_tools

    (tmp_path / "README.md").write_text("# hello\n", encoding="utf-8")
    path = tmp_path / "run.jsonl"
    with _journal.Journal(path) as journal:
        result = asyncio.run(
            _journal.run_agent_journaled(
                journal=journal,
                model=demo_model(),
                tools=workspace_tools(tmp_path),
                messages=[UserMessage(PROMPT)],
                run_id="journaled",
            )
        )
    return path, result


def test_trace_reads_a_journal_by_replaying_it(
    journaled: tuple[Path, RunResult], tmp_path: Path
) -> None:
    from statemachine._runs import _JOURNAL_FORMAT
    from statemachine.journal import _journal

    assert _JOURNAL_FORMAT == _journal.FORMAT
    path, result = journaled
    out = tmp_path / "seq.mmd"
    assert cli.main(["trace", str(path), "--format", "sequence", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == sequence_diagram(result)
    assert cli.main(["trace", str(path), "--format", "dot", "--out", str(tmp_path / "p.dot")]) == 0
    chart = chart_from_table()
    overlay = overlay_from_trace(chart, result.trace, result.state.value)
    assert (tmp_path / "p.dot").read_text(encoding="utf-8") == render("dot", chart, overlay)


def test_a_damaged_journal_is_refused_with_its_line(
    journaled: tuple[Path, RunResult], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = journaled
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:10], encoding="utf-8")
    assert cli.main(["trace", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trace: journal line {len(lines)}: not valid JSON")
    path.write_text('{"format": "statemachine-journal", "version": 1}\n', encoding="utf-8")
    assert cli.main(["trace", str(path)]) == 2
    assert capsys.readouterr().err.startswith("trace: journal line 1: bad header")
