"""The Engine gRPC servicer: converts protobuf and delegates to the engine core."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from grpc import aio
from opentelemetry import trace

from services.engine.config import EngineConfig
from services.engine.convert import load_to_proto, outputs_into, outputs_to_proto, request_from_proto
from services.engine.engine_loop import EngineLoop
from services.engine.generate_stream import GenerateStreams
from services.engine.model_loader import LoadedModel
from services.engine.request import EngineOutput
from turnout.telemetry.engine_metrics import RequestTimeline
from turnout.telemetry.request_context import set_request_id
from turnout.v1 import common_pb2, engine_pb2, engine_pb2_grpc

log = logging.getLogger(__name__)


class EngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(self, loaded: LoadedModel, engine: EngineLoop, config: EngineConfig) -> None:
        self._loaded = loaded
        self._engine = engine
        self._config = config
        # Carried, a request's outputs are written straight into the stream's next message.
        self._streams = GenerateStreams(self._outputs, write=outputs_into)

    def drain(self) -> None:
        """The server is stopping: GenerateStream calls take no new requests and end once idle."""
        self._streams.drain()

    async def Generate(
        self, request: engine_pb2.EngineGenerateRequest, context: aio.ServicerContext
    ) -> AsyncIterator[engine_pb2.EngineGenerateResponse]:
        async for outputs in self._outputs(request):
            yield outputs_to_proto(outputs)

    async def GenerateStream(
        self, commands: AsyncIterator[engine_pb2.EngineStreamCommands], context: aio.ServicerContext
    ) -> AsyncIterator[engine_pb2.EngineStreamOutputs]:
        async for outputs in self._streams.serve(commands):
            yield outputs

    async def _outputs(self, request: engine_pb2.EngineGenerateRequest) -> AsyncIterator[list[EngineOutput]]:
        """One request's outputs, a response's worth at a time, whether it came as a Generate call or over
        GenerateStream."""
        # Logs and traces show the caller's id; `request_id` (unique) is the engine's key.
        shown_id = request.external_request_id or request.request_id
        set_request_id(shown_id)
        engine_request = request_from_proto(request, self._loaded, self._config, self._engine.engine.processors)
        # The stack's line per request is the router's (`generated`, at the end, with the engine's id,
        # tokens and status); this one is for debugging an engine (a JSON line costs ~35 us of CPU).
        log.debug(
            "generate",
            extra={
                "request_id": shown_id,
                "engine_request_id": request.request_id,
                "prompt_tokens": len(request.input_ids),
            },
        )
        # A cancelled call cancels this generator; closing engine.generate_batches() aborts the request.
        # One message per batch: what became ready while this call's reader lagged goes out together.
        priority = request.priority if request.HasField("priority") else 0
        timeline = RequestTimeline()
        last: EngineOutput | None = None
        try:
            async for outputs in self._engine.generate_batches(engine_request, priority, timeline):
                last = outputs[-1]
                yield outputs
        finally:
            _annotate_span(shown_id, timeline, last)

    async def Abort(self, request: engine_pb2.AbortRequest, context: aio.ServicerContext) -> engine_pb2.AbortResponse:
        return engine_pb2.AbortResponse(aborted=self._engine.abort(request.request_id, tuple(request.indices)))

    async def GetModelInfo(
        self, request: engine_pb2.GetModelInfoRequest, context: aio.ServicerContext
    ) -> common_pb2.ModelInfo:
        info = common_pb2.ModelInfo()
        info.CopyFrom(self._loaded.info)
        info.lora_enabled = self._config.enable_lora
        for name, path in self._engine.engine.lora_adapters():
            info.lora_adapters.add(name=name, path=path)
        return info

    async def LoadLoraAdapter(
        self, request: engine_pb2.LoadLoraAdapterRequest, context: aio.ServicerContext
    ) -> engine_pb2.LoadLoraAdapterResponse:
        engine = self._engine.engine
        await self._engine.call(lambda: engine.load_lora(request.lora_name, request.lora_path))
        log.info("lora adapter loaded", extra={"lora_name": request.lora_name, "lora_path": request.lora_path})
        return engine_pb2.LoadLoraAdapterResponse()

    async def UnloadLoraAdapter(
        self, request: engine_pb2.UnloadLoraAdapterRequest, context: aio.ServicerContext
    ) -> engine_pb2.UnloadLoraAdapterResponse:
        engine = self._engine.engine
        await self._engine.call(lambda: engine.unload_lora(request.lora_name))
        log.info("lora adapter unloaded", extra={"lora_name": request.lora_name})
        return engine_pb2.UnloadLoraAdapterResponse()

    async def GetLoad(self, request: engine_pb2.GetLoadRequest, context: aio.ServicerContext) -> engine_pb2.Load:
        return load_to_proto(self._engine.load())

    async def FlushCache(
        self, request: engine_pb2.FlushCacheRequest, context: aio.ServicerContext
    ) -> engine_pb2.FlushCacheResponse:
        if await self._engine.flush_cache():
            log.info("prefix cache flushed")
            return engine_pb2.FlushCacheResponse(flushed=True)
        load = self._engine.load()
        busy = f"{load.running + load.waiting} requests running or waiting hold KV blocks"
        return engine_pb2.FlushCacheResponse(flushed=False, message=f"not flushed: {busy}")


def _annotate_span(request_id: str, timeline: RequestTimeline, last: EngineOutput | None) -> None:
    """The call's span (when tracing) gets the request's stages as events at the times the step loop saw them."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("turnout.request_id", request_id)
    span.add_event("queued", timestamp=timeline.queued_ns)
    if timeline.scheduled_ns is not None:
        span.add_event("scheduled", {"queue_time_s": timeline.queue_time_s or 0.0}, timestamp=timeline.scheduled_ns)
    if timeline.first_token_ns is not None:
        span.add_event("first_token", {"ttft_s": timeline.ttft_s or 0.0}, timestamp=timeline.first_token_ns)
    if last is None:
        return
    span.set_attributes(
        {
            "turnout.prompt_tokens": last.prompt_tokens,
            "turnout.completion_tokens": last.completion_tokens,
            "turnout.cached_tokens": last.cached_tokens,
        }
    )
    if timeline.finished_ns is not None and last.finish is not None:
        attributes = {"finish_reason": last.finish.kind, "completion_tokens": last.completion_tokens}
        span.add_event("finished", attributes, timestamp=timeline.finished_ns)
