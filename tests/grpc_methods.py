"""Every RPC Turnout serves, read from the generated descriptors, and a way to call any of them
with an empty request: the security tests walk them all, so a new RPC cannot escape its check."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass
from grpc import aio
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

import turnout.v1


@dataclass(frozen=True)
class Rpc:
    service: str  # full name, e.g. turnout.v1.Engine
    descriptor: MethodDescriptor

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.descriptor.name}"


def turnout_services() -> list[ServiceDescriptor]:
    """Every service of every generated module in turnout/v1 (a new .proto file is included too)."""
    services = []
    for module in pkgutil.iter_modules(turnout.v1.__path__):
        if module.name.endswith("_pb2"):
            file = importlib.import_module(f"turnout.v1.{module.name}").DESCRIPTOR
            services += list(file.services_by_name.values())
    return services


def standard_services() -> list[ServiceDescriptor]:
    """The services `grpc_server.serve` adds to every server."""
    return [
        health_pb2.DESCRIPTOR.services_by_name["Health"],
        reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
    ]


def rpcs(service: ServiceDescriptor) -> list[Rpc]:
    return [Rpc(service.full_name, method) for method in service.methods]


async def call(channel: aio.Channel, rpc: Rpc, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    """Call `rpc` with one empty request (none on a request stream) and return the status it ends
    with (OK when it answers)."""
    method = rpc.descriptor
    request_class = GetMessageClass(method.input_type)
    response_class = GetMessageClass(method.output_type)
    kind = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }[(method.client_streaming, method.server_streaming)]
    stub: Any = kind(
        rpc.path, request_serializer=request_class.SerializeToString, response_deserializer=response_class.FromString
    )
    request = request_class()
    # A request stream sends no message: when the server ends the call before reading (a refused
    # credential), a write that races its status makes grpc.aio's client report INTERNAL "Internal
    # error from Core" in place of the server's status (grpc/grpc#36066), a few calls in a hundred.
    argument: Any = iter([]) if method.client_streaming else request
    try:
        result = stub(argument, metadata=metadata, timeout=10)
        if method.server_streaming:
            async for _ in result:
                break
            result.cancel()
        else:
            await result
    except aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK
