"""``python -m statemachine transcript FILE...``: check recorded conversation logs.

Each file holds one transcript (a JSON list of messages, or a request body that wraps
it as ``messages`` / ``input`` / ``contents``) or several in JSON Lines: one transcript
per line when every line is a list or a wrapper, else one message per line. The checker is
``statemachine.testing.transcript_findings``.

Exit status: 0 when no file has an error-level finding, 1 when one has, 2 when a file
cannot be read (missing, too large, not UTF-8 JSON or JSONL, or JSON that holds no list
of messages) or the arguments are wrong. Findings go to stdout; a file that cannot be
read is one line on stderr.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from statemachine.cli.common import EXIT_FAILED, EXIT_OK, CommandParser, fail, parse
from statemachine.testing.transcript import (
    FORMATS,
    TranscriptFormat,
    detect_format,
    transcript_findings,
)

__all__ = ["DEFAULT_MAX_BYTES", "cli_transcript"]

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
"""Files larger than this are refused unread (``--max-bytes`` changes it)."""


class _UnreadableError(Exception):
    """A file that cannot be read as transcripts; the message is one line."""


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        "transcript",
        description="Check recorded conversation logs for tool-call pairing and order "
        "problems (I1, I2), by each provider's own rules.",
        failed="error-level findings",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="JSON or JSONL file")
    parser.add_argument(
        "--format",
        choices=(*FORMATS, "auto"),
        default="auto",
        help="the log's format (default: auto, from the shape of each transcript; a log "
        "that matches no format or several is one format error)",
    )
    parser.add_argument(
        "--allow-open-tail",
        action="store_true",
        help="accept a log that ends mid-turn (unanswered calls in the last message)",
    )
    parser.add_argument(
        "--id-reuse",
        choices=("warning", "error"),
        default=None,
        help="level of a call id reused across turns (default: warning for the "
        "providers' formats, error for statemachine)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="make errors of the rules some servers enforce and others do not (a call id "
        "reused across turns on Anthropic, a Responses output after a later message item)",
    )
    parser.add_argument(
        "--max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        help=f"refuse files larger than this (default: {DEFAULT_MAX_BYTES})",
    )
    parser.add_argument(
        "--errors-only", action="store_true", help="print error-level findings only"
    )
    return parser


def cli_transcript(argv: list[str]) -> int:
    """``python -m statemachine transcript FILE...``; see the module docstring."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.max_bytes <= 0:
        return fail("transcript", "--max-bytes must be positive")
    worst = EXIT_OK
    for name in args.files:
        try:
            transcripts = _read(Path(name), args.max_bytes)
        except _UnreadableError as exc:
            worst = fail("transcript", f"{name}: {exc}")
            continue
        for label, transcript in transcripts:
            try:
                errors = _report(f"{name}{label}", transcript, args)
            except _UnreadableError as exc:
                worst = fail("transcript", f"{name}{label}: {exc}")
                continue
            if errors and worst == EXIT_OK:
                worst = EXIT_FAILED
    return worst


def _report(name: str, transcript: Any, args: argparse.Namespace) -> int:
    """Prints one summary line and the findings; returns the number of errors."""
    try:
        fmt = detect_format(transcript) if args.format == "auto" else args.format
        found = transcript_findings(
            transcript,
            cast(TranscriptFormat, args.format),
            allow_open_tail=args.allow_open_tail,
            id_reuse=args.id_reuse,
            strict=args.strict,
        )
    except TypeError as exc:  # JSON, but no list of messages in it
        raise _UnreadableError(str(exc)) from None
    errors = sum(1 for f in found if f.level == "error")
    warnings = len(found) - errors
    size = _count(transcript)
    verdict = "ok" if not errors else "FAIL"
    print(
        f"{name}: {verdict} ({fmt}, {size} messages, "
        f"{_plural(errors, 'error')}, {_plural(warnings, 'warning')})"
    )
    for finding in found:
        if finding.level == "error" or not args.errors_only:
            print(
                f"  {finding.level} {finding.invariant} at message {finding.index}: "
                f"{finding.message}"
            )
    return errors


def _count(transcript: Any) -> int:
    if isinstance(transcript, dict):
        transcript = next(
            (transcript[k] for k in ("messages", "input", "contents") if k in transcript), None
        )
    return len(transcript) if isinstance(transcript, list) else 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _read(path: Path, max_bytes: int) -> list[tuple[str, Any]]:
    """The transcripts in a file, each with a label for the report ("" or ":LINE")."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise _UnreadableError(f"{size} bytes, over the limit of {max_bytes} (--max-bytes)")
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise _UnreadableError(exc.strerror or type(exc).__name__) from None
    if len(raw) > max_bytes:  # the file grew after stat
        raise _UnreadableError(f"over the limit of {max_bytes} bytes (--max-bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _UnreadableError(f"not UTF-8 (byte {exc.start})") from None
    try:
        return [("", _loads(text))]
    except ValueError as whole:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if len(lines) < 2:
            raise _UnreadableError(f"not JSON: {whole}") from None
    values: list[tuple[int, Any]] = []
    for n, line in lines:
        try:
            values.append((n, _loads(line)))
        except ValueError as exc:
            raise _UnreadableError(f"not JSON or JSONL (line {n}: {exc})") from None
    if all(_is_transcript(v) for _, v in values):
        return [(f":{n}", v) for n, v in values]
    return [("", [v for _, v in values])]


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _is_transcript(value: Any) -> bool:
    if isinstance(value, dict):
        return any(isinstance(value.get(k), list) for k in ("messages", "input", "contents"))
    return isinstance(value, Sequence) and not isinstance(value, str)
