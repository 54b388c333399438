"""SGLang-native routes: `/generate`, `/health`, `/get_model_info`.

`/generate` answers one output object for one prompt with one sample, and a
list (prompt-major, `n` per prompt) otherwise; stream events then carry
`index`. Streamed `text` and `output_ids` are cumulative, as SGLang sends them.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from grpc import aio

from gateway import convert, sse
from gateway.errors import HTTPError, error_response, to_http_error
from gateway.generation import Generation, Sample, unless_disconnected
from gateway.protocol import NativeGenerateRequest
from gateway.router_client import router_of
from turnout.v1 import common_pb2

router = APIRouter()

# A health probe must answer quickly even when the router does not.
HEALTH_TIMEOUT_S = 5.0


def finish_reason(reason: common_pb2.FinishReason | None) -> dict[str, Any] | None:
    """SGLang's finish_reason object; None while the sample is still running."""
    if reason is None:
        return None
    kind = reason.WhichOneof("kind")
    if kind == "stop":
        matched = reason.stop.WhichOneof("matched")
        return {"type": "stop", "matched": getattr(reason.stop, matched) if matched else None}
    if kind == "length":
        return {"type": "length", "length": reason.length.length}
    return {"type": "abort", "message": reason.abort.message}


def _output(sample: Sample, sample_id: str) -> dict[str, Any]:
    return {
        "text": sample.text,
        "output_ids": list(sample.token_ids),
        "meta_info": {
            "id": sample_id,
            "finish_reason": finish_reason(sample.finish_reason),
            "prompt_tokens": sample.prompt_tokens,
            "completion_tokens": sample.completion_tokens,
            "cached_tokens": sample.cached_tokens,
            "e2e_latency": round(sample.latency_s, 6),
        },
    }


@router.post("/generate")
async def generate(body: NativeGenerateRequest, request: Request) -> Response:
    messages, is_batch = convert.native_requests(body)
    for message in messages:
        message.request_id = message.request_id or uuid.uuid4().hex
    generation = await unless_disconnected(request, router_of(request).generate(messages))
    listed = is_batch or len(generation.samples) > 1

    def sample_id(sample: Sample) -> str:
        rid = messages[sample.prompt].request_id
        n = messages[sample.prompt].sampling_params.n
        return f"{rid}-{sample.local_index}" if n > 1 else rid

    if body.stream:
        events = _stream(generation, sample_id, listed)
        return sse.SSEResponse(sse.frames(events), on_close=generation.cancel)
    samples = await unless_disconnected(request, generation.collect())
    outputs = [_output(s, sample_id(s)) for s in samples]
    return JSONResponse(outputs if listed else outputs[0])


async def _stream(
    generation: Generation, sample_id: Callable[[Sample], str], listed: bool
) -> AsyncGenerator[dict[str, Any], None]:
    async with contextlib.aclosing(generation.events()) as events:
        async for event in events:
            out = _output(event.sample, sample_id(event.sample))
            if listed:
                out["index"] = event.sample.index
            yield out


@router.get("/health")
async def health(request: Request) -> Response:
    """200 when the router answers and serves a model, else 503."""
    try:
        models = await router_of(request).list_models(timeout_s=HEALTH_TIMEOUT_S)
    except aio.AioRpcError as exc:
        return error_response(HTTPError(503, f"router is not healthy: {to_http_error(exc).message}"))
    if not models:
        return error_response(HTTPError(503, "router serves no model"))
    return Response(status_code=200)


@router.get("/get_model_info")
async def get_model_info(request: Request) -> dict[str, Any]:
    info = await router_of(request).model_info("")
    # The contract has no separate tokenizer path: the tokenizer is loaded from the model's directory.
    return {"model_path": info.path, "tokenizer_path": info.path, "is_generation": True}
