"""What `turnout serve` prints once every service is healthy: where to send requests, where the
router's gRPC API and the metrics are, and what each engine can hold.

The KV-cache figures come from the engines themselves (GetLoad's capacity, GetModelInfo's
context length, the latter already capped to what the pool holds), asked once with the stack's
internal token: the same numbers the engine's "kv cache ready" log line gives. Max concurrency
is how many sequences of the full context fit in the cache at once (vLLM's "maximum concurrency").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from turnout.grpc_auth import sync_channel
from turnout.security import ClientCredentials
from turnout.v1 import engine_pb2, engine_pb2_grpc

log = logging.getLogger(__name__)

READY_PREFIX = "Turnout is serving "


@dataclass(frozen=True)
class EngineCapacity:
    kv_tokens: int
    max_model_len: int

    @property
    def max_concurrency(self) -> float:
        """Sequences of `max_model_len` tokens the KV cache holds at once."""
        return self.kv_tokens / self.max_model_len if self.max_model_len else 0.0


def engine_capacity(address: str, credentials: ClientCredentials) -> EngineCapacity | None:
    """The KV capacity the engine at `address` reports; None (and a warning) when it does not answer."""
    with sync_channel(address, credentials, []) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        try:
            load = stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=5.0)
            info = stub.GetModelInfo(engine_pb2.GetModelInfoRequest(), timeout=5.0)
        except grpc.RpcError as exc:
            log.warning("engine did not report its KV capacity", extra={"engine": address, "error": str(exc)})
            return None
    return EngineCapacity(int(load.kv_cache_capacity_tokens), int(info.max_context_length))


def ready_lines(
    name: str, url: str, router_address: str, engines: dict[str, EngineCapacity | None], metrics_urls: list[str]
) -> list[str]:
    """The ready line and the summary under it (`engines`: each engine's name and capacity)."""
    lines = [
        f"{READY_PREFIX}{name} at {url}  (OpenAI API: {url}/v1; Ctrl-C stops)",
        f"  router gRPC (turnout.v1.Inference): {router_address}",
        f"  metrics: {url}/metrics",
    ]
    for engine, capacity in engines.items():
        if capacity is None:
            continue
        lines.append(
            f"  {engine}: KV cache {capacity.kv_tokens:,} tokens; max concurrency at full context "
            f"({capacity.max_model_len:,} tokens per request): {capacity.max_concurrency:.2f}x"
        )
    return lines + metrics_urls
