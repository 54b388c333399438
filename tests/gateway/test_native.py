"""SGLang-native `/generate`, `/health`, `/get_model_info` against the fake router."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import pytest

from gateway.config import GatewayConfig
from tests.gateway.conftest import FakeRouter, chunk, complete, sse_events


async def test_generate_shape_and_default_max_new_tokens(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    response = await client.post("/generate", json={"text": "Hi", "rid": "r1"})
    assert response.status_code == 200
    body = response.json()
    assert body["text"] == "Hello world"
    assert body["output_ids"] == [11, 12, 13]
    meta = body["meta_info"]
    assert meta["id"] == "r1"
    assert meta["finish_reason"] == {"type": "stop", "matched": 2}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (5, 3, 1)
    assert isinstance(meta["e2e_latency"], float) and meta["e2e_latency"] >= 0
    [sent] = fake_router.requests
    assert sent.text == "Hi" and sent.request_id == "r1"
    assert sent.sampling_params.max_new_tokens == 128  # SGLang's default
    assert not sent.sampling_params.HasField("temperature")


async def test_max_new_tokens_null_and_value(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    await client.post("/generate", json={"text": "a", "sampling_params": {"max_new_tokens": None}})
    await client.post("/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    await client.post("/generate", json={"text": "a", "sampling_params": {"temperature": 0}})
    first, second, third = (r.sampling_params for r in fake_router.requests)
    assert not first.HasField("max_new_tokens")
    assert second.max_new_tokens == 3 and second.HasField("temperature") and second.temperature == 0
    assert third.max_new_tokens == 128


async def test_native_sampling_params_are_mapped(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    params = {
        "min_new_tokens": 1,
        "stop": ["A", "B"],
        "stop_token_ids": [3],
        "stop_regex": "x+",
        "top_k": 5,
        "no_stop_trim": True,
        "seed": 7,
        "logit_bias": {"9": 1.5},
        "json_schema": '{"type": "object"}',
        "custom_params": {"thinking_budget": 10},
    }
    assert (await client.post("/generate", json={"text": "a", "sampling_params": params})).status_code == 200
    sp = fake_router.requests[0].sampling_params
    assert list(sp.stop) == ["A", "B"] and list(sp.stop_token_ids) == [3] and list(sp.stop_regex) == ["x+"]
    assert (sp.min_new_tokens, sp.top_k, sp.seed, sp.no_stop_trim) == (1, 5, 7, True)
    assert dict(sp.logit_bias) == {9: 1.5}
    assert sp.WhichOneof("constraint") == "json_schema" and sp.json_schema == '{"type": "object"}'
    # Without a processor, SGLang's budget key becomes the thinking_budget field (docs/reasoning.md).
    assert sp.thinking_budget == 10 and not sp.HasField("custom_params")


async def test_batch_text_with_per_prompt_params(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = {
        "text": ["a", "b"],
        "rid": ["ra", "rb"],
        "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 4}],
    }
    response = await client.post("/generate", json=body)
    outputs = response.json()
    assert isinstance(outputs, list) and len(outputs) == 2
    assert [o["meta_info"]["id"] for o in outputs] == ["ra", "rb"]
    sent = {r.text: r for r in fake_router.requests}
    assert (sent["a"].request_id, sent["a"].sampling_params.max_new_tokens) == ("ra", 2)
    assert (sent["b"].request_id, sent["b"].sampling_params.max_new_tokens) == ("rb", 4)


async def test_input_ids_single_batch_and_n(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    single = (await client.post("/generate", json={"input_ids": [1, 2]})).json()
    assert isinstance(single, dict)
    assert list(fake_router.requests[0].input_ids.ids) == [1, 2]
    batch = (await client.post("/generate", json={"input_ids": [[1], [2, 3]]})).json()
    assert len(batch) == 2
    assert sorted(list(r.input_ids.ids) for r in fake_router.requests[1:]) == [[1], [2, 3]]
    # One prompt with n=2 is a list too, with one id per sample.
    several = (await client.post("/generate", json={"input_ids": [1], "rid": "x", "sampling_params": {"n": 2}})).json()
    assert [o["meta_info"]["id"] for o in several] == ["x-0", "x-1"]


async def test_stream_is_cumulative_and_ends_with_done(client: httpx.AsyncClient) -> None:
    response = await client.post("/generate", json={"text": "a", "stream": True})
    events = sse_events(response.text)
    assert [e["text"] for e in events] == ["Hello", "Hello", "Hello world", "Hello world"]
    assert [e["output_ids"] for e in events] == [[11, 12], [11, 12, 13], [11, 12, 13], [11, 12, 13]]
    assert [e["meta_info"]["finish_reason"] for e in events] == [None, None, None, {"type": "stop", "matched": 2}]
    assert all("index" not in e for e in events)


async def test_batch_stream_items_carry_index(client: httpx.AsyncClient) -> None:
    response = await client.post("/generate", json={"text": ["a", "b"], "stream": True})
    events = sse_events(response.text)
    finals = {e["index"]: e for e in events if e["meta_info"]["finish_reason"]}
    assert sorted(finals) == [0, 1]
    assert all(f["text"] == "Hello world" for f in finals.values())


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ({"token_id": 7}, {"type": "stop", "matched": 7}),
        ({"stop_str": "END"}, {"type": "stop", "matched": "END"}),
        ({"regex": "x+"}, {"type": "stop", "matched": "x+"}),
        ({"eos_token_id": 2}, {"type": "stop", "matched": 2}),
        ({}, {"type": "stop", "matched": None}),
        ({"length": 4}, {"type": "length", "length": 4}),
    ],
)
async def test_finish_reason_shapes(
    client: httpx.AsyncClient, fake_router: FakeRouter, reason: dict[str, Any], expected: dict[str, Any]
) -> None:
    async def script(request, context):  # type: ignore[no-untyped-def]
        yield chunk(0, "x", (1,), completion=1)
        yield complete(0, **reason)

    fake_router.script = script
    body = (await client.post("/generate", json={"text": "a"})).json()
    assert body["meta_info"]["finish_reason"] == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"text": "a", "input_ids": [1]}, "text"),
        ({}, "text"),
        ({"text": "a", "sampling_params": {"temperature": "1"}}, "sampling_params.temperature"),
        ({"text": "a", "sampling_params": {"stop": [""]}}, "sampling_params.stop"),
        ({"text": "a", "sampling_params": {"stop_regex": ""}}, "sampling_params.stop_regex"),
        ({"text": "a", "sampling_params": {"logit_bias": {"x": 1}}}, "sampling_params.logit_bias"),
        ({"text": "a", "sampling_params": {"best_of": 2}}, "sampling_params.best_of"),
        (
            {"text": "a", "sampling_params": {"include_stop_str_in_output": True}},
            "sampling_params.include_stop_str_in_output",
        ),
        ({"text": ["a", "b"], "return_logprob": [True]}, "return_logprob"),
        ({"text": ["a", "b"], "top_logprobs_num": [1, 2, 3]}, "top_logprobs_num"),
        ({"text": ["a", "b"], "logprob_start_len": [0]}, "logprob_start_len"),
        ({"text": ["a", "b"], "token_ids_logprob": [[1]]}, "token_ids_logprob"),
        ({"text": ["a", "b"], "return_text_in_logprobs": [True]}, "return_text_in_logprobs"),
        ({"text": "a", "top_logprobs_num": -1}, "top_logprobs_num"),
        ({"text": "a", "sampling_params": {"max_tokens": 5}}, "sampling_params.max_tokens"),
        ({"text": "a", "sampling_params": {"regex": "a", "ebnf": "b"}}, "sampling_params.ebnf"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
        ({"text": ["a", "b"], "rid": "one"}, "rid"),
        ({"text": [], "stream": False}, "text"),
        ({"input_ids": []}, "input_ids"),
        ({"text": "a", "image_data": "x.png"}, "image_data"),
    ],
)
async def test_generate_bad_request_is_400(
    client: httpx.AsyncClient, fake_router: FakeRouter, body: dict[str, Any], param: str
) -> None:
    response = await client.post("/generate", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert fake_router.requests == []


async def test_health_and_model_info(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    assert (await client.get("/health")).status_code == 200
    info = (await client.get("/get_model_info")).json()
    assert info == {"model_path": "/models/tiny", "tokenizer_path": "/models/tiny", "is_generation": True}
    fake_router.list_error = grpc.StatusCode.UNAVAILABLE
    down = await client.get("/health")
    assert down.status_code == 503 and down.json()["error"]["code"] == 503
    fake_router.list_error = None
    fake_router.models.clear()
    assert (await client.get("/health")).status_code == 503


async def test_health_is_503_when_router_unreachable(
    make_client: Callable[[GatewayConfig], AsyncIterator[httpx.AsyncClient]], unused_tcp_port: int
) -> None:
    async for client in make_client(GatewayConfig(router_address=f"127.0.0.1:{unused_tcp_port}")):
        response = await client.get("/health")
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "service_unavailable_error"


async def test_prompt_is_the_older_name_of_text(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    """SGLang's older /generate documents call the text `prompt`: it is taken as `text`; both is a 400."""
    reply = await client.post("/generate", json={"prompt": ["Hi", "Yo"], "sampling_params": {"max_new_tokens": 2}})
    assert reply.status_code == 200, reply.text
    assert [r.text for r in fake_router.requests] == ["Hi", "Yo"]
    both = await client.post("/generate", json={"prompt": "Hi", "text": "Hi"})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"
