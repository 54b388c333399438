"""The real stack (`turnout serve`, four processes) with console span export and JSON logs: one
request's trace id is the same in every process's spans and log lines, so the trace context
crossed each process boundary in gRPC metadata; `--metrics` serves each service's /metrics."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.stack import start_stack

# The body's request_id is the id every service sees (response ids add the cmpl- prefix).
REQUEST_ID = "e2e-trace"


def _json_lines(text: str) -> list[dict[str, Any]]:
    entries = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):  # a line that merely starts with "{"
                entries.append(json.loads(line))
    return entries


def _engine_spans(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engine's spans of the request, among the log's JSON lines."""
    spans = [e for e in entries if "context" in e and "resource" in e]
    return [s for s in spans if s["attributes"].get("turnout.request_id") == REQUEST_ID and "Engine" in s["name"]]


@pytest.mark.timeout(300)
def test_trace_context_crosses_every_process(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("TURNOUT_LOG_FORMAT", "json")
    log_path = tmp_path / "stack.log"
    # Debug level: the engine's line per request (`generate`) is a debug line; the router's (`generated`)
    # is written when asked for.
    stack = start_stack(tiny_model_dir, log_path, "--metrics", "--log-level", "debug", "--enable-log-requests")
    try:
        body = {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True, "request_id": "e2e-trace"}
        reply = httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        urls = dict(re.findall(r"  (\w+) metrics: (http://\S+/metrics)", log_path.read_text()))
        # The launcher serves its own (restart counts) beside the three gRPC services'.
        assert set(urls) == {"engine", "tokenizer", "router", "launcher"}
        engine_metrics = httpx.get(urls["engine"], timeout=5).text
        assert 'turnout_engine_requests_total{finish_reason="length"} 1.0' in engine_metrics
        assert "turnout_router_requests_total" in httpx.get(urls["router"], timeout=5).text
        assert "turnout_tokenizer_requests_total" in httpx.get(urls["tokenizer"], timeout=5).text
        assert "turnout_launcher_child_restarts_total" in httpx.get(urls["launcher"], timeout=5).text
        # Spans are exported every 100 ms by a background thread, which a busy core may not run for
        # seconds: wait for the engine's before stopping the stack (a child slow to stop is killed).
        deadline = time.monotonic() + 60
        while not _engine_spans(_json_lines(log_path.read_text())) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stack.stop()  # every service exports its queued spans as it exits

    entries = _json_lines(log_path.read_text())
    spans = [e for e in entries if "context" in e and "resource" in e]
    (engine_span,) = _engine_spans(entries)
    trace_id = engine_span["context"]["trace_id"]
    in_trace = [s for s in spans if s["context"]["trace_id"] == trace_id]
    services = {s["resource"]["attributes"]["service.name"] for s in in_trace}
    assert services == {"turnout-gateway", "turnout-router", "turnout-tokenizer", "turnout-engine"}
    # One span for the HTTP request: FastAPI's own tracing (which would add another) stays off.
    gateway = [s for s in in_trace if s["resource"]["attributes"]["service.name"] == "turnout-gateway"]
    assert [s["name"] for s in gateway] == ["POST /v1/completions"]

    # Log lines of the request, from the router and the engine processes, carry its id and trace.
    lines = [e for e in entries if e.get("request_id") == REQUEST_ID and "message" in e]
    assert {e["service"] for e in lines} >= {"router", "engine"}
    assert {e["trace_id"] for e in lines} == {trace_id.removeprefix("0x")}
