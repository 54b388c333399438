"""Aborts are reaped at the next step however many steps pass between them (the step walks its
requests for abort marks only after abort() made one, issue 15)."""

from __future__ import annotations

from pathlib import Path

from services.engine.config import EngineConfig
from services.engine.llm_engine import LLMEngine, StepOutput
from services.engine.model_loader import load_model
from services.engine.request import EngineRequest
from services.engine.sampling_validation import Limits, resolve
from turnout.v1 import common_pb2


def _add(engine: LLMEngine, request_id: str, n: int = 1) -> None:
    loaded = engine.loaded
    params = common_pb2.SamplingParams(max_new_tokens=50, ignore_eos=True, n=n)
    sampling = resolve(params, loaded.info.generation_defaults, Limits(3, loaded.max_model_len, loaded.vocab_size))
    engine.add_request(EngineRequest(request_id, (5, 6, 7), sampling))


def _ends(outputs: list[StepOutput]) -> list[tuple[str, int, str, bool]]:
    return [
        (o.request_id, o.output.index, o.output.finish.kind, o.output.request_finished)
        for o in outputs
        if o.output.finish is not None
    ]


def test_aborts_between_quiet_steps_are_each_reaped_at_the_next_step(tiny_model_dir: Path) -> None:
    config = EngineConfig(model=tiny_model_dir, num_kv_blocks=64, skip_forward=True)
    engine = LLMEngine(config, load_model(config))
    _add(engine, "a")
    _add(engine, "b", n=2)
    _add(engine, "c")
    for _ in range(3):
        assert _ends(engine.step()) == []
    assert engine.abort("a", "stop now")
    assert _ends(engine.step()) == [("a", 0, "abort", True)]
    for _ in range(3):
        assert _ends(engine.step()) == []
    assert engine.abort("b", indices=[1])  # one sample: the request goes on
    assert _ends(engine.step()) == [("b", 1, "abort", False)]
    assert _ends(engine.step()) == []
    assert engine.abort("b") and engine.abort("c")
    assert _ends(engine.step()) == [("b", 0, "abort", True), ("c", 0, "abort", True)]
    assert not engine.has_work() and not engine.abort("c")
    engine.block_manager.check_integrity()
