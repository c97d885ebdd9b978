r"""Workspace tools: ``list_files`` and ``read_file``, confined to one root directory.

This module owns the file tools that the demo runs and that users can hand to
``run_agent`` as they are. Everything a model can ask for is refused with an error
tool result (``ToolOutput(..., is_error=True)``) whose text says what to do instead,
because a refusal the model can act on is fixed in the next turn, while an exception
would only end the conversation.

Confinement
-----------
A path is always relative to the root. It is refused when it is absolute, when its
``..`` parts climb above the root (``src/../README.md`` is fine, ``../x`` is not), or
when the file it names resolves, through symlinks, to a place outside the root. The
check runs on the real path just before the access; a symlink swapped between the
check and the open is outside what this module defends against (run untrusted
agents in a container), though the open never blocks and only a regular file is read.

What ``list_files`` shows
-------------------------
Files under the asked directory (the root by default), depth first, each
directory's entries sorted by name (code point order), so the listing is the same on
every machine. Paths are relative to the root, so each line can be passed to
``read_file`` as it is. An empty directory is shown as ``name/``. Not shown:

- directories whose name is in ``IGNORED_DIRS`` or ends with ``.egg-info``
  (version control, virtual environments, caches, build output). The rule applies
  only while descending: asking for such a directory by path lists it;
- symlinked directories (not followed: that avoids cycles, and what they point to
  inside the root is listed under its own path);
- symlinks that lead outside the root, or nowhere.

A listing stops after ``max_entries`` lines (default 200) or ``max_bytes`` bytes
(default 64 KiB), whichever comes first; the walk then goes on, showing nothing, to
count what was left out ("... and 57 more entries"), up to 20,000 entries (beyond
that, "more than 20000"). Every omission is stated in a closing ``[...]`` note, so
the model knows what it did not see and how to see it; a note names at most 5 paths
and counts the rest.

What ``read_file`` returns
--------------------------
The text of a UTF-8 file (undecodable bytes after the first 8 KiB are replaced,
not fatal), from line ``offset`` on, up to ``max_bytes`` (default 64 KiB). A longer
file is cut at a line boundary with a note naming the ``offset`` to read on from; a
single line longer than ``max_bytes`` is cut inside it. The file is read in chunks
of 64 KiB and reading stops at ``max_bytes`` whatever the lines look like, so a call
holds about ``max_bytes`` of the file in memory, never the whole file. Skipping to
``offset`` reads through the file chunk by chunk, and gives up after 1 GiB, so that
one call stays short. Binary files (a NUL byte,
or invalid UTF-8, in the first 8 KiB) are refused; so are directories, devices,
sockets and FIFOs, which are never opened. A file is opened non-blocking and the
*opened* descriptor is checked again, so a FIFO swapped in after the check is refused
too, at once.

A missing path gets "Did you mean" suggestions: ``difflib`` matches against the
workspace's relative paths and, separately, against their base names, so both
``src/maths.ts`` and a bare ``maths.ts`` find ``src/math.ts``. Only what the tool
would accept is suggested (regular files, or symlinks to one inside the root, for
``read_file``; directories for ``list_files``), never a dangling symlink. The scan
for candidates stops after 20,000 paths.

File names that are not UTF-8
-----------------------------
POSIX file names are bytes. A byte that is not part of valid UTF-8 is shown as
``\xNN`` (Python's escape for it), and a lone surrogate a model sent as ``\uNNNN``,
so every tool result is valid UTF-8: the journal and the next provider request can
always encode it. An escaped path passed back to either tool names the file it was
shown for.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import difflib
import errno
import functools
import io
import itertools
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.errors import InvalidInputError
from statemachine.core.tools import ToolDefinition, ToolExecute, ToolOutput, ToolReturn

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "IGNORED_DIRS",
    "Workspace",
    "list_files_tool",
    "printable",
    "read_file_tool",
    "workspace_tools",
]

IGNORED_DIRS: frozenset[str] = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        "__pycache__",
        "node_modules",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".hypothesis",
        ".tox",
        ".nox",
        ".idea",
        ".eggs",
    }
)
"""Directory names that ``list_files`` does not descend into (plus ``*.egg-info``)."""

DEFAULT_MAX_ENTRIES = 200
"""Lines a listing shows before it stops with a note."""

DEFAULT_MAX_BYTES = 64 * 1024
"""Bytes of text ``read_file`` returns, and of paths ``list_files`` shows, before
each stops with a note."""

# How much of a file decides whether it is text; the same window git uses.
_SNIFF_BYTES = 8192
# What read_file holds of a file besides its max_bytes, and how far it reads to find
# the line to start at.
_CHUNK_BYTES = 64 * 1024
_SKIP_LIMIT_BYTES = 1024 * 1024 * 1024
# Bounds the walk made to find "did you mean" candidates in a huge tree, and the
# walk that counts what a stopped listing left out.
_SUGGESTION_SCAN_LIMIT = 20_000
_COUNT_LIMIT = 20_000
# Paths a note names before it only counts the rest.
_NOTE_PATHS = 5
_MAX_SUGGESTIONS = 3
_SUGGESTION_CUTOFF = 0.7


_NOT_REGULAR = "{rel} is not a regular file (a device, socket or FIFO)."


class _RefusalError(Exception):
    """A request the tool answers with an error result; the text is for the model."""


# os.fsdecode turns a byte that is not UTF-8 into a lone surrogate (U+DC80-U+DCFF),
# which no strict UTF-8 encoder accepts; a model may also send a lone surrogate.
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_BYTE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if code >= 0xDC80 else f"\\u{code:04x}"


def printable(text: str) -> str:
    r"""``text`` with every lone surrogate escaped (``\xNN`` for an undecodable byte
    of a file name), so that it encodes as UTF-8 with ``errors="strict"``."""
    return _SURROGATE.sub(_escape, text)


def _unescape(path: str) -> str:
    """The file name ``printable`` showed as ``path``."""
    return _ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), path)


def _some(paths: list[str], total: int) -> str:
    """The first paths of a note and a count of the rest."""
    rest = total - len(paths)
    return ", ".join(paths) + (f" and {rest} more" if rest > 0 else "")


def _nth_newline(chunk: bytes, n: int) -> int:
    """The index of the ``n``-th newline of ``chunk`` (which has at least ``n``)."""
    at = -1
    for _ in range(n):
        at = chunk.index(b"\n", at + 1)
    return at


class _Skipped:
    """What a listing left out, by kind: a count and the first few paths."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.paths: dict[str, list[str]] = {}
        self.noise_names: set[str] = set()
        self.more_noise_names = False

    def __call__(self, kind: str, path: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind == "noise":
            # Named by base name, each once: ".git" rather than every repo's path.
            name = PurePosixPath(path).name
            if len(self.noise_names) < _NOTE_PATHS:
                self.noise_names.add(name)
            elif name not in self.noise_names:
                self.more_noise_names = True
            return
        paths = self.paths.setdefault(kind, [])
        if len(paths) < _NOTE_PATHS:
            paths.append(path)

    def note(self, kind: str) -> str:
        return _some(self.paths.get(kind, []), self.counts.get(kind, 0))


def _join_choices(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _closest(wanted: str, pool: list[str]) -> list[str]:
    """The paths of ``pool`` most like ``wanted``, best first, ties by path.

    A path scores the better of its whole-path and its base-name similarity, so a
    bare ``maths.ts`` finds ``src/math.ts``. Only paths close to the best score are
    kept: one good suggestion beats three where two are noise.
    """
    base = PurePosixPath(wanted).name
    whole = difflib.SequenceMatcher(b=wanted, autojunk=False)
    name = difflib.SequenceMatcher(b=base, autojunk=False)
    scored: list[tuple[float, str]] = []
    for path in pool:
        best = 0.0
        for matcher, candidate in ((whole, path), (name, PurePosixPath(path).name)):
            matcher.set_seq1(candidate)
            # The cheap upper bounds first, as difflib.get_close_matches does.
            if (
                matcher.real_quick_ratio() >= _SUGGESTION_CUTOFF
                and matcher.quick_ratio() >= _SUGGESTION_CUTOFF
            ):
                best = max(best, matcher.ratio())
        if best >= _SUGGESTION_CUTOFF:
            scored.append((best, path))
    if not scored:
        return []
    scored.sort(key=lambda item: (-item[0], item[1]))
    top = scored[0][0]
    return [path for score, path in scored[:_MAX_SUGGESTIONS] if score >= top - 0.1]


class Workspace:
    """A root directory and the two file operations allowed inside it.

    The methods are blocking and return a ``ToolOutput``; the tools built by
    ``tools()`` run them in a worker thread. ``max_entries`` (default 200) caps the
    lines of a listing; ``max_bytes`` (default 64 KiB) caps the text ``read_file``
    returns and the paths a listing shows; the module docstring lists the fixed
    bounds (the 64 KiB read chunk, the 20,000-path scans, 5 paths per note).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ignored_dirs: Iterable[str] = IGNORED_DIRS,
    ) -> None:
        for name, value in (("max_entries", max_entries), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
        try:
            resolved = Path(root).resolve(strict=True)
        except (OSError, RuntimeError) as exc:
            raise InvalidInputError(f"workspace root {os.fspath(root)!r} does not exist") from exc
        if not resolved.is_dir():
            raise InvalidInputError(f"workspace root {os.fspath(root)!r} is not a directory")
        self.root = resolved
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ignored_dirs = frozenset(ignored_dirs)

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def is_ignored(self, name: str) -> bool:
        """Whether ``list_files`` skips a directory of this name while descending."""
        return name in self.ignored_dirs or name.endswith(".egg-info")

    # -- paths -----------------------------------------------------------------------

    def resolve(self, path: str) -> tuple[Path, str]:
        """The absolute path for ``path`` and its normalised relative form.

        Raises ``ValueError`` with a message for the model when the path is not
        allowed. The path need not exist.
        """
        try:
            return self._resolve(path)
        except _RefusalError as exc:
            raise ValueError(str(exc)) from None

    def _resolve(self, raw: str) -> tuple[Path, str]:
        literal = self._resolve_exact(raw)
        if _ESCAPED_BYTE.search(raw) and not os.path.lexists(literal[0]):
            # A name shown escaped (a file whose name really holds "\xNN" comes first).
            with contextlib.suppress(_RefusalError):
                found = self._resolve_exact(_unescape(raw))
                if os.path.lexists(found[0]):
                    return found
        return literal

    def _resolve_exact(self, raw: str) -> tuple[Path, str]:
        if "\x00" in raw:
            raise _RefusalError(f"Invalid path {raw!r}: it contains a NUL character.")
        try:
            os.fsencode(raw)
        except UnicodeError:
            raise _RefusalError(
                f"Invalid path {printable(raw)}: it holds a lone surrogate, which no file "
                "name can. Use a path as list_files prints it."
            ) from None
        pure = PurePosixPath(raw)
        # "~/x" is a file named "~" to the OS, but a model that writes it means $HOME.
        if raw == "~" or raw.startswith("~/"):
            raise _RefusalError(
                f"Home-relative paths are not allowed: {raw}. Use a path relative to the "
                "workspace root, as list_files prints them (for example README.md)."
            )
        if pure.is_absolute():
            raise _RefusalError(
                f"Absolute paths are not allowed: {raw}. Use a path relative to the "
                "workspace root, as list_files prints them (for example README.md)."
            )
        parts: list[str] = []
        for part in pure.parts:
            if part == "..":
                if not parts:
                    raise _RefusalError(
                        f"Path escapes the workspace: {raw}. Paths must stay inside the "
                        "workspace root; use list_files to see what is there."
                    )
                parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        candidate = self.root.joinpath(*parts)
        # Lexically inside; only a symlink can still lead out, so check the real path.
        try:
            real = candidate.resolve()
        except (OSError, RuntimeError):
            raise _RefusalError(
                f"Cannot resolve {raw}: a symlink loop. Use list_files to see real paths."
            ) from None
        if not real.is_relative_to(self.root):
            raise _RefusalError(
                f"Path leads outside the workspace through a symlink: {raw}. Only files "
                "inside the workspace root can be used."
            )
        return candidate, "/".join(parts) or "."

    def _walk(
        self, top: Path, rel_top: str, on_skip: Callable[[str, str], None]
    ) -> Iterator[tuple[str, bool]]:
        """Depth-first ``(relative path, is_dir)`` pairs under ``top``, sorted by name.

        Yields files, and directories that turned out empty as ``(path, True)``.
        ``on_skip(kind, path)`` hears about every omission (kind: ``noise``,
        ``dirlink``, ``outside``, ``unreadable``).
        """
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            on_skip("unreadable", rel_top)
            return
        shown = 0
        for entry in entries:
            rel = f"{rel_top}/{entry.name}" if rel_top != "." else entry.name
            try:
                if entry.is_symlink():
                    try:
                        real = Path(entry.path).resolve(strict=True)
                    except (OSError, RuntimeError):  # dangling, or a loop
                        on_skip("outside", rel)
                        continue
                    if not real.is_relative_to(self.root):
                        on_skip("outside", rel)
                        continue
                    if real.is_dir():
                        on_skip("dirlink", rel)
                        continue
                    shown += 1
                    yield rel, False
                elif entry.is_dir(follow_symlinks=False):
                    if self.is_ignored(entry.name):
                        on_skip("noise", rel)
                        continue
                    before = shown
                    for item in self._walk(Path(entry.path), rel, on_skip):
                        shown += 1
                        yield item
                    if shown == before:
                        shown += 1
                        yield rel + "/", True
                else:
                    shown += 1
                    yield rel, False
            except (OSError, RuntimeError):
                on_skip("unreadable", rel)

    def _not_found(self, raw: str, rel: str, *, want_dir: bool) -> _RefusalError:
        """A refusal for a missing path, with the closest existing paths."""
        files: list[str] = []
        dirs: list[str] = []
        for path, is_dir in self._walk_all():
            (dirs if is_dir else files).append(path)
        suggestions = _closest(rel, dirs if want_dir else files)
        what = "Directory" if want_dir else "File"
        message = f"{what} not found: {raw}."
        if suggestions:
            return _RefusalError(f"{message} Did you mean {_join_choices(suggestions)}?")
        return _RefusalError(f"{message} Use list_files to see the files in the workspace.")

    def _walk_all(self) -> Iterator[tuple[str, bool]]:
        """Every file and directory (``(path, is_dir)``), bounded, for suggestions."""
        count = 0
        stack = [(self.root, "")]
        while stack and count < _SUGGESTION_SCAN_LIMIT:
            top, rel_top = stack.pop()
            try:
                with os.scandir(top) as it:
                    entries = sorted(it, key=lambda e: e.name, reverse=True)
            except OSError:
                continue
            for entry in entries:
                rel = f"{rel_top}{entry.name}"
                kind = self._candidate_kind(entry)
                if kind is None or (kind == "dir" and self.is_ignored(entry.name)):
                    continue
                count += 1
                yield rel, kind != "file"
                if kind == "dir":
                    stack.append((Path(entry.path), rel + "/"))

    def _candidate_kind(self, entry: os.DirEntry[str]) -> str | None:
        """``file``, ``dir`` (to descend), ``dirlink``, or None: not worth suggesting.

        Never suggest a path the tools would refuse: a symlink that dangles or leads
        out, a FIFO, a socket, a device.
        """
        try:
            if entry.is_symlink():
                real = Path(entry.path).resolve(strict=True)
                if not real.is_relative_to(self.root):
                    return None
                return "dirlink" if real.is_dir() else "file" if real.is_file() else None
            if entry.is_dir(follow_symlinks=False):
                return "dir"
            return "file" if entry.is_file(follow_symlinks=False) else None
        except (OSError, RuntimeError):  # a loop, or gone since the scan
            return None

    # -- list_files ------------------------------------------------------------------

    def list_files(self, path: str = ".") -> ToolOutput:
        """The listing of ``path`` (see the module docstring), or a refusal."""
        try:
            return ToolOutput(printable(self._list(path)))
        except _RefusalError as exc:
            return ToolOutput(printable(str(exc)), is_error=True)

    def _list(self, raw: str) -> str:
        target, rel = self._resolve(raw)
        if not target.exists():
            raise self._not_found(raw, rel, want_dir=True)
        if not target.is_dir():
            raise _RefusalError(
                f"{rel} is a file, not a directory. Use read_file with path={rel!r} to read it."
            )
        skipped = _Skipped()
        lines: list[str] = []
        used = 0
        more = 0
        walk = self._walk(target, rel, skipped)
        for entry, _ in walk:
            line = printable(entry)
            used += len(line.encode()) + 1
            if len(lines) == self.max_entries or used > self.max_bytes:
                # Counted, not shown: the model learns how much it did not see.
                more = 1 + sum(1 for _ in itertools.islice(walk, _COUNT_LIMIT))
                break
            lines.append(line)
        if not lines and not more:
            lines.append(f"[{'The workspace' if rel == '.' else rel} holds no files.]")
        if more:
            lines.append(self._more_note(more, stopped_at_entries=len(lines) == self.max_entries))
        lines.extend(self._notes(skipped))
        return "\n".join(lines)

    def _more_note(self, more: int, *, stopped_at_entries: bool) -> str:
        count = f"more than {_COUNT_LIMIT}" if more > _COUNT_LIMIT else str(more)
        limit = f"{self.max_entries} entries" if stopped_at_entries else f"{self.max_bytes} bytes"
        return (
            f"[Listing stopped at {limit} ... and {count} more "
            f"{'entry' if more == 1 else 'entries'}. Pass path=<a subdirectory> to list "
            "part of the tree.]"
        )

    def _notes(self, skipped: _Skipped) -> list[str]:
        notes: list[str] = []
        if noise := skipped.counts.get("noise"):
            names = ", ".join(sorted(skipped.noise_names))
            notes.append(
                f"[Not listed: {_count(noise, 'directory', 'directories')} of tooling or "
                f"version control ({names}{', ...' if skipped.more_noise_names else ''}); "
                "pass one as path to list it.]"
            )
        if "dirlink" in skipped.counts:
            notes.append(f"[Not followed: symlinked directories {skipped.note('dirlink')}.]")
        if "outside" in skipped.counts:
            notes.append(
                "[Not listed: symlinks leading outside the workspace or nowhere: "
                f"{skipped.note('outside')}.]"
            )
        if "unreadable" in skipped.counts:
            notes.append(f"[Could not read: {skipped.note('unreadable')}.]")
        return notes

    # -- read_file -------------------------------------------------------------------

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

    # -- tools -----------------------------------------------------------------------

    def list_files_tool(self) -> Tool:
        """The ``list_files`` tool over this workspace."""
        definition = ToolDefinition(
            name="list_files",
            description=(
                "List the files in the workspace (or under one directory of it), one "
                "path per line, relative to the workspace root, sorted. Tooling and "
                "version-control directories such as .git are left out unless asked "
                "for by path."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "Directory to list, relative to the workspace root.",
                        "default": ".",
                    }
                },
                "additionalProperties": False,
            },
        )
        return Tool(definition, _threaded(self.list_files))

    def read_file_tool(self) -> Tool:
        """The ``read_file`` tool over this workspace."""
        definition = ToolDefinition(
            name="read_file",
            description=(
                "Read a UTF-8 text file of the workspace. Long files are cut with a note "
                "giving the offset to read on from."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "File to read, relative to the workspace root.",
                    },
                    "offset": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Line number to start at (1 is the first line).",
                        "default": 1,
                    },
                },
                "required": ["path"],
                "additionalProperties": False,
            },
        )
        return Tool(definition, _threaded(self.read_file))

    def tools(self) -> list[Tool]:
        """``[list_files, read_file]`` over this workspace."""
        return [self.list_files_tool(), self.read_file_tool()]


def _threaded(method: Callable[..., ToolOutput]) -> ToolExecute:
    """An async execute that runs a blocking workspace method in a worker thread.

    Each call is bounded (``max_entries``, ``max_bytes``, the suggestion scan), so an
    aborted run waits at most one short call; the signal is not polled.
    """

    async def execute(arguments: dict[str, Any], signal: AbortSignal) -> ToolReturn:
        return await asyncio.to_thread(functools.partial(method, **arguments))

    execute.__name__ = f"execute_{method.__name__}"
    return execute


def list_files_tool(
    root: str | os.PathLike[str],
    *,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    ignored_dirs: Iterable[str] = IGNORED_DIRS,
) -> Tool:
    """A ``list_files`` tool confined to ``root``."""
    return Workspace(
        root, max_entries=max_entries, max_bytes=max_bytes, ignored_dirs=ignored_dirs
    ).list_files_tool()


def read_file_tool(root: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES) -> Tool:
    """A ``read_file`` tool confined to ``root``."""
    return Workspace(root, max_bytes=max_bytes).read_file_tool()


def workspace_tools(
    root: str | os.PathLike[str],
    *,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    ignored_dirs: Iterable[str] = IGNORED_DIRS,
) -> list[Tool]:
    """``[list_files, read_file]`` confined to ``root``.

    Raises ``InvalidInputError`` if ``root`` is not an existing directory.
    """
    return Workspace(
        root, max_entries=max_entries, max_bytes=max_bytes, ignored_dirs=ignored_dirs
    ).tools()
