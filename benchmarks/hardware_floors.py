"""The two ceilings of a device, measured: memory bandwidth and dense matmul rate.

(a) bandwidth: one large device-to-device copy, bytes read + bytes written over the
    median time; (b) matmul rate: N x N x N products in the model dtype, 2 N^3 over the
    median time. Both on random data (zeros run faster than real data on some GPUs),
    timed with CUDA events after warm-up. On CPU (smoke runs) the same code measures the
    CPU, with a host clock; those numbers are labelled as such and are no GPU figure.

    python -m benchmarks.hardware_floors [--copy-gib 2] [--matmul-n 8192] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.step_floors import Ceilings

GIB = 1 << 30

# Datasheet figures (dense bf16, no sparsity) for the devices lent here, by torch's device name;
# /work/.library/device/H200.md. Leads only: the floors use the measured numbers.
SPEC_SHEET: dict[str, Ceilings] = {
    "NVIDIA H100 80GB HBM3": Ceilings(bandwidth=3.35e12, matmul_rate=989e12),
    "NVIDIA H200": Ceilings(bandwidth=4.8e12, matmul_rate=989e12),
}


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median time of one call of `fn`: CUDA events around each call on a GPU, a host clock on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
    else:
        for _ in range(repeats):
            begin = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, nbytes: int = 2 * GIB, repeats: int = 20) -> float:
    """Bytes per second of a device-to-device copy of `nbytes`, counting the read and the write."""
    count = nbytes // 4
    source = torch.randn(count, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    seconds = median_seconds(lambda: target.copy_(source), device, warmup=3, repeats=repeats)
    if not torch.equal(target, source):
        raise RuntimeError("the timed copy did not copy")
    return 2 * source.numel() * source.element_size() / seconds


def matmul_rate(device: torch.device, n: int = 8192, dtype: torch.dtype = torch.bfloat16, repeats: int = 20) -> float:
    """FLOP per second of an n x n by n x n product in `dtype`: 2 n^3 over the median time."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out = torch.empty(n, n, dtype=dtype, device=device)
    seconds = median_seconds(lambda: torch.mm(a, b, out=out), device, warmup=3, repeats=repeats)
    return 2 * n**3 / seconds


@dataclass(frozen=True)
class MeasuredCeilings:
    device_name: str
    dtype: torch.dtype
    measured: Ceilings
    spec: Ceilings | None

    def rows(self) -> list[tuple[str, str]]:
        """Markdown rows: each ceiling, measured, and its datasheet figure where one is on file."""
        where = self.device_name if self.device_name != "cpu" else "CPU, not a GPU figure"
        dtype = str(self.dtype).removeprefix("torch.")
        bandwidth = f"**{self.measured.bandwidth / 1e9:,.0f} GB/s** ({where})"
        rate = f"**{flop_rate_text(self.measured.matmul_rate)}** ({where})"
        if self.spec is not None:
            bandwidth += f", datasheet {self.spec.bandwidth / 1e9:,.0f} GB/s"
            bandwidth += f" = {self.measured.bandwidth / self.spec.bandwidth:.0%}"
            rate += f", datasheet {flop_rate_text(self.spec.matmul_rate)}"
            rate += f" = {self.measured.matmul_rate / self.spec.matmul_rate:.0%}"
        return [
            ("memory bandwidth (device-to-device copy, read + write)", bandwidth),
            (f"matmul rate ({dtype})", rate),
        ]


def flop_rate_text(rate: float) -> str:
    return f"{rate / 1e12:,.0f} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:,.1f} GFLOP/s"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def measure_ceilings(
    device: torch.device, dtype: torch.dtype, copy_bytes: int, matmul_n: int, repeats: int
) -> MeasuredCeilings:
    name = device_name(device)
    measured = Ceilings(copy_bandwidth(device, copy_bytes, repeats), matmul_rate(device, matmul_n, dtype, repeats))
    return MeasuredCeilings(name, dtype, measured, SPEC_SHEET.get(name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copied buffer")
    parser.add_argument("--matmul-n", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    ceilings = measure_ceilings(device, dtype, int(args.copy_gib * GIB), args.matmul_n, args.repeats)
    print("| measurement | result |\n| --- | --- |")
    for name, value in ceilings.rows():
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
