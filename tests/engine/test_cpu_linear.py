"""The CPU linear paths against torch's F.linear: the packed_linear kernel and the oneDNN
pre-packed weight, float32 and bfloat16, with and without bias, odd widths, every tile shape."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.engine.cpu_kernels import load
from services.engine.models.layers import CpuWeight, Linear, LMHead, pack_linears

kernels = load()

# Both sides sum `in` float32 products in different orders: the error grows like sqrt(in) ulps
# of the sum; bfloat16 outputs add their own rounding (8 bits of mantissa).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def kernel_dtypes() -> list[torch.dtype]:
    return [getattr(torch, name) for name in kernels.PACKED_LINEAR_DTYPES] if kernels is not None else []


def packs_here(dtype: torch.dtype, with_kernels: bool) -> bool:
    """Whether pack_linears packs a weight of `dtype` on this CPU: float32 always (oneDNN);
    bfloat16 where oneDNN has it (AVX-512) or, with the kernels, where packed_linear has it."""
    if dtype != torch.bfloat16:
        return True
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) or (with_kernels and dtype in kernel_dtypes())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 16, 70])
@pytest.mark.parametrize("with_kernels", [True, False], ids=["packed-linear-kernel", "onednn-only"])
def test_packed_layers_match_their_plain_weights(dtype: torch.dtype, rows: int, with_kernels: bool) -> None:
    if with_kernels and kernels is None:
        pytest.skip("the CPU kernels could not be built here")
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(500, 64).to(dtype)
    model = torch.nn.ModuleDict(
        {"proj": Linear(64, 96, bias=True).to(dtype), "head": LMHead(64, 500, tied_to=embedding)}
    )
    x = torch.randn(rows, 64).to(dtype)
    with torch.inference_mode():
        plain = model["proj"](x), model["head"](x)
        assert pack_linears(model, kernels if with_kernels else None) == (2 if packs_here(dtype, with_kernels) else 0)
        packed = model["proj"](x), model["head"](x)
    for before, after in zip(plain, packed, strict=True):
        scale = before.float().abs().max().item()
        torch.testing.assert_close(after.float(), before.float(), atol=TOLERANCE[dtype] * scale, rtol=TOLERANCE[dtype])


def test_bfloat16_stays_unpacked_where_onednn_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without oneDNN bfloat16 (pre-AVX-512) keeps torch's linear for a bfloat16 model."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    model = torch.nn.ModuleDict({"bf16": Linear(8, 4).to(torch.bfloat16), "fp32": Linear(8, 4)})
    assert pack_linears(model, None) == 1  # such a CPU has no AVX-512 BF16 for packed_linear either
    assert model["bf16"].cpu_weight is None and model["fp32"].cpu_weight is not None
    x = torch.randn(3, 8).bfloat16()
    with torch.inference_mode():
        assert torch.equal(model["bf16"](x), F.linear(x, model["bf16"].weight, model["bf16"].bias))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 16, 63, 257, 600])
@pytest.mark.parametrize(("out", "width", "bias"), [(960, 576, False), (37, 64, True), (48, 1538, True)])
def test_packed_linear_matches_f_linear(dtype: torch.dtype, rows: int, out: int, width: int, bias: bool) -> None:
    """Every tile shape: rows past one 8-row tile and one 256-row panel, outputs that fill 1-3
    blocks of 16 or leave a partial block (37), widths of one to many steps."""
    if dtype not in kernel_dtypes():
        pytest.skip(f"no {dtype} packed_linear on this CPU")
    assert kernels is not None
    generator = torch.Generator().manual_seed(rows * out)
    x = torch.randn(rows, width, generator=generator).to(dtype)
    weight = torch.randn(out, width, generator=generator).to(dtype)
    b = torch.randn(out, generator=generator).to(dtype) if bias else None
    got = kernels.packed_linear(x, kernels.pack_linear(weight), out, b)
    want = F.linear(x.float(), weight.float(), None if b is None else b.float())
    assert got.dtype == dtype and got.shape == (rows, out)
    scale = want.abs().max().item()
    torch.testing.assert_close(got.float(), want, atol=TOLERANCE[dtype] * scale, rtol=TOLERANCE[dtype])


@pytest.mark.skipif(torch.bfloat16 not in kernel_dtypes(), reason="no bfloat16 packed_linear on this CPU")
def test_packed_linear_refuses_bad_inputs_by_name() -> None:
    assert kernels is not None
    with pytest.raises(RuntimeError, match="even input width"):
        kernels.pack_linear(torch.randn(4, 7).bfloat16())
    with pytest.raises(RuntimeError, match="has no Half kernel"):
        kernels.pack_linear(torch.randn(4, 8).half())
    packed = kernels.pack_linear(torch.randn(20, 8).bfloat16())
    with pytest.raises(RuntimeError, match="x has 6 columns, the packed weight 8"):
        kernels.packed_linear(torch.randn(2, 6).bfloat16(), packed, 20)
    with pytest.raises(RuntimeError, match="does not match"):
        kernels.packed_linear(torch.randn(2, 8).bfloat16(), packed, 40)
    with pytest.raises(RuntimeError, match="share a dtype"):
        kernels.packed_linear(torch.randn(2, 8), packed, 20)


@pytest.mark.skipif(kernels is None, reason="the CPU kernels could not be built here")
def test_layers_take_the_packed_kernel_for_the_dtypes_it_has() -> None:
    model = torch.nn.ModuleDict({"bf16": Linear(64, 40).to(torch.bfloat16), "fp32": Linear(64, 40)})
    assert pack_linears(model, kernels) == 1 + packs_here(torch.bfloat16, with_kernels=True)
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        weight = model[name].cpu_weight
        if not packs_here(dtype, with_kernels=True):
            assert weight is None, name
            continue
        assert isinstance(weight, CpuWeight), name
        assert (weight.kernel is not None) == (dtype in kernel_dtypes()), name
