"""Workspace tools: ``list_files`` and ``read_file``, confined to one root directory.

This module owns the file tools that the demo runs and that users can hand to
``run_agent`` as they are. Everything a model can ask for is refused with an error
tool result (``ToolOutput(..., is_error=True)``) whose text says what to do instead,
because a refusal the model can act on is fixed in the next turn, while an exception
would only end the conversation (the seed's "all failures converge on one exit").

Confinement
-----------
A path is always relative to the root. It is refused when it is absolute, when its
``..`` parts climb above the root (``src/../README.md`` is fine, ``../x`` is not), or
when the file it names resolves, through symlinks, to a place outside the root. The
check runs on the real path just before the access; a symlink swapped between the
check and the open is outside what this module defends against (run untrusted
agents in a container).

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

A listing stops after ``max_entries`` lines. Every omission is stated in a closing
``[...]`` note, so the model knows what it did not see and how to see it.

What ``read_file`` returns
--------------------------
The text of a UTF-8 file (undecodable bytes after the first 8 KiB are replaced,
not fatal), from line ``offset`` on, up to ``max_bytes``. A longer file is cut at a
line boundary with a note naming the ``offset`` to read on from. Binary files (a
NUL byte, or invalid UTF-8, in the first 8 KiB) are refused; so are directories,
devices and FIFOs (reading a FIFO would block the tool forever).

A missing path gets "Did you mean" suggestions: ``difflib`` matches against the
workspace's relative paths and, separately, against their base names, so both
``src/maths.ts`` and a bare ``maths.ts`` find ``src/math.ts``.
"""

from __future__ import annotations

import asyncio
import codecs
import difflib
import functools
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from ._abort import AbortSignal
from ._errors import InvalidInputError
from ._tools import Tool, ToolDefinition, ToolExecute, ToolOutput, ToolReturn

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "IGNORED_DIRS",
    "Workspace",
    "list_files_tool",
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
"""Bytes of text ``read_file`` returns before it stops with a note."""

# How much of a file decides whether it is text; the same window git uses.
_SNIFF_BYTES = 8192
# Bounds the walk made to find "did you mean" candidates in a huge tree.
_SUGGESTION_SCAN_LIMIT = 20_000
_MAX_SUGGESTIONS = 3
_SUGGESTION_CUTOFF = 0.7


class _RefusalError(Exception):
    """A request the tool answers with an error result; the text is for the model."""


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
    ``tools()`` run them in a worker thread.
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
        if "\x00" in raw:
            raise _RefusalError(f"Invalid path {raw!r}: it contains a NUL character.")
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
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if entry.is_symlink() and not Path(entry.path).resolve().is_relative_to(
                        self.root
                    ):
                        continue  # never suggest a path that would be refused
                except (OSError, RuntimeError):
                    continue
                if is_dir and self.is_ignored(entry.name):
                    continue
                count += 1
                yield rel, is_dir
                if is_dir:
                    stack.append((Path(entry.path), rel + "/"))

    # -- list_files ------------------------------------------------------------------

    def list_files(self, path: str = ".") -> ToolOutput:
        """The listing of ``path`` (see the module docstring), or a refusal."""
        try:
            return ToolOutput(self._list(path))
        except _RefusalError as exc:
            return ToolOutput(str(exc), is_error=True)

    def _list(self, raw: str) -> str:
        target, rel = self._resolve(raw)
        if not target.exists():
            raise self._not_found(raw, rel, want_dir=True)
        if not target.is_dir():
            raise _RefusalError(
                f"{rel} is a file, not a directory. Use read_file with path={rel!r} to read it."
            )
        skipped: dict[str, list[str]] = {}

        def on_skip(kind: str, skipped_path: str) -> None:
            skipped.setdefault(kind, []).append(skipped_path)

        lines: list[str] = []
        more = False
        for entry, _ in self._walk(target, rel, on_skip):
            if len(lines) == self.max_entries:
                more = True
                break
            lines.append(entry)
        if not lines and not more:
            lines.append(f"[{'The workspace' if rel == '.' else rel} holds no files.]")
        lines.extend(self._notes(skipped, more))
        return "\n".join(lines)

    def _notes(self, skipped: dict[str, list[str]], more: bool) -> list[str]:
        notes: list[str] = []
        if more:
            notes.append(
                f"[Listing stopped at {self.max_entries} entries; more exist. "
                "Pass path=<a subdirectory> to list part of the tree.]"
            )
        if noise := skipped.get("noise"):
            names = sorted({PurePosixPath(p).name for p in noise})
            notes.append(
                f"[Not listed: {_count(len(noise), 'directory', 'directories')} of "
                f"tooling or version control ({', '.join(names)}); pass one as path to "
                "list it.]"
            )
        if links := skipped.get("dirlink"):
            notes.append(f"[Not followed: symlinked directories {', '.join(links)}.]")
        if outside := skipped.get("outside"):
            notes.append(
                "[Not listed: symlinks leading outside the workspace or nowhere: "
                f"{', '.join(outside)}.]"
            )
        if unreadable := skipped.get("unreadable"):
            notes.append(f"[Could not read: {', '.join(unreadable)}.]")
        return notes

    # -- read_file -------------------------------------------------------------------

    def read_file(self, path: str, offset: int = 1) -> ToolOutput:
        """The text of ``path`` from line ``offset`` (1-based), or a refusal."""
        try:
            return ToolOutput(self._read(path, offset))
        except _RefusalError as exc:
            return ToolOutput(str(exc), is_error=True)

    def _read(self, raw: str, offset: int) -> str:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
            raise _RefusalError(f"offset must be a line number of 1 or more, got {offset!r}.")
        target, rel = self._resolve(raw)
        try:
            info = target.stat()
        except FileNotFoundError:
            raise self._not_found(raw, rel, want_dir=False) from None
        except OSError as exc:
            raise _RefusalError(f"Cannot read {rel}: {exc.strerror or exc}.") from None
        if stat.S_ISDIR(info.st_mode):
            raise _RefusalError(
                f"{rel} is a directory, not a file. Use list_files with path={rel!r} to "
                "see what it holds."
            )
        if not stat.S_ISREG(info.st_mode):
            raise _RefusalError(f"{rel} is not a regular file (a device, socket or FIFO).")
        try:
            with target.open("rb") as f:
                return self._read_text(f, rel, info.st_size, offset)
        except OSError as exc:
            raise _RefusalError(f"Cannot read {rel}: {exc.strerror or exc}.") from None

    def _read_text(self, f: Any, rel: str, size: int, offset: int) -> str:
        head: bytes = f.read(_SNIFF_BYTES)
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
        if size == 0:
            return f"[{rel} is empty.]"
        f.seek(0)
        budget = self.max_bytes
        out: list[bytes] = []
        line_no = 0
        for line in f:
            line_no += 1
            if line_no < offset:
                continue
            if len(line) > budget:
                if not out:
                    # One line longer than the whole budget: show its start anyway.
                    out.append(line[:budget])
                    text = b"".join(out).decode("utf-8", errors="replace")
                    return (
                        f"{text}\n[Truncated: line {line_no} of {rel} is longer than "
                        f"{self.max_bytes} bytes; only its start is shown. Call read_file "
                        f"with offset={line_no + 1} to read on after it.]"
                    )
                text = b"".join(out).decode("utf-8", errors="replace")
                sep = "" if text.endswith("\n") else "\n"
                return (
                    f"{text}{sep}[Truncated: showing lines {offset}-{line_no - 1} of {rel} "
                    f"({size} bytes in all, {self.max_bytes}-byte limit). Call read_file "
                    f"with offset={line_no} to read on.]"
                )
            out.append(line)
            budget -= len(line)
        if line_no < offset:
            raise _RefusalError(
                f"offset {offset} is past the end of {rel}, which has "
                f"{_count(line_no, 'line', 'lines')}."
            )
        return b"".join(out).decode("utf-8", errors="replace")

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
    ignored_dirs: Iterable[str] = IGNORED_DIRS,
) -> Tool:
    """A ``list_files`` tool confined to ``root``."""
    return Workspace(root, max_entries=max_entries, ignored_dirs=ignored_dirs).list_files_tool()


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
