"""Trace context: a W3C traceparent is continued (or started) by the router, travels with the
intent, and is sent downstream on every attempt with a fresh span id.

Spans (route, queue wait, downstream call) go through opentelemetry-api. Nothing is recorded
unless an SDK is configured: ``OTEL_TRACES_EXPORTER=console`` (one JSON span per line on stdout)
or ``otlp`` (needs opentelemetry-exporter-otlp installed). Without a tracer provider, ``span``
yields None at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from workers.ids import hex_id

log = logging.getLogger("reach.tracing")

try:  # opentelemetry-api is a dependency, but a stripped install must still run
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
except ImportError:  # pragma: no cover
    otel_trace = None  # type: ignore[assignment]


def new_span_id() -> str:
    return hex_id(16)


def traceparent_for(trace_id: str, incoming: str | None) -> str:
    """The traceparent the fleet carries: the agent's own, or a new one on ``trace_id``."""
    return incoming or f"00-{trace_id}-{new_span_id()}-01"


def child_traceparent(traceparent: str) -> str:
    """Same trace, new span id: what one downstream attempt sends."""
    version, trace_id, _, flags = traceparent.split("-")
    return f"{version}-{trace_id}-{new_span_id()}-{flags}"


def configure_tracing(service: str) -> bool:
    """Install an SDK tracer provider when OTEL_TRACES_EXPORTER asks for one. True if installed."""
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if otel_trace is None or exporter_name in ("", "none"):
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        log.warning("OTEL_TRACES_EXPORTER=%s but opentelemetry-sdk is not installed: no spans", exporter_name)
        return False
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)}))
    if exporter_name == "console":
        exporter = ConsoleSpanExporter(formatter=lambda span: span.to_json(indent=None) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp: no spans")
            return False
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported (console, otlp): no spans", exporter_name)
        return False
    otel_trace.set_tracer_provider(provider)
    return True


def tracing_on() -> bool:
    """Whether spans are recorded at all: a caller may skip building one when not."""
    return otel_trace is not None and _sdk_installed()


def _sdk_installed() -> bool:
    """Whether a real tracer provider is set (by ``configure_tracing`` or by the deployment)."""
    return not isinstance(
        otel_trace.get_tracer_provider(), (otel_trace.ProxyTracerProvider, otel_trace.NoOpTracerProvider)
    )


@contextlib.contextmanager
def span(
    name: str, traceparent: str | None, *, start_time: float | None = None, attributes: dict[str, Any] | None = None
) -> Iterator[Any]:
    """A span whose parent is the intent's traceparent. ``start_time`` (epoch seconds) lets a
    span begin in the past, e.g. queue wait from the moment of dispatch."""
    if otel_trace is None or traceparent is None or not _sdk_installed():
        yield None  # no tracer provider: a no-op span and its context would still cost CPU per job
        return
    tracer = otel_trace.get_tracer("agent-reach")
    try:
        _, trace_id, span_id, flags = traceparent.split("-")
        parent = SpanContext(
            int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16))
        )
        context = otel_trace.set_span_in_context(NonRecordingSpan(parent))
    except (ValueError, TypeError):
        context = None
    start_ns = int(start_time * 1e9) if start_time is not None else None
    with tracer.start_as_current_span(
        name,
        context=context,
        start_time=start_ns,
        attributes={k: v for k, v in (attributes or {}).items() if v is not None},
    ) as current:
        yield current
