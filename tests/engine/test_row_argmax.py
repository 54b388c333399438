"""cpu_kernels' argmax_rows (greedy tokens, the random draw's race) gives torch.argmax's answer:
the first index of each row's maximum, NaN counting as the maximum."""

from __future__ import annotations

import pytest
import torch

from services.engine.cpu_kernels import load
from services.engine.sampler.row_argmax import row_argmax

kernels = load()
pytestmark = pytest.mark.skipif(kernels is None, reason="the CPU kernels could not be built here")


@pytest.mark.parametrize("vocab", [1, 7, 16, 17, 49152, 49157])
def test_random_rows_match_torch(vocab: int) -> None:
    x = torch.randn(33, vocab, generator=torch.Generator().manual_seed(vocab))
    assert torch.equal(kernels.argmax_rows(x), x.argmax(dim=-1))


def test_ties_take_the_first_index_in_every_lane_and_the_tail() -> None:
    x = torch.zeros(6, 100)
    x[0, [3, 19, 35]] = 5.0  # the same lane of three vectors
    x[1, [21, 4]] = 5.0  # two lanes: the smaller index wins
    x[2, [97, 99]] = 5.0  # in the scalar tail
    x[3, [15, 99]] = 5.0  # a vector's lane against the tail
    x[4] = float("-inf")  # all -inf: index 0, as torch
    x[5, 50] = float("inf")
    assert kernels.argmax_rows(x).tolist() == [3, 4, 97, 15, 0, 50] == x.argmax(dim=-1).tolist()


@pytest.mark.parametrize("vocab", [*range(1, 80), 255, 256, 257, 4099])
def test_rows_full_of_ties_match_torch(vocab: int) -> None:
    # Few distinct values: a row's maximum sits in many lanes of every vector (AVX-512: one set of 16
    # lanes; AVX2: four sets of 8, interleaved) and in the scalar tail, so each lane's first index and
    # the smallest across lanes and sets must both be kept.
    x = torch.randint(-3, 3, (20, vocab), generator=torch.Generator().manual_seed(vocab)).float()
    x[0] = float("-inf")
    assert torch.equal(kernels.argmax_rows(x), x.argmax(dim=-1))


def test_nan_counts_as_the_maximum() -> None:
    x = torch.randn(4, 40)
    x[0, 30] = float("nan")  # in a vector
    x[1, [5, 33]] = float("nan")  # the first of two
    x[2, 39] = float("nan")  # in the tail
    x[3, 2] = float("inf")
    assert kernels.argmax_rows(x).tolist() == [30, 5, 39, 2] == x.argmax(dim=-1).tolist()


def test_strided_rows_and_the_torch_fallback() -> None:
    wide = torch.randn(8, 300)
    view = wide[:, 10:250]  # rows 300 apart, each dense
    assert torch.equal(row_argmax(view), view.argmax(dim=-1))
    for other in (view.double(), wide.t(), torch.randn(3, 40).to(torch.bfloat16)):
        assert torch.equal(row_argmax(other), other.argmax(dim=-1))
