"""Many runs at once in one process: what a service holding slow conversations pays.

Every run of the workload is ``turns`` model calls; each call waits ``latency``
seconds (``asyncio.sleep``, as a real model call waits on the network), calls
0..turns-2 ask for one ``echo`` tool call and the last answers ``done``. ``N`` such
runs start together in one event loop. Each (contender, N) is measured in a fresh
Python process, so peak RSS belongs to that measurement alone.

What is reported, per contender and N:

- wall time from the start of the first run to the end of the last, and its ratio
  to the ideal (``turns * latency``: every model call waiting in parallel);
- turns per second (``N * turns / wall``), and the process's CPU time per turn,
  whose growth from the smallest N to the largest shows a cost that is not linear;
- event-loop lag: a ticker asks to wake every 10 ms; the lag is how late it woke
  (p50 and p99 over the measurement), which is what every other task on the loop
  feels while the runs are being driven;
- peak RSS of the process, and the memory each *waiting* run holds: RSS when every
  run waits in its first model call, less RSS before any started, divided by N;
- the ratio of wall time, lag p99 and memory per waiting run to the bare loop's at
  the same N (the bare loop is the classic teaching loop over dicts: the limit), and
  to the floor's: the same dict loop with each operation (the model call, each tool
  call) an asyncio task of its own that reports into an inbox, which is what a loop
  needs to return within a grace period after an abort whatever a tool does (a tool
  awaited in the loop's own task could hold it forever);
- the garbage collector's share: the time spent in collections (``gc.callbacks``, as a
  share of the CPU time) and how many were full ones (generation 2), which scan every
  object of the process. The collector is observed, never configured, for every
  contender alike.

The peers (PydanticAI, the OpenAI Agents SDK, LangGraph) run through their adapters
in ``contenders.py``: the agent is built once, before the clock starts, and shared by
every run, as a service shares it; each run has its own script (a context variable set
in the run's own task) and is checked against the workload from the framework's own
result object, as the sequential harness checks it. A run that does not do the
workload fails the benchmark. A cell that takes longer than the time budget
(``--budget``, 300 s) is cut off and reported as such, and the contender is not run at
larger N; a peer that is not installed is reported as missing.

The report ends with the growth of every figure from one N to the next: 1.00 for a
per-run or per-turn figure means that it does not depend on how many runs there are.

Run it as ``python bench/scale.py`` (all contenders, N = 100, 1,000, 10,000) or
``bash bench/run.sh scale``, which writes ``bench/scale.md`` (keeping the dated
sections below its marker). ``--gc-young N`` has every cell collect the youngest
generation every N allocations, as a service may choose to. ``--one NAME N`` runs a
single measurement and prints it as JSON (what the full run does in each child).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from contenders import Contender, LangGraph, OpenAIAgents, PacedScript, PydanticAI
from harness import versions, with_kept_sections
from workload import problems

import statemachine as sm
from statemachine import testing as sm_testing

NS = (100, 1_000, 10_000)
TURNS = 5
LATENCY_S = 0.1
TICK_S = 0.01
TOOL = "echo"
BUDGET_S = 300.0


@dataclass
class Measurement:
    contender: str
    n: int
    turns: int
    latency_s: float
    wall_s: float
    cpu_s: float
    lag_p50_ms: float
    lag_p99_ms: float
    peak_rss_mib: float
    waiting_kib_per_run: float
    load_1m: float = 0.0  # the machine's load average when the cell started
    gc_s: float = 0.0  # CPU seconds spent in garbage collections, all generations
    gc_full: int = 0  # how many of them were full (generation 2) collections
    gc_young: int = 0  # the youngest generation's threshold in the cell (gc.get_threshold)

    @property
    def ideal_s(self) -> float:
        return self.turns * self.latency_s

    @property
    def turns_per_s(self) -> float:
        return self.n * self.turns / self.wall_s

    @property
    def cpu_us_per_turn(self) -> float:
        return self.cpu_s / (self.n * self.turns) * 1e6

    @property
    def gc_share(self) -> float:
        """The share of the CPU time spent in garbage collections."""
        return self.gc_s / self.cpu_s if self.cpu_s > 0 else 0.0


class GcWatch:
    """The CPU time of the garbage collections made while it is installed
    (``gc.callbacks``), and how many of them were full."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: Mapping[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
            return
        self.seconds += time.process_time() - self._started
        self.full += info["generation"] == 2

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class Gate:
    """Counts the runs that reached their first model call; samples RSS when all have."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.entered = 0
        self.rss_waiting = 0

    def first_call(self) -> None:
        self.entered += 1
        if self.entered == self.n:
            self.rss_waiting = rss_bytes()


def rss_bytes() -> int:
    """The process's resident set now (Linux: /proc/self/statm, in pages)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize()


@dataclass
class Missing:
    """A cell that has no figures: not installed, cut off by the budget, or failed."""

    contender: str
    n: int
    reason: str


# -- the contenders: one coroutine function per run ------------------------------------------

Run = Callable[[int, int, float, Gate], Awaitable[None]]
Maker = Callable[[], Run]  # builds what the runs share (untimed), returns the run


def _dict_answer(index: int, turn: int, turns: int) -> dict[str, Any]:
    """The dict loops' model answer at ``turn``: a tool call, or "done" at the last."""
    if turn < turns - 1:
        block = {"type": "toolCall", "id": f"c{turn}", "name": TOOL, "arguments": {}}
        block["arguments"] = {"text": f"{index}:{turn}"}
        return {"role": "assistant", "content": [block]}
    return {"role": "assistant", "content": [{"type": "text", "text": "done"}]}


async def _dict_result(
    call: dict[str, Any], tools: Mapping[str, Callable[[Mapping[str, Any]], Awaitable[str]]]
) -> dict[str, Any]:
    """The dict loops' tool result for ``call``."""
    tool = tools.get(call["name"])
    text = await tool(call["arguments"]) if tool else f"Unknown tool: {call['name']}"
    return {
        "role": "toolResult",
        "toolCallId": call["id"],
        "toolName": call["name"],
        "isError": tool is None,
        "content": [{"type": "text", "text": text}],
    }


async def bare_run(index: int, turns: int, latency: float, gate: Gate) -> None:
    """The classic loop over dicts: await the model, append, run each call in place."""

    async def echo(arguments: Mapping[str, Any]) -> str:
        return str(arguments["text"])

    tools = {TOOL: echo}
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    for turn in range(turns):
        if turn == 0:
            gate.first_call()
        await asyncio.sleep(latency)
        assistant = _dict_answer(index, turn, turns)
        messages.append(assistant)
        calls = [b for b in assistant["content"] if b["type"] == "toolCall"]
        if not calls:
            break
        for call in calls:
            messages.append(await _dict_result(call, tools))
    results = [m for m in messages if m["role"] == "toolResult"]
    if len(results) != turns - 1 or messages[-1]["content"][0]["text"] != "done":
        raise RuntimeError(f"bare run {index} did not do the workload")


async def tasked_run(index: int, turns: int, latency: float, gate: Gate) -> None:
    """The dict loop with what a loop needs to abort a run within a grace period
    whatever its tools do: each operation (the model call, each tool call) is an
    asyncio task of its own, which reports into the run's inbox, read one event at a
    time. What it costs over ``bare_run`` is the floor of any driver so built."""

    async def echo(arguments: Mapping[str, Any]) -> str:
        return str(arguments["text"])

    tools = {TOOL: echo}
    inbox: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()  # referenced until done, as asyncio asks

    def start(operation: Awaitable[None]) -> None:
        task = asyncio.ensure_future(operation)
        running.add(task)
        task.add_done_callback(running.discard)

    async def call_model(turn: int) -> None:
        if turn == 0:
            gate.first_call()
        await asyncio.sleep(latency)
        inbox.put_nowait(("model", _dict_answer(index, turn, turns)))

    async def call_tool(call: dict[str, Any]) -> None:
        inbox.put_nowait(("tool", await _dict_result(call, tools)))

    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    turn, calls, results = 0, [], {}  # results by call id, added in call order
    start(call_model(turn))
    while True:
        kind, message = await inbox.get()
        if kind == "model":
            messages.append(message)
            calls = [b for b in message["content"] if b["type"] == "toolCall"]
            if not calls:
                break
            for call in calls:
                start(call_tool(call))
            continue
        results[message["toolCallId"]] = message
        if len(results) == len(calls):
            messages.extend(results[call["id"]] for call in calls)
            turn, results = turn + 1, {}
            start(call_model(turn))
    results_seen = [m for m in messages if m["role"] == "toolResult"]
    if len(results_seen) != turns - 1 or messages[-1]["content"][0]["text"] != "done":
        raise RuntimeError(f"tasked run {index} did not do the workload")


@sm.tool(name=TOOL, description="Return the text it is given.")
async def _echo(text: str) -> str:
    return text


async def ours_run(index: int, turns: int, latency: float, gate: Gate) -> None:
    """``statemachine.run_agent`` with a fake model that waits like a real one."""
    made = 0

    async def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> sm.AssistantMessage:
        nonlocal made
        turn = made
        made += 1
        if turn == 0:
            gate.first_call()
        await asyncio.sleep(latency)
        if turn < turns - 1:
            return sm.AssistantMessage(
                (sm.ToolCall(f"c{turn}", TOOL, {"text": f"{index}:{turn}"}),)
            )
        return sm.AssistantMessage("done")

    result = await sm.run_agent(
        model=sm_testing.FunctionModel(answer, record=False),
        tools=[_echo],
        messages=[sm.UserMessage("go")],
        max_turns=turns,
    )
    if result.state is not sm.TurnState.DONE or result.turns != turns:
        raise RuntimeError(f"run {index} ended {result.state.value}: {result.explanation}")


def peer(factory: Callable[[], Contender]) -> Maker:
    """A peer's adapter as a scale contender: its agent built once, a script per run."""

    def make() -> Run:
        contender = factory()

        async def run(index: int, turns: int, latency: float, gate: Gate) -> None:
            script = PacedScript(turns, latency=latency, on_first_call=gate.first_call)
            raw = await contender.execute(script)
            found = problems(contender.outcome(raw), script)
            if found:
                raise RuntimeError(f"{contender.name} run {index}: " + "; ".join(found))

        return run

    return make


BASELINE = "bare async loop (dicts)"
FLOOR = "bare loop, a task per operation (dicts)"
CONTENDERS: dict[str, Maker] = {
    BASELINE: lambda: bare_run,
    FLOOR: lambda: tasked_run,
    "statemachine run_agent": lambda: ours_run,
    PydanticAI.name: peer(PydanticAI),
    OpenAIAgents.name: peer(OpenAIAgents),
    LangGraph.name: peer(LangGraph),
}


# -- one measurement ----------------------------------------------------------------------------


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        asked = time.perf_counter()
        await asyncio.sleep(TICK_S)
        lags.append(time.perf_counter() - asked - TICK_S)


def _percentile(values: Sequence[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


async def measure(
    name: str, n: int, turns: int, latency: float, run: Run | None = None
) -> Measurement:
    """N runs of ``name`` at once (``run``: its runs, built already, or built here)."""
    load = os.getloadavg()[0]
    run = run or CONTENDERS[name]()
    gate = Gate(n)
    gc.collect()
    before = rss_bytes()
    lags: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticker(lags, stop))
    started, cpu_started = time.perf_counter(), time.process_time()
    with GcWatch() as collections:
        await asyncio.gather(*(run(i, turns, latency, gate) for i in range(n)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    stop.set()
    await ticker
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return Measurement(
        contender=name,
        n=n,
        turns=turns,
        latency_s=latency,
        wall_s=wall,
        cpu_s=cpu,
        lag_p50_ms=_percentile(lags, 50) * 1000,
        lag_p99_ms=_percentile(lags, 99) * 1000,
        peak_rss_mib=peak_kib / 1024,
        waiting_kib_per_run=max(0, gate.rss_waiting - before) / 1024 / n,
        load_1m=load,
        gc_s=collections.seconds,
        gc_full=collections.full,
        gc_young=gc.get_threshold()[0],
    )


def _in_child(name: str, n: int, args: argparse.Namespace) -> Measurement | Missing:
    """One measurement in a fresh interpreter, so that its peak RSS is its own."""
    command = [sys.executable, __file__, "--one", name, str(n)]
    command += ["--turns", str(args.turns), "--latency", str(args.latency)]
    young = getattr(args, "gc_young", None)
    if young is not None:
        command += ["--gc-young", str(young)]
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=args.budget, check=False
        )
    except subprocess.TimeoutExpired:
        return Missing(name, n, f"cut off: over the {args.budget:.0f} s budget")
    if proc.returncode != 0:
        raise RuntimeError(f"{name} at N={n} failed:\n{proc.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(proc.stdout)
    if "missing" in found:
        return Missing(name, n, found["missing"])
    return Measurement(**found)


# -- the report ---------------------------------------------------------------------------------

FIGURES: tuple[tuple[str, Callable[[Measurement], float]], ...] = (
    ("wall / ideal", lambda c: c.wall_s / c.ideal_s),
    ("turns/s", lambda c: c.turns_per_s),
    ("CPU µs/turn", lambda c: c.cpu_us_per_turn),
    ("lag p50", lambda c: c.lag_p50_ms),
    ("lag p99", lambda c: c.lag_p99_ms),
    ("peak RSS", lambda c: c.peak_rss_mib),
    ("KiB per waiting run", lambda c: c.waiting_kib_per_run),
)


def _ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.2f}x" if baseline > 0 else "n/a"


def _row(c: Measurement, b: Measurement | None) -> str:
    versus = (
        [
            _ratio(c.wall_s, b.wall_s),
            _ratio(c.lag_p99_ms, b.lag_p99_ms),
            _ratio(c.waiting_kib_per_run, b.waiting_kib_per_run),
        ]
        if b
        else ["n/a"] * 3
    )
    return (
        f"| {c.contender} | {c.n:,} | {c.wall_s:.2f} | {c.wall_s / c.ideal_s:.2f} "
        f"| {c.turns_per_s:,.0f} | {c.cpu_us_per_turn:.0f} "
        f"| {c.lag_p50_ms:.1f} | {c.lag_p99_ms:.1f} "
        f"| {c.peak_rss_mib:.0f} | {c.waiting_kib_per_run:.1f} | {' | '.join(versus)} "
        f"| {c.gc_share:.0%} | {c.gc_full} | {c.load_1m:.1f} |"
    )


def growth_rows(cells: Sequence[Measurement | Missing]) -> list[str]:
    """Every figure's growth from each measured N of a contender to its next one."""
    rows = []
    for name in dict.fromkeys(c.contender for c in cells):
        own = sorted(
            (c for c in cells if c.contender == name and isinstance(c, Measurement)),
            key=lambda c: c.n,
        )
        for a, b in itertools.pairwise(own):
            ratios = [_ratio(figure(b), figure(a)) for _, figure in FIGURES]
            rows.append(f"| {name} | {a.n:,} → {b.n:,} | " + " | ".join(ratios) + " |")
    return rows


def floor_rows(measured: Sequence[Measurement]) -> list[str]:
    """Each contender's wall, lag p99 and memory per waiting run against the floor's
    (a task per operation) at the same N; nothing if the floor was not measured."""
    floor = {c.n: c for c in measured if c.contender == FLOOR}
    rows = [
        f"| {c.contender} | {c.n:,} | {_ratio(c.wall_s, floor[c.n].wall_s)} "
        f"| {_ratio(c.lag_p99_ms, floor[c.n].lag_p99_ms)} "
        f"| {_ratio(c.waiting_kib_per_run, floor[c.n].waiting_kib_per_run)} |"
        for c in measured
        if c.n in floor and c.contender not in (BASELINE, FLOOR)
    ]
    if not rows:
        return []
    return [
        "",
        "Against the floor (the dict loop with a task per operation, at the same N):",
        "",
        "| contender | N | wall vs floor | lag p99 vs floor | KiB/run vs floor |",
        "| --- | ---: | ---: | ---: | ---: |",
        *rows,
    ]


def render(
    cells: Sequence[Measurement | Missing], *, when: str, gc_young: int | None = None
) -> str:
    measured = [c for c in cells if isinstance(c, Measurement)]
    base = {c.n: c for c in measured if c.contender == BASELINE}
    first = measured[0]
    peers = ", ".join(f"{k} {v}" for k, v in versions().items() if k != "agent-statemachine")
    lines = [
        "# Many runs at once (bench/scale.py)",
        "",
        f"Measured {when} on {platform.machine()} ({os.cpu_count()} cores), Python "
        f"{platform.python_version()}; {peers}. Each run: {first.turns} model calls of "
        f"{first.latency_s * 1000:.0f} ms (asyncio.sleep) and one tool call per turn but "
        "the last; N runs start together in one event loop; each cell in a fresh process. "
        "Ratios are against the bare loop at the same N, measured in the same run; GC % of "
        "CPU is the CPU time spent in garbage collections over the cell's, full GCs the "
        "collections of the oldest generation (each scans every object); load is "
        "the machine's 1-minute load average when the cell started."
        + (
            ""
            if gc_young is None
            else f" Every cell set gc.set_threshold({gc_young}), as an application may "
            f"(this Python's default: {gc.get_threshold()[0]})."
        ),
        "",
        "| contender | N | wall s | wall / ideal | turns/s | CPU µs/turn | lag p50 ms "
        "| lag p99 ms | peak RSS MiB | KiB per waiting run | wall vs bare | lag p99 vs bare "
        "| KiB/run vs bare | GC % of CPU | full GCs | load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: |",
    ]
    for c in cells:
        if isinstance(c, Missing):
            lines.append(f"| {c.contender} | {c.n:,} | {c.reason} |" + " |" * 13)
        else:
            lines.append(_row(c, base.get(c.n)))
    lines += floor_rows(measured)
    growth = growth_rows(cells)
    if growth:
        lines += [
            "",
            "Growth of each figure from one N to the next (value at the larger N / value at "
            "the smaller). For the per-turn and per-run figures 1.00 is the goal; wall / "
            "ideal and lag grow when the loop cannot keep up; peak RSS grows with N.",
            "",
            "| contender | N | " + " | ".join(label for label, _ in FIGURES) + " |",
            "| --- | --- |" + " ---: |" * len(FIGURES),
            *growth,
        ]
    return "\n".join(lines) + "\n"


def _measure_all(args: argparse.Namespace, names: Sequence[str]) -> list[Measurement | Missing]:
    cells: list[Measurement | Missing] = []
    stopped: dict[str, str] = {}  # contender -> why it is not run at larger N
    for n in args.ns:
        for name in names:
            stop = stopped.get(name)
            cell = _in_child(name, n, args) if stop is None else Missing(name, n, stop)
            if isinstance(cell, Missing):
                # Not installed stays so; a cut-off contender is not run at larger N.
                cut = cell.reason.startswith("cut off")
                stopped.setdefault(name, f"not run: cut off at N={n:,}" if cut else cell.reason)
                print(f"{name:34} N={n:>6,}: {cell.reason}", file=sys.stderr)
            else:
                print(
                    f"{name:34} N={n:>6,}: {cell.wall_s:6.2f} s, lag p99 "
                    f"{cell.lag_p99_ms:7.1f} ms, {cell.waiting_kib_per_run:6.1f} KiB/run, "
                    f"GC {cell.gc_share:.0%} of CPU ({cell.gc_full} full)",
                    file=sys.stderr,
                )
            cells.append(cell)
    return cells


def _one(name: str, n: int, turns: int, latency: float) -> dict[str, Any]:
    try:
        run = CONTENDERS[name]()  # a peer's adapter imports its framework here
    except ModuleNotFoundError as exc:
        return {"missing": f"not installed ({exc.name})"}
    return asdict(asyncio.run(measure(name, n, turns, latency, run)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/scale.py", description=__doc__.split("\n")[0])
    parser.add_argument("--ns", type=int, nargs="+", default=list(NS))
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--latency", type=float, default=LATENCY_S)
    parser.add_argument(
        "--gc-young",
        type=int,
        metavar="N",
        help="as an application may: collect the youngest generation every N allocations "
        "(gc.set_threshold(N)) in every cell alike; default: Python's own threshold",
    )
    parser.add_argument("--only", nargs="+", choices=sorted(CONTENDERS))
    parser.add_argument(
        "--budget", type=float, default=BUDGET_S, help="seconds a cell may take (300)"
    )
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    parser.add_argument("--json", type=Path, help="write the measurements here as JSON")
    parser.add_argument("--one", nargs=2, metavar=("CONTENDER", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        if args.gc_young is not None:
            gc.set_threshold(args.gc_young, *gc.get_threshold()[1:])
        print(json.dumps(_one(args.one[0], int(args.one[1]), args.turns, args.latency)))
        return 0
    cells = _measure_all(args, args.only or list(CONTENDERS))
    if not any(isinstance(c, Measurement) for c in cells):
        print("nothing was measured", file=sys.stderr)
        return 1
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    report = render(cells, when=when, gc_young=args.gc_young)
    write_outputs(report, [asdict(c) for c in cells], args.out, args.json)
    return 0


def write_outputs(
    report: str, rows: Sequence[dict[str, Any]], out: Path | None, json_out: Path | None
) -> None:
    """The report to ``out`` (keeping the dated sections below its marker) or to stdout;
    the measurements to ``json_out`` as JSON."""
    if out:
        out.write_text(with_kept_sections(report, out), encoding="utf-8")
    else:
        sys.stdout.write(report)
    if json_out:
        json_out.write_text(json.dumps(list(rows), indent=1), encoding="utf-8")


if __name__ == "__main__":
    raise SystemExit(main())
