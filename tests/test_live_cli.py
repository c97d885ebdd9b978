"""``statemachine serve``: the live server from the command line, as a person runs it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ag_ui", reason="the [live] extra is not installed")
pytest.importorskip("ag_ui_validate", reason="ag-ui-validate (the [dev] extra) is not installed")

import httpx2
from live_support import DEADLINE, run_input, sse_events

ROOT = Path(__file__).resolve().parent.parent


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "statemachine", "serve", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.timeout(120)
def test_serve_demo_prints_the_address_serves_a_run_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# A tiny project\n")
    server = _serve("--demo", str(tmp_path), "--port", "0")
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        found = re.fullmatch(r"serve: open (http://127\.0\.0\.1:\d+)/\?token=(\S+)\n", line)
        assert found, line
        url, token = found.groups()
        with httpx2.Client(timeout=DEADLINE) as client:
            assert client.get(url + "/runs").status_code == 401
            assert client.get(f"{url}/?token={token}").status_code == 200
            with client.stream(
                "POST",
                url + "/",
                json=run_input("r1", prompt="list the files"),
                headers={"authorization": f"Bearer {token}"},
            ) as response:
                events = sse_events("".join(response.iter_text()))
        assert events[-1]["type"] == "RUN_FINISHED"
        results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
        assert any("README.md" in r for r in results)
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(DEADLINE)
    assert code == 130


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--demo", "--host", "0.0.0.0"], {}, "access token you chose"),
        (["--demo"], {"STATEMACHINE_LIVE_TOKEN": "short"}, "at least 16"),
        ([], {}, "name an agent"),
        (["no_such_module:agent"], {}, "cannot import"),
    ],
    ids=["other machines", "short token", "no agent", "no module"],
)
def test_serve_refuses_what_it_should_with_one_line_and_exit_2(
    args: list[str], env: dict[str, str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "statemachine", "serve", *args],
        cwd=ROOT,
        env={**os.environ, "STATEMACHINE_LIVE_TOKEN": "", **env},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert done.stderr.startswith("serve: ")
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(60)
def test_without_the_live_extra_the_help_shows_and_serving_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['ag_ui'] = None; sys.modules['uvicorn'] = None\n"
        "from statemachine.cli import main\n"
        "sys.exit(main(sys.argv[1:]))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code, "help", "serve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert shown.returncode == 0, shown.stderr
    assert "the [live] extra's default" in shown.stdout
    refused = subprocess.run(
        [sys.executable, "-c", code, "serve", "--demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert refused.returncode == 2
    assert "pip install 'agent-statemachine[live]'" in refused.stderr
    assert "Traceback" not in refused.stderr
