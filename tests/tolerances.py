"""How far apart two computations of the same values may land, from their dtype and the length of
the reductions behind them, instead of constants tuned on one CPU.

Every kernel and torch op the engine runs accumulates in float32 and rounds its result to the
storage dtype. Two computations that differ only in how they sum (another blocking of a matmul
for another batch shape, another vector width or instruction set, fused multiply-adds or not, a
Triton kernel against torch) then differ by:

- the float32 sums: rounding errors add like a random walk, about U32 * sqrt(n) times the size of
  the terms in a sum of n of them (Higham & Mary, "A new approach to probabilistic rounding error
  analysis", SIAM J. Sci. Comput. 2019; at worst U32 * n). Through a model forward the sums chain
  up, so n is the whole chain behind a value (`forward_reduction`);
- roundings to the storage dtype the two do at different points: each may land one step apart,
  2 * u(dtype) relative (the result's own rounding is one; a kernel that rounds an intermediate,
  e.g. attention probabilities to bfloat16 before the value product, adds one).

    relative = roundings * 2 * u(dtype) + SAFETY * U32 * sqrt(n)
    rtol = relative,  atol = relative * scale   (scale: the typical size of the values, by default
                                                 the root mean square of the expected ones: errors
                                                 carried through earlier sums grow with it)

with u the unit roundoff (2^-24 float32, 2^-11 float16, 2^-8 bfloat16). SAFETY = 8: the random walk
has a standard deviation of about U32 * sqrt(n) * scale / sqrt(3), and the largest of a few thousand
compared values lies about four standard deviations out; the rest is margin for terms larger than
the scale. A bug (a wrong mask, a stale block, a misplaced row) moves values by a
sizeable fraction of their scale: orders of magnitude above these tolerances in float32.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from services.engine.models.llama import DecoderSpec

# Attention in half precision rounds twice where a float32 / float64 reference may not: the
# probabilities (cast to the value dtype before their product), then the output.
ATTENTION_ROUNDINGS = 2
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float64: 2.0**-53}
SAFETY = 8


def tolerance(dtype: torch.dtype, reduction: int, scale: float = 1.0, roundings: int = 1) -> dict[str, float]:
    """{"atol", "rtol"} for torch.testing.assert_close, for values stored in `dtype` that each come
    out of float32 reductions totalling `reduction` terms of size about `scale`."""
    relative = roundings * 2 * UNIT_ROUNDOFF[dtype] + SAFETY * UNIT_ROUNDOFF[torch.float32] * math.sqrt(reduction)
    return {"atol": relative * scale, "rtol": relative}


def assert_close(
    actual: Any,
    expected: Any,
    *,
    reduction: int,
    dtype: torch.dtype | None = None,
    scale: float | None = None,
    roundings: int = 1,
    **kwargs: Any,
) -> None:
    """torch.testing.assert_close with `tolerance`: `dtype` defaults to expected's, `scale` to the
    root mean square of its finite values (expected may be a list of tensors, as cache snapshots are)."""
    tensors = expected if isinstance(expected, (list, tuple)) else [expected]
    dtype = dtype or tensors[0].dtype
    if scale is None:
        scale = root_mean_square(tensors)
    torch.testing.assert_close(actual, expected, **tolerance(dtype, reduction, scale, roundings), **kwargs)


def root_mean_square(tensors: list[torch.Tensor]) -> float:
    """The root mean square of the tensors' finite values (1.0 if there are none)."""
    finite = torch.cat([t[t.isfinite()].double().flatten() for t in tensors])
    return float(finite.square().mean().sqrt()) if finite.numel() else 1.0


def attention_scale(expected: torch.Tensor, v_cache: torch.Tensor) -> float:
    """The size of an attention output's errors. A probability that rounds one step apart in half
    precision (the GPU's exp2 is not torch's exp) moves an output by up to 2u * p * |v|: by the size
    of the values, which the outputs of long rows, averages of many values, are much smaller than."""
    return max(root_mean_square([expected]), root_mean_square([v_cache]))


def forward_reduction(spec: DecoderSpec, context: int) -> int:
    """The chain of float32 sums behind a decoder's logits over `context` positions: in each layer
    the q/k/v projection (hidden), the scores (head_dim), the weighted values (context), the
    output projection (heads * head_dim), gate/up (hidden) and down (intermediate); then the LM
    head (hidden)."""
    attention = spec.hidden_size + spec.head_dim + context + spec.num_heads * spec.head_dim
    per_layer = attention + spec.hidden_size + spec.intermediate_size
    return spec.num_layers * per_layer + spec.hidden_size


def attention_reduction(head_dim: int, longest: int) -> int:
    """The float32 sums behind an attention output over at most `longest` positions: a score
    (head_dim terms), then the weighted values (one term per position)."""
    return head_dim + longest
