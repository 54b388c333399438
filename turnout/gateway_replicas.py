"""`turnout serve --api-server-count N`: N gateway processes behind the one HTTP port (vLLM's flag).

One gateway is one Python process, and at one core it is the stack's HTTP ceiling on a machine with
cores to spare (docs/benchmarks.md, "Against a GPU engine"). With N of them:
- **one socket**: the launcher binds `--host:--port` and listens once; every gateway inherits the
  socket and accepts on it, so the kernel gives each connection to whichever gateway takes it first
  (a busy one takes it later), and a gateway that dies and is restarted leaves the port served by
  the others. Each gateway also listens on a loopback port of its own, where its health is probed.
- **one metrics page**: the gateways write their series to a shared folder
  (`PROMETHEUS_MULTIPROC_DIR`, prometheus_client's multiprocess mode), and whichever gateway a scrape
  reaches sums them all (gateway/metrics.py).
- **one responses store**: `/v1/responses` keeps what it stores in one SQLite file
  (`--responses-store-file`, gateway/responses_store.py), so a follow-up (`previous_response_id`,
  `GET /v1/responses/{id}`) works whichever gateway it reaches.

Everything else a gateway holds is per request, or asked of the router.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

# In each gateway's environment: the file descriptor of the shared socket (gateway/main.py), and
# prometheus_client's switch to multiprocess mode (read when it is imported, so set before the process starts).
SHARED_SOCKET_ENV = "TURNOUT_GATEWAY_SOCKET_FD"
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# uvicorn's own default: connections the kernel queues before a gateway accepts them.
BACKLOG = 2048


class GatewayReplicas:
    """The socket and the folder the gateways share; `close()` once they have all stopped."""

    def __init__(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(BACKLOG)
            self.socket.set_inheritable(True)
        except OSError:
            self.socket.close()
            raise
        self.folder = Path(tempfile.mkdtemp(prefix="turnout-gateways-"))
        (self.folder / "metrics").mkdir()

    @property
    def fd(self) -> int:
        return self.socket.fileno()

    def env(self) -> dict[str, str]:
        return {SHARED_SOCKET_ENV: str(self.fd), MULTIPROC_DIR_ENV: str(self.folder / "metrics")}

    def flags(self) -> list[str]:
        return ["--responses-store-file", str(self.folder / "responses.sqlite")]

    def close(self) -> None:
        self.socket.close()
        shutil.rmtree(self.folder, ignore_errors=True)
