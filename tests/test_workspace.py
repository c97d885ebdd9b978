"""Tests of statemachine.workspace: confinement, listings, reads, suggestions, tools."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import statemachine as sm
import statemachine.engine
import statemachine.journal
import statemachine.messages
from statemachine.core.tools import ToolReturn
from statemachine.journal import run_agent_journaled
from statemachine.testing import FunctionModel
from statemachine.workspace import (
    IGNORED_DIRS,
    Workspace,
    list_files_tool,
    printable,
    read_file_tool,
    workspace_tools,
)


def text_of(output: sm.ToolOutput) -> str:
    assert all(isinstance(b, sm.TextContent) for b in output.content)
    return "".join(b.text for b in output.content if isinstance(b, sm.TextContent))


def ok(output: sm.ToolOutput) -> str:
    assert not output.is_error, text_of(output)
    return text_of(output)


def refused(output: sm.ToolOutput) -> str:
    assert output.is_error, text_of(output)
    return text_of(output)


def make_tree(root: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    make_tree(
        root,
        {
            "README.md": "# Demo project\nMore text.\n",
            "src/index.ts": "export {};\n",
            "src/math.ts": "export const add = 1;\n",
            "src/util/strings.ts": "export const s = '';\n",
            "B.txt": "upper\n",
            "a.txt": "lower\n",
        },
    )
    return Workspace(root)


# -- list_files ------------------------------------------------------------------------


def test_listing_is_depth_first_sorted_by_name_and_relative_to_root(ws: Workspace) -> None:
    assert ok(ws.list_files()) == "\n".join(
        ["B.txt", "README.md", "a.txt", "src/index.ts", "src/math.ts", "src/util/strings.ts"]
    )


def test_listing_does_not_depend_on_creation_order(tmp_path: Path) -> None:
    names = ["zeta.txt", "alpha/b.txt", "Mid.txt", "alpha/a.txt", "beta.txt"]
    first, second = tmp_path / "one", tmp_path / "two"
    make_tree(first, {n: "x" for n in names})
    make_tree(second, {n: "x" for n in reversed(names)})
    assert ok(Workspace(first).list_files()) == ok(Workspace(second).list_files())
    assert ok(Workspace(first).list_files()).splitlines() == [
        "Mid.txt",
        "alpha/a.txt",
        "alpha/b.txt",
        "beta.txt",
        "zeta.txt",
    ]


def test_listing_a_subdirectory_keeps_root_relative_paths(ws: Workspace) -> None:
    listing = ok(ws.list_files("src")).splitlines()
    assert listing == ["src/index.ts", "src/math.ts", "src/util/strings.ts"]
    for path in listing:
        ok(ws.read_file(path))  # each line is usable as read_file's path


def test_noise_directories_are_skipped_with_a_note_but_listable_by_path(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            "main.py": "",
            ".git/HEAD": "ref",
            ".venv/bin/python": "",
            "pkg/__pycache__/m.pyc": "",
            "pkg/m.py": "",
            "thing.egg-info/PKG-INFO": "",
            ".gitignore": "x",
        },
    )
    ws = Workspace(tmp_path)
    lines = ok(ws.list_files()).splitlines()
    assert lines[:3] == [".gitignore", "main.py", "pkg/m.py"]
    assert lines[3:] == [
        "[Not listed: 4 directories of tooling or version control "
        "(.git, .venv, __pycache__, thing.egg-info); pass one as path to list it.]"
    ]
    assert ok(ws.list_files(".git")) == ".git/HEAD"
    assert {".git", ".venv", "__pycache__", "node_modules"} <= IGNORED_DIRS


def test_ignored_dirs_can_be_replaced(tmp_path: Path) -> None:
    make_tree(tmp_path, {".git/HEAD": "", "build/out.txt": "", "a.txt": ""})
    ws = Workspace(tmp_path, ignored_dirs={"build"})
    assert ok(ws.list_files()).splitlines()[:2] == [".git/HEAD", "a.txt"]
    assert "(build)" in ok(ws.list_files())


def test_listing_stops_at_max_entries_with_a_note(tmp_path: Path) -> None:
    make_tree(tmp_path, {f"f{i:02}.txt": "" for i in range(5)})
    assert ok(Workspace(tmp_path, max_entries=5).list_files()).splitlines() == [
        f"f{i:02}.txt" for i in range(5)
    ]
    lines = ok(Workspace(tmp_path, max_entries=3).list_files()).splitlines()
    assert lines[:3] == ["f00.txt", "f01.txt", "f02.txt"]
    assert lines[3:] == [
        "[Listing stopped at 3 entries ... and 2 more entries. Pass path=<a subdirectory> "
        "to list part of the tree.]"
    ]


def test_empty_directories_and_empty_workspace(tmp_path: Path) -> None:
    assert ok(Workspace(tmp_path).list_files()) == "[The workspace holds no files.]"
    (tmp_path / "empty").mkdir()
    (tmp_path / "a.txt").write_text("a")
    assert ok(Workspace(tmp_path).list_files()).splitlines() == ["a.txt", "empty/"]
    assert ok(Workspace(tmp_path).list_files("empty")) == "[empty holds no files.]"


def test_listing_a_missing_directory_suggests_directories(ws: Workspace) -> None:
    assert refused(ws.list_files("srcc")) == "Directory not found: srcc. Did you mean src?"


def test_listing_a_file_points_to_read_file(ws: Workspace) -> None:
    assert refused(ws.list_files("README.md")) == (
        "README.md is a file, not a directory. Use read_file with path='README.md' to read it."
    )


# -- read_file -------------------------------------------------------------------------


def test_read_returns_the_text(ws: Workspace) -> None:
    assert ok(ws.read_file("README.md")) == "# Demo project\nMore text.\n"
    assert ok(ws.read_file("src/../README.md")) == "# Demo project\nMore text.\n"
    assert ok(ws.read_file("./src/math.ts")) == "export const add = 1;\n"


def test_missing_file_gets_a_suggestion(ws: Workspace) -> None:
    assert refused(ws.read_file("src/maths.ts")) == (
        "File not found: src/maths.ts. Did you mean src/math.ts?"
    )


def test_bare_base_name_finds_the_file_in_its_directory(ws: Workspace) -> None:
    assert refused(ws.read_file("strings.ts")) == (
        "File not found: strings.ts. Did you mean src/util/strings.ts?"
    )


def test_several_suggestions_are_listed(tmp_path: Path) -> None:
    make_tree(tmp_path, {"notes1.txt": "", "notes2.txt": "", "zzz.bin": ""})
    message = refused(Workspace(tmp_path).read_file("notes.txt"))
    assert message == "File not found: notes.txt. Did you mean notes1.txt or notes2.txt?"


def test_no_similar_file_points_to_list_files(ws: Workspace) -> None:
    assert refused(ws.read_file("qqqqqqqq.xyz")) == (
        "File not found: qqqqqqqq.xyz. Use list_files to see the files in the workspace."
    )


def test_suggestions_skip_noise_directories(tmp_path: Path) -> None:
    make_tree(tmp_path, {".venv/lib/config.py": "", "other.md": ""})
    assert "Did you mean" not in refused(Workspace(tmp_path).read_file("lib/config.py"))


@pytest.mark.parametrize(
    ("path", "start"),
    [
        ("../secret.txt", "Path escapes the workspace: ../secret.txt."),
        ("src/../../secret.txt", "Path escapes the workspace: src/../../secret.txt."),
        ("..", "Path escapes the workspace: ..."),
        ("/etc/passwd", "Absolute paths are not allowed: /etc/passwd."),
        ("~/secret.txt", "Home-relative paths are not allowed: ~/secret.txt."),
        ("a\x00b", "Invalid path 'a\\x00b': it contains a NUL character."),
    ],
)
def test_paths_leading_out_are_refused(tmp_path: Path, path: str, start: str) -> None:
    root = tmp_path / "ws"
    make_tree(root, {"a.txt": "a"})
    (tmp_path / "secret.txt").write_text("secret")
    ws = Workspace(root)
    for output in (ws.read_file(path), ws.list_files(path)):
        message = refused(output)
        assert message.startswith(start)
        assert "secret" not in message.replace(path, "")
    with pytest.raises(ValueError, match=r"not allowed|escapes|NUL"):
        ws.resolve(path)


def test_absolute_path_inside_the_root_is_still_refused(ws: Workspace) -> None:
    message = refused(ws.read_file(str(ws.root / "README.md")))
    assert message.startswith("Absolute paths are not allowed")


def test_symlinks_leading_outside_are_refused_and_not_listed(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    make_tree(root, {"a.txt": "a"})
    make_tree(outside, {"secret.txt": "secret"})
    (root / "file_link").symlink_to(outside / "secret.txt")
    (root / "dir_link").symlink_to(outside)
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    ws = Workspace(root)
    assert refused(ws.read_file("file_link")).startswith(
        "Path leads outside the workspace through a symlink: file_link."
    )
    assert refused(ws.read_file("dir_link/secret.txt")).startswith(
        "Path leads outside the workspace through a symlink: dir_link/secret.txt."
    )
    assert refused(ws.list_files("dir_link")).startswith("Path leads outside the workspace")
    assert ok(ws.list_files()).splitlines() == [
        "a.txt",
        "[Not listed: symlinks leading outside the workspace or nowhere: "
        "dangling, dir_link, file_link.]",
    ]
    # A refused path is never offered as a suggestion either.
    assert refused(ws.read_file("file_lnk")) == (
        "File not found: file_lnk. Use list_files to see the files in the workspace."
    )


def test_symlinks_inside_the_root_are_followed_for_files_not_for_directories(
    tmp_path: Path,
) -> None:
    make_tree(tmp_path, {"src/real.txt": "real\n"})
    (tmp_path / "alias.txt").symlink_to(tmp_path / "src" / "real.txt")
    (tmp_path / "src" / "loop").symlink_to(tmp_path / "src")  # a cycle if followed
    ws = Workspace(tmp_path)
    assert ok(ws.list_files()).splitlines() == [
        "alias.txt",
        "src/real.txt",
        "[Not followed: symlinked directories src/loop.]",
    ]
    assert ok(ws.read_file("alias.txt")) == "real\n"
    assert ok(ws.read_file("src/loop/real.txt")) == "real\n"


def test_symlink_loop_is_an_error_result_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    ws = Workspace(tmp_path)
    assert refused(ws.read_file("a")) == (
        "Cannot resolve a: a symlink loop. Use list_files to see real paths."
    )
    assert ok(ws.list_files()) == (
        "[The workspace holds no files.]\n"
        "[Not listed: symlinks leading outside the workspace or nowhere: a, b.]"
    )


def test_root_given_through_a_symlink_works(tmp_path: Path) -> None:
    make_tree(tmp_path / "real", {"a.txt": "a"})
    (tmp_path / "link").symlink_to(tmp_path / "real")
    ws = Workspace(tmp_path / "link")
    assert ok(ws.list_files()) == "a.txt"
    assert ok(ws.read_file("a.txt")) == "a"


def test_directory_is_refused_with_a_pointer_to_list_files(ws: Workspace) -> None:
    assert refused(ws.read_file("src")) == (
        "src is a directory, not a file. Use list_files with path='src' to see what it holds."
    )


def test_binary_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / "nul.bin").write_bytes(b"abc\x00def")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    ws = Workspace(tmp_path)
    assert refused(ws.read_file("nul.bin")) == (
        "nul.bin is a binary file (7 bytes); read_file returns text only."
    )
    assert refused(ws.read_file("latin1.txt")).startswith("latin1.txt is a binary file")


def test_multibyte_character_cut_by_the_sniff_window_is_still_text(tmp_path: Path) -> None:
    text = "a" * 8191 + "é" + "tail\n"  # é straddles byte 8192
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    assert ok(Workspace(tmp_path).read_file("t.txt")) == text


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    assert refused(Workspace(tmp_path).read_file("pipe")) == (
        "pipe is not a regular file (a device, socket or FIFO)."
    )


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_text("")
    assert ok(Workspace(tmp_path).read_file("e.txt")) == "[e.txt is empty.]"


def test_big_file_is_truncated_at_a_line_with_the_offset_to_read_on(tmp_path: Path) -> None:
    lines = [f"line {i:03}\n" for i in range(1, 101)]  # 9 bytes each
    (tmp_path / "big.txt").write_text("".join(lines))
    ws = Workspace(tmp_path, max_bytes=100)
    first = ok(ws.read_file("big.txt"))
    assert first == "".join(lines[:11]) + (
        "[Truncated: showing lines 1-11 of big.txt (900 bytes in all, 100-byte limit). "
        "Call read_file with offset=12 to read on.]"
    )
    assert ok(ws.read_file("big.txt", offset=12)).startswith("line 012\n")
    assert ok(ws.read_file("big.txt", offset=100)) == "line 100\n"


def test_a_line_longer_than_the_limit_shows_its_start(tmp_path: Path) -> None:
    (tmp_path / "min.js").write_text("x" * 50 + "\nnext\n")
    ws = Workspace(tmp_path, max_bytes=10)
    assert ok(ws.read_file("min.js")) == "x" * 10 + (
        "\n[Truncated: line 1 of min.js is longer than 10 bytes; only its start is shown. "
        "Call read_file with offset=2 to read on after it.]"
    )
    assert ok(ws.read_file("min.js", offset=2)) == "next\n"


def test_offset_past_the_end_and_invalid_offset(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    ws = Workspace(tmp_path)
    assert refused(ws.read_file("a.txt", offset=3)) == (
        "offset 3 is past the end of a.txt, which has 2 lines."
    )
    assert refused(ws.read_file("a.txt", offset=0)).startswith("offset must be a line number")


@given(
    lines=st.lists(
        st.text(
            alphabet=st.characters(codec="utf-8", exclude_characters="\r\n\x00"),
            max_size=9,
        ).map(lambda s: s + "\n"),
        min_size=1,
        max_size=40,
    ),
    max_bytes=st.integers(min_value=40, max_value=200),
)
def test_reading_on_from_each_offset_reassembles_the_file(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], max_bytes: int
) -> None:
    # Every line fits the budget (9 chars of up to 4 bytes + newline < 40), so paging
    # by the offsets the notes name must give back the whole file, byte for byte.
    root = tmp_path_factory.mktemp("paging")
    (root / "f.txt").write_text("".join(lines), encoding="utf-8")
    ws = Workspace(root, max_bytes=max_bytes)
    pages: list[str] = []
    offset = 1
    while True:
        text = ok(ws.read_file("f.txt", offset=offset))
        body, _, note = text.partition("[Truncated: ")
        pages.append(body)
        if not note:
            break
        assert len(body.encode("utf-8")) <= max_bytes
        offset = int(note.split("offset=")[1].split(" ")[0])
    assert "".join(pages) == "".join(lines)


# -- construction and tools ------------------------------------------------------------


def test_bad_roots_and_limits_are_refused(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("")
    with pytest.raises(sm.InvalidInputError, match="does not exist"):
        Workspace(tmp_path / "missing")
    with pytest.raises(sm.InvalidInputError, match="is not a directory"):
        Workspace(tmp_path / "f.txt")
    with pytest.raises(sm.InvalidInputError, match="max_entries must be a positive integer"):
        Workspace(tmp_path, max_entries=0)
    with pytest.raises(sm.InvalidInputError, match="max_bytes must be a positive integer"):
        workspace_tools(tmp_path, max_bytes=True)


def execute(coro_tool: sm.Tool, arguments: dict[str, object]) -> sm.ToolOutput:
    async def call() -> ToolReturn:
        return await coro_tool.execute(dict(arguments), sm.AbortSignal())

    value = asyncio.run(call())
    assert isinstance(value, sm.ToolOutput)
    return value


def test_tools_have_schemas_that_validate_arguments(ws: Workspace) -> None:
    list_files, read_file = workspace_tools(ws.root)
    assert [list_files.name, read_file.name] == ["list_files", "read_file"]
    assert sm.engine.validate_arguments(list_files.definition, {}) == []
    assert sm.engine.validate_arguments(read_file.definition, {"path": "a", "offset": 2}) == []
    assert sm.engine.validate_arguments(read_file.definition, {}) == [
        "arguments: 'path' is a required property"
    ]
    assert sm.engine.validate_arguments(read_file.definition, {"path": "a", "offset": 0}) == [
        "arguments.offset: 0 is less than the minimum of 1"
    ]
    assert len(sm.engine.validate_arguments(list_files.definition, {"recursive": True})) == 1


def test_tools_execute_off_the_event_loop(ws: Workspace) -> None:
    assert ok(execute(list_files_tool(ws.root), {"path": "src/util"})) == "src/util/strings.ts"
    assert ok(execute(read_file_tool(ws.root), {"path": "a.txt"})) == "lower\n"
    assert ok(execute(read_file_tool(ws.root, max_bytes=3), {"path": "a.txt"})).startswith(
        "low\n[Truncated: line 1 of a.txt"
    )
    assert refused(execute(list_files_tool(ws.root, max_entries=1), {"path": "nope"})) == (
        "Directory not found: nope. Use list_files to see the files in the workspace."
    )


def _tool_results(messages: Sequence[sm.Message]) -> list[sm.ToolResultMessage]:
    return [m for m in messages if isinstance(m, sm.ToolResultMessage)]


def _reads_the_suggestion(
    seen: list[sm.ToolResultMessage],
) -> Callable[[Sequence[sm.Message], Sequence[sm.ToolDefinition]], sm.AssistantMessage]:
    """A model that reads a misspelt path, then the path the error suggests."""

    def answer(
        messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
    ) -> sm.AssistantMessage:
        results = _tool_results(messages)
        if not results:
            call = sm.ToolCall("c1", "read_file", {"path": "src/maths.ts"})
            return sm.AssistantMessage([call], stop_reason=sm.messages.StopReason.TOOL_USE)
        last = results[-1]
        seen.append(last)
        if last.is_error and "Did you mean " in last.text:
            path = last.text.split("Did you mean ")[1].rstrip("?")
            call = sm.ToolCall("c2", "read_file", {"path": path})
            return sm.AssistantMessage([call], stop_reason=sm.messages.StopReason.TOOL_USE)
        return sm.AssistantMessage(f"It says: {last.text.strip()}")

    return answer


def test_a_model_recovers_from_the_suggestion_in_a_run(ws: Workspace) -> None:
    seen: list[sm.ToolResultMessage] = []
    model = FunctionModel(_reads_the_suggestion(seen))
    result = sm.run_agent_sync(
        model=model, tools=workspace_tools(ws.root), messages=[sm.UserMessage("read math")]
    )
    assert result.state is sm.TurnState.DONE
    assert [(m.is_error, m.text) for m in seen] == [
        (True, "File not found: src/maths.ts. Did you mean src/math.ts?"),
        (False, "export const add = 1;\n"),
    ]
    assert result.final_text == "It says: export const add = 1;"


# -- file names that are not UTF-8 -------------------------------------------------------


def _strict(output: sm.ToolOutput) -> str:
    text = text_of(output)
    text.encode("utf-8")  # strict: raises on a lone surrogate
    return text


@pytest.fixture
def latin1_tree(tmp_path: Path) -> Workspace:
    root = os.fsencode(tmp_path)
    os.mkdir(root + b"/r\xe9pertoire")
    for name in (b"caf\xe9.txt", b"r\xe9pertoire/na\xefve.md"):
        with open(root + b"/" + name, "wb") as f:
            f.write(b"bytes named in latin-1\n")
    (tmp_path / "plain.txt").write_text("plain\n")
    return Workspace(tmp_path)


def test_names_that_are_not_utf8_are_listed_escaped(latin1_tree: Workspace) -> None:
    assert _strict(latin1_tree.list_files()).splitlines() == [
        "caf\\xe9.txt",
        "plain.txt",
        "r\\xe9pertoire/na\\xefve.md",
    ]
    assert _strict(latin1_tree.list_files("r\\xe9pertoire")) == "r\\xe9pertoire/na\\xefve.md"


def test_an_escaped_name_passed_back_reads_the_file(latin1_tree: Workspace) -> None:
    for path in _strict(latin1_tree.list_files()).splitlines():
        assert _strict(latin1_tree.read_file(path)).endswith("\n")
    assert _strict(latin1_tree.read_file("caf\\xe9.txt")) == "bytes named in latin-1\n"
    # A file whose name really holds the escape text is read as named.
    (latin1_tree.root / "caf\\xe9.txt").write_text("literal\n")
    assert _strict(latin1_tree.read_file("caf\\xe9.txt")) == "literal\n"


def test_errors_about_such_names_are_utf8_too(latin1_tree: Workspace) -> None:
    assert _strict(latin1_tree.read_file("caf\\xe8.txt")) == (
        "File not found: caf\\xe8.txt. Did you mean caf\\xe9.txt?"
    )
    assert _strict(latin1_tree.read_file("r\\xe9pertoire")).startswith(
        "r\\xe9pertoire is a directory, not a file."
    )
    # A model can send lone surrogates (JSON "\udcff", "\ud800"): echoed escaped.
    assert _strict(latin1_tree.read_file("x\udcff\ud800.txt")).startswith(
        "Invalid path x\\xff\\ud800.txt: it holds a lone surrogate"
    )
    assert printable("a\udce9b") == "a\\xe9b"


def _list_then_read(
    messages: Sequence[sm.Message], tools: Sequence[sm.ToolDefinition]
) -> sm.AssistantMessage:
    """Lists the workspace, reads every line of the listing, then stops."""
    # What a provider client sends: the whole context as strict UTF-8 JSON.
    body = json.dumps([sm.messages.message_to_dict(m) for m in messages], ensure_ascii=False)
    body.encode("utf-8")  # strict: raises on a lone surrogate
    results = _tool_results(messages)
    if not results:
        call = sm.ToolCall("c0", "list_files", {})
        return sm.AssistantMessage([call], stop_reason=sm.messages.StopReason.TOOL_USE)
    if len(results) == 1:
        paths = results[0].text.splitlines()
        calls = [sm.ToolCall(f"c{i}", "read_file", {"path": p}) for i, p in enumerate(paths, 1)]
        return sm.AssistantMessage(calls, stop_reason=sm.messages.StopReason.TOOL_USE)
    return sm.AssistantMessage("done")


def test_a_journaled_run_over_such_names_completes_and_replays(
    latin1_tree: Workspace, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = FunctionModel(_list_then_read)
    journal_path = tmp_path_factory.mktemp("journal") / "run.jsonl"
    with sm.journal.Journal(journal_path) as journal:
        result = asyncio.run(
            run_agent_journaled(
                journal=journal,
                model=model,
                tools=workspace_tools(latin1_tree.root),
                messages=[sm.UserMessage("read everything")],
            )
        )
    assert result.state is sm.TurnState.DONE, result.error
    results = [m for m in result.messages if isinstance(m, sm.ToolResultMessage)]
    assert [r.is_error for r in results] == [False, False, False, False]
    assert len(model.requests) == 3
    journal_path.read_bytes().decode("utf-8")  # strict
    assert sm.journal.replay(journal_path).engine.state is sm.TurnState.DONE
