"""Randomness of a step: the final draw and the XTC coin.

Draw by exponential race: with q_i ~ Exp(1) independent, q_i / p_i ~ Exp(rate p_i) and the
smallest of independent exponentials is the i-th with probability p_i / sum(p); so
argmax_i p_i / q_i is a draw from p, one vectorised argmax instead of a multinomial. We take it
as argmax_i (logit_i - log q_i), the same race without the softmax, so the result does not
depend on how a softmax would have summed the row, and make q_i = -log u_i from uniforms
(cheaper than `exponential_` on CPU).

Unseeded rows share one batched draw from torch's default RNG on the logits' device; on CUDA, when
no row is seeded, that draw is one fused kernel instead (kernels/sampling.py: Philox noise made
in-kernel, never materialised), keyed each step by two ints from torch's CPU default generator, so
torch.manual_seed still fixes it and nothing waits for the GPU. A seeded row
draws from its own CPU generator (moved to the device afterwards), so its token depends only on
its own logits and generator state, never on the other rows of the batch or their order.

Per step, a seeded non-greedy row consumes from its generator, in this order:
1. if its xtc_probability > 0: one `torch.rand(1)` (the XTC coin);
2. V uniforms, `uniform_()` into a contiguous float32 vector of V = the logits' width, entry t
   giving token t's q (the whole vocabulary, whatever truncation left).
Greedy rows consume nothing. This pattern defines seeded reproducibility; changing it changes
the tokens every seeded request produces.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.engine.kernels import triton_runs_on
from services.engine.sampler.candidates import Candidates
from services.engine.sampler.row_argmax import row_argmax


def exponential_race(
    c: Candidates, generators: Sequence[torch.Generator | None], vocab_size: int, fused: bool | None = None
) -> torch.Tensor:
    """c.values (R, W) final logits -> (R,) long sampled token ids. fused: whether a batch without
    seeded rows draws in the fused kernel (None: fused_draw_runs_on the device)."""
    rows, width = c.values.shape
    device = c.values.device
    seeded = [i for i, g in enumerate(generators) if g is not None]
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if fused is None:
        fused = fused_draw_runs_on(device)
    if not seeded and fused:
        return c.token_ids(_fused_race(c.values))
    if not seeded:
        uniforms = torch.empty(rows, width, device=device).uniform_()  # (R, W)
    else:
        uniforms = torch.empty(rows, width, device=device)
        if unseeded:
            index = torch.tensor(unseeded, device=device)
            uniforms.index_copy_(0, index, torch.empty(len(unseeded), width, device=device).uniform_())
        host = torch.empty(len(seeded), vocab_size)  # (S, V)
        for j, i in enumerate(seeded):
            host[j].uniform_(generator=generators[i])
        own = host.to(device)  # (S, V), indexed by token id
        if c.ids is not None:
            own = own.gather(-1, c.ids.index_select(0, torch.tensor(seeded, device=device)))  # (S, W)
        uniforms.index_copy_(0, torch.tensor(seeded, device=device), own)
    log_q = uniforms.log_().neg_().log_()  # (R, W): log of q = -log u ~ Exp(1); u = 0 gives +inf
    scores = c.values - log_q  # (R, W); -inf logits stay -inf
    return c.token_ids(row_argmax(scores))


def fused_draw_runs_on(device: torch.device) -> bool:
    """Whether an all-unseeded draw goes through the fused kernel by default: on CUDA only (on CPU
    its interpreter would crawl, and the torch draw is the portable reference)."""
    return device.type == "cuda"


def fused_draw_for(backend: str, device: torch.device) -> bool:
    """--sampling-backend (auto, torch or triton) on `device` -> whether the fused draw is used."""
    if backend == "auto":
        return fused_draw_runs_on(device)
    if backend == "triton" and not triton_runs_on(device):
        raise ValueError(f"--sampling-backend triton needs a CUDA device, or TRITON_INTERPRET=1 on CPU ({device})")
    return backend == "triton"


def _fused_race(values: torch.Tensor) -> torch.Tensor:
    """values (R, W) -> (R,) long columns, drawn by the fused kernel with a fresh per-step key."""
    from services.engine.kernels.sampling import MAX_OFFSET, exponential_race_argmax

    seed, offset = torch.randint(MAX_OFFSET, (2,)).tolist()  # CPU default generator: no device sync
    return exponential_race_argmax(values, seed, offset)


def row_uniforms(
    rows: int, drawing: Sequence[int], generators: Sequence[torch.Generator | None], device: torch.device
) -> torch.Tensor:
    """(rows,) float32: U(0, 1) for the rows listed in `drawing` (seeded ones from their own
    generator), 1.0 for the others."""
    values = torch.ones(rows, device=device)
    unseeded = [i for i in drawing if generators[i] is None]
    seeded = [i for i in drawing if generators[i] is not None]
    if unseeded:
        values.index_copy_(0, torch.tensor(unseeded, device=device), torch.rand(len(unseeded), device=device))
    if seeded:
        host = torch.cat([torch.rand(1, generator=generators[i]) for i in seeded])  # (S,)
        values.index_copy_(0, torch.tensor(seeded, device=device), host.to(device))
    return values
