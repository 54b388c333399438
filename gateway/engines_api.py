"""`GET /v1/engines`: the router's engines as JSON (health, circuit, load, counters).

Read-only on purpose: adding and removing engines is the router's RouterAdmin
gRPC service, which is not exposed on the public HTTP port.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.router_client import router_of
from turnout.v1 import router_admin_pb2

router = APIRouter()


def engine_json(status: router_admin_pb2.EngineStatus) -> dict[str, Any]:
    health = router_admin_pb2.EngineStatus.Health.Name(status.health).removeprefix("HEALTH_").lower()
    circuit = router_admin_pb2.EngineStatus.Circuit.Name(status.circuit).removeprefix("CIRCUIT_").lower()
    return {
        "address": status.address,
        "target": status.target,
        "model": status.model or None,
        "health": health,
        "circuit": circuit,
        "routable": status.routable,
        "in_flight": status.in_flight,
        "load": status.load,
        "running_requests": status.running_requests,
        "waiting_requests": status.waiting_requests,
        "kv_cache_usage": round(status.kv_cache_usage, 4),
        "kv_cache_capacity_tokens": status.kv_cache_capacity_tokens,
        "requests_total": status.requests_total,
        "failures_total": status.failures_total,
        "retried_total": status.retried_total,
        "prefix_tree_tokens": status.prefix_tree_tokens,
    }


@router.get("/v1/engines")
async def list_engines(request: Request) -> dict[str, Any]:
    reply = await router_of(request).list_engines()
    return {
        "object": "list",
        "policy": reply.policy,
        "targets": list(reply.targets),
        "active_requests": reply.active_requests,
        "queued_requests": reply.queued_requests,
        "data": [engine_json(s) for s in reply.engines],
    }
