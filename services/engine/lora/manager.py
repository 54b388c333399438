"""The engine's adapters: the names it knows, the slots they run in, and the model projections they adapt.

Names come from --lora-modules at start and from load()/unload() at run time (/v1/load_lora_adapter,
/v1/unload_lora_adapter). A request names its adapter (vLLM `model`, SGLang `lora_path`): resolve()
turns the name, or the path an adapter was loaded from, into the LoraAdapter the request keeps for
its whole life. Requests never make the engine read a path of their choosing: a path is only
accepted when an adapter was loaded from it (loading is the admin's call).

Unloading removes the name at once: new requests naming it are refused, while requests admitted
before keep the adapter they resolved and finish with it (its slot is freed after the last one).
Weights are read from disk once, at load; a slot is filled from the host copy when a sequence of
that adapter is admitted and no slot holds it (slots.py picks, evicting the least recently used).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from services.engine.lora.adapter import LoraAdapter, LoraError, read_adapter
from services.engine.lora.slots import LoraSlots
from services.engine.lora.weights import LoraWeights

# Each adaptable projection of a decoder layer: its attribute path and the checkpoint projections
# whose outputs it concatenates (one row slice each, see layers.MergedLinear).
TARGETS: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "self_attn.o_proj": ("o_proj",),
    "mlp.gate_up_proj": ("gate_proj", "up_proj"),
    "mlp.down_proj": ("down_proj",),
}


def _linear(layer: torch.nn.Module, path: str) -> Any:
    module: Any = layer
    for part in path.split("."):
        module = getattr(module, part)
    return module


class LoraManager:
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_loras: int,
        max_rank: int,
        modules: Iterable[tuple[str, Path]] = (),
    ) -> None:
        self.max_rank = max_rank
        self.slots = LoraSlots(max_loras)
        layers = list(model.model.layers)  # type: ignore[union-attr,arg-type,operator]
        self.num_layers = len(layers)
        weight = next(model.parameters())
        self._weights: list[dict[str, LoraWeights]] = []
        # Checkpoint projection -> (in_features, out_features), what an adapter's A and B must fit.
        self.shapes: dict[str, tuple[int, int]] = {}
        for layer in layers:
            per_layer: dict[str, LoraWeights] = {}
            for target, names in TARGETS.items():
                linear = _linear(layer, target)
                sizes = tuple(getattr(linear, "shard_sizes", (linear.out_features,)))
                lora = LoraWeights(linear.in_features, sizes, max_loras, max_rank, weight.dtype, weight.device)
                linear.lora = lora
                per_layer[target] = lora
                self.shapes.update({name: (linear.in_features, size) for name, size in zip(names, sizes, strict=True)})
            self._weights.append(per_layer)
        self._adapters: dict[str, LoraAdapter] = {}
        self._uids = itertools.count(1)
        for name, folder in modules:
            self.load(name, folder)

    # -- names ----------------------------------------------------------------

    @property
    def adapters(self) -> list[LoraAdapter]:
        """The loaded adapters, in load order."""
        return list(self._adapters.values())

    def load(self, name: str, path: Path) -> LoraAdapter:
        """Read and check the adapter at `path` and serve it as `name`. LoraError when the name is taken
        or the adapter cannot be served (rank, target modules, shapes, files)."""
        if not name or name.strip() != name:
            raise LoraError(f"LoRA adapter name {name!r} must be non-empty, without surrounding spaces")
        if name in self._adapters:
            raise LoraError(f"LoRA adapter {name!r} is already loaded (from {self._adapters[name].path})")
        adapter = read_adapter(
            name,
            Path(path),
            uid=next(self._uids),
            max_rank=self.max_rank,
            num_layers=self.num_layers,
            shapes=self.shapes,
        )
        self._adapters[name] = adapter
        return adapter

    def unload(self, name: str) -> LoraAdapter:
        """Stop serving `name`; requests already using it finish with it (see the module docstring)."""
        adapter = self._adapters.pop(name, None)
        if adapter is None:
            raise LoraError(f"LoRA adapter {name!r} is not loaded{self._known()}")
        freed = self.slots.forget(adapter.uid)
        if freed is not None:
            self._clear(freed)
        return adapter

    def resolve(self, name_or_path: str) -> LoraAdapter:
        """The loaded adapter of this name, or loaded from this path; LoraError naming the known ones."""
        adapter = self._adapters.get(name_or_path)
        if adapter is not None:
            return adapter
        wanted = Path(name_or_path).expanduser().resolve()
        # A copy: requests are resolved on the gRPC thread while the step thread may load or unload.
        for adapter in list(self._adapters.values()):
            if adapter.path.expanduser().resolve() == wanted:
                return adapter
        raise LoraError(f"unknown LoRA adapter {name_or_path!r}{self._known()}")

    def _known(self) -> str:
        names = ", ".join(sorted(self._adapters))
        return f" (loaded: {names})" if names else " (none is loaded)"

    # -- slots ----------------------------------------------------------------

    def acquire(self, seq_id: str, adapter: LoraAdapter) -> bool:
        """Give the sequence a slot holding its adapter (copying its weights in when needed); False
        when every slot is in use by running sequences of other adapters."""
        got = self.slots.acquire(seq_id, adapter.uid)
        if got is None:
            return False
        if got.needs_write:
            self._write(got.slot, adapter)
        return True

    def release(self, seq_id: str) -> None:
        self.slots.release(seq_id)

    def slot_of(self, seq_id: str) -> int:
        """The slot of a running adapter sequence, -1 for one of the base model."""
        slot = self.slots.slot_of(seq_id)
        return -1 if slot is None else slot

    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        for layer, per_layer in enumerate(self._weights):
            for path, names in TARGETS.items():
                shards = [adapter.weights.get((layer, name)) for name in names]
                per_layer[path].write(slot, shards, adapter.scaling)

    def _clear(self, slot: int) -> None:
        for per_layer in self._weights:
            for lora in per_layer.values():
                lora.clear(slot)
