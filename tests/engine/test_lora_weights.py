"""LoraWeights: PEFT's per-projection A/B written into a fused projection's slot give each token
x @ A.T @ B.T * scaling on its own shard's rows, through the dense (all slots, masked) pass and the
per-adapter loop alike; base tokens and unadapted shards get nothing."""

from __future__ import annotations

import pytest
import torch

from services.engine.lora import weights as lora_weights
from services.engine.lora.batch import LoraBatch
from services.engine.lora.weights import LoraWeights

SHARDS = (12, 4, 4)  # a qkv_proj: q, k, v rows
IN, RANK, SLOTS = 16, 4, 3


Shards = list[tuple[torch.Tensor, torch.Tensor] | None]


def expected(x: torch.Tensor, token_slots: list[int], adapters: dict[int, tuple[Shards, float]]) -> torch.Tensor:
    """The LoRA term of every token, one token and one shard at a time (PEFT's formula)."""
    out = torch.zeros(x.shape[0], sum(SHARDS), dtype=torch.float64)
    for t, slot in enumerate(token_slots):
        if slot < 0:
            continue
        row = 0
        for size, pair in zip(SHARDS, adapters[slot][0], strict=True):
            if pair is not None:
                a, b = pair
                out[t, row : row + size] = (x[t].double() @ a.double().T @ b.double().T) * adapters[slot][1]
            row += size
    return out


@pytest.mark.parametrize("dense", [True, False])
def test_each_token_gets_its_slots_adapter_on_its_shards_rows(dense: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lora_weights, "DENSE_MAX_WIDTH", 10**6 if dense else 0)
    generator = torch.Generator().manual_seed(0)

    def pair(rank: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(rank, IN, generator=generator), torch.randn(out, rank, generator=generator)

    adapters: dict[int, tuple[Shards, float]] = {
        0: ([pair(4, 12), pair(4, 4), pair(4, 4)], 2.0),  # every shard at the full rank
        2: ([pair(2, 12), None, pair(2, 4)], 0.5),  # q and v at rank 2, k unadapted
    }
    lora = LoraWeights(IN, SHARDS, SLOTS, RANK, torch.float32, torch.device("cpu"))
    for slot, (shards, scaling) in adapters.items():
        lora.write(slot, shards, scaling)
    lora.write(1, [pair(4, 12), None, None], 9.0)
    lora.clear(1)  # a cleared slot is zeros again
    token_slots = [2, -1, 0, 0, 2, -1, 0]
    batch = LoraBatch.of(token_slots, torch.device("cpu"))
    assert batch is not None
    x = torch.randn(len(token_slots), IN, generator=generator)
    base = torch.randn(len(token_slots), sum(SHARDS), generator=generator)
    got = lora.add_to(base.clone(), x, batch) - base
    torch.testing.assert_close(got.double(), expected(x, token_slots, adapters), rtol=1e-5, atol=1e-5)
    assert not got[[1, 5]].any()
