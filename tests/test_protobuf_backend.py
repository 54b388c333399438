"""The services' messages go through protobuf's C backend (upb), not its pure-Python one: every hop of
every token builds and parses messages, and the Python backend is ~15x slower per message
(docs/architecture.md, "Cheaper hops")."""

from __future__ import annotations

import os
import subprocess
import sys

from google.protobuf.internal import api_implementation


def test_protobuf_runs_on_upb() -> None:
    assert api_implementation.Type() == "upb"


def test_a_fresh_service_process_gets_upb_too() -> None:
    """What a service started by `turnout serve` gets (the environment, not this test process's imports)."""
    env = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    code = "import turnout.v1.engine_pb2; from google.protobuf.internal import api_implementation as a; print(a.Type())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "upb"
