"""What `bench_cuda` measured for one model shape, as Markdown rows (docs/benchmarks.md) and JSON."""

from __future__ import annotations

import importlib.metadata
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from benchmarks.cuda_workload import Workload
from benchmarks.hf_baseline import GenerateRun
from benchmarks.kernel_benches import KernelResult
from benchmarks.model_shapes import ModelShape


@dataclass(frozen=True)
class Measurement:
    """One workload's median run: tokens per second and how close to its floor it came."""

    seconds: float
    output_tokens_per_second: float
    total_tokens_per_second: float
    # Sum of every step's floor over the measured time (the whole run).
    fraction_of_floor: float
    # Decode-only steps: median measured and floor milliseconds, and the median of floor / measured.
    decode_step_ms: float | None
    decode_floor_ms: float | None
    decode_fraction: float | None
    # Prompt tokens served from the prefix cache: 0, or the run measured less work than it says.
    cached_tokens: int


@dataclass(frozen=True)
class Ttft:
    ms: float
    floor_ms: float
    bound: str

    @property
    def fraction(self) -> float:
        return self.floor_ms / self.ms


@dataclass
class ShapeReport:
    shape: ModelShape
    dtype: str
    attention_backend: str = ""
    graphs: str = ""
    decode: Measurement | None = None
    throughput: dict[int, Measurement] = field(default_factory=dict)
    ttft: Ttft | None = None
    # Graphs off: batch-1 decode and the baseline concurrency; or why not measured.
    graphs_off_decode: Measurement | None = None
    graphs_off_throughput: Measurement | None = None
    baseline: GenerateRun | None = None
    kernels: list[KernelResult] = field(default_factory=list)


def params_text(count: int) -> str:
    return f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.2f} M"


def _pct(value: float | None) -> str:
    return f"**{value:.0%}**" if value is not None else "n/a"


def measurement_text(m: Measurement) -> str:
    text = (
        f"**{m.output_tokens_per_second:,.0f} output tok/s**, {m.total_tokens_per_second:,.0f} total tok/s "
        f"({m.seconds:.2f} s); whole run {_pct(m.fraction_of_floor)} of its floor"
    )
    if m.decode_step_ms is not None and m.decode_floor_ms is not None:
        text += (
            f"; decode step median {m.decode_step_ms:.2f} ms vs floor {m.decode_floor_ms:.2f} ms"
            f" = {_pct(m.decode_fraction)}"
        )
    return text


def decode_text(m: Measurement) -> str:
    assert m.decode_step_ms is not None and m.decode_floor_ms is not None
    return (
        f"**{1000 / m.decode_step_ms:,.0f} tok/s** ({m.decode_step_ms:.2f} ms/token, median step); "
        f"floor {m.decode_floor_ms:.3f} ms/token = {_pct(m.decode_fraction)}"
    )


def shape_rows(report: ShapeReport, workload: Workload) -> list[tuple[str, str]]:
    w, shape = workload, report.shape
    rows = [
        (
            "model",
            f"{shape.name}: {params_text(shape.total_params)} parameters (random, {report.dtype}), "
            f"{report.attention_backend}, {report.graphs}",
        )
    ]
    if report.decode is not None:
        rows.append((f"batch 1: decode, prompt {w.decode_prompt}, {w.decode_output} out", decode_text(report.decode)))
    for c, m in report.throughput.items():
        rows.append((f"{c} concurrent: {w.throughput_prompt} in, {w.throughput_output} out", measurement_text(m)))
    if report.ttft is not None:
        t = report.ttft
        rows.append(
            (
                f"time to first token, one {w.ttft_prompt}-token prompt",
                f"**{t.ms:.2f} ms**; floor {t.floor_ms:.2f} ms ({t.bound}-bound) = {_pct(t.fraction)}",
            )
        )
    rows += graph_rows(report, w)
    baseline, ours = report.baseline, report.throughput.get(w.baseline_concurrency)
    if baseline is not None:
        rows.append(
            (
                f"transformers.generate: {w.baseline_concurrency} in one static batch, "
                f"{w.throughput_prompt} in, {w.throughput_output} out",
                f"**{baseline.output_tokens_per_second:,.0f} output tok/s**, "
                f"{baseline.total_tokens_per_second:,.0f} total tok/s ({baseline.seconds:.2f} s)",
            )
        )
        if ours is not None:
            ratio = ours.output_tokens_per_second / baseline.output_tokens_per_second
            rows.append(
                (f"throughput ratio turnout / transformers, {w.baseline_concurrency} concurrent", f"**{ratio:.2f}x**")
            )
    rows += [kernel_row(k) for k in report.kernels]
    return rows


def graph_rows(report: ShapeReport, w: Workload) -> list[tuple[str, str]]:
    rows = []
    on, off = report.decode, report.graphs_off_decode
    if on is not None and off is not None and on.decode_step_ms and off.decode_step_ms:
        rows.append(
            (
                "CUDA graphs off vs on: batch-1 decode",
                f"{1000 / off.decode_step_ms:,.0f} vs {1000 / on.decode_step_ms:,.0f} tok/s"
                f" = **{off.decode_step_ms / on.decode_step_ms:.2f}x**",
            )
        )
    on, off = report.throughput.get(w.baseline_concurrency), report.graphs_off_throughput
    if on is not None and off is not None:
        rows.append(
            (
                f"CUDA graphs off vs on: {w.baseline_concurrency} concurrent",
                f"{off.output_tokens_per_second:,.0f} vs {on.output_tokens_per_second:,.0f} output tok/s"
                f" = **{on.output_tokens_per_second / off.output_tokens_per_second:.2f}x**",
            )
        )
    return rows


def kernel_row(k: KernelResult) -> tuple[str, str]:
    if k.seconds is None or k.achieved_bandwidth is None:
        return (f"kernel {k.name}", k.note or "not measured")
    if k.achieved_flop_rate is not None:
        return (
            f"kernel {k.name}",
            f"{1e6 * k.seconds:.1f} µs, {k.achieved_flop_rate / 1e12:,.1f} TFLOP/s"
            f" = {_pct(k.fraction_of_floor)} of the FLOP floor",
        )
    return (
        f"kernel {k.name}",
        f"{1e6 * k.seconds:.1f} µs, {k.achieved_bandwidth / 1e9:,.0f} GB/s ({k.bytes / 1e6:,.1f} MB moved)"
        f" = {_pct(k.fraction_of_floor)} of the bandwidth floor",
    )


def report_json(report: ShapeReport) -> dict[str, Any]:
    data = asdict(report)
    data["shape"]["total_params"] = report.shape.total_params
    data["ttft"] = report.ttft and {**asdict(report.ttft), "fraction": report.ttft.fraction}
    data["baseline"] = report.baseline and {
        **asdict(report.baseline),
        "output_tokens_per_second": report.baseline.output_tokens_per_second,
        "total_tokens_per_second": report.baseline.total_tokens_per_second,
    }
    data["kernels"] = [
        {
            **asdict(k),
            "achieved_bandwidth": k.achieved_bandwidth,
            "achieved_flop_rate": k.achieved_flop_rate,
            "fraction_of_floor": k.fraction_of_floor,
        }
        for k in report.kernels
    ]
    return data


def versions() -> dict[str, str]:
    found: dict[str, str] = {"torch": str(torch.__version__)}
    for package in ("triton", "transformers"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "absent"
    return found


def print_table(rows: list[tuple[str, str]]) -> None:
    lines = ["| measurement | result |", "| --- | --- |", *(f"| {name} | {value} |" for name, value in rows)]
    print("\n".join(lines) + "\n", flush=True)  # flushed: a device run's output may be cut off by its time limit
