"""The router and LoRA adapters: `model=<adapter>` resolves to its base model, /v1/models lists adapters
with their parent, requests go to engines that have the adapter, and the cache-aware policy keys
prompts by adapter."""

from __future__ import annotations

import pytest

from services.router.config import RouterConfig
from services.router.engine_pool import EnginePool
from services.router.health_checker import Health
from services.router.policies import CacheAware, routing_key
from tests.router.test_policies import stubs
from turnout.errors import NotFound
from turnout.v1 import common_pb2


def pool_with(*adapters_per_engine: tuple[str, ...]) -> EnginePool:
    """Engines of model "base", engine i serving adapters_per_engine[i], all healthy."""
    pool = EnginePool(RouterConfig(engines=(), tokenizers=("t:1",)))
    for i, names in enumerate(adapters_per_engine):
        engine = pool.add(f"127.0.0.1:{5000 + i}", f"127.0.0.1:{5000 + i}")
        assert engine is not None
        engine.model = common_pb2.ModelInfo(name="base", path="/models/base", lora_enabled=True)
        for name in names:
            engine.model.lora_adapters.add(name=name, path=f"/adapters/{name}")
        engine.health.status = Health.HEALTHY
    return pool


async def test_model_names_an_adapter_or_the_base_model() -> None:
    pool = pool_with(("sql",), ("sql", "chat"))
    assert pool.resolve_model("base")[1] == ""
    info, adapter = pool.resolve_model("chat")
    assert (info.name, adapter) == ("base", "chat")
    with pytest.raises(NotFound, match="LoRA adapters: chat, sql"):
        pool.resolve_model("nope")
    await pool.close()


async def test_models_list_each_adapter_once_after_its_parent() -> None:
    pool = pool_with(("sql",), ("sql", "chat"))
    listed = [(m.name, m.parent, m.path) for m in pool.models()]
    assert listed == [
        ("base", "", "/models/base"),
        ("sql", "base", "/adapters/sql"),
        ("chat", "base", "/adapters/chat"),
    ]
    await pool.close()


async def test_adapter_requests_go_to_engines_that_have_the_adapter() -> None:
    pool = pool_with(("sql",), ("sql", "chat"), ())
    addresses = [e.address for e in pool.engines]
    assert [e.address for e in pool.routable("base", "chat")] == [addresses[1]]
    assert [e.address for e in pool.routable("base", "/adapters/sql")] == addresses[:2]  # by path too
    assert [e.address for e in pool.routable("base")] == addresses
    # No engine has it: every engine of the model (each refuses it with its own 400).
    assert [e.address for e in pool.routable("base", "gone")] == addresses
    await pool.close()


def test_cache_aware_keeps_adapters_apart() -> None:
    engines = stubs()
    policy = CacheAware(cache_threshold=0.5, abs_threshold=32, rel_threshold=1.5, max_tree_size=10_000)
    prompt = list(range(100))
    base = policy.pick(engines, routing_key(prompt, ""))
    assert policy.pick(engines, routing_key(prompt, "")).reason == "cache_hit"
    sql = policy.pick(engines, routing_key(prompt, "sql"))
    assert sql.reason == "cache_miss" and sql.engine is not base.engine
    again = policy.pick(engines, routing_key([*prompt, 7], "sql"))
    assert again.reason == "cache_hit" and again.engine is sql.engine
    assert routing_key(prompt, "sql") != routing_key(prompt, "chat")
