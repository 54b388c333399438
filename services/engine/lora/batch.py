"""Which adapter slot each token of a step uses, grouped for the LoRA matmuls (S-LoRA/Punica style).

build_batch lays tokens out by sequence; sequences of one adapter need not be next to each other.
Every adapted projection of the step then runs one grouped pass over the same grouping:

    token_slots[t]   slot of token t, or -1 (the base model: no LoRA term)        (T,)
    order            indices of the tokens with a slot, grouped by slot, each      (L,)
                     group in token order
    segments         (slot, start, end): order[start:end] are the tokens of slot    G entries
    seg_starts       [s_0, s_1, ..., s_G = L], and seg_slots: the same on the device (G+1,), (G,)

A step without any adapter token has no LoraBatch at all (ForwardContext.lora is None), so the
base model's path, the CPU decoder and the CUDA graphs, stays as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class LoraBatch:
    token_slots: torch.Tensor  # (T,) int64, -1: base model
    order: torch.Tensor  # (L,) int64
    segments: tuple[tuple[int, int, int], ...]  # (slot, start, end) into order, host side
    seg_starts: torch.Tensor  # (G+1,) int64
    seg_slots: torch.Tensor  # (G,) int64
    max_segment: int  # most tokens of one segment (the grouped kernel's grid)
    # slot_mask() results per (slots, dtype), made once per step and shared by every projection.
    _masks: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def slot_mask(self, num_slots: int, dtype: torch.dtype) -> torch.Tensor:
        """(T, num_slots) one-hot of each token's slot in `dtype`; all zeros for a base-model token."""
        key = (num_slots, dtype)
        if key not in self._masks:
            slots = torch.arange(num_slots, device=self.token_slots.device)
            self._masks[key] = (self.token_slots[:, None] == slots[None, :]).to(dtype)
        return self._masks[key]

    @property
    def num_tokens(self) -> int:
        """L: tokens that get a LoRA term."""
        return int(self.order.shape[0])

    @classmethod
    def of(cls, token_slots: list[int], device: torch.device) -> LoraBatch | None:
        """The grouping of one step's tokens; None when no token has an adapter."""
        by_slot: dict[int, list[int]] = {}
        for token, slot in enumerate(token_slots):
            if slot >= 0:
                by_slot.setdefault(slot, []).append(token)
        if not by_slot:
            return None
        order: list[int] = []
        segments: list[tuple[int, int, int]] = []
        for slot in sorted(by_slot):
            segments.append((slot, len(order), len(order) + len(by_slot[slot])))
            order += by_slot[slot]

        def tensor(values: list[int]) -> torch.Tensor:
            host = torch.tensor(values, dtype=torch.int64, pin_memory=device.type == "cuda")
            return host.to(device, non_blocking=True)

        return cls(
            token_slots=tensor(token_slots),
            order=tensor(order),
            segments=tuple(segments),
            seg_starts=tensor([s for _, s, _ in segments] + [len(order)]),
            seg_slots=tensor([slot for slot, _, _ in segments]),
            max_segment=max(end - start for _, start, end in segments),
        )
