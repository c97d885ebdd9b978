"""Every Python block of the docs site runs, and prints what its comments claim.

The blocks of one page run in order, in one namespace (a page is one story); a
comment line right after a ``print(...)`` line is what that line prints. The site
itself is built with ``zensical build --strict`` by ``run.sh test``.
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
# A block right after this comment needs a provider account, a model server or an extra.
NOT_RUN = re.compile(r"<!-- docs-test: not run \((.+?)\) -->\n```python\n(.*?)^```", re.S | re.M)


def _blocks(page: Path) -> list[str]:
    return BLOCK.findall(NOT_RUN.sub("", page.read_text(encoding="utf-8")))


def test_only_examples_that_need_a_provider_or_a_server_are_not_run() -> None:
    for page in PAGES:
        for reason, block in NOT_RUN.findall(page.read_text(encoding="utf-8")):
            assert any(w in reason for w in ("provider", "server", "extra")), (page.name, reason)
            compile(block, f"{page.name}: an example not run", "exec")  # it parses


def test_the_docs_have_pages_with_examples() -> None:
    assert sum(bool(_blocks(p)) for p in PAGES) >= 5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_every_python_block_runs(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _blocks(page)
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
            line, after = line.strip(), after.strip()
            if line.startswith("print(") and after.startswith("# "):
                assert after[2:] in printed, f"{page.name} claims {after!r} after {line!r}"
