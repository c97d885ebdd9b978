"""The README's Python examples run as they are, in order, in one namespace."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import re
import sys
import types
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
TEXT = README.read_text(encoding="utf-8")
# A block right after a "readme-test: not run" comment needs a provider account or a
# model server; every other block must run here, offline.
NOT_RUN = re.compile(r"<!-- readme-test: not run \((.+?)\) -->\n```python\n(.*?)```", re.S)
SKIPPED = NOT_RUN.findall(TEXT)
BLOCKS = re.findall(r"```python\n(.*?)```", NOT_RUN.sub("", TEXT), re.S)


def test_only_provider_examples_are_not_run() -> None:
    assert len(SKIPPED) <= 2
    for reason, block in SKIPPED:
        assert "provider" in reason or "server" in reason
        assert "statemachine.providers" in block or "OpenAIChatModel(" in block
        compile(block, "README.md provider example", "exec")  # at least it parses


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 1  # the rest of the examples live in docs/ (tests/test_docs.py)


def test_every_python_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Run from the repository root so the examples that read README.md find it.
    monkeypatch.chdir(README.parent)
    # A real module, so that classes defined in the examples (dataclasses) can find it.
    module = types.ModuleType("readme")
    monkeypatch.setitem(sys.modules, "readme", module)
    namespace = module.__dict__
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for index, block in enumerate(BLOCKS):
            try:
                exec(compile(block, f"README.md python block {index}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"README python block {index} failed: {exc!r}") from exc
    printed = out.getvalue()
    # What the examples claim in their comments is what they print: a comment right
    # after a print(...) line is what that line prints.
    for block in BLOCKS:
        lines = block.splitlines()
        for line, after in itertools.pairwise(lines):
            line, after = line.strip(), after.strip()
            if line.startswith("print(") and after.startswith("# "):
                assert after[2:] in printed, f"README claims {after!r} after {line!r}"
    assert os.getcwd() == str(README.parent)
