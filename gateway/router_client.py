"""The gateway's client of the router's public `turnout.v1.Inference` service.

While the router is down (restarting), a call waits up to `ready_timeout_s` for it, then fails
with HTTP 503 naming it (`connected`). The router can also die between that check and the call
(the channel still looked connected): the call then fails UNAVAILABLE with gRPC's transport text
before any response. Every call goes through `_call`, which then waits for the router as
`connected` does and tries the call once more; nothing reached the HTTP client yet, so nothing is
sent twice. A generate stream that fails after its first response is not retried (it surfaces in
`Generation.events`, past `_call`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from grpc import aio
from starlette.requests import Request

from gateway.errors import HTTPError
from gateway.generation import Generation
from turnout.channel_ready import first_ready
from turnout.generate_carrier import GenerateCarrier
from turnout.v1 import (
    common_pb2,
    engine_pb2,
    inference_pb2,
    inference_pb2_grpc,
    router_admin_pb2,
    router_admin_pb2_grpc,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RouterClient:
    """The stubs on the app's channel, and the deadline every call gets."""

    stub: inference_pb2_grpc.InferenceStub
    timeout_s: float | None
    admin: router_admin_pb2_grpc.RouterAdminStub | None = None
    # --served-model-name: names of the router's default model; the first is reported.
    aliases: tuple[str, ...] = ()
    # The stubs' channel, to wait up to `ready_timeout_s` for a router that is down (restarting)
    # before a call; None: no waiting.
    channel: aio.Channel | None = None
    address: str = ""
    ready_timeout_s: float = 0.0
    # Every Generate stream goes over one GenerateStream (turnout/generate_carrier.py).
    carrier: GenerateCarrier | None = None

    @classmethod
    def on_channel(
        cls,
        channel: aio.Channel,
        timeout_s: float | None,
        aliases: Sequence[str] = (),
        *,
        address: str = "",
        ready_timeout_s: float = 0.0,
    ) -> RouterClient:
        stub = inference_pb2_grpc.InferenceStub(channel)
        return cls(
            stub,
            timeout_s,
            router_admin_pb2_grpc.RouterAdminStub(channel),
            tuple(aliases),
            channel,
            address,
            ready_timeout_s,
            GenerateCarrier(stub),
        )

    async def close(self) -> None:
        """End the Generate carrier (before the channel closes)."""
        if self.carrier is not None:
            await self.carrier.close()

    async def connected(self, timeout_s: float | None = None) -> None:
        """Return at once while the router is connected; while it is down, wait for it up to the
        ready timeout (or `timeout_s`, if shorter), then raise HTTP 503 naming it. With no wait
        allowed, the call goes ahead (and fails at once if the router is down)."""
        wait_s = self._wait_s(timeout_s)
        if wait_s <= 0:
            return
        assert self.channel is not None
        if await first_ready([self.channel], 0, wait_s) is None:
            raise self._unreachable(f"waited {wait_s:g} s for it")

    async def _call(self, rpc: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T:
        """`rpc()` once the router is connected. A call failing UNAVAILABLE before any response (the
        router died after `connected` saw it up, or answered so itself, e.g. no engine healthy yet)
        waits for the router as `connected` does and is tried once more. Failing UNAVAILABLE again
        while the channel is not connected is the 503 naming the router; while it is, the router's
        own error stands. A client that may not wait (a probe) calls once."""
        await self.connected(timeout_s)
        try:
            return await rpc()
        except aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE or self._wait_s(timeout_s) <= 0:
                raise
            log.warning("router call failed before any response; trying once more", extra={"details": exc.details()})
        await self.connected(timeout_s)
        try:
            return await rpc()
        except aio.AioRpcError as exc:
            # Still connected: the router itself answered UNAVAILABLE (no healthy engine, ...); its words.
            if exc.code() is not grpc.StatusCode.UNAVAILABLE or self._router_connected():
                raise
            raise self._unreachable("it dropped the call again after coming back") from None

    def _wait_s(self, timeout_s: float | None) -> float:
        """How long a call may wait for the router (0: not at all)."""
        if self.channel is None:
            return 0.0
        return self.ready_timeout_s if timeout_s is None else min(timeout_s, self.ready_timeout_s)

    def _router_connected(self) -> bool:
        return self.channel is not None and self.channel.get_state() is grpc.ChannelConnectivity.READY

    def _unreachable(self, detail: str) -> HTTPError:
        return HTTPError(503, f"the router at {self.address} is not reachable (restarting?); {detail}")

    def probing(self) -> RouterClient:
        """This client for a probe: it tells how things are now, so it never waits for the router."""
        return dataclasses.replace(self, ready_timeout_s=0.0)

    def router_model(self, requested: str | None) -> str:
        """The name to send to the router: an alias becomes "" (the default model)."""
        return "" if not requested or requested in self.aliases else requested

    async def generate(self, requests: Sequence[inference_pb2.GenerateRequest]) -> Generation:
        # `start` returns once every call has its first response; until then a failure cancels them all
        # and nothing has reached the HTTP client, so all may start again. Later failures (in `events`)
        # are not retried: output has been sent.
        carrier = self.carrier
        assert carrier is not None, "RouterClient built without the Generate carrier"
        return await self._call(
            lambda: Generation.start(lambda request: carrier.generate(request, self.timeout_s), requests)
        )

    async def tokenize_request(self, request: inference_pb2.TokenizeRequest) -> inference_pb2.TokenizeResponse:
        request.model = self.router_model(request.model)
        return await self._call(lambda: self.stub.Tokenize(request, timeout=self.timeout_s))

    async def tokenize(self, model: str, text: str, add_special_tokens: bool | None) -> list[int]:
        """`text` as the router encodes a text prompt (`add_special_tokens` None: the router's default)."""
        request = inference_pb2.TokenizeRequest(model=model, text=text)
        if add_special_tokens is not None:
            request.add_special_tokens = add_special_tokens
        reply = await self._call(lambda: self.stub.Tokenize(request, timeout=self.timeout_s))
        return list(reply.input_ids)

    async def detokenize(
        self,
        model: str,
        token_ids: Sequence[int],
        skip_special_tokens: bool | None,
        spaces_between_special_tokens: bool | None = None,
    ) -> str:
        request = inference_pb2.DetokenizeTextRequest(model=model, token_ids=token_ids)
        if skip_special_tokens is not None:
            request.skip_special_tokens = skip_special_tokens
        if spaces_between_special_tokens is not None:
            request.spaces_between_special_tokens = spaces_between_special_tokens
        reply = await self._call(lambda: self.stub.Detokenize(request, timeout=self.timeout_s))
        return reply.text

    async def tokenizer_info(self, model: str | None) -> common_pb2.TokenizerInfo:
        request = inference_pb2.TokenizerInfoRequest(model=self.router_model(model))
        return await self._call(lambda: self.stub.GetTokenizerInfo(request, timeout=self.timeout_s))

    async def list_models(self, timeout_s: float | None = None) -> list[common_pb2.ModelInfo]:
        request = inference_pb2.ListModelsRequest()
        reply = await self._call(lambda: self.stub.ListModels(request, timeout=timeout_s or self.timeout_s), timeout_s)
        return list(reply.models)

    async def model_info(self, model: str = "", timeout_s: float | None = None) -> common_pb2.ModelInfo:
        """The named model (an alias: the default one), or the default one for an empty name; NOT_FOUND
        when unknown."""
        request = inference_pb2.ModelInfoRequest(model=self.router_model(model))
        return await self._call(lambda: self.stub.GetModelInfo(request, timeout=timeout_s or self.timeout_s), timeout_s)

    async def list_engines(self, timeout_s: float | None = None) -> router_admin_pb2.ListEnginesResponse:
        """The router's engines with their health, load and counters (RouterAdmin.ListEngines)."""
        admin = self.admin
        assert admin is not None, "RouterClient built without the admin stub"
        request = router_admin_pb2.ListEnginesRequest()
        return await self._call(lambda: admin.ListEngines(request, timeout=timeout_s or self.timeout_s), timeout_s)

    async def model_name(self, requested: str | None) -> str:
        """The name to report in responses: the one asked for, else the default model's (its first
        alias when it has some, as vLLM reports the first --served-model-name)."""
        if self.aliases and (not requested or requested in self.aliases):
            return self.aliases[0]
        if requested:
            return requested
        return (await self.model_info("")).name

    async def flush_cache(self, admin_key: str) -> router_admin_pb2.FlushAllCachesResponse:
        """Drop every engine's prefix cache (RouterAdmin.FlushCache), as the caller holding `admin_key`
        (the router and each engine check it)."""
        admin = self.admin
        assert admin is not None, "RouterClient built without the admin stub"
        metadata = (("authorization", f"Bearer {admin_key}"),)
        request = engine_pb2.FlushCacheRequest()
        return await self._call(lambda: admin.FlushCache(request, timeout=self.timeout_s, metadata=metadata))

    async def load_lora_adapter(self, admin_key: str, name: str, path: str) -> None:
        """RouterAdmin.LoadLoraAdapter as the caller holding `admin_key` (the router and each engine check it)."""
        admin = self.admin
        assert admin is not None, "RouterClient built without the admin stub"
        metadata = (("authorization", f"Bearer {admin_key}"),)
        request = engine_pb2.LoadLoraAdapterRequest(lora_name=name, lora_path=path)
        await self._call(lambda: admin.LoadLoraAdapter(request, timeout=self.timeout_s, metadata=metadata))

    async def unload_lora_adapter(self, admin_key: str, name: str) -> None:
        """RouterAdmin.UnloadLoraAdapter, as load_lora_adapter."""
        admin = self.admin
        assert admin is not None, "RouterClient built without the admin stub"
        metadata = (("authorization", f"Bearer {admin_key}"),)
        request = engine_pb2.UnloadLoraAdapterRequest(lora_name=name)
        await self._call(lambda: admin.UnloadLoraAdapter(request, timeout=self.timeout_s, metadata=metadata))


def router_of(request: Request) -> RouterClient:
    """The client `create_app` put on the app state."""
    client: RouterClient = request.app.state.router
    return client
