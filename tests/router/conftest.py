"""An in-process router (the real RouterRuntime and servicers on a loopback gRPC server)
in front of scripted fake engines and a fake tokenizer, each a real grpc.aio server.

Fake engines stream `tokens` token ids (100, 101, ...) one chunk each, or scripted
`outputs` (one list of token ids per sample), each chunk with the sampled token's
logprob (-id / 1000), and can be told to batch `steps_per_message` steps per message
(as the real engine does for a reader that lags),
told to fail before output, fail after k tokens, hold their stream open until
released, or be stopped and started again on the same port, as a killed and
restarted engine would be.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.engine.generate_stream import GenerateStreams
from services.router.config import RouterConfig
from services.router.engine_discovery import Resolver, resolve_dns
from services.router.runtime import RouterRuntime
from services.tokenizer.detokenize_streams import DetokenizeStreams
from services.tokenizer.encode_streams import EncodeStreams
from turnout.errors import StatusInterceptor, TurnoutError
from turnout.v1 import (
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    router_admin_pb2,
    router_admin_pb2_grpc,
    tokenizer_pb2,
    tokenizer_pb2_grpc,
)

MODEL = "fake-model"


class _Refusal(TurnoutError):
    """A fake engine's scripted failure: the status its Generate ends with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class FakeEngine(engine_pb2_grpc.EngineServicer):
    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0
        self.tokens = 3
        # Scripted output: sample i streams outputs[i % len(outputs)], one token id per chunk.
        self.outputs: list[list[int]] | None = None
        self.token_delay_s = 0.0
        # Steps sent together in one message (the first response, then the rest in `batch`).
        self.steps_per_message = 1
        # Fail every Generate with this status before any output.
        self.fail: grpc.StatusCode | None = None
        # Fail with INTERNAL after this many tokens.
        self.fail_after: int | None = None
        # While set, streams wait before their last message until it is released.
        self.hold: asyncio.Event | None = None
        self.received: list[engine_pb2.EngineGenerateRequest] = []
        # How many commands each GenerateStream message carried.
        self.command_messages: list[int] = []
        self.active = 0
        self.cancelled = 0
        self._server: aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        # The router's path: Generate requests over one GenerateStream, served as the engine serves it.
        self._streams = GenerateStreams(self._generate)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = aio.server()
        engine_pb2_grpc.add_EngineServicer_to_server(self, server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._server = server

    async def stop(self) -> None:
        """Stop at once, as a killed process would: open streams break."""
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def set_serving(self, serving: bool) -> None:
        assert self._health is not None
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self._health.set("", status)

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            async for response in self._generate(request):
                yield response
        except _Refusal as exc:
            await context.abort(exc.code, str(exc))

    async def GenerateStream(self, commands: Any, context: Any) -> AsyncIterator[Any]:
        async for outputs in self._streams.serve(self._counted(commands)):
            yield outputs

    async def _counted(self, messages: Any) -> AsyncIterator[Any]:
        async for message in messages:
            self.command_messages.append(len(message.items))
            yield message

    async def _generate(self, request: Any) -> AsyncIterator[Any]:
        self.received.append(request)
        self.active += 1
        try:
            if self.fail is not None:
                raise _Refusal(self.fail, f"{self.name} fails on purpose")
            n = request.sampling_params.n if request.sampling_params.HasField("n") else 1
            outputs = [self.outputs[index % len(self.outputs)] for index in range(n)] if self.outputs else None
            length = max(len(o) for o in outputs) if outputs else self.tokens
            ready: list[engine_pb2.EngineGenerateResponse] = []
            for i in range(length):
                if self.fail_after is not None and i == self.fail_after:
                    raise _Refusal(grpc.StatusCode.INTERNAL, f"{self.name} broke mid-stream")
                await asyncio.sleep(self.token_delay_s)
                for index in range(n):
                    if outputs is not None and i >= len(outputs[index]):
                        continue
                    token = outputs[index][i] if outputs else 100 + i
                    logprob = common_pb2.PositionLogprobs(
                        token=common_pb2.TokenLogprob(token_id=token, logprob=-token / 1000)
                    )
                    ready.append(
                        engine_pb2.EngineGenerateResponse(
                            chunk=engine_pb2.EngineChunk(
                                index=index,
                                token_ids=[token],
                                logprobs=[logprob],
                                prompt_tokens=len(request.input_ids),
                                completion_tokens=i + 1,
                            )
                        )
                    )
                if (i + 1) % self.steps_per_message == 0 or i == length - 1:
                    first, *rest = ready
                    first.batch.extend(rest)
                    ready = []
                    yield first
            if self.hold is not None:
                await self.hold.wait()
            for index in range(n):
                done = len(outputs[index]) if outputs else self.tokens
                usage = common_pb2.Usage(prompt_tokens=len(request.input_ids), completion_tokens=done)
                finish = common_pb2.FinishReason(length=common_pb2.FinishReason.Length(length=done))
                yield engine_pb2.EngineGenerateResponse(
                    complete=engine_pb2.EngineComplete(index=index, finish_reason=finish, usage=usage)
                )
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def GetModelInfo(self, request: Any, context: Any) -> Any:
        return common_pb2.ModelInfo(name=MODEL, max_context_length=4096)

    async def GetLoad(self, request: Any, context: Any) -> Any:
        return engine_pb2.Load(running_requests=self.active)


class FakeTokenizer(tokenizer_pb2_grpc.TokenizerServicer):
    """Encode: one token per character. Detokenize: token t becomes the text "<t>"."""

    def __init__(self) -> None:
        self.streams = 0
        # The router's path: every sample's Detokenize stream carried by one, served as the tokenizer serves it.
        self._carried = DetokenizeStreams(lambda requests: self.Detokenize(requests, None))
        self._carried_encodes = EncodeStreams(lambda request: self.Encode(request, None))

    async def DetokenizeStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        async for answers in self._carried.serve(requests):
            yield answers

    async def EncodeStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        async for answers in self._carried_encodes.serve(requests):
            yield answers

    async def Encode(self, request: Any, context: Any) -> Any:
        return tokenizer_pb2.EncodeResponse(input_ids=[ord(c) for c in request.text])

    async def Detokenize(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        self.streams += 1
        async for request in request_iterator:
            if request.WhichOneof("kind") == "start":
                yield tokenizer_pb2.DetokenizeResponse()  # accepted
            elif request.tokens.step_sizes:  # several steps: one answer each
                ids, steps = list(request.tokens.token_ids), []
                for size in request.tokens.step_sizes:
                    steps.append(tokenizer_pb2.DetokenizeResponse(text="".join(f"<{t}>" for t in ids[:size])))
                    ids = ids[size:]
                yield tokenizer_pb2.DetokenizeResponse(steps=steps)
            else:
                yield tokenizer_pb2.DetokenizeResponse(text="".join(f"<{t}>" for t in request.tokens.token_ids))


# Fast enough for tests: checks every 50 ms, two failures mark an engine down.
FAST = {
    "health_check_interval_s": 0.05,
    "health_check_timeout_s": 0.5,
    "health_failure_threshold": 2,
    "health_success_threshold": 1,
    "load_poll_interval_s": 0.0,
    "retry_backoff_s": 0.0,
    "circuit_breaker_cooldown_s": 60.0,
}


@dataclasses.dataclass
class Cluster:
    engines: list[FakeEngine]
    runtime: RouterRuntime
    inference: inference_pb2_grpc.InferenceStub
    admin: router_admin_pb2_grpc.RouterAdminStub
    tokenizer: FakeTokenizer

    async def generate(self, prompt: str = "hello", **params: Any) -> list[inference_pb2.GenerateResponse]:
        request = inference_pb2.GenerateRequest(text=prompt, sampling_params=common_pb2.SamplingParams(**params))
        return [r async for r in self.inference.Generate(request)]

    def by_engine(self) -> list[int]:
        return [len(e.received) for e in self.engines]

    async def statuses(self) -> dict[str, router_admin_pb2.EngineStatus]:
        reply = await self.admin.ListEngines(router_admin_pb2.ListEnginesRequest())
        return {s.address: s for s in reply.engines}

    async def wait_routable(self, count: int | None = None, timeout_s: float = 5.0) -> None:
        want = len(self.engines) if count is None else count
        await eventually(lambda: len(self.runtime.engines.routable(MODEL)) == want, timeout_s)


async def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.02)


def text_of(responses: list[inference_pb2.GenerateResponse]) -> str:
    return "".join(r.chunk.text for r in responses if r.WhichOneof("kind") == "chunk")


def finish_of(responses: list[inference_pb2.GenerateResponse]) -> list[common_pb2.FinishReason]:
    return [r.complete.finish_reason for r in responses if r.WhichOneof("kind") == "complete"]


@pytest.fixture
async def make_cluster() -> AsyncIterator[Callable[..., Any]]:
    """`await make_cluster(n, **config)`: n fake engines behind a real in-process router."""
    stack: list[tuple[list[FakeEngine], RouterRuntime, aio.Server, aio.Server, list[aio.Channel]]] = []

    async def make(
        n: int = 3,
        *,
        wait: bool = True,
        targets: tuple[str, ...] | None = None,
        resolver: Resolver = resolve_dns,
        tokenizer_servicer: tokenizer_pb2_grpc.TokenizerServicer | None = None,
        **config: Any,
    ) -> Cluster:
        """`tokenizer_servicer`: serve this one (e.g. the real TokenizerServicer) instead of a FakeTokenizer."""
        engines = [FakeEngine(f"engine{i}") for i in range(n)]
        for engine in engines:
            await engine.start()
        tokenizer_server = aio.server(interceptors=[StatusInterceptor()])
        tokenizer = FakeTokenizer()
        tokenizer_pb2_grpc.add_TokenizerServicer_to_server(tokenizer_servicer or tokenizer, tokenizer_server)
        tokenizer_port = tokenizer_server.add_insecure_port("127.0.0.1:0")
        await tokenizer_server.start()
        settings = {**FAST, **config}
        router_config = RouterConfig(
            engines=tuple(e.address for e in engines) if targets is None else targets,
            tokenizers=(f"127.0.0.1:{tokenizer_port}",),
            **settings,
        )
        runtime = RouterRuntime(router_config, resolver)
        await runtime.start()
        server = aio.server(interceptors=[StatusInterceptor()])
        for spec in runtime.services():
            spec.add(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = aio.insecure_channel(f"127.0.0.1:{port}")
        stack.append((engines, runtime, server, tokenizer_server, [channel]))
        cluster = Cluster(
            engines,
            runtime,
            inference_pb2_grpc.InferenceStub(channel),
            router_admin_pb2_grpc.RouterAdminStub(channel),
            tokenizer,
        )
        if wait:
            await cluster.wait_routable()
        return cluster

    yield make
    for engines, runtime, server, tokenizer_server, channels in stack:
        for channel in channels:
            await channel.close()
        await server.stop(0)
        await runtime.close()
        await tokenizer_server.stop(0)
        for engine in engines:
            if engine.hold is not None:
                engine.hold.set()
            await engine.stop()
