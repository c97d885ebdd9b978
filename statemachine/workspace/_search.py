"""Suggestions for a missing path: the existing paths closest to it ("did you mean").

A missing path is answered with the paths most like it, by ``difflib`` over whole
paths and over base names; only what the tool would accept is suggested, and the scan
for candidates stops after 20,000 paths.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from statemachine.workspace._root import _join_choices, _RefusalError, _Root

# Bounds the walk made to find "did you mean" candidates in a huge tree, and the
# walk that counts what a stopped listing left out.
_SUGGESTION_SCAN_LIMIT = 20_000
_MAX_SUGGESTIONS = 3
_SUGGESTION_CUTOFF = 0.7


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


class _Suggesting(_Root):
    """A root that can say which existing paths a missing one was probably meant as."""

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
