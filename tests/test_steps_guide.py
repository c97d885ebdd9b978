"""The example agents of the steps guide and of the OpenAI Agents SDK comparison are the
ones the docs site draws, and each drawing is the agent's table, drawn by the docs
extension the library ships."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import markdown
import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "steps.md"
COMPARISON = ROOT / "docs" / "guides" / "from-openai-agents.md"
# page: (the module its drawing names, the python block of the page the module holds)
DRAWN = {
    GUIDE: ("examples.refund_agent", 0),
    COMPARISON: ("examples.language_team", 5),
}


@pytest.mark.parametrize("page", DRAWN, ids=lambda p: p.name)
def test_a_pages_example_is_the_module_its_diagram_draws(page: Path) -> None:
    module, index = DRAWN[page]
    text = page.read_text(encoding="utf-8")
    block = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)[index]
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8")
    assert block in source
    lines = re.findall(r"^\.\. statemachine-agent:: (\S+)$", text, re.M)
    assert lines == [f"{module}:agent"]


@pytest.mark.timeout(60)
def test_the_guide_draws_the_agents_table_with_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pygraphviz")  # a table of its own is drawn by Graphviz
    # As the site is built: from the repository's root, nothing else on the path.
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(ROOT))])
    monkeypatch.delitem(sys.modules, "examples.refund_agent", raising=False)
    page = markdown.Markdown(extensions=["statemachine.docs.markdown"]).convert(
        ".. statemachine-agent:: examples.refund_agent:agent\n"
    )
    assert page.startswith('<div class="statemachine-agent"')
    assert "<strong>Refund desk</strong>" in page
    assert "<td>lookup_order</td>" in page
    assert page.count("<svg") == 2  # the overview, and the full drawing a click away
    for state in ("RefundLimit", "NeedsHumanReview", "AwaitingModel", "Done"):
        assert state in page
    assert "step decided [outcome=retry, retries left]" in page
