"""Pooling requests (embeddings) through the engine equal transformers' final hidden states pooled the
same way, with and without a prefix-cache hit, chunked, and in a batch with generating requests; and
max_new_tokens 0 is prefill only (prompt log-probabilities, no tokens)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

from services.engine.config import EngineConfig
from services.engine.convert import pooling_from_proto
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.pooling import PoolingSettings
from services.engine.request import EngineOutput, EngineRequest
from services.engine.sampling_validation import Limits, resolve
from tests.engine.test_engine_parity import hf_greedy, prompts
from tests.tolerances import assert_close, forward_reduction
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir, dtype="float32"))


@pytest.fixture(scope="module")
def hf_hidden(tiny_model_dir: Path) -> torch.nn.Module:
    """transformers' decoder without the LM head: last_hidden_state is after the final norm."""
    return AutoModel.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def expected(model: torch.nn.Module, prompt: Sequence[int], settings: PoolingSettings) -> torch.Tensor:
    with torch.inference_mode():
        hidden = model(torch.tensor([list(prompt)])).last_hidden_state[0].float()  # (L, hidden)
    vector = {"last": hidden[-1], "first": hidden[0], "mean": hidden.mean(dim=0)}[settings.type]
    if settings.dimensions is not None:
        vector = vector[: settings.dimensions]
    return torch.nn.functional.normalize(vector, dim=0) if settings.normalize else vector


def check(loaded: LoadedModel, got: list[float], want: torch.Tensor, prompt_len: int) -> None:
    spec = loaded.model.spec  # type: ignore[union-attr]
    assert len(got) == len(want)
    assert_close(torch.tensor(got), want, reduction=forward_reduction(spec, prompt_len), scale=float(want.abs().max()))


def pooling_request(loaded: LoadedModel, rid: str, prompt: Sequence[int], settings: PoolingSettings) -> EngineRequest:
    limits = Limits(len(prompt), loaded.max_model_len, loaded.vocab_size, max_logprobs=5)
    sampling = resolve(common_pb2.SamplingParams(max_new_tokens=0), loaded.info.generation_defaults, limits)
    return EngineRequest(rid, tuple(prompt), sampling, pooling=settings)


def generate_request(loaded: LoadedModel, rid: str, prompt: Sequence[int], max_new: int = 8) -> EngineRequest:
    params = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True)
    limits = Limits(len(prompt), loaded.max_model_len, loaded.vocab_size)
    return EngineRequest(rid, tuple(prompt), resolve(params, loaded.info.generation_defaults, limits))


def run(engine: LLMEngine, arrivals: dict[int, list[EngineRequest]]) -> dict[str, list[EngineOutput]]:
    """Add requests at the given steps, step until all finish; every output of each request."""
    outputs: dict[str, list[EngineOutput]] = {}
    step = 0
    while step <= max(arrivals) or engine.has_work():
        for req in arrivals.get(step, []):
            engine.add_request(req)
            outputs[req.request_id] = []
        for out in engine.step():
            outputs[out.request_id].append(out.output)
        engine.block_manager.check_integrity()
        step += 1
        assert step < 10_000
    assert engine.block_manager.usage == 0.0
    return outputs


def engine_for(folder: Path, loaded: LoadedModel, **options: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=folder, num_kv_blocks=128, **options), loaded)  # type: ignore[arg-type]


SETTINGS = [
    PoolingSettings("last"),
    PoolingSettings("mean"),
    PoolingSettings("first"),
    PoolingSettings("last", normalize=False),
    PoolingSettings("mean", dimensions=16),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"{s.type}-{s.normalize}-{s.dimensions}")
def test_pooled_vector_matches_transformers(
    tiny_model_dir: Path, loaded: LoadedModel, hf_hidden: torch.nn.Module, settings: PoolingSettings
) -> None:
    prompt = prompts(loaded, 1, seed=11, low=30, high=30)[0]
    # A budget of 7 tokens a step: the prompt is pooled over five chunks.
    engine = engine_for(tiny_model_dir, loaded, max_num_batched_tokens=7)
    out = run(engine, {0: [pooling_request(loaded, "e", prompt, settings)]})["e"]
    assert len(out) == 1 and out[0].request_finished and out[0].token_ids == []
    assert out[0].finish is not None and out[0].finish.kind == "length"
    assert out[0].embedding is not None
    check(loaded, out[0].embedding, expected(hf_hidden, prompt, settings), len(prompt))
    if settings.normalize:
        assert torch.tensor(out[0].embedding).norm().item() == pytest.approx(1.0, abs=1e-5)


def test_last_pooling_uses_a_cached_prefix_and_mean_pooling_does_not(
    tiny_model_dir: Path, loaded: LoadedModel, hf_hidden: torch.nn.Module
) -> None:
    shared = prompts(loaded, 1, seed=12, low=40, high=40)[0]  # 2 full blocks of 16
    longer = shared + prompts(loaded, 1, seed=13, low=5, high=5)[0]
    engine = engine_for(tiny_model_dir, loaded)
    last, mean = PoolingSettings("last"), PoolingSettings("mean")
    arrivals = {
        0: [pooling_request(loaded, "first", shared, last)],
        2: [pooling_request(loaded, "last", longer, last), pooling_request(loaded, "mean", longer, mean)],
    }
    out = run(engine, arrivals)
    assert out["first"][0].cached_tokens == 0
    assert out["last"][0].cached_tokens == 32, "the shared blocks come from the cache"
    assert out["mean"][0].cached_tokens == 0, "mean pooling needs every position's hidden state"
    for rid, prompt, settings in (("first", shared, last), ("last", longer, last), ("mean", longer, mean)):
        check(loaded, out[rid][0].embedding or [], expected(hf_hidden, prompt, settings), len(prompt))


def test_pooling_in_a_batch_with_generating_requests(
    tiny_model_dir: Path, loaded: LoadedModel, hf_hidden: torch.nn.Module, tiny_model_dir_reference: torch.nn.Module
) -> None:
    batch = prompts(loaded, 6, seed=14, low=5, high=30)
    engine = engine_for(tiny_model_dir, loaded, max_num_batched_tokens=24)
    kinds = [PoolingSettings("last"), PoolingSettings("mean"), PoolingSettings("first")]
    arrivals = {
        0: [generate_request(loaded, "g0", batch[0]), pooling_request(loaded, "p0", batch[1], kinds[0])],
        2: [generate_request(loaded, "g1", batch[2]), pooling_request(loaded, "p1", batch[3], kinds[1])],
        3: [pooling_request(loaded, "p2", batch[4], kinds[2]), generate_request(loaded, "g2", batch[5])],
    }
    out = run(engine, arrivals)
    for i, prompt in ((0, batch[0]), (1, batch[2]), (2, batch[5])):
        tokens = [t for o in out[f"g{i}"] for t in o.token_ids]
        assert tokens == hf_greedy(tiny_model_dir_reference, prompt, max_new=8)
        assert all(o.embedding is None for o in out[f"g{i}"])
    for i, prompt in ((0, batch[1]), (1, batch[3]), (2, batch[4])):
        check(loaded, out[f"p{i}"][0].embedding or [], expected(hf_hidden, prompt, kinds[i]), len(prompt))


@pytest.fixture(scope="module")
def tiny_model_dir_reference(tiny_model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_preempted_mean_pooling_folds_each_position_once(
    tiny_model_dir: Path,
    loaded: LoadedModel,
    hf_hidden: torch.nn.Module,
    tiny_model_dir_reference: torch.nn.Module,
) -> None:
    """A generating request grows into the blocks a chunked mean pooling needs: the pooling one (the
    newest) is preempted mid-prompt, recomputed later, and still folds every position exactly once."""
    long_prompt, pooled = (
        prompts(loaded, 1, seed=15, low=60, high=60)[0],
        prompts(loaded, 1, seed=16, low=40, high=40)[0],
    )
    engine = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=6, max_num_batched_tokens=16), loaded)
    preempted: list[str] = []
    original = engine.scheduler._preempt

    def spy(seq: object) -> None:
        preempted.append(seq.seq_id)  # type: ignore[attr-defined]
        original(seq)  # type: ignore[arg-type]

    engine.scheduler._preempt = spy  # type: ignore[method-assign]
    mean = PoolingSettings("mean")
    arrivals = {0: [generate_request(loaded, "g", long_prompt, max_new=30), pooling_request(loaded, "m", pooled, mean)]}
    out = run(engine, arrivals)
    assert "m#0" in preempted, "the cache was meant to be too small for both at once"
    assert [t for o in out["g"] for t in o.token_ids] == hf_greedy(tiny_model_dir_reference, long_prompt, max_new=30)
    check(loaded, out["m"][0].embedding or [], expected(hf_hidden, pooled, mean), len(pooled))


def test_prefill_only_request_returns_prompt_logprobs_and_no_tokens(
    tiny_model_dir: Path, loaded: LoadedModel, tiny_model_dir_reference: torch.nn.Module
) -> None:
    prompt = prompts(loaded, 1, seed=16, low=12, high=12)[0]
    limits = Limits(len(prompt), loaded.max_model_len, loaded.vocab_size, max_logprobs=5)
    options = common_pb2.LogprobOptions(return_logprob=True, logprob_start_len=0)
    sampling = resolve(common_pb2.SamplingParams(max_new_tokens=0), loaded.info.generation_defaults, limits, options)
    out = run(engine_for(tiny_model_dir, loaded), {0: [EngineRequest("s", tuple(prompt), sampling)]})["s"]
    assert len(out) == 1 and out[0].token_ids == [] and out[0].completion_tokens == 0
    assert out[0].embedding is None and out[0].finish is not None and out[0].finish.kind == "length"
    with torch.inference_mode():
        logits = tiny_model_dir_reference(torch.tensor([prompt])).logits[0].float().log_softmax(-1)  # (L, V)
    want = [logits[p - 1, prompt[p]].item() for p in range(1, len(prompt))]
    got = [position.token.logprob for position in out[0].input_logprobs]
    assert got == pytest.approx(want, abs=1e-3)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dimensions": 10_000}, "dimensions must be between 1 and the model's hidden size"),
        ({"dimensions": 0}, "dimensions must be between 1"),
        ({"type": 9}, "pooling type 9 is not one of"),
    ],
)
def test_bad_pooling_params_are_refused(loaded: LoadedModel, fields: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        pooling_from_proto(common_pb2.PoolingParams(**fields), loaded.info.hidden_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("overlap", [False, True])
def test_hidden_states_of_every_computed_position_match_transformers(
    tiny_model_dir: Path, loaded: LoadedModel, hf_hidden: torch.nn.Module, overlap: bool
) -> None:
    """SGLang's return_hidden_states: each prompt position (no cache hit, though its prefix is cached),
    then the input of each decode step, handed out with the outputs, in a batch with other requests."""
    shared = prompts(loaded, 1, seed=17, low=32, high=32)[0]
    prompt = shared + prompts(loaded, 1, seed=18, low=9, high=9)[0]
    limits = Limits(len(prompt), loaded.max_model_len, loaded.vocab_size)
    params = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    sampling = resolve(params, loaded.info.generation_defaults, limits)
    asking = EngineRequest("h", tuple(prompt), sampling, return_hidden_states=True)
    engine = engine_for(tiny_model_dir, loaded, max_num_batched_tokens=16, overlap_schedule=overlap)
    out = run(
        engine,
        {0: [generate_request(loaded, "warm", shared)], 3: [asking, generate_request(loaded, "g", prompt, max_new=6)]},
    )
    tokens = [t for o in out["h"] for t in o.token_ids]
    assert tokens == [t for o in out["g"] for t in o.token_ids] and len(tokens) == 6
    assert out["h"][-1].cached_tokens == 0 and out["g"][-1].cached_tokens == 32
    assert all(not o.hidden_states for o in out["g"])
    rows = [row for o in out["h"] for row in o.hidden_states]
    # The positions computed: the prompt, then each generated token but the last (never fed back).
    computed = prompt + tokens[:-1]
    with torch.inference_mode():
        want = hf_hidden(torch.tensor([computed])).last_hidden_state[0].float()  # (P + 5, hidden)
    spec = loaded.model.spec  # type: ignore[union-attr]
    assert_close(torch.tensor(rows), want, reduction=forward_reduction(spec, len(computed)))
    # The first output carries the prompt's rows and the row that produced the first token.
    assert len(out["h"][0].hidden_states) >= len(prompt)


def test_hidden_states_refuse_several_samples(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    from services.engine.convert import request_from_proto
    from turnout.v1 import engine_pb2

    message = engine_pb2.EngineGenerateRequest(
        request_id="x", input_ids=[5, 6], sampling_params=common_pb2.SamplingParams(n=2), return_hidden_states=True
    )
    with pytest.raises(InvalidArgument, match="return_hidden_states takes n and best_of 1"):
        request_from_proto(message, loaded, EngineConfig(model=tiny_model_dir))


def test_offline_llm_embed(tiny_model_dir: Path, hf_hidden: torch.nn.Module) -> None:
    from services.engine.llm import LLM

    llm = LLM(tiny_model_dir, dtype="float32", num_kv_blocks=64)
    ids = list(llm.tokenizer.encode("The capital of France is", add_special_tokens=True))
    by_text, by_ids = llm.embed(["The capital of France is", ids], {"type": "MEAN", "dimensions": 32})
    want = expected(hf_hidden, ids, PoolingSettings("mean", dimensions=32))
    check(llm.engine.loaded, by_text, want, len(ids))
    assert by_ids == by_text
    with pytest.raises(InvalidArgument, match="pooling:"):
        llm.embed("x", {"kind": "MEAN"})
