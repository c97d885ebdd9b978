"""``python -m statemachine trace RUN``: the path a finished run took, drawn.

RUN is a run file (``run_result_to_dict``) or a run journal; reading it and drawing it
are ``statemachine._runs`` and ``statemachine._render``; this module reads the
arguments and writes the result (with ``--format markdown --out``, the page's SVG too).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from statemachine._render import FORMATS, chart_from_table, overlay_from_trace, render
from statemachine._runs import (
    load_run_and_table,
    run_page,
    run_result_to_dict,
    run_section,
    sequence_diagram,
)
from statemachine.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CommandParser,
    emit,
    fail,
    parse,
)
from statemachine.cli.diagram import format_for
from statemachine.errors import BadDataError, JournalError, UsageError
from statemachine.steps import chart as steps_chart

# run_result_to_dict is re-exported: it writes the run files this command reads.
__all__ = ["cli_trace", "run_result_to_dict"]

_GENERATOR: Final = "python -m statemachine trace"


def _parser() -> CommandParser:
    parser = CommandParser(
        "trace",
        description=(
            "Draw the machine with the path a finished run took (states and steps, with "
            "counts), or the run's messages as a sequence diagram. RUN is a run file (JSON "
            "from statemachine.cli.trace.run_result_to_dict(result)) or a run journal "
            "(statemachine-journal JSON Lines), which is replayed and verified first."
        ),
        failed="a journal that does not replay as recorded from its second line on",
        epilog="A run file or journal that cannot be read at all (or whose first line is not "
        "a journal's header) is unreadable input (2), as in 'view' and 'replay'.",
    )
    parser.add_argument("run", type=Path, metavar="RUN", help="the run file or journal")
    parser.add_argument(
        "--format",
        choices=(*FORMATS, "sequence", "markdown"),
        help="mermaid|dot|svg|png: the path overlay; sequence: a mermaid sequenceDiagram; "
        "markdown: a page with both, and with --out its overlay SVG next to it "
        "(default: from --out's extension, else mermaid)",
    )
    parser.add_argument("--out", help="write here instead of standard output")
    return parser


def _trace_data(args: argparse.Namespace) -> str | bytes:
    result, table = load_run_and_table(args.run)
    fmt = format_for(args.out, args.format, "mermaid")
    if fmt == "sequence":
        return sequence_diagram(result)
    # A journal of a run with steps is drawn with its own table, as 'view' draws it.
    chart = steps_chart(table) if table.steps else chart_from_table()
    overlay = overlay_from_trace(chart, result.trace, result.state.value)
    if fmt != "markdown":
        return render(fmt, chart, overlay)
    stem = Path(args.out).stem if args.out else args.run.stem
    svg = f"{stem}.svg"
    if args.out:
        (Path(args.out).parent / svg).write_text(str(render("svg", chart, overlay)), "utf-8")
    intro = f"The run recorded in `{args.run.name}`."
    return run_page(
        f"Run {result.run_id or args.run.stem}",
        [run_section(result, "The run", intro, args.run.name, svg)],
        _GENERATOR,
    )


def cli_trace(argv: list[str]) -> int:
    """``python -m statemachine trace RUN``: draw the path a finished run took."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        emit(_trace_data(args), args.out)
    except JournalError as exc:
        # As 'replay' and 'view': a journal from its second line on reads, and going
        # wrong there is the run failing to replay as recorded.
        return fail("trace", str(exc), EXIT_FAILED if exc.line > 1 else EXIT_USAGE)
    except (UsageError, BadDataError, OSError) as exc:
        return fail("trace", str(exc))
    return EXIT_OK
