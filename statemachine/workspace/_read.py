"""``read_file``: a UTF-8 text file of the workspace, paged by line, bounded in memory.

Only regular files are opened (non-blocking, the kind checked again on the opened
descriptor); binary files are refused; a long file is cut at a line boundary with a
note giving the offset to read on from (see the package docstring).
"""

from __future__ import annotations

import codecs
import errno
import io
import itertools
import os
import stat
from collections.abc import Iterable

from statemachine.core.tools import ToolOutput
from statemachine.workspace._root import _count, _RefusalError, printable
from statemachine.workspace._search import _Suggesting

_SNIFF_BYTES = 8192
# What read_file holds of a file besides its max_bytes, and how far it reads to find
# the line to start at.
_CHUNK_BYTES = 64 * 1024
_SKIP_LIMIT_BYTES = 1024 * 1024 * 1024

_NOT_REGULAR = "{rel} is not a regular file (a device, socket or FIFO)."


def _nth_newline(chunk: bytes, n: int) -> int:
    """The index of the ``n``-th newline of ``chunk`` (which has at least ``n``)."""
    at = -1
    for _ in range(n):
        at = chunk.index(b"\n", at + 1)
    return at


class _Reader(_Suggesting):
    """The ``read_file`` operation of a workspace."""

    def read_file(self, path: str, offset: int = 1) -> ToolOutput:
        """The text of ``path`` from line ``offset`` (1-based), or a refusal."""
        try:
            return ToolOutput(printable(self._read(path, offset)))
        except _RefusalError as exc:
            return ToolOutput(printable(str(exc)), is_error=True)

    def _read(self, raw: str, offset: int) -> str:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
            raise _RefusalError(f"offset must be a line number of 1 or more, got {offset!r}.")
        target, rel = self._resolve(raw)
        try:
            # Opening some devices acts on them (a watchdog starts, a tape rewinds):
            # what is not a file or a directory now is not opened at all.
            self._check_kind(os.stat(target).st_mode, rel)
            # Non-blocking: opening a FIFO would otherwise wait for a writer. The kind
            # is judged again on the opened descriptor, against a swap in between.
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise self._not_found(raw, rel, want_dir=False) from None
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a socket, or a device with no driver
                raise _RefusalError(_NOT_REGULAR.format(rel=rel)) from None
            raise _RefusalError(f"Cannot read {rel}: {exc.strerror or exc}.") from None
        try:
            info = os.fstat(fd)
            self._check_kind(info.st_mode, rel)
            with open(fd, "rb", buffering=0, closefd=False) as f:
                return self._read_text(f, rel, info.st_size, offset)
        except OSError as exc:
            raise _RefusalError(f"Cannot read {rel}: {exc.strerror or exc}.") from None
        finally:
            os.close(fd)

    @staticmethod
    def _check_kind(mode: int, rel: str) -> None:
        if stat.S_ISDIR(mode):
            raise _RefusalError(
                f"{rel} is a directory, not a file. Use list_files with path={rel!r} to "
                "see what it holds."
            )
        if not stat.S_ISREG(mode):
            raise _RefusalError(_NOT_REGULAR.format(rel=rel))

    def _read_text(self, f: io.RawIOBase, rel: str, size: int, offset: int) -> str:
        head = f.read(_SNIFF_BYTES) or b""
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            # final=False: a character cut by the window's end is not an error.
            decoder.decode(head, final=len(head) < _SNIFF_BYTES)
            binary = b"\x00" in head
        except UnicodeDecodeError:
            binary = True
        if binary:
            raise _RefusalError(
                f"{rel} is a binary file ({size} bytes); read_file returns text only."
            )
        if not head:
            return f"[{rel} is empty.]"
        rest = iter(lambda: f.read(_CHUNK_BYTES) or b"", b"")
        return self._page(itertools.chain([head], rest), rel, size, offset)

    def _page(self, chunks: Iterable[bytes], rel: str, size: int, offset: int) -> str:
        """The text from line ``offset`` on, reading no more than ``max_bytes + 1``
        bytes past its start (the extra byte tells whether anything was cut)."""
        line_no = 1  # the line the next byte belongs to
        ends_with_newline = False
        out = bytearray()
        limit = self.max_bytes + 1
        skipped = 0
        for chunk in chunks:
            ends_with_newline = chunk.endswith(b"\n")
            if line_no < offset:
                count = chunk.count(b"\n")
                if line_no + count < offset:
                    line_no += count
                    skipped += len(chunk)
                    if skipped > _SKIP_LIMIT_BYTES:
                        raise _RefusalError(
                            f"read_file skips at most {_SKIP_LIMIT_BYTES} bytes to find the "
                            f"line to start at; line {offset} of {rel} lies further in "
                            f"(past line {line_no - 1})."
                        )
                    continue
                chunk = chunk[_nth_newline(chunk, offset - line_no) + 1 :]
                line_no = offset
            out += chunk[: limit - len(out)]
            if len(out) == limit:
                break
        if not out and offset > 1:
            lines = line_no - 1 if ends_with_newline else line_no
            raise _RefusalError(
                f"offset {offset} is past the end of {rel}, which has "
                f"{_count(lines, 'line', 'lines')}."
            )
        if len(out) < limit:
            return out.decode("utf-8", errors="replace")
        return self._truncated(bytes(out[: self.max_bytes]), rel, size, offset)

    def _truncated(self, body: bytes, rel: str, size: int, offset: int) -> str:
        cut = body.rfind(b"\n") + 1
        if cut:
            last = offset + body.count(b"\n", 0, cut) - 1
            text = body[:cut].decode("utf-8", errors="replace")
            return (
                f"{text}[Truncated: showing lines {offset}-{last} of {rel} ({size} bytes in "
                f"all, {self.max_bytes}-byte limit). Call read_file with offset={last + 1} "
                "to read on.]"
            )
        # One line longer than the whole budget: show its start anyway, without the
        # character the cut may have split.
        text = codecs.getincrementaldecoder("utf-8")("replace").decode(body, final=False)
        return (
            f"{text}\n[Truncated: line {offset} of {rel} is longer than {self.max_bytes} "
            f"bytes; only its start is shown. Call read_file with offset={offset + 1} to "
            "read on after it.]"
        )
