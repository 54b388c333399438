"""convert.request_from_proto checks the prompt's token ids against the vocabulary: a bad one is refused
by the first such id (found without a Python scan when every id is in range, issue 15)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.engine.config import EngineConfig
from services.engine.convert import request_from_proto
from services.engine.model_loader import load_model
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2, engine_pb2


def test_prompt_ids_are_checked_against_the_vocabulary(tiny_model_dir: Path) -> None:
    config = EngineConfig(model=tiny_model_dir, num_kv_blocks=64, skip_forward=True)
    loaded = load_model(config)
    vocab = loaded.vocab_size
    params = common_pb2.SamplingParams(max_new_tokens=2)

    def convert(ids: list[int]) -> tuple[int, ...]:
        message = engine_pb2.EngineGenerateRequest(request_id="r", input_ids=ids, sampling_params=params)
        return request_from_proto(message, loaded, config).input_ids

    assert convert([0, 5, vocab - 1]) == (0, 5, vocab - 1)
    with pytest.raises(InvalidArgument, match=f"token id {vocab + 3} is out of range for a vocabulary of {vocab}"):
        convert([5, vocab + 3, vocab, 7])
    with pytest.raises(InvalidArgument, match=f"token id {vocab} is out of range"):
        convert([vocab])
