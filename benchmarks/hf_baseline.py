"""The baseline: Hugging Face `transformers` generating the same workload on the same device.

`LlamaForCausalLM` built from the same config.json, random weights drawn on the device
in the same dtype (as `model_shapes.random_loaded_model` does for ours), `generate` on
one static left-padded batch, greedy, exactly `output_len` new tokens per prompt
(min_new_tokens = max_new_tokens, so EOS never ends one early).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.model_shapes import fill_random_


@dataclass(frozen=True)
class GenerateRun:
    seconds: float
    prompt_tokens: int
    output_tokens: int

    @property
    def output_tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tokens_per_second(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds


def build_transformers_model(folder: Path, device: torch.device, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # allocated on the device
    fill_random_(model, seed)
    return model.eval()


def generate_batch(model: torch.nn.Module, prompts: list[list[int]], output_len: int) -> GenerateRun:
    """One static batch of every prompt, left-padded, timed with the device synchronized."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)  # (B, width)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            pad_token_id=0,
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    assert isinstance(out, torch.Tensor)
    generated = (out.shape[1] - width) * len(prompts)
    return GenerateRun(seconds, sum(len(p) for p in prompts), generated)


def transformers_throughput(
    folder: Path,
    prompt_sets: list[list[list[int]]],
    output_len: int,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
) -> GenerateRun:
    """The run of median time over `prompt_sets` (one static batch each), after a short warm-up."""
    model = build_transformers_model(folder, device, dtype, seed)
    generate_batch(model, [p[:8] for p in prompt_sets[0][:2]], 4)
    runs = [generate_batch(model, prompts, output_len) for prompts in prompt_sets]
    median = statistics.median_low(r.seconds for r in runs)
    del model
    return next(r for r in runs if r.seconds == median)
