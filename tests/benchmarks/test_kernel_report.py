"""The arithmetic and the checks behind the kernel report, on made-up kernels."""

from __future__ import annotations

import pytest

from benchmarks.gpu_occupancy import ARCHS, occupancy
from benchmarks.kernel_aot import AotRun, Resources, Specialisation, Unit, spills_in_sass_loops
from benchmarks.kernel_report import OCCUPANCY_FLOOR_WARPS, SPILL_BYTES_OUTSIDE_LOOPS, markdown, problems

H100 = ARCHS[90]


def test_arch_limits_are_the_documented_ones() -> None:
    assert [ARCHS[a].max_shared_per_block for a in (80, 90, 100)] == [163 * 1024, 227 * 1024, 227 * 1024]
    assert {(a.registers_per_sm, a.max_warps_per_sm, a.max_blocks_per_sm) for a in ARCHS.values()} == {(65536, 64, 32)}


@pytest.mark.parametrize(
    ("registers", "warps", "shared", "blocks", "limited_by"),
    [
        (32, 4, 0, 16, "warps"),  # 64 warps / 4
        (255, 4, 0, 2, "registers"),  # 256 registers x 32 threads = 8192 per warp: 8 warps
        (250, 4, 80 * 1024, 2, "registers"),  # 2 x (80 KiB + 1 KiB reserved) fits 228 KiB
        (64, 4, 120 * 1024, 1, "shared memory"),
        (255, 16, 0, 0, "registers"),  # 16 warps x 8192 registers > 65536: cannot launch
        (16, 1, 0, 32, "blocks"),
    ],
)
def test_occupancy(registers: int, warps: int, shared: int, blocks: int, limited_by: str) -> None:
    fit = occupancy(H100, registers, warps, shared)
    assert (fit.blocks_per_sm, fit.limited_by) == (blocks, limited_by)
    assert fit.fraction == blocks * warps / 64


def test_registers_are_allocated_in_units_of_eight_per_thread() -> None:
    # 129 registers round up to 136: 136 x 32 = 4352 per warp, 15 warps fit, 3 blocks of 4.
    assert occupancy(H100, 129, 4, 0).blocks_per_sm == 3
    assert occupancy(H100, 128, 4, 0).blocks_per_sm == 4


def unit(arch: int = 90, warps: int = 4, **resources: int) -> Unit:
    spec = Specialisation(
        module="m",
        kernel="_k",
        arch=arch,
        signature={"x_ptr": "*bf16", "BLOCK": "constexpr"},
        constants={"BLOCK": 64},
        attrs={},
        options={"num_warps": warps},
        cache_key="k",
        sources=["1b bf16: k (step)"],
    )
    return Unit(spec, Resources(**{"registers": 64, **resources}))


def test_a_clean_kernel_passes_every_check() -> None:
    assert problems(unit()) == {}


def test_each_check_fails_on_its_own() -> None:
    assert set(problems(Unit(unit().spec, Resources(error="PTXASError: boom")))) == {"compiles"}
    assert set(problems(unit(spill_stores=4, spill_loads=4, spills_in_loops=1))) == {"spills"}
    assert set(problems(unit(spill_stores=SPILL_BYTES_OUTSIDE_LOOPS + 4))) == {"spills"}
    assert problems(unit(spill_stores=8, spill_loads=8)) == {}  # once per program, outside loops
    assert set(problems(unit(arch=80, shared_bytes=164 * 1024))) == {"shared memory", "occupancy"}
    assert set(problems(unit(arch=90, shared_bytes=164 * 1024))) == {"occupancy"}  # 1 block of 4 warps
    assert set(problems(unit(warps=16, registers=255))) == {"occupancy"}
    assert OCCUPANCY_FLOOR_WARPS == 8


def test_markdown_puts_each_architecture_in_its_column() -> None:
    units = [unit(arch=80), unit(arch=90, spill_stores=8, spill_loads=8), unit(arch=100, shared_bytes=300 * 1024)]
    table = markdown(AotRun([80, 90, 100], units, ["m:_k"], [], 1.0)).splitlines()
    assert table[0] == "| kernel | dtype | specialisation | launched for | sm_80 | sm_90 | sm_100 |"
    assert len(table) == 3  # one specialisation, three architectures
    cells = [c.strip() for c in table[2].split("|")[1:-1]]
    assert cells[:4] == ["_k", "bf16", "BLOCK=64 warps=4", "1b bf16: step"]
    assert cells[4] == "64 / 0 / 0.0 / 50%"  # 64 registers: 32 warps fit
    assert cells[5] == "64 / 8 B once / 0.0 / 50%"
    assert cells[6].startswith("64 / 0 / 300.0 / 0% **(shared memory, occupancy)**")


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R10 ;
        /*0020*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0030*/                   LDL.LU R3, [R1+0x4] ;
        /*0040*/               @P0 BRA 0x20 ;
        /*0050*/                   LDL R4, [R1] ;
        /*0060*/                   EXIT ;
        /*0070*/                   BRA 0x70;
"""


def test_spills_count_only_inside_loops() -> None:
    # The loop is 0x20 .. 0x40 (its backward branch): one reload inside, a store before, a load after.
    assert spills_in_sass_loops(SASS) == 1
    assert spills_in_sass_loops(SASS.replace("@P0 BRA 0x20", "@P0 BRA 0x60")) == 0  # a forward branch
