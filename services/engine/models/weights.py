"""Loading Hugging Face safetensors checkpoints into our models, and building a ready model.

Our parameter names are the checkpoint's, except for fused projections: a
`MergedLinear` named `...self_attn.qkv_proj` takes `...self_attn.q_proj/k_proj/
v_proj.{weight,bias}` into consecutive row slices. The model is built on the
meta device and every parameter is allocated once, in the target dtype on the
target device, then filled tensor by tensor straight from the files.

Tensor parallel (services/engine/parallel/): a module's `shard_dims` names the dimension of each
parameter split over the ranks; each rank reads only its part of those tensors from the files
(safetensors slices), and a fused projection's part i takes this rank's rows of checkpoint
projection i.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from services.engine.models.checkpoint_config import read_checkpoint_config
from services.engine.models.layers import MergedLinear
from services.engine.models.llama import LlamaForCausalLM
from services.engine.models.registry import model_class
from services.engine.parallel.group import TensorParallel
from turnout.logs import progress_bar

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Checkpoint entries that are derived, not learned (older Llama exports carry them).
SKIPPED_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: a parameter of ours, whole or a row slice of it."""

    param: str
    rows: slice | None = None
    # Tensor parallel: the checkpoint tensor's dimension split over the ranks (this rank reads its part).
    shard_dim: int | None = None


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Map every tensor name in the checkpoint to the file holding it (single or sharded)."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / SINGLE_FILE
    if single.is_file():
        with safe_open(single, framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    raise FileNotFoundError(f"{folder} holds neither {SINGLE_FILE} nor {INDEX_FILE}")


def checkpoint_targets(model: nn.Module) -> dict[str, Target]:
    """Every checkpoint name the model needs, and where each one goes."""
    targets: dict[str, Target] = {}
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            ours = f"{module_name}.{param_name}"
            shard_dim = getattr(module, "shard_dims", {}).get(param_name)
            if isinstance(module, MergedLinear):
                parent = module_name.rpartition(".")[0]
                for i, shard in enumerate(module.shard_names):
                    targets[f"{parent}.{shard}.{param_name}"] = Target(ours, module.shard_rows(i), shard_dim)
            else:
                targets[ours] = Target(ours, None, shard_dim)
    return targets


def load_weights(
    model: LlamaForCausalLM, folder: Path, dtype: torch.dtype, device: torch.device, tp: TensorParallel | None = None
) -> None:
    """Allocate every parameter in `dtype` on `device` and fill it from the checkpoint in `folder`
    (with `tp`, this rank's shard of the split ones).

    Raises ValueError naming the missing and unexpected tensors (checked before any is read),
    or a tensor whose shape does not match."""
    files = checkpoint_files(Path(folder))
    targets = checkpoint_targets(model)
    ignored = {name for name in files if name.endswith(SKIPPED_SUFFIXES)}
    if model.spec.tie_word_embeddings:
        ignored.add("lm_head.weight")  # tied: the embedding is the head, as in transformers
    missing = sorted(set(targets) - set(files))
    unexpected = sorted(set(files) - set(targets) - ignored)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {folder} does not match {type(model).__name__}: "
            f"missing weights {_names(missing)}; unexpected weights {_names(unexpected)}"
        )
    _materialize(model, dtype, device)
    params = dict(model.named_parameters())
    by_file: dict[Path, list[str]] = {}
    for name in targets:
        by_file.setdefault(files[name], []).append(name)
    with torch.no_grad(), progress_bar(len(targets), "loading weights", unit="tensor") as bar:
        for file, names in by_file.items():
            with safe_open(file, framework="pt", device=_safetensors_device(device)) as f:
                for name in names:
                    target = targets[name]
                    dest: torch.Tensor = params[target.param]
                    if target.rows is not None:
                        dest = dest[target.rows]
                    if target.shard_dim is not None and tp is not None:
                        _copy_shard(f.get_slice(name), dest, target.shard_dim, tp, f"weight {name} in {file.name}")
                        continue
                    tensor = f.get_tensor(name)
                    if tensor.shape != dest.shape:
                        raise ValueError(
                            f"weight {name} in {file.name} has shape {tuple(tensor.shape)}, "
                            f"the model expects {tuple(dest.shape)}"
                        )
                    dest.copy_(tensor)  # converts to the parameter's dtype on the way
                    bar.update()


def _copy_shard(source: Any, dest: torch.Tensor, dim: int, tp: TensorParallel, what: str) -> None:
    """Read rank r's part [r * local, (r + 1) * local) of dimension `dim` of a checkpoint tensor
    (`source`, a safetensors slice: only that part is read) into `dest`, whose `dim` is `local` long.
    Past the tensor's end (the last rank of a padded vocabulary) dest is zeroed."""
    shape = tuple(source.get_shape())
    local, full = dest.shape[dim], shape[dim]
    expected = (*dest.shape[:dim], full, *dest.shape[dim + 1 :])
    if shape != expected or -(-full // tp.world_size) != local:
        raise ValueError(
            f"{what} has shape {shape}; rank {tp.rank} of {tp.world_size} expects its {tuple(dest.shape)} part of it"
        )
    start = tp.rank * local
    count = max(0, min(local, full - start))
    index = (slice(None),) * dim + (slice(start, start + count),)
    if count:
        dest.narrow(dim, 0, count).copy_(source[index])
    if count < local:
        dest.narrow(dim, count, local - count).zero_()


def build_model(
    folder: Path | str, dtype: torch.dtype, device: torch.device | str, tp: TensorParallel | None = None
) -> tuple[LlamaForCausalLM, SimpleNamespace]:
    """Read config.json, construct the registered model class (with `tp`, this rank's shard of it) and
    load its weights; in eval mode."""
    folder, device = Path(folder), torch.device(device)
    config = read_checkpoint_config(folder)  # as transformers would read it, without importing it
    cls = model_class(config)
    with torch.device("meta"):
        model = cls(config, tp)  # shapes only; load_weights allocates the real tensors
    load_weights(model, folder, dtype, device, tp)
    return model.eval(), config


def _materialize(model: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Give every parameter real (uninitialised) storage in dtype on device; move buffers
    to device keeping their dtype (rotary frequencies stay float32)."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            storage = torch.empty(param.shape, dtype=dtype, device=device)
            setattr(module, name, nn.Parameter(storage, requires_grad=False))
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_meta:
                raise ValueError(f"buffer {name} of {type(module).__name__} has no data to move")
            setattr(module, name, buffer.to(device))


def _safetensors_device(device: torch.device) -> str:
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _names(names: list[str], limit: int = 8) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} (and {len(names) - limit} more)"
