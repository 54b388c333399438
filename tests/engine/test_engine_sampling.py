"""The engine core with the full sampler: samples sharing a prompt, seeds inside mixed batches,
log-probabilities equal to log_softmax of the reference model's logits, stop ids and min_new_tokens."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine, StepOutput
from services.engine.model_loader import LoadedModel, load_model
from services.engine.request import EngineOutput, EngineRequest
from services.engine.sampling_validation import Limits, resolve
from turnout.v1 import common_pb2

PROMPT = tuple(range(100, 137))  # 37 tokens: two full blocks of 16 and a partial one


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir, dtype="float32"))


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def make_engine(tiny_model_dir: Path, loaded: LoadedModel, **options: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=256, **options), loaded)  # type: ignore[arg-type]


def request(
    loaded: LoadedModel,
    rid: str,
    prompt: tuple[int, ...] = PROMPT,
    logprobs: common_pb2.LogprobOptions | None = None,
    **params: object,
) -> EngineRequest:
    settings = resolve(
        common_pb2.SamplingParams(**params),  # type: ignore[arg-type]
        common_pb2.SamplingParams(),
        Limits(len(prompt), loaded.max_model_len, loaded.vocab_size),
        logprobs,
    )
    return EngineRequest(rid, prompt, settings)


class Run:
    """Steps an engine to the end, collecting every sample's outputs."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.outputs: dict[tuple[str, int], list[EngineOutput]] = defaultdict(list)
        self.finished: set[str] = set()
        self.max_running = 0

    def step(self) -> list[StepOutput]:
        outs = self.engine.step()
        self.engine.block_manager.check_integrity()
        self.max_running = max(self.max_running, len(self.engine.scheduler.running))
        for out in outs:
            self.outputs[(out.request_id, out.output.index)].append(out.output)
            if out.output.request_finished:
                assert out.request_id not in self.finished, "a request finished twice"
                self.finished.add(out.request_id)
        return outs

    def until_done(self) -> Run:
        while self.engine.has_work():
            self.step()
        assert self.engine.block_manager.usage == 0.0
        return self

    def tokens(self, rid: str, index: int = 0) -> list[int]:
        return [t for out in self.outputs[(rid, index)] for t in out.token_ids]

    def samples(self, rid: str) -> list[int]:
        return sorted(i for r, i in self.outputs if r == rid)


def test_n_samples_share_the_prompt_blocks_and_differ(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    engine = make_engine(tiny_model_dir, loaded)
    engine.add_request(request(loaded, "r", n=4, temperature=1.0, seed=3, max_new_tokens=8, ignore_eos=True))
    run = Run(engine)
    run.step()  # prefill of sample 0, then every sample draws its first token from the same logits
    tables = [engine.block_manager.block_table(f"r#{i}") for i in range(4)]
    assert all(t[:2] == tables[0][:2] for t in tables), "the two full prompt blocks are shared"
    assert all(engine.block_manager.ref_count(b) == 4 for b in tables[0][:2])
    run.until_done()
    assert run.samples("r") == [0, 1, 2, 3]
    outputs = [tuple(run.tokens("r", i)) for i in range(4)]
    assert all(len(o) == 8 for o in outputs)
    assert len(set(outputs)) > 1, "seeded samples draw from seed + index, so they differ"
    # Only the last sample's end finishes the request.
    assert run.finished == {"r"}


def test_greedy_samples_equal_the_single_greedy_output(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    one = Run(make_engine(tiny_model_dir, loaded))
    one.engine.add_request(request(loaded, "a", temperature=0.0, max_new_tokens=10, ignore_eos=True))
    many = Run(make_engine(tiny_model_dir, loaded, enable_prefix_caching=False))
    many.engine.add_request(request(loaded, "a", n=3, temperature=0.0, max_new_tokens=10, ignore_eos=True))
    one.until_done()
    many.until_done()
    # The forked samples recompute the partial prompt block themselves: still the same tokens.
    assert [many.tokens("a", i) for i in range(3)] == [one.tokens("a")] * 3


def test_seeded_request_is_reproducible_inside_a_mixed_batch(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    seeded = {"temperature": 0.9, "top_p": 0.9, "top_k": 50, "seed": 1234, "max_new_tokens": 12, "ignore_eos": True}
    alone = Run(make_engine(tiny_model_dir, loaded))
    alone.engine.add_request(request(loaded, "s", **seeded))
    alone.until_done()

    mixed = Run(make_engine(tiny_model_dir, loaded))
    mixed.engine.add_request(request(loaded, "x", prompt=(5, 6, 7), temperature=1.0, max_new_tokens=20))
    mixed.engine.add_request(request(loaded, "g", prompt=(9, 9, 9, 9), temperature=0.0, max_new_tokens=20))
    mixed.step()
    mixed.engine.add_request(request(loaded, "s", **seeded))
    mixed.engine.add_request(request(loaded, "y", prompt=(8, 1), temperature=1.5, seed=7, max_new_tokens=20))
    mixed.until_done()
    assert mixed.max_running >= 3
    assert mixed.tokens("s") == alone.tokens("s")


def test_output_logprobs_equal_log_softmax_of_the_reference_logits(
    tiny_model_dir: Path, loaded: LoadedModel, reference: torch.nn.Module
) -> None:
    options = common_pb2.LogprobOptions(return_logprob=True, top_logprobs_num=3, token_ids_logprob=[5, 77])
    engine = make_engine(tiny_model_dir, loaded)
    # Temperature 0.7: the processed distribution is log_softmax(logits / 0.7).
    engine.add_request(
        request(loaded, "r", logprobs=options, temperature=0.7, seed=1, max_new_tokens=5, ignore_eos=True)
    )
    run = Run(engine).until_done()
    tokens = run.tokens("r")
    positions = [p for out in run.outputs[("r", 0)] for p in out.logprobs]
    assert len(positions) == 5
    with torch.inference_mode():
        logits = reference(torch.tensor([list(PROMPT) + tokens])).logits[0, len(PROMPT) - 1 : -1]  # (5, V)
    expected = torch.log_softmax(logits / 0.7, dim=-1)
    for step, position in enumerate(positions):
        row = expected[step]
        assert position.token.token_id == tokens[step]
        assert position.token.logprob == pytest.approx(row[tokens[step]].item(), abs=1e-4)
        assert position.token.rank == int((row > row[tokens[step]]).sum()) + 1
        top = torch.topk(row, 3)
        assert [t.token_id for t in position.top] == top.indices.tolist()
        assert [t.logprob for t in position.top] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [t.token_id for t in position.requested] == [5, 77]
        assert [t.logprob for t in position.requested] == pytest.approx([row[5].item(), row[77].item()], abs=1e-4)


def test_raw_logprobs_mode_ignores_temperature(
    tiny_model_dir: Path, loaded: LoadedModel, reference: torch.nn.Module
) -> None:
    engine = make_engine(tiny_model_dir, loaded, logprobs_mode="raw")
    options = common_pb2.LogprobOptions(return_logprob=True)
    engine.add_request(
        request(loaded, "r", logprobs=options, temperature=0.5, seed=2, max_new_tokens=3, ignore_eos=True)
    )
    run = Run(engine).until_done()
    tokens = run.tokens("r")
    with torch.inference_mode():
        logits = reference(torch.tensor([list(PROMPT) + tokens])).logits[0, len(PROMPT) - 1 : -1]
    expected = torch.log_softmax(logits, dim=-1)
    got = [p.token.logprob for out in run.outputs[("r", 0)] for p in out.logprobs]
    assert got == pytest.approx([expected[i, t].item() for i, t in enumerate(tokens)], abs=1e-4)


@pytest.mark.parametrize("chunk", [2048, 7])
def test_prompt_logprobs_equal_the_reference_and_skip_the_prefix_cache(
    tiny_model_dir: Path, loaded: LoadedModel, reference: torch.nn.Module, chunk: int
) -> None:
    engine = make_engine(tiny_model_dir, loaded, max_num_batched_tokens=chunk)
    warm = Run(engine)
    warm.engine.add_request(request(loaded, "warm", temperature=0.0, max_new_tokens=1))
    warm.until_done()  # PROMPT's full blocks are now cached
    options = common_pb2.LogprobOptions(logprob_start_len=3, input_top_logprobs_num=2)
    engine.add_request(request(loaded, "r", logprobs=options, temperature=0.0, max_new_tokens=2))
    run = Run(engine).until_done()
    first = run.outputs[("r", 0)][0]
    assert first.cached_tokens == 0, "prompt logprobs need every prompt position computed"
    with torch.inference_mode():
        logits = reference(torch.tensor([list(PROMPT)])).logits[0]
    expected = torch.log_softmax(logits, dim=-1)
    positions = first.input_logprobs
    assert [p.token.token_id for p in positions] == list(PROMPT[3:])
    for offset, position in enumerate(positions):
        row = expected[3 + offset - 1]
        assert position.token.logprob == pytest.approx(row[PROMPT[3 + offset]].item(), abs=1e-4)
        assert [t.token_id for t in position.top] == torch.topk(row, 2).indices.tolist()
    assert all(not out.input_logprobs for out in run.outputs[("r", 0)][1:])


def test_min_new_tokens_suppresses_stop_ids_then_stop_id_ends(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    probe = Run(make_engine(tiny_model_dir, loaded))
    probe.engine.add_request(request(loaded, "p", temperature=0.0, max_new_tokens=6, ignore_eos=True))
    greedy = probe.until_done().tokens("p")
    stop = greedy[0]
    engine = make_engine(tiny_model_dir, loaded)
    engine.add_request(request(loaded, "s", temperature=0.0, max_new_tokens=6, ignore_eos=True, stop_token_ids=[stop]))
    engine.add_request(
        request(
            loaded, "m", temperature=0.0, max_new_tokens=6, ignore_eos=True, stop_token_ids=[stop], min_new_tokens=3
        )
    )
    run = Run(engine).until_done()
    s = run.outputs[("s", 0)][-1]
    assert run.tokens("s") == [stop] and s.finish is not None and s.finish.matched_token_id == stop
    assert not s.finish.eos
    m = run.tokens("m")
    assert len(m) >= 3 and stop not in m[:3], "the stop id cannot be sampled before min_new_tokens"


def test_eos_is_reported_as_eos(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    eos = next(iter(loaded.eos_token_ids))
    engine = make_engine(tiny_model_dir, loaded)
    # A huge bias makes EOS the greedy choice at once.
    engine.add_request(request(loaded, "e", temperature=0.0, max_new_tokens=4, logit_bias={eos: 100.0}))
    run = Run(engine).until_done()
    finish = run.outputs[("e", 0)][-1].finish
    assert finish is not None and finish.kind == "stop" and finish.eos and finish.matched_token_id == eos


def test_aborting_one_sample_leaves_the_others_running(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    engine = make_engine(tiny_model_dir, loaded)
    engine.add_request(request(loaded, "r", n=3, temperature=1.0, seed=5, max_new_tokens=10, ignore_eos=True))
    run = Run(engine)
    run.step()
    run.step()
    assert engine.abort("r", "stop string", indices=[1])
    run.until_done()
    ends = {i: run.outputs[("r", i)][-1].finish for i in range(3)}
    assert ends[1] is not None and ends[1].kind == "abort"
    assert all(ends[i] is not None and ends[i].kind == "length" for i in (0, 2))  # type: ignore[union-attr]
    assert run.finished == {"r"}


def test_aborting_before_the_fork_ends_the_request(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    engine = make_engine(tiny_model_dir, loaded)
    engine.add_request(request(loaded, "r", n=3, temperature=1.0, max_new_tokens=10))
    engine.abort("r")
    run = Run(engine).until_done()
    assert run.finished == {"r"} and run.samples("r") == [0]


def test_best_of_tracks_cumulative_logprob(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    engine = make_engine(tiny_model_dir, loaded)
    engine.add_request(request(loaded, "b", n=1, best_of=3, temperature=1.0, seed=9, max_new_tokens=4, ignore_eos=True))
    run = Run(engine).until_done()
    assert run.samples("b") == [0, 1, 2]
    for i in range(3):
        last = run.outputs[("b", i)][-1]
        assert last.cumulative_logprob < 0.0
        assert not any(out.logprobs for out in run.outputs[("b", i)]), "logprobs were not asked for"
