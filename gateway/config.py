"""Gateway settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayConfig:
    """Where the router is and where the gateway listens.

    `request_timeout_s` bounds each gRPC call to the router (None: no deadline);
    a call that runs past it answers HTTP 504.
    """

    router_address: str
    host: str = "127.0.0.1"
    port: int = 8000
    request_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not self.router_address.strip():
            raise ValueError("router_address must not be empty (e.g. 127.0.0.1:50051)")
        if not self.host.strip():
            raise ValueError("host must not be empty")
        # Port 0 lets the OS pick a free port (tests use it).
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.request_timeout_s is not None and not (
            math.isfinite(self.request_timeout_s) and self.request_timeout_s > 0
        ):
            raise ValueError(f"request_timeout_s must be a positive number or None, got {self.request_timeout_s}")
