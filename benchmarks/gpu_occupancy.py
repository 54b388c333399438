"""NVIDIA architectures' per-SM limits, and the occupancy a kernel's resources allow on them.

Limits per compute capability, from the CUDA C++ Programming Guide's "Technical Specifications per
Compute Capability" (the values NVIDIA's CCCL encodes in cuda/__device/arch_traits.h):

    arch    GPUs         registers/SM  warps/SM  blocks/SM  shared/SM  reserved/block  shared/block (opt-in)
    sm_80   A100         65536         64        32         164 KiB    1 KiB           163 KiB
    sm_90   H100, H200   65536         64        32         228 KiB    1 KiB           227 KiB
    sm_100  B200         65536         64        32         228 KiB    1 KiB           227 KiB

A kernel whose `shared` (Triton's metadata, dynamic shared memory per block) exceeds the opt-in
per-block limit cannot launch: Triton raises OutOfResources when it loads it.
"""

from __future__ import annotations

from dataclasses import dataclass

WARP_SIZE = 32
# Registers are allocated per warp in units of 256 (a thread's count rounded up to a multiple of 8),
# shared memory per block in units of 128 bytes (the CUDA occupancy calculator's allocation units).
REGISTER_UNIT = 256
SHARED_UNIT = 128


@dataclass(frozen=True)
class ArchLimits:
    arch: int  # compute capability, 80 for sm_80
    gpus: str
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    shared_per_sm: int = 228 * 1024
    reserved_shared_per_block: int = 1024

    @property
    def max_shared_per_block(self) -> int:
        """Dynamic shared memory one block may opt in to."""
        return self.shared_per_sm - self.reserved_shared_per_block

    @property
    def name(self) -> str:
        return f"sm_{self.arch}"


ARCHS: dict[int, ArchLimits] = {
    80: ArchLimits(80, "A100", shared_per_sm=164 * 1024),
    90: ArchLimits(90, "H100, H200"),
    100: ArchLimits(100, "B200"),
}


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    limited_by: str  # "warps", "registers", "shared memory" or "blocks"
    warps_per_sm: int
    fraction: float  # resident warps over the SM's maximum


def occupancy(limits: ArchLimits, registers_per_thread: int, num_warps: int, shared_bytes: int) -> Occupancy:
    """Blocks of `num_warps` warps, each thread holding `registers_per_thread` registers and each
    block `shared_bytes` of dynamic shared memory, that fit on one SM at once, and what stops more:

        by warps     = max_warps_per_sm // num_warps
        by registers = (registers_per_sm // (ceil(registers_per_thread * 32 / 256) * 256)) // num_warps
        by shared    = shared_per_sm // ceil((shared_bytes + reserved_per_block) / 128) * 128
        blocks       = min(by warps, by registers, by shared, max_blocks_per_sm)
        occupancy    = blocks * num_warps / max_warps_per_sm

    It is the theoretical occupancy of the CUDA occupancy calculator; what a GPU achieves also
    depends on the grid (too few programs leave SMs idle) and on the driver's L1 / shared carve-out.
    """
    registers_per_warp = -(-registers_per_thread * WARP_SIZE // REGISTER_UNIT) * REGISTER_UNIT
    shared_per_block = -(-(shared_bytes + limits.reserved_shared_per_block) // SHARED_UNIT) * SHARED_UNIT
    limits_by = {
        "warps": limits.max_warps_per_sm // num_warps,
        "registers": (limits.registers_per_sm // registers_per_warp) // num_warps if registers_per_warp else 10**9,
        "shared memory": limits.shared_per_sm // shared_per_block,
        "blocks": limits.max_blocks_per_sm,
    }
    limited_by = min(limits_by, key=lambda name: limits_by[name])
    blocks = limits_by[limited_by]
    return Occupancy(blocks, limited_by, blocks * num_warps, blocks * num_warps / limits.max_warps_per_sm)
