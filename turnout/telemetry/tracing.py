"""OpenTelemetry tracing: on only when the standard environment asks for an exporter.

The rule, the same in every service: tracing is on when `OTEL_TRACES_EXPORTER` names at least
one exporter (`console`, `otlp`; comma-separated); unset or `none` leaves it off. Off means no
tracer provider and no gRPC interceptors at all: request paths only meet OpenTelemetry's no-op
API (`trace.get_current_span()` returns the invalid span, whose methods do nothing).

Spans leave through a `BatchSpanProcessor`: exporting happens on its own thread and never
blocks a request or the engine's step loop. The other `OTEL_*` variables (OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_*, OTEL_BSP_*, OTEL_PROPAGATORS) work as the
OpenTelemetry SDK documents them.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

log = logging.getLogger(__name__)

# The provider of this process while tracing is on; None: off.
_provider: TracerProvider | None = None


def enabled() -> bool:
    return _provider is not None


def tracer(service: str) -> trace.Tracer | None:
    """The tracer of one service's spans (instrumentation scope `turnout.<service>`); None when off."""
    return None if _provider is None else _provider.get_tracer(f"turnout.{service}")


def use_provider(provider: TracerProvider | None) -> None:
    """Turn tracing on with `provider` (tests pass one with an in-memory exporter), or off with None."""
    global _provider
    _provider = provider


def setup_tracing(service: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Turn tracing on for this process if the environment asks for it; whether it is on."""
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    exporters = [e for e in (_exporter(n) for n in names if n != "none") if e is not None]
    if not exporters:
        if names and names != ["none"]:
            log.warning("tracing stays off: no usable exporter in OTEL_TRACES_EXPORTER", extra={"exporters": names})
        return False
    name = environ.get("OTEL_SERVICE_NAME") or f"turnout-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name, "turnout.service": service}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    # Also the global provider, so libraries using the API join the same traces.
    trace.set_tracer_provider(provider)
    use_provider(provider)
    log.info("tracing on", extra={"exporters": names, "service_name": name})
    return True


def shutdown_tracing() -> None:
    """Export what is still queued (the SDK also does this at exit)."""
    if _provider is not None:
        _provider.shutdown()


def _one_line(span: ReadableSpan) -> str:
    # indent=None: the SDK's JSON on a single line, so a log reader can take a span per line.
    return span.to_json(indent=None) + "\n"


def _exporter(name: str) -> SpanExporter | None:
    if name == "console":
        # One JSON object per line on stdout (logs go to stderr).
        return ConsoleSpanExporter(out=sys.stdout, formatter=_one_line)
    if name == "otlp":
        return _otlp_exporter()
    log.warning("unknown OTEL_TRACES_EXPORTER entry ignored (known: console, otlp, none)", extra={"exporter": name})
    return None


def _otlp_exporter() -> SpanExporter | None:
    # The OTLP exporter is an optional package: imported only when asked for.
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    try:
        if protocol.startswith("http"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

            return HttpExporter()  # type: ignore[no-any-return]
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()  # type: ignore[no-any-return]
    except ImportError:
        log.warning(
            "OTEL_TRACES_EXPORTER=otlp but the OTLP exporter is not installed "
            "(pip install opentelemetry-exporter-otlp); OTLP export skipped",
            extra={"protocol": protocol},
        )
        return None
