"""LoRA adapters in the engine: greedy tokens equal peft's merged model in transformers; a batch
mixing adapters and the base model gives each request its solo tokens; slots, load and unload
under load; the prefix cache keyed by adapter."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.request import EngineRequest
from tests.engine.model_fixtures import build_tiny_checkpoint
from tests.engine.test_engine_parity import hf_greedy, prompts, request, run
from tests.lora_adapters import build_lora_adapter, merged_reference
from turnout.errors import InvalidArgument

# Three adapters of the tiny Llama that differ in everything the engine handles: all seven
# projections at rank 8; q and v only at rank 4 with rsLoRA scaling; the MLP only at the rank limit.
ADAPTERS = {
    "all": {"seed": 1, "rank": 8, "alpha": 16},
    "qv": {"seed": 2, "rank": 4, "alpha": 8, "targets": ("q_proj", "v_proj"), "rslora": True},
    "mlp": {"seed": 3, "rank": 16, "alpha": 64, "targets": ("gate_proj", "up_proj", "down_proj")},
}
MAX_RANK = 16


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {name: build_lora_adapter(tiny_model_dir, root / name, **opts) for name, opts in ADAPTERS.items()}  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir, dtype="float32"))


def lora_engine(model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path], **options: object) -> LLMEngine:
    settings: dict[str, object] = {
        "num_kv_blocks": 256,
        "enable_lora": True,
        "lora_modules": tuple(adapters.items()),
        "max_loras": 3,
        "max_lora_rank": MAX_RANK,
    }
    settings.update(options)
    return LLMEngine(EngineConfig(model=model_dir, **settings), loaded)  # type: ignore[arg-type]


def lora_request(loaded: LoadedModel, rid: str, prompt: Sequence[int], lora: str | None) -> EngineRequest:
    base = request(loaded, rid, prompt)
    return EngineRequest(base.request_id, base.input_ids, base.sampling, lora_name=lora)


def lora_requests(
    loaded: LoadedModel, prefix: str, batch: Sequence[Sequence[int]], names: Sequence[str | None]
) -> list[EngineRequest]:
    """Request {prefix}{i}: prompt i under adapter names[i]."""
    return [lora_request(loaded, f"{prefix}{i}", p, n) for i, (p, n) in enumerate(zip(batch, names, strict=True))]


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_each_adapter_matches_peft_merged(
    tiny_model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path], name: str
) -> None:
    reference = merged_reference(tiny_model_dir, adapters[name])
    batch = prompts(loaded, 3, seed=10)
    engine = lora_engine(tiny_model_dir, loaded, adapters)
    tokens, _ = run(engine, {0: [lora_request(loaded, f"r{i}", p, name) for i, p in enumerate(batch)]})
    base = [hf_greedy(reference, p) for p in batch]
    assert [tokens[f"r{i}"] for i in range(len(batch))] == base
    # The adapter changes the output (a test of a no-op adapter would prove nothing).
    plain, _ = run(engine, {0: [lora_request(loaded, f"b{i}", p, None) for i, p in enumerate(batch)]})
    assert [plain[f"b{i}"] for i in range(len(batch))] != base


def test_mixed_batch_gives_each_request_its_solo_tokens(
    tiny_model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path]
) -> None:
    names: list[str | None] = [None, "all", "qv", "mlp"] * 3
    batch = prompts(loaded, len(names), seed=11)
    engine = lora_engine(tiny_model_dir, loaded, adapters)
    solo = {}
    for i, (prompt, name) in enumerate(zip(batch, names, strict=True)):
        alone, _ = run(engine, {0: [lora_request(loaded, f"s{i}", prompt, name)]})
        solo[i] = alone[f"s{i}"]
    assert engine.block_manager.reset_prefix_cache()
    mixed, _ = run(engine, {0: lora_requests(loaded, "m", batch, names)})
    assert [mixed[f"m{i}"] for i in range(len(names))] == [solo[i] for i in range(len(names))]
    assert len({tuple(solo[i]) for i in range(4)}) == 4, "the same prompt seed gives four different outputs"


def test_one_slot_runs_adapters_in_turn(tiny_model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path]) -> None:
    """With --max-loras 1 the step holds one adapter's sequences (and base ones); the others wait for
    the slot, and every request still gets its adapter's tokens."""
    names = ["all", "qv", None, "mlp", "all", "qv"]
    batch = prompts(loaded, len(names), seed=12)
    wide, _ = run(
        lora_engine(tiny_model_dir, loaded, adapters),
        {0: lora_requests(loaded, "r", batch, names)},
    )
    engine = lora_engine(tiny_model_dir, loaded, adapters, max_loras=1)
    slots = engine.loras.slots  # type: ignore[union-attr]
    seen_adapters: list[set[int]] = []
    original = engine.runner.build_batch

    def spy(scheduled, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen_adapters.append({item.seq.lora.uid for item in scheduled if item.seq.lora is not None})
        slots.check_integrity()
        return original(scheduled, *args, **kwargs)

    engine.runner.build_batch = spy  # type: ignore[method-assign]
    narrow, _ = run(engine, {0: lora_requests(loaded, "r", batch, names)})
    assert narrow == wide
    assert max(len(s) for s in seen_adapters) == 1
    assert slots.num_evicted >= 2


def test_same_prompt_under_two_adapters_shares_no_blocks(
    tiny_model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path]
) -> None:
    prompt = prompts(loaded, 1, seed=13, low=40, high=40)[0]  # 2 full blocks of 16 to share
    engine = lora_engine(tiny_model_dir, loaded, adapters)
    cached = {}
    for rid, name in [("a1", "all"), ("q1", "qv"), ("base", None), ("a2", "all"), ("base2", None)]:
        _, counts = run(engine, {0: [lora_request(loaded, rid, prompt, name)]})
        cached[rid] = counts[rid]
    assert cached == {"a1": 0, "q1": 0, "base": 0, "a2": 32, "base2": 32}


def test_unknown_adapter_and_lora_off_are_refused(
    tiny_model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path]
) -> None:
    engine = lora_engine(tiny_model_dir, loaded, adapters)
    with pytest.raises(InvalidArgument, match="unknown LoRA adapter 'nope' \\(loaded: all, mlp, qv\\)"):
        engine.add_request(lora_request(loaded, "x", [5, 6, 7], "nope"))
    # A path is accepted only where an adapter was loaded from it.
    engine.add_request(lora_request(loaded, "by-path", [5, 6, 7], str(adapters["qv"])))
    assert engine._groups["by-path"].seqs[0].lora.name == "qv"  # type: ignore[union-attr]
    plain = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=64), loaded)
    with pytest.raises(InvalidArgument, match="--enable-lora"):
        plain.add_request(lora_request(loaded, "y", [5, 6, 7], "all"))


def test_load_and_unload_under_load_lose_nothing(
    tiny_model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path]
) -> None:
    """Requests running an adapter finish with it when it is unloaded mid-flight; the next ones are
    refused; a load mid-flight serves the next requests, and the running ones are unchanged."""
    batch = prompts(loaded, 4, seed=14)
    expected, _ = run(
        lora_engine(tiny_model_dir, loaded, adapters),
        {
            0: [
                lora_request(loaded, f"r{i}", p, n)
                for i, (p, n) in enumerate(zip(batch, ["all", "all", "qv", None], strict=True))
            ]
        },
    )
    engine = lora_engine(tiny_model_dir, loaded, {"all": adapters["all"], "qv": adapters["qv"]})
    for i, (p, n) in enumerate(zip(batch, ["all", "all", "qv", None], strict=True)):
        engine.add_request(lora_request(loaded, f"r{i}", p, n))
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(4)}
    finished: set[str] = set()
    step = 0
    while engine.has_work():
        if step == 3:
            engine.unload_lora("all")
            engine.load_lora("mlp", str(adapters["mlp"]))
            with pytest.raises(InvalidArgument, match="unknown LoRA adapter 'all'"):
                engine.add_request(lora_request(loaded, "late", batch[0], "all"))
            engine.add_request(lora_request(loaded, "new", batch[0], "mlp"))
            tokens["new"] = []
        for out in engine.step():
            tokens[out.request_id] += out.output.token_ids
            if out.output.request_finished:
                finished.add(out.request_id)
        engine.block_manager.check_integrity()
        engine.loras.slots.check_integrity()  # type: ignore[union-attr]
        step += 1
    assert finished == {"r0", "r1", "r2", "r3", "new"}
    assert {f"r{i}": tokens[f"r{i}"] for i in range(4)} == expected
    solo, _ = run(lora_engine(tiny_model_dir, loaded, adapters), {0: [lora_request(loaded, "new", batch[0], "mlp")]})
    assert tokens["new"] == solo["new"]
    # The unloaded adapter's slot went free once its requests finished.
    assert not engine.loras.slots.resident(1)  # type: ignore[union-attr]


def test_adapters_over_the_rank_limit_or_with_other_targets_are_refused(
    tiny_model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path], tmp_path: Path
) -> None:
    engine = lora_engine(tiny_model_dir, loaded, {}, max_lora_rank=8)
    with pytest.raises(InvalidArgument, match="rank 16 is over the limit of 8 \\(raise --max-lora-rank\\)"):
        engine.load_lora("mlp", str(adapters["mlp"]))
    head = build_lora_adapter(tiny_model_dir, tmp_path / "head", seed=4, targets=("q_proj", "lm_head"))
    with pytest.raises(InvalidArgument, match="target modules lm_head are not supported"):
        engine.load_lora("head", str(head))
    with pytest.raises(InvalidArgument, match=r"no adapter_config\.json there"):
        engine.load_lora("empty", str(tmp_path))
    engine.load_lora("all", str(adapters["all"]))
    with pytest.raises(InvalidArgument, match="'all' is already loaded"):
        engine.load_lora("all", str(adapters["qv"]))
    with pytest.raises(InvalidArgument, match="'qv' is not loaded"):
        engine.unload_lora("qv")
    assert engine.lora_adapters() == [("all", str(adapters["all"]))]


def test_steps_with_adapter_tokens_leave_the_cpu_decoder(
    tiny_model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path]
) -> None:
    """The C++ decoder knows nothing of LoRA: a step with an adapter token runs the layers one by one
    (else the adapter would be silently ignored); base-only steps keep the one-call decoder."""
    if loaded.model.model.cpu_decoder is None:  # type: ignore[union-attr]
        pytest.skip("the CPU decoder is not built for this CPU and dtype")
    engine = lora_engine(tiny_model_dir, loaded, adapters)
    backend = engine.runner.backend
    calls: list[bool] = []  # per forward: whether the step had adapter tokens
    original = backend.run_cpu_decoder

    def spy(decoder, hidden, cos_sin, ctx):  # type: ignore[no-untyped-def]
        calls.append(ctx.lora is not None)
        return original(decoder, hidden, cos_sin, ctx)

    backend.run_cpu_decoder = spy  # type: ignore[method-assign]
    batch = prompts(loaded, 2, seed=15)
    run(engine, {0: [lora_request(loaded, "base", batch[0], None)]})
    assert calls and not any(calls)
    calls.clear()
    run(engine, {0: lora_requests(loaded, "m", batch, [None, "all"])})
    assert calls == []


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3", "llama_untied"])
def test_other_architectures_match_peft_merged(architecture: str, tmp_path: Path) -> None:
    """Qwen2's q/k/v biases, Qwen3's per-head q/k norms after the adapted q/k, an untied LM head."""
    model_dir = build_tiny_checkpoint(tmp_path / architecture, architecture)
    adapter = build_lora_adapter(model_dir, tmp_path / "adapter", seed=5, rank=8, alpha=32)
    loaded_here = load_model(EngineConfig(model=model_dir, dtype="float32"))
    batch = prompts(loaded_here, 2, seed=16)
    engine = lora_engine(model_dir, loaded_here, {"a": adapter})
    tokens, _ = run(engine, {0: lora_requests(loaded_here, "r", batch, ["a", "a"])})
    reference = merged_reference(model_dir, adapter)
    assert [tokens["r0"], tokens["r1"]] == [hf_greedy(reference, p) for p in batch]
    plain, _ = run(engine, {0: lora_requests(loaded_here, "b", batch, [None, None])})
    assert [plain["b0"], plain["b1"]] != [tokens["r0"], tokens["r1"]]


@pytest.mark.default_model
def test_default_model_adapter_matches_peft_merged(default_model_dir: Path, tmp_path: Path) -> None:
    adapter = build_lora_adapter(default_model_dir, tmp_path / "adapter", seed=6, rank=16, alpha=16)
    loaded_here = load_model(EngineConfig(model=default_model_dir, dtype="float32"))
    batch = prompts(loaded_here, 2, seed=17, low=8, high=24)
    engine = lora_engine(default_model_dir, loaded_here, {"a": adapter}, num_kv_blocks=64)
    tokens, _ = run(engine, {0: lora_requests(loaded_here, "r", batch, ["a", None])})
    reference = merged_reference(default_model_dir, adapter)
    assert tokens["r0"] == hf_greedy(reference, batch[0])
    assert tokens["r0"] != tokens["r1"]


def test_lora_flags_are_checked(tiny_model_dir: Path) -> None:
    from services.engine.config import parse_lora_module
    from services.engine.main import build_parser

    with pytest.raises(ValueError, match="--lora-modules needs --enable-lora"):
        EngineConfig(model=tiny_model_dir, lora_modules=(("a", Path("/x")),))
    with pytest.raises(ValueError, match="names must be unique"):
        EngineConfig(model=tiny_model_dir, enable_lora=True, lora_modules=(("a", Path("/x")), ("a", Path("/y"))))
    with pytest.raises(ValueError, match="--max-loras and --max-lora-rank must be >= 1"):
        EngineConfig(model=tiny_model_dir, enable_lora=True, max_loras=0)
    assert parse_lora_module(" sql = /a/b ") == ("sql", Path("/a/b"))
    with pytest.raises(ValueError, match="name=path"):
        parse_lora_module("just-a-path")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "/m", "--lora-modules", "nope"])


def test_offline_llm_takes_lora_path_per_prompt(
    tiny_model_dir: Path, loaded: LoadedModel, adapters: dict[str, Path]
) -> None:
    from services.engine.llm import LLM

    batch = prompts(loaded, 2, seed=18)
    expected, _ = run(
        lora_engine(tiny_model_dir, loaded, adapters), {0: lora_requests(loaded, "r", batch, ["qv", None])}
    )
    llm = LLM(
        tiny_model_dir, dtype="float32", num_kv_blocks=64, enable_lora=True, lora_modules=(("qv", adapters["qv"]),)
    )
    greedy = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    outputs = llm.generate(batch, greedy, lora_path=["qv", None])
    assert [o.output_token_ids for o in outputs] == [expected["r0"], expected["r1"]]
    with pytest.raises(InvalidArgument, match="unknown LoRA adapter 'all'"):
        llm.generate(batch[:1], greedy, lora_path="all")
    assert not llm.engine.has_work()
