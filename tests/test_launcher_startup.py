"""`turnout serve`'s start-up, piece by piece: the ports it checks before loading anything, a child
that dies during start explained by its own last lines, a health answer from someone else's
server never taken for ours, and the ready summary."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnout import launcher
from turnout.child_output import last_error_lines
from turnout.child_processes import Child, Stack, free_port
from turnout.port_check import PlannedPort, port_problems
from turnout.ready_summary import EngineCapacity, ready_lines


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port this test process listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_busy_port_is_named_with_its_flag_and_holder(held_port: int) -> None:
    free = free_port()
    problems = port_problems(
        [PlannedPort("127.0.0.1", free, "gateway --port"), PlannedPort("127.0.0.1", held_port, "router --router-port")]
    )
    assert len(problems) == 1
    assert problems[0].startswith(f"port {held_port} is already in use (router --router-port), held by pid ")
    assert "pytest" in problems[0] or "python" in problems[0]  # this very process, by its command line


def test_free_port_never_hands_out_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel may give the port of a socket just closed to the next bind: a CI run's stack got the
    # same port for its engine and its tokenizer. Here the kernel answers the same port twice in a row.
    ports = iter([49001, 49001, 49002])

    class ScriptedSocket:
        def __init__(self, *args: object) -> None:
            self.port = next(ports)

        def __enter__(self) -> ScriptedSocket:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            pass

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr("turnout.child_processes._handed_out", set())
    monkeypatch.setattr("turnout.child_processes.socket.socket", ScriptedSocket)
    assert [free_port(), free_port()] == [49001, 49002]


def test_a_port_given_twice_is_a_problem() -> None:
    port = free_port()
    problems = port_problems(
        [PlannedPort("127.0.0.1", port, "gateway --port"), PlannedPort("127.0.0.1", port, "engine --engine-port")]
    )
    assert problems == [f"port {port} is given twice (gateway --port and engine --engine-port)"]


def test_every_fixed_port_is_planned() -> None:
    argv = ["--model", "/m", "--port", "9000", "--engines", "2", "--engine-port", "9100", "--router-port", "9200"]
    planned = launcher.planned_ports(launcher.build_parser().parse_args(argv))
    assert [(p.port, p.flag) for p in planned] == [
        (9000, "gateway --port"),
        (9100, "engine --engine-port"),
        (9101, "engine1: --engine-port + 1"),
        (9200, "router --router-port"),
    ]
    # Free ports (0) are picked when the stack starts: nothing to check.
    assert [p.port for p in launcher.planned_ports(launcher.build_parser().parse_args(["--port", "9000"]))] == [9000]


def test_the_launcher_refuses_a_busy_port_before_resolving_the_model(
    held_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # The model does not exist: had it been looked at first, the message would be about the model.
    args = launcher.build_parser().parse_args(["--model", "/no/such/model", "--port", str(held_port)])
    with pytest.raises(SystemExit, match=rf"^turnout serve: port {held_port} is already in use \(gateway --port\)"):
        launcher.run(args)


def test_a_model_that_cannot_be_resolved_stops_the_start_with_its_message(tmp_path: Path) -> None:
    args = launcher.build_parser().parse_args(["--model", str(tmp_path / "missing"), "--port", str(free_port())])
    with pytest.raises(SystemExit, match=r"^turnout serve: model '.*/missing': no such file or folder"):
        launcher.run(args)


def test_the_tokenizer_folder_reaches_the_tokenizer_and_the_model_the_engine() -> None:
    args = launcher.build_parser().parse_args(["--model", "/m", "--tokenizer", "/t"])
    stack = launcher.build_stack(args, Path("/m"), Path("/t"))
    by_name = {child.name: child for child in stack.children}
    assert by_name["engine"].argv[by_name["engine"].argv.index("--model") + 1] == "/m"
    # The tokenizer service takes the model folder and, apart, the folder its tokenizer files come from.
    tokenizer = by_name["tokenizer"].argv
    assert tokenizer[tokenizer.index("--model") + 1] == "/m" and tokenizer[tokenizer.index("--tokenizer") + 1] == "/t"


def _child(name: str, script: str, healthy: bool = False, port: int | None = None) -> Child:
    return Child(name, [sys.executable, "-c", script], lambda: healthy, 0, port=port)


def test_a_child_dying_during_start_is_explained_by_its_last_lines(capfd: pytest.CaptureFixture[str]) -> None:
    lines = [
        {"level": "info", "logger": "uvicorn.error", "message": "Started server process"},
        {"level": "error", "logger": "uvicorn.error", "message": "[Errno 98] address already in use"},
    ]
    script = f"import sys\nfor line in {[json.dumps(x) for x in lines]!r}: print(line, file=sys.stderr)\nsys.exit(3)"
    stack = Stack([_child("gateway", script)])
    try:
        assert stack.start(timeout_s=60) is False
    finally:
        stack.stop()
    err = capfd.readouterr().err
    assert "turnout serve: the gateway exited during start-up (exit code 3); its last lines:\n" in err
    assert "    ERROR uvicorn.error: [Errno 98] address already in use\n" in err
    assert "    INFO uvicorn.error: Started" not in err  # info lines do not explain a failure
    assert json.dumps(lines[1]) in err  # and the child's own output still reached our stderr, as written


def test_a_health_answer_from_another_process_is_not_taken_for_the_childs(
    held_port: int, capfd: pytest.CaptureFixture[str]
) -> None:
    # The child's probe "succeeds", but the port belongs to this test process, not to the child.
    stack = Stack([_child("gateway", "import time; time.sleep(60)", healthy=True, port=held_port)])
    try:
        assert stack.start(timeout_s=60) is False
    finally:
        stack.stop()
    err = capfd.readouterr().err
    assert f"turnout serve: port {held_port} answered gateway's health probe, but pid " in err
    assert "holds it, not the gateway" in err


def test_last_error_lines_render_json_tracebacks_and_plain_lines() -> None:
    lines = [
        json.dumps({"level": "info", "logger": "x", "message": "loading"}),
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "ValueError: boom",
        json.dumps({"level": "error", "logger": "engine", "message": "failed", "exc": "Traceback ...\nKeyError: 1"}),
    ]
    assert last_error_lines(lines) == [
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "ValueError: boom",
        "ERROR engine: failed\nTraceback ...\nKeyError: 1",
    ]
    quiet = [json.dumps({"level": "info", "logger": "x", "message": f"step {i}"}) for i in range(9)]
    assert last_error_lines(quiet) == [f"INFO x: step {i}" for i in range(4, 9)]  # nothing telling: the last few


def test_the_ready_summary_gives_the_router_the_metrics_and_the_kv_capacity() -> None:
    lines = ready_lines(
        "org/tiny",
        "http://127.0.0.1:8000",
        "127.0.0.1:50055",
        {"engine": EngineCapacity(kv_tokens=65536, max_model_len=8192), "engine1": None},
        ["  engine metrics: http://127.0.0.1:9100/metrics"],
    )
    assert lines == [
        "Turnout is serving org/tiny at http://127.0.0.1:8000  (OpenAI API: http://127.0.0.1:8000/v1; Ctrl-C stops)",
        "  router gRPC (turnout.v1.Inference): 127.0.0.1:50055",
        "  metrics: http://127.0.0.1:8000/metrics",
        "  engine: KV cache 65,536 tokens; max concurrency at full context (8,192 tokens per request): 8.00x",
        "  engine metrics: http://127.0.0.1:9100/metrics",
    ]
