"""The limit on prompts per request (`--max-client-batch-size`).

A batch fans out into one router call per prompt, all running at once, so an
unbounded batch is unbounded work and memory from one request.
"""

from __future__ import annotations

from starlette.requests import Request

from gateway.config import GatewayConfig
from gateway.errors import invalid_request


def check_batch_size(request: Request, count: int, param: str) -> None:
    """400 naming `param`, the limit and its flag when a batch has more than the limit's entries."""
    config: GatewayConfig = request.app.state.config
    limit = config.max_client_batch_size
    if count > limit:
        raise invalid_request(
            f"'{param}' has {count} entries, more than the limit of {limit} per request (--max-client-batch-size)",
            param,
        )
