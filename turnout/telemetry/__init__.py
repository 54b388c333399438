"""Observability shared by every service: tracing setup and propagation over gRPC, the request id
of log lines, and Prometheus helpers. docs/observability.md lists what each service exports."""
