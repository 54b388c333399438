"""The rotary kernel against its torch reference (which is layers.RotaryEmbedding + apply_rotary):
strided q/k views of a fused qkv output, GQA ratios, head dims whose half is not a power of two,
positions far from zero (where float32 angles lose precision the same way on both paths), scaled
(llama3) frequencies, and half precision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from services.engine.kernels.rotary import rotary_embedding, rotary_embedding_reference
from services.engine.models.layers import RotaryEmbedding, apply_rotary, rope_inv_freq
from tests.engine.kernels.kernel_device import DEVICE
from tests.engine.kernels.poisoned_outputs import poisoned_outputs

needs_cuda = pytest.mark.cuda
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}


@pytest.fixture(autouse=True)
def _poisoned_outputs() -> Iterator[None]:
    with poisoned_outputs():
        yield


def qkv_views(
    tokens: int, q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (T, Hq, D) and k (T, Hkv, D) as the model has them: views into one (T, (Hq + 2 Hkv) D) output."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=g).to(DEVICE, dtype)
    q, k, _ = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    return q.unflatten(-1, (q_heads, head_dim)), k.unflatten(-1, (kv_heads, head_dim))


def random_positions(tokens: int, seed: int, high: int = 4096) -> torch.Tensor:
    return torch.randint(0, high, (tokens,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.mark.parametrize(
    ("tokens", "q_heads", "kv_heads", "head_dim", "rope"),
    [
        (1, 4, 4, 16, DEFAULT),  # one decode token, no GQA
        (7, 4, 2, 16, DEFAULT),  # GQA 2
        (5, 6, 2, 20, DEFAULT),  # GQA 3, half = 10 (padded to 16), heads padded to 8
        (9, 8, 1, 32, LLAMA3),  # GQA 8 (MQA), scaled frequencies
    ],
)
def test_matches_reference_fp32(tokens: int, q_heads: int, kv_heads: int, head_dim: int, rope: dict) -> None:
    q, k = qkv_views(tokens, q_heads, kv_heads, head_dim, torch.float32, seed=tokens * head_dim)
    q_before, k_before = q.clone(), k.clone()
    positions = random_positions(tokens, seed=tokens)
    inv_freq = rope_inv_freq(head_dim, rope).to(DEVICE)
    q_rot, k_rot = rotary_embedding(q, k, positions, inv_freq)
    expected_q, expected_k = rotary_embedding_reference(q, k, positions, inv_freq)
    assert q_rot.shape == q.shape and k_rot.shape == k.shape and q_rot.is_contiguous() and k_rot.is_contiguous()
    torch.testing.assert_close(q_rot, expected_q, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(k_rot, expected_k, atol=2e-6, rtol=1e-5)
    assert torch.equal(q, q_before) and torch.equal(k, k_before), "the inputs are not written"


def test_position_zero_is_identity_and_positions_are_per_token() -> None:
    q, k = qkv_views(3, 2, 1, 8, torch.float32, seed=1)
    inv_freq = rope_inv_freq(8, DEFAULT).to(DEVICE)
    positions = torch.tensor([0, 5, 0], device=DEVICE)
    q_rot, k_rot = rotary_embedding(q, k, positions, inv_freq)
    assert torch.equal(q_rot[[0, 2]], q[[0, 2]]) and torch.equal(k_rot[[0, 2]], k[[0, 2]])
    assert not torch.allclose(q_rot[1], q[1])


def test_reference_is_the_layer_ops() -> None:
    q, k = qkv_views(6, 4, 2, 16, torch.bfloat16, seed=2)
    positions = random_positions(6, seed=2)
    rotary = RotaryEmbedding(16, DEFAULT).to(DEVICE)
    cos_sin = rotary(positions).cos_sin
    assert cos_sin is not None
    cos, sin = cos_sin
    expected_q, expected_k = rotary_embedding_reference(q, k, positions, rotary.inv_freq)
    assert torch.equal(apply_rotary(q, cos, sin), expected_q)
    assert torch.equal(apply_rotary(k, cos, sin), expected_k)


# An element of the result is rounded four times (cos or sin, two products, the sum), each to nearest
# as torch does, so results are bit-identical but where a different fp32 cos/sin flips a rounding:
# rarely, by one ulp of the inputs' size. Triton's interpreter truncates fp32 -> bf16 instead, a
# whole ulp at each rounding, so there bf16 is only held to four ulps.
INTERPRETED_BF16 = not torch.cuda.is_available()


def assert_within_ulps(rotated: torch.Tensor, expected: torch.Tensor, x: torch.Tensor) -> None:
    truncating = rotated.dtype == torch.bfloat16 and INTERPRETED_BF16
    x1, x2 = x.float().chunk(2, dim=-1)
    size = (x1.abs() + x2.abs()).repeat(1, 1, 2)  # (T, H, D): bounds both halves' results
    error = (rotated.float() - expected.float()).abs()
    assert (error <= (4 if truncating else 1) * torch.finfo(rotated.dtype).eps * size).all(), f"max {error.max()}"
    if not truncating:
        assert (rotated != expected).float().mean() < 0.01, "bit-identical but for rare rounding flips"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype: torch.dtype) -> None:
    q, k = qkv_views(6, 4, 2, 24, dtype, seed=3)
    positions = random_positions(6, seed=3)
    inv_freq = rope_inv_freq(24, DEFAULT).to(DEVICE)
    q_rot, k_rot = rotary_embedding(q, k, positions, inv_freq)
    expected_q, expected_k = rotary_embedding_reference(q, k, positions, inv_freq)
    assert q_rot.dtype == k_rot.dtype == dtype
    assert_within_ulps(q_rot, expected_q, q)
    assert_within_ulps(k_rot, expected_k, k)


def test_rejects_mismatched_inputs() -> None:
    q, k = qkv_views(4, 4, 2, 16, torch.float32, seed=4)
    positions = random_positions(4, seed=4)
    inv_freq = rope_inv_freq(16, DEFAULT).to(DEVICE)
    with pytest.raises(ValueError, match="inv_freq"):
        rotary_embedding(q, k, positions, inv_freq[:4])
    with pytest.raises(ValueError, match="positions"):
        rotary_embedding(q, k, positions[:3], inv_freq)
    with pytest.raises(ValueError, match="must be"):
        rotary_embedding(q, k[:3], positions, inv_freq)


@needs_cuda
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(32, 8, 128), (64, 8, 128), (16, 8, 64)])
def test_llama_sized_heads_bf16_on_cuda(q_heads: int, kv_heads: int, head_dim: int) -> None:
    q, k = qkv_views(300, q_heads, kv_heads, head_dim, torch.bfloat16, seed=q_heads)
    positions = random_positions(300, seed=5, high=131072)
    inv_freq = rope_inv_freq(head_dim, {**LLAMA3, "original_max_position_embeddings": 8192}).to(DEVICE)
    q_rot, k_rot = rotary_embedding(q, k, positions, inv_freq)
    expected_q, expected_k = rotary_embedding_reference(q, k, positions, inv_freq)
    assert_within_ulps(q_rot, expected_q, q)
    assert_within_ulps(k_rot, expected_k, k)


# Compiled for sm_90, in a process of its own (this one interprets the kernels, which compiles
# nothing): each specialisation the launch table makes, half precision only, PTX fma counts.
_FUSED_MULTIPLY_ADDS = """
import json
from benchmarks.kernel_aot import compile_spec, specialisations
counts = {}
for spec in specialisations(90, launchers={"rotary_embedding"}):
    if spec.signature["q_ptr"] not in ("*bf16", "*fp16"):
        continue
    ptx = compile_spec(spec).asm["ptx"]
    counts[spec.signature["q_ptr"]] = ptx.count("fma.rn.bf16") + ptx.count("fma.rn.f16")
print(json.dumps(counts))
"""


def test_compiled_rotation_rounds_each_product_as_torch_does() -> None:
    """On an H100, contraction fused `x1 * cos - x2 * sin` into one half-precision fma, skipping the
    product's rounding torch does: a fifth of the elements one step off. No fma may remain."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _FUSED_MULTIPLY_ADDS],
        cwd=Path(__file__).parents[3],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=True,
    )
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(counts) == {"*bf16", "*fp16"}
    assert counts == {"*bf16": 0, "*fp16": 0}
