"""EngineLoop.generate_batches: a reader that lags gets every output that is ready in one batch, in
order, the same outputs one by one; a reader that keeps up gets one step's output per batch."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.engine.config import EngineConfig
from services.engine.engine_loop import EngineLoop
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.request import EngineOutput, EngineRequest
from services.engine.sampling_validation import Limits, resolve
from turnout.v1 import common_pb2

PROMPT = (1, 504, 3575, 282, 4649, 314)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir, dtype="float32"))


@pytest.fixture
def engine(loaded: LoadedModel, tiny_model_dir: Path) -> Iterator[EngineLoop]:
    core = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=128), loaded)
    engine = EngineLoop(core)
    yield engine
    engine.shutdown()
    core.block_manager.check_integrity()


def request(loaded: LoadedModel, rid: str) -> EngineRequest:
    params = common_pb2.SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    limits = Limits(len(PROMPT), loaded.max_model_len, loaded.vocab_size)
    sampling = resolve(params, loaded.info.generation_defaults, limits)
    return EngineRequest(rid, PROMPT, sampling)


async def test_a_lagging_reader_gets_the_ready_steps_in_one_batch(engine: EngineLoop, loaded: LoadedModel) -> None:
    one_by_one: list[EngineOutput] = [out async for out in engine.generate(request(loaded, "a"))]
    assert len(one_by_one) == 24 and all(len(out.token_ids) == 1 for out in one_by_one)
    batches: list[list[EngineOutput]] = []
    async for batch in engine.generate_batches(request(loaded, "b")):
        batches.append(batch)
        await asyncio.sleep(0.05)  # a reader slower than the steps
    assert max(len(b) for b in batches) > 1
    flat = [out for batch in batches for out in batch]
    assert [out.token_ids for out in flat] == [out.token_ids for out in one_by_one]
    assert [out.completion_tokens for out in flat] == list(range(1, 25))
    assert flat[-1].request_finished and not any(out.request_finished for out in flat[:-1])
