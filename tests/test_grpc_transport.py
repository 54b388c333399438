"""Every Turnout process asks gRPC for its POSIX endpoints before gRPC starts (turnout/grpc_transport.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from turnout.grpc_transport import ENV, POSIX_ENDPOINTS, use_posix_endpoints

# Run in a fresh interpreter: records GRPC_EXPERIMENTS at the moment anything first imports grpc, then
# runs the `turnout` command line as a service would start (`--help` stops it once every command's
# module, grpc included, is imported).
_PROBE = """
import importlib.abc, json, os, sys

seen = {}

class FirstGrpcImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "grpc" and "at_grpc_import" not in seen:
            seen["at_grpc_import"] = os.environ.get("GRPC_EXPERIMENTS")
        return None

sys.meta_path.insert(0, FirstGrpcImport())
from turnout import cli
try:
    cli.main(["router", "--help"])
except SystemExit:
    pass
print(json.dumps(seen))
"""


def _probe(env: dict[str, str]) -> dict[str, str | None]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True, timeout=300
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_command_line_asks_for_posix_endpoints_before_grpc_is_imported() -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    assert _probe(env) == {"at_grpc_import": POSIX_ENDPOINTS}


def test_experiments_the_user_chose_are_kept() -> None:
    assert _probe({**os.environ, ENV: ""}) == {"at_grpc_import": ""}
    environ = {ENV: "event_engine_client"}
    assert use_posix_endpoints(environ) == "event_engine_client"
    assert environ == {ENV: "event_engine_client"}
    fresh: dict[str, str] = {}
    assert use_posix_endpoints(fresh) == POSIX_ENDPOINTS and fresh == {ENV: POSIX_ENDPOINTS}
