"""A durable-run worker process for the tests/test_durable_*.py (killed -9 at will),
and what those tests share about it.

    python tests/durable_worker.py DB_URL RUN_ID OUT [MODE]

MODE is "" (the run RUN_ID of three turns of two parallel tools), "approvals" (the
same, beta needing a person), "typed" (the same with instructions, an output type and
usage limits, named in the worker's registry), "reviewed" (the same with an output
guardrail whose check is slow and logged, ``reviewed_steps``), "compacted" (four
turns of one tool call, the model's view compacted from the fourth on by a slow,
logged summariser: ``tells_its_view``, ``compacting_steps``), "listening" (the gate, or a tool a
person must approve for a run started with DURABLE_START="approval"; then the model
repeats what the person said), "broken" (tools also run outside their
steps), "gated"
(one tool that waits until the file DURABLE_GATE exists; the model repeats what the
person said; "gated-dies": the same, dying when a message has come, before its
place is recorded), "asking" (one tool, ``ask``, that asks a person for a row and
then waits for the file DURABLE_GATE, if set; the model says what it answered) or
"serve" (no run of its own: it takes runs from the queue "jobs",
first taking over the runs of the workers named in DURABLE_RECOVER; then it makes
the file OUT.ready, and it stops when the file OUT exists). Every other mode starts
RUN_ID (or takes it back after a restart), waits for its result and writes it as
JSON to OUT (with DURABLE_GO set, it first waits for that file to exist). The
worker's executor id is DURABLE_EXECUTOR ("local"), its application version
DURABLE_APP_VERSION (if set). Every tool start and end is appended to the file named
by DURABLE_SIDE_EFFECTS, with the process id and the run id, and synced, so a line
survives a kill.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import statemachine as sm
from statemachine.agent.model import CallOptions
from statemachine.core.tools import ToolDefinition
from statemachine.core.wire import messages_to_dicts
from statemachine.durable import idempotency_key
from statemachine.steps import Step, compaction, output_guardrail
from statemachine.testing import FunctionModel

TURNS = 4  # three turns of two parallel tool calls, then the answer
TOOL_DELAY = 0.04
QUEUE = "jobs"
WORKER = str(Path(__file__).resolve())
ROOT = str(Path(__file__).resolve().parent.parent)


def _log(line: str) -> None:
    path = os.environ.get("DURABLE_SIDE_EFFECTS")
    if not path:
        return
    key = idempotency_key() or ":"
    run_id = key.rsplit(":", 1)[0]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} {os.getpid()} {run_id}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def _side_effect(name: str, x: int) -> str:
    call = sm.current_tool_call()
    assert call is not None
    _log(f"start {call.id}")
    # Different durations: the tools finish in another order than they were called.
    await asyncio.sleep(TOOL_DELAY * (1 + (x + (name == "beta")) % 3))
    _log(f"end {call.id}")
    return f"{name}({x})={x * x if name == 'alpha' else x + 1000}"


@sm.tool
async def alpha(x: int) -> str:
    """Square a number.

    Args:
        x: the number
    """
    return await _side_effect("alpha", x)


@sm.tool
async def beta(x: int) -> str:
    """Add a thousand.

    Args:
        x: the number
    """
    return await _side_effect("beta", x)


TOOLS = [alpha, beta]
CHECK_DELAY = 0.15  # an output guardrail's check: long enough to be killed in


async def review_answer(text: str) -> str | None:
    """The "reviewed" runs' output guardrail check, logged as ``start rN``/``end rN``
    (N: the turn of the answer it judges, from "done after N turns"): the first answer
    is sent back once, keyed by its text (the same after a restart)."""
    label = "r" + text.split()[2]
    _log(f"start {label}")
    await asyncio.sleep(CHECK_DELAY)
    _log(f"end {label}")
    return "count again" if text == f"done after {TURNS} turns" else None


def reviewed_steps() -> list[Step]:
    """The declared steps of the "reviewed" runs."""
    return [output_guardrail("review", review_answer)]


def tells_its_view(
    messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]
) -> sm.AssistantMessage:
    """The "compacted" runs' model, whose answers depend on the view it is sent: one
    tool call a turn, the next after the newest result it sees; at last it says how
    many messages it was sent and how the first begins (a summary, once compacted)."""
    seen = [int(m.tool_call_id[1:]) for m in messages if isinstance(m, sm.ToolResultMessage)]
    turn = 1 + max(seen, default=0)
    if turn > 4:
        first = messages[0]
        text = "".join(b.text for b in first.content if isinstance(b, sm.TextContent))
        return sm.AssistantMessage(f"sent {len(messages)} messages, the first: {text[:40]}")
    return sm.AssistantMessage([sm.ToolCall(f"t{turn}", "alpha", {"x": turn})])


async def summarize(messages: Sequence[sm.Message]) -> str:
    """The "compacted" runs' summariser, logged as ``start cN``/``end cN`` (N: how
    many messages it summarises) and slow enough to be killed in."""
    label = f"c{len(messages)}"
    _log(f"start {label}")
    await asyncio.sleep(CHECK_DELAY if os.environ.get("DURABLE_SIDE_EFFECTS") else 0)
    _log(f"end {label}")
    return f"summary of {len(messages)} messages"


def compacting_steps() -> list[Step]:
    """The declared steps of the "compacted" runs: the view past five messages is a
    summary and the last two."""
    return [compaction(summarize, max_messages=5, keep_last=2)]


def answer(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    """Keyed by the history, not by a call counter: the same after a restart."""
    turn = 1 + sum(isinstance(m, sm.AssistantMessage) for m in messages)
    if turn >= TURNS:
        return sm.AssistantMessage(f"done after {turn} turns")
    return sm.AssistantMessage(
        [
            sm.TextContent(f"turn {turn}: two tools"),
            sm.ToolCall(f"t{turn}a", "alpha", {"x": turn}),
            sm.ToolCall(f"t{turn}b", "beta", {"x": turn}),
        ]
    )


@dataclasses.dataclass
class Tally:
    """The typed output of the "typed" runs."""

    turns: int
    heard: str


def billing_instructions(ctx: sm.RunContext[None]) -> str:
    """Instructions as a function of the run's context: they name the turn."""
    return f"turn {ctx.turn}: answer with a Tally"


TYPED_LIMITS = sm.UsageLimits(requests=10)


def typed_answer(
    messages: Sequence[sm.Message], tools: Sequence[ToolDefinition], options: CallOptions
) -> sm.AssistantMessage:
    """``answer``, saying the instructions it was given at each turn, then ending with
    the final result (its output): a run that lost its instructions or output type
    after a restart has another history."""
    heard = options.instructions or "no instructions"
    turn = 1 + sum(isinstance(m, sm.AssistantMessage) for m in messages)
    if turn >= TURNS:
        arguments = {"turns": turn, "heard": heard}
        return sm.AssistantMessage([sm.ToolCall(f"f{turn}", "final_result", arguments)])
    calls = answer(messages, tools).tool_calls
    return sm.AssistantMessage([sm.TextContent(f"turn {turn} heard: {heard}"), *calls])


def beta_needs_approval(call: sm.ToolCall) -> sm.RequireApproval | None:
    return sm.RequireApproval("beta needs a person") if call.name == "beta" else None


@sm.tool
async def wait_at_gate() -> str:
    """Wait until the gate opens."""
    _log("start g1")
    gate = Path(os.environ["DURABLE_GATE"])
    while not gate.exists():
        await asyncio.sleep(0.01)
    return "opened"


def said(messages: Sequence[sm.Message]) -> str:
    """What the person said so far, joined."""
    texts = [
        block.text
        for m in messages
        if isinstance(m, sm.UserMessage)
        for block in m.content
        if isinstance(block, sm.TextContent)
    ]
    return " | ".join(texts)


def echo(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    """Call the gate once, then repeat what the person said."""
    if not any(isinstance(m, sm.ToolResultMessage) for m in messages):
        return sm.AssistantMessage([sm.ToolCall("g1", "wait_at_gate", {})])
    return sm.AssistantMessage(f"heard: {said(messages)}")


ROW = {"type": "object", "properties": {"row": {"type": "integer"}}, "required": ["row"]}
ANSWERS: list[Any] = []  # what ``ask`` was answered, in this process


async def _ask_row(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
    """Ask a person for a row (as an MCP server's elicitation would), logged as
    ``start c0``, ``answered c0`` and ``end c0``; between the last two it waits until
    the file DURABLE_GATE exists, if that is set."""
    from statemachine.agent.running import ask_person
    from statemachine.hooks import ToolQuestion

    call = sm.current_tool_call()
    assert call is not None
    _log(f"start {call.id}")

    def question(question_id: str, call: sm.ToolCall) -> ToolQuestion:
        return ToolQuestion(question_id, call.id, call.name, "Which row?", ROW, None, "test")

    answer = await ask_person(question, signal)
    ANSWERS.append(answer)
    _log(f"answered {call.id}")
    gate = os.environ.get("DURABLE_GATE")
    while gate and not os.path.exists(gate):
        await asyncio.sleep(0.01)
    _log(f"end {call.id}")
    return repr(answer)


def asking_tool(timeout: float | None = None) -> sm.Tool:
    """The tool ``ask`` (``_ask_row``), with the call timeout ``timeout``."""
    return sm.Tool(sm.ToolDefinition("ask", "Ask a person for a row."), _ask_row, timeout=timeout)


def asks(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    """The "asking" runs: call ``ask`` once, then say what it answered."""
    results = [m.text for m in messages if isinstance(m, sm.ToolResultMessage)]
    if not results:
        return sm.AssistantMessage([sm.ToolCall("c0", "ask", {})])
    return sm.AssistantMessage(f"answered: {results[0]}")


@sm.tool
async def guarded() -> str:
    """A tool a person must approve."""
    return "guarded ran"


def guarded_needs_a_person(call: sm.ToolCall) -> sm.RequireApproval | None:
    return sm.RequireApproval("a person decides") if call.name == "guarded" else None


def listen(messages: Sequence[sm.Message], tools: Sequence[ToolDefinition]) -> sm.AssistantMessage:
    """The "listening" runs: first the gate (or, for a run started with "approval",
    a tool a person must approve), then repeat what the person said."""
    if not any(isinstance(m, sm.AssistantMessage) for m in messages):
        name = "guarded" if said(messages[:1]) == "approval" else "wait_at_gate"
        return sm.AssistantMessage([sm.ToolCall("c1", name, {})])
    return sm.AssistantMessage(f"heard: {said(messages)}")


def _run_tools_outside_their_steps() -> None:
    """A broken backend, for showing that the kill trials' check can fail: every tool
    call also runs outside its step, so a recovery runs finished calls again."""
    from dbos import DBOS

    recorded = DBOS.run_step_async

    async def run_step(options: Any, func: Any, *args: Any) -> Any:
        if options.get("name") == "statemachine.tool":
            await func(*args)
        return await recorded(options, func, *args)

    dbos: Any = DBOS  # typed as DBOS's own; replaced here on purpose
    dbos.run_step_async = run_step


def _die_before_placing_a_message() -> None:
    """Die (as by kill -9) after a message was received and before its place was
    recorded: the narrowest window of the control lane."""
    from dbos import StepReservation

    def run_async(self: Any, options: Any, func: Any, *args: Any) -> Any:
        os._exit(9)

    reservation: Any = StepReservation  # replaced here on purpose
    reservation.run_async = run_async


def launched(runner: Any, body: Callable[[Any], Awaitable[Any]]) -> Any:
    """``body(runner)`` run with ``runner`` (a ``DBOSRunner``) launched, in an event
    loop of its own; the runner destroyed after."""

    async def go() -> Any:
        runner.launch()
        try:
            return await body(runner)
        finally:
            runner.destroy()

    return asyncio.run(go())


def reference_run(mode: str = "") -> sm.RunResult:
    """The run every durable test compares with: the same model and tools, in memory
    (for the mode "typed", with the same instructions, output type and limits; for
    "reviewed" and "compacted", with the same model and steps)."""
    if mode == "typed":
        run = sm.run_agent(
            model=FunctionModel(typed_answer),
            tools=TOOLS,
            messages="go",
            instructions=billing_instructions,
            output_type=Tally,
            usage_limits=TYPED_LIMITS,
        )
    elif mode == "compacted":
        model = FunctionModel(tells_its_view)
        run = sm.run_agent(model=model, tools=TOOLS, messages="go", steps=compacting_steps())
    else:
        steps = reviewed_steps() if mode == "reviewed" else []
        run = sm.run_agent(model=FunctionModel(answer), tools=TOOLS, messages="go", steps=steps)
    return asyncio.run(run)


def replays_to(path: Path, result: sm.RunResult) -> None:
    """The journal at ``path`` replays to ``result``'s state, history and trace, and
    the transcript checker reads it."""
    from statemachine.journal import replay
    from statemachine.testing import check_transcript

    replayed = replay(path)
    assert replayed.ok
    assert replayed.state is result.state
    assert replayed.messages == result.messages
    assert replayed.trace == result.trace
    assert check_transcript(list(replayed.messages)) == []


def result_json(result: sm.RunResult) -> dict[str, Any]:
    """State, history, trace (and the typed output of a run that has one)."""
    found: dict[str, Any] = {
        "state": result.state.value,
        "messages": messages_to_dicts(result.messages),
        "trace": [[r.source.value, r.trigger.value, r.dest.value, r.turn] for r in result.trace],
    }
    output = result.output  # a text run's is its final text, already in the messages
    if output is not None and dataclasses.is_dataclass(output) and not isinstance(output, type):
        found["output"] = [type(output).__name__, dataclasses.asdict(output)]
    return found


def _model_of(mode: str) -> Any:
    models = {
        "typed": typed_answer,
        "listening": listen,
        "gated": echo,
        "gated-dies": echo,
        "compacted": tells_its_view,
        "asking": asks,
    }
    return models.get(mode, answer)


def _hook_of(mode: str) -> Any:
    hooks = {"approvals": beta_needs_approval, "listening": guarded_needs_a_person}
    return hooks.get(mode)


def _tools_of(mode: str) -> list[sm.Tool]:
    if mode == "listening":
        return [wait_at_gate, guarded]
    if mode.startswith("gated"):
        return [wait_at_gate]
    return [asking_tool()] if mode == "asking" else TOOLS


async def main(db_url: str, run_id: str, out: str, mode: str) -> None:
    from statemachine.durable.dbos import DBOSRunner

    if mode == "broken":
        _run_tools_outside_their_steps()
    if mode == "gated-dies":
        _die_before_placing_a_message()
    listening = mode == "listening"
    typed = mode == "typed"
    # Only a typed worker has more in its registry: the others keep the version the
    # tests' own runners have.
    registry: dict[str, Any] = {}
    if typed:
        registry = {
            "instructions": {"billing": billing_instructions},
            "output_types": {"tally": Tally},
        }
    runner = DBOSRunner(
        models={"scripted": FunctionModel(_model_of(mode))},
        tools=_tools_of(mode),
        database_url=db_url,
        before_tool_call=_hook_of(mode),
        notification_interval=0.05 if listening else 0.1,
        executor_id=os.environ.get("DURABLE_EXECUTOR", "local"),
        queues={QUEUE: 2} if mode == "serve" else None,
        app_version=os.environ.get("DURABLE_APP_VERSION") or None,
        steps={"reviewed": reviewed_steps, "compacted": compacting_steps}.get(mode, list)(),
        **registry,
    )
    runner.launch()
    try:
        if mode == "serve":
            dead = [e for e in os.environ.get("DURABLE_RECOVER", "").split(",") if e]
            await runner.recover(dead)
            Path(out + ".ready").touch()
            while not os.path.exists(out):
                await asyncio.sleep(0.05)
            return
        options: dict[str, Any] = {"model": "scripted"}
        if typed:
            options = {"model": "scripted", "instructions": "billing", "output_type": "tally"}
            options["usage_limits"] = TYPED_LIMITS
        start = os.environ.get("DURABLE_START", "go")
        handle = await runner.start(run_id, messages=start, **options)
        result = await handle.result()
    finally:
        runner.destroy()
    with open(out + ".tmp", "w") as f:
        json.dump(result_json(result), f)
    os.replace(out + ".tmp", out)


# -- what the tests use to drive worker processes -------------------------------------------

POSTGRES = os.environ.get("STATEMACHINE_TEST_POSTGRES")


def database_urls(backend: str, tmp_path: Path) -> Any:
    """The ``database`` fixture's value: a function from a name to the URL of a fresh
    database of that name on ``backend`` (call it from a pytest fixture)."""
    import pytest

    if backend == "sqlite":
        return lambda name: f"sqlite:///{tmp_path}/{name}.sqlite"
    if not POSTGRES:
        if os.environ.get("CI") == "true":
            pytest.fail("under CI the PostgreSQL tests must run: use bash .ci/postgres.sh")
        # A developer machine without a server: the SQLite case of the same test still
        # runs; CI (above) never skips, since .ci/run starts PostgreSQL for it.
        pytest.skip("no PostgreSQL: run under bash .ci/postgres.sh to include it")
    prefix = f"sm_{os.urandom(6).hex()}"

    def url(name: str) -> str:
        # A fresh database per name, made here: a handle may connect before any worker.
        import psycopg

        assert POSTGRES is not None
        server = POSTGRES.replace("+psycopg", "") + "/postgres"
        with psycopg.connect(server, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{prefix}_{name}"')
        return f"{POSTGRES}/{prefix}_{name}"

    return url


def start_worker(
    db: str,
    run_id: str,
    out: Path,
    log: Path,
    mode: str = "",
    errors: Path | None = None,
    **env: str,
) -> subprocess.Popen[bytes]:
    """A worker process; its stderr goes to the file ``errors`` if given."""
    environment = dict(os.environ, DURABLE_SIDE_EFFECTS=str(log), PYTHONPATH=ROOT, **env)
    with open(errors or os.devnull, "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, WORKER, db, run_id, str(out), mode],
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def log_lines(log: Path) -> list[list[str]]:
    """The side-effect log: [what, call id, pid, run id] per line."""
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def wait_for_log(log: Path, lines: int, proc: subprocess.Popen[bytes], limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while len(log_lines(log)) < lines and proc.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"the worker logged {len(log_lines(log))} lines, not {lines}")
        time.sleep(0.002)


def _wait_for_go() -> None:
    """With DURABLE_GO set: import everything, then wait until that file exists (a
    test starts the next worker while the current one runs, to save the imports)."""
    go = os.environ.get("DURABLE_GO")
    if not go:
        return
    import statemachine.durable.dbos  # noqa: F401 - imported now, used at go

    while not os.path.exists(go):
        time.sleep(0.002)


if __name__ == "__main__":
    mode = sys.argv[4] if len(sys.argv) > 4 else ""
    _wait_for_go()
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], mode))
