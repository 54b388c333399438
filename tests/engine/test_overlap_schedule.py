"""The overlap schedule (step N postprocessed while the device runs step N+1) gives exactly the outputs of
the plain schedule: same tokens, finish reasons, log-probabilities and cumulative log-probabilities, for
every feature that reads token history or ends sequences. On CPU it is forced on (`overlap_schedule=True`):
nothing runs asynchronously there, but the order of work, the placeholders and their device gather are
the same as on CUDA.

Every step of both runs checks the block manager's integrity, that no placeholder (negative id) reaches
an output, and that no sample outputs anything after its end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.engine_loop import EngineLoop
from services.engine.llm_engine import LLMEngine
from services.engine.logprobs import PositionLogprobs
from services.engine.model_loader import LoadedModel, load_model
from services.engine.request import EngineOutput, EngineRequest, Finish
from services.engine.sampling_validation import Limits, resolve
from services.engine.scheduler import ScheduledSequence, SchedulerOutput
from services.engine.sequence import Sequence, placeholder
from turnout import LLM
from turnout.v1 import common_pb2

PROMPT = tuple(range(100, 137))  # 37 tokens: two full blocks of 16 and a partial one
SCHEMA = {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["v"]}


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    # On CPU even beside a GPU: exact comparisons need batches computed alike (see the CUDA test at the end).
    return load_model(EngineConfig(model=tiny_model_dir, device="cpu"))


def request(
    loaded: LoadedModel,
    rid: str,
    prompt: tuple[int, ...] = PROMPT,
    logprobs: common_pb2.LogprobOptions | None = None,
    **params: Any,
) -> EngineRequest:
    settings = resolve(
        common_pb2.SamplingParams(**params),
        common_pb2.SamplingParams(),
        Limits(len(prompt), loaded.max_model_len, loaded.vocab_size),
        logprobs,
    )
    return EngineRequest(rid, prompt, settings)


@dataclass
class Sample:
    """Everything one sample of a request gave back, whatever steps it came in."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    input_logprobs: list[PositionLogprobs] = field(default_factory=list)
    finish: Finish | None = None
    cumulative_logprob: float = 0.0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Transcript:
    samples: dict[tuple[str, int], Sample] = field(default_factory=dict)
    # Per step: (request id, sample index, tokens computed) of every scheduled sequence.
    plans: list[list[tuple[str, int, int]]] = field(default_factory=list)
    num_preemptions: int = 0
    # Preempted while their newest token was still pending (a placeholder).
    num_preempted_pending: int = 0

    def computed(self) -> list[list[tuple[str, int, int]]]:
        """The plans up to the last step that computed anything (the overlap schedule's final step only
        collects)."""
        plans = list(self.plans)
        while plans and not plans[-1]:
            plans.pop()
        return plans

    def tokens(self, rid: str, index: int = 0) -> list[int]:
        return self.samples[(rid, index)].tokens

    def finishes(self) -> dict[tuple[str, int], Finish | None]:
        return {key: sample.finish for key, sample in self.samples.items()}


def record(sample: Sample, out: EngineOutput) -> None:
    assert sample.finish is None, "a sample output something after its end"
    assert all(t >= 0 for t in out.token_ids), f"a placeholder reached an output: {out.token_ids}"
    assert all(p.token.token_id >= 0 for p in out.logprobs), "a placeholder reached the log-probabilities"
    assert len(out.logprobs) in (0, len(out.token_ids))
    sample.tokens += out.token_ids
    sample.logprobs += out.logprobs
    sample.input_logprobs += out.input_logprobs
    sample.finish = out.finish
    sample.cumulative_logprob = out.cumulative_logprob
    sample.cached_tokens = out.cached_tokens
    sample.completion_tokens = out.completion_tokens


Action = Callable[[LLMEngine, Transcript], object]


def drive(
    engine: LLMEngine, arrivals: dict[int, list[EngineRequest]], at_step: dict[int, Action] | None = None
) -> Transcript:
    """Add requests (and run actions) before the given step numbers; step until every request finished."""
    transcript = Transcript()
    schedule = engine.scheduler.schedule

    def spy() -> SchedulerOutput:
        out = schedule()
        transcript.plans.append([(s.seq.request.request_id, s.seq.index, s.num_new_tokens) for s in out.scheduled])
        transcript.num_preemptions += len(out.preempted)
        transcript.num_preempted_pending += sum(seq.token_ids[-1] < 0 for seq in out.preempted)
        return out

    engine.scheduler.schedule = spy  # type: ignore[method-assign]
    finished: set[str] = set()
    step = 0
    last_event = max([*arrivals, *(at_step or {})])
    while step <= last_event or engine.has_work():
        for req in arrivals.get(step, []):
            engine.add_request(req)
        if at_step and step in at_step:
            at_step[step](engine, transcript)
        for out in engine.step():
            record(transcript.samples.setdefault((out.request_id, out.output.index), Sample()), out.output)
            if out.output.request_finished:
                assert out.request_id not in finished, "a request finished twice"
                finished.add(out.request_id)
        engine.block_manager.check_integrity()
        step += 1
        assert step < 2_000
    assert finished == {rid for rid, _ in transcript.samples}
    assert finished >= {r.request_id for reqs in arrivals.values() for r in reqs}
    assert all(s.finish is not None for s in transcript.samples.values())
    assert engine.block_manager.usage == 0.0 and not engine.scheduler.has_work()
    hashed = [key for key in engine.block_manager._pool._keys if key is not None]
    assert all(t >= 0 for key in hashed for t in key.tokens), "a placeholder was hashed into the prefix cache"
    assert engine.block_manager.reset_prefix_cache(), "no block may stay referenced once everything drained"
    return transcript


def both(
    model_dir: Path,
    loaded: LoadedModel,
    arrivals: dict[int, list[EngineRequest]],
    at_step: dict[int, Action] | None = None,
    **options: Any,
) -> tuple[Transcript, Transcript]:
    """The same traffic through the plain and the overlap schedule; their samples must be identical."""
    runs = []
    for overlap in (False, True):
        engine = LLMEngine(EngineConfig(model=model_dir, overlap_schedule=overlap, **options), loaded)
        assert engine.overlap is overlap
        runs.append(drive(engine, arrivals, at_step))
    plain, overlapped = runs
    assert overlapped.samples == plain.samples
    return plain, overlapped


def extra_tokens(plain: Transcript, overlapped: Transcript) -> int:
    """Tokens the overlap schedule computed beyond the plain one."""
    return sum(n for plan in overlapped.plans for *_, n in plan) - sum(n for plan in plain.plans for *_, n in plan)


def test_on_by_default_only_on_cuda(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    assert not LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=16), loaded).overlap


def test_batch_takes_pending_tokens_from_the_device(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    engine = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=16), loaded)
    decoding = Sequence(request(loaded, "decoding", (5, 6, 7), max_new_tokens=4))
    decoding.token_ids.append(placeholder(1))
    decoding.num_computed_tokens = 3
    forked = Sequence(request(loaded, "forked", (8, 9), max_new_tokens=4))  # computes its prompt and token
    forked.token_ids.append(placeholder(0))
    for seq in (decoding, forked):
        assert engine.block_manager.allocate(seq.seq_id, seq.num_tokens)
    scheduled = [ScheduledSequence(decoding, 1), ScheduledSequence(forked, 3)]
    pending = torch.tensor([40, 41])  # (N,) the pending step's tokens
    batch = engine.runner.build_batch(scheduled, engine.block_manager, pending)
    assert batch.input_ids.tolist() == [41, 8, 9, 40]
    assert batch.sample_seqs == [decoding, forked]
    with pytest.raises(ValueError, match="placeholders"):
        engine.runner.build_batch(scheduled, engine.block_manager)


def test_length_limits_schedule_exactly_the_plain_batches(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    """A sequence holding its last allowed token (still a placeholder) is neither scheduled nor counted
    against the running cap, so ends by length cost nothing and admit the next request as early."""
    arrivals = {
        0: [
            request(loaded, f"a{i}", PROMPT[: 5 + 7 * i], temperature=0.0, max_new_tokens=2 + 3 * i, ignore_eos=True)
            for i in range(3)
        ],
        2: [request(loaded, "b", (7, 8, 9), temperature=0.0, max_new_tokens=1, ignore_eos=True)],
        3: [request(loaded, f"c{i}", PROMPT[i:], temperature=0.0, max_new_tokens=4, ignore_eos=True) for i in range(2)],
    }
    plain, overlapped = both(tiny_model_dir, loaded, arrivals, num_kv_blocks=256, max_running_requests=3)
    assert overlapped.computed() == plain.computed()
    assert {f.kind for f in plain.finishes().values() if f is not None} == {"length"}
    assert [len(plain.tokens(f"a{i}")) for i in range(3)] == [2, 5, 8]


def test_staggered_arrivals_with_stop_ids_and_eos(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    probe = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=64), loaded)
    greedy = drive(probe, {0: [request(loaded, "p", temperature=0.0, max_new_tokens=8, ignore_eos=True)]}).tokens("p")
    eos = next(iter(loaded.eos_token_ids))
    arrivals = {
        0: [
            request(loaded, "stop", temperature=0.0, max_new_tokens=12, ignore_eos=True, stop_token_ids=[greedy[3]]),
            request(loaded, "long", (5, 6, 7, 8), temperature=0.0, max_new_tokens=14, ignore_eos=True),
        ],
        1: [request(loaded, "eos", (9, 10), temperature=0.0, max_new_tokens=10, logit_bias={eos: 100.0})],
        2: [
            request(
                loaded,
                "min",
                temperature=0.0,
                max_new_tokens=12,
                ignore_eos=True,
                stop_token_ids=[greedy[1]],
                min_new_tokens=5,
            )
        ],
        4: [request(loaded, "late", PROMPT[:20], temperature=0.0, max_new_tokens=6, ignore_eos=True)],
    }
    plain, overlapped = both(tiny_model_dir, loaded, arrivals, num_kv_blocks=256)
    finishes = plain.finishes()
    assert finishes[("stop", 0)] == Finish("stop", matched_token_id=greedy[3])
    assert plain.tokens("stop") == greedy[: greedy.index(greedy[3]) + 1]
    assert finishes[("eos", 0)] == Finish("stop", matched_token_id=eos, eos=True)
    assert finishes[("long", 0)] == Finish("length") and len(plain.tokens("long")) == 14
    # A sequence that stopped on a token while it was pending had its next token computed already, and
    # nothing more: at most one wasted token per stop.
    stops = sum(1 for f in finishes.values() if f is not None and f.kind == "stop")
    assert 0 < extra_tokens(plain, overlapped) <= stops


def test_seeded_samples_with_penalties_and_logprobs(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    """Penalties read the history, seeded draws consume their generators per sampling, logprobs come
    from the processed distribution: all of it sees the filled-in tokens, in the same order."""
    top = common_pb2.LogprobOptions(return_logprob=True, top_logprobs_num=3, token_ids_logprob=[5, 77])
    penalties: dict[str, Any] = {"repetition_penalty": 1.4, "frequency_penalty": 0.9, "presence_penalty": 0.5}
    arrivals = {
        0: [
            request(loaded, "n", n=3, temperature=1.0, seed=5, max_new_tokens=10, ignore_eos=True, **penalties),
            request(loaded, "lp", (3, 4, 5), top, temperature=0.8, seed=2, max_new_tokens=9, ignore_eos=True),
        ],
        2: [
            request(
                loaded, "best", (40, 41), n=1, best_of=3, temperature=1.2, seed=9, max_new_tokens=6, ignore_eos=True
            ),
            request(loaded, "pen", (6, 6, 6), top, temperature=0.0, max_new_tokens=12, ignore_eos=True, **penalties),
        ],
    }
    plain, overlapped = both(tiny_model_dir, loaded, arrivals, num_kv_blocks=256)
    samples = [tuple(plain.tokens("n", i)) for i in range(3)]
    assert len(set(samples)) == 3 and all(len(s) == 10 for s in samples)
    assert len(plain.samples[("lp", 0)].logprobs) == 9 and len(plain.samples[("lp", 0)].logprobs[0].top) == 3
    assert all(plain.samples[("best", i)].cumulative_logprob < 0.0 for i in range(3))
    # The penalties do their job: the greedy row never repeats a token its history holds.
    pen = plain.tokens("pen")
    assert len(set(pen)) == len(pen) and not set(pen) & {6}
    assert extra_tokens(plain, overlapped) == 0


def test_json_schema_constraint(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    """The grammar accepts token N (postprocess) before it fills the mask of token N+1 (launch)."""
    compiler = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=16), loaded)

    def constrained(rid: str, prompt: tuple[int, ...], **params: Any) -> EngineRequest:
        req = request(loaded, rid, prompt, json_schema=json.dumps(SCHEMA), max_new_tokens=48, **params)
        assert req.sampling.constraint is not None
        return dataclasses.replace(req, grammar=compiler.grammars.compile(req.sampling.constraint))  # once

    arrivals = {
        0: [constrained("json", (1, 504, 3575), n=2, temperature=1.0, seed=7)],
        1: [request(loaded, "free", (8, 9, 10), temperature=0.0, max_new_tokens=10, ignore_eos=True)],
        2: [constrained("greedy", (1, 504), temperature=0.0)],
    }
    plain, _ = both(tiny_model_dir, loaded, arrivals, num_kv_blocks=256)
    for key in [("json", 0), ("json", 1), ("greedy", 0)]:
        assert plain.samples[key].finish == Finish("stop")
        text = compiler.vocab.tokenizer.decode(plain.samples[key].tokens, skip_special_tokens=True)
        jsonschema.validate(json.loads(text), SCHEMA)


def test_prompt_logprobs_in_chunks(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    options = common_pb2.LogprobOptions(logprob_start_len=3, input_top_logprobs_num=2, return_logprob=True)
    arrivals = {
        0: [request(loaded, "warm", temperature=0.0, max_new_tokens=3, ignore_eos=True)],
        1: [request(loaded, "prompt", PROMPT, options, temperature=0.0, max_new_tokens=4, ignore_eos=True)],
        2: [request(loaded, "n", PROMPT[5:], options, n=2, temperature=0.9, seed=4, max_new_tokens=3)],
    }
    plain, _ = both(tiny_model_dir, loaded, arrivals, num_kv_blocks=256, max_num_batched_tokens=7)
    assert [p.token.token_id for p in plain.samples[("prompt", 0)].input_logprobs] == list(PROMPT[3:])
    assert len(plain.samples[("n", 0)].input_logprobs) == len(PROMPT) - 5 - 3


def test_abort_mid_generation(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    """An aborted sequence is not scheduled again; its pending token is collected and emitted first."""
    arrivals = {
        0: [
            request(loaded, "whole", temperature=0.0, max_new_tokens=10, ignore_eos=True),
            request(loaded, "one", (4, 5, 6), n=3, temperature=1.0, seed=1, max_new_tokens=10, ignore_eos=True),
            request(loaded, "queued", PROMPT[:9], temperature=0.0, max_new_tokens=10, ignore_eos=True),
        ],
        3: [request(loaded, "early", (7, 7), n=2, temperature=1.0, seed=3, max_new_tokens=10)],
    }
    actions: dict[int, Action] = {
        3: lambda e, _: e.abort("early"),  # before its prefill, with its samples not forked yet
        5: lambda e, _: e.abort("whole", "client left"),
        6: lambda e, _: e.abort("one", "stop string", indices=[1]),
    }
    plain, overlapped = both(tiny_model_dir, loaded, arrivals, actions, num_kv_blocks=256, max_running_requests=4)
    finishes = plain.finishes()
    assert finishes[("whole", 0)] == Finish("abort", message="client left")
    assert len(plain.tokens("whole")) == 5
    assert finishes[("one", 1)] == Finish("abort", message="stop string")
    assert finishes[("one", 0)] == finishes[("one", 2)] == Finish("length")
    assert ("early", 1) not in plain.samples and finishes[("early", 0)] == Finish("abort", message="aborted")
    assert overlapped.computed() == plain.computed(), "aborted sequences are left out at once in both schedules"


def test_preemption_under_a_tiny_kv_cache(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    """Preempted sequences may hold a pending token: it is filled in before they are recomputed."""
    penalties: dict[str, Any] = {"repetition_penalty": 1.3, "frequency_penalty": 0.5}
    arrivals = {
        0: [
            request(loaded, f"g{i}", PROMPT[i * 4 :], temperature=0.0, max_new_tokens=12, ignore_eos=True)
            for i in range(3)
        ],
        1: [
            request(loaded, "s", (3, 9, 27), temperature=1.0, seed=8, max_new_tokens=14, ignore_eos=True, **penalties),
            request(loaded, "n", PROMPT[:30], n=2, temperature=0.7, seed=6, max_new_tokens=10, ignore_eos=True),
        ],
    }
    plain, overlapped = both(tiny_model_dir, loaded, arrivals, num_kv_blocks=10)
    assert plain.num_preemptions > 0 and overlapped.num_preempted_pending > 0
    # Ends by length give their blocks back before the next step is planned, pending token or not.
    assert overlapped.computed() == plain.computed()
    assert all(len(s.tokens) == s.completion_tokens for s in plain.samples.values())


def test_prefix_cache_hits(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    """Blocks are hashed at commit, after the step before was collected: a block holding outputs is cached
    with their real ids, and a later prompt that repeats them hits it."""
    system = PROMPT[:33]  # two full blocks of 16 and one more token
    first = (*system, 1, 2)
    arrivals = {
        0: [request(loaded, "p0", first, temperature=0.0, max_new_tokens=16, ignore_eos=True)],
        3: [
            request(loaded, f"p{i}", (*system, i, i), temperature=0.0, max_new_tokens=5, ignore_eos=True)
            for i in range(1, 4)
        ],
    }

    def repeat(engine: LLMEngine, transcript: Transcript) -> None:
        # 35 prompt tokens + 14 of p0's outputs: its third block (tokens 32-47) holds 13 outputs.
        prompt = first + tuple(transcript.tokens("p0")[:14])
        engine.add_request(request(loaded, "again", prompt, temperature=0.0, max_new_tokens=2, ignore_eos=True))

    plain, _ = both(tiny_model_dir, loaded, arrivals, {20: repeat}, num_kv_blocks=64)
    assert plain.samples[("p0", 0)].cached_tokens == 0
    assert all(plain.samples[(f"p{i}", 0)].cached_tokens == 32 for i in range(1, 4))
    assert plain.samples[("again", 0)].cached_tokens == 48
    assert plain.tokens("again") == plain.tokens("p0")[14:16]


def test_thinking_budget_offline(tiny_thinking_model_dir: Path) -> None:
    """The budget processor counts the output so far: it must see the filled-in tokens. Through `LLM`, whose
    engine drains its last pending sampling before generate() returns."""
    llm = LLM(tiny_thinking_model_dir, device="cpu", num_kv_blocks=128, overlap_schedule=True)
    end = llm.engine.vocab.token_id("</think>")
    assert end is not None
    text = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Why is the sky blue?"}], add_generation_prompt=True, tokenize=False
    )
    prompt = llm.tokenizer.encode(text, add_special_tokens=False)
    base = {"temperature": 0, "ignore_eos": True, "logit_bias": {str(end): -100.0}, "max_new_tokens": 8}
    params = [{**base, "thinking_budget": 2}, {**base, "thinking_budget": 4, "n": 2, "temperature": 1.0, "seed": 3}]
    runs = []
    # One engine for both (the vocabulary scan behind the budget is slow): nothing is pending between
    # two generate() calls, so the schedule can change there.
    for overlap in (True, False):
        llm.engine.overlap = overlap
        outs = llm.generate([prompt, prompt, prompt], [*params, base])
        runs.append([[(s.output_token_ids, s.finish, s.cumulative_logprob) for s in o.samples] for o in outs])
        llm.engine.block_manager.check_integrity()
        assert not llm.engine.has_work() and llm.engine.block_manager.usage == 0.0
    overlapped, plain = runs
    assert overlapped == plain
    assert end in plain[0][0][0] and all(end in sample[0] for sample in plain[1])
    assert end not in plain[2][0][0]


async def test_engine_loop_streams_and_drains(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    """Through the gRPC path's step loop: a request left early is aborted, the other streams to its end, and
    the loop goes idle with every block released."""
    plain = drive(
        LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=128), loaded),
        {0: [request(loaded, "a", temperature=0.0, max_new_tokens=12, ignore_eos=True)]},
    )
    core = LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=128, overlap_schedule=True), loaded)
    loop = EngineLoop(core)

    async def stream(req: EngineRequest, keep: int) -> list[int]:
        tokens: list[int] = []
        outputs = cast("AsyncGenerator[EngineOutput, None]", loop.generate(req))
        try:
            async for out in outputs:
                assert all(t >= 0 for t in out.token_ids)
                tokens += out.token_ids
                if len(tokens) >= keep:
                    break
        finally:
            await outputs.aclose()  # leaving early aborts the request
        return tokens

    try:
        full, partial = await asyncio.wait_for(
            asyncio.gather(
                stream(request(loaded, "a", temperature=0.0, max_new_tokens=12, ignore_eos=True), keep=100),
                stream(request(loaded, "left", (3, 4), temperature=0.0, max_new_tokens=500, ignore_eos=True), keep=3),
            ),
            60,
        )
        assert full == plain.tokens("a") and len(partial) >= 3
        for _ in range(500):
            if not core.has_work():
                break
            await asyncio.sleep(0.01)
        assert not core.has_work()
    finally:
        loop.shutdown()
    core.block_manager.check_integrity()
    assert core.block_manager.usage == 0.0


@pytest.mark.cuda
def test_cuda_overlap_gives_the_plain_outputs(tiny_model_dir: Path) -> None:
    """Where the device really runs ahead: tokens and log-probabilities reach the host through pinned
    copies and an event, while the next forward pass is queued. Only ends by length, so both schedules
    compute the same batches and the comparison can be exact."""
    cuda = load_model(EngineConfig(model=tiny_model_dir, device="cuda", dtype="float32"))
    assert LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=16), cuda).overlap
    top = common_pb2.LogprobOptions(return_logprob=True, top_logprobs_num=2, token_ids_logprob=[5])
    prompt_lp = common_pb2.LogprobOptions(logprob_start_len=2, input_top_logprobs_num=1)
    penalties: dict[str, Any] = {"repetition_penalty": 1.3, "frequency_penalty": 0.4}
    arrivals = {
        0: [
            request(cuda, "g", temperature=0.0, max_new_tokens=16, ignore_eos=True),
            request(cuda, "n", (4, 5), n=3, temperature=1.0, seed=2, max_new_tokens=12, ignore_eos=True, **penalties),
        ],
        2: [
            request(cuda, "lp", PROMPT[:20], top, temperature=0.7, seed=5, max_new_tokens=10, ignore_eos=True),
            request(cuda, "p", PROMPT[3:], prompt_lp, temperature=0.0, max_new_tokens=6, ignore_eos=True),
        ],
    }
    plain, overlapped = both(tiny_model_dir, cuda, arrivals, num_kv_blocks=64)
    assert overlapped.computed() == plain.computed()
    assert len(plain.samples[("lp", 0)].logprobs) == 10 and plain.samples[("p", 0)].input_logprobs
