"""A stdio server's stdout, read as UTF-8 lines that say when they are not.

The SDK's stdio transport decodes the server's stdout with the codec it is told
(``StdioServerParameters.encoding``), one line a message. Bytes that are not UTF-8
stop its reader for good, and a line without end grows its buffer without bound;
either way the session is never told, so every request waits out its deadline (or
forever). Nor is anything told when the server exits (only a request sent after
fails). The transport is given the codec registered here instead: UTF-8, which also
tells the connection (``watching``, set by the task that opens it) the moment the
bytes are not UTF-8 or a line runs past ``max_line_bytes`` (and then stops the reader
as strict UTF-8 would), or the stream ends. The connection treats that as its end.
"""

from __future__ import annotations

import codecs
import contextlib
import contextvars
from collections.abc import Callable, Iterator

import attrs
from typing_extensions import Buffer

from statemachine.errors import MCPError

__all__ = ["ENCODING", "watching"]

ENCODING = "statemachine_mcp_stdout"
"""The codec's name, for ``StdioServerParameters.encoding``."""


@attrs.frozen
class _Watch:
    broken: Callable[[str], None]  # told once, why the stdout cannot be read on
    max_line_bytes: int


_WATCH: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar(
    "statemachine_mcp_stdout", default=None
)


@contextlib.contextmanager
def watching(broken: Callable[[str], None], max_line_bytes: int) -> Iterator[None]:
    """Within this block (and the tasks started from it), a stdout decoded with
    ``ENCODING`` tells ``broken`` why it cannot be read on."""
    token = _WATCH.set(_Watch(broken, max_line_bytes))
    try:
        yield
    finally:
        _WATCH.reset(token)


class _Decoder(codecs.IncrementalDecoder):
    def __init__(self, errors: str = "strict") -> None:
        super().__init__(errors)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors)
        # The watch of the connection whose reader builds this decoder.
        self._watch = _WATCH.get()
        self._line = 0  # bytes of the line not ended yet

    def decode(self, input: Buffer, final: bool = False) -> str:
        watch = self._watch
        if watch is None:
            return self._utf8.decode(input, final)
        if final:  # the reader calls this once at the end of the stream
            watch.broken("its stdout ended (the server exited, or closed it)")
        data = bytes(input)
        end = data.rfind(b"\n")
        longest = self._line + (end if end >= 0 else len(data))
        self._line = len(data) - end - 1 if end >= 0 else longest
        if max(longest, self._line) > watch.max_line_bytes:
            reason = (
                f"it wrote a line of more than {watch.max_line_bytes} bytes on its stdout "
                "(max_message_bytes)"
            )
            watch.broken(reason)
            raise MCPError(reason)  # stops the SDK's reader, which drains the rest
        try:
            return self._utf8.decode(data, final)
        except UnicodeDecodeError as exc:
            shown = data[exc.start : exc.end][:8]
            watch.broken(
                f"it wrote bytes that are not UTF-8 on its stdout ({shown!r}: {exc.reason})"
            )
            raise

    def reset(self) -> None:
        self._utf8.reset()
        self._line = 0


def _search(name: str) -> codecs.CodecInfo | None:
    if name.replace("-", "_") != ENCODING:
        return None
    utf8 = codecs.lookup("utf-8")
    return codecs.CodecInfo(
        name=ENCODING,
        encode=utf8.encode,
        decode=utf8.decode,
        incrementalencoder=utf8.incrementalencoder,
        incrementaldecoder=_Decoder,
        streamreader=utf8.streamreader,
        streamwriter=utf8.streamwriter,
    )


codecs.register(_search)
