"""The CUDA path against the hardware's floors, in one run per model shape:

1. the device's ceilings (copy bandwidth, bf16 matmul rate) and the floors they give;
2. batch-1 decode (prompt 128, 256 out) and its fraction of the bandwidth floor;
3. throughput at 64 and 256 concurrent requests (512 random token ids in, 256 out);
4. time to first token of one 2048-token prompt, against the FLOP floor;
5. CUDA graphs on vs off;
6. the same 64-request workload through `transformers.generate` (the baseline);
7. the Triton kernels alone, against the bandwidth floor (those in the tree).

Models are Llama-3.2-1B / Llama-3.1-8B shaped with random bf16 weights
(benchmarks/model_shapes.py); every request is greedy with ignore_eos.

    python -m benchmarks.bench_cuda [--shape 1b 8b] [--repeats 3] [--json PATH]
    TRITON_INTERPRET=1 python -m benchmarks.bench_cuda --smoke   # tiny shape on CPU, seconds

Prints Markdown tables (the format of docs/benchmarks.md); --json writes every number.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_engine import engine_requests, make_prompts
from benchmarks.cuda_report import Measurement, ShapeReport, Ttft, print_table, report_json, shape_rows, versions
from benchmarks.cuda_workload import SMOKE, Workload
from benchmarks.engine_trace import Trace, run_requests
from benchmarks.hardware_floors import MeasuredCeilings, measure_ceilings
from benchmarks.hf_baseline import transformers_throughput
from benchmarks.kernel_benches import bench_kernels
from benchmarks.model_shapes import SHAPES, ModelShape, random_loaded_model, write_model_folder
from benchmarks.step_floors import Ceilings, prefill_floor
from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine


class Bench:
    """The sections of one run, for one device and dtype, measured against one set of ceilings."""

    def __init__(self, workload: Workload, device: torch.device, dtype: torch.dtype, ceilings: Ceilings) -> None:
        self.workload = workload
        self.device = device
        self.dtype = dtype
        self.ceilings = ceilings
        self.element_bytes = torch.tensor([], dtype=dtype).element_size()

    def measure(
        self, engine: LLMEngine, shape: ModelShape, prompt_sets: list[list[list[int]]], output: int
    ) -> Measurement:
        """Warm up on the first prompt set (a few tokens out), then run each other one; the run of median
        output tokens/s. Every set is drawn afresh, so no run hits another's prefix cache."""
        run_requests(engine, engine_requests(engine, prompt_sets[0], self.workload.warmup_output, "warm"))
        results = [
            self._summarize(run_requests(engine, engine_requests(engine, p, output, "r")), shape)
            for p in prompt_sets[1:]
        ]
        median = statistics.median_low(r.output_tokens_per_second for r in results)
        return next(r for r in results if r.output_tokens_per_second == median)

    def _summarize(self, trace: Trace, shape: ModelShape) -> Measurement:
        floors = [s.floor_seconds(shape, self.element_bytes, self.ceilings) for s in trace.steps]
        decode = [(s.seconds, f) for s, f in zip(trace.steps, floors, strict=True) if s.is_decode]
        return Measurement(
            seconds=trace.seconds,
            output_tokens_per_second=trace.output_tokens / trace.seconds,
            total_tokens_per_second=(trace.prompt_tokens + trace.output_tokens) / trace.seconds,
            fraction_of_floor=sum(floors) / trace.seconds,
            decode_step_ms=1000 * statistics.median(t for t, _ in decode) if decode else None,
            decode_floor_ms=1000 * statistics.median(f for _, f in decode) if decode else None,
            decode_fraction=statistics.median(f / t for t, f in decode) if decode else None,
            cached_tokens=trace.cached_tokens,
        )

    def decode_prompts(self, vocab: int) -> list[list[list[int]]]:
        """A warm-up set, then one set per repeat (one prompt each)."""
        w = self.workload
        return [make_prompts(1, w.decode_prompt, w.decode_prompt, 100 + r, vocab) for r in range(w.repeats + 1)]

    def throughput_prompts(self, concurrency: int, vocab: int) -> list[list[list[int]]]:
        """A warm-up set, then one set per repeat (`concurrency` prompts each)."""
        w = self.workload
        length = w.throughput_prompt
        return [make_prompts(concurrency, length, length, 1000 * concurrency + r, vocab) for r in range(w.repeats + 1)]

    def time_to_first_token(self, engine: LLMEngine, shape: ModelShape) -> Ttft:
        """One prompt alone, one new token: its first-token latency, median over fresh prompts."""
        w, vocab = self.workload, engine.loaded.vocab_size
        prompts = [make_prompts(1, w.ttft_prompt, w.ttft_prompt, 300 + r, vocab) for r in range(w.repeats + 1)]
        latencies = []
        for i, prompt in enumerate(prompts):  # the first is the warm-up
            trace = run_requests(engine, engine_requests(engine, prompt, 1, "ttft"))
            if i:
                latencies.append(trace.first_token["ttft0"])
        floor = prefill_floor(shape, w.ttft_prompt, self.element_bytes, self.ceilings)
        return Ttft(1000 * statistics.median(latencies), 1000 * floor.seconds, floor.bound)

    def release(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def run_shape(self, shape: ModelShape, folder: Path) -> ShapeReport:
        w = self.workload
        dtype_name = str(self.dtype).removeprefix("torch.")
        report = ShapeReport(shape, dtype_name)
        base = EngineConfig(
            model=folder,
            device=self.device.type,
            dtype=dtype_name,
            max_model_len=w.max_model_len,
            block_size=w.block_size,
            num_kv_blocks=w.kv_blocks(),
            max_running_requests=max(w.concurrency),
            max_num_batched_tokens=w.max_num_batched_tokens,
        )
        graphs_on, graphs_off = graph_variants(base)
        loaded = random_loaded_model(base)
        vocab = loaded.vocab_size

        engine = LLMEngine(graphs_on, loaded)
        report.attention_backend = type(engine.runner.backend).__name__
        report.graphs = graphs_state(graphs_on)
        report.decode = self.measure(engine, shape, self.decode_prompts(vocab), w.decode_output)
        for c in w.concurrency:
            report.throughput[c] = self.measure(engine, shape, self.throughput_prompts(c, vocab), w.throughput_output)
        report.ttft = self.time_to_first_token(engine, shape)
        del engine
        self.release()

        engine = LLMEngine(graphs_off, loaded)
        report.graphs_off_decode = self.measure(engine, shape, self.decode_prompts(vocab), w.decode_output)
        prompts = self.throughput_prompts(w.baseline_concurrency, vocab)
        report.graphs_off_throughput = self.measure(engine, shape, prompts, w.throughput_output)
        del engine
        del loaded
        self.release()

        prompts = self.throughput_prompts(w.baseline_concurrency, vocab)[1:]  # the sets measured on ours
        report.baseline = transformers_throughput(folder, prompts, w.throughput_output, self.device, self.dtype)
        self.release()
        report.kernels = bench_kernels(
            shape,
            w.kernels,
            self.dtype,
            self.device,
            self.ceilings.bandwidth,
            self.ceilings.matmul_rate,
            w.kernel_repeats,
        )
        self.release()
        return report


def graph_variants(base: EngineConfig) -> tuple[EngineConfig, EngineConfig]:
    """(graphs on, graphs off) configs, otherwise the same."""
    return replace(base, disable_cuda_graph=False), replace(base, disable_cuda_graph=True)


def graphs_state(config: EngineConfig) -> str:
    if config.device != "cuda":
        return "CUDA graphs off (not a CUDA device)"
    return "CUDA graphs off (disabled)" if config.disable_cuda_graph else "CUDA graphs on"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", nargs="+", choices=sorted(SHAPES), default=None, help="default: 1b 8b")
    parser.add_argument("--repeats", type=int, default=None, help="runs per workload, the median reported")
    parser.add_argument("--smoke", action="store_true", help="tiny shape on CPU in float32: checks the script runs")
    parser.add_argument("--json", type=Path, default=None, help="also write every number here")
    args = parser.parse_args(argv)

    workload = SMOKE if args.smoke else Workload()
    if args.repeats is not None:
        workload = replace(workload, repeats=args.repeats)
    if args.smoke:
        device, dtype, shapes = torch.device("cpu"), torch.float32, args.shape or ["tiny"]
    elif torch.cuda.is_available():
        device, dtype, shapes = torch.device("cuda"), torch.bfloat16, args.shape or ["1b", "8b"]
    else:
        parser.error("no CUDA device here: run with --smoke to check the script on CPU")

    ceilings: MeasuredCeilings = measure_ceilings(
        device, dtype, workload.copy_bytes, workload.matmul_n, workload.kernel_repeats
    )
    found = versions()
    header = [
        (
            "device",
            f"{ceilings.device_name}, torch {found['torch']}, triton {found['triton']}, "
            f"transformers {found['transformers']}, {str(dtype).removeprefix('torch.')}"
            + (" (CPU smoke run: not a GPU figure)" if args.smoke else ""),
        ),
        *ceilings.rows(),
    ]
    print_table(header)
    bench = Bench(workload, device, dtype, ceilings.measured)
    results: dict[str, Any] = {
        "device": ceilings.device_name,
        "smoke": args.smoke,
        "dtype": str(dtype).removeprefix("torch."),
        "versions": found,
        "ceilings": {
            "bandwidth_bytes_per_s": ceilings.measured.bandwidth,
            "matmul_flop_per_s": ceilings.measured.matmul_rate,
            "spec_sheet": asdict(ceilings.spec) if ceilings.spec else None,
        },
        "workload": asdict(workload),
        "shapes": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as tmp:
        for key in shapes:
            shape = SHAPES[key]
            report = bench.run_shape(shape, write_model_folder(shape, Path(tmp)))
            print_table(shape_rows(report, workload))
            results["shapes"][key] = report_json(report)
            if args.json is not None:  # after every shape, so a run cut short keeps what it measured
                args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
