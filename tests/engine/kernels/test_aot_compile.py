"""Every Triton kernel the engine launches compiles for NVIDIA GPUs, with no GPU here.

benchmarks/kernel_aot.py specialises each call of services/engine/kernels/launch_table.py for the
default model, Llama-3.2-1B and Llama-3.1-8B in bf16, fp16 and fp32, compiles every distinct
variant with the Triton wheel's ptxas, and these tests hold each to benchmarks/kernel_report.py's
checks: it compiles, spills no registers in a loop, fits the architecture's shared memory, keeps
enough warps resident. sm_90 (H100 / H200) runs here; TURNOUT_AOT_ARCHS=80,90,100 adds A100 and
B200 (`make kernel-report` always covers all three). Results are cached per Triton version under
the project's cache folder, so only the first run on a machine compiles (about half a minute).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.kernel_aot import AotRun, Unit, cache_dir
from benchmarks.kernel_report import describe, problems

ARCHS = [int(a) for a in os.environ.get("TURNOUT_AOT_ARCHS", "90").split(",")]
KERNELS = Path(__file__).parents[3] / "services" / "engine" / "kernels"


@pytest.fixture(scope="module")
def aot(tmp_path_factory: pytest.TempPathFactory) -> AotRun:
    """The compile results, from a process of its own: this one runs the kernels in Triton's
    interpreter (tests/conftest.py), which compiles nothing."""
    out = tmp_path_factory.mktemp("aot") / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "benchmarks.kernel_aot", "--arch", *map(str, ARCHS), "--json", str(out)]
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".lock", "w") as lock:  # parallel test workers: one compiles, the others read its cache
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(command, env=env, check=True, timeout=280)
    return AotRun.from_json(json.loads(out.read_text()))


def failing(aot: AotRun, check: str) -> list[str]:
    return [f"{describe(u)}: {problems(u)[check]}" for u in aot.units if check in problems(u)]


def test_every_jit_function_of_the_package_is_compiled(aot: AotRun) -> None:
    # The enumeration itself: as many JIT functions as @triton.jit decorators in the sources.
    decorators = sum(len(re.findall(r"^@triton\.jit", p.read_text(), re.M)) for p in KERNELS.glob("*.py"))
    assert len(aot.jit_functions) == decorators > 0
    # A kernel that no entry of launch_table.py launches (nor calls from a launched kernel) escapes
    # these tests: add its launcher's calls to the table.
    assert aot.uncovered == []


def test_every_specialisation_compiles(aot: AotRun) -> None:
    assert failing(aot, "compiles") == []


def test_no_specialisation_spills_registers_in_a_loop(aot: AotRun) -> None:
    assert failing(aot, "spills") == []


def test_shared_memory_fits_the_architecture(aot: AotRun) -> None:
    assert failing(aot, "shared memory") == []


def test_occupancy_stays_above_the_floor(aot: AotRun) -> None:
    assert failing(aot, "occupancy") == []


def test_specialisations_come_from_the_launchers(aot: AotRun) -> None:
    """Spot checks against the launchers' own tile rules, so the table cannot drift into fiction."""
    units: list[Unit] = [u for u in aot.units if u.spec.arch == ARCHS[0]]
    extend = {u.spec.dtype: u.spec.constants for u in units if u.spec.kernel == "_extend_kernel"}
    assert extend["bf16"]["BLOCK_N"] == 64 and extend["fp32"]["BLOCK_N"] == 32  # tiling.kv_tile_size
    assert {u.spec.constants["BLOCK_DIM"] for u in units if u.spec.kernel == "_rms_norm_kernel"} == {1024, 2048, 4096}
    merges = {u.spec.constants["MERGE_BLOCK"] for u in units if u.spec.kernel == "_merge_kernel"}
    assert merges == {2, 4, 8, 16, 32}
    columns = {u.spec.constants["BLOCK_COLUMNS"] for u in units if u.spec.kernel == "_race_kernel"}
    assert columns == {8, 16, 32, 64, 128, 256, 512, 1024}
