"""The library logs nothing an application did not ask for (statemachine/_log.py).

Each case runs in a fresh interpreter: the test suite itself configures structlog,
and what matters is what a plain application sees.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A run that logs at every level the library uses: debug transitions, the info line
# of a finished run, and a warning (a repeated tool-call id gets a new one).
_RUN = textwrap.dedent(
    """
    import statemachine as sm
    from statemachine.testing import ScriptedModel

    call = sm.ToolCall(id="same", name="echo", arguments={"text": "hi"})
    model = ScriptedModel(call, call, "done")

    @sm.tool
    async def echo(text: str) -> str:
        "Echo the text."
        return text

    result = sm.run_agent_sync(
        model=model, tools=[echo], messages=[sm.UserMessage("go")], max_turns=5
    )
    assert result.state is sm.TurnState.DONE, result.state
    """
)


def _run(prelude: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(prelude) + _RUN],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.timeout(90)
def test_an_unconfigured_application_sees_nothing() -> None:
    proc = _run("")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == ""


@pytest.mark.timeout(90)
def test_stdlib_logging_at_debug_shows_each_transition_with_its_fields() -> None:
    proc = _run(
        """
        import logging, sys
        logging.basicConfig(
            level=logging.DEBUG, stream=sys.stdout, format="%(name)s %(message)s"
        )
        """
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "event='transition'" in line]
    # 3 model calls, 2 tool calls: at least one line per transition, each with its fields.
    assert len(lines) >= 10, proc.stdout
    first = lines[0]
    assert first.startswith("statemachine ")
    for field in ("from_state='Ready'", "to_state='AwaitingModel'", "trigger='start'", "run_id="):
        assert field in first, first
    # the info and warning events go through logging too, with their fields
    assert any(
        "event='tool_call_id_normalised'" in line and "original='same'" in line
        for line in proc.stdout.splitlines()
    ), proc.stdout
    assert any(
        "event='run_ended'" in line and "state='Done'" in line for line in proc.stdout.splitlines()
    )
    assert proc.stderr == ""


@pytest.mark.timeout(90)
def test_stdlib_logging_at_warning_shows_only_warnings() -> None:
    proc = _run(
        """
        import logging, sys
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s"
        )
        """
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines, "the repeated tool-call id should be logged as a warning"
    assert all(line.startswith("WARNING ") for line in lines), lines
    assert not any("event='transition'" in line for line in lines)


@pytest.mark.timeout(90)
def test_an_application_that_configured_structlog_gets_the_events_there() -> None:
    proc = _run(
        """
        import structlog
        seen = []
        def keep(logger, method, event_dict):
            seen.append(event_dict)
            raise structlog.DropEvent
        structlog.configure(processors=[keep])
        import atexit
        atexit.register(lambda: print(sum(e["event"] == "transition" for e in seen)))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) >= 10
