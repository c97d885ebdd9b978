"""``statemachine view JOURNAL``: a run journal as one self-contained HTML page.

The page is ``statemachine.journal.view_html``'s: the state diagram with the run's path
drawn over it, a timeline of the events that steps a highlight along the diagram, and
the messages as a chat transcript. It needs no network and opens from ``file://``.
"""

from __future__ import annotations

from pathlib import Path

from statemachine.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    CommandParser,
    add_agent_option,
    fail,
    load_attribute,
    parse,
)
from statemachine.errors import UsageError
from statemachine.journal import (
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_VIEW_BYTES,
    JournalError,
    view_html,
)

__all__ = ["cli_view"]


def _parser() -> CommandParser:
    parser = CommandParser(
        "view",
        description="Write a run journal as one HTML page: the state diagram with the "
        "run's path drawn over it, a timeline of the events (model calls, tool calls with "
        "their arguments and results, approvals, steering, aborts) that steps a highlight "
        "along the diagram, and the messages as a chat transcript. The page needs no "
        "network: open it in a browser from disk. Journals come from run_agent_journaled "
        "or from 'statemachine durable export'. A run with steps is drawn with its own "
        "table, which its journal records; --agent checks it is that agent's, and names a "
        "team's first speaker.",
        failed=None,
        epilog="A journal that stops replaying at some line is shown up to there, and the "
        "page says why.",
    )
    parser.add_argument("journal", help="the journal (JSON Lines)")
    parser.add_argument(
        "--out", help="where to write the page (default: the journal's name with .html)"
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=DEFAULT_MAX_VIEW_BYTES,
        help="refuse a larger journal (default: 64 MiB)",
    )
    parser.add_argument(
        "--max-line-bytes",
        type=int,
        default=DEFAULT_MAX_LINE_BYTES,
        help="refuse a longer line (default: 16 MiB)",
    )
    add_agent_option(parser, "check the journal against")
    return parser


def cli_view(argv: list[str]) -> int:
    """``statemachine view JOURNAL [--out FILE]``: write the run's page."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.max_bytes < 1 or args.max_line_bytes < 1:
        return fail("view", "--max-bytes and --max-line-bytes must be at least 1")
    source = Path(args.journal)
    out = Path(args.out) if args.out else source.with_suffix(".html")
    if out.resolve() == source.resolve():
        return fail("view", f"--out {out} is the journal itself: name another file")
    try:
        agent = load_attribute("--agent", args.agent, "refunds:agent") if args.agent else None
        page = view_html(
            source, agent=agent, max_bytes=args.max_bytes, max_line_bytes=args.max_line_bytes
        )
    except JournalError as exc:
        return fail("view", f"{source}: {exc}", EXIT_USAGE)
    except UsageError as exc:  # the package's drawing cannot be read (a broken install)
        return fail("view", str(exc), EXIT_USAGE)
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        return fail("view", f"cannot write {out}: {exc.strerror or exc}")
    print(f"wrote {out} (open it in a browser)")
    return EXIT_OK
