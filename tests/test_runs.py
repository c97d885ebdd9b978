"""A finished run, saved and drawn: run files, journals, overlays, sequence diagrams
and the ``trace`` command (statemachine._runs, statemachine.cli.trace)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_diagrams import assert_valid_mermaid, dot_graph

import statemachine.cli as cli
from statemachine import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from statemachine._render import DiagramError, chart_from_table, overlay_from_trace, render
from statemachine._runs import run_result_from_dict, run_result_to_dict, sequence_diagram
from statemachine.agent.events import (
    RunResult,
)
from statemachine.core.engine import TransitionRecord
from statemachine.core.table import Trigger, TurnState
from statemachine.errors import WireFormatError
from statemachine.messages import StopReason
from tools.figures import demo_run, recovery_run

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
        state=TurnState.FAILED,
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
    with pytest.raises(WireFormatError, match=message):
        run_result_from_dict(data)


# -- overlays -----------------------------------------------------------------------------------


def test_overlay_counts_the_states_and_steps_of_the_run(demo: RunResult) -> None:
    chart = chart_from_table()
    overlay = overlay_from_trace(chart, demo.trace, demo.state.value)
    steps = Counter((r.source.value, r.trigger.value, r.dest.value) for r in demo.trace)
    assert overlay.steps == steps
    model_calls = sum(isinstance(m, AssistantMessage) for m in demo.messages)
    assert overlay.states[TurnState.AWAITING_MODEL.value] == model_calls == demo.turns
    assert overlay.states[chart.initial] == 1
    assert overlay.final == demo.state.value


def test_overlay_refuses_a_step_the_table_does_not_have() -> None:
    bogus = (TransitionRecord(TurnState.READY, Trigger.SETTLED, TurnState.DONE, 0),)
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
    assert recovery.state is TurnState.DONE


def test_sequence_diagram_marks_failures_and_aborts_and_escapes_text() -> None:
    messages = (
        UserMessage('say "hi"; then #stop <now>'),
        AssistantMessage((ToolCall("c1", "do-it now", {"x": 1}),), stop_reason=StopReason.ABORTED),
        ToolResultMessage("c1", "do-it now", "Tool call not started", is_error=True),
    )
    result = RunResult(
        state=TurnState.ABORTED, messages=messages, error=None, turns=1, explanation="aborted"
    )
    lines = sequence_diagram(result).splitlines()
    assert "  participant tool_do_it_now as do-it now" in lines
    assert "  User->>Model: say #quot;hi#quot;#59; then #35;stop #lt;now#gt;" in lines
    assert any(ln.startswith("  Model--xUser: ✗ aborted") for ln in lines)
    assert "  tool_do_it_now--xModel: ✗ Tool call not started" in lines
    assert lines[-1].endswith("✗ Aborted: aborted")


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


# -- journals ------------------------------------------------------------------------------------


@pytest.fixture
def journaled(tmp_path: Path) -> tuple[Path, RunResult]:
    """A journal of the demo model's run on a one-file workspace, and the run."""
    import asyncio

    from statemachine import journal as _journal
    from statemachine.cli.demo import PROMPT, demo_model
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
    from statemachine.journal._format import FORMAT

    assert _JOURNAL_FORMAT == FORMAT
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
    # A journal that reads but does not replay to its end: 1, as from 'replay'.
    assert cli.main(["trace", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"trace: journal line {len(lines)}: not valid JSON")
    path.write_text('{"format": "statemachine-journal", "version": 1}\n', encoding="utf-8")
    assert cli.main(["trace", str(path)]) == 2
    assert capsys.readouterr().err.startswith("trace: journal line 1: bad header")
