"""SGLang-native routes: `/generate` and `/get_model_info` (the probes and server state are `server_api`).

`/generate` answers one output object for one prompt with one sample, and a
list (prompt-major, `n` per prompt) otherwise; stream events then carry
`index`. Streamed `text`, `output_ids` and `meta_info`'s logprobs are
cumulative, as SGLang sends them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway import convert, request_id, sse
from gateway.batch_limit import check_batch_size, gather_bounded
from gateway.cumulative_json import CumulativeEvents
from gateway.generation import Generation, Sample, unless_disconnected
from gateway.hidden_states import sglang_hidden_states
from gateway.logprobs_format import sglang_logprobs
from gateway.prompts import Prompt, look_up, starts_at_zero
from gateway.protocol import NativeGenerateRequest
from gateway.router_client import router_of
from turnout.v1 import common_pb2, inference_pb2

router = APIRouter()


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


def _meta_info(
    sample: Sample, sample_id: str, request: inference_pb2.GenerateRequest, prompt: Prompt
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": sample_id,
        "finish_reason": finish_reason(sample.finish_reason),
        "prompt_tokens": sample.prompt_tokens,
        "completion_tokens": sample.completion_tokens,
        "cached_tokens": sample.cached_tokens,
    }
    if request.logprob_options.return_logprob:
        # The prompt's positions come with the end of the sample: empty lists until then.
        first = prompt.first if sample.finish_reason is not None else None
        meta.update(sglang_logprobs(sample.logprobs, sample.input_logprobs, first, request.logprob_options))
    if request.return_hidden_states:
        meta["hidden_states"] = sglang_hidden_states(sample.hidden_states, sample.prompt_tokens)
    meta["e2e_latency"] = round(sample.latency_s, 6)
    return meta


@router.post("/generate")
async def generate(body: NativeGenerateRequest, request: Request) -> Response:
    messages, is_batch = convert.native_requests(body)
    check_batch_size(request, len(messages), "text" if body.text is not None else "input_ids")
    chosen = request_id.begin(request, body, body.rid if isinstance(body.rid, str) else None)
    header_id = request.headers.get(request_id.HEADER)
    client = router_of(request)
    for i, message in enumerate(messages):
        # The header wins over `rid`; prompts of a batch without their own rid get `{id}-{i}`.
        if header_id or not message.request_id:
            message.request_id = f"{chosen}-{i}" if is_batch else chosen
        message.model = client.router_model(message.model)

    async def begin() -> tuple[list[Prompt], Generation]:
        prompts = await gather_bounded(
            look_up(
                client,
                m,
                text=False,
                first=m.logprob_options.return_logprob and starts_at_zero(m),
                first_text=m.logprob_options.return_text_in_logprobs,
            )
            for m in messages
        )
        return list(prompts), await client.generate(messages)

    prompts, generation = await unless_disconnected(request, begin())
    listed = is_batch or len(generation.samples) > 1

    def meta_info(sample: Sample) -> dict[str, Any]:
        message = messages[sample.prompt]
        rid = message.request_id
        sample_id = f"{rid}-{sample.local_index}" if message.sampling_params.n > 1 else rid
        return _meta_info(sample, sample_id, message, prompts[sample.prompt])

    if body.stream:
        events = _stream(generation, meta_info, listed)
        return sse.SSEResponse(sse.frames(events, generation.ready), on_close=generation.cancel)
    samples = await unless_disconnected(request, generation.collect())
    outputs = [{"text": s.text, "output_ids": s.token_ids, "meta_info": meta_info(s)} for s in samples]
    return JSONResponse(outputs if listed else outputs[0])


async def _stream(
    generation: Generation, meta_info: Callable[[Sample], dict[str, Any]], listed: bool
) -> AsyncGenerator[str, None]:
    """Each event's JSON: the sample's text and ids so far, its meta_info, and with several samples its index."""
    encoded = CumulativeEvents()
    async with contextlib.aclosing(generation.events()) as events:
        async for event in events:
            sample = event.sample
            rest: dict[str, Any] = {"meta_info": meta_info(sample)}
            if listed:
                rest["index"] = sample.index
            yield encoded.encode(sample.index, sample.text, sample.token_ids, rest)


@router.get("/get_model_info")
async def get_model_info(request: Request) -> dict[str, Any]:
    info = await router_of(request).model_info("")
    # The contract has no separate tokenizer path: the tokenizer is loaded from the model's directory.
    return {"model_path": info.path, "tokenizer_path": info.path, "is_generation": True}
