"""Durable runs on DBOS under kill -9: nothing lost, no finished tool run again.

Real worker processes (tests/durable_worker.py) are killed with SIGKILL at random
points of a run of three turns with two parallel tools each, one to three times,
then a last worker finishes the run; its history and trace must be run_agent's. A run
with an output guardrail is killed in the middle of the guardrail's check, one to three
times. The suite runs DURABLE_KILL_TRIALS trials per backend (20 by default, four at a
time; a quarter of that for the typed and the guarded runs);
DURABLE_KILL_SEED picks the kill points. PostgreSQL runs under `bash .ci/postgres.sh` (see
test_durable_dbos.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
else:
    pytest.importorskip("dbos")

from durable_worker import (
    CHECK_DELAY,
    database_urls,
    log_lines,
    reference_run,
    result_json,
    start_worker,
)

from statemachine.durable.dbos import connect

TRIALS = int(os.environ.get("DURABLE_KILL_TRIALS", "20"))
TYPED_TRIALS = max(1, TRIALS // 4)  # with instructions, an output type and limits
PARALLEL = 4  # trials at once
REVIEWED_TRIALS = max(2, TRIALS // 4)  # with an output guardrail, killed in its check
CALLS = [f"t{turn}{side}" for turn in (1, 2, 3) for side in "ab"]
CHECKS = ["r4", "r5"]  # the "reviewed" runs' guardrail checks: turn 4's answer, then 5's
SUMMARIES = ["c5"]  # the "compacted" runs' summarising calls (of five messages)
STEPS = {"reviewed": CHECKS, "compacted": SUMMARIES}  # the logged steps of each mode
COMPACTED_CALLS = ["t1", "t2", "t3", "t4"]
KILLED_IN_CHECKS: list[int] = []  # kills that landed in a step's check, per trial


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """The database URL for a name, on each backend (a fresh database per test)."""
    return database_urls(request.param, tmp_path)  # type: ignore[no-any-return]


def _reference(mode: str = "") -> dict[str, Any]:
    return result_json(reference_run(mode))


def _recorded_calls(db: str, run_id: str) -> set[str]:
    """The tool calls and guardrail checks whose step is recorded in the database."""
    try:
        client = connect(db)
    except Exception:
        return set()  # the database is not made yet
    try:
        steps = client.list_workflow_steps(run_id)
    except Exception:
        return set()  # the run is not in the database yet
    finally:
        client.destroy()
    decided = [
        s["output"][0] for s in steps if s["function_name"] == "statemachine.step" and s["output"]
    ]
    reviews = [d for d in decided if d["step"] == "review"]  # in order: CHECKS
    # A compacted decision's message ends with the summary: "summary of N messages".
    summaries = {f"c{d['message'].split()[-2]}" for d in decided if d["outcome"] == "compacted"}
    return (
        {
            s["output"][0]["callId"]
            for s in steps
            if s["function_name"] == "statemachine.tool" and s["output"]
        }
        | set(CHECKS[: len(reviews)])
        | summaries
    )


def _kill_when(proc: subprocess.Popen[bytes], log: Path, lines: int, extra: float) -> bool:
    """SIGKILL ``proc`` once the log has ``lines`` lines, ``extra`` s later; False if
    it ended on its own first."""
    deadline = time.monotonic() + 60
    while len(log_lines(log)) < lines and proc.poll() is None:
        if time.monotonic() > deadline:
            break
        time.sleep(0.002)
    try:
        proc.wait(timeout=extra)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def _kill_mid_check(
    proc: subprocess.Popen[bytes], log: Path, extra: float, checks: list[str]
) -> bool:
    """SIGKILL ``proc`` ``extra`` s after it began one of the ``checks`` (a step's
    logged work) it has not ended; False if it ended on its own first."""
    pid = str(proc.pid)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        mine = [line for line in log_lines(log) if line[2] == pid and line[1] in checks]
        if {c for what, c, *_ in mine if what == "start"} - {
            c for what, c, *_ in mine if what == "end"
        }:
            break
        time.sleep(0.002)
    try:
        proc.wait(timeout=extra)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def reruns_of_finished_calls(log: Path, processes: list[tuple[int, set[str]]]) -> list[str]:
    """Calls recorded when one process ended that started again in a later one."""
    order = {pid: i for i, (pid, _) in enumerate(processes)}
    problems = []
    for what, call, pid, *_ in log_lines(log):
        if what != "start":
            continue
        for earlier, (_, recorded) in enumerate(processes):
            if order[int(pid)] > earlier and call in recorded:
                problems.append(f"finished call {call} ran again in process {order[int(pid)]}")
    return problems


def _warm(
    db: str, run_id: str, out: Path, log: Path, go: Path, mode: str
) -> tuple[subprocess.Popen[bytes], Path]:
    return start_worker(db, run_id, out, log, mode, DURABLE_GO=str(go)), go


def _trial(
    db: str, tmp: Path, index: int, rng: random.Random, mode: str = ""
) -> tuple[dict[str, Any], list[str]]:
    """One run killed one to three times; its result and any broken promise."""
    run_id = f"run{index}"
    out, log = tmp / f"trial{index}.json", tmp / f"trial{index}.log"
    processes: list[tuple[int, set[str]]] = []  # pid, calls recorded when it ended
    problems: list[str] = []
    kills = rng.choice([1, 1, 2, 3])
    # Each worker is started while the one before runs, and told to go once it is
    # dead: its imports (seconds on a busy machine) are then out of the trial's way.
    ready = _warm(db, run_id, out, log, tmp / f"go{index}-0", mode)
    in_checks = 0
    for attempt in range(kills):
        proc, go = ready
        already = len(log_lines(log))
        go.touch()
        ready = _warm(db, run_id, out, log, tmp / f"go{index}-{attempt + 1}", mode)
        if mode == "reviewed" or (mode == "compacted" and attempt == 0):
            # Within the check: it sleeps CHECK_DELAY between its start and its end.
            extra = rng.uniform(0.0, CHECK_DELAY * 0.8)
            in_checks += _kill_mid_check(proc, log, extra, STEPS[mode])
        elif mode == "compacted":
            # Later kills land anywhere after: once the summary is recorded, the model
            # calls after a recovery must be sent the compacted view it made.
            _kill_when(proc, log, already + rng.randint(0, 3), rng.uniform(0.0, 0.3))
        else:
            _kill_when(proc, log, already + rng.randint(0, 8), rng.uniform(0.0, 0.08))
        processes.append((proc.pid, _recorded_calls(db, run_id)))
    if mode in STEPS:
        KILLED_IN_CHECKS.append(in_checks)
    proc, go = ready
    go.touch()
    if proc.wait(timeout=120) != 0:
        problems.append("the last worker failed")
    processes.append((proc.pid, set()))
    problems += reruns_of_finished_calls(log, processes)
    starts = [line[1] for line in log_lines(log) if line[0] == "start"]
    started = set(starts)
    # -s shows what each trial did: kills, and interrupted calls run again.
    print(f"trial {index}: {len(processes) - 1} kills, {len(starts) - len(started)} re-runs")
    calls = COMPACTED_CALLS if mode == "compacted" else CALLS
    if started != set(calls) | set(STEPS.get(mode, [])):
        problems.append(f"calls started: {sorted(started)}")
    return (json.loads(out.read_text()) if out.exists() else {}), problems


def _trials(
    database: Callable[[str], str], tmp_path: Path, trials: int, mode: str = ""
) -> list[str]:
    """``trials`` runs killed at random points (four at a time): what went wrong."""
    expected = _reference(mode)
    seed = int(os.environ.get("DURABLE_KILL_SEED", "15"))
    urls = [database(f"trial{index}") for index in range(trials)]
    started = time.monotonic()
    # Trials are independent (a database each) and mostly wait on processes: a few
    # run at once.
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        outcomes = list(
            pool.map(
                lambda i: _trial(urls[i], tmp_path, i, random.Random(seed * 1000 + i), mode),
                range(trials),
            )
        )
    failures = []
    for index, (got, problems) in enumerate(outcomes):
        if got.get("state") != "Done":
            problems.append(f"state {got.get('state')}")
        for what in ("messages", "trace", "output"):
            if got.get(what) != expected.get(what):
                problems.append(f"the {what} differs from run_agent's")
        if problems:
            failures.append(f"trial {index}: {'; '.join(problems)}")
    print(f"{trials} trials ({PARALLEL} at once) in {time.monotonic() - started:.1f} s")
    return failures


@pytest.mark.timeout(60 + 30 * TRIALS)
def test_kill_9_at_random_points_loses_nothing_and_reruns_no_finished_tool(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    failures = _trials(database, tmp_path, TRIALS)
    assert not failures, failures


@pytest.mark.timeout(60 + 30 * TYPED_TRIALS)
def test_a_run_with_instructions_an_output_type_and_limits_survives_kill_9(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    """The run names its instructions (a function of its context) and output type in
    the worker's registry and carries its usage limits: after each restart the model
    hears the same instructions, and the output is the typed one run_agent returns."""
    expected = _reference("typed")
    assert expected["output"] == ["Tally", {"turns": 4, "heard": "turn 4: answer with a Tally"}]
    failures = _trials(database, tmp_path, TYPED_TRIALS, "typed")
    assert not failures, failures


@pytest.mark.timeout(60 + 30 * REVIEWED_TRIALS)
def test_a_run_killed_during_its_output_guardrails_check_decides_each_check_once(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    """The guardrail sends the first answer back once: a check that was running when
    its worker died runs again, a check whose decision was recorded never does, and the
    run ends with run_agent's history and trace (the retry and both answers)."""
    expected = _reference("reviewed")
    assert expected["messages"][-1]["content"][0]["text"] == "done after 5 turns"
    KILLED_IN_CHECKS.clear()
    failures = _trials(database, tmp_path, REVIEWED_TRIALS, "reviewed")
    assert not failures, failures
    print(f"kills in a guardrail's check: {KILLED_IN_CHECKS}")
    assert len(KILLED_IN_CHECKS) == REVIEWED_TRIALS
    assert all(KILLED_IN_CHECKS), KILLED_IN_CHECKS  # every trial killed a worker mid-check


@pytest.mark.timeout(60 + 30 * REVIEWED_TRIALS)
def test_a_run_killed_during_its_compactions_summarising_call_summarises_once(
    tmp_path: Path, database: Callable[[str], str]
) -> None:
    """The first kill of each trial lands in the summarising call, the later ones
    anywhere after: a summary that was running runs again, one whose decision was
    recorded never does, and the model calls after a recovery are sent the compacted
    view (its last answer tells the view it was sent, as in run_agent)."""
    expected = _reference("compacted")
    assert expected["messages"][-1]["content"][0]["text"].startswith("sent 5 messages")
    KILLED_IN_CHECKS.clear()
    failures = _trials(database, tmp_path, REVIEWED_TRIALS, "compacted")
    assert not failures, failures
    print(f"kills in a summarising call: {KILLED_IN_CHECKS}")
    assert len(KILLED_IN_CHECKS) == REVIEWED_TRIALS
    assert all(KILLED_IN_CHECKS), KILLED_IN_CHECKS  # every trial killed a worker mid-summary


@pytest.mark.timeout(120)
def test_the_kill_check_catches_a_backend_that_runs_finished_tools_again(tmp_path: Path) -> None:
    db, out, log = f"sqlite:///{tmp_path}/runs.sqlite", tmp_path / "out.json", tmp_path / "log"
    proc = start_worker(db, "broken", out, log, "broken")
    deadline = time.monotonic() + 60
    while not _recorded_calls(db, "broken") and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    processes = [(proc.pid, _recorded_calls(db, "broken"))]
    assert processes[0][1], "no tool call was recorded before the kill"
    proc = start_worker(db, "broken", out, log, "broken")
    assert proc.wait(timeout=60) == 0
    processes.append((proc.pid, set()))
    assert reruns_of_finished_calls(log, processes)
