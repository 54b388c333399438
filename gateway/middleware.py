"""ASGI middleware in front of every route: the root path, the API key and the request size limit.

Both answer with the gateway's OpenAI-style error body (`errors.HTTPError`),
before any handler runs, so a refused request costs no router call.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette._utils import get_route_path
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import HTTPError, error_response

# Probes and the version stay open with a key set: load balancers and
# Prometheus do not carry it (vLLM leaves everything but /v1 open; SGLang
# leaves /health and /metrics open).
OPEN_PATHS = ("/health", "/health_generate", "/metrics", "/version", "/ping")


class ApiKeyMiddleware:
    """`Authorization: Bearer KEY` with one of `keys`, on every path except `OPEN_PATHS`; else 401.

    Installed inside the CORS middleware, which answers preflights (sent without credentials) itself.
    """

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app = app
        self._keys = [key.encode() for key in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or get_route_path(scope) in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        given = token.strip().encode()
        # Compare against every key in constant time, so timing tells nothing about a key.
        valid = scheme.lower() == "bearer" and any([hmac.compare_digest(given, key) for key in self._keys])
        if not valid:
            message = "invalid or missing API key: send 'Authorization: Bearer <key>'"
            response = error_response(HTTPError(401, message, type_="authentication_error"))
            response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class RequestTooLarge(HTTPException):
    """Raised from `receive` when the body passes the limit; FastAPI passes HTTPExceptions through
    its body parsing, so `errors` answers it as 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is larger than the limit of {limit} bytes (--max-request-bytes)")


class BodySizeLimitMiddleware:
    """413 for a request body over `max_bytes`: up front from Content-Length, else while it is read
    (chunked bodies have no length), so a huge body is never held in memory."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.isdigit() and int(length) > self._max:
            await error_response(HTTPError(413, RequestTooLarge(self._max).detail))(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._max:
                    raise RequestTooLarge(self._max)
            return message

        await self.app(scope, counting_receive, send)


class RootPathMiddleware:
    """Serve under `root_path` (vLLM's `--root-path`): set as the ASGI root path, so routes match with
    the prefix (a proxy that keeps it) and without it (one that strips it), and OpenAPI names it."""

    def __init__(self, app: ASGIApp, root_path: str) -> None:
        self.app = app
        self._root_path = root_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "root_path": self._root_path}
        await self.app(scope, receive, send)
