"""One HTTP request is one trace with a span from each of the four services (in one process,
over real loopback gRPC, the trace context riding in the calls' metadata); with tracing off,
nothing is recorded and no interceptor is installed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from services.engine.config import EngineConfig
from services.engine.model_loader import LoadedModel, load_model
from tests.telemetry.in_process import in_process_stack
from turnout.grpc_server import client_channel
from turnout.telemetry import tracing
from turnout.telemetry.grpc_tracing import TracingChannel, TracingInterceptor, server_interceptors

BODY = {"prompt": "Hello there", "max_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir))


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every span kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield exporter
    tracing.use_provider(None)
    provider.shutdown()


def _by_service(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        assert span.instrumentation_scope is not None
        found.setdefault(span.instrumentation_scope.name.removeprefix("turnout."), []).append(span)
    return found


async def test_one_request_is_one_trace_across_all_four_services(
    tiny_model_dir: Path, loaded: LoadedModel, exporter: InMemorySpanExporter
) -> None:
    async with in_process_stack(tiny_model_dir, loaded) as stack:
        exporter.clear()  # startup (health checks, model info) is not part of the request
        reply = await stack.client.post("/v1/completions", json=BODY, headers={"X-Request-Id": "trace-me"})
        assert reply.status_code == 200, reply.text

    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans}) == 1, [(s.name, s.context.trace_id) for s in spans]
    services = _by_service(spans)
    assert set(services) == {"gateway", "router", "tokenizer", "engine"}

    (gateway,) = services["gateway"]
    assert gateway.kind is SpanKind.SERVER and gateway.parent is None
    assert gateway.name == "POST /v1/completions"
    assert gateway.attributes is not None
    assert gateway.attributes["http.response.status_code"] == 200
    # The X-Request-Id header is the request id every service sees (gateway/request_id.py).
    assert gateway.attributes["turnout.request_id"] == "trace-me"

    # The gateway asks the router for the default model's name, then generates.
    assert sorted(s.name for s in services["router"]) == [
        "turnout.v1.Inference/Generate",
        "turnout.v1.Inference/GetModelInfo",
    ]
    assert all(s.parent is not None and s.parent.span_id == gateway.context.span_id for s in services["router"])
    (router,) = [s for s in services["router"] if s.name.endswith("/Generate")]
    assert (
        router.attributes is not None
        and router.attributes["turnout.request_id"] == gateway.attributes["turnout.request_id"]
    )
    assert [e.name for e in router.events] == ["routed"]

    tokenizer_calls = sorted(s.name for s in services["tokenizer"])
    assert tokenizer_calls == ["turnout.v1.Tokenizer/Detokenize", "turnout.v1.Tokenizer/Encode"]
    assert all(s.parent is not None and s.parent.span_id == router.context.span_id for s in services["tokenizer"])

    (engine,) = services["engine"]
    assert engine.name == "turnout.v1.Engine/Generate"
    assert engine.parent is not None and engine.parent.span_id == router.context.span_id
    events = {e.name: e for e in engine.events}
    assert list(events) == ["queued", "scheduled", "first_token", "finished"]
    times = [e.timestamp for e in engine.events]
    assert times == sorted(times) and engine.start_time <= times[0] and times[-1] <= engine.end_time  # type: ignore[operator]
    assert events["finished"].attributes == {"finish_reason": "length", "completion_tokens": 4}
    assert engine.attributes is not None and engine.attributes["turnout.completion_tokens"] == 4


async def test_a_streamed_request_is_traced_too(
    tiny_model_dir: Path, loaded: LoadedModel, exporter: InMemorySpanExporter
) -> None:
    async with in_process_stack(tiny_model_dir, loaded) as stack:
        exporter.clear()
        async with stack.client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as reply:
            assert reply.status_code == 200
            body = await reply.aread()
        assert body.endswith(b"data: [DONE]\n\n")
    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans}) == 1
    assert set(_by_service(spans)) == {"gateway", "router", "tokenizer", "engine"}


async def test_tracing_off_records_nothing_and_installs_no_interceptor(
    tiny_model_dir: Path, loaded: LoadedModel
) -> None:
    assert not tracing.enabled()
    assert server_interceptors("engine") == []
    plain = client_channel("127.0.0.1:1")
    assert not isinstance(plain, TracingChannel)
    await plain.close()
    # A provider exists but was never turned on: nothing may reach it.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with in_process_stack(tiny_model_dir, loaded) as stack:
        reply = await stack.client.post("/v1/completions", json=BODY)
        assert reply.status_code == 200
    assert exporter.get_finished_spans() == ()

    tracing.use_provider(provider)
    try:
        traced = client_channel("127.0.0.1:1")
        assert isinstance(traced, TracingChannel)
        await traced.close()
        assert [type(i) for i in server_interceptors("engine")] == [TracingInterceptor]
    finally:
        tracing.use_provider(None)


async def test_a_refused_request_records_its_status_without_marking_a_fault(
    tiny_model_dir: Path, loaded: LoadedModel, exporter: InMemorySpanExporter
) -> None:
    async with in_process_stack(tiny_model_dir, loaded) as stack:
        exporter.clear()
        # More tokens than the engine's KV cache (128 blocks of 16) holds: the engine refuses it.
        reply = await stack.client.post("/v1/completions", json={**BODY, "max_tokens": 4000})
        assert reply.status_code == 400, reply.text
    services = _by_service(exporter.get_finished_spans())
    (engine,) = services["engine"]
    (router,) = [s for s in services["router"] if s.name.endswith("/Generate")]
    for span in (engine, router):
        assert span.attributes is not None and span.attributes["rpc.grpc.status_code"] == 3  # INVALID_ARGUMENT
        assert span.status.status_code is StatusCode.UNSET  # the caller's mistake, not a server fault
    (gateway,) = services["gateway"]
    assert gateway.attributes is not None and gateway.attributes["http.response.status_code"] == 400
