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
  the same N (the bare loop is the classic teaching loop over dicts: the limit).

Run it as ``python bench/scale.py`` (all contenders, N = 100, 1,000, 10,000) or
``bash bench/run.sh scale``, which writes ``bench/scale.md``. ``--one NAME N`` runs a
single measurement and prints it as JSON (what the full run does in each child).
The peers are not in this table yet: their adapters in ``contenders.py`` keep one
script per agent, which concurrent runs would share.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
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

import statemachine as sm
from statemachine import testing as sm_testing

NS = (100, 1_000, 10_000)
TURNS = 5
LATENCY_S = 0.1
TICK_S = 0.01
TOOL = "echo"


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

    @property
    def ideal_s(self) -> float:
        return self.turns * self.latency_s

    @property
    def turns_per_s(self) -> float:
        return self.n * self.turns / self.wall_s

    @property
    def cpu_us_per_turn(self) -> float:
        return self.cpu_s / (self.n * self.turns) * 1e6


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


# -- the contenders: one coroutine function per run ------------------------------------------

Run = Callable[[int, int, float, Gate], Awaitable[None]]


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
        if turn < turns - 1:
            block = {"type": "toolCall", "id": f"c{turn}", "name": TOOL, "arguments": {}}
            block["arguments"] = {"text": f"{index}:{turn}"}
            assistant: dict[str, Any] = {"role": "assistant", "content": [block]}
        else:
            assistant = {"role": "assistant", "content": [{"type": "text", "text": "done"}]}
        messages.append(assistant)
        calls = [b for b in assistant["content"] if b["type"] == "toolCall"]
        if not calls:
            break
        for call in calls:
            tool = tools.get(call["name"])
            text = await tool(call["arguments"]) if tool else f"Unknown tool: {call['name']}"
            messages.append(
                {
                    "role": "toolResult",
                    "toolCallId": call["id"],
                    "toolName": call["name"],
                    "isError": tool is None,
                    "content": [{"type": "text", "text": text}],
                }
            )
    results = [m for m in messages if m["role"] == "toolResult"]
    if len(results) != turns - 1 or messages[-1]["content"][0]["text"] != "done":
        raise RuntimeError(f"bare run {index} did not do the workload")


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


CONTENDERS: dict[str, Run] = {
    "bare async loop (dicts)": bare_run,
    "statemachine run_agent": ours_run,
}
BASELINE = "bare async loop (dicts)"


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


async def measure(name: str, n: int, turns: int, latency: float) -> Measurement:
    run = CONTENDERS[name]
    gate = Gate(n)
    gc.collect()
    before = rss_bytes()
    lags: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.create_task(_ticker(lags, stop))
    started, cpu_started = time.perf_counter(), time.process_time()
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
    )


def _in_child(name: str, n: int, turns: int, latency: float) -> Measurement:
    """One measurement in a fresh interpreter, so that its peak RSS is its own."""
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--one",
            name,
            str(n),
            "--turns",
            str(turns),
            "--latency",
            str(latency),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} at N={n} failed:\n{proc.stderr[-2000:]}")
    return Measurement(**json.loads(proc.stdout))


# -- the report ---------------------------------------------------------------------------------


def render(cells: Sequence[Measurement], *, when: str) -> str:
    base = {c.n: c for c in cells if c.contender == BASELINE}

    def ratio(value: float, baseline: float) -> str:
        return f"{value / baseline:.2f}x" if baseline > 0 else "n/a"

    lines = [
        "# Many runs at once (bench/scale.py)",
        "",
        f"Measured {when} on {platform.machine()}, Python {platform.python_version()}. "
        f"Each run: {cells[0].turns} model calls of {cells[0].latency_s * 1000:.0f} ms "
        "(asyncio.sleep) and one tool call per turn but the last; N runs start together "
        "in one event loop; each cell in a fresh process. Ratios are against the bare "
        "loop at the same N, measured in the same run.",
        "",
        "| contender | N | wall s | wall / ideal | turns/s | CPU µs/turn | lag p50 ms "
        "| lag p99 ms | peak RSS MiB | KiB per waiting run | wall vs bare | lag p99 vs bare "
        "| KiB/run vs bare |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for c in cells:
        b = base.get(c.n)
        lines.append(
            f"| {c.contender} | {c.n:,} | {c.wall_s:.2f} | {c.wall_s / c.ideal_s:.2f} "
            f"| {c.turns_per_s:,.0f} | {c.cpu_us_per_turn:.0f} "
            f"| {c.lag_p50_ms:.1f} | {c.lag_p99_ms:.1f} "
            f"| {c.peak_rss_mib:.0f} | {c.waiting_kib_per_run:.1f} "
            f"| {ratio(c.wall_s, b.wall_s) if b else 'n/a'} "
            f"| {ratio(c.lag_p99_ms, b.lag_p99_ms) if b else 'n/a'} "
            f"| {ratio(c.waiting_kib_per_run, b.waiting_kib_per_run) if b else 'n/a'} |"
        )
    growth = []
    for name in dict.fromkeys(c.contender for c in cells):
        own = sorted((c for c in cells if c.contender == name), key=lambda c: c.n)
        if len(own) >= 2:
            first, last = own[0], own[-1]
            growth.append(
                f"- {name}: CPU µs per turn {first.cpu_us_per_turn:.0f} at N={first.n:,}, "
                f"{last.cpu_us_per_turn:.0f} at N={last.n:,}: growth "
                f"{last.cpu_us_per_turn / first.cpu_us_per_turn:.2f}"
            )
    if growth:
        lines += ["", "Growth:", "", *growth]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/scale.py", description=__doc__.split("\n")[0])
    parser.add_argument("--ns", type=int, nargs="+", default=list(NS))
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--latency", type=float, default=LATENCY_S)
    parser.add_argument("--only", nargs="+", choices=sorted(CONTENDERS))
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    parser.add_argument("--json", type=Path, help="write the measurements here as JSON")
    parser.add_argument("--one", nargs=2, metavar=("CONTENDER", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        name, n = args.one[0], int(args.one[1])
        cell = asyncio.run(measure(name, n, args.turns, args.latency))
        print(json.dumps(asdict(cell)))
        return 0
    names = args.only or list(CONTENDERS)
    cells: list[Measurement] = []
    for n in args.ns:
        for name in names:
            cell = _in_child(name, n, args.turns, args.latency)
            print(
                f"{name:28} N={n:>6,}: {cell.wall_s:6.2f} s, lag p99 "
                f"{cell.lag_p99_ms:7.1f} ms, {cell.waiting_kib_per_run:6.1f} KiB/run",
                file=sys.stderr,
            )
            cells.append(cell)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    report = render(cells, when=when)
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    else:
        sys.stdout.write(report)
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in cells], indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
