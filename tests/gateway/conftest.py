"""A fake router (a real grpc.aio server on loopback) and clients of the gateway in front of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import httpx
import pytest
import uvicorn
from grpc import aio

from gateway.app import create_app
from gateway.config import GatewayConfig
from services.router.generate_streams import GenerateStreams
from turnout.v1 import (
    common_pb2,
    engine_pb2,
    inference_pb2,
    inference_pb2_grpc,
    router_admin_pb2,
    router_admin_pb2_grpc,
)

MakeClient = Callable[[GatewayConfig], AsyncIterator[httpx.AsyncClient]]
Script = Callable[[inference_pb2.GenerateRequest, aio.ServicerContext], AsyncIterator[inference_pb2.GenerateResponse]]


# The fake tokenizer: BOS, then one token per character.
BOS = 1
_CHAR_BASE = 100


def fake_encode(text: str, add_special_tokens: bool = True) -> list[int]:
    return ([BOS] if add_special_tokens else []) + [_CHAR_BASE + ord(c) for c in text]


def fake_decode(ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return "".join(("" if skip_special_tokens else "<s>") if i == BOS else chr(i - _CHAR_BASE) for i in ids)


def tok(token_id: int, logprob: float, text: str | None = None, *, rank: int = 1, raw: bytes | None = None) -> Any:
    """A TokenLogprob; `text` and `raw` (token_bytes) only when given, as the router sends them."""
    token = common_pb2.TokenLogprob(token_id=token_id, logprob=logprob, rank=rank)
    if text is not None:
        token.text = text
    if raw is not None:
        token.token_bytes = raw
    return token


def pos(token: Any, top: Sequence[Any] = (), requested: Sequence[Any] = ()) -> Any:
    """A PositionLogprobs: the token at the position, its alternatives, the requested ids."""
    return common_pb2.PositionLogprobs(token=token, top=top, requested=requested)


def chunk(
    index: int = 0,
    text: str = "",
    token_ids: tuple[int, ...] = (),
    completion: int = 0,
    logprobs: Sequence[Any] = (),
    **counts: int,
) -> Any:
    return inference_pb2.GenerateResponse(
        chunk=inference_pb2.GenerateChunk(
            index=index,
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            prompt_tokens=counts.get("prompt", 5),
            completion_tokens=completion,
            cached_tokens=counts.get("cached", 1),
        )
    )


def complete(
    index: int = 0,
    *,
    prompt: int = 5,
    completion: int = 3,
    cached: int = 1,
    input_logprobs: Sequence[Any] = (),
    **reason: Any,
) -> Any:
    """A Complete message; `reason` is one of token_id=, eos_token_id=, stop_str=, regex=, length=, abort=,
    or nothing (stop)."""
    if "length" in reason:
        finish = common_pb2.FinishReason(length=common_pb2.FinishReason.Length(length=reason["length"]))
    elif "abort" in reason:
        finish = common_pb2.FinishReason(abort=common_pb2.FinishReason.Abort(message=reason["abort"]))
    else:
        finish = common_pb2.FinishReason(stop=common_pb2.FinishReason.Stop(**reason))
    return inference_pb2.GenerateResponse(
        complete=inference_pb2.GenerateComplete(
            index=index,
            finish_reason=finish,
            usage=common_pb2.Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached),
            input_logprobs=input_logprobs,
        )
    )


async def default_script(
    request: inference_pb2.GenerateRequest, context: aio.ServicerContext
) -> AsyncIterator[inference_pb2.GenerateResponse]:
    """Every sample says "Hello world" in 3 tokens (the held-back empty chunk is deliberate) and stops on token 2."""
    n = request.sampling_params.n if request.sampling_params.HasField("n") else 1
    for i in range(n):
        yield chunk(i, "Hello", (11, 12), completion=2)
        yield chunk(i, "", (13,), completion=3)
        yield chunk(i, " world", (), completion=3)
    for i in range(n):
        yield complete(i, token_id=2)


class FakeRouter(inference_pb2_grpc.InferenceServicer):
    """Scripted `Inference` service that records what the gateway sent and whether it cancelled."""

    def __init__(self) -> None:
        self.address = ""
        self.requests: list[inference_pb2.GenerateRequest] = []
        self.tokenize_requests: list[inference_pb2.TokenizeRequest] = []
        self.detokenize_requests: list[inference_pb2.DetokenizeTextRequest] = []
        self.model_requests: list[str] = []
        self.models = [common_pb2.ModelInfo(name="tiny", path="/models/tiny", max_context_length=2048)]
        self.script: Script = default_script
        self.list_error: grpc.StatusCode | None = None
        self.cancelled = asyncio.Event()
        # GenerateStream calls opened (the gateway carries its Generate calls in them).
        self.carriers = 0
        self.admin = FakeAdmin()
        # Tokenize / Detokenize calls being answered at once, and the most seen (each waits
        # tokenizer_delay_s first, so concurrent calls overlap).
        self.tokenizer_calls_in_flight = 0
        self.most_tokenizer_calls_in_flight = 0
        self.tokenizer_delay_s = 0.0

    @contextlib.asynccontextmanager
    async def _tokenizer_call(self) -> AsyncIterator[None]:
        self.tokenizer_calls_in_flight += 1
        self.most_tokenizer_calls_in_flight = max(self.most_tokenizer_calls_in_flight, self.tokenizer_calls_in_flight)
        try:
            await asyncio.sleep(self.tokenizer_delay_s)
            yield
        finally:
            self.tokenizer_calls_in_flight -= 1

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.requests.append(request)
        if request.model and request.model not in {m.name for m in self.models}:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model '{request.model}' is not served")
        try:
            async for response in self.script(request, context):
                yield response
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def GenerateStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        """The gateway's carrier: each carried stream runs `Generate`, as the router's does."""
        self.carriers += 1
        async for message in GenerateStreams(self.Generate).serve(requests, context):
            yield message

    async def Tokenize(self, request: Any, context: Any) -> Any:
        self.tokenize_requests.append(request)
        async with self._tokenizer_call():
            return await self._tokenize(request, context)

    async def _tokenize(self, request: Any, context: Any) -> Any:
        if request.model and request.model not in {m.name for m in self.models}:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model '{request.model}' is not served")
        special = request.add_special_tokens if request.HasField("add_special_tokens") else True
        if request.WhichOneof("input") == "chat":
            # The fake chat template: "role: content" lines, then "assistant: " as the generation prompt.
            lines = [f"{m.role}: {m.content}" for m in request.chat.messages]
            if request.chat.options.add_generation_prompt:
                lines.append("assistant: ")
            text = "\n".join(lines)
        else:
            text = request.text
        ids = fake_encode(text, special)
        strs = [fake_decode([i], skip_special_tokens=False) for i in ids] if request.return_token_strs else []
        return inference_pb2.TokenizeResponse(
            input_ids=ids, prompt_text=text, max_model_len=self.models[0].max_context_length, token_strs=strs
        )

    async def Detokenize(self, request: Any, context: Any) -> Any:
        self.detokenize_requests.append(request)
        async with self._tokenizer_call():
            pass
        skip = request.skip_special_tokens if request.HasField("skip_special_tokens") else True
        return inference_pb2.DetokenizeTextResponse(text=fake_decode(request.token_ids, skip))

    async def GetTokenizerInfo(self, request: Any, context: Any) -> Any:
        if request.model and request.model not in {m.name for m in self.models}:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model '{request.model}' is not served")
        config = {"bos_token": "<s>", "model_max_length": 2048, "chat_template": "{{ messages }}"}
        return common_pb2.TokenizerInfo(tokenizer_class="PreTrainedTokenizerFast", config_json=json.dumps(config))

    async def ListModels(self, request: Any, context: Any) -> Any:
        if self.list_error is not None:
            await context.abort(self.list_error, "router is down")
        return inference_pb2.ListModelsResponse(models=self.models)

    async def GetModelInfo(self, request: Any, context: Any) -> Any:
        self.model_requests.append(request.model)
        for model in self.models:
            if model.name == request.model or not request.model:
                return model
        await context.abort(grpc.StatusCode.NOT_FOUND, f"model '{request.model}' is not served")


class FakeAdmin(router_admin_pb2_grpc.RouterAdminServicer):
    """The router's RouterAdmin: one engine, routable unless a test says otherwise."""

    def __init__(self) -> None:
        self.engines = [
            router_admin_pb2.EngineStatus(
                address="10.0.0.5:50051",
                model="tiny",
                health=router_admin_pb2.EngineStatus.HEALTH_HEALTHY,
                routable=True,
            )
        ]
        # Engine address -> why it did not flush; absent: it flushed.
        self.busy: dict[str, str] = {}
        self.flushes = 0
        # The `authorization` each FlushCache came with.
        self.authorizations: list[str] = []
        # The router's own counts of requests holding a slot and waiting for one.
        self.active_requests = 0
        self.queued_requests = 0

    async def ListEngines(self, request: Any, context: Any) -> Any:
        return router_admin_pb2.ListEnginesResponse(
            policy="round_robin",
            engines=self.engines,
            active_requests=self.active_requests,
            queued_requests=self.queued_requests,
        )

    async def FlushCache(self, request: engine_pb2.FlushCacheRequest, context: Any) -> Any:
        self.flushes += 1
        self.authorizations += [v for k, v in context.invocation_metadata() if k == "authorization"]
        results = [
            router_admin_pb2.EngineFlushResult(
                address=e.address, flushed=e.address not in self.busy, message=self.busy.get(e.address, "")
            )
            for e in self.engines
        ]
        return router_admin_pb2.FlushAllCachesResponse(engines=results)


@contextlib.asynccontextmanager
async def serving(fake: FakeRouter) -> AsyncIterator[FakeRouter]:
    """`fake` served over gRPC on a free port (its `address`) while the block runs."""
    server = aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(fake, server)
    router_admin_pb2_grpc.add_RouterAdminServicer_to_server(fake.admin, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    fake.address = f"127.0.0.1:{port}"
    try:
        yield fake
    finally:
        await server.stop(0)


@pytest.fixture
async def fake_router() -> AsyncIterator[FakeRouter]:
    async with serving(FakeRouter()) as fake:
        yield fake


async def _asgi_client(config: GatewayConfig) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            yield client


@pytest.fixture
async def client(fake_router: FakeRouter) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app driven in-process (no sockets for HTTP)."""
    async for c in _asgi_client(GatewayConfig(router_address=fake_router.address)):
        yield c


@pytest.fixture
def make_client() -> Callable[[GatewayConfig], AsyncIterator[httpx.AsyncClient]]:
    """For tests that need their own config: `async for c in make_client(config)`."""
    return _asgi_client


@pytest.fixture
async def live_gateway(fake_router: FakeRouter) -> AsyncIterator[str]:
    """The gateway behind real uvicorn on a free port, for tests that need a real disconnect."""
    app = create_app(GatewayConfig(router_address=fake_router.address))
    # A bounded graceful shutdown: a gateway that fails to end a request must fail the test, not hang it.
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task


def sse_events(body: str) -> list[Any]:
    """Parse an SSE body, checking the framing: only `data:` frames, [DONE] last and only there."""
    assert body.endswith("\n\n"), body[-50:]
    frames = body.split("\n\n")[:-1]
    assert all(f.startswith("data: ") and "\n" not in f for f in frames), frames
    payloads = [f[len("data: ") :] for f in frames]
    assert payloads[-1] == "[DONE]"
    assert "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]
