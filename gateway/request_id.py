"""The id of an HTTP request: chosen once, sent to the router, echoed to the client.

The id is the `X-Request-Id` header when the client sent one, else the
body's own id (OpenAI bodies' `request_id`, `/generate`'s `rid`), else a new
uuid. It is what goes into `GenerateRequest.request_id` (a batch of prompts
adds `-{i}` per prompt), so logs and traces of the router and engines can be
matched to the client's request; the response carries it back as
`X-Request-Id` (see `RequestIdMiddleware`).
"""

from __future__ import annotations

import logging
import uuid

from pydantic import BaseModel
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import invalid_request
from gateway.protocol import REFUSED_EXTRAS, unknown_fields

log = logging.getLogger(__name__)

HEADER = "x-request-id"
# Where the chosen id waits for the response headers: scope["state"], i.e. `request.state`.
_STATE_KEY = "request_id"


def request_id(request: Request, body_id: str | None = None) -> str:
    """The request's id (header, else `body_id`, else a new one), remembered for the response header."""
    chosen = request.headers.get(HEADER) or body_id or uuid.uuid4().hex
    setattr(request.state, _STATE_KEY, chosen)
    return chosen


def begin(request: Request, body: BaseModel, body_id: str | None = None) -> str:
    """What every endpoint with a body does first: choose the id, refuse the fields in
    `REFUSED_EXTRAS`, warn about the other unknown ones (ignored)."""
    chosen = request_id(request, body_id)
    ignored = unknown_fields(body)
    for name in ignored:
        if name in REFUSED_EXTRAS:
            raise invalid_request(f"unknown or unsupported parameter '{name}'", name)
    if ignored:
        # One warning per request, naming every field, as vLLM does.
        log.warning(
            "ignoring unknown fields", extra={"request_id": chosen, "fields": ignored, "path": request.url.path}
        )
    return chosen


class RequestIdMiddleware:
    """Echo the request's id as the `X-Request-Id` response header on every response.

    The id is the one the handler chose (`request_id`), else the client's header,
    else a new one for responses no handler chose an id for (errors before the
    handler ran, health probes).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                chosen = state.get(_STATE_KEY) or Headers(scope=scope).get(HEADER) or uuid.uuid4().hex
                MutableHeaders(scope=message)[HEADER] = chosen
            await send(message)

        await self.app(scope, receive, send_with_id)
