"""The ceilings' arithmetic (bytes read + written, 2 n^3 FLOPs, medians) on a fake clock."""

from __future__ import annotations

import itertools

import pytest
import torch

from benchmarks import hardware_floors
from benchmarks.hardware_floors import MeasuredCeilings, copy_bandwidth, matmul_rate, median_seconds
from benchmarks.step_floors import Ceilings

CPU = torch.device("cpu")


def test_median_seconds_skips_the_warm_up_and_takes_the_median(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count()
    now = [0.0]
    monkeypatch.setattr(hardware_floors.time, "perf_counter", lambda: now[0])
    durations = [100.0, 100.0, 1.0, 5.0, 2.0]  # two warm-up calls, then three timed ones

    def call() -> None:
        now[0] += durations[next(clock)]

    assert median_seconds(call, CPU, warmup=2, repeats=3) == 2.0
    assert next(clock) == 5


def test_copy_counts_bytes_read_and_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware_floors, "median_seconds", lambda fn, device, warmup, repeats: (fn(), 0.5)[1])
    assert copy_bandwidth(CPU, nbytes=1 << 20, repeats=1) == 2 * (1 << 20) / 0.5


def test_matmul_rate_counts_two_n_cubed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware_floors, "median_seconds", lambda fn, device, warmup, repeats: (fn(), 0.25)[1])
    assert matmul_rate(CPU, n=64, dtype=torch.float32, repeats=1) == 2 * 64**3 / 0.25


def test_measured_on_cpu_gives_positive_ceilings() -> None:
    assert copy_bandwidth(CPU, nbytes=1 << 20, repeats=2) > 0
    assert matmul_rate(CPU, n=64, dtype=torch.float32, repeats=2) > 0


def test_rows_compare_with_the_datasheet() -> None:
    spec = hardware_floors.SPEC_SHEET["NVIDIA H100 80GB HBM3"]
    ceilings = MeasuredCeilings("NVIDIA H100 80GB HBM3", torch.bfloat16, Ceilings(3.0e12, 791e12), spec)
    (_, bandwidth), (rate_name, rate) = ceilings.rows()
    assert bandwidth == "**3,000 GB/s** (NVIDIA H100 80GB HBM3), datasheet 3,350 GB/s = 90%"
    assert rate_name == "matmul rate (bfloat16)"
    assert rate == "**791 TFLOP/s** (NVIDIA H100 80GB HBM3), datasheet 989 TFLOP/s = 80%"
    cpu = MeasuredCeilings("cpu", torch.float32, Ceilings(4e9, 5e10), None).rows()
    assert cpu[0][1] == "**4 GB/s** (CPU, not a GPU figure)"
    assert cpu[1][1] == "**50.0 GFLOP/s** (CPU, not a GPU figure)"
