"""The engine's large CPU tensors (KV pools, packed weights) sit in mappings advised for huge pages."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from services.engine import huge_pages
from services.engine.attention.backend import KVCache

SMAPS = Path("/proc/self/smaps")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")  # absent: a kernel built without THP refuses the advice
pytestmark = pytest.mark.skipif(
    not SMAPS.exists() or not hasattr(mmap, "MADV_HUGEPAGE") or not THP.exists(),
    reason="Linux /proc, madvise and transparent huge pages only",
)


def vm_flags(tensor: torch.Tensor) -> set[str]:
    """The VmFlags of the mapping that holds `tensor`'s first byte ("hg": advised for huge pages)."""
    address = tensor.data_ptr()
    inside = False
    for line in SMAPS.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    raise AssertionError("no mapping holds the tensor")


def test_zeros_is_zeroed_writable_and_advised() -> None:
    t = huge_pages.zeros((3, 1024, 1024), torch.bfloat16)  # 6 MiB
    assert t.shape == (3, 1024, 1024) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert not t.any()
    t[1, 2, 3] = 5.0
    assert t.sum().item() == 5.0
    assert "hg" in vm_flags(t)
    assert "hg" not in vm_flags(torch.zeros(3, 1024, 1024))  # torch's own allocation is not


def test_copy_of_keeps_contents() -> None:
    source = torch.randn(257, 33)
    copy = huge_pages.copy_of(source)
    assert torch.equal(copy, source) and copy.data_ptr() != source.data_ptr()
    assert huge_pages.zeros((0, 4), torch.float32).shape == (0, 4)


def test_cpu_kv_pools_are_advised_and_zero() -> None:
    cache = KVCache(2, 64, 16, 2, 64, torch.float32, torch.device("cpu"))
    for pool in (*cache.k, *cache.v):
        assert pool.shape == (66, 16, 2, 64) and not pool.any()
        assert "hg" in vm_flags(pool)


def test_packed_weights_are_advised() -> None:
    from services.engine.cpu_kernels import load
    from services.engine.models.layers import Linear, pack_linears

    kernels = load()
    if kernels is None or "float32" not in kernels.PACKED_LINEAR_DTYPES:
        pytest.skip("no packed_linear kernel on this CPU")
    layer = Linear(64, 96, bias=False)
    assert pack_linears(layer, kernels) == 1
    assert layer.cpu_weight is not None and "hg" in vm_flags(layer.cpu_weight.packed)
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer.cpu_weight.linear(x, None), x @ layer.weight.T, rtol=1e-5, atol=1e-5)
