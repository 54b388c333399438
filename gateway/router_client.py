"""The gateway's client of the router's public `turnout.v1.Inference` service."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from grpc import aio
from starlette.requests import Request

from gateway.errors import HTTPError
from gateway.generation import Generation
from turnout.channel_ready import first_ready
from turnout.v1 import (
    common_pb2,
    engine_pb2,
    inference_pb2,
    inference_pb2_grpc,
    router_admin_pb2,
    router_admin_pb2_grpc,
)


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
        return cls(
            inference_pb2_grpc.InferenceStub(channel),
            timeout_s,
            router_admin_pb2_grpc.RouterAdminStub(channel),
            tuple(aliases),
            channel,
            address,
            ready_timeout_s,
        )

    async def connected(self, timeout_s: float | None = None) -> None:
        """Return at once while the router is connected; while it is down, wait for it up to the
        ready timeout (or `timeout_s`, if shorter), then raise HTTP 503 naming it. With no wait
        allowed, the call goes ahead (and fails at once if the router is down)."""
        wait_s = self.ready_timeout_s if timeout_s is None else min(timeout_s, self.ready_timeout_s)
        if self.channel is None or wait_s <= 0:
            return
        if await first_ready([self.channel], 0, wait_s) is None:
            raise HTTPError(
                503, f"the router at {self.address} is not reachable (restarting?); waited {wait_s:g} s for it"
            )

    def probing(self) -> RouterClient:
        """This client for a probe: it tells how things are now, so it never waits for the router."""
        return dataclasses.replace(self, ready_timeout_s=0.0)

    def router_model(self, requested: str | None) -> str:
        """The name to send to the router: an alias becomes "" (the default model)."""
        return "" if not requested or requested in self.aliases else requested

    async def generate(self, requests: Sequence[inference_pb2.GenerateRequest]) -> Generation:
        await self.connected()
        return await Generation.start(self.stub, requests, self.timeout_s)

    async def tokenize_request(self, request: inference_pb2.TokenizeRequest) -> inference_pb2.TokenizeResponse:
        request.model = self.router_model(request.model)
        await self.connected()
        return await self.stub.Tokenize(request, timeout=self.timeout_s)

    async def tokenize(self, model: str, text: str, add_special_tokens: bool | None) -> list[int]:
        """`text` as the router encodes a text prompt (`add_special_tokens` None: the router's default)."""
        request = inference_pb2.TokenizeRequest(model=model, text=text)
        if add_special_tokens is not None:
            request.add_special_tokens = add_special_tokens
        await self.connected()
        reply = await self.stub.Tokenize(request, timeout=self.timeout_s)
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
        await self.connected()
        reply = await self.stub.Detokenize(request, timeout=self.timeout_s)
        return reply.text

    async def tokenizer_info(self, model: str | None) -> common_pb2.TokenizerInfo:
        request = inference_pb2.TokenizerInfoRequest(model=self.router_model(model))
        await self.connected()
        return await self.stub.GetTokenizerInfo(request, timeout=self.timeout_s)

    async def list_models(self, timeout_s: float | None = None) -> list[common_pb2.ModelInfo]:
        await self.connected(timeout_s)
        reply = await self.stub.ListModels(inference_pb2.ListModelsRequest(), timeout=timeout_s or self.timeout_s)
        return list(reply.models)

    async def model_info(self, model: str = "", timeout_s: float | None = None) -> common_pb2.ModelInfo:
        """The named model (an alias: the default one), or the default one for an empty name; NOT_FOUND
        when unknown."""
        request = inference_pb2.ModelInfoRequest(model=self.router_model(model))
        await self.connected(timeout_s)
        return await self.stub.GetModelInfo(request, timeout=timeout_s or self.timeout_s)

    async def list_engines(self, timeout_s: float | None = None) -> router_admin_pb2.ListEnginesResponse:
        """The router's engines with their health, load and counters (RouterAdmin.ListEngines)."""
        assert self.admin is not None, "RouterClient built without the admin stub"
        request = router_admin_pb2.ListEnginesRequest()
        await self.connected(timeout_s)
        return await self.admin.ListEngines(request, timeout=timeout_s or self.timeout_s)

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
        assert self.admin is not None, "RouterClient built without the admin stub"
        await self.connected()
        metadata = (("authorization", f"Bearer {admin_key}"),)
        return await self.admin.FlushCache(engine_pb2.FlushCacheRequest(), timeout=self.timeout_s, metadata=metadata)

    async def load_lora_adapter(self, admin_key: str, name: str, path: str) -> None:
        """RouterAdmin.LoadLoraAdapter as the caller holding `admin_key` (the router and each engine check it)."""
        assert self.admin is not None, "RouterClient built without the admin stub"
        await self.connected()
        metadata = (("authorization", f"Bearer {admin_key}"),)
        request = engine_pb2.LoadLoraAdapterRequest(lora_name=name, lora_path=path)
        await self.admin.LoadLoraAdapter(request, timeout=self.timeout_s, metadata=metadata)

    async def unload_lora_adapter(self, admin_key: str, name: str) -> None:
        """RouterAdmin.UnloadLoraAdapter, as load_lora_adapter."""
        assert self.admin is not None, "RouterClient built without the admin stub"
        await self.connected()
        metadata = (("authorization", f"Bearer {admin_key}"),)
        request = engine_pb2.UnloadLoraAdapterRequest(lora_name=name)
        await self.admin.UnloadLoraAdapter(request, timeout=self.timeout_s, metadata=metadata)


def router_of(request: Request) -> RouterClient:
    """The client `create_app` put on the app state."""
    client: RouterClient = request.app.state.router
    return client
