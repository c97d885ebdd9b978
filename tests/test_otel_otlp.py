"""Spans exported over OTLP/HTTP into a local receiver (a collector stand-in on
127.0.0.1), through the SDK's BatchSpanProcessor, with a collector that holds the
export: the run goes on meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from test_mcp_boundaries import Ticker
from test_otel import Script, _calls, double

import statemachine as sm
from statemachine.otel import SCHEMA_URL, AgentTracer


class Receiver:
    """An OTLP/HTTP trace receiver that holds each request until ``release`` is set."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.received = threading.Event()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append(request)
                receiver.received.set()
                receiver.release.wait(30)  # a slow collector
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for request in self.requests:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        found[span.name] = (scope.scope, scope.schema_url, span)
        return found


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    try:
        yield running
    finally:
        running.close()


@pytest.mark.timeout(60)
def test_spans_reach_an_otlp_receiver_and_a_slow_one_never_holds_the_run(
    receiver: Receiver,
) -> None:
    exporter = OTLPSpanExporter(endpoint=receiver.url, timeout=30)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=10))
    tracer = AgentTracer(provider, agent_name="exported")

    async def answer_once_exporting(*args: Any) -> sm.AssistantMessage:
        # The first model call's span is on its way to the collector, which holds it.
        assert await asyncio.to_thread(receiver.received.wait, 30)
        return sm.AssistantMessage("4")

    model = Script(_calls(("a", "double", {"n": 2})), answer_once_exporting)

    async def go() -> tuple[sm.RunResult, float, float]:
        with Ticker() as ticker:
            started = time.monotonic()
            result = await tracer.run_agent(
                model=model, tools=[double], messages=[sm.UserMessage("go")]
            )
            took = time.monotonic() - started
        return result, ticker.longest, took

    result, held, took = asyncio.run(go())
    assert result.state is sm.TurnState.DONE
    assert not receiver.release.is_set()  # the collector still held the export
    assert held < max(0.5, took / 2)  # and the loop ran all along
    receiver.release.set()
    assert provider.force_flush(30_000)
    provider.shutdown()
    spans = receiver.spans()
    assert sorted(spans) == ["chat scripted-1", "execute_tool double", "invoke_agent exported"]
    scope, schema_url, root = spans["invoke_agent exported"]
    assert (scope.name, scope.version, schema_url) == ("statemachine", sm.__version__, SCHEMA_URL)
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["gen_ai.operation.name"].string_value == "invoke_agent"
    assert attributes["gen_ai.provider.name"].string_value == "Script"
    assert attributes["gen_ai.usage.input_tokens"].int_value == 100
    _, _, tool = spans["execute_tool double"]
    assert tool.parent_span_id == root.span_id
