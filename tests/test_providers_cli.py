"""``python -m statemachine run`` against the loopback server, with the workspace tools.

The key is set in the environment and must reach the server, yet never appear in
anything the command prints, transcript or logs.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from providers_server import LoopbackServer, Reply, sse

import statemachine as sm
import statemachine.messages
from statemachine.agent.events import (
    MessageAdded,
    TurnStarted,
)
from statemachine.cli import main
from statemachine.cli.run import _Transcript
from statemachine.providers import RedactSecrets

OPENAI_KEY = "sk-live-cli-0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-cli-0123456789abcdef"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "README.md").write_text("# Demo\nhello from the readme\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "index.ts").write_text("export {}\n")
    return tmp_path


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)


def run(*argv: str) -> int:
    return main(["run", *argv])


def run_openai(server: LoopbackServer, workspace: Path, *argv: str) -> int:
    """``run`` with the gpt-4o-mini model of the loopback server, on ``workspace``."""
    provider = ("--provider", "openai", "--base-url", server.url + "/v1")
    return run(*provider, "--model", "gpt-4o-mini", "--dir", str(workspace), *argv)


def test_openai_run_streams_the_transcript_and_ends_done(
    server: LoopbackServer, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.add(
        sse("openai/parallel_tool_calls.sse"),
        sse("openai/single_tool_call.sse"),
        sse("openai/text_stream.sse"),
    )
    code = run_openai(server, workspace, "--max-turns", "4", "list the files")
    out, err = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    assert "user: list the files" in lines
    assert "assistant: Let me look." in lines
    assert '  -> list_files {"path": "src"}' in lines
    assert "  result (list_files): src/index.ts" in lines
    assert "  result (read_file): # Demo" in lines
    assert "assistant: The workspace contains README.md and src/index.ts." in lines
    assert lines[-2] == "final state: Done after 3 model call(s)"
    # Messages appear in history order: the call, then its results, then the answer.
    order = [
        lines.index("assistant: Let me look."),
        lines.index("  result (list_files): src/index.ts"),
        lines.index('  -> read_file {"path": "README.md"}'),
        lines.index("  result (read_file): # Demo"),
        lines.index("assistant: The workspace contains README.md and src/index.ts."),
    ]
    assert order == sorted(order)
    assert OPENAI_KEY not in out + err
    assert server.requests[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert server.bodies()[0]["model"] == "gpt-4o-mini"


def test_anthropic_run_ends_done(
    server: LoopbackServer, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.add(sse("anthropic/single_tool_call.sse"), sse("anthropic/text_stream.sse"))
    code = run(
        "--provider",
        "anthropic",
        "--base-url",
        server.url,
        "--model",
        "claude-sonnet-4-5",
        "--system",
        "Be brief.",
        "--dir",
        str(workspace),
        "what is in the readme?",
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert "  result (read_file): # Demo" in out.splitlines()
    assert "final state: Done after 2 model call(s)" in out
    assert ANTHROPIC_KEY not in out + err
    first = server.bodies()[0]
    assert first["system"] == "Be brief."
    assert [t["name"] for t in first["tools"]] == ["list_files", "read_file"]


def test_an_auth_failure_ends_failed_and_the_echoed_key_is_redacted_everywhere(
    server: LoopbackServer, workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"error": {"message": f"Incorrect API key provided: {OPENAI_KEY}.", "code": "x"}}
    server.add(Reply(401, (("Content-Type", "application/json"),), json.dumps(body).encode()))
    code = run_openai(server, workspace, "--verbose", "hi")
    out, err = capsys.readouterr()
    assert code == 1
    assert "final state: Failed after 1 model call(s)" in out
    assert "ProviderAuthError" in out
    assert "Incorrect API key provided: [REDACTED]" in out
    assert "model_call_failed" in err  # --verbose logs went to stderr ...
    assert "[REDACTED]" in err
    assert OPENAI_KEY not in out + err  # ... and neither shows the key
    assert len(server.requests) == 1


def test_a_missing_key_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], workspace: Path
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    code = run("--provider", "anthropic", "--model", "m", "--dir", str(workspace), "hi")
    assert code == 2
    assert "set ANTHROPIC_API_KEY" in capsys.readouterr().err


def test_a_local_openai_compatible_server_needs_no_key(
    monkeypatch: pytest.MonkeyPatch,
    server: LoopbackServer,
    workspace: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    server.add(sse("openai/text_stream.sse"))
    code = run(
        "--provider", "openai", "--base-url", server.url + "/v1", "--model", "llama3",
        "--dir", str(workspace), "hi",
    )  # fmt: skip
    assert code == 0
    assert "final state: Done" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--provider", "openai", "hi"], "--model"),
        (["--provider", "cohere", "--model", "m", "hi"], "invalid choice"),
        (["--provider", "openai", "--model", "m", "--dir", "/nonexistent/dir", "hi"], "run:"),
        (["--provider", "openai", "--model", "m", "--max-turns", "0", "hi"], "--max-turns"),
    ],
)
def test_bad_usage_exits_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(*argv) == 2
    assert message in capsys.readouterr().err


def test_the_module_entry_point_runs_a_real_process(
    server: LoopbackServer, workspace: Path
) -> None:
    server.add(sse("openai/text_stream.sse"))
    env = {**os.environ, "OPENAI_API_KEY": OPENAI_KEY}
    done = subprocess.run(
        [sys.executable, "-m", "statemachine", "run", "--provider", "openai",
         "--base-url", server.url + "/v1", "--model", "gpt-4o-mini",
         "--dir", str(workspace), "hi"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "assistant: The workspace contains README.md and src/index.ts." in done.stdout
    assert OPENAI_KEY not in done.stdout + done.stderr


def test_redact_secrets_processor_cleans_nested_values_and_sensitive_keys() -> None:
    processor = RedactSecrets([OPENAI_KEY])
    event = processor(
        None,
        "warning",
        {
            "event": f"failed with {OPENAI_KEY}",
            "headers": {"Authorization": f"Bearer {OPENAI_KEY}", "accept": "json"},
            "api_key": "anything",
            "attempts": [f"x{OPENAI_KEY}x", 3],
            "error": ValueError(f"key {OPENAI_KEY}"),
        },
    )
    assert event == {
        "event": "failed with [REDACTED]",
        "headers": {"Authorization": "[REDACTED]", "accept": "json"},
        "api_key": "[REDACTED]",
        "attempts": ["x[REDACTED]x", 3],
        "error": "ValueError: key [REDACTED]",
    }


def test_the_transcript_prints_the_event_stream_after_the_streamed_text() -> None:
    out = io.StringIO()
    transcript = _Transcript(out, [OPENAI_KEY])
    transcript.show(sm.UserMessage("hi"))
    transcript.stream_text("Let me ")
    transcript.stream_text("look.")
    call = sm.ToolCall("c1", "list_files", {})
    streamed = sm.AssistantMessage(
        [sm.TextContent("Let me look."), call], stop_reason=sm.messages.StopReason.TOOL_USE
    )
    transcript.event(MessageAdded(1, streamed))  # its text was streamed: not again
    transcript.event(MessageAdded(2, sm.ToolResultMessage("c1", "list_files", "a\nb")))
    transcript.event(TurnStarted(2))
    transcript.event(MessageAdded(3, sm.AssistantMessage(f"not streamed {OPENAI_KEY}")))
    transcript.stream_text("cut")
    transcript.event(TurnStarted(3))  # a call that ended without a message ends the line
    assert out.getvalue().splitlines() == [
        "user: hi",
        "assistant: Let me look.",
        "  -> list_files {}",
        "  result (list_files): a",
        "    b",
        "assistant: not streamed [REDACTED]",
        "assistant: cut",
    ]
