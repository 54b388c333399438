"""The RMSNorm kernels against their torch references (which are layers.RMSNorm's ops) on random rows:
plain and with the residual add, 2-D hidden states and strided per-head (T, H, D) views, row widths
that are not powers of two, several rows per program and one row per program."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from services.engine.kernels.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
)
from services.engine.models.layers import RMSNorm
from tests.engine.kernels.kernel_device import DEVICE
from tests.engine.kernels.poisoned_outputs import poisoned_outputs
from tests.tolerances import assert_close

needs_cuda = pytest.mark.cuda
EPS = 1e-6
# (rows, dim): one row, rows sharing a program (dim 64 -> 64 rows a program), a partial last program,
# odd widths, and rows wider than ELEMENTS_PER_PROGRAM / 2 (one row a program).
SHAPES = [(1, 64), (5, 48), (70, 64), (9, 100), (3, 2500)]


@pytest.fixture(autouse=True)
def _poisoned_outputs() -> Iterator[None]:
    with poisoned_outputs():
        yield


def random_rows(rows: int, dim: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations with a per-row scale (so rows normalise differently) and a weight around 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * torch.rand(rows, 1, generator=g).add(0.1) * 4
    weight = 1 + 0.3 * torch.randn(dim, generator=g)
    return x.to(DEVICE, dtype), weight.to(DEVICE, dtype)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance between a and b in representable values of their (half-precision) dtype."""
    assert a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16)
    return int((ordinal(a) - ordinal(b)).abs().max())


def ordinal(x: torch.Tensor) -> torch.Tensor:
    """16-bit floats as integers that count representable values (sign-magnitude bits made monotone)."""
    bits = x.view(torch.int16).int()
    return torch.where(bits < 0, -32768 - bits, bits)


@pytest.mark.parametrize(("rows", "dim"), SHAPES)
def test_rms_norm_matches_reference_fp32(rows: int, dim: int) -> None:
    x, weight = random_rows(rows, dim, torch.float32, seed=rows * dim)
    out = rms_norm(x, weight, EPS)
    assert out.shape == x.shape and out.is_contiguous()
    assert_close(out, rms_norm_reference(x, weight, EPS), reduction=dim)


@pytest.mark.parametrize(("rows", "dim"), SHAPES)
def test_fused_add_rms_norm_matches_reference_fp32(rows: int, dim: int) -> None:
    x, weight = random_rows(rows, dim, torch.float32, seed=rows + dim)
    residual, _ = random_rows(rows, dim, torch.float32, seed=rows + dim + 1)
    residual_before = residual.clone()
    normed, summed = fused_add_rms_norm(x, residual, weight, EPS)
    expected_normed, expected_summed = fused_add_rms_norm_reference(x, residual, weight, EPS)
    assert torch.equal(summed, expected_summed)
    assert_close(normed, expected_normed, reduction=dim)
    assert torch.equal(residual, residual_before), "the inputs are not written"


def test_per_head_norm_of_strided_views() -> None:
    """Qwen3's q/k norm: q and k are (T, H, D) views into one (T, (Hq + 2 Hkv) D) qkv output."""
    tokens, q_heads, kv_heads, head_dim = 6, 4, 2, 24
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=g).to(DEVICE)
    q, k, _ = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.unflatten(-1, (q_heads, head_dim)), k.unflatten(-1, (kv_heads, head_dim))  # (T, H, D) views
    weight = (1 + 0.3 * torch.randn(head_dim, generator=g)).to(DEVICE)
    for view in (q, k):
        assert not view.is_contiguous()
        out = rms_norm(view, weight, EPS)
        assert out.shape == view.shape and out.is_contiguous()
        assert_close(out, rms_norm_reference(view, weight, EPS), reduction=head_dim)


def test_references_are_the_layer_ops() -> None:
    x, weight = random_rows(4, 40, torch.bfloat16, seed=9)
    residual, _ = random_rows(4, 40, torch.bfloat16, seed=10)
    layer = RMSNorm(40, EPS).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(weight)
    assert torch.equal(layer(x), rms_norm_reference(x, weight, EPS))
    for ours, theirs in zip(
        layer.add_forward(x, residual), fused_add_rms_norm_reference(x, residual, weight, EPS), strict=True
    ):
        assert torch.equal(ours, theirs)


# Most ulps a half-precision result may be off: a different fp32 sum order or rsqrt can flip one
# rounding. Triton's interpreter truncates fp32 -> bf16 where torch rounds to nearest even: an ulp at
# the add, and the normalised value's error (one ulp) doubles in the weight product (bf16 only, CPU).
INTERPRETED_BF16 = not torch.cuda.is_available()
ALLOWED_ULPS = {torch.float16: (0, 1), torch.bfloat16: (1, 4) if INTERPRETED_BF16 else (0, 1)}  # (sum, norm)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_within_rounding(dtype: torch.dtype) -> None:
    sum_ulps, norm_ulps = ALLOWED_ULPS[dtype]
    x, weight = random_rows(33, 80, dtype, seed=11)
    residual, _ = random_rows(33, 80, dtype, seed=12)
    normed, summed = fused_add_rms_norm(x, residual, weight, EPS)
    assert normed.dtype == summed.dtype == dtype
    assert ulp_distance(summed, x + residual) <= sum_ulps
    assert ulp_distance(normed, rms_norm_reference(summed, weight, EPS)) <= norm_ulps
    assert ulp_distance(rms_norm(x, weight, EPS), rms_norm_reference(x, weight, EPS)) <= norm_ulps


def test_float32_weight_on_half_activations_promotes_like_torch() -> None:
    x, weight = random_rows(3, 32, torch.float16, seed=13)
    out = rms_norm(x, weight.float(), EPS)
    expected = rms_norm_reference(x, weight.float(), EPS)
    assert out.dtype == expected.dtype == torch.float32
    # Both round the normalised value to float16 before the weight: another float32 sum order may
    # land it one float16 step apart.
    assert_close(out, expected, reduction=32, dtype=torch.float16)


def test_rejects_what_it_cannot_normalise() -> None:
    x, weight = random_rows(4, 16, torch.float32, seed=14)
    with pytest.raises(ValueError, match="contiguous"):
        rms_norm(x.t().contiguous().t(), weight, EPS)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, weight[:8], EPS)
    with pytest.raises(ValueError, match="residual"):
        fused_add_rms_norm(x, x[:2], weight, EPS)


@needs_cuda
@pytest.mark.parametrize("dim", [4096, 5120, 8192])
def test_llama_sized_rows_bf16_on_cuda(dim: int) -> None:
    x, weight = random_rows(37, dim, torch.bfloat16, seed=dim)
    residual, _ = random_rows(37, dim, torch.bfloat16, seed=dim + 1)
    normed, summed = fused_add_rms_norm(x, residual, weight, EPS)
    expected_normed, expected_summed = fused_add_rms_norm_reference(x, residual, weight, EPS)
    assert torch.equal(summed, expected_summed)
    assert ulp_distance(normed, expected_normed) <= 1
    assert ulp_distance(rms_norm(x, weight, EPS), rms_norm_reference(x, weight, EPS)) <= 1
