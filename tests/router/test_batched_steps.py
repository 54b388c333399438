"""Steps batched in one engine message (what the engine sends a router that lags) give the caller
exactly what one message per step gives: the same chunks, text, stop-string cut, token ids, logprobs
and counts, whether the caller takes them one message each or batched (accept_batches)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.tokenizer.service import TokenizerServicer
from services.tokenizer.text_tokenizer import TextTokenizer
from tests.router.conftest import Cluster
from turnout.v1 import common_pb2, inference_pb2

TEXT = "Hello there, caf\u00e9 owners! The stop word END is here, and more text follows after it."


@pytest.fixture(scope="module")
def text_tokenizer(default_model_dir: Path) -> TextTokenizer:
    return TextTokenizer(default_model_dir)


@pytest.fixture
async def cluster(make_cluster: Callable[..., Any], text_tokenizer: TextTokenizer) -> Cluster:
    return await make_cluster(1, tokenizer_servicer=TokenizerServicer(text_tokenizer))  # type: ignore[no-any-return]


async def run(cluster: Cluster, steps: int, *, accept_batches: bool, **params: Any) -> list[Any]:
    cluster.engines[0].steps_per_message = steps
    request = inference_pb2.GenerateRequest(
        input_ids=common_pb2.TokenIds(ids=[1, 2, 3]),
        sampling_params=common_pb2.SamplingParams(**params),
        logprob_options=common_pb2.LogprobOptions(return_logprob=True),
        accept_batches=accept_batches,
    )
    messages = [r async for r in cluster.inference.Generate(request)]
    if not accept_batches:
        assert all(not m.batch for m in messages)
    responses = []
    for m in messages:
        parts = [m, *m.batch]
        m.ClearField("batch")
        responses += parts
    return responses


@pytest.mark.parametrize("params", [{}, {"stop": ["END"]}, {"stop": [" is here"], "no_stop_trim": True}])
async def test_batched_steps_answer_as_one_message_per_step(
    cluster: Cluster, text_tokenizer: TextTokenizer, params: dict[str, Any]
) -> None:
    ids = text_tokenizer.encode(TEXT, add_special_tokens=False)
    cluster.engines[0].outputs = [ids]
    one_each = await run(cluster, 1, accept_batches=False, **params)
    chunks = [r.chunk for r in one_each if r.WhichOneof("kind") == "chunk"]
    assert len(chunks) > 5 and all(len(c.token_ids) == 1 for c in chunks)  # one chunk per token
    if params:
        assert one_each[-1].complete.finish_reason.stop.stop_str == params["stop"][0]
        assert len(chunks) < len(ids)  # the stop string ended it early
    for steps in (3, 4, len(ids)):
        assert await run(cluster, steps, accept_batches=False, **params) == one_each
        assert await run(cluster, steps, accept_batches=True, **params) == one_each


async def test_a_caller_that_accepts_batches_gets_fewer_messages(cluster: Cluster) -> None:
    cluster.engines[0].tokens = 12
    one_each = await run(cluster, 1, accept_batches=False)
    cluster.engines[0].steps_per_message = 4
    request = inference_pb2.GenerateRequest(input_ids=common_pb2.TokenIds(ids=[1, 2, 3]), accept_batches=True)
    messages = [r async for r in cluster.inference.Generate(request)]
    # 12 steps in 3 engine messages, then the Complete: at most one message to the caller for each (fewer
    # when the router read several at once), with every response of the one-by-one stream in them.
    assert len(messages) <= 4 < len(one_each)
    assert sum(1 + len(m.batch) for m in messages) == len(one_each)
