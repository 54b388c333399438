"""Layers shared by the Llama-family models: RMSNorm, rotary embedding, fused projections, MLP.

Numerics follow Hugging Face `transformers` (same dtype at each step), so greedy
output can match it token for token: RMSNorm normalises in float32 and casts back
before the weight; rotary cos/sin are computed in float32 and applied in the
activation dtype.

On CPU, `pack_linears` and `use_cpu_kernels` do the same with oneDNN's packed weights and the
C++ kernels of services/engine/cpu_kernels/.

`enable_fused_kernels(model)` switches a model's RMSNorms and rotary embedding to the Triton
kernels of services/engine/kernels/ (same numerics, fewer launches, no host syncs); the loader
does it on CUDA. The torch ops stay the default everywhere else and the reference for tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from services.engine import huge_pages
from services.engine.kernels import triton_runs_on

if TYPE_CHECKING:
    from services.engine.lora.batch import LoraBatch
    from services.engine.lora.weights import LoraWeights

ROPE_TYPES = ("default", "linear", "llama3")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused = False  # kernels.rms_norm instead of the torch ops; see enable_fused_kernels
        self.cpu_ops: ModuleType | None = None  # cpu_kernels' rms_norm; see use_cpu_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., dim) -> normalised (..., dim), same dtype."""
        if self.cpu_ops is not None and x.is_contiguous():
            return self.cpu_ops.rms_norm(x, self.weight, self.eps)  # type: ignore[no-any-return]
        if self.fused:
            from services.engine.kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual add, then norm (one call a fused kernel can replace): (norm(x + residual), x + residual)."""
        if self.cpu_ops is not None and x.is_contiguous() and residual.is_contiguous():
            return self.cpu_ops.add_rms_norm(x, residual, self.weight, self.eps)  # type: ignore[no-any-return]
        if self.fused:
            from services.engine.kernels.rms_norm import fused_add_rms_norm

            return fused_add_rms_norm(x, residual, self.weight, self.eps)
        summed = x + residual  # (T, dim)
        return self.forward(summed), summed


def rope_parameters(config: Any) -> dict[str, Any]:
    """rope_theta and scaling settings from a config of either transformers generation:
    4.x (`rope_theta` + `rope_scaling`) or 5.x (`rope_parameters`, which holds both)."""
    params: dict[str, Any] = {}
    for source in (getattr(config, "rope_scaling", None), getattr(config, "rope_parameters", None)):
        if isinstance(source, dict):
            params.update(source)
    if "rope_theta" not in params:
        params["rope_theta"] = float(getattr(config, "rope_theta", None) or 10000.0)
    params["rope_type"] = params.get("rope_type", params.get("type")) or "default"
    return params


def rope_inv_freq(head_dim: int, params: dict[str, Any]) -> torch.Tensor:
    """Inverse frequencies (head_dim // 2,) float32 on the CPU for a rope_type in ROPE_TYPES."""
    rope_type = params["rope_type"]
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported yet (supported: {', '.join(ROPE_TYPES)})")
    # Same expression as transformers, so the frequencies are bit-identical.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (float(params["rope_theta"]) ** exponents)  # (D/2,)
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        return _llama3_scaled(inv_freq, params)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 context extension: long wavelengths are slowed down by `factor`, short ones kept,
    and the band between low_freq_wavelen and high_freq_wavelen interpolated smoothly."""
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    original = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq  # (D/2,)
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, smoothed, scaled)


@dataclass(frozen=True)
class Rotation:
    """The rotary embedding of one model forward's tokens, shared by every layer."""

    positions: torch.Tensor  # (T,) int64
    inv_freq: torch.Tensor  # (D/2,) float32
    cos_sin: tuple[torch.Tensor, torch.Tensor] | None  # (T, D/2) float32 each; None: fused kernel
    cpu_ops: ModuleType | None = None  # cpu_kernels' rotary; see use_cpu_kernels

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (T, Hq, D), k (T, Hkv, D) -> both rotated by position, new tensors of the same dtype."""
        if self.cos_sin is None:
            from services.engine.kernels.rotary import rotary_embedding

            return rotary_embedding(q, k, self.positions, self.inv_freq)
        if self.cpu_ops is not None:
            return self.cpu_ops.rotary(q, *self.cos_sin), self.cpu_ops.rotary(k, *self.cos_sin)
        return apply_rotary(q, *self.cos_sin), apply_rotary(k, *self.cos_sin)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in the rotate-half layout, applied at arbitrary positions
    (a batch mixes sequences, and chunks start mid-sequence)."""

    inv_freq: torch.Tensor  # (D/2,) float32

    def __init__(self, head_dim: int, params: dict[str, Any]) -> None:
        super().__init__()
        # Kept in float32 on whatever device the model lives on; not part of the checkpoint.
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, params), persistent=False)
        self.fused = False  # kernels.rotary instead of the torch ops; see enable_fused_kernels
        self.cpu_ops: ModuleType | None = None  # cpu_kernels' rotary; see use_cpu_kernels

    def forward(self, positions: torch.Tensor) -> Rotation:
        """positions (T,) int64 -> the rotation of one model forward, shared by every layer. The torch
        path computes cos, sin (T, D/2) float32 here, once; the fused kernel computes them per call."""
        if self.fused:
            return Rotation(positions, self.inv_freq, None)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # (T, D/2)
        return Rotation(positions, self.inv_freq, (freqs.cos(), freqs.sin()), self.cpu_ops)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, H, D), cos/sin (T, D/2) -> x rotated by position, same dtype as x."""
    cos = cos.to(x.dtype)[:, None, :]  # (T, 1, D/2)
    sin = sin.to(x.dtype)[:, None, :]  # (T, 1, D/2)
    x1, x2 = x.chunk(2, dim=-1)  # (T, H, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # (T, H, D)


def _packable(weight: torch.Tensor) -> bool:
    """oneDNN packs float32 on any x86 CPU; bfloat16 only where oneDNN supports it (AVX-512 and
    up): elsewhere the plain torch linear serves, so a bfloat16 model still loads."""
    if weight.device.type != "cpu" or weight.dim() != 2 or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in) reordered once into oneDNN's blocked layout for x @ weight.T, which
    oneDNN then multiplies without repacking it on every call: 1.4-2x torch's plain linear on
    CPU at batch 1-64 (docs/benchmarks.md)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


@dataclass(frozen=True)
class CpuWeight:
    """A CPU linear layer's weight packed once for the matmul that reads it."""

    plain: torch.Tensor  # (out, in), the parameter itself
    # cpu_kernels' pack_linear layout when `kernel` is set, else oneDNN's blocked one (pack_weight).
    packed: torch.Tensor
    kernel: Callable[..., torch.Tensor] | None  # cpu_kernels' packed_linear

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x (T, in) @ weight.T (+ bias): through cpu_kernels' packed_linear where the CPU has it
        for this dtype (float32: AVX-512; bfloat16: AVX-512 BF16), else through oneDNN."""
        if self.kernel is not None and x.dim() == 2:
            return self.kernel(x, self.packed, self.plain.shape[0], bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


def skip_random_init_on_meta(module: nn.Module, reset_parameters: Callable[[], None]) -> None:
    """A module's random init, except on the meta device. Models are built there and filled from their
    checkpoint (weights.py), where drawing values stores nothing, and torch's meta-tensor init runs through
    its decompositions, which import `torch._dynamo`: 3.6 s of CPU, a third of an engine's start here."""
    if not any(p.is_meta for p in module.parameters(recurse=False)):
        reset_parameters()


class Embedding(nn.Embedding):
    """nn.Embedding, without the random init on the meta device (`skip_random_init_on_meta`)."""

    def reset_parameters(self) -> None:
        skip_random_init_on_meta(self, super().reset_parameters)


class Linear(nn.Linear):
    """nn.Linear that, once `pack_linears` has run (CPU), multiplies through `CpuWeight`.
    The plain weight stays the parameter (loading, tests, the reference path)."""

    cpu_weight: CpuWeight | None = None
    # Tensor parallel: the dimension of each parameter split over the ranks (see parallel_layers.py).
    shard_dims: dict[str, int] = {}  # replaced per instance, never mutated
    # Its LoRA weights in every adapter slot, set by services.engine.lora.manager when LoRA is on.
    lora: LoraWeights | None = None

    def reset_parameters(self) -> None:
        skip_random_init_on_meta(self, super().reset_parameters)

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        """x (T, in) -> (T, out); `lora` (the step's ForwardContext.lora) adds each adapter token's LoRA term."""
        y = self.cpu_weight.linear(x, self.bias) if self.cpu_weight is not None else super().forward(x)
        if lora is not None and self.lora is not None:
            y = self.lora.add_to(y, x, lora)
        return y


class MergedLinear(Linear):
    """One Linear whose output rows are the concatenation of several checkpoint projections
    (`shard_names`, in order), so one matmul replaces several."""

    def __init__(self, in_features: int, shard_sizes: tuple[int, ...], shard_names: tuple[str, ...], bias: bool):
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        self.shard_sizes = shard_sizes
        self.shard_names = shard_names

    def shard_rows(self, index: int) -> slice:
        """Rows of the fused weight (and bias) that hold checkpoint projection `shard_names[index]`."""
        start = sum(self.shard_sizes[:index])
        return slice(start, start + self.shard_sizes[index])


class QKVLinear(MergedLinear):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool) -> None:
        sizes = (num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim)
        super().__init__(hidden_size, sizes, ("q_proj", "k_proj", "v_proj"), bias)
        self.head_dim = head_dim

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, lora: LoraBatch | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (T, hidden) -> q (T, Hq, D), k (T, Hkv, D), v (T, Hkv, D)."""
        qkv = super().forward(x, lora)  # (T, (Hq + 2 Hkv) D)
        q, k, v = qkv.split(self.shard_sizes, dim=-1)
        return (
            q.unflatten(-1, (-1, self.head_dim)),
            k.unflatten(-1, (-1, self.head_dim)),
            v.unflatten(-1, (-1, self.head_dim)),
        )


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        sizes = (intermediate_size, intermediate_size)
        self.gate_up_proj = MergedLinear(hidden_size, sizes, ("gate_proj", "up_proj"), bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    cpu_ops: ModuleType | None = None  # cpu_kernels' silu_mul; see use_cpu_kernels

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        gate_up = self.gate_up_proj(x, lora)  # (T, 2I)
        if self.cpu_ops is not None:
            # One vectorised pass instead of torch's silu, then mul through a (T, I) temporary.
            return self.down_proj(self.cpu_ops.silu_mul(gate_up), lora)
        gate, up = gate_up.chunk(2, dim=-1)  # (T, I) each
        return self.down_proj(F.silu(gate) * up, lora)  # (T, hidden)


class LMHead(nn.Module):
    """Hidden states -> float32 logits, through its own weight or the (tied) embedding's."""

    def __init__(self, hidden_size: int, vocab_size: int, tied_to: nn.Embedding | None) -> None:
        super().__init__()
        # A tied head owns no parameter: the embedding is the only copy, and the loader never sees two names.
        self.tied_to = [tied_to] if tied_to is not None else []  # a list keeps it out of the module tree
        if tied_to is None:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    cpu_weight: CpuWeight | None = None

    @property
    def head_weight(self) -> torch.Tensor:
        return self.tied_to[0].weight if self.tied_to else self.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, hidden) -> logits (N, vocab) float32 (matmul in the model dtype, like transformers)."""
        if self.cpu_weight is not None:
            return self.cpu_weight.linear(hidden, None).float()
        return F.linear(hidden, self.head_weight).float()


def pack_linears(model: nn.Module, kernels: ModuleType | None = None) -> int:
    """Give every Linear and the LM head of a CPU model (float32 / bfloat16) its `CpuWeight`:
    packed for `kernels`' packed_linear (services.engine.cpu_kernels) where it takes the dtype
    on this CPU, else for oneDNN; returns how many. Each packed copy costs the weight's size
    again (a tied head packs the embedding), the price of not repacking inside every call.

    packed_linear against oneDNN, one forward's matmuls of the default model, same run
    (docs/benchmarks.md): bfloat16 0.6-0.8x oneDNN's time at 1-16 rows, 0.94-0.96x at 64-256;
    float32 0.6-0.8x at 1-16 rows and 1.05x at 64-256, kept there too so a model holds two
    copies of its weights, not three."""
    dtypes = {getattr(torch, name) for name in kernels.PACKED_LINEAR_DTYPES} if kernels is not None else set()
    count = 0
    for module in model.modules():
        if isinstance(module, (Linear, LMHead)):
            weight = module.weight if isinstance(module, Linear) else module.head_weight
            plain = weight.detach()
            if kernels is not None and _kernel_packable(weight, dtypes):
                # In huge pages: a decode step streams every packed weight once (services/engine/huge_pages.py).
                packed = huge_pages.copy_of(kernels.pack_linear(plain))
                module.cpu_weight = CpuWeight(plain, packed, kernels.packed_linear)
                count += 1
            elif _packable(weight):
                module.cpu_weight = CpuWeight(plain, pack_weight(weight), None)
                count += 1
    return count


def _kernel_packable(weight: torch.Tensor, dtypes: set[torch.dtype]) -> bool:
    """What packed_linear takes: a CPU (out, in) weight of a dtype it has here; bfloat16 pairs
    input columns, so `in` must be even."""
    if weight.device.type != "cpu" or weight.dim() != 2 or weight.dtype not in dtypes:
        return False
    return weight.dtype != torch.bfloat16 or weight.shape[1] % 2 == 0


def use_cpu_kernels(model: nn.Module, kernels: ModuleType | None) -> None:
    """Run a CPU model's RMSNorms (residual add included), rotary embedding and SiLU-mul through
    `kernels` (services.engine.cpu_kernels: one call each instead of 3-20 torch ops, same
    roundings), or the torch ops again with None."""
    for module in model.modules():
        if isinstance(module, (RMSNorm, RotaryEmbedding, GatedMLP)):
            module.cpu_ops = kernels


def enable_fused_kernels(model: nn.Module, enabled: bool = True) -> None:
    """Run every RMSNorm and rotary embedding of `model` through the Triton kernels (or, with
    enabled=False, the torch ops again). Raises ValueError where Triton cannot run on the model's
    device (CPU needs TRITON_INTERPRET=1, which is only for tests: the interpreter is slow)."""
    device = next(model.parameters()).device
    if enabled and not triton_runs_on(device):
        raise ValueError(f"fused kernels need a CUDA device, or TRITON_INTERPRET=1 on CPU; the model is on {device}")
    for module in model.modules():
        if isinstance(module, (RMSNorm, RotaryEmbedding)):
            module.fused = enabled
