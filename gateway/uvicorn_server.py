"""The gateway's uvicorn server: how it takes the signals that stop it."""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn


class GatewayServer(uvicorn.Server):
    """uvicorn's server, where only a second Ctrl-C forces the exit.

    A terminal's Ctrl-C reaches `turnout serve` and all its children at once, and the launcher then sends
    each child SIGTERM: the gateway may take that SIGTERM first and the Ctrl-C while it is stopping. uvicorn
    takes any SIGINT that comes while it stops as the impatient second Ctrl-C: it skips the app's shutdown,
    whose task is then cancelled with a traceback. Here that takes a SIGINT after an earlier SIGINT."""

    interrupted = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGINT:
            if self.should_exit and not self.interrupted:
                self.interrupted = True  # the stop under way is this Ctrl-C's
                return
            self.interrupted = True
        super().handle_exit(sig, frame)
