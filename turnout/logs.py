"""Logs, the same in every service: JSON lines (default) or plain text on stderr.

One rule picks the format everywhere: `--log-format` when given, else `TURNOUT_LOG_FORMAT`,
else `json`. A JSON line holds `timestamp`, `level`, `service`, `logger`, `message`, the
`request_id` of the request being served (`turnout.telemetry.request_context`), `trace_id` and
`span_id` while a span is current (tracing on), and every field passed with `extra=`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from opentelemetry import trace

from turnout.telemetry.request_context import current_request_id

LOG_FORMATS = ("json", "text")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Attributes every LogRecord has; anything else came in through `extra=` and is logged as a field.
_STANDARD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _request_fields(record: logging.LogRecord) -> dict[str, str]:
    fields: dict[str, str] = {}
    request_id = getattr(record, "request_id", None) or current_request_id()
    if request_id:
        fields["request_id"] = str(request_id)
    span = trace.get_current_span().get_span_context()
    if span.is_valid:
        fields["trace_id"] = format(span.trace_id, "032x")
        fields["span_id"] = format(span.span_id, "016x")
    return fields


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
            **_request_fields(record),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """`time level service logger: message [request_id=… key=value …]` for a person at a terminal."""

    def __init__(self, service: str) -> None:
        super().__init__("%(asctime)s %(levelname)s " + service + " %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _request_fields(record)
        fields.update({k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")})
        return line + "".join(f" {k}={v}" for k, v in fields.items() if k != "span_id")


def log_format(flag: str | None = None) -> str:
    """The format of this process: the flag, else TURNOUT_LOG_FORMAT, else json."""
    chosen = (flag or os.environ.get("TURNOUT_LOG_FORMAT") or "json").lower()
    if chosen not in LOG_FORMATS:
        raise SystemExit(f"log format must be one of {', '.join(LOG_FORMATS)}, got {chosen!r}")
    return chosen


def setup_logging(service: str, level: str | None = None, fmt: str | None = None) -> None:
    """Send all logs to stderr, tagged with the service name, in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if log_format(fmt) == "json" else TextFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("TURNOUT_LOG_LEVEL", "INFO")).upper())
    # Third-party chatter stays at warning unless asked for.
    for noisy in ("uvicorn.access", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
