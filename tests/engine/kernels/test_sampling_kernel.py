"""The fused draw: the same tokens as its torch reference (same Philox noise, same argmax) however
the rows are split across programs; a lone live token always wins; frequencies over many rows and
seeds follow each row's softmax; the noise is fixed by (seed, offset) and changes with either."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from services.engine.kernels.sampling import (
    MAX_OFFSET,
    exponential_race_argmax,
    exponential_race_argmax_reference,
)
from tests.engine.kernels.kernel_device import DEVICE
from tests.engine.kernels.poisoned_outputs import poisoned_outputs

needs_cuda = pytest.mark.cuda
NEG_INF = float("-inf")
# (seed, offset) pairs, incl. a seed using Philox's high key word and an offset past 2^32 (high counter word).
DRAWS = [(0, 0), (7, 123), (2**40 + 5, 9), (12345, 2**33 + 17)]


@pytest.fixture(autouse=True)
def _poisoned_outputs() -> Iterator[None]:
    with poisoned_outputs():
        yield


def random_logits(rows: int, width: int, seed: int, dropped: float = 0.3) -> torch.Tensor:
    """Logits with a fraction of -inf (truncated) entries; every row keeps at least one live token."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, width, generator=g) * 2
    drop = torch.rand(rows, width, generator=g) < dropped
    drop[:, 0] = False
    logits[drop] = NEG_INF
    return logits[:, torch.randperm(width, generator=g)].contiguous().to(DEVICE)


@pytest.mark.parametrize(("seed", "offset"), DRAWS)
def test_matches_reference(seed: int, offset: int) -> None:
    logits = random_logits(9, 37, seed=seed % 1000)
    tokens = exponential_race_argmax(logits, seed, offset)
    assert tokens.dtype == torch.int64 and tokens.shape == (9,)
    assert torch.equal(tokens, exponential_race_argmax_reference(logits, seed, offset))


@pytest.mark.parametrize("split_columns", [37, 64, 100])
def test_splitting_rows_changes_nothing(split_columns: int) -> None:
    logits = random_logits(6, 300, seed=split_columns)
    expected = exponential_race_argmax_reference(logits, 99, 5)
    assert torch.equal(exponential_race_argmax(logits, 99, 5), expected)
    assert torch.equal(exponential_race_argmax(logits, 99, 5, split_columns=split_columns), expected)


def test_default_split_of_a_wide_row() -> None:
    """One row of more than MIN_SPLIT_COLUMNS is split across programs by default."""
    logits = torch.randn(1, 5000, generator=torch.Generator().manual_seed(4)).to(DEVICE) * 0.1
    for seed in range(3):
        assert torch.equal(exponential_race_argmax(logits, seed, 0), exponential_race_argmax_reference(logits, seed, 0))


def test_a_lone_live_token_always_wins() -> None:
    width = 7
    rows = 4 * width
    live = torch.arange(rows) % width
    logits = torch.full((rows, width), NEG_INF)
    logits[torch.arange(rows), live] = torch.tensor([-80.0, -3.0, 0.0, 60.0]).repeat_interleave(width)
    logits = logits.to(DEVICE)
    for seed, offset in DRAWS:
        assert torch.equal(exponential_race_argmax(logits, seed, offset).cpu(), live)


def test_an_all_minus_inf_row_gets_column_zero() -> None:
    logits = torch.full((3, 5), NEG_INF, device=DEVICE)
    logits[1, 3] = 0.0
    assert exponential_race_argmax(logits, 3, 4).tolist() == [0, 3, 0]


DISTRIBUTIONS = torch.tensor(
    [
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # uniform
        [2.0, 1.0, 0.0, -1.0, -2.0, -3.0],  # graded
        [0.5, NEG_INF, 1.5, NEG_INF, -0.5, 0.0],  # truncated: two impossible tokens
        [4.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # peaked: rare tokens still drawn
    ]
)


def test_frequencies_follow_softmax() -> None:
    """Each distribution fills 2000 rows of one launch; three launches with different (seed, offset).
    Per distribution 6000 draws: a frequency's standard deviation is at most 0.0065."""
    copies = 2000
    logits = DISTRIBUTIONS.repeat_interleave(copies, dim=0).to(DEVICE)  # (4 * copies, 6)
    counts = torch.zeros_like(DISTRIBUTIONS)
    for seed, offset in DRAWS[1:]:
        tokens = exponential_race_argmax(logits, seed, offset).cpu().view(len(DISTRIBUTIONS), copies)
        counts += torch.nn.functional.one_hot(tokens, DISTRIBUTIONS.shape[1]).sum(dim=1)
    frequencies = counts / counts.sum(dim=1, keepdim=True)
    expected = DISTRIBUTIONS.softmax(dim=1)
    assert (frequencies[expected == 0] == 0).all()
    assert (frequencies - expected).abs().max() < 0.025, f"{frequencies} vs {expected}"


def test_noise_is_fixed_by_seed_and_offset() -> None:
    logits = torch.zeros(200, 8, device=DEVICE)  # uniform rows: the tokens are the noise's argmax
    tokens = exponential_race_argmax(logits, 11, 40)
    assert torch.equal(exponential_race_argmax(logits, 11, 40), tokens)
    assert (exponential_race_argmax(logits, 12, 40) != tokens).float().mean() > 0.5
    assert (exponential_race_argmax(logits, 11, 41) != tokens).float().mean() > 0.5
    # The counter of row r, column c is offset + r * W + c: moving the offset by W shifts rows up by one.
    assert torch.equal(exponential_race_argmax(logits, 11, 48)[:-1], tokens[1:])


def test_rejects_what_it_cannot_draw_from() -> None:
    logits = torch.zeros(2, 4, device=DEVICE)
    with pytest.raises(ValueError, match="seed"):
        exponential_race_argmax(logits, -1, 0)
    with pytest.raises(ValueError, match="offset"):
        exponential_race_argmax(logits, 0, MAX_OFFSET)
    with pytest.raises(ValueError, match="float32"):
        exponential_race_argmax(logits.double(), 0, 0)


@needs_cuda
def test_vocabulary_wide_rows_on_cuda() -> None:
    """Full-vocabulary rows (Qwen-sized), few and many: the default splits, the same tokens as torch
    but for rare near-ties where the GPU's log differs from torch's by an ulp."""
    for rows in (1, 3, 64):
        logits = random_logits(rows, 151936, seed=rows, dropped=0.0)
        matches = sum(
            torch.equal(exponential_race_argmax(logits, s, 0), exponential_race_argmax_reference(logits, s, 0))
            for s in range(5)
        )
        assert matches >= 4
