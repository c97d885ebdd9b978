"""The workspace root and path confinement: every path the tools accept is checked here.

A path is relative to the root; it is refused when it is absolute or home-relative,
when its ``..`` parts climb above the root, or when it resolves through a symlink to a
place outside the root (see the package docstring). Also here: the limits the tools
share, and ``printable``, which makes any file name valid UTF-8 for a tool result.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from statemachine.core.checks import positive_int
from statemachine.errors import InvalidInputError

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


# Paths a note names before it only counts the rest.
_NOTE_PATHS = 5


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


def _join_choices(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


class _Root:
    """A root directory, the limits of the tools over it, and path confinement.

    ``resolve`` is the one way from a path a model sent to a path on disk; the
    operations (``_list.py``, ``_read.py``) build on it.
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
            positive_int(name, value)
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
