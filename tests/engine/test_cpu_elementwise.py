"""The C++ elementwise kernels against the torch ops they replace (services/engine/models/layers.py):
RMSNorm with and without the residual add, rotary on strided q/k views, SiLU-mul; float32 and
bfloat16. bfloat16 results must round the same way: at most one bfloat16 step apart where a
float32 sum order differs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.engine.cpu_kernels import load
from services.engine.models.layers import RMSNorm, apply_rotary

kernels = load()
pytestmark = pytest.mark.skipif(kernels is None, reason="the CPU kernels could not be built here")

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}  # bfloat16: one step of 8 mantissa bits


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = TOLERANCE[want.dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol * want.float().abs().max().item(), rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_rms_norm_and_add_rms_norm(dtype: torch.dtype, rows: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    norm = RMSNorm(576, 1e-5).to(dtype)
    norm.weight.data = torch.randn(576, generator=generator).to(dtype)
    x = (3 * torch.randn(rows, 576, generator=generator)).to(dtype)
    residual = torch.randn(rows, 576, generator=generator).to(dtype)
    close(kernels.rms_norm(x, norm.weight, norm.eps), norm(x))
    normed, summed = kernels.add_rms_norm(x, residual, norm.weight, norm.eps)
    want_normed, want_summed = norm.add_forward(x, residual)
    assert torch.equal(summed, want_summed)  # one rounded add: identical
    close(normed, want_normed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 7])
def test_rotary_on_strided_q_and_k(dtype: torch.dtype, tokens: int) -> None:
    generator = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (9 + 3 + 3) * 64, generator=generator).to(dtype)
    q, k, _ = (part.unflatten(-1, (-1, 64)) for part in qkv.split([576, 192, 192], dim=-1))
    positions = torch.arange(100, 100 + tokens).float()
    freqs = positions[:, None] * (1.0 / 10000 ** (torch.arange(0, 64, 2).float() / 64))[None, :]
    cos, sin = freqs.cos(), freqs.sin()
    for x in (q, k):
        assert tokens == 1 or not x.is_contiguous()
        close(kernels.rotary(x, cos, sin), apply_rotary(x, cos, sin))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(dtype: torch.dtype) -> None:
    gate_up = (4 * torch.randn(5, 2 * 1539, generator=torch.Generator().manual_seed(0))).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    close(kernels.silu_mul(gate_up), F.silu(gate) * up)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_at_the_ends_of_exp(dtype: torch.dtype) -> None:
    """Gates whose exp(-gate) underflows, overflows to inf (past ~88.72) or sits at the edge between:
    the vector paths' exp must not wrap its exponent there (a very negative gate's SiLU is -0)."""
    ends = [-1e4, -100.0, -89.0, -88.8, -88.7, -88.5, -87.4, -87.2, -30.0, -1e-3, 0.0, 1e-3, 30.0]
    ends += [87.2, 87.4, 88.5, 88.7, 88.8, 89.0, 100.0, 1e4]
    gate = torch.tensor(ends).repeat(3)[:61].to(dtype)  # 61: every lane of the 8- and 16-wide loops, and a tail
    up = torch.linspace(-2, 2, 61).to(dtype)
    got = kernels.silu_mul(torch.cat([gate, up])[None])
    want = F.silu(gate) * up
    assert not got.isnan().any()
    close(got, want[None])


def test_bad_inputs_are_refused_by_name() -> None:
    with pytest.raises(RuntimeError, match="weight"):
        kernels.rms_norm(torch.randn(2, 8), torch.ones(4), 1e-5)
    with pytest.raises(RuntimeError, match="cos and sin"):
        kernels.rotary(torch.randn(2, 3, 8), torch.randn(2, 3), torch.randn(2, 3))
    with pytest.raises(RuntimeError, match="even"):
        kernels.silu_mul(torch.randn(2, 7))
