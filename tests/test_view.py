"""``statemachine.journal.view_html`` and ``statemachine view``: a journal as one HTML
page, looked at in headless Chromium (tests/headless.py) from ``file://``.

The page loads with the network off, stepping moves the highlight along the diagram,
text from the journal stays text (it is untrusted input), a journal of 10,000 events
stays responsive, and the journals both writers produce (``run_agent_journaled``, the
durable runs' export) are read.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from headless import Browser, keep, offline_browser, text_heights

import statemachine as sm
from statemachine.cli import main
from statemachine.journal import (
    DEFAULT_MAX_VIEW_TEXT,
    Journal,
    JournalError,
    JournalingEngine,
    ReplayStep,
    replay,
    run_agent_journaled,
    view_html,
)

HOSTILE = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


@sm.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@sm.tool
def delete(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


controller = sm.AbortController()


@sm.tool
async def build(signal: sm.AbortSignal) -> str:
    """Build; the user presses stop while it runs."""
    controller.abort("the user pressed stop")
    await asyncio.sleep(30)  # ended by the abort, well before this
    return "built"


class Script:
    """Answers model call n with the n-th response."""

    def __init__(self, *responses: sm.AssistantMessage) -> None:
        self.responses = list(responses)

    async def complete(self, messages: Any, tools: Any, signal: Any) -> sm.AssistantMessage:
        return self.responses.pop(0)


def deny_delete(call: sm.ToolCall, *_: Any) -> sm.Deny | None:
    return sm.Deny("deleting is not allowed", advisory=True) if call.name == "delete" else None


def eventful_journal(path: Path) -> sm.RunResult:
    """A run with a steer, tool calls with results, a denial, and an abort mid-tool."""
    global controller
    controller = sm.AbortController()
    model = Script(
        sm.AssistantMessage(
            [
                sm.TextContent(f"Adding, and deleting {HOSTILE}"),
                sm.ToolCall("c1", "add", {"a": 40, "b": 2}),
                sm.ToolCall("c2", "delete", {"path": HOSTILE}),
            ]
        ),
        sm.AssistantMessage([sm.ToolCall("c3", "build", {})]),
        sm.AssistantMessage("never asked"),
    )
    journal = Journal(path)
    try:
        run = sm.AgentRun(
            model=model,
            tools=[add, delete, build],
            messages=[sm.UserMessage(f"add, delete, build {HOSTILE}")],
            before_tool_call=deny_delete,
            signal=controller.signal,
            grace_period=0.2,
            engine_factory=functools.partial(JournalingEngine, journal=journal),
        )
        run.steer("use integers")
        return asyncio.run(run.run())
    finally:
        journal.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with offline_browser(width=1400, height=1000) as b:
        yield b


def load(browser: Browser, page: Path) -> None:
    browser.open(page)
    assert browser.evaluate("document.body.dataset.ready") == "true"


def current(browser: Browser) -> dict[str, Any]:
    """Where the highlight is: the step, the state node, the edges, the event row."""
    value: dict[str, Any] = browser.evaluate(
        "({step: Number(document.body.dataset.step),"
        " node: [...document.querySelectorAll('#diagram g.node.vw-current title')]"
        "   .map(t => t.textContent),"
        " edges: [...document.querySelectorAll('#diagram g.edge.vw-taken title')]"
        "   .map(t => t.textContent),"
        " rows: [...document.querySelectorAll('#events li.vw-active')].map(li => li.textContent),"
        " message: [...document.querySelectorAll('#messages li.vw-active')]"
        "   .map(li => li.textContent)})"
    )
    return value


def step_through(browser: Browser, steps: Sequence[ReplayStep]) -> list[str]:
    """Press "next" through every step: the highlight is on the state the event led to,
    the edges it took are drawn over, its row is marked. The states seen, in order."""
    seen = []
    for i, step in enumerate(steps, start=1):
        browser.evaluate("document.getElementById('next').click()")
        at = current(browser)
        assert at["step"] == i
        assert at["node"] == [step.state.value]
        assert sorted(set(at["edges"])) == sorted(
            {f"{r.source.value}->{r.dest.value}" for r in step.transitions}
        )
        assert len(at["rows"]) == 1
        assert at["rows"][0].startswith(f"#{i}")
        seen.append(at["node"][0])
    return seen


def press(browser: Browser, key: str) -> None:
    for kind in ("keyDown", "keyUp"):
        browser.call("Input.dispatchKeyEvent", type=kind, key=key, code=key)


@pytest.mark.timeout(120)
def test_the_page_loads_offline_and_stepping_moves_the_highlight(
    tmp_path: Path, browser: Browser
) -> None:
    result = eventful_journal(tmp_path / "run.jsonl")
    assert result.state is sm.TurnState.ABORTED
    steps = replay(tmp_path / "run.jsonl").steps
    page = tmp_path / "run.html"
    assert main(["view", str(tmp_path / "run.jsonl")]) == 0
    load(browser, page)
    at = current(browser)
    assert at["step"] == 0
    assert at["node"] == ["Ready"]
    assert at["edges"] == []
    seen_states = step_through(browser, steps)
    assert seen_states[-1] == "Aborted"
    assert {"AwaitingModel", "DispatchingTools", "Aborting"} <= set(seen_states)
    # Keys step back and jump; #step=N opens a step.
    press(browser, "ArrowLeft")
    assert current(browser)["step"] == len(steps) - 1
    press(browser, "Home")
    assert current(browser)["step"] == 0
    browser.open(tmp_path / "run.jsonl")  # another document first: then a fresh load
    browser.open(page, "step=3")
    assert current(browser)["step"] == 3
    assert current(browser)["node"] == [steps[2].state.value]
    # The timeline names each kind of event; the transcript shows the calls and results.
    rows = browser.evaluate(
        "[...document.querySelectorAll('#events li')].map(li => li.textContent)"
    )
    text = "\n".join(rows)
    for words in ("run starts", "steer from the user", "model asks for add, delete"):
        assert words in text
    for words in ("add returned", "delete denied", "abort requested", "→ Aborted"):
        assert words in text
    chat = browser.evaluate("document.getElementById('messages').textContent")
    assert 'add({"a": 40, "b": 2})' in chat
    assert "result of add (c1)42" in chat
    assert "deleting is not allowed" in chat
    # The diagram is drawn at a size to read; its pane scrolls to the current state.
    press(browser, "End")
    browser.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    heights = text_heights(browser, "#diagram svg text")
    assert {s.value for s in sm.TurnState} <= set(heights)
    assert min(heights.values()) >= 10, sorted(heights.items(), key=lambda kv: kv[1])[:3]
    inside = browser.evaluate(
        "(() => { const pane = document.getElementById('diagram').getBoundingClientRect();"
        " const r = document.querySelector('#diagram g.node.vw-current').getBoundingClientRect();"
        " return r.left >= pane.left && r.right <= pane.right"
        " && r.top >= pane.top && r.bottom <= pane.bottom; })()"
    )
    assert inside, "the current state is scrolled out of the diagram's pane"
    # The run's path: the states it entered and the steps it took, the rest faded.
    on_path = browser.evaluate(
        "[...document.querySelectorAll('#diagram g.node.vw-path title')].map(t => t.textContent)"
    )
    assert set(on_path) == {"Ready"} | {r.dest.value for st in steps for r in st.transitions}
    keep("view.png", browser.screenshot(), min(heights.values()))
    fetched = [
        e["params"]["request"]["url"]
        for e in browser.events
        if e["method"] == "Network.requestWillBeSent"
    ]
    assert [u for u in fetched if not u.startswith(("file:", "data:"))] == []


@pytest.mark.timeout(120)
def test_text_from_the_journal_stays_text(tmp_path: Path, browser: Browser) -> None:
    eventful_journal(tmp_path / "run.jsonl")
    page = view_html(tmp_path / "run.jsonl")
    # Not in the markup: the data sits in a JSON script element with <, > and & escaped.
    assert "</script><script>window.pwned" not in page
    assert "onerror" not in page.split('id="run-data">')[0]
    assert page.count("<script") == 2
    assert "Content-Security-Policy" in page
    (tmp_path / "run.html").write_text(page, encoding="utf-8")
    load(browser, tmp_path / "run.html")
    assert browser.evaluate("typeof window.pwned") == "undefined"
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    assert browser.evaluate("document.querySelectorAll('script').length") == 2
    chat = browser.evaluate("document.getElementById('messages').textContent")
    assert HOSTILE in chat  # shown as the text it is


def many_events_journal(path: Path, turns: int, calls: int) -> sm.RunResult:
    """A run of ``turns`` turns, each with ``calls`` parallel tool calls."""

    class Busy:
        def __init__(self) -> None:
            self.turn = 0

        async def complete(
            self, messages: Sequence[sm.Message], tools: Any, signal: Any
        ) -> sm.AssistantMessage:
            self.turn += 1
            if self.turn > turns:
                return sm.AssistantMessage("done")
            return sm.AssistantMessage(
                [
                    sm.ToolCall(f"t{self.turn}c{i}", "add", {"a": self.turn, "b": i})
                    for i in range(calls)
                ]
            )

    journal = Journal(path, flush="close")
    try:
        return asyncio.run(
            run_agent_journaled(
                journal=journal,
                model=Busy(),
                tools=[add],
                messages=[sm.UserMessage("add a lot")],
                max_turns=turns + 1,
                logger=_quiet(),
            )
        )
    finally:
        journal.close()


def _quiet() -> Any:
    import logging

    import structlog

    return structlog.wrap_logger(
        None, wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
    )


@pytest.mark.timeout(300)
def test_a_journal_of_10000_events_stays_responsive(tmp_path: Path, browser: Browser) -> None:
    result = many_events_journal(tmp_path / "big.jsonl", turns=100, calls=100)
    assert result.state is sm.TurnState.DONE
    events = sum(1 for line in (tmp_path / "big.jsonl").open() if '"seq"' in line)
    assert events >= 10_000
    assert main(["view", str(tmp_path / "big.jsonl")]) == 0
    load(browser, tmp_path / "big.html")
    assert browser.evaluate("document.querySelectorAll('#events li').length") == events + 1
    # Generous bounds for a shared, busy machine: far from what a person calls stuck.
    loaded_ms = browser.evaluate("performance.now()")
    assert loaded_ms < 20_000, f"the page took {loaded_ms:.0f} ms to be ready"
    elapsed = browser.evaluate(
        "(() => { const t = performance.now(); const next = document.getElementById('next');"
        " for (let i = 0; i < 500; i++) next.click();"
        " return performance.now() - t; })()"
    )
    assert current(browser)["step"] == 500
    assert elapsed < 5_000, f"500 steps took {elapsed:.0f} ms"
    jump = browser.evaluate(
        "(() => { const t = performance.now(); document.getElementById('last').click();"
        " return performance.now() - t; })()"
    )
    assert current(browser)["node"] == ["Done"]
    assert jump < 1_000, f"jumping to the end took {jump:.0f} ms"
    keep("view-big.png", browser.screenshot())


# -- without a browser ---------------------------------------------------------------------


def page_data(page: str) -> dict[str, Any]:
    raw = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)
    assert raw is not None
    data: dict[str, Any] = json.loads(raw.group(1))
    return data


def test_the_page_holds_every_step_and_message_of_the_run(tmp_path: Path) -> None:
    result = eventful_journal(tmp_path / "run.jsonl")
    data = page_data(view_html(tmp_path / "run.jsonl"))
    replayed = replay(tmp_path / "run.jsonl")
    assert [s["state"] for s in data["steps"]] == [s.state.value for s in replayed.steps]
    assert [s["line"] for s in data["steps"]] == [s.line for s in replayed.steps]
    assert len(data["messages"]) == len(result.messages)
    assert data["run"]["state"] == "Aborted"
    assert data["run"]["error"] == ""
    kinds = {s["kind"] for s in data["steps"]}
    assert {"run", "model", "tool", "approval", "steer", "abort"} <= kinds
    # Each message after the first points at the step that put it there, and back.
    linked = [m for m in data["messages"] if m["step"] > 0]
    assert len(linked) == len(data["messages"]) - 1
    for index, message in enumerate(data["messages"]):
        if message["step"] > 0 and message["role"] == "assistant":
            assert data["steps"][message["step"] - 1]["message"] == index


def test_a_journal_cut_off_is_shown_up_to_where_it_stops(tmp_path: Path) -> None:
    eventful_journal(tmp_path / "run.jsonl")
    lines = (tmp_path / "run.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    cut = [*lines[:5], lines[5][:10]]
    data = page_data(view_html(cut))
    assert data["run"]["error"].startswith("journal line 6: not valid JSON")
    assert len(data["steps"]) == 4


def test_the_view_bounds_what_it_reads_and_shows(tmp_path: Path) -> None:
    eventful_journal(tmp_path / "run.jsonl")
    size = (tmp_path / "run.jsonl").stat().st_size
    with pytest.raises(JournalError, match="more than the view reads"):
        view_html(tmp_path / "run.jsonl", max_bytes=size - 1)
    lines = (tmp_path / "run.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    with pytest.raises(JournalError, match="longer than 100 characters"):
        view_html(lines, max_bytes=100)
    with pytest.raises(JournalError, match="max_text must be a positive int"):
        view_html(lines, max_text=0)
    data = page_data(view_html(lines, max_text=10))
    first = data["messages"][0]["text"]
    assert first.startswith("add, delet")
    assert first.endswith("more characters not shown)")
    assert DEFAULT_MAX_VIEW_TEXT == 4000


def test_the_view_command_refuses_what_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read journal" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("not a journal\n", encoding="utf-8")
    assert main(["view", str(tmp_path / "notes.txt")]) == 2
    assert "journal line 1: not valid JSON" in capsys.readouterr().err
    eventful_journal(tmp_path / "run.jsonl")
    assert main(["view", str(tmp_path / "run.jsonl"), "--out", str(tmp_path / "run.jsonl")]) == 2
    assert "is the journal itself" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "run.jsonl"), "--out", str(tmp_path / "x.html")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'x.html'} (open it in a browser)\n"
    assert main(["view", str(tmp_path / "run.jsonl"), "--max-bytes", "10"]) == 2
    assert "more than the view reads" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_durable_runs_export_is_viewed(tmp_path: Path) -> None:
    if os.environ.get("CI") == "true":
        import dbos  # noqa: F401 - under CI the extra is installed: fail here, never skip
    else:
        pytest.importorskip("dbos")
    from statemachine.durable.dbos import DBOSRunner
    from statemachine.testing import FunctionModel

    def answer(messages: Sequence[sm.Message], tools: Any) -> sm.AssistantMessage:
        if isinstance(messages[-1], sm.ToolResultMessage):
            return sm.AssistantMessage(f"It is {messages[-1].text}.")
        return sm.AssistantMessage([sm.ToolCall("c1", "add", {"a": 40, "b": 2})])

    runner = DBOSRunner(
        models={"scripted": FunctionModel(answer)},
        tools=[add],
        database_url=f"sqlite:///{tmp_path}/runs.sqlite",
    )

    async def body() -> sm.RunResult:
        runner.launch()
        try:
            handle = await runner.start("durable-view", model="scripted", messages="40 + 2?")
            result = await handle.result(timeout=60)
            await runner.export_journal("durable-view", tmp_path / "exported.jsonl")
            return result
        finally:
            runner.destroy()

    result = asyncio.run(body())
    data = page_data(view_html(tmp_path / "exported.jsonl"))
    assert data["run"]["id"] == "durable-view"
    assert data["run"]["state"] == "Done"
    assert data["run"]["error"] == ""
    assert [m["text"] for m in data["messages"]][-1] == result.final_text
    assert any(s["title"] == "add returned" for s in data["steps"])


def test_a_run_waiting_for_approval_shows_the_request(tmp_path: Path) -> None:
    def ask(call: sm.ToolCall, *_: Any) -> sm.RequireApproval | None:
        return sm.RequireApproval("a person decides") if call.name == "delete" else None

    journal = Journal(tmp_path / "wait.jsonl")
    try:
        result = asyncio.run(
            run_agent_journaled(
                journal=journal,
                model=Script(sm.AssistantMessage([sm.ToolCall("d1", "delete", {"path": "a"})])),
                tools=[delete],
                messages=[sm.UserMessage("delete a")],
                before_tool_call=ask,
            )
        )
    finally:
        journal.close()
    assert result.state is sm.TurnState.AWAITING_USER
    data = page_data(view_html(tmp_path / "wait.jsonl"))
    assert data["run"]["state"] == "AwaitingUser"
    wanted = [s for s in data["steps"] if s["title"] == "delete needs approval"]
    assert len(wanted) == 1
    assert wanted[0]["kind"] == "approval"
    assert 'call d1: delete({"path": "a"})' in wanted[0]["detail"]
    assert "reason: a person decides" in wanted[0]["detail"]


def view_without_graphviz(journal: Path) -> subprocess.CompletedProcess[str]:
    """``statemachine view JOURNAL`` in a fresh interpreter in which pygraphviz cannot
    be imported, as with the base install."""
    code = (
        "import sys; sys.modules['pygraphviz'] = None\n"
        "from statemachine.cli import main\n"
        f"sys.exit(main(['view', {str(journal)!r}]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=100
    )


@pytest.mark.timeout(120)
def test_the_view_draws_without_graphviz_installed(tmp_path: Path) -> None:
    eventful_journal(tmp_path / "run.jsonl")
    done = view_without_graphviz(tmp_path / "run.jsonl")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "run.html").read_text(encoding="utf-8")
    assert all(f"<title>{s.value}</title>" in page for s in sm.TurnState)


def line_separator_journal(path: Path) -> None:
    """A journal whose model answer holds U+2028, which JSON writes as it is."""
    model = Script(sm.AssistantMessage("one\u2028two\u2029three\x85four"))
    journal = Journal(path)
    try:
        asyncio.run(
            run_agent_journaled(
                journal=journal, model=model, tools=[], messages=[sm.UserMessage("hi")]
            )
        )
    finally:
        journal.close()


@pytest.mark.timeout(120)
def test_a_journal_holding_line_separators_is_read_by_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line_separator_journal(tmp_path / "run.jsonl")
    text = (tmp_path / "run.jsonl").read_text(encoding="utf-8")
    assert "\u2028" in text  # the case: str.splitlines breaks this line in two
    assert main(["trace", str(tmp_path / "run.jsonl")]) == 0
    assert "stateDiagram-v2" in capsys.readouterr().out
    assert main(["replay", "--quiet", str(tmp_path / "run.jsonl")]) == 0
    assert main(["view", str(tmp_path / "run.jsonl")]) == 0
    # The docs' idiom for a journal held in memory.
    assert replay(io.StringIO(text)).state is sm.TurnState.DONE


def test_a_bad_journal_exits_the_same_from_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.jsonl").write_text("not a journal\n", encoding="utf-8")
    codes = {c: main([c, str(tmp_path / "notes.jsonl")]) for c in ("view", "replay", "trace")}
    assert codes == {"view": 2, "replay": 2, "trace": 2}
    err = capsys.readouterr().err
    assert "at at" not in err
    assert len(err.splitlines()) == 3, err  # one line each, no traceback
    # JSON's own message ends "starting at", and the column follows it once.
    (tmp_path / "cut-string.jsonl").write_text('{"format": "statemachine-jou\n', "utf-8")
    assert main(["replay", str(tmp_path / "cut-string.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "Unterminated string starting at" in err
    assert "at at" not in err
    assert "Traceback" not in err
    # A journal that reads but goes wrong at a later line: the run did not replay (1).
    line_separator_journal(tmp_path / "run.jsonl")
    lines = (tmp_path / "run.jsonl").read_text(encoding="utf-8").split("\n")
    lines[2] = "{"
    (tmp_path / "cut.jsonl").write_text("\n".join(lines), encoding="utf-8")
    codes = {c: main([c, str(tmp_path / "cut.jsonl")]) for c in ("replay", "trace")}
    assert codes == {"replay": 1, "trace": 1}
    assert main(["view", str(tmp_path / "cut.jsonl")]) == 0  # shown up to that line
