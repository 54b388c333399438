"""`make gpu-check` in its CPU smoke mode, so the first GPU session's kit works the day a GPU comes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import Step, main, run_all


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine gpu-check runs for real")
def test_without_cuda_gpu_check_runs_its_smoke_steps(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "Device: no CUDA device: CPU smoke run" in report
    assert "| kernel tests (RMSNorm, Triton's interpreter) | passed |" in report
    assert "| bench-cuda | skipped |" in report
    assert "| kernel report (RMSNorm, sm_90) | passed |" in report
    # The interpreted tests really ran, and the report really compiled: their own output is in it.
    assert " passed" in report.split("## kernel tests")[1].split("##")[0]
    assert "| _rms_norm_kernel | bf16 | HAS_RESIDUAL=False" in report


def test_a_failing_step_is_reported_and_the_next_still_runs(tmp_path: Path) -> None:
    steps = [
        Step("fails", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"]),
        Step("not here", [], skipped="no such device"),
        Step("passes", [sys.executable, "-c", "print('fine')"]),
    ]
    assert run_all(steps, tmp_path, "test device") is False
    report = (tmp_path / "report.md").read_text()
    assert "| fails | failed (exit 3) |" in report and "| not here | skipped |" in report
    assert "| passes | passed |" in report
    assert "boom" in report and "fine" in report and "no such device" in report
