"""The grouped LoRA matmul kernel against the torch reference (lora/weights.py), in Triton's
interpreter on CPU or compiled on CUDA: segments of several slots, tokens of one adapter scattered
through the batch, base tokens between them, segments longer than a program's rows, widths and
output sizes that are not multiples of the tiles."""

from __future__ import annotations

import random

import pytest
import torch

from services.engine.lora.batch import LoraBatch
from services.engine.lora.weights import grouped_matmul_reference
from tests.engine.kernels.kernel_device import DEVICE
from tests.tolerances import assert_close


@pytest.mark.parametrize(
    ("tokens", "in_features", "width", "out_features", "slots"),
    [(1, 64, 16, 64, 1), (37, 64, 48, 160, 3), (70, 100, 24, 96, 4)],
)
def test_grouped_matmul_matches_the_reference(
    tokens: int, in_features: int, width: int, out_features: int, slots: int
) -> None:
    from services.engine.kernels.lora_matmul import lora_grouped_matmul

    rng = random.Random(tokens)
    generator = torch.Generator().manual_seed(tokens)
    token_slots = [rng.randrange(-1, slots) for _ in range(tokens)]
    token_slots[0] = 0  # at least one adapter token
    batch = LoraBatch.of(token_slots, torch.device(DEVICE))
    assert batch is not None
    x = torch.randn(tokens, in_features, generator=generator).to(DEVICE)
    a = (torch.randn(slots, in_features, width, generator=generator) / in_features**0.5).to(DEVICE)
    b = torch.randn(slots, width, out_features, generator=generator).to(DEVICE)
    got = lora_grouped_matmul(x, a, b, batch)
    want = grouped_matmul_reference(x, a, b, batch)
    assert got.shape == (batch.num_tokens, out_features)
    assert_close(got, want.float(), dtype=torch.float32, reduction=in_features + width)
