"""Prometheus plumbing every service shares: latency buckets and the /metrics HTTP endpoint.

Each service keeps its metrics in its own `CollectorRegistry` (never prometheus_client's global
one), so several services can live in one process (tests do) without clashing names.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

# Seconds. Token latencies sit between a few ms (GPU decode) and seconds (CPU, long queues).
TOKEN_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)
REQUEST_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


def check_metrics_port(port: int | None) -> None:
    """For config validation: None (off) or a port number (0: any free port)."""
    if port is not None and not 0 <= port < 65536:
        raise ValueError(f"--metrics-port must be a port number, got {port}")


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """Serve `registry` at http://host:port/metrics on a background thread; `.shutdown()` stops it."""
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server
