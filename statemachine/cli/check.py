"""``python -m statemachine check``: the exhaustive checker from the command line."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import attrs

from statemachine.cli.common import (
    CommandParser,
    Progress,
    add_agent_option,
    fail,
    load_attribute,
    parse,
)
from statemachine.errors import InvalidInputError
from statemachine.steps import table_of
from statemachine.testing.checker import (
    DEFAULT_CONFIGS,
    Bounds,
    CheckReport,
    check_engine,
    write_counterexample,
)


@contextmanager
def _ticking(progress: Progress, item: str, every: float) -> Iterator[None]:
    """While the block runs, redraw ``item`` with its running time every ``every`` s,
    so a configuration that takes a minute still shows the check is alive."""
    progress.step(item)
    if not progress.enabled:
        yield
        return
    stop = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not stop.wait(every):
            progress.update(f"{item} ({time.monotonic() - started:.0f} s)")

    ticker = threading.Thread(target=tick, name="check-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()


def check_with_progress(
    bounds: Bounds,
    strategy: Literal["snapshot", "replay"],
    progress: Progress,
    every: float = 1.0,
) -> CheckReport:
    """``check_engine(bounds)``, one configuration at a time so that ``progress`` shows
    which one is being explored; the same report as one call."""
    if not bounds.configs:
        return check_engine(bounds, strategy=strategy)
    reports = []
    for config in bounds.configs:
        with _ticking(progress, config.describe(), every):
            one = attrs.evolve(bounds, configs=(config,))
            reports.append(check_engine(one, strategy=strategy))
    rows = frozenset().union(*(r.rows_taken for r in reports))
    return CheckReport(
        bounds=bounds,
        states=sum(r.states for r in reports),
        transitions=sum(r.transitions for r in reports),
        refusals=sum(r.refusals for r in reports),
        rows_taken=rows,
        dead_ends=tuple(d for r in reports for d in r.dead_ends),
        violations=tuple(v for r in reports for v in r.violations),
        seconds=sum(r.seconds for r in reports),
        strategy=strategy,
        table=reports[0].table,
    )


__all__ = ["cli_check"]


def _parser() -> CommandParser:
    parser = CommandParser(
        "check",
        description="Exhaustively check the engine: every accepted sequence of engine events "
        "within the bounds, every invariant at every reachable state, every destination "
        "against the rules, every table row taken.",
        failed="a finding (an invariant broken, a destination against the rules, a row "
        "never taken, a dead end)",
    )
    parser.add_argument("--turns", type=int, default=3, help="max_turns (default 3)")
    parser.add_argument("--calls", type=int, default=3, help="tool calls per response (3)")
    parser.add_argument(
        "--counterexample",
        metavar="FILE",
        help="write the engine events that lead to the first violation as a journal "
        "(replay it to see it)",
    )
    parser.add_argument(
        "--uncapped",
        action="store_true",
        help="explore every configuration with --calls (the hooked one is capped at 2)",
    )
    parser.add_argument(
        "--strategy",
        choices=("snapshot", "replay"),
        default="snapshot",
        help="how engines are copied (default snapshot)",
    )
    add_agent_option(parser, "check")
    return parser


def cli_check(argv: list[str]) -> int:
    """``python -m statemachine check [--turns N] [--calls M] [--agent MODULE:NAME]``."""
    parser = _parser()
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    if args.turns < 1 or args.calls < 0:
        return fail("check", "--turns must be >= 1 and --calls >= 0 (see --help)")
    configs = DEFAULT_CONFIGS
    if args.uncapped:
        configs = tuple(attrs.evolve(c, max_calls=None) for c in configs)
    if args.agent:
        try:
            table = table_of(load_attribute("--agent", args.agent, "refunds:agent"))
        except InvalidInputError as exc:
            return fail("check", str(exc))
        configs = tuple(attrs.evolve(c, options={**c.options, "table": table}) for c in configs)
    bounds = Bounds(turns=args.turns, calls=args.calls, configs=configs)
    # On a terminal, a one-line display names the configuration being explored (the
    # whole check takes about a minute); piped output holds only the report.
    with Progress("check", len(configs)) as progress:
        report = check_with_progress(bounds, args.strategy, progress)
    print(report.summary())
    findings = (*report.violations, *report.dead_ends)
    if args.counterexample and findings:
        try:
            count = write_counterexample(findings[0], args.counterexample, bounds=bounds)
        except OSError as exc:
            return fail("check", f"cannot write {args.counterexample}: {exc.strerror or exc}")
        print(f"wrote {count} event(s) to {args.counterexample}: python -m statemachine replay")
    print("OK" if report.ok else "FAILED")
    return 0 if report.ok else 1
