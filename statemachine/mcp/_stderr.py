"""A stdio server's stderr: passed on as it arrives, its end kept for the errors.

A server that cannot start says why on its stderr (``can't open file``, a traceback, a
missing module); the protocol only sees the connection close. So the stderr goes through
a pipe that a thread reads to its end: every piece goes on to where the server's stderr
would have gone (``MCPServer.stdio(stderr=...)``, else this process's stderr), and the
last ``MAX_STDERR_CHARS`` characters are kept for the ``MCPError`` that says the server
could not be reached.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import sys
import threading
from typing import TextIO

__all__ = ["MAX_STDERR_CHARS", "StderrTail", "with_stderr"]

MAX_STDERR_CHARS = 2_000
"""How much of a stdio server's stderr (its last characters) a connection error quotes."""

_READ_BYTES = 4096
_EXIT_WAIT = 2.0
"""Seconds to wait for the end of a stopped server's stderr (a child it started may
hold the pipe open; the error then quotes what arrived)."""


class StderrTail:
    """The pipe a stdio server writes its stderr to (``errlog``, for the SDK), read to its
    end by a thread of its own."""

    def __init__(self, sink: TextIO | None) -> None:
        read_end, write_end = os.pipe()
        self.errlog: TextIO = open(write_end, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._sink = sink
        self._lock = threading.Lock()
        self._text = ""
        self._cut = False
        self._ended = threading.Event()
        threading.Thread(
            target=self._read, args=(read_end,), name="MCP server stderr", daemon=True
        ).start()

    def close(self) -> None:
        """Close this process's end of the pipe, once the server has been started or has
        failed to start: the reader ends when the server's end closes too."""
        with contextlib.suppress(OSError):
            self.errlog.close()

    async def ended(self) -> str:
        """``text()`` once the server's stderr has ended (the server stopped), or after
        a few seconds if something still holds it open."""
        self.close()
        await asyncio.to_thread(self._ended.wait, _EXIT_WAIT)
        return self.text()

    def text(self) -> str:
        """What the server wrote last, at most ``MAX_STDERR_CHARS`` characters, with a
        line to say so if it wrote more; ``""`` if it wrote nothing."""
        with self._lock:
            text, cut = self._text.strip(), self._cut
        if not text:
            return ""
        if cut:
            return f"its stderr ends with (the last {MAX_STDERR_CHARS} characters):\n{text}"
        return f"its stderr:\n{text}"

    def _read(self, read_end: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while chunk := os.read(read_end, _READ_BYTES):
                self._add(decoder.decode(chunk))
            self._add(decoder.decode(b"", final=True))
        except OSError:
            pass  # nothing more can be read: what arrived is kept
        finally:
            os.close(read_end)
            self._ended.set()

    def _add(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            kept = self._text + text
            self._cut = self._cut or len(kept) > MAX_STDERR_CHARS
            self._text = kept[-MAX_STDERR_CHARS:]
        sink = self._sink if self._sink is not None else sys.stderr
        # Where it would have gone, as it would have: a sink that fails loses only this.
        with contextlib.suppress(Exception):
            sink.write(text)
            sink.flush()


def with_stderr(message: str, tail: StderrTail | None) -> str:
    """``message``, followed by what the server wrote to its stderr, if anything."""
    text = tail.text() if tail is not None else ""
    return f"{message}; {text}" if text else message
