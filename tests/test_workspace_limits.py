"""Tests of statemachine.workspace's bounds: reads stream and hold about ``max_bytes``,
listings and their counts are bounded, and what is not a regular file is never opened
or blocked on."""

from __future__ import annotations

import io
import os
import socket
import tempfile
import tracemalloc
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from test_workspace import make_tree, ok, refused, text_of

import statemachine as sm
import statemachine.workspace._list as list_module
import statemachine.workspace._read as read_module
from statemachine.workspace import Workspace

# -- limits: reads stream, listings are bounded ------------------------------------------

_MiB = 1024 * 1024


def _sparse_file(path: Path, head: bytes, size: int) -> None:
    """``head``, then NUL bytes up to ``size``: one huge line, without using the disk."""
    with path.open("wb") as f:
        f.write(head)
        f.truncate(size)


def _peak_memory(call: Callable[[], sm.ToolOutput]) -> tuple[str, int]:
    tracemalloc.start()
    try:
        text = text_of(call())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return text, peak


@pytest.mark.timeout(60)
def test_reading_a_huge_single_line_holds_about_max_bytes_in_memory(tmp_path: Path) -> None:
    # 128 MiB: 4096 short lines, then one line of NUL bytes to the end (the text sniff
    # sees only the short lines). Reading it line by line would hold the whole line.
    _sparse_file(tmp_path / "huge.log", b"x\n" * 4096, 128 * _MiB)
    ws = Workspace(tmp_path)
    text, peak = _peak_memory(lambda: ws.read_file("huge.log"))
    assert text == "x\n" * 4096 + (
        "[Truncated: showing lines 1-4096 of huge.log (134217728 bytes in all, "
        "65536-byte limit). Call read_file with offset=4097 to read on.]"
    )
    assert peak < 1 * _MiB
    text, peak = _peak_memory(lambda: ws.read_file("huge.log", offset=4097))
    assert text == "\x00" * 65536 + (
        "\n[Truncated: line 4097 of huge.log is longer than 65536 bytes; only its start is "
        "shown. Call read_file with offset=4098 to read on after it.]"
    )
    assert peak < 1 * _MiB
    # Skipping to an offset reads through the whole line, chunk by chunk.
    text, peak = _peak_memory(lambda: ws.read_file("huge.log", offset=4098))
    assert text == "offset 4098 is past the end of huge.log, which has 4097 lines."
    assert peak < 1 * _MiB


def test_skipping_to_an_offset_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text("line\n" * 1000)  # 5000 bytes
    ws = Workspace(tmp_path)
    with (
        mock.patch.object(read_module, "_SKIP_LIMIT_BYTES", 2000),
        mock.patch.object(read_module, "_CHUNK_BYTES", 1000),
        mock.patch.object(read_module, "_SNIFF_BYTES", 1000),
    ):
        assert ok(ws.read_file("log.txt", offset=600)) == "line\n" * 401
        assert refused(ws.read_file("log.txt", offset=700)) == (
            "read_file skips at most 2000 bytes to find the line to start at; line 700 of "
            "log.txt lies further in (past line 600)."
        )


def test_a_long_line_is_cut_between_characters(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_text("é" * 10, encoding="utf-8")  # 2 bytes each
    assert ok(Workspace(tmp_path, max_bytes=5).read_file("e.txt")).startswith("éé\n[Truncated")


def _reference_read(data: bytes, offset: int, max_bytes: int) -> tuple[bytes, int | None]:
    """What ``read_file`` must show of ASCII ``data`` from line ``offset``, read whole:
    the bytes shown and the offset its note names (None: nothing was cut)."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    rest = lines[offset - 1 :]
    if len(b"".join(rest)) <= max_bytes:
        return b"".join(rest), None
    shown: list[bytes] = []
    while len(b"".join([*shown, rest[len(shown)]])) <= max_bytes:
        shown.append(rest[len(shown)])
    if not shown:
        return rest[0][:max_bytes] + b"\n", offset + 1
    return b"".join(shown), offset + len(shown)


def _read_in_chunks(ws: Workspace, chunk: int, offset: int) -> tuple[bytes, int | None]:
    with (
        mock.patch.object(read_module, "_CHUNK_BYTES", chunk),
        mock.patch.object(read_module, "_SNIFF_BYTES", chunk),
    ):
        text = ok(ws.read_file("f.txt", offset=offset))
    body, _, note = text.partition("[Truncated: ")
    if not note:
        return body.encode(), None
    return body.encode(), int(note.split("offset=")[1].split(" ")[0])


class _ChunkBoundaryBug(Workspace):
    """Counts a line at each chunk's end, as a reader that forgets lines span chunks."""

    def _page(self, chunks: Iterable[bytes], rel: str, size: int, offset: int) -> str:
        fixed = (c if c.endswith(b"\n") else c + b"\n" for c in chunks)
        return super()._page(fixed, rel, size, offset)


def _paging_property(workspace_class: type[Workspace]) -> Callable[..., None]:
    @given(
        data=st.text(alphabet="ab\n", min_size=1, max_size=60).map(str.encode),
        max_bytes=st.integers(min_value=1, max_value=12),
        chunk=st.integers(min_value=1, max_value=9),
        offset=st.integers(min_value=1, max_value=8),
    )
    def check(data: bytes, max_bytes: int, chunk: int, offset: int) -> None:
        with tempfile.TemporaryDirectory() as root:
            Path(root, "f.txt").write_bytes(data)
            ws = workspace_class(root, max_bytes=max_bytes)
            lines = len(data.split(b"\n")) - (1 if data.endswith(b"\n") else 0)
            if offset > lines:
                assert refused(ws.read_file("f.txt", offset=offset)).startswith(
                    f"offset {offset} is past the end of f.txt, which has {lines} line"
                )
                return
            expected = _reference_read(data, offset, max_bytes)
            assert _read_in_chunks(ws, chunk, offset) == expected

    return check


def test_chunked_reading_agrees_with_reading_the_whole_file() -> None:
    _paging_property(Workspace)()


def test_the_chunk_property_catches_a_reader_that_loses_lines_across_chunks() -> None:
    # Finding the bug is the point here; shrinking it is Hypothesis's business.
    quick = settings(phases=[Phase.generate], database=None, derandomize=True, max_examples=200)
    with pytest.raises(AssertionError):
        quick(_paging_property(_ChunkBoundaryBug))()


def test_a_listing_is_bounded_in_bytes_and_counts_what_it_left_out(tmp_path: Path) -> None:
    names = [f"{'n' * 40}{i:02}.txt" for i in range(30)]  # 47 bytes each, with the newline
    make_tree(tmp_path, dict.fromkeys(names, ""))
    lines = ok(Workspace(tmp_path, max_bytes=200).list_files()).splitlines()
    assert lines[:4] == names[:4]
    assert sum(len(line) + 1 for line in lines[:4]) <= 200
    assert lines[4:] == [
        "[Listing stopped at 200 bytes ... and 26 more entries. Pass path=<a subdirectory> "
        "to list part of the tree.]"
    ]
    # A path longer than the whole budget: nothing fits, the note still says why.
    assert ok(Workspace(tmp_path, max_bytes=10).list_files()).startswith(
        "[Listing stopped at 10 bytes ... and 30 more entries."
    )


def test_the_count_of_what_a_listing_left_out_is_bounded(tmp_path: Path) -> None:
    make_tree(tmp_path, {f"d{i}/f{j}.txt": "" for i in range(3) for j in range(4)})
    with mock.patch.object(list_module, "_COUNT_LIMIT", 5):
        lines = ok(Workspace(tmp_path, max_entries=2).list_files()).splitlines()
    assert lines[2] == (
        "[Listing stopped at 2 entries ... and more than 5 more entries. "
        "Pass path=<a subdirectory> to list part of the tree.]"
    )
    lines = ok(Workspace(tmp_path, max_entries=2).list_files()).splitlines()
    assert lines[2].startswith("[Listing stopped at 2 entries ... and 10 more entries.")


def test_notes_name_a_few_paths_and_count_the_rest(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    for i in range(8):
        (tmp_path / f"gone{i}").symlink_to(tmp_path / f"missing{i}")
    for name in [".git", ".hg", ".svn", ".tox", ".nox", ".idea", "x.egg-info"]:
        (tmp_path / name).mkdir()
    assert ok(Workspace(tmp_path).list_files()).splitlines()[1:] == [
        "[Not listed: 7 directories of tooling or version control "
        "(.git, .hg, .idea, .nox, .svn, ...); pass one as path to list it.]",
        "[Not listed: symlinks leading outside the workspace or nowhere: "
        "gone0, gone1, gone2, gone3, gone4 and 3 more.]",
    ]


# -- what is not a regular file ----------------------------------------------------------


@pytest.mark.timeout(10)
def test_a_fifo_swapped_in_after_the_check_is_refused_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The swap happens as late as it can: right before the file is opened, after
    # every check made on the path. Without a non-blocking open the tool would wait
    # forever for a writer (the timeout above would end the test as a failure).
    target = tmp_path / "data.txt"
    target.write_text("text\n")
    swapped: list[bool] = []

    def swap_first(opener: Callable[..., Any]) -> Callable[..., Any]:
        def open_after_swap(path: Any, *args: Any, **kwargs: Any) -> Any:
            if not swapped and os.fspath(path) == os.fspath(target):
                swapped.append(True)
                target.unlink()
                os.mkfifo(target)
            return opener(path, *args, **kwargs)

        return open_after_swap

    monkeypatch.setattr(os, "open", swap_first(os.open))
    monkeypatch.setattr(io, "open", swap_first(io.open))
    assert refused(Workspace(tmp_path).read_file("data.txt")) == (
        "data.txt is not a regular file (a device, socket or FIFO)."
    )
    assert swapped == [True]


@pytest.mark.timeout(10)
def test_devices_and_sockets_are_refused_without_being_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    dev = Workspace("/dev")
    for name in ("null", "zero", "tty"):
        if os.path.exists(f"/dev/{name}"):
            assert refused(dev.read_file(name)) == (
                f"{name} is not a regular file (a device, socket or FIFO)."
            )
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "s.sock"))
        assert refused(Workspace(tmp_path).read_file("s.sock")) == (
            "s.sock is not a regular file (a device, socket or FIFO)."
        )
    assert opened == []


def test_suggestions_never_name_a_dangling_symlink_or_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").symlink_to(tmp_path / "notes-moved.txt")  # dangles, inside
    os.mkfifo(tmp_path / "notes.fifo")
    (tmp_path / "pipe.txt").symlink_to(tmp_path / "notes.fifo")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs.txt").symlink_to(tmp_path / "docs")
    ws = Workspace(tmp_path)
    for wanted in ("note.txt", "notes.txtt", "pipe.tx", "notes.fif"):
        assert "Did you mean" not in refused(ws.read_file(wanted)), wanted
    assert "Did you mean" not in refused(ws.read_file("docs.tx"))  # a directory
    assert refused(ws.list_files("doc")) == "Directory not found: doc. Did you mean docs?"
    (tmp_path / "notes-moved.txt").write_text("here\n")  # the link no longer dangles
    assert refused(ws.read_file("note.txt")).endswith("Did you mean notes.txt?")
