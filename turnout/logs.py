"""Logs, the same in every service: text for a person at a terminal, JSON lines otherwise, on stderr.

One rule picks the format everywhere: `--log-format` when given, else `TURNOUT_LOG_FORMAT`,
else `text` when stderr is a terminal and `json` when it is not (a file, a pipe, a container's
log collector). A JSON line holds `timestamp`, `level`, `service`, `logger`, `message`, the
`request_id` of the request being served (`turnout.telemetry.request_context`), `trace_id` and
`span_id` while a span is current (tracing on), and every field passed with `extra=`. Text is
coloured by level on a terminal (not with NO_COLOR set).

Lines are formatted and written by one thread of their own (`BackgroundHandler`): a write into a
pipe whose reader lags (the launcher copying a child's stderr on a busy machine) blocks the
writer, and the writer must not be a service's event loop. The caller only takes what exists in
its own thread (the message, the request id, the span) and queues the record.

"A terminal" is `TURNOUT_TTY` (1 or 0) when set, else whether stderr is one: the children of
`turnout serve` write into a pipe the launcher copies to its own stderr, and it tells them what
that is. Progress bars (`progress_bar`) follow the same rule.
"""

from __future__ import annotations

import copy
import json
import logging
import logging.handlers
import os
import queue
import sys
import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from turnout.telemetry.request_context import current_request_id

if TYPE_CHECKING:
    from tqdm import tqdm

LOG_FORMATS = ("json", "text")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TTY_ENV = "TURNOUT_TTY"

# Attributes every LogRecord has; anything else came in through `extra=` and is logged as a field.
# `color_message` is uvicorn's copy of the message with ANSI colours in it: noise in both formats.
_STANDARD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "color_message"}
# ANSI colours of the level names in coloured text.
_LEVEL_COLOURS = {
    "DEBUG": "\x1b[2m",
    "INFO": "\x1b[32m",
    "WARNING": "\x1b[33m",
    "ERROR": "\x1b[31m",
    "CRITICAL": "\x1b[1;31m",
}
_DIM, _RESET = "\x1b[2m", "\x1b[0m"
# Records queued for the writing thread at most; a logger that outruns a blocked stderr waits (as a
# blocking write would), so memory stays bounded and no line is dropped.
QUEUED_RECORDS = 10_000


def stderr_is_terminal() -> bool:
    """Whether this process's logs reach a person at a terminal (TURNOUT_TTY, else stderr's own answer)."""
    told = os.environ.get(TTY_ENV)
    if told is not None:
        return told == "1"
    return sys.stderr.isatty()


def _request_fields(record: logging.LogRecord) -> dict[str, str]:
    """The request id and trace ids of the record: taken where it was logged (context variables
    of the logging task), or by `BackgroundHandler.prepare` there before it was queued."""
    taken = getattr(record, "_request_fields", None)
    if taken is not None:
        return dict(taken)
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
    """`time level service logger: message [request_id=… key=value …]` for a person at a terminal;
    with `colour`, the level in its colour and the fields dimmed."""

    def __init__(self, service: str, colour: bool = False) -> None:
        super().__init__(datefmt="%H:%M:%S")
        self.service = service
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        level = record.levelname
        if self.colour:
            level = f"{_LEVEL_COLOURS.get(record.levelname, '')}{level}{_RESET}"
        line = f"{self.formatTime(record, self.datefmt)} {level} {self.service} {record.name}: {record.getMessage()}"
        fields = _request_fields(record)
        fields.update({k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")})
        tail = "".join(f" {k}={v}" for k, v in fields.items() if k != "span_id")
        if tail and self.colour:
            tail = f"{_DIM}{tail}{_RESET}"
        if record.exc_info:
            tail += "\n" + self.formatException(record.exc_info)
        return line + tail


class BackgroundHandler(logging.handlers.QueueHandler):
    """Queues each record for a thread that formats it and hands it to `target` (a StreamHandler).
    `flush()` returns once every queued line is written; `close()` (logging.shutdown, at exit)
    writes what is queued and stops the thread."""

    def __init__(self, target: logging.Handler, capacity: int = QUEUED_RECORDS) -> None:
        self._records: queue.Queue[logging.LogRecord] = queue.Queue(capacity)
        super().__init__(self._records)
        self.target = target
        self._listener = logging.handlers.QueueListener(self._records, target)
        self._listener.start()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # What only this thread knows: the request's context, and `args` that may change once we return.
        record = copy.copy(record)  # other handlers (pytest's) keep the original
        record._request_fields = _request_fields(record)
        record.msg = record.getMessage()
        record.args = None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        self._records.put(record)  # blocks while the queue is full

    def flush(self) -> None:
        # Once closed, nothing takes records off the queue: waiting for it would never end (logging.shutdown
        # at exit flushes every handler still attached, a closed one too).
        if self._listener._thread is not None:
            self._records.join()
        self.target.flush()

    def close(self) -> None:
        if self._listener._thread is not None:
            self._listener.stop()  # writes what is queued first
        self.target.close()
        super().close()


def flush_logs() -> None:
    """Wait until every line logged so far is written (tests read stderr right after logging)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


def log_format(flag: str | None = None) -> str:
    """The format of this process: the flag, else TURNOUT_LOG_FORMAT, else text on a terminal and json elsewhere."""
    chosen = (flag or os.environ.get("TURNOUT_LOG_FORMAT") or ("text" if stderr_is_terminal() else "json")).lower()
    if chosen not in LOG_FORMATS:
        raise SystemExit(f"log format must be one of {', '.join(LOG_FORMATS)}, got {chosen!r}")
    return chosen


def setup_logging(service: str, level: str | None = None, fmt: str | None = None) -> None:
    """Send all logs to stderr, tagged with the service name, in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    colour = stderr_is_terminal() and not os.environ.get("NO_COLOR")
    handler.setFormatter(JsonFormatter(service) if log_format(fmt) == "json" else TextFormatter(service, colour))
    root = logging.getLogger()
    for replaced in root.handlers:
        if isinstance(replaced, BackgroundHandler):
            replaced.close()  # a second setup (tests) stops the first one's thread
    root.handlers[:] = [BackgroundHandler(handler)]
    root.setLevel((level or os.environ.get("TURNOUT_LOG_LEVEL", "INFO")).upper())
    # Third-party chatter stays at warning unless asked for.
    for noisy in ("uvicorn.access", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def progress_bar(total: int, description: str, unit: str = "it") -> tqdm[Any]:
    """A progress bar of `total` steps (`.update()` each, or use it as a context manager) on
    stderr while that is a terminal; invisible otherwise (a log file would get one line per redraw)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit=unit, disable=not stderr_is_terminal(), leave=False)
