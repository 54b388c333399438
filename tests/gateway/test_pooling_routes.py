"""What the pooling routes send the router and how they shape its vectors, against the fake router
(the vectors here are scripted: the engine's are checked in tests/engine/test_pooling.py and through
the live stack in tests/e2e/test_embeddings_api.py)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
from grpc import aio

from tests.gateway.conftest import FakeRouter
from turnout.v1 import common_pb2, inference_pb2

# The fake engine's vector of each prompt text.
VECTORS = {"a": [1.0, 0.0], "b": [0.6, 0.8], "c": [0.0, 1.0], "ab": [0.8, 0.6]}


async def pooled(
    request: inference_pb2.GenerateRequest, context: aio.ServicerContext
) -> AsyncIterator[inference_pb2.GenerateResponse]:
    vector = VECTORS.get(request.text, [0.5, 0.5])
    yield inference_pb2.GenerateResponse(
        complete=inference_pb2.GenerateComplete(
            finish_reason=common_pb2.FinishReason(length=common_pb2.FinishReason.Length(length=0)),
            usage=common_pb2.Usage(prompt_tokens=len(request.text) or len(request.input_ids.ids)),
            embedding=vector,
        )
    )


@pytest.fixture
def router(fake_router: FakeRouter) -> FakeRouter:
    fake_router.script = pooled
    return fake_router


async def test_embeddings_send_prefill_only_pooling_requests(client: httpx.AsyncClient, router: FakeRouter) -> None:
    body = {"input": ["a", "b"], "dimensions": 2, "normalize": False, "pooling_type": "Mean"}
    reply = await client.post("/v1/embeddings", json={**body, "truncate_prompt_tokens": 7, "priority": 1})
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["data"][0]["embedding"] == VECTORS["a"]
    assert data["data"][1]["embedding"] == pytest.approx(VECTORS["b"])  # float32 on the wire
    assert data["usage"] == {"prompt_tokens": 2, "total_tokens": 2} and data["model"] == "tiny"
    first, second = router.requests
    assert (first.text, second.text) == ("a", "b")
    assert first.pooling == common_pb2.PoolingParams(type=common_pb2.PoolingParams.MEAN, dimensions=2, normalize=False)
    sp = first.sampling_params
    assert sp.HasField("max_new_tokens") and sp.max_new_tokens == 0 and sp.truncate_prompt_tokens == 7
    assert first.priority == 1


async def test_token_id_inputs_and_base64(client: httpx.AsyncClient, router: FakeRouter) -> None:
    reply = await client.post("/v1/embeddings", json={"input": [5, 6, 7], "encoding_format": "base64"})
    [sent] = router.requests
    assert list(sent.input_ids.ids) == [5, 6, 7] and not sent.pooling.HasField("dimensions")
    raw = base64.b64decode(reply.json()["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == [0.5, 0.5] and reply.json()["data"][0]["index"] == 0
    half = await client.post(
        "/v1/embeddings", json={"input": "a", "embed_dtype": "float16", "encoding_format": "base64"}
    )
    assert np.frombuffer(base64.b64decode(half.json()["data"][0]["embedding"]), dtype="<f2").tolist() == [1.0, 0.0]


async def test_truncate_minus_one_keeps_the_context(client: httpx.AsyncClient, router: FakeRouter) -> None:
    await client.post("/v1/embeddings", json={"input": "a", "truncate_prompt_tokens": -1})
    assert router.requests[0].sampling_params.truncate_prompt_tokens == 2048


async def test_score_is_the_cosine_of_pooled_vectors_each_text_pooled_once(
    client: httpx.AsyncClient, router: FakeRouter
) -> None:
    reply = await client.post("/v1/score", json={"text_1": "a", "text_2": ["b", "c", "a"]})
    assert [d["score"] for d in reply.json()["data"]] == pytest.approx([0.6, 0.0, 1.0])
    assert sorted(r.text for r in router.requests) == ["a", "b", "c"]
    zipped = await client.post("/score", json={"text_1": ["a", "b"], "text_2": ["c", "c"]})
    assert [d["score"] for d in zipped.json()["data"]] == pytest.approx([0.0, 0.8])


async def test_rerank_sorts_cuts_and_leaves_documents_out(client: httpx.AsyncClient, router: FakeRouter) -> None:
    body = {"query": "a", "documents": ["c", {"text": "ab"}, "b"], "top_n": 2}
    results = (await client.post("/v2/rerank", json=body)).json()["results"]
    assert [r["index"] for r in results] == [1, 2]
    assert [r["relevance_score"] for r in results] == pytest.approx([0.8, 0.6])
    assert results[0]["document"] == {"text": "ab"}
    bare = (await client.post("/rerank", json={**body, "return_documents": False})).json()["results"]
    assert all("document" not in r for r in bare)


def _rows(*values: float) -> list[common_pb2.HiddenState]:
    return [common_pb2.HiddenState(values=[v, -v]) for v in values]


async def with_hidden_states(
    request: inference_pb2.GenerateRequest, context: aio.ServicerContext
) -> AsyncIterator[inference_pb2.GenerateResponse]:
    """A 3-token prompt and 3 generated tokens: 3 + 2 computed positions, sent over two chunks."""
    hidden = request.return_hidden_states
    yield inference_pb2.GenerateResponse(
        chunk=inference_pb2.GenerateChunk(
            text="ab",
            token_ids=[11, 12],
            prompt_tokens=3,
            completion_tokens=2,
            hidden_states=_rows(1, 2, 3, 4) if hidden else [],
        )
    )
    yield inference_pb2.GenerateResponse(
        chunk=inference_pb2.GenerateChunk(
            text="c",
            token_ids=[13],
            prompt_tokens=3,
            completion_tokens=3,
            last=True,
            hidden_states=_rows(5) if hidden else [],
        )
    )
    yield inference_pb2.GenerateResponse(
        complete=inference_pb2.GenerateComplete(
            finish_reason=common_pb2.FinishReason(length=common_pb2.FinishReason.Length(length=3)),
            usage=common_pb2.Usage(prompt_tokens=3, completion_tokens=3),
        )
    )


async def test_hidden_states_in_sglang_and_openai_shapes(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    fake_router.script = with_hidden_states
    native = (await client.post("/generate", json={"text": "x", "return_hidden_states": True})).json()
    assert native["meta_info"]["hidden_states"] == [[[1, -1], [2, -2], [3, -3]], [4, -4], [5, -5]]
    assert fake_router.requests[-1].return_hidden_states
    batch = (await client.post("/generate", json={"text": ["x", "y"], "return_hidden_states": [False, True]})).json()
    assert "hidden_states" not in batch[0]["meta_info"] and len(batch[1]["meta_info"]["hidden_states"]) == 3
    completion = (await client.post("/v1/completions", json={"prompt": "x", "return_hidden_states": True})).json()
    assert completion["choices"][0]["hidden_states"] == [5, -5]
    chat = {"messages": [{"role": "user", "content": "x"}], "return_hidden_states": True}
    assert (await client.post("/v1/chat/completions", json=chat)).json()["choices"][0]["hidden_states"] == [5, -5]
    plain = (await client.post("/v1/completions", json={"prompt": "x"})).json()
    assert "hidden_states" not in plain["choices"][0] and not fake_router.requests[-1].return_hidden_states
    streamed = await client.post("/v1/completions", json={"prompt": "x", "return_hidden_states": True, "stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "return_hidden_states"
