"""bench_cpu_attention: both kernels run on the same step and agree, and the FLOP count is the
causal one (each token of a chunk sees the cached prefix and the chunk up to itself)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_cpu_attention import DIM, HEADS, Step, causal_flops, default_steps, inputs, main
from services.engine.cpu_kernels import load

kernels = load()


def test_causal_flops_count_each_token_over_its_own_prefix() -> None:
    # Two tokens after 3 cached: they see 4 and 5 positions.
    assert causal_flops(Step("s", [(2, 3)])) == HEADS * DIM * 4 * (4 + 5)


@pytest.mark.skipif(kernels is None, reason="the CPU kernels could not be built here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_kernels_read_the_same_step(dtype: torch.dtype) -> None:
    for step in default_steps(scale=0.1):
        x = inputs(step, dtype)
        per_token = kernels.paged_decode(x["q"], x["k_cache"], x["v_cache"], x["row_tables"], x["row_lens"], 0.125)
        tiled = kernels.paged_prefill(
            x["q"], x["k_cache"], x["v_cache"], x["tables"], x["seq_lens"], x["query_start_loc"], 0.125
        )
        # Weights rounded to bfloat16 for the value sum in the tiled bf16 kernel: a few ulp of the output.
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(tiled.float(), per_token.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.skipif(kernels is None, reason="the CPU kernels could not be built here")
def test_the_table_has_a_row_per_step_and_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--scale", "0.1", "--repeats", "1", "--threads", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "x |" in line]
    assert len(rows) == 4
