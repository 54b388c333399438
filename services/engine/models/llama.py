"""The Llama decoder (Llama 2/3/3.x, SmolLM, TinyLlama, Mistral), the base of the family.

Parameter names match the Hugging Face checkpoints, except that q/k/v and
gate/up are fused (`qkv_proj`, `gate_up_proj`); the loader fills their row
slices from the checkpoint's separate projections. Variants (Qwen2, Qwen3)
differ only in the `DecoderSpec` they derive from their config.

All tokens of a step are flattened: input_ids and positions are (T,), hidden
states (T, hidden). Batch structure and the KV cache live in the
ForwardContext; the attention call is the only place that touches the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, cast

import torch
from torch import nn

from services.engine.attention.context import ForwardContext
from services.engine.models.layers import (
    Embedding,
    GatedMLP,
    Linear,
    LMHead,
    QKVLinear,
    RMSNorm,
    RotaryEmbedding,
    Rotation,
    rope_parameters,
)
from services.engine.models.parallel_layers import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from services.engine.parallel.group import TensorParallel, check_divisible


@dataclass(frozen=True)
class DecoderSpec:
    """What one Llama-family checkpoint needs, read from its config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: dict[str, Any]
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k, before rotary

    @property
    def attention_scale(self) -> float:
        return float(self.head_dim**-0.5)


def sliding_window_layers(config: Any) -> bool:
    """Whether any layer would attend through a sliding window shorter than the context."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return "sliding_attention" in layer_types
    window = getattr(config, "sliding_window", None)
    return window is not None and window < config.max_position_embeddings


class LlamaAttention(nn.Module):
    def __init__(self, spec: DecoderSpec, layer_index: int, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.layer_index = layer_index
        n = tp.world_size if tp is not None else 1
        # Tensor parallel: this rank's num_heads/N query and num_kv_heads/N KV heads (column-parallel).
        self.qkv_proj = QKVLinear(
            spec.hidden_size, spec.num_heads // n, spec.num_kv_heads // n, spec.head_dim, spec.qkv_bias
        )
        self.o_proj: Linear
        if tp is None:
            self.o_proj = Linear(spec.num_heads * spec.head_dim, spec.hidden_size, bias=spec.o_bias)
        else:
            self.qkv_proj.shard_dims = {"weight": 0, "bias": 0}
            self.o_proj = RowParallelLinear(spec.num_heads * spec.head_dim, spec.hidden_size, spec.o_bias, tp)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None

    def forward(self, hidden: torch.Tensor, rope: Rotation, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden, ctx.lora)  # (T, Hq, D), (T, Hkv, D), (T, Hkv, D)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope.rotate(q, k)
        out = ctx.attention(self.layer_index, q, k, v)  # (T, Hq, D)
        return self.o_proj(out.flatten(1), ctx.lora)  # (T, hidden)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: DecoderSpec, layer_index: int, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(spec, layer_index, tp)
        n = tp.world_size if tp is not None else 1
        self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size // n, spec.mlp_bias)
        if tp is not None:
            # gate_up: this rank's rows of gate and of up (column-parallel); down: its columns (row-parallel).
            self.mlp.gate_up_proj.shard_dims = {"weight": 0, "bias": 0}
            self.mlp.down_proj = RowParallelLinear(spec.intermediate_size, spec.hidden_size, spec.mlp_bias, tp)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        rope: Rotation,
        ctx: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm block. `residual` is the running sum of the stream; the previous block's
        output is added to it inside the next norm: returns (block output, residual), both (T, hidden)."""
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_forward(hidden, residual)
        hidden = self.self_attn(hidden, rope, ctx)
        hidden, residual = self.post_attention_layernorm.add_forward(hidden, residual)
        return self.mlp(hidden, ctx.lora), residual


class LlamaModel(nn.Module):
    def __init__(self, spec: DecoderSpec, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.tensor_parallel = tp is not None
        self.embed_tokens: nn.Module = (
            Embedding(spec.vocab_size, spec.hidden_size)
            if tp is None
            else VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp)
        )
        self.layers = nn.ModuleList(LlamaDecoderLayer(spec, i, tp) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.rotary = RotaryEmbedding(spec.head_dim, spec.rope)

    # cpu_kernels' CpuDecoder over every layer, set by use_cpu_decoder: the same kernels the layers
    # call, in one call per forward instead of ~25 Python calls per layer.
    cpu_decoder: Any = None

    def use_cpu_decoder(self, kernels: ModuleType | None) -> bool:
        """Run this model's layers through one cpu_kernels.CpuDecoder call per forward where every
        piece of them already runs on those kernels (packed_linear weights, C++ norms, rotary and
        SiLU-mul: see layers.pack_linears and use_cpu_kernels) and no layer needs more (Qwen3's q/k
        norms); returns whether it does. With None, the layers run one by one again."""
        self.cpu_decoder = None
        layers = [cast(LlamaDecoderLayer, layer) for layer in self.layers]
        if kernels is None or not hasattr(kernels, "CpuDecoder") or not layers:
            return False
        if self.tensor_parallel:
            return False  # one C++ call runs every layer: no place for the ranks' all-reduces
        linears: list[Linear] = []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            if attn.q_norm is not None or layer.input_layernorm.cpu_ops is None or mlp.cpu_ops is None:
                return False
            linears += [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
        if self.rotary.cpu_ops is None or any(
            lin.cpu_weight is None or lin.cpu_weight.kernel is None for lin in linears
        ):
            return False
        qkv = layers[0].self_attn.qkv_proj
        num_heads, num_kv_heads = qkv.shard_sizes[0] // qkv.head_dim, qkv.shard_sizes[1] // qkv.head_dim
        eps = layers[0].input_layernorm.eps
        decoder = kernels.CpuDecoder(num_heads, num_kv_heads, qkv.head_dim, eps, qkv.head_dim**-0.5)

        def weight(linear: Linear) -> tuple[torch.Tensor, int, torch.Tensor | None]:
            assert linear.cpu_weight is not None
            bias = linear.bias.detach() if linear.bias is not None else None
            return linear.cpu_weight.packed, linear.out_features, bias

        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            decoder.add_layer(
                layer.input_layernorm.weight.detach(),
                layer.post_attention_layernorm.weight.detach(),
                *weight(attn.qkv_proj),
                *weight(attn.o_proj),
                *weight(mlp.gate_up_proj),
                *weight(mlp.down_proj),
            )
        self.cpu_decoder = decoder
        return True

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # (T, hidden)
        rope = self.rotary(positions)  # shared by every layer
        residual: torch.Tensor | None = None
        ran = None
        # The C++ decoder knows nothing of LoRA: a step with any adapter token runs the layers one by one.
        if self.cpu_decoder is not None and rope.cos_sin is not None and ctx.lora is None:
            ran = ctx.backend.run_cpu_decoder(self.cpu_decoder, hidden, rope.cos_sin, ctx)
        if ran is not None:
            hidden, residual = ran
        else:
            for layer in self.layers:
                hidden, residual = layer(hidden, residual, rope, ctx)
        assert residual is not None, "a model has at least one layer"
        hidden, _ = self.norm.add_forward(hidden, residual)
        return hidden  # (T, hidden)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: Any, tp: TensorParallel | None = None) -> None:
        """`tp`: build this rank's shard of the model (tensor parallelism, see services/engine/parallel/)."""
        super().__init__()
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported yet (only 'silu')")
        if sliding_window_layers(config):
            raise ValueError(
                f"sliding window attention is not supported yet (sliding_window={config.sliding_window}, "
                f"max_position_embeddings={config.max_position_embeddings})"
            )
        if tp is not None:
            check_divisible(config, tp.world_size)
        self.spec = self.spec_from_config(config)
        self.tp = tp
        self.model = LlamaModel(self.spec, tp)
        tied = self.model.embed_tokens if self.spec.tie_word_embeddings else None
        self.lm_head: LMHead
        if tp is None:
            self.lm_head = LMHead(self.spec.hidden_size, self.spec.vocab_size, cast(nn.Embedding | None, tied))
        else:
            vocab_shard = cast(VocabParallelEmbedding | None, tied)
            self.lm_head = ParallelLMHead(self.spec.hidden_size, self.spec.vocab_size, vocab_shard, tp)

    @classmethod
    def spec_from_config(cls, config: Any) -> DecoderSpec:
        attention_bias = bool(getattr(config, "attention_bias", False))
        return DecoderSpec(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            rms_norm_eps=float(config.rms_norm_eps),
            rope=rope_parameters(config),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """input_ids, positions (T,) int64 -> final hidden states (T, hidden)."""
        return self.model(input_ids, positions, ctx)  # type: ignore[no-any-return]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, hidden), usually each sequence's last token -> logits (N, vocab) float32."""
        return self.lm_head(hidden)  # type: ignore[no-any-return]


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral is the Llama decoder; its sliding window is rejected above when it would matter."""


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2/2.5: biases on q, k and v (never on o_proj)."""

    @classmethod
    def spec_from_config(cls, config: Any) -> DecoderSpec:
        return replace(super().spec_from_config(config), qkv_bias=True, o_bias=False)


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: per-head RMSNorm on q and k before rotary; explicit head_dim; biases per attention_bias."""

    @classmethod
    def spec_from_config(cls, config: Any) -> DecoderSpec:
        return replace(super().spec_from_config(config), qk_norm=True)
