"""The steps guide's diagram is the one its example agent's table draws."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from statemachine.steps import diagram

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "steps.md"


def test_the_guides_diagram_is_drawn_from_its_example_agent() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    first = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)[0]
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(first, "steps.md python block 0", "exec"), namespace)
    agent = namespace["refund_agent"]()  # type: ignore[operator]
    (drawn,) = re.findall(r"^```mermaid\n(.*?)^```", text, re.S | re.M)
    assert drawn == str(diagram(agent)).rstrip("\n") + "\n"
