from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.engine.config import EngineConfig
from services.engine.engine_loop import EngineLoop
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.request import EngineOutput, EngineRequest
from services.engine.sampling_validation import Limits, resolve
from turnout.v1 import common_pb2

PROMPT = (1, 504, 3575, 282, 4649, 314)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir, dtype="float32"))


@pytest.fixture
def engine(loaded: LoadedModel, tiny_model_dir: Path) -> Iterator[EngineLoop]:
    core = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=512), loaded)
    engine = EngineLoop(core)
    yield engine
    engine.shutdown()
    core.block_manager.check_integrity()
    assert core.block_manager.usage == 0.0  # every request gave its blocks back


def make_request(
    loaded: LoadedModel, rid: str = "r", prompt: tuple[int, ...] = PROMPT, **params: object
) -> EngineRequest:
    sampling = resolve(
        common_pb2.SamplingParams(**params),  # type: ignore[arg-type]
        loaded.info.generation_defaults,
        Limits(len(prompt), loaded.max_model_len, loaded.vocab_size),
    )
    return EngineRequest(rid, prompt, sampling)


async def collect(outputs: AsyncIterator[EngineOutput]) -> tuple[list[int], EngineOutput]:
    tokens: list[int] = []
    last = None
    async for out in outputs:
        tokens += out.token_ids
        last = out
    assert last is not None and last.finished
    return tokens, last


async def test_greedy_output_equals_transformers(engine: EngineLoop, loaded: LoadedModel, tiny_model_dir: Path) -> None:
    tokens, last = await collect(
        engine.generate(make_request(loaded, temperature=0.0, max_new_tokens=24, ignore_eos=True))
    )
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    expected = reference.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False, eos_token_id=None)
    assert tokens == expected[0, len(PROMPT) :].tolist()
    assert last.finish is not None and last.finish.kind == "length"
    assert (last.prompt_tokens, last.completion_tokens) == (len(PROMPT), 24)


async def test_stop_token_id_ends_with_a_match(engine: EngineLoop, loaded: LoadedModel) -> None:
    greedy, _ = await collect(
        engine.generate(make_request(loaded, "a", temperature=0.0, max_new_tokens=8, ignore_eos=True))
    )
    stop_at = greedy[3]
    tokens, last = await collect(
        engine.generate(
            make_request(loaded, "b", temperature=0.0, max_new_tokens=8, stop_token_ids=[stop_at], ignore_eos=True)
        )
    )
    assert tokens == greedy[: greedy.index(stop_at) + 1]
    assert last.finish is not None and (last.finish.kind, last.finish.matched_token_id) == ("stop", stop_at)


async def test_min_new_tokens_suppresses_stop_tokens(engine: EngineLoop, loaded: LoadedModel) -> None:
    greedy, _ = await collect(
        engine.generate(make_request(loaded, "a", temperature=0.0, max_new_tokens=6, ignore_eos=True))
    )
    first = greedy[0]
    tokens, _ = await collect(
        engine.generate(
            make_request(
                loaded,
                "b",
                temperature=0.0,
                max_new_tokens=6,
                min_new_tokens=4,
                stop_token_ids=[first],
                ignore_eos=True,
            )
        )
    )
    assert first not in tokens[:4]
    assert len(tokens) >= 4


async def test_same_seed_same_sample(engine: EngineLoop, loaded: LoadedModel) -> None:
    runs = []
    for rid in ("a", "b", "c"):
        seed = 11 if rid != "c" else 12
        tokens, _ = await collect(
            engine.generate(make_request(loaded, rid, temperature=1.0, seed=seed, max_new_tokens=16, ignore_eos=True))
        )
        runs.append(tokens)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


async def test_leaving_the_stream_aborts_and_frees_the_engine(engine: EngineLoop, loaded: LoadedModel) -> None:
    stream = engine.generate(make_request(loaded, temperature=1.0, max_new_tokens=3000, ignore_eos=True))
    for _ in range(3):
        await anext(stream)
    assert engine.load().running == 1
    await stream.aclose()
    for _ in range(100):
        if engine.load().running == 0:
            break
        await asyncio.sleep(0.02)
    assert engine.load().running == 0 and engine.load().waiting == 0
    # The engine takes new work afterwards.
    tokens, _ = await collect(engine.generate(make_request(loaded, "next", temperature=0.0, max_new_tokens=2)))
    assert len(tokens) <= 2


async def test_concurrent_requests_match_running_alone(engine: EngineLoop, loaded: LoadedModel) -> None:
    results = await asyncio.gather(
        *(
            collect(engine.generate(make_request(loaded, f"q{i}", temperature=0.0, max_new_tokens=5, ignore_eos=True)))
            for i in range(3)
        )
    )
    assert len({tuple(tokens) for tokens, _ in results}) == 1  # same prompt, greedy: same output for all


async def test_a_step_wakes_the_event_loop_once_for_all_its_outputs(
    engine: EngineLoop, loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    wakeups: list[object] = []
    original = loop.call_soon_threadsafe

    def counting(callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        wakeups.append(callback)
        return original(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    requests = [make_request(loaded, f"r{i}", max_new_tokens=8, ignore_eos=True) for i in range(4)]
    results = await asyncio.gather(*(collect(engine.generate(r)) for r in requests))
    assert [len(tokens) for tokens, _ in results] == [8] * 4
    # 32 outputs from ~8-11 steps of the four decoding together: one wake-up per step, not per output.
    assert len(wakeups) < 20, len(wakeups)


async def test_build_makes_the_engine_on_the_thread_that_steps_it(loaded: LoadedModel, tiny_model_dir: Path) -> None:
    """One thread loads and steps the model, so the process opens one OpenMP team (engine_loop.py)."""
    threads: dict[str, threading.Thread] = {}

    class Recording(LLMEngine):
        def step(self):  # type: ignore[no-untyped-def]
            threads.setdefault("step", threading.current_thread())
            return super().step()

    def make() -> LLMEngine:
        threads["build"] = threading.current_thread()
        return Recording(EngineConfig(model=tiny_model_dir, num_kv_blocks=64), loaded)

    engine = await asyncio.wrap_future(EngineLoop.build(make))
    try:
        tokens, _ = await collect(engine.generate(make_request(loaded, max_new_tokens=3, ignore_eos=True)))
    finally:
        engine.shutdown()
    assert len(tokens) == 3
    assert threads["build"] is threads["step"]
    assert threads["step"] is not threading.main_thread()
    assert not threads["step"].is_alive()  # shutdown ended it


async def test_a_failed_build_reaches_the_caller() -> None:
    def make() -> LLMEngine:
        raise ValueError("no config.json in /nowhere")

    with pytest.raises(ValueError, match="no config"):
        await asyncio.wrap_future(EngineLoop.build(make))


def test_model_info_reads_the_folder(loaded: LoadedModel, tiny_model_dir: Path) -> None:
    info = loaded.info
    assert info.name == tiny_model_dir.name
    assert list(info.eos_token_ids) == [2]
    assert info.max_context_length == 4096 and info.vocab_size == 49152
    assert info.architecture == "LlamaForCausalLM" and info.dtype == "float32"


@pytest.mark.parametrize(
    ("name", "device", "declared", "expected"),
    [
        ("auto", "cpu", "bfloat16", torch.float32),
        ("auto", "cuda", "bfloat16", torch.bfloat16),
        ("auto", "cuda", "float16", torch.float16),
        ("auto", "cuda", "float32", torch.bfloat16),
        ("float16", "cpu", "bfloat16", torch.float16),
    ],
)
def test_dtype_choice(
    name: str, device: str, declared: str, expected: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.engine import model_loader

    monkeypatch.setattr(model_loader, "cpu_prefers_bf16", lambda: False)
    assert model_loader.pick_dtype(name, torch.device(device), declared) == expected


@pytest.mark.parametrize(("has_bf16", "expected"), [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_is_bfloat16_on_a_cpu_that_has_it(
    has_bf16: bool, expected: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.engine import model_loader

    monkeypatch.setattr(model_loader, "cpu_prefers_bf16", lambda: has_bf16)
    assert model_loader.pick_dtype("auto", torch.device("cpu"), "float32") == expected


@pytest.mark.parametrize(
    ("native", "kernel_dtypes", "expected"),
    [
        (True, [], True),  # avx512_bf16 or AMX
        (False, ["bfloat16"], True),  # AVX2 without AVX-512: packed_linear widens bfloat16 weights
        (False, ["float32"], False),  # AVX-512 without BF16: torch would emulate bfloat16
        (False, None, False),  # no kernels built (no compiler)
    ],
)
def test_bfloat16_is_preferred_where_it_beats_float32(
    native: bool, kernel_dtypes: list[str] | None, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from services.engine import cpu_kernels, model_loader

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    built = None if kernel_dtypes is None else SimpleNamespace(PACKED_LINEAR_DTYPES=kernel_dtypes)
    monkeypatch.setattr(cpu_kernels, "load", lambda: built)
    assert model_loader.cpu_prefers_bf16() is expected


@pytest.mark.cuda
def test_cuda_loads_bfloat16_weights_straight_onto_the_device(tiny_model_dir: Path) -> None:
    on_gpu = load_model(EngineConfig(model=tiny_model_dir))  # device and dtype auto; the checkpoint is float32
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.bfloat16
    assert all(p.device.type == "cuda" and p.dtype == torch.bfloat16 for p in on_gpu.model.parameters())
    # Rotary frequencies stay float32, on the device too.
    assert all(b.device.type == "cuda" and b.dtype == torch.float32 for b in on_gpu.model.buffers())


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("scheduling_policy", "lifo", "--scheduling-policy"),
        ("num_kv_blocks", 0, "--num-kv-blocks"),
        ("block_size", -4, "--block-size"),
        ("kv_cache_memory_gib", -1.0, "--kv-cache-memory"),
        ("max_num_batched_tokens", 0, "--max-num-batched-tokens"),
        ("max_running_requests", 0, "--max-running-requests"),
        ("dtype", "float8", "--dtype"),
    ],
)
def test_engine_config_refuses_bad_values_naming_the_flag(
    tiny_model_dir: Path, option: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(model=tiny_model_dir, **{option: value})  # type: ignore[arg-type]
