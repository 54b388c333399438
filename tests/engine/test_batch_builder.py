"""ModelRunner.build_batch packs every index tensor of a step into one buffer (one copy to the device);
each field must be exactly what building them one by one from Python lists gives. The reference below
is that straightforward builder (the engine's until issue 15); real traffic runs through an engine whose
runner checks every batch it builds against it: chunked prefills beside decodes, prefix-cache hits,
placeholders of the overlap schedule, forked samples, prompt log-probabilities, pooling and hidden
states, with small and large blocks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from services.engine.block_manager import BlockManager
from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.model_runner import Batch, ModelRunner, PromptLogprobRows
from services.engine.pooling import PoolingSettings, PoolRows, pool_rows
from services.engine.request import EngineRequest
from services.engine.sampling_params import SamplingSettings
from services.engine.sampling_validation import Limits, resolve
from services.engine.scheduler import ScheduledSequence
from services.engine.sequence import Sequence
from turnout.v1 import common_pb2

PROMPT = tuple(range(100, 141))  # 41 tokens


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir, device="cpu"))


@dataclass(frozen=True)
class Reference:
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    query_lens_cpu: list[int]
    sample_rows: list[int]
    sample_seqs: list[Sequence]
    prompt_rows: list[PromptLogprobRows]
    pool_rows: list[PoolRows]


def reference(runner: ModelRunner, scheduled: list[ScheduledSequence], blocks: BlockManager) -> Reference:
    """Every field built one at a time from the sequences, as plain lists (placeholders left in)."""
    bs = runner.block_size
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    sample_rows: list[int] = []
    sample_seqs: list[Sequence] = []
    prompt_rows: list[PromptLogprobRows] = []
    pooled: list[PoolRows] = []
    for item in scheduled:
        seq, start, count = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
        end = start + count
        table = blocks.block_table(seq.seq_id)
        input_ids += seq.token_ids[start:end]
        positions += range(start, end)
        slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
        query_start.append(query_start[-1] + count)
        seq_lens.append(end)
        tables.append(table)
        pool = pool_rows(seq, start, end, query_start[-2])
        if pool is not None:
            pooled.append(pool)
        if end == seq.num_tokens and not seq.prefill_only:
            sample_rows.append(query_start[-1] - 1)
            sample_seqs.append(seq)
        target = seq.prompt_logprob_start
        if target is not None:
            first, last = max(start, target - 1), min(end, seq.num_prompt_tokens - 1)
            if first < last:
                row = query_start[-2] + first - start
                prompt_rows.append(PromptLogprobRows(seq, row, last - first, first + 1))
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]
    counts = [item.num_new_tokens for item in scheduled]
    return Reference(
        input_ids,
        positions,
        slots,
        query_start,
        seq_lens,
        padded,
        counts,
        sample_rows,
        sample_seqs,
        prompt_rows,
        pooled,
    )


def exact(tensor: torch.Tensor, values: list[int] | list[list[int]], name: str) -> None:
    expected = torch.tensor(values, dtype=torch.int64)
    assert tensor.dtype == torch.int64, name
    assert tensor.shape == expected.shape, f"{name}: shape {tuple(tensor.shape)}, expected {tuple(expected.shape)}"
    assert torch.equal(tensor.cpu(), expected), f"{name}: {tensor.tolist()}, expected {values}"


def check(batch: Batch, want: Reference, pending: torch.Tensor | None) -> None:
    ids = torch.tensor(want.input_ids)
    if pending is not None:  # the reference keeps the placeholders: resolve them as the runner must
        ids = torch.where(ids < 0, pending[(-ids - 1).clamp(min=0)], ids)
    exact(batch.input_ids, ids.tolist(), "input_ids")
    ctx = batch.context
    exact(ctx.positions, want.positions, "positions")
    exact(ctx.slot_mapping, want.slot_mapping, "slot_mapping")
    exact(ctx.query_start_loc, want.query_start_loc, "query_start_loc")
    exact(ctx.seq_lens, want.seq_lens, "seq_lens")
    exact(ctx.block_tables, want.block_tables, "block_tables")
    exact(batch.sample_rows, want.sample_rows, "sample_rows")
    assert ctx.query_lens_cpu == want.query_lens_cpu
    assert ctx.seq_lens_cpu == want.seq_lens
    assert ctx.lora is None
    assert [id(s) for s in batch.sample_seqs] == [id(s) for s in want.sample_seqs]
    assert batch.prompt_rows == want.prompt_rows
    assert batch.pool_rows == want.pool_rows


def checked_engine(tiny_model_dir: Path, loaded: LoadedModel, seen: Counter[str], **options: object) -> LLMEngine:
    """An engine whose runner compares every batch it builds with the reference; `seen` counts what the
    batches held, so the test knows the traffic reached every case."""
    config = EngineConfig(model=tiny_model_dir, num_kv_blocks=256, overlap_schedule=True, **options)  # type: ignore[arg-type]
    engine = LLMEngine(config, loaded)
    runner = engine.runner
    build = runner.build_batch

    def checked(scheduled: list[ScheduledSequence], blocks: BlockManager, pending: torch.Tensor | None = None) -> Batch:
        want = reference(runner, scheduled, blocks)
        batch = build(scheduled, blocks, pending)
        check(batch, want, pending)
        counts = set(want.query_lens_cpu)
        seen["batches"] += 1
        seen["mixed"] += 1 in counts and any(c > 1 for c in counts)
        seen["placeholders"] += min(want.input_ids) < 0
        seen["prompt_rows"] += bool(want.prompt_rows)
        seen["pool_rows"] += bool(want.pool_rows)
        seen["prefill_only"] += any(item.seq.prefill_only for item in scheduled)
        seen["unequal_tables"] += len({len(t) - t.count(0) for t in want.block_tables}) > 1
        return batch

    runner.build_batch = checked  # type: ignore[method-assign,assignment]
    return engine


def sampling(
    loaded: LoadedModel, prompt_len: int, options: common_pb2.LogprobOptions | None = None, **params: Any
) -> SamplingSettings:
    limits = Limits(prompt_len, loaded.max_model_len, loaded.vocab_size, max_logprobs=5)
    return resolve(common_pb2.SamplingParams(**params), loaded.info.generation_defaults, limits, options)


def traffic(loaded: LoadedModel) -> dict[int, list[EngineRequest]]:
    def generate(rid: str, prompt: tuple[int, ...], **params: Any) -> EngineRequest:
        return EngineRequest(rid, prompt, sampling(loaded, len(prompt), temperature=0.0, ignore_eos=True, **params))

    prompt_logprobs = common_pb2.LogprobOptions(logprob_start_len=2, input_top_logprobs_num=2, return_logprob=True)
    pooling = sampling(loaded, 30, max_new_tokens=0)
    return {
        0: [generate("long", PROMPT, max_new_tokens=12), generate("short", (5, 6, 7), max_new_tokens=20)],
        2: [
            generate("shared", PROMPT[:35], max_new_tokens=6),  # its first blocks are cached by then
            EngineRequest("n", (9, 8, 7, 6, 5), sampling(loaded, 5, n=3, temperature=0.8, seed=3, max_new_tokens=7)),
        ],
        3: [
            EngineRequest(
                "logprobs", PROMPT[3:], sampling(loaded, 38, prompt_logprobs, temperature=0.0, max_new_tokens=4)
            ),
            EngineRequest("pooled", PROMPT[:30], pooling, pooling=PoolingSettings("mean")),
            EngineRequest("hidden", PROMPT[1:20], sampling(loaded, 19, max_new_tokens=3), return_hidden_states=True),
        ],
        6: [generate("late", PROMPT[:17], max_new_tokens=9)],
    }


@pytest.mark.parametrize("block_size", [4, 16])
def test_every_batch_field_is_what_the_list_builder_gives(
    tiny_model_dir: Path, loaded: LoadedModel, block_size: int
) -> None:
    seen: Counter[str] = Counter()
    engine = checked_engine(tiny_model_dir, loaded, seen, block_size=block_size, max_num_batched_tokens=24)
    arrivals = traffic(loaded)
    finished: set[str] = set()
    step = 0
    while step <= max(arrivals) or engine.has_work():
        for req in arrivals.get(step, []):
            engine.add_request(req)
        finished |= {out.request_id for out in engine.step() if out.output.request_finished}
        step += 1
        assert step < 1_000
    assert finished == {req.request_id for reqs in arrivals.values() for req in reqs}
    for case in ("mixed", "placeholders", "prompt_rows", "pool_rows", "prefill_only", "unequal_tables"):
        assert seen[case] > 0, f"no batch had {case}: {dict(seen)}"


def test_a_decode_only_batch_across_block_boundaries(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    """Decodes whose position is the first, a middle and the last of a block, one of them a placeholder."""
    seen: Counter[str] = Counter()
    engine = checked_engine(tiny_model_dir, loaded, seen, block_size=4)
    seqs = []
    for rid, length in (("a", 4), ("b", 6), ("c", 7)):
        seq = Sequence(EngineRequest(rid, tuple(range(10, 10 + length)), sampling(loaded, length, max_new_tokens=4)))
        seq.num_computed_tokens = length - 1
        assert engine.block_manager.allocate(seq.seq_id, length)
        seqs.append(seq)
    seqs[1].token_ids[-1] = -1  # placeholder(0)
    batch = engine.runner.build_batch([ScheduledSequence(s, 1) for s in seqs], engine.block_manager, torch.tensor([77]))
    assert batch.input_ids.tolist() == [13, 77, 16]
    assert batch.context.positions.tolist() == [3, 5, 6]
    assert seen["batches"] == 1
