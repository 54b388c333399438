"""The tolerance helper against sums it is meant to bound, and against the errors it must not hide."""

from __future__ import annotations

import pytest
import torch

from tests.tolerances import UNIT_ROUNDOFF, assert_close, tolerance


def test_relative_tolerance_is_roundings_plus_a_random_walk_of_float32_sums() -> None:
    assert tolerance(torch.float32, 1)["rtol"] == pytest.approx(2 * 2**-24 + 8 * 2**-24)
    assert tolerance(torch.bfloat16, 100, scale=3.0, roundings=2) == pytest.approx(
        {"rtol": 4 * 2**-8 + 80 * 2**-24, "atol": 3 * (4 * 2**-8 + 80 * 2**-24)}
    )
    assert UNIT_ROUNDOFF[torch.float16] == 2**-11


@pytest.mark.parametrize("n", [16, 1024, 65536])
def test_float32_sums_in_other_orders_stay_inside(n: int) -> None:
    """Dot products of n terms, summed blockwise (as a matmul kernel does) and sequentially."""
    gen = torch.Generator().manual_seed(n)
    a, b = torch.randn(64, n, generator=gen), torch.randn(n, generator=gen)
    exact = (a.double() @ b.double()).float()
    blocked = a @ b
    sequential = torch.zeros(64)
    for start in range(0, n, max(1, n // 16)):  # 16 partial sums, added in turn
        sequential += a[:, start : start + max(1, n // 16)] @ b[start : start + max(1, n // 16)]
    # The terms are ~1: their sum is ~sqrt(n), the size the float32 errors scale with.
    for got in (blocked, sequential):
        assert_close(got, exact, reduction=n)


def test_an_error_of_a_bug_does_not_fit() -> None:
    gen = torch.Generator().manual_seed(0)
    expected = torch.randn(4096, generator=gen)
    wrong = expected.clone()
    wrong[123] += 1e-3 * expected.abs().mean()  # one value off by a thousandth of the scale
    with pytest.raises(AssertionError):
        assert_close(wrong, expected, reduction=4096)
