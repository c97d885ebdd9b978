"""The docs site as a reader sees it: built with ``zensical build --strict``, opened from
disk in headless Chromium with the network off, its pictures drawn.

The state diagram is SVG drawn from the table when the site is built (the
``statemachine-diagram`` fence); these tests look at the pixels, not at the markup
alone, so a page that shows the diagram's source as text fails. Set
``STATEMACHINE_SCREENSHOTS`` to a directory to keep the screenshots.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from headless import Browser, keep, offline_browser, pixels_of, png_pixels, text_heights

from statemachine.core.table import TurnState

REPO = Path(__file__).resolve().parent.parent
READABLE_PX = 10.0  # the smallest text height a person reads on a 1280 px screen
WAITING_FILL = (0xFF, 0xF4, 0xC2)  # the yellow of a state where the run waits for a person
TERMINAL_FILL = (0xEE, 0xEE, 0xEE)  # the grey of a state that ends the run


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    # zensical builds only inside the project: a directory of its own under build/.
    (REPO / "build").mkdir(exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="site-test-", dir=REPO / "build"))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "zensical", "build", "--strict", "-f", "mkdocs.yml"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "STATEMACHINE_SITE_DIR": str(out)},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with offline_browser(width=1280, height=1000) as b:
        yield b


def fetched(browser: Browser) -> list[str]:
    """The URLs the page asked for that are not files of the site."""
    urls = [
        e["params"]["request"]["url"]
        for e in browser.events
        if e["method"] == "Network.requestWillBeSent"
    ]
    return [u for u in urls if not u.startswith(("file:", "data:", "blob:"))]


@pytest.mark.timeout(240)
def test_the_concepts_page_draws_the_state_diagram(site: Path, browser: Browser) -> None:
    browser.open(site / "concepts" / "index.html")
    figure = "document.querySelector('figure.statemachine-diagram')"
    # The DOM: an <svg> in the figure, with every state's name as text, drawn at least
    # READABLE_PX high.
    heights = text_heights(browser, "figure.statemachine-diagram svg text")
    missing = [s.value for s in TurnState if s.value not in heights]
    assert not missing, f"states not in the drawn diagram: {missing}"
    small = {t: h for t, h in heights.items() if h < READABLE_PX}
    assert not small, f"text drawn under {READABLE_PX} px high: {small}"
    assert browser.evaluate("document.body.textContent.includes('stateDiagram')") is False
    # The pixels: the figure is scrolled into view and photographed.
    browser.evaluate(f"{figure}.scrollIntoView({{block: 'center'}})")
    box = browser.evaluate(
        f"(() => {{ const r = {figure}.querySelector('svg').getBoundingClientRect();"
        " return [r.x, r.y, r.width, r.height]; })()"
    )
    x, y, width, height = box
    assert width >= 500, f"the diagram is {width:.0f} px wide"
    assert height >= 250, f"the diagram is {height:.0f} px high"
    png = browser.screenshot()
    keep("concepts.png", png, min(heights.values()))
    _, _, rows = png_pixels(png)
    region = [row[int(x) * 3 : int(x + width) * 3] for row in rows[int(y) : int(y + height)]]
    # Drawn, not printed: the state boxes' fills cover areas no text has, and ink
    # (anything not white) spans most of the figure in both directions. A box is at
    # least 150 px of its fill at the page's width (the diagram shrinks as the table
    # grows), and text has none of those colours.
    yellow = list(pixels_of(region, WAITING_FILL))
    grey = list(pixels_of(region, TERMINAL_FILL))
    terminal = sum(1 for s in TurnState if s.is_terminal)
    assert len(yellow) >= 150, f"{len(yellow)} px of the waiting state's fill"
    assert len(grey) >= terminal * 150, f"{len(grey)} px of the terminal states' fill"
    ink = [
        (i // 3, j)
        for j, row in enumerate(region)
        for i in range(0, len(row), 3)
        if row[i : i + 3] != b"\xff\xff\xff"
    ]
    xs, ys = [p[0] for p in ink], [p[1] for p in ink]
    assert max(xs) - min(xs) >= 0.8 * width
    assert max(ys) - min(ys) >= 0.6 * min(height, 1000 - y)
    assert fetched(browser) == []


@pytest.mark.timeout(240)
def test_a_click_opens_every_trigger_and_guard_at_a_size_to_read(
    site: Path, browser: Browser
) -> None:
    browser.open(site / "concepts" / "index.html")
    selector = "figure.statemachine-diagram .sm-full svg text"
    assert text_heights(browser, selector) == {}, "the full drawing shows before a click"
    browser.evaluate(
        "(() => { const s = document.querySelector('figure.statemachine-diagram summary');"
        " s.scrollIntoView(); s.click(); })()"
    )
    heights = text_heights(browser, selector)
    # Every state, and the triggers and guards the overview leaves out.
    assert {s.value for s in TurnState} <= set(heights)
    assert {"model responded [has tool calls]", "abort"} <= set(heights)
    small = {t: h for t, h in heights.items() if h < READABLE_PX}
    assert not small, f"text drawn under {READABLE_PX} px high: {small}"
    # At its own size it is wider than the column, which scrolls instead of squeezing it.
    widths = browser.evaluate(
        "(() => { const d = document.querySelector('figure.statemachine-diagram .sm-scroll');"
        " return [d.scrollWidth, d.clientWidth]; })()"
    )
    assert widths[0] > widths[1] > 500, widths
    keep("concepts-full.png", browser.screenshot(), min(heights.values()))


@pytest.mark.timeout(240)
def test_the_steps_guide_draws_its_agents_table(site: Path, browser: Browser) -> None:
    browser.open(site / "guides" / "steps" / "index.html")
    # Drawn by the extension the library ships for your docs (statemachine.docs): the
    # agent's tools, then its table's overview, the guardrail's states among the rest.
    agent = "div.statemachine-agent[data-agent='examples.refund_agent:agent']"
    tools = browser.evaluate(f'document.querySelector("{agent} table").textContent')
    assert "lookup_order" in tools
    heights = text_heights(browser, f"{agent} .sm-overview svg text")
    for state in ("RefundLimit", "NeedsHumanReview", *(s.value for s in TurnState)):
        assert state in heights, f"{state} is not in the drawn diagram"
    small = {t: h for t, h in heights.items() if h < READABLE_PX}
    assert not small, f"text drawn under {READABLE_PX} px high: {small}"
    browser.evaluate(f'document.querySelector("{agent} .sm-overview").scrollIntoView()')
    keep("steps.png", browser.screenshot(), min(heights.values()))
    assert fetched(browser) == []


@pytest.mark.timeout(240)
def test_the_openai_agents_comparison_draws_the_triage_team(site: Path, browser: Browser) -> None:
    browser.open(site / "guides" / "from-openai-agents" / "index.html")
    agent = "div.statemachine-agent[data-agent='examples.language_team:agent']"
    tools = browser.evaluate(f'document.querySelector("{agent} table").textContent')
    assert "transfer_to_french" in tools
    heights = text_heights(browser, f"{agent} .sm-overview svg text")
    assert {"HandoffLimit", "HandoffLimitExceeded", "AwaitingModel", "Done"} <= set(heights)
    small = {t: h for t, h in heights.items() if h < READABLE_PX}
    assert not small, f"text drawn under {READABLE_PX} px high: {small}"
    assert fetched(browser) == []


def test_no_page_leaves_a_diagram_to_a_script() -> None:
    pages = sorted((REPO / "docs").rglob("*.md"))
    assert len(pages) > 10
    assert not [p.name for p in pages if "```mermaid" in p.read_text(encoding="utf-8")]


@pytest.mark.timeout(240)
def test_the_home_page_shows_the_diagram_and_the_example_in_one_screen(
    site: Path, browser: Browser
) -> None:
    browser.open(site / "index.html")
    heights = text_heights(browser, "figure.statemachine-diagram svg text")
    assert {s.value for s in TurnState} <= set(heights)
    small = {t: h for t, h in heights.items() if h < READABLE_PX}
    assert not small, f"text drawn under {READABLE_PX} px high: {small}"
    # What it is and the picture start on the first screen of a 1280x1000 window; the
    # guarantees and the example follow it, then where to go next.
    tops = browser.evaluate(
        "['h1', 'figure.statemachine-diagram', 'ul', 'pre', 'a[href*=tutorial]'].map(s =>"
        " document.querySelector('article ' + s).getBoundingClientRect().top)"
    )
    assert max(tops[:2]) < 1000, tops
    assert tops == sorted(tops), tops
    assert tops[4] < 2400, tops
    keep("home.png", browser.screenshot(), min(heights.values()))
    assert fetched(browser) == []


@pytest.mark.timeout(240)
def test_the_home_page_has_the_site_navigation_at_desktop_width(
    site: Path, browser: Browser
) -> None:
    browser.open(site / "index.html")
    # The primary navigation is laid out and shown beside the page, not only in a menu.
    links = browser.evaluate(
        "[...document.querySelectorAll('.md-sidebar--primary .md-nav__link')]"
        ".filter(a => { const r = a.getBoundingClientRect();"
        " return r.width > 0 && r.height > 0 && r.left < 400; }).map(a => a.textContent.trim())"
    )
    assert {"Tutorial", "Concepts", "Command line"} <= set(links), links


@pytest.mark.timeout(240)
@pytest.mark.parametrize("page", ["index.html", "tutorial/index.html", "guides/running/index.html"])
def test_code_blocks_fit_the_page_without_scrolling(
    site: Path, browser: Browser, page: str
) -> None:
    browser.open(site / page)
    count = browser.evaluate("document.querySelectorAll('article pre > code').length")
    assert count > 0
    wide = browser.evaluate(
        "[...document.querySelectorAll('article pre > code')]"
        ".filter(c => c.scrollWidth > c.clientWidth)"
        ".map(c => c.textContent.split('\\n').reduce((a, b) => a.length >= b.length ? a : b))"
    )
    assert wide == [], f"{page}: code blocks scroll sideways; their longest lines: {wide}"


def test_the_reference_names_every_export_of_statemachine() -> None:
    import statemachine

    page = (REPO / "docs" / "reference" / "statemachine.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"^::: statemachine\.(\w+)$", page, re.M))
    assert set(statemachine.__all__) <= shown, set(statemachine.__all__) - shown


@pytest.mark.timeout(240)
def test_no_reference_page_dumps_an_all_list(site: Path) -> None:
    pages = sorted((site / "reference").rglob("index.html"))
    assert len(pages) >= 10
    assert [p.parent.name for p in pages if "__all__" in p.read_text(encoding="utf-8")] == []


def test_a_missing_browser_fails_under_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shutil

    import headless

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must have it"):
        headless.chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium"):
        headless.chromium()
