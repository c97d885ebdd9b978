"""``python -m statemachine transcript PATH...``: check recorded conversation logs.

Each file holds one transcript (a JSON list of messages, or a request body that wraps
it as ``messages`` / ``input`` / ``contents``) or several in JSON Lines: one transcript
per line when every line is a list or a wrapper, else one message per line. The checker is
``statemachine.testing.transcript_findings``.

A PATH is a file, a directory (its ``.json`` and ``.jsonl`` files, in its subdirectories
too, in name order) or a glob pattern (``'logs/**/*.json'``, expanded here, so a shell
that does not expand it, or a list too long for one command line, still works). All of
them are checked in one process, and when more than one file is checked a last line
sums them up. At most ``--max-files`` files (``DEFAULT_MAX_FILES``) are checked in one
call: more is refused before any is read.

Exit status: 0 when no file has an error-level finding, 1 when one has, 2 when a file
cannot be read (missing, too large, not UTF-8 JSON or JSONL, or JSON that holds no list
of messages), a directory or pattern names no file, or the arguments are wrong.
Findings go to stdout; a file that cannot be read is one line on stderr.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from statemachine.cli.common import EXIT_FAILED, EXIT_OK, CommandParser, fail, parse
from statemachine.testing.transcript import (
    FORMATS,
    TranscriptFormat,
    detect_format,
    transcript_findings,
)

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_FILES", "cli_transcript"]

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
"""Files larger than this are refused unread (``--max-bytes`` changes it)."""

DEFAULT_MAX_FILES = 10_000
"""At most this many files in one call, after directories and patterns are expanded
(``--max-files`` changes it)."""

_SUFFIXES = (".json", ".jsonl")  # the files a directory contributes


class _UnreadableError(Exception):
    """A file that cannot be read as transcripts; the message is one line."""


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        "transcript",
        description="Check recorded conversation logs for tool-call pairing and order "
        "problems (I1, I2), by each provider's own rules.",
        failed="error-level findings",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a JSON or JSONL file, a directory (its .json and .jsonl files, "
        "subdirectories included) or a glob pattern such as 'logs/**/*.json'",
    )
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
        "--max-files",
        type=int,
        default=DEFAULT_MAX_FILES,
        help=f"refuse to check more files than this in one call (default: {DEFAULT_MAX_FILES})",
    )
    parser.add_argument(
        "--errors-only", action="store_true", help="print error-level findings only"
    )
    return parser


def cli_transcript(argv: list[str]) -> int:
    """``python -m statemachine transcript PATH...``; see the module docstring."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    if args.max_bytes <= 0:
        return fail("transcript", "--max-bytes must be positive")
    if args.max_files <= 0:
        return fail("transcript", "--max-files must be positive")
    files, worst = _expand(args.paths, args.max_files)
    if len(files) > args.max_files:
        return fail(
            "transcript",
            f"more than {args.max_files} files to check (--max-files): name fewer",
        )
    tally = _Tally()
    for name in files:
        try:
            transcripts = _read(Path(name), args.max_bytes)
        except _UnreadableError as exc:
            worst = fail("transcript", f"{name}: {exc}")
            tally.unreadable += 1
            continue
        for label, transcript in transcripts:
            try:
                errors = _report(f"{name}{label}", transcript, args, tally)
            except _UnreadableError as exc:
                worst = fail("transcript", f"{name}{label}: {exc}")
                tally.unreadable += 1
                continue
            if errors and worst == EXIT_OK:
                worst = EXIT_FAILED
    if len(files) > 1:
        print(tally.line(len(files)))
    return worst


class _Tally:
    """What the summary line counts."""

    def __init__(self) -> None:
        self.ok = self.failed = self.unreadable = self.errors = self.warnings = 0

    def line(self, files: int) -> str:
        transcripts = self.ok + self.failed
        return (
            f"{_plural(files, 'file')}, {_plural(transcripts, 'transcript')}: {self.ok} ok, "
            f"{self.failed} failed, {self.unreadable} unreadable "
            f"({_plural(self.errors, 'error')}, {_plural(self.warnings, 'warning')})"
        )


def _expand(paths: Sequence[str], max_files: int) -> tuple[list[str], int]:
    """The files named by ``paths`` (a file as given; a directory's and a pattern's in
    name order), at most ``max_files + 1`` of them, and the exit status so far (2 when a
    directory or a pattern names no file, which is said on stderr)."""
    files: list[str] = []
    worst = EXIT_OK
    for path in paths:
        if os.path.isdir(path):
            found = _bounded(_under(path), max_files + 1 - len(files))
            why = f"no {' or '.join(_SUFFIXES)} file in this directory"
        elif glob.has_magic(path) and not os.path.exists(path):
            matches = (m for m in glob.iglob(path, recursive=True) if os.path.isfile(m))
            found = _bounded(matches, max_files + 1 - len(files))
            why = "the pattern matches no file"
        else:
            found, why = [path], ""
        if not found:
            worst = fail("transcript", f"{path}: {why}")
        files += found
        if len(files) > max_files:
            break
    return files, worst


def _under(directory: str) -> Iterator[str]:
    """The ``.json`` and ``.jsonl`` files under ``directory`` (symbolic links to
    directories are not followed, so a link loop cannot make the walk endless)."""
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            if name.endswith(_SUFFIXES):
                yield os.path.join(root, name)


def _bounded(found: Iterator[str], room: int) -> list[str]:
    """At most ``room`` of ``found``, sorted (a pattern's matches come in no order)."""
    return sorted(itertools.islice(found, max(room, 0)))


def _report(name: str, transcript: Any, args: argparse.Namespace, tally: _Tally) -> int:
    """Prints one summary line and the findings, counts them in ``tally``; returns the
    number of errors."""
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
    tally.errors += errors
    tally.warnings += warnings
    if errors:
        tally.failed += 1
    else:
        tally.ok += 1
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
