"""``python -m statemachine replay FILE``: replay a run journal, print it as a readable
trace and verify it."""

from __future__ import annotations

import io
import logging
import sys

import structlog

from statemachine.cli.common import EXIT_FAILED, EXIT_USAGE, CommandParser, fail, parse
from statemachine.errors import InvalidInputError
from statemachine.journal import (
    DEFAULT_MAX_LINE_BYTES,
    JournalError,
    ReplayResult,
    format_step,
    replay,
)

__all__ = ["cli_replay"]


def _parser() -> CommandParser:
    parser = CommandParser(
        "replay",
        description="Replay a run journal, print it as a readable trace and verify it.",
        failed="the journal does not replay as recorded (a bad or cut-off line after its "
        "header, or a step that comes out differently)",
        epilog="2 is for a file that cannot be read as a journal (it cannot be opened, or "
        "its first line is not a journal's header), as in 'view' and 'trace'; a journal "
        "that goes wrong at a later line fails with 1.",
    )
    parser.add_argument("file", help="the journal (JSON Lines)")
    parser.add_argument("--quiet", action="store_true", help="print only the verdict, on one line")
    parser.add_argument(
        "--max-line-bytes",
        type=int,
        default=DEFAULT_MAX_LINE_BYTES,
        help="refuse a line longer than this (default: 16 MiB)",
    )
    return parser


def _account(result: ReplayResult, quiet: bool) -> str:
    """The run the journal holds: its header, each step unless ``quiet``, where it ends."""
    out = io.StringIO()
    header = result.header
    out.write(
        f"run {header.run_id}: {len(header.messages)} initial message(s), "
        f"{len(header.tools)} tool(s) ({', '.join(t.name for t in header.tools) or 'none'}), "
        f"max_turns={header.max_turns}, permissions "
        f"{'checked' if header.check_permissions else 'not checked'}\n"
    )
    if not quiet:
        for step in result.steps:
            out.write(format_step(step) + "\n")
    engine = result.engine
    out.write(
        f"state {engine.state.value} after {len(result.steps)} event(s), {engine.turns} "
        f"turn(s), {len(engine.messages)} message(s), {result.checkpoints} checkpoint(s) "
        "verified\n"
    )
    if engine.explanation:
        out.write(f"explanation: {engine.explanation}\n")
    return out.getvalue()


def cli_replay(argv: list[str]) -> int:
    """``python -m statemachine replay FILE``: print the run and verify it."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.max_line_bytes < 1:
        return fail("replay", f"--max-line-bytes must be at least 1, got {args.max_line_bytes}")
    try:
        # The command prints its own trace; the engine's per-transition log lines would
        # only repeat it (warnings, such as normalised ids, still show).
        quiet = structlog.wrap_logger(
            None, wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
        )
        result = replay(args.file, strict=False, logger=quiet, max_line_bytes=args.max_line_bytes)
    except JournalError as exc:
        if exc.line <= 1:  # the file cannot be opened, or is no journal at all
            return fail("replay", str(exc), EXIT_USAGE)
        return fail("replay", f"FAILED: {exc}", EXIT_FAILED)
    except InvalidInputError as exc:
        return fail("replay", str(exc), EXIT_USAGE)
    if result.error is None and args.quiet:
        engine = result.engine
        verdict = (
            "OK: the replay matches the journal"
            if result.checkpoints
            else "OK (no checkpoint: the run had not returned when the journal ends)"
        )
        print(
            f"{verdict} (run {result.header.run_id}: {engine.state.value} after "
            f"{len(result.steps)} event(s), {result.checkpoints} checkpoint(s))"
        )
        return 0
    if not args.quiet:
        sys.stdout.write(_account(result, quiet=False))
    if result.error is not None:
        return fail(
            "replay",
            f"FAILED: {result.error} (everything before line {result.error.line} replayed "
            "and verified)",
            EXIT_FAILED,
        )
    if result.checkpoints == 0:
        print("OK (no checkpoint: the run had not returned when the journal ends)")
        return 0
    print("OK: the replay matches the journal")
    return 0
