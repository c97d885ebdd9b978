"""Headless Chromium for the tests that look at pages: the DevTools protocol over a pipe.

Chromium comes from Debian's package (``apt-get install chromium``; ``.ci/run`` installs
it). Without it a browser test is skipped on a developer's machine and fails under
``CI=true``, where a skipped check would pass unseen.

The browser is driven over ``--remote-debugging-pipe`` (JSON messages ending in a NUL
byte on file descriptors 3 and 4), so there is no port and no client library; every
wait has a deadline. ``png_pixels`` reads the screenshots Chromium writes (8-bit RGB or
RGBA, not interlaced), so that a test can count what was drawn.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

NAMES: Final = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """The browser's path; skip the test without one, or fail it in CI."""
    for name in NAMES:
        found = shutil.which(name)
        if found is not None:
            return found
    if os.environ.get("CI") == "true":
        pytest.fail("Chromium is not installed; CI must have it (.ci/run installs it)")
    pytest.skip("Chromium is not installed (apt-get install chromium); CI runs this test")


class BrowserError(Exception):
    """The browser did not answer in time, or answered with an error."""


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, width: int = 1280, height: int = 1000, timeout: float = 60.0) -> None:
        self.timeout = timeout
        # Chromium's helper processes may still write the profile for a moment after the
        # browser exits: the group is ended together (close), and what is left of the
        # profile after that is not worth failing a test for.
        self._profile = tempfile.TemporaryDirectory(
            prefix="statemachine-chromium-", ignore_cleanup_errors=True
        )
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()
        args = [
            chromium(),
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",  # CI runs as root, where the sandbox refuses to start
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--hide-scrollbars",
            f"--user-data-dir={self._profile.name}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        # bash, not sh: dash redirects only the descriptors 0 to 9.
        script = f'exec "$0" "$@" 3<&{commands_read} 4>&{replies_write}'
        self._process = subprocess.Popen(
            ["bash", "-c", script, *args],
            pass_fds=(commands_read, replies_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, ended whole by close()
        )
        os.close(commands_read)
        os.close(replies_write)
        self._buffer = b""
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self._session = ""
        try:
            self._attach(width, height)
        except BaseException:
            self.close()  # a browser that did not start answering is not left behind
            raise

    def _attach(self, width: int, height: int) -> None:
        targets = self._call("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        attached = self._call("Target.attachToTarget", targetId=page["targetId"], flatten=True)
        self._session = attached["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        os.close(self._commands)
        os.close(self._replies)
        for signal_number in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal_number)
            try:
                self._process.wait(10)
                break
            except subprocess.TimeoutExpired:
                continue
        self._profile.cleanup()

    # -- the protocol ---------------------------------------------------------------------

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                raise BrowserError(f"no answer from Chromium within {self.timeout} s")
            chunk = os.read(self._replies, 1 << 20)
            if not chunk:
                raise BrowserError("Chromium closed the pipe (it exited)")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        return message

    def _call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self._ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params}
        if self._session:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == number:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command to the page; its result."""
        return self._call(method, **params)

    def wait_event(self, method: str) -> dict[str, Any]:
        """The first event named ``method`` not seen yet (waiting for it if need be)."""
        deadline = time.monotonic() + self.timeout
        while True:
            for i, event in enumerate(self.events):
                if event["method"] == method:
                    del self.events[i]
                    return event
            message = self._message(deadline)
            if "method" in message:
                self.events.append(message)

    # -- what the tests use ---------------------------------------------------------------

    def open(self, path: Path, fragment: str = "") -> None:
        """Load ``path`` (a file, through ``file://``; ``fragment`` after a ``#``) and
        wait for its load event."""
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        url = path.resolve().as_uri() + (f"#{fragment}" if fragment else "")
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression!r} raised: {details.get('exception', details)}")
        return result["result"].get("value")

    def screenshot(self) -> bytes:
        """The page's viewport as PNG."""
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])


@contextlib.contextmanager
def offline_browser(width: int, height: int) -> Iterator[Browser]:
    """A browser with the network off, as a reader behind a proxy or on a train:
    anything a page fetched would fail."""
    with Browser(width=width, height=height) as b:
        b.call("Network.enable")
        b.call(
            "Network.emulateNetworkConditions",
            offline=True,
            latency=0,
            downloadThroughput=-1,
            uploadThroughput=-1,
        )
        yield b


def keep(name: str, png: bytes, smallest_text: float | None = None) -> None:
    """Keep a screenshot as ``name`` in ``$STATEMACHINE_SCREENSHOTS``, when it is set,
    with the smallest text height measured in it (``smallest-text.tsv`` there)."""
    directory = os.environ.get("STATEMACHINE_SCREENSHOTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / name).write_bytes(png)
        if smallest_text is not None:
            with (Path(directory) / "smallest-text.tsv").open("a", encoding="utf-8") as f:
                f.write(f"{name}\t{smallest_text:.1f}\n")


SHOWN_TEXT_HEIGHTS: Final = """
(selector => [...document.querySelectorAll(selector)]
  .filter(t => !t.closest('details:not([open])') && t.textContent.trim() !== ''
               && t.getClientRects().length > 0)
  .map(t => [t.textContent.trim(), t.getBoundingClientRect().height]))
"""


def text_heights(browser: Browser, selector: str) -> dict[str, float]:
    """How high, in CSS pixels of the page as shown, each text ``selector`` matches is
    drawn (its bounding box as the browser lays it out: SVG scaled to its box included);
    text in a closed ``<details>`` is not shown and not measured. Keyed by the text, the
    smallest height of each."""
    pairs = browser.evaluate(f"({SHOWN_TEXT_HEIGHTS})({json.dumps(selector)})")
    heights: dict[str, float] = {}
    for text, height in pairs:
        heights[text] = min(height, heights.get(text, height))
    return heights


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows of RGB pixels (3 bytes each) of an 8-bit PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    chunks: list[tuple[bytes, bytes]] = []
    at = 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        chunks.append((png[at + 4 : at + 8], png[at + 8 : at + 8 + length]))
        at += 12 + length
    header = next(data for kind, data in chunks if kind == b"IHDR")
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"an 8-bit RGB(A) PNG was expected (depth {depth}, colour {colour})")
    size = 3 if colour == 2 else 4
    data = zlib.decompress(b"".join(data for kind, data in chunks if kind == b"IDAT"))
    stride = width * size
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, row = data[start], bytearray(data[start + 1 : start + 1 + stride])
        for x in range(stride) if kind else ():
            left = row[x - size] if x >= size else 0
            up = previous[x]
            corner = previous[x - size] if x >= size else 0
            if kind == 1:
                row[x] = (row[x] + left) & 0xFF
            elif kind == 2:
                row[x] = (row[x] + up) & 0xFF
            elif kind == 3:
                row[x] = (row[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                row[x] = (row[x] + best) & 0xFF
        previous = row
        rgb = bytearray(width * 3)
        for channel in range(3):
            rgb[channel::3] = row[channel::size]
        rows.append(bytes(rgb))
    return width, height, rows


def pixels_of(rows: list[bytes], colour: tuple[int, int, int]) -> Iterator[tuple[int, int]]:
    """The (x, y) of every pixel of exactly ``colour``."""
    want = bytes(colour)
    for y, row in enumerate(rows):
        for x in range(0, len(row), 3):
            if row[x : x + 3] == want:
                yield x // 3, y
