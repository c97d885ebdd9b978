"""Your agent in your docs: ``statemachine.docs.markdown`` (MkDocs, Zensical) and
``statemachine.docs.sphinx`` draw a user's agent from ``package.module:attr``.

Each test builds a small sample site of its kind around a sample agent, opens it in
headless Chromium (tests/headless.py) with the network off, and measures what a reader
sees: the agent's tools and limits, its loop drawn with every state, and text at least
10 px high. A target that names no agent stops each kind of build. Set
``STATEMACHINE_SCREENSHOTS`` to a directory to keep the screenshots.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import markdown
import pytest
from headless import Browser, keep, offline_browser, text_heights

import statemachine.docs
from statemachine import Agent
from statemachine._figures import packaged_svg
from statemachine._render import chart_from_table, svg_inline
from statemachine.core.table import TurnState
from statemachine.docs import _chart_of, agent_html, load_agent
from statemachine.errors import DiagramError
from statemachine.testing import ScriptedModel

REPO = Path(__file__).resolve().parent.parent
READABLE_PX = 10.0
KINDS = ("mkdocs", "zensical", "sphinx")

SAMPLE_AGENT = '''
import statemachine as sm
from statemachine.testing import ScriptedModel


@sm.tool(timeout=5)
def look_up_order(order_id: str) -> str:
    """Look up an order by its id.

    Args:
        order_id: the order's id
    """
    return "order " + order_id


@sm.tool(sequential=True)
def refund(order_id: str) -> str:
    """Refund an order <in full>.

    Args:
        order_id: the order's id
    """
    return "refunded " + order_id


desk = sm.Agent(
    ScriptedModel(sm.AssistantMessage("done")),
    name="Refund desk",
    tools=[look_up_order, refund],
    max_turns=4,
    usage_limits=sm.UsageLimits(requests=12),
)
not_an_agent = 42
'''

SITES = {
    "mkdocs": {
        "mkdocs.yml": "site_name: sample\nmarkdown_extensions:\n  - statemachine.docs.markdown\n",
        "docs/index.md": "# The refund desk\n\n.. statemachine-agent:: {target}\n\nAfter.\n",
    },
    "zensical": {
        "mkdocs.yml": "site_name: sample\nmarkdown_extensions:\n  - statemachine.docs.markdown\n",
        "docs/index.md": "# The refund desk\n\n.. statemachine-agent:: {target}\n\nAfter.\n",
    },
    "sphinx": {
        "conf.py": "project = 'sample'\nextensions = ['statemachine.docs.sphinx']\n",
        "index.rst": "The refund desk\n===============\n\n.. statemachine-agent:: {target}\n\n"
        "After.\n",
    },
}


def build(kind: str, root: Path, target: str) -> subprocess.CompletedProcess[str]:
    """Write the sample site of ``kind`` under ``root`` and build it into root/out."""
    for name, text in SITES[kind].items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text.format(target=target), encoding="utf-8")
    command = {
        "mkdocs": [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", "out"],
        "zensical": [sys.executable, "-m", "zensical", "build", "--strict", "-f", "mkdocs.yml"],
        "sphinx": [sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", ".", "out"],
    }[kind]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(root.parent / "pkg")])}
    return subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, timeout=200, check=False
    )


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    # zensical builds only inside a project of its own; the sites live under build/.
    (REPO / "build").mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="sample-sites-", dir=REPO / "build"))
    (root / "pkg" / "sample_agents").mkdir(parents=True)
    (root / "pkg" / "sample_agents" / "__init__.py").write_text("", encoding="utf-8")
    (root / "pkg" / "sample_agents" / "refund.py").write_text(SAMPLE_AGENT, encoding="utf-8")
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with offline_browser(width=1280, height=1000) as b:
        yield b


def built_page(kind: str, site: Path) -> Path:
    if kind == "zensical":
        return site / "site" / "index.html"
    return site / "out" / "index.html"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_a_sample_site_draws_the_agent_readably(kind: str, workdir: Path, browser: Browser) -> None:
    site = workdir / kind
    site.mkdir()
    done = build(kind, site, "sample_agents.refund:desk")
    assert done.returncode == 0, done.stdout + done.stderr
    browser.open(built_page(kind, site))
    agent = "document.querySelector('.statemachine-agent')"
    text = browser.evaluate(f"{agent}.textContent")
    for words in ("Refund desk", "look_up_order", "Look up an order by its id.", "timeout 5 s"):
        assert words in text, words
    assert "Refund an order <in full>." in text  # the docstring's text, shown as text
    assert "runs alone" in text
    assert "max_turns4" in text.replace(" ", "")
    assert "usage_limits.requests12" in text.replace(" ", "")
    assert "ScriptedModel" in text
    heights = text_heights(browser, ".statemachine-agent svg text")
    assert {s.value for s in TurnState} <= set(heights)
    small = {t: h for t, h in heights.items() if h < READABLE_PX}
    assert not small, f"{kind}: text drawn under {READABLE_PX} px high: {small}"
    # Shown, not squeezed: the overview is wide enough to read and fits the page.
    width = browser.evaluate(
        f"{agent}.querySelector('.sm-overview svg').getBoundingClientRect().width"
    )
    assert 500 <= width <= 1280, width
    browser.evaluate(f"{agent}.querySelector('.sm-overview').scrollIntoView()")
    keep(f"sample-{kind}.png", browser.screenshot(), min(heights.values()))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", KINDS)
def test_a_sample_site_naming_no_agent_does_not_build(kind: str, workdir: Path) -> None:
    site = workdir / f"{kind}-bad"
    site.mkdir()
    done = build(kind, site, "sample_agents.refund:not_an_agent")
    assert done.returncode != 0, done.stdout + done.stderr
    assert "expected an Agent, got int" in done.stdout + done.stderr


def test_load_agent_names_what_is_wrong(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "sample_agents_x.py").write_text(SAMPLE_AGENT, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_agent("sample_agents_x:desk").name == "Refund desk"
    cases = {
        "no colon": "is not package.module:attr",
        "x" * 400 + ":a": "is not package.module:attr",
        "no_such_module_here:agent": "cannot import no_such_module_here: ModuleNotFoundError",
        "sample_agents_x:missing": "sample_agents_x has no missing",
        "sample_agents_x:not_an_agent": "expected an Agent, got int",
    }
    for target, message in cases.items():
        with pytest.raises(DiagramError, match=message):
            load_agent(target)


def test_an_agent_without_steps_is_drawn_from_the_built_in_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "sample_agents_y.py").write_text(SAMPLE_AGENT, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    agent = load_agent("sample_agents_y:desk")
    sample_module = sys.modules["sample_agents_y"]
    assert _chart_of(agent) == chart_from_table()
    assert svg_inline(packaged_svg("overview")) in agent_html("sample_agents_y:desk")
    # Through the one function (statemachine.steps.chart): an agent whose table has a
    # declared step's rows, ending in a state of its own, is drawn with them.
    from statemachine.steps import End, GoOn, Step, chart

    review = Step(
        "review",
        "after_final",
        {"ok": GoOn(), "rejected": End("ReviewRejected", "a person rejected the answer")},
        lambda messages: "ok",
    )
    reviewed = Agent(ScriptedModel(), tools=agent.tools, steps=[review])
    monkeypatch.setattr(sample_module, "reviewed", reviewed, raising=False)
    drawn = _chart_of(reviewed)
    assert drawn == chart(reviewed) != chart_from_table()
    assert "ReviewRejected" in drawn.terminal
    assert drawn.docs["ReviewRejected"] == "a person rejected the answer"
    pytest.importorskip("pygraphviz")  # a table of its own is drawn by Graphviz
    page = agent_html("sample_agents_y:reviewed")
    assert "ReviewRejected" in page
    assert "step decided [outcome=rejected]" in page


def test_the_markdown_line_inside_code_stays_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "sample_agents_z.py").write_text(SAMPLE_AGENT, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    md = markdown.Markdown(extensions=["fenced_code", "statemachine.docs.markdown"])
    page = md.convert(
        "```\n.. statemachine-agent:: sample_agents_z:desk\n```\n\n"
        "    .. statemachine-agent:: sample_agents_z:desk\n\n"
        ".. statemachine-agent:: sample_agents_z:desk\n"
    )
    assert page.count('<div class="statemachine-agent"') == 1
    assert page.count(".. statemachine-agent:: sample_agents_z:desk") == 2
    assert statemachine.docs.__all__ == ["agent_html", "load_agent"]


BROKEN_FENCE = """
import statemachine._figures as figures
from statemachine.errors import DiagramError


def lost(view="full"):
    raise DiagramError("the drawing is lost")


figures.packaged_svg = lost  # as an install that lost its data files
fence = figures.svg_fence
"""

FENCE_SITE = """site_name: sample
markdown_extensions:
  - pymdownx.superfences:
      custom_fences:
        - name: statemachine-diagram
          class: statemachine-diagram
          format: !!python/name:broken_fence.fence
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["mkdocs", "zensical"])
def test_a_diagram_fence_that_cannot_draw_stops_the_build(kind: str, workdir: Path) -> None:
    # superfences shows a fence whose function fails as plain code, and --strict passed.
    (workdir / "pkg" / "broken_fence.py").write_text(BROKEN_FENCE, encoding="utf-8")
    site = workdir / f"{kind}-fence"
    (site / "docs").mkdir(parents=True)
    (site / "mkdocs.yml").write_text(FENCE_SITE, encoding="utf-8")
    (site / "docs" / "index.md").write_text(
        "# Loop\n\n```statemachine-diagram\nThe loop.\n```\n", encoding="utf-8"
    )
    command = {
        "mkdocs": [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", "out"],
        "zensical": [sys.executable, "-m", "zensical", "build", "--strict", "-f", "mkdocs.yml"],
    }[kind]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(workdir / "pkg")])}
    done = subprocess.run(
        command, cwd=site, env=env, capture_output=True, text=True, timeout=200, check=False
    )
    assert done.returncode != 0, done.stdout + done.stderr
    assert "statemachine-diagram: the drawing is lost" in done.stdout + done.stderr
