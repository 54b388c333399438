"""Beam search: the engine's beams equal Hugging Face transformers' `generate(num_beams=W, do_sample=False)`
token for token (tiny random model and the default model, float32), share their KV blocks, survive
preemption, and the KV cache stays consistent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.request import EngineOutput, EngineRequest
from services.engine.sampling_validation import Limits, resolve
from turnout.v1 import common_pb2

PROMPT = [5, 17, 230, 41, 9, 77, 1203]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir, dtype="float32"))


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def beam_request(loaded: LoadedModel, rid: str, prompt: Sequence[int], **params: Any) -> EngineRequest:
    proto = common_pb2.SamplingParams(use_beam_search=True, **params)
    limits = Limits(len(prompt), loaded.max_model_len, loaded.vocab_size)
    return EngineRequest(rid, tuple(prompt), resolve(proto, loaded.info.generation_defaults, limits))


def run(engine: LLMEngine, requests: list[EngineRequest]) -> dict[str, list[EngineOutput]]:
    """Add the requests, step until all finish; each request's outputs, checking the cache every step."""
    outputs: dict[str, list[EngineOutput]] = {r.request_id: [] for r in requests}
    for r in requests:
        engine.add_request(r)
    for _ in range(10_000):
        if not engine.has_work():
            break
        for out in engine.step():
            outputs[out.request_id].append(out.output)
        engine.block_manager.check_integrity()
    assert not engine.has_work()
    assert engine.block_manager.usage == 0.0
    return outputs


def hf_beams(
    model: torch.nn.Module,
    prompt: Sequence[int],
    *,
    width: int,
    n: int,
    max_new: int,
    stop_ids: Sequence[int] = (),
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
) -> tuple[list[list[int]], list[float]]:
    """transformers' n best beams (each cut after its first stop id) and their scores."""
    eos = list(stop_ids) or None
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([list(prompt)]),
            num_beams=width,
            num_return_sequences=n,
            do_sample=False,
            max_new_tokens=max_new,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            eos_token_id=eos,
            pad_token_id=eos[0] if eos else 0,
            return_dict_in_generate=True,
            output_scores=True,
            # Only what is asked: no sampling defaults or processors from generation_config.json.
            temperature=None,
            top_p=None,
            top_k=None,
            repetition_penalty=None,
        )
    beams = []
    for row in out.sequences[:, len(prompt) :].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
        beams.append(row[:cut])
    return beams, out.sequences_scores.tolist()


def engine_beams(engine: LLMEngine, loaded: LoadedModel, prompt: Sequence[int], **params: Any) -> list[EngineOutput]:
    outputs = run(engine, [beam_request(loaded, "beam", prompt, **params)])["beam"]
    assert [o.index for o in outputs] == list(range(len(outputs)))
    assert outputs[-1].request_finished and all(o.finished for o in outputs)
    return outputs


def score(output: EngineOutput, length_penalty: float) -> float:
    return output.cumulative_logprob / len(output.token_ids) ** length_penalty


def stop_ids_reached(loaded: LoadedModel, reference: torch.nn.Module, width: int) -> list[int]:
    """Token ids the search's beams actually produce early on, so that stopping on them ends beams
    mid-search (the tiny random model never picks its real EOS)."""
    beams, _ = hf_beams(reference, PROMPT, width=width, n=width, max_new=6)
    return sorted({beams[0][2], beams[-1][1]})


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize(
    ("length_penalty", "early_stopping"), [(1.0, False), (0.0, "never"), (2.0, True), (-0.5, "never")]
)
@pytest.mark.parametrize("stops", [False, True])
def test_beams_equal_transformers(
    loaded: LoadedModel,
    reference: torch.nn.Module,
    tiny_model_dir: Path,
    width: int,
    length_penalty: float,
    early_stopping: bool | str,
    stops: bool,
) -> None:
    max_new = 9
    stop_ids = stop_ids_reached(loaded, reference, width) if stops else []
    n = width // 2
    expected, scores = hf_beams(
        reference,
        PROMPT,
        width=width,
        n=n,
        max_new=max_new,
        stop_ids=stop_ids,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )
    # Small blocks: beams fork on partial blocks, which are copied.
    engine = LLMEngine(EngineConfig(model=tiny_model_dir, dtype="float32", block_size=4), loaded)
    outputs = engine_beams(
        engine,
        loaded,
        PROMPT,
        n=n,
        best_of=width,
        max_new_tokens=max_new,
        ignore_eos=True,
        stop_token_ids=stop_ids,
        length_penalty=length_penalty,
        early_stopping=str(early_stopping).lower(),
    )
    assert [o.token_ids for o in outputs] == expected
    assert [score(o, length_penalty) for o in outputs] == pytest.approx(scores, rel=1e-4, abs=1e-4)
    if stops and length_penalty <= 0.0:
        # Without a reward for length the short beams the stop ids end win: stops do end beams here.
        assert all(o.finish is not None and o.finish.kind == "stop" for o in outputs)


def test_beams_share_blocks(loaded: LoadedModel, tiny_model_dir: Path) -> None:
    """Width 4 holds the prompt once: its peak block usage is far below 4 requests of the same prompt
    (prefix caching off, so that only the beams' own sharing counts)."""
    prompt = list(range(3, 3 + 61))

    def peak(requests: list[EngineRequest]) -> int:
        config = EngineConfig(model=tiny_model_dir, dtype="float32", block_size=4, enable_prefix_caching=False)
        engine = LLMEngine(config, loaded)
        for r in requests:
            engine.add_request(r)
        most = 0
        while engine.has_work():
            engine.step()
            most = max(most, engine.block_manager.num_total_blocks - engine.block_manager.num_free_blocks)
        return most

    beams = peak([beam_request(loaded, "b", prompt, n=4, max_new_tokens=8, ignore_eos=True)])
    params = common_pb2.SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    limits = Limits(len(prompt), loaded.max_model_len, loaded.vocab_size)
    settings = resolve(params, loaded.info.generation_defaults, limits)
    separate = peak([EngineRequest(f"r{i}", tuple(prompt), settings) for i in range(4)])
    # The prompt is 16 blocks; 4 beams of 8 new tokens add at most 3 blocks each.
    assert beams <= 16 + 4 * 3
    assert separate >= 4 * 16 > 2 * beams


@pytest.mark.parametrize("overlap", [False, True])
def test_beams_under_preemption_equal_unpressured(loaded: LoadedModel, tiny_model_dir: Path, overlap: bool) -> None:
    """Beams preempted mid-search (as the scheduler does when the cache runs out: blocks freed, recomputed
    later) hold the search until they are back; the answer is the same as without preemption, with or
    without the overlap schedule, beside a sampled request."""
    params: dict[str, Any] = {"n": 2, "best_of": 4, "max_new_tokens": 10, "ignore_eos": True}
    roomy = LLMEngine(EngineConfig(model=tiny_model_dir, dtype="float32", block_size=4), loaded)
    expected = [o.token_ids for o in engine_beams(roomy, loaded, PROMPT, **params)]

    config = EngineConfig(model=tiny_model_dir, dtype="float32", block_size=4, overlap_schedule=overlap)
    engine = LLMEngine(config, loaded)
    engine.add_request(beam_request(loaded, "beam", PROMPT, **params))
    sampled = common_pb2.SamplingParams(temperature=1.0, seed=3, max_new_tokens=15, ignore_eos=True)
    limits = Limits(3, loaded.max_model_len, loaded.vocab_size)
    engine.add_request(EngineRequest("sampled", (4, 5, 6), resolve(sampled, common_pb2.SamplingParams(), limits)))
    outputs: list[EngineOutput] = []
    sampled_tokens = 0
    for step in range(1_000):
        if not engine.has_work():
            break
        search = engine._groups["beam"].beams if "beam" in engine._groups else None
        if search is not None and step in (3, 6):
            # Two live beams lose their blocks; the others' logits wait for their recompute.
            for victim in search.beams[1:3]:
                engine.scheduler._preempt(victim)
        for out in engine.step():
            if out.request_id == "beam":
                outputs.append(out.output)
            else:
                sampled_tokens += len(out.output.token_ids)
        engine.block_manager.check_integrity()
    assert engine.scheduler.num_preemptions == 4
    assert [o.token_ids for o in outputs] == expected
    assert sampled_tokens == 15
    assert engine.block_manager.usage == 0.0


def test_beam_logprobs_and_abort(loaded: LoadedModel, tiny_model_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=tiny_model_dir, dtype="float32"), loaded)
    proto = common_pb2.SamplingParams(use_beam_search=True, n=2, best_of=3, max_new_tokens=5, ignore_eos=True)
    limits = Limits(len(PROMPT), loaded.max_model_len, loaded.vocab_size)
    options = common_pb2.LogprobOptions(return_logprob=True, top_logprobs_num=2)
    settings = resolve(proto, loaded.info.generation_defaults, limits, options)
    outputs = run(engine, [EngineRequest("lp", tuple(PROMPT), settings)])["lp"]
    for out in outputs:
        assert [p.token.token_id for p in out.logprobs] == out.token_ids
        assert sum(p.token.logprob for p in out.logprobs) == pytest.approx(out.cumulative_logprob, abs=1e-4)
        assert all(len(p.top) == 2 for p in out.logprobs)
    assert outputs[0].cumulative_logprob >= outputs[1].cumulative_logprob

    engine.add_request(beam_request(loaded, "gone", PROMPT, n=2, best_of=4, max_new_tokens=50, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort("gone", "client went away")
    ended = [o.output for o in engine.step() if o.request_id == "gone"]
    assert [o.index for o in ended] == [0, 1]
    assert all(o.finish is not None and o.finish.kind == "abort" for o in ended) and ended[-1].request_finished
    assert not engine.has_work() and engine.block_manager.usage == 0.0
    engine.block_manager.check_integrity()


@pytest.fixture(scope="module")
def default_loaded(default_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=default_model_dir, dtype="float32"))


@pytest.fixture(scope="module")
def default_reference(default_model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("width", "early_stopping"), [(2, True), (4, False)])
def test_default_model_beams_equal_transformers(
    default_model_dir: Path,
    default_loaded: LoadedModel,
    default_reference: torch.nn.Module,
    width: int,
    early_stopping: bool,
) -> None:
    """The pretrained model, whose real EOS ends beams, in float32."""
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    eos = sorted(default_loaded.eos_token_ids)
    expected, _ = hf_beams(
        default_reference, prompt, width=width, n=2, max_new=12, stop_ids=eos, early_stopping=early_stopping
    )
    engine = LLMEngine(EngineConfig(model=default_model_dir, dtype="float32", block_size=4), default_loaded)
    outputs = engine_beams(
        engine,
        default_loaded,
        prompt,
        n=2,
        best_of=width,
        max_new_tokens=12,
        early_stopping=str(early_stopping).lower(),
    )
    assert [o.token_ids for o in outputs] == expected
    assert any(o.finish is not None and o.finish.eos for o in outputs)
