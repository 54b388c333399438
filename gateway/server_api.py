"""The server's own state: `/health`, `/health_generate`, `/version`, `/get_server_info`, `/load`,
`/flush_cache`.

`/health` is cheap (two metadata calls to the router) and says 503 unless the
router answers, serves a model and has at least one engine it would route
to. `/health_generate` proves the whole path: it generates one token through
router, tokenizer and an engine (as SGLang's does).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from grpc import aio

from gateway.admin_auth import admin_credential
from gateway.engines_api import engine_json
from gateway.errors import HTTPError, error_response, to_http_error
from gateway.router_client import router_of
from turnout import __version__
from turnout.v1 import common_pb2, inference_pb2

router = APIRouter()

# A probe must answer quickly even when the router does not.
HEALTH_TIMEOUT_S = 5.0
# One token, but possibly behind a full batch: longer than a metadata call.
HEALTH_GENERATE_TIMEOUT_S = 20.0


@router.get("/health")
async def health(request: Request) -> Response:
    """200 when the router answers, serves a model and has a routable engine; else 503."""
    client = router_of(request).probing()
    try:
        models, engines = await asyncio.gather(
            client.list_models(timeout_s=HEALTH_TIMEOUT_S), client.list_engines(timeout_s=HEALTH_TIMEOUT_S)
        )
    except aio.AioRpcError as exc:
        return error_response(HTTPError(503, f"router is not healthy: {to_http_error(exc).message}"))
    if not models:
        return error_response(HTTPError(503, "router serves no model"))
    if not any(e.routable for e in engines.engines):
        return error_response(HTTPError(503, f"no healthy engine ({len(engines.engines)} known to the router)"))
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """200 once one greedy token has come back through the whole stack, else 503."""
    # Token id 0 exists in every vocabulary; the text path would also test the tokenizer's encode,
    # but the detokenizer stream already exercises the tokenizer service.
    message = inference_pb2.GenerateRequest(
        request_id=f"health-generate-{uuid.uuid4().hex}",
        input_ids=common_pb2.TokenIds(ids=[0]),
        sampling_params=common_pb2.SamplingParams(max_new_tokens=1, temperature=0.0),
    )
    try:
        generation = await router_of(request).probing().generate([message])
        await asyncio.wait_for(generation.collect(), HEALTH_GENERATE_TIMEOUT_S)
    except TimeoutError:
        return error_response(HTTPError(503, f"no token within {HEALTH_GENERATE_TIMEOUT_S:g} s"))
    except Exception as exc:  # any failure of the path is the answer, not a 500
        return error_response(HTTPError(503, f"generation failed: {to_http_error(exc).message}"))
    return Response(status_code=200)


@router.get("/version")
async def version() -> dict[str, str]:
    return {"version": __version__}


@router.get("/get_server_info")
async def get_server_info(request: Request) -> dict[str, Any]:
    """SGLang's shape where it has a counterpart: the server's settings at the top level, the
    engines' state in `internal_states` (one entry per engine)."""
    client = router_of(request)
    info, engines = await asyncio.gather(client.model_info(""), client.list_engines())
    config = request.app.state.config
    settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "security"}
    return {
        "version": __version__,
        "model_path": info.path,
        "tokenizer_path": info.path,
        "served_model_name": await client.model_name(None),
        "context_length": info.max_context_length,
        # SGLang: the KV cache's capacity in tokens; with several engines, the smallest that has
        # reported one (what a request can count on wherever it is routed); 0 before any has.
        "max_total_num_tokens": min((c for e in engines.engines if (c := e.kv_cache_capacity_tokens)), default=0),
        "policy": engines.policy,
        "api_key_required": bool(config.security.api_keys),
        **settings,
        "internal_states": [engine_json(e) for e in engines.engines],
    }


@router.get("/load")
async def load(request: Request) -> dict[str, Any]:
    """vLLM's `server_load`: the generate requests the stack holds now (running or queued at the
    router), and each engine's own count of running and waiting requests (SGLang's `num_reqs`,
    `num_waiting_reqs`) and KV-cache use, as the router last heard them."""
    reply = await router_of(request).list_engines()
    return {
        "server_load": reply.active_requests + reply.queued_requests,
        "engines": [
            {
                "address": e.address,
                "num_reqs": e.running_requests,
                "num_waiting_reqs": e.waiting_requests,
                "kv_cache_usage": round(e.kv_cache_usage, 4),
            }
            for e in reply.engines
        ],
    }


@router.post("/flush_cache")
@router.get("/flush_cache", operation_id="flush_cache_get")
async def flush_cache(request: Request) -> Response:
    """Drop every engine's prefix cache. 200 when all did; 400 naming the busy ones otherwise
    (SGLang also refuses while requests run)."""
    reply = await router_of(request).flush_cache(admin_credential(request))
    busy = [f"{e.address}: {e.message}" for e in reply.engines if not e.flushed]
    if not reply.engines:
        return error_response(HTTPError(503, "the router has no engine"))
    if busy:
        return error_response(HTTPError(400, "cache not flushed on " + "; ".join(busy)))
    return PlainTextResponse(f"Cache flushed on {len(reply.engines)} engine(s).\n")
