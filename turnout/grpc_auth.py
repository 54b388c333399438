"""Authentication on gRPC: which credential each RPC needs, the one server interceptor that checks
it, and the client side that attaches it.

Every call carries `authorization: Bearer <credential>`. Three credentials, each allowing more:

    API key          PUBLIC     the router's Inference service, ListEngines and reflection (open while no
                                API key is configured)
    internal token   INTERNAL   every RPC but the admin ones (open only with --insecure-internal)
    admin key        ADMIN      everything, the admin RPCs included (refused while none is configured)

Unlisted methods need INTERNAL, so a new RPC is closed until someone decides otherwise; only the
standard health service is open (load balancers and probes carry no credential).
"""

from __future__ import annotations

import enum
import functools
import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import grpc
from grpc import aio

from turnout.metadata_channel import MetadataChannel
from turnout.security import ClientCredentials, ServiceSecurity


class Access(enum.IntEnum):
    OPEN = 0
    PUBLIC = 1
    INTERNAL = 2
    ADMIN = 3


_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
# The public contract: what the HTTP API also offers to an API key (/v1/engines is ListEngines),
# and reflection, which describes only the published .proto files and which grpcurl needs.
_PUBLIC_PREFIXES = ("/turnout.v1.Inference/", "/grpc.reflection.")
_PUBLIC_METHODS = frozenset({"/turnout.v1.RouterAdmin/ListEngines"})
# Methods that change what the deployment serves, or touch other callers' requests.
ADMIN_METHODS = frozenset(
    {
        "/turnout.v1.Engine/Abort",
        "/turnout.v1.Engine/FlushCache",
        "/turnout.v1.RouterAdmin/AddEngine",
        "/turnout.v1.RouterAdmin/RemoveEngine",
        "/turnout.v1.RouterAdmin/FlushCache",
        "/turnout.v1.Engine/LoadLoraAdapter",
        "/turnout.v1.Engine/UnloadLoraAdapter",
        "/turnout.v1.RouterAdmin/LoadLoraAdapter",
        "/turnout.v1.RouterAdmin/UnloadLoraAdapter",
    }
)


def required_access(method: str) -> Access:
    """The credential `method` (`/package.Service/Method`) needs."""
    if method.startswith(_OPEN_PREFIXES):
        return Access.OPEN
    if method in ADMIN_METHODS:
        return Access.ADMIN
    if method.startswith(_PUBLIC_PREFIXES) or method in _PUBLIC_METHODS:
        return Access.PUBLIC
    return Access.INTERNAL


def bearer_of(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, credential = value.partition(" ")
            return credential.strip() if scheme.lower() == "bearer" else None
    return None


def _matches(given: bytes, secret: str | None) -> bool:
    return secret is not None and hmac.compare_digest(given, secret.encode())


class AuthInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses a call whose credential does not reach its method's `required_access`: UNAUTHENTICATED
    without a valid one, PERMISSION_DENIED with one that allows less. Outermost, so a refused call
    costs no span, metric or handler."""

    def __init__(self, security: ServiceSecurity) -> None:
        self._security = security

    def credential(self, bearer: str | None) -> Access:
        """What `bearer` is: ADMIN (the admin key), INTERNAL (the token), PUBLIC (an API key) or OPEN
        (nothing this service knows). Every secret is compared, in constant time."""
        s = self._security
        given = (bearer or "").encode()
        admin = _matches(given, s.admin_key)
        internal = _matches(given, s.internal_token)
        public = any([_matches(given, key) for key in s.api_keys])
        return Access.ADMIN if admin else Access.INTERNAL if internal else Access.PUBLIC if public else Access.OPEN

    def allows(self, credential: Access, needed: Access) -> bool:
        """Each credential allows its level and those below; a level with no secret configured is
        open (INTERNAL under --insecure-internal, PUBLIC without API keys), ADMIN never."""
        if credential >= needed or needed is Access.OPEN:
            return True
        if needed is Access.INTERNAL:
            return self._security.internal_token is None
        return needed is Access.PUBLIC and not self._security.api_keys

    def refusal(self, method: str, bearer: str | None) -> tuple[grpc.StatusCode, str] | None:
        needed = required_access(method)
        credential = self.credential(bearer)
        if self.allows(credential, needed):
            return None
        if needed is Access.ADMIN and self._security.admin_key is None:
            return grpc.StatusCode.PERMISSION_DENIED, f"{method} is an admin RPC and no --admin-key is configured"
        what = {
            Access.PUBLIC: "an API key (or the internal token)",
            Access.INTERNAL: "the internal token",
            Access.ADMIN: "the admin key",
        }[needed]
        if credential is Access.OPEN:
            return grpc.StatusCode.UNAUTHENTICATED, f"{method} needs 'authorization: Bearer <key>' with {what}"
        return grpc.StatusCode.PERMISSION_DENIED, f"{method} needs {what}; this credential allows less"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        refused = self.refusal(details.method, bearer_of(details.invocation_metadata))
        if handler is None or refused is None:
            return handler
        return _refusing(handler, *refused)


def _refusing(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that ends the call with `code` before any work."""

    async def unary(request: Any, context: aio.ServicerContext) -> Any:
        await context.abort(code, message)

    async def stream(request: Any, context: aio.ServicerContext) -> Any:
        await context.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
    return grpc.stream_stream_rpc_method_handler(stream, **kwargs)


def server_interceptors(security: ServiceSecurity) -> list[aio.ServerInterceptor]:
    return [AuthInterceptor(security)]


# -- client side ----------------------------------------------------------------


def forwarded(context: aio.ServicerContext) -> tuple[tuple[str, str], ...]:
    """The caller's `authorization`, to pass on when a call is made on its behalf (the router's
    cache flush fans out to the engines with the admin key it was called with)."""
    return tuple((k, v) for k, v in context.invocation_metadata() or () if k == "authorization")


def _with_bearer(metadata: Any, bearer: str) -> Any:
    if any(key == "authorization" for key, _ in metadata or ()):
        return metadata
    return aio.Metadata(*(metadata or ()), ("authorization", f"Bearer {bearer}"))


class AuthorizedChannel(MetadataChannel):
    """An asyncio channel whose calls carry `authorization: Bearer <bearer>` unless they set their own."""

    def __init__(self, channel: aio.Channel, bearer: str) -> None:
        super().__init__(channel, functools.partial(_with_bearer, bearer=bearer))


def async_channel(address: str, credentials: ClientCredentials | None, options: list[tuple[str, Any]]) -> aio.Channel:
    """A plain or TLS asyncio channel that presents `credentials`."""
    credentials = credentials or ClientCredentials()
    if credentials.tls is not None:
        channel = aio.secure_channel(address, credentials.tls.channel_credentials(), options=options)
    else:
        channel = aio.insecure_channel(address, options=options)
    if credentials.bearer is None:
        return channel
    return cast(aio.Channel, AuthorizedChannel(channel, credentials.bearer))


class _BearerInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, bearer: str) -> None:
        self._bearer = bearer

    def _details(self, details: Any) -> Any:
        metadata = list(details.metadata or ())
        if not any(key == "authorization" for key, _ in metadata):
            metadata.append(("authorization", f"Bearer {self._bearer}"))
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def sync_channel(address: str, credentials: ClientCredentials | None, options: list[tuple[str, Any]]) -> grpc.Channel:
    """The blocking counterpart of `async_channel` (the launcher's probes, the blocking client)."""
    credentials = credentials or ClientCredentials()
    if credentials.tls is not None:
        channel = grpc.secure_channel(address, credentials.tls.channel_credentials(), options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    if credentials.bearer is None:
        return channel
    return grpc.intercept_channel(channel, _BearerInterceptor(credentials.bearer))
