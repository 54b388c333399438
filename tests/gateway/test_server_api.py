"""Probes and server state: /health, /health_generate, /version, /get_server_info, /flush_cache;
and /tokenize, /detokenize."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
from grpc import aio

from gateway.config import GatewayConfig
from tests.gateway.conftest import FakeRouter, MakeClient, complete, fake_encode
from turnout import __version__
from turnout.security import ServiceSecurity
from turnout.v1 import router_admin_pb2


async def test_health_needs_a_routable_engine(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    assert (await client.get("/health")).status_code == 200
    fake_router.admin.engines[0].routable = False
    down = await client.get("/health")
    assert down.status_code == 503
    assert "no healthy engine" in down.json()["error"]["message"]
    fake_router.admin.engines.clear()
    assert (await client.get("/health")).status_code == 503


async def test_health_generate_runs_one_token_through_the_stack(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    assert (await client.get("/health_generate")).status_code == 200
    [sent] = fake_router.requests
    assert sent.sampling_params.max_new_tokens == 1 and list(sent.input_ids.ids) == [0]

    async def failing(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        yield complete(abort="engine lost")

    fake_router.script = failing
    failed = await client.get("/health_generate")
    assert failed.status_code == 503
    assert "engine lost" in failed.json()["error"]["message"]


async def test_version_and_server_info(fake_router: FakeRouter, make_client: MakeClient) -> None:
    security = ServiceSecurity(api_keys=("secret",), admin_key="admin-secret", internal_token="token-secret")
    config = GatewayConfig(router_address=fake_router.address, security=security, served_model_names=("m",))
    async for client in make_client(config):
        auth = {"Authorization": "Bearer secret"}
        assert (await client.get("/version")).json() == {"version": __version__}
        info = (await client.get("/get_server_info", headers=auth)).json()
        assert info["model_path"] == "/models/tiny" and info["context_length"] == 2048
        assert info["served_model_name"] == "m" and info["served_model_names"] == ["m"]
        assert info["api_key_required"] is True
        assert "secret" not in str(info)  # none of the three
        assert info["internal_states"][0]["address"] == "10.0.0.5:50051"
        # SGLang's max_total_num_tokens: the engines' smallest KV cache, in tokens.
        assert info["max_total_num_tokens"] == 0  # no engine has reported its load yet
        fake_router.admin.engines[0].kv_cache_capacity_tokens = 8192
        fake_router.admin.engines += [
            router_admin_pb2.EngineStatus(address="10.0.0.6:50051", kv_cache_capacity_tokens=4096),
            router_admin_pb2.EngineStatus(address="10.0.0.7:50051"),  # not polled yet: not counted
        ]
        info = (await client.get("/get_server_info", headers=auth)).json()
        assert info["max_total_num_tokens"] == 4096


async def test_flush_cache(fake_router: FakeRouter, make_client: MakeClient) -> None:
    config = GatewayConfig(router_address=fake_router.address, security=ServiceSecurity(admin_key="adm"))
    async for client in make_client(config):
        admin = {"Authorization": "Bearer adm"}
        for method in ("POST", "GET"):
            ok = await client.request(method, "/flush_cache", headers=admin)
            assert ok.status_code == 200 and "Cache flushed" in ok.text
        assert fake_router.admin.flushes == 2
        # The caller's admin key goes on to the router, which checks it (and passes it to the engines).
        assert fake_router.admin.authorizations == ["Bearer adm", "Bearer adm"]
        fake_router.admin.busy["10.0.0.5:50051"] = "not flushed: 2 requests running or waiting hold KV blocks"
        busy = await client.post("/flush_cache", headers=admin)
        assert busy.status_code == 400
        assert "2 requests running" in busy.json()["error"]["message"]


async def test_flush_cache_needs_the_admin_key(
    client: httpx.AsyncClient, fake_router: FakeRouter, make_client: MakeClient
) -> None:
    # No admin key configured: the admin routes are off.
    off = await client.post("/flush_cache", headers={"Authorization": "Bearer anything"})
    assert off.status_code == 403 and "--admin-key" in off.json()["error"]["message"]
    security = ServiceSecurity(api_keys=("user",), admin_key="adm")
    async for keyed in make_client(GatewayConfig(router_address=fake_router.address, security=security)):
        for headers in ({}, {"Authorization": "Bearer user"}, {"Authorization": "Bearer wrong"}):
            refused = await keyed.post("/flush_cache", headers=headers)
            assert refused.status_code == 401, headers
        # The admin key also opens what the API key opens.
        assert (await keyed.get("/v1/models", headers={"Authorization": "Bearer adm"})).status_code == 200
    assert fake_router.admin.flushes == 0


async def test_tokenize_prompt_batch_and_messages(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    one = (await client.post("/tokenize", json={"prompt": "hi", "return_token_strs": True})).json()
    assert one == {"count": 3, "max_model_len": 2048, "tokens": fake_encode("hi"), "token_strs": ["<s>", "h", "i"]}
    plain = (await client.post("/tokenize", json={"prompt": "hi", "add_special_tokens": False})).json()
    assert plain["tokens"] == fake_encode("hi", False) and plain["token_strs"] is None
    batch = (await client.post("/tokenize", json={"prompt": ["a", "bc"]})).json()
    assert batch["count"] == [2, 3] and batch["tokens"] == [fake_encode("a"), fake_encode("bc")]

    chat = (await client.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})).json()
    # vLLM's defaults for messages: a generation prompt, no special tokens added.
    assert chat["tokens"] == fake_encode("user: hi\nassistant: ", False)
    sent = fake_router.tokenize_requests[-1]
    assert sent.chat.options.add_generation_prompt and not sent.add_special_tokens
    cont = {"messages": [{"role": "assistant", "content": "x"}], "continue_final_message": True}
    await client.post("/tokenize", json=cont)
    assert fake_router.tokenize_requests[-1].chat.options.continue_final_message

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with_tools = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    assert (await client.post("/tokenize", json=with_tools)).status_code == 200
    # The template renders the tools, as for a chat request.
    assert [dict(t) for t in fake_router.tokenize_requests[-1].chat.options.tools] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]


async def test_tokenize_bad_requests(client: httpx.AsyncClient) -> None:
    both = await client.post("/tokenize", json={"prompt": "x", "messages": [{"role": "user", "content": "x"}]})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"
    assert (await client.post("/tokenize", json={})).status_code == 400
    assert (await client.post("/tokenize", json={"prompt": []})).status_code == 400
    clash = {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True,
             "add_generation_prompt": True}  # fmt: skip
    assert (await client.post("/tokenize", json=clash)).status_code == 400
    assert (await client.post("/detokenize", json={"tokens": [-1]})).status_code == 400
    unknown = await client.post("/tokenize", json={"prompt": "x", "model": "nope"})
    assert unknown.status_code == 404


async def test_detokenize_round_trip(client: httpx.AsyncClient) -> None:
    ids = (await client.post("/tokenize", json={"prompt": "héllo"})).json()["tokens"]
    text = (await client.post("/detokenize", json={"tokens": ids})).json()
    # vLLM names it `prompt`, SGLang `text`.
    assert text == {"prompt": "héllo", "text": "héllo"}
    batch = (await client.post("/detokenize", json={"tokens": [ids, ids[1:2]]})).json()
    assert batch["text"] == ["héllo", "h"]
    shown = (await client.post("/detokenize", json={"tokens": ids, "skip_special_tokens": False})).json()
    assert shown["prompt"] == "<s>héllo"
