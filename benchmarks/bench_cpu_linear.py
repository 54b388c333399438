"""The CPU linear paths on the default model's weight shapes: torch's F.linear, oneDNN with a
pre-packed weight and the C++ packed_linear kernel (float32 with AVX-512, bfloat16 with AVX-512
BF16), per dtype and batch rows.

    python -m benchmarks.bench_cpu_linear [--rows 1,2,4,16,64,256] [--dtypes float32,bfloat16]

Each row multiplies one decode step's worth of activations through every linear layer of
SmolLM2-135M (30 layers of qkv 576->960, o 576->576, gate_up 576->3072, down 1536->576, then
the 576->49152 LM head): ms per step, and the weight bytes read per second. Random weights;
the shapes are what matter. The engine's choice (services/engine/models/layers.py) follows it:
packed_linear for every dtype it has on this CPU, oneDNN for the others.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from services.engine.cpu_kernels import load
from services.engine.models.layers import pack_weight

# (out, in) of every linear of one SmolLM2-135M forward, in order.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
Path = Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


def plain(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: F.linear(x, weight)


def onednn(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    packed = pack_weight(weight)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def paths() -> dict[str, tuple[Path, set[torch.dtype]]]:
    """Each path by name, with the dtypes it takes on this CPU."""
    both = {torch.float32, torch.bfloat16}
    found: dict[str, tuple[Path, set[torch.dtype]]] = {"F.linear": (plain, both), "oneDNN packed": (onednn, both)}
    kernels = load()
    if kernels is not None:

        def packed_kernel(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
            packed, out = kernels.pack_linear(weight), weight.shape[0]
            return lambda x: kernels.packed_linear(x, packed, out)  # type: ignore[no-any-return]

        found["packed_linear kernel"] = (packed_kernel, {getattr(torch, n) for n in kernels.PACKED_LINEAR_DTYPES})
    return found


def step_ms(dtype: torch.dtype, rows: int, make: Path, repeats: int) -> tuple[float, float]:
    weights = [torch.randn(o, i).to(dtype) for o, i in SHAPES]
    calls = [make(w) for w in weights]
    inputs = {i: torch.randn(rows, i).to(dtype) for _, i in SHAPES}
    for _ in range(2):
        for (_, i), call in zip(SHAPES, calls, strict=True):
            call(inputs[i])
    start = time.perf_counter()
    for _ in range(repeats):
        for (_, i), call in zip(SHAPES, calls, strict=True):
            call(inputs[i])
    seconds = (time.perf_counter() - start) / repeats
    size = sum(w.numel() * w.element_size() for w in weights)
    return 1000 * seconds, size / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,4,16,64,256")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{torch.get_num_threads()} threads; ms per forward's linears (weight GB/s)")
    available = paths()
    print(f"| dtype | rows | {' | '.join(available)} |")
    print(f"| --- | --- | {' | '.join('---' for _ in available)} |")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for rows in (int(r) for r in args.rows.split(",")):
            cells = []
            for make, dtypes in available.values():
                if dtype not in dtypes:
                    cells.append("-")
                    continue
                ms, rate = step_ms(dtype, rows, make, args.repeats)
                cells.append(f"{ms:.1f} ({rate:.0f})")
            print(f"| {dtype_name} | {rows} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
