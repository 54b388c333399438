"""`make gpu-check`: what the first session on a CUDA machine runs, in one command, into one report.

On a CUDA device, in order (a failing step does not stop the ones after it):
1. the CUDA-only tests (`pytest -m cuda`: the kernels compiled for this GPU against their torch
   references, CUDA graphs, the memory profile, overlap), then every kernel test on the GPU;
2. `make bench-cuda` for both shapes (benchmarks/bench_cuda.py, one process per shape, each
   writing its JSON beside the report);
3. the kernel report for this GPU's architecture (registers, spills, shared memory, occupancy,
   compiled ahead of time), to read beside the kernels bench-cuda timed.
Every step's command, exit status, duration and output (its tail; the whole output in a log beside
it) go into `<out>/report.md`; the exit status is 1 when a step failed.

Without CUDA (or with --smoke) the same steps check themselves on CPU in seconds: the RMSNorm
kernel's tests in Triton's interpreter instead of the CUDA-only tests, no bench-cuda (its own
--smoke mode is tests/benchmarks/test_bench_cuda_smoke.py), and RMSNorm alone compiled for sm_90.
`make test` runs that mode (tests/benchmarks/test_gpu_check.py), so the kit works the day a GPU comes.

    python -m benchmarks.gpu_check [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.gpu_occupancy import ARCHS

TAIL_LINES = 60
REPO = Path(__file__).resolve().parents[1]  # where the steps run: `tests/` and `benchmarks/` resolve from here


@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    env: dict[str, str | None] = field(default_factory=dict)  # overrides; None removes the variable
    timeout: float = 3600.0
    skipped: str | None = None  # why the step does not run here


@dataclass(frozen=True)
class Outcome:
    step: Step
    status: str  # "passed", "failed (exit N)", "timed out", "skipped"
    seconds: float
    log: Path | None
    tail: str


def steps(out: Path, smoke: bool) -> list[Step]:
    """The kit's steps: on this machine's GPU, or their CPU smoke versions."""
    python = sys.executable
    compiled: dict[str, str | None] = {"TRITON_INTERPRET": None}  # compiled for a GPU, not interpreted
    if smoke:
        return [
            Step(
                "kernel tests (RMSNorm, Triton's interpreter)",
                [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/engine/kernels/test_rms_norm.py"],
                {"TRITON_INTERPRET": "1"},
                timeout=600,
            ),
            Step("bench-cuda", [], skipped="no CUDA device (tests/benchmarks/test_bench_cuda_smoke.py runs --smoke)"),
            Step(
                "kernel report (RMSNorm, sm_90)",
                [python, "-m", "benchmarks.kernel_report", "--arch", "90", "--launcher", "rms_norm"],
                compiled,
                timeout=600,
            ),
        ]
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    pytest = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    return [
        Step("CUDA-only tests", [*pytest, "-m", "cuda"]),
        Step("kernel tests on the GPU", [*pytest, "tests/engine/kernels"]),
        *(
            Step(f"bench-cuda {shape}", [python, "-m", "benchmarks.bench_cuda", "--shape", shape, "--json", str(json)])
            for shape, json in ((s, out.resolve() / f"bench-cuda-{s}.json") for s in ("1b", "8b"))
        ),
        Step(
            f"kernel report (sm_{arch})",
            [python, "-m", "benchmarks.kernel_report", *(["--arch", str(arch)] if arch in ARCHS else [])],
            compiled,
        ),
    ]


def run_step(step: Step, out: Path, index: int) -> Outcome:
    if step.skipped is not None:
        return Outcome(step, "skipped", 0.0, None, step.skipped)
    env = dict(os.environ)
    for name, value in step.env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    log = out / f"{index}-{re.sub(r'[^a-z0-9]+', '-', step.name.lower()).strip('-')}.log"
    started = time.perf_counter()
    with log.open("w") as sink:
        try:
            done = subprocess.run(
                step.command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=step.timeout
            )
            code = done.returncode
            status = "passed" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {step.timeout:.0f} s"
    lines = log.read_text(errors="replace").splitlines()
    return Outcome(step, status, time.perf_counter() - started, log, "\n".join(lines[-TAIL_LINES:]))


def device_line(smoke: bool) -> str:
    versions = f"torch {torch.__version__}"
    if smoke or not torch.cuda.is_available():
        return f"no CUDA device: CPU smoke run ({versions})"
    major, minor = torch.cuda.get_device_capability()
    return f"{torch.cuda.get_device_name()} (sm_{major}{minor}), {versions}, CUDA {torch.version.cuda}"


def report(outcomes: list[Outcome], device: str) -> str:
    lines = ["# gpu-check", "", f"Device: {device}", ""]
    lines += ["| step | status | seconds | log |", "| --- | --- | --- | --- |"]
    for o in outcomes:
        lines.append(f"| {o.step.name} | {o.status} | {o.seconds:.1f} | {o.log.name if o.log else '-'} |")
    for o in outcomes:
        lines += ["", f"## {o.step.name}: {o.status}", ""]
        if o.step.command:
            lines += [f"`{' '.join(o.step.command)}`", ""]
        lines += ["```", o.tail, "```"]
    return "\n".join(lines) + "\n"


def run_all(step_list: list[Step], out: Path, device: str) -> bool:
    """Run the steps in order into out/report.md; whether none failed."""
    out.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for index, step in enumerate(step_list, 1):
        print(f"gpu-check: {step.name} ...", flush=True)
        outcomes.append(run_step(step, out, index))
        print(f"gpu-check: {step.name}: {outcomes[-1].status}", flush=True)
    (out / "report.md").write_text(report(outcomes, device))
    print(f"gpu-check: report in {out / 'report.md'}")
    return all(o.status in ("passed", "skipped") for o in outcomes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="report.md, logs and bench JSON go here")
    parser.add_argument("--smoke", action="store_true", help="the CPU smoke run even where CUDA is available")
    args = parser.parse_args(argv)
    smoke = args.smoke or not torch.cuda.is_available()
    return 0 if run_all(steps(args.out, smoke), args.out, device_line(smoke)) else 1


if __name__ == "__main__":
    sys.exit(main())
