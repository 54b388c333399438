"""GatewayConfig validation and the `turnout gateway` command line."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway.config import GatewayConfig
from gateway.main import parse_args
from turnout.child_processes import free_port


@pytest.mark.parametrize(
    "kwargs",
    [
        {"router_address": ""},
        {"router_address": "r:1", "port": 70000},
        {"router_address": "r:1", "port": -1},
        {"router_address": "r:1", "host": " "},
        {"router_address": "r:1", "request_timeout_s": 0},
        {"router_address": "r:1", "request_timeout_s": float("inf")},
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        GatewayConfig(**kwargs)  # type: ignore[arg-type]


def test_config_defaults_and_frozen() -> None:
    config = GatewayConfig(router_address="127.0.0.1:50051")
    assert (config.host, config.port, config.request_timeout_s) == ("127.0.0.1", 8000, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]


def test_cli_flags() -> None:
    args = parse_args(["--router", "r:1"])
    # Each flag lands on the GatewayConfig field that declares it.
    assert (args.router_address, args.host, args.port, args.request_timeout_s, args.log_level) == (
        "r:1",
        "127.0.0.1",
        8000,
        None,
        None,
    )
    args = parse_args(
        ["--router", "r:1", "--host", "0.0.0.0", "--port", "9", "--request-timeout", "2.5", "--log-level", "debug"]
    )
    assert (args.host, args.port, args.request_timeout_s, args.log_level) == ("0.0.0.0", 9, 2.5, "DEBUG")


def test_cli_requires_router(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args([])
    assert "--router" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["missing folder", "directory", "not sqlite"])
def test_a_responses_store_file_that_cannot_be_one_is_named(tmp_path: Path, what: str) -> None:
    path = {"missing folder": tmp_path / "no" / "r.sqlite", "directory": tmp_path, "not sqlite": tmp_path / "r.txt"}
    (tmp_path / "r.txt").write_text("not a database, at least 100 bytes long " * 4)
    argv = [sys.executable, "-m", "turnout.cli", "gateway", "--insecure-internal", "--router", "127.0.0.1:1"]
    argv += ["--port", str(free_port()), "--responses-store-file", str(path[what])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"turnout gateway: --responses-store-file {path[what]}: " in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "signals",
    # The last: a terminal's Ctrl-C under `turnout serve`, which reaches the gateway with the launcher's
    # SIGTERM, either first; one stop, not the impatient second Ctrl-C that skips the app's shutdown.
    [[signal.SIGINT], [signal.SIGTERM], [signal.SIGTERM, signal.SIGINT]],
    ids=["ctrl-c", "sigterm", "sigterm-then-ctrl-c"],
)
def test_gateway_process_stops_cleanly_on_signal(signals: list[int]) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "turnout.cli", "gateway", "--router", "127.0.0.1:1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # Signalled only once it answers: before its handlers exist a signal just kills it (-15). The
        # deadline is for a start that hangs, not a timing: a loaded machine took over 30 s.
        deadline = time.monotonic() + 120
        answered = False
        while not answered and time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
                answered = True
            time.sleep(0.1)
        assert answered, "the gateway never answered on its port"
        first, *later = signals
        process.send_signal(first)
        seen = b""
        if later:  # sent once the gateway is stopping (the deadline above bounds a gateway that never says so)
            while b"Shutting down" not in seen and process.poll() is None and time.monotonic() < deadline:
                seen += process.stdout.readline()  # type: ignore[union-attr]
            for signum in later:
                process.send_signal(signum)
        output = (seen + process.communicate(timeout=15)[0]).decode(errors="replace")
    finally:
        process.kill()
    assert "Traceback" not in output
    assert "Application shutdown complete" in output, "the app's own shutdown ran"
    assert "startup heap frozen" in output, "the gateway froze its startup heap before serving (turnout/gc_heap.py)"
    # Both end with 0 (uvicorn re-raises SIGTERM after draining; the gateway handles it as uvicorn does).
    assert process.returncode == 0, output[-2000:]
