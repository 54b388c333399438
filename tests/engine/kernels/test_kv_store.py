"""The K/V store kernel against its torch reference: the slots it writes and the ones it must not."""

from __future__ import annotations

import pytest
import torch

from services.engine.kernels.kv_store import kv_store, kv_store_reference
from tests.engine.kernels.kernel_device import DEVICE


def run_case(
    num_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    seed: int,
    device: str = DEVICE,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    # V as the model hands it over: a strided view into the fused q/k/v projection output.
    fused = torch.randn(num_tokens, 3, num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    k, v = fused[:, 1].contiguous(), fused[:, 2]  # (T, Hkv, D)
    num_blocks = num_tokens // block_size + 3  # room for every token, and blocks nobody writes
    null_slot, scratch_slot = num_blocks * block_size, (num_blocks + 1) * block_size  # as in KVCache
    slots = torch.randperm(null_slot, generator=gen)[:num_tokens]
    # Padding rows of a graph batch: a negative mark, the zero block's and the scratch block's first slot.
    slots[-3:] = torch.tensor([-1, null_slot, scratch_slot])
    slot_mapping = slots.to(device)
    shape = (num_blocks + 2, block_size, num_kv_heads, head_dim)  # the requests' blocks, zero, scratch
    k_cache = torch.full(shape, float("nan"), dtype=cache_dtype, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=cache_dtype, device=device)
    k_cache[num_blocks] = 0
    v_cache[num_blocks] = 0
    k_expected, v_expected = k_cache.clone(), v_cache.clone()

    kv_store(k, v, k_cache, v_cache, slot_mapping, null_slot)
    kv_store_reference(k, v, k_expected, v_expected, slot_mapping, null_slot)

    torch.testing.assert_close(k_cache, k_expected, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_expected, atol=0, rtol=0, equal_nan=True)
    # The real tokens landed (not NaN), the zero block stayed zero, everything else (the scratch
    # block too) kept its poison.
    rows = k_cache.view(-1, num_kv_heads, head_dim)
    assert not rows[slot_mapping[:-3]].isnan().any()
    assert not k_cache[num_blocks].any() and not v_cache[num_blocks].any()
    assert rows[:null_slot].isnan().all(-1).all(-1).sum() == null_slot - (num_tokens - 3)
    assert k_cache[num_blocks + 1].isnan().all() and v_cache[num_blocks + 1].isnan().all()


@pytest.mark.parametrize(
    ("num_kv_heads", "head_dim", "block_size"), [(2, 16, 4), (3, 24, 16), (1, 8, 1)], ids=["gqa", "odd", "mqa"]
)
@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [(torch.float32, torch.float32), (torch.float32, torch.float16), (torch.bfloat16, torch.bfloat16)],
    ids=["fp32", "cast-fp16", "bf16"],
)
def test_matches_reference(
    num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype, cache_dtype: torch.dtype
) -> None:
    run_case(11, num_kv_heads, head_dim, block_size, dtype, cache_dtype, seed=num_kv_heads)


def test_caches_of_different_layouts_are_refused() -> None:
    k = torch.zeros(1, 2, 16)
    with pytest.raises(ValueError, match="differ"):
        kv_store(k, k, torch.zeros(3, 4, 2, 16), torch.zeros(3, 4, 2, 8), torch.zeros(1, dtype=torch.int64), 8)


@pytest.mark.cuda
def test_cuda_llama3_shapes() -> None:
    run_case(500, 8, 128, 16, torch.bfloat16, torch.bfloat16, seed=0, device="cuda")
