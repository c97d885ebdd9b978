"""``list_files``: the files under a directory of the workspace, bounded and explained.

Depth first, sorted by name, relative to the root; noise directories, symlinked
directories and symlinks that lead out are left out, and every omission is stated in
a closing note (see the package docstring).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from statemachine.core.tools import ToolOutput
from statemachine.workspace._root import _NOTE_PATHS, _count, _RefusalError, _some, printable
from statemachine.workspace._search import _Suggesting

# Bounds the walk that counts what a stopped listing left out.
_COUNT_LIMIT = 20_000


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


class _Lister(_Suggesting):
    """The ``list_files`` operation of a workspace."""

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
