"""Peers' routes beyond the OpenAI core: `/tokenizer_info` (vLLM), `/load` (vLLM, SGLang), `/invocations`
(SageMaker, dispatched by the body's shape as vLLM does) and the audio routes we answer with a 400."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.gateway.conftest import FakeRouter, sse_events


async def test_tokenizer_info_is_the_class_and_its_settings(client: httpx.AsyncClient) -> None:
    assert (await client.get("/tokenizer_info")).json() == {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "model_max_length": 2048,
        "chat_template": "{{ messages }}",
    }
    assert (await client.get("/tokenizer_info", params={"model": "nope"})).status_code == 404


async def test_load_is_the_routers_count(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    fake_router.admin.active_requests, fake_router.admin.queued_requests = 3, 2
    engine = fake_router.admin.engines[0]
    engine.running_requests, engine.waiting_requests, engine.kv_cache_usage = 3, 1, 0.25
    assert (await client.get("/load")).json() == {
        "server_load": 5,
        "engines": [{"address": "10.0.0.5:50051", "num_reqs": 3, "num_waiting_reqs": 1, "kv_cache_usage": 0.25}],
    }


@pytest.mark.parametrize(
    ("body", "object_key", "object_value"),
    [
        ({"messages": [{"role": "user", "content": "Hi"}]}, "object", "chat.completion"),
        ({"prompt": "Hi"}, "object", "text_completion"),
        ({"text": "Hi"}, "text", "Hello world"),
        ({"input_ids": [1, 2]}, "text", "Hello world"),
    ],
)
async def test_invocations_answers_as_the_endpoint_of_the_body(
    client: httpx.AsyncClient, fake_router: FakeRouter, body: dict[str, Any], object_key: str, object_value: str
) -> None:
    reply = await client.post("/invocations", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()[object_key] == object_value
    assert len(fake_router.requests) == 1


async def test_invocations_streams_and_refuses_as_the_endpoint(client: httpx.AsyncClient) -> None:
    stream = await client.post("/invocations", json={"prompt": "Hi", "stream": True})
    events = sse_events(stream.text)
    assert "".join(e["choices"][0]["text"] for e in events) == "Hello world"
    bad = await client.post("/invocations", json={"prompt": "Hi", "max_tokens": "many"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    refused = await client.post("/invocations", json={"messages": [{"role": "user", "content": "Hi"}], "n": 1.5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "n"
    neither = await client.post("/invocations", json={"query": "Hi"})
    assert neither.status_code == 400 and "'messages', 'prompt'" in neither.json()["error"]["message"]
    assert (await client.post("/invocations", content=b"[1]")).status_code == 400


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/audio/translations"])
async def test_audio_routes_say_no_audio_model(client: httpx.AsyncClient, path: str) -> None:
    reply = await client.post(path, files={"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}, data={"model": "x"})
    assert reply.status_code == 400
    assert "does not support" in reply.json()["error"]["message"] and "audio" in reply.json()["error"]["message"]
