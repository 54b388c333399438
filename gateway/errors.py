"""The one place errors become HTTP responses.

Every error leaves the gateway as an OpenAI-style body
`{"error": {"message", "type", "param", "code"}}` with `code` the HTTP status:
gRPC status codes from the router are mapped here, request validation errors
are 400 (never FastAPI's 422), and anything unexpected is logged with its
traceback and answered 500 without one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from grpc import aio
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_STATUS_OF_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    # The gateway's own cancellations never get here (a client that left is ClientDisconnected):
    # a CANCELLED from the router means the serving side shed the call (overload, shutdown).
    grpc.StatusCode.CANCELLED: 503,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

_TYPE_OF_STATUS = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}

# Pydantic names union members in error locations by their type ("str",
# "list[int]", "constrained-int", a model class name); those are not part of
# the parameter path.
_UNION_TAGS = {"str", "int", "float", "bool", "none", "dict"}


class HTTPError(Exception):
    """An error answered with `status` and an OpenAI-style body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, type_: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or _TYPE_OF_STATUS.get(status, "internal_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


def invalid_request(message: str, param: str | None = None) -> HTTPError:
    """HTTP 400 for a request the gateway refuses, naming the offending parameter."""
    return HTTPError(400, message, param=param)


def unsupported(param: str, what: str = "is not supported yet") -> HTTPError:
    """HTTP 400 for a parameter we cannot honour: refusing beats silently ignoring it."""
    return HTTPError(400, f"'{param}' {what}", param=param)


class ClientDisconnected(HTTPError):
    """The client went away before the answer; nobody reads the status (nginx calls it 499)."""

    def __init__(self) -> None:
        super().__init__(499, "client disconnected", type_="client_closed_request")


class GenerationAborted(Exception):
    """The router ended a sample with finish_reason `abort` (cut short, or failed)."""


def to_http_error(exc: BaseException, *, log_unexpected: bool = True) -> HTTPError:
    """Map any exception to the HTTP error the client sees; unexpected ones are logged."""
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, aio.AioRpcError):
        status = _STATUS_OF_CODE.get(exc.code(), 500)
        message = exc.details() or exc.code().name
        if status >= 500:
            log.warning("router call failed", extra={"grpc_code": exc.code().name, "details": message})
        return HTTPError(status, message)
    if isinstance(exc, GenerationAborted):
        # The abort carries no status code, and aborts come from the serving side
        # (an engine lost mid-stream, a request cancelled there): retryable.
        message = str(exc) or "generation was aborted"
        log.warning("generation aborted", extra={"details": message})
        return HTTPError(503, f"generation aborted: {message}")
    if log_unexpected:
        log.error("unhandled error", exc_info=exc)
    return HTTPError(500, f"internal server error ({type(exc).__name__})")


def error_response(err: HTTPError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _is_union_tag(part: str | int) -> bool:
    return isinstance(part, str) and (
        part in _UNION_TAGS or "[" in part or part.startswith("constrained-") or part[:1].isupper()
    )


def _param_path(loc: Sequence[str | int]) -> str:
    path = ""
    for part in loc:
        if part == "body" or _is_union_tag(part):
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def validation_error(errors: Sequence[Any]) -> HTTPError:
    """HTTP 400 from pydantic/FastAPI errors, naming one offending field.

    A union field reports one error per alternative; the deepest one is from
    the alternative that matched the input's shape best, so it is the one to show.
    """
    if not errors:
        return invalid_request("invalid request")
    ranked = sorted(errors, key=lambda e: -len(e.get("loc", ())))
    first = ranked[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return invalid_request(f"request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}")
    param = _param_path(first.get("loc", ()))
    if not param:
        if kind == "missing":
            return invalid_request("a JSON request body is required")
        if kind in ("model_attributes_type", "model_type", "dict_type"):
            return invalid_request("the request body must be a JSON object, sent as Content-Type: application/json")
        return invalid_request(f"invalid request body: {first.get('msg', 'invalid')}")
    if kind == "extra_forbidden":
        return invalid_request(f"unknown or unsupported parameter '{param}'", param)
    depth = len(first.get("loc", ()))
    alike = [e for e in ranked if len(e.get("loc", ())) == depth and _param_path(e.get("loc", ())) == param]
    if len(alike) > 1:
        # Every alternative of a union failed at the same depth: no single message is the right one.
        return invalid_request(f"'{param}' has an invalid type or value", param)
    return invalid_request(f"'{param}': {first.get('msg', 'invalid value')}", param)


def install_handlers(app: FastAPI) -> None:
    """Route every error raised while handling a request through this module."""

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(to_http_error(exc))

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        return error_response(to_http_error(exc, log_unexpected=False))

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(exc.errors()))

    async def on_starlette(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(HTTPError(exc.status_code, str(exc.detail)))

    app.add_exception_handler(HTTPError, on_http_error)
    app.add_exception_handler(aio.AioRpcError, on_http_error)
    app.add_exception_handler(GenerationAborted, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_starlette)
    # This handler runs in Starlette's outermost middleware, which re-raises after
    # answering so the server logs the traceback; the client only sees the body.
    app.add_exception_handler(Exception, on_unexpected)
