"""Engine.FlushCache: the prefix cache dropped on the step-loop thread, refused while requests hold blocks."""

from __future__ import annotations

import asyncio
from typing import Any

from services.engine.engine_loop import EngineLoop
from services.engine.model_loader import LoadedModel
from services.engine.service import EngineServicer
from tests.engine.test_engine_loop import collect, engine, loaded, make_request
from turnout.v1 import engine_pb2

__all__ = ["engine", "loaded"]  # the fixtures, re-used


async def test_flush_drops_cached_blocks_and_is_refused_while_busy(engine: EngineLoop, loaded: LoadedModel) -> None:
    prompt = tuple(range(1, 70))  # several full blocks, so the finished request leaves cached ones
    await collect(engine.generate(make_request(loaded, "a", prompt, max_new_tokens=2, ignore_eos=True)))
    pool = engine.engine.block_manager._pool
    assert pool.num_cached > 0
    servicer = EngineServicer(loaded, engine, engine.engine.config)
    context: Any = None

    running = engine.generate(make_request(loaded, "b", prompt, max_new_tokens=3000, ignore_eos=True))
    first = await anext(running)  # holds blocks from here on
    assert first.token_ids
    busy = await servicer.FlushCache(engine_pb2.FlushCacheRequest(), context)
    assert not busy.flushed and "running or waiting" in busy.message
    assert pool.num_cached > 0
    await running.aclose()  # aborts "b" and frees its blocks at the next step
    for _ in range(100):
        if engine.load().running == 0:
            break
        await asyncio.sleep(0.02)

    done = await servicer.FlushCache(engine_pb2.FlushCacheRequest(), context)
    assert done.flushed and done.message == ""
    assert pool.num_cached == 0
    engine.engine.block_manager.check_integrity()
