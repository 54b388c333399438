"""Tensor parallelism: one engine as 2 gloo ranks on the CPU against the same engine on 1 rank.

Each engine test starts a real second rank (a process); they are kept few and short for a
2-core machine. The NCCL path runs the same checks on 2 GPUs (marked `cuda`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from services.engine.llm_engine import LLMEngine
from services.engine.models.weights import _copy_shard, build_model
from services.engine.parallel.group import TensorParallel, check_divisible
from services.engine.request import EngineRequest
from services.engine.sampling_validation import Limits, resolve
from turnout import LLM
from turnout.v1 import common_pb2

PROMPTS: list[Any] = ["The capital of France is", "Once upon a time there", [1, 504, 3575, 282]]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
# float32 and a pool small enough for 3 processes on this machine.
ENGINE = {"dtype": "float32", "num_kv_blocks": 128, "max_model_len": 1024}


def greedy(llm: LLM) -> list[list[int]]:
    return [out.output_token_ids for out in llm.generate(PROMPTS, GREEDY)]


def prompt_logprobs(engine: LLMEngine, prompt: list[int]) -> list[float]:
    """The log-probability of each prompt token after the first (computed outside the step's sampling)."""
    params = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True)
    limits = Limits(len(prompt), engine.loaded.max_model_len, engine.loaded.vocab_size)
    settings = resolve(
        params, engine.loaded.info.generation_defaults, limits, common_pb2.LogprobOptions(logprob_start_len=1)
    )
    engine.add_request(EngineRequest("plp", tuple(prompt), settings))
    logprobs: list[float] = []
    while engine.has_work():
        for out in engine.step():
            logprobs += [position.token.logprob for position in out.output.input_logprobs]
    return logprobs


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir: Path) -> Iterator[LLM]:
    with LLM(tiny_model_dir, device="cpu", **ENGINE) as llm:
        yield llm


def test_check_divisible_names_the_numbers() -> None:
    config = SimpleNamespace(num_attention_heads=6, num_key_value_heads=2, intermediate_size=90)
    check_divisible(config, 2)
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 3 must divide the model's num_key_value_heads=2"):
        check_divisible(config, 3)
    with pytest.raises(ValueError, match=r"num_attention_heads=6 and num_key_value_heads=2 and intermediate_size=90"):
        check_divisible(config, 4)


def test_engine_refuses_a_size_that_does_not_divide_the_heads_before_starting_ranks(tiny_model_dir: Path) -> None:
    # The tiny model has 4 query heads and 2 KV heads.
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 4 must divide the model's num_key_value_heads=2"):
        LLM(tiny_model_dir, device="cpu", tensor_parallel_size=4, **ENGINE)
    with pytest.raises(ValueError, match="--distributed-backend nccl needs CUDA"):
        LLM(tiny_model_dir, device="cpu", tensor_parallel_size=2, distributed_backend="nccl", **ENGINE)


def test_each_rank_loads_its_rows_of_each_fused_part_and_its_columns(tiny_model_dir: Path) -> None:
    """Rank 1 of 2, built without a group (loading needs none): its qkv rows are its heads of q, k
    and v, its gate_up rows its rows of gate and up, o/down its input columns, the embedding its
    vocab rows (no collective runs here)."""
    full, _ = build_model(tiny_model_dir, torch.float32, "cpu")
    shard, _ = build_model(tiny_model_dir, torch.float32, "cpu", TensorParallel(1, 2, torch.device("cpu")))
    whole, part = full.model.layers[0], shard.model.layers[0]
    d = full.spec.head_dim
    q, k, v = whole.self_attn.qkv_proj.weight.split(whole.self_attn.qkv_proj.shard_sizes)
    expected_qkv = torch.cat([q[2 * d : 4 * d], k[d : 2 * d], v[d : 2 * d]])  # query heads 2-3, KV head 1
    assert torch.equal(part.self_attn.qkv_proj.weight, expected_qkv)
    assert torch.equal(part.self_attn.o_proj.weight, whole.self_attn.o_proj.weight[:, 2 * d :])
    gate, up = whole.mlp.gate_up_proj.weight.chunk(2)
    half = gate.shape[0] // 2
    assert torch.equal(part.mlp.gate_up_proj.weight, torch.cat([gate[half:], up[half:]]))
    assert torch.equal(part.mlp.down_proj.weight, whole.mlp.down_proj.weight[:, half:])
    rows = full.spec.vocab_size // 2
    assert torch.equal(shard.model.embed_tokens.weight, full.model.embed_tokens.weight[rows:])
    assert shard.lm_head.head_weight is shard.model.embed_tokens.weight  # tied: the same shard
    assert torch.equal(part.input_layernorm.weight, whole.input_layernorm.weight)  # norms are whole


def test_a_vocabulary_that_does_not_divide_is_padded_with_zero_rows(tmp_path: Path) -> None:
    embedding = torch.arange(15, dtype=torch.float32).view(5, 3)
    save_file({"embed": embedding}, tmp_path / "w.safetensors")
    with safe_open(tmp_path / "w.safetensors", framework="pt") as f:
        first, last = torch.full((3, 3), -1.0), torch.full((3, 3), -1.0)
        _copy_shard(f.get_slice("embed"), first, 0, TensorParallel(0, 2, torch.device("cpu")), "embed")
        _copy_shard(f.get_slice("embed"), last, 0, TensorParallel(1, 2, torch.device("cpu")), "embed")
        with pytest.raises(ValueError, match=r"rank 0 of 2 expects its \(2, 3\) part"):
            _copy_shard(f.get_slice("embed"), torch.empty(2, 3), 0, TensorParallel(0, 2, torch.device("cpu")), "embed")
    assert torch.equal(first, embedding[:3])
    assert torch.equal(last, torch.cat([embedding[3:], torch.zeros(1, 3)]))


def test_two_gloo_ranks_give_the_greedy_tokens_and_logprobs_of_one(one_rank: LLM, tiny_model_dir: Path) -> None:
    expected = greedy(one_rank)
    prompt = list(range(100, 140))
    expected_logprobs = prompt_logprobs(one_rank.engine, prompt)
    assert len(expected_logprobs) == len(prompt) - 1
    with LLM(tiny_model_dir, device="cpu", tensor_parallel_size=2, **ENGINE) as two:
        assert two.engine.ranks is not None and len(two.engine.ranks.workers) == 1
        assert two.engine.loaded.num_kv_heads == 1  # 2 KV heads over 2 ranks
        assert two.engine.loaded.model.model.cpu_decoder is None  # the module path: all-reduces between layers
        assert greedy(two) == expected
        # Prompt log-probabilities compute logits outside a step: the other rank follows that too.
        got_logprobs = prompt_logprobs(two.engine, prompt)
        two.engine.block_manager.check_integrity()
        workers = two.engine.ranks.workers
    assert all(w.poll() == 0 for w in workers)  # left their loop on the shutdown message
    assert got_logprobs == pytest.approx(expected_logprobs, rel=1e-4, abs=1e-4)


def test_a_lost_rank_fails_the_next_step_instead_of_hanging(tiny_model_dir: Path) -> None:
    llm = LLM(tiny_model_dir, device="cpu", tensor_parallel_size=2, **ENGINE)
    try:
        ranks = llm.engine.ranks
        assert ranks is not None
        lost: list[str] = []
        ranks.on_lost(lost.append)
        ranks.workers[0].kill()
        deadline = time.monotonic() + 10
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lost and "rank 1" in lost[0] and ranks.lost == lost[0]
        started = time.monotonic()
        with pytest.raises(RuntimeError):  # the step's all-reduce fails: its peer is gone
            llm.generate(PROMPTS[:1], GREEDY)
        assert time.monotonic() - started < 10
    finally:
        llm.close()


@pytest.mark.cuda
def test_two_nccl_ranks_give_the_greedy_tokens_of_one(one_rank: LLM, tiny_model_dir: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    with LLM(tiny_model_dir, device="cuda", **ENGINE) as single:
        expected = greedy(single)
    with LLM(tiny_model_dir, device="cuda", tensor_parallel_size=2, **ENGINE) as two:
        assert two.engine.ranks is not None and two.engine.ranks.tp.device == torch.device("cuda", 0)
        assert greedy(two) == expected


def test_flags_and_their_checks(tiny_model_dir: Path) -> None:
    from services.engine.config import EngineConfig
    from services.engine.main import build_parser

    for flag in ("--tensor-parallel-size", "--tp-size"):
        args = build_parser().parse_args(["--model", str(tiny_model_dir), flag, "2", "--distributed-backend", "gloo"])
        assert (args.tensor_parallel_size, args.distributed_backend) == (2, "gloo")
    with pytest.raises(ValueError, match="--tensor-parallel-size must be positive"):
        EngineConfig(model=tiny_model_dir, tensor_parallel_size=0)
    with pytest.raises(ValueError, match="--distributed-backend must be one of auto, gloo, nccl"):
        EngineConfig(model=tiny_model_dir, distributed_backend="mpi")
    with pytest.raises(ValueError, match="--enable-lora cannot be combined with --tensor-parallel-size"):
        EngineConfig(model=tiny_model_dir, tensor_parallel_size=2, enable_lora=True)


@pytest.mark.default_model
def test_the_default_model_on_three_ranks_gives_one_ranks_greedy_tokens(default_model_dir: Path) -> None:
    """SmolLM2-135M: 9 query heads and 3 KV heads split over 3 ranks (2 would not divide them)."""
    with pytest.raises(ValueError, match=r"num_attention_heads=9 and num_key_value_heads=3"):
        LLM(default_model_dir, device="cpu", tensor_parallel_size=2, **ENGINE)
    params = {**GREEDY, "max_new_tokens": 8}
    with LLM(default_model_dir, device="cpu", **ENGINE) as one:
        expected = [o.output_token_ids for o in one.generate(PROMPTS[:2], params)]
    with LLM(default_model_dir, device="cpu", tensor_parallel_size=3, **ENGINE) as three:
        assert [o.output_token_ids for o in three.generate(PROMPTS[:2], params)] == expected
