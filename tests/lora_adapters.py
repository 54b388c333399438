"""LoRA adapters for tests, made with `peft` on a test model: seeded random A and B (PEFT's own
init leaves B zero, an adapter that changes nothing), saved in PEFT's format."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def peft_model(base_dir: Path, *, seed: int, rank: int, alpha: int, targets: Sequence[str], rslora: bool) -> object:
    """The base model (float32) wrapped by peft with one seeded random LoRA adapter, not merged."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora, init_lora_weights=False
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                # Large enough that greedy tokens change, small enough to keep the model's scale.
                param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5 * 0.5)
    return model


def build_lora_adapter(
    base_dir: Path,
    out: Path,
    *,
    seed: int,
    rank: int = 8,
    alpha: int = 16,
    targets: Sequence[str] = ALL_TARGETS,
    rslora: bool = False,
) -> Path:
    """Save a seeded random adapter of `base_dir` to `out` (adapter_config.json + adapter_model.safetensors)."""
    model = peft_model(base_dir, seed=seed, rank=rank, alpha=alpha, targets=targets, rslora=rslora)
    model.save_pretrained(out)  # type: ignore[attr-defined]
    return out


def merged_reference(base_dir: Path, adapter_dir: Path) -> nn.Module:
    """transformers' model of `base_dir` with the adapter at `adapter_dir` merged by peft (float32)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged: nn.Module = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    return merged.eval()
