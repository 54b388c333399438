"""KV pool sizing: the order of the rules, the CPU default and RAM check, max_model_len against the
pool, the CUDA arithmetic on measured numbers, the probes.

The arithmetic and the rule order run on CPU with made-up measurements; the probe forward runs on
CPU too; the measurement itself needs a CUDA device.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from services.engine import kv_cache_sizing
from services.engine.attention.backend import AttentionBackend, KVCache
from services.engine.attention.torch_backend import TorchAttentionBackend
from services.engine.config import EngineConfig, kv_cache_memory_from_env
from services.engine.kv_cache_sizing import (
    GIB,
    check_ram_available,
    cpu_default_bytes,
    fit_max_model_len,
    num_kv_blocks,
    profiled_budget_bytes,
    size_kv_pool,
    total_ram_bytes,
)
from services.engine.llm_engine import LLMEngine
from services.engine.memory_profile import (
    SAMPLER_BYTES_PER_LOGIT,
    MemoryProfile,
    prefill_probe,
    prefill_probe_context,
    profile_memory,
)
from services.engine.model_loader import LoadedModel, load_model
from services.engine.models import build_model
from services.engine.models.llama import LlamaForCausalLM
from tests.engine.model_fixtures import build_tiny_checkpoint, poison

MIB = 1 << 20
on_cuda = pytest.mark.cuda  # the memory profile needs a CUDA device
PROFILE = MemoryProfile(
    total_bytes=80 * GIB,
    in_use_bytes=20 * GIB,  # 2 GiB held by others before the engine loaded, then 18 GiB of its own
    others_bytes=2 * GIB,
    activation_bytes=3 * GIB,
    sampler_bytes=GIB,
    graph_bytes=GIB // 2,
)


def test_profiled_budget_is_this_engines_share_minus_what_it_holds_and_the_two_extra_blocks() -> None:
    per_block = 2 * MIB
    own = (18 + 3 + 1 + 0.5) * GIB
    assert profiled_budget_bytes(PROFILE, 0.9, per_block) == int(80 * GIB * 0.9) - own - 2 * per_block
    # Half the device for each of two engines: what others hold does not shrink this one's share...
    assert profiled_budget_bytes(PROFILE, 0.5, per_block) == 40 * GIB - own - 2 * per_block
    # ...but the pool never takes memory that is not free: at 1.0 the others' 2 GiB stay theirs.
    assert profiled_budget_bytes(PROFILE, 1.0, per_block) == 80 * GIB - 20 * GIB - 4.5 * GIB - 2 * per_block


def test_profiled_budget_refuses_when_not_one_block_fits_and_names_the_flags() -> None:
    per_block = 2 * MIB
    # Half of the device leaves room for exactly one block besides the zero and scratch blocks.
    one_block = dataclasses.replace(PROFILE, total_bytes=2 * (PROFILE.own_bytes + 3 * per_block))
    assert profiled_budget_bytes(one_block, 0.5, per_block) == per_block
    just_short = dataclasses.replace(one_block, in_use_bytes=PROFILE.in_use_bytes + 1)
    with pytest.raises(ValueError, match="raise --gpu-memory-utilization or lower --max-num-batched-tokens"):
        profiled_budget_bytes(just_short, 0.5, per_block)
    with pytest.raises(ValueError, match=r"--gpu-memory-utilization 0\.25 allows this engine 20\.00 GiB"):
        profiled_budget_bytes(PROFILE, 0.25, per_block)
    # Its share would fit, but others hold the memory: refused rather than over-allocated.
    crowded = dataclasses.replace(PROFILE, in_use_bytes=78 * GIB, others_bytes=60 * GIB)
    with pytest.raises(ValueError, match=r"other processes and the CUDA context hold 60\.00 GiB"):
        profiled_budget_bytes(crowded, 0.9, per_block)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir))


def no_backend(num_blocks: int) -> AttentionBackend:
    raise AssertionError("only the CUDA profile builds a probe backend")


def test_explicit_sizes_come_first_and_the_useful_cap_last(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    per_block = loaded.kv_bytes_per_block(16)
    config = EngineConfig(model=tiny_model_dir, num_kv_blocks=7, kv_cache_memory_gib=1.0)
    assert num_kv_blocks(config, loaded, no_backend) == 7
    config = EngineConfig(model=tiny_model_dir, kv_cache_memory_gib=100 * per_block / GIB, max_running_requests=1)
    assert num_kv_blocks(config, loaded, no_backend) == 100
    useful = 256 * loaded.max_model_len // 16
    config = EngineConfig(model=tiny_model_dir, kv_cache_memory_gib=64.0)
    assert num_kv_blocks(config, loaded, no_backend) == useful
    config = EngineConfig(model=tiny_model_dir, max_running_requests=1)
    assert num_kv_blocks(config, loaded, no_backend) == min(
        cpu_default_bytes(total_ram_bytes()) // per_block, 4096 // 16
    )


# -- CPU: a default that does not depend on the moment, checked against what is available -------


def test_cpu_default_is_fixed_and_capped_by_a_tenth_of_total_ram() -> None:
    assert cpu_default_bytes(64 * GIB) == 4 * GIB  # vLLM's 4 GiB on a large machine
    assert cpu_default_bytes(8 * GIB) == int(0.8 * GIB)  # a tenth of a small one
    assert cpu_default_bytes(23 * GIB) == cpu_default_bytes(23 * GIB)  # nothing else goes in


def test_cpu_default_ignores_what_is_free_at_start(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, loaded: LoadedModel
) -> None:
    monkeypatch.setattr(kv_cache_sizing, "total_ram_bytes", lambda: 10 * GIB)
    per_block = loaded.kv_bytes_per_block(16)
    # Running cap high enough that the useful cap (8 GiB of this model's blocks) stays out of the way.
    config = EngineConfig(model=tiny_model_dir, max_running_requests=4096)
    busy = size_kv_pool(config, loaded, no_backend, available_bytes=lambda: 2 * GIB)
    idle = size_kv_pool(config, loaded, no_backend, available_bytes=lambda: 9 * GIB)
    assert busy == idle
    assert busy.blocks == GIB // per_block < 4096 * loaded.max_model_len // 16


def test_cpu_pool_must_fit_in_available_ram() -> None:
    check_ram_available(GIB, GIB)
    with pytest.raises(ValueError, match=r"needs 2\.00 GiB of RAM but only 1\.50 GiB is available \(MemAvailable\)"):
        check_ram_available(2 * GIB, int(1.5 * GIB))
    with pytest.raises(ValueError, match="lower --kv-cache-memory"):
        check_ram_available(2 * GIB, GIB)


def test_engine_refuses_a_pool_that_ram_cannot_hold(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    per_block = loaded.kv_bytes_per_block(16)
    config = EngineConfig(model=tiny_model_dir, num_kv_blocks=100)
    # The pool is its managed blocks and the zero and scratch blocks.
    assert size_kv_pool(config, loaded, no_backend, available_bytes=lambda: 102 * per_block).blocks == 100
    with pytest.raises(ValueError, match="MemAvailable"):
        size_kv_pool(config, loaded, no_backend, available_bytes=lambda: 102 * per_block - 1)


def test_vllm_env_var_is_an_alias_of_the_flag() -> None:
    env = {"VLLM_CPU_KVCACHE_SPACE": "8"}
    assert kv_cache_memory_from_env(None, env) == 8.0
    assert kv_cache_memory_from_env(2.5, env) == 2.5  # the flag wins
    assert kv_cache_memory_from_env(None, {}) is None
    assert kv_cache_memory_from_env(None, {"VLLM_CPU_KVCACHE_SPACE": "0"}) is None  # vLLM's "unset"
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE must be a number of GiB, got 'lots'"):
        kv_cache_memory_from_env(None, {"VLLM_CPU_KVCACHE_SPACE": "lots"})


# -- max_model_len against the pool -------------------------------------------------------------


def test_max_model_len_that_fits_is_kept() -> None:
    assert fit_max_model_len(blocks=64, block_size=16, max_model_len=1024, explicit=True) == 1024
    assert fit_max_model_len(blocks=64, block_size=16, max_model_len=1024, explicit=False) == 1024


def test_explicit_max_model_len_the_pool_cannot_hold_refuses_and_names_the_knobs() -> None:
    with pytest.raises(ValueError) as refused:
        fit_max_model_len(blocks=63, block_size=16, max_model_len=1024, explicit=True)
    message = str(refused.value)
    assert "holds 1008 tokens" in message and "--max-model-len 1024" in message
    assert all(knob in message for knob in ("--kv-cache-memory", "--num-kv-blocks", "--max-model-len"))


def test_model_context_the_pool_cannot_hold_is_capped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=kv_cache_sizing.__name__):
        assert fit_max_model_len(blocks=63, block_size=16, max_model_len=1024, explicit=False) == 1008
    assert "max_model_len capped" in caplog.text


def test_engine_starts_with_max_model_len_capped_to_its_pool(
    tiny_model_dir: Path, loaded: LoadedModel, caplog: pytest.LogCaptureFixture
) -> None:
    assert loaded.max_model_len == 4096
    with caplog.at_level(logging.INFO):
        engine = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=16), loaded)
    assert engine.loaded.max_model_len == 256 and loaded.max_model_len == 4096
    assert engine.limits(prompt_len=10).max_model_len == 256
    ready = next(r for r in caplog.records if r.getMessage() == "kv cache ready")
    assert (ready.tokens, ready.max_model_len, ready.max_concurrency_at_full_length) == (256, 256, 1.0)  # type: ignore[attr-defined]
    # As load_model leaves it when --max-model-len 512 is given.
    loaded_512 = loaded.with_max_model_len(512)
    with pytest.raises(ValueError, match="less than one sequence of --max-model-len 512"):
        LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=16, max_model_len=512), loaded_512)
    fits = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=32, max_model_len=512), loaded_512)
    assert fits.loaded.max_model_len == 512


def test_cuda_sizes_the_pool_from_the_profile(
    monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path, loaded: LoadedModel
) -> None:
    on_gpu = dataclasses.replace(loaded, device=torch.device("cuda"))
    per_block = on_gpu.kv_bytes_per_block(16)
    seen: list[Callable[[int], AttentionBackend]] = []

    def fake_profile(
        config: EngineConfig, model: LoadedModel, make_backend: Callable[[int], AttentionBackend]
    ) -> MemoryProfile:
        assert model is on_gpu
        seen.append(make_backend)
        return dataclasses.replace(PROFILE, total_bytes=PROFILE.in_use_bytes + PROFILE.step_bytes + 1000 * per_block)

    monkeypatch.setattr(kv_cache_sizing, "profile_memory", fake_profile)
    config = EngineConfig(model=tiny_model_dir, gpu_memory_utilization=1.0)
    assert num_kv_blocks(config, on_gpu, no_backend) == 1000 - KVCache.NUM_EXTRA_BLOCKS
    assert seen == [no_backend]
    # An explicit size needs no profile.
    assert num_kv_blocks(EngineConfig(model=tiny_model_dir, num_kv_blocks=5), on_gpu, no_backend) == 5
    assert len(seen) == 1


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> LlamaForCausalLM:
    model, _ = build_model(build_tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama"), torch.float32, "cpu")
    return model


def test_prefill_probe_splits_the_step_into_sequences_of_at_most_the_context() -> None:
    cache = KVCache(1, 1, 4, 1, 8, torch.float32, torch.device("cpu"))
    ctx = prefill_probe_context(TorchAttentionBackend(cache, 1.0), num_tokens=20, max_model_len=8)
    assert ctx.query_lens_cpu == ctx.seq_lens_cpu == ctx.seq_lens.tolist() == [8, 8, 4]
    assert ctx.query_start_loc.tolist() == [0, 8, 16, 20]
    assert ctx.positions.tolist() == [*range(8), *range(8), *range(4)]
    assert (ctx.slot_mapping == cache.scratch_slot).all() and (ctx.block_tables == cache.null_block).all()
    assert ctx.block_tables.shape == (3, 2)


def test_prefill_probe_runs_the_largest_step_without_touching_the_managed_blocks(tiny_model: LlamaForCausalLM) -> None:
    spec = tiny_model.spec
    cache = KVCache(spec.num_layers, 1, 4, spec.num_kv_heads, spec.head_dim, torch.float32, torch.device("cpu"))
    poison(cache)
    backend = TorchAttentionBackend(cache, spec.attention_scale)

    logits = prefill_probe(tiny_model, backend, num_tokens=20, max_model_len=8, logit_rows=11)

    assert logits.shape == (11, spec.vocab_size) and logits.isfinite().all()
    assert all(pool[0].isnan().all() for pool in (*cache.k, *cache.v)), "a managed block was written"
    assert not any(pool[cache.null_block].any() for pool in (*cache.k, *cache.v)), "the zero block was written"
    assert all(pool[cache.null_block + 1].any() for pool in (*cache.k, *cache.v)), "K/V go to the scratch block"


# -- CUDA: the measurement ----------------------------------------------------------------------


def backend_factory(loaded: LoadedModel, block_size: int, name: str) -> Callable[[int], AttentionBackend]:
    return lambda num_blocks: loaded.make_backend(num_blocks, block_size, name)


@on_cuda
def test_profile_measures_activations_graphs_and_what_is_in_use(tiny_model_dir: Path) -> None:
    config = EngineConfig(model=tiny_model_dir, max_num_batched_tokens=512, max_running_requests=32)
    loaded = load_model(config)
    profile = profile_memory(config, loaded, backend_factory(loaded, config.block_size, "triton"))
    assert 0 < profile.in_use_bytes < profile.total_bytes
    # The weights loaded after the "before" reading: they are this engine's, not the others'.
    assert 0 <= profile.others_bytes < profile.in_use_bytes
    weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    assert profile.in_use_bytes - profile.others_bytes >= weights
    # At least the logits of 32 rows, in float32, were allocated during the probe.
    assert profile.activation_bytes >= 32 * loaded.vocab_size * 4
    assert profile.graph_bytes >= 32 * loaded.vocab_size * 4
    assert profile.sampler_bytes == 32 * loaded.vocab_size * SAMPLER_BYTES_PER_LOGIT
    without = profile_memory(
        EngineConfig(model=tiny_model_dir, disable_cuda_graph=True),
        loaded,
        backend_factory(loaded, config.block_size, "triton"),
    )
    assert without.graph_bytes == 0
    # The torch backend cannot be captured: nothing is reserved for graphs.
    torch_backend = profile_memory(config, loaded, backend_factory(loaded, config.block_size, "torch"))
    assert torch_backend.graph_bytes == 0


@on_cuda
def test_engine_on_cuda_sizes_its_pool_by_profile_and_refuses_a_share_too_small(tiny_model_dir: Path) -> None:
    loaded = load_model(EngineConfig(model=tiny_model_dir))
    config = EngineConfig(model=tiny_model_dir, max_running_requests=4, gpu_memory_utilization=0.9)
    engine = LLMEngine(config, loaded)
    assert engine.block_manager.num_total_blocks == 4 * loaded.max_model_len // 16  # the useful cap
    profile = profile_memory(config, loaded, backend_factory(loaded, config.block_size, "torch"))
    too_small = profile.own_bytes / profile.total_bytes / 2  # half of what the engine holds without a pool
    with pytest.raises(ValueError, match="raise --gpu-memory-utilization"):
        LLMEngine(EngineConfig(model=tiny_model_dir, gpu_memory_utilization=too_small), loaded)
