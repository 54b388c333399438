"""Which socket layer gRPC runs on in every Turnout process: the POSIX endpoints, not the EventEngine's.

Since grpcio 1.80, Python's channels and servers move their bytes through gRPC's EventEngine (the
`event_engine_client`, `event_engine_listener` and `event_engine_for_all_other_endpoints` experiments,
on by default). Turnout's hops are small messages on loopback or a LAN, one after another, and for
them the older POSIX endpoints cost less: on grpcio 1.85 a message and its answer on a grpc.aio
stream between two processes took 180 to 220 µs instead of 240 to 350 µs, with less CPU at both ends, and
the stack's services spent 6 to 18% less CPU per request (docs/benchmarks.md, "gRPC's POSIX
endpoints").

The experiments are read once, when gRPC's core starts, so `turnout.cli` sets them before anything
imports grpc, in the process and (by inheritance) in every child it starts. A `GRPC_EXPERIMENTS` the
user set is left as it is, so `GRPC_EXPERIMENTS=` (empty) gives gRPC's own defaults back.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ENV = "GRPC_EXPERIMENTS"
POSIX_ENDPOINTS = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def use_posix_endpoints(environ: MutableMapping[str, str] = os.environ) -> str:
    """Ask gRPC for its POSIX endpoints unless the user chose the experiments; what GRPC_EXPERIMENTS is now.
    Must run before grpc is first imported (a later change has no effect on this process)."""
    return environ.setdefault(ENV, POSIX_ENDPOINTS)
