"""The benchmark harness: every contender, every N, one process, one run.

Run it through ``bash bench/run.sh`` (which builds ``bench/.venv`` with the pinned
peers); ``--smoke`` runs N=10 once per contender, which is what the test suite does.

What is measured, per contender and N (see bench/README.md for the why):

- µs per turn: wall time of one whole agent run divided by N; the median over the
  repetitions, with the min and max;
- growth: the median of the last 100 turn intervals over the median of the first
  100 (fewer when N < 200), where a turn interval is the time between two model calls
  as stamped inside the scripted model; the median over repetitions;
- peak memory: tracemalloc's peak during one extra, untimed run (tracemalloc slows
  the run, so it never overlaps a timed one);
- the ratio of the median µs per turn to the bare loop's at the same N.

A run whose result is wrong (model calls, tool results or final text) stops the
harness with an error: a fast wrong answer is not a result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import importlib.metadata
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from pathlib import Path

from contenders import CONTENDERS, BareTypedTasked, Contender, Ours
from micro import Figure
from workload import Script, intervals_ns, problems

NS = (10, 100, 1_000, 10_000)
REPETITIONS = {10: 30, 100: 10, 1_000: 5, 10_000: 3}
CELL_BUDGET_S = 30.0
"""Timed repetitions of one (contender, N) stop adding up past this."""
RUN_CAP_S = 60.0
"""A run projected to take longer than this is skipped (and the table says so)."""
MEMORY_CAP_S = 15.0
"""The tracemalloc run is skipped when the timed run took longer than this."""
WINDOW = 100
TASKED = BareTypedTasked.name
VERSIONED = (
    "agent-statemachine",
    "transitions",
    "attrs",
    "structlog",
    "jsonschema",
    "pydantic-ai-slim",
    "pydantic",
    "openai-agents",
    "openai",
    "langgraph",
    "langgraph-prebuilt",
    "langchain-core",
)


class WrongResultError(RuntimeError):
    """A contender's run did not do the workload."""


@dataclass
class Cell:
    """The measurements of one contender at one N."""

    contender: str
    n: int
    per_turn_us: list[float] = field(default_factory=list)
    cpu_per_turn_us: list[float] = field(default_factory=list)
    run_s: list[float] = field(default_factory=list)
    growth: list[float] = field(default_factory=list)
    first_interval_us: float = 0.0
    last_interval_us: float = 0.0
    peak_bytes: int | None = None
    skipped: str = ""
    checked_runs: int = 0

    @property
    def median_us(self) -> float:
        return statistics.median(self.per_turn_us)

    @property
    def cpu_median_us(self) -> float:
        return statistics.median(self.cpu_per_turn_us)


def growth_of(script: Script) -> tuple[float, float, float]:
    """(growth, median first-window interval µs, median last-window interval µs).

    Medians over 100 intervals: a turn preempted by another process on the shared
    machine is an outlier in its window, not a shift of it."""
    intervals = intervals_ns(script)
    k = min(WINDOW, len(intervals) // 2)
    if k == 0:
        return 1.0, 0.0, 0.0
    first = statistics.median(intervals[:k])
    last = statistics.median(intervals[-k:])
    return last / max(first, 1), first / 1e3, last / 1e3


def projected_run_s(previous: Cell, n: int) -> float:
    """A run's duration at ``n`` from the previous cell, assuming that a turn interval
    grows linearly with the history (``a + b*k``), as the measured intervals say."""
    a = previous.first_interval_us / 1e6
    b = max(0.0, previous.last_interval_us / 1e6 - a) / previous.n
    measured = statistics.median(previous.run_s) * n / previous.n
    return max(measured, a * n + b * n * n / 2)


async def run_once(contender: Contender, n: int) -> tuple[Script, float, float]:
    """One checked run: the script, its wall seconds and its CPU seconds."""
    script = Script(n)
    gc.collect()
    cpu_start = time.process_time_ns()
    start = time.perf_counter_ns()
    raw = await contender.execute(script)
    elapsed = (time.perf_counter_ns() - start) / 1e9
    cpu = (time.process_time_ns() - cpu_start) / 1e9
    found = problems(contender.outcome(raw), script)
    if found:
        raise WrongResultError(f"{contender.name}, N={n}: " + "; ".join(found))
    return script, elapsed, cpu


async def peak_memory(contender: Contender, n: int) -> int:
    script = Script(n)
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        raw = await contender.execute(script)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    found = problems(contender.outcome(raw), script)
    if found:
        raise WrongResultError(f"{contender.name}, N={n} (memory run): " + "; ".join(found))
    return peak


async def measure(
    contender: Contender, ns: tuple[int, ...], repetitions: dict[int, int], smoke: bool
) -> list[Cell]:
    cells: list[Cell] = []
    for _ in range(1 if smoke else 3):
        await run_once(contender, 10)  # warm-up: imports, caches, first-call paths
    previous: Cell | None = None
    for n in ns:
        cell = Cell(contender.name, n)
        cells.append(cell)
        if previous is not None and previous.skipped:
            cell.skipped = previous.skipped
            continue
        if previous is not None and not smoke:
            estimate = projected_run_s(previous, n)
            if estimate > RUN_CAP_S:
                cell.skipped = f"skipped: one run projected at {estimate:,.0f} s"
                previous = cell
                continue
        spent = 0.0
        while len(cell.run_s) < repetitions[n] and (spent < CELL_BUDGET_S or not cell.run_s):
            script, elapsed, cpu = await run_once(contender, n)
            spent += elapsed
            cell.checked_runs += 1
            cell.run_s.append(elapsed)
            cell.per_turn_us.append(elapsed * 1e6 / n)
            cell.cpu_per_turn_us.append(cpu * 1e6 / n)
            growth, first, last = growth_of(script)
            cell.growth.append(growth)
            cell.first_interval_us, cell.last_interval_us = first, last
        if smoke or statistics.median(cell.run_s) <= MEMORY_CAP_S:
            cell.peak_bytes = await peak_memory(contender, n)
            cell.checked_runs += 1
        previous = cell
    return cells


async def default_logger_note(n: int, repetitions: int) -> Figure:
    """Our loop with run_agent's default logger against one that drops everything.

    The default logger goes through the standard ``logging`` module's ``statemachine``
    logger, which an unconfigured application leaves silent: the target is that it
    costs within 1.1x of no logging at all. Anything it writes to stdout is counted
    (it should be nothing).
    """
    quiet, default = Ours(), Ours(default_logger=True)
    quiet_us: list[float] = []
    default_us: list[float] = []
    lines = 0
    for _ in range(repetitions):
        _, elapsed, _ = await run_once(quiet, n)
        quiet_us.append(elapsed * 1e6 / n)
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink):
            _, elapsed, _ = await run_once(default, n)
        default_us.append(elapsed * 1e6 / n)
        lines = sink.getvalue().count("\n")
    q, d = statistics.median(quiet_us), statistics.median(default_us)
    return Figure(
        "default-logger cost (ours)",
        f"{d:,.0f} µs/turn vs {q:,.0f} ({d / q:.2f}x)",
        f"run_agent with logger=None (the default: logging's silent 'statemachine' logger; "
        f"{lines} lines printed per run) vs a logger filtered at WARNING, N={n}, "
        f"median of {repetitions}",
    )


async def tracing_note(n: int, repetitions: int) -> Figure | None:
    """What tracing a run with ``statemachine.otel`` costs, against the same run untraced.

    An untraced run has no tracing code on its path at all (it never imports
    OpenTelemetry; a test checks that); this shows what opting in costs, with the SDK's
    tracer provider making every span but exporting none.
    """
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return None
    from contenders import OursTraced

    plain, traced = Ours(), OursTraced(TracerProvider())
    plain_us: list[float] = []
    traced_us: list[float] = []
    for _ in range(repetitions):
        _, elapsed, _ = await run_once(plain, n)
        plain_us.append(elapsed * 1e6 / n)
        _, elapsed, _ = await run_once(traced, n)
        traced_us.append(elapsed * 1e6 / n)
    p, t = statistics.median(plain_us), statistics.median(traced_us)
    return Figure(
        "OpenTelemetry tracing cost (ours)",
        f"{t:,.0f} µs/turn vs {p:,.0f} ({t / p:.2f}x)",
        f"run_agent through AgentTracer (SDK provider, 3 spans a turn, none exported) vs "
        f"untraced, N={n}, median of {repetitions}; an untraced run has no tracing code",
    )


# -- the report ----------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in VERSIONED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def _mem(cell: Cell) -> tuple[str, str]:
    if cell.peak_bytes is None:
        return "—", "—"
    return f"{cell.peak_bytes / 2**20:.2f} MiB", f"{cell.peak_bytes / cell.n / 1024:.1f} KiB"


def render(
    cells: list[Cell],
    unavailable: dict[str, str],
    figures: list[Figure],
    info: dict[str, str],
    vers: dict[str, str],
    command: str,
    note: str = "",
) -> str:
    bare = _medians(cells, CONTENDERS[0][0])
    dicts = _medians(cells, CONTENDERS[1][0])
    out = [
        "# Benchmark results",
        "",
        f"Command: `{command}`  ",
        f"Date: {info['date']}; machine: {info['nproc']} cores, {info['cpu']}; "
        f"{info['python']}; load average at start {info['load']} (a shared machine: "
        "ratios within this run are what count).  ",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()) + ".",
        *([f"  \n{note}"] if note else []),
        "",
        "Workload: a scripted model asks for one `echo` tool call per turn for N-1 turns, "
        "then answers text. µs/turn = run wall time / N (median, min–max over the "
        "repetitions); growth = median of the last 100 turn intervals / median of the "
        "first 100; memory = tracemalloc peak of one extra run.",
        "",
        "| contender | N | µs/turn (median) | min–max | CPU µs/turn | runs | growth "
        "| peak memory | memory/turn | × bare (our types) | × bare (dicts) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cell in cells:
        if cell.skipped:
            out.append(f"| {cell.contender} | {cell.n:,} | {cell.skipped} |{' |' * 8}")
            continue
        peak, per_turn = _mem(cell)
        ratio = _ratio(cell, bare)
        out.append(
            f"| {cell.contender} | {cell.n:,} | {cell.median_us:,.1f} | "
            f"{min(cell.per_turn_us):,.1f}–{max(cell.per_turn_us):,.1f} | "
            f"{cell.cpu_median_us:,.1f} | {len(cell.run_s)} | "
            f"{statistics.median(cell.growth):.2f} | {peak} | "
            f"{per_turn} | {ratio} | {_ratio(cell, dicts)} |"
        )
    for name, reason in unavailable.items():
        out.append(f"| {name} | — | not run: {reason} |{' |' * 8}")
    out += ["", "| figure | value | how |", "| --- | ---: | --- |"]
    out += [f"| {f.name} | {f.value} | {f.detail} |" for f in figures]
    out += ["", *targets(cells, bare, dicts)]
    return "\n".join(out) + "\n"


def _medians(cells: list[Cell], contender: str) -> dict[int, float]:
    return {c.n: c.median_us for c in cells if c.contender == contender and c.run_s}


def _ratio(cell: Cell, baseline: dict[int, float]) -> str:
    return f"{cell.median_us / baseline[cell.n]:,.1f}" if cell.n in baseline else "—"


def targets(cells: list[Cell], bare: dict[int, float], dicts: dict[int, float]) -> list[str]:
    """The overhead targets, judged on this run's numbers."""
    ours = {c.n: c for c in cells if c.contender == "statemachine run_agent" and c.run_s}
    lines = ["Targets:", ""]
    if 1_000 in ours and 1_000 in bare:
        ratio = ours[1_000].median_us / bare[1_000]
        verdict = "met" if ratio <= 10 else "MISSED"
        lines.append(
            f"- our loop ≤ 10x the bare loop (our types) per turn at N = 1,000: "
            f"{ratio:.1f}x, {verdict}"
        )
    tasked = {c.n: c for c in cells if c.contender == TASKED and c.run_s}
    if 1_000 in ours and 1_000 in tasked:
        # Reported beside the target: the floor of any loop that keeps the abort
        # guarantee (a task per operation), on the same types.
        ratio = ours[1_000].median_us / tasked[1_000].median_us
        lines.append(
            f"- against the bare loop with a task per operation (our types) at N = 1,000: "
            f"{ratio:.1f}x (CPU time "
            f"{ours[1_000].cpu_median_us / tasked[1_000].cpu_median_us:.1f}x; no target)"
        )
    if 1_000 in ours and 1_000 in dicts:
        # Reported, no longer a target: what the goal of 10x the dict loop bought cost
        # the core its readability (compiled dispatch, packed records, asyncio internals).
        ratio = ours[1_000].median_us / dicts[1_000]
        lines.append(f"- against the bare loop on dicts at N = 1,000: {ratio:.1f}x (no target)")
    agent = {c.n: c for c in cells if c.contender == "statemachine Agent.run" and c.run_s}
    if 1_000 in ours and 1_000 in agent:
        wall = agent[1_000].median_us / ours[1_000].median_us
        cpu = agent[1_000].cpu_median_us / ours[1_000].cpu_median_us
        lines.append(
            f"- Agent.run against run_agent at N = 1,000: {wall:.2f}x "
            f"(CPU time {cpu:.2f}x; no target, one code path)"
        )
    for label, contender in (("our types", CONTENDERS[0][0]), ("dicts", CONTENDERS[1][0])):
        base = {c.n: c for c in cells if c.contender == contender and c.run_s}
        if 1_000 in ours and 1_000 in base:
            ratio = ours[1_000].cpu_median_us / base[1_000].cpu_median_us
            lines.append(f"  (in CPU time, against {label}: {ratio:.1f}x)")
    if ours:
        top = max(ours)
        worst = max(statistics.median(c.growth) for c in ours.values())
        verdict = "met" if worst <= 1.1 else "MISSED"
        lines.append(
            f"- turn-interval growth ≤ 1.1 up to N = {top:,}: worst {worst:.2f}, {verdict}"
        )
    with_mem = [c for c in ours.values() if c.peak_bytes is not None and c.n >= 100]
    if len(with_mem) >= 2:
        per_turn = [c.peak_bytes / c.n for c in with_mem if c.peak_bytes is not None]
        spread = max(per_turn) / min(per_turn)
        verdict = "met" if spread <= 1.5 else "MISSED"
        lines.append(
            f"- memory linear in history: peak bytes per turn varies {spread:.2f}x over "
            f"N = {with_mem[0].n:,}..{with_mem[-1].n:,}, {verdict}"
        )
    return lines


def _micro_in_fresh_process(smoke: bool) -> list[Figure]:
    """The micro figures, measured in a new interpreter that imports only this package.

    By the time they run, this process holds every peer's modules: each full garbage
    collection walks those too, which cost the allocation-heavy figures (replay,
    conformance) up to a third of their rate; a user's process has no such heap.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "micro.json"
        command = [sys.executable, str(Path(__file__).with_name("micro.py")), str(out)]
        proc = subprocess.run(
            command + (["--smoke"] if smoke else []),
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).parent,
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return [Figure("micro figures", "failed", last)]
        return [Figure(**f) for f in json.loads(out.read_text(encoding="utf-8"))]


# -- entry point ---------------------------------------------------------------------------


# The generated report is the top of bench/results.md; below this line are dated
# sections written by hand (before/after measurements of each change), which a new
# run keeps.
KEPT_MARKER = "<!-- Below: dated sections, kept when bench/run.sh writes the report above. -->"


def with_kept_sections(report: str, out: Path) -> str:
    """``report``, followed by the marker and what follows it in ``out`` (if any)."""
    kept = ""
    if out.exists():
        old = out.read_text(encoding="utf-8")
        if KEPT_MARKER in old:
            kept = old[old.index(KEPT_MARKER) + len(KEPT_MARKER) :]
    return report.rstrip("\n") + "\n\n" + KEPT_MARKER + (kept or "\n")


async def main_async(args: argparse.Namespace) -> int:
    ns = (10,) if args.smoke else tuple(args.ns)
    repetitions = {n: 1 for n in ns} if args.smoke else {n: REPETITIONS.get(n, 3) for n in ns}
    cells: list[Cell] = []
    unavailable: dict[str, str] = {}
    for name, factory in CONTENDERS:
        if args.only and not any(word.lower() in name.lower() for word in args.only):
            continue
        try:
            contender = factory()
        except ImportError as exc:
            unavailable[name] = f"not installed ({exc.name}); run bench/run.sh"
            continue
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        try:
            cells += await measure(contender, ns, repetitions, args.smoke)
        except WrongResultError:
            raise
        except Exception as exc:  # noqa: BLE001 - one broken peer must not cost the run
            unavailable[name] = f"failed: {type(exc).__name__}: {exc}"
    figures = [] if args.no_micro else await asyncio.to_thread(_micro_in_fresh_process, args.smoke)
    if not args.smoke and not args.no_micro:
        figures.insert(0, await default_logger_note(1_000, 3))
        tracing = await tracing_note(1_000, 3)
        if tracing is not None:
            figures.insert(1, tracing)
    command = "bash bench/run.sh" + (" --smoke" if args.smoke else "")
    report = render(cells, unavailable, figures, machine(), versions(), command, args.note)
    print(report)
    if args.out:
        Path(args.out).write_text(with_kept_sections(report, Path(args.out)), encoding="utf-8")
    if args.json:
        data = {
            "cells": [asdict(c) for c in cells],
            "unavailable": unavailable,
            "figures": [asdict(f) for f in figures],
        }
        Path(args.json).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--smoke", action="store_true", help="N=10, one run each")
    parser.add_argument("--ns", type=int, nargs="+", default=list(NS), help="run sizes")
    parser.add_argument(
        "--only", nargs="+", help="run only contenders whose name contains one of these"
    )
    parser.add_argument("--no-micro", action="store_true", help="skip the micro-benchmarks")
    parser.add_argument("--note", default="", help="a line for the report's header")
    parser.add_argument("--out", help="write the markdown table here")
    parser.add_argument("--json", help="write the raw measurements here")
    args = parser.parse_args(argv)
    if any(n < 2 for n in args.ns):
        parser.error("every N must be at least 2 (N-1 tool turns, then the answer)")
    try:
        return asyncio.run(main_async(args))
    except WrongResultError as exc:
        print(f"wrong result: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
