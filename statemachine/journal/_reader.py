"""Reading a journal's lines, whatever they hold: each line within a length cap
(found before the line is whole in memory), and the exact reading of a line (the
stdlib's json with the journal's limits), whose every failure is a ``JournalError``
naming the line and saying what is wrong.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable, Iterator
from typing import IO, Any, Final

from statemachine.journal._format import JournalError, short

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "EXACT_DECODER",
    "HEADER_DECODER",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "Lines",
    "decode_exact",
    "open_lines",
]

DEFAULT_MAX_LINE_BYTES: Final = 16 * 1024 * 1024
"""The longest journal line ``replay`` reads (bytes of UTF-8; characters for lines given as
``str``): a longer line is a ``JournalError``, found before the line is read whole."""

MAX_DEPTH: Final = 320
"""How deeply a journal line may nest arrays and objects (the record itself takes six
levels around a tool call's arguments). Deeper lines are a ``JournalError``: the run that
wrote them could not have gone much deeper (the interpreter's recursion limit bounds the
history's own encoding), and replay's decoding and digest recurse as deeply."""

MAX_INT_DIGITS: Final = 1000
"""The longest integer (in digits) a journal may hold: converting a longer one costs
time quadratic in its length, and no count or argument a run records needs it."""

_CHUNK_BYTES: Final = 256 * 1024


class Lines:
    """The lines of a journal, each with its number; raises ``JournalError`` for a line
    over the cap before it is whole in memory. ``unterminated`` says whether the last
    line given out was the journal's last and had no newline (it was cut off)."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.number = 0
        self.unterminated = False

    def __iter__(self) -> Iterator[bytes | str]:
        raise NotImplementedError

    def too_long(self) -> JournalError:
        return JournalError(
            self.number,
            f"the line is longer than {self.max_line_bytes:,} bytes (replay's "
            "max_line_bytes): a journal line is one engine event or the header",
        )


class _FileLines(Lines):
    """A file read in chunks: memory holds at most one line of up to the cap and one
    chunk, however long a line is."""

    def __init__(self, stream: IO[bytes], max_line_bytes: int) -> None:
        super().__init__(max_line_bytes)
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        cap = self.max_line_bytes
        head: list[bytes] = []  # the start of a line that goes on in the next chunk
        held = 0
        while chunk := self._stream.read(_CHUNK_BYTES):
            *lines, rest = chunk.split(b"\n")
            for line in lines:
                self.number += 1
                if head:
                    line = b"".join([*head, line])
                    head.clear()
                    held = 0
                if len(line) > cap:
                    raise self.too_long()
                yield line
            if rest:
                held += len(rest)
                if held > cap:
                    self.number += 1
                    raise self.too_long()
                head.append(rest)
        if head:
            self.number += 1
            self.unterminated = True
            yield b"".join(head)


class _TextLines(Lines):
    """Lines given as strings (each ending with its newline, as a file gives them)."""

    def __init__(self, lines: Iterable[str], max_line_bytes: int) -> None:
        super().__init__(max_line_bytes)
        self._lines = lines

    def __iter__(self) -> Iterator[bytes | str]:
        lines = iter(self._lines)
        line = next(lines, None)
        while line is not None:
            following = next(lines, None)
            self.number += 1
            if not isinstance(line, str):
                raise JournalError(
                    self.number, f"expected a line of text, got {type(line).__name__}"
                )
            if len(line) > self.max_line_bytes:
                raise self.too_long()
            self.unterminated = following is None and not line.endswith("\n")
            raw: bytes | str
            try:
                raw = line.encode()
            except UnicodeEncodeError:
                raw = line  # a lone surrogate: the exact decoder reads the text itself
            yield raw
            line = following


# -- decoding a line ------------------------------------------------------------------------


class _RefusedValueError(ValueError):
    """A JSON value the journal does not accept (raised by the exact decoder's hooks)."""


def _refuse_constant(name: str) -> Any:
    raise _RefusedValueError(f"{name} is not a JSON number")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _RefusedValueError(
            f"an integer of {len(text.lstrip('-')):,} digits (a journal holds at most "
            f"{MAX_INT_DIGITS:,})"
        )
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _RefusedValueError(f"{short(text, 30)} is out of the range of a number")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise _RefusedValueError(f"the key {twice!r} appears twice in one object")
    return out


EXACT_DECODER: Final = json.JSONDecoder(
    parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_refuse_constant
)
HEADER_DECODER: Final = json.JSONDecoder(
    parse_int=_bounded_int,
    parse_float=_finite_float,
    parse_constant=_refuse_constant,
    object_pairs_hook=_unique_keys,
)


def _brackets(raw: bytes | str) -> int:
    """An upper bound of how deeply ``raw`` nests (a bracket in a string counts too)."""
    if isinstance(raw, bytes):
        return raw.count(b"[") + raw.count(b"{")
    return raw.count("[") + raw.count("{")


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests deeper than ``limit`` (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if type(item) is dict:
            stack.extend((v, depth + 1) for v in item.values() if type(v) in (dict, list))
        elif type(item) is list:
            stack.extend((v, depth + 1) for v in item if type(v) in (dict, list))
    return False


def _too_deep(number: int) -> JournalError:
    return JournalError(
        number, f"the line nests arrays and objects more than {MAX_DEPTH} levels deep"
    )


def decode_exact(raw: bytes | str, lines: Lines, decoder: json.JSONDecoder) -> Any:
    """The stdlib's reading of one line, with the journal's limits; every failure is a
    ``JournalError`` naming the line and saying what is wrong."""
    number = lines.number
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JournalError(
                number, f"not UTF-8 text (byte {exc.start + 1} of the line: {exc.reason})"
            ) from None
    else:
        text = raw
    if not text.strip():
        raise JournalError(number, "blank line: a journal has no empty lines")
    try:
        value = decoder.decode(text)
    except json.JSONDecodeError as exc:
        hint = (
            " (the line has no newline at its end: the journal was cut off while it "
            "was being written)"
            if lines.unterminated
            else ""
        )
        raise JournalError(
            number, f"not valid JSON: {exc.msg} (column {exc.colno}){hint}"
        ) from None
    except _RefusedValueError as exc:
        raise JournalError(number, str(exc)) from None
    except RecursionError:
        raise _too_deep(number) from None
    if _brackets(raw) > MAX_DEPTH and _depth_exceeds(value, MAX_DEPTH):
        raise _too_deep(number)
    return value


@contextlib.contextmanager
def open_lines(
    source: str | os.PathLike[str] | Iterable[str], max_line_bytes: int
) -> Iterator[Lines]:
    if not isinstance(source, (str, os.PathLike)):
        yield _TextLines(source, max_line_bytes)
        return
    try:
        stream = open(source, "rb")  # noqa: SIM115 - closed below, after the replay
    except OSError as exc:
        raise JournalError(0, f"cannot read journal {os.fspath(source)!r}: {exc}") from None
    with stream:
        yield _FileLines(stream, max_line_bytes)
