"""Log lines: JSON with the fields docs/observability.md lists, the request id of the request being
served on every line (without passing it), trace ids while a span is current, one format rule."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from turnout.logs import BackgroundHandler, flush_logs, log_format, progress_bar, setup_logging
from turnout.telemetry.request_context import set_request_id

log = logging.getLogger("tests.telemetry")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """setup_logging replaces the root handlers: put the test runner's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in root.handlers:
        if isinstance(handler, BackgroundHandler) and handler not in handlers:  # the ones put back stay open
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_closed_handler_still_attached_flushes_at_once() -> None:
    # logging.shutdown flushes every attached handler at exit; one closed earlier used to wait forever for
    # a queue nothing reads any more, and the process never exited.
    handler = BackgroundHandler(logging.StreamHandler(io.StringIO()))
    handler.close()
    handler.handle(logging.LogRecord("t", logging.INFO, __file__, 1, "after close", None, None))
    done = threading.Event()
    threading.Thread(target=lambda: (handler.flush(), done.set()), daemon=True).start()
    assert done.wait(10), "flush waited for a queue nothing reads"


def logged(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    """The lines written since the last read (setup_logging binds sys.stderr, which capsys replaced)."""
    flush_logs()
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


async def test_json_lines_carry_the_request_id_of_their_own_request(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("router", "INFO", "json")

    async def serve(request_id: str) -> None:
        set_request_id(request_id)
        await asyncio.sleep(0.01)  # the two requests interleave
        log.info("working", extra={"step": 1})

    # Each request runs in its own task, as gRPC and ASGI run them.
    await asyncio.gather(asyncio.create_task(serve("req-a")), asyncio.create_task(serve("req-b")))
    log.info("between requests")
    entries = logged(capsys)
    assert [(e["message"], e.get("request_id")) for e in entries] == [
        ("working", "req-a"),
        ("working", "req-b"),
        ("between requests", None),
    ]
    first = entries[0]
    assert first["service"] == "router" and first["level"] == "info" and first["logger"] == "tests.telemetry"
    assert first["step"] == 1 and str(first["timestamp"]).endswith("Z")
    assert "trace_id" not in first  # no span: no trace ids


def test_lines_inside_a_span_carry_its_trace_and_span_ids(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("engine", "INFO", "json")
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("request") as span:
        log.info("inside")
    (entry,) = logged(capsys)
    assert entry["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert entry["span_id"] == format(span.get_span_context().span_id, "016x")


def test_an_explicit_request_id_wins(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("engine", "INFO", "json")
    set_request_id("outer")
    log.info("x", extra={"request_id": "explicit"})
    set_request_id(None)
    (entry,) = logged(capsys)
    assert entry["request_id"] == "explicit"


def test_text_format_and_the_one_rule(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TURNOUT_LOG_FORMAT", "text")
    assert log_format(None) == "text"
    assert log_format("json") == "json"  # the flag wins over the environment
    setup_logging("gateway", "INFO")
    set_request_id("req-t")
    log.info("hello", extra={"port": 8000})
    set_request_id(None)
    flush_logs()
    line = capsys.readouterr().err.strip()
    assert " INFO gateway tests.telemetry: hello" in line and "request_id=req-t" in line and "port=8000" in line
    monkeypatch.setenv("TURNOUT_LOG_FORMAT", "yaml")
    with pytest.raises(SystemExit, match="log format must be one of json, text, got 'yaml'"):
        log_format(None)


def test_text_on_a_terminal_json_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNOUT_LOG_FORMAT", raising=False)
    monkeypatch.setenv("TURNOUT_TTY", "1")  # what `turnout serve` tells children whose logs reach a terminal
    assert log_format(None) == "text"
    monkeypatch.setenv("TURNOUT_TTY", "0")
    assert log_format(None) == "json"
    assert log_format("text") == "text"


def test_text_is_coloured_on_a_terminal_unless_no_color(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TURNOUT_TTY", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    setup_logging("engine", "INFO", "text")
    log.warning("careful", extra={"blocks": 3})
    flush_logs()
    line = capsys.readouterr().err.strip()
    assert "\x1b[33mWARNING\x1b[0m engine tests.telemetry: careful" in line and "blocks=3" in line
    monkeypatch.setenv("NO_COLOR", "1")
    setup_logging("engine", "INFO", "text")
    log.warning("careful")
    flush_logs()
    assert "\x1b" not in capsys.readouterr().err
    monkeypatch.setenv("TURNOUT_TTY", "0")
    monkeypatch.delenv("NO_COLOR")
    setup_logging("engine", "INFO", "text")
    log.warning("careful")
    flush_logs()
    assert "\x1b" not in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_uvicorns_color_message_is_not_logged(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("gateway", "INFO", fmt)
    # What uvicorn passes with every line it logs.
    logging.getLogger("uvicorn.error").info("Started", extra={"color_message": "\x1b[36mStarted\x1b[0m"})
    flush_logs()
    err = capsys.readouterr().err
    assert "Started" in err and "color_message" not in err and "\x1b[36m" not in err


def test_progress_bars_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TURNOUT_TTY", "0")
    with progress_bar(3, "loading weights", unit="tensor") as bar:
        bar.update(3)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("TURNOUT_TTY", "1")
    with progress_bar(3, "loading weights", unit="tensor") as bar:
        bar.update(3)
    assert "loading weights:   0%|          | 0/3" in capsys.readouterr().err


class _StuckStream:
    """A stderr whose writes block until `release` is set (a pipe whose reader lags)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        self.release.wait(10)
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_a_blocked_stderr_does_not_block_the_logging_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _StuckStream()
    monkeypatch.setattr(sys, "stderr", stream)
    setup_logging("router", "INFO", "json")
    set_request_id("req-blocked")
    started = time.perf_counter()
    for i in range(3):
        log.info("queued", extra={"i": i})
    set_request_id(None)
    assert time.perf_counter() - started < 1.0  # not the 10 s each write waits
    assert stream.lines == []
    stream.release.set()
    flush_logs()
    entries = [json.loads(line) for line in stream.lines]
    assert [(e["message"], e["i"], e["request_id"]) for e in entries] == [
        ("queued", i, "req-blocked") for i in range(3)
    ]


def test_closing_writes_what_is_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _StuckStream()
    monkeypatch.setattr(sys, "stderr", stream)
    setup_logging("engine", "INFO", "text")
    log.warning("last words")
    threading.Timer(0.2, stream.release.set).start()
    logging.shutdown()  # what exit_now does before the process ends
    assert len(stream.lines) == 1 and "last words" in stream.lines[0]


def test_the_message_is_what_its_arguments_were_when_logged(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("router", "INFO", "json")
    engines = ["a"]
    log.info("engines %s", engines)
    engines.append("b")  # after the call, before the thread may have formatted it
    (entry,) = logged(capsys)
    assert entry["message"] == "engines ['a']"
