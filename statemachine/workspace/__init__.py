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
import functools
import os
from collections.abc import Callable, Iterable
from typing import Any

from statemachine.agent.tools import Tool
from statemachine.core.abort import AbortSignal
from statemachine.core.tools import ToolDefinition, ToolExecute, ToolOutput, ToolReturn
from statemachine.workspace._list import _Lister
from statemachine.workspace._read import _Reader
from statemachine.workspace._root import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ENTRIES,
    IGNORED_DIRS,
    printable,
)

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


class Workspace(_Lister, _Reader):
    """A root directory and the two file operations allowed inside it.

    The methods are blocking and return a ``ToolOutput``; the tools built by
    ``tools()`` run them in a worker thread. ``max_entries`` (default 200) caps the
    lines of a listing; ``max_bytes`` (default 64 KiB) caps the text ``read_file``
    returns and the paths a listing shows; the module docstring lists the fixed
    bounds (the 64 KiB read chunk, the 20,000-path scans, 5 paths per note).

    Built in layers, one module each: ``_root`` (the root, its limits, confinement),
    ``_search`` (suggestions for a missing path), ``_list`` and ``_read`` (the two
    operations); this class adds the tools.
    """

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
