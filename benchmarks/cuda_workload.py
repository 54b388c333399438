"""The sizes of `bench_cuda`'s workloads: the GPU defaults of issue 8, and a tiny smoke variant."""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.hardware_floors import GIB
from benchmarks.kernel_benches import KernelShapes


@dataclass(frozen=True)
class Workload:
    decode_prompt: int = 128
    decode_output: int = 256
    concurrency: tuple[int, ...] = (64, 256)
    throughput_prompt: int = 512
    throughput_output: int = 256
    ttft_prompt: int = 2048
    # Concurrency of the transformers baseline and of the CUDA-graphs comparison.
    baseline_concurrency: int = 64
    repeats: int = 3
    kernel_repeats: int = 20
    # New tokens of the warm-up run before each measurement (Triton compiles, cuBLAS picks kernels).
    warmup_output: int = 4
    # The workloads need 2049 positions at most. Kept short on purpose: CUDA graphs size their
    # block tables (and a split-K decode its partition grid) by the context length.
    max_model_len: int = 4096
    block_size: int = 16
    copy_bytes: int = 2 * GIB
    matmul_n: int = 8192
    kernels: KernelShapes = field(default_factory=lambda: KernelShapes(batch=64, context=2048, token_counts=(64, 2048)))

    @property
    def max_num_batched_tokens(self) -> int:
        """Room for the whole time-to-first-token prompt in one step."""
        return max(2048, self.ttft_prompt)

    def kv_blocks(self) -> int:
        """Enough blocks for the largest section; sections run one after the other."""

        def blocks(count: int, tokens: int) -> int:
            return count * -(-tokens // self.block_size)

        tokens = self.throughput_prompt + self.throughput_output
        return max(
            *(blocks(c, tokens) for c in self.concurrency),
            blocks(1, self.decode_prompt + self.decode_output),
            blocks(1, self.ttft_prompt + 1),
        )


# Tiny sizes on CPU: every section runs, in seconds; the numbers mean nothing.
SMOKE = Workload(
    decode_prompt=8,
    decode_output=6,
    concurrency=(4, 8),
    throughput_prompt=40,
    throughput_output=6,
    ttft_prompt=48,
    baseline_concurrency=4,
    repeats=2,
    kernel_repeats=2,
    warmup_output=2,
    max_model_len=128,
    copy_bytes=16 << 20,
    matmul_n=128,
    kernels=KernelShapes(batch=2, context=32, token_counts=(4, 16), prompt=32),
)
