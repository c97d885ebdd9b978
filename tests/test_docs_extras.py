"""Guides whose code needs an extra say so where a reader sees it (an admonition at the
top), and their code stops with the library's one-line message, not a traceback, when
the extra is not installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# page -> (the extra the admonition names, a module of its SDK to take away)
NEEDS = {
    "guides/mcp.md": ("[mcp]", "mcp"),
    "guides/providers.md": ("[openai", "openai"),
    "guides/otel.md": ("[otel]", "opentelemetry"),
    "guides/durable.md": ("[dbos]", None),
    "guides/temporal.md": ("[temporal]", None),
}


@pytest.mark.parametrize("page", sorted(NEEDS))
def test_a_guide_that_needs_an_extra_says_so_at_its_top(page: str) -> None:
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    extra, _ = NEEDS[page]
    note = re.search(r'^!!! note "Needs[^"]*"\n\n((?:    .*\n|\n)+)', text, re.M)
    assert note is not None, f"{page} has no 'Needs ...' admonition"
    assert extra in note.group(0)
    assert "pip install 'agent-statemachine[" in note.group(1)
    first_code = min((m.start() for m in re.finditer("^```", text, re.M)), default=len(text))
    assert note.start() < first_code, f"{page}: the note comes after the code"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", sorted(p for p, (_, m) in NEEDS.items() if m))
def test_a_guides_code_without_its_extra_stops_in_one_line(page: str, tmp_path: Path) -> None:
    extra, module = NEEDS[page]
    blocks = BLOCK.findall((REPO / "docs" / page).read_text(encoding="utf-8"))
    script = tmp_path / "guide.py"
    # The SDK taken away as if it were not installed, then the page's code as a reader
    # pastes it, block after block.
    script.write_text(
        f"import sys\nsys.modules[{module!r}] = None\n" + "\n".join(blocks), encoding="utf-8"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"pip install 'agent-statemachine{extra}" in done.stderr
