"""The one rule that turns tracing on, and what happens with exporters that cannot work."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from turnout.telemetry import tracing


@pytest.fixture(autouse=True)
def _tracing_off_afterwards() -> Iterator[None]:
    yield
    tracing.shutdown_tracing()  # nothing may reach the console exporter after capture ended
    tracing.use_provider(None)


@pytest.mark.parametrize("value", [None, "", "none", " none "])
def test_off_unless_an_exporter_is_named(value: str | None) -> None:
    environ = {} if value is None else {"OTEL_TRACES_EXPORTER": value}
    assert tracing.setup_tracing("engine", environ) is False
    assert not tracing.enabled() and tracing.tracer("engine") is None


def test_console_turns_it_on_with_the_service_name() -> None:
    assert tracing.setup_tracing("router", {"OTEL_TRACES_EXPORTER": "console"}) is True
    tracer = tracing.tracer("router")
    assert tracer is not None
    with tracer.start_as_current_span("x") as span:
        resource = span.resource  # type: ignore[attr-defined]
    assert resource.attributes["service.name"] == "turnout-router"
    assert resource.attributes["turnout.service"] == "router"


def test_otlp_without_its_package_says_so_and_stays_off(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("opentelemetry.sdk")
    try:
        import opentelemetry.exporter.otlp  # noqa: F401

        pytest.skip("the OTLP exporter is installed here")
    except ImportError:
        pass
    with caplog.at_level(logging.WARNING):
        assert tracing.setup_tracing("engine", {"OTEL_TRACES_EXPORTER": "otlp"}) is False
    assert "pip install opentelemetry-exporter-otlp" in caplog.text
    assert "tracing stays off" in caplog.text


def test_an_unknown_exporter_is_named_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert tracing.setup_tracing("engine", {"OTEL_TRACES_EXPORTER": "zipkin-ish"}) is False
    assert "unknown OTEL_TRACES_EXPORTER entry ignored" in caplog.text
    assert any(getattr(r, "exporter", None) == "zipkin-ish" for r in caplog.records)


def test_a_bad_metrics_port_is_a_clear_error(tmp_path: object) -> None:
    from turnout.telemetry.metrics_http import check_metrics_port

    check_metrics_port(None)
    check_metrics_port(9100)
    with pytest.raises(ValueError, match="--metrics-port must be a port number, got 70000"):
        check_metrics_port(70000)
