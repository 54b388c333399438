"""Grammars through the step loop: compiled off it, so a slow compilation never stalls the batch."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from services.engine.config import EngineConfig
from services.engine.engine_loop import EngineLoop
from services.engine.grammar.compiler import GrammarCompiler
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel, load_model
from services.engine.request import EngineRequest
from services.engine.sampling_validation import resolve
from tests.engine.grammar_builds import HOLD_ENV, held_build
from tests.engine.test_engine_loop import collect
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2

PROMPT = (1, 504, 3575, 282, 4649, 314)
SCHEMA = {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["v"]}


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir))


@pytest.fixture
def core(loaded: LoadedModel, tiny_model_dir: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=tiny_model_dir, num_kv_blocks=512), loaded)


@pytest.fixture
def engine(core: LLMEngine) -> Iterator[EngineLoop]:
    engine = EngineLoop(core)
    yield engine
    engine.shutdown()
    core.block_manager.check_integrity()
    assert core.block_manager.usage == 0.0


async def wait_for_file(path: Path, timeout_s: float = 120) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if path.exists():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(path)


def request(core: LLMEngine, rid: str, **params: Any) -> EngineRequest:
    sampling = resolve(common_pb2.SamplingParams(**params), common_pb2.SamplingParams(), core.limits(len(PROMPT)))
    return EngineRequest(rid, PROMPT, sampling)


async def test_a_held_compilation_does_not_stall_other_requests(
    core: LLMEngine, engine: EngineLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = tmp_path / "release"
    monkeypatch.setenv(HOLD_ENV, str(release))  # read by the compile workers, started below
    core.grammars = GrammarCompiler(core.vocab, build=held_build)
    slow = asyncio.create_task(
        collect(engine.generate(request(core, "slow", json_schema=json.dumps(SCHEMA), max_new_tokens=64)))
    )
    await wait_for_file(tmp_path / "release.started")
    # While the grammar is held, another request runs from start to finish.
    tokens, last = await asyncio.wait_for(
        collect(engine.generate(request(core, "free", temperature=0.0, max_new_tokens=20, ignore_eos=True))), 60
    )
    assert len(tokens) == 20 and last.finish is not None and last.finish.kind == "length"
    assert not slow.done()
    release.touch()
    tokens, last = await asyncio.wait_for(slow, 60)
    assert last.finish is not None and last.finish.kind == "stop" and last.finish.matched_token_id is None
    text = core.vocab.tokenizer.decode(tokens, skip_special_tokens=True)
    jsonschema.validate(json.loads(text), SCHEMA)


async def test_compile_error_reaches_the_caller_and_nothing_runs(core: LLMEngine, engine: EngineLoop) -> None:
    with pytest.raises(InvalidArgument, match="regex: the constraint does not compile"):
        await collect(engine.generate(request(core, "bad", regex="[a-", max_new_tokens=8)))
    assert not core.has_work()


async def test_streamed_constrained_samples(core: LLMEngine, engine: EngineLoop) -> None:
    outputs = []
    async for out in engine.generate(
        request(core, "n3", json_schema=json.dumps(SCHEMA), max_new_tokens=64, n=3, seed=7, temperature=1.0)
    ):
        outputs.append(out)
    by_index: dict[int, list[int]] = {}
    for out in outputs:
        by_index.setdefault(out.index, []).extend(out.token_ids)
    assert sorted(by_index) == [0, 1, 2]
    for tokens in by_index.values():
        jsonschema.validate(json.loads(core.vocab.tokenizer.decode(tokens, skip_special_tokens=True)), SCHEMA)


async def test_grpc_request_with_a_constraint_and_a_processor(
    core: LLMEngine, engine: EngineLoop, loaded: LoadedModel
) -> None:
    """The servicer's path: proto -> request_from_proto (with the engine's processors) -> EngineLoop."""
    from google.protobuf.struct_pb2 import Struct

    from services.engine.convert import output_to_proto, request_from_proto
    from turnout.v1 import engine_pb2

    params = Struct()
    params.update({"token_ids": [core.vocab.tokenizer.encode("1", add_special_tokens=False)[0]]})
    message = engine_pb2.EngineGenerateRequest(
        request_id="grpc",
        input_ids=PROMPT,
        sampling_params=common_pb2.SamplingParams(
            regex="[0-9]{3}", max_new_tokens=10, custom_logit_processor="disallowed_tokens", custom_params=params
        ),
    )
    request = request_from_proto(message, loaded, core.config, core.processors)
    tokens, last = await collect(engine.generate(request))
    text = core.vocab.tokenizer.decode(tokens, skip_special_tokens=True)
    assert len(text) == 3 and text.isdigit() and "1" not in text
    assert last.finish is not None
    complete = output_to_proto(last).complete
    assert complete.finish_reason.WhichOneof("kind") == "stop"
    assert complete.finish_reason.stop.WhichOneof("matched") is None  # the grammar ended it


async def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 300) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(what)


async def test_a_cancelled_call_aborts_every_sample_and_frees_its_blocks(core: LLMEngine, engine: EngineLoop) -> None:
    """What a cancelled gRPC Generate does (its handler task is cancelled): every sample of the group ends."""
    seen: set[int] = set()

    async def consume() -> None:
        async for out in engine.generate(request(core, "many", n=8, max_new_tokens=3000, ignore_eos=True)):
            seen.add(out.index)

    task = asyncio.create_task(consume())
    await wait_for(lambda: len(seen) == 8, "all 8 samples to run")
    assert core.block_manager.usage > 0
    task.cancel()
    await wait_for(lambda: engine.load().running == 0, "the samples to be aborted", timeout_s=30)
    await wait_for(lambda: core.block_manager.usage == 0.0, "the blocks to be freed", timeout_s=30)
    assert not core.has_work()


async def test_a_cancelled_call_waiting_for_its_grammar_stops_the_compile(
    core: LLMEngine, engine: EngineLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HOLD_ENV, str(tmp_path / "never"))  # the compile would wait forever
    core.grammars = GrammarCompiler(core.vocab, build=held_build, workers=1)
    task = asyncio.create_task(collect(engine.generate(request(core, "gone", regex="[0-9]{2}", max_new_tokens=4))))
    await wait_for_file(tmp_path / "never.started")
    task.cancel()
    await wait_for(lambda: core.grammars.num_replaced == 1, "the compile's worker to be killed")
    assert not core.has_work()
    core.grammars.shutdown()
