"""Every Python block of the docs site runs, and prints what its comments claim.

The blocks of one page run in order, in one namespace (a page is one story); a
comment line right after a ``print(...)`` line is what that line prints. The site
itself is built with ``mkdocs build --strict`` by ``run.sh test``.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import sys
import types
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def test_the_docs_have_pages_with_examples() -> None:
    assert sum(bool(BLOCK.findall(p.read_text(encoding="utf-8"))) for p in PAGES) >= 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_every_python_block_runs(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = BLOCK.findall(page.read_text(encoding="utf-8"))
    monkeypatch.chdir(DOCS.parent)
    module = types.ModuleType(f"docs_{page.stem}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for index, block in enumerate(blocks):
            try:
                exec(compile(block, f"{page.name} python block {index}", "exec"), module.__dict__)
            except Exception as exc:
                raise AssertionError(f"{page.name} python block {index} failed: {exc!r}") from exc
    printed = out.getvalue()
    for block in blocks:
        for line, after in itertools.pairwise(block.splitlines()):
            if line.startswith("print(") and after.startswith("# "):
                assert after[2:] in printed, f"{page.name} claims {after!r} after {line!r}"
