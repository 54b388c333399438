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
import triton

from benchmarks.kernel_aot import DTYPES, MODELS, AotRun, Unit, cache_dir
from benchmarks.kernel_report import describe, problems
from services.engine.kernels import paged_decode, sampling, tiling

ARCHS = [int(a) for a in os.environ.get("TURNOUT_AOT_ARCHS", "90").split(",")]
ROOT = Path(__file__).parents[3]  # `python -m benchmarks...` imports from here (benchmarks is not installed)
KERNELS = ROOT / "services" / "engine" / "kernels"


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
        subprocess.run(command, cwd=ROOT, env=env, check=True, timeout=280)
    return AotRun.from_json(json.loads(out.read_text()))


def failures(aot: AotRun, check: str) -> str:
    """One line per specialisation failing `check`, empty when none does."""
    return "\n".join(f"{describe(u)}: {problems(u)[check]}" for u in aot.units if check in problems(u))


def test_every_jit_function_of_the_package_is_compiled(aot: AotRun) -> None:
    # The enumeration itself: as many JIT functions as @triton.jit decorators in the sources.
    decorators = sum(len(re.findall(r"^@triton\.jit", p.read_text(), re.M)) for p in KERNELS.glob("*.py"))
    assert len(aot.jit_functions) == decorators > 0
    # A kernel that no entry of launch_table.py launches (nor calls from a launched kernel) escapes
    # these tests: add its launcher's calls to the table.
    assert aot.uncovered == []


def test_every_specialisation_compiles(aot: AotRun) -> None:
    bad = failures(aot, "compiles")
    assert not bad, "\n" + bad


def test_no_specialisation_spills_registers_in_a_loop(aot: AotRun) -> None:
    bad = failures(aot, "spills")
    assert not bad, "\n" + bad


def test_shared_memory_fits_the_architecture(aot: AotRun) -> None:
    bad = failures(aot, "shared memory")
    assert not bad, "\n" + bad


def test_occupancy_stays_above_the_floor(aot: AotRun) -> None:
    bad = failures(aot, "occupancy")
    assert not bad, "\n" + bad


def test_the_table_reaches_every_tile_the_launchers_pick(aot: AotRun) -> None:
    """The table's calls cover each launcher's range of tile choices for these models (their own
    rules, from their own modules): a call the table lost would show as a missing value."""
    units: list[Unit] = [u for u in aot.units if u.spec.arch == ARCHS[0]]

    def values(kernel: str, name: str, dtype: str | None = None) -> set[object]:
        return {u.spec.constants[name] for u in units if u.spec.kernel == kernel and dtype in (None, u.spec.dtype)}

    for dtype, torch_dtype in DTYPES.items():
        assert values("_extend_kernel", "BLOCK_N", dtype) == {tiling.kv_tile_size(torch_dtype)}
        assert values("_partition_kernel", "BLOCK_N", dtype) == {tiling.kv_tile_size(torch_dtype)}
        assert {u.spec.num_warps for u in units if "_extend" in u.spec.kernel and u.spec.dtype == dtype} == {
            tiling.attention_warps(torch_dtype)
        }
    hidden = {triton.next_power_of_2(shape.hidden_size) for shape in MODELS.values()}
    assert values("_rms_norm_kernel", "BLOCK_DIM") == hidden
    assert values("_partition_kernel", "SINGLE_PARTITION") == {True, False}
    assert values("_merge_kernel", "MERGE_BLOCK") == {2**i for i in range(1, paged_decode.MERGE_BLOCK.bit_length())}
    widths = range(sampling.MIN_BLOCK_COLUMNS.bit_length() - 1, sampling.MAX_BLOCK_COLUMNS.bit_length())
    assert values("_race_kernel", "BLOCK_COLUMNS") == {2**i for i in widths}
