"""`python -m benchmarks.bench_cuda --smoke` runs every section on CPU, so the GPU benchmark cannot rot."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.bench_cuda import graph_variants, graphs_state, main
from benchmarks.cuda_workload import SMOKE, Workload
from benchmarks.model_shapes import SHAPES, write_model_folder
from services.engine.config import EngineConfig


def test_smoke_run_measures_every_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    main(["--smoke", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["smoke"] is True and data["device"] == "cpu" and data["dtype"] == "float32"
    assert data["ceilings"]["bandwidth_bytes_per_s"] > 0 and data["ceilings"]["matmul_flop_per_s"] > 0
    tiny = data["shapes"]["tiny"]
    assert tiny["shape"]["total_params"] == SHAPES["tiny"].total_params

    decode = tiny["decode"]
    # Not step > floor: on a busy CPU the ceilings, measured before the run, can come out lower than
    # what the run then gets, so the "floor" is no bound there (it is on an idle GPU).
    assert decode["decode_step_ms"] > 0 and decode["decode_floor_ms"] > 0
    assert decode["decode_fraction"] > 0
    assert decode["cached_tokens"] == 0
    for concurrency in SMOKE.concurrency:
        run = tiny["throughput"][str(concurrency)]
        # ignore_eos: every request produced exactly its output length.
        produced = run["output_tokens_per_second"] * run["seconds"]
        assert produced == pytest.approx(concurrency * SMOKE.throughput_output)
        total = run["total_tokens_per_second"] * run["seconds"]
        assert total == pytest.approx(concurrency * (SMOKE.throughput_prompt + SMOKE.throughput_output))
        assert run["fraction_of_floor"] > 0 and run["decode_fraction"] > 0
        assert run["cached_tokens"] == 0, "a measured run reused the warm-up's prompts"
    assert tiny["ttft"]["ms"] > 0 and tiny["ttft"]["floor_ms"] > 0
    baseline = tiny["baseline"]
    assert baseline["output_tokens"] == SMOKE.baseline_concurrency * SMOKE.throughput_output
    assert baseline["prompt_tokens"] == SMOKE.baseline_concurrency * SMOKE.throughput_prompt
    assert tiny["graphs_off_decode"]["decode_step_ms"] > 0 and tiny["graphs_off_throughput"]["seconds"] > 0
    assert len(tiny["kernels"]) == 2 + 2 * len(SMOKE.kernels.token_counts)
    for kernel in tiny["kernels"]:
        assert kernel["bytes"] > 0
        assert (kernel["seconds"] is not None and kernel["seconds"] > 0) or kernel["note"].startswith("not measured")

    printed = capsys.readouterr().out
    assert "| time to first token, one 48-token prompt |" in printed
    assert "| throughput ratio turnout / transformers, 4 concurrent |" in printed
    assert "CPU smoke run: not a GPU figure" in printed


def test_default_workload_kv_pool_fits_its_largest_section() -> None:
    workload = Workload()
    # 256 requests of 512 + 256 tokens, 48 blocks of 16 each.
    assert workload.kv_blocks() == 256 * 48
    assert workload.max_num_batched_tokens >= workload.ttft_prompt
    assert workload.max_model_len > workload.ttft_prompt


def test_graph_variants_differ_only_in_the_switch(tmp_path: Path) -> None:
    folder = write_model_folder(SHAPES["tiny"], tmp_path)
    on, off = graph_variants(EngineConfig(model=folder, device="cuda", num_kv_blocks=7))
    assert (on.disable_cuda_graph, off.disable_cuda_graph) == (False, True)
    assert replace(on, disable_cuda_graph=True) == off
    assert (graphs_state(on), graphs_state(off)) == ("CUDA graphs on", "CUDA graphs off (disabled)")
    assert graphs_state(EngineConfig(model=folder, device="cpu")) == "CUDA graphs off (not a CUDA device)"
