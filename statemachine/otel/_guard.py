"""Calls into OpenTelemetry that can never raise into a run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import Histogram
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from statemachine._log import library_logger

Attributes = dict[str, Any]


class Guard:
    """Calls into OpenTelemetry that can never raise into a run.

    Processors, samplers, views and exporters run inside these calls; whatever they
    raise is logged (a warning the first time per kind, then debug) and dropped.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._log = library_logger("statemachine.otel")

    def failed(self, where: str, exc: Exception) -> None:
        key = (where, type(exc).__name__)
        level = "debug" if key in self._seen else "warning"
        self._seen.add(key)
        try:
            getattr(self._log, level)(
                "telemetry_call_failed", where=where, error=type(exc).__name__, run_unchanged=True
            )
        except Exception:  # noqa: BLE001 - a broken logger must not break a run either
            pass

    def safely(self, where: str, work: Callable[..., None], *args: Any) -> None:
        """``work(*args)``, any exception it raises logged and dropped: a call into the
        SDK, or the tracer's own work around one (attributes, content, metrics), which
        must not change a run either."""
        try:
            work(*args)
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed(where, exc)

    def start(
        self,
        tracer: Tracer,
        name: str,
        kind: SpanKind,
        attributes: Attributes,
        parent: Span | None = None,
        start_time: int | None = None,
    ) -> Span | None:
        try:
            context = trace.set_span_in_context(parent) if parent is not None else None
            return tracer.start_span(
                name,
                context=context,
                kind=kind,
                attributes=attributes,
                start_time=start_time,
                record_exception=False,
                set_status_on_exception=False,
            )
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed(f"start {name.split(' ', 1)[0]}", exc)
            return None

    def set(self, span: Span | None, attributes: Attributes) -> None:
        if span is not None:
            self.safely("set_attributes", span.set_attributes, attributes)

    def error(self, span: Span | None, error_type: str) -> None:
        if span is None:
            return
        try:
            span.set_attribute("error.type", error_type)
            span.set_status(Status(StatusCode.ERROR, error_type))
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed("set_status", exc)

    def end(self, span: Span | None, end_time: int | None = None) -> None:
        if span is not None:
            self.safely("end span", span.end, end_time)

    def attach(self, span: Span | None) -> object:
        if span is None:
            return None
        try:
            return otel_context.attach(trace.set_span_in_context(span))
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            self.failed("attach context", exc)
            return None

    def detach(self, token: object) -> None:
        if token is not None:
            self.safely("detach context", otel_context.detach, token)

    def record(self, histogram: Histogram | None, value: float, attributes: Attributes) -> None:
        if histogram is not None:
            self.safely("record metric", histogram.record, value, attributes)
