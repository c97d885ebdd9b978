"""The bridge: the kit drives agent loops running in other processes and languages.

The peers are tiny loops written for these tests (``tests/bridge_peers``): one that
conforms and one with a classic defect, in Node.js and in Python. Searches use fixed
seeds and few examples so the suite stays fast; ``hang_limit`` is short because a
peer in another process cannot cancel a hanging scripted call, only abort it.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from statemachine import (
    AbortSignal,
    InvalidInputError,
    Message,
    StateMachineError,
    Tool,
    ToolResultMessage,
)
from statemachine.testing import (
    ModelTurn,
    Scenario,
    ScriptedCall,
    check_record,
    run_conformance,
    run_scenario,
)
from statemachine.testing.bridge import (
    PROTOCOL_VERSION,
    BridgeError,
    BridgeLoop,
    BridgeProtocolError,
    BridgeTimeoutError,
    bridge_loop,
)
from statemachine.testing.scenario import (
    AbortAt,
    AbortKind,
    ToolBehaviour,
)
from statemachine.testing.strategies import scenarios
from statemachine.testing.world import (
    Scripted,
)

PEERS = Path(__file__).parent / "bridge_peers"
PYTHON_OK = [sys.executable, str(PEERS / "conforming_loop.py")]
PYTHON_BROKEN = [sys.executable, str(PEERS / "broken_loop.py")]
NODE_OK = ["node", str(PEERS / "conforming_loop.mjs")]
NODE_BROKEN = ["node", str(PEERS / "broken_loop.mjs")]

# The broken peers' defects need no abort, so their searches skip hangs (each costs a
# hang_limit per run) and long scripts: the shrink then takes a few dozen runs.
SMALL = scenarios(max_responses=2, hangs=False)
ONE_CALL = Scenario(turns=[ModelTurn(calls=[ScriptedCall()], stop_reason="toolUse")])
HELLO = f'{{"type": "hello", "protocol": {PROTOCOL_VERSION}}}'


def _python_peer(source: str) -> list[str]:
    return [sys.executable, "-c", source]


@pytest.mark.parametrize("command", [PYTHON_OK, NODE_OK], ids=["python", "node"])
def test_a_conforming_peer_runs_one_scenario(command: list[str]) -> None:
    record = run_scenario(bridge_loop(command), ONE_CALL)
    assert record.error is None
    assert record.transcript is not None
    assert [m.role for m in record.transcript] == ["user", "assistant", "toolResult", "assistant"]
    assert [ex.how for ex in record.executions] == ["returned"]


@pytest.mark.parametrize("command", [PYTHON_OK, NODE_OK], ids=["python", "node"])
def test_a_peer_hears_the_abort_and_forwards_it(command: list[str]) -> None:
    scenario = Scenario(
        turns=[ModelTurn(calls=[ScriptedCall(), ScriptedCall()], stop_reason="toolUse")],
        abort=AbortAt(AbortKind.TOOL_START, turn=1, call=0),
    )
    record = run_scenario(bridge_loop(command), scenario)
    assert record.error is None
    assert record.transcript is not None
    assert [ex.how for ex in record.executions] == ["aborted"]
    results = [m for m in record.transcript if isinstance(m, ToolResultMessage)]
    assert [r.is_error for r in results] == [True, True]
    assert record.model_calls_after_abort == 0


@pytest.mark.parametrize("command", [PYTHON_OK, NODE_OK], ids=["python", "node"])
def test_a_peer_cancels_a_model_call_and_a_tool_that_hang(command: list[str]) -> None:
    # The peer's 'cancel' cancels the kit-side call, as an in-process loop cancels its
    # task: nothing waits for the hang limit (I6 would report that), and the peer gets
    # an answer to what it cancelled.
    model_hang = Scenario(
        turns=[ModelTurn(calls=[ScriptedCall()], stop_reason="toolUse", on_abort="hang")],
        abort=AbortAt(AbortKind.MODEL_CALL, turn=1),
    )
    tool_hang = Scenario(
        turns=[
            ModelTurn(
                calls=[ScriptedCall(behaviour=ToolBehaviour(on_abort="hang"))],
                stop_reason="toolUse",
            )
        ],
        abort=AbortAt(AbortKind.TOOL_START, turn=1, call=0),
    )
    loop = bridge_loop(command)
    record = run_scenario(loop, model_hang, hang_limit=30.0)
    assert record.error is None
    assert not record.model_hang_expired
    assert check_record(record, None, properties=["I6"]) == {}
    record = run_scenario(loop, tool_hang, hang_limit=30.0)
    assert record.error is None
    assert [ex.how for ex in record.executions] == ["cancelled"]
    assert check_record(record, None, properties=["I6"]) == {}
    assert record.transcript is not None
    [result] = [m for m in record.transcript if isinstance(m, ToolResultMessage)]
    assert result.is_error


def test_an_abort_from_another_thread_reaches_the_peer() -> None:
    # A person pressing stop aborts from a UI thread: the bridge hands the abort to
    # its event loop, which forwards it to the peer and to the running tool.
    scenario = Scenario(
        turns=[
            ModelTurn(calls=[ScriptedCall(behaviour=ToolBehaviour(ticks=5))], stop_reason="toolUse")
        ]
    )
    scripted = Scripted(scenario)
    inner = scripted.tools[0]

    async def execute(arguments: dict[str, Any], signal: AbortSignal) -> Any:
        elsewhere = threading.Thread(target=scripted.controller.abort, args=("stop pressed",))
        elsewhere.start()
        elsewhere.join()  # the abort has happened, on another thread, before the tool runs
        return await inner.execute(arguments, signal)

    tools = (Tool(inner.definition, execute), *scripted.tools[1:])

    async def go() -> list[Any]:
        loop = bridge_loop(PYTHON_OK)
        return await loop(
            model=scripted.model,
            tools=tools,
            messages=list(scenario.history),
            max_turns=8,
            signal=scripted.signal,
        )

    transcript = asyncio.run(go())
    assert [ex.how for ex in scripted.executions] == ["aborted"]
    assert isinstance(transcript[-1], ToolResultMessage)
    assert transcript[-1].is_error
    assert scripted.model.calls == 1


@pytest.mark.parametrize("command", [PYTHON_OK, NODE_OK], ids=["python", "node"])
def test_conforming_peers_pass_run_conformance(command: list[str]) -> None:
    report = run_conformance(bridge_loop(command), max_examples=12, seed=7, hang_limit=0.1)
    assert report.passed, report.summary()


def test_the_broken_python_peer_fails_with_a_shrunk_counterexample() -> None:
    report = run_conformance(
        bridge_loop(PYTHON_BROKEN), max_examples=60, seed=7, scenarios=SMALL, max_shrink_runs=40
    )
    assert not report.passed
    failure = report.failures[0]
    # The peer decides by the stop reason. Shrunk to the defect itself, one response:
    # a call under another stop reason goes unanswered (I1), or a toolUse response
    # without calls makes it call the model again (I3).
    assert len(failure.scenario.turns) == 1
    turn = failure.scenario.turns[0]
    if failure.property == "I1":
        assert "has no result" in failure.sentence
        assert len(turn.calls) == 1
        assert turn.stop_reason.value != "toolUse"
    else:
        assert failure.property == "I3"
        assert "it should have stopped after 1" in failure.sentence
        assert turn.calls == ()
        assert turn.stop_reason.value == "toolUse"
    assert f"{failure.property} {failure.title} is violated" in report.summary()


def test_the_broken_node_peer_fails_with_a_shrunk_counterexample() -> None:
    report = run_conformance(
        bridge_loop(NODE_BROKEN), max_examples=60, seed=7, scenarios=SMALL, max_shrink_runs=40
    )
    assert not report.passed
    assert "I3" in report.failed_properties
    failure = next(f for f in report.failures if f.property == "I3")
    assert "arguments fail the tool's JSON Schema" in failure.sentence
    assert len(failure.scenario.turns) == 1
    assert [c.valid_arguments for c in failure.scenario.turns[0].calls] == [False]


# -- misbehaving peers: a clear error, never a hang ---------------------------------------


def _error(command: list[str], *, silence_timeout: float = 5.0) -> str:
    record = run_scenario(bridge_loop(command, silence_timeout=silence_timeout), ONE_CALL)
    assert not record.timed_out  # the bridge's own error, not the kit's whole-run timeout
    assert record.error is not None
    return record.error


def test_a_silent_peer_times_out_with_a_clear_error() -> None:
    error = _error(_python_peer("import time; time.sleep(60)"), silence_timeout=0.3)
    assert error.startswith("BridgeTimeoutError")
    assert "sent nothing for 0.3 s" in error


def test_a_peer_that_goes_silent_mid_run_times_out() -> None:
    source = (
        "import sys, time\n"
        f"print({HELLO!r}, flush=True)\n"
        "sys.stdin.readline()\n"
        'print(\'{"type": "modelRequest", "id": "m1", "messages": []}\', flush=True)\n'
        "time.sleep(60)\n"
    )
    error = _error(_python_peer(source), silence_timeout=0.3)
    assert "BridgeTimeoutError" in error
    assert "modelRequest" in error


def test_a_peer_that_writes_no_json_gets_a_protocol_error() -> None:
    source = f"print({HELLO!r}, flush=True); print('hello, kit', flush=True); input()"
    error = _error(_python_peer(source))
    assert error.startswith("BridgeProtocolError")
    assert "not JSON" in error
    assert "hello, kit" in error


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"type": "hello", "protocol": 99}', "speaks protocol 99; this kit speaks 1"),
        ('{"type": "result", "messages": []}', "first line must be a 'hello'"),
        ("[1, 2]", "not an object with a 'type'"),
    ],
)
def test_a_bad_first_line_is_refused(line: str, expected: str) -> None:
    error = _error(_python_peer(f"print({line!r}, flush=True); input()"))
    assert "BridgeProtocolError" in error
    assert expected in error


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"type": "dance"}', "unknown message type 'dance'"),
        ('{"type": "toolExecute", "id": 3, "name": "alpha", "arguments": {}}', "'id' must be"),
        ('{"type": "toolExecute", "id": "x", "name": "alpha", "arguments": []}', "'arguments'"),
        ('{"type": "result", "messages": [{"role": "robot"}]}', "unreadable message"),
    ],
)
def test_a_malformed_message_mid_run_is_refused(line: str, expected: str) -> None:
    source = (
        f"import sys\nprint({HELLO!r}, flush=True)\nsys.stdin.readline()\n"
        f"print({line!r}, flush=True)\ninput()\n"
    )
    error = _error(_python_peer(source))
    assert "BridgeProtocolError" in error
    assert expected in error


def test_a_peer_that_exits_early_says_so_with_its_stderr() -> None:
    source = (
        f"import sys; print({HELLO!r}, flush=True)\nsys.stderr.write('boom: no model'); sys.exit(3)"
    )
    error = _error(_python_peer(source))
    assert "exited (code 3) without sending its result" in error
    assert "boom: no model" in error


def test_a_command_that_does_not_exist_is_a_bridge_error() -> None:
    error = _error(["/nonexistent/peer-binary"])
    assert error.startswith("BridgeError")
    assert "cannot start it" in error


def test_the_peer_process_is_gone_after_a_failed_run() -> None:
    loop = bridge_loop(_python_peer("import time; time.sleep(60)"), silence_timeout=0.2)
    scripted = Scripted(ONE_CALL)

    async def go() -> None:
        with pytest.raises(BridgeTimeoutError):
            await loop(
                model=scripted.model,
                tools=scripted.tools,
                messages=list(ONE_CALL.history),
                max_turns=8,
                signal=scripted.signal,
            )

    asyncio.run(go())
    # asyncio.run would warn about, and pytest fail on, a child left unreaped.


def test_bridge_loop_refuses_a_command_string() -> None:
    with pytest.raises(ValueError, match="sequence of arguments"):
        bridge_loop("node peer.mjs")
    with pytest.raises(ValueError, match="silence_timeout"):
        bridge_loop(["node"], silence_timeout=0)
    assert issubclass(BridgeProtocolError, BridgeError)
    assert not issubclass(BridgeTimeoutError, TimeoutError)


# -- the transport: capped lines, process groups, a close that always returns ------------

MISBEHAVING = PEERS / "misbehaving.py"


def _misbehaving(mode: str, pidfile: Path) -> list[str]:
    return [sys.executable, str(MISBEHAVING), mode, str(pidfile)]


def _drive(loop: BridgeLoop) -> tuple[list[Message] | BaseException, float]:
    """Run ``loop`` on ONE_CALL; what it returned or raised, and how long it took."""
    scripted = Scripted(ONE_CALL)

    async def go() -> list[Message]:
        return await loop(
            model=scripted.model,
            tools=scripted.tools,
            messages=list(ONE_CALL.history),
            max_turns=8,
            signal=scripted.signal,
        )

    began = time.monotonic()
    try:
        outcome: list[Message] | BaseException = asyncio.run(go())
    except BridgeError as exc:
        outcome = exc
    return outcome, time.monotonic() - began


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie waiting for its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _grandchild_is_gone(pidfile: Path) -> bool:
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 2.0  # SIGKILL is delivered at once; reaping may lag
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return _gone(pid)


@pytest.mark.timeout(20)
def test_a_line_without_end_hits_the_line_cap(tmp_path: Path) -> None:
    loop = bridge_loop(_misbehaving("endless-line", tmp_path / "pid"), max_line_bytes=64 * 1024)
    outcome, took = _drive(loop)
    assert isinstance(outcome, BridgeProtocolError)
    assert "a line longer than 65536 bytes (max_line_bytes)" in str(outcome)
    assert took < 5.0


@pytest.mark.timeout(20)
def test_a_grandchild_holding_the_pipes_cannot_block_close(tmp_path: Path) -> None:
    # The peer answers and exits; its grandchild keeps stdout open for two minutes.
    outcome, took = _drive(bridge_loop(_misbehaving("grandchild-result", tmp_path / "pid")))
    assert isinstance(outcome, list)
    assert [m.role for m in outcome] == ["user"]
    assert took < 5.0
    assert _grandchild_is_gone(tmp_path / "pid")


@pytest.mark.timeout(20)
def test_a_peer_gone_silent_behind_its_grandchild_times_out_and_is_reaped(
    tmp_path: Path,
) -> None:
    loop = bridge_loop(_misbehaving("grandchild-silent", tmp_path / "pid"), silence_timeout=0.5)
    outcome, took = _drive(loop)
    assert isinstance(outcome, BridgeTimeoutError)
    assert took < 5.0
    assert _grandchild_is_gone(tmp_path / "pid")


@pytest.mark.timeout(20)
def test_the_whole_process_group_is_killed_on_close(tmp_path: Path) -> None:
    # Ignores SIGTERM and the end of its stdin; so does nothing it started.
    loop = bridge_loop(_misbehaving("stubborn", tmp_path / "pid"), silence_timeout=0.5)
    outcome, took = _drive(loop)
    assert isinstance(outcome, BridgeTimeoutError)
    assert took < 5.0
    assert _grandchild_is_gone(tmp_path / "pid")


def test_bridge_errors_belong_to_the_library_hierarchy() -> None:
    assert issubclass(BridgeError, StateMachineError)
    with pytest.raises(InvalidInputError, match="max_line_bytes must be a positive integer"):
        bridge_loop(["node"], max_line_bytes=0)
