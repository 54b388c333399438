"""A child's stderr, copied line by line to the launcher's, with its last lines kept.

When a child of `turnout serve` dies during start-up, the cause is somewhere in what it wrote
last, maybe one JSON log line among many: `last_error_lines` picks the lines that explain it
(warnings, errors, tracebacks, the `SystemExit` message) and renders JSON log lines as text, so
the launcher can say in plain words why the start failed.
"""

from __future__ import annotations

import collections
import json
import sys
import threading
from typing import IO

# Lines kept per child; a traceback fits.
KEPT_LINES = 60
_QUIET_LEVELS = {"debug", "info"}


class OutputTail:
    """Copies `stream` (a child's stderr) to our stderr on a daemon thread; keeps its last lines."""

    def __init__(self, stream: IO[bytes], name: str) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self._stream = stream
        self._thread = threading.Thread(target=self._copy, name=f"{name}-stderr", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        for raw in iter(self._stream.readline, b""):
            if out is not None:
                out.write(raw)
                out.flush()
            else:
                sys.stderr.write(raw.decode(errors="replace"))
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
        self._stream.close()

    def join(self, timeout_s: float) -> None:
        """Wait until the child's last line is copied (its stderr closed)."""
        self._thread.join(timeout_s)


def readable(line: str) -> tuple[str, bool]:
    """`line` as text, and whether it helps explain a failure (not a debug or info log line)."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line, bool(line.strip())
    if not isinstance(entry, dict) or "message" not in entry:
        return line, True
    level = str(entry.get("level", "")).lower()
    text = f"{level.upper()} {entry.get('logger', '')}: {entry['message']}"
    if entry.get("exc"):
        text += "\n" + str(entry["exc"])
    return text, level not in _QUIET_LEVELS


def last_error_lines(lines: list[str], limit: int = 15) -> list[str]:
    """The last `limit` lines that explain a failure, as text; the last few lines of any kind if none does."""
    rendered = [readable(line) for line in lines]
    telling = [text for text, tells in rendered if tells]
    return (telling or [text for text, _ in rendered][-5:])[-limit:]
