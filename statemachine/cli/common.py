"""What every ``python -m statemachine`` command shares: parsing, exit codes, progress.

One style across commands: ``--help`` everywhere, with the exit codes in its epilog; an
expected failure (a bad option, a path that does not exist, a file that cannot be read)
is one line on stderr that starts with the command's name, never a traceback; and a
long run shows its progress on a terminal and prints nothing extra anywhere else.

Exit codes, the same for every command:

- ``EXIT_OK`` (0): the command did what was asked and what it checked holds;
- ``EXIT_FAILED`` (1): the thing the command checks or runs failed (a scenario, a
  run that did not end ``Done``, a stale file, an error-level finding);
- ``EXIT_USAGE`` (2): bad arguments, or input that cannot be read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NoReturn, TextIO

if TYPE_CHECKING:  # the run layer is imported by the commands that run agents, not here
    from statemachine.agent.events import (
        RunEvent,
        RunResult,
    )
    from statemachine.agent.run import (
        AgentRun,
    )
    from statemachine.core.messages import Message

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CommandParser",
    "Progress",
    "add_agent_option",
    "describe_run_event",
    "emit",
    "exit_codes",
    "fail",
    "load_attribute",
    "parse",
    "program",
    "run_shown",
]


def add_agent_option(parser: argparse.ArgumentParser, verb: str) -> None:
    """``--agent MODULE:NAME``, for the commands that ``verb`` an agent's table."""
    parser.add_argument(
        "--agent",
        metavar="MODULE:NAME",
        help=f"{verb} this agent's table, its declared steps included: an Agent, a list of "
        "Step or a Table (default: the library's table)",
    )


def load_attribute(option: str, spec: str, example: str) -> Any:
    """What ``MODULE:NAME`` names (``NAME`` may be dotted), the module imported as
    ``python -m`` would find it beside you; ``InvalidInputError`` saying what is wrong."""
    import importlib

    from statemachine.errors import InvalidInputError

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidInputError(f"{option} {spec!r}: write MODULE:NAME, e.g. {example}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as python -m does: your module beside you
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInputError(f"{option} {spec!r}: cannot import {module_name}: {exc}") from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise InvalidInputError(f"{option} {spec!r}: {module_name} has no {attribute}")
        found = getattr(found, part)
    return found


EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
"""Ctrl-C: the shells' code for a process ended by SIGINT (128 + 2)."""


def program() -> str:
    """How the user called the command line: ``statemachine`` (the script) or
    ``python -m statemachine``; usage lines say the same."""
    return "statemachine" if Path(sys.argv[0]).name == "statemachine" else "python -m statemachine"


def exit_codes(failed: str | None) -> str:
    """The ``--help`` epilog line that documents the exit codes.

    ``failed`` says what 1 means; ``None`` for a command that checks nothing (it never
    exits 1).
    """
    one = "" if failed is None else f", 1 {failed}"
    return f"exit status: 0 ok{one}, 2 bad arguments or unreadable input"


def _fill(text: str) -> str:
    # Paragraphs wrapped here, because argparse's own wrapping would join them.
    return "\n\n".join(textwrap.fill(p, 78) for p in text.split("\n\n"))


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``COMMAND: message (see --help)``."""

    def __init__(
        self, command: str, *, description: str, failed: str | None, epilog: str = ""
    ) -> None:
        super().__init__(
            prog=f"{program()} {command}",
            description=_fill(description),
            epilog=_fill("\n\n".join(filter(None, (epilog, exit_codes(failed))))),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        self.command = command

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.command}: {message} (see --help)\n")


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    """``parser.parse_args(argv)``, or the exit code where argparse would exit.

    A command's ``cli_*`` function returns its exit code and never raises ``SystemExit``,
    so that ``main()`` and callers in tests see one contract.
    """
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) and bad arguments (2) end the parse here
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


async def run_shown(
    run: AgentRun,
    history: Sequence[Message],
    show: Callable[[Message], None],
    on_event: Callable[[RunEvent], None],
) -> RunResult:
    """Run ``run``: ``show`` each message of its initial ``history``, then hand each
    event of its stream to ``on_event`` as it arrives; return how the run returned."""
    events = run.events()  # subscribed before run(), so no event is missed
    for message in history:
        show(message)

    async def follow() -> None:
        async for event in events:
            on_event(event)

    shown = asyncio.ensure_future(follow())
    try:
        result = await run.run()
    except BaseException:
        shown.cancel()
        raise
    await shown  # the stream ends with RunReturned, which run() has emitted
    return result


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_run_event(event: RunEvent) -> str:
    """One readable line for an event of ``AgentRun.events()`` (the console's form)."""
    import json

    from statemachine.agent import events as ev
    from statemachine.core.messages import thaw_json

    if isinstance(event, ev.RunStarted):
        return f"run {event.run_id} started"
    if isinstance(event, ev.TurnStarted):
        return f"turn {event.turn} started"
    if isinstance(event, ev.TurnEnded):
        return f"turn {event.turn} ended ({event.seconds:.2f} s)"
    if isinstance(event, ev.StateChanged):
        r = event.record
        return f"{r.source.value} --{r.trigger.value.replace('_', ' ')}--> {r.dest.value}"
    if isinstance(event, ev.MessageAdded):
        message = event.message
        text = getattr(message, "text", "") or ""
        return f"message {event.index} ({message.role}): {_short(text)}"
    if isinstance(event, ev.ToolStarted):
        arguments = json.dumps(thaw_json(event.call.arguments), ensure_ascii=False)
        return f"tool {event.call.name} ({event.call.id}) started: {_short(arguments)}"
    if isinstance(event, ev.ToolProgress):
        return f"tool call {event.call_id} progress: {_short(repr(event.data))}"
    if isinstance(event, ev.ToolEnded):
        how = (
            "abandoned"
            if event.abandoned
            else "cancelled"
            if event.cancelled
            else "failed"
            if event.output.is_error
            else "returned"
        )
        text = "".join(getattr(b, "text", "") for b in event.output.content)
        return (
            f"tool {event.call.name} ({event.call.id}) {how} after {event.seconds:.2f} s: "
            f"{_short(text)}"
        )
    if isinstance(event, ev.RunReturned):
        return f"run returned: {event.state.value}: {_short(event.explanation, 200)}"
    return _short(repr(event), 200)  # an event kind this printer does not know yet


def emit(data: str | bytes, out: str | None) -> None:
    """Write a command's output to ``out``, or to standard output for ``None`` or ``-``."""
    if out is None or out == "-":
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(data)
        return
    path = Path(out)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")


def fail(command: str, message: str, code: int = EXIT_USAGE) -> int:
    """Print ``COMMAND: message`` as one line on stderr and return ``code``."""
    one_line = " ".join(message.split())
    print(f"{command}: {one_line}", file=sys.stderr)
    return code


class Progress:
    """A one-line ``LABEL [i/n] item`` display, redrawn in place, for long runs.

    ``total`` is ``None`` for work whose size is not known in advance (an exhaustive
    search: ``LABEL [i] item``).

    It draws only when ``stream`` (stderr by default) is a terminal whose ``TERM`` is not
    ``dumb``; anywhere else it draws nothing, so piped or captured output holds exactly
    what the command prints. Redraws come at most every ``interval`` seconds, so a loop
    that steps thousands of times a second costs no terminal traffic. Print a result
    line through ``write`` (it clears the display first, so the two never share a line).
    Use it as a context manager so the display is cleared however the run ends.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        interval: float = 0.1,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"
        self.enabled = enabled
        self.interval = interval
        self._shown = False
        self._drawn_at: float | None = None

    def step(self, item: str) -> None:
        """Show that work on ``item`` (the next of ``total``) starts."""
        self.done += 1
        self.update(item)

    def update(self, item: str) -> None:
        """Redraw the current step with ``item`` (e.g. how long it has been running)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self._drawn_at is not None and now - self._drawn_at < self.interval:
            return
        self._drawn_at = now
        width = shutil.get_terminal_size((80, 24)).columns - 1
        count = self.done if self.total is None else f"{self.done}/{self.total}"
        text = f"{self.label} [{count}] {item}"
        self.stream.write("\r\x1b[K" + text[:width])
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        """Remove the display (nothing to do when it is not shown)."""
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    def write(self, text: str, out: TextIO | None = None) -> None:
        """Print ``text`` as a line on ``out`` (stdout by default) without garbling."""
        self.clear()
        print(text, file=sys.stdout if out is None else out, flush=self.enabled)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.clear()
