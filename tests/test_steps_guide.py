"""The steps guide's example agent is the one the docs site draws, and its drawing is
the agent's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from statemachine.steps import diagram_fence

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "guides" / "steps.md"
EXAMPLE = ROOT / "examples" / "refund_agent.py"


def test_the_guides_example_is_the_module_its_diagram_draws() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    first = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)[0]
    assert first in EXAMPLE.read_text(encoding="utf-8")
    (fence,) = re.findall(r"^```statemachine-agent-diagram\n(.*?)^```", text, re.S | re.M)
    assert fence.splitlines()[0] == "examples.refund_agent:agent"


@pytest.mark.timeout(60)
def test_the_fence_draws_the_agents_table_with_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pygraphviz")
    monkeypatch.chdir(ROOT)
    html = diagram_fence(
        "examples.refund_agent:agent\nThe refund agent.", "", "statemachine-diagram", {}, None
    )
    assert html.startswith('<figure class="statemachine-diagram"')
    assert "<svg" in html
    for state in ("RefundLimit", "NeedsHumanReview", "AwaitingModel", "Done"):
        assert state in html
    assert "<figcaption>The refund agent.</figcaption>" in html
