"""The live server (statemachine.live): runs started and watched over HTTP as AG-UI
events, checked against the protocol by ag-ui-validate, on a real uvicorn server."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest

pytest.importorskip("ag_ui", reason="the [live] extra is not installed")
pytest.importorskip("ag_ui_validate", reason="ag-ui-validate (the [dev] extra) is not installed")

import httpx2
from ag_ui_validate.pytest_plugin import validate_agui
from live_support import (
    DEADLINE,
    TOKEN,
    Call,
    PacedModel,
    Say,
    StreamReader,
    Wait,
    auth,
    findings,
    live_server,
    read_stream,
    run_input,
    sse_events,
    validate_live,
)

import statemachine as sm
import statemachine.hooks
import statemachine.steps
import statemachine.testing
from statemachine.agent.model import CallOptions
from statemachine.core.messages import AssistantMessage, StopReason, ToolCall
from statemachine.live import AguiStream, LiveApp, running


@sm.tool
async def lookup(city: str) -> str:
    """Look a city's weather up."""
    return f"{city}: 21 C"


def weather_model(*gates: threading.Event) -> PacedModel:
    """Two turns: text and a call of ``lookup``, then the answer; waits on ``gates``
    (the first before it says anything, the second after its first words)."""
    first: list[Any] = [Wait(g) for g in gates[:1]]
    first += [Say("Let me "), *[Wait(g) for g in gates[1:2]], Say("look.")]
    first.append(Call("c1", "lookup", {"city": "Paris"}))
    return PacedModel(first, [Say("It is 21 C in Paris.")])


def _app(model: Any, **options: Any) -> LiveApp:
    return LiveApp(sm.Agent(model, tools=[lookup]), token=TOKEN, **options)


# -- the protocol -----------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_posted_run_agent_input_runs_the_agent_and_streams_a_valid_agui_run() -> None:
    app = _app(weather_model())
    with live_server(app) as url:
        report = validate_live(url + "/", run_input("r1"))
    assert findings(report) == []
    assert report.summary.errors == 0
    assert app.runs["r1"].result is not None
    assert app.runs["r1"].result.state is sm.TurnState.DONE


@pytest.mark.timeout(120)
def test_the_stream_says_each_step_of_the_run_in_agui_terms() -> None:
    with live_server(_app(weather_model())) as url:
        status, events = read_stream(url + "/", "POST", run_input("r1"))
    assert status == 200
    types = [e["type"] for e in events]
    assert types[0] == "RUN_STARTED"
    assert types[-1] == "RUN_FINISHED"
    assert events[-1]["outcome"] == {"type": "success"}
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Let me look.It is 21 C in Paris."
    args = [e for e in events if e["type"] == "TOOL_CALL_ARGS"]
    assert [(a["toolCallId"], a["delta"]) for a in args] == [("c1", '{"city":"Paris"}')]
    (result,) = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert (result["toolCallId"], result["content"]) == ("c1", "Paris: 21 C")
    states = [
        op["value"]
        for e in events
        if e["type"] == "STATE_DELTA"
        for op in e["delta"]
        if op["path"] == "/state"
    ]
    assert states[0] == "AwaitingModel"
    assert states[-1] == "Done"
    assert "CollectingResults" in states
    started = [e["value"]["callId"] for e in events if e.get("name") == "statemachine.toolStarted"]
    assert started == ["c1"]
    assert validate_agui(events).summary.errors == 0


@pytest.mark.timeout(60)
def test_the_validator_catches_a_stream_that_breaks_the_protocol() -> None:
    # What the checks above rely on: a call never closed, a result for no call.
    with live_server(_app(weather_model())) as url:
        _, events = read_stream(url + "/", "POST", run_input("r1"))
    unclosed = [e for e in events if e["type"] != "TOOL_CALL_END"]
    rules = {d.rule for d in validate_agui(unclosed).diagnostics if d.severity == "error"}
    assert "AGUI203" in rules
    result = {"type": "TOOL_CALL_RESULT", "messageId": "x", "toolCallId": "nobody", "content": "?"}
    orphan = [*events[:-1], result, events[-1]]
    rules = {d.rule for d in validate_agui(orphan).diagnostics if d.severity == "error"}
    assert "AGUI207" in rules


@pytest.mark.timeout(120)
def test_a_watcher_that_joins_mid_run_gets_the_history_and_state_then_the_rest() -> None:
    asked, said = threading.Event(), threading.Event()
    app = _app(weather_model(asked, said))
    with live_server(app) as url:
        starter = StreamReader(url + "/", "POST", run_input("r1"))
        starter.wait_until("the run started", lambda r: "STATE_DELTA" in r.types())
        asked.set()
        starter.wait_until("the first words", lambda r: "TEXT_MESSAGE_CONTENT" in r.types())
        watcher = StreamReader(url + "/runs/r1/events")
        watcher.wait_until("the opening", lambda r: "STATE_SNAPSHOT" in r.types())
        said.set()
        events = watcher.join()
        starter.join()
    types = [e["type"] for e in events]
    assert types[:3] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT"]
    assert events[2]["snapshot"]["state"] == "AwaitingModel"
    assert types[-1] == "RUN_FINISHED"
    assert validate_agui(events).summary.errors == 0, findings(validate_agui(events))


@pytest.mark.timeout(120)
def test_a_watcher_of_a_run_that_returned_gets_its_history_and_its_end() -> None:
    with live_server(_app(weather_model())) as url:
        read_stream(url + "/", "POST", run_input("r1"))
        status, events = read_stream(url + "/runs/r1/events")
    assert status == 200
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        "MESSAGES_SNAPSHOT",
        "STATE_SNAPSHOT",
        "RUN_FINISHED",
    ]
    assert len(events[1]["messages"]) == 4
    assert validate_agui(events).summary.errors == 0


class _Failing:
    async def complete(self, messages: object, tools: object, signal: object) -> AssistantMessage:
        raise RuntimeError("the provider is down")


@pytest.mark.timeout(120)
def test_a_run_that_fails_ends_with_run_error_and_one_aborted_is_cancelled() -> None:
    asked = threading.Event()
    app = LiveApp(sm.Agent(_Failing()), token=TOKEN)
    with live_server(app) as url:
        _, failed = read_stream(url + "/", "POST", run_input("r1"))
    assert failed[-1]["type"] == "RUN_ERROR"
    assert failed[-1]["code"] == "Failed"
    assert validate_agui(failed).summary.errors == 0

    app = _app(weather_model(asked))
    with live_server(app) as url:
        starter = StreamReader(url + "/", "POST", run_input("r2"))
        starter.wait_until("the run started", lambda r: "STATE_DELTA" in r.types())
        with httpx2.Client(timeout=DEADLINE) as client:
            answer = client.post(url + "/runs/r2/abort", json={}, headers=auth())
        assert answer.status_code == 202
        events = starter.join()
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["outcome"] == {"type": "cancelled"}
    assert validate_agui(events).summary.errors == 0


@pytest.mark.timeout(120)
def test_a_run_a_guardrail_ends_in_its_own_state_ends_with_run_error_naming_it() -> None:
    # A state a team's step declared is an end like the library's own: RUN_ERROR, the
    # state's name as its code, the step's explanation as its message.
    blocked = sm.steps.output_guardrail(
        "no_secrets", lambda text: "it names a secret", state="SecretBlocked", retries=0
    )
    app = LiveApp(
        sm.Agent(sm.testing.FunctionModel(lambda m, t: "the code is 1234"), steps=[blocked]),
        token=TOKEN,
    )
    with live_server(app) as url:
        _, events = read_stream(url + "/", "POST", run_input("r1"))
    assert events[-1]["type"] == "RUN_ERROR"
    assert events[-1]["code"] == "SecretBlocked"
    assert validate_agui(events).summary.errors == 0


@pytest.mark.timeout(120)
def test_steering_a_run_adds_the_message_at_its_next_turn() -> None:
    asked = threading.Event()
    app = _app(weather_model(asked))
    with live_server(app) as url:
        starter = StreamReader(url + "/", "POST", run_input("r1"))
        starter.wait_until("the run started", lambda r: "STATE_DELTA" in r.types())
        with httpx2.Client(timeout=DEADLINE) as client:
            answer = client.post(
                url + "/runs/r1/steer", json={"message": "in Celsius"}, headers=auth()
            )
            assert answer.status_code == 202
            asked.set()
            events = starter.join()
            late = client.post(url + "/runs/r1/steer", json={"message": "late"}, headers=auth())
    assert late.status_code == 409  # the run has returned
    users = [e for e in events if e["type"] == "TEXT_MESSAGE_START" and e["role"] == "user"]
    assert len(users) == 1
    assert validate_agui(events).summary.errors == 0


# -- a watcher never holds a run --------------------------------------------------------------


class _Chatty:
    """Streams many fragments at once, never yielding between them."""

    def __init__(self, fragments: int, size: int) -> None:
        self.fragments, self.size = fragments, size

    async def complete(
        self, messages: object, tools: object, signal: object, *, options: CallOptions | None = None
    ) -> AssistantMessage:
        assert options is not None
        assert options.on_text is not None
        piece = "x" * (self.size - 1) + " "
        for _ in range(self.fragments):
            options.on_text(piece)
        return AssistantMessage(piece * self.fragments)


@pytest.mark.timeout(120)
def test_a_lagging_watcher_gets_events_dropped_and_a_valid_repaired_stream() -> None:
    app = LiveApp(sm.Agent(_Chatty(400, 10)), token=TOKEN, max_buffered=20)
    with live_server(app) as url:
        status, events = read_stream(url + "/", "POST", run_input("r1"))
        run = app.runs["r1"]
    assert status == 200
    assert run.result is not None
    assert run.result.state is sm.TurnState.DONE
    dropped = [e["value"]["count"] for e in events if e.get("name") == "statemachine.eventsDropped"]
    assert dropped
    assert sum(dropped) > 300
    # The text streamed was cut; the snapshot after it holds the whole message.
    snapshots = [e for e in events if e["type"] == "MESSAGES_SNAPSHOT"]
    assert snapshots[-1]["messages"][-1]["content"] == run.result.final_text
    assert validate_agui(events).summary.errors == 0, findings(validate_agui(events))


@pytest.mark.timeout(120)
def test_a_slow_watcher_that_never_reads_does_not_hold_the_run() -> None:
    # Connected before the run starts, it reads nothing: the run still returns.
    gate = threading.Event()
    app = LiveApp(
        sm.Agent(PacedModel([Wait(gate), *[Say("y" * 999 + " ")] * 3000])),
        token=TOKEN,
        max_buffered=50,
    )
    with live_server(app) as url:
        host, port = url.removeprefix("http://").split(":")
        starter = StreamReader(url + "/", "POST", run_input("r1"))
        starter.wait_until("the run started", lambda r: "STATE_DELTA" in r.types())
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.settimeout(DEADLINE)
        slow.connect((host, int(port)))
        try:
            slow.sendall(
                f"GET /runs/r1/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n".encode()
            )
            while app.watchers < 2:
                assert starter.status in (0, 200)
                threading.Event().wait(0.02)
            gate.set()
            starter.join()  # the run returned while the slow watcher read nothing
            assert app.runs["r1"].result is not None
            received = bytearray()
            while chunk := slow.recv(65536):
                received += chunk
        finally:
            slow.close()
    assert b"statemachine.eventsDropped" in received
    # Everything it missed was progress: its stream still ends with the run's end.
    assert received.rsplit(b"data: ", 1)[1].startswith(b'{"type":"RUN_FINISHED"')


# -- the converter alone ----------------------------------------------------------------------


def test_a_call_the_engine_renamed_is_closed_and_the_history_resent() -> None:
    # A streamed call whose id the final message does not hold (normalised, or cut by
    # an abort): closed without arguments, then a snapshot of what holds.
    stream = AguiStream("t", "r")
    history: list[sm.Message] = [sm.UserMessage("go")]
    out = stream.opening(history, sm.TurnState.AWAITING_MODEL, 0)
    out += stream.convert(sm.ToolCallDelta(1, 0, "dup", "lookup", "{"), history)
    final = AssistantMessage([ToolCall("r-1", "lookup", {})], stop_reason=StopReason.TOOL_USE)
    history = [*history, final]
    out += stream.convert(sm.MessageAdded(1, final), history)
    types = [e.type.value for e in out]
    assert types[-1] == "MESSAGES_SNAPSHOT"
    assert types.count("TOOL_CALL_END") == 2
    events = [e.model_dump(by_alias=True, mode="json") for e in out]
    events.append({"type": "RUN_FINISHED", "threadId": "t", "runId": "r"})
    assert validate_agui(events).summary.errors == 0


# -- running and serving ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_running_serves_the_app_in_this_event_loop_and_stops_it() -> None:
    async def main() -> int:
        app = _app(weather_model())
        async with running(app) as url, httpx2.AsyncClient(timeout=DEADLINE) as client:
            answer = await client.get(url + "/runs", headers=auth())
        with pytest.raises(httpx2.ConnectError):
            async with httpx2.AsyncClient(timeout=DEADLINE) as client:
                await client.get(url + "/runs", headers=auth())
        return answer.status_code

    assert asyncio.run(main()) == 200


@pytest.mark.timeout(60)
def test_stopping_the_server_aborts_the_runs_still_running_and_ends_their_streams() -> None:
    gate = threading.Event()
    app = LiveApp(sm.Agent(PacedModel([Wait(gate), Say("never said")])), token=TOKEN)
    try:
        with live_server(app) as url:
            starter = StreamReader(url + "/", "POST", run_input("r1"))
            starter.wait_until("the run started", lambda r: "STATE_DELTA" in r.types())
        events = starter.join()
    finally:
        gate.set()
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["outcome"] == {"type": "cancelled"}
    result = app.runs["r1"].result
    assert result is not None
    assert result.state is sm.TurnState.ABORTED


def test_every_name_statemachine_live_exports_resolves() -> None:
    import statemachine.live as live

    for name in live.__all__:
        assert hasattr(live, name), name
    assert live.DEFAULT_HOST == "127.0.0.1"


# -- approvals ----------------------------------------------------------------------------------


def _asking_app() -> LiveApp:
    def ask(call: ToolCall) -> sm.RequireApproval:
        return sm.RequireApproval("weather costs money")

    agent = sm.Agent(weather_model(), tools=[lookup], before_tool_call=ask)
    return LiveApp(agent, token=TOKEN)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["approve route", "AG-UI resume"])
def test_a_run_that_waits_for_approval_ends_with_an_interrupt_and_goes_on_when_answered(
    how: str,
) -> None:
    app = _asking_app()
    with live_server(app) as url:
        _, first = read_stream(url + "/", "POST", run_input("r1"))
        _, late = read_stream(url + "/runs/r1/events")  # a watcher that came after
        if how == "approve route":
            status, then = read_stream(
                url + "/runs/r1/approve", "POST", {"approvals": {"c1": True}}
            )
        else:
            answer = {**run_input("r1-resumed"), "messages": []}
            answer["resume"] = [{"interruptId": "c1", "status": "resolved"}]
            status, then = read_stream(url + "/", "POST", answer)
    outcome = first[-1]["outcome"]
    assert late[-1]["outcome"] == outcome
    assert outcome["type"] == "interrupt"
    (interrupt,) = outcome["interrupts"]
    assert (interrupt["id"], interrupt["toolCallId"], interrupt["reason"]) == (
        "c1",
        "c1",
        "tool_approval",
    )
    assert "weather costs money" in interrupt["message"]
    assert status == 200
    assert then[0]["type"] == "RUN_STARTED"
    assert then[-1]["outcome"] == {"type": "success"}
    results = [e["content"] for e in then if e["type"] == "TOOL_CALL_RESULT"]
    assert results == ["Paris: 21 C"]
    for events in (first, then):
        assert validate_agui(events).summary.errors == 0, findings(validate_agui(events))
    result = app.runs["r1"].result
    assert result is not None
    assert result.state is sm.TurnState.DONE


@pytest.mark.timeout(120)
def test_an_approval_for_a_run_that_does_not_wait_is_refused() -> None:
    app = _asking_app()
    with live_server(app) as url, httpx2.Client(timeout=DEADLINE) as client:
        read_stream(url + "/", "POST", run_input("r1"))
        wrong = client.post(url + "/runs/r1/approve", json={"approvals": {"c9": 1}}, headers=auth())
        answer = {
            **run_input("x"),
            "messages": [],
            "resume": [{"interruptId": "c9", "status": "resolved"}],
        }
        unknown = client.post(url + "/", json=answer, headers=auth())
        read_stream(url + "/runs/r1/approve", "POST", {"approvals": {"c1": False}})
        again = client.post(
            url + "/runs/r1/approve", json={"approvals": {"c1": True}}, headers=auth()
        )
    assert wrong.status_code == 422
    assert unknown.status_code == 409
    assert again.status_code == 409  # denied once, the run went on: nothing waits now


@pytest.mark.timeout(60)
def test_a_silent_stream_gets_keep_alive_comments_that_clients_skip() -> None:
    gate = threading.Event()
    app = LiveApp(
        sm.Agent(PacedModel([Wait(gate), Say("late")])), token=TOKEN, keepalive_seconds=0.05
    )
    try:
        with live_server(app) as url, httpx2.Client(timeout=DEADLINE) as client:
            with client.stream("POST", url + "/", json=run_input("r1"), headers=auth()) as answer:
                text = ""
                for chunk in answer.iter_text():
                    text += chunk
                    if text.count(": keep-alive") >= 2:
                        gate.set()
            events = [e["type"] for e in sse_events(text)]
    finally:
        gate.set()
    assert events[-1] == "RUN_FINISHED"
    assert validate_agui(sse_events(text)).summary.errors == 0


def test_without_graphviz_the_page_lists_the_states_to_light(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import statemachine._render as render
    from statemachine.errors import DiagramError
    from statemachine.live._page import page_html

    def no_graphviz(*args: object, **kwargs: object) -> str:
        raise DiagramError("svg needs pygraphviz (the [diagrams] extra)")

    monkeypatch.setattr(render, "render", no_graphviz)
    page = page_html()
    assert '<ul id="states">' in page
    for state in ("Ready", "AwaitingModel", "CollectingResults", "AwaitingUser", "Done"):
        assert f'data-state="{state}"' in page, state
    assert "<svg" not in page


async def _ask_for_a_row(arguments: dict[str, Any], signal: sm.AbortSignal) -> str:
    """A tool that asks a person through its run, as an MCP server's elicitation does."""
    from statemachine.agent.running import ask_person

    def question(question_id: str, call: ToolCall) -> sm.hooks.ToolQuestion:
        schema = {"type": "object", "properties": {"row": {"type": "integer"}}}
        return sm.hooks.ToolQuestion(question_id, call.id, call.name, "Which row?", schema)

    answer = await ask_person(question, signal)
    return f"row {answer['row']}" if isinstance(answer, dict) else str(answer)


@pytest.mark.timeout(120)
def test_a_question_a_running_tool_asks_is_shown_and_answered_over_http() -> None:
    seat = sm.Tool(sm.ToolDefinition("seat", "Ask for a row."), _ask_for_a_row)
    model = PacedModel([Call("c1", "seat", {})], [Say("Booked.")])
    app = LiveApp(sm.Agent(model, tools=[seat]), token=TOKEN)
    streamed: list[tuple[int, list[dict[str, Any]]]] = []
    with live_server(app) as url, httpx2.Client(timeout=DEADLINE) as client:
        reader = threading.Thread(
            target=lambda: streamed.append(read_stream(url + "/", "POST", run_input("r1")))
        )
        reader.start()
        waited = 0.0
        while not ("r1" in app.runs and app.runs["r1"].pending_questions()) and waited < DEADLINE:
            threading.Event().wait(0.02)
            waited += 0.02
        answer = url + "/runs/r1/answer"
        wrong = client.post(answer, json={"question": "q1", "answer": {"row": "x"}}, headers=auth())
        right = client.post(answer, json={"question": "q1", "answer": {"row": 2}}, headers=auth())
        again = client.post(answer, json={"question": "q1", "answer": "cancel"}, headers=auth())
        reader.join(DEADLINE)
    assert (wrong.status_code, right.status_code, again.status_code) == (422, 202, 409)
    assert "answer.row: 'x' is not of type 'integer'" in wrong.json()["error"]
    ((status, events),) = streamed
    custom = {e["name"]: e["value"] for e in events if e["type"] == "CUSTOM"}
    asked = custom["statemachine.toolAsked"]
    assert (asked["id"], asked["callId"], asked["message"]) == ("q1", "c1", "Which row?")
    assert custom["statemachine.toolAnswered"]["outcome"] == "accept"
    results = [e["content"] for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert (status, results, events[-1]["outcome"]) == (200, ["row 2"], {"type": "success"})
    assert validate_agui(events).summary.errors == 0, findings(validate_agui(events))
