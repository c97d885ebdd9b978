"""Tests of the demo: ``python -m statemachine demo [DIR]`` (statemachine.cli.demo)."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import structlog

import statemachine as sm
from statemachine.cli.demo import PROMPT, Narrator, cli_demo, demo_model, run_demo
from statemachine.testing import FunctionModel

TRANSITION = re.compile(r"^    (\w+) -> (\w+) +\((\w+), turn (\d+)\)$")


def make_tree(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def demo(root: Path, *, max_turns: int = 8) -> tuple[sm.RunResult, str]:
    out = io.StringIO()
    result = run_demo(root, out, max_turns=max_turns)
    return result, out.getvalue()


def logical_lines(output: str) -> list[str]:
    """The output with wrapped assistant text joined back onto its first line."""
    lines: list[str] = []
    for line in output.splitlines():
        if line.startswith(" " * 12) and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def printed_transitions(output: str) -> list[tuple[str, str, str, int]]:
    return [(m[1], m[2], m[3], int(m[4])) for m in map(TRANSITION.match, output.splitlines()) if m]


def index_of(lines: list[str], prefix: str, start: int = 0) -> int:
    for i in range(start, len(lines)):
        if lines[i].startswith(prefix):
            return i
    raise AssertionError(f"no line starts with {prefix!r} after line {start}")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    make_tree(
        tmp_path,
        {"README.md": "# Project Alpha\n\nSome words.\n", "src/index.ts": "export {};\n"},
    )
    return tmp_path


def test_cli_runs_the_checkpoint_script_on_the_directory(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_demo([str(project)]) == 0
    lines = logical_lines(capsys.readouterr().out)
    assert f"user        {PROMPT}" in lines
    assert "assistant   toolCall list_files {}  (id call_1)  [stopReason: toolUse]" in lines
    assert "toolResult  list_files: README.md | src/index.ts" in lines
    assert (
        'assistant   toolCall read_file {"path": "README.md"}  (id call_2)  [stopReason: toolUse]'
    ) in lines
    assert "toolResult  read_file: # Project Alpha | Some words." in lines
    assert (
        "assistant   The workspace contains 2 files: README.md and src/index.ts. README.md "
        'begins with: "# Project Alpha".  [stopReason: stop]'
    ) in lines
    assert lines[-2:] == [
        "final state: Done after 3 model calls",
        "explanation: The model answered without tool calls: the task is complete.",
    ]


def test_printed_transitions_are_the_runs_trace_in_order(project: Path) -> None:
    result, output = demo(project)
    expected = [(r.source.value, r.dest.value, r.trigger.value, r.turn) for r in result.trace]
    assert printed_transitions(output) == expected
    assert expected[0][:3] == ("Ready", "AwaitingModel", "start")
    assert expected[-1][:3] == ("AwaitingModel", "Done", "model_responded")
    dispatches = [t for t in expected if t[:2] == ("DispatchingTools", "CollectingResults")]
    assert len(dispatches) == 2  # the listing's turn and the reading's turn


def test_messages_and_transitions_are_interleaved_as_they_happen(project: Path) -> None:
    lines = logical_lines(demo(project)[1])
    user = index_of(lines, "user ")
    start = index_of(lines, "    Ready -> AwaitingModel")
    call = index_of(lines, "assistant   toolCall list_files")
    dispatched = index_of(lines, "    DispatchingTools -> CollectingResults", call)
    result = index_of(lines, "toolResult  list_files")
    finished = index_of(lines, "    CollectingResults -> ", result)
    read = index_of(lines, "assistant   toolCall read_file")
    answer = index_of(lines, "assistant   The workspace contains")
    done = index_of(lines, "    AwaitingModel -> Done")
    assert user < start < call < dispatched < result < finished < read < answer < done


def test_history_is_printed_once_per_message(project: Path) -> None:
    result, output = demo(project)
    roles = [line.split()[0] for line in output.splitlines() if re.match(r"^\w+ {2,}", line)]
    assert roles == [m.role for m in result.messages]


def test_the_answer_is_composed_from_the_tool_results(project: Path) -> None:
    first, _ = demo(project)
    (project / "README.md").write_text("Beta edition\n", encoding="utf-8")
    (project / "docs").mkdir()
    (project / "docs" / "guide.md").write_text("guide\n", encoding="utf-8")
    second, _ = demo(project)
    assert first.final_text == (
        "The workspace contains 2 files: README.md and src/index.ts. "
        'README.md begins with: "# Project Alpha".'
    )
    assert second.final_text == (
        "The workspace contains 3 files: README.md, docs/guide.md and src/index.ts. "
        'README.md begins with: "Beta edition".'
    )


def test_without_a_readme_the_first_text_file_is_read(tmp_path: Path) -> None:
    make_tree(tmp_path, {"a.bin": b"\x00\x01", "notes.txt": "remember the milk\n"})
    result, _ = demo(tmp_path)
    assert result.final_text == (
        "The workspace contains 2 files: a.bin and notes.txt. "
        'notes.txt begins with: "remember the milk".'
    )


def test_a_refused_read_is_reported_in_the_answer(tmp_path: Path) -> None:
    make_tree(tmp_path, {"logo.png": b"\x89PNG\x00\x00"})
    result, output = demo(tmp_path)
    assert result.state is sm.TurnState.DONE
    assert "toolResult  read_file (isError): logo.png is a binary file (6 bytes)" in output
    assert result.final_text == (
        "The workspace contains 1 file: logo.png. I could not read logo.png: logo.png is a "
        "binary file (6 bytes); read_file returns text only."
    )


def test_empty_workspace_answers_after_one_listing(tmp_path: Path) -> None:
    result, output = demo(tmp_path)
    assert result.final_text == "The workspace holds no files."
    assert result.turns == 2
    assert "read_file {" not in output


def test_a_cut_listing_says_at_least(tmp_path: Path) -> None:
    make_tree(tmp_path, {f"f{i:03}.txt": "x\n" for i in range(205)})
    result, _ = demo(tmp_path)
    assert result.final_text.startswith(
        "The workspace contains at least 200 files, among them f000.txt, f001.txt,"
    )
    assert "and 192 more." in result.final_text
    assert result.final_text.endswith('f000.txt begins with: "x".')


def test_the_same_workspace_gives_the_same_output(project: Path) -> None:
    assert demo(project)[1] == demo(project)[1]


def test_turn_limit_ends_with_exit_1(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_demo([str(project), "--max-turns", "1"]) == 1
    assert "final state: TurnLimitExceeded after 1 model calls" in capsys.readouterr().out
    result, output = demo(project, max_turns=1)
    assert result.state is sm.TurnState.TURN_LIMIT_EXCEEDED
    assert output.splitlines()[-1] == f"explanation: {result.explanation}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{tmp}/missing"], "demo: directory '{tmp}/missing' does not exist"),
        (["{tmp}/file.txt"], "demo: '{tmp}/file.txt' is not a directory"),
        (["{tmp}", "--max-turns", "0"], "demo: max_turns must be a positive integer, got 0"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "file.txt").write_text("x")
    code = cli_demo([a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 2
    assert capsys.readouterr().err.strip() == message.replace("{tmp}", str(tmp_path))


def test_unknown_option_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_demo(["--frobnicate"]) == 2
    assert "unrecognized arguments: --frobnicate" in capsys.readouterr().err


def test_default_directory_is_the_current_one(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(project)
    assert cli_demo([]) == 0
    lines = logical_lines(capsys.readouterr().out)
    assert lines[0] == f"statemachine demo: the checkpoint script on {project.resolve()}"
    assert any("2 files: README.md and src/index.ts" in line for line in lines)


def test_the_demo_does_not_configure_structlog(project: Path) -> None:
    before = structlog.get_config()
    demo(project)
    assert structlog.get_config() == before


def test_python_dash_m_runs_it(project: Path) -> None:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run(
        [sys.executable, "-m", "statemachine", "demo", str(project)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert 'README.md begins with: "# Project Alpha".' in " ".join(logical_lines(done.stdout))
    missing = subprocess.run(
        [sys.executable, "-m", "statemachine", "demo", str(project / "nope")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr


def _unknown_tool_model() -> FunctionModel:
    """Calls a tool that does not exist, then stops: the engine makes that result."""

    def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> sm.AssistantMessage:
        if isinstance(messages[-1], sm.ToolResultMessage):
            return sm.AssistantMessage("ok")
        return sm.AssistantMessage([sm.ToolCall("x1", "nope", {})])

    return FunctionModel(answer)


def test_results_the_engine_makes_are_narrated_from_the_event_stream() -> None:
    out = io.StringIO()
    narrator = Narrator(out)
    messages = [sm.UserMessage("go")]
    run = sm.AgentRun(model=_unknown_tool_model(), messages=messages, logger=narrator.logger())
    result = asyncio.run(narrator.narrate(run, messages))
    output = out.getvalue()
    lines = output.splitlines()
    results = [line for line in lines if line.startswith("toolResult")]
    assert len(results) == 1
    assert results[0].startswith("toolResult  nope (isError): ")
    roles = [line.split()[0] for line in lines if re.match(r"^\w+ {2,}", line)]
    assert roles == [m.role for m in result.messages]
    expected = [(r.source.value, r.dest.value, r.trigger.value, r.turn) for r in result.trace]
    assert printed_transitions(output) == expected


def test_warnings_are_shown_and_debug_logs_are_not() -> None:
    out = io.StringIO()
    narrator = Narrator(out)
    log = narrator.logger()
    log.debug("transition", from_state="Ready")
    log.info("tool_raised", call_id="c1")
    log.warning("model_call_failed", run_id="r", turn=1, error="boom")
    assert out.getvalue() == "    ! model_call_failed: error=boom, turn=1\n"


def test_scripted_model_without_tools_says_so() -> None:
    result = sm.run_agent_sync(model=demo_model(), messages=[sm.UserMessage(PROMPT)])
    assert result.final_text == "I cannot list the workspace: I have no list_files tool."


def test_the_docs_show_the_demos_real_output(tmp_path: Path) -> None:
    page = (Path(__file__).parent.parent / "docs" / "demo.md").read_text(encoding="utf-8")
    shown = page.split("$ bash run.sh demo /tmp/ws\n", 1)[1].split("```", 1)[0]
    make_tree(tmp_path, {"README.md": "# My project\n", "src/index.ts": "export {};\n"})
    _, output = demo(tmp_path)
    real = output.replace(str(tmp_path.resolve()), "/tmp/ws")
    assert shown == real, (
        "docs/demo.md's demo output drifted; paste the output of `bash run.sh demo /tmp/ws` "
        "(workspace made by the command above it) into it"
    )
