"""Loading a Hugging Face model folder and the facts the engine serves about it."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from services.engine import cpu_kernels
from services.engine.attention.backend import AttentionBackend, KVCache
from services.engine.attention.torch_backend import TorchAttentionBackend
from services.engine.config import GENERATION_CONFIG_KEYS, EngineConfig
from services.engine.kernels import triton_runs_on
from services.engine.models.layers import enable_fused_kernels, pack_linears, use_cpu_kernels
from services.engine.models.weights import build_model
from services.engine.parallel.group import TensorParallel
from turnout.v1 import common_pb2

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# generation_config.json keys that become sampling defaults, and their SamplingParams names.


@dataclass(frozen=True)
class LoadedModel:
    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    info: common_pb2.ModelInfo
    num_layers: int
    num_kv_heads: int  # on this rank: the model's num_key_value_heads / --tensor-parallel-size
    head_dim: int
    # CUDA: device memory in use before this engine loaded its weights (other processes, the CUDA
    # context), so --gpu-memory-utilization can be this engine's share; None on CPU.
    device_bytes_in_use_before: int | None = None

    def with_max_model_len(self, max_model_len: int) -> LoadedModel:
        """The same model served with a shorter context (when the KV pool holds less than the model's)."""
        info = common_pb2.ModelInfo()
        info.CopyFrom(self.info)
        info.max_context_length = max_model_len
        return replace(self, info=info)

    def kv_bytes_per_block(self, block_size: int) -> int:
        return KVCache.bytes_per_block(self.num_layers, block_size, self.num_kv_heads, self.head_dim, self.dtype)

    def make_backend(self, num_blocks: int, block_size: int, name: str = "auto") -> AttentionBackend:
        """The paged KV cache and the attention backend `name` (see EngineConfig.attention_backend) over it."""
        chosen = self._attention_backend(name)
        cache = KVCache(
            self.num_layers, num_blocks, block_size, self.num_kv_heads, self.head_dim, self.dtype, self.device
        )
        if chosen == "cpu":
            from services.engine.attention.cpu_backend import CpuAttentionBackend

            kernels = cpu_kernels.load()
            assert kernels is not None  # _attention_backend chose cpu because it loads
            return CpuAttentionBackend(cache, scale=self.head_dim**-0.5, kernels=kernels)
        if chosen == "triton":
            from services.engine.attention.triton_backend import TritonAttentionBackend

            return TritonAttentionBackend(cache, scale=self.head_dim**-0.5)
        return TorchAttentionBackend(cache, scale=self.head_dim**-0.5)

    def _attention_backend(self, name: str) -> str:
        """`auto`: triton on CUDA when its kernels serve this model; on CPU the C++ kernel when it
        builds (`_cpu_backend`); else torch. Checked before the cache is allocated; the triton
        module (and Triton itself) is imported only when usable."""
        if name == "cpu" or (name == "auto" and self.device.type == "cpu"):
            return self._cpu_backend(name)
        if name == "torch" or (name == "auto" and self.device.type != "cuda"):
            return "torch"
        if not triton_runs_on(self.device):
            if name == "auto":
                return "torch"
            raise ValueError(
                f"--attention-backend triton needs a CUDA device, or TRITON_INTERPRET=1 on CPU (device: {self.device})"
            )
        from services.engine.attention.triton_backend import unsupported_reason

        reason = unsupported_reason(self.head_dim, self.dtype, self.device)
        if reason is None:
            return "triton"
        if name == "triton":
            raise ValueError(f"--attention-backend triton: {reason}")
        log.warning("attention backend: torch, not triton", extra={"reason": reason})
        return "torch"

    def _cpu_backend(self, name: str) -> str:
        """`cpu` when the C++ kernels serve this device and dtype and build here; `auto` falls back to torch."""
        from services.engine.attention.cpu_backend import DTYPES

        if self.device.type != "cpu" or self.dtype not in DTYPES:
            reason = f"needs a CPU device and float32 or bfloat16 (got {self.device}, {self.dtype})"
        elif cpu_kernels.load() is None:
            reason = "the CPU kernels could not be built (see the log line above)"
        else:
            return "cpu"
        if name == "cpu":
            raise ValueError(f"--attention-backend cpu: {reason}")
        log.info("attention backend: torch", extra={"reason": reason})
        return "torch"

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset(self.info.eos_token_ids)

    @property
    def max_model_len(self) -> int:
        return self.info.max_context_length

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device, checkpoint_dtype: object = None) -> torch.dtype:
    """`auto`: on CUDA the checkpoint's own half-precision dtype, else bfloat16; on a CPU where
    bfloat16 runs faster than float32 (`cpu_prefers_bf16`) bfloat16, as vLLM's CPU build; float32
    elsewhere."""
    if name != "auto":
        return _DTYPES[name]
    if device.type != "cuda":
        return torch.bfloat16 if device.type == "cpu" and cpu_prefers_bf16() else torch.float32
    declared = str(checkpoint_dtype).removeprefix("torch.")
    return torch.float16 if declared == "float16" else torch.bfloat16


def cpu_prefers_bf16() -> bool:
    """Whether bfloat16 beats float32 on this CPU: it computes in bfloat16 natively (avx512_bf16 or
    AMX: twice float32's rate on half the memory traffic), or the CPU kernels' packed_linear takes
    bfloat16 here (AVX2 without AVX-512: the weights widened in registers, half float32's bytes a
    decode step; 1.3-1.9x float32's decode at 1-16 sequences on an AVX2 EPYC, docs/benchmarks.md).
    Elsewhere torch emulates bfloat16, slower than float32."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    if any(getattr(torch.cpu, probe, lambda: False)() for probe in probes):
        return True
    kernels = cpu_kernels.load()
    return kernels is not None and "bfloat16" in kernels.PACKED_LINEAR_DTYPES


def load_model(config: EngineConfig, tp: TensorParallel | None = None) -> LoadedModel:
    """The model of `config`; with `tp`, this rank's shard of it, on the rank's device."""
    device = tp.device if tp is not None else pick_device(config.device)
    declared = _read_json(config.model / "config.json")
    dtype = pick_dtype(config.dtype, device, declared.get("torch_dtype") or declared.get("dtype"))
    in_use_before = _device_bytes_in_use(device)
    model, hf_config = build_model(config.model, dtype, device, tp)
    if device.type == "cuda":
        enable_fused_kernels(model)  # RMSNorm and rotary as Triton kernels; CPU keeps the torch ops
    elif device.type == "cpu":
        # Every weight packed once for the matmul that reads it: the C++ packed_linear where it
        # builds here and takes the dtype, oneDNN's layout otherwise.
        kernels = cpu_kernels.load()
        pack_linears(model, kernels)
        use_cpu_kernels(model, kernels)  # RMSNorm, rotary and SiLU-mul in one call each
        model.model.use_cpu_decoder(kernels)  # and every layer of a forward in one call
    context = int(getattr(hf_config, "max_position_embeddings", 0) or 2048)
    if config.max_model_len is not None:
        if config.max_model_len > context:
            raise ValueError(f"--max-model-len {config.max_model_len} exceeds the model's context of {context}")
        context = config.max_model_len
    generation = _read_generation_config(config.model)
    eos = _eos_ids(hf_config.eos_token_id, generation.get("eos_token_id"))
    info = common_pb2.ModelInfo(
        name=config.model_name,
        path=str(config.model),
        max_context_length=context,
        vocab_size=int(hf_config.vocab_size),
        eos_token_ids=sorted(eos),
        generation_defaults=_generation_defaults(_sampling_defaults(config)),
        architecture=(hf_config.architectures or [type(model).__name__])[0],
        dtype=str(dtype).removeprefix("torch."),
        hidden_size=int(hf_config.hidden_size),
    )
    log.info("model loaded", extra={"model": info.name, "device": str(device), "dtype": info.dtype})
    heads = int(hf_config.num_attention_heads)
    ranks = tp.world_size if tp is not None else 1
    return LoadedModel(
        model=model,
        device=device,
        dtype=dtype,
        info=info,
        num_layers=int(hf_config.num_hidden_layers),
        num_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or heads) // ranks,
        head_dim=int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads),
        device_bytes_in_use_before=in_use_before,
    )


def _device_bytes_in_use(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def _read_json(path: Path) -> dict[str, object]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _read_generation_config(folder: Path) -> dict[str, object]:
    return _read_json(folder / "generation_config.json")


def _eos_ids(*values: object) -> set[int]:
    ids: set[int] = set()
    for value in values:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return ids


def _sampling_defaults(config: EngineConfig) -> dict[str, object]:
    """The generation_config.json values unset sampling parameters take (vLLM's --generation-config):
    none for `openai`; --override-generation-config goes over them."""
    chosen = {} if config.sampling_defaults == "openai" else _read_json(config.generation_config_file)
    return {**chosen, **config.override_generation_config}


def _generation_defaults(generation: dict[str, object]) -> common_pb2.SamplingParams:
    # Like vLLM, only the sampling values themselves count; `do_sample` is not read.
    defaults = common_pb2.SamplingParams()
    for key in GENERATION_CONFIG_KEYS:
        value = generation.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(defaults, key, type(getattr(defaults, key))(value))
    return defaults
