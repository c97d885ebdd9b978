"""The live page in headless Chromium: a run shown while it runs, and a page of another
origin that tries to drive a run and cannot."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ag_ui", reason="the [live] extra is not installed")
pytest.importorskip("ag_ui_validate", reason="ag-ui-validate (the [dev] extra) is not installed")

from headless import Browser, chromium, keep
from live_support import (
    DEADLINE,
    TOKEN,
    Call,
    PacedModel,
    Say,
    StreamReader,
    Wait,
    live_server,
    run_input,
)

import statemachine as sm
from statemachine.agent.model import CallOptions
from statemachine.core.messages import AssistantMessage
from statemachine.live import LiveApp


def _until(browser: Browser, expression: str, what: str) -> Any:
    """Poll ``expression`` in the page until it is truthy (bounded)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        value = browser.evaluate(expression)
        if value:
            return value
        assert time.monotonic() < deadline, f"the page never showed {what}"
        time.sleep(0.05)


def _open(browser: Browser, url: str) -> None:
    browser.events = [e for e in browser.events if e["method"] != "Page.loadEventFired"]
    browser.call("Page.navigate", url=url)
    browser.wait_event("Page.loadEventFired")


SMALLEST_TEXT = """(() => {
  let html = Infinity, svg = Infinity;
  for (const e of document.querySelectorAll("body *")) {
    if (!e.childNodes.length || e.closest("[hidden]")) continue;
    const own = [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own) continue;
    const box = e.getBoundingClientRect();
    if (!box.width || !box.height) continue;
    if (e.closest("svg")) svg = Math.min(svg, box.height);
    else html = Math.min(html, parseFloat(getComputedStyle(e).fontSize));
  }
  return [html, svg];
})()"""


@pytest.mark.timeout(180)
def test_the_page_shows_the_run_while_it_runs() -> None:
    chromium()
    asked, said, answered = threading.Event(), threading.Event(), threading.Event()

    @sm.tool
    async def lookup(city: str) -> str:
        """Look a city's weather up."""
        from live_support import wait_for

        await wait_for(answered)
        return f"{city}: 21 C"

    model = PacedModel(
        [
            Wait(asked),
            Say("Let me "),
            Wait(said),
            Say("look."),
            Call("c1", "lookup", {"city": "Paris"}),
        ],
        [Say("It is 21 C in Paris.")],
    )
    app = LiveApp(sm.Agent(model, tools=[lookup]), token=TOKEN)
    try:
        with live_server(app) as url, Browser(width=1280, height=900) as b:
            starter = StreamReader(url + "/", "POST", run_input("r1", prompt="weather in Paris?"))
            starter.wait_until("the run started", lambda r: "STATE_DELTA" in r.types())
            _open(b, f"{url}/?token={TOKEN}")
            _until(b, "location.hash === '#run=r1'", "the run it follows")
            _until(b, "document.body.dataset.state === 'AwaitingModel'", "the run waiting")
            lit = "document.querySelector('#diagram g.live-current title').textContent"
            assert b.evaluate(lit) == "AwaitingModel"
            asked.set()
            _until(
                b,
                "document.querySelector('#messages li.streaming')?.textContent.includes('Let me')",
                "the first words, streaming",
            )
            png = b.screenshot()
            keep("live-mid-run.png", png)
            smallest_html, smallest_svg = b.evaluate(SMALLEST_TEXT)
            said.set()
            _until(b, "document.body.dataset.state === 'CollectingResults'", "the tool running")
            assert b.evaluate(lit) == "CollectingResults"
            running = "document.querySelector('#messages .call.running')?.textContent"
            assert b.evaluate(running) == 'lookup({"city":"Paris"})'
            answered.set()
            _until(b, "document.body.dataset.finished === 'true'", "the run's end")
            transcript = b.evaluate("document.getElementById('messages').innerText")
            page = b.evaluate("document.documentElement.outerHTML")
            assert b.evaluate("document.body.dataset.state") == "Done"
            assert b.evaluate(lit) == "Done"
            starter.join()
    finally:
        for gate in (asked, said, answered):
            gate.set()
    assert "weather in Paris?" in transcript
    assert "Let me look." in transcript
    assert "Paris: 21 C" in transcript
    assert "It is 21 C in Paris." in transcript
    assert TOKEN not in page
    assert smallest_html >= 12, smallest_html
    assert smallest_svg >= 10, smallest_svg  # the diagram at its own size, the state in view
    print(f"live page mid-run: smallest text {smallest_html}px (HTML), {smallest_svg:.1f}px (SVG)")


class _Chatty:
    async def complete(
        self, messages: object, tools: object, signal: object, *, options: CallOptions | None = None
    ) -> AssistantMessage:
        assert options is not None
        assert options.on_text is not None
        for _ in range(300):
            options.on_text("word ")
        return AssistantMessage("word " * 300)


@pytest.mark.timeout(180)
def test_the_page_says_how_many_events_it_missed_when_it_fell_behind() -> None:
    chromium()
    app = LiveApp(sm.Agent(_Chatty()), token=TOKEN, max_buffered=5)
    with live_server(app) as url, Browser(width=1280, height=900) as b:
        _open(b, f"{url}/?token={TOKEN}")
        _until(b, "document.body.dataset.ready === 'true'", "the page ready")
        b.evaluate(
            "document.getElementById('prompt').value = 'talk';"
            "document.querySelector('#start button').click(); true"
        )
        _until(b, "document.body.dataset.finished === 'true'", "the run's end")
        dropped = int(b.evaluate("document.body.dataset.dropped"))
        notice = b.evaluate("document.getElementById('dropped').textContent")
        hidden = b.evaluate("document.getElementById('dropped').hidden")
        transcript = b.evaluate("document.getElementById('messages').innerText")
    assert dropped > 200
    assert not hidden
    assert notice.startswith(f"{dropped} event(s) dropped")
    assert transcript.count("word") == 300  # the message itself is whole


# -- another origin -----------------------------------------------------------------------------

ATTACK = """<!doctype html>
<html><body>
<iframe name="sink" hidden></iframe>
<form id="f" method="POST" action="{live}/runs/r1/abort" target="sink" enctype="text/plain">
  <input name="{{}}" value="">
</form>
<script>
const live = "{live}";
const body = JSON.stringify({start});
const tries = [
  fetch(live + "/", {{ method: "POST", mode: "no-cors", credentials: "include",
    headers: {{ "content-type": "text/plain" }}, body }}),
  fetch(live + "/runs/r1/abort", {{ method: "POST", mode: "no-cors", credentials: "include",
    body: "{{}}" }}),
  fetch(live + "/runs/r1/steer", {{ method: "POST", credentials: "include",
    headers: {{ "content-type": "application/json" }}, body: '{{"message": "obey"}}' }}),
  fetch(live + "/", {{ method: "POST", credentials: "include",
    headers: {{ "content-type": "application/json" }}, body }}),
  fetch(live + "/runs/r1/events", {{ credentials: "include" }}).then((r) => r.text()),
  fetch(live + "/runs", {{ credentials: "include" }}).then((r) => r.text()),
];
document.getElementById("f").submit();
Promise.allSettled(tries).then((results) => {{
  document.title = "done " + JSON.stringify(results.map((r) =>
    r.status === "fulfilled" ? (typeof r.value === "string" ? "read:" + r.value : "opaque")
                             : "failed"));
}});
</script>
</body></html>
"""


@pytest.fixture
def attacker() -> Iterator[tuple[str, list[str]]]:
    """A second local server, on another port, serving a page: its address, and a list
    whose first item is that page's text; the headers of every request it gets are
    added to the list."""
    page: list[str] = [""]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page.append(str(self.headers))
            data = page[0].encode()
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass  # quiet

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    worker = threading.Thread(target=server.serve_forever, daemon=True)
    worker.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", page
    finally:
        server.shutdown()
        server.server_close()
        worker.join(DEADLINE)


@pytest.mark.timeout(180)
def test_a_page_of_another_origin_cannot_drive_or_watch_a_run(
    attacker: tuple[str, list[str]],
) -> None:
    chromium()
    gate = threading.Event()
    app = LiveApp(sm.Agent(PacedModel([Wait(gate), Say("done")])), token=TOKEN)
    evil_url, page = attacker
    try:
        with live_server(app) as url, Browser(width=1000, height=700) as b:
            starter = StreamReader(url + "/", "POST", run_input("r1"))
            starter.wait_until("the run started", lambda r: "STATE_DELTA" in r.types())
            # The worst case: this browser opened the live page with its token.
            _open(b, f"{url}/?token={TOKEN}")
            _until(b, "document.body.dataset.ready === 'true'", "the live page")
            page[0] = ATTACK.format(live=url, start=json.dumps(run_input("evil")))
            _open(b, evil_url + "/attack.html")
            title = _until(
                b, "document.title.startsWith('done') && document.title", "the attack settle"
            )
            deadline = time.monotonic() + DEADLINE
            while app.refused["origin"] < 7:  # the form's request may come last
                assert time.monotonic() < deadline, dict(app.refused)
                time.sleep(0.05)
            state = app.runs["r1"].engine.state
            messages = len(app.runs["r1"].engine.messages)
            runs = list(app.runs)
            gate.set()
            events = starter.join()
    finally:
        gate.set()
    # Cookies are not kept apart by port: the token must not be one, or this server
    # would have been handed it with the page's request.
    seen = page[1:]
    assert seen
    assert not any(TOKEN in headers for headers in seen), seen
    results = json.loads(title.removeprefix("done "))
    assert not any(r.startswith("read:") for r in results), results  # nothing read back
    assert runs == ["r1"]  # nothing started
    assert state is sm.TurnState.AWAITING_MODEL  # nor aborted
    assert messages == 1  # nor steered
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["outcome"] == {"type": "success"}
    assert app.refused["token"] == 0  # refused for their origin, not for a missing token


@pytest.mark.timeout(180)
def test_a_person_approves_a_waiting_call_on_the_page_and_the_run_goes_on() -> None:
    chromium()

    @sm.tool
    async def lookup(city: str) -> str:
        """Look a city's weather up."""
        return f"{city}: 21 C"

    def ask(call: sm.ToolCall) -> sm.RequireApproval:
        return sm.RequireApproval("weather costs money")

    model = PacedModel(
        [Say("Let me look."), Call("c1", "lookup", {"city": "Paris"})],
        [Say("It is 21 C in Paris.")],
    )
    app = LiveApp(sm.Agent(model, tools=[lookup], before_tool_call=ask), token=TOKEN)
    with live_server(app) as url, Browser(width=1280, height=900) as b:
        StreamReader(url + "/", "POST", run_input("r1")).join()
        _open(b, f"{url}/?token={TOKEN}")
        _until(b, "!document.getElementById('waiting').hidden", "the approval asked")
        question = b.evaluate("document.getElementById('waiting').innerText")
        b.evaluate("document.querySelector('#waiting button.decide').click(); true")
        _until(b, "document.body.dataset.state === 'Done'", "the run done")
        _until(b, "document.body.dataset.finished === 'true'", "the run's end")
        transcript = b.evaluate("document.getElementById('messages').innerText")
    assert "weather costs money" in question
    assert 'lookup({"city":"Paris"})' in question
    assert "It is 21 C in Paris." in transcript
    result = app.runs["r1"].result
    assert result is not None
    assert result.state is sm.TurnState.DONE


@pytest.mark.timeout(180)
def test_a_person_answers_a_running_tools_question_on_the_page() -> None:
    chromium()
    from test_live import _ask_for_a_row

    seat = sm.Tool(sm.ToolDefinition("seat", "Ask for a row."), _ask_for_a_row)
    model = PacedModel([Call("c1", "seat", {})], [Say("Booked.")])
    app = LiveApp(sm.Agent(model, tools=[seat]), token=TOKEN)
    with live_server(app) as url, Browser(width=1280, height=900) as b:
        starter = StreamReader(url + "/", "POST", run_input("r1"))
        starter.wait_until("the question asked", lambda r: "CUSTOM" in r.types())
        _open(b, f"{url}/?token={TOKEN}")
        _until(b, "!!document.querySelector('#questions form input[name=row]')", "the question")
        shown = b.evaluate("document.getElementById('questions').innerText")
        b.evaluate(
            "document.querySelector('#questions input[name=row]').value = '4';"
            "document.querySelector('#questions button.answer').click(); true"
        )
        _until(b, "document.body.dataset.state === 'Done'", "the run done")
        _until(b, "document.getElementById('questions').hidden", "the question gone")
        transcript = b.evaluate("document.getElementById('messages').innerText")
        starter.join()
    assert "Which row?" in shown
    assert "row 4" in transcript
    result = app.runs["r1"].result
    assert result is not None
    assert result.final_text == "Booked."
