"""The id of the request being served, for log lines (`turnout.logs` adds it to every line).

Every service sets it where a request starts (the gateway's middleware and generation, the
router's and engine's Generate, the tokenizer's Detokenize). gRPC and ASGI run each request
in its own task, whose context is a copy, so a value never leaks into another request.
"""

from __future__ import annotations

from contextvars import ContextVar

_request_id: ContextVar[str | None] = ContextVar("turnout_request_id", default=None)


def set_request_id(request_id: str | None) -> None:
    """Tag the current request's log lines with `request_id` (None or "" clears it)."""
    _request_id.set(request_id or None)


def current_request_id() -> str | None:
    return _request_id.get()
