"""The step trace records exactly the batches the engine ran."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_engine import engine_requests, make_prompts
from benchmarks.engine_trace import run_requests
from benchmarks.model_shapes import SHAPES, random_loaded_model, write_model_folder
from benchmarks.step_floors import Ceilings
from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine


def test_trace_holds_every_computed_token_and_first_token_time(tmp_path: Path) -> None:
    shape = SHAPES["tiny"]
    # A 24-token budget: the 20-token prompts are prefilled in chunks, beside decodes.
    config = EngineConfig(
        model=write_model_folder(shape, tmp_path), num_kv_blocks=64, max_model_len=128, max_num_batched_tokens=24
    )
    engine = LLMEngine(config, random_loaded_model(config))
    prompts = make_prompts(3, 20, 20, seed=0, vocab=shape.vocab_size)
    output_len = 5
    trace = run_requests(engine, engine_requests(engine, prompts, output_len, "r"))

    assert not engine.has_work()
    assert trace.prompt_tokens == 60
    assert trace.output_tokens == 3 * output_len
    # Every prompt token and every output token but the last goes through the model once.
    assert sum(sum(s.query_lens) for s in trace.steps) == 3 * (20 + output_len - 1)
    assert sum(s.sampled for s in trace.steps) == 3 * output_len
    assert any(not s.is_decode and len(s.query_lens) > 1 for s in trace.steps), "no mixed step"
    assert max(sum(s.query_lens) for s in trace.steps) <= 24
    final = trace.steps[-1]
    assert final.is_decode
    assert set(final.seq_lens) == {20 + output_len - 1}
    assert sorted(trace.first_token) == ["r0", "r1", "r2"]
    assert all(0 < t < trace.seconds for t in trace.first_token.values())
    assert 0 < sum(s.seconds for s in trace.steps) <= trace.seconds

    ceilings = Ceilings(bandwidth=1e9, matmul_rate=1e9)
    floor = trace.floor_seconds(shape, 4, ceilings)
    assert floor == sum(s.floor_seconds(shape, 4, ceilings) for s in trace.steps) > 0
