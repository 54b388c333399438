"""One LoRA adapter in PEFT's format, read from its folder and checked against the base model.

A PEFT LoRA folder holds `adapter_config.json` (r, lora_alpha, target_modules, ...) and
`adapter_model.safetensors` with, for every adapted projection of layer i,

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   (r, in)
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   (out, r)

and the adapted projection computes x @ W.T + scaling * (x @ A.T) @ B.T, with scaling =
lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). Everything else PEFT can save (DoRA
magnitudes, trained biases, modules_to_save, embedding or LM-head adapters, per-module ranks) is
refused with a LoraError naming it, rather than served wrongly.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The checkpoint projections an adapter may target: those of the Llama-family decoder layer.
SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class LoraError(ValueError):
    """An adapter that cannot be served here; the message names the adapter and the problem."""


@dataclass(frozen=True)
class LoraAdapter:
    """An adapter read into host memory, ready to be copied into a slot (slots.py)."""

    name: str
    path: Path
    # Unique per load: it salts the prefix cache (an adapter's K/V differ from the base's and from
    # every other adapter's), so reloading a name with new weights never hits the old one's blocks.
    uid: int
    rank: int
    scaling: float
    # (layer, checkpoint projection) -> (A (r, in), B (out, r)), float32 on the CPU.
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)


def read_adapter(
    name: str,
    path: Path,
    *,
    uid: int,
    max_rank: int,
    num_layers: int,
    shapes: dict[str, tuple[int, int]],
) -> LoraAdapter:
    """Read and check the PEFT folder at `path`. `shapes` maps each checkpoint projection name to the
    base model's (in_features, out_features) for it. Raises LoraError naming what is wrong."""
    where = f"LoRA adapter {name!r} ({path})"
    config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not config_path.is_file():
        raise LoraError(f"{where}: no {CONFIG_FILE} there (expected a PEFT LoRA folder)")
    if not weights_path.is_file():
        raise LoraError(f"{where}: no {WEIGHTS_FILE} there (only safetensors weights are loaded)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as error:
        raise LoraError(f"{where}: {CONFIG_FILE} is not readable JSON: {error}") from None
    rank, alpha = _check_config(where, config, max_rank)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank

    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(weights_path, device="cpu")
    except (OSError, SafetensorError) as error:
        raise LoraError(f"{where}: {WEIGHTS_FILE} is not readable: {error}") from None
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise LoraError(f"{where}: weight {key!r} is not a LoRA A/B of a decoder projection; not supported")
        layer, module, half = int(match[1]), match[2], match[3]
        if module not in SUPPORTED_MODULES:
            raise LoraError(
                f"{where}: target module {module!r} is not supported (supported: {', '.join(SUPPORTED_MODULES)})"
            )
        if not 0 <= layer < num_layers:
            raise LoraError(f"{where}: weight {key!r} is for layer {layer}, but the model has {num_layers} layers")
        halves.setdefault((layer, module), {})[half] = tensor.float()
    if not halves:
        raise LoraError(f"{where}: {WEIGHTS_FILE} holds no LoRA weights")
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            raise LoraError(f"{where}: layer {layer} {module} has lora_{''.join(pair)} but not both A and B")
        a, b = pair["A"], pair["B"]
        in_features, out_features = shapes[module]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise LoraError(
                f"{where}: layer {layer} {module} has A {tuple(a.shape)} and B {tuple(b.shape)}; the base model "
                f"needs A ({rank}, {in_features}) and B ({out_features}, {rank}) at rank {rank} "
                "(is it an adapter of another model?)"
            )
        weights[(layer, module)] = (a.contiguous(), b.contiguous())
    return LoraAdapter(name, path, uid, rank, scaling, weights)


def _check_config(where: str, config: dict[str, object], max_rank: int) -> tuple[int, float]:
    """(rank, lora_alpha) of a config we can serve; LoraError for anything else."""
    if config.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"{where}: peft_type {config.get('peft_type')!r} is not supported (only LORA)")
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise LoraError(f"{where}: r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise LoraError(f"{where}: rank {rank} is over the limit of {max_rank} (raise --max-lora-rank)")
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)):
        raise LoraError(f"{where}: lora_alpha must be a number, got {alpha!r}")
    refused = {
        "use_dora": "DoRA adapters",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D) weights",
        "rank_pattern": "per-module ranks (rank_pattern)",
        "alpha_pattern": "per-module alphas (alpha_pattern)",
        "modules_to_save": "fully trained modules (modules_to_save)",
        "lora_bias": "LoRA biases (lora_bias)",
        "target_parameters": "adapters of parameters (target_parameters)",
        "trainable_token_indices": "trained token embeddings (trainable_token_indices)",
        "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
        "layer_replication": "replicated layers (layer_replication)",
        "use_qalora": "QALoRA adapters",
        # Variants whose forward is not x @ A.T @ B.T * scaling.
        "use_bdlora": "block-diagonal LoRA (use_bdlora)",
        "velora_config": "VeLoRA (velora_config)",
        "monteclora_config": "MonteCLoRA (monteclora_config)",
        "arrow_config": "Arrow routing (arrow_config)",
        "kasa_config": "KaSA (kasa_config)",
    }
    for key, what in refused.items():
        if config.get(key):
            raise LoraError(f"{where}: {what} are not supported ({key}={config[key]!r})")
    if config.get("bias", "none") != "none":
        raise LoraError(f"{where}: trained biases are not supported (bias={config['bias']!r}, only 'none')")
    targets = config.get("target_modules")
    if isinstance(targets, list):
        unsupported = sorted(set(map(str, targets)) - set(SUPPORTED_MODULES))
        if unsupported:
            raise LoraError(
                f"{where}: target modules {', '.join(unsupported)} are not supported "
                f"(supported: {', '.join(SUPPORTED_MODULES)})"
            )
    return rank, float(alpha)
